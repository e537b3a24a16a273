//! The endpoint's error answer: `{"error": {"code", "message"}}` with `no-store`, and the
//! mapping from the broker's error kinds to HTTP statuses (404 go anonymous, 403 identity,
//! 503 throttled, unavailable or overloaded, 504 timed out, 502 bad upstream answer). Upstream detail
//! never reaches the body: the cause chain goes only to the log.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use regbroker_provider::ErrorKind;
use serde_json::json;

use crate::broker::BrokerError;

/// An error answered to the client.
#[derive(Debug)]
pub struct AppError {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
}

impl AppError {
    pub(super) fn bad_request(message: impl Into<String>) -> AppError {
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
            ErrorKind::Throttled | ErrorKind::Unavailable | ErrorKind::Overloaded => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorKind::TimedOut => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::BadResponse | ErrorKind::CredentialRejected => StatusCode::BAD_GATEWAY,
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
