//! `GET /v1/providers`: which providers this sidecar has and what each could serve, for a
//! UI that offers only the providers that work where it runs.
//!
//! ```json
//! {"providers": [{"name": "aws", "compiledIn": true, "identity": "irsa",
//!   "lastFetch": {"outcome": "ok", "at": "2026-01-01T00:00:00Z"},
//!   "registries": {"rules": ["ecr-proxy.example.com"],
//!                  "autoDetected": ["*.dkr.ecr.*.amazonaws.com", "public.ecr.aws"]}}]}
//! ```
//!
//! Nothing here is a secret: identity kinds, `ok` or an error code, patterns. Behind the
//! same bearer token as `/v1/credentials`.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;

#[derive(Serialize)]
struct Body {
    providers: Vec<Provider>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Provider {
    name: &'static str,
    compiled_in: bool,
    identity: Option<&'static str>,
    last_fetch: Option<LastFetch>,
    registries: Registries,
}

#[derive(Serialize)]
struct LastFetch {
    outcome: &'static str,
    at: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Registries {
    rules: Vec<String>,
    auto_detected: Vec<String>,
}

pub(super) async fn providers(State(state): State<AppState>) -> Response {
    let providers = state
        .broker
        .provider_statuses()
        .into_iter()
        .map(|p| Provider {
            name: p.name,
            compiled_in: p.compiled_in,
            identity: p.identity.map(|i| i.as_str()),
            last_fetch: p.last_fetch.map(|l| LastFetch {
                outcome: l.outcome,
                at: crate::rfc3339(l.at),
            }),
            registries: Registries {
                rules: p.rule_patterns,
                auto_detected: p.auto_detected,
            },
        })
        .collect();
    let mut res = axum::Json(Body { providers }).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}
