//! The federated providers in kubelet mode as the kubelet really runs it (issue 27): the
//! shipped `deploy/kubelet/credential-provider-config-federated.yaml` under the kubelet's
//! own plugin code (`kubelet-credential-harness`, see `kubelet_support`), with each pod's
//! ServiceAccount token issued by the real API server through the kubelet's token manager
//! (KEP-4412).
//!
//! - `regbroker-quay` (`cacheType: ServiceAccount`): the token goes to a stand-in of Quay's
//!   robot federation endpoint (`federated_support`), which verifies it against the API
//!   server's JWKS, issuer, audience, subject and expiry; only the trusted ServiceAccount
//!   gets the robot token.
//! - `regbroker-artifactory` and `regbroker-cloudsmith` (`cacheType: ServiceAccount`): the
//!   token goes to stand-ins of JFrog's and Cloudsmith's OIDC exchanges
//!   (`federated_support::VendorExchange`), which verify it the same way.
//! - `regbroker-zot` (`cacheType: Token`): the `oidc` pass-through, whose password is the
//!   pod's own token; the kubelet takes it only from a `cacheType: Token` entry, and
//!   regbroker refuses it when the kubelet sent no token.
//!
//! Changed in the shipped config, and only that (each change is asserted to apply, and no
//! placeholder is left): the placeholder hosts (`quay.example.com`, `acme.jfrog.io`,
//! `docker.cloudsmith.io`, `zot.example.com`) become loopback ones, their audiences the
//! stand-ins', and `REGBROKER_CONFIG` a file of the test's with the four rules. Each
//! exchange's host is its stand-in's address (Quay and Artifactory serve theirs on the
//! registry's own host); nothing serves the Zot host (a port that refuses connections):
//! the harness pulls nothing, it reports what the kubelet would pull with.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "federated")]

mod cloud_fakes;
mod common;
mod control_plane;
mod federated_support;
mod kubelet_support;
mod registry_peer;

use std::path::Path;
use std::sync::{Arc, Mutex};

use cloud_fakes::{claims, review, subject};
use control_plane::ControlPlane;
use federated_support::{
    AUDIENCE, CLOUDSMITH_SERVICE, Exchange, JFROG_PROVIDER, JFROG_USER, ROBOT, Vendor,
    VendorExchange, discovery, rand_u128, serve,
};
use kubelet_support::{Kubelet, assert_token_unlogged, for_pod, pod_of, workload};
use serde_json::json;

const FEDERATED_CONFIG: &str = "deploy/kubelet/credential-provider-config-federated.yaml";
/// Where the shipped config's entries point `REGBROKER_CONFIG`.
const SHIPPED_REGBROKER_CONFIG: &str = "/etc/kubernetes/image-credential-provider/regbroker.toml";
/// The audience the pass-through rule names (the Zot stand-in's, if one ran).
const ZOT_AUDIENCE: &str = "zot.regbroker.test";
/// The pass-through rule's `username` option.
const ZOT_USERNAME: &str = "k8s";
/// What the kubelet logs when a provider entry without `cacheType: Token` answers the
/// ServiceAccount token as the password (pkg/credentialprovider/plugin).
const KUBELET_REFUSES_ECHO: &str = "credential provider plugin returned the service account token as the password which is not allowed when service account cache type is not set to 'Token'";

/// The shipped federated config on loopback, the Quay stand-in it reaches, and the image
/// of each entry.
struct Federated {
    kubelet: Kubelet,
    exchange: Arc<Exchange>,
    robot_token: String,
    quay_image: String,
    zot_image: String,
    jfrog: VendorExchange,
    jfrog_image: String,
    cloudsmith: VendorExchange,
    cloudsmith_image: String,
}

/// The shipped config with its placeholders replaced, the Quay stand-in trusting
/// ServiceAccount `trusted` (`system:serviceaccount:NS:NAME`), and a regbroker config of
/// the four rules; `edit` changes the config further before `REGBROKER_CONFIG` is set
/// (a test's own change to an entry).
async fn federated(
    cp: &'static ControlPlane,
    trusted: &str,
    edit: impl FnOnce(Kubelet) -> Kubelet,
) -> Federated {
    let (issuer, keys) = discovery(cp).await;
    let robot_token = format!("robot-{:032x}", rand_u128());
    let jfrog = VendorExchange::serve(Vendor::Artifactory, &issuer, keys.clone(), trusted).await;
    let cloudsmith =
        VendorExchange::serve(Vendor::Cloudsmith, &issuer, keys.clone(), trusted).await;
    let exchange = Arc::new(Exchange {
        issuer,
        keys,
        subject: trusted.to_string(),
        robot_token: robot_token.clone(),
        seen: Mutex::default(),
    });
    let url = serve(exchange.clone()).await;
    let quay_host = url.strip_prefix("http://").unwrap().to_string();
    let zot_host = format!("127.0.0.1:{}", registry_peer::closed_port());
    let kubelet = Kubelet::shipped_as_is(FEDERATED_CONFIG)
        .api_server(cp)
        .replace("- \"quay.example.com\"", &format!("- \"{quay_host}\""))
        .replace(
            "serviceAccountTokenAudience: quay.example.com",
            &format!("serviceAccountTokenAudience: {AUDIENCE}"),
        )
        .replace("- \"acme.jfrog.io\"", &format!("- \"{}\"", jfrog.host()))
        .replace(
            "serviceAccountTokenAudience: jfrog\n",
            &format!(
                "serviceAccountTokenAudience: {}\n",
                Vendor::Artifactory.audience()
            ),
        )
        .replace(
            "- \"docker.cloudsmith.io\"",
            &format!("- \"{}\"", cloudsmith.host()),
        )
        .replace(
            "serviceAccountTokenAudience: https://api.cloudsmith.io\n",
            &format!(
                "serviceAccountTokenAudience: {}\n",
                Vendor::Cloudsmith.audience()
            ),
        )
        .replace("- \"zot.example.com\"", &format!("- \"{zot_host}\""))
        .replace(
            "serviceAccountTokenAudience: zot.example.com",
            &format!("serviceAccountTokenAudience: {ZOT_AUDIENCE}"),
        );
    let kubelet = edit(kubelet);
    let rules = kubelet.file(
        "regbroker.toml",
        &format!(
            r#"[[rule]]
match = "{quay_host}"
source = "quay"
options = {{ audience = "{AUDIENCE}", robot = "{ROBOT}", url = "{url}" }}

[[rule]]
match = "{zot_host}"
source = "oidc"
options = {{ audience = "{ZOT_AUDIENCE}", username = "{ZOT_USERNAME}" }}

{}
{}"#,
            jfrog.rule(jfrog.host(), None),
            cloudsmith.rule(cloudsmith.host(), None),
        ),
    );
    let kubelet = kubelet.replace(SHIPPED_REGBROKER_CONFIG, &rules.display().to_string());
    for placeholder in ["example.com", "jfrog.io", "cloudsmith.io"] {
        assert!(
            !kubelet.config.contains(placeholder),
            "a placeholder is left: {}",
            kubelet.config
        );
    }
    Federated {
        kubelet,
        exchange,
        robot_token,
        quay_image: format!("{quay_host}/acme/app:1"),
        zot_image: format!("{zot_host}/acme/app:1"),
        jfrog_image: format!("{}/docker-local/app:1", jfrog.host()),
        cloudsmith_image: format!("{}/acme/app:1", cloudsmith.host()),
        jfrog,
        cloudsmith,
    }
}

/// The shipped config unchanged but for the placeholders.
fn as_shipped(k: Kubelet) -> Kubelet {
    k
}

/// Every regular file under `dir` (recursively), with its content.
fn files_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn quay_robot_token_goes_to_the_trusted_service_account_and_never_to_another() {
    let cp = ControlPlane::shared();
    let (a, b) = (
        cp.namespace("kpf-quay-a").await,
        cp.namespace("kpf-quay-b").await,
    );
    let uid_a = workload(cp, &a, "app", &[]).await;
    // b's ServiceAccount has the same name in another namespace: another subject.
    workload(cp, &b, "app", &[]).await;
    let f = federated(cp, &subject(&a), as_shipped).await;

    // a, b, a, b in one kubelet: a's repeat comes from the kubelet's cache (cacheType
    // ServiceAccount), which must never hand it to b.
    let run = f
        .kubelet
        .run(&[
            for_pod(&a, "app", &f.quay_image),
            for_pod(&b, "app", &f.quay_image),
            for_pod(&a, "app", &f.quay_image),
            for_pod(&b, "app", &f.quay_image),
        ])
        .await;
    assert_eq!(
        run.report["providers"],
        json!([
            "regbroker-quay",
            "regbroker-artifactory",
            "regbroker-cloudsmith",
            "regbroker-zot"
        ])
    );
    assert_eq!(run.lookup(0)["providers"], json!(["regbroker-quay"]));
    let robot = (
        ROBOT.to_string(),
        f.robot_token.clone(),
        format!("{a}/puller"),
    );
    for i in [0, 2] {
        assert_eq!(
            run.credentials(i),
            std::slice::from_ref(&robot),
            "{}",
            run.report
        );
        assert_eq!(run.errors(i), "[]");
    }
    assert_eq!(
        run.lookup(0)["credentials"][0]["serviceAccount"]["UID"],
        uid_a,
        "tracked to the ServiceAccount's UID"
    );
    // b: the stand-in refused its token (verified, but another subject); the kubelet
    // logged regbroker's error, with the stand-in's reason, and pulls with nothing.
    for i in [1, 3] {
        assert_eq!(run.passwords(i), Vec::<String>::new(), "{}", run.report);
        let errors = run.errors(i);
        assert!(errors.contains("regbroker-quay"), "{errors}");
        assert!(
            errors.contains("the token's subject is not trusted by acme+puller"),
            "{errors}"
        );
        assert!(!errors.contains(&f.robot_token), "{errors}");
    }
    // What the stand-in saw: a once (its repeat was the kubelet's cache), then b twice
    // (the kubelet caches no failure), each verified against the API server's keys and
    // refused only for its subject.
    let seen = f.exchange.seen.lock().unwrap().clone();
    let why = "the token's subject is not trusted by acme+puller".to_string();
    assert_eq!(
        seen,
        [
            (ROBOT.to_string(), Ok(())),
            (ROBOT.to_string(), Err(why.clone())),
            (ROBOT.to_string(), Err(why)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn artifactory_and_cloudsmith_tokens_go_to_the_trusted_service_account_only() {
    let cp = ControlPlane::shared();
    let (a, b) = (
        cp.namespace("kpf-vendor-a").await,
        cp.namespace("kpf-vendor-b").await,
    );
    workload(cp, &a, "app", &[]).await;
    workload(cp, &b, "app", &[]).await;
    let f = federated(cp, &subject(&a), as_shipped).await;
    let run = f
        .kubelet
        .run(&[
            for_pod(&a, "app", &f.jfrog_image),
            for_pod(&b, "app", &f.jfrog_image),
            for_pod(&a, "app", &f.cloudsmith_image),
            for_pod(&b, "app", &f.cloudsmith_image),
        ])
        .await;
    for (i, name, exchange, username, trusted_by) in [
        (
            0,
            "regbroker-artifactory",
            &f.jfrog,
            JFROG_USER,
            JFROG_PROVIDER,
        ),
        (
            2,
            "regbroker-cloudsmith",
            &f.cloudsmith,
            "token",
            CLOUDSMITH_SERVICE,
        ),
    ] {
        assert_eq!(run.lookup(i)["providers"], json!([name]), "{}", run.report);
        // a: the vendor's token, with JFrog's user read from its access token's `sub`
        // and Cloudsmith's documented `token`, tracked to a's ServiceAccount.
        assert_eq!(
            run.credentials(i),
            [(
                username.to_string(),
                exchange.token.clone(),
                format!("{a}/puller")
            )],
            "{}",
            run.report
        );
        assert_eq!(run.errors(i), "[]");
        // b: refused by the stand-in, whose reason reaches the kubelet's log.
        assert_eq!(run.passwords(i + 1), Vec::<String>::new(), "{}", run.report);
        let errors = run.errors(i + 1);
        assert!(errors.contains(name), "{errors}");
        assert!(
            errors.contains(&format!(
                "the token's subject is not trusted by {trusted_by}"
            )),
            "{errors}"
        );
        assert!(!errors.contains(&exchange.token), "{errors}");
        let seen = exchange.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{name}: {seen:?}");
        assert!(seen[0].is_ok() && seen[1].is_err(), "{name}: {seen:?}");
    }
    assert_eq!(f.exchange.requests(), 0, "nothing went to Quay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn pass_through_with_cache_type_token_gives_each_pod_its_own_token() {
    let cp = ControlPlane::shared();
    let (a, b) = (
        cp.namespace("kpf-oidc-a").await,
        cp.namespace("kpf-oidc-b").await,
    );
    workload(cp, &a, "app-1", &[]).await;
    pod_of(cp, &a, "app-2", "puller").await;
    workload(cp, &b, "app", &[]).await;
    let f = federated(cp, &subject(&a), as_shipped).await;

    let pods = [(&a, "app-1"), (&a, "app-2"), (&b, "app")];
    let mut lookups: Vec<String> = pods
        .iter()
        .map(|(ns, pod)| for_pod(ns, pod, &f.zot_image))
        .collect();
    lookups.push(for_pod(&a, "app-1", &f.zot_image));
    let run = f.kubelet.run(&lookups).await;
    assert_eq!(run.lookup(0)["providers"], json!(["regbroker-zot"]));

    let mut tokens = Vec::new();
    for (i, (ns, pod)) in pods.iter().enumerate() {
        let creds = run.credentials(i);
        assert_eq!(creds.len(), 1, "{}", run.report);
        let (username, token, tracked) = &creds[0];
        assert_eq!(username, ZOT_USERNAME, "the rule's username");
        assert_eq!(tracked, &format!("{ns}/puller"));
        // The password is the API server's token for this pod's ServiceAccount, for the
        // rule's audience, bound to this pod.
        let c = claims(token);
        assert_eq!(c["aud"], json!([ZOT_AUDIENCE]), "{c}");
        assert_eq!(c["sub"], subject(ns), "{c}");
        assert_eq!(c["kubernetes.io"]["pod"]["name"], *pod, "{c}");
        assert_eq!(
            review(&cp.admin(), token, ZOT_AUDIENCE).await,
            Some(subject(ns)),
            "the API server vouches for it"
        );
        assert_token_unlogged(&run, token);
        assert_eq!(run.errors(i), "[]");
        tokens.push(token.clone());
    }
    assert_ne!(tokens[0], tokens[1], "two pods of one ServiceAccount");
    assert_ne!(tokens[0], tokens[2]);
    assert_ne!(tokens[1], tokens[2]);
    // app-1 again: its own token (cached per token by the kubelet), nobody else's.
    assert_eq!(run.passwords(3), [tokens[0].clone()]);
    assert_eq!(f.exchange.requests(), 0, "nothing went to Quay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn pass_through_cached_per_service_account_is_dropped_by_the_kubelet() {
    let cp = ControlPlane::shared();
    let a = cp.namespace("kpf-oidc-sa").await;
    workload(cp, &a, "app", &[]).await;
    let f = federated(cp, &subject(&a), |k| {
        k.replace("cacheType: Token", "cacheType: ServiceAccount")
    })
    .await;
    let run = f.kubelet.run(&[for_pod(&a, "app", &f.zot_image)]).await;
    // regbroker answered the pod's token; the kubelet's own check dropped it.
    assert_eq!(run.passwords(0), Vec::<String>::new(), "{}", run.report);
    let errors = run.errors(0);
    assert!(errors.contains("regbroker-zot"), "{errors}");
    assert!(errors.contains(KUBELET_REFUSES_ECHO), "{errors}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn pass_through_without_token_attributes_is_refused_naming_cache_type_token() {
    let cp = ControlPlane::shared();
    let a = cp.namespace("kpf-oidc-none").await;
    workload(cp, &a, "app", &[]).await;
    let f = federated(cp, &subject(&a), |k| {
        k.replace(
            &format!(
                "    tokenAttributes:\n      serviceAccountTokenAudience: {ZOT_AUDIENCE}\n      # Pass-through (`source = \"oidc\"`): the password is the ServiceAccount token\n      # itself, which the kubelet accepts only with cacheType Token (cached per token).\n      cacheType: Token\n      requireServiceAccount: true\n"
            ),
            "",
        )
    })
    .await;
    // Without tokenAttributes the kubelet runs the plugin with no token, for a pod and a
    // static pod alike: regbroker must refuse rather than pass anything through.
    let run = f
        .kubelet
        .run(&[for_pod(&a, "app", &f.zot_image), f.zot_image.clone()])
        .await;
    for i in [0, 1] {
        assert_eq!(run.passwords(i), Vec::<String>::new(), "{}", run.report);
        let errors = run.errors(i);
        assert!(errors.contains("regbroker-zot"), "{errors}");
        assert!(errors.contains("exit status 1"), "{errors}");
        assert!(errors.contains("tokenAttributes"), "{errors}");
        assert!(errors.contains("cacheType: Token"), "{errors}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet-credential-harness, etcd, kube-apiserver from scripts/peers.sh; run scripts/test.sh"]
async fn pass_through_token_never_reaches_the_disk_cache() {
    let cp = ControlPlane::shared();
    let (a, b) = (
        cp.namespace("kpf-disk-a").await,
        cp.namespace("kpf-disk-b").await,
    );
    workload(cp, &a, "app", &[]).await;
    workload(cp, &b, "app", &[]).await;
    // REGBROKER_CACHE_DIR in both entries' env: the pass-through's, and Quay's, whose
    // robot token shows the cache is written at all. (Checked: without the
    // `passes_subject_token` guard in src/broker/cache/flight.rs this fails, a record
    // holding the pod's token.)
    let f = federated(cp, &subject(&a), |k| {
        let cache = k.cache_dir();
        k.replace(
            &format!("        value: {SHIPPED_REGBROKER_CONFIG}\n"),
            &format!(
                "        value: {SHIPPED_REGBROKER_CONFIG}\n      - name: REGBROKER_CACHE_DIR\n        value: {}\n",
                cache.display()
            ),
        )
    })
    .await;
    assert_eq!(
        f.kubelet.config.matches("REGBROKER_CACHE_DIR").count(),
        f.kubelet.provider_names().len()
    );
    let run = f
        .kubelet
        .run(&[
            for_pod(&a, "app", &f.zot_image),
            for_pod(&b, "app", &f.zot_image),
            for_pod(&a, "app", &f.quay_image),
        ])
        .await;
    let tokens: Vec<String> = [0, 1].iter().flat_map(|i| run.passwords(*i)).collect();
    assert_eq!(tokens.len(), 2, "{}", run.report);
    assert_eq!(
        run.passwords(2),
        std::slice::from_ref(&f.robot_token),
        "{}",
        run.report
    );

    let files = files_under(&f.kubelet.cache_dir());
    let holds = |content: &[u8], needle: &str| {
        content
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    assert!(
        files.iter().any(|(_, c)| holds(c, &f.robot_token)),
        "the disk cache was not written at all: {files:?}"
    );
    for token in &tokens {
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        for (path, content) in &files {
            for needle in std::iter::once(token.as_str()).chain(parts.iter().copied()) {
                assert!(
                    !holds(content, needle),
                    "{path} holds the ServiceAccount token or a part of it"
                );
            }
        }
    }
}
