//! Against gcplocal, a third-party GCE emulator (PyPI `gcplocal`): its metadata token
//! endpoint and its OAuth token endpoint (`POST /token`), started on loopback per test.
//!
//! gcplocal's endpoints accept anything (no `Metadata-Flavor` check, no signature check)
//! and always answer `ya29.gcplocal-mock-token` with `expires_in: 3600`; what this proves is
//! that the provider speaks the wire format of a peer nobody here wrote. The checks
//! gcplocal does not make are covered by the fakes in tests/fakes.rs.
//!
//! Needs `gcplocal` on PATH (`pip install gcplocal`): every test here is `#[ignore]`d, so
//! plain `cargo test` lists them as ignored; `scripts/test.sh` installs gcplocal and runs
//! them, and a missing gcplocal is then a failure, never a silent pass.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{
    clock_now, credentials_provider, fetch, free_port, provider, service_account_key, test_key,
    write,
};
use regbroker_provider::test_util::require_peer;
use regbroker_provider::{ExposeSecret, ManualClock};
use serde_json::json;

const MOCK_TOKEN: &str = "ya29.gcplocal-mock-token";

struct Gcplocal {
    child: tokio::process::Child,
    addr: String,
    _cwd: tempfile::TempDir,
}

impl Drop for Gcplocal {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Starts gcplocal on a free loopback port; panics naming the peer when it is missing.
async fn start() -> Gcplocal {
    let bin = require_peer("gcplocal", "pip install gcplocal");
    let port = free_port();
    let cwd = tempfile::tempdir().unwrap();
    let child = tokio::process::Command::new(bin)
        .args(["start", "--host", "127.0.0.1", "--port", &port.to_string()])
        .current_dir(cwd.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let server = Gcplocal {
        child,
        addr,
        _cwd: cwd,
    };
    // Wait until it answers (Flask start-up takes about a second).
    let url = format!(
        "http://{}/computeMetadata/v1/instance/service-accounts/default/token",
        server.addr
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    loop {
        if let Ok(r) = client.get(&url).send().await
            && r.status().is_success()
        {
            return server;
        }
        assert!(
            Instant::now() < deadline,
            "gcplocal did not start on {}",
            server.addr
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[ignore = "needs gcplocal: run scripts/test.sh"]
async fn metadata_token_from_gcplocal() {
    let g = start().await;
    let clock = ManualClock::fixed();
    let p = provider(&[("GCE_METADATA_HOST", g.addr.as_str())], &clock);
    let cred = fetch(&p, "europe-west1-docker.pkg.dev").await.unwrap();
    assert_eq!(cred.username(), "oauth2accesstoken");
    assert_eq!(cred.secret().expose_secret(), MOCK_TOKEN);
    assert_eq!(
        cred.expires_at(),
        Some(clock_now(&clock) + Duration::from_secs(3600))
    );
}

/// gcplocal is Google's universe (it has no universe-domain path, as older metadata
/// servers): its token serves Google's registries and never an S3NS one.
#[tokio::test]
#[ignore = "needs gcplocal: run scripts/test.sh"]
async fn gcplocal_token_never_reaches_an_s3ns_registry() {
    let g = start().await;
    let clock = ManualClock::fixed();
    let p = provider(&[("GCE_METADATA_HOST", g.addr.as_str())], &clock);
    let cred = fetch(&p, "gcr.io").await.unwrap();
    assert_eq!(cred.secret().expose_secret(), MOCK_TOKEN);
    let e = fetch(&p, "docker.s3nsregistry.fr").await.unwrap_err();
    assert_eq!(
        e.kind(),
        regbroker_provider::ErrorKind::NotConfigured,
        "{}",
        e.chain()
    );
    assert!(!e.chain().contains(MOCK_TOKEN), "{}", e.chain());
}

#[tokio::test]
#[ignore = "needs gcplocal: run scripts/test.sh"]
async fn service_account_key_exchanged_at_gcplocal_token_endpoint() {
    let g = start().await;
    let key = test_key();
    let dir = tempfile::tempdir().unwrap();
    let key_file = service_account_key(
        &dir,
        &key,
        "puller@p.iam.gserviceaccount.com",
        &format!("http://{}/token", g.addr),
    );
    let clock = ManualClock::fixed();
    let p = credentials_provider(&key_file, &clock);
    let cred = fetch(&p, "gcr.io").await.unwrap();
    assert_eq!(cred.secret().expose_secret(), MOCK_TOKEN);
    assert_eq!(
        cred.expires_at(),
        Some(clock_now(&clock) + Duration::from_secs(3600))
    );
}

#[tokio::test]
#[ignore = "needs gcplocal: run scripts/test.sh"]
async fn external_account_exchanged_at_gcplocal_token_endpoint() {
    let g = start().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = write(&dir, "token", "eyJ.projected-token");
    let creds = write(
        &dir,
        "creds.json",
        &json!({
            "type": "external_account",
            "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/q",
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": format!("http://{}/token", g.addr),
            "credential_source": {"file": token_file},
        })
        .to_string(),
    );
    let clock = ManualClock::fixed();
    let p = credentials_provider(&creds, &clock);
    let cred = fetch(&p, "us-docker.pkg.dev").await.unwrap();
    assert_eq!(cred.secret().expose_secret(), MOCK_TOKEN);
}
