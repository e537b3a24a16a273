//! Unit tests of the provider against in-process stand-ins of the exchanges (written
//! from the vendors' documentation: no vendor service runs here). The end-to-end tests
//! with real ServiceAccount tokens, their signatures checked, are in the workspace's
//! `tests/federated.rs`.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use regbroker_provider::test_util::jwt;
use regbroker_provider::{ErrorKind, ManualClock};

use super::*;

const NOW: u64 = 1_800_000_000;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// An OIDC token for `audience`, expiring at `exp`, of ServiceAccount team-a/puller.
fn subject(audience: &str, exp: u64) -> String {
    jwt(&serde_json::json!({
        "iss": "https://kubernetes.default.svc.cluster.local",
        "aud": [audience],
        "sub": "system:serviceaccount:team-a:puller",
        "exp": exp,
        "iat": NOW - 60,
        "kubernetes.io": {"namespace": "team-a", "serviceaccount": {"name": "puller", "uid": "u-1"}},
    }))
}

/// What a stand-in exchange saw: each request's headers and body.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(HeaderMap, String)>>>);

impl Seen {
    fn all(&self) -> Vec<(HeaderMap, String)> {
        self.0.lock().unwrap().clone()
    }
}

/// Serves `app` on loopback; its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A stand-in answering every request on `path` with `status` and `body`.
async fn stand_in(path: &str, status: u16, body: serde_json::Value) -> (String, Seen) {
    let seen = Seen::default();
    let handler = move |State(seen): State<Seen>, headers: HeaderMap, body_in: String| {
        let body = body.clone();
        async move {
            seen.0.lock().unwrap().push((headers, body_in));
            (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
        }
    };
    let app = axum::Router::new()
        .route(path, get(handler.clone()).post(handler))
        .with_state(seen.clone());
    (serve(app).await, seen)
}

fn provider(kind: Kind) -> FederatedProvider {
    let settings = HttpSettings {
        attempts: 1,
        ..HttpSettings::default()
    };
    FederatedProvider::with_settings(kind, settings)
        .unwrap()
        .with_clock(Arc::new(ManualClock::new(at(NOW))))
}

fn options(pairs: &[(&str, &str)]) -> Options {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn token_file(token: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), format!("{token}\n")).unwrap();
    f
}

fn registry(host: &str) -> Registry {
    Registry::parse(host).unwrap()
}

#[tokio::test]
async fn quay_sends_the_token_as_the_robots_basic_auth_and_serves_the_robot_token() {
    let answer = jwt(&serde_json::json!({"exp": NOW + 3600}));
    let (url, seen) = stand_in(
        "/oauth2/federation/robot/token",
        200,
        serde_json::json!({"token": answer}),
    )
    .await;
    let token = subject("quay.example.com", NOW + 600);
    let file = token_file(&token);
    let p = provider(Kind::Quay);
    let target = p
        .target(
            &registry("quay.example.com"),
            &options(&[
                ("audience", "quay.example.com"),
                ("robot", "acme+puller"),
                ("url", &url),
                ("token_file", &file.path().to_string_lossy()),
            ]),
        )
        .unwrap();
    let c = p.fetch(&target).await.unwrap();
    assert_eq!(c.username(), "acme+puller");
    assert_eq!(c.secret().expose_secret(), answer);
    // The earlier of the answer's hour and the subject token's ten minutes.
    assert_eq!(c.expires_at(), Some(at(NOW + 600)));
    assert!(!c.passes_subject_token());
    let (headers, _) = &seen.all()[0];
    let basic = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("acme+puller:{token}"),
    );
    assert_eq!(
        headers.get("authorization").unwrap().to_str().unwrap(),
        format!("Basic {basic}")
    );
}

#[tokio::test]
async fn artifactory_exchanges_for_the_integration_and_reads_expires_in() {
    let (url, seen) = stand_in(
        "/access/api/v1/oidc/token",
        200,
        serde_json::json!({"access_token": "jfrog-access", "expires_in": 900, "token_type": "access_token", "username": "ci-puller"}),
    )
    .await;
    let token = subject("jfrog", NOW + 3600);
    let file = token_file(&token);
    let p = provider(Kind::Artifactory);
    let target = p
        .target(
            &registry("acme.jfrog.io"),
            &options(&[
                ("audience", "jfrog"),
                ("provider_name", "k8s-prod"),
                ("project_key", "apps"),
                ("url", &url),
                ("token_file", &file.path().to_string_lossy()),
            ]),
        )
        .unwrap();
    let c = p.fetch(&target).await.unwrap();
    assert_eq!(
        (c.username(), c.secret().expose_secret()),
        ("ci-puller", "jfrog-access")
    );
    assert_eq!(c.expires_at(), Some(at(NOW + 900)));
    let sent: serde_json::Value = serde_json::from_str(&seen.all()[0].1).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
            "subject_token": token,
            "provider_name": "k8s-prod",
            "project_key": "apps",
        })
    );
}

#[tokio::test]
async fn cloudsmith_posts_the_token_and_service_for_the_org() {
    let answer = jwt(&serde_json::json!({"exp": NOW + 5400}));
    let (url, seen) = stand_in("/openid/acme/", 201, serde_json::json!({"token": answer})).await;
    let token = subject("https://api.cloudsmith.io", NOW + 7200);
    let file = token_file(&token);
    let p = provider(Kind::Cloudsmith);
    let target = p
        .target(
            &registry("docker.cloudsmith.io"),
            &options(&[
                ("audience", "https://api.cloudsmith.io"),
                ("org", "acme"),
                ("service", "k8s-puller"),
                ("url", &url),
                ("token_file", &file.path().to_string_lossy()),
            ]),
        )
        .unwrap();
    let c = p.fetch(&target).await.unwrap();
    assert_eq!(c.username(), "token");
    assert_eq!(c.expires_at(), Some(at(NOW + 5400)));
    let sent: serde_json::Value = serde_json::from_str(&seen.all()[0].1).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({"oidc_token": token, "service_slug": "k8s-puller"})
    );
}

#[tokio::test]
async fn pass_through_serves_the_token_itself_until_it_expires() {
    let token = subject("zot.example.com", NOW + 1200);
    let file = token_file(&token);
    let p = provider(Kind::Oidc);
    let target = p
        .target(
            &registry("zot.example.com"),
            &options(&[
                ("audience", "zot.example.com"),
                ("token_file", &file.path().to_string_lossy()),
            ]),
        )
        .unwrap();
    let c = p.fetch(&target).await.unwrap();
    assert_eq!(
        (c.username(), c.secret().expose_secret()),
        (OIDC_USERNAME, token.as_str())
    );
    assert_eq!(c.expires_at(), Some(at(NOW + 1200)));
    assert!(c.passes_subject_token());
}

#[test]
fn only_the_pass_through_says_before_a_fetch_that_it_passes_the_token() {
    for kind in Kind::ALL {
        let p = FederatedProvider::new(kind).unwrap();
        assert_eq!(p.passes_subject_token(), kind == Kind::Oidc, "{kind:?}");
    }
}

#[tokio::test]
async fn a_workload_token_is_used_and_names_the_service_account_in_the_scope() {
    let p = provider(Kind::Oidc);
    let base = p
        .target(
            &registry("zot.example.com"),
            &options(&[("audience", "zot"), ("username", "puller")]),
        )
        .unwrap();
    assert_eq!(p.workload_audience(&base, &BTreeMap::new()).unwrap(), "zot");
    let token = subject("zot", NOW + 600);
    let w = WorkloadIdentity::from_token(token.clone().into(), BTreeMap::new()).unwrap();
    let bound = p.bind_workload(base.clone(), w).unwrap();
    assert!(
        bound.scope().starts_with("sa=team-a/puller/u-1|oidc:"),
        "{}",
        bound.scope()
    );
    let c = p.fetch(&bound).await.unwrap();
    assert_eq!(c.secret().expose_secret(), token);
    assert_eq!(c.username(), "puller");
    // Unbound, with no token file, there is no identity: never an ambient one.
    let e = p.fetch(&base).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMissing);
    assert!(e.message().contains("names no `token_file`"), "{e}");
}

#[tokio::test]
async fn a_token_for_another_audience_or_expired_is_refused_before_any_call() {
    let (url, seen) = stand_in(
        "/oauth2/federation/robot/token",
        200,
        serde_json::json!({"token": "t"}),
    )
    .await;
    let p = provider(Kind::Quay);
    for (token, needle, kind) in [
        (
            subject("sts.amazonaws.com", NOW + 600),
            "has audience sts.amazonaws.com, not the rule's `quay`",
            ErrorKind::IdentityRejected,
        ),
        (
            subject("quay", NOW - 1),
            "expired at",
            ErrorKind::IdentityMissing,
        ),
        (
            "not-a-jwt".to_string(),
            "is not a JWT",
            ErrorKind::InvalidConfig,
        ),
    ] {
        let file = token_file(&token);
        let target = p
            .target(
                &registry("quay.example.com"),
                &options(&[
                    ("audience", "quay"),
                    ("robot", "acme+puller"),
                    ("url", &url),
                    ("token_file", &file.path().to_string_lossy()),
                ]),
            )
            .unwrap();
        let e = p.fetch(&target).await.unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.message().contains(needle), "{e}");
        assert!(!e.chain().contains(&token), "{e}");
    }
    assert!(seen.all().is_empty(), "no token reached the exchange");
}

#[tokio::test]
async fn a_refusal_names_its_reason_and_a_redirect_is_never_followed() {
    let token = subject("quay", NOW + 600);
    let file = token_file(&token);
    let p = provider(Kind::Quay);
    let fetch = |url: String| {
        let p = &p;
        let file = &file;
        let target = p
            .target(
                &registry("quay.example.com"),
                &options(&[
                    ("audience", "quay"),
                    ("robot", "acme+puller"),
                    ("url", &url),
                    ("token_file", &file.path().to_string_lossy()),
                ]),
            )
            .unwrap();
        async move { p.fetch(&target).await.unwrap_err() }
    };
    let (url, _) = stand_in(
        "/oauth2/federation/robot/token",
        401,
        serde_json::json!({"error": "the token's subject is not trusted by this robot"}),
    )
    .await;
    let e = fetch(url).await;
    assert_eq!(e.kind(), ErrorKind::IdentityRejected);
    assert!(
        e.message().ends_with(
            "refused the token (HTTP 401): the token's subject is not trusted by this robot"
        ),
        "{e}"
    );

    // An exchange that redirects elsewhere: the other host never sees a request.
    let (elsewhere, seen_elsewhere) = stand_in(
        "/oauth2/federation/robot/token",
        200,
        serde_json::json!({"token": "stolen"}),
    )
    .await;
    let target = format!("{elsewhere}/oauth2/federation/robot/token");
    let redirect = axum::Router::new().route(
        "/oauth2/federation/robot/token",
        get(move || {
            let target = target.clone();
            async move { axum::response::Redirect::temporary(&target) }
        }),
    );
    let e = fetch(serve(redirect).await).await;
    assert_eq!(e.kind(), ErrorKind::BadResponse);
    assert!(e.message().contains("never follows"), "{e}");
    assert!(seen_elsewhere.all().is_empty());
}

#[tokio::test]
async fn an_answer_without_expiry_lasts_an_hour_at_most() {
    let (url, _) = stand_in("/openid/acme/", 201, serde_json::json!({"token": "opaque"})).await;
    let file = token_file(&subject("cs", NOW + 7200));
    let p = provider(Kind::Cloudsmith);
    let target = p
        .target(
            &registry("docker.cloudsmith.io"),
            &options(&[
                ("audience", "cs"),
                ("org", "acme"),
                ("service", "svc"),
                ("url", &url),
                ("token_file", &file.path().to_string_lossy()),
            ]),
        )
        .unwrap();
    let c = p.fetch(&target).await.unwrap();
    assert_eq!(c.expires_at(), Some(at(NOW + 3600)));
}

#[test]
fn no_host_is_recognised_and_scopes_tell_rules_apart() {
    let p = provider(Kind::Quay);
    assert!(p.recognise(&registry("quay.io")).is_none());
    let a = p
        .target(
            &registry("quay.io"),
            &options(&[("audience", "quay"), ("robot", "acme+a")]),
        )
        .unwrap();
    assert_eq!(a.param("url"), Some("https://quay.io"));
    let b = p
        .target(
            &registry("quay.io"),
            &options(&[("audience", "quay"), ("robot", "acme+b")]),
        )
        .unwrap();
    let c = p
        .target(
            &registry("quay.example.com"),
            &options(&[("audience", "quay"), ("robot", "acme+a")]),
        )
        .unwrap();
    assert_ne!(a.scope(), b.scope());
    assert_ne!(
        a.scope(),
        c.scope(),
        "another Quay host is another exchange"
    );
    let cloudsmith = provider(Kind::Cloudsmith)
        .target(
            &registry("docker.cloudsmith.io"),
            &options(&[("audience", "cs"), ("org", "acme"), ("service", "svc")]),
        )
        .unwrap();
    assert_eq!(cloudsmith.param("url"), Some(CLOUDSMITH_API));
}

/// A Quay target for the stand-in at `url`, reading `file`.
fn quay_target(p: &FederatedProvider, url: &str, file: &tempfile::NamedTempFile) -> Target {
    p.target(
        &registry("quay.example.com"),
        &options(&[
            ("audience", "quay"),
            ("robot", "acme+puller"),
            ("url", url),
            ("token_file", &file.path().to_string_lossy()),
        ]),
    )
    .unwrap()
}

/// A provider that tries twice, 20 ms apart, and gives a call `timeout`.
fn patient(kind: Kind, timeout: Duration) -> FederatedProvider {
    let settings = HttpSettings {
        attempts: 2,
        backoff: Duration::from_millis(20),
        request_timeout: timeout,
        ..HttpSettings::default()
    };
    FederatedProvider::with_settings(kind, settings)
        .unwrap()
        .with_clock(Arc::new(ManualClock::new(at(NOW))))
}

/// A stand-in of the Quay endpoint answering the statuses of `script` in turn (the last
/// one repeated), with a robot token when 200; how many calls it had.
async fn scripted(script: Vec<u16>) -> (String, Arc<Mutex<usize>>) {
    let calls = Arc::new(Mutex::new(0usize));
    let counted = calls.clone();
    let app = axum::Router::new().route(
        "/oauth2/federation/robot/token",
        get(move || {
            let counted = counted.clone();
            let script = script.clone();
            async move {
                let n = {
                    let mut c = counted.lock().unwrap();
                    *c += 1;
                    *c
                };
                let status = script[(n - 1).min(script.len() - 1)];
                let body = if status == 200 {
                    serde_json::json!({"token": "robot"})
                } else {
                    serde_json::json!({"error": "nope"})
                };
                (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
            }
        }),
    );
    (serve(app).await, calls)
}

#[tokio::test]
async fn only_5xx_and_429_answers_are_retried_and_each_status_has_its_kind() {
    let file = token_file(&subject("quay", NOW + 600));
    let p = patient(Kind::Quay, Duration::from_secs(5));
    for (script, want, calls) in [
        (vec![503, 200], Ok(()), 2),
        (vec![429, 200], Ok(()), 2),
        (vec![401, 200], Err(ErrorKind::IdentityRejected), 1),
        (vec![404], Err(ErrorKind::IdentityRejected), 1),
        (vec![500], Err(ErrorKind::Unavailable), 2),
        (vec![429], Err(ErrorKind::Throttled), 2),
        (vec![418], Err(ErrorKind::BadResponse), 1),
    ] {
        let (url, seen) = scripted(script.clone()).await;
        let got = p.fetch(&quay_target(&p, &url, &file)).await;
        assert_eq!(
            got.as_ref().map(|_| ()).map_err(|e| e.kind()),
            want,
            "{script:?}: {got:?}"
        );
        assert_eq!(*seen.lock().unwrap(), calls, "{script:?}");
    }
}

#[tokio::test]
async fn a_refused_connection_is_retried_but_a_dropped_one_is_not() {
    let file = token_file(&subject("quay", NOW + 600));
    let p = patient(Kind::Quay, Duration::from_secs(5));

    // Nothing listens yet: refused. The stand-in comes up before the retry, which
    // succeeds; without a retry the fetch would fail.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let late = tokio::spawn(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let app = axum::Router::new().route(
            "/oauth2/federation/robot/token",
            get(|| async { axum::Json(serde_json::json!({"token": "robot"})) }),
        );
        axum::serve(listener, app).await.unwrap();
    });
    let p_slow = FederatedProvider::with_settings(
        Kind::Quay,
        HttpSettings {
            attempts: 2,
            backoff: Duration::from_millis(300),
            ..HttpSettings::default()
        },
    )
    .unwrap()
    .with_clock(Arc::new(ManualClock::new(at(NOW))));
    let got = p_slow
        .fetch(&quay_target(
            &p_slow,
            &format!("http://127.0.0.1:{port}"),
            &file,
        ))
        .await;
    assert_eq!(got.unwrap().secret().expose_secret(), "robot");
    late.abort();

    // A port that refuses for good: unavailable, "could not be reached".
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = p
        .fetch(&quay_target(
            &p,
            &format!("http://127.0.0.1:{closed}"),
            &file,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("could not be reached"), "{e}");

    // A server that accepts and hangs up: the request may have arrived, so it is not
    // sent again.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(Mutex::new(0usize));
    let counted = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            *counted.lock().unwrap() += 1;
            drop(socket);
        }
    });
    let e = p
        .fetch(&quay_target(&p, &format!("http://{addr}"), &file))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("failed"), "{e}");
    assert_eq!(*accepted.lock().unwrap(), 1);
}

#[tokio::test]
async fn an_exchange_that_does_not_answer_in_time_is_timed_out() {
    let app = axum::Router::new().route(
        "/oauth2/federation/robot/token",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            axum::Json(serde_json::json!({"token": "late"}))
        }),
    );
    let url = serve(app).await;
    let file = token_file(&subject("quay", NOW + 600));
    let p = patient(Kind::Quay, Duration::from_millis(300));
    let e = p.fetch(&quay_target(&p, &url, &file)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(e.message().contains("did not answer in time"), "{e}");
}

/// An answer `{"token": "aaa…"}` of exactly `len` bytes.
fn answer_of(len: usize) -> String {
    let frame = r#"{"token":""}"#.len();
    format!(r#"{{"token":"{}"}}"#, "a".repeat(len - frame))
}

#[tokio::test]
async fn answers_are_read_up_to_the_cap_and_not_a_byte_more() {
    use axum::body::Body;
    use regbroker_provider::MAX_UPSTREAM_BODY as MAX;
    let file = token_file(&subject("quay", NOW + 600));
    let p = provider(Kind::Quay);
    // (status, body length, chunked) → ok, or the error kind.
    for (status, len, chunked, want) in [
        (200, MAX, false, Ok(())),
        (200, MAX + 1, false, Err(ErrorKind::BadResponse)),
        (200, MAX, true, Ok(())),
        (200, MAX + 1, true, Err(ErrorKind::BadResponse)),
        // A refusal with an oversized body is still a refusal.
        (401, MAX + 1, false, Err(ErrorKind::IdentityRejected)),
    ] {
        let body = answer_of(len);
        let app = axum::Router::new().route(
            "/oauth2/federation/robot/token",
            get(move || {
                let body = body.clone();
                async move {
                    let body = if chunked {
                        // Two halves, no Content-Length: the cap is met while reading.
                        let (a, b) = body.split_at(body.len() / 2);
                        let chunks =
                            vec![Ok::<_, std::io::Error>(a.to_string()), Ok(b.to_string())];
                        Body::from_stream(futures_util::stream::iter(chunks))
                    } else {
                        Body::from(body)
                    };
                    (StatusCode::from_u16(status).unwrap(), body).into_response()
                }
            }),
        );
        let url = serve(app).await;
        let got = p.fetch(&quay_target(&p, &url, &file)).await;
        assert_eq!(
            got.as_ref().map(|_| ()).map_err(|e| e.kind()),
            want,
            "{status} {len} chunked={chunked}: {got:?}"
        );
        if let Err(e) = &got
            && status == 200
        {
            assert!(e.message().contains("larger than 65536 bytes"), "{e}");
        }
    }
}

#[tokio::test]
async fn artifactory_reads_expires_in_as_text_and_a_bad_username_falls_back_to_the_tokens() {
    let access = jwt(&serde_json::json!({"sub": "jfac@01h/users/ci-puller", "exp": NOW + 7200}));
    for bad in ["", "a:b"] {
        let (url, _) = stand_in(
            "/access/api/v1/oidc/token",
            200,
            serde_json::json!({"access_token": access, "expires_in": "600", "username": bad}),
        )
        .await;
        let file = token_file(&subject("jfrog", NOW + 3600));
        let p = provider(Kind::Artifactory);
        let target = p
            .target(
                &registry("acme.jfrog.io"),
                &options(&[
                    ("audience", "jfrog"),
                    ("provider_name", "k8s"),
                    ("url", &url),
                    ("token_file", &file.path().to_string_lossy()),
                ]),
            )
            .unwrap();
        let c = p.fetch(&target).await.unwrap();
        assert_eq!(c.username(), "ci-puller", "username {bad:?}");
        assert_eq!(c.expires_at(), Some(at(NOW + 600)));
    }
}

#[test]
fn the_four_providers_are_named_and_check_their_options() {
    let all = FederatedProvider::all().unwrap();
    let names: Vec<&str> = all.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["quay", "artifactory", "cloudsmith", "oidc"]);
    assert!(
        all.iter()
            .all(|p| p.identity_kind() == IdentityKind::RuleToken)
    );
    let e = all[0]
        .check_options(&options(&[("audience", "quay")]))
        .unwrap_err();
    assert!(e.contains("`robot`"), "{e}");
    assert!(
        all[3]
            .check_options(&options(&[("audience", "zot")]))
            .is_ok()
    );
}

#[test]
fn diagnose_target_checks_the_rules_token_file_and_never_shows_the_token() {
    use regbroker_provider::diagnosis::Status;
    let p = provider(Kind::Oidc);
    let token = subject("sts.amazonaws.com", NOW + 600);
    let file = token_file(&token);
    let target = p
        .target(
            &registry("zot.example.com"),
            &options(&[
                ("audience", "zot"),
                ("token_file", &file.path().to_string_lossy()),
            ]),
        )
        .unwrap();
    let findings = p.diagnose_target(&target);
    assert!(
        findings
            .iter()
            .all(|f| f.check.starts_with("oidc.token_file")),
        "{findings:?}"
    );
    assert!(
        findings.iter().any(|f| f.status == Status::Warn
            && f.fix
                .as_deref()
                .is_some_and(|x| x.contains("`audience: zot`"))),
        "{findings:?}"
    );
    assert!(!format!("{findings:?}").contains(&token));
    let without = p
        .target(
            &registry("zot.example.com"),
            &options(&[("audience", "zot")]),
        )
        .unwrap();
    let findings = p.diagnose_target(&without);
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].status, Status::Info);
    assert!(findings[0].detail.contains("no token_file"), "{findings:?}");
}
