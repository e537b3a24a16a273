//! Scenarios against in-process fakes of Google's token services (axum on 127.0.0.1:0):
//! the metadata server, an OAuth token endpoint for service-account keys, the STS and IAM
//! Credentials for external_account. Google's services cannot run here; each fake checks
//! what the real one checks for the behaviour under test.
//!
//! Every scenario passes its settings through `GcpProvider::builder().env(..)`, so tests
//! run in parallel without touching the process environment.

#![allow(clippy::unwrap_used)]

mod common;

use common::federation::{
    AUDIENCE, Federation, Scenario, external_account, external_account_file, start_federation,
};
use common::metadata::{MDS_PATH, Mds, start_mds};
use common::token_endpoint::{TokenEndpoint, start_token_endpoint};

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{
    Fake, Seen, TestKey, clock_now, closed_port, credentials_provider, fetch, form,
    metadata_provider, provider, service_account_key, test_key, write,
};
use regbroker_gcp::{FALLBACK_TTL, OAUTH_SCOPE, USERNAME};
use regbroker_provider::{Credential, Error, ErrorKind, ExposeSecret, ManualClock};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// Metadata server
// ---------------------------------------------------------------------------------------

/// Starts `mds` and fetches a `gcr.io` credential through it.
async fn fetch_through(mds: Mds) -> Result<Credential, Error> {
    let fake = start_mds(mds).await;
    let clock = ManualClock::fixed();
    fetch(&metadata_provider(&fake, &clock), "gcr.io").await
}

#[tokio::test]
async fn metadata_token_needs_the_flavor_header_and_carries_its_expiry() {
    let mds = Mds::default();
    let fake = start_mds(mds.clone()).await;
    // The fake really refuses a request without the header.
    let bare = reqwest::get(fake.url(MDS_PATH)).await.unwrap();
    assert_eq!(bare.status().as_u16(), 403);

    let clock = ManualClock::fixed();
    let p = metadata_provider(&fake, &clock);
    let cred = fetch(&p, "europe-west1-docker.pkg.dev").await.unwrap();
    assert_eq!(cred.username(), USERNAME);
    assert_eq!(cred.secret().expose_secret(), "ya29.mds-1");
    assert_eq!(
        cred.expires_at(),
        Some(clock_now(&clock) + Duration::from_secs(3599))
    );
    let seen = mds.seen.all();
    let last = seen.last().unwrap();
    assert_eq!(last.headers.get("metadata-flavor").unwrap(), "Google");
}

/// A metadata server answering every token request with `body` (status 200).
async fn mds_answering(body: String) -> Fake {
    Fake::start(Router::new().route(
        MDS_PATH,
        get(move || {
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    ))
    .await
}

#[tokio::test]
async fn a_huge_expires_in_is_capped_at_the_max_lifetime() {
    for expires_in in [u64::MAX, 253_402_300_800] {
        let fake = mds_answering(
            json!({"access_token": "ya29.far", "expires_in": expires_in}).to_string(),
        )
        .await;
        let clock = ManualClock::fixed();
        let cred = fetch(&metadata_provider(&fake, &clock), "gcr.io")
            .await
            .unwrap();
        assert_eq!(
            cred.expires_at(),
            Some(clock_now(&clock) + regbroker_provider::MAX_LIFETIME)
        );
    }
}

#[tokio::test]
async fn a_token_answer_over_the_size_cap_is_a_bad_response_and_not_buffered() {
    let pad = "x".repeat(regbroker_provider::MAX_UPSTREAM_BODY);
    let fake = mds_answering(format!(
        r#"{{"access_token":"ya29.big-secret","expires_in":3600,"pad":"{pad}"}}"#
    ))
    .await;
    let clock = ManualClock::fixed();
    let e = fetch(&metadata_provider(&fake, &clock), "gcr.io")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadResponse, "{}", e.chain());
    assert!(e.message().contains("larger than"), "{}", e.chain());
    assert!(!e.chain().contains("ya29"), "{}", e.chain());
}

#[tokio::test]
async fn metadata_500_then_success_is_retried() {
    let mds = Mds::failing(1, 500);
    let cred = fetch_through(mds.clone()).await.unwrap();
    assert_eq!(cred.secret().expose_secret(), "ya29.mds-1");
    assert_eq!(mds.seen.count(), 2, "one 500, one success");
}

#[tokio::test]
async fn metadata_always_500_is_unavailable_after_bounded_retries() {
    let mds = Mds::failing(100, 503);
    let e = fetch_through(mds.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert!(e.message().contains("503"), "{e}");
    assert_eq!(mds.seen.count(), 3, "attempts = 3");
}

#[tokio::test]
async fn metadata_429_is_throttled() {
    let mds = Mds::failing(100, 429);
    let e = fetch_through(mds).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Throttled, "{}", e.chain());
}

#[tokio::test]
async fn metadata_404_means_no_service_account() {
    let mds = Mds::failing(100, 404);
    let e = fetch_through(mds.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMissing, "{}", e.chain());
    assert_eq!(mds.seen.count(), 1, "a 404 is not retried");
}

#[tokio::test]
async fn no_metadata_server_is_identity_missing_naming_the_env_vars() {
    let clock = ManualClock::fixed();
    let host = format!("127.0.0.1:{}", closed_port());
    let p = provider(&[("GCE_METADATA_HOST", &host)], &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMissing, "{}", e.chain());
    assert!(
        e.message().contains("GOOGLE_APPLICATION_CREDENTIALS"),
        "{e}"
    );
    assert!(e.message().contains("GCE_METADATA_HOST"), "{e}");
}

#[tokio::test]
async fn malformed_metadata_host_is_invalid_config() {
    let clock = ManualClock::fixed();
    let p = provider(&[("GCE_METADATA_HOST", "http://169.254.169.254/")], &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{}", e.chain());
    assert!(e.message().contains("GCE_METADATA_HOST"), "{e}");
}

#[tokio::test]
async fn an_explicit_rule_serves_a_custom_domain_with_the_same_credential() {
    use regbroker_provider::{Options, Provider, Registry};
    let mds = Mds::default();
    let fake = start_mds(mds.clone()).await;
    let clock = ManualClock::fixed();
    let p = metadata_provider(&fake, &clock);
    let custom = Registry::parse("images.example.com").unwrap();
    assert!(p.recognise(&custom).is_none(), "never auto-detected");
    let target = p.target(&custom, &Options::new()).unwrap();
    assert_eq!(
        target.scope(),
        p.recognise(&Registry::parse("gcr.io").unwrap())
            .unwrap()
            .scope()
    );
    let cred = p.fetch(&target).await.unwrap();
    assert_eq!(cred.secret().expose_secret(), "ya29.mds-1");
}

#[tokio::test]
async fn metadata_that_hangs_times_out() {
    let mds = Mds {
        delay: Some(Duration::from_secs(5)),
        ..Mds::default()
    };
    let fake = start_mds(mds).await;
    let clock = ManualClock::fixed();
    let host = fake.addr.to_string();
    let p = regbroker_gcp::GcpProvider::builder()
        .env([("GCE_METADATA_HOST", host.as_str())])
        .clock(Arc::new(clock))
        .http(regbroker_gcp::HttpSettings {
            request_timeout: Duration::from_millis(300),
            ..common::fast_http()
        })
        .build();
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{}", e.chain());
}

#[tokio::test]
async fn metadata_without_expires_in_gets_the_short_fallback_ttl() {
    let mds = Mds {
        omit_expires_in: true,
        ..Mds::default()
    };
    let fake = start_mds(mds).await;
    let clock = ManualClock::fixed();
    let p = metadata_provider(&fake, &clock);
    let cred = fetch(&p, "gcr.io").await.unwrap();
    assert_eq!(cred.expires_at(), Some(clock_now(&clock) + FALLBACK_TTL));
}

#[tokio::test]
async fn expired_token_is_refreshed_on_the_next_fetch() {
    let mds = Mds::default();
    let fake = start_mds(mds.clone()).await;
    let clock = ManualClock::fixed();
    let p = metadata_provider(&fake, &clock);
    let first = fetch(&p, "gcr.io").await.unwrap();
    let first_expiry = first.expires_at().unwrap();
    clock.advance(Duration::from_secs(3600)); // past first_expiry
    assert!(clock_now(&clock) > first_expiry);
    let second = fetch(&p, "us-docker.pkg.dev").await.unwrap();
    assert_eq!(first.secret().expose_secret(), "ya29.mds-1");
    assert_eq!(second.secret().expose_secret(), "ya29.mds-2");
    assert_eq!(
        second.expires_at(),
        Some(clock_now(&clock) + Duration::from_secs(3599))
    );
    assert_eq!(mds.seen.count(), 2);
}

// ---------------------------------------------------------------------------------------
// Service-account key
// ---------------------------------------------------------------------------------------

/// Fetches a `gcr.io` credential with a service-account key file of `key`,
/// `client_email` and `token_uri`.
async fn fetch_with_key(
    key: &TestKey,
    client_email: &str,
    token_uri: &str,
) -> Result<Credential, Error> {
    let dir = tempfile::tempdir().unwrap();
    let key_file = service_account_key(&dir, key, client_email, token_uri);
    let clock = ManualClock::fixed();
    fetch(&credentials_provider(&key_file, &clock), "gcr.io").await
}

fn jwt_part(assertion: &str, i: usize) -> serde_json::Value {
    let part = assertion.split('.').nth(i).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

#[tokio::test]
async fn service_account_key_is_exchanged_at_its_token_uri() {
    let key = test_key();
    let ep = TokenEndpoint::new(&key.public, false);
    let fake = start_token_endpoint(ep.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let token_uri = fake.url("/token");
    let key_file = write(
        &dir,
        "key.json",
        &json!({
            "type": "service_account",
            "project_id": "p",
            "private_key_id": "kid-1",
            "private_key": key.pem,
            "client_email": "puller@p.iam.gserviceaccount.com",
            "token_uri": token_uri,
        })
        .to_string(),
    );
    let clock = ManualClock::fixed();
    // A metadata host that would fail: the key file must win.
    let mds = format!("127.0.0.1:{}", closed_port());
    let p = provider(
        &[
            ("GOOGLE_APPLICATION_CREDENTIALS", &key_file),
            ("GCE_METADATA_HOST", &mds),
        ],
        &clock,
    );
    let cred = fetch(&p, "eu.gcr.io").await.unwrap();
    assert_eq!(cred.username(), "oauth2accesstoken");
    assert_eq!(cred.secret().expose_secret(), "ya29.from-key");
    let now = clock_now(&clock);
    assert_eq!(cred.expires_at(), Some(now + Duration::from_secs(3600)));

    let req = ep.seen.all().pop().unwrap();
    let assertion = form(&req.body).remove("assertion").unwrap();
    let header = jwt_part(&assertion, 0);
    assert_eq!(header["alg"], "RS256");
    assert_eq!(header["kid"], "kid-1");
    let claims = jwt_part(&assertion, 1);
    let iat = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(claims["iss"], "puller@p.iam.gserviceaccount.com");
    assert_eq!(claims["aud"], token_uri);
    assert_eq!(claims["scope"], OAUTH_SCOPE);
    assert_eq!(claims["iat"], iat);
    assert_eq!(claims["exp"], iat + 3600);
}

#[tokio::test]
async fn service_account_rejected_by_the_token_endpoint_is_identity_rejected() {
    let key = test_key();
    let ep = TokenEndpoint::new(&key.public, true);
    let fake = start_token_endpoint(ep.clone()).await;
    let e = fetch_with_key(
        &key,
        "puller@p.iam.gserviceaccount.com",
        &fake.url("/token"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityRejected, "{}", e.chain());
    assert!(e.message().contains("invalid_grant"), "{e}");
    assert!(!e.chain().contains("secret-detail"), "{}", e.chain());
    assert_eq!(ep.seen.count(), 1, "a 400 is not retried");
}

#[tokio::test]
async fn wrong_key_signature_is_refused_by_the_fake() {
    // Guards the honesty of the test above: an assertion signed by another key fails.
    let key = test_key();
    let other = test_key();
    let fake = start_token_endpoint(TokenEndpoint::new(&other.public, false)).await;
    let e = fetch_with_key(&key, "a@p.iam.gserviceaccount.com", &fake.url("/token"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityRejected);
}

#[tokio::test]
async fn a_redirecting_token_endpoint_is_not_followed() {
    // The redirect target records whatever reaches it: the signed assertion must not.
    let elsewhere = Seen::default();
    let sink = elsewhere.clone();
    let other = Fake::start(
        Router::new().fallback(move |headers: HeaderMap, body: String| {
            let sink = sink.clone();
            async move {
                sink.push(&headers, &body);
                axum::Json(json!({"access_token": "ya29.stolen", "expires_in": 3600}))
            }
        }),
    )
    .await;
    let target = other.url("/token");
    let redirector = Fake::start(Router::new().route(
        "/token",
        post(move || {
            let target = target.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [("location", target)]) }
        }),
    ))
    .await;
    let key = test_key();
    let e = fetch_with_key(
        &key,
        "a@p.iam.gserviceaccount.com",
        &redirector.url("/token"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadResponse, "{}", e.chain());
    assert!(e.message().contains("307"), "{e}");
    assert_eq!(elsewhere.count(), 0, "the redirect was followed");
}

#[tokio::test]
async fn plain_http_token_uri_off_loopback_is_invalid_config() {
    let key = test_key();
    let e = fetch_with_key(
        &key,
        "a@p.iam.gserviceaccount.com",
        "http://oauth2.example.com/token",
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{}", e.chain());
    assert!(e.message().contains("token_uri"), "{e}");
}

#[tokio::test]
async fn credentials_file_problems_name_the_env_var() {
    let clock = ManualClock::fixed();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let p = credentials_provider(missing.to_str().unwrap(), &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMissing, "{}", e.chain());
    assert!(
        e.message().contains("GOOGLE_APPLICATION_CREDENTIALS"),
        "{e}"
    );

    let user = write(
        &dir,
        "adc.json",
        r#"{"type":"authorized_user","client_id":"x","client_secret":"s3cret","refresh_token":"r3fresh"}"#,
    );
    let p = credentials_provider(&user, &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{}", e.chain());
    assert!(e.message().contains("authorized_user"), "{e}");
    assert!(!e.chain().contains("r3fresh") && !e.chain().contains("s3cret"));
}

// ---------------------------------------------------------------------------------------
// external_account (workload identity federation)
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn external_account_file_token_is_exchanged_at_the_sts() {
    let s = Scenario::start("eyJ.subject-1\n", false).await;
    let clock = ManualClock::fixed();
    let p = credentials_provider(&s.creds, &clock);
    let cred = fetch(&p, "asia-docker.pkg.dev").await.unwrap();
    assert_eq!(cred.username(), "oauth2accesstoken");
    assert_eq!(cred.secret().expose_secret(), "ya29.sts-1");
    assert_eq!(
        cred.expires_at(),
        Some(clock_now(&clock) + Duration::from_secs(3600))
    );
    let f = form(&s.fed.sts.all()[0].body);
    assert_eq!(f["audience"], AUDIENCE);
    assert_eq!(f["subject_token"], "eyJ.subject-1", "trimmed file contents");
    assert_eq!(
        f["subject_token_type"],
        "urn:ietf:params:oauth:token-type:jwt"
    );
    assert_eq!(f["scope"], OAUTH_SCOPE);
    assert_eq!(s.fed.iam.count(), 0);
}

#[tokio::test]
async fn external_account_with_impersonation_uses_the_generated_token_and_its_expiry() {
    let s = Scenario::start("eyJ.subject-1", true).await;
    let clock = ManualClock::fixed();
    let p = credentials_provider(&s.creds, &clock);
    let cred = fetch(&p, "gcr.io").await.unwrap();
    assert_eq!(cred.secret().expose_secret(), "ya29.impersonated");
    assert_eq!(
        cred.expires_at(),
        Some(clock_now(&clock) + Duration::from_secs(1800))
    );
    let iam = s.fed.iam.all().pop().unwrap();
    assert_eq!(iam.headers["authorization"], "Bearer ya29.sts-1");
    let body: serde_json::Value = serde_json::from_str(&iam.body).unwrap();
    assert_eq!(body["scope"], json!([OAUTH_SCOPE]));
    assert_eq!(body["lifetime"], "3600s");
}

#[tokio::test]
async fn rotated_subject_token_file_is_read_again_on_each_fetch() {
    let s = Scenario::start("eyJ.subject-1", false).await;
    let clock = ManualClock::fixed();
    let p = credentials_provider(&s.creds, &clock);
    fetch(&p, "gcr.io").await.unwrap();
    std::fs::write(&s.token_file, "eyJ.subject-2").unwrap();
    clock.advance(Duration::from_secs(3600));
    let second = fetch(&p, "gcr.io").await.unwrap();
    assert_eq!(second.secret().expose_secret(), "ya29.sts-2");
    let bodies: Vec<String> = s
        .fed
        .sts
        .all()
        .iter()
        .map(|r| form(&r.body)["subject_token"].clone())
        .collect();
    assert_eq!(bodies, ["eyJ.subject-1", "eyJ.subject-2"]);
}

#[tokio::test]
async fn json_formatted_subject_token_is_read_from_its_field() {
    let fed = Federation::default();
    let fake = start_federation(fed.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = write(
        &dir,
        "token.json",
        r#"{"id_token":"eyJ.from-json","other":1}"#,
    );
    let mut config = external_account(&fake, &token_file, false);
    config["credential_source"]["format"] =
        json!({"type": "json", "subject_token_field_name": "id_token"});
    let creds = write(&dir, "creds.json", &config.to_string());
    let clock = ManualClock::fixed();
    let p = credentials_provider(&creds, &clock);
    fetch(&p, "gcr.io").await.unwrap();
    assert_eq!(
        form(&fed.sts.all()[0].body)["subject_token"],
        "eyJ.from-json"
    );
}

#[tokio::test]
async fn url_sourced_subject_token_is_fetched_with_its_headers() {
    let fed = Federation::default();
    let fake = start_federation(fed.clone()).await;
    let subject_seen = Seen::default();
    let sink = subject_seen.clone();
    // Stands in for a cloud's instance metadata token URL (e.g. Azure IMDS).
    let subject = Fake::start(Router::new().route(
        "/identity",
        get(move |headers: HeaderMap| {
            let sink = sink.clone();
            async move {
                sink.push(&headers, "");
                if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
                    return StatusCode::BAD_REQUEST.into_response();
                }
                axum::Json(json!({"access_token": "eyJ.from-url"})).into_response()
            }
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = external_account(&fake, "/unused", false);
    config["credential_source"] = json!({
        "url": subject.url("/identity"),
        "headers": {"Metadata": "true"},
        "format": {"type": "json", "subject_token_field_name": "access_token"},
    });
    let creds = write(&dir, "creds.json", &config.to_string());
    let clock = ManualClock::fixed();
    let p = credentials_provider(&creds, &clock);
    let cred = fetch(&p, "gcr.io").await.unwrap();
    assert_eq!(cred.secret().expose_secret(), "ya29.sts-1");
    assert_eq!(subject_seen.count(), 1);
    assert_eq!(
        form(&fed.sts.all()[0].body)["subject_token"],
        "eyJ.from-url"
    );
}

#[tokio::test]
async fn missing_subject_token_file_is_identity_missing() {
    let fed = Federation::default();
    let fake = start_federation(fed.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("not-mounted");
    let creds = external_account_file(&dir, &fake, token_file.to_str().unwrap(), false);
    let clock = ManualClock::fixed();
    let p = credentials_provider(&creds, &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMissing, "{}", e.chain());
    assert_eq!(fed.sts.count(), 0);
}

#[tokio::test]
async fn unsupported_credential_sources_are_invalid_config() {
    let fed = Federation::default();
    let fake = start_federation(fed).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = external_account(&fake, "/x", false);
    config["credential_source"] =
        json!({"environment_id": "aws1", "region_url": "http://169.254.169.254/x"});
    let creds = write(&dir, "aws.json", &config.to_string());
    let clock = ManualClock::fixed();
    let p = credentials_provider(&creds, &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{}", e.chain());
}

#[tokio::test]
async fn sts_rejection_is_identity_rejected() {
    // Not a JWT: the fake STS answers 400 invalid_request, as the real one does.
    let s = Scenario::start("not-a-jwt", false).await;
    let clock = ManualClock::fixed();
    let p = credentials_provider(&s.creds, &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityRejected, "{}", e.chain());
}
