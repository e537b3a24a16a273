//! `doctor` for Azure (`Provider::diagnose`), against the in-process fakes of Entra ID and
//! IMDS in `fake/` (no Entra ID emulator can run here): the real `azure_identity` code
//! asks them. Each scenario checks that the finding names the cause, and that no token
//! or secret reaches any finding.

#![allow(clippy::unwrap_used)]

mod fake;

use std::sync::Arc;
use std::time::Duration;

use fake::*;
use regbroker_azure::{AzureProvider, Env};
use regbroker_provider::{Diagnosis, ManualClock, Provider, SharedClock, Status};
use serde_json::json;

/// 2026-01-01T00:00:00Z, the fixed clock's time.
const NOW: u64 = 1_767_225_600;

fn sa_jwt(aud: &str, iat: u64, exp: u64) -> String {
    jwt(json!({
        "iss": "https://oidc.aks.example/issuer",
        "aud": [aud],
        "sub": "system:serviceaccount:flux-system:source-controller",
        "iat": iat,
        "exp": exp,
    }))
}

struct Setup {
    running: Running,
    _dir: tempfile::TempDir,
    token: String,
    provider: AzureProvider,
}

/// A provider wired to the fakes, with `env` plus (unless `None`) a federated token file
/// holding `token`.
async fn setup(token: Option<String>, extra: &[(&'static str, String)], imds: bool) -> Setup {
    let running = start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = if imds {
        Vec::new()
    } else {
        identity_env(format!("{}/", running.https))
    };
    let token = token.unwrap_or_default();
    if !token.is_empty() {
        let path = dir.path().join("azure-identity-token");
        std::fs::write(&path, &token).unwrap();
        env.push(("AZURE_FEDERATED_TOKEN_FILE", path.display().to_string()));
        running
            .fake
            .accepted_assertions
            .lock()
            .unwrap()
            .push(token.clone());
    }
    env.extend(extra.iter().cloned());
    let client = client_trusting(&running.ca_pem);
    let mut builder = AzureProvider::builder()
        .env(Env::from_pairs(env))
        .http_client(client.clone())
        .clock(Arc::new(ManualClock::fixed()) as SharedClock)
        .retry(0, Duration::from_millis(10));
    if imds {
        // The SDK picks the App Service endpoint from the process env; this test binary
        // must not have it, or IMDS would not be asked.
        assert!(
            std::env::var_os("IDENTITY_ENDPOINT").is_none(),
            "unset IDENTITY_ENDPOINT to run this test"
        );
        builder = builder.sdk_http_client(Arc::new(ImdsToLoopback {
            inner: client,
            fake_http: running.http.parse().unwrap(),
        }));
    }
    Setup {
        provider: builder.build().unwrap(),
        running,
        _dir: dir,
        token,
    }
}

fn text(d: &Diagnosis) -> String {
    d.findings
        .iter()
        .map(|f| {
            format!(
                "{} {}: {} | fix: {}",
                f.status.as_str(),
                f.check,
                f.detail,
                f.fix.as_deref().unwrap_or("-")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn finding<'a>(d: &'a Diagnosis, check: &str) -> &'a regbroker_provider::Finding {
    d.findings
        .iter()
        .rev()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no {check} finding in\n{}", text(d)))
}

fn assert_no_secret(s: &Setup, d: &Diagnosis) {
    let all = format!("{}\n{d:?}", text(d));
    let mut secrets = vec![
        s.running.fake.access_token.clone(),
        s.running.fake.refresh_token(),
        CLIENT_SECRET.to_string(),
    ];
    if !s.token.is_empty() {
        secrets.extend(s.token.split('.').map(str::to_string));
    }
    for secret in secrets {
        assert!(!all.contains(&secret), "a secret reached a finding:\n{all}");
    }
}

#[tokio::test]
async fn workload_identity_gets_an_entra_token_for_the_acr_scope() {
    let s = setup(
        Some(sa_jwt("api://AzureADTokenExchange", NOW - 60, NOW + 3600)),
        &[],
        false,
    )
    .await;
    let d = s.provider.diagnose(Duration::from_secs(5)).await;
    assert!(!d.failed(), "{}", text(&d));
    assert_eq!(d.identity.as_str(), "workload_identity");
    assert!(d.explicit);
    let t = text(&d);
    assert!(t.contains(&format!("AZURE_CLIENT_ID={CLIENT_ID}")), "{t}");
    assert!(
        t.contains("subject system:serviceaccount:flux-system:source-controller"),
        "{t}"
    );
    let token = finding(&d, "azure.entra_token");
    assert_eq!(token.status, Status::Pass, "{t}");
    assert!(token.detail.contains("containerregistry.azure.net"), "{t}");
    assert!(token.detail.contains(TOKEN_TENANT), "the token's tid: {t}");
    assert_no_secret(&s, &d);
}

#[tokio::test]
async fn audience_mismatch_names_the_expected_audience() {
    let s = setup(
        Some(sa_jwt("sts.amazonaws.com", NOW - 60, NOW + 3600)),
        &[],
        false,
    )
    .await;
    // What Entra ID answers for a federated token with an audience it does not accept.
    s.running.fake.script_aad(
        400,
        json!({
            "error": "invalid_request",
            "error_description": "AADSTS700212: No matching federated identity record found for presented assertion audience 'sts.amazonaws.com'.",
            "error_codes": [700212],
        }),
    );
    let d = s.provider.diagnose(Duration::from_secs(5)).await;
    assert!(d.failed(), "{}", text(&d));
    let f = finding(&d, "azure.entra_token");
    assert_eq!(f.status, Status::Fail);
    assert!(f.detail.contains("audience mismatch"), "{}", text(&d));
    assert!(f.detail.contains("sts.amazonaws.com"), "{}", text(&d));
    assert!(
        f.detail.contains("expected api://AzureADTokenExchange"),
        "{}",
        text(&d)
    );
    assert_no_secret(&s, &d);
}

#[tokio::test]
async fn authority_host_over_http_is_refused_before_any_call() {
    let s = setup(
        Some(sa_jwt("api://AzureADTokenExchange", NOW - 60, NOW + 3600)),
        &[(
            "AZURE_AUTHORITY_HOST",
            "http://login.microsoftonline.com/".to_string(),
        )],
        false,
    )
    .await;
    let d = s.provider.diagnose(Duration::from_secs(5)).await;
    let f = finding(&d, "azure.authority_host");
    assert_eq!(f.status, Status::Fail);
    assert!(
        f.detail.contains("AZURE_AUTHORITY_HOST not https"),
        "{}",
        text(&d)
    );
    assert!(
        f.fix
            .as_deref()
            .unwrap()
            .contains("https://login.microsoftonline.com")
    );
    assert_eq!(
        s.running
            .fake
            .aad_calls
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[tokio::test]
async fn missing_and_expired_token_files_are_named() {
    let s = setup(
        None,
        &[(
            "AZURE_FEDERATED_TOKEN_FILE",
            "/nonexistent/regbroker/azure-token".to_string(),
        )],
        false,
    )
    .await;
    let d = s.provider.diagnose(Duration::from_secs(5)).await;
    let f = finding(&d, "azure.token_file");
    assert_eq!(f.status, Status::Fail);
    assert!(f.detail.contains("token file missing"), "{}", text(&d));
    assert!(f.detail.contains("/nonexistent/regbroker/azure-token"));
    assert_eq!(finding(&d, "azure.entra_token").status, Status::Skip);

    let s = setup(
        Some(sa_jwt("api://AzureADTokenExchange", NOW - 7200, NOW - 3600)),
        &[],
        false,
    )
    .await;
    let d = s.provider.diagnose(Duration::from_secs(5)).await;
    let f = finding(&d, "azure.token_file.expiry");
    assert_eq!(f.status, Status::Fail);
    assert!(f.detail.contains("token expired"), "{}", text(&d));
    assert_no_secret(&s, &d);
}

#[tokio::test]
async fn several_managed_identities_and_no_client_id() {
    let s = setup(None, &[], true).await;
    // What IMDS answers a request that names no identity on a VM with several.
    s.running.fake.imds_script.lock().unwrap().push_back(Scripted {
        status: 400,
        body: json!({
            "error": "invalid_request",
            "error_description": "Multiple user assigned identities exist, please specify the clientId / resourceId of the identity in the token request",
        })
        .to_string(),
    });
    let d = s.provider.diagnose(Duration::from_secs(5)).await;
    assert_eq!(d.identity.as_str(), "managed_identity");
    assert!(!d.explicit, "IMDS alone is not an explicit identity");
    let f = finding(&d, "azure.entra_token");
    assert_eq!(f.status, Status::Fail, "{}", text(&d));
    assert!(
        f.detail
            .contains("several managed identities and no AZURE_CLIENT_ID"),
        "{}",
        text(&d)
    );
    assert!(f.fix.as_deref().unwrap().contains("set AZURE_CLIENT_ID"));

    // With AZURE_CLIENT_ID the same IMDS hands out the token.
    let s = setup(None, &[("AZURE_CLIENT_ID", CLIENT_ID.to_string())], true).await;
    let d = s.provider.diagnose(Duration::from_secs(5)).await;
    assert_eq!(
        finding(&d, "azure.entra_token").status,
        Status::Pass,
        "{}",
        text(&d)
    );
    assert!(d.explicit);
    assert_no_secret(&s, &d);
}
