//! The HTTP calls every identity source shares: bounded retries, status → error kind,
//! and token-response parsing that never lets a token or a raw body reach a message.
//!
//! Reads no env var. Proxies: the API client honours `HTTPS_PROXY`/`NO_PROXY` (reqwest's
//! system proxy support); the metadata client never uses a proxy.

pub use regbroker_provider::HttpSettings;
use regbroker_provider::{Error, MAX_UPSTREAM_BODY};
use secrecy::SecretString;
use serde::Deserialize;

/// Which upstream a call goes to; decides how some statuses are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upstream {
    /// The GCE/GKE metadata server.
    Metadata,
    /// An OAuth token endpoint (`token_uri`) or the STS (`token_url`).
    TokenEndpoint,
    /// The IAM Credentials `generateAccessToken` call (impersonation).
    Impersonation,
    /// A URL-sourced subject token (external_account `credential_source.url`).
    SubjectTokenUrl,
}

impl Upstream {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Upstream::Metadata => "GCE metadata server",
            Upstream::TokenEndpoint => "token endpoint",
            Upstream::Impersonation => "service-account impersonation endpoint",
            Upstream::SubjectTokenUrl => "subject token URL",
        }
    }
}

/// A response whose status was 2xx, with its body read.
pub(crate) struct Success {
    /// Token answers hold access tokens: wiped on drop.
    pub(crate) body: secrecy::zeroize::Zeroizing<Vec<u8>>,
}

/// Why one attempt failed, before it is turned into a provider [`Error`].
enum Failure {
    Connect(reqwest::Error),
    Timeout(reqwest::Error),
    Other(reqwest::Error),
    Status(u16, Vec<u8>),
}

impl Failure {
    fn retryable(&self) -> bool {
        match self {
            // A refused connection may be a metadata server still starting (GKE pods can
            // start before it); a connect timeout is not retried, so that a host without
            // one fails after one connect timeout rather than several.
            Failure::Connect(e) => !e.is_timeout(),
            Failure::Status(s, _) => *s == 429 || *s >= 500,
            Failure::Timeout(_) | Failure::Other(_) => false,
        }
    }
}

/// Builds a client: no redirects (a token endpoint that redirects is not followed, so a
/// form holding an assertion or subject token is never re-sent elsewhere), bounded
/// timeouts, and a proxy only when `proxy` is set.
pub(crate) fn client(settings: &HttpSettings, proxy: bool) -> Result<reqwest::Client, Error> {
    let builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(settings.connect_timeout)
        .timeout(settings.request_timeout);
    let builder = if proxy { builder } else { builder.no_proxy() };
    builder
        .build()
        .map_err(|e| Error::invalid_config("cannot build the HTTP client").with_source(e))
}

/// Sends the request `build` makes, retrying 5xx, 429 and refused connections with
/// exponential backoff, and maps the final failure to an error kind.
///
/// `what` names the upstream in error messages (`GCE metadata server at 127.0.0.1:8080`);
/// it must not hold a secret.
pub(crate) async fn send(
    settings: &HttpSettings,
    upstream: Upstream,
    what: &str,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<Success, Error> {
    send_inner(settings, upstream, what, build, false)
        .await?
        .ok_or_else(|| Error::bad_response(format!("{what} answered HTTP 404")))
}

/// As [`send`], but a 404 is `Ok(None)` (an endpoint an older server lacks).
pub(crate) async fn send_optional(
    settings: &HttpSettings,
    upstream: Upstream,
    what: &str,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<Option<Success>, Error> {
    send_inner(settings, upstream, what, build, true).await
}

async fn send_inner(
    settings: &HttpSettings,
    upstream: Upstream,
    what: &str,
    build: impl Fn() -> reqwest::RequestBuilder,
    absent_ok: bool,
) -> Result<Option<Success>, Error> {
    let attempts = settings.attempts.max(1);
    let mut delay = settings.backoff;
    let mut attempt = 1;
    loop {
        let failure = match build().send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match read_capped(resp).await {
                    Err(TooLarge) if (200..300).contains(&status) => {
                        return Err(Error::bad_response(format!(
                            "{what} answered with a body larger than {MAX_UPSTREAM_BODY} bytes"
                        )));
                    }
                    // An error body over the cap is not read; the status still counts.
                    Err(TooLarge) => Failure::Status(status, Vec::new()),
                    Ok(Ok(_)) if status == 404 && absent_ok => return Ok(None),
                    Ok(Ok(body)) if (200..300).contains(&status) => {
                        tracing::debug!(
                            upstream = upstream.as_str(),
                            status,
                            "Token call answered"
                        );
                        return Ok(Some(Success { body }));
                    }
                    Ok(Ok(body)) => Failure::Status(status, body.to_vec()),
                    Ok(Err(e)) if e.is_timeout() => Failure::Timeout(e),
                    Ok(Err(e)) => Failure::Other(e),
                }
            }
            Err(e) if e.is_connect() => Failure::Connect(e),
            Err(e) if e.is_timeout() => Failure::Timeout(e),
            Err(e) => Failure::Other(e),
        };
        if attempt < attempts && failure.retryable() {
            tracing::debug!(
                upstream = upstream.as_str(),
                attempt,
                ?delay,
                "Token call failed, retrying"
            );
            tokio::time::sleep(delay).await;
            delay = delay.saturating_mul(2);
            attempt += 1;
            continue;
        }
        return Err(to_error(upstream, what, failure));
    }
}

/// A body over [`MAX_UPSTREAM_BODY`].
struct TooLarge;

/// Reads a body of at most [`MAX_UPSTREAM_BODY`] bytes into memory that is wiped on drop;
/// nothing past the cap is buffered. `Ok(Err(..))` is a transport error while reading.
async fn read_capped(
    mut resp: reqwest::Response,
) -> Result<Result<secrecy::zeroize::Zeroizing<Vec<u8>>, reqwest::Error>, TooLarge> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_UPSTREAM_BODY as u64)
    {
        return Err(TooLarge);
    }
    let mut body = secrecy::zeroize::Zeroizing::new(Vec::new());
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_UPSTREAM_BODY {
                    return Err(TooLarge);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Ok(body)),
            Err(e) => return Ok(Err(e)),
        }
    }
}

fn to_error(upstream: Upstream, what: &str, failure: Failure) -> Error {
    match failure {
        Failure::Connect(e) if upstream == Upstream::Metadata => Error::identity_missing(format!(
            "no GCP identity: GOOGLE_APPLICATION_CREDENTIALS is not set and no {what} could be reached (set GCE_METADATA_HOST to override its address)"
        ))
        .with_source(e.without_url()),
        Failure::Connect(e) => {
            Error::unavailable(format!("{what} could not be reached")).with_source(e.without_url())
        }
        Failure::Timeout(e) => {
            Error::timed_out(format!("{what} did not answer in time")).with_source(e.without_url())
        }
        Failure::Other(e) => {
            Error::unavailable(format!("call to {what} failed")).with_source(e.without_url())
        }
        Failure::Status(status, body) => {
            // Only the OAuth `error` code is echoed, and only when it looks like one: the
            // rest of a body may hold anything.
            let code = oauth_error_code(&body)
                .map(|c| format!(" ({c})"))
                .unwrap_or_default();
            let message = format!("{what} answered HTTP {status}{code}");
            match status {
                404 if upstream == Upstream::Metadata => Error::identity_missing(format!(
                    "{message}: no service account is available to this workload (on GKE, check the Workload Identity binding of the pod's Kubernetes service account)"
                )),
                400 | 401 | 403 | 404 => Error::identity_rejected(message),
                429 => Error::throttled(message),
                s if s >= 500 => Error::unavailable(message),
                _ => Error::bad_response(message),
            }
        }
    }
}

/// The `error` field of an OAuth / Google error body, when it is a short plain code
/// (`invalid_grant`, `PERMISSION_DENIED`).
fn oauth_error_code(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct OAuth {
        error: serde_json::Value,
    }
    let parsed: OAuth = serde_json::from_slice(body).ok()?;
    let code = match &parsed.error {
        serde_json::Value::String(s) => s.clone(),
        // Google APIs: {"error": {"code": 403, "status": "PERMISSION_DENIED", ...}}
        serde_json::Value::Object(o) => o.get("status")?.as_str()?.to_string(),
        _ => return None,
    };
    let plain = !code.is_empty()
        && code.len() <= 40
        && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    plain.then_some(code)
}

/// An OAuth 2.0 token response (`token_uri`, STS, metadata server).
#[derive(Deserialize)]
pub(crate) struct OAuthToken {
    pub(crate) access_token: SecretString,
    #[serde(default)]
    pub(crate) expires_in: Option<u64>,
}

/// Parses a JSON token body; the error never repeats the body.
pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(
    what: &str,
    body: &[u8],
) -> Result<T, Error> {
    serde_json::from_slice(body).map_err(|e| {
        // serde_json's message names the line and column and the missing field, never the
        // values around them.
        Error::bad_response(format!("{what} answered with an unexpected body")).with_source(
            std::io::Error::other(format!(
                "{} at line {} column {}",
                classify_json_error(&e),
                e.line(),
                e.column()
            )),
        )
    })
}

fn classify_json_error(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "I/O error",
        serde_json::error::Category::Syntax => "invalid JSON",
        serde_json::error::Category::Data => "missing or mistyped field",
        serde_json::error::Category::Eof => "truncated JSON",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answered_statuses_map_to_error_kinds_and_only_429_and_5xx_are_retried() {
        use regbroker_provider::ErrorKind as K;
        let kind = |upstream, status| {
            to_error(upstream, "the call", Failure::Status(status, Vec::new())).kind()
        };
        for (status, want) in [
            (400, K::IdentityRejected),
            (401, K::IdentityRejected),
            (403, K::IdentityRejected),
            (404, K::IdentityRejected),
            (429, K::Throttled),
            (500, K::Unavailable),
            (503, K::Unavailable),
            (302, K::BadResponse),
            (418, K::BadResponse),
        ] {
            assert_eq!(kind(Upstream::TokenEndpoint, status), want, "{status}");
            assert_eq!(
                Failure::Status(status, Vec::new()).retryable(),
                status == 429 || status >= 500,
                "{status}"
            );
        }
        // The metadata server's 404: no service account for this workload.
        assert_eq!(kind(Upstream::Metadata, 404), K::IdentityMissing);
        assert_eq!(kind(Upstream::Metadata, 403), K::IdentityRejected);
        let message = to_error(
            Upstream::TokenEndpoint,
            "the call",
            Failure::Status(403, br#"{"error":"invalid_grant"}"#.to_vec()),
        );
        assert_eq!(
            message.message(),
            "the call answered HTTP 403 (invalid_grant)"
        );
    }

    #[test]
    fn oauth_error_codes_are_echoed_only_when_plain() {
        assert_eq!(
            oauth_error_code(br#"{"error":"invalid_grant","error_description":"secret stuff"}"#),
            Some("invalid_grant".to_string())
        );
        assert_eq!(
            oauth_error_code(
                br#"{"error":{"code":403,"status":"PERMISSION_DENIED","message":"x"}}"#
            ),
            Some("PERMISSION_DENIED".to_string())
        );
        assert_eq!(
            oauth_error_code(br#"{"error":"ya29.a token lookalike"}"#),
            None
        );
        assert_eq!(oauth_error_code(b"not json"), None);
    }

    #[test]
    fn parse_errors_do_not_repeat_the_body() {
        let body = br#"{"access_token": 12, "secret": "ya29.leaked"}"#;
        let e = parse_json::<OAuthToken>("token endpoint", body)
            .err()
            .map(|e| e.chain());
        let chain = e.unwrap_or_default();
        assert!(chain.contains("unexpected body"), "{chain}");
        assert!(!chain.contains("ya29"), "{chain}");
    }
}
