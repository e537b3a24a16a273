//! Workload-identity federation end to end on loopback (issue 27): the real API server
//! issues ServiceAccount tokens (TokenRequest) and serves its JWKS; a stand-in of Quay's
//! robot federation endpoint (written here from Red Hat's Quay documentation: no Quay runs
//! here) checks each token's ES256 signature against that JWKS, its issuer, audience,
//! subject and expiry, and answers the robot token, which is the htpasswd password of a
//! real distribution registry. skopeo pushes and pulls through the docker credential
//! helper; the sidecar answers the same credential, and refusals reach its clients as
//! 403 with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod registry_peer;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use common::ServeProcess;
use common::process::{PEER_CLIENT_BOUND, run_bounded};
use control_plane::ControlPlane;
use regbroker_provider::{Clock as _, SystemClock};
use registry_peer::{Registry, oci_layout, peer};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");
const AUDIENCE: &str = "quay.regbroker.test";
const ROBOT: &str = "acme+puller";

fn b64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()
}

async fn get(cp: &ControlPlane, path: &str) -> serde_json::Value {
    let text = cp
        .admin()
        .request_text(axum::http::Request::get(path).body(Vec::new()).unwrap())
        .await
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The API server as an OIDC issuer, as an exchange discovers it: the issuer of its
/// `/.well-known/openid-configuration`, and the signing keys of its JWKS by `kid`
/// (uncompressed P-256 points: the API server signs with the test's EC key).
async fn discovery(cp: &ControlPlane) -> (String, Vec<(String, Vec<u8>)>) {
    let config = get(cp, "/.well-known/openid-configuration").await;
    let issuer = config["issuer"].as_str().unwrap().to_string();
    let jwks_uri = config["jwks_uri"].as_str().unwrap();
    assert!(jwks_uri.ends_with("/openid/v1/jwks"), "{jwks_uri}");
    let v = get(cp, "/openid/v1/jwks").await;
    let keys = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            assert_eq!(k["kty"], "EC", "{k}");
            let mut point = vec![4u8];
            point.extend(b64(k["x"].as_str().unwrap()).unwrap());
            point.extend(b64(k["y"].as_str().unwrap()).unwrap());
            (k["kid"].as_str().unwrap().to_string(), point)
        })
        .collect();
    (issuer, keys)
}

/// What the stand-in checks, and what it saw.
struct Exchange {
    issuer: String,
    keys: Vec<(String, Vec<u8>)>,
    /// The subject the robot trusts.
    subject: String,
    /// The robot token handed out.
    robot_token: String,
    /// Every request, as (robot, verdict).
    seen: Mutex<Vec<(String, Result<(), String>)>>,
}

impl Exchange {
    /// Quay's federation check, as documented: the robot names the issuer and subject it
    /// trusts; the token must verify against the issuer's keys and be for the audience.
    fn verify(&self, robot: &str, jwt: &str) -> Result<(), String> {
        if robot != ROBOT {
            return Err(format!("no federation is configured for robot {robot}"));
        }
        let mut parts = jwt.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not a JWT".into());
        };
        let header: serde_json::Value =
            serde_json::from_slice(&b64(h).ok_or("bad header")?).map_err(|_| "bad header")?;
        let claims: serde_json::Value =
            serde_json::from_slice(&b64(p).ok_or("bad claims")?).map_err(|_| "bad claims")?;
        if header["alg"] != "ES256" {
            return Err("unsupported signing algorithm".into());
        }
        let signature = b64(s).ok_or("bad signature encoding")?;
        let verified = self.keys.iter().any(|(kid, point)| {
            header["kid"].as_str() == Some(kid)
                && UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
                    .verify(format!("{h}.{p}").as_bytes(), &signature)
                    .is_ok()
        });
        if !verified {
            return Err("the token's signature does not verify against the issuer's keys".into());
        }
        if claims["iss"] != self.issuer.as_str() {
            return Err("the token's issuer is not trusted".into());
        }
        let aud_ok = match &claims["aud"] {
            serde_json::Value::Array(a) => a.iter().any(|x| x == AUDIENCE),
            other => other == AUDIENCE,
        };
        if !aud_ok {
            return Err("the token is for another audience".into());
        }
        if claims["sub"] != self.subject.as_str() {
            return Err(format!("the token's subject is not trusted by {ROBOT}"));
        }
        let now = SystemClock
            .now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        if claims["exp"].as_u64().is_none_or(|e| e <= now) {
            return Err("the token has expired".into());
        }
        Ok(())
    }

    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Serves the stand-in on loopback: `GET /oauth2/federation/robot/token` with Basic
/// `<robot>:<token>`.
async fn serve(exchange: Arc<Exchange>) -> String {
    let handler = move |headers: HeaderMap| {
        let exchange = exchange.clone();
        async move {
            let basic = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Basic "))
                .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
                .and_then(|v| String::from_utf8(v).ok())
                .unwrap_or_default();
            let (robot, jwt) = basic.split_once(':').unwrap_or(("", ""));
            let verdict = exchange.verify(robot, jwt);
            exchange
                .seen
                .lock()
                .unwrap()
                .push((robot.to_string(), verdict.clone()));
            match verdict {
                Ok(()) => (
                    StatusCode::OK,
                    axum::Json(serde_json::json!({"token": exchange.robot_token})),
                ),
                Err(why) => (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(serde_json::json!({"error": why})),
                ),
            }
        }
    };
    let app = axum::Router::new().route(
        "/oauth2/federation/robot/token",
        axum::routing::get(handler),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn config(dir: &Path, name: &str, registry: &str, exchange: &str, token_file: &Path) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[[rule]]\nmatch = \"{registry}\"\nsource = \"quay\"\noptions = {{ audience = \"{AUDIENCE}\", robot = \"{ROBOT}\", url = \"{exchange}\", token_file = \"{}\" }}\n",
            token_file.display()
        ),
    )
    .unwrap();
    path
}

fn skopeo(args: &[&str], dir: &Path, config: &Path) -> Output {
    let bin = dir.join("bin");
    if !bin.exists() {
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(BIN, bin.join("docker-credential-regbroker")).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run_bounded(
        Command::new("skopeo")
            .arg("--insecure-policy")
            .args(args)
            .env_clear()
            .env("HOME", dir)
            .env("TMPDIR", std::env::temp_dir())
            .env("PATH", path)
            .env("REGBROKER_CONFIG", config),
        None,
        PEER_CLIENT_BOUND,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn credentials(sidecar: &ServeProcess, registry: &str) -> (u16, serde_json::Value) {
    let res = reqwest::Client::new()
        .get(format!("http://{}/v1/credentials", sidecar.addr))
        .query(&[("registry", registry)])
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap_or_default())
}

/// A token with the right claims for `subject`, signed by a key the API server never had.
fn forged(issuer: &str, subject: &str, kid: &str) -> String {
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).unwrap();
    let enc = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let now = SystemClock
        .now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signing_input = format!(
        "{}.{}",
        enc(serde_json::json!({"alg": "ES256", "kid": kid})),
        enc(
            serde_json::json!({"iss": issuer, "aud": [AUDIENCE], "sub": subject, "exp": now + 3600, "iat": now})
        ),
    );
    let sig = key.sign(&rng, signing_input.as_bytes()).unwrap();
    format!(
        "{signing_input}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sig.as_ref())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver from scripts/peers.sh, skopeo, docker-registry, htpasswd: run scripts/test.sh"]
async fn quay_federation_pulls_with_the_pods_token_and_refuses_every_other_token() {
    peer("skopeo", "apt-get install skopeo");
    let cp = ControlPlane::shared();
    let ns = cp.namespace("quay-fed").await;
    let dir = tempfile::tempdir().unwrap();
    let robot_token = format!("robot-{:032x}", rand_u128());
    let registry = Registry::start_with(Some((ROBOT, &robot_token)));
    let (issuer, keys) = discovery(cp).await;
    let kid = keys[0].0.clone();
    let exchange = Arc::new(Exchange {
        issuer: issuer.clone(),
        keys,
        subject: format!("system:serviceaccount:{ns}:puller"),
        robot_token: robot_token.clone(),
        seen: Mutex::default(),
    });
    let url = serve(exchange.clone()).await;

    // The pod's projected token, as the kubelet writes it: TokenRequest for the audience.
    let token = cp.service_account_token(&ns, "puller", &[AUDIENCE]).await;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let good = config(dir.path(), "good", &registry.host, &url, &token_file);

    // skopeo pushes and pulls through the helper, which exchanges the token.
    let authfile = dir.path().join("auth.json");
    std::fs::write(
        &authfile,
        serde_json::json!({"credHelpers": {registry.host.as_str(): "regbroker"}}).to_string(),
    )
    .unwrap();
    let layout = oci_layout(dir.path(), "federated");
    let image = format!("docker://{}/acme/app:v1", registry.host);
    let auth = authfile.to_str().unwrap();
    let push = skopeo(
        &[
            "copy",
            "--authfile",
            auth,
            "--dest-tls-verify=false",
            &format!("oci:{}:v1", layout.display()),
            &image,
        ],
        dir.path(),
        &good,
    );
    assert!(push.status.success(), "push: {}", text(&push.stderr));
    let pulled = dir.path().join("pulled");
    let pull = skopeo(
        &[
            "copy",
            "--authfile",
            auth,
            "--src-tls-verify=false",
            &image,
            &format!("oci:{}:v1", pulled.display()),
        ],
        dir.path(),
        &good,
    );
    assert!(pull.status.success(), "pull: {}", text(&pull.stderr));
    assert!(pulled.join("index.json").is_file());
    assert!(exchange.requests() >= 1);
    assert!(exchange.seen.lock().unwrap().iter().all(|(_, v)| v.is_ok()));

    // The sidecar answers the same credential.
    let sidecar = ServeProcess::start(&["--config", good.to_str().unwrap()], &[]);
    let (status, body) = credentials(&sidecar, &registry.host).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["username"], ROBOT);
    assert_eq!(body["password"], robot_token.as_str());
    // A host outside every rule gets nothing, and the exchange hears nothing of it.
    let before = exchange.requests();
    let (status, body) = credentials(&sidecar, "127.0.0.1:1").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(exchange.requests(), before);
    drop(sidecar);

    // Adversaries, each through a fresh sidecar: the refusal reaches the client as 403
    // with its reason, and no credential.
    let other = cp.service_account_token(&ns, "intruder", &[AUDIENCE]).await;
    let forged = forged(&issuer, &format!("system:serviceaccount:{ns}:puller"), &kid);
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
        let file = dir.path().join(format!("token-{name}"));
        std::fs::write(&file, bad).unwrap();
        let cfg = config(dir.path(), name, &registry.host, &url, &file);
        let sidecar = ServeProcess::start(&["--config", cfg.to_str().unwrap()], &[]);
        let before = exchange.requests();
        let (status, body) = credentials(&sidecar, &registry.host).await;
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
}

fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    aws_lc_rs::rand::fill(&mut b).unwrap();
    u128::from_le_bytes(b)
}
