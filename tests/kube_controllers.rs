//! What the real kube-controller-manager does for the objects regbroker will write
//! (tests/control_plane's `ControlPlane::shared_with_controllers`): the garbage collector
//! deletes a Secret whose controller owner is gone, in the background or before the
//! owner under foreground deletion; the namespace controller empties and removes a
//! deleted namespace; ClusterRole aggregation copies the rules of a ClusterRole labelled
//! `rbac.authorization.k8s.io/aggregate-to-view` / `-edit` into the built-in `view`,
//! `edit` and `admin` roles, and takes them out again when that role goes.
//!
//! The API server alone does none of this (without the controller-manager a deleted
//! namespace stays Terminating and `view` has no rules), so each test waits for the
//! effect with a bound and fails naming what did not happen.
//!
//! Needs the peers from scripts/peers.sh (etcd, kube-apiserver, kube-controller-manager):
//! ignored by plain `cargo test`, run by scripts/test.sh.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use control_plane::ControlPlane;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams};

/// How long a controller may take to act. The garbage collector, the namespace controller
/// and aggregation act within about a second here; this is room for a busy 2-core machine.
const BOUND: Duration = Duration::from_secs(60);

const VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";
const EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";

/// Polls `check` every 200 ms until it returns `Some`, for at most [`BOUND`]; panics
/// naming `what` and quoting kube-controller-manager's last log lines when it never does.
async fn eventually<T, F, Fut>(cp: &ControlPlane, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "not within {} s: {what}. kube-controller-manager's last lines:\n{}",
                BOUND.as_secs(),
                cp.controller_manager_log_tail()
                    .unwrap_or_else(|| "(not running)".into())
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A name unique in this run, for cluster-scoped objects.
fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A ConfigMap standing in for the owner (the coming `RegistryCredential`).
fn owner(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A Secret named `name` whose controller is `owner` (as kube-rs'
/// `Resource::controller_owner_ref` makes it: `controller` and `blockOwnerDeletion`).
fn secret_controlled_by(name: &str, owner: &ConfigMap) -> Secret {
    let reference = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.metadata.name.clone().unwrap(),
        uid: owner
            .metadata
            .uid
            .clone()
            .expect("the owner as the server stored it"),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: Some(vec![reference]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn unowned_secret(name: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A ClusterRole holding `rule`, labelled `label: "true"`.
fn labelled_role(name: &str, label: &str, rule: PolicyRule) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(label.to_string(), "true".to_string())])),
            ..Default::default()
        },
        rules: Some(vec![rule]),
        ..Default::default()
    }
}

fn rule(group: &str, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec!["registrycredentials".into()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

/// Whether ClusterRole `name` holds `rule` now.
async fn holds(roles: &Api<ClusterRole>, name: &str, rule: &PolicyRule) -> bool {
    let role = roles.get(name).await.unwrap();
    role.rules.unwrap_or_default().contains(rule)
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and kube-controller-manager from scripts/peers.sh; run scripts/test.sh"]
async fn a_secret_whose_controller_owner_is_deleted_is_garbage_collected() {
    let cp = ControlPlane::shared_with_controllers();
    let ns = cp.namespace("gc-background").await;
    let config_maps = Api::<ConfigMap>::namespaced(cp.admin(), &ns);
    let secrets = Api::<Secret>::namespaced(cp.admin(), &ns);
    let pp = PostParams::default();
    let credential = config_maps.create(&pp, &owner("credential")).await.unwrap();
    secrets
        .create(&pp, &secret_controlled_by("credential-pull", &credential))
        .await
        .unwrap();
    secrets
        .create(&pp, &unowned_secret("hand-written"))
        .await
        .unwrap();

    // The default propagation for a ConfigMap: the owner goes at once, the collector
    // deletes what it owned afterwards.
    config_maps
        .delete("credential", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        cp,
        "the garbage collector deletes the Secret of a deleted owner",
        || async {
            secrets
                .get_opt("credential-pull")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        secrets.get_opt("hand-written").await.unwrap().is_some(),
        "a Secret without an owner must stay"
    );
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and kube-controller-manager from scripts/peers.sh; run scripts/test.sh"]
async fn foreground_deletion_removes_the_owned_secret_before_its_owner() {
    let cp = ControlPlane::shared_with_controllers();
    let ns = cp.namespace("gc-foreground").await;
    let config_maps = Api::<ConfigMap>::namespaced(cp.admin(), &ns);
    let secrets = Api::<Secret>::namespaced(cp.admin(), &ns);
    let pp = PostParams::default();
    let credential = config_maps.create(&pp, &owner("credential")).await.unwrap();
    secrets
        .create(&pp, &secret_controlled_by("credential-pull", &credential))
        .await
        .unwrap();

    // `kubectl delete --cascade=foreground`: the owner stays, marked deleted with the
    // `foregroundDeletion` finalizer, until the collector has deleted what it blocks.
    let marked = config_maps
        .delete("credential", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .expect("the owner is kept, marked deleted");
    assert_eq!(
        marked.metadata.finalizers.as_deref(),
        Some(&["foregroundDeletion".to_string()][..])
    );
    eventually(
        cp,
        "foreground deletion of the owner completes (the collector removes its finalizer)",
        || async {
            config_maps
                .get_opt("credential")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        secrets.get_opt("credential-pull").await.unwrap().is_none(),
        "the owner went while the Secret it blocks was still there"
    );
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and kube-controller-manager from scripts/peers.sh; run scripts/test.sh"]
async fn a_deleted_namespace_is_emptied_and_removed() {
    let cp = ControlPlane::shared_with_controllers();
    let ns = cp.namespace("doomed").await;
    Api::<Secret>::namespaced(cp.admin(), &ns)
        .create(&PostParams::default(), &unowned_secret("left-behind"))
        .await
        .unwrap();
    let namespaces = Api::<Namespace>::all(cp.admin());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        cp,
        "the namespace controller removes a deleted namespace (it stays Terminating without it)",
        || async {
            namespaces
                .get_opt(&ns)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver and kube-controller-manager from scripts/peers.sh; run scripts/test.sh"]
async fn roles_labelled_aggregate_to_view_and_edit_reach_the_built_in_roles() {
    let cp = ControlPlane::shared_with_controllers();
    let roles = Api::<ClusterRole>::all(cp.admin());
    let pp = PostParams::default();
    let group = format!("{}.regbroker.test", unique("aggregation"));
    let read = rule(&group, &["get", "list", "watch"]);
    let write = rule(&group, &["create", "update", "patch", "delete"]);
    let viewer = unique("regbroker-test-view");
    let editor = unique("regbroker-test-edit");

    // The built-in roles are aggregated too: `view` is empty in the API server's bootstrap
    // policy and gets the rules of `system:aggregate-to-view` from the controller.
    eventually(
        cp,
        "`view` holds the bootstrap rules (read pods)",
        || async {
            let rules = roles.get("view").await.unwrap().rules.unwrap_or_default();
            rules
                .iter()
                .any(|r| {
                    r.api_groups.as_deref() == Some(&[String::new()])
                        && r.resources
                            .as_deref()
                            .unwrap_or_default()
                            .contains(&"pods".into())
                        && r.verbs.contains(&"get".into())
                })
                .then_some(())
        },
    )
    .await;

    roles
        .create(&pp, &labelled_role(&viewer, VIEW, read.clone()))
        .await
        .unwrap();
    roles
        .create(&pp, &labelled_role(&editor, EDIT, write.clone()))
        .await
        .unwrap();
    // `view` is itself labelled aggregate-to-edit, and `edit` aggregate-to-admin, so the
    // read rule flows on to `edit` and `admin`.
    for (role, rule, what) in [
        ("view", &read, "the aggregate-to-view rule"),
        ("edit", &read, "the aggregate-to-view rule (through `view`)"),
        ("edit", &write, "the aggregate-to-edit rule"),
        (
            "admin",
            &read,
            "the aggregate-to-view rule (through `edit`)",
        ),
        (
            "admin",
            &write,
            "the aggregate-to-edit rule (through `edit`)",
        ),
    ] {
        eventually(cp, &format!("`{role}` holds {what}"), || async {
            holds(&roles, role, rule).await.then_some(())
        })
        .await;
    }
    assert!(
        !holds(&roles, "view", &write).await,
        "`view` must not get the aggregate-to-edit rule"
    );

    // Deleting the labelled role takes its rule out again (uninstalling a CRD's roles).
    roles
        .delete(&viewer, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        cp,
        "`view` no longer holds the deleted role's rule",
        || async { (!holds(&roles, "view", &read).await).then_some(()) },
    )
    .await;
    roles
        .delete(&editor, &DeleteParams::default())
        .await
        .unwrap();
}
