//! Per-Secret identity in the Secret sync (issue 15.4 and 15.6), on a real kube-apiserver
//! with moto: each `[[secret]]` entry holds only its own registries, fetched with its own
//! ServiceAccount's token from TokenRequest (audience `sts.amazonaws.com`), and moto's
//! `AssumeRoleWithWebIdentity` maps each tenant's role to its own account, so two tenants
//! pulling from one registry host get credentials a test can tell apart.
//!
//! The sync runs in-process as a ServiceAccount whose Role grants `get` on the tenants'
//! ServiceAccounts and `create` on `serviceaccounts/token` for the named ones only
//! (`resourceNames`), plus the Secrets, as `deploy/tenants/rbac.yaml` does.
//! moto does not check trust policies or token signatures (see `workload_identity.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "aws")]

mod common;
mod control_plane;
mod registry_peer;

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use control_plane::ControlPlane;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use regbroker::broker::Broker;
use regbroker::broker::providers::Providers;
use regbroker::broker::routing::Router;
use regbroker::broker::static_secret;
use regbroker::metrics::Metrics;
use regbroker::sinks::secret_sync::{Config, Entry, Outcome, SecretRef, SecretSync, Tokens};
use regbroker_provider::Registry;
use registry_peer::{Emulator, moto};

const HOST: &str = "555555555555.dkr.ecr.us-east-1.amazonaws.com";
const OTHER_HOST: &str = "666666666666.dkr.ecr.us-east-1.amazonaws.com";
const ROLE_A: &str = "arn:aws:iam::111111111111:role/team-a-puller";
const ROLE_B: &str = "arn:aws:iam::222222222222:role/team-b-puller";
const SECRET: &str = "regbroker-pull";

/// A broker whose only provider is AWS, every endpoint moto, and this process's own
/// identity absent: a workload's pull can only be its own.
fn broker(moto: &Emulator, metrics: Arc<Metrics>) -> Arc<Broker> {
    let aws = regbroker_aws::AwsProvider::builder()
        .endpoint_url(format!("http://{}", moto.addr))
        .build();
    Arc::new(Broker::new(
        Arc::new(static_secret::Store::empty(metrics.clone())),
        Router::new(Vec::new()),
        Providers::new(vec![Arc::new(aws)]),
        Default::default(),
        metrics,
        regbroker_provider::system_clock(),
    ))
}

/// ServiceAccount `namespace/puller` with `annotations`.
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

/// The tenant RBAC of `deploy/tenants/rbac.yaml`, applied to `tenant` for the
/// syncing ServiceAccount `regbroker/regbroker`.
fn tenant_rbac(cp: &ControlPlane, tenant: &str, regbroker: &str) {
    let yaml = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/tenants/rbac.yaml"),
    )
    .unwrap();
    assert!(yaml.contains("namespace: team-a") && yaml.contains("namespace: regbroker"));
    cp.apply(
        &yaml
            .replace("namespace: team-a", &format!("namespace: {tenant}"))
            .replace("namespace: regbroker", &format!("namespace: {regbroker}")),
    );
}

/// Every `auths` entry of the Secret: registry -> password.
async fn auths(cp: &ControlPlane, namespace: &str) -> BTreeMap<String, String> {
    let s = Api::<Secret>::namespaced(cp.admin(), namespace)
        .get(SECRET)
        .await
        .unwrap();
    let raw = &s.data.unwrap()[".dockerconfigjson"].0;
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

/// Every log line of this test binary, at TRACE under the caps `serve` applies.
fn logs() -> regbroker_provider::test_util::LogCapture {
    static CAPTURE: std::sync::OnceLock<regbroker_provider::test_util::LogCapture> =
        std::sync::OnceLock::new();
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

fn entry(namespace: &str, registries: &[&str]) -> Entry {
    Entry {
        secret: SecretRef {
            namespace: namespace.to_string(),
            name: SECRET.to_string(),
        },
        registries: registries
            .iter()
            .map(|r| Registry::parse(r).unwrap())
            .collect(),
        service_account: Some("puller".to_string()),
    }
}

#[tokio::test]
#[ignore = "needs moto_server, etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn each_secret_holds_only_its_own_registries_with_its_own_identity() {
    let logs = logs();
    let cp = ControlPlane::shared();
    let (a, b, c) = (
        cp.namespace("team-a").await,
        cp.namespace("team-b").await,
        cp.namespace("team-c").await,
    );
    let regbroker = cp.namespace("regbroker").await;
    service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
    service_account(cp, &b, &[("eks.amazonaws.com/ecr-role-arn", ROLE_B)]).await;
    // team-c forgot its annotation: it must get nothing, not the sync's own identity.
    service_account(cp, &c, &[]).await;
    for t in [&a, &b, &c] {
        tenant_rbac(cp, t, &regbroker);
    }
    let moto = moto();
    let client = cp.service_account_client(&regbroker, "regbroker").await;
    let config = Config {
        entries: vec![
            entry(&a, &[HOST, OTHER_HOST]),
            entry(&b, &[HOST]),
            entry(&c, &[HOST]),
        ],
        ..Default::default()
    };
    let metrics = Arc::new(Metrics::new());
    let sync = SecretSync::start(broker(&moto, metrics.clone()), config, client).await;
    let outcomes: Vec<Option<Outcome>> = sync.outcomes().into_iter().map(|(_, o)| o).collect();
    assert_eq!(
        outcomes,
        vec![Some(Outcome::Created); 3],
        "every Secret written"
    );

    let in_a = auths(cp, &a).await;
    let in_b = auths(cp, &b).await;
    assert_eq!(
        in_a,
        BTreeMap::from([
            (HOST.to_string(), "111111111111-auth-token".to_string()),
            (
                OTHER_HOST.to_string(),
                "111111111111-auth-token".to_string()
            ),
        ]),
        "team-a: its two registries, its own role's token"
    );
    assert_eq!(
        in_b,
        BTreeMap::from([(HOST.to_string(), "222222222222-auth-token".to_string())]),
        "team-b: only its registry, its own role's token"
    );
    assert!(
        auths(cp, &c).await.is_empty(),
        "team-c has no identity: nothing"
    );
    let state = moto.get("/moto-api/data.json");
    for ns in [&a, &b] {
        assert!(
            state.contains(&format!("regbroker-{ns}-puller")),
            "no session for {ns}"
        );
    }
    // Neither a ServiceAccount token (every JWT the API server issues starts with this
    // header) nor a credential reached a log line, at TRACE.
    let text = logs.text();
    assert!(
        text.contains("Requested a ServiceAccount token"),
        "the sync logged nothing?"
    );
    assert!(!text.contains("eyJhbGciOi"), "a JWT in the log");
    assert!(!text.contains("auth-token"), "a credential in the log");
    // Metrics count the fetches, and name no ServiceAccount, role or credential. A tenant's
    // namespace appears only where the operator configured it: in the `sink` label naming
    // the Secret a sink keeps (`secret/NAMESPACE/NAME`), and nowhere else.
    let encoded = metrics.encode();
    assert!(encoded.contains("regbroker_"), "{encoded}");
    let mut exposed = encoded.clone();
    for ns in [a.as_str(), b.as_str(), c.as_str()] {
        let label = format!("sink=\"secret/{ns}/regbroker-pull\"");
        assert!(
            encoded.contains(&label),
            "no sink series for {ns}:\n{encoded}"
        );
        exposed = exposed.replace(&label, "sink=\"\"");
    }
    for never in [
        a.as_str(),
        b.as_str(),
        c.as_str(),
        "puller",
        "role/",
        "auth-token",
        "eyJ",
    ] {
        assert!(
            !exposed.contains(never),
            "{never} in the metrics:\n{exposed}"
        );
    }
}

#[tokio::test]
#[ignore = "needs moto_server, etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn the_tenant_rbac_allows_the_named_service_account_only() {
    let cp = ControlPlane::shared();
    let a = cp.namespace("team-a").await;
    let regbroker = cp.namespace("regbroker").await;
    tenant_rbac(cp, &a, &regbroker);
    service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
    let other = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("admin-bot".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(cp.admin(), &a)
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    let client = cp.service_account_client(&regbroker, "regbroker").await;
    let api = Api::<ServiceAccount>::namespaced(client, &a);
    let request = k8s_openapi::api::authentication::v1::TokenRequest {
        spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
            audiences: vec!["sts.amazonaws.com".into()],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let ok = api
        .create_token_request("puller", &PostParams::default(), &request)
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    let refused = api
        .create_token_request("admin-bot", &PostParams::default(), &request)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused:?}"
    );
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn service_account_tokens_have_the_clouds_audience_and_are_reused_while_young() {
    use regbroker_provider::ExposeSecret;
    let cp = ControlPlane::shared();
    let a = cp.namespace("team-a").await;
    service_account(
        cp,
        &a,
        &[("eks.amazonaws.com/role-arn", ROLE_A), ("other/key", "x")],
    )
    .await;
    let tokens = Tokens::new(cp.admin());
    let (uid, annotations) = tokens.account(&a, "puller").await.unwrap();
    assert!(!uid.is_empty());
    assert_eq!(
        annotations,
        BTreeMap::from([("eks.amazonaws.com/role-arn".to_string(), ROLE_A.to_string())]),
        "only identity annotations reach a provider"
    );
    let sts = tokens
        .token(&a, "puller", &uid, "sts.amazonaws.com")
        .await
        .unwrap();
    let claims = regbroker_provider::diagnosis::Claims::of_jwt(sts.expose_secret()).unwrap();
    assert_eq!(claims.audiences, vec!["sts.amazonaws.com"]);
    assert_eq!(
        claims.subject.as_deref(),
        Some(format!("system:serviceaccount:{a}:puller").as_str())
    );
    let life = claims
        .expires_at
        .unwrap()
        .duration_since(claims.issued_at.unwrap())
        .unwrap();
    assert_eq!(life, std::time::Duration::from_secs(3600));
    // The same key again: the kept token, not a new request.
    let again = tokens
        .token(&a, "puller", &uid, "sts.amazonaws.com")
        .await
        .unwrap();
    assert_eq!(again.expose_secret(), sts.expose_secret());
    // Another audience is another token.
    let entra = tokens
        .token(&a, "puller", &uid, "api://AzureADTokenExchange")
        .await
        .unwrap();
    let claims = regbroker_provider::diagnosis::Claims::of_jwt(entra.expose_secret()).unwrap();
    assert_eq!(claims.audiences, vec!["api://AzureADTokenExchange"]);
    // A ServiceAccount that does not exist is identity_missing, naming it.
    let e = tokens.account(&a, "nobody").await.unwrap_err();
    assert_eq!(e.kind(), regbroker_provider::ErrorKind::IdentityMissing);
    assert!(e.message().contains("nobody"), "{e}");
}

#[tokio::test]
#[ignore = "needs moto_server, etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn a_token_no_secret_asks_for_any_more_is_forgotten_after_the_pass() {
    // Issue 30, finding 5: a recreated ServiceAccount (a new UID) is a new token key; the
    // old key's token is no one's after the next pass and must not stay in memory.
    let cp = ControlPlane::shared();
    let a = cp.namespace("team-a").await;
    let regbroker = cp.namespace("regbroker").await;
    service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
    tenant_rbac(cp, &a, &regbroker);
    let moto = moto();
    let client = cp.service_account_client(&regbroker, "regbroker").await;
    let config = Config {
        entries: vec![entry(&a, &[HOST])],
        ..Default::default()
    };
    let metrics = Arc::new(Metrics::new());
    let mut sync = SecretSync::start(broker(&moto, metrics), config, client).await;
    assert_eq!(sync.kept_tokens().await, 1);
    for round in 0..3 {
        Api::<ServiceAccount>::namespaced(cp.admin(), &a)
            .delete("puller", &Default::default())
            .await
            .unwrap();
        service_account(cp, &a, &[("eks.amazonaws.com/role-arn", ROLE_A)]).await;
        sync.refresh().await;
        assert_eq!(
            auths(cp, &a).await,
            BTreeMap::from([(HOST.to_string(), "111111111111-auth-token".to_string())]),
            "round {round}: the Secret is still written with the tenant's own identity"
        );
        assert_eq!(
            sync.kept_tokens().await,
            1,
            "round {round}: only the current ServiceAccount's token is kept"
        );
    }
}
