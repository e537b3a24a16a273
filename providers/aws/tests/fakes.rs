//! Scenarios moto cannot play, against the in-process fake in `common::fake`: ECR Public
//! (moto has no ecr-public API), IMDSv2 (moto's IMDS lacks the token-TTL header
//! aws-config requires), the EKS Pod Identity agent, and ECR misbehaving (throttling,
//! 5xx, malformed tokens, slow answers, refusals).
//!
//! Identity-chain scenarios run in a child process with their own env (see `common`);
//! the others use `AwsProvider::builder()` with explicit endpoint and credentials.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use common::fake::{self, Fake, Mode};
use common::{Outcome, closed_url, hermetic_env, irsa_env, run_child};
use regbroker_aws::{AwsProvider, Builder, CallSettings};
use regbroker_provider::{Credential, Error, ErrorKind, ExposeSecret, Provider, Registry};

const ECR_HOST: &str = "123456789012.dkr.ecr.eu-west-1.amazonaws.com";

#[tokio::test]
#[ignore = "runs only as a child of the other scenarios"]
async fn child_fetch() {
    common::child_main().await;
}

fn quick_calls() -> CallSettings {
    CallSettings {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        attempt_timeout: Duration::from_millis(800),
        operation_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
    }
}

/// Endpoint `endpoint`, explicit static credentials and [`quick_calls`].
fn builder(endpoint: &str) -> Builder {
    AwsProvider::builder()
        .endpoint_url(endpoint)
        .credentials(SharedCredentialsProvider::new(Credentials::new(
            "AKIDEXPLICITTEST0001",
            "explicit-secret-s3cr3t",
            None,
            None,
            "test",
        )))
        .calls(quick_calls())
}

fn provider(endpoint: &str) -> AwsProvider {
    builder(endpoint).build()
}

async fn fetch(p: &AwsProvider, host: &str) -> Result<Credential, Error> {
    let target = p.recognise(&Registry::parse(host).unwrap()).unwrap();
    p.fetch(&target).await
}

/// What a child fetch gives from the fake: user `AWS`, `password`, the fake's expiry.
fn fake_token(fake: &Fake, password: &str) -> Outcome {
    Outcome::Ok("AWS".into(), password.into(), Some(fake.expires_at()))
}

/// [`hermetic_env`] with IMDS enabled at `imds`, and every AWS call sent to `endpoint`.
fn imds_env(imds: String, endpoint: &str) -> Vec<(&'static str, String)> {
    let mut env = hermetic_env();
    env.retain(|(k, _)| *k != "AWS_EC2_METADATA_DISABLED");
    env.extend([
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds),
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
    ]);
    env
}

fn expires(c: &Credential) -> u64 {
    c.expires_at()
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn ecr_public_token_comes_from_ecr_public_in_us_east_1() {
    let fake = Fake::start(Mode::Ok).await;
    let c = fetch(&provider(&fake.url), "public.ecr.aws").await.unwrap();
    assert_eq!(c.username(), "AWS");
    assert_eq!(c.secret().expose_secret(), fake::PUBLIC_PASSWORD);
    assert_eq!(expires(&c), fake.expires_at());
    fake.seen(|s| {
        assert_eq!((s.public_calls, s.ecr_calls), (1, 0));
        assert!(
            s.scopes[0].ends_with("/us-east-1/ecr-public"),
            "{:?}",
            s.scopes
        );
    });
}

#[tokio::test]
async fn private_ecr_is_signed_for_the_hosts_region() {
    let fake = Fake::start(Mode::Ok).await;
    let c = fetch(&provider(&fake.url), ECR_HOST).await.unwrap();
    assert_eq!(c.secret().expose_secret(), fake::PASSWORD);
    assert_eq!(expires(&c), fake.expires_at());
    fake.seen(|s| {
        assert_eq!(s.ecr_calls, 1);
        assert!(s.scopes[0].ends_with("/eu-west-1/ecr"), "{:?}", s.scopes);
        assert_eq!(s.access_keys, ["AKIDEXPLICITTEST0001"]);
    });
}

#[tokio::test]
async fn an_expiry_in_the_year_10000_or_later_is_capped() {
    // Formatting a year-10000 expiry once panicked (and aborted the release build); an
    // expiry further ahead than MAX_LIFETIME is capped at the provider boundary.
    let fake = Fake::start(Mode::Ok).await;
    for raw in ["253402300800.0", "999999999999.0"] {
        fake.set_expires_at(raw);
        for host in [ECR_HOST, "public.ecr.aws"] {
            let before = regbroker_provider::Clock::now(&*regbroker_provider::system_clock());
            let c = fetch(&provider(&fake.url), host).await.unwrap();
            let after = regbroker_provider::Clock::now(&*regbroker_provider::system_clock());
            let at = c.expires_at().unwrap();
            assert!(
                at >= before + regbroker_provider::MAX_LIFETIME - Duration::from_secs(1)
                    && at <= after + regbroker_provider::MAX_LIFETIME,
                "{host} expiresAt {raw}: got {at:?}, want now + MAX_LIFETIME"
            );
        }
    }
}

#[tokio::test]
async fn throttled_then_ok() {
    let fake = Fake::start(Mode::ThrottleFirst(1)).await;
    let c = fetch(&provider(&fake.url), ECR_HOST).await.unwrap();
    assert_eq!(c.secret().expose_secret(), fake::PASSWORD);
    assert_eq!(fake.seen(|s| s.ecr_calls), 2);
}

#[tokio::test]
async fn throttled_every_time_is_throttled_after_bounded_attempts() {
    let fake = Fake::start(Mode::ThrottleFirst(usize::MAX)).await;
    let e = fetch(&provider(&fake.url), ECR_HOST).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Throttled, "{}", e.chain());
    assert_eq!(fake.seen(|s| s.ecr_calls), 3);
}

#[tokio::test]
async fn server_errors_exhaust_retries_and_are_unavailable() {
    let fake = Fake::start(Mode::ServerError).await;
    let e = fetch(&provider(&fake.url), ECR_HOST).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert_eq!(fake.seen(|s| s.ecr_calls), 3);
}

#[tokio::test]
async fn malformed_tokens_are_bad_responses_without_the_token() {
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    for token in [
        "not*base64*leaky-s3cr3t".to_string(),
        b64("Basic:leaky-s3cr3t"),
        b64("leaky-s3cr3t"),
        b64("AWS:"),
    ] {
        let fake = Fake::start(Mode::Token(token.clone())).await;
        let e = fetch(&provider(&fake.url), ECR_HOST).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadResponse, "{token}: {}", e.chain());
        let shown = format!("{} {} {e:?}", e.chain(), e);
        assert!(
            !shown.contains("leaky-s3cr3t") && !shown.contains(&token),
            "{shown}"
        );
        // A bad answer is not retried.
        assert_eq!(fake.seen(|s| s.ecr_calls), 1);
    }
}

#[tokio::test]
async fn refusals_are_identity_rejected() {
    for (code, status) in [
        ("AccessDeniedException", 400),
        ("UnrecognizedClientException", 400),
        ("ExpiredTokenException", 400),
        ("InvalidSignatureException", 403),
    ] {
        let fake = Fake::start(Mode::Fail(code, status)).await;
        let e = fetch(&provider(&fake.url), ECR_HOST).await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::IdentityRejected,
            "{code}: {}",
            e.chain()
        );
        assert!(e.message().contains(code), "{e}");
    }
}

#[tokio::test]
async fn slow_upstream_times_out() {
    let fake = Fake::start(Mode::Slow(Duration::from_secs(10))).await;
    let started = std::time::Instant::now();
    let e = fetch(&provider(&fake.url), ECR_HOST).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{}", e.chain());
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn unreachable_endpoint_is_unavailable() {
    let e = fetch(&provider(&closed_url()), ECR_HOST).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
}

#[tokio::test]
async fn imdsv2_role_credentials_are_used() {
    let fake = Fake::start(Mode::Ok).await;
    let env = imds_env(fake.url.clone(), &fake.url);
    let got = run_child(ECR_HOST, "", &env).await;
    assert_eq!(got, fake_token(&fake, fake::PASSWORD));
    fake.seen(|s| {
        assert!(
            s.imds_token_puts >= 1,
            "no IMDSv2 token PUT with a TTL header"
        );
        assert!(
            s.imds_creds_gets >= 1,
            "no role credentials GET with the session token"
        );
        assert_eq!(
            s.imds_unauthorised, 0,
            "an IMDS call lacked the session token"
        );
        assert_eq!(s.access_keys, [fake::IMDS_ACCESS_KEY]);
    });
}

#[tokio::test]
async fn eks_pod_identity_credentials_are_used() {
    let fake = Fake::start(Mode::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, fake::POD_AUTH_TOKEN).unwrap();
    let mut env = hermetic_env();
    env.extend([
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            format!("{}/v1/credentials", fake.url),
        ),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            token_file.display().to_string(),
        ),
        ("AWS_ENDPOINT_URL", fake.url.clone()),
    ]);
    let got = run_child(ECR_HOST, "", &env).await;
    assert_eq!(got, fake_token(&fake, fake::PASSWORD));
    fake.seen(|s| {
        assert_eq!(s.pod_unauthorised, 0);
        assert!(s.pod_gets >= 1);
        assert_eq!(s.access_keys, [fake::POD_ACCESS_KEY]);
    });
}

#[tokio::test]
async fn no_identity_at_all_is_identity_missing_naming_what_was_looked_for() {
    let fake = Fake::start(Mode::Ok).await;
    // IMDS is tried too, and answers nothing.
    let env = imds_env(closed_url(), &fake.url);
    let Outcome::Err(code, msg) = run_child(ECR_HOST, "", &env).await else {
        panic!("no identity must not give a credential");
    };
    assert_eq!(code, "identity_missing", "{msg}");
    for name in [
        "AWS_ACCESS_KEY_ID",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
        "IMDS",
    ] {
        assert!(msg.contains(name), "message does not name {name}: {msg}");
    }
    assert_eq!(
        fake.seen(|s| s.ecr_calls),
        0,
        "ECR was called without an identity"
    );
}

#[tokio::test]
async fn ecr_public_endpoint_env_var_is_honoured() {
    let fake = Fake::start(Mode::Ok).await;
    let mut env = hermetic_env();
    env.extend([
        ("AWS_ACCESS_KEY_ID", "AKIDENVTEST000000001".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "env-secret".to_string()),
        ("AWS_ENDPOINT_URL", closed_url()),
        ("AWS_ENDPOINT_URL_ECR_PUBLIC", fake.url.clone()),
    ]);
    let got = run_child("public.ecr.aws", "", &env).await;
    assert_eq!(got, fake_token(&fake, fake::PUBLIC_PASSWORD));
    fake.seen(|s| assert_eq!(s.access_keys, ["AKIDENVTEST000000001"]));
}

#[tokio::test]
async fn irsa_with_sts_unreachable_is_unavailable_not_missing() {
    let (_token_dir, mut env) = irsa_env();
    env.push(("AWS_ENDPOINT_URL", closed_url()));
    let Outcome::Err(code, msg) = run_child(ECR_HOST, "", &env).await else {
        panic!("STS is unreachable");
    };
    assert_eq!(code, "upstream_unavailable", "{msg}");
}

#[tokio::test]
async fn sts_refusing_the_web_identity_is_identity_rejected() {
    // The fake's STS answers AccessDenied to AssumeRoleWithWebIdentity; moto accepts
    // every token, so it cannot play this.
    let fake = Fake::start(Mode::Ok).await;
    let (_token_dir, mut env) = irsa_env();
    env.extend([
        ("AWS_ENDPOINT_URL_STS", format!("{}/sts-denies", fake.url)),
        ("AWS_ENDPOINT_URL", fake.url.clone()),
    ]);
    let Outcome::Err(code, msg) = run_child(ECR_HOST, "", &env).await else {
        panic!("STS refused the token");
    };
    assert_eq!(code, "identity_rejected", "{msg}");
    assert_eq!(fake.seen(|s| s.ecr_calls), 0);
}

#[tokio::test]
async fn requests_are_signed_with_the_injected_clock() {
    let fake = Fake::start(Mode::Ok).await;
    // 1_767_225_600 is 2026-01-01T00:00:00Z.
    let clock =
        regbroker_provider::ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_767_225_600));
    let p = builder(&fake.url).clock(std::sync::Arc::new(clock)).build();
    fetch(&p, ECR_HOST).await.unwrap();
    fake.seen(|s| assert_eq!(s.scopes, ["20260101/eu-west-1/ecr"]));
}

/// Counts how often the SDK asks for the base identity.
#[derive(Clone, Debug, Default)]
struct CountingIdentity(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl aws_credential_types::provider::ProvideCredentials for CountingIdentity {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        aws_credential_types::provider::future::ProvideCredentials::ready(Ok(Credentials::new(
            "AKIDCOUNTING00000001",
            "counting-secret",
            None,
            None,
            "counting",
        )))
    }
}

#[tokio::test]
async fn identity_is_loaded_once_across_fetches_and_regions() {
    let fake = Fake::start(Mode::Ok).await;
    let identity = CountingIdentity::default();
    let p = AwsProvider::builder()
        .endpoint_url(&fake.url)
        .credentials(SharedCredentialsProvider::new(identity.clone()))
        .calls(quick_calls())
        .build();
    for host in [
        ECR_HOST,
        ECR_HOST,
        "123456789012.dkr.ecr.us-west-2.amazonaws.com",
        "public.ecr.aws",
    ] {
        fetch(&p, host).await.unwrap();
    }
    assert_eq!(fake.seen(|s| s.ecr_calls + s.public_calls), 4);
    assert_eq!(identity.0.load(std::sync::atomic::Ordering::SeqCst), 1);
}
