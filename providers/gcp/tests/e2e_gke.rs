//! Opt-in end-to-end test on a real GKE pod (or GCE VM) with Workload Identity.
//!
//! Enabled by `REGBROKER_E2E_GKE=1` and `REGBROKER_E2E_GAR_REGISTRY=<host>` (e.g.
//! `europe-west1-docker.pkg.dev`). Run it inside a pod whose Kubernetes service account is
//! bound to a Google service account with `roles/artifactregistry.reader` (see README.md,
//! "GKE Workload Identity"). `#[ignore]`d in every mode (plain `cargo test` and
//! `scripts/test.sh`, which skips `e2e_real_cloud_*`): run it with `--ignored`. Run without its
//! env vars, it fails.
//!
//! Asserts: the host is recognised; the provider fetches an `oauth2accesstoken` credential
//! from the real metadata server with an expiry in the future; and the registry accepts it
//! (`GET https://<host>/v2/` with basic auth answers 200, where anonymous gets 401).

#![allow(clippy::unwrap_used)]

use std::time::SystemTime;

use regbroker_gcp::GcpProvider;
use regbroker_provider::{ExposeSecret, Provider, Registry};

#[tokio::test]
#[ignore = "real cloud: set REGBROKER_E2E_GKE=1 and REGBROKER_E2E_GAR_REGISTRY (see deploy/e2e/README.md)"]
async fn e2e_real_cloud_gke_workload_identity_pulls_from_artifact_registry() {
    assert_eq!(
        std::env::var("REGBROKER_E2E_GKE").as_deref(),
        Ok("1"),
        "this real-cloud test needs REGBROKER_E2E_GKE=1 and REGBROKER_E2E_GAR_REGISTRY=<host>, \
         in a pod on GKE with Workload Identity (see providers/gcp/README.md)"
    );
    let Ok(host) = std::env::var("REGBROKER_E2E_GAR_REGISTRY") else {
        panic!(
            "REGBROKER_E2E_GKE=1 needs REGBROKER_E2E_GAR_REGISTRY=<host>, e.g. europe-west1-docker.pkg.dev"
        );
    };
    let registry = Registry::parse(&host).unwrap();
    let p = GcpProvider::from_env().unwrap();
    let target = p
        .recognise(&registry)
        .unwrap_or_else(|| panic!("{host} is not recognised as a Google registry"));
    let cred = p
        .fetch(&target)
        .await
        .unwrap_or_else(|e| panic!("{}", e.chain()));
    assert_eq!(cred.username(), "oauth2accesstoken");
    #[allow(clippy::disallowed_methods)] // comparing with real expiry on a real cloud
    let now = SystemTime::now();
    assert!(cred.expires_at().unwrap() > now);

    let client = reqwest::Client::new();
    let url = format!("https://{host}/v2/");
    let anonymous = client.get(&url).send().await.unwrap().status();
    assert_eq!(anonymous.as_u16(), 401, "anonymous /v2/ should be refused");
    let authed = client
        .get(&url)
        .basic_auth(cred.username(), Some(cred.secret().expose_secret()))
        .send()
        .await
        .unwrap()
        .status();
    assert!(
        authed.is_success(),
        "{host} refused the token: HTTP {authed}"
    );
    eprintln!("OK: {host} accepted the Workload Identity token");
}
