//! The sidecar HTTP endpoint.
//!
//! - `GET /v1/credentials?registry=HOST`: `200 {"registry","username","password","expiresAt","provider"}`,
//!   `404` when nothing applies (the client should go anonymous), `400` for a malformed
//!   registry, `403` when the identity is missing or rejected, `502`/`503`/`504` for
//!   upstream failures. Errors are `{"error": {"code", "message"}}` and never hold a secret.
//! - `GET /healthz` (alive), `GET /readyz` (configuration and static secrets loaded),
//!   `GET /metrics` (Prometheus text).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{MatchedPath, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use regbroker_provider::{ErrorKind, ExposeSecret, Registry, SecretString};
use serde_json::json;
use std::time::Duration;
use tokio::sync::Semaphore;

use crate::broker::{Broker, BrokerError};
use crate::metrics::Metrics;

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

/// The router with default [`Options`] (no token).
pub fn app(state: AppState) -> Router {
    app_with(state, Options::default())
}

/// The router.
pub fn app_with(state: AppState, options: Options) -> Router {
    let credentials_route = get(credentials).route_layer(middleware::from_fn_with_state(
        options.bearer_token.clone(),
        require_token,
    ));
    let guard = Arc::new(Guard {
        in_flight: Semaphore::new(options.max_in_flight),
        timeout: options.request_timeout,
    });
    Router::new()
        .route("/v1/credentials", credentials_route)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(guard, limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

#[derive(Debug)]
struct Guard {
    in_flight: Semaphore,
    timeout: Duration,
}

async fn limit(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let Ok(_permit) = guard.in_flight.try_acquire() else {
        return AppError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "overloaded",
            message: "too many requests in flight; retry shortly".into(),
        }
        .into_response();
    };
    match tokio::time::timeout(guard.timeout, next.run(req)).await {
        Ok(res) => res,
        Err(_) => AppError {
            status: StatusCode::GATEWAY_TIMEOUT,
            code: "request_timeout",
            message: format!(
                "request took longer than {}",
                humantime::format_duration(guard.timeout)
            ),
        }
        .into_response(),
    }
}

/// Constant-time check of `Authorization: Bearer <token>` (the length is not hidden).
async fn require_token(
    State(token): State<Option<Arc<SecretString>>>,
    req: Request,
    next: Next,
) -> Response {
    use subtle::ConstantTimeEq as _;
    let Some(token) = token else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    let ok = presented.is_some_and(|p| bool::from(p.ct_eq(token.expose_secret().as_bytes())));
    if ok {
        return next.run(req).await;
    }
    let mut res = AppError {
        status: StatusCode::UNAUTHORIZED,
        code: "unauthorized",
        message: "this endpoint needs `Authorization: Bearer <token>` with the configured token"
            .into(),
    }
    .into_response();
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// The probe router: `/healthz`, `/readyz` and `/metrics` only, never credentials. It
/// serves `serve --probe-listen`, so the kubelet can probe (and Prometheus scrape) a
/// sidecar whose credential endpoint listens on loopback.
pub fn probe_app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = match req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        Some("/v1/credentials") => "/v1/credentials",
        Some("/healthz") => "/healthz",
        Some("/readyz") => "/readyz",
        Some("/metrics") => "/metrics",
        _ => "other",
    };
    let response = next.run(req).await;
    state
        .metrics
        .http_request(route, response.status().as_u16());
    response
}

/// An error answered to the client.
#[derive(Debug)]
pub struct AppError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl AppError {
    fn bad_request(message: impl Into<String>) -> AppError {
        AppError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_request",
            message: message.into(),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut res = (self.status, axum::Json(body)).into_response();
        res.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        res
    }
}

impl From<BrokerError> for AppError {
    fn from(e: BrokerError) -> AppError {
        let kind = e.kind();
        let status = match kind {
            ErrorKind::NotConfigured => StatusCode::NOT_FOUND,
            ErrorKind::IdentityMissing | ErrorKind::IdentityRejected => StatusCode::FORBIDDEN,
            ErrorKind::Throttled | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::TimedOut => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::BadResponse => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        // Provider messages are written to be safe for clients; the cause chain, which
        // may quote upstream detail, goes only to the log (by the broker).
        AppError {
            status,
            code: kind.code(),
            message: e.to_string(),
        }
    }
}

async fn credentials(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, AppError> {
    let query = query.unwrap_or_default();
    if query.len() > MAX_QUERY_LEN {
        return Err(AppError::bad_request(format!(
            "query string longer than {MAX_QUERY_LEN} bytes"
        )));
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(&query)
        .map_err(|_| AppError::bad_request("malformed query string"))?;
    let mut values = pairs
        .iter()
        .filter(|(k, _)| k == "registry")
        .map(|(_, v)| v);
    let raw = match (values.next(), values.next()) {
        (Some(v), None) => v,
        (None, _) => return Err(AppError::bad_request("missing query parameter `registry`")),
        (Some(_), Some(_)) => {
            return Err(AppError::bad_request(
                "query parameter `registry` given more than once",
            ));
        }
    };
    let registry = Registry::parse(raw).map_err(|e| AppError {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_registry",
        message: e.to_string(),
    })?;
    let served = state.broker.credential(&registry).await?;
    let expires = served
        .credential
        .expires_at()
        .filter(|t| *t > state.broker.now())
        .map(crate::rfc3339);
    let mut res = axum::Json(CredentialBody {
        expires_at: expires.as_deref(),
        password: served.credential.secret().expose_secret(),
        provider: served.source,
        registry: served.registry.as_str(),
        username: served.credential.username(),
    })
    .into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// The 200 answer of `/v1/credentials`, serialised straight from borrowed fields (a
/// `serde_json::Value` made a second, unzeroised copy of the secret and a map per
/// request). Fields in the order earlier releases printed them (alphabetical);
/// `expiresAt` is `null` for a credential without a known expiry.
#[derive(serde::Serialize)]
struct CredentialBody<'a> {
    #[serde(rename = "expiresAt")]
    expires_at: Option<&'a str>,
    password: &'a str,
    provider: &'a str,
    registry: &'a str,
    username: &'a str,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

async fn not_found() -> AppError {
    AppError {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: "no such endpoint; try GET /v1/credentials?registry=HOST".into(),
    }
}

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address (loopback by default).
    Tcp(SocketAddr),
    /// A unix socket path.
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/regbroker/sock".into());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        s.parse::<SocketAddr>().map(Listen::Tcp).map_err(|_| {
            format!("`{s}` is neither HOST:PORT (an IP address and port) nor unix:PATH")
        })
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Bound {
    /// TCP.
    Tcp(tokio::net::TcpListener),
    /// Unix socket.
    Unix(tokio::net::UnixListener, PathBuf),
}

impl Bound {
    /// Binds `listen`. A unix socket gets mode 0600; a stale socket file is replaced.
    pub async fn bind(listen: &Listen) -> std::io::Result<Bound> {
        Bound::bind_with(listen, None).await
    }

    /// As [`Bound::bind`]; with `socket_group`, a unix socket is given to that group with
    /// mode 0660 so members of the group may connect.
    pub async fn bind_with(listen: &Listen, socket_group: Option<u32>) -> std::io::Result<Bound> {
        match listen {
            Listen::Tcp(addr) => Ok(Bound::Tcp(tokio::net::TcpListener::bind(addr).await?)),
            Listen::Unix(path) => {
                use std::os::unix::fs::{FileTypeExt, PermissionsExt};
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if meta.file_type().is_socket() {
                        std::fs::remove_file(path)?;
                    } else {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            format!("{} exists and is not a socket", path.display()),
                        ));
                    }
                }
                let listener = tokio::net::UnixListener::bind(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                if let Some(gid) = socket_group {
                    std::os::unix::fs::chown(path, None, Some(gid))?;
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
                }
                Ok(Bound::Unix(listener, path.clone()))
            }
        }
    }

    /// What was bound, with the real port for `:0`.
    pub fn local(&self) -> String {
        match self {
            Bound::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            Bound::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }

    /// Serves `app` until `shutdown` completes, then finishes in-flight requests.
    pub async fn serve(
        self,
        app: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.serve_with(app, shutdown, ConnLimits::default()).await
    }

    /// As [`Bound::serve`], with connection limits.
    pub async fn serve_with(
        self,
        app: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        limits: ConnLimits,
    ) -> std::io::Result<()> {
        match self {
            Bound::Tcp(l) => accept_loop(l, app, shutdown, limits).await,
            Bound::Unix(l, path) => {
                let r = accept_loop(l, app, shutdown, limits).await;
                let _ = std::fs::remove_file(path);
                r
            }
        }
    }
}

/// Per-connection limits, enforced by hyper.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Most open connections; further clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Longest time a client may take to send its request headers.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers) read; more is answered 431.
    pub max_header_bytes: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 16_384,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
        }
    }
}

async fn accept_loop<L>(
    listener: L,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: ConnLimits,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Io: Send + 'static,
{
    let mut listener = listener;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let service = hyper_util::service::TowerToHyperService::new(app);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (io, _peer) = tokio::select! {
            conn = listener.accept() => conn,
            _ = &mut shutdown => break,
        };
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service.clone());
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "Connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
