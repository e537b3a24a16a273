//! Workload-identity federation end to end on loopback (issue 27): the real API server
//! issues ServiceAccount tokens (TokenRequest) and serves its JWKS; a stand-in of Quay's
//! robot federation endpoint (written here from Red Hat's Quay documentation: no Quay runs
//! here) checks each token's ES256 signature against that JWKS, its issuer, audience,
//! subject and expiry, and answers the robot token, which is the htpasswd password of a
//! real distribution registry. skopeo pushes and pulls through the docker credential
//! helper; the sidecar answers the same credential, and refusals reach its clients as
//! 403 with the reason. Stand-ins of JFrog's and Cloudsmith's OIDC exchanges
//! (`federated_support::Federation`, from their documentation) do the same for the
//! `artifactory` and `cloudsmith` rules.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client_support;
mod common;
mod control_plane;
mod federated_support;
mod registry_peer;

use client_support::{ClientHome, ok};
use common::ServeProcess;
use control_plane::ControlPlane;
use federated_support::{
    AUDIENCE, Federation, Quay, ROBOT, Vendor, credentials, forged, write_config,
};
use registry_peer::{http_status, oci_layout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver from scripts/peers.sh, skopeo, docker-registry, htpasswd: run scripts/test.sh"]
async fn quay_federation_pulls_with_the_pods_token_and_refuses_every_other_token() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("quay-fed").await;
    let quay = Quay::start(cp, &ns).await;
    let (registry, exchange) = (&quay.registry, &quay.exchange);
    let home = ClientHome::cred_helpers(&[&registry.host]);

    // The pod's projected token, as the kubelet writes it: TokenRequest for the audience.
    let token = cp.service_account_token(&ns, "puller", &[AUDIENCE]).await;
    let token_file = home.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let good = write_config(home.path(), "good", &quay.rule(Some(&token_file)));
    let env = [("REGBROKER_CONFIG", good.to_str().unwrap())];

    // skopeo pushes and pulls through the helper, which exchanges the token.
    let layout = oci_layout(home.path(), "federated");
    let image = format!("{}/acme/app:v1", registry.host);
    ok("push", &home.skopeo_push(&layout, &image, &env));
    let (pull, pulled) = home.skopeo_pull(&image, &env);
    ok("pull", &pull);
    assert!(pulled.join("index.json").is_file());
    assert!(exchange.requests() >= 1);
    assert!(quay.all_accepted());

    // The sidecar answers the same credential.
    let sidecar = ServeProcess::start(
        &["--config", good.to_str().unwrap()],
        &[("REGBROKER_LOG", "trace")],
    );
    let (status, body) = credentials(&sidecar.addr, &registry.host).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["username"], ROBOT);
    assert_eq!(body["password"], quay.robot_token.as_str());
    // A host outside every rule gets nothing, and the exchange hears nothing of it.
    let before = exchange.requests();
    let (status, body) = credentials(&sidecar.addr, "127.0.0.1:1").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(exchange.requests(), before);
    // Even at trace, neither the ServiceAccount token (nor a part of it) nor the robot
    // token reaches the log.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let logs: Vec<String> = sidecar.log.try_iter().collect();
    assert!(logs.len() > 3, "the trace log was read: {logs:?}");
    for line in &logs {
        assert!(!line.contains(quay.robot_token.as_str()), "{line}");
        for part in token.split('.') {
            assert!(!line.contains(part), "a token part in the log: {line}");
        }
    }
    drop(sidecar);

    // Adversaries, each through a fresh sidecar: the refusal reaches the client as 403
    // with its reason, and no credential.
    let other = cp.service_account_token(&ns, "intruder", &[AUDIENCE]).await;
    let forged = forged(
        &quay.issuer,
        &format!("system:serviceaccount:{ns}:puller"),
        &quay.kid,
    );
    let elsewhere = cp
        .service_account_token(&ns, "puller", &["sts.amazonaws.com"])
        .await;
    for (name, bad, reason, reaches_exchange) in [
        ("another-sa", &other, "subject is not trusted", true),
        ("another-key", &forged, "signature does not verify", true),
        (
            "another-audience",
            &elsewhere,
            "not the rule's `quay.regbroker.test`",
            false,
        ),
    ] {
        let file = home.path().join(format!("token-{name}"));
        std::fs::write(&file, bad).unwrap();
        let cfg = write_config(home.path(), name, &quay.rule(Some(&file)));
        let sidecar = ServeProcess::start(&["--config", cfg.to_str().unwrap()], &[]);
        let before = exchange.requests();
        let (status, body) = credentials(&sidecar.addr, &registry.host).await;
        assert_eq!(status, 403, "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(reason), "{name}: {body}");
        assert!(body.get("password").is_none(), "{name}: {body}");
        assert!(
            !body.to_string().contains(bad.as_str()),
            "{name}: the token was echoed"
        );
        assert_eq!(exchange.requests() > before, reaches_exchange, "{name}");
    }

    // A rule whose exchange URL redirects to another host (here: to the real stand-in,
    // which would accept the token): the redirect is not followed, so the token never
    // arrives there, and the client learns why.
    let target = format!("{}/oauth2/federation/robot/token", quay.url);
    let redirect = axum::Router::new().route(
        "/oauth2/federation/robot/token",
        axum::routing::get(move || {
            let target = target.clone();
            async move { axum::response::Redirect::temporary(&target) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirect_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, redirect).await.unwrap() });
    let rule = quay
        .rule(Some(&token_file))
        .replace(&quay.url, &redirect_url);
    assert!(rule.contains(&redirect_url), "{rule}");
    let cfg = write_config(home.path(), "redirect", &rule);
    let sidecar = ServeProcess::start(&["--config", cfg.to_str().unwrap()], &[]);
    let before = exchange.requests();
    let (status, body) = credentials(&sidecar.addr, &registry.host).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("never follows"),
        "{body}"
    );
    assert_eq!(exchange.requests(), before, "the redirect was followed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, crane from scripts/peers.sh, skopeo, docker-registry, htpasswd: run scripts/test.sh"]
async fn artifactory_and_cloudsmith_exchange_the_pods_token_for_a_registry_password_and_refuse_another_sa()
 {
    let cp = ControlPlane::shared();
    for vendor in [Vendor::Artifactory, Vendor::Cloudsmith] {
        let ns = cp.namespace(&format!("{vendor:?}").to_lowercase()).await;
        let fed = Federation::start(cp, &ns, vendor).await;
        let exchange = &fed.exchange;
        let host = fed.registry.host.clone();
        let home = ClientHome::cred_helpers(&[&host]);
        let token = cp
            .service_account_token(&ns, "puller", &[vendor.audience()])
            .await;
        let token_file = home.path().join("token");
        std::fs::write(&token_file, &token).unwrap();
        let config = write_config(home.path(), "good", &fed.rule(Some(&token_file)));
        let env = [("REGBROKER_CONFIG", config.to_str().unwrap())];
        assert_eq!(
            http_status(&host, "/v2/"),
            401,
            "{vendor:?}: the registry wants a credential"
        );

        // skopeo pushes and crane pulls through the helper, which exchanges the token.
        let layout = oci_layout(home.path(), "federated");
        let image = format!("{host}/acme/app:v1");
        ok(
            &format!("{vendor:?}: skopeo push through the helper"),
            &home.skopeo_push(&layout, &image, &env),
        );
        let (pull, pulled) = home.crane_pull(&image, &env);
        ok(&format!("{vendor:?}: crane pull through the helper"), &pull);
        assert!(pulled.join("index.json").is_file());
        assert!(exchange.requests() >= 2, "{vendor:?}");
        assert!(exchange.all_accepted(), "{vendor:?}: {:?}", exchange.seen);

        // The sidecar answers the vendor's username (JFrog's from its token's `sub`,
        // as the rule names none) and the token.
        let sidecar = ServeProcess::start(&["--config", config.to_str().unwrap()], &[]);
        let (status, body) = credentials(&sidecar.addr, &host).await;
        assert_eq!(status, 200, "{vendor:?}: {body}");
        assert_eq!(body["username"], vendor.username(), "{vendor:?}");
        assert_eq!(body["password"], exchange.token.as_str(), "{vendor:?}");
        drop(sidecar);

        // Another ServiceAccount's token, for the right audience: the stand-in refuses
        // it, and its reason (JFrog's `errors[0].message`, Cloudsmith's `detail`) reaches
        // the client as 403 with no credential.
        let other = cp
            .service_account_token(&ns, "intruder", &[vendor.audience()])
            .await;
        let file = home.path().join("token-intruder");
        std::fs::write(&file, &other).unwrap();
        let cfg = write_config(home.path(), "intruder", &fed.rule(Some(&file)));
        let sidecar = ServeProcess::start(&["--config", cfg.to_str().unwrap()], &[]);
        let before = exchange.requests();
        let (status, body) = credentials(&sidecar.addr, &host).await;
        assert_eq!(status, 403, "{vendor:?}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("subject is not trusted"),
            "{vendor:?}: {body}"
        );
        assert!(body.get("password").is_none(), "{vendor:?}: {body}");
        assert!(
            !body.to_string().contains(other.as_str()),
            "{vendor:?}: the token was echoed"
        );
        assert_eq!(exchange.requests(), before + 1, "{vendor:?}");
        assert!(exchange.seen.lock().unwrap().last().unwrap().is_err());
    }
}
