//! The three exchanges, each from its vendor's documentation (README.md names the
//! sources), and what each answer means as a docker credential.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use regbroker_provider::diagnosis::Claims;
use regbroker_provider::{Error, ExposeSecret, SecretString, Target};
use serde::Deserialize;

use crate::http::Http;
use crate::options::{
    IDENTITY_MAPPING_NAME, ORG, PROJECT_KEY, PROVIDER_NAME, ROBOT, SERVICE, URL, USERNAME,
};

/// How long an answer is taken to last when neither the answer nor its token says (the
/// token is not a JWT and no `expires_in` came): an hour, which Quay documents for its
/// robot tokens, and less than Cloudsmith's "around 90 minutes". The subject token's own
/// expiry still caps it.
pub(crate) const FALLBACK_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// Cloudsmith's documented docker username for a token (any username is accepted with
/// an API key or token; `token` is what its docs and external-secrets use).
pub(crate) const CLOUDSMITH_USERNAME: &str = "token";

/// A registry credential an exchange answered.
pub(crate) struct Answer {
    pub(crate) username: String,
    pub(crate) secret: SecretString,
    /// From the answer (`expires_in`) or its token's `exp`; `None`: not said.
    pub(crate) expires_at: Option<SystemTime>,
}

fn param<'a>(target: &'a Target, key: &str) -> Result<&'a str, Error> {
    target.param(key).ok_or_else(|| {
        Error::invalid_config(format!(
            "the rule has no `{key}` option (it was checked at start-up: a bug)"
        ))
    })
}

/// The `exp` of `token` when it is a JWT.
fn jwt_expiry(token: &str) -> Option<SystemTime> {
    Claims::of_jwt(token).and_then(|c| c.expires_at)
}

fn parse<T: for<'de> Deserialize<'de>>(what: &str, body: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(body).map_err(|e| {
        // serde_json names the line, column and field, never the values around them.
        Error::bad_response(format!(
            "{what} answered with an unexpected body (line {} column {})",
            e.line(),
            e.column()
        ))
    })
}

fn non_empty(what: &str, field: &str, token: SecretString) -> Result<SecretString, Error> {
    if token.expose_secret().is_empty() {
        return Err(Error::bad_response(format!(
            "{what} answered an empty `{field}`"
        )));
    }
    Ok(token)
}

/// A `{"token": "..."}` answer (Quay's and Cloudsmith's): the token, not empty.
fn token_answer(what: &str, body: &[u8]) -> Result<SecretString, Error> {
    #[derive(Deserialize)]
    struct Body {
        token: SecretString,
    }
    non_empty(what, "token", parse::<Body>(what, body)?.token)
}

/// Quay robot federation: `GET <url>/oauth2/federation/robot/token` with Basic auth
/// `<robot>:<subject token>`; `{"token": "..."}`, used with the robot's name.
pub(crate) async fn quay(
    http: &Http,
    target: &Target,
    subject: &SecretString,
) -> Result<Answer, Error> {
    let robot = param(target, ROBOT)?;
    let endpoint = format!("{}/oauth2/federation/robot/token", param(target, URL)?);
    let what = format!("Quay robot federation at {}", host_of(&endpoint));
    let body = http
        .call(&what, subject, |c| {
            c.get(&endpoint)
                .basic_auth(robot, Some(subject.expose_secret()))
                .header("accept", "application/json")
        })
        .await?;
    let token = token_answer(&what, &body)?;
    Ok(Answer {
        username: robot.to_string(),
        expires_at: jwt_expiry(token.expose_secret()),
        secret: token,
    })
}

/// JFrog Platform OIDC token exchange: `POST <url>/access/api/v1/oidc/token`, a JSON
/// token-exchange request for an id_token and the integration's `provider_name`; the
/// answer's `access_token`, for `expires_in` seconds when given.
pub(crate) async fn artifactory(
    http: &Http,
    target: &Target,
    subject: &SecretString,
    now: SystemTime,
) -> Result<Answer, Error> {
    #[derive(Deserialize)]
    struct Body {
        access_token: SecretString,
        #[serde(default)]
        expires_in: Option<serde_json::Value>,
        #[serde(default)]
        username: Option<String>,
    }
    let endpoint = format!("{}/access/api/v1/oidc/token", param(target, URL)?);
    let what = format!("JFrog OIDC token exchange at {}", host_of(&endpoint));
    let mut request = serde_json::json!({
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
        "provider_name": param(target, PROVIDER_NAME)?,
    });
    for key in [PROJECT_KEY, IDENTITY_MAPPING_NAME] {
        if let Some(v) = target.param(key) {
            request[key] = v.into();
        }
    }
    let body = http
        .call(&what, subject, |c| {
            let mut r = request.clone();
            r["subject_token"] = subject.expose_secret().into();
            c.post(&endpoint).json(&r)
        })
        .await?;
    let answer: Body = parse(&what, &body)?;
    let token = non_empty(&what, "access_token", answer.access_token)?;
    // `expires_in` is seconds, as a number or (in JFrog's examples) a string.
    let expires_in = match &answer.expires_in {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.parse().ok(),
        _ => None,
    };
    let expires_at = expires_in
        .map(|s| now + Duration::from_secs(s))
        .or_else(|| jwt_expiry(token.expose_secret()));
    let username = match target.param(USERNAME) {
        Some(u) => u.to_string(),
        None => answer
            .username
            .filter(|u| !u.is_empty() && !u.contains(':') && u.len() <= 256)
            .or_else(|| jfrog_user(token.expose_secret()))
            .ok_or_else(|| {
                Error::invalid_config(format!(
                    "{what} answered no username, and its token names none: set the rule's `username` option to the JFrog user of the identity mapping"
                ))
            })?,
    };
    Ok(Answer {
        username,
        secret: token,
        expires_at,
    })
}

/// The user a JFrog access token is for: its `sub` is `<service id>/users/<user>`.
fn jfrog_user(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let (_, user) = claims.get("sub")?.as_str()?.rsplit_once("/users/")?;
    let ok = !user.is_empty()
        && user.len() <= 256
        && !user.contains(':')
        && user.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| user.to_string())
}

/// Cloudsmith OIDC: `POST <url>/openid/<org>/` with `{"oidc_token", "service_slug"}`;
/// `201 {"token": "..."}`.
pub(crate) async fn cloudsmith(
    http: &Http,
    target: &Target,
    subject: &SecretString,
) -> Result<Answer, Error> {
    let endpoint = format!("{}/openid/{}/", param(target, URL)?, param(target, ORG)?);
    let what = format!("Cloudsmith OIDC exchange at {}", host_of(&endpoint));
    let service = param(target, SERVICE)?;
    let body = http
        .call(&what, subject, |c| {
            c.post(&endpoint).json(&serde_json::json!({
                "oidc_token": subject.expose_secret(),
                "service_slug": service,
            }))
        })
        .await?;
    let token = token_answer(&what, &body)?;
    Ok(Answer {
        username: target
            .param(USERNAME)
            .unwrap_or(CLOUDSMITH_USERNAME)
            .to_string(),
        expires_at: jwt_expiry(token.expose_secret()),
        secret: token,
    })
}

/// `host[:port]` of an endpoint, for messages.
pub(crate) fn host_of(endpoint: &str) -> String {
    url::Url::parse(endpoint)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_string();
            Some(match u.port() {
                Some(p) => format!("{host}:{p}"),
                None => host,
            })
        })
        .unwrap_or_else(|| "(bad URL)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jfrog_user_is_read_from_the_token_subject_only_when_plain() {
        let token = |sub: &str| {
            let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(serde_json::json!({ "sub": sub }).to_string());
            format!("eyJhbGciOiJSUzI1NiJ9.{payload}.sig")
        };
        assert_eq!(
            jfrog_user(&token("jfac@01h/users/ci-puller")).as_deref(),
            Some("ci-puller")
        );
        assert_eq!(jfrog_user(&token("jfac@01h/users/a:b")), None);
        assert_eq!(jfrog_user(&token("jfac@01h/groups/x")), None);
        assert_eq!(jfrog_user("not-a-jwt"), None);
    }

    #[test]
    fn hosts_are_shown_with_their_port() {
        assert_eq!(
            host_of("https://quay.example.com/oauth2"),
            "quay.example.com"
        );
        assert_eq!(host_of("http://127.0.0.1:8080/x"), "127.0.0.1:8080");
    }
}
