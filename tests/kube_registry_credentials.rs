//! The `RegistryCredential` controller on a real kube-apiserver, with moto issuing ECR
//! tokens (`flux_support::Ecr`: moto whose tokens live twelve hours, as ECR's do, where
//! stock moto's expired in 2015): the CRD `regbroker crd` prints (the copy in `deploy/`), the controller running
//! in-process as the ServiceAccount and ClusterRole `deploy/registry-credentials/rbac.yaml`
//! ships, and each tenant's ServiceAccount token from the API server's TokenRequest.
//! moto's `AssumeRoleWithWebIdentity` maps each tenant's role to its own account, so two
//! tenants pulling from one host get credentials a test can tell apart (moto checks no
//! trust policy nor token signature; see `workload_identity.rs`).
//!
//! The control plane runs kube-controller-manager's garbage collector and ClusterRole
//! aggregation, so deleting an object collects its Secret for real, and the tenants'
//! aggregated roles reach the built-in `edit` and `view`.
//!
//! Each test watches only namespaces of its own (`--registry-credentials-namespace`), so
//! the tests of this binary share the control plane without seeing each other's objects.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "aws")]

mod common;
mod control_plane;
mod flux_support;
mod registry_peer;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use control_plane::{ControlPlane, eventually};
use flux_support::Ecr;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use regbroker::broker::Broker;
use regbroker::broker::providers::Providers;
use regbroker::broker::routing::Router;
use regbroker::broker::static_secret;
use regbroker::controller::api::{RegistryCredential, RegistryCredentialSpec};
use regbroker::metrics::Metrics;

const HOST: &str = "555555555555.dkr.ecr.us-east-1.amazonaws.com";
const OTHER_HOST: &str = "666666666666.dkr.ecr.us-east-1.amazonaws.com";
const ROLE_A: &str = "arn:aws:iam::111111111111:role/team-a-puller";
const ROLE_B: &str = "arn:aws:iam::222222222222:role/team-b-puller";
/// A host only the operator's static entry serves.
const STATIC_HOST: &str = "static.registry.test";
const STATIC_PASSWORD: &str = "operators-own-password";

/// A broker whose only provider is AWS on moto, with the operator's static entry for
/// [`STATIC_HOST`] and no identity of its own.
fn broker(moto: &Ecr) -> Arc<Broker> {
    let metrics = Arc::new(Metrics::new());
    let dir = tempfile::tempdir().unwrap().keep();
    let path = dir.join("config.json");
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("operator:{STATIC_PASSWORD}"));
    std::fs::write(
        &path,
        format!(
            r#"{{"auths": {{"{STATIC_HOST}": {{"auth": "{}"}}}}}}"#,
            auth
        ),
    )
    .unwrap();
    let aws = regbroker_aws::AwsProvider::builder()
        .endpoint_url(format!("http://{}", moto.addr))
        .build();
    Arc::new(Broker::new(
        Arc::new(static_secret::Store::open(vec![path], metrics.clone()).unwrap()),
        Router::new(Vec::new()),
        Providers::new(vec![Arc::new(aws)]),
        Default::default(),
        metrics,
        regbroker_provider::system_clock(),
    ))
}

/// The controller, as the deploy/ RBAC's ServiceAccount, watching `namespaces`; stopped
/// when the handle drops.
struct Running(tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn start(
    cp: &ControlPlane,
    moto: &Ecr,
    namespaces: &[&str],
    default_service_account: Option<&str>,
) -> Running {
    start_with(cp, moto, namespaces, default_service_account, Vec::new()).await
}

/// [`start`], with `reserved`: the Secrets regbroker's own configuration keeps
/// (`--sync-secret`, `[[secret]]`).
async fn start_with(
    cp: &ControlPlane,
    moto: &Ecr,
    namespaces: &[&str],
    default_service_account: Option<&str>,
    reserved: Vec<regbroker::sinks::secret_sync::SecretRef>,
) -> Running {
    let ns = cp.registry_credential_operator().await;
    let client = cp.service_account_client(&ns, "regbroker").await;
    let config = regbroker::controller::Config {
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        default_service_account: default_service_account.map(str::to_string),
        reserved,
    };
    Running(tokio::spawn(regbroker::controller::run(
        broker(moto),
        client,
        config,
        None,
    )))
}

async fn service_account(cp: &ControlPlane, namespace: &str, annotations: &[(&str, &str)]) {
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
    Api::<ServiceAccount>::namespaced(cp.admin(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

fn spec(registries: &[&str]) -> RegistryCredentialSpec {
    RegistryCredentialSpec {
        registries: registries.iter().map(|r| r.to_string()).collect(),
        service_account_name: Some("puller".into()),
        secret_ref: None,
        target: None,
        suspend: false,
    }
}

async fn create(cp: &ControlPlane, ns: &str, name: &str, spec: RegistryCredentialSpec) {
    cp.registry_credential_operator().await;
    Api::<RegistryCredential>::namespaced(cp.admin(), ns)
        .create(&PostParams::default(), &RegistryCredential::new(name, spec))
        .await
        .unwrap();
}

async fn object(cp: &ControlPlane, ns: &str, name: &str) -> RegistryCredential {
    Api::<RegistryCredential>::namespaced(cp.admin(), ns)
        .get(name)
        .await
        .unwrap()
}

/// The object's condition `type_` as (status, reason, message).
fn condition(o: &RegistryCredential, type_: &str) -> Option<(String, String, String)> {
    o.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until the object has condition `type_` with `status` and `reason`; on timeout,
/// panics showing the conditions it had.
async fn wait_for(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> RegistryCredential {
    let start = Instant::now();
    loop {
        let o = object(cp, ns, name).await;
        if let Some(c) = condition(&o, type_)
            && c.0 == status
            && c.1 == reason
        {
            return o;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{ns}/{name}: no {type_}={status} {reason} within 60 s; status: {:?}",
            o.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn secret(cp: &ControlPlane, ns: &str, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(cp.admin(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

/// Every `auths` entry of Secret `ns/name`: registry -> password.
fn auths(s: &Secret) -> BTreeMap<String, String> {
    let raw = &s.data.as_ref().unwrap()[".dockerconfigjson"].0;
    let v: serde_json::Value = serde_json::from_slice(raw).unwrap();
    v["auths"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, e)| {
            let pair = base64::engine::general_purpose::STANDARD
                .decode(e["auth"].as_str().unwrap())
                .unwrap();
            let pair = String::from_utf8(pair).unwrap();
            (k.clone(), pair.split_once(':').unwrap().1.to_string())
        })
        .collect()
}

/// The reasons of the Events about object `name` in `ns`.
async fn event_reasons(cp: &ControlPlane, ns: &str, name: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cp.admin(), ns);
    let mut events: Vec<_> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    events.into_iter().filter_map(|e| e.reason).collect()
}

fn logs() -> regbroker_provider::test_util::LogCapture {
    static CAPTURE: OnceLock<regbroker_provider::test_util::LogCapture> = OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            use tracing_subscriber::Layer as _;
            use tracing_subscriber::layer::SubscriberExt as _;
            use tracing_subscriber::util::SubscriberInitExt as _;
            let capture = regbroker_provider::test_util::LogCapture::default();
            let writer = capture.clone();
            tracing_subscriber::registry()
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(move || writer.clone())
                        .with_ansi(false)
                        .with_filter(regbroker::cli::log_filter("trace")),
                )
                .init();
            capture
        })
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server, etcd, kube-apiserver, kube-controller-manager, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn a_registry_credential_keeps_its_secret_as_the_spec_says() {
    let logs = logs();
    let cp = ControlPlane::shared_with_controllers();
    let moto = Ecr::start();
    let a = cp.namespace("team-a").await;
    service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
    let mut s = spec(&[HOST]);
    s.target = Some(regbroker::controller::api::LocalObjectReference {
        name: "charts-pull".into(),
    });
    create(cp, &a, "charts", s).await;
    let _controller = start(cp, &moto, &[&a], None).await;

    // kubectl wait, as a user would.
    let (ok, out, err) = cp.kubectl(
        &[
            "-n",
            &a,
            "wait",
            "--for=condition=Ready",
            "regcred/charts",
            "--timeout=60s",
        ],
        "",
    );
    assert!(ok, "kubectl wait: {out}{err}");
    let o = object(cp, &a, "charts").await;
    let status = o.status.clone().unwrap();
    assert_eq!(status.observed_generation, o.metadata.generation);
    assert_eq!(status.secret_name.as_deref(), Some("charts-pull"));
    assert!(status.expires_at.is_some() && status.refresh_time.is_some());
    assert_eq!(status.registries.len(), 1);
    assert_eq!(status.registries[0].provider.as_deref(), Some("aws"));
    assert!(condition(&o, "Reconciling").is_none() && condition(&o, "Stalled").is_none());
    // The Secret: its type, regbroker's label and the owner's, a controller ownerReference
    // to the object, and exactly the spec's registry with the tenant's own token.
    let sec = secret(cp, &a, "charts-pull").await.expect("the Secret");
    assert_eq!(sec.type_.as_deref(), Some("kubernetes.io/dockerconfigjson"));
    let labels = sec.metadata.labels.clone().unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "regbroker");
    assert_eq!(labels["regbroker.dev/registrycredential"], "charts");
    let owner = &sec.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.kind, "RegistryCredential");
    assert_eq!(Some(&owner.uid), o.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(
        auths(&sec),
        BTreeMap::from([(HOST.to_string(), "111111111111-auth-token".to_string())])
    );
    // kubectl get shows the printer columns.
    let (ok, out, _) = cp.kubectl(&["-n", &a, "get", "regcred"], "");
    assert!(ok);
    let header = out.lines().next().unwrap();
    for column in ["NAME", "READY", "EXPIRES", "SECRET", "AGE"] {
        assert!(header.contains(column), "{out}");
    }
    assert!(out.contains("True") && out.contains("charts-pull"), "{out}");
    assert!(
        event_reasons(cp, &a, "charts")
            .await
            .contains(&"Succeeded".to_string())
    );

    // A steady state writes nothing: a change the controller sees (an unrelated
    // annotation) reconciles the object without a write to the Secret or the status.
    let api = Api::<RegistryCredential>::namespaced(cp.admin(), &a);
    let poke = serde_json::json!({"metadata": {"annotations": {"test/poke": "1"}}});
    api.patch("charts", &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .unwrap();
    let before = (
        object(cp, &a, "charts").await.metadata.resource_version,
        secret(cp, &a, "charts-pull")
            .await
            .unwrap()
            .metadata
            .resource_version,
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = (
        object(cp, &a, "charts").await.metadata.resource_version,
        secret(cp, &a, "charts-pull")
            .await
            .unwrap()
            .metadata
            .resource_version,
    );
    assert_eq!(
        before, after,
        "a reconcile with nothing new wrote something"
    );

    // Add a registry: the Secret follows, and so does observedGeneration.
    let add = serde_json::json!({"spec": {"registries": [HOST, OTHER_HOST]}});
    api.patch("charts", &PatchParams::default(), &Patch::Merge(&add))
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the Secret holds both", || async {
        let s = secret(cp, &a, "charts-pull").await?;
        (auths(&s).len() == 2).then_some(())
    })
    .await;
    let o = eventually(Duration::from_secs(30), "observedGeneration 2", || async {
        let o = object(cp, &a, "charts").await;
        (o.status.as_ref()?.observed_generation == Some(2)).then_some(o)
    })
    .await;
    assert_eq!(o.status.unwrap().registries.len(), 2);

    // A deleted Secret is restored at once (the watch), and so is an edited one.
    Api::<Secret>::namespaced(cp.admin(), &a)
        .delete("charts-pull", &Default::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(15),
        "the deleted Secret restored",
        || async { secret(cp, &a, "charts-pull").await.map(|s| auths(&s)) },
    )
    .await;
    let edit = serde_json::json!({"data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(r#"{"auths":{}}"#)}});
    Api::<Secret>::namespaced(cp.admin(), &a)
        .patch("charts-pull", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(15),
        "the edited Secret repaired",
        || async {
            let s = secret(cp, &a, "charts-pull").await?;
            (auths(&s).len() == 2).then_some(())
        },
    )
    .await;

    // The manual trigger is handled and echoed.
    let poke =
        serde_json::json!({"metadata": {"annotations": {"regbroker.dev/requestedAt": "now-1"}}});
    api.patch("charts", &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "lastHandledReconcileAt",
        || async {
            let o = object(cp, &a, "charts").await;
            (o.status?.last_handled_reconcile_at.as_deref() == Some("now-1")).then_some(())
        },
    )
    .await;

    // Suspended: Ready says so, and the Secret is no longer repaired.
    let suspend = serde_json::json!({"spec": {"suspend": true}});
    api.patch("charts", &PatchParams::default(), &Patch::Merge(&suspend))
        .await
        .unwrap();
    wait_for(cp, &a, "charts", "Ready", "True", "Suspended").await;
    Api::<Secret>::namespaced(cp.admin(), &a)
        .patch("charts-pull", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        auths(&secret(cp, &a, "charts-pull").await.unwrap()).is_empty(),
        "suspended, yet written"
    );

    // No token, ServiceAccount token or credential reached a log line, at TRACE.
    let text = logs.text();
    assert!(!text.contains("eyJhbGciOi"), "a JWT in the log");
    assert!(!text.contains("auth-token"), "a credential in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server, etcd, kube-apiserver, kube-controller-manager, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn what_retrying_cannot_fix_stalls_and_the_fix_needs_no_touch_of_the_object() {
    let cp = ControlPlane::shared_with_controllers();
    let moto = Ecr::start();
    let a = cp.namespace("team-a").await;
    create(cp, &a, "pull", spec(&[HOST])).await;
    // Without a serviceAccountName, and no default: ServiceAccountRequired.
    let mut nameless = spec(&[HOST]);
    nameless.service_account_name = None;
    create(cp, &a, "nameless", nameless).await;
    // A host no provider serves, and one only the operator's static entry serves.
    create(cp, &a, "unserved", spec(&["registry.example.com"])).await;
    create(cp, &a, "operators", spec(&[STATIC_HOST])).await;
    // A Secret of the target's name that regbroker does not own.
    let foreign = Secret {
        metadata: ObjectMeta {
            name: Some("taken".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([("k".to_string(), "theirs".to_string())])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(cp.admin(), &a)
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    create(cp, &a, "taken", spec(&[HOST])).await;
    // A Secret regbroker's own configuration keeps (a [[secret]] entry): the file wins.
    create(cp, &a, "configured", spec(&[HOST])).await;
    let reserved = vec![regbroker::sinks::secret_sync::SecretRef {
        namespace: a.clone(),
        name: "configured".into(),
    }];
    let _controller = start_with(cp, &moto, &[&a], None, reserved).await;

    let o = wait_for(cp, &a, "configured", "Stalled", "True", "SecretConflict").await;
    let (_, _, message) = condition(&o, "Stalled").unwrap();
    assert!(
        message.contains("regbroker's own configuration"),
        "{message}"
    );
    assert!(secret(cp, &a, "configured").await.is_none());
    let o = wait_for(cp, &a, "pull", "Stalled", "True", "ServiceAccountNotFound").await;
    let (ready, reason, message) = condition(&o, "Ready").unwrap();
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "ServiceAccountNotFound")
    );
    assert!(message.contains("spec.serviceAccountName"), "{message}");
    assert_eq!(
        o.status.as_ref().unwrap().observed_generation,
        o.metadata.generation
    );
    wait_for(
        cp,
        &a,
        "nameless",
        "Stalled",
        "True",
        "ServiceAccountRequired",
    )
    .await;
    wait_for(cp, &a, "unserved", "Stalled", "True", "RegistryNotServed").await;
    let o = wait_for(cp, &a, "operators", "Stalled", "True", "RegistryNotServed").await;
    let (_, _, message) = condition(&o, "Stalled").unwrap();
    assert!(message.contains("spec.registries[0]"), "{message}");
    assert!(
        secret(cp, &a, "operators").await.is_none(),
        "a stalled object wrote a Secret"
    );
    let o = wait_for(cp, &a, "taken", "Stalled", "True", "SecretConflict").await;
    assert!(condition(&o, "Stalled").unwrap().2.contains("taken"));
    let untouched = secret(cp, &a, "taken").await.unwrap();
    assert_eq!(untouched.data.unwrap()["k"], ByteString(b"theirs".to_vec()));
    assert!(untouched.metadata.owner_references.is_none());
    assert!(
        event_reasons(cp, &a, "pull")
            .await
            .contains(&"ServiceAccountNotFound".to_string())
    );

    // The ServiceAccount appears, without an annotation: IdentityNotConfigured; annotated:
    // Ready. The object itself is never touched.
    let generation = object(cp, &a, "pull").await.metadata.generation;
    service_account(cp, &a, &[]).await;
    wait_for(cp, &a, "pull", "Stalled", "True", "IdentityNotConfigured").await;
    let annotate =
        serde_json::json!({"metadata": {"annotations": {"eks.amazonaws.com/role-arn": ROLE_A}}});
    Api::<ServiceAccount>::namespaced(cp.admin(), &a)
        .patch("puller", &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();
    let o = wait_for(cp, &a, "pull", "Ready", "True", "Succeeded").await;
    assert!(condition(&o, "Stalled").is_none());
    assert_eq!(o.metadata.generation, generation);
    let reasons = event_reasons(cp, &a, "pull").await;
    assert!(reasons.contains(&"Recovered".to_string()), "{reasons:?}");
    // Exactly one Event per transition: not one per reconcile.
    let stalls = reasons
        .iter()
        .filter(|r| *r == "ServiceAccountNotFound")
        .count();
    assert_eq!(stalls, 1, "{reasons:?}");

    // A second object naming the same Secret: the first keeps it, the second stalls.
    let mut second = spec(&[OTHER_HOST]);
    second.target = Some(regbroker::controller::api::LocalObjectReference {
        name: "pull".into(),
    });
    create(cp, &a, "second", second).await;
    wait_for(cp, &a, "second", "Stalled", "True", "SecretConflict").await;
    let kept = secret(cp, &a, "pull").await.unwrap();
    assert_eq!(auths(&kept).keys().collect::<Vec<_>>(), [HOST]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server, etcd, kube-apiserver, kube-controller-manager, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn tenants_get_their_own_credentials_and_never_the_operators() {
    let cp = ControlPlane::shared_with_controllers();
    let moto = Ecr::start();
    let (a, b, c) = (
        cp.namespace("team-a").await,
        cp.namespace("team-b").await,
        cp.namespace("team-c").await,
    );
    service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
    service_account(cp, &b, &[("eks.amazonaws.com/ecr-role-arn", ROLE_B)]).await;
    // team-c's ServiceAccount has no cloud annotation: it gets nothing, and never
    // regbroker's own identity.
    service_account(cp, &c, &[]).await;
    for ns in [&a, &b, &c] {
        let mut s = spec(&[HOST]);
        s.service_account_name = None; // --default-service-account puller
        create(cp, ns, "pull", s).await;
    }
    // team-a also asks for the host only the operator's static entry serves.
    create(cp, &a, "sneaky", spec(&[HOST, STATIC_HOST])).await;
    let _controller = start(cp, &moto, &[&a, &b, &c], Some("puller")).await;

    wait_for(cp, &a, "pull", "Ready", "True", "Succeeded").await;
    wait_for(cp, &b, "pull", "Ready", "True", "Succeeded").await;
    wait_for(cp, &c, "pull", "Stalled", "True", "IdentityNotConfigured").await;
    wait_for(cp, &a, "sneaky", "Stalled", "True", "RegistryNotServed").await;
    assert_eq!(
        auths(&secret(cp, &a, "pull").await.unwrap())[HOST],
        "111111111111-auth-token"
    );
    assert_eq!(
        auths(&secret(cp, &b, "pull").await.unwrap())[HOST],
        "222222222222-auth-token"
    );
    assert!(secret(cp, &c, "pull").await.is_none());
    assert!(secret(cp, &a, "sneaky").await.is_none());
    // The operator's password is in no Secret of any tenant.
    for ns in [&a, &b, &c] {
        let all = Api::<Secret>::namespaced(cp.admin(), ns)
            .list(&Default::default())
            .await
            .unwrap();
        for s in all.items {
            let text = serde_json::to_string(&s.data).unwrap();
            let decoded: String = s
                .data
                .iter()
                .flatten()
                .map(|(_, v)| String::from_utf8_lossy(&v.0).into_owned())
                .collect();
            assert!(!text.contains(STATIC_PASSWORD) && !decoded.contains("b3BlcmF0b3I6"));
        }
    }
}

#[tokio::test]
#[ignore = "needs moto_server, etcd, kube-apiserver, kube-controller-manager, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn the_api_server_refuses_what_the_schema_can_say() {
    let cp = ControlPlane::shared_with_controllers();
    cp.registry_credential_operator().await;
    let a = cp.namespace("team-a").await;
    let api = Api::<RegistryCredential>::namespaced(cp.admin(), &a);
    let many: Vec<String> = (0..65).map(|i| format!("r{i}.example.com")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let cases: Vec<(&str, RegistryCredentialSpec)> = vec![
        ("empty", spec(&[])),
        ("65 registries", spec(&many)),
        ("whitespace", spec(&["bad host"])),
        ("user info", spec(&["user@example.com"])),
        ("duplicates", spec(&[HOST, HOST])),
        ("a bad ServiceAccount name", {
            let mut s = spec(&[HOST]);
            s.service_account_name = Some("Not_A_Name".into());
            s
        }),
        ("a bad target", {
            let mut s = spec(&[HOST]);
            s.target = Some(regbroker::controller::api::LocalObjectReference {
                name: "../x".into(),
            });
            s
        }),
    ];
    for (what, s) in cases {
        let refused = api
            .create(&PostParams::default(), &RegistryCredential::new("bad", s))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(s) if s.code == 422),
            "{what}: {refused:?}"
        );
    }
    // 64 is the limit, not 63.
    let ok: Vec<&str> = many[..64].to_vec();
    api.create(
        &PostParams::default(),
        &RegistryCredential::new("ok", spec(&ok)),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server, etcd, kube-apiserver, kube-controller-manager, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn deleting_the_object_collects_its_secret_and_view_users_see_status_not_secrets() {
    let cp = ControlPlane::shared_with_controllers();
    let moto = Ecr::start();
    let a = cp.namespace("team-a").await;
    cp.registry_credential_operator().await;
    service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
    // An `edit` user of the namespace creates the object; a `view` user reads it.
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-edit, namespace: {a}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: bob-view, namespace: {a}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}}]
"
    ));
    let object = format!(
        "apiVersion: regbroker.dev/v1alpha1
kind: RegistryCredential
metadata: {{name: pull, namespace: {a}}}
spec: {{registries: [{HOST}], serviceAccountName: puller}}
"
    );
    // Aggregation takes a moment after the CRD's roles appear: retry the create.
    eventually(
        Duration::from_secs(60),
        "alice (edit) creates the object",
        || async {
            let (ok, _, _) = cp.kubectl(&["--as=alice", "create", "-f", "-"], &object);
            ok.then_some(())
        },
    )
    .await;
    let _controller = start(cp, &moto, &[&a], None).await;
    wait_for(cp, &a, "pull", "Ready", "True", "Succeeded").await;
    let can = |user: &str, verb: &str, what: &str| {
        let (ok, out, _) = cp.kubectl(
            &[
                "auth",
                "can-i",
                verb,
                what,
                "-n",
                &a,
                &format!("--as={user}"),
            ],
            "",
        );
        ok && out.trim() == "yes"
    };
    let (ok, out, err) = cp.kubectl(&["--as=bob", "-n", &a, "get", "regcred", "pull"], "");
    assert!(
        ok && out.contains("True"),
        "bob (view) reads the status: {out}{err}"
    );
    assert!(can(
        "bob",
        "get",
        "registrycredentials.regbroker.dev/status"
    ));
    assert!(!can("bob", "create", "registrycredentials.regbroker.dev"));
    assert!(!can("bob", "get", "secrets"), "view reads no Secret");
    let (ok, _, _) = cp.kubectl(&["--as=bob", "-n", &a, "get", "secret", "pull"], "");
    assert!(!ok, "bob read the Secret");
    assert!(can("alice", "delete", "registrycredentials.regbroker.dev"));

    // Deleting the object: Kubernetes' garbage collector deletes its Secret.
    assert!(secret(cp, &a, "pull").await.is_some());
    let (ok, out, err) = cp.kubectl(&["--as=alice", "-n", &a, "delete", "regcred", "pull"], "");
    assert!(ok, "{out}{err}");
    eventually(Duration::from_secs(60), "the Secret collected", || async {
        secret(cp, &a, "pull").await.is_none().then_some(())
    })
    .await;
}

/// A restart, or a new leader, starts with an empty cache: it keeps what each Secret
/// holds while that was fetched as the identity that would fetch it now and its refresh
/// point is ahead, instead of fetching and writing every Secret again; an identity changed
/// while no controller ran is fetched anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server, etcd, kube-apiserver, kube-controller-manager, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn a_restart_keeps_what_secrets_hold_unless_the_identity_changed() {
    let cp = ControlPlane::shared_with_controllers();
    let moto = Ecr::start();
    let a = cp.namespace("restart").await;
    service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
    create(cp, &a, "kept", spec(&[HOST])).await;
    let controller = start(cp, &moto, &[&a], None).await;
    wait_for(cp, &a, "kept", "Ready", "True", "Succeeded").await;
    let versions = || async {
        (
            object(cp, &a, "kept").await.metadata.resource_version,
            secret(cp, &a, "kept")
                .await
                .unwrap()
                .metadata
                .resource_version,
        )
    };
    let before = versions().await;
    let sec = secret(cp, &a, "kept").await.unwrap();
    let annotations = sec.metadata.annotations.clone().unwrap();
    let refresh_at: k8s_openapi::jiff::Timestamp =
        annotations["regbroker.dev/refresh-at"].parse().unwrap();
    assert!(
        refresh_at > k8s_openapi::jiff::Timestamp::now(),
        "{annotations:?}"
    );
    assert_eq!(annotations["regbroker.dev/fetched-as"].len(), 32);

    // moto now answers with other tokens: a fetch would show in the Secret.
    moto.rotate("-rotated");
    drop(controller);
    let controller = start(cp, &moto, &[&a], None).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = secret(cp, &a, "kept").await.unwrap();
    assert_eq!(
        versions().await,
        before,
        "the restart wrote something; the Secret's metadata before: {:?}, after: {:?}",
        sec.metadata,
        after.metadata
    );
    assert_eq!(
        auths(&secret(cp, &a, "kept").await.unwrap())[HOST],
        "111111111111-auth-token"
    );
    // A later look (the ServiceAccount changed, not its identity) keeps the Secret too.
    let poke = serde_json::json!({"metadata": {"annotations": {"test/poke": "1"}}});
    Api::<ServiceAccount>::namespaced(cp.admin(), &a)
        .patch("puller", &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(versions().await, before, "a later look wrote something");
    // A Secret edited after the restart is not adopted again: it is fetched for and
    // restored, with what moto issues now.
    // Byte for byte as regbroker writes it, but for the password.
    let b64 = &base64::engine::general_purpose::STANDARD;
    let doc = String::from_utf8(sec.data.as_ref().unwrap()[".dockerconfigjson"].0.clone())
        .unwrap()
        .replace(
            &b64.encode("AWS:111111111111-auth-token"),
            &b64.encode("AWS:bogus-----------------"),
        );
    assert!(
        doc.contains(&b64.encode("AWS:bogus-----------------")),
        "{doc}"
    );
    let edit = serde_json::json!({"data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(doc)}});
    Api::<Secret>::namespaced(cp.admin(), &a)
        .patch("kept", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the rotated token", || async {
        let s = secret(cp, &a, "kept").await?;
        (auths(&s)[HOST] == "111111111111-auth-token-rotated").then_some(())
    })
    .await;

    // The ServiceAccount names another role while no controller runs: the restart
    // fetches as that role rather than keep what the old one got.
    drop(controller);
    let role_b =
        serde_json::json!({"metadata": {"annotations": {"eks.amazonaws.com/role-arn": ROLE_B}}});
    Api::<ServiceAccount>::namespaced(cp.admin(), &a)
        .patch("puller", &PatchParams::default(), &Patch::Merge(&role_b))
        .await
        .unwrap();
    let controller = start(cp, &moto, &[&a], None).await;
    eventually(Duration::from_secs(30), "role B's token", || async {
        let s = secret(cp, &a, "kept").await?;
        (auths(&s)[HOST] == "222222222222-auth-token-rotated").then_some(())
    })
    .await;

    // A Secret whose refresh point passed while no controller ran is fetched anew.
    drop(controller);
    let past = serde_json::json!({"metadata": {"annotations": {"regbroker.dev/refresh-at": "2026-01-01T00:00:00Z"}}});
    Api::<Secret>::namespaced(cp.admin(), &a)
        .patch("kept", &PatchParams::default(), &Patch::Merge(&past))
        .await
        .unwrap();
    moto.rotate("-third");
    let _controller = start(cp, &moto, &[&a], None).await;
    eventually(Duration::from_secs(30), "the third token", || async {
        let s = secret(cp, &a, "kept").await?;
        (auths(&s)[HOST] == "222222222222-auth-token-third").then_some(())
    })
    .await;
}
