//! Fakes of sts.googleapis.com and iamcredentials.googleapis.com (axum on 127.0.0.1:0):
//! Google's federation services cannot run here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use super::{Fake, Seen, form, write};

#[derive(Clone, Default)]
pub struct Federation {
    pub sts: Seen,
    pub iam: Seen,
    pub issued: Arc<AtomicUsize>,
}

/// sts.googleapis.com's token exchange: checks the RFC 8693 form.
pub async fn sts_token(State(s): State<Federation>, headers: HeaderMap, body: String) -> Response {
    s.sts.push(&headers, &body);
    let f = form(&body);
    let ok = f.get("grant_type").map(String::as_str)
        == Some("urn:ietf:params:oauth:grant-type:token-exchange")
        && f.get("requested_token_type").map(String::as_str)
            == Some("urn:ietf:params:oauth:token-type:access_token")
        && f.get("subject_token").is_some_and(|t| t.starts_with("eyJ"));
    if !ok {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_request"})),
        )
            .into_response();
    }
    let n = s.issued.fetch_add(1, Ordering::SeqCst) + 1;
    axum::Json(json!({
        "access_token": format!("ya29.sts-{n}"),
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "token_type": "Bearer",
        "expires_in": 3600,
    }))
    .into_response()
}

/// iamcredentials.googleapis.com's generateAccessToken: needs the STS token as bearer.
pub async fn generate_access_token(
    State(s): State<Federation>,
    headers: HeaderMap,
    body: String,
) -> Response {
    s.iam.push(&headers, &body);
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !auth.starts_with("Bearer ya29.sts-") {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"code": 401, "status": "UNAUTHENTICATED"}})),
        )
            .into_response();
    }
    // A fixed expiry the test can predict: 2026-01-01T00:30:00Z (ManualClock::fixed + 30 min).
    axum::Json(json!({"accessToken": "ya29.impersonated", "expireTime": "2026-01-01T00:30:00Z"}))
        .into_response()
}

pub async fn start_federation(state: Federation) -> Fake {
    Fake::start(
        Router::new()
            .route("/v1/token", post(sts_token))
            .route(
                "/v1/projects/-/serviceAccounts/{sa}",
                post(generate_access_token),
            )
            .with_state(state),
    )
    .await
}

pub const AUDIENCE: &str =
    "//iam.googleapis.com/projects/123/locations/global/workloadIdentityPools/eks/providers/oidc";

pub fn external_account(fake: &Fake, token_file: &str, impersonate: bool) -> serde_json::Value {
    let mut v = json!({
        "type": "external_account",
        "audience": AUDIENCE,
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": fake.url("/v1/token"),
        "credential_source": {"file": token_file, "format": {"type": "text"}},
    });
    if impersonate {
        v["service_account_impersonation_url"] = json!(fake.url(
            "/v1/projects/-/serviceAccounts/puller@p.iam.gserviceaccount.com:generateAccessToken"
        ));
    }
    v
}

/// Writes [`external_account`] as `creds.json` in `dir` and returns its path.
pub fn external_account_file(
    dir: &tempfile::TempDir,
    fake: &Fake,
    token_file: &str,
    impersonate: bool,
) -> String {
    write(
        dir,
        "creds.json",
        &external_account(fake, token_file, impersonate).to_string(),
    )
}

/// The federation fakes and an external_account credentials file for them whose subject
/// token file holds `subject_token`; everything lives as long as the value.
pub struct Scenario {
    /// What the fakes saw.
    pub fed: Federation,
    /// The subject token file (rewrite it to rotate the token).
    pub token_file: String,
    /// The credentials file, for `GOOGLE_APPLICATION_CREDENTIALS`.
    pub creds: String,
    _fake: Fake,
    _dir: tempfile::TempDir,
}

impl Scenario {
    pub async fn start(subject_token: &str, impersonate: bool) -> Scenario {
        let fed = Federation::default();
        let fake = start_federation(fed.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let token_file = write(&dir, "token", subject_token);
        let creds = external_account_file(&dir, &fake, &token_file, impersonate);
        Scenario {
            fed,
            token_file,
            creds,
            _fake: fake,
            _dir: dir,
        }
    }
}
