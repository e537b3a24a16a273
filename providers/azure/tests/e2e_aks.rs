//! Opt-in end-to-end test against a real ACR from a pod with AKS Workload Identity (or
//! any Azure identity the provider's chain finds).
//!
//! Env vars: `REGBROKER_E2E_AKS=1` enables it; `REGBROKER_E2E_ACR_REGISTRY` names the
//! login server (e.g. `myregistry.azurecr.io`); optional `REGBROKER_E2E_ACR_REPOSITORY`
//! names a repository the identity may pull. The provider itself reads the usual
//! `AZURE_*` variables (see the README for the cluster setup).
//!
//! Asserted: the provider recognises the host, fetches a credential with the ACR
//! username and a future expiry, and ACR's own `/oauth2/token` endpoint accepts that
//! credential (the step docker, helm and Flux do next).
//!
//! `#[ignore]`d in every mode (plain `cargo test` and `scripts/test.sh`, which skips
//! `e2e_real_cloud_*`): run it with `--ignored`. Run without its env vars, it fails.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use regbroker_azure::{ACR_USERNAME, AzureProvider};
use regbroker_provider::{Clock, ExposeSecret, Provider, Registry, SystemClock};

#[tokio::test]
#[ignore = "real cloud: set REGBROKER_E2E_AKS=1 and REGBROKER_E2E_ACR_REGISTRY (see deploy/e2e/README.md)"]
async fn e2e_real_cloud_aks_workload_identity_pulls_from_acr() {
    assert_eq!(
        std::env::var("REGBROKER_E2E_AKS").as_deref(),
        Ok("1"),
        "this real-cloud test needs REGBROKER_E2E_AKS=1 and \
         REGBROKER_E2E_ACR_REGISTRY=<name>.azurecr.io, in a pod with AKS Workload Identity \
         (see providers/azure/README.md)"
    );
    let host = std::env::var("REGBROKER_E2E_ACR_REGISTRY")
        .expect("REGBROKER_E2E_ACR_REGISTRY must name the ACR login server");
    let registry = Registry::parse(&host).unwrap();
    let provider = AzureProvider::from_env().unwrap();
    let target = provider
        .recognise(&registry)
        .unwrap_or_else(|| panic!("{host} is not recognised as an ACR login server"));
    let cred = provider
        .fetch(&target)
        .await
        .unwrap_or_else(|e| panic!("fetch failed: {} ({})", e.chain(), e.kind().code()));
    assert_eq!(cred.username(), ACR_USERNAME);
    let expires = cred.expires_at().expect("an expiry");
    let left = expires
        .duration_since(SystemClock.now())
        .expect("expiry in the future");
    assert!(left > Duration::from_secs(60), "expires in {left:?}");
    println!("credential for {host} expires in {left:?}");

    let mut url = format!("https://{host}/oauth2/token?service={host}");
    if let Ok(repo) = std::env::var("REGBROKER_E2E_ACR_REPOSITORY") {
        url.push_str(&format!("&scope=repository:{repo}:pull"));
    }
    let res = regbroker_azure::reqwest::Client::new()
        .get(url)
        .basic_auth(ACR_USERNAME, Some(cred.secret().expose_secret()))
        .send()
        .await
        .unwrap();
    assert!(
        res.status().is_success(),
        "ACR refused the credential at /oauth2/token: HTTP {}",
        res.status()
    );
}
