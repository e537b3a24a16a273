//! The aws provider against moto (a real third-party AWS emulator): ECR
//! GetAuthorizationToken, STS AssumeRoleWithWebIdentity (IRSA) and AssumeRole.
//!
//! Each scenario runs in a child process with its own env (see `common`). moto's
//! `expiresAt` is always 2015-01-01T00:00:00Z; the provider must pass it through as is.
//!
//! Needs `moto_server` on PATH (`pip install 'moto[server]'`): every scenario is
//! `#[ignore]`d, so plain `cargo test` lists them as ignored; `scripts/test.sh` installs moto
//! and runs them, and a missing moto is then a failure, never a silent pass.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Moto, Outcome, closed_url, hermetic_env, irsa_env, run_child};

/// moto's fixed `expiresAt` (2015-01-01T00:00:00Z, moto started with TZ=UTC).
const MOTO_EXPIRES_AT: u64 = 1_420_070_400;
const ECR_HOST: &str = "123456789012.dkr.ecr.us-east-1.amazonaws.com";

#[tokio::test]
#[ignore = "runs only as a child of the other scenarios"]
async fn child_fetch() {
    common::child_main().await;
}

/// What moto answers for `account`: user `AWS`, password `<account>-auth-token`, and
/// its fixed expiry.
fn moto_token(account: &str) -> Outcome {
    Outcome::Ok(
        "AWS".into(),
        format!("{account}-auth-token"),
        Some(MOTO_EXPIRES_AT),
    )
}

fn keys_env(endpoint: &str) -> Vec<(&'static str, String)> {
    let mut env = hermetic_env();
    env.extend([
        ("AWS_ACCESS_KEY_ID", "AKIAMOTOTESTKEY00001".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "moto-test-secret".to_string()),
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
    ]);
    env
}

#[tokio::test]
#[ignore = "needs moto_server: run scripts/test.sh"]
async fn static_env_keys_get_an_ecr_token() {
    let moto = Moto::start();
    let got = run_child(ECR_HOST, "", &keys_env(&moto.url)).await;
    // moto's password names the registry id: the account came from the host.
    assert_eq!(got, moto_token("123456789012"));
}

#[tokio::test]
#[ignore = "needs moto_server: run scripts/test.sh"]
async fn irsa_web_identity_gets_an_ecr_token() {
    let moto = Moto::start();
    let (_token_dir, mut env) = irsa_env();
    // No AWS_REGION: STS for the web identity falls back to us-east-1, ECR uses the host's.
    env.retain(|(k, _)| *k != "AWS_REGION");
    env.push(("AWS_ENDPOINT_URL", moto.url.clone()));
    let got = run_child("210987654321.dkr.ecr.eu-west-1.amazonaws.com", "", &env).await;
    assert_eq!(got, moto_token("210987654321"));
    assert!(
        moto_assumed(&moto, "irsa-puller").await,
        "moto saw no AssumeRoleWithWebIdentity for AWS_ROLE_ARN"
    );

    // The same env without the token file: IRSA is configured but broken, and that is
    // reported, not silently replaced by anonymous access.
    let mut broken = env.clone();
    broken.retain(|(k, _)| *k != "AWS_WEB_IDENTITY_TOKEN_FILE");
    broken.push(("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/token".into()));
    let Outcome::Err(code, msg) = run_child(ECR_HOST, "", &broken).await else {
        panic!("a missing token file must fail");
    };
    assert_eq!(code, "identity_rejected", "{msg}");
}

#[tokio::test]
#[ignore = "needs moto_server: run scripts/test.sh"]
async fn role_arn_option_assumes_the_role() {
    let moto = Moto::start();
    let role = "arn:aws:iam::210987654321:role/cross-account-puller";
    let got = run_child(
        "210987654321.dkr.ecr.us-west-2.amazonaws.com",
        &format!("role_arn={role}"),
        &keys_env(&moto.url),
    )
    .await;
    assert_eq!(got, moto_token("210987654321"));
    assert!(
        moto_assumed(&moto, "cross-account-puller").await,
        "moto saw no AssumeRole for the rule's role"
    );
}

#[tokio::test]
#[ignore = "needs moto_server: run scripts/test.sh"]
async fn custom_domain_with_region_and_account_options() {
    let moto = Moto::start();
    let got = run_child(
        "ecr-proxy.internal.example:5000",
        "region=eu-central-1,account=111122223333",
        &keys_env(&moto.url),
    )
    .await;
    assert_eq!(got, moto_token("111122223333"));
}

#[tokio::test]
#[ignore = "needs moto_server: run scripts/test.sh"]
async fn service_specific_endpoint_vars_are_honoured() {
    // AWS_ENDPOINT_URL points nowhere; only the service-specific overrides reach moto.
    let moto = Moto::start();
    let (_token_dir, mut env) = irsa_env();
    env.extend([
        ("AWS_ENDPOINT_URL", closed_url()),
        ("AWS_ENDPOINT_URL_ECR", moto.url.clone()),
        ("AWS_ENDPOINT_URL_STS", moto.url.clone()),
    ]);
    let got = run_child(ECR_HOST, "", &env).await;
    assert_eq!(got, moto_token("123456789012"));

    // And without the ECR override the call goes to the dead global endpoint.
    env.retain(|(k, _)| *k != "AWS_ENDPOINT_URL_ECR");
    let Outcome::Err(code, msg) = run_child(ECR_HOST, "", &env).await else {
        panic!("the global endpoint is closed");
    };
    assert_eq!(code, "upstream_unavailable", "{msg}");
}

/// Whether moto's STS state holds a session of `role_name` (moto's own state dump).
async fn moto_assumed(moto: &Moto, role_name: &str) -> bool {
    let url = format!("{}/moto-api/data.json", moto.url);
    let body = tokio::task::spawn_blocking(move || http_get(&url))
        .await
        .unwrap();
    body.contains(role_name)
}

/// A minimal HTTP/1.0 GET, so the test needs no HTTP client dependency.
fn http_get(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let mut s = std::net::TcpStream::connect(authority).unwrap();
    write!(s, "GET /{path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
