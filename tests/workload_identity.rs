//! Per-workload identity (issue 15) in the kubelet credential provider (KEP-4412), against
//! real peers: a real kube-apiserver issues each ServiceAccount's token (TokenRequest,
//! audience `sts.amazonaws.com`), and moto answers STS `AssumeRoleWithWebIdentity` and
//! ECR `GetAuthorizationToken`. moto maps an assumed role to the role's own account and
//! names that account in the ECR password (`<account>-auth-token`), so two tenants pulling
//! from one registry host get credentials a test can tell apart.
//!
//! What moto does not do: check a role's trust policy or the token's signature. So a
//! tenant naming another tenant's role is not refused here as AWS would refuse it; what
//! these tests prove is regbroker's own part: each tenant's pull is exchanged with its
//! own token (moto records the session named after its ServiceAccount), never served from
//! another ServiceAccount's cache entry, and never falls back to the node's identity.
//!
//! Each call runs the real binary (`regbroker kubelet-credential-provider`) as the kubelet
//! would, with a disk cache shared by every call (`REGBROKER_CACHE_DIR`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod registry_peer;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::process::{CLI_BOUND, run_bounded};
use control_plane::ControlPlane;
use registry_peer::{Emulator, moto};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

/// One registry host both tenants pull from.
const IMAGE: &str = "555555555555.dkr.ecr.us-east-1.amazonaws.com/shared/app:1.0";
const HOST: &str = "555555555555.dkr.ecr.us-east-1.amazonaws.com";
const ROLE_A: &str = "arn:aws:iam::111111111111:role/team-a-puller";
const ROLE_B: &str = "arn:aws:iam::222222222222:role/team-b-puller";
const ECR_ROLE: &str = "eks.amazonaws.com/ecr-role-arn";

struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

/// One kubelet call: `request` on stdin, the node's own identity in the env (static keys
/// of moto's default account), moto as every AWS endpoint, and `cache` as the disk cache.
fn kubelet(moto: &Emulator, cache: &Path, request: &serde_json::Value) -> Run {
    let home = tempfile::tempdir().unwrap();
    let out = run_bounded(
        Command::new(BIN)
            .arg("kubelet-credential-provider")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", home.path())
            .env("RUST_LOG", "trace")
            .env("AWS_ENDPOINT_URL", format!("http://{}", moto.addr))
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ACCESS_KEY_ID", "AKIANODEIDENTITY0001")
            .env("AWS_SECRET_ACCESS_KEY", "node-secret-key")
            .env("AWS_REGION", "us-east-1")
            .env("REGBROKER_CACHE_DIR", cache),
        Some(request.to_string().as_bytes()),
        CLI_BOUND,
    );
    Run {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn request(token: Option<&str>, annotations: &[(&str, &str)]) -> serde_json::Value {
    let mut r = serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderRequest",
        "image": IMAGE,
    });
    if let Some(t) = token {
        r["serviceAccountToken"] = t.into();
        r["serviceAccountAnnotations"] = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    r
}

/// The password the kubelet got for [`HOST`], or a panic quoting the run.
fn password(run: &Run) -> String {
    assert_eq!(
        run.code,
        Some(0),
        "stdout: {}\nstderr: {}",
        run.out,
        run.err
    );
    let v: serde_json::Value = serde_json::from_str(&run.out).unwrap();
    v["auth"][HOST]["password"]
        .as_str()
        .unwrap_or_else(|| panic!("no credential for {HOST}: {}", run.out))
        .to_string()
}

/// No part of `token` (a JWT) in the run's output, its log, or any file of the cache.
fn assert_token_nowhere(token: &str, runs: &[&Run], cache: &Path) {
    let mut files = String::new();
    for e in std::fs::read_dir(cache).unwrap() {
        files.push_str(&String::from_utf8_lossy(
            &std::fs::read(e.unwrap().path()).unwrap(),
        ));
    }
    for part in token.split('.').filter(|p| p.len() > 8) {
        for r in runs {
            assert!(!r.out.contains(part), "token in stdout: {}", r.out);
            assert!(!r.err.contains(part), "token in the log: {}", r.err);
        }
        assert!(!files.contains(part), "token in the disk cache");
    }
}

fn private_cache() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    dir
}

#[tokio::test]
#[ignore = "needs moto_server, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn each_workload_pulls_with_its_own_role_and_never_anothers() {
    let cp = ControlPlane::shared();
    let (ns_a, ns_b) = (cp.namespace("team-a").await, cp.namespace("team-b").await);
    let token_a = cp
        .service_account_token(&ns_a, "puller", &["sts.amazonaws.com"])
        .await;
    let token_b = cp
        .service_account_token(&ns_b, "puller", &["sts.amazonaws.com"])
        .await;
    let moto = moto();
    let cache = private_cache();

    // The node's own identity (no token): moto names the registry's account.
    let node = kubelet(&moto, cache.path(), &request(None, &[]));
    assert_eq!(password(&node), "555555555555-auth-token");

    // Each tenant, same host: its own role's account, not the node's.
    let a = kubelet(
        &moto,
        cache.path(),
        &request(Some(&token_a), &[(ECR_ROLE, ROLE_A)]),
    );
    let b = kubelet(
        &moto,
        cache.path(),
        &request(Some(&token_b), &[(ECR_ROLE, ROLE_B)]),
    );
    assert_eq!(password(&a), "111111111111-auth-token");
    assert_eq!(password(&b), "222222222222-auth-token");
    let state = moto.get("/moto-api/data.json");
    for ns in [&ns_a, &ns_b] {
        let session = format!("regbroker-{ns}-puller");
        assert!(state.contains(&session), "moto saw no session {session}");
    }

    // Again, now that the disk cache holds all three: each still gets its own.
    let a2 = kubelet(
        &moto,
        cache.path(),
        &request(Some(&token_a), &[(ECR_ROLE, ROLE_A)]),
    );
    let b2 = kubelet(
        &moto,
        cache.path(),
        &request(Some(&token_b), &[(ECR_ROLE, ROLE_B)]),
    );
    let node2 = kubelet(&moto, cache.path(), &request(None, &[]));
    assert_eq!(password(&a2), "111111111111-auth-token");
    assert_eq!(password(&b2), "222222222222-auth-token");
    assert_eq!(password(&node2), "555555555555-auth-token");
    assert_eq!(
        std::fs::read_dir(cache.path()).unwrap().count(),
        3,
        "one disk cache entry per identity: node, team-a, team-b"
    );
    assert_token_nowhere(&token_a, &[&a, &a2, &b, &b2], cache.path());
    assert_token_nowhere(&token_b, &[&a, &a2, &b, &b2], cache.path());

    // IRSA's annotation (Flux's key) works as well when the kubelet plugin's is absent.
    let irsa = kubelet(
        &moto,
        cache.path(),
        &request(Some(&token_a), &[("eks.amazonaws.com/role-arn", ROLE_A)]),
    );
    assert_eq!(password(&irsa), "111111111111-auth-token");
}

#[tokio::test]
#[ignore = "needs moto_server, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn a_tenant_naming_another_tenants_role_never_gets_its_cached_credential() {
    let cp = ControlPlane::shared();
    let (ns_a, ns_b) = (cp.namespace("team-a").await, cp.namespace("team-b").await);
    let token_a = cp
        .service_account_token(&ns_a, "puller", &["sts.amazonaws.com"])
        .await;
    let token_b = cp
        .service_account_token(&ns_b, "puller", &["sts.amazonaws.com"])
        .await;
    let moto = moto();
    let cache = private_cache();
    let b = kubelet(
        &moto,
        cache.path(),
        &request(Some(&token_b), &[(ECR_ROLE, ROLE_B)]),
    );
    assert_eq!(password(&b), "222222222222-auth-token");
    let before = moto
        .get("/moto-api/data.json")
        .matches(&format!("regbroker-{ns_a}-puller"))
        .count();
    assert_eq!(before, 0);

    // team-a's ServiceAccount annotated with team-b's role: not a cache hit on team-b's
    // entry, but an exchange of team-a's own token (AWS would refuse it by the role's
    // trust policy; moto does not check trust policies).
    let forged = kubelet(
        &moto,
        cache.path(),
        &request(Some(&token_a), &[(ECR_ROLE, ROLE_B)]),
    );
    assert_eq!(forged.code, Some(0), "{}", forged.err);
    assert!(
        moto.get("/moto-api/data.json")
            .contains(&format!("regbroker-{ns_a}-puller")),
        "team-a's token was not exchanged: the answer came from another entry"
    );
    assert_eq!(
        std::fs::read_dir(cache.path()).unwrap().count(),
        2,
        "team-a's attempt has an entry of its own"
    );
}

#[tokio::test]
#[ignore = "needs moto_server, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn a_bad_or_missing_annotation_is_an_error_never_the_nodes_identity() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("team-c").await;
    let token = cp
        .service_account_token(&ns, "puller", &["sts.amazonaws.com"])
        .await;
    let moto = moto();
    let cache = private_cache();
    for (annotations, needle) in [
        (vec![(ECR_ROLE, "team-c-puller")], ECR_ROLE),
        (
            vec![(
                "eks.amazonaws.com/role-arn",
                "arn:aws:iam::123456789012:user/bob",
            )],
            "eks.amazonaws.com/role-arn",
        ),
        (
            // A malformed kubelet-plugin annotation is not skipped for IRSA's.
            vec![
                (ECR_ROLE, "nonsense"),
                ("eks.amazonaws.com/role-arn", ROLE_A),
            ],
            ECR_ROLE,
        ),
        (vec![], "Pod Identity cannot act"),
    ] {
        let run = kubelet(&moto, cache.path(), &request(Some(&token), &annotations));
        assert_eq!(run.code, Some(1), "{annotations:?}: {}", run.out);
        assert!(run.out.is_empty(), "{}", run.out);
        assert!(run.err.contains(needle), "{annotations:?}: {}", run.err);
        assert!(run.err.contains(&format!("{ns}/puller")), "{}", run.err);
        assert_token_nowhere(&token, &[&run], cache.path());
    }
    assert_eq!(
        std::fs::read_dir(cache.path()).unwrap().count(),
        0,
        "nothing was fetched, not even with the node's identity"
    );
}

#[tokio::test]
#[ignore = "needs moto_server: run scripts/test.sh"]
async fn a_token_that_is_not_a_service_account_token_is_refused() {
    let moto = moto();
    let cache = private_cache();
    let forged = regbroker_provider::test_util::jwt(&serde_json::json!({
        "sub": "system:serviceaccount:team-b:puller",
        "kubernetes.io": {"namespace": "team-a", "serviceaccount": {"name": "puller", "uid": "u"}},
    }));
    for (token, needle) in [("not-a-jwt", "not a JWT"), (forged.as_str(), "`sub`")] {
        let run = kubelet(
            &moto,
            cache.path(),
            &request(Some(token), &[(ECR_ROLE, ROLE_A)]),
        );
        assert_eq!(run.code, Some(1), "{}", run.out);
        assert!(run.err.contains("serviceAccountToken"), "{}", run.err);
        assert!(run.err.contains(needle), "{}", run.err);
        assert!(!run.err.contains(token), "{}", run.err);
    }
}

/// Tried as a new user would: two processes with different AWS keys sharing one
/// `REGBROKER_CACHE_DIR` used to read each other's entry (the scope was
/// `default|region|account` whatever the identity). Each identity now has its own entry.
#[tokio::test]
#[ignore = "needs moto_server: run scripts/test.sh"]
async fn two_aws_identities_sharing_a_disk_cache_never_share_an_entry() {
    let moto = moto();
    let cache = private_cache();
    let helper = |key_id: &str| {
        let home = tempfile::tempdir().unwrap();
        let out = run_bounded(
            Command::new(BIN)
                .args(["credential-helper", "get"])
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("HOME", home.path())
                .env("AWS_ENDPOINT_URL", format!("http://{}", moto.addr))
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("AWS_ACCESS_KEY_ID", key_id)
                .env("AWS_SECRET_ACCESS_KEY", "secret-of-the-key")
                .env("REGBROKER_CACHE_DIR", cache.path()),
            Some(HOST.as_bytes()),
            CLI_BOUND,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::fs::read_dir(cache.path()).unwrap().count()
    };
    assert_eq!(helper("AKIAFIRSTIDENTITY001"), 1);
    assert_eq!(
        helper("AKIAFIRSTIDENTITY001"),
        1,
        "the same identity shares its entry"
    );
    assert_eq!(
        helper("AKIASECONDIDENTITY01"),
        2,
        "another identity gets its own"
    );
    let records: BTreeMap<_, _> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.clone(), std::fs::read_to_string(p).unwrap())
        })
        .collect();
    for text in records.values() {
        assert!(!text.contains("secret-of-the-key"), "{text}");
        assert!(
            !text.contains("AKIA"),
            "a key id is fingerprinted, not written: {text}"
        );
    }
}
