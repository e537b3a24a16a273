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
//! and each sink (the docker config file, each synced Secret) with what it has written
//! since start:
//!
//! ```json
//! {"sinks": [{"name": "secret/flux-system/regbroker-oci", "kind": "secret",
//!   "state": "never_written", "lastSuccess": null, "lastAttempt": "2026-01-01T00:00:05Z",
//!   "writeError": null,
//!   "registries": [{"registry": "123456789012.dkr.ecr.us-east-1.amazonaws.com",
//!                   "outcome": "identity_missing"}]}]}
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
    sinks: Vec<Sink>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Sink {
    name: String,
    kind: &'static str,
    state: &'static str,
    last_success: Option<String>,
    last_attempt: Option<String>,
    write_error: Option<&'static str>,
    registries: Vec<SinkRegistry>,
}

#[derive(Serialize)]
struct SinkRegistry {
    registry: String,
    outcome: &'static str,
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

pub(super) async fn providers(State(state): State<std::sync::Arc<AppState>>) -> Response {
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
    let sinks = state
        .metrics
        .sinks
        .snapshot()
        .into_iter()
        .map(|s| Sink {
            state: s.state().as_str(),
            kind: s.kind.as_str(),
            last_success: s.last_success.map(crate::rfc3339),
            last_attempt: s.last_attempt.map(crate::rfc3339),
            write_error: s.write_error,
            registries: s
                .registries
                .into_iter()
                .map(|(r, outcome)| SinkRegistry {
                    registry: r.to_string(),
                    outcome,
                })
                .collect(),
            name: s.name,
        })
        .collect();
    let mut res = axum::Json(Body { providers, sinks }).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}
