//! The `RegistryCredential` controller with Azure and Google Cloud per-workload identity,
//! on a real kube-apiserver: the CRD and RBAC from `deploy/registry-credentials`, the
//! controller in-process as its ServiceAccount, and each tenant's ServiceAccount token
//! from the API server's TokenRequest, as in `kube_registry_credentials.rs` (AWS).
//!
//! What is fake, and why: Entra ID, ACR's `/oauth2/exchange`, Google's STS and IAM
//! Credentials are cloud services with no emulator that runs here (gcplocal serves only
//! the metadata server's own identity, never a federation exchange). So they are axum
//! fakes on 127.0.0.1 that do what the clouds' trust configuration does: each checks the
//! token it is handed with the API server's own TokenReview (signed by this control
//! plane, not expired, for the audience the cloud wants) and accepts it only for the
//! subject its "federated credential" names, then issues a credential naming the
//! identity it was issued for. Entra ID is served over https with a CA made here, since
//! `azure_identity` refuses an http authority. Every token a fake received is kept, and
//! the tests decode its claims themselves.
//!
//! Regbroker's own identity is configured and working in each broker (an Entra ID app
//! with a token file the fake accepts; a GCE metadata server), so a fall-back to it would
//! produce a Secret, and the tests check it never does.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(all(feature = "azure", feature = "gcp"))]

mod cloud_fakes;
mod common;
mod control_plane;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use cloud_fakes::*;
use common::FakeMetadata;
use control_plane::{ControlPlane, eventually};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use regbroker::broker::Broker;
use regbroker::broker::providers::Providers;
use regbroker::broker::routing::Router as Routes;
use regbroker::broker::static_secret;
use regbroker::controller::api::{RegistryCredential, RegistryCredentialSpec};
use regbroker::metrics::Metrics;
use regbroker_provider::Provider;
use serde_json::json;

/// The issuer `tests/control_plane` gives kube-apiserver.
fn issuer(cp: &ControlPlane) -> String {
    format!("{}/regbroker-test", cp.server)
}

// --- The controller ----------------------------------------------------------------------

/// The controller, stopped when the handle drops.
struct Running(tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The controller as the deploy/ RBAC's ServiceAccount, watching `namespaces`, with
/// `provider` as the broker's only provider.
async fn start(cp: &ControlPlane, provider: Arc<dyn Provider>, namespaces: &[&str]) -> Running {
    let ns = cp.registry_credential_operator().await;
    let client = cp.service_account_client(&ns, "regbroker").await;
    let metrics = Arc::new(Metrics::new());
    let broker = Arc::new(Broker::new(
        Arc::new(static_secret::Store::empty(metrics.clone())),
        Routes::new(Vec::new()),
        Providers::new(vec![provider]),
        Default::default(),
        metrics,
        regbroker_provider::system_clock(),
    ));
    let config = regbroker::controller::Config {
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        default_service_account: None,
        reserved: Vec::new(),
    };
    Running(tokio::spawn(regbroker::controller::run(
        broker, client, config, None,
    )))
}

/// A new namespace with ServiceAccount `puller` annotated with `annotations`, and a
/// `RegistryCredential` `pull` for `registry` naming it.
async fn tenant(cp: &ControlPlane, annotations: &[(&str, &str)], registry: &str) -> String {
    cp.registry_credential_operator().await;
    let ns = cp.namespace("tenant").await;
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("puller".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(cp.admin(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let spec = RegistryCredentialSpec {
        registries: vec![registry.to_string()],
        service_account_name: Some("puller".into()),
        secret_ref: None,
        target: None,
        suspend: false,
    };
    Api::<RegistryCredential>::namespaced(cp.admin(), &ns)
        .create(
            &PostParams::default(),
            &RegistryCredential::new("pull", spec),
        )
        .await
        .unwrap();
    ns
}

/// Waits (at most 60 s) until object `ns/pull` has condition `type_` = `status` with
/// `reason`; returns its message.
async fn wait_for(cp: &ControlPlane, ns: &str, type_: &str, status: &str, reason: &str) -> String {
    let api = Api::<RegistryCredential>::namespaced(cp.admin(), ns);
    eventually(
        Duration::from_secs(60),
        &format!("{ns}/pull: {type_}={status} {reason}"),
        || async {
            let o = api.get("pull").await.unwrap();
            o.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == type_ && c.status == status && c.reason == reason)
                .map(|c| c.message)
        },
    )
    .await
}

/// Every `auths` entry of Secret `ns/pull`, registry -> (username, password); `None`
/// without a Secret.
async fn auths(cp: &ControlPlane, ns: &str) -> Option<BTreeMap<String, (String, String)>> {
    let s = Api::<Secret>::namespaced(cp.admin(), ns)
        .get_opt("pull")
        .await
        .unwrap()?;
    let raw = &s.data.as_ref().unwrap()[".dockerconfigjson"].0;
    let v: serde_json::Value = serde_json::from_slice(raw).unwrap();
    Some(
        v["auths"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, e)| {
                let pair = base64::engine::general_purpose::STANDARD
                    .decode(e["auth"].as_str().unwrap())
                    .unwrap();
                let (user, password) = std::str::from_utf8(&pair).unwrap().split_once(':').unwrap();
                (k.clone(), (user.to_string(), password.to_string()))
            })
            .collect(),
    )
}

/// Two Azure tenants on one ACR host, annotated with Azure Workload Identity's keys and
/// with the AKS kubelet plugin's, each get the ACR credential Entra ID's fake issued for
/// its own client, having asserted its own ServiceAccount's token (audience
/// `api://AzureADTokenExchange`). A tenant without the annotation, or with a malformed
/// one, is Stalled `IdentityNotConfigured` with no Secret; one naming another tenant's
/// client is refused by that client's federated credential. Regbroker's own app (a
/// working identity in this broker) is never used for any of them.
///
/// Fakes: Entra ID's token endpoint and ACR's exchange (no emulator runs here); they check
/// the assertion with the API server's TokenReview and the federated subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn azure_tenants_get_their_own_clients_credential_and_never_the_operators() {
    let cp = ControlPlane::shared();
    let a = tenant(
        cp,
        &[
            ("azure.workload.identity/client-id", CLIENT_A),
            ("azure.workload.identity/tenant-id", AZURE_TENANT),
        ],
        ACR_HOST,
    )
    .await;
    let b = tenant(
        cp,
        &[
            ("kubernetes.azure.com/acr-client-id", CLIENT_B),
            ("kubernetes.azure.com/acr-tenant-id", AZURE_TENANT),
        ],
        ACR_HOST,
    )
    .await;
    let missing = tenant(cp, &[], ACR_HOST).await;
    let malformed = tenant(
        cp,
        &[("azure.workload.identity/client-id", "not-a-client-id")],
        ACR_HOST,
    )
    .await;
    // Annotated with team a's client: its own token is asserted, and a's federated
    // credential (for a's subject) refuses it.
    let forged = tenant(
        cp,
        &[("azure.workload.identity/client-id", CLIENT_A)],
        ACR_HOST,
    )
    .await;

    let operator_token = jwt(json!({"sub": "regbroker-itself", "aud": [AZURE_AUDIENCE]}));
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("azure-identity-token");
    std::fs::write(&token_file, &operator_token).unwrap();
    let entra = Arc::new(Entra {
        kube: cp.admin(),
        federated: BTreeMap::from([
            (CLIENT_A.to_string(), subject(&a)),
            (CLIENT_B.to_string(), subject(&b)),
        ]),
        operator_token,
        assertions: Mutex::default(),
        access: Mutex::default(),
        issued: Mutex::default(),
        n: AtomicUsize::new(0),
    });
    let (base, ca_pem) = start_entra(entra.clone()).await;
    let http = regbroker_azure::reqwest::Client::builder()
        .tls_certs_only([
            regbroker_azure::reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap(),
        ])
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // Regbroker's own identity: workload identity for its own app, which the fake accepts.
    let azure = regbroker_azure::AzureProvider::builder()
        .env(regbroker_azure::Env::from_pairs(vec![
            ("AZURE_CLIENT_ID", OPERATOR_CLIENT.to_string()),
            ("AZURE_TENANT_ID", AZURE_TENANT.to_string()),
            (
                "AZURE_FEDERATED_TOKEN_FILE",
                token_file.display().to_string(),
            ),
            ("AZURE_AUTHORITY_HOST", format!("{base}/")),
            (
                "REGBROKER_AZURE_EXCHANGE_URL",
                format!("{base}/oauth2/exchange"),
            ),
        ]))
        .http_client(http)
        .retry(1, Duration::from_millis(50))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let _controller = start(
        cp,
        Arc::new(azure),
        &[&a, &b, &missing, &malformed, &forged],
    )
    .await;

    wait_for(cp, &a, "Ready", "True", "Succeeded").await;
    wait_for(cp, &b, "Ready", "True", "Succeeded").await;
    let message = wait_for(cp, &missing, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(
        message.contains("azure.workload.identity/client-id"),
        "{message}"
    );
    let message = wait_for(cp, &malformed, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(
        message.contains("not-a-client-id") || message.contains("GUID"),
        "{message}"
    );
    wait_for(cp, &forged, "Reconciling", "True", "ProgressingWithRetry").await;
    wait_for(cp, &forged, "Ready", "False", "IdentityRejected").await;

    // Each Secret holds exactly the host, with a credential issued for its own client.
    let (a_user, a_password) = auths(cp, &a).await.expect("a's Secret")[ACR_HOST].clone();
    let (b_user, b_password) = auths(cp, &b).await.expect("b's Secret")[ACR_HOST].clone();
    assert_eq!(a_user, regbroker_azure::ACR_USERNAME);
    assert_eq!(b_user, regbroker_azure::ACR_USERNAME);
    assert!(
        entra.issued_to(CLIENT_A).contains(&a_password),
        "a's is not CLIENT_A's"
    );
    assert!(
        entra.issued_to(CLIENT_B).contains(&b_password),
        "b's is not CLIENT_B's"
    );
    assert_eq!(claims(&a_password)["client"], CLIENT_A);
    assert_eq!(claims(&b_password)["client"], CLIENT_B);
    for ns in [&missing, &malformed] {
        assert_eq!(auths(cp, ns).await, None, "{ns} got a Secret");
    }
    // A refused refresh writes the Secret with what it held before: here nothing.
    let held = auths(cp, &forged).await.unwrap_or_default();
    assert!(held.is_empty(), "the forged tenant got {held:?}");

    // What Entra ID received: for each client, the API server's token of the tenant it
    // trusts, for Entra ID's audience; the forged tenant's own token, never a's; nothing
    // from the tenants without a usable annotation, and nothing as regbroker itself.
    let assertions = entra.assertions.lock().unwrap().clone();
    assert!(!assertions.is_empty());
    let mut subjects_by_client: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (client, assertion) in &assertions {
        assert_ne!(client, OPERATOR_CLIENT, "regbroker's own identity was used");
        let c = claims(assertion);
        assert_eq!(c["iss"], issuer(cp), "{c}");
        assert_eq!(c["aud"], json!([AZURE_AUDIENCE]), "{c}");
        let sub = c["sub"].as_str().unwrap().to_string();
        assert_eq!(
            c["kubernetes.io"]["serviceaccount"]["name"], "puller",
            "{c}"
        );
        subjects_by_client
            .entry(client.clone())
            .or_default()
            .push(sub);
    }
    let subjects = |client: &str| -> std::collections::BTreeSet<String> {
        subjects_by_client[client].iter().cloned().collect()
    };
    assert_eq!(subjects(CLIENT_A), [subject(&a), subject(&forged)].into());
    assert_eq!(subjects(CLIENT_B), [subject(&b)].into());
    assert_eq!(subjects_by_client.len(), 2, "{subjects_by_client:?}");
}

/// Two Google Cloud tenants annotated with the pool's provider, one also with a Google
/// service account to act as, each get the token Google's fakes issued for it: the
/// federated token for its own subject, or the impersonated account's token. A tenant
/// without the annotation, or with a malformed one, is Stalled `IdentityNotConfigured`
/// with no Secret; one naming another tenant's Google service account is refused by
/// IAM. Regbroker's own identity (a GCE metadata server here) is never asked.
///
/// Fakes: Google's STS and IAM Credentials (no emulator runs here; gcplocal serves only
/// the metadata server) and the GCE metadata server (`tests/common`); STS checks the
/// subject token with the API server's TokenReview for the provider's audience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn gcp_tenants_get_their_own_tokens_and_never_the_operators() {
    let cp = ControlPlane::shared();
    const WIP: &str = "gcp.auth.fluxcd.io/workload-identity-provider";
    const GSA: &str = "iam.gke.io/gcp-service-account";
    let a = tenant(cp, &[(WIP, GCP_PROVIDER)], GAR_HOST).await;
    let b = tenant(cp, &[(WIP, GCP_PROVIDER), (GSA, EMAIL_B)], GAR_HOST).await;
    let missing = tenant(cp, &[(GSA, EMAIL_B)], GAR_HOST).await;
    let malformed = tenant(cp, &[(WIP, "projects/123456789/pools/tenants")], GAR_HOST).await;
    let forged = tenant(cp, &[(WIP, GCP_PROVIDER), (GSA, EMAIL_B)], GAR_HOST).await;

    let google = Arc::new(Google {
        kube: cp.admin(),
        impersonators: BTreeMap::from([(EMAIL_B.to_string(), subject(&b))]),
        exchanges: Mutex::default(),
        federated: Mutex::default(),
        issued: Mutex::default(),
        n: AtomicUsize::new(0),
    });
    let base = start_google(google.clone()).await;
    let metadata = FakeMetadata::start(3600, false);
    let gcp = regbroker_gcp::GcpProvider::builder()
        .env([
            ("GCE_METADATA_HOST", metadata.addr.clone()),
            (
                regbroker_gcp::workload::STS_URL_ENV,
                format!("{base}/v1/token"),
            ),
            (
                regbroker_gcp::workload::IAM_CREDENTIALS_URL_ENV,
                base.clone(),
            ),
        ])
        .build();
    let _controller = start(cp, Arc::new(gcp), &[&a, &b, &missing, &malformed, &forged]).await;

    wait_for(cp, &a, "Ready", "True", "Succeeded").await;
    wait_for(cp, &b, "Ready", "True", "Succeeded").await;
    let message = wait_for(cp, &missing, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(message.contains(WIP), "{message}");
    let message = wait_for(cp, &malformed, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(message.contains(WIP), "{message}");
    wait_for(cp, &forged, "Reconciling", "True", "ProgressingWithRetry").await;

    let (a_user, a_password) = auths(cp, &a).await.expect("a's Secret")[GAR_HOST].clone();
    let (b_user, b_password) = auths(cp, &b).await.expect("b's Secret")[GAR_HOST].clone();
    assert_eq!(a_user, "oauth2accesstoken");
    assert_eq!(b_user, "oauth2accesstoken");
    assert!(
        google.issued_to(&subject(&a)).contains(&a_password),
        "a's is not a's federated token"
    );
    assert!(
        google.issued_to(EMAIL_B).contains(&b_password),
        "b's is not {EMAIL_B}'s token"
    );
    assert!(!google.issued_to(EMAIL_B).contains(&a_password));
    for ns in [&missing, &malformed] {
        assert_eq!(auths(cp, ns).await, None, "{ns} got a Secret");
    }
    // A refused refresh writes the Secret with what it held before: here nothing.
    let held = auths(cp, &forged).await.unwrap_or_default();
    assert!(held.is_empty(), "the forged tenant got {held:?}");
    assert_eq!(metadata.calls(), 0, "regbroker's own identity was asked");

    // What STS received: the API server's token of a, b and the forged tenant (never the
    // tenants without a usable annotation), each for the provider's audience.
    let audience = format!("//iam.googleapis.com/{GCP_PROVIDER}");
    let mut subjects = std::collections::BTreeSet::new();
    for (asked, token) in google.exchanges.lock().unwrap().iter() {
        assert_eq!(asked, &audience);
        let c = claims(token);
        assert_eq!(c["iss"], issuer(cp), "{c}");
        assert_eq!(c["aud"], json!([audience]), "{c}");
        subjects.insert(c["sub"].as_str().unwrap().to_string());
    }
    assert_eq!(
        subjects,
        [subject(&a), subject(&b), subject(&forged)].into()
    );
}
