//! End-to-end scenarios through the real `azure_identity` code against in-process fakes
//! of Entra ID, the App Service managed identity endpoint and ACR's exchange (see
//! `fake/mod.rs` for why they are fakes).
//!
//! Every in-process scenario passes its settings explicitly (an env map, an HTTP client
//! trusting the test CA, a clock), so tests run in parallel threads without touching
//! the process env. Managed identity is the exception: `azure_identity` reads
//! `IDENTITY_ENDPOINT` / `IDENTITY_HEADER` from the process env only, so that scenario
//! runs this test binary again as a child process with those variables set.
//!
//! Env vars used: `REGBROKER_AZURE_TEST_CHILD`, `REGBROKER_AZURE_TEST_CA_PEM`,
//! `REGBROKER_AZURE_TEST_IMDS` and `REGBROKER_AZURE_TEST_REFRESH` (set by the parent for the child only), plus the
//! provider's own variables in the child's env. Nothing needs installing.

#![allow(clippy::unwrap_used)]

mod fake;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use fake::scenario::*;
use fake::*;
use regbroker_azure::{ACR_USERNAME, AzureProvider, Env, FALLBACK_TTL};
use regbroker_provider::{ErrorKind, ExposeSecret, ManualClock, Provider};

#[tokio::test]
async fn workload_identity_end_to_end() {
    let s = scenario(false).await;
    let cred = fetch(&s).await.expect("credential");
    assert_eq!(cred.username(), ACR_USERNAME);
    assert_eq!(
        cred.secret().expose_secret(),
        s.running.fake.refresh_token()
    );
    assert_eq!(
        cred.expires_at(),
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(REFRESH_EXP)),
        "expiry is the refresh token's exp"
    );

    // Entra ID saw the projected token as client assertion, for our tenant and scope.
    let fake = &s.running.fake;
    assert_eq!(fake.aad_tenants.lock().unwrap().as_slice(), [TENANT]);
    let aad = fake.aad_forms.lock().unwrap()[0].clone();
    assert_eq!(aad["client_assertion"], SA_TOKEN);
    assert_eq!(aad["client_id"], CLIENT_ID);
    assert_eq!(aad["scope"], "https://containerregistry.azure.net/.default");

    // The exchange got the four form fields.
    let ex = fake.exchange_forms.lock().unwrap()[0].clone();
    assert_eq!(ex["grant_type"], "access_token");
    assert_eq!(ex["service"], REGISTRY);
    assert_eq!(ex["tenant"], TENANT);
    assert_eq!(ex["access_token"], fake.access_token);

    // A second fetch reuses the SDK credential and its token cache: one more exchange,
    // no second Entra ID call.
    fetch(&s).await.expect("second credential");
    assert_eq!(fake.aad_calls.load(Ordering::SeqCst), 1);
    assert_eq!(fake.exchange_calls.load(Ordering::SeqCst), 2);
    assert_no_secret(&s, &format!("{cred:?} {:?}", s.provider));
}

#[tokio::test]
async fn client_secret_end_to_end() {
    let s = scenario(true).await;
    let cred = fetch(&s).await.expect("credential");
    assert_eq!(
        cred.secret().expose_secret(),
        s.running.fake.refresh_token()
    );
    let aad = s.running.fake.aad_forms.lock().unwrap()[0].clone();
    assert_eq!(aad["client_secret"], CLIENT_SECRET);
    assert!(!aad.contains_key("client_assertion"));
}

#[tokio::test]
async fn exchange_401_is_identity_rejected_with_a_clear_message() {
    let s = scenario(false).await;
    s.running.fake.script_exchange(
        401,
        &format!(
            r#"{{"errors":[{{"code":"UNAUTHORIZED","message":"authentication required for {}"}}]}}"#,
            s.running.fake.access_token
        ),
    );
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityRejected, "{e}");
    assert!(e.message().contains(REGISTRY), "{e}");
    assert!(e.message().contains("HTTP 401"), "{e}");
    assert!(e.message().contains("UNAUTHORIZED"), "{e}");
    assert!(e.message().contains("AcrPull"), "{e}");
    assert_no_secret_in_error(&s, &e);
}

#[tokio::test]
async fn exchange_429_and_503_are_transient() {
    let s = scenario(false).await;
    s.running.fake.script_exchange(
        429,
        r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#,
    );
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Throttled, "{e}");
    s.running.fake.script_exchange(503, "<html>busy</html>");
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(!e.message().contains("html"), "no raw body: {e}");
    s.running
        .fake
        .script_exchange(200, r#"{"access_token":"not what we asked"}"#);
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadResponse, "{e}");
    assert!(!e.message().contains("not what we asked"), "{e}");
}

#[tokio::test]
async fn an_exchange_answer_over_the_size_cap_counts_by_its_status() {
    // A body over the cap is not read: a 5xx or 429 is still the upstream failing; any
    // other status is a bad answer.
    let s = scenario(false).await;
    let huge = "x".repeat(regbroker_provider::MAX_UPSTREAM_BODY + 1);
    for (status, want) in [
        (503, ErrorKind::Unavailable),
        (429, ErrorKind::Throttled),
        (200, ErrorKind::BadResponse),
        (401, ErrorKind::BadResponse),
    ] {
        s.running.fake.script_exchange(status, &huge);
        let e = fetch(&s).await.unwrap_err();
        assert_eq!(e.kind(), want, "HTTP {status}: {e}");
    }
}

/// The exchange sent to a raw TCP server on loopback that reads the request and then
/// either never answers (`stall`) or closes the connection: faults no real server gives on
/// demand. Entra ID is the fake's; the transport times out after 1 s.
async fn exchange_fault(stall: bool) -> regbroker_provider::Error {
    use tokio::io::AsyncReadExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                if stall {
                    std::future::pending::<()>().await;
                }
            });
        }
    });
    let running = start().await;
    let token_file = SaTokenFile::write();
    let mut env = identity_env(format!("{}/", running.https));
    env.push((
        "REGBROKER_AZURE_EXCHANGE_URL",
        format!("http://{addr}/oauth2/exchange"),
    ));
    env.push(("AZURE_FEDERATED_TOKEN_FILE", token_file.path.clone()));
    let provider = AzureProvider::builder()
        .env(Env::from_pairs(env))
        // The transport's own timeout (1 s) comes before the provider's (10 s).
        .http_client(
            reqwest::Client::builder()
                .tls_certs_only(
                    [reqwest::Certificate::from_pem(running.ca_pem.as_bytes()).unwrap()],
                )
                .no_proxy()
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .clock(Arc::new(ManualClock::fixed()) as regbroker_provider::SharedClock)
        .retry(1, Duration::from_millis(20))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let target = provider.recognise(&registry()).expect("recognised");
    provider.fetch(&target).await.unwrap_err()
}

#[tokio::test]
async fn an_exchange_that_never_answers_times_out_and_a_dropped_one_is_unavailable() {
    let e = exchange_fault(true).await;
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{}", e.chain());
    let e = exchange_fault(false).await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert!(e.message().contains("could not be sent"), "{}", e.chain());
}

#[tokio::test]
async fn refresh_token_exp_in_the_year_10000_or_later_is_capped() {
    // A year-10000 `exp` once reached RFC 3339 formatting, which panicked (an abort in
    // the release build). It is capped at MAX_LIFETIME from now at the provider boundary.
    let s = scenario(false).await;
    for exp in [253_402_300_800_u64, u64::MAX / 2] {
        let refresh = jwt(serde_json::json!({"exp": exp, "tid": TENANT}));
        s.running.fake.script_exchange(
            200,
            &serde_json::json!({ "refresh_token": refresh }).to_string(),
        );
        let cred = fetch(&s).await.expect("credential");
        assert_eq!(cred.secret().expose_secret(), refresh);
        assert_eq!(
            cred.expires_at(),
            Some(s.clock.now_for_test() + regbroker_provider::MAX_LIFETIME),
            "exp {exp}"
        );
    }
}

#[tokio::test]
async fn an_exchange_answer_over_the_size_cap_is_a_bad_response() {
    let s = scenario(false).await;
    let huge = format!(
        r#"{{"refresh_token":"{}","pad":"{}"}}"#,
        s.running.fake.refresh_token(),
        "x".repeat(regbroker_provider::MAX_UPSTREAM_BODY)
    );
    s.running.fake.script_exchange(200, &huge);
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadResponse, "{e}");
    assert!(e.message().contains("larger than"), "{e}");
    assert_no_secret_in_error(&s, &e);
    // An error body over the cap is cut too, and still classified by its status.
    s.running.fake.script_exchange(503, &"y".repeat(1 << 20));
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[tokio::test]
async fn an_entra_id_answer_over_the_size_cap_is_a_bad_response() {
    // The SDK's own read of a token answer used to be unbounded: a hostile or broken
    // identity endpoint could make the sidecar buffer any amount. The transport now reads
    // at most MAX_UPSTREAM_BODY and reports more as a bad response.
    let s = scenario(false).await;
    s.running.fake.script_aad(
        200,
        serde_json::json!({
            "token_type": "Bearer",
            "expires_in": 3600,
            "access_token": "x".repeat(regbroker_provider::MAX_UPSTREAM_BODY),
        }),
    );
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadResponse, "{e}");
    assert!(!e.message().contains("xxxxxxxx"), "{e}");
    assert_eq!(
        s.running.fake.exchange_calls.load(Ordering::SeqCst),
        0,
        "no exchange without an Entra ID token"
    );
}

#[tokio::test]
async fn aad_500_then_success() {
    let s = scenario(false).await;
    s.running.fake.script_aad(
        500,
        serde_json::json!({"error":"temporarily_unavailable","error_description":"AADSTS50000: retry","error_codes":[50000]}),
    );
    let cred = fetch(&s).await.expect("the SDK retries the 500");
    assert_eq!(
        cred.secret().expose_secret(),
        s.running.fake.refresh_token()
    );
    assert_eq!(s.running.fake.aad_calls.load(Ordering::SeqCst), 2);
}

/// azure_identity 1.0 adds `expires_in` to the clock with a panicking `+`: without the
/// provider's clamp in its transport, this answer panicked (and aborted a release build).
/// Found by the `entra_error` fuzz target.
#[tokio::test]
async fn an_entra_answer_with_an_absurd_expires_in_is_survived() {
    let s = scenario(false).await;
    s.running.fake.script_aad(
        200,
        serde_json::json!({
            "token_type": "Bearer",
            "access_token": s.running.fake.access_token,
            "expires_in": i64::MAX,
            "ext_expires_in": i64::MAX,
        }),
    );
    let cred = fetch(&s).await.expect("credential");
    assert_eq!(
        cred.secret().expose_secret(),
        s.running.fake.refresh_token()
    );
}

#[tokio::test]
async fn aad_500_every_time_is_unavailable() {
    let s = scenario(false).await;
    for _ in 0..3 {
        s.running.fake.script_aad(
            500,
            serde_json::json!({"error":"temporarily_unavailable","error_description":"AADSTS50000: retry","error_codes":[50000]}),
        );
    }
    let e = fetch(&s).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert_eq!(
        s.running.fake.aad_calls.load(Ordering::SeqCst),
        3,
        "1 try + 2 retries"
    );
    assert_eq!(s.running.fake.exchange_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn aad_refusal_is_identity_rejected() {
    let s = scenario(false).await;
    let target = s
        .provider
        .target(
            &registry(),
            &[(
                "client_id".to_string(),
                "not-the-registered-app".to_string(),
            )]
            .into_iter()
            .collect(),
        )
        .unwrap();
    let e = s.provider.fetch(&target).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityRejected, "{}", e.chain());
    assert!(e.message().contains("not-the-registered-app"), "{e}");
    assert!(e.message().contains("700016"), "{e}");
    assert_no_secret_in_error(&s, &e);
    assert_eq!(s.running.fake.exchange_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn refresh_token_without_exp_gets_the_fallback_ttl() {
    let s = scenario(false).await;
    *s.running.fake.refresh_token.lock().unwrap() =
        jwt(serde_json::json!({"grant_type":"refresh_token"}));
    s.clock.advance(Duration::from_secs(42));
    let cred = fetch(&s).await.expect("credential");
    assert_eq!(
        cred.expires_at(),
        Some(s.clock.now_for_test() + FALLBACK_TTL)
    );
}

#[tokio::test]
async fn rule_scope_option_reaches_entra_id() {
    let s = scenario(false).await;
    let scope = "https://management.azure.com/.default";
    *s.running.fake.expect_scope.lock().unwrap() = scope.to_string();
    let target = s
        .provider
        .target(
            &registry(),
            &[("scope".to_string(), scope.to_string())]
                .into_iter()
                .collect(),
        )
        .unwrap();
    s.provider.fetch(&target).await.expect("credential");
    assert_eq!(s.running.fake.aad_forms.lock().unwrap()[0]["scope"], scope);
}

#[tokio::test]
async fn slow_exchange_times_out() {
    let running = start().await;
    *running.fake.exchange_delay.lock().unwrap() = Some(Duration::from_secs(5));
    let token_file = SaTokenFile::write();
    let mut env = identity_env(running.https.clone());
    env.extend([
        ("AZURE_FEDERATED_TOKEN_FILE", token_file.path.clone()),
        ("REGBROKER_AZURE_EXCHANGE_URL", running.exchange_url()),
    ]);
    let provider = AzureProvider::builder()
        .env(Env::from_pairs(env))
        .http_client(client_trusting(&running.ca_pem))
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    let target = provider.recognise(&registry()).unwrap();
    let e = provider.fetch(&target).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
}

#[tokio::test]
async fn untrusted_tls_is_unavailable_not_accepted() {
    // The provider's default client trusts only real roots, not the test CA.
    let running = start().await;
    let token_file = SaTokenFile::write();
    let mut env = identity_env(running.https.clone());
    env.push(("AZURE_FEDERATED_TOKEN_FILE", token_file.path.clone()));
    let provider = AzureProvider::builder()
        .env(Env::from_pairs(env))
        .retry(0, Duration::from_millis(10))
        .build()
        .unwrap();
    let target = provider.recognise(&registry()).unwrap();
    let e = provider.fetch(&target).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert_eq!(running.fake.aad_calls.load(Ordering::SeqCst), 0);
}

/// Captures every log line (all levels) of a scenario and checks no secret is in them.
trait NowForTest {
    fn now_for_test(&self) -> SystemTime;
}

impl NowForTest for ManualClock {
    fn now_for_test(&self) -> SystemTime {
        regbroker_provider::Clock::now(self)
    }
}

// ---- managed identity, in a child process -------------------------------------------

const CHILD_FLAG: &str = "REGBROKER_AZURE_TEST_CHILD";
const CHILD_CA: &str = "REGBROKER_AZURE_TEST_CA_PEM";
const CHILD_OK: &str = "REGBROKER-AZURE-CHILD-OK";
const CHILD_IMDS: &str = "REGBROKER_AZURE_TEST_IMDS";
/// Set: the child builds the provider's own HTTP clients (trusting the test CA) instead
/// of passing one, so the proxy variables reach reqwest as in production.
const CHILD_OWN_CLIENTS: &str = "REGBROKER_AZURE_TEST_OWN_CLIENTS";

/// Runs `managed_identity_child` in a child process, with the App Service managed
/// identity variables or (with `imds`) none of them, and returns the fake's record.
async fn run_managed_identity_child(client_id: Option<&str>, imds: bool) -> Running {
    let (running, out) = spawn_managed_identity_child(client_id, imds, &[]).await;
    assert_child_ok(&out);
    running
}

/// Runs `managed_identity_child` in a child process against fresh fakes, with the
/// managed identity env (App Service endpoint, or IMDS when `imds`) plus `extra` env.
async fn spawn_managed_identity_child(
    client_id: Option<&str>,
    imds: bool,
    extra: &[(&str, String)],
) -> (Running, std::process::Output) {
    let running = start().await;
    let exe = std::env::current_exe().unwrap();
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args([
        "--exact",
        "managed_identity_child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    // Killed when the timeout below drops it: a child that hangs must not outlive the test.
    .kill_on_drop(true);
    // Start from a clean identity env: these also steer the SDK's managed identity
    // source selection (Service Fabric, Azure Arc, Cloud Shell, Azure ML).
    let sdk_sources = [
        "IDENTITY_SERVER_THUMBPRINT",
        "IMDS_ENDPOINT",
        "MSI_ENDPOINT",
        "MSI_SECRET",
    ];
    for k in Env::NAMES.iter().chain(&sdk_sources).chain(PROXY_VARS) {
        cmd.env_remove(k);
    }
    cmd.env(CHILD_FLAG, "1")
        .env(CHILD_CA, &running.ca_pem)
        .env("REGBROKER_AZURE_EXCHANGE_URL", running.exchange_url())
        .env("REGBROKER_AZURE_TEST_REFRESH", running.fake.refresh_token());
    if let Some(c) = client_id {
        cmd.env("AZURE_CLIENT_ID", c);
    }
    if imds {
        cmd.env(CHILD_IMDS, &running.http);
    } else {
        cmd.env("IDENTITY_ENDPOINT", running.msi_endpoint())
            .env("IDENTITY_HEADER", MSI_HEADER);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let bound = Duration::from_secs(60);
    let out = tokio::time::timeout(bound, cmd.output())
        .await
        .unwrap_or_else(|_| {
            panic!("child `managed_identity_child` of this test binary did not exit within {bound:?}: killed it")
        })
        .expect("child ran");
    (running, out)
}

fn assert_child_ok(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(CHILD_OK),
        "child failed or did not run:\n{stdout}\n{stderr}"
    );
}

/// Every proxy variable reqwest reads (both spellings).
const PROXY_VARS: &[&str] = &[
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// A proxy on loopback that records the head of every request it receives and answers
/// 502 (it forwards nothing).
async fn recording_proxy() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sink = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                sink.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = tcp
                    .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn managed_identity_requests_never_go_through_a_proxy() {
    // HTTP_PROXY and friends are honoured for Entra ID and the exchange, never for a
    // loopback or link-local identity endpoint: the proxy would get the token request
    // with its `x-identity-header` secret, and the token.
    let (proxy, seen) = recording_proxy().await;
    let env: Vec<(&str, String)> = PROXY_VARS
        .iter()
        .filter(|k| !k.eq_ignore_ascii_case("no_proxy"))
        .map(|k| (*k, proxy.clone()))
        .chain([(CHILD_OWN_CLIENTS, "1".to_string())])
        .collect();
    let (running, out) = spawn_managed_identity_child(Some(CLIENT_ID), false, &env).await;
    let through_proxy = seen.lock().unwrap().clone();
    assert!(
        through_proxy.is_empty(),
        "the proxy received {} request(s); first: {:?}",
        through_proxy.len(),
        through_proxy.first()
    );
    assert_child_ok(&out);
    assert_eq!(running.fake.msi_calls.load(Ordering::SeqCst), 1);
    assert_eq!(running.fake.exchange_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn managed_identity_app_service_user_assigned() {
    let running = run_managed_identity_child(Some(CLIENT_ID), false).await;
    let fake = &running.fake;
    assert_eq!(fake.msi_calls.load(Ordering::SeqCst), 1);
    assert_eq!(fake.imds_calls.load(Ordering::SeqCst), 0);
    let q = fake.msi_queries.lock().unwrap()[0].clone();
    assert_eq!(q["resource"], "https://containerregistry.azure.net");
    assert_eq!(q["client_id"], CLIENT_ID);
    assert_eq!(fake.aad_calls.load(Ordering::SeqCst), 0);
    let ex = fake.exchange_forms.lock().unwrap()[0].clone();
    assert_eq!(ex["access_token"], fake.access_token);
    assert_eq!(
        ex["tenant"], TOKEN_TENANT,
        "tenant taken from the token's tid"
    );
}

#[tokio::test]
async fn managed_identity_app_service_system_assigned() {
    let running = run_managed_identity_child(None, false).await;
    let q = running.fake.msi_queries.lock().unwrap()[0].clone();
    assert!(!q.contains_key("client_id"), "system-assigned: {q:?}");
    assert_eq!(running.fake.exchange_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn managed_identity_imds_user_assigned() {
    // Without IDENTITY_ENDPOINT the SDK asks IMDS; the child's SDK transport sends that
    // request to the fake on loopback (and refuses any other non-loopback host).
    let running = run_managed_identity_child(Some(CLIENT_ID), true).await;
    let fake = &running.fake;
    assert_eq!(fake.imds_calls.load(Ordering::SeqCst), 1);
    assert_eq!(fake.msi_calls.load(Ordering::SeqCst), 0);
    let q = fake.msi_queries.lock().unwrap()[0].clone();
    assert_eq!(q["client_id"], CLIENT_ID);
    assert_eq!(q["resource"], "https://containerregistry.azure.net");
    assert_eq!(fake.exchange_calls.load(Ordering::SeqCst), 1);
}

/// The child side: builds the provider from the (child's own) process env, as
/// production does, and fetches through the App Service endpoint or IMDS.
#[tokio::test]
#[ignore = "child process of managed_identity_*; runs only with REGBROKER_AZURE_TEST_CHILD=1"]
async fn managed_identity_child() {
    // Run by hand without its parent it fails, rather than passing having tested nothing.
    assert_eq!(
        std::env::var(CHILD_FLAG).as_deref(),
        Ok("1"),
        "only meaningful as a child of managed_identity_*, which sets {CHILD_FLAG}=1"
    );
    let ca = std::env::var(CHILD_CA).unwrap();
    let client = client_trusting(&ca);
    let mut builder = AzureProvider::builder()
        .env(Env::from_process())
        .retry(1, Duration::from_millis(20))
        .timeout(Duration::from_secs(10));
    builder = if std::env::var_os(CHILD_OWN_CLIENTS).is_some() {
        builder.tls_root_pem(ca.as_bytes())
    } else {
        builder.http_client(client.clone())
    };
    if let Ok(fake_http) = std::env::var(CHILD_IMDS) {
        builder = builder.sdk_http_client(Arc::new(ImdsToLoopback {
            inner: client,
            fake_http: fake_http.parse().unwrap(),
        }));
    } else {
        // App Service: IDENTITY_ENDPOINT is a loopback URL, no redirection needed.
        assert!(std::env::var("IDENTITY_ENDPOINT").is_ok());
    }
    let provider = builder.build().unwrap();
    let target = provider.recognise(&registry()).expect("recognised");
    assert_eq!(target.param("kind"), Some("managed"));
    let cred = provider
        .fetch(&target)
        .await
        .unwrap_or_else(|e| panic!("{}", e.chain()));
    assert_eq!(cred.username(), ACR_USERNAME);
    assert_eq!(
        cred.secret().expose_secret(),
        std::env::var("REGBROKER_AZURE_TEST_REFRESH").unwrap()
    );
    assert_eq!(
        cred.expires_at(),
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(REFRESH_EXP))
    );
    println!("{CHILD_OK}");
}

/// A ServiceAccount token as the API server issues it for Entra ID (audience
/// `api://AzureADTokenExchange`), unsigned: the fake Entra ID reads its claims.
fn workload_token(namespace: &str) -> String {
    regbroker_provider::test_util::jwt(&serde_json::json!({
        "aud": [regbroker_azure::workload::AUDIENCE],
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": format!("system:serviceaccount:{namespace}:puller"),
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": "puller", "uid": "u-1"}},
    }))
}

fn workload(token: &str, annotations: &[(&str, &str)]) -> regbroker_provider::WorkloadIdentity {
    regbroker_provider::WorkloadIdentity::from_token(
        token.to_string().into(),
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
    .unwrap()
}

/// Per-workload identity (issue 15): the workload's ServiceAccount token is the client
/// assertion, for the client id and tenant of its annotations; this process's own
/// identity (here a client secret) is never used for it. Entra ID is a fake (no emulator
/// exists): it records what it was sent, and this test checks the assertion is that
/// ServiceAccount's token, for Entra ID's audience.
#[tokio::test]
async fn a_workloads_own_token_is_the_client_assertion_for_its_annotated_client() {
    use regbroker_azure::workload::{ACR_CLIENT_ID_ANNOTATION, TENANT_ID_ANNOTATION};
    let s = scenario(true).await;
    let token = workload_token("team-a");
    s.running
        .fake
        .accepted_assertions
        .lock()
        .unwrap()
        .push(token.clone());
    let w = workload(
        &token,
        &[
            (ACR_CLIENT_ID_ANNOTATION, CLIENT_ID),
            (TENANT_ID_ANNOTATION, TENANT),
        ],
    );
    let target = s
        .provider
        .bind_workload(s.provider.recognise(&registry()).unwrap(), w.clone())
        .unwrap();
    assert!(
        target.scope().starts_with("sa=team-a/puller/u-1|workload|"),
        "{}",
        target.scope()
    );
    assert!(target.scope().contains(CLIENT_ID));
    let cred = s.provider.fetch(&target).await.expect("credential");
    assert_eq!(
        cred.secret().expose_secret(),
        s.running.fake.refresh_token()
    );
    let forms = s.running.fake.aad_forms.lock().unwrap().clone();
    let form = forms.last().unwrap();
    assert_eq!(
        form.get("client_assertion"),
        Some(&token),
        "the workload's own token"
    );
    assert_eq!(form.get("client_id").map(String::as_str), Some(CLIENT_ID));
    assert!(
        form.get("client_secret").is_none(),
        "never this process's secret"
    );
    let claims = regbroker_provider::diagnosis::Claims::of_jwt(&token).unwrap();
    assert_eq!(
        claims.subject.as_deref(),
        Some("system:serviceaccount:team-a:puller")
    );
    assert_eq!(claims.audiences, vec![regbroker_azure::workload::AUDIENCE]);
    assert_eq!(
        s.running
            .fake
            .aad_tenants
            .lock()
            .unwrap()
            .last()
            .map(String::as_str),
        Some(TENANT)
    );

    // Another workload whose token Entra ID does not federate: refused, and not served
    // team-a's credential nor this process's.
    let other = workload(
        &workload_token("team-b"),
        &[
            (ACR_CLIENT_ID_ANNOTATION, CLIENT_ID),
            (TENANT_ID_ANNOTATION, TENANT),
        ],
    );
    let target = s
        .provider
        .bind_workload(s.provider.recognise(&registry()).unwrap(), other)
        .unwrap();
    let e = s.provider.fetch(&target).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityRejected, "{e}");
    assert_no_secret_in_error(&s, &e);
    assert!(!e.chain().contains(&token), "{}", e.chain());
}

#[tokio::test]
async fn a_workload_without_a_client_id_is_an_error_never_this_processs_identity() {
    let s = scenario(true).await;
    let e = s
        .provider
        .bind_workload(
            s.provider.recognise(&registry()).unwrap(),
            workload(&workload_token("team-a"), &[]),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMissing, "{e}");
    assert!(
        e.message().contains("azure.workload.identity/client-id"),
        "{e}"
    );
    assert_eq!(s.running.fake.aad_calls.load(Ordering::SeqCst), 0);
}
