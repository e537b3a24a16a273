//! The sidecar HTTP endpoint.
//!
//! - `GET /v1/credentials?registry=HOST`: `200 {"registry","username","password","expiresAt","provider"}`,
//!   `404` when nothing applies (the client should go anonymous), `400` for a malformed
//!   registry, `403` when the identity is missing or rejected, `502`/`503`/`504` for
//!   upstream failures. Errors are `{"error": {"code", "message"}}` and never hold a secret.
//! - `GET /v1/providers`: each provider, compiled in or not, its identity kind, last fetch
//!   and registry patterns (`providers.rs`); behind the same token as credentials.
//! - `GET /healthz` (alive), `GET /readyz` (configuration and static secrets loaded; with
//!   `--ready-requires-sinks` also every sink written since start; `?verbose` lists each
//!   check), `GET /metrics` (Prometheus text).
//!
//! This module holds the router and the handlers; `front` the layer every request
//! passes (counting, in-flight cap, timeout, token); [`AppError`] is the error answer and
//! its status mapping; [`access`] decides who may ask, [`limits`] how much at once, and
//! [`listen`] binds TCP or unix sockets and serves them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use regbroker_provider::{ExposeSecret, Registry, SecretString};
use std::time::Duration;

pub mod access;
mod answer;
mod error;
mod front;
pub mod limits;
pub mod listen;
mod providers;
pub mod tls;
mod watchdog;

pub use error::AppError;
pub use front::{App, AppFuture};

pub use limits::ConnLimits;
pub use listen::{Bound, Listen};

use crate::broker::Broker;
use crate::metrics::Metrics;
use front::{Front, Limit};

/// Most bytes of query string accepted.
const MAX_QUERY_LEN: usize = 2048;

/// Shared state of the handlers.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The broker.
    pub broker: Arc<Broker>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Flips to true once start-up work is done.
    pub ready: Arc<AtomicBool>,
}

/// Who may ask, and how much at once.
#[derive(Clone, Debug)]
pub struct Options {
    /// When set, `/v1/credentials` requires `Authorization: Bearer <token>`.
    pub bearer_token: Option<Arc<SecretString>>,
    /// Most requests handled at once; more are answered 503 at once (load shedding).
    pub max_in_flight: usize,
    /// Longest a request may take end to end.
    pub request_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bearer_token: None,
            max_in_flight: 16_384,
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// The endpoint with default [`Options`] (no token).
pub fn app(state: AppState) -> App {
    app_with(state, Options::default())
}

/// The endpoint: the routes below, behind `front`'s layer (counting, limits, token).
pub fn app_with(state: AppState, options: Options) -> App {
    let router = Router::new()
        .route("/v1/credentials", get(credentials).delete(refused))
        .route("/v1/providers", get(providers::providers))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::new(state.clone()));
    App::new(
        router,
        Front {
            metrics: state.metrics,
            limit: Some(Limit {
                in_flight: AtomicUsize::new(0),
                max: options.max_in_flight,
                timeout: options.request_timeout,
            }),
            token: options.bearer_token,
        },
    )
}

/// The probe endpoint: `/healthz`, `/readyz` and `/metrics` only, never credentials. It
/// serves `serve --probe-listen`, so the kubelet can probe (and Prometheus scrape) a
/// sidecar whose credential endpoint listens on loopback. Counted, not limited.
pub fn probe_app(state: AppState) -> App {
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::new(state.clone()));
    App::new(
        router,
        Front {
            metrics: state.metrics,
            limit: None,
            token: None,
        },
    )
}

/// `DELETE /v1/credentials?registry=HOST`: the client's registry refused the credential
/// it got. The cached one is dropped and the next `GET` fetches anew (single-flight),
/// at most once per `refetch_interval` per credential (`429` with `Retry-After` within
/// it). A static entry cannot be fetched anew (`409`); a registry nothing serves is
/// `404` and a malformed one `400`, as for `GET`.
async fn refused(State(state): State<Arc<AppState>>, uri: Uri) -> Result<Response, AppError> {
    let registry = registry_param(uri.query().unwrap_or_default())?;
    match state.broker.report_refused(&registry).await? {
        crate::broker::Reported::Forgotten => Ok(StatusCode::NO_CONTENT.into_response()),
        crate::broker::Reported::TooSoon(wait) => {
            let secs = wait.as_secs().max(1);
            let mut res = AppError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: "refetch_too_soon",
                message: format!(
                    "{registry}'s credential was fetched anew on a report less than refetch_interval ago; try again in {secs} s"
                ),
            }
            .into_response();
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            Ok(res)
        }
        crate::broker::Reported::Static => Err(AppError {
            status: StatusCode::CONFLICT,
            code: "static_credential",
            message: format!(
                "{registry} is served from a static entry, which cannot be fetched anew: update the docker config it comes from"
            ),
        }),
    }
}

/// The one `registry` query parameter of `/v1/credentials`, parsed. The query is read
/// where it lies: a value is copied only when it is percent-encoded.
fn registry_param(query: &str) -> Result<Registry, AppError> {
    if query.len() > MAX_QUERY_LEN {
        return Err(AppError::bad_request(format!(
            "query string longer than {MAX_QUERY_LEN} bytes"
        )));
    }
    let mut values = query_values(query, "registry");
    let raw = match (values.next(), values.next()) {
        (Some(v), None) => v,
        (None, _) => return Err(AppError::bad_request("missing query parameter `registry`")),
        (Some(_), Some(_)) => {
            return Err(AppError::bad_request(
                "query parameter `registry` given more than once",
            ));
        }
    };
    Registry::parse(&raw).map_err(|e| AppError {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_registry",
        message: e.to_string(),
    })
}

/// Whether decoding can change `query`: it holds a `%` (an escape) or a `+` (a space).
fn needs_decoding(query: &str) -> bool {
    query.bytes().any(|b| b == b'%' || b == b'+')
}

/// The values of `name` in a query string, decoded as `application/x-www-form-urlencoded`.
/// A query with no `%` and no `+` decodes to itself, so it is split where it lies
/// (`form_urlencoded` would check every byte of every key and value once more).
fn query_values<'q>(
    query: &'q str,
    name: &'q str,
) -> impl Iterator<Item = std::borrow::Cow<'q, str>> + 'q {
    let plain = !needs_decoding(query);
    let split = plain
        .then(|| {
            query
                .split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
                .filter(move |(k, _)| *k == name)
                .map(|(_, v)| std::borrow::Cow::Borrowed(v))
        })
        .into_iter()
        .flatten();
    let decoded = (!plain)
        .then(|| {
            form_urlencoded::parse(query.as_bytes())
                .filter(move |(k, _)| k == name)
                .map(|(_, v)| v)
        })
        .into_iter()
        .flatten();
    split.chain(decoded)
}

async fn credentials(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
) -> Result<Response, AppError> {
    let query = request.uri().query().unwrap_or_default();
    let miss = match state.broker.kept_answer(query) {
        Ok(body) => return Ok(credential_answer(body)),
        Err(miss) => miss,
    };
    let registry = registry_param(query)?;
    let served = state.broker.credential(&registry).await?;
    let expires = served
        .credential
        .expires_at()
        .filter(|t| *t > state.broker.now())
        .map(crate::rfc3339);
    let body = answer::CredentialBody {
        expires_at: expires.as_deref(),
        password: served.credential.secret().expose_secret(),
        provider: served.source,
        registry: served.registry.as_str(),
        username: served.credential.username(),
    }
    .to_bytes();
    state.broker.keep_answer(query, miss, &served, body.clone());
    Ok(credential_answer(body))
}

/// The `200` answer with a credential: `no-store`, so no proxy or client cache keeps it.
fn credential_answer(body: bytes::Bytes) -> Response {
    let mut res = Response::new(axum::body::Body::from(body));
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// `/readyz`: `200 ok` once start-up work is done and, with `--ready-requires-sinks`,
/// every sink this replica writes has been written since start. With `?verbose` (or on
/// failure) each check on a line, as kube-apiserver prints them: `[+]name ok` or
/// `[-]name failed: reason`, then `readyz check passed` or `readyz check failed`. A sink
/// that does not gate readiness is still listed, with `[-]` when it is not written.
/// Reasons are codes and counts, never a message or a secret (the probe port has no
/// token).
async fn readyz(State(state): State<Arc<AppState>>, RawQuery(query): RawQuery) -> Response {
    let verbose = query.as_deref().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    let started = state.ready.load(Ordering::Acquire);
    let required = state.metrics.sinks.required();
    let mut lines = Vec::new();
    lines.push(if started {
        "[+]startup ok".to_string()
    } else {
        "[-]startup failed: starting".to_string()
    });
    let mut ready = started;
    for sink in state.metrics.sinks.snapshot() {
        let passes = sink.state().passes();
        ready &= passes || !required;
        let (mark, verdict) = if passes { ('+', "ok") } else { ('-', "failed") };
        let mut line = format!("[{mark}]sink/{} {verdict}", sink.name);
        if let Some(detail) = sink.check_detail() {
            line.push_str(": ");
            line.push_str(&detail);
        }
        if !passes && !required {
            line.push_str(" (not required for readiness: --ready-requires-sinks is off)");
        }
        lines.push(line);
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = if ready && !verbose {
        "ok\n".to_string()
    } else if !started && !verbose {
        // What a starting process has always answered.
        "starting\n".to_string()
    } else {
        let verdict = if ready { "passed" } else { "failed" };
        format!("{}\nreadyz check {verdict}\n", lines.join("\n"))
    };
    let mut res = (status, body).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// OpenMetrics for a client that accepts it (Prometheus does), else the Prometheus text
/// format, as Prometheus' own client libraries negotiate.
async fn metrics(State(state): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> Response {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            state.metrics.encode(),
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            )],
            state.metrics.encode_text(),
        )
            .into_response()
    }
}

/// A known path with another method: the JSON error body like every other error (axum
/// adds the `Allow` header).
async fn method_not_allowed(method: axum::http::Method) -> AppError {
    AppError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        code: "method_not_allowed",
        message: format!(
            "{} is not allowed here; every endpoint answers GET",
            regbroker_provider::printable(method.as_str(), 16)
        ),
    }
}

async fn not_found() -> AppError {
    AppError {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: "no such endpoint; try GET /v1/credentials?registry=HOST".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_percent_or_a_plus_needs_decoding() {
        for q in ["", "registry=gcr.io", "registry=gcr.io:5000&x=a/b?c#d=e"] {
            assert!(!needs_decoding(q), "{q:?}");
        }
        for q in [
            "%",
            "+",
            "registry=gcr.io%3A443",
            "registry=a+b",
            "x=+&registry=gcr.io",
        ] {
            assert!(needs_decoding(q), "{q:?}");
        }
    }

    #[test]
    fn a_plain_query_is_split_as_form_urlencoded_decodes_it() {
        let queries = [
            "",
            "registry=gcr.io",
            "registry=gcr.io&registry=ghcr.io",
            "a=1&&registry=gcr.io&",
            "registry",
            "registry=",
            "registry=a=b",
            "=gcr.io&registry=x",
            "registryx=1&xregistry=2&registry=3",
            "registry=gcr.io%3A443",
            "registry=a+b",
            "reg%69stry=gcr.io",
            "registry=%zz",
            "registry=caf\u{e9}.example",
        ];
        for q in queries {
            let ours: Vec<String> = query_values(q, "registry")
                .map(|v| v.into_owned())
                .collect();
            let reference: Vec<String> = form_urlencoded::parse(q.as_bytes())
                .filter(|(k, _)| k == "registry")
                .map(|(_, v)| v.into_owned())
                .collect();
            assert_eq!(ours, reference, "{q:?}");
        }
    }
}
