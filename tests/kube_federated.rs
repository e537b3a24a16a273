//! Federated credentials in Secrets (issue 27, item 4), on the real kube-apiserver: one
//! `regbroker serve` process, as the ServiceAccount and ClusterRole that
//! `deploy/registry-credentials/rbac.yaml` ships, keeps a `[[secret]]` entry's Secret
//! (`service_account = "puller"`) and runs the RegistryCredential controller. Either way
//! regbroker asks TokenRequest for the named ServiceAccount's token, for the `quay` rule's
//! audience, and sends it to the stand-in of Quay's robot federation
//! (`federated_support`), which verifies it against the API server's JWKS and trusts only
//! `puller`; its robot token is the htpasswd password of a real distribution registry,
//! and crane, skopeo, helm and oras pull with the Secrets as their docker config.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client_support;
mod common;
mod control_plane;
mod federated_support;
mod registry_peer;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use client_support::{ClientHome, ok, text};
use common::ServeProcess;
use control_plane::{ControlPlane, eventually};
use federated_support::{Quay, ROBOT, write_config};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use regbroker::controller::api::{RegistryCredential, RegistryCredentialSpec};
use registry_peer::{http_status, oci_layout};

/// The version of this repository's chart (deploy/chart/regbroker/Chart.yaml).
const CHART_VERSION: &str = "0.1.0";

/// Every `auths` entry of a dockerconfigjson Secret: registry -> (username, password).
fn auths(s: &Secret) -> BTreeMap<String, (String, String)> {
    let Some(raw) = s.data.as_ref().and_then(|d| d.get(".dockerconfigjson")) else {
        return BTreeMap::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&raw.0).unwrap();
    v["auths"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, e)| {
            let pair = base64::engine::general_purpose::STANDARD
                .decode(e["auth"].as_str().unwrap())
                .unwrap();
            let pair = String::from_utf8(pair).unwrap();
            let (user, password) = pair.split_once(':').unwrap();
            (k.clone(), (user.to_string(), password.to_string()))
        })
        .collect()
}

/// A RegistryCredential for `registry`, served with ServiceAccount `service_account`.
fn credential_for(registry: &str, service_account: &str) -> RegistryCredentialSpec {
    RegistryCredentialSpec {
        registries: vec![registry.to_string()],
        service_account_name: Some(service_account.to_string()),
        secret_ref: None,
        target: None,
        suspend: false,
    }
}

/// The `Ready` condition of `ns/name`: (status, reason, message).
async fn ready(cp: &ControlPlane, ns: &str, name: &str) -> Option<(String, String, String)> {
    let o = Api::<RegistryCredential>::namespaced(cp.admin(), ns)
        .get(name)
        .await
        .unwrap();
    o.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status, c.reason, c.message))
}

/// The notes of the Events about object `name` in `ns`.
async fn event_notes(cp: &ControlPlane, ns: &str, name: &str) -> Vec<String> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(cp.admin(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl, crane, helm from scripts/peers.sh, oras (PyPI), skopeo, docker-registry, htpasswd: run scripts/test.sh"]
async fn secrets_synced_and_registry_credentials_hold_the_robot_token_of_their_own_service_account_only()
 {
    let cp = ControlPlane::shared();
    let operator = cp.registry_credential_operator().await;
    let ns = cp.namespace("quay-secrets").await;
    let quay = Quay::start(cp, &ns).await;
    let host = quay.registry.host.clone();
    // Both ServiceAccounts exist; the stand-in's robot trusts only `puller`.
    for sa in ["puller", "intruder"] {
        cp.service_account_token(&ns, sa, &[]).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "{}\n[[secret]]\nnamespace = \"{ns}\"\nname = \"quay-pull\"\nregistries = [\"{host}\"]\nservice_account = \"puller\"\n",
        quay.rule(None)
    );
    let config = write_config(dir.path(), "regbroker", &toml);
    let kubeconfig = cp.service_account_kubeconfig(&operator, "regbroker").await;
    let _serve = tokio::task::block_in_place(|| {
        ServeProcess::start(
            &[
                "--config",
                config.to_str().unwrap(),
                "--registry-credentials",
                "--registry-credentials-namespace",
                &ns,
            ],
            &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
        )
    });
    let secrets = Api::<Secret>::namespaced(cp.admin(), &ns);
    let robot = BTreeMap::from([(host.clone(), (ROBOT.to_string(), quay.robot_token.clone()))]);

    // The `[[secret]]` entry: its Secret holds the robot credential.
    let synced = eventually(Duration::from_secs(60), "the synced Secret", || async {
        secrets.get_opt("quay-pull").await.unwrap()
    })
    .await;
    assert_eq!(
        synced.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );
    assert_eq!(auths(&synced), robot);
    // skopeo pushes and crane pulls with that Secret as their whole docker config.
    let doc = &synced.data.as_ref().unwrap()[".dockerconfigjson"].0;
    let home = ClientHome::with_docker_config(doc);
    assert_eq!(
        http_status(&host, "/v2/"),
        401,
        "the registry wants a credential"
    );
    let image = format!("{host}/acme/app:v1");
    let layout = oci_layout(home.path(), "synced");
    ok(
        "skopeo push with the synced Secret",
        &home.skopeo_push(&layout, &image, &[]),
    );
    let (pull, pulled) = home.crane_pull(&image, &[]);
    ok("crane pull with the synced Secret", &pull);
    assert!(pulled.join("index.json").is_file());
    // helm (the Secret as its registry config) and oras push and pull with it too.
    let tgz = home.helm_package();
    let charts = format!("oci://{host}/charts");
    ok(
        "helm push with the synced Secret",
        &home.helm(
            &["push", tgz.to_str().unwrap(), &charts, "--plain-http"],
            &[],
        ),
    );
    let (pull, pulled) = home.helm_pull(&format!("{host}/charts/regbroker"), CHART_VERSION, &[]);
    ok("helm pull with the synced Secret", &pull);
    assert_eq!(
        std::fs::read(&pulled).unwrap(),
        std::fs::read(&tgz).unwrap()
    );
    let artifact = home.path().join("artifact.txt");
    std::fs::write(&artifact, "federated through a synced Secret").unwrap();
    let run = home.oras(&format!("{host}/acme/artifact:v1"), Some(&artifact), &[]);
    ok("oras push and pull with the synced Secret", &run);
    assert!(text(&run.stdout).contains("federated through a synced Secret"));

    // A RegistryCredential naming `puller`: Ready, its Secret the robot credential, which
    // pulls.
    let api = Api::<RegistryCredential>::namespaced(cp.admin(), &ns);
    for (name, sa) in [("puller", "puller"), ("intruder", "intruder")] {
        api.create(
            &PostParams::default(),
            &RegistryCredential::new(name, credential_for(&host, sa)),
        )
        .await
        .unwrap();
    }
    let (_, reason, _) = eventually(Duration::from_secs(60), "puller Ready", || async {
        ready(cp, &ns, "puller")
            .await
            .filter(|(status, _, _)| status == "True")
    })
    .await;
    assert_eq!(reason, "Succeeded");
    let kept = secrets.get("puller").await.unwrap();
    assert_eq!(auths(&kept), robot);
    let doc = &kept.data.as_ref().unwrap()[".dockerconfigjson"].0;
    let home = ClientHome::with_docker_config(doc);
    let (pull, pulled) = home.skopeo_pull(&image, &[]);
    ok("skopeo pull with the RegistryCredential's Secret", &pull);
    assert!(pulled.join("index.json").is_file());

    // One naming `intruder`: the stand-in refuses its token, and the refusal's reason is
    // in the condition and in an Event; its Secret (if any) never holds the robot token.
    let refusal = format!("the token's subject is not trusted by {ROBOT}");
    let (_, reason, message) = eventually(
        Duration::from_secs(60),
        "intruder not Ready, saying why",
        || async {
            ready(cp, &ns, "intruder")
                .await
                .filter(|(status, _, message)| status == "False" && message.contains(&refusal))
        },
    )
    .await;
    assert_eq!(reason, "IdentityRejected", "{message}");
    eventually(
        Duration::from_secs(30),
        "an Event with the reason",
        || async {
            event_notes(cp, &ns, "intruder")
                .await
                .iter()
                .any(|n| n.contains(&refusal))
                .then_some(())
        },
    )
    .await;
    let intruder_sub = format!("system:serviceaccount:{ns}:intruder");
    assert!(
        quay.exchange
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|(r, v)| r == ROBOT && v.as_ref().is_err_and(|e| e.contains("subject"))),
        "the stand-in never refused {intruder_sub}"
    );
    for s in secrets.list(&Default::default()).await.unwrap().items {
        let name = s.metadata.name.clone().unwrap();
        if name == "quay-pull" || name == "puller" {
            continue;
        }
        assert!(
            auths(&s).values().all(|(_, p)| p != &quay.robot_token),
            "Secret {name} holds the robot token"
        );
    }
    // Its Secret, if written, holds no credential at all.
    if let Some(s) = secrets.get_opt("intruder").await.unwrap() {
        assert!(auths(&s).is_empty(), "{:?}", auths(&s).keys());
    }
    // The synced Secret and the good RegistryCredential were not disturbed.
    assert_eq!(auths(&secrets.get("quay-pull").await.unwrap()), robot);
    assert_eq!(
        ready(cp, &ns, "puller").await.map(|r| r.0).as_deref(),
        Some("True")
    );
    // puller's token was exchanged (once: the synced Secret and the RegistryCredential
    // share the cached credential of one ServiceAccount), intruder's refused.
    assert!(
        quay.exchange
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|(_, v)| v.is_ok())
    );
}
