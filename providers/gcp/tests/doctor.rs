//! `doctor` for GCP (`Provider::diagnose`): against small in-process fakes of the GKE
//! metadata server and of sts.googleapis.com (axum on 127.0.0.1:0; Google's services
//! cannot run here), and against gcplocal (a third-party GCE metadata emulator) for the
//! wire format. Each scenario checks that the finding names the cause and that no token
//! reaches a finding.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use base64::Engine as _;
use common::{Fake, closed_port, free_port, provider, write};
use regbroker_provider::test_util::require_peer;
use regbroker_provider::{Diagnosis, Finding, ManualClock, Provider, Status};
use serde_json::json;

/// 2026-01-01T00:00:00Z, the fixed clock's time.
const NOW: u64 = 1_767_225_600;
const ACCESS_TOKEN: &str = "ya29.doctor-access-token-Qm4";
const AUDIENCE: &str =
    "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/pool/providers/eks";

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

fn finding<'a>(d: &'a Diagnosis, check: &str) -> &'a Finding {
    d.findings
        .iter()
        .rev()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no {check} finding in\n{}", text(d)))
}

fn assert_no_token(d: &Diagnosis, secrets: &[&str]) {
    let all = format!("{}\n{d:?}", text(d));
    for s in secrets.iter().chain(&[ACCESS_TOKEN]) {
        assert!(!all.contains(s), "a token reached a finding:\n{all}");
    }
}

/// A fake GKE metadata server: the default account's token, email and scopes, each
/// only with `Metadata-Flavor: Google`.
async fn metadata_fake(email: &'static str) -> Fake {
    fn flavored(h: &HeaderMap) -> bool {
        h.get("metadata-flavor").and_then(|v| v.to_str().ok()) == Some("Google")
    }
    let base = "/computeMetadata/v1/instance/service-accounts/default";
    let router = Router::new()
        .route(
            &format!("{base}/token"),
            get(|h: HeaderMap| async move {
                if !flavored(&h) {
                    return StatusCode::FORBIDDEN.into_response();
                }
                axum::Json(json!({"access_token": ACCESS_TOKEN, "expires_in": 3599, "token_type": "Bearer"}))
                    .into_response()
            }),
        )
        .route(
            &format!("{base}/email"),
            get(move |h: HeaderMap| async move {
                if !flavored(&h) {
                    return StatusCode::FORBIDDEN.into_response();
                }
                email.into_response()
            }),
        )
        .route(
            &format!("{base}/scopes"),
            get(|h: HeaderMap| async move {
                if !flavored(&h) {
                    return StatusCode::FORBIDDEN.into_response();
                }
                "https://www.googleapis.com/auth/cloud-platform\nhttps://www.googleapis.com/auth/userinfo.email\n".into_response()
            }),
        );
    Fake::start(router).await
}

#[tokio::test]
async fn metadata_server_names_its_service_account_and_scopes() {
    let fake = metadata_fake("puller@proj.iam.gserviceaccount.com").await;
    let clock = ManualClock::fixed();
    let p = provider(&[("GCE_METADATA_HOST", &fake.addr.to_string())], &clock);
    let d = p.diagnose(Duration::from_secs(5)).await;
    assert!(!d.failed(), "{}", text(&d));
    assert_eq!(d.identity.as_str(), "metadata_server");
    assert!(!d.explicit);
    let m = finding(&d, "gcp.metadata_server");
    assert!(
        m.detail.contains("puller@proj.iam.gserviceaccount.com"),
        "{}",
        text(&d)
    );
    assert!(m.detail.contains("auth/cloud-platform"), "{}", text(&d));
    assert_eq!(
        finding(&d, "gcp.token").status,
        Status::Pass,
        "{}",
        text(&d)
    );
    assert_no_token(&d, &[]);
}

#[tokio::test]
async fn no_metadata_server_gives_the_gke_host_network_hint() {
    let clock = ManualClock::fixed();
    let host = format!("127.0.0.1:{}", closed_port());
    let p = provider(&[("GCE_METADATA_HOST", &host)], &clock);
    let started = std::time::Instant::now();
    let d = p.diagnose(Duration::from_secs(2)).await;
    assert!(started.elapsed() < Duration::from_secs(10), "bounded");
    let f = finding(&d, "gcp.metadata_server");
    assert_eq!(f.status, Status::Fail, "{}", text(&d));
    assert!(f.detail.contains("no metadata server"), "{}", text(&d));
    assert!(f.detail.contains(&host), "{}", text(&d));
    assert!(
        f.fix.as_deref().unwrap().contains("hostNetwork"),
        "{}",
        text(&d)
    );
    assert_eq!(finding(&d, "gcp.token").status, Status::Skip);
}

fn subject_jwt(aud: &str) -> String {
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let claims = json!({"iss": "https://oidc.eks.example", "aud": aud, "sub": "system:serviceaccount:flux-system:source-controller", "iat": NOW - 60, "exp": NOW + 3600});
    format!(
        "{}.{}.c2lnbmF0dXJl",
        e.encode(r#"{"alg":"RS256"}"#),
        e.encode(claims.to_string())
    )
}

/// A fake sts.googleapis.com that accepts only subject tokens for `accepted` (as a
/// workload identity pool provider's allowed audiences do).
async fn sts_fake(accepted: &'static str) -> Fake {
    let router = Router::new().route(
        "/v1/token",
        post(move |body: String| async move {
            let f = common::form(&body);
            let aud = f
                .get("subject_token")
                .and_then(|t| t.split('.').nth(1).map(str::to_string))
                .and_then(|p| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p).ok())
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["aud"].as_str().map(str::to_string))
                .unwrap_or_default();
            if aud != accepted {
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"error": "invalid_grant", "error_description": "The audience in ID Token does not match the expected audience."})),
                )
                    .into_response();
            }
            axum::Json(json!({"access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer", "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"}))
                .into_response()
        }),
    );
    Fake::start(router).await
}

fn external_account(dir: &tempfile::TempDir, sts: &Fake, token_file: &str) -> String {
    write(
        dir,
        "creds.json",
        &json!({
            "type": "external_account",
            "audience": AUDIENCE,
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": sts.url("/v1/token"),
            "credential_source": {"file": token_file},
        })
        .to_string(),
    )
}

#[tokio::test]
async fn external_account_exchange_and_audience_mismatch() {
    let expected = format!("https:{AUDIENCE}");
    let sts = sts_fake(Box::leak(expected.clone().into_boxed_str())).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::fixed();

    let good = subject_jwt(&expected);
    let token_file = write(&dir, "token", &good);
    let creds = external_account(&dir, &sts, &token_file);
    let p = provider(&[("GOOGLE_APPLICATION_CREDENTIALS", &creds)], &clock);
    let d = p.diagnose(Duration::from_secs(5)).await;
    assert!(!d.failed(), "{}", text(&d));
    assert_eq!(d.identity.as_str(), "external_account");
    assert!(d.explicit);
    let t = finding(&d, "gcp.token");
    assert!(t.detail.contains("STS token exchange"), "{}", text(&d));
    assert_no_token(&d, &good.split('.').collect::<Vec<_>>());

    // The token projected for the AWS audience: the STS refuses it, and doctor says why.
    let bad = subject_jwt("sts.amazonaws.com");
    std::fs::write(&token_file, &bad).unwrap();
    let d = p.diagnose(Duration::from_secs(5)).await;
    let f = finding(&d, "gcp.token");
    assert_eq!(f.status, Status::Fail, "{}", text(&d));
    assert!(f.detail.contains("audience mismatch"), "{}", text(&d));
    assert!(
        f.detail.contains(&format!("expected {expected}")),
        "{}",
        text(&d)
    );
    assert_no_token(&d, &bad.split('.').collect::<Vec<_>>());

    // The projected token not mounted.
    std::fs::remove_file(&token_file).unwrap();
    let d = p.diagnose(Duration::from_secs(5)).await;
    let f = finding(&d, "gcp.token_file");
    assert!(f.detail.contains("token file missing"), "{}", text(&d));
    assert_eq!(finding(&d, "gcp.token").status, Status::Skip);
}

#[tokio::test]
async fn unreadable_credentials_file_is_named() {
    let clock = ManualClock::fixed();
    let p = provider(
        &[(
            "GOOGLE_APPLICATION_CREDENTIALS",
            "/nonexistent/regbroker/creds.json",
        )],
        &clock,
    );
    let d = p.diagnose(Duration::from_secs(2)).await;
    let f = finding(&d, "gcp.identity");
    assert_eq!(f.status, Status::Fail);
    assert!(
        f.detail.contains("/nonexistent/regbroker/creds.json"),
        "{}",
        text(&d)
    );
    assert!(
        f.fix
            .as_deref()
            .unwrap()
            .contains("GOOGLE_APPLICATION_CREDENTIALS")
    );
}

#[tokio::test]
#[ignore = "needs gcplocal: run scripts/test.sh"]
async fn gcplocal_metadata_token_passes() {
    let bin = require_peer("gcplocal", "pip install gcplocal");
    let port = free_port();
    let cwd = tempfile::tempdir().unwrap();
    let _child = tokio::process::Command::new(bin)
        .args(["start", "--host", "127.0.0.1", "--port", &port.to_string()])
        .current_dir(cwd.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "gcplocal did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let clock = ManualClock::fixed();
    let p = provider(&[("GCE_METADATA_HOST", &addr)], &clock);
    let d = p.diagnose(Duration::from_secs(5)).await;
    // gcplocal has no email endpoint (404): a warning, not a failure; its token passes.
    assert!(!d.failed(), "{}", text(&d));
    assert_eq!(finding(&d, "gcp.metadata_server").status, Status::Warn);
    assert_eq!(
        finding(&d, "gcp.token").status,
        Status::Pass,
        "{}",
        text(&d)
    );
    assert_no_token(&d, &["ya29.gcplocal-mock-token"]);
}
