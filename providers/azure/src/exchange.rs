//! The ACR token exchange: an Entra ID access token in, an ACR refresh token out.
//!
//! Reads no env var. `POST <exchange url>` (by default `https://<registry>/oauth2/exchange`)
//! with the form `grant_type=access_token`, `service=<registry>`, `tenant=<tenant>` (when
//! known) and `access_token=<Entra ID token>`. The answer's `refresh_token` is the
//! registry password for the username [`ACR_USERNAME`]; its expiry is the JWT `exp`
//! claim, read without verifying the signature (the registry verifies it, we only
//! schedule the refresh). A refresh token without a readable `exp` is given
//! [`FALLBACK_TTL`] from now.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use regbroker_provider::{Credential, Error, ExposeSecret, SecretString};
use serde::Deserialize;

use crate::http::{self, Http};

/// The username ACR expects with a refresh token as password.
pub const ACR_USERNAME: &str = "00000000-0000-0000-0000-000000000000";

/// How long a refresh token without a readable `exp` claim is used before it is fetched
/// again. ACR refresh tokens normally live 3 hours; 10 minutes is well inside that, so a
/// token whose lifetime we cannot read is never served past its real end.
pub const FALLBACK_TTL: Duration = Duration::from_secs(10 * 60);

/// Longest part of an upstream error message we repeat.
const MAX_UPSTREAM_MESSAGE: usize = 160;

/// One exchange request.
pub(crate) struct Request<'a> {
    pub url: &'a url::Url,
    pub service: &'a str,
    pub tenant: Option<&'a str>,
    pub access_token: &'a SecretString,
}

#[derive(Deserialize)]
struct ExchangeResponse {
    refresh_token: Option<SecretString>,
}

#[derive(Deserialize, Default)]
struct AcrErrors {
    #[serde(default)]
    errors: Vec<AcrError>,
}

#[derive(Deserialize)]
struct AcrError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Runs the exchange and turns the answer into a credential.
pub(crate) async fn exchange(
    http: &Http,
    req: Request<'_>,
    now: SystemTime,
) -> Result<Credential, Error> {
    let registry = req.service;
    // The access token travels only in this form body (no header carries it), and no
    // layer logs bodies: reqwest does not, and this crate never does.
    let body = {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "access_token");
        form.append_pair("service", req.service);
        if let Some(t) = req.tenant {
            form.append_pair("tenant", t);
        }
        form.append_pair("access_token", req.access_token.expose_secret());
        form.finish()
    };

    let sent = http
        .for_url(req.url)
        .post(req.url.clone())
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(reqwest::header::ACCEPT, "application/json")
        .body(body)
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return Err(
                Error::timed_out(format!("ACR token exchange for {registry} timed out"))
                    .with_source(e.without_url()),
            );
        }
        Err(e) => {
            return Err(Error::unavailable(format!(
                "ACR token exchange for {registry} could not be sent"
            ))
            .with_source(e.without_url()));
        }
    };
    let status = response.status();
    let what = format!("ACR token exchange for {registry}");
    let bytes = match http::read_capped(response, &what).await {
        Ok(Ok(b)) => secrecy::zeroize::Zeroizing::new(b),
        Ok(Err(e)) => {
            return Err(Error::unavailable(format!(
                "{what}: reading the answer failed (HTTP {})",
                status.as_u16()
            ))
            .with_source(e.without_url()));
        }
        // Over the cap: a 5xx or 429 is still the upstream failing, whatever its body.
        Err(_) if status.is_server_error() || status.as_u16() == 429 => {
            return Err(status_error(registry, status.as_u16(), b""));
        }
        Err(e) => return Err(e),
    };

    if !status.is_success() {
        return Err(status_error(registry, status.as_u16(), &bytes));
    }

    let answer = parse_exchange_answer(&bytes, now).map_err(|why| {
        Error::bad_response(format!("{what} answered HTTP {} {why}", status.as_u16()))
    })?;
    if answer.exp_unreadable {
        tracing::debug!(%registry, ttl = ?FALLBACK_TTL, "ACR refresh token has no readable exp; using the fallback lifetime");
    }
    Ok(Credential::issued(
        ACR_USERNAME,
        answer.refresh_token,
        Some(answer.expires_at),
        now,
    ))
}

/// A successful exchange answer, read.
#[derive(Debug)]
pub struct ExchangeAnswer {
    /// The refresh token (the registry password).
    pub refresh_token: SecretString,
    /// Its `exp`, or `now + `[`FALLBACK_TTL`] when unreadable (not yet capped: see
    /// [`Credential::issued`]).
    pub expires_at: SystemTime,
    /// Whether `exp` was missing or unreadable.
    pub exp_unreadable: bool,
}

/// Reads a 200 answer of the exchange (`{"refresh_token": "<JWT>"}`) received at `now`.
/// Pure: no I/O. The error says what is wrong in a few words and never quotes the body.
pub fn parse_exchange_answer(body: &[u8], now: SystemTime) -> Result<ExchangeAnswer, &'static str> {
    let parsed: ExchangeResponse =
        serde_json::from_slice(body).map_err(|_| "with a body that is not the expected JSON")?;
    let refresh_token = parsed
        .refresh_token
        .filter(|t| !t.expose_secret().is_empty())
        .ok_or("without a refresh_token")?;
    let (expires_at, exp_unreadable) = match jwt_exp(refresh_token.expose_secret()) {
        Some(exp) => (exp, false),
        None => (now + FALLBACK_TTL, true),
    };
    Ok(ExchangeAnswer {
        refresh_token,
        expires_at,
        exp_unreadable,
    })
}

/// Maps a non-success exchange answer to an error kind, with ACR's own code and message
/// (truncated and scrubbed of anything token-like) when the body has them.
fn status_error(registry: &str, status: u16, body: &[u8]) -> Error {
    let detail = serde_json::from_slice::<AcrErrors>(body)
        .ok()
        .and_then(|e| e.errors.into_iter().next())
        .map(|e| {
            let code = scrub(&e.code);
            let message = scrub(&e.message);
            match (code.is_empty(), message.is_empty()) {
                (true, true) => String::new(),
                (false, true) => format!(": {code}"),
                (true, false) => format!(": {message}"),
                (false, false) => format!(": {code}: {message}"),
            }
        })
        .unwrap_or_default();
    match status {
        401 | 403 => Error::identity_rejected(format!(
            "ACR {registry} rejected the Entra ID token (HTTP {status}{detail}); check that the identity has the AcrPull role on this registry and the token's tenant and audience"
        )),
        429 => Error::throttled(format!(
            "ACR {registry} is throttling token exchanges (HTTP 429{detail})"
        )),
        500..=599 => Error::unavailable(format!(
            "ACR {registry} token exchange failed (HTTP {status}{detail})"
        )),
        _ => Error::bad_response(format!(
            "ACR {registry} token exchange answered HTTP {status}{detail}"
        )),
    }
}

/// Keeps an upstream string to one short line without anything that looks like a token
/// (JWTs start with `eyJ`; any very long word is dropped too).
fn scrub(s: &str) -> String {
    let words: Vec<&str> = s
        .split_whitespace()
        .map(|w| {
            if w.contains("eyJ") || w.len() > 64 {
                "[redacted]"
            } else {
                w
            }
        })
        .collect();
    let mut out: String = words
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_UPSTREAM_MESSAGE)
        .collect();
    if out.len() < s.len() && out.chars().count() == MAX_UPSTREAM_MESSAGE {
        out.push('…');
    }
    out
}

/// A claim from a JWT's payload, read without verifying the signature.
pub(crate) fn jwt_claim(token: &str, claim: &str) -> Option<serde_json::Value> {
    let mut parts = token.split('.');
    let (_header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let mut claims: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes).ok()?;
    claims.remove(claim)
}

/// The `exp` claim of a JWT as a time, if present and a plausible number of seconds.
pub(crate) fn jwt_exp(token: &str) -> Option<SystemTime> {
    let exp = jwt_claim(token, "exp")?;
    let secs = exp
        .as_u64()
        .or_else(|| exp.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use regbroker_provider::ErrorKind;

    fn jwt(payload: &str) -> String {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
            e.encode(payload)
        )
    }

    #[test]
    fn exp_is_read_from_the_payload() {
        let t = jwt(r#"{"exp":1767236400,"tid":"t1"}"#);
        assert_eq!(
            jwt_exp(&t),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_236_400))
        );
        assert_eq!(jwt_claim(&t, "tid"), Some(serde_json::json!("t1")));
    }

    #[test]
    fn missing_or_malformed_exp_is_none() {
        assert_eq!(jwt_exp(&jwt(r#"{"iat":1}"#)), None);
        assert_eq!(jwt_exp(&jwt(r#"{"exp":"soon"}"#)), None);
        assert_eq!(jwt_exp(&jwt(r#"{"exp":-5}"#)), None);
        assert_eq!(jwt_exp("not-a-jwt"), None);
        assert_eq!(jwt_exp("a.!!!.c"), None);
        assert_eq!(jwt_exp(&format!("{}.extra", jwt(r#"{"exp":1}"#))), None);
    }

    #[test]
    fn status_codes_map_to_kinds() {
        let body = br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
        let cases = [
            (401, ErrorKind::IdentityRejected),
            (403, ErrorKind::IdentityRejected),
            (429, ErrorKind::Throttled),
            (500, ErrorKind::Unavailable),
            (503, ErrorKind::Unavailable),
            (400, ErrorKind::BadResponse),
            (404, ErrorKind::BadResponse),
        ];
        for (status, kind) in cases {
            let e = status_error("r.azurecr.io", status, body);
            assert_eq!(e.kind(), kind, "{status}");
            assert!(
                e.message()
                    .contains("UNAUTHORIZED: authentication required"),
                "{e}"
            );
            assert!(e.message().contains(&status.to_string()), "{e}");
        }
    }

    #[test]
    fn error_bodies_never_leak_tokens_or_raw_text() {
        let token = jwt(r#"{"exp":1}"#);
        let body = format!(
            r#"{{"errors":[{{"code":"DENIED","message":"bad token {token} here\nsecond line"}}]}}"#
        );
        let e = status_error("r.azurecr.io", 401, body.as_bytes());
        assert!(!e.message().contains(&token), "{e}");
        assert!(!e.message().contains('\n'), "{e}");
        assert!(e.message().contains("[redacted]"), "{e}");

        let raw = format!("<html>{token}</html>");
        let e = status_error("r.azurecr.io", 502, raw.as_bytes());
        assert!(!e.message().contains("html"), "{e}");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn long_messages_are_truncated() {
        let long = "word ".repeat(100);
        let s = scrub(&long);
        assert!(s.chars().count() <= MAX_UPSTREAM_MESSAGE + 1);
    }

    #[test]
    fn a_refresh_token_without_a_readable_expiry_is_kept_ten_minutes() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let got = parse_exchange_answer(br#"{"refresh_token": "opaque"}"#, now).unwrap();
        assert_eq!(got.expires_at, now + Duration::from_secs(600));
        assert!(got.exp_unreadable);
        assert_eq!(got.refresh_token.expose_secret(), "opaque");
    }

    #[test]
    fn upstream_messages_are_cut_with_a_mark_only_when_cut() {
        // Words up to 64 characters are kept, longer ones dropped.
        let w64 = "w".repeat(64);
        assert_eq!(scrub(&w64), w64);
        assert_eq!(scrub(&"w".repeat(65)), "[redacted]");
        // Longer than 160 characters: cut, with a mark.
        let long = "ab ".repeat(80);
        let cut = scrub(&long);
        assert!(cut.ends_with('…'), "{cut}");
        assert_eq!(cut.chars().count(), 161);
        // Exactly 160, or shortened only by dropping control characters: no mark.
        let exact = "abc ".repeat(40).trim_end().to_string() + "x";
        assert_eq!(exact.len(), 160);
        assert_eq!(scrub(&exact), exact);
        assert_eq!(scrub("bad\u{7} thing"), "bad thing");
    }
}
