//! A fake of oauth2.googleapis.com's token endpoint for service-account keys (axum on
//! 127.0.0.1:0), serving `POST /token`: Google's service cannot run here.

use std::sync::Arc;

use aws_lc_rs::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::json;

use super::{Fake, Seen, form};

/// What the fake saw, and the key it checks assertions with.
#[derive(Clone)]
pub struct TokenEndpoint {
    pub seen: Seen,
    /// DER `RSAPublicKey` the assertion must verify with.
    pub public_key: Arc<Vec<u8>>,
    /// Refuse every request with `invalid_grant`.
    pub reject: bool,
}

/// Checks what oauth2.googleapis.com checks for the JWT-bearer grant: the grant type and
/// an RS256 assertion signed by the key's private half.
async fn oauth_token(State(s): State<TokenEndpoint>, headers: HeaderMap, body: String) -> Response {
    s.seen.push(&headers, &body);
    if s.reject {
        let body = json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature. secret-detail"});
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    let f = form(&body);
    if f.get("grant_type").map(String::as_str)
        != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "unsupported_grant_type"})),
        )
            .into_response();
    }
    let assertion = f.get("assertion").cloned().unwrap_or_default();
    let Some((signing_input, sig)) = assertion.rsplit_once('.') else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_request"})),
        )
            .into_response();
    };
    let sig = URL_SAFE_NO_PAD.decode(sig).unwrap_or_default();
    let key = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, s.public_key.as_slice());
    if key.verify(signing_input.as_bytes(), &sig).is_err() {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_grant"})),
        )
            .into_response();
    }
    axum::Json(json!({"access_token": "ya29.from-key", "expires_in": 3600, "token_type": "Bearer"}))
        .into_response()
}

impl TokenEndpoint {
    /// Checks assertions against `public_key` (DER); `reject` refuses them all.
    pub fn new(public_key: &[u8], reject: bool) -> TokenEndpoint {
        TokenEndpoint {
            seen: Seen::default(),
            public_key: Arc::new(public_key.to_vec()),
            reject,
        }
    }
}

/// Starts the fake with `state`; its token URI is `fake.url("/token")`.
pub async fn start_token_endpoint(state: TokenEndpoint) -> Fake {
    Fake::start(
        Router::new()
            .route("/token", post(oauth_token))
            .with_state(state),
    )
    .await
}
