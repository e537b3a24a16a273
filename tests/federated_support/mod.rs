//! Shared by the federated-provider tests: the real API server as an OIDC issuer (its
//! discovery document and JWKS), and a stand-in of Quay's robot federation endpoint,
//! written from Red Hat's Quay documentation (no Quay runs here), that verifies each
//! token's ES256 signature against that JWKS, its issuer, audience, subject and expiry,
//! before it answers the robot token.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use regbroker_provider::{Clock as _, SystemClock};

use crate::control_plane::ControlPlane;
use crate::registry_peer::Registry;

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

/// The check every stand-in here makes of a ServiceAccount token, as an OIDC relying
/// party does: its ES256 signature verifies against one of the issuer's `keys` (by
/// `kid`), and its issuer, audience, subject and expiry are the ones `trusted_by` (the
/// robot, the registry) trusts. The error says which check failed, never the token.
pub fn verify_token(
    issuer: &str,
    keys: &[(String, Vec<u8>)],
    audience: &str,
    subject: &str,
    trusted_by: &str,
    jwt: &str,
) -> Result<(), String> {
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
    let verified = keys.iter().any(|(kid, point)| {
        header["kid"].as_str() == Some(kid)
            && UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
                .verify(format!("{h}.{p}").as_bytes(), &signature)
                .is_ok()
    });
    if !verified {
        return Err("the token's signature does not verify against the issuer's keys".into());
    }
    if claims["iss"] != issuer {
        return Err("the token's issuer is not trusted".into());
    }
    let aud_ok = match &claims["aud"] {
        serde_json::Value::Array(a) => a.iter().any(|x| x == audience),
        other => other == audience,
    };
    if !aud_ok {
        return Err("the token is for another audience".into());
    }
    if claims["sub"] != subject {
        return Err(format!(
            "the token's subject is not trusted by {trusted_by}"
        ));
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
        verify_token(
            &self.issuer,
            &self.keys,
            AUDIENCE,
            &self.subject,
            ROBOT,
            jwt,
        )
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

/// Writes `dir/NAME.toml` holding `toml`; returns its path.
pub fn write_config(dir: &Path, name: &str, toml: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).unwrap();
    path
}

/// `GET /v1/credentials?registry=REGISTRY` on a sidecar at `addr`: status and JSON body.
pub async fn credentials(addr: &str, registry: &str) -> (u16, serde_json::Value) {
    let res = reqwest::Client::new()
        .get(format!("http://{addr}/v1/credentials"))
        .query(&[("registry", registry)])
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap_or_default())
}

/// The Quay scenario the federated tests start from: a distribution registry whose one
/// htpasswd user is the robot, its password a fresh robot token, and the stand-in exchange
/// ([`serve`]) handing out that token for the API server's tokens of
/// `system:serviceaccount:NS:puller`, for [`AUDIENCE`], only.
pub struct Quay {
    pub registry: Registry,
    pub exchange: Arc<Exchange>,
    /// The stand-in's base URL: a rule's `url`.
    pub url: String,
    pub robot_token: String,
    /// The API server's issuer, and the `kid` of its signing key.
    pub issuer: String,
    pub kid: String,
}

impl Quay {
    /// Starts the registry and the stand-in, trusting `NS/puller`.
    pub async fn start(cp: &ControlPlane, ns: &str) -> Quay {
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
        Quay {
            registry,
            exchange,
            url,
            robot_token,
            issuer,
            kid,
        }
    }

    /// The `[[rule]]` sending the registry to the stand-in: `quay`, [`AUDIENCE`],
    /// [`ROBOT`], reading `token_file` when given (a Secret or a RegistryCredential
    /// needs none: regbroker asks TokenRequest for the ServiceAccount's token).
    pub fn rule(&self, token_file: Option<&Path>) -> String {
        let file = token_file
            .map(|f| format!(", token_file = \"{}\"", f.display()))
            .unwrap_or_default();
        format!(
            "[[rule]]\nmatch = \"{}\"\nsource = \"quay\"\noptions = {{ audience = \"{AUDIENCE}\", robot = \"{ROBOT}\", url = \"{}\"{file} }}\n",
            self.registry.host, self.url
        )
    }

    /// Whether every exchange so far handed out the robot token (no refusal).
    pub fn all_accepted(&self) -> bool {
        self.exchange
            .seen
            .lock()
            .unwrap()
            .iter()
            .all(|(_, v)| v.is_ok())
    }
}

/// The audience the pass-through stand-in ([`OidcFront`]) trusts.
pub const OIDC_AUDIENCE: &str = "zot.regbroker.test";

/// A stand-in for a registry that validates the ServiceAccount token itself, as Zot does
/// with its OIDC workload-identity federation (and Harbor next): none runs here, and the
/// distribution registry cannot take a JWT as an htpasswd password (bcrypt reads only
/// the first 72 bytes of a password). It answers every request without acceptable Basic
/// credentials with 401 and a `Basic` challenge; it accepts one only when the password
/// is a token of the trusted subject that [`verify_token`] passes for [`OIDC_AUDIENCE`]
/// against the API server's JWKS, and then forwards it, without its `Authorization`, to an
/// anonymous distribution registry behind it (a minimal reverse proxy: whole bodies in
/// memory, redirects passed back as they are, never followed).
pub struct OidcFront {
    /// `127.0.0.1:PORT`: the registry's name as clients write it.
    pub host: String,
    /// Every password presented, with the verdict.
    pub seen: Presented,
}

/// What [`OidcFront`] saw: each password presented, with its verdict.
pub type Presented = Arc<Mutex<Vec<(String, Result<(), String>)>>>;

struct FrontState {
    issuer: String,
    keys: Vec<(String, Vec<u8>)>,
    subject: String,
    backend: String,
    client: reqwest::Client,
    seen: Presented,
}

impl OidcFront {
    /// Serves on loopback in front of the anonymous registry at `backend`
    /// (`127.0.0.1:PORT`), trusting `subject`'s tokens from `issuer` signed by `keys`.
    pub async fn start(
        issuer: &str,
        keys: Vec<(String, Vec<u8>)>,
        subject: &str,
        backend: &str,
    ) -> OidcFront {
        let seen = Arc::new(Mutex::default());
        let state = Arc::new(FrontState {
            issuer: issuer.to_string(),
            keys,
            subject: subject.to_string(),
            backend: format!("http://{backend}"),
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            seen: Arc::clone(&seen),
        });
        let app = axum::Router::new()
            .fallback(move |req: axum::extract::Request| forward(state.clone(), req));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        OidcFront { host, seen }
    }

    /// How many requests carried `password`.
    pub fn presented(&self, password: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == password)
            .count()
    }

    /// How many requests it accepted and forwarded.
    pub fn accepted(&self) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.is_ok())
            .count()
    }
}

/// The password of a request's `Authorization: Basic`, if any.
fn basic_password(headers: &HeaderMap) -> Option<String> {
    let pair = headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let pair = base64::engine::general_purpose::STANDARD
        .decode(pair)
        .ok()?;
    let pair = String::from_utf8(pair).ok()?;
    Some(pair.split_once(':')?.1.to_string())
}

async fn forward(state: Arc<FrontState>, req: axum::extract::Request) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let password = basic_password(req.headers());
    let verdict = match &password {
        None => Err("no Basic credentials".to_string()),
        Some(p) => verify_token(
            &state.issuer,
            &state.keys,
            OIDC_AUDIENCE,
            &state.subject,
            "the registry",
            p,
        ),
    };
    if let Some(p) = password {
        state.seen.lock().unwrap().push((p, verdict.clone()));
    }
    if let Err(why) = verdict {
        let body = serde_json::json!({"errors": [{"code": "UNAUTHORIZED", "message": why}]});
        return (
            StatusCode::UNAUTHORIZED,
            [
                (
                    "www-authenticate",
                    "Basic realm=\"regbroker-oidc-stand-in\"",
                ),
                ("content-type", "application/json"),
            ],
            body.to_string(),
        )
            .into_response();
    }
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 64 << 20).await.unwrap();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut upstream = state
        .client
        .request(parts.method.clone(), format!("{}{path}", state.backend))
        .body(body);
    for (name, value) in &parts.headers {
        // The length too: reqwest sets it from the body it sends.
        if !HOP_BY_HOP.contains(&name.as_str())
            && !["authorization", "host", "content-length"].contains(&name.as_str())
        {
            upstream = upstream.header(name, value);
        }
    }
    let Ok(answer) = upstream.send().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let mut response = axum::http::Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            response = response.header(name, value);
        }
    }
    let bytes = answer.bytes().await.unwrap_or_default();
    response.body(axum::body::Body::from(bytes)).unwrap()
}

/// Headers about one connection, not the message: never forwarded. The response's
/// length is (the whole body is forwarded, and a HEAD answer keeps the registry's).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
];

/// The vendors a [`Federation`] stand-in speaks for, each written here from the vendor's
/// public documentation (neither runs here), as recorded in `providers/federated/README.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// JFrog's OIDC token exchange: `POST /access/api/v1/oidc/token`, a JSON
    /// token-exchange request (`grant_type`, `subject_token_type` id_token,
    /// `subject_token`, `provider_name`); answers `access_token` (a JWT whose `sub` is
    /// `<service id>/users/<user>`), `expires_in` as a string (as in JFrog's examples),
    /// `token_type` and `scope`, and no `username`.
    Artifactory,
    /// Cloudsmith's OIDC exchange: `POST /openid/<org>/` with `oidc_token` and
    /// `service_slug`; answers `201 {"token": ...}`.
    Cloudsmith,
}

/// The JFrog OIDC integration the stand-in knows.
pub const JFROG_PROVIDER: &str = "regbroker-k8s";
/// The JFrog user its identity mapping gives `puller`: only the access token's `sub` says so.
pub const JFROG_USER: &str = "ci-puller";
/// The Cloudsmith organisation and the service account whose OIDC trusts `puller`.
pub const CLOUDSMITH_ORG: &str = "acme";
pub const CLOUDSMITH_SERVICE: &str = "k8s-puller";

impl Vendor {
    /// The audience the vendor's OIDC integration is configured to trust.
    pub fn audience(self) -> &'static str {
        match self {
            Vendor::Artifactory => "jfrog.regbroker.test",
            Vendor::Cloudsmith => "cloudsmith.regbroker.test",
        }
    }

    /// The registry username its tokens log in with: JFrog's mapped user; Cloudsmith's
    /// documented `token`.
    pub fn username(self) -> &'static str {
        match self {
            Vendor::Artifactory => JFROG_USER,
            Vendor::Cloudsmith => "token",
        }
    }

    /// A fresh access token as the vendor hands it out. JFrog's is a JWT naming the
    /// user in its `sub`; random bits come first in its payload (the distribution
    /// registry's bcrypt reads only a password's first 72 bytes).
    fn new_token(self) -> String {
        match self {
            Vendor::Artifactory => {
                let enc = |v: serde_json::Value| {
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
                };
                format!(
                    "{}.{}.{:032x}",
                    enc(serde_json::json!({"alg": "RS256"})),
                    enc(serde_json::json!({
                        "jti": format!("{:032x}", rand_u128()),
                        "sub": format!("jfac@01h0regbroker/users/{JFROG_USER}"),
                        "scp": "applied-permissions/user",
                    })),
                    rand_u128()
                )
            }
            Vendor::Cloudsmith => format!("cs-{:032x}", rand_u128()),
        }
    }
}

/// A stand-in of `vendor`'s exchange on loopback, trusting one subject's tokens from the
/// API server for the vendor's audience and handing out one token.
pub struct VendorExchange {
    pub vendor: Vendor,
    /// The stand-in's base URL: a rule's `url`.
    pub url: String,
    /// The one token it hands out.
    pub token: String,
    /// Every exchange's verdict.
    pub seen: Arc<Mutex<Vec<Result<(), String>>>>,
}

struct VendorState {
    vendor: Vendor,
    issuer: String,
    keys: Vec<(String, Vec<u8>)>,
    subject: String,
    token: String,
    seen: Arc<Mutex<Vec<Result<(), String>>>>,
}

impl VendorState {
    /// The request's fields as the vendor documents them, then the token.
    fn verify(&self, request: &serde_json::Value) -> Result<(), String> {
        let field = |k: &str| request[k].as_str().unwrap_or_default().to_string();
        let (jwt, trusted_by) = match self.vendor {
            Vendor::Artifactory => {
                if field("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange"
                    || field("subject_token_type") != "urn:ietf:params:oauth:token-type:id_token"
                {
                    return Err("not an OIDC token-exchange request".into());
                }
                if field("provider_name") != JFROG_PROVIDER {
                    return Err(format!(
                        "no OIDC integration named {}",
                        field("provider_name")
                    ));
                }
                (field("subject_token"), JFROG_PROVIDER)
            }
            Vendor::Cloudsmith => {
                if field("service_slug") != CLOUDSMITH_SERVICE {
                    return Err(format!("no OIDC for service {}", field("service_slug")));
                }
                (field("oidc_token"), CLOUDSMITH_SERVICE)
            }
        };
        verify_token(
            &self.issuer,
            &self.keys,
            self.vendor.audience(),
            &self.subject,
            trusted_by,
            &jwt,
        )
    }

    /// The vendor's answer: JFrog's token-exchange answer or its `errors`; Cloudsmith's
    /// `201 {"token"}` or its `detail`.
    fn answer(&self, verdict: Result<(), String>) -> (StatusCode, axum::Json<serde_json::Value>) {
        let (status, body) = match (verdict, self.vendor) {
            (Ok(()), Vendor::Artifactory) => (
                StatusCode::OK,
                serde_json::json!({
                    "access_token": self.token,
                    "expires_in": "3600",
                    "token_type": "Bearer",
                    "scope": "applied-permissions/user",
                }),
            ),
            (Ok(()), Vendor::Cloudsmith) => (
                StatusCode::CREATED,
                serde_json::json!({"token": self.token}),
            ),
            (Err(why), Vendor::Artifactory) => (
                StatusCode::UNAUTHORIZED,
                serde_json::json!({"errors": [{"code": "UNAUTHORIZED", "message": why}]}),
            ),
            (Err(why), Vendor::Cloudsmith) => {
                (StatusCode::UNAUTHORIZED, serde_json::json!({"detail": why}))
            }
        };
        (status, axum::Json(body))
    }
}

impl VendorExchange {
    /// Serves `vendor`'s exchange trusting `subject`'s tokens from `issuer`, signed by
    /// one of `keys`, for the vendor's audience.
    pub async fn serve(
        vendor: Vendor,
        issuer: &str,
        keys: Vec<(String, Vec<u8>)>,
        subject: &str,
    ) -> VendorExchange {
        let token = vendor.new_token();
        let seen = Arc::new(Mutex::default());
        let state = Arc::new(VendorState {
            vendor,
            issuer: issuer.to_string(),
            keys,
            subject: subject.to_string(),
            token: token.clone(),
            seen: Arc::clone(&seen),
        });
        let handler = move |body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let verdict = state.verify(&request);
                state.seen.lock().unwrap().push(verdict.clone());
                state.answer(verdict)
            }
        };
        let path = match vendor {
            Vendor::Artifactory => "/access/api/v1/oidc/token".to_string(),
            Vendor::Cloudsmith => format!("/openid/{CLOUDSMITH_ORG}/"),
        };
        let app = axum::Router::new().route(&path, axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        VendorExchange {
            vendor,
            url,
            token,
            seen,
        }
    }

    /// `host:port` of the stand-in.
    pub fn host(&self) -> &str {
        self.url.strip_prefix("http://").unwrap()
    }

    /// The `[[rule]]` sending `host` to the stand-in, reading `token_file` when given.
    /// The Artifactory rule names no `username`: it comes from the access token.
    pub fn rule(&self, host: &str, token_file: Option<&Path>) -> String {
        let file = token_file
            .map(|f| format!(", token_file = \"{}\"", f.display()))
            .unwrap_or_default();
        let (source, names) = match self.vendor {
            Vendor::Artifactory => (
                "artifactory",
                format!("provider_name = \"{JFROG_PROVIDER}\""),
            ),
            Vendor::Cloudsmith => (
                "cloudsmith",
                format!("org = \"{CLOUDSMITH_ORG}\", service = \"{CLOUDSMITH_SERVICE}\""),
            ),
        };
        format!(
            "[[rule]]\nmatch = \"{host}\"\nsource = \"{source}\"\noptions = {{ audience = \"{}\", {names}, url = \"{}\"{file} }}\n",
            self.vendor.audience(),
            self.url
        )
    }

    /// How many exchanges it answered or refused.
    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Whether every exchange so far handed out the token.
    pub fn all_accepted(&self) -> bool {
        self.seen.lock().unwrap().iter().all(Result::is_ok)
    }
}

/// [`VendorExchange`] trusting `system:serviceaccount:NS:puller`, in front of a
/// distribution registry whose one htpasswd user is the vendor's username with the
/// handed-out token as its password.
pub struct Federation {
    pub registry: Registry,
    pub exchange: VendorExchange,
}

impl Federation {
    pub async fn start(cp: &ControlPlane, ns: &str, vendor: Vendor) -> Federation {
        let (issuer, keys) = discovery(cp).await;
        let subject = format!("system:serviceaccount:{ns}:puller");
        let exchange = VendorExchange::serve(vendor, &issuer, keys, &subject).await;
        let registry = Registry::start_with(Some((vendor.username(), &exchange.token)));
        Federation { registry, exchange }
    }

    /// The registry's rule.
    pub fn rule(&self, token_file: Option<&Path>) -> String {
        self.exchange.rule(&self.registry.host, token_file)
    }
}
