//! A fake of the GKE/GCE metadata server's token endpoint (axum on 127.0.0.1:0): it
//! refuses a request without `Metadata-Flavor: Google`, as the real one does, and can be
//! told to fail, to hang or to leave out `expires_in`. The real server cannot run here.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::{Fake, Seen};

/// The token path of the default service account.
pub const MDS_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// The universe-domain path (absent on older servers and on gcplocal: a 404).
pub const UNIVERSE_PATH: &str = "/computeMetadata/v1/universe/universe-domain";

/// What the fake saw, and how it answers.
#[derive(Clone, Default)]
pub struct Mds {
    pub seen: Seen,
    /// Answer this many requests with `fail_status` before succeeding.
    pub fail_first: Arc<AtomicUsize>,
    pub fail_status: u16,
    pub issued: Arc<AtomicUsize>,
    pub omit_expires_in: bool,
    pub delay: Option<Duration>,
    /// Answer the universe-domain path with this (else 404, as Google's older servers).
    pub universe: Option<String>,
    /// Tokens are `<prefix>-<n>` (default `ya29.mds`).
    pub token_prefix: Option<String>,
    /// Universe-domain requests seen.
    pub universe_seen: Seen,
}

impl Mds {
    /// A metadata server of the universe `universe`, whose tokens start with `prefix`.
    pub fn of_universe(universe: &str, prefix: &str) -> Mds {
        Mds {
            universe: Some(universe.to_string()),
            token_prefix: Some(prefix.to_string()),
            ..Mds::default()
        }
    }
}

async fn mds_universe(State(s): State<Mds>, headers: HeaderMap) -> Response {
    s.universe_seen.push(&headers, "");
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return StatusCode::FORBIDDEN.into_response();
    }
    match &s.universe {
        Some(u) => u.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

impl Mds {
    /// Answers the first `n` requests with `status`, then issues tokens.
    pub fn failing(n: usize, status: u16) -> Mds {
        Mds {
            fail_first: Arc::new(AtomicUsize::new(n)),
            fail_status: status,
            ..Mds::default()
        }
    }
}

/// The token endpoint: `ya29.mds-<n>` for the n-th token issued.
async fn mds_token(State(s): State<Mds>, headers: HeaderMap) -> Response {
    s.seen.push(&headers, "");
    if let Some(d) = s.delay {
        tokio::time::sleep(d).await;
    }
    // The real metadata server refuses requests without this header (SSRF protection).
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header.",
        )
            .into_response();
    }
    if s.fail_first
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        let status = StatusCode::from_u16(s.fail_status).unwrap();
        return (status, "metadata trouble").into_response();
    }
    let n = s.issued.fetch_add(1, Ordering::SeqCst) + 1;
    let prefix = s.token_prefix.as_deref().unwrap_or("ya29.mds");
    let mut body = json!({"access_token": format!("{prefix}-{n}"), "token_type": "Bearer"});
    if !s.omit_expires_in {
        body["expires_in"] = json!(3599);
    }
    axum::Json(body).into_response()
}

/// Starts the fake with `state`; point `GCE_METADATA_HOST` at its address.
pub async fn start_mds(state: Mds) -> Fake {
    Fake::start(
        Router::new()
            .route(MDS_PATH, get(mds_token))
            .route(UNIVERSE_PATH, get(mds_universe))
            .with_state(state),
    )
    .await
}
