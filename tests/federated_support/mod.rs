//! Shared by the federated-provider tests: the real API server as an OIDC issuer (its
//! discovery document and JWKS), and a stand-in of Quay's robot federation endpoint,
//! written from Red Hat's Quay documentation (no Quay runs here), that verifies each
//! token's ES256 signature against that JWKS, its issuer, audience, subject and expiry,
//! before it answers the robot token.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use regbroker_provider::{Clock as _, SystemClock};

use crate::control_plane::ControlPlane;

/// The audience the stand-in's robot federation trusts.
pub const AUDIENCE: &str = "quay.regbroker.test";
/// The robot whose federation trusts one ServiceAccount.
pub const ROBOT: &str = "acme+puller";

fn b64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()
}

pub async fn get(cp: &ControlPlane, path: &str) -> serde_json::Value {
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
pub async fn discovery(cp: &ControlPlane) -> (String, Vec<(String, Vec<u8>)>) {
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
pub struct Exchange {
    pub issuer: String,
    pub keys: Vec<(String, Vec<u8>)>,
    /// The subject the robot trusts.
    pub subject: String,
    /// The robot token handed out.
    pub robot_token: String,
    /// Every request, as (robot, verdict).
    pub seen: Mutex<Vec<(String, Result<(), String>)>>,
}

impl Exchange {
    /// Quay's federation check, as documented: the robot names the issuer and subject it
    /// trusts; the token must verify against the issuer's keys and be for the audience.
    pub fn verify(&self, robot: &str, jwt: &str) -> Result<(), String> {
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

    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Serves the stand-in on loopback: `GET /oauth2/federation/robot/token` with Basic
/// `<robot>:<token>`.
pub async fn serve(exchange: Arc<Exchange>) -> String {
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

/// A token with the right claims for `subject`, signed by a key the API server never had.
pub fn forged(issuer: &str, subject: &str, kid: &str) -> String {
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

/// 128 random bits, for a robot token nobody can guess.
pub fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    aws_lc_rs::rand::fill(&mut b).unwrap();
    u128::from_le_bytes(b)
}
