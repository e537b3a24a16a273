//! Checking a credential against its registry the way a client logs in, before a sink
//! writes it: `GET /v2/` and, on a `401` with a `WWW-Authenticate` challenge, the Basic or
//! token handshake it names, asking the token server for no scope at all (what
//! `docker login` asks for; never more than pull).
//!
//! The credential goes only to the registry itself, or to a token realm on the same host
//! or a host the operator allowed ([`Policy::realms`]). No redirect is followed, and a
//! realm elsewhere is a skipped check, never a request. A registry that cannot be reached
//! or answers something other than yes or no is a skipped check too: the credential is
//! written as before, and the skip is logged and counted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use regbroker_provider::{Credential, ExposeSecret, Registry};
use zeroize::Zeroizing;

use super::cache::{Key, Lifetime};

/// What the rule says about checking (`check`, `check_realms`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Check before writing (default).
    pub enabled: bool,
    /// Hosts besides the registry's own that may receive the credential as a token
    /// realm (`auth.example.com`, `auth.example.com:8443`).
    pub realms: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            enabled: true,
            realms: Vec::new(),
        }
    }
}

/// What the registry said of a credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It accepted the credential (the status of the request that proved it).
    Accepted(u16),
    /// It refused the credential with this status (401, 403, or 400 as ECR Public answers
    /// an expired token).
    Refused(u16),
    /// No verdict: why (never a secret).
    Skipped(String),
}

impl Verdict {
    /// `accepted`, `refused` or `skipped`: the metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Accepted(_) => "accepted",
            Verdict::Refused(_) => "refused",
            Verdict::Skipped(_) => "skipped",
        }
    }
}

/// The longest a check may take, end to end.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a token server's answer read.
const MAX_TOKEN_BODY: usize = 64 * 1024;

/// The HTTP client of the checks: no redirects, no proxy surprises beyond the system's,
/// bounded.
#[derive(Clone, Debug)]
pub struct Checker {
    client: std::sync::OnceLock<reqwest::Client>,
}

impl Default for Checker {
    fn default() -> Self {
        Checker::new()
    }
}

/// The checks made: per cache key and registry, the fetch last checked (by its lifetime,
/// unique per fetch), the refusals in a row and until when the registry is not asked
/// again. Names, times and statuses only, never a credential.
#[derive(Debug, Default)]
pub struct Checks {
    pub(super) checker: Checker,
    seen: Mutex<HashMap<(Key, Registry), Seen>>,
    /// When a client's report last made each key fetch anew.
    reported: Mutex<HashMap<Key, SystemTime>>,
}

/// What is known of one registry's verdicts on one key's credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The fetch last checked.
    pub lifetime: Lifetime,
    /// Refusals in a row (0: the last verdict let the credential through).
    pub refusals: u32,
    /// The status of the last refusal.
    pub status: u16,
    /// Until when a refusal stands without asking the registry again.
    pub until: SystemTime,
}

impl Checks {
    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<(Key, Registry), Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is known for `registry` and `key` at `now` (what is no longer served, and
    /// refusals long past, are forgotten: bounded by keys × registries).
    pub fn get(&self, key: &Key, registry: &Registry, now: SystemTime) -> Option<Seen> {
        let mut seen = self.seen();
        seen.retain(|_, s| s.lifetime.stale_at > now || s.until > now);
        seen.get(&(key.clone(), registry.clone())).copied()
    }

    /// Records a verdict on the fetch of `lifetime` at `now`: let through, or refused
    /// with `status` and not asked again for `pause(refusals in a row)`. Returns the
    /// refusals in a row.
    pub fn record(
        &self,
        key: &Key,
        registry: &Registry,
        lifetime: Lifetime,
        refused: Option<(u16, SystemTime)>,
        pause: impl Fn(u32) -> Duration,
    ) -> u32 {
        let mut seen = self.seen();
        let entry = seen.entry((key.clone(), registry.clone())).or_insert(Seen {
            lifetime,
            refusals: 0,
            status: 0,
            until: SystemTime::UNIX_EPOCH,
        });
        entry.lifetime = lifetime;
        match refused {
            Some((status, now)) => {
                entry.refusals = entry.refusals.saturating_add(1);
                entry.status = status;
                entry.until = now + pause(entry.refusals);
            }
            None => {
                entry.refusals = 0;
                entry.until = SystemTime::UNIX_EPOCH;
            }
        }
        entry.refusals
    }

    /// Whether a registry other than `registry` let the fetch of `lifetime` through: the
    /// credential works there, so a refusal here is this registry's, and it stays cached.
    pub fn let_through_elsewhere(
        &self,
        key: &Key,
        registry: &Registry,
        lifetime: Lifetime,
    ) -> bool {
        self.seen().iter().any(|((k, r), s)| {
            k == key && r != registry && s.lifetime == lifetime && s.refusals == 0
        })
    }

    /// Takes a client's report for `key` at `now` unless one was taken within
    /// `interval`: then how long until the next may be.
    pub fn refetch(&self, key: &Key, now: SystemTime, interval: Duration) -> Option<Duration> {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        reported.retain(|_, at| now.duration_since(*at).is_ok_and(|d| d < interval) || *at > now);
        if let Some(at) = reported.get(key) {
            let next = *at + interval;
            return Some(
                next.duration_since(now)
                    .unwrap_or(Duration::ZERO)
                    .max(Duration::from_secs(1)),
            );
        }
        reported.insert(key.clone(), now);
        None
    }
}

/// Whether `host` is a loopback name or address (checked over plain HTTP, as container
/// tools treat such registries).
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The scheme and authority of `registry`'s API.
fn base(registry: &Registry) -> String {
    let scheme = if is_loopback(registry.host()) {
        "http"
    } else {
        "https"
    };
    format!("{scheme}://{}", registry.as_str())
}

/// A challenge of `WWW-Authenticate`: its scheme (lower case) and parameters.
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl Challenge {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The first Basic or Bearer challenge of a `WWW-Authenticate` value (a registry sends
/// one), its parameters unescaped; `None` if there is none or the value does not parse.
fn parse_challenge(header: &str) -> Option<Challenge> {
    http_auth::ChallengeParser::new(header)
        .map_while(Result::ok)
        .find(|c| c.scheme.eq_ignore_ascii_case("basic") || c.scheme.eq_ignore_ascii_case("bearer"))
        .map(|c| Challenge {
            scheme: c.scheme.to_ascii_lowercase(),
            params: c
                .params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_unescaped()))
                .collect(),
        })
}

/// Whether a token realm at `realm` may receive the credential of `registry`: on the
/// registry's own host (any port), or on a host of `allowed` (`host` or `host:port`), and
/// over HTTPS unless on a loopback host.
fn realm_allowed(realm: &reqwest::Url, registry: &Registry, allowed: &[String]) -> bool {
    let Some(host) = realm.host_str() else {
        return false;
    };
    let host = host.to_ascii_lowercase();
    let secure = realm.scheme() == "https" || (realm.scheme() == "http" && is_loopback(&host));
    let with_port = match realm.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    secure
        && (host == registry.host()
            || allowed
                .iter()
                .any(|a| a.eq_ignore_ascii_case(&host) || a.eq_ignore_ascii_case(&with_port)))
}

/// The verdict of a status on a request that carried the credential.
fn verdict(status: reqwest::StatusCode) -> Verdict {
    match status.as_u16() {
        200..=299 => Verdict::Accepted(status.as_u16()),
        s @ (400 | 401 | 403) => Verdict::Refused(s),
        s => Verdict::Skipped(format!("the registry answered {s}")),
    }
}

/// A transport error's cause, without its URL.
fn unreachable(what: &str, e: reqwest::Error) -> Verdict {
    let e = e.without_url();
    let why = if e.is_timeout() {
        "timed out".to_string()
    } else {
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg = format!("{msg}: {s}");
            source = s.source();
        }
        msg
    };
    Verdict::Skipped(format!("cannot reach {what}: {why}"))
}

impl Checker {
    /// A checker with its own HTTP client, built on its first check: building one loads
    /// the system's root certificates (about 5 ms), which a process that checks nothing
    /// (every credential helper run) must not pay at start.
    pub fn new() -> Checker {
        Checker {
            client: std::sync::OnceLock::new(),
        }
    }

    fn client(&self) -> &reqwest::Client {
        self.client.get_or_init(|| {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(TIMEOUT)
                .connect_timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default()
        })
    }

    /// Asks `registry` whether it accepts `credential`, as a client logging in would.
    pub async fn check(
        &self,
        registry: &Registry,
        credential: &Credential,
        policy: &Policy,
    ) -> Verdict {
        let v2 = format!("{}/v2/", base(registry));
        let first = match self.client().get(&v2).send().await {
            Ok(r) => r,
            Err(e) => return unreachable(registry.as_str(), e),
        };
        let status = first.status();
        if status.is_success() {
            return Verdict::Skipped("the registry asks for no credential".into());
        }
        if status != reqwest::StatusCode::UNAUTHORIZED {
            return Verdict::Skipped(format!("the registry answered {status} to /v2/"));
        }
        let Some(challenge) = first
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|h| h.to_str().ok())
            .and_then(parse_challenge)
        else {
            return Verdict::Skipped("the registry's 401 names no challenge".into());
        };
        let user = credential.username();
        let password = credential.secret().expose_secret();
        match challenge.scheme.as_str() {
            "basic" => match self
                .client()
                .get(&v2)
                .basic_auth(user, Some(password))
                .send()
                .await
            {
                Ok(r) => verdict(r.status()),
                Err(e) => unreachable(registry.as_str(), e),
            },
            "bearer" => {
                let Some(realm) = challenge
                    .param("realm")
                    .and_then(|r| reqwest::Url::parse(r).ok())
                else {
                    return Verdict::Skipped("the Bearer challenge names no usable realm".into());
                };
                if !realm_allowed(&realm, registry, &policy.realms) {
                    return Verdict::Skipped(format!(
                        "the token realm {} is not on the registry's host nor in the rule's check_realms: the credential is not sent there",
                        realm.host_str().unwrap_or("")
                    ));
                }
                let mut query: Vec<(&str, &str)> = vec![("account", user)];
                if let Some(service) = challenge.param("service") {
                    query.push(("service", service));
                }
                let answer = match self
                    .client()
                    .get(realm.clone())
                    .query(&query)
                    .basic_auth(user, Some(password))
                    .send()
                    .await
                {
                    Ok(r) => r,
                    Err(e) => return unreachable("the token realm", e),
                };
                let status = answer.status();
                if !status.is_success() {
                    return match verdict(status) {
                        Verdict::Skipped(_) => Verdict::Skipped(format!(
                            "the token realm answered {}",
                            status.as_u16()
                        )),
                        v => v,
                    };
                }
                let Some(token) = read_token(answer).await else {
                    return Verdict::Skipped("the token realm's answer holds no token".into());
                };
                match self
                    .client()
                    .get(&v2)
                    .bearer_auth(token.as_str())
                    .send()
                    .await
                {
                    Ok(r) => verdict(r.status()),
                    Err(e) => unreachable(registry.as_str(), e),
                }
            }
            other => Verdict::Skipped(format!("unknown challenge scheme {other:?}")),
        }
    }
}

/// The token of a token server's JSON answer (`token`, or OAuth2's `access_token`),
/// reading at most [`MAX_TOKEN_BODY`] bytes.
async fn read_token(mut answer: reqwest::Response) -> Option<Zeroizing<String>> {
    let mut body = Zeroizing::new(Vec::new());
    while let Ok(Some(chunk)) = answer.chunk().await {
        if body.len() + chunk.len() > MAX_TOKEN_BODY {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        token: Option<Zeroizing<String>>,
        access_token: Option<Zeroizing<String>>,
    }
    let a: Answer = serde_json::from_slice(&body).ok()?;
    a.token.or(a.access_token).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn reg(s: &str) -> Registry {
        Registry::parse(s).unwrap()
    }

    #[test]
    fn the_http_client_is_built_at_the_first_check_not_before() {
        // Building it loads every root certificate on the system: a helper run that
        // checks nothing must not pay for that (BENCHMARKS.md, "Start-up").
        let checker = Checker::new();
        assert!(checker.client.get().is_none());
        let _ = checker.client();
        assert!(checker.client.get().is_some());
    }

    /// Serves `router` on a loopback port; its address.
    async fn serve(router: axum::Router) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        addr
    }

    #[tokio::test]
    async fn a_redirect_is_a_verdict_of_its_own_and_never_followed() {
        use axum::http::{StatusCode, header};
        use axum::response::IntoResponse;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        // Where the registry sends the client once it has the credential: it would
        // accept anything, and counts who came.
        let followed = Arc::new(AtomicUsize::new(0));
        let elsewhere = serve(axum::Router::new().fallback({
            let followed = followed.clone();
            move || async move {
                followed.fetch_add(1, Ordering::SeqCst);
                StatusCode::OK
            }
        }))
        .await;
        let registry = serve(axum::Router::new().route(
            "/v2/",
            axum::routing::get(move |headers: axum::http::HeaderMap| async move {
                if headers.contains_key(header::AUTHORIZATION) {
                    (
                        StatusCode::TEMPORARY_REDIRECT,
                        [(header::LOCATION, format!("http://{elsewhere}/v2/"))],
                    )
                        .into_response()
                } else {
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Basic realm=\"r\"".to_string())],
                    )
                        .into_response()
                }
            }),
        ))
        .await;
        let credential = Credential::new("u", "p", None);
        let verdict = Checker::new()
            .check(&reg(&registry.to_string()), &credential, &Policy::default())
            .await;
        assert_eq!(
            verdict,
            Verdict::Skipped("the registry answered 307".into()),
            "a 307 is neither an acceptance nor a refusal"
        );
        assert_eq!(
            followed.load(Ordering::SeqCst),
            0,
            "the redirect was followed"
        );
    }

    #[test]
    fn challenges_are_parsed_as_registries_send_them() {
        let c = parse_challenge(
            r#"Bearer realm="https://europe-west1-docker.pkg.dev/v2/token",service="europe-west1-docker.pkg.dev""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(
            c.param("realm"),
            Some("https://europe-west1-docker.pkg.dev/v2/token")
        );
        assert_eq!(c.param("Service"), Some("europe-west1-docker.pkg.dev"));
        let c = parse_challenge(r#"Basic realm="https://1.dkr.ecr.us-east-1.amazonaws.com/",service="ecr.amazonaws.com""#).unwrap();
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.param("service"), Some("ecr.amazonaws.com"));
        // Several challenges: the Basic or Bearer one; escapes in quoted strings undone.
        let c = parse_challenge(
            r#"Newauth realm="apps", type=1, Bearer realm="https://a.example/t\"x", scope="s""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.param("realm"), Some(r#"https://a.example/t"x"#));
        assert_eq!(c.param("scope"), Some("s"));
        assert!(parse_challenge("").is_none());
        assert!(parse_challenge("Negotiate").is_none());
        assert!(parse_challenge(r#"Bearer realm="unterminated"#).is_none());
    }

    #[test]
    fn the_credential_goes_only_to_the_registry_host_or_an_allowed_realm_over_https() {
        let r = reg("myregistry.azurecr.io");
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        assert!(realm_allowed(
            &url("https://myregistry.azurecr.io/oauth2/token"),
            &r,
            &[]
        ));
        // Another port of the same host is the same host.
        assert!(realm_allowed(
            &url("https://myregistry.azurecr.io:8443/t"),
            &r,
            &[]
        ));
        // A look-alike, a sub-domain, another host: never.
        for other in [
            "https://myregistry.azurecr.io.evil.example/t",
            "https://evil.myregistry.azurecr.io/t",
            "https://auth.docker.io/token",
        ] {
            assert!(!realm_allowed(&url(other), &r, &[]), "{other}");
        }
        // Plain HTTP off loopback: never, even to the same host.
        assert!(!realm_allowed(
            &url("http://myregistry.azurecr.io/t"),
            &r,
            &[]
        ));
        // Allowed by the operator, by host or host:port.
        let allowed = vec![
            "auth.example.com".to_string(),
            "tok.example.com:8443".into(),
        ];
        assert!(realm_allowed(
            &url("https://auth.example.com/t"),
            &r,
            &allowed
        ));
        assert!(realm_allowed(
            &url("https://tok.example.com:8443/t"),
            &r,
            &allowed
        ));
        assert!(!realm_allowed(
            &url("https://tok.example.com/t"),
            &r,
            &allowed
        ));
        // Loopback registries are spoken to over HTTP.
        let local = reg("127.0.0.1:5000");
        assert!(realm_allowed(
            &url("http://127.0.0.1:5001/token"),
            &local,
            &[]
        ));
        assert_eq!(base(&local), "http://127.0.0.1:5000");
        assert_eq!(base(&r), "https://myregistry.azurecr.io");
        assert_eq!(base(&reg("localhost:5000")), "http://localhost:5000");
    }

    fn lifetime(at: u64) -> Lifetime {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(at);
        Lifetime {
            refresh_at: t,
            stale_at: t + Duration::from_secs(100),
        }
    }

    #[test]
    fn verdicts_are_kept_per_registry_and_a_refusal_stands_for_its_growing_pause() {
        let checks = Checks::default();
        let key = Key {
            provider: "gcp",
            scope: "s".into(),
        };
        let (a, b) = (reg("a.example.com"), reg("b.example.com"));
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let pause = |n: u32| Duration::from_secs(u64::from(n) * 10);
        let first = lifetime(1_000);
        assert_eq!(checks.get(&key, &a, now), None);
        assert_eq!(checks.record(&key, &a, first, None, pause), 0);
        assert_eq!(checks.get(&key, &a, now).unwrap().lifetime, first);
        assert_eq!(
            checks.get(&key, &b, now),
            None,
            "another registry is its own"
        );
        // b refuses what a let through: the refusal is b's alone.
        assert_eq!(checks.record(&key, &b, first, Some((401, now)), pause), 1);
        assert!(checks.let_through_elsewhere(&key, &b, first));
        assert!(!checks.let_through_elsewhere(&key, &a, first));
        assert!(!checks.let_through_elsewhere(&key, &b, lifetime(1_010)));
        let seen = checks.get(&key, &b, now).unwrap();
        assert_eq!((seen.refusals, seen.status), (1, 401));
        assert_eq!(seen.until, now + Duration::from_secs(10));
        // Refusals in a row make the pause longer; a verdict that lets it through resets.
        assert_eq!(checks.record(&key, &b, first, Some((403, now)), pause), 2);
        assert_eq!(
            checks.get(&key, &b, now).unwrap().until,
            now + Duration::from_secs(20)
        );
        assert_eq!(checks.record(&key, &b, lifetime(1_020), None, pause), 0);
        // Forgotten once no longer served and past any pause.
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(5_000);
        assert_eq!(checks.get(&key, &a, later), None);
    }

    #[test]
    fn a_report_is_taken_once_per_interval_per_key() {
        let checks = Checks::default();
        let key = |s: &str| Key {
            provider: "gcp",
            scope: s.into(),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let interval = Duration::from_secs(30);
        assert_eq!(checks.refetch(&key("a"), t0, interval), None);
        assert_eq!(
            checks.refetch(&key("a"), at(10), interval),
            Some(Duration::from_secs(20))
        );
        assert_eq!(checks.refetch(&key("b"), at(10), interval), None);
        // Never "retry in 0 s".
        assert_eq!(
            checks.refetch(&key("a"), at(29) + Duration::from_millis(900), interval),
            Some(Duration::from_secs(1))
        );
        assert_eq!(checks.refetch(&key("a"), at(30), interval), None);
    }

    #[test]
    fn statuses_with_the_credential_are_verdicts() {
        use reqwest::StatusCode as S;
        assert_eq!(verdict(S::OK), Verdict::Accepted(200));
        assert_eq!(verdict(S::UNAUTHORIZED), Verdict::Refused(401));
        assert_eq!(verdict(S::FORBIDDEN), Verdict::Refused(403));
        // ECR Public answers an expired token 400.
        assert_eq!(verdict(S::BAD_REQUEST), Verdict::Refused(400));
        assert!(matches!(verdict(S::TOO_MANY_REQUESTS), Verdict::Skipped(_)));
        assert!(matches!(verdict(S::BAD_GATEWAY), Verdict::Skipped(_)));
    }

    #[test]
    fn a_refusal_outlives_the_credential_until_its_pause_ends() {
        let checks = Checks::default();
        let key = Key {
            provider: "gcp",
            scope: "s".into(),
        };
        let a = reg("a.example.com");
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        // Served until 1,100; refused at 1,050 with a pause to 1,250.
        let pause = |_: u32| Duration::from_secs(200);
        checks.record(&key, &a, lifetime(1_000), Some((401, t(1_050))), pause);
        for now in [t(1_100), t(1_200), t(1_249)] {
            let seen = checks.get(&key, &a, now);
            assert_eq!(seen.map(|s| s.refusals), Some(1), "{now:?}");
        }
        assert_eq!(checks.get(&key, &a, t(1_250)), None, "the pause is over");
        // Let through: kept while the credential is served, to its stale point.
        checks.record(&key, &a, lifetime(2_000), None, pause);
        assert!(checks.get(&key, &a, t(2_099)).is_some());
        assert_eq!(checks.get(&key, &a, t(2_100)), None);
    }

    #[test]
    fn verdicts_are_labelled_for_the_metric() {
        assert_eq!(Verdict::Accepted(200).as_str(), "accepted");
        assert_eq!(Verdict::Refused(401).as_str(), "refused");
        assert_eq!(Verdict::Skipped("x".into()).as_str(), "skipped");
    }

    fn answer(body: Vec<u8>) -> reqwest::Response {
        reqwest::Response::from(http::Response::new(body))
    }

    #[tokio::test]
    async fn a_token_answer_is_read_up_to_its_bound_and_no_further() {
        // A token server's answer with padding to exactly `len` bytes.
        let of_len = |len: usize| {
            let head = br#"{"token":"t0k","pad":""#.to_vec();
            let mut body = head.clone();
            body.resize(len - 2, b'x');
            body.extend_from_slice(br#""}"#);
            assert_eq!(body.len(), len);
            body
        };
        for len in [40 * 1024, MAX_TOKEN_BODY] {
            let token = read_token(answer(of_len(len))).await;
            assert_eq!(token.as_deref().map(String::as_str), Some("t0k"), "{len}");
        }
        assert_eq!(read_token(answer(of_len(MAX_TOKEN_BODY + 1))).await, None);
    }

    #[tokio::test]
    async fn a_token_answer_names_its_token_or_an_oauth2_access_token() {
        let read = |body: &str| read_token(answer(body.as_bytes().to_vec()));
        let got = |t: Option<Zeroizing<String>>| t.map(|t| t.as_str().to_string());
        assert_eq!(got(read(r#"{"token":"abc"}"#).await), Some("abc".into()));
        assert_eq!(
            got(read(r#"{"access_token":"def"}"#).await),
            Some("def".into())
        );
        assert_eq!(got(read(r#"{"token":""}"#).await), None, "an empty token");
        assert_eq!(got(read(r#"{"other":"x"}"#).await), None);
        assert_eq!(got(read("not json").await), None);
    }

    #[test]
    fn a_report_taken_before_the_clock_stepped_back_still_holds() {
        let checks = Checks::default();
        let key = Key {
            provider: "gcp",
            scope: "s".into(),
        };
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let interval = Duration::from_secs(30);
        assert_eq!(checks.refetch(&key, t(1_000), interval), None);
        // The clock stepped back 100 s: the report is not forgotten, and the wait is
        // counted from it.
        assert_eq!(
            checks.refetch(&key, t(900), interval),
            Some(Duration::from_secs(130))
        );
    }
}
