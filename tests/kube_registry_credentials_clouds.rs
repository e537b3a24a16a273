//! The `RegistryCredential` controller with Azure and Google Cloud per-workload identity,
//! on a real kube-apiserver: the CRD and RBAC from `deploy/registry-credentials`, the
//! controller in-process as its ServiceAccount, and each tenant's ServiceAccount token
//! from the API server's TokenRequest, as in `kube_registry_credentials.rs` (AWS).
//!
//! What is fake, and why: Entra ID, ACR's `/oauth2/exchange`, Google's STS and IAM
//! Credentials are cloud services with no emulator that runs here (gcplocal serves only
//! the metadata server's own identity, never a federation exchange). So they are axum
//! fakes on 127.0.0.1 that do what the clouds' trust configuration does: each checks the
//! token it is handed with the API server's own TokenReview (signed by this control
//! plane, not expired, for the audience the cloud wants) and accepts it only for the
//! subject its "federated credential" names, then issues a credential naming the
//! identity it was issued for. Entra ID is served over https with a CA made here, since
//! `azure_identity` refuses an http authority. Every token a fake received is kept, and
//! the tests decode its claims themselves.
//!
//! Regbroker's own identity is configured and working in each broker (an Entra ID app
//! with a token file the fake accepts; a GCE metadata server), so a fall-back to it would
//! produce a Secret, and the tests check it never does.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(all(feature = "azure", feature = "gcp"))]

mod common;
mod control_plane;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use common::FakeMetadata;
use control_plane::{ControlPlane, eventually};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use regbroker::broker::Broker;
use regbroker::broker::providers::Providers;
use regbroker::broker::routing::Router as Routes;
use regbroker::broker::static_secret;
use regbroker::controller::api::{RegistryCredential, RegistryCredentialSpec};
use regbroker::metrics::Metrics;
use regbroker_provider::Provider;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The issuer `tests/control_plane` gives kube-apiserver.
fn issuer(cp: &ControlPlane) -> String {
    format!("{}/regbroker-test", cp.server)
}
/// Far-future `exp` of what the fakes issue (2100-01-01), so nothing expires in a test.
const FAR_EXP: u64 = 4_102_444_800;

// --- Azure -------------------------------------------------------------------------------

const ACR_HOST: &str = "tenants.azurecr.io";
const AZURE_AUDIENCE: &str = "api://AzureADTokenExchange";
const AZURE_TENANT: &str = "11111111-2222-3333-4444-555555555555";
const CLIENT_A: &str = "aaaaaaaa-0000-0000-0000-00000000000a";
const CLIENT_B: &str = "bbbbbbbb-0000-0000-0000-00000000000b";
/// Regbroker's own Entra ID app (`AZURE_CLIENT_ID`), with a token file the fake accepts.
const OPERATOR_CLIENT: &str = "eeeeeeee-0000-0000-0000-0000000000ee";
const ACR_SCOPE: &str = "https://containerregistry.azure.net/.default";

// --- Google Cloud ------------------------------------------------------------------------

const GAR_HOST: &str = "europe-west1-docker.pkg.dev";
const GCP_PROVIDER: &str =
    "projects/123456789/locations/global/workloadIdentityPools/tenants/providers/cluster";
const EMAIL_B: &str = "team-b-puller@tenants.iam.gserviceaccount.com";

/// An unsigned JWT with `payload` (what Entra ID and ACR tokens look like to a client).
fn jwt(payload: serde_json::Value) -> String {
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.c2lnbmF0dXJl",
        e.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        e.encode(payload.to_string())
    )
}

/// The claims of `token` (a JWT), decoded here, not taken from anyone's bookkeeping.
fn claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&raw).unwrap()
}

/// `system:serviceaccount:NS:puller`, the subject of the tenant's ServiceAccount token.
fn subject(ns: &str) -> String {
    format!("system:serviceaccount:{ns}:puller")
}

/// Who the API server says `token` is, when it is this control plane's token for
/// `audience` (TokenReview, as the admin); what a cloud checks against the issuer's keys.
async fn review(kube: &kube::Client, token: &str, audience: &str) -> Option<String> {
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

fn form(body: &str) -> BTreeMap<String, String> {
    serde_urlencoded::from_str(body).unwrap_or_default()
}

fn refuse(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Entra ID and ACR's exchange. Entra ID accepts a client assertion for a client only
/// when the API server vouches for it (audience `api://AzureADTokenExchange`) and its
/// subject is the one the client's federated credential names; regbroker's own app only
/// with its own token file's content.
struct Entra {
    kube: kube::Client,
    /// Federated credentials: client id -> the subject it trusts.
    federated: BTreeMap<String, String>,
    operator_token: String,
    /// Every (client id, client assertion) Entra ID received.
    assertions: Mutex<Vec<(String, String)>>,
    /// Entra ID access token -> the client it was issued to.
    access: Mutex<BTreeMap<String, String>>,
    /// ACR refresh tokens (the registry credential) by the client they were issued for.
    issued: Mutex<BTreeMap<String, Vec<String>>>,
    n: AtomicUsize,
}

impl Entra {
    fn issued_to(&self, client: &str) -> Vec<String> {
        self.issued
            .lock()
            .unwrap()
            .get(client)
            .cloned()
            .unwrap_or_default()
    }
}

async fn entra_token(
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

async fn acr_exchange(State(fake): State<Arc<Entra>>, body: String) -> Response {
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
async fn start_entra(fake: Arc<Entra>) -> (String, String) {
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
fn test_tls() -> (String, TlsAcceptor) {
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
struct Google {
    kube: kube::Client,
    /// Google service account -> the subject allowed to impersonate it.
    impersonators: BTreeMap<String, String>,
    /// Every (audience, subject token) STS received.
    exchanges: Mutex<Vec<(String, String)>>,
    /// Federated token -> its subject.
    federated: Mutex<BTreeMap<String, String>>,
    /// Access tokens by whom they were issued for: a subject, or a Google service account.
    issued: Mutex<BTreeMap<String, Vec<String>>>,
    n: AtomicUsize,
}

impl Google {
    fn issued_to(&self, who: &str) -> Vec<String> {
        self.issued
            .lock()
            .unwrap()
            .get(who)
            .cloned()
            .unwrap_or_default()
    }

    fn issue(&self, prefix: &str, who: &str) -> String {
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

async fn sts_token(State(fake): State<Arc<Google>>, body: String) -> Response {
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

async fn generate_access_token(
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
async fn start_google(fake: Arc<Google>) -> String {
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

// --- The controller ----------------------------------------------------------------------

/// The controller, stopped when the handle drops.
struct Running(tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The controller as the deploy/ RBAC's ServiceAccount, watching `namespaces`, with
/// `provider` as the broker's only provider.
async fn start(cp: &ControlPlane, provider: Arc<dyn Provider>, namespaces: &[&str]) -> Running {
    let ns = cp.registry_credential_operator().await;
    let client = cp.service_account_client(&ns, "regbroker").await;
    let metrics = Arc::new(Metrics::new());
    let broker = Arc::new(Broker::new(
        Arc::new(static_secret::Store::empty(metrics.clone())),
        Routes::new(Vec::new()),
        Providers::new(vec![provider]),
        Default::default(),
        metrics,
        regbroker_provider::system_clock(),
    ));
    let config = regbroker::controller::Config {
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        default_service_account: None,
        reserved: Vec::new(),
    };
    Running(tokio::spawn(regbroker::controller::run(
        broker, client, config, None,
    )))
}

/// A new namespace with ServiceAccount `puller` annotated with `annotations`, and a
/// `RegistryCredential` `pull` for `registry` naming it.
async fn tenant(cp: &ControlPlane, annotations: &[(&str, &str)], registry: &str) -> String {
    cp.registry_credential_operator().await;
    let ns = cp.namespace("tenant").await;
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
    Api::<ServiceAccount>::namespaced(cp.admin(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let spec = RegistryCredentialSpec {
        registries: vec![registry.to_string()],
        service_account_name: Some("puller".into()),
        secret_ref: None,
        target: None,
        suspend: false,
    };
    Api::<RegistryCredential>::namespaced(cp.admin(), &ns)
        .create(
            &PostParams::default(),
            &RegistryCredential::new("pull", spec),
        )
        .await
        .unwrap();
    ns
}

/// Waits (at most 60 s) until object `ns/pull` has condition `type_` = `status` with
/// `reason`; returns its message.
async fn wait_for(cp: &ControlPlane, ns: &str, type_: &str, status: &str, reason: &str) -> String {
    let api = Api::<RegistryCredential>::namespaced(cp.admin(), ns);
    eventually(
        Duration::from_secs(60),
        &format!("{ns}/pull: {type_}={status} {reason}"),
        || async {
            let o = api.get("pull").await.unwrap();
            o.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == type_ && c.status == status && c.reason == reason)
                .map(|c| c.message)
        },
    )
    .await
}

/// Every `auths` entry of Secret `ns/pull`, registry -> (username, password); `None`
/// without a Secret.
async fn auths(cp: &ControlPlane, ns: &str) -> Option<BTreeMap<String, (String, String)>> {
    let s = Api::<Secret>::namespaced(cp.admin(), ns)
        .get_opt("pull")
        .await
        .unwrap()?;
    let raw = &s.data.as_ref().unwrap()[".dockerconfigjson"].0;
    let v: serde_json::Value = serde_json::from_slice(raw).unwrap();
    Some(
        v["auths"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, e)| {
                let pair = base64::engine::general_purpose::STANDARD
                    .decode(e["auth"].as_str().unwrap())
                    .unwrap();
                let (user, password) = std::str::from_utf8(&pair).unwrap().split_once(':').unwrap();
                (k.clone(), (user.to_string(), password.to_string()))
            })
            .collect(),
    )
}

/// Two Azure tenants on one ACR host, annotated with Azure Workload Identity's keys and
/// with the AKS kubelet plugin's, each get the ACR credential Entra ID's fake issued for
/// its own client, having asserted its own ServiceAccount's token (audience
/// `api://AzureADTokenExchange`). A tenant without the annotation, or with a malformed
/// one, is Stalled `IdentityNotConfigured` with no Secret; one naming another tenant's
/// client is refused by that client's federated credential. Regbroker's own app (a
/// working identity in this broker) is never used for any of them.
///
/// Fakes: Entra ID's token endpoint and ACR's exchange (no emulator runs here); they check
/// the assertion with the API server's TokenReview and the federated subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn azure_tenants_get_their_own_clients_credential_and_never_the_operators() {
    let cp = ControlPlane::shared();
    let a = tenant(
        cp,
        &[
            ("azure.workload.identity/client-id", CLIENT_A),
            ("azure.workload.identity/tenant-id", AZURE_TENANT),
        ],
        ACR_HOST,
    )
    .await;
    let b = tenant(
        cp,
        &[
            ("kubernetes.azure.com/acr-client-id", CLIENT_B),
            ("kubernetes.azure.com/acr-tenant-id", AZURE_TENANT),
        ],
        ACR_HOST,
    )
    .await;
    let missing = tenant(cp, &[], ACR_HOST).await;
    let malformed = tenant(
        cp,
        &[("azure.workload.identity/client-id", "not-a-client-id")],
        ACR_HOST,
    )
    .await;
    // Annotated with team a's client: its own token is asserted, and a's federated
    // credential (for a's subject) refuses it.
    let forged = tenant(
        cp,
        &[("azure.workload.identity/client-id", CLIENT_A)],
        ACR_HOST,
    )
    .await;

    let operator_token = jwt(json!({"sub": "regbroker-itself", "aud": [AZURE_AUDIENCE]}));
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("azure-identity-token");
    std::fs::write(&token_file, &operator_token).unwrap();
    let entra = Arc::new(Entra {
        kube: cp.admin(),
        federated: BTreeMap::from([
            (CLIENT_A.to_string(), subject(&a)),
            (CLIENT_B.to_string(), subject(&b)),
        ]),
        operator_token,
        assertions: Mutex::default(),
        access: Mutex::default(),
        issued: Mutex::default(),
        n: AtomicUsize::new(0),
    });
    let (base, ca_pem) = start_entra(entra.clone()).await;
    let http = regbroker_azure::reqwest::Client::builder()
        .tls_certs_only([
            regbroker_azure::reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap(),
        ])
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // Regbroker's own identity: workload identity for its own app, which the fake accepts.
    let azure = regbroker_azure::AzureProvider::builder()
        .env(regbroker_azure::Env::from_pairs(vec![
            ("AZURE_CLIENT_ID", OPERATOR_CLIENT.to_string()),
            ("AZURE_TENANT_ID", AZURE_TENANT.to_string()),
            (
                "AZURE_FEDERATED_TOKEN_FILE",
                token_file.display().to_string(),
            ),
            ("AZURE_AUTHORITY_HOST", format!("{base}/")),
            (
                "REGBROKER_AZURE_EXCHANGE_URL",
                format!("{base}/oauth2/exchange"),
            ),
        ]))
        .http_client(http)
        .retry(1, Duration::from_millis(50))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let _controller = start(
        cp,
        Arc::new(azure),
        &[&a, &b, &missing, &malformed, &forged],
    )
    .await;

    wait_for(cp, &a, "Ready", "True", "Succeeded").await;
    wait_for(cp, &b, "Ready", "True", "Succeeded").await;
    let message = wait_for(cp, &missing, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(
        message.contains("azure.workload.identity/client-id"),
        "{message}"
    );
    let message = wait_for(cp, &malformed, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(
        message.contains("not-a-client-id") || message.contains("GUID"),
        "{message}"
    );
    wait_for(cp, &forged, "Reconciling", "True", "ProgressingWithRetry").await;
    wait_for(cp, &forged, "Ready", "False", "IdentityRejected").await;

    // Each Secret holds exactly the host, with a credential issued for its own client.
    let (a_user, a_password) = auths(cp, &a).await.expect("a's Secret")[ACR_HOST].clone();
    let (b_user, b_password) = auths(cp, &b).await.expect("b's Secret")[ACR_HOST].clone();
    assert_eq!(a_user, regbroker_azure::ACR_USERNAME);
    assert_eq!(b_user, regbroker_azure::ACR_USERNAME);
    assert!(
        entra.issued_to(CLIENT_A).contains(&a_password),
        "a's is not CLIENT_A's"
    );
    assert!(
        entra.issued_to(CLIENT_B).contains(&b_password),
        "b's is not CLIENT_B's"
    );
    assert_eq!(claims(&a_password)["client"], CLIENT_A);
    assert_eq!(claims(&b_password)["client"], CLIENT_B);
    for ns in [&missing, &malformed] {
        assert_eq!(auths(cp, ns).await, None, "{ns} got a Secret");
    }
    // A refused refresh writes the Secret with what it held before: here nothing.
    let held = auths(cp, &forged).await.unwrap_or_default();
    assert!(held.is_empty(), "the forged tenant got {held:?}");

    // What Entra ID received: for each client, the API server's token of the tenant it
    // trusts, for Entra ID's audience; the forged tenant's own token, never a's; nothing
    // from the tenants without a usable annotation, and nothing as regbroker itself.
    let assertions = entra.assertions.lock().unwrap().clone();
    assert!(!assertions.is_empty());
    let mut subjects_by_client: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (client, assertion) in &assertions {
        assert_ne!(client, OPERATOR_CLIENT, "regbroker's own identity was used");
        let c = claims(assertion);
        assert_eq!(c["iss"], issuer(cp), "{c}");
        assert_eq!(c["aud"], json!([AZURE_AUDIENCE]), "{c}");
        let sub = c["sub"].as_str().unwrap().to_string();
        assert_eq!(
            c["kubernetes.io"]["serviceaccount"]["name"], "puller",
            "{c}"
        );
        subjects_by_client
            .entry(client.clone())
            .or_default()
            .push(sub);
    }
    let subjects = |client: &str| -> std::collections::BTreeSet<String> {
        subjects_by_client[client].iter().cloned().collect()
    };
    assert_eq!(subjects(CLIENT_A), [subject(&a), subject(&forged)].into());
    assert_eq!(subjects(CLIENT_B), [subject(&b)].into());
    assert_eq!(subjects_by_client.len(), 2, "{subjects_by_client:?}");
}

/// Two Google Cloud tenants annotated with the pool's provider, one also with a Google
/// service account to act as, each get the token Google's fakes issued for it: the
/// federated token for its own subject, or the impersonated account's token. A tenant
/// without the annotation, or with a malformed one, is Stalled `IdentityNotConfigured`
/// with no Secret; one naming another tenant's Google service account is refused by
/// IAM. Regbroker's own identity (a GCE metadata server here) is never asked.
///
/// Fakes: Google's STS and IAM Credentials (no emulator runs here; gcplocal serves only
/// the metadata server) and the GCE metadata server (`tests/common`); STS checks the
/// subject token with the API server's TokenReview for the provider's audience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh; run scripts/test.sh"]
async fn gcp_tenants_get_their_own_tokens_and_never_the_operators() {
    let cp = ControlPlane::shared();
    const WIP: &str = "gcp.auth.fluxcd.io/workload-identity-provider";
    const GSA: &str = "iam.gke.io/gcp-service-account";
    let a = tenant(cp, &[(WIP, GCP_PROVIDER)], GAR_HOST).await;
    let b = tenant(cp, &[(WIP, GCP_PROVIDER), (GSA, EMAIL_B)], GAR_HOST).await;
    let missing = tenant(cp, &[(GSA, EMAIL_B)], GAR_HOST).await;
    let malformed = tenant(cp, &[(WIP, "projects/123456789/pools/tenants")], GAR_HOST).await;
    let forged = tenant(cp, &[(WIP, GCP_PROVIDER), (GSA, EMAIL_B)], GAR_HOST).await;

    let google = Arc::new(Google {
        kube: cp.admin(),
        impersonators: BTreeMap::from([(EMAIL_B.to_string(), subject(&b))]),
        exchanges: Mutex::default(),
        federated: Mutex::default(),
        issued: Mutex::default(),
        n: AtomicUsize::new(0),
    });
    let base = start_google(google.clone()).await;
    let metadata = FakeMetadata::start(3600, false);
    let gcp = regbroker_gcp::GcpProvider::builder()
        .env([
            ("GCE_METADATA_HOST", metadata.addr.clone()),
            (
                regbroker_gcp::workload::STS_URL_ENV,
                format!("{base}/v1/token"),
            ),
            (
                regbroker_gcp::workload::IAM_CREDENTIALS_URL_ENV,
                base.clone(),
            ),
        ])
        .build();
    let _controller = start(cp, Arc::new(gcp), &[&a, &b, &missing, &malformed, &forged]).await;

    wait_for(cp, &a, "Ready", "True", "Succeeded").await;
    wait_for(cp, &b, "Ready", "True", "Succeeded").await;
    let message = wait_for(cp, &missing, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(message.contains(WIP), "{message}");
    let message = wait_for(cp, &malformed, "Stalled", "True", "IdentityNotConfigured").await;
    assert!(message.contains(WIP), "{message}");
    wait_for(cp, &forged, "Reconciling", "True", "ProgressingWithRetry").await;

    let (a_user, a_password) = auths(cp, &a).await.expect("a's Secret")[GAR_HOST].clone();
    let (b_user, b_password) = auths(cp, &b).await.expect("b's Secret")[GAR_HOST].clone();
    assert_eq!(a_user, "oauth2accesstoken");
    assert_eq!(b_user, "oauth2accesstoken");
    assert!(
        google.issued_to(&subject(&a)).contains(&a_password),
        "a's is not a's federated token"
    );
    assert!(
        google.issued_to(EMAIL_B).contains(&b_password),
        "b's is not {EMAIL_B}'s token"
    );
    assert!(!google.issued_to(EMAIL_B).contains(&a_password));
    for ns in [&missing, &malformed] {
        assert_eq!(auths(cp, ns).await, None, "{ns} got a Secret");
    }
    // A refused refresh writes the Secret with what it held before: here nothing.
    let held = auths(cp, &forged).await.unwrap_or_default();
    assert!(held.is_empty(), "the forged tenant got {held:?}");
    assert_eq!(metadata.calls(), 0, "regbroker's own identity was asked");

    // What STS received: the API server's token of a, b and the forged tenant (never the
    // tenants without a usable annotation), each for the provider's audience.
    let audience = format!("//iam.googleapis.com/{GCP_PROVIDER}");
    let mut subjects = std::collections::BTreeSet::new();
    for (asked, token) in google.exchanges.lock().unwrap().iter() {
        assert_eq!(asked, &audience);
        let c = claims(token);
        assert_eq!(c["iss"], issuer(cp), "{c}");
        assert_eq!(c["aud"], json!([audience]), "{c}");
        subjects.insert(c["sub"].as_str().unwrap().to_string());
    }
    assert_eq!(
        subjects,
        [subject(&a), subject(&b), subject(&forged)].into()
    );
}
