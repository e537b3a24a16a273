//! How much the endpoint takes at once: requests in flight (more are shed with 503 at
//! once), the end-to-end request timeout (504), and per-connection limits (open
//! connections, header size and read time, how long an answer may wait unwritten) that
//! the listener enforces with hyper.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::error::AppError;

/// Per-connection limits, enforced by the listener with hyper.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Most open connections; further clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Longest time a client may take to send its request headers; it also bounds how
    /// long a keep-alive connection may sit idle waiting for its next request.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers) read; more is answered 431.
    pub max_header_bytes: usize,
    /// Longest time an answer may wait to be written without a byte of progress (the
    /// client does not read, so the socket's send buffer stays full); the connection is
    /// then closed with a reset and its slot freed. A request waiting on upstream does no
    /// I/O and is not cut by this (the request timeout bounds it).
    pub write_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 16_384,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            write_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug)]
pub(super) struct Guard {
    pub(super) in_flight: Semaphore,
    pub(super) timeout: Duration,
}

pub(super) async fn limit(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
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
