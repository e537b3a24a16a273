//! Kubelet mode as the kubelet really runs it: the shipped `deploy/kubelet/` configs loaded
//! by the kubelet's own credential-provider plugin code (`kubelet-credential-harness`,
//! built by `scripts/peers.sh` from `k8s.io/kubernetes/pkg/credentialprovider/plugin` at
//! kube-apiserver's version), with a plugin bin dir of symlinks to this build's `regbroker`
//! under the names the configs use. The harness registers the plugins (the kubelet's
//! validation included), then, per image and pod, runs the keyring lookup the kubelet runs
//! before a pull: ServiceAccount from the real API server, token from the kubelet's token
//! manager (a TokenRequest bound to the pod, for the provider entry's audience), the
//! kubelet's cache across lookups of one process. The tests assert on what it reports.
//!
//! Changed in the shipped configs, and only that (each change is asserted to apply):
//! the cache directory (`/var/lib/kubelet/...` becomes a temporary one) and, for Google,
//! the placeholder audience (`my-pool/providers/my-cluster`, which the config says to
//! replace with your provider) becomes the fake's provider. The clouds' endpoints are
//! moved to loopback through the kubelet's own environment, which the kubelet passes on to
//! every plugin: moto for AWS STS and ECR, the fakes of `cloud_fakes` for Entra ID + ACR
//! and Google STS + IAM Credentials (which check each token with the API server's
//! TokenReview).
//!
//! The set-up and the harness run are in `kubelet_support` (shared with
//! `kubelet_plugin_federated.rs`, the federated providers under the same code); an added
//! provider is an entry and a regbroker config away: [`Kubelet::with_provider`] and
//! [`Kubelet::file`].

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(all(feature = "azure", feature = "gcp"))]

mod cloud_fakes;
mod common;
mod control_plane;
mod kubelet_support;
mod registry_peer;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use cloud_fakes::*;
use common::process::{PEER_CLIENT_BOUND, run_bounded};
use control_plane::{ControlPlane, Peers};
use kubelet_support::{Kubelet, assert_token_unlogged, for_pod, workload};
use serde_json::json;

const WORKLOAD_CONFIG: &str = "deploy/kubelet/credential-provider-config-workload.yaml";
const NODE_CONFIG: &str = "deploy/kubelet/credential-provider-config.yaml";

const ECR_IMAGE: &str = "555555555555.dkr.ecr.us-east-1.amazonaws.com/shared/app:1.0";
const ROLE_A: &str = "arn:aws:iam::111111111111:role/team-a-puller";
const ROLE_B: &str = "arn:aws:iam::222222222222:role/team-b-puller";
const ECR_ROLE: &str = "eks.amazonaws.com/ecr-role-arn";
/// The audience the shipped workload config asks for Google (a placeholder to replace).
const SHIPPED_GCP_AUDIENCE: &str = "//iam.googleapis.com/projects/123456789/locations/global/workloadIdentityPools/my-pool/providers/my-cluster";
const WIP: &str = "gcp.auth.fluxcd.io/workload-identity-provider";
const GSA: &str = "iam.gke.io/gcp-service-account";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, moto_server, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn ecr_workloads_each_get_their_own_role_through_the_kubelets_cache() {
    let cp = ControlPlane::shared();
    let (a, b, c) = (
        cp.namespace("kp-ecr-a").await,
        cp.namespace("kp-ecr-b").await,
        cp.namespace("kp-ecr-c").await,
    );
    let uid_a = workload(cp, &a, "app", &[(ECR_ROLE, ROLE_A)]).await;
    workload(cp, &b, "app", &[(ECR_ROLE, ROLE_B)]).await;
    workload(cp, &c, "app", &[]).await;
    let moto = moto_peer();
    let kubelet = Kubelet::shipped(WORKLOAD_CONFIG)
        .api_server(cp)
        .env("AWS_ENDPOINT_URL", &format!("http://{}", moto.addr))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ACCESS_KEY_ID", "AKIANODEIDENTITY0001")
        .env("AWS_SECRET_ACCESS_KEY", "node-secret-key")
        .env("AWS_REGION", "us-east-1");

    // a, b, a, b in one kubelet: the second round is served from the kubelet's cache
    // (cacheType ServiceAccount), which must keep the workloads apart; then c (no role
    // annotation) and a static pod (no ServiceAccount).
    let run = kubelet
        .run(&[
            for_pod(&a, "app", ECR_IMAGE),
            for_pod(&b, "app", ECR_IMAGE),
            for_pod(&a, "app", ECR_IMAGE),
            for_pod(&b, "app", ECR_IMAGE),
            for_pod(&c, "app", ECR_IMAGE),
            ECR_IMAGE.to_string(),
        ])
        .await;
    for i in [0, 2] {
        assert_eq!(
            run.passwords(i),
            ["111111111111-auth-token"],
            "{}",
            run.report
        );
        assert_eq!(run.credentials(i)[0].2, format!("{a}/puller"));
    }
    for i in [1, 3] {
        assert_eq!(
            run.passwords(i),
            ["222222222222-auth-token"],
            "{}",
            run.report
        );
        assert_eq!(run.credentials(i)[0].2, format!("{b}/puller"));
    }
    assert_eq!(run.credentials(0)[0].0, "AWS");
    assert_eq!(
        run.lookup(0)["credentials"][0]["serviceAccount"]["UID"],
        uid_a,
        "tracked to the ServiceAccount's UID"
    );
    assert_eq!(run.lookup(0)["providers"], json!(["regbroker-ecr"]));
    // One exchange per workload (one assumed-role session each, counted by its ARN's
    // tail): the repeats came from the kubelet's cache.
    let state = moto.get("/moto-api/data.json");
    for ns in [&a, &b] {
        let session = format!("-puller/regbroker-{ns}-puller\"");
        assert_eq!(
            state.matches(&session).count(),
            1,
            "sessions of {session}: {state}"
        );
    }
    // c: regbroker refuses (no role to assume, never the node's), the kubelet logs it and
    // pulls with nothing.
    assert_eq!(run.passwords(4), Vec::<String>::new(), "{}", run.report);
    assert!(run.errors(4).contains("regbroker-ecr"), "{}", run.errors(4));
    assert!(run.errors(4).contains(ECR_ROLE), "{}", run.errors(4));
    // A static pod: requireServiceAccount, so the kubelet does not even run the plugin.
    assert_eq!(run.lookup(5)["found"], false, "{}", run.report);
    assert_eq!(run.errors(5), "[]");
}

/// moto, with a name that says what it stands for here.
fn moto_peer() -> registry_peer::Emulator {
    registry_peer::moto()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn acr_workloads_each_get_their_own_client_with_pod_bound_tokens() {
    let cp = ControlPlane::shared();
    let (a, b) = (
        cp.namespace("kp-acr-a").await,
        cp.namespace("kp-acr-b").await,
    );
    // Each ServiceAccount names its client and tenant (the config's AZURE_TENANT_ID is
    // the fallback, a placeholder the fake does not know).
    workload(
        cp,
        &a,
        "app-a",
        &[
            ("kubernetes.azure.com/acr-client-id", CLIENT_A),
            ("kubernetes.azure.com/acr-tenant-id", AZURE_TENANT),
        ],
    )
    .await;
    workload(
        cp,
        &b,
        "app-b",
        &[
            ("azure.workload.identity/client-id", CLIENT_B),
            ("azure.workload.identity/tenant-id", AZURE_TENANT),
        ],
    )
    .await;
    let entra = Arc::new(Entra {
        kube: cp.admin(),
        federated: BTreeMap::from([
            (CLIENT_A.to_string(), subject(&a)),
            (CLIENT_B.to_string(), subject(&b)),
        ]),
        operator_token: "unused: regbroker's own app is not configured here".into(),
        assertions: Mutex::default(),
        access: Mutex::default(),
        issued: Mutex::default(),
        n: AtomicUsize::new(0),
    });
    let (base, ca_pem) = start_entra(entra.clone()).await;
    let kubelet = Kubelet::shipped(WORKLOAD_CONFIG).api_server(cp);
    let ca = kubelet.file("entra-ca.pem", &ca_pem);
    let kubelet = kubelet
        .env("AZURE_AUTHORITY_HOST", &format!("{base}/"))
        .env(
            "REGBROKER_AZURE_EXCHANGE_URL",
            &format!("{base}/oauth2/exchange"),
        )
        .env("SSL_CERT_FILE", &ca.display().to_string());
    let image = format!("{ACR_HOST}/team/app:1");

    let run = kubelet
        .run(&[
            for_pod(&a, "app-a", &image),
            for_pod(&b, "app-b", &image),
            for_pod(&a, "app-a", &image),
        ])
        .await;
    let (pa, pb) = (run.passwords(0), run.passwords(1));
    assert_eq!(pa.len(), 1, "{}", run.report);
    assert_eq!(pb.len(), 1, "{}", run.report);
    assert_eq!(run.credentials(0)[0].0, regbroker_azure::ACR_USERNAME);
    assert!(
        entra.issued_to(CLIENT_A).contains(&pa[0]),
        "a's is not CLIENT_A's"
    );
    assert!(
        entra.issued_to(CLIENT_B).contains(&pb[0]),
        "b's is not CLIENT_B's"
    );
    assert_eq!(
        run.passwords(2),
        pa,
        "a again: the kubelet's cached answer for a"
    );
    assert_eq!(run.lookup(0)["providers"], json!(["regbroker-acr"]));

    // What Entra ID received: tokens the API server issued through the kubelet's
    // TokenRequest, for Entra's audience, bound to the pulling pod.
    let assertions = entra.assertions.lock().unwrap().clone();
    assert_eq!(assertions.len(), 2, "one exchange per workload");
    for (client, token) in &assertions {
        let claims = claims(token);
        let (ns, pod) = if client == CLIENT_A {
            (&a, "app-a")
        } else {
            (&b, "app-b")
        };
        assert_eq!(claims["aud"], json!([AZURE_AUDIENCE]), "{claims}");
        assert_eq!(claims["sub"], subject(ns), "{claims}");
        assert_eq!(claims["kubernetes.io"]["pod"]["name"], pod, "{claims}");
        assert_token_unlogged(&run, token);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn gar_workloads_each_get_their_own_federated_or_impersonated_token() {
    let cp = ControlPlane::shared();
    let (a, b, c) = (
        cp.namespace("kp-gar-a").await,
        cp.namespace("kp-gar-b").await,
        cp.namespace("kp-gar-c").await,
    );
    workload(cp, &a, "app", &[(WIP, GCP_PROVIDER)]).await;
    workload(cp, &b, "app", &[(WIP, GCP_PROVIDER), (GSA, EMAIL_B)]).await;
    // c names b's Google service account, which trusts only b.
    workload(cp, &c, "app", &[(WIP, GCP_PROVIDER), (GSA, EMAIL_B)]).await;
    let google = Arc::new(Google {
        kube: cp.admin(),
        impersonators: BTreeMap::from([(EMAIL_B.to_string(), subject(&b))]),
        exchanges: Mutex::default(),
        federated: Mutex::default(),
        issued: Mutex::default(),
        n: AtomicUsize::new(0),
    });
    let base = start_google(google.clone()).await;
    let audience = format!("//iam.googleapis.com/{GCP_PROVIDER}");
    let kubelet = Kubelet::shipped(WORKLOAD_CONFIG)
        .replace(SHIPPED_GCP_AUDIENCE, &audience)
        .api_server(cp)
        .env("REGBROKER_GCP_STS_URL", &format!("{base}/v1/token"))
        .env("REGBROKER_GCP_IAM_CREDENTIALS_URL", &base);
    let image = format!("{GAR_HOST}/project/repo/app:1");

    let run = kubelet
        .run(&[
            for_pod(&a, "app", &image),
            for_pod(&b, "app", &image),
            for_pod(&c, "app", &image),
            for_pod(&a, "app", &image),
        ])
        .await;
    let (pa, pb) = (run.passwords(0), run.passwords(1));
    assert_eq!(
        run.credentials(0)[0].0,
        "oauth2accesstoken",
        "{}",
        run.report
    );
    assert_eq!(pa.len(), 1, "{}", run.report);
    assert!(
        google.issued_to(&subject(&a)).contains(&pa[0]),
        "a's is not a's federated token"
    );
    assert_eq!(pb.len(), 1, "{}", run.report);
    assert!(
        google.issued_to(EMAIL_B).contains(&pb[0]),
        "b's is not EMAIL_B's"
    );
    // c is refused by IAM Credentials: the kubelet logs it and c pulls with nothing,
    // never b's cached credential.
    assert_eq!(run.passwords(2), Vec::<String>::new(), "{}", run.report);
    assert!(run.errors(2).contains("regbroker-gar"), "{}", run.errors(2));
    assert_eq!(run.passwords(3), pa);

    let exchanges = google.exchanges.lock().unwrap().clone();
    assert_eq!(exchanges.len(), 3, "a, b and c, each once");
    for (aud, token) in &exchanges {
        assert_eq!(aud, &audience);
        assert_eq!(claims(token)["aud"], json!([audience]));
        assert_token_unlogged(&run, token);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, moto_server, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn the_node_config_loads_and_answers_with_the_nodes_identity() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("kp-node").await;
    workload(cp, &ns, "app", &[(ECR_ROLE, ROLE_A)]).await;
    let moto = moto_peer();
    let kubelet = Kubelet::shipped(NODE_CONFIG)
        .api_server(cp)
        .env("AWS_ENDPOINT_URL", &format!("http://{}", moto.addr))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ACCESS_KEY_ID", "AKIANODEIDENTITY0001")
        .env("AWS_SECRET_ACCESS_KEY", "node-secret-key")
        .env("AWS_REGION", "us-east-1");
    let run = kubelet
        .run(&[
            ECR_IMAGE.to_string(),
            // No tokenAttributes: a pod's ServiceAccount changes nothing.
            for_pod(&ns, "app", ECR_IMAGE),
            "nginx:1".to_string(),
        ])
        .await;
    assert_eq!(run.report["providers"], json!(["regbroker"]));
    assert_eq!(
        run.passwords(0),
        ["555555555555-auth-token"],
        "{}",
        run.report
    );
    assert_eq!(run.credentials(0)[0].2, "/", "no ServiceAccount source");
    assert_eq!(
        run.passwords(1),
        ["555555555555-auth-token"],
        "{}",
        run.report
    );
    assert_eq!(run.lookup(2)["repository"], "docker.io/library/nginx");
    assert_eq!(run.lookup(2)["providers"], json!([]));
    assert_eq!(run.lookup(2)["found"], false);
    assert_eq!(run.errors(0), "[]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness from scripts/peers.sh; run scripts/test.sh"]
async fn configs_the_kubelet_rejects_are_rejected_by_its_own_validation() {
    // Each edit of the shipped workload config, and the kubelet's own message for it.
    let cases: &[(&str, &str, &str)] = &[
        (
            "      cacheType: ServiceAccount\n",
            "",
            "providers.tokenAttributes.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token",
        ),
        (
            "cacheType: ServiceAccount",
            "cacheType: Pod",
            "providers.tokenAttributes.cacheType: Unsupported value: \"Pod\": supported values: \"ServiceAccount\", \"Token\"",
        ),
        (
            "      requireServiceAccount: true\n      requiredServiceAccountAnnotationKeys:",
            "      requireServiceAccount: false\n      requiredServiceAccountAnnotationKeys:",
            "providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set",
        ),
        (
            "apiVersion: credentialprovider.kubelet.k8s.io/v1\n    args: [\"kubelet-credential-provider\"]\n    matchImages:\n      - \"*.azurecr.io\"",
            "apiVersion: credentialprovider.kubelet.k8s.io/v1beta1\n    args: [\"kubelet-credential-provider\"]\n    matchImages:\n      - \"*.azurecr.io\"",
            "providers.tokenAttributes: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version",
        ),
    ];
    for (from, to, message) in cases {
        let run = Kubelet::shipped(WORKLOAD_CONFIG)
            .replace(from, to)
            .run(&[])
            .await;
        assert!(!run.ok, "accepted with `{to}`: {}", run.report);
        let error = run.report["error"].as_str().unwrap();
        assert!(
            error.starts_with("failed to validate credential provider config: "),
            "{error}"
        );
        assert!(error.contains(message), "{error}\nwanted: {message}");
    }

    // The shipped files themselves pass, and each plugin must exist under its name.
    for path in [WORKLOAD_CONFIG, NODE_CONFIG] {
        let run = Kubelet::shipped(path).run(&[]).await;
        assert!(run.ok, "{path}: {}", run.report);
    }
    let missing =
        Kubelet::shipped(NODE_CONFIG).replace("- name: regbroker", "- name: regbroker-missing");
    let config = missing.file("credential-provider-config.yaml", &missing.config);
    let out = run_bounded(
        Command::new(Peers::find().get("kubelet-credential-harness"))
            .arg(format!("--config={}", config.display()))
            .arg(format!("--bin-dir={}", missing.dir.path().display())),
        None,
        PEER_CLIENT_BOUND,
    );
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("plugin binary executable") && stdout.contains("did not exist"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn an_added_token_cached_provider_entry_answers_each_pod_from_regbrokers_config() {
    // The shape of a later provider's test: one more entry (here cacheType Token, as the
    // pass-through provider will need) whose regbroker reads a file of the test's.
    let cp = ControlPlane::shared();
    let ns = cp.namespace("kp-added").await;
    workload(cp, &ns, "app", &[]).await;
    let kubelet = Kubelet::shipped(WORKLOAD_CONFIG).api_server(cp);
    let docker_config = kubelet.file(
        "docker-config.json",
        r#"{"auths": {"registry.example.com:5000": {"username": "puller", "password": "static-pw"}}}"#,
    );
    let kubelet = kubelet.with_provider(&format!(
        r#"  - name: regbroker-static
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["kubelet-credential-provider"]
    matchImages: ["registry.example.com:5000"]
    defaultCacheDuration: "1m"
    tokenAttributes:
      serviceAccountTokenAudience: registry.example.com
      cacheType: Token
      requireServiceAccount: true
    env:
      - name: REGBROKER_DOCKER_CONFIG
        value: {}
"#,
        docker_config.display()
    ));
    let image = "registry.example.com:5000/team/app:1";
    let run = kubelet
        .run(&[for_pod(&ns, "app", image), image.to_string()])
        .await;
    assert_eq!(
        run.report["providers"],
        json!([
            "regbroker-ecr",
            "regbroker-acr",
            "regbroker-gar",
            "regbroker-static"
        ])
    );
    assert_eq!(
        run.credentials(0),
        [(
            "puller".to_string(),
            "static-pw".to_string(),
            format!("{ns}/puller")
        )],
        "{}",
        run.report
    );
    assert_eq!(run.lookup(1)["found"], false, "no ServiceAccount, not run");
}
