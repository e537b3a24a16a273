//! Flux pulls a Helm chart with the Secret a tenant's `RegistryCredential` asks regbroker
//! for, across a rotation of the registry's password, and no longer once the object is
//! deleted (issue 24, "Flux end to end").
//!
//! Peers, none written here: kube-apiserver + etcd + kube-controller-manager's garbage
//! collector (tests/control_plane), Flux's source-controller v1.9.6 and its CRDs and the
//! Helm CLI (scripts/peers.sh), the distribution registry with htpasswd auth
//! (tests/registry_peer), and moto for STS and ECR, whose one ECR view tests/flux_support
//! replaces so that a token lives twelve hours, as ECR's do, and can rotate. The chain:
//!
//! The tenant's ServiceAccount is annotated with its role; the controller (in-process, as
//! the ServiceAccount and ClusterRole `deploy/registry-credentials/` ships) gets its token
//! from TokenRequest, moto's `AssumeRoleWithWebIdentity` maps the role to account
//! 111111111111 and ECR's `GetAuthorizationToken` answers `AWS:111111111111-auth-token`.
//! The loopback registry is an ECR registry to regbroker by the operator's routing rule
//! (`[[rule]]` with the aws provider's `region` and `account` options), and its htpasswd
//! accepts exactly that password. source-controller reads the Secret through the
//! `secretRef` of an OCI `HelmRepository`, for its `HelmChart`.
//!
//! Every wait is bounded and prints the object's status and source-controller's log when
//! it runs out; every process is on loopback and ends with the test binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "aws")]

mod common;
mod control_plane;
mod flux_support;
mod registry_peer;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane::ControlPlane;
use flux_support::{
    Ecr, Helm, SourceController, auth_for, condition, get, handled, observed, ready_status,
    ready_with_artifact, request_reconcile, secret_docker_config, wait_for,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use regbroker::broker::Broker;
use regbroker::broker::providers::Providers;
use regbroker::broker::static_secret;
use regbroker::controller::api::{RegistryCredential, RegistryCredentialSpec};
use regbroker::metrics::Metrics;
use registry_peer::Registry;
use sha2::{Digest, Sha256};

/// The tenant's role; moto's STS maps it to its account, whose ECR password is
/// `111111111111-auth-token`.
const ROLE: &str = "arn:aws:iam::111111111111:role/team-a-puller";
const PASSWORD: &str = "111111111111-auth-token";
/// The RegistryCredential, and the Secret it keeps (its default target).
const CREDENTIAL: &str = "charts";
const HELM_CHART: &str = "helmchart.source.toolkit.fluxcd.io";
const REGISTRY_CREDENTIAL: &str = "registrycredential.regbroker.dev";

async fn service_account(cp: &ControlPlane, ns: &str, name: &str, role: Option<&str>) {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: role.map(|r| [("eks.amazonaws.com/role-arn".into(), r.into())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(cp.admin(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

/// A broker as `serve --config` builds one: the aws provider (every endpoint moto), the
/// operator's rule making `registry` an ECR registry, no static entry and no identity of
/// its own.
fn broker(ecr: &Ecr, registry: &str) -> Arc<Broker> {
    let metrics = Arc::new(Metrics::new());
    let aws = regbroker_aws::AwsProvider::builder()
        .endpoint_url(format!("http://{}", ecr.addr))
        .build();
    let providers = Providers::new(vec![Arc::new(aws)]);
    let config = regbroker::broker::config::parse(
        &format!(
            "[[rule]]\nmatch = \"{registry}\"\nsource = \"aws\"\n\
             options = {{ region = \"us-east-1\", account = \"111111111111\" }}\n"
        ),
        &providers,
    )
    .unwrap();
    Arc::new(Broker::new(
        Arc::new(static_secret::Store::empty(metrics.clone())),
        config.router,
        providers,
        config.cache,
        metrics,
        regbroker_provider::system_clock(),
    ))
}

/// An OCI `HelmRepository` authenticating with the RegistryCredential's Secret, and a
/// `HelmChart` from it asking for the newest 0.1.x, so that every reconcile lists the
/// repository's tags with the Secret's credentials. (A chart pinned to a version already
/// in storage is not pulled again: it would stay Ready with any Secret.) Reconciled only
/// when asked, or retried after a failure.
fn flux_objects(ns: &str, registry: &str) -> String {
    format!(
        r#"apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata: {{name: regbroker, namespace: {ns}}}
spec:
  type: oci
  url: oci://{registry}/charts
  insecure: true
  interval: 1h
  provider: generic
  secretRef: {{name: {CREDENTIAL}}}
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmChart
metadata: {{name: regbroker, namespace: {ns}}}
spec:
  chart: regbroker
  version: "0.1.x"
  interval: 1h
  sourceRef: {{kind: HelmRepository, name: regbroker}}
"#
    )
}

/// A value for a `requestedAt` annotation not used before.
fn fresh(what: &str) -> String {
    let tail: String = (0..12).map(|_| fastrand::alphanumeric()).collect();
    format!("{what}-{tail}")
}

/// The password the Secret `ns/charts` gives `registry`, if any.
fn secret_password(cp: &ControlPlane, ns: &str, registry: &str) -> Option<String> {
    let doc = secret_docker_config(cp, ns, CREDENTIAL)?;
    let pair = auth_for(&doc, registry)?;
    Some(pair.strip_prefix("AWS:")?.to_string())
}

/// Waits until the HelmChart handled the reconcile asked at `at` and is Ready with chart
/// `version`, the file `tgz` as pushed (its digest and the bytes source-controller
/// serves).
async fn wait_for_chart(
    cp: &ControlPlane,
    sc: &SourceController,
    ns: &str,
    tgz: &Path,
    version: &str,
    at: &str,
) {
    let pushed = std::fs::read(tgz).unwrap();
    let digest = format!("sha256:{:x}", Sha256::digest(&pushed));
    let what = format!("Ready with chart {version} after the reconcile asked at {at}");
    let obj = wait_for(cp, sc, ns, HELM_CHART, "regbroker", &what, |o| {
        handled(o, at) && ready_with_artifact(o) && o["status"]["artifact"]["revision"] == version
    });
    assert_eq!(obj["status"]["artifact"]["digest"], digest.as_str());
    let url = obj["status"]["artifact"]["url"].as_str().unwrap();
    let served = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(served.status().as_u16(), 200, "GET {url}");
    assert!(
        served.bytes().await.unwrap() == pushed,
        "the HelmChart's artifact is not the pushed chart"
    );
}

/// Asks the HelmChart to reconcile and waits until it has, and failed; returns Ready's
/// message. Its artifact is still chart `kept`.
fn reconcile_fails(cp: &ControlPlane, sc: &SourceController, ns: &str, kept: &str) -> String {
    let at = fresh("expect-failure");
    request_reconcile(cp, ns, HELM_CHART, "regbroker", &at);
    let obj = wait_for(cp, sc, ns, HELM_CHART, "regbroker", "failing", |o| {
        handled(o, &at) && observed(o) && ready_status(o) == "False"
    });
    assert_eq!(
        obj["status"]["artifact"]["revision"], kept,
        "a failed pull keeps the artifact it had"
    );
    let ready = condition(&obj, "Ready").unwrap();
    eprintln!(
        "flux: HelmChart failing: {} {}",
        ready["reason"], ready["message"]
    );
    ready["message"].as_str().unwrap_or("").to_string()
}

/// Asks regbroker to fetch the object's credentials anew (`regbroker.dev/requestedAt`).
fn ask_refresh(cp: &ControlPlane, tenant: &str, asked: &str) {
    let (ok, out, err) = cp.kubectl(
        &[
            "annotate",
            "--overwrite",
            "-n",
            tenant,
            &format!("{REGISTRY_CREDENTIAL}/{CREDENTIAL}"),
            &format!("regbroker.dev/requestedAt={asked}"),
        ],
        "",
    );
    assert!(ok, "{out}{err}");
}

/// A tenant's `RegistryCredential` is what lets Flux pull: the HelmChart becomes Ready
/// through the Secret regbroker keeps; when the registry's password rotates, the
/// credential in the Secret stops working until `regbroker.dev/requestedAt` has regbroker
/// fetch the new one, and then a new chart version is pulled with it; once the object is
/// deleted, the garbage collector takes the Secret and the next pull fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs moto_server, etcd, kube-apiserver, kube-controller-manager, kubectl, source-controller, helm from scripts/peers.sh, docker-registry and htpasswd: run scripts/test.sh"]
async fn flux_pulls_with_a_registry_credential_through_rotation_until_it_is_deleted() {
    let started = Instant::now();
    let cp = ControlPlane::shared_with_controllers();
    let sc = SourceController::shared(cp);
    let ecr = Ecr::start();
    let registry = Registry::start_with(Some((regbroker_aws::USERNAME, PASSWORD)));
    let host = registry.host.clone();
    let operator_ns = cp.registry_credential_operator().await;
    let tenant = cp.namespace("team-a").await;
    service_account(cp, &tenant, "puller", Some(ROLE)).await;
    let config = regbroker::controller::Config {
        namespaces: vec![tenant.clone()],
        default_service_account: None,
        reserved: Vec::new(),
    };
    let client = cp.service_account_client(&operator_ns, "regbroker").await;
    let controller = tokio::spawn(regbroker::controller::run(
        broker(&ecr, &host),
        client,
        config,
        None,
    ));
    let _stop = AbortOnDrop(controller);

    // 1. The tenant asks for its Secret, and Flux pulls with it.
    Api::<RegistryCredential>::namespaced(cp.admin(), &tenant)
        .create(
            &PostParams::default(),
            &RegistryCredential::new(
                CREDENTIAL,
                RegistryCredentialSpec {
                    registries: vec![host.clone()],
                    service_account_name: Some("puller".into()),
                    secret_ref: None,
                    target: None,
                    suspend: false,
                },
            ),
        )
        .await
        .unwrap();
    let rc = wait_for(
        cp,
        sc,
        &tenant,
        REGISTRY_CREDENTIAL,
        CREDENTIAL,
        "Ready",
        |o| observed(o) && ready_status(o) == "True",
    );
    assert_eq!(rc["status"]["registries"][0]["provider"], "aws");
    let first_refresh = rc["status"]["refreshTime"].clone();
    assert_eq!(
        secret_password(cp, &tenant, &host).as_deref(),
        Some(PASSWORD),
        "the tenant role's ECR password"
    );
    let secret = get(cp, &tenant, "secret", CREDENTIAL).unwrap();
    let uid = secret["metadata"]["uid"].clone();
    // The chart goes in with the very document regbroker wrote.
    let mut helm = Helm::new(cp);
    let v010 = helm.package_chart("0.1.0");
    let doc = secret_docker_config(cp, &tenant, CREDENTIAL).unwrap();
    helm.push(&v010, &host, "charts", &doc.to_string());
    cp.apply(&flux_objects(&tenant, &host));
    let at = fresh("first");
    request_reconcile(cp, &tenant, HELM_CHART, "regbroker", &at);
    wait_for_chart(cp, sc, &tenant, &v010, "0.1.0", &at).await;
    eprintln!(
        "flux: HelmChart Ready through the RegistryCredential in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // 2. ECR rotates the token, and the registry takes only the new one: the Secret's
    // credential stops working. Its refresh point is most of an hour away (the token
    // lives twelve hours, the role's session one, and regbroker keeps the shorter), so
    // nothing changes until the tenant asks for a refresh.
    let suffix = fresh("-rotated");
    let rotated = format!("{PASSWORD}{suffix}");
    ecr.rotate(&suffix);
    registry.set_password(regbroker_aws::USERNAME, &rotated);
    let message = reconcile_fails(cp, sc, &tenant, "0.1.0").to_lowercase();
    assert!(
        ["401", "unauthorized", "authentication"]
            .iter()
            .any(|w| message.contains(w)),
        "the old credential fails, but not to authenticate: {message}"
    );
    assert_eq!(
        secret_password(cp, &tenant, &host).as_deref(),
        Some(PASSWORD),
        "regbroker refreshed before the refresh point, unasked"
    );
    let asked_at = Instant::now();
    let asked = fresh("rotate");
    ask_refresh(cp, &tenant, &asked);
    let rc = wait_for(
        cp,
        sc,
        &tenant,
        REGISTRY_CREDENTIAL,
        CREDENTIAL,
        "refreshed with the rotated token",
        |o| {
            o["status"]["lastHandledReconcileAt"] == asked.as_str()
                && secret_password(cp, &tenant, &host).as_deref() == Some(rotated.as_str())
        },
    );
    let refreshed_in = asked_at.elapsed();
    assert_eq!(ready_status(&rc), "True");
    assert_ne!(rc["status"]["refreshTime"], first_refresh);
    assert_eq!(
        get(cp, &tenant, "secret", CREDENTIAL).unwrap()["metadata"]["uid"],
        uid,
        "the Secret is updated in place"
    );
    // A new version, pushed with the refreshed document (the old one works for nobody).
    let v011 = helm.package_chart("0.1.1");
    let doc = secret_docker_config(cp, &tenant, CREDENTIAL).unwrap();
    helm.push(&v011, &host, "charts", &doc.to_string());
    let at = fresh("rotated");
    request_reconcile(cp, &tenant, HELM_CHART, "regbroker", &at);
    wait_for_chart(cp, sc, &tenant, &v011, "0.1.1", &at).await;

    // 2b. ECR rotates again, but the registry still takes only the previous token (a
    // credential the cloud issued that the registry refuses): regbroker checks the new
    // one with the registry before writing it, so the Secret keeps the working token
    // while the status says CredentialRejected; once the registry takes the new token,
    // the Secret gets it without anyone asking again.
    let suffix = fresh("-again");
    let again = format!("{PASSWORD}{suffix}");
    ecr.rotate(&suffix);
    let asked = fresh("again");
    ask_refresh(cp, &tenant, &asked);
    wait_for(
        cp,
        sc,
        &tenant,
        REGISTRY_CREDENTIAL,
        CREDENTIAL,
        "the new token refused by the registry",
        |o| o["status"]["registries"][0]["reason"] == "CredentialRejected",
    );
    assert_eq!(
        secret_password(cp, &tenant, &host).as_deref(),
        Some(rotated.as_str()),
        "a token the registry refused was written"
    );
    registry.set_password(regbroker_aws::USERNAME, &again);
    wait_for(
        cp,
        sc,
        &tenant,
        REGISTRY_CREDENTIAL,
        CREDENTIAL,
        "the new token written once the registry takes it",
        |o| {
            o["status"]["registries"][0]["reason"] == "Succeeded"
                && secret_password(cp, &tenant, &host).as_deref() == Some(again.as_str())
        },
    );

    // 3. The tenant deletes its RegistryCredential: the garbage collector deletes the
    // Secret, and Flux can no longer pull.
    Api::<RegistryCredential>::namespaced(cp.admin(), &tenant)
        .delete(CREDENTIAL, &Default::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(cp, &tenant, "secret", CREDENTIAL).is_some() {
        assert!(
            Instant::now() < deadline,
            "Secret {CREDENTIAL} not collected within 60 s; kube-controller-manager:\n{}",
            cp.controller_manager_log_tail().unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let message = reconcile_fails(cp, sc, &tenant, "0.1.1");
    assert!(
        message.contains(CREDENTIAL) && message.contains("not found"),
        "the pull fails for want of the Secret: {message}"
    );
    assert!(sc.running(), "source-controller exited");
    eprintln!(
        "flux: Secret refreshed {:.1} s after requestedAt; whole test {:.1} s",
        refreshed_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// Stops the in-process controller when the test ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
