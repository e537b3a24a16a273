//! Loopback fakes of the cloud exchanges no emulator here serves: Entra ID with ACR's
//! `/oauth2/exchange` (over https, with a CA made here, since `azure_identity` refuses an
//! http authority), and Google's STS with IAM Credentials. Each checks the ServiceAccount
//! token it is handed with the real API server's TokenReview (signed by the test control
//! plane, not expired, for the audience the cloud wants) and accepts it only for the
//! subject its trust configuration names, then issues a credential naming the identity it
//! was issued for; every token received is kept for the tests to decode.
//!
//! Used by `kube_registry_credentials_clouds.rs` (the controller in-process) and
//! `kubelet_plugin.rs` (the binary under the kubelet's own plugin code).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Far-future `exp` of what the fakes issue (2100-01-01), so nothing expires in a test.
pub const FAR_EXP: u64 = 4_102_444_800;

// --- Azure -------------------------------------------------------------------------------

pub const ACR_HOST: &str = "tenants.azurecr.io";
pub const AZURE_AUDIENCE: &str = "api://AzureADTokenExchange";
pub const AZURE_TENANT: &str = "11111111-2222-3333-4444-555555555555";
pub const CLIENT_A: &str = "aaaaaaaa-0000-0000-0000-00000000000a";
pub const CLIENT_B: &str = "bbbbbbbb-0000-0000-0000-00000000000b";
/// Regbroker's own Entra ID app (`AZURE_CLIENT_ID`), with a token file the fake accepts.
pub const OPERATOR_CLIENT: &str = "eeeeeeee-0000-0000-0000-0000000000ee";
pub const ACR_SCOPE: &str = "https://containerregistry.azure.net/.default";

// --- Google Cloud ------------------------------------------------------------------------

pub const GAR_HOST: &str = "europe-west1-docker.pkg.dev";
pub const GCP_PROVIDER: &str =
    "projects/123456789/locations/global/workloadIdentityPools/tenants/providers/cluster";
pub const EMAIL_B: &str = "team-b-puller@tenants.iam.gserviceaccount.com";

/// An unsigned JWT with `payload` (what Entra ID and ACR tokens look like to a client).
pub fn jwt(payload: serde_json::Value) -> String {
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.c2lnbmF0dXJl",
        e.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        e.encode(payload.to_string())
    )
}

/// The claims of `token` (a JWT), decoded here, not taken from anyone's bookkeeping.
pub fn claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&raw).unwrap()
}

/// `system:serviceaccount:NS:puller`, the subject of the tenant's ServiceAccount token.
pub fn subject(ns: &str) -> String {
    format!("system:serviceaccount:{ns}:puller")
}

/// Who the API server says `token` is, when it is this control plane's token for
/// `audience` (TokenReview, as the admin); what a cloud checks against the issuer's keys.
pub async fn review(kube: &kube::Client, token: &str, audience: &str) -> Option<String> {
    let request = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: Some(vec![audience.to_string()]),
        },
        ..Default::default()
    };
    let status = Api::<TokenReview>::all(kube.clone())
        .create(&PostParams::default(), &request)
        .await
        .ok()?
        .status?;
    let audiences = status.audiences.unwrap_or_default();
    (status.authenticated == Some(true) && audiences.iter().any(|a| a == audience))
        .then_some(status.user?.username?)
}

pub fn form(body: &str) -> BTreeMap<String, String> {
    serde_urlencoded::from_str(body).unwrap_or_default()
}

pub fn refuse(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Entra ID and ACR's exchange. Entra ID accepts a client assertion for a client only
/// when the API server vouches for it (audience `api://AzureADTokenExchange`) and its
/// subject is the one the client's federated credential names; regbroker's own app only
/// with its own token file's content.
pub struct Entra {
    pub kube: kube::Client,
    /// Federated credentials: client id -> the subject it trusts.
    pub federated: BTreeMap<String, String>,
    pub operator_token: String,
    /// Every (client id, client assertion) Entra ID received.
    pub assertions: Mutex<Vec<(String, String)>>,
    /// Entra ID access token -> the client it was issued to.
    pub access: Mutex<BTreeMap<String, String>>,
    /// ACR refresh tokens (the registry credential) by the client they were issued for.
    pub issued: Mutex<BTreeMap<String, Vec<String>>>,
    pub n: AtomicUsize,
}

impl Entra {
    pub fn issued_to(&self, client: &str) -> Vec<String> {
        self.issued
            .lock()
            .unwrap()
            .get(client)
            .cloned()
            .unwrap_or_default()
    }
}

pub async fn entra_token(
    State(fake): State<Arc<Entra>>,
    UrlPath(tenant): UrlPath<String>,
    body: String,
) -> Response {
    let f = form(&body);
    let client = f.get("client_id").cloned().unwrap_or_default();
    let assertion = f.get("client_assertion").cloned().unwrap_or_default();
    fake.assertions
        .lock()
        .unwrap()
        .push((client.clone(), assertion.clone()));
    let invalid = |code: u32, text: &str| {
        refuse(
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid_request", "error_description": format!("AADSTS{code}: {text}"), "error_codes": [code]}),
        )
    };
    if tenant != AZURE_TENANT {
        return invalid(90002, "Tenant not found.");
    }
    if f.get("grant_type").map(String::as_str) != Some("client_credentials")
        || f.get("client_assertion_type").map(String::as_str)
            != Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        || f.get("scope").map(String::as_str) != Some(ACR_SCOPE)
    {
        return invalid(900144, "Malformed request.");
    }
    let trusted = if client == OPERATOR_CLIENT {
        assertion == fake.operator_token
    } else {
        match fake.federated.get(&client) {
            Some(sub) => {
                review(&fake.kube, &assertion, AZURE_AUDIENCE)
                    .await
                    .as_ref()
                    == Some(sub)
            }
            None => return invalid(700016, "Application not found in the directory."),
        }
    };
    if !trusted {
        return refuse(
            StatusCode::UNAUTHORIZED,
            json!({"error": "invalid_client", "error_description": "AADSTS700213: No matching federated identity record found.", "error_codes": [700213]}),
        );
    }
    let n = fake.n.fetch_add(1, Ordering::SeqCst);
    let token = jwt(json!({
        "aud": "https://containerregistry.azure.net",
        "tid": AZURE_TENANT,
        "appid": client,
        "exp": FAR_EXP,
        "n": n,
    }));
    fake.access.lock().unwrap().insert(token.clone(), client);
    axum::Json(json!({"token_type": "Bearer", "expires_in": 3599, "access_token": token}))
        .into_response()
}

pub async fn acr_exchange(State(fake): State<Arc<Entra>>, body: String) -> Response {
    let f = form(&body);
    let client = f
        .get("access_token")
        .and_then(|t| fake.access.lock().unwrap().get(t).cloned());
    let (Some(client), Some("access_token"), Some(ACR_HOST), Some(AZURE_TENANT)) = (
        client,
        f.get("grant_type").map(String::as_str),
        f.get("service").map(String::as_str),
        f.get("tenant").map(String::as_str),
    ) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            json!({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}),
        );
    };
    let n = fake.n.fetch_add(1, Ordering::SeqCst);
    let refresh =
        jwt(json!({"exp": FAR_EXP, "grant_type": "refresh_token", "client": client, "n": n}));
    fake.issued
        .lock()
        .unwrap()
        .entry(client)
        .or_default()
        .push(refresh.clone());
    axum::Json(json!({"refresh_token": refresh})).into_response()
}

/// Starts the Entra ID and ACR fake over https; returns its base URL and CA.
pub async fn start_entra(fake: Arc<Entra>) -> (String, String) {
    let app = Router::new()
        .route("/{tenant}/oauth2/v2.0/token", post(entra_token))
        .route("/oauth2/exchange", post(acr_exchange))
        .with_state(fake);
    let (ca_pem, acceptor) = test_tls();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)): std::io::Result<(tokio::net::TcpStream, SocketAddr)> =
                listener.accept().await
            else {
                return;
            };
            let (app, acceptor) = (app.clone(), acceptor.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (base, ca_pem)
}

/// A CA and a server certificate for 127.0.0.1, generated now.
pub fn test_tls() -> (String, TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca_cert.pem(), TlsAcceptor::from(Arc::new(config)))
}

/// Google's STS and IAM Credentials. STS accepts a subject token when the API server
/// vouches for it for the audience asked (a provider of the pool) and issues a federated
/// token for its subject; IAM Credentials lets a federated token act as a Google service
/// account only when its subject is the one granted `roles/iam.workloadIdentityUser`.
pub struct Google {
    pub kube: kube::Client,
    /// Google service account -> the subject allowed to impersonate it.
    pub impersonators: BTreeMap<String, String>,
    /// Every (audience, subject token) STS received.
    pub exchanges: Mutex<Vec<(String, String)>>,
    /// Federated token -> its subject.
    pub federated: Mutex<BTreeMap<String, String>>,
    /// Access tokens by whom they were issued for: a subject, or a Google service account.
    pub issued: Mutex<BTreeMap<String, Vec<String>>>,
    pub n: AtomicUsize,
}

impl Google {
    pub fn issued_to(&self, who: &str) -> Vec<String> {
        self.issued
            .lock()
            .unwrap()
            .get(who)
            .cloned()
            .unwrap_or_default()
    }

    pub fn issue(&self, prefix: &str, who: &str) -> String {
        let token = format!("ya29.{prefix}-{}", self.n.fetch_add(1, Ordering::SeqCst));
        self.issued
            .lock()
            .unwrap()
            .entry(who.to_string())
            .or_default()
            .push(token.clone());
        token
    }
}

pub async fn sts_token(State(fake): State<Arc<Google>>, body: String) -> Response {
    let f = form(&body);
    let audience = f.get("audience").cloned().unwrap_or_default();
    let token = f.get("subject_token").cloned().unwrap_or_default();
    fake.exchanges
        .lock()
        .unwrap()
        .push((audience.clone(), token.clone()));
    let bad = || refuse(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
    if f.get("grant_type").map(String::as_str)
        != Some("urn:ietf:params:oauth:grant-type:token-exchange")
        || f.get("subject_token_type").map(String::as_str)
            != Some("urn:ietf:params:oauth:token-type:jwt")
        || audience != format!("//iam.googleapis.com/{GCP_PROVIDER}")
    {
        return bad();
    }
    let Some(sub) = review(&fake.kube, &token, &audience).await else {
        return bad();
    };
    let access = fake.issue("sts", &sub);
    fake.federated.lock().unwrap().insert(access.clone(), sub);
    axum::Json(json!({
        "access_token": access,
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "token_type": "Bearer",
        "expires_in": 3600,
    }))
    .into_response()
}

pub async fn generate_access_token(
    State(fake): State<Arc<Google>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let email = name.strip_suffix(":generateAccessToken").unwrap_or("");
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let sub = fake.federated.lock().unwrap().get(bearer).cloned();
    if sub.is_none() || sub.as_ref() != fake.impersonators.get(email) {
        return refuse(
            StatusCode::FORBIDDEN,
            json!({"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "Permission 'iam.serviceAccounts.getAccessToken' denied"}}),
        );
    }
    let token = fake.issue("as", email);
    axum::Json(json!({"accessToken": token, "expireTime": "2100-01-01T00:00:00Z"})).into_response()
}

/// Starts the STS and IAM Credentials fake over http (the provider allows loopback).
pub async fn start_google(fake: Arc<Google>) -> String {
    let app = Router::new()
        .route("/v1/token", post(sts_token))
        .route(
            "/v1/projects/-/serviceAccounts/{name}",
            post(generate_access_token),
        )
        .with_state(fake);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}
