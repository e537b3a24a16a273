//! Federated credentials in the hands of real clients (issue 27, item 4): crane
//! (go-containerregistry), the Helm CLI, the oras Python client and skopeo, each through
//! the docker credential helper, in-process and with a `regbroker serve` sidecar behind it.
//!
//! - `quay`: the real API server's token (TokenRequest, as the kubelet projects it) goes
//!   to the stand-in of Quay's robot federation (`federated_support`: it verifies the
//!   token against the API server's JWKS), whose robot token is the htpasswd password of
//!   a real distribution registry.
//! - `oidc` (pass-through): the token itself is the password, for a registry that
//!   validates it; `federated_support::OidcFront` stands in for one (Zot's OIDC
//!   workload-identity federation: no Zot runs here) in front of an anonymous
//!   distribution registry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client_support;
mod common;
mod control_plane;
mod federated_support;
mod registry_peer;

use std::process::Command;

use client_support::{ClientHome, ok, text};
use common::ServeProcess;
use common::process::{CLI_BOUND, run_bounded};
use control_plane::ControlPlane;
use federated_support::{AUDIENCE, OIDC_AUDIENCE, OidcFront, Quay, discovery, write_config};
use registry_peer::{Registry, http_status, oci_layout};

/// The version of this repository's chart (deploy/chart/regbroker/Chart.yaml).
const CHART_VERSION: &str = "0.1.0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, crane, helm from scripts/peers.sh, oras (PyPI), skopeo, docker-registry, htpasswd: run scripts/test.sh"]
async fn crane_helm_oras_and_skopeo_pull_with_a_quay_robot_token_through_the_helper_and_the_sidecar()
 {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("quay-clients").await;
    let quay = Quay::start(cp, &ns).await;
    let host = quay.registry.host.clone();
    let home = ClientHome::cred_helpers(&[&host]);
    let token_file = home.path().join("token");
    let token = cp.service_account_token(&ns, "puller", &[AUDIENCE]).await;
    std::fs::write(&token_file, &token).unwrap();
    let config = write_config(home.path(), "quay", &quay.rule(Some(&token_file)));
    let helper = [("REGBROKER_CONFIG", config.to_str().unwrap())];
    // Control: the registry wants a credential, so every pull below needed the robot's.
    assert_eq!(http_status(&host, "/v2/"), 401);

    // The helper, in-process: each client pushes, then pulls back what it pushed.
    let image = format!("{host}/acme/crane:v1");
    let layout = oci_layout(home.path(), "crane");
    let push = home.crane(&["push", layout.to_str().unwrap(), &image], &helper);
    ok("crane push through the helper", &push);
    let (pull, pulled) = home.crane_pull(&image, &helper);
    ok("crane pull through the helper", &pull);
    assert!(pulled.join("index.json").is_file());

    let tgz = home.helm_package();
    let charts = format!("oci://{host}/charts");
    let push = home.helm(
        &["push", tgz.to_str().unwrap(), &charts, "--plain-http"],
        &helper,
    );
    ok("helm push through the helper", &push);
    let chart = format!("{host}/charts/regbroker");
    let (pull, pulled) = home.helm_pull(&chart, CHART_VERSION, &helper);
    ok("helm pull through the helper", &pull);
    assert_eq!(
        std::fs::read(&pulled).unwrap(),
        std::fs::read(&tgz).unwrap()
    );

    let artifact = home.path().join("artifact.txt");
    std::fs::write(&artifact, "federated through oras").unwrap();
    let reference = format!("{host}/acme/artifact:v1");
    let run = home.oras(&reference, Some(&artifact), &helper);
    ok("oras push and pull through the helper", &run);
    assert!(text(&run.stdout).contains("federated through oras"));

    // Every helper run exchanged the pod's token (no disk cache here), and the stand-in
    // accepted each one.
    let through_helper = quay.exchange.requests();
    assert!(through_helper >= 3, "{through_helper} exchanges");
    assert!(quay.all_accepted());

    // The sidecar: the helper has no configuration, only the sidecar's address; one
    // exchange serves all four clients from the sidecar's cache.
    let mut sidecar = ServeProcess::start(&["--config", config.to_str().unwrap()], &[]);
    let endpoint = format!("http://{}", sidecar.addr);
    let via = [("REGBROKER_ENDPOINT", endpoint.as_str())];
    let (pull, pulled) = home.crane_pull(&image, &via);
    ok("crane pull via the sidecar", &pull);
    assert!(pulled.join("index.json").is_file());
    let (pull, pulled) = home.skopeo_pull(&image, &via);
    ok("skopeo pull via the sidecar", &pull);
    assert!(pulled.join("index.json").is_file());
    let (pull, pulled) = home.helm_pull(&chart, CHART_VERSION, &via);
    ok("helm pull via the sidecar", &pull);
    assert_eq!(
        std::fs::read(&pulled).unwrap(),
        std::fs::read(&tgz).unwrap()
    );
    let run = home.oras(&reference, None, &via);
    ok("oras pull via the sidecar", &run);
    assert!(text(&run.stdout).contains("federated through oras"));
    assert_eq!(quay.exchange.requests(), through_helper + 1);
    assert!(quay.all_accepted());

    // With the sidecar gone the helper has nothing, and crane pulls nothing: the
    // credential above came through the sidecar.
    assert!(sidecar.stop().success());
    let (pull, _) = home.crane_pull(&image, &via);
    assert!(!pull.status.success(), "crane pulled with no sidecar");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, crane from scripts/peers.sh, skopeo, docker-registry: run scripts/test.sh"]
async fn the_oidc_rule_hands_the_pods_token_to_a_registry_that_validates_it_and_no_other() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("oidc-clients").await;
    let backend = Registry::start(true);
    let (issuer, keys) = discovery(cp).await;
    let subject = format!("system:serviceaccount:{ns}:puller");
    let front = OidcFront::start(&issuer, keys, &subject, &backend.host).await;
    let home = ClientHome::cred_helpers(&[&front.host]);
    // The image is pushed to the anonymous registry behind the front; the front itself
    // wants credentials.
    let layout = oci_layout(home.path(), "oidc");
    let push = home.skopeo_push(&layout, &format!("{}/acme/app:v1", backend.host), &[]);
    ok("skopeo push to the registry behind", &push);
    assert_eq!(http_status(&front.host, "/v2/"), 401);
    let image = format!("{}/acme/app:v1", front.host);

    // A rule per token file: the pod's projected token for `audience`.
    let rule = |name: &str, token: &str| {
        let file = home.path().join(format!("token-{name}"));
        std::fs::write(&file, token).unwrap();
        let toml = format!(
            "[[rule]]\nmatch = \"{}\"\nsource = \"oidc\"\noptions = {{ audience = \"{OIDC_AUDIENCE}\", token_file = \"{}\" }}\n",
            front.host,
            file.display()
        );
        write_config(home.path(), name, &toml)
    };

    // The pod's own token: skopeo and crane pull through the helper, the front having
    // verified the token they presented as the password.
    let token = cp
        .service_account_token(&ns, "puller", &[OIDC_AUDIENCE])
        .await;
    let good = rule("good", &token);
    let env = [("REGBROKER_CONFIG", good.to_str().unwrap())];
    let (pull, pulled) = home.skopeo_pull(&image, &env);
    ok("skopeo pull through the helper", &pull);
    assert!(pulled.join("index.json").is_file());
    let (pull, pulled) = home.crane_pull(&image, &env);
    ok("crane pull through the helper", &pull);
    assert!(pulled.join("index.json").is_file());
    assert!(
        front.presented(&token) >= 2,
        "the token was not the password"
    );
    assert_eq!(front.accepted(), front.seen.lock().unwrap().len());

    // Another ServiceAccount's token for the right audience leaves regbroker (it cannot
    // verify signatures or subjects): the front refuses it, and nothing is pulled.
    let intruder = cp
        .service_account_token(&ns, "intruder", &[OIDC_AUDIENCE])
        .await;
    let cfg = rule("intruder", &intruder);
    let (pull, _) = home.crane_pull(&image, &[("REGBROKER_CONFIG", cfg.to_str().unwrap())]);
    assert!(!pull.status.success(), "crane pulled with another's token");
    assert!(front.presented(&intruder) >= 1);
    assert_eq!(front.accepted(), front.presented(&token));

    // A token for another audience is refused by regbroker before it leaves: the helper
    // says why, and the front never sees it.
    let elsewhere = cp
        .service_account_token(&ns, "puller", &["sts.amazonaws.com"])
        .await;
    let cfg = rule("elsewhere", &elsewhere);
    let cfg_s = cfg.to_str().unwrap();
    let (pull, _) = home.skopeo_pull(&image, &[("REGBROKER_CONFIG", cfg_s)]);
    assert!(
        !pull.status.success(),
        "skopeo pulled with another audience"
    );
    let (pull, _) = home.crane_pull(&image, &[("REGBROKER_CONFIG", cfg_s)]);
    assert!(!pull.status.success(), "crane pulled with another audience");
    assert_eq!(front.presented(&elsewhere), 0, "the token left regbroker");
    let out = run_bounded(
        Command::new(home.helper())
            .arg("get")
            .env_clear()
            .env("HOME", home.path())
            .env("REGBROKER_CONFIG", cfg_s),
        Some(front.host.as_bytes()),
        CLI_BOUND,
    );
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!("not the rule's `{OIDC_AUDIENCE}`")),
        "{said}"
    );
    assert!(!said.contains(&elsewhere), "the helper echoed the token");
}
