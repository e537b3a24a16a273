//! The Google answers the provider reads, as pure functions of the body (the HTTP calls
//! in [`crate::http`] hand their bodies here; the fuzz targets drive them directly).
//!
//! Reads no env var. No error repeats a body: serde_json's position and category only.

use std::time::{Duration, SystemTime};

use regbroker_provider::{Credential, Error};
use serde::Deserialize;

use crate::http::{self, OAuthToken};
use crate::token::AccessToken;

/// An OAuth 2.0 token answer (`{"access_token", "expires_in"}`: the metadata server, a
/// `token_uri`, the STS), issued at about `issued`. `what` names the upstream.
pub(crate) fn oauth_token(
    what: &str,
    body: &[u8],
    issued: SystemTime,
) -> Result<AccessToken, Error> {
    let token: OAuthToken = http::parse_json(what, body)?;
    AccessToken::from_expires_in(token.access_token, token.expires_in, issued).non_empty(what)
}

/// An IAM Credentials `generateAccessToken` answer (`{"accessToken", "expireTime"}`), for
/// a token asked for `lifetime` at `started`: never believed to last longer.
pub(crate) fn generated_token(
    what: &str,
    body: &[u8],
    started: SystemTime,
    lifetime: Duration,
) -> Result<AccessToken, Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Generated {
        access_token: regbroker_provider::SecretString,
        expire_time: String,
    }
    let generated: Generated = http::parse_json(what, body)?;
    let expires_at = humantime::parse_rfc3339(generated.expire_time.trim()).map_err(|_| {
        Error::bad_response(format!("{what} answered with an unreadable expireTime"))
    })?;
    let expires_at = expires_at.min(started + lifetime);
    AccessToken {
        secret: generated.access_token,
        expires_at,
    }
    .non_empty(what)
}

/// The metadata server's `universe/universe-domain` answer: a bare domain.
pub(crate) fn universe_domain(what: &str, body: &[u8]) -> Result<String, Error> {
    let text = std::str::from_utf8(body).unwrap_or_default();
    if text.trim().is_empty() {
        // Google's libraries read an empty answer as the default universe.
        return Ok(crate::universe::DEFAULT_UNIVERSE.to_string());
    }
    crate::universe::parse(text).ok_or_else(|| {
        Error::bad_response(format!(
            "{what} answered with a universe domain that is not a DNS name"
        ))
    })
}

/// Parses a Google token answer (metadata server, `token_uri`, STS) received at `issued`
/// into the registry credential the provider would serve (`oauth2accesstoken`, expiry
/// capped at [`regbroker_provider::MAX_LIFETIME`]). For fuzzing and tests: the provider
/// runs this same parsing on every answer.
pub fn parse_token_answer(body: &[u8], issued: SystemTime) -> Result<Credential, Error> {
    let t = oauth_token("token endpoint", body, issued)?;
    Ok(Credential::issued(
        crate::USERNAME,
        t.secret,
        Some(t.expires_at),
        issued,
    ))
}

/// Parses an IAM Credentials `generateAccessToken` answer for a token asked for
/// `lifetime` at `started` (see [`parse_token_answer`]).
pub fn parse_generated_token_answer(
    body: &[u8],
    started: SystemTime,
    lifetime: Duration,
) -> Result<Credential, Error> {
    let t = generated_token("IAM Credentials", body, started, lifetime)?;
    Ok(Credential::issued(
        crate::USERNAME,
        t.secret,
        Some(t.expires_at),
        started,
    ))
}

/// Parses the metadata server's `universe/universe-domain` answer.
pub fn parse_universe_domain_answer(body: &[u8]) -> Result<String, Error> {
    universe_domain("GCE metadata server", body)
}
