//! The one HTTP call each exchange makes: no redirect is ever followed (the subject token
//! goes only to the URL the rule names), bounded time and body, retries only for 5xx,
//! 429 and a refused connection, and a refusal's reason echoed only when it cannot be a
//! token.

pub use regbroker_provider::HttpSettings;
use regbroker_provider::{Error, ExposeSecret, MAX_UPSTREAM_BODY, SecretString};
use secrecy::zeroize::Zeroizing;

/// The client, built on first use, and its settings.
#[derive(Clone, Debug)]
pub(crate) struct Http {
    /// Building a client loads the system's root certificates (every file under
    /// `/etc/ssl/certs`: about 5 ms), which a process that never calls this provider
    /// (a credential helper answering a static entry, a sidecar whose rules name no
    /// federated provider) must not pay at start.
    client: std::sync::OnceLock<reqwest::Client>,
    settings: HttpSettings,
}

impl Http {
    pub(crate) fn new(settings: HttpSettings) -> Http {
        Http {
            client: std::sync::OnceLock::new(),
            settings,
        }
    }

    /// The client, built now if this is the first call.
    fn client(&self) -> Result<&reqwest::Client, Error> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let built = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(self.settings.connect_timeout)
            .timeout(self.settings.request_timeout)
            .build()
            .map_err(|e| Error::unavailable(format!("cannot build the HTTP client: {e}")))?;
        Ok(self.client.get_or_init(|| built))
    }

    /// Sends what `build` makes until it succeeds or fails for good; `what` names the
    /// exchange in messages (never a secret), `subject` is the token sent, so that no
    /// echo of it reaches a message.
    pub(crate) async fn call(
        &self,
        what: &str,
        subject: &SecretString,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let mut delay = self.settings.backoff;
        let attempts = self.settings.attempts.max(1);
        for attempt in 1.. {
            let failure = match build(self.client()?).send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    match read_capped(resp).await {
                        Ok(body) if (200..300).contains(&status) => return Ok(body),
                        Ok(body) => Failure::Status(status, body),
                        Err(ReadError::TooLarge) if (200..300).contains(&status) => {
                            return Err(Error::bad_response(format!(
                                "{what} answered with a body larger than {MAX_UPSTREAM_BODY} bytes"
                            )));
                        }
                        Err(ReadError::TooLarge) => Failure::Status(status, Zeroizing::default()),
                        Err(ReadError::Transport(e)) => Failure::Transport(e),
                    }
                }
                Err(e) => Failure::Transport(e),
            };
            if attempt < attempts && failure.retryable() {
                tracing::debug!(what, attempt, ?delay, "Exchange call failed, retrying");
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
                continue;
            }
            return Err(failure.into_error(what, subject));
        }
        unreachable!("the loop returns")
    }
}

enum Failure {
    Transport(reqwest::Error),
    Status(u16, Zeroizing<Vec<u8>>),
}

impl Failure {
    fn retryable(&self) -> bool {
        match self {
            Failure::Transport(e) => e.is_connect() && !e.is_timeout(),
            Failure::Status(s, _) => *s == 429 || *s >= 500,
        }
    }

    fn into_error(self, what: &str, subject: &SecretString) -> Error {
        match self {
            Failure::Transport(e) if e.is_timeout() => {
                Error::timed_out(format!("{what} did not answer in time"))
                    .with_source(e.without_url())
            }
            Failure::Transport(e) if e.is_connect() => {
                Error::unavailable(format!("{what} could not be reached"))
                    .with_source(e.without_url())
            }
            Failure::Transport(e) => {
                Error::unavailable(format!("call to {what} failed")).with_source(e.without_url())
            }
            Failure::Status(status, body) => {
                let reason = reason(&body, subject)
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                match status {
                    300..=399 => Error::bad_response(format!(
                        "{what} answered a redirect (HTTP {status}), which regbroker never follows with a token: point the rule's `url` at the exchange itself"
                    )),
                    400 | 401 | 403 | 404 => Error::identity_rejected(format!(
                        "{what} refused the token (HTTP {status}){reason}"
                    )),
                    429 => Error::throttled(format!("{what} answered HTTP 429{reason}")),
                    s if s >= 500 => Error::unavailable(format!("{what} answered HTTP {s}")),
                    s => Error::bad_response(format!("{what} answered HTTP {s}{reason}")),
                }
            }
        }
    }
}

enum ReadError {
    TooLarge,
    Transport(reqwest::Error),
}

/// Reads at most [`MAX_UPSTREAM_BODY`] bytes into memory wiped on drop.
async fn read_capped(mut resp: reqwest::Response) -> Result<Zeroizing<Vec<u8>>, ReadError> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_UPSTREAM_BODY as u64)
    {
        return Err(ReadError::TooLarge);
    }
    let mut body = Zeroizing::new(Vec::new());
    while let Some(chunk) = resp.chunk().await.map_err(ReadError::Transport)? {
        if body.len() + chunk.len() > MAX_UPSTREAM_BODY {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why an exchange refused, from its error body: OAuth's `error` and
/// `error_description`, Cloudsmith's `detail`, Quay's `error` or `error_message`, JFrog's
/// `errors[0].message`. Echoed only when it is short printable text that holds neither
/// the subject token nor any part of it, nor anything shaped like a token (a run of 32 or
/// more token characters): a client may see it, so it must not be a way to read one.
pub(crate) fn reason(body: &[u8], subject: &SecretString) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_string);
    let code = text(v.get("error"));
    let detail = text(v.get("error_description"))
        .or_else(|| text(v.get("detail")))
        .or_else(|| text(v.get("error_message")))
        .or_else(|| text(v.get("message")))
        .or_else(|| text(v.pointer("/errors/0/message")));
    let joined = match (code, detail) {
        (Some(c), Some(d)) => format!("{c}: {d}"),
        (Some(one), None) | (None, Some(one)) => one,
        (None, None) => return None,
    };
    let safe = !joined.is_empty()
        && joined.len() <= 200
        && joined.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        && !holds_token(&joined, subject.expose_secret());
    safe.then_some(joined)
}

fn holds_token(text: &str, subject: &str) -> bool {
    let parts_echoed = subject
        .split('.')
        .filter(|p| p.len() >= 8)
        .any(|p| text.contains(p));
    let token_run = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || "-_.~+/=".contains(c)))
        .any(|run| run.len() >= 32);
    parts_echoed || token_run
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_is_built_at_the_first_call_not_before() {
        // Building it loads every root certificate on the system: a process whose rules
        // never reach this provider must not pay for that at start.
        let http = Http::new(HttpSettings::default());
        assert!(http.client.get().is_none());
        assert!(http.client().is_ok());
        assert!(http.client.get().is_some());
    }

    #[test]
    fn a_reason_is_echoed_only_when_it_cannot_be_a_token() {
        let subject =
            SecretString::from("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl");
        let r = |body: &str| reason(body.as_bytes(), &subject);
        assert_eq!(
            r(r#"{"error":"invalid_grant","error_description":"audience mismatch"}"#).as_deref(),
            Some("invalid_grant: audience mismatch")
        );
        assert_eq!(
            r(r#"{"detail":"OIDC token cannot be authenticated."}"#).as_deref(),
            Some("OIDC token cannot be authenticated.")
        );
        assert_eq!(
            r(r#"{"errors":[{"code":"UNAUTHORIZED","message":"no mapping"}]}"#).as_deref(),
            Some("no mapping")
        );
        // The token echoed back, a part of it, or anything token-shaped: nothing echoed.
        assert_eq!(
            r(r#"{"error":"bad token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl"}"#),
            None
        );
        assert_eq!(r(r#"{"error":"bad signature c2lnbmF0dXJl"}"#), None);
        assert_eq!(
            r(r#"{"error":"robot token is AAAABBBBCCCCDDDDEEEEFFFFGGGGHHHH"}"#),
            None
        );
        assert_eq!(r(&format!(r#"{{"error":"{}"}}"#, "x ".repeat(101))), None);
        assert_eq!(r(r#"{"error":"line\nbreak"}"#), None);
        assert_eq!(r("<html>not json</html>"), None);
    }
}
