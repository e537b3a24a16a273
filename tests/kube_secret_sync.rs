//! The Secret sync against a real kube-apiserver (tests/control_plane), acting as the
//! ServiceAccount that `deploy/standalone/rbac.yaml` grants, applied from that very file
//! (its namespaces renamed to this test's own).
//!
//! What the real server proves that a fake cannot: the ownership label and type are what
//! the API server stores, updates happen in place (same UID, new resourceVersion), the
//! RBAC in `deploy/` is enough for every step and no broader than needed. Faults a real
//! server cannot produce on demand (500s, lost update races) stay in tests/secret_sync.rs.
//!
//! Needs the peers from scripts/peers.sh (etcd, kube-apiserver, kubectl): ignored by plain
//! `cargo test`, run by scripts/test.sh.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use common::{Answer, server_with_static};
use control_plane::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use regbroker::sinks::secret_sync::{Config, Outcome, SecretSync};
use regbroker_provider::Registry;

const SECRET: &str = "regbroker-pull";
const NEEDS: &str =
    "needs etcd, kube-apiserver and kubectl from scripts/peers.sh; run scripts/test.sh";

/// The namespaces of one test: `apps` (where the Secret lives) and `regbroker` (where
/// its ServiceAccount lives), with the deploy/ RBAC applied between them.
struct Tenancy {
    apps: String,
    regbroker: String,
}

/// Applies deploy/standalone/rbac.yaml with its namespaces renamed to fresh ones.
async fn deployed_rbac(cp: &ControlPlane) -> Tenancy {
    let apps = cp.namespace("apps").await;
    let regbroker = cp.namespace("regbroker").await;
    let yaml = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/standalone/rbac.yaml"),
    )
    .unwrap();
    assert!(yaml.contains("namespace: apps") && yaml.contains("namespace: regbroker"));
    let yaml = yaml
        .replace("namespace: apps", &format!("namespace: {apps}"))
        .replace("namespace: regbroker", &format!("namespace: {regbroker}"));
    cp.apply(&yaml);
    Tenancy { apps, regbroker }
}

fn config(namespace: &str) -> Config {
    Config {
        secrets: vec![format!("{namespace}/{SECRET}").parse().unwrap()],
        entries: Vec::new(),
        extra: vec![Registry::parse("named.fake.test").unwrap()],
    }
}

/// `username:password` for `registry` in the Secret's docker config.
fn auth_in(secret: &Secret, registry: &str) -> Option<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let doc = &secret.data.as_ref()?.get(".dockerconfigjson")?.0;
    let doc: serde_json::Value = serde_json::from_slice(doc).unwrap();
    let auth = doc["auths"][registry]["auth"].as_str()?;
    Some(String::from_utf8(b64.decode(auth).unwrap()).unwrap())
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn deployed_service_account_creates_refreshes_restores_and_repairs_its_secret() {
    let cp = ControlPlane::shared();
    let ns = deployed_rbac(cp).await;
    let as_regbroker = cp.service_account_client(&ns.regbroker, "regbroker").await;
    let secrets = Api::<Secret>::namespaced(cp.admin(), &ns.apps);
    let (srv, _dir) = server_with_static().await;
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(1000))))
        .then(Answer::Credential(Some(Duration::from_secs(1000))));

    // Absent: created with the ownership label and type, holding every registry.
    let mut sync = SecretSync::start(srv.broker.clone(), config(&ns.apps), as_regbroker).await;
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Created), "{NEEDS}");
    let created = secrets.get(SECRET).await.unwrap();
    assert_eq!(
        created.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );
    assert_eq!(
        created.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        "regbroker"
    );
    assert_eq!(
        auth_in(&created, "static.example.com").unwrap(),
        "s-user:s-pw"
    );
    let first = auth_in(&created, "named.fake.test").unwrap();
    assert_eq!(first, "fake-user:fake-secret-1");
    assert_eq!(srv.fake.calls(), 1);

    // Nothing changed: no write (the resourceVersion stays).
    sync.refresh().await;
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Unchanged));
    assert_eq!(
        srv.fake.calls(),
        1,
        "served from the cache before the refresh point"
    );
    let unchanged = secrets.get(SECRET).await.unwrap();
    assert_eq!(
        unchanged.metadata.resource_version,
        created.metadata.resource_version
    );

    // Past the refresh point (0.8 of 970 s), well before expiry: updated in place.
    srv.clock.advance(Duration::from_secs(800));
    sync.refresh().await;
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Updated));
    assert_eq!(srv.fake.calls(), 2);
    let refreshed = secrets.get(SECRET).await.unwrap();
    assert_eq!(
        auth_in(&refreshed, "named.fake.test").unwrap(),
        "fake-user:fake-secret-2"
    );
    assert_eq!(refreshed.metadata.uid, created.metadata.uid, "same object");
    assert_ne!(
        refreshed.metadata.resource_version,
        created.metadata.resource_version
    );

    // Deleted behind regbroker's back: restored at the next pass.
    secrets
        .delete(SECRET, &DeleteParams::default())
        .await
        .unwrap();
    sync.refresh().await;
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Created));
    let restored = secrets.get(SECRET).await.unwrap();
    assert_ne!(restored.metadata.uid, created.metadata.uid);
    assert_eq!(
        auth_in(&restored, "named.fake.test").unwrap(),
        "fake-user:fake-secret-2"
    );

    // Edited by hand (the label kept): repaired at the next pass.
    let tampered = serde_json::json!({
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD
            .encode(r#"{"auths":{"named.fake.test":{"auth":"ZXZpbDpldmls"}}}"#)}
    });
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&tampered))
        .await
        .unwrap();
    sync.refresh().await;
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Updated));
    let repaired = secrets.get(SECRET).await.unwrap();
    assert_eq!(
        auth_in(&repaired, "named.fake.test").unwrap(),
        "fake-user:fake-secret-2"
    );
    assert_eq!(
        auth_in(&repaired, "static.example.com").unwrap(),
        "s-user:s-pw"
    );
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn secret_of_the_same_name_without_our_label_is_left_untouched() {
    let cp = ControlPlane::shared();
    // Unlabelled, and labelled as another manager's: both are someone else's.
    for labels in [None, Some(("app.kubernetes.io/managed-by", "Helm"))] {
        let ns = deployed_rbac(cp).await;
        let secrets = Api::<Secret>::namespaced(cp.admin(), &ns.apps);
        let theirs = Secret {
            metadata: ObjectMeta {
                name: Some(SECRET.into()),
                labels: labels.map(|(k, v)| BTreeMap::from([(k.to_string(), v.to_string())])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/dockerconfigjson".into()),
            data: Some(BTreeMap::from([(
                ".dockerconfigjson".to_string(),
                ByteString(br#"{"auths":{}}"#.to_vec()),
            )])),
            ..Default::default()
        };
        let before = secrets
            .create(&PostParams::default(), &theirs)
            .await
            .unwrap();
        let (srv, _dir) = server_with_static().await;
        let as_regbroker = cp.service_account_client(&ns.regbroker, "regbroker").await;

        let mut sync = SecretSync::start(srv.broker.clone(), config(&ns.apps), as_regbroker).await;
        sync.refresh().await;

        assert_eq!(
            sync.outcomes()[0].1,
            Some(Outcome::Foreign),
            "{labels:?}; {NEEDS}"
        );
        let after = secrets.get(SECRET).await.unwrap();
        assert_eq!(
            after.metadata.resource_version, before.metadata.resource_version,
            "{labels:?}: never written"
        );
        assert_eq!(after.data, before.data);
    }
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn deployed_rbac_refuses_other_secrets_listing_and_other_namespaces() {
    let cp = ControlPlane::shared();
    let ns = deployed_rbac(cp).await;
    let elsewhere = cp.namespace("elsewhere").await;
    let admin_secrets = Api::<Secret>::namespaced(cp.admin(), &ns.apps);
    let other = Secret {
        metadata: ObjectMeta {
            name: Some("someone-elses".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
        ..Default::default()
    };
    admin_secrets
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    let client = cp.service_account_client(&ns.regbroker, "regbroker").await;
    let in_apps = Api::<Secret>::namespaced(client.clone(), &ns.apps);
    let in_elsewhere = Api::<Secret>::namespaced(client, &elsewhere);

    // What it needs works: read and create its own Secret.
    assert!(in_apps.get_opt(SECRET).await.unwrap().is_none(), "{NEEDS}");

    // Another Secret in the same namespace: refused.
    let e = in_apps.get("someone-elses").await.unwrap_err();
    assert_eq!(status_code(&e), Some(403), "{e}");
    // Listing (which would read every Secret): refused.
    let e = in_apps.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(status_code(&e), Some(403), "{e}");
    // Writing or reading in another namespace: refused.
    let mine = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let e = in_elsewhere
        .create(&PostParams::default(), &mine)
        .await
        .unwrap_err();
    assert_eq!(status_code(&e), Some(403), "{e}");
    let e = in_elsewhere.get(SECRET).await.unwrap_err();
    assert_eq!(status_code(&e), Some(403), "{e}");
    // Updating someone else's Secret by name: refused.
    let mut theirs = admin_secrets.get("someone-elses").await.unwrap();
    theirs.string_data = Some(BTreeMap::from([("k".to_string(), "stolen".to_string())]));
    let e = in_apps
        .replace("someone-elses", &PostParams::default(), &theirs)
        .await
        .unwrap_err();
    assert_eq!(status_code(&e), Some(403), "{e}");
}
