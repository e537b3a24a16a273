//! Issue 18, finding 5: a Google token must never reach an S3NS registry, nor an S3NS
//! token a Google one. Each universe is an in-process fake with its own tokens (Google's
//! metadata server has no universe-domain path, as older real ones and gcplocal; S3NS's
//! answers `s3nsapis.fr`); the assertions are on which token each registry host gets and
//! on how many tokens each universe's token service was asked for. gcplocal, a real
//! third-party emulator of Google's universe, is in tests/gcplocal.rs.

#![allow(clippy::unwrap_used)]

mod common;

use common::metadata::{Mds, start_mds};
use common::token_endpoint::{TokenEndpoint, start_token_endpoint};
use common::{credentials_provider, fetch, metadata_provider, test_key, write};
use regbroker_provider::{ErrorKind, ExposeSecret, ManualClock, Options, Provider, Registry};
use serde_json::json;

const GOOGLE_HOSTS: &[&str] = &["gcr.io", "eu.gcr.io", "europe-west1-docker.pkg.dev"];
const S3NS_HOST: &str = "docker.s3nsregistry.fr";

/// Asserts `host` is refused as "not configured", naming both universes.
async fn refused(p: &regbroker_gcp::GcpProvider, host: &str) {
    let e = fetch(p, host)
        .await
        .err()
        .unwrap_or_else(|| panic!("{host} got a token"));
    assert_eq!(e.kind(), ErrorKind::NotConfigured, "{host}: {}", e.chain());
    assert!(
        e.message().contains("s3nsapis.fr") && e.message().contains("googleapis.com"),
        "{e}"
    );
}

#[tokio::test]
async fn a_google_token_never_reaches_an_s3ns_registry() {
    let google = Mds::default();
    let fake = start_mds(google.clone()).await;
    let clock = ManualClock::fixed();
    let p = metadata_provider(&fake, &clock);
    for host in GOOGLE_HOSTS {
        let cred = fetch(&p, host).await.unwrap();
        assert!(
            cred.secret().expose_secret().starts_with("ya29.mds-"),
            "{host}"
        );
    }
    let minted = google.seen.count();
    refused(&p, S3NS_HOST).await;
    // An explicit rule to another S3NS host is refused the same way.
    let regional = Registry::parse("u-france-east1-docker.s3nsregistry.fr").unwrap();
    let target = p.target(&regional, &Options::new()).unwrap();
    let e = p.fetch(&target).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::NotConfigured, "{}", e.chain());
    assert_eq!(google.seen.count(), minted, "a token was minted for S3NS");
    assert_eq!(
        google.universe_seen.count(),
        1,
        "the universe is asked once"
    );
}

#[tokio::test]
async fn an_s3ns_token_never_reaches_a_google_registry() {
    let s3ns = Mds::of_universe("s3nsapis.fr", "s3ns.mds");
    let fake = start_mds(s3ns.clone()).await;
    let clock = ManualClock::fixed();
    let p = metadata_provider(&fake, &clock);
    let cred = fetch(&p, S3NS_HOST).await.unwrap();
    assert_eq!(cred.secret().expose_secret(), "s3ns.mds-1");
    for host in GOOGLE_HOSTS {
        refused(&p, host).await;
    }
    // A custom domain routed without `universe_domain` is Google's: refused too...
    let custom = Registry::parse("images.example.com").unwrap();
    let t = p.target(&custom, &Options::new()).unwrap();
    assert_eq!(
        p.fetch(&t).await.err().unwrap().kind(),
        ErrorKind::NotConfigured
    );
    // ... and served once the rule says it is S3NS's.
    let mut o = Options::new();
    o.insert("universe_domain".into(), "s3nsapis.fr".into());
    let t = p.target(&custom, &o).unwrap();
    assert!(
        p.fetch(&t)
            .await
            .unwrap()
            .secret()
            .expose_secret()
            .starts_with("s3ns.mds-")
    );
    assert_eq!(
        s3ns.seen.count(),
        2,
        "only the two S3NS fetches minted tokens"
    );
}

#[tokio::test]
async fn a_service_account_key_serves_only_its_own_universe() {
    let key = test_key();
    for (universe, own, other) in [
        (None, "gcr.io", S3NS_HOST),
        (
            Some("s3nsapis.fr"),
            S3NS_HOST,
            "europe-west1-docker.pkg.dev",
        ),
    ] {
        let ep = TokenEndpoint::new(&key.public, false);
        let fake = start_token_endpoint(ep.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let mut file = json!({
            "type": "service_account",
            "private_key": key.pem,
            "client_email": "puller@p.iam.gserviceaccount.com",
            "token_uri": fake.url("/token"),
        });
        if let Some(u) = universe {
            file["universe_domain"] = json!(u);
        }
        let path = write(&dir, "key.json", &file.to_string());
        let clock = ManualClock::fixed();
        let p = credentials_provider(&path, &clock);
        assert!(fetch(&p, own).await.is_ok(), "{universe:?}: {own}");
        refused(&p, other).await;
        assert_eq!(
            ep.seen.count(),
            1,
            "{universe:?}: no token minted for {other}"
        );
    }
}

#[tokio::test]
async fn a_metadata_server_naming_nonsense_as_its_universe_is_a_bad_response() {
    let odd = Mds::of_universe("not a domain/..", "x");
    let fake = start_mds(odd.clone()).await;
    let clock = ManualClock::fixed();
    let p = metadata_provider(&fake, &clock);
    let e = fetch(&p, "gcr.io").await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::BadResponse, "{}", e.chain());
    assert_eq!(odd.seen.count(), 0);
}
