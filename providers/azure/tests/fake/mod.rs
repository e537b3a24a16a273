//! In-process fakes of Entra ID, the App Service managed identity endpoint and the ACR
//! exchange endpoint.
//!
//! No Entra ID (Azure AD) emulator exists that can run here, and ACR's `/oauth2/exchange`
//! is a cloud service, so these are faked on 127.0.0.1 (a free port). The Entra ID token
//! endpoint and the exchange are served over https with a CA generated at test time
//! (rcgen), because `azure_identity` refuses a non-https authority host; the provider is
//! given a reqwest client that trusts only that CA (the same client the SDK uses as its
//! transport). The managed identity endpoint is plain http on loopback, as on App
//! Service. The real `azure_identity` code runs against them.

#![allow(dead_code, clippy::unwrap_used)]

pub mod scenario;

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use hyper_util::rt::TokioIo;
use regbroker_azure::reqwest;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Far-future `exp` for tokens that should not expire during the test (2100-01-01).
pub const FAR_EXP: u64 = 4_102_444_800;
/// The `exp` of the default refresh token (2026-01-01T01:00:00Z).
pub const REFRESH_EXP: u64 = 1_767_229_200;
pub const TENANT: &str = "11111111-2222-3333-4444-555555555555";
pub const TOKEN_TENANT: &str = "99999999-8888-7777-6666-555555555555";
pub const CLIENT_ID: &str = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
pub const CLIENT_SECRET: &str = "client-secret-value-Zq9";
pub const SA_TOKEN: &str = "projected-service-account-token-Kx7";
pub const MSI_HEADER: &str = "identity-header-secret-Pw3";
pub const REGISTRY: &str = "myregistry.azurecr.io";

/// A file holding [`SA_TOKEN`] (the projected service account token), in its own temp
/// dir, removed on drop.
pub struct SaTokenFile {
    _dir: tempfile::TempDir,
    pub path: String,
}

impl SaTokenFile {
    pub fn write() -> SaTokenFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("azure-identity-token");
        std::fs::write(&path, SA_TOKEN).unwrap();
        SaTokenFile {
            path: path.display().to_string(),
            _dir: dir,
        }
    }
}

/// The identity env the fake Entra ID accepts: [`CLIENT_ID`], [`TENANT`], and
/// `authority` as `AZURE_AUTHORITY_HOST`. A scenario adds the token file or the secret.
pub fn identity_env(authority: String) -> Vec<(&'static str, String)> {
    vec![
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
        ("AZURE_TENANT_ID", TENANT.to_string()),
        ("AZURE_AUTHORITY_HOST", authority),
    ]
}

/// An unsigned JWT with `payload` (what ACR and Entra ID tokens look like).
pub fn jwt(payload: serde_json::Value) -> String {
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.c2lnbmF0dXJl",
        e.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        e.encode(payload.to_string())
    )
}

/// A scripted error answer.
#[derive(Clone, Debug)]
pub struct Scripted {
    pub status: u16,
    pub body: String,
}

/// What the fakes were asked and what they answer.
#[derive(Debug)]
pub struct FakeCloud {
    pub access_token: String,
    pub refresh_token: Mutex<String>,
    pub expect_scope: Mutex<String>,
    pub aad_script: Mutex<VecDeque<Scripted>>,
    pub exchange_script: Mutex<VecDeque<Scripted>>,
    pub imds_script: Mutex<VecDeque<Scripted>>,
    /// Client assertions accepted besides [`SA_TOKEN`] (JWT-shaped tokens for doctor).
    pub accepted_assertions: Mutex<Vec<String>>,
    pub aad_calls: AtomicUsize,
    pub msi_calls: AtomicUsize,
    pub imds_calls: AtomicUsize,
    pub exchange_calls: AtomicUsize,
    pub aad_forms: Mutex<Vec<HashMap<String, String>>>,
    pub aad_tenants: Mutex<Vec<String>>,
    pub msi_queries: Mutex<Vec<HashMap<String, String>>>,
    pub exchange_forms: Mutex<Vec<HashMap<String, String>>>,
    pub exchange_delay: Mutex<Option<Duration>>,
}

impl FakeCloud {
    pub fn new() -> Arc<FakeCloud> {
        Arc::new(FakeCloud {
            access_token: jwt(json!({
                "aud": "https://containerregistry.azure.net",
                "tid": TOKEN_TENANT,
                "exp": FAR_EXP,
                "marker": "entra-access-token",
            })),
            refresh_token: Mutex::new(jwt(json!({
                "exp": REFRESH_EXP,
                "grant_type": "refresh_token",
                "marker": "acr-refresh-token",
            }))),
            expect_scope: Mutex::new("https://containerregistry.azure.net/.default".into()),
            aad_script: Mutex::new(VecDeque::new()),
            exchange_script: Mutex::new(VecDeque::new()),
            imds_script: Mutex::new(VecDeque::new()),
            accepted_assertions: Mutex::new(Vec::new()),
            aad_calls: AtomicUsize::new(0),
            msi_calls: AtomicUsize::new(0),
            imds_calls: AtomicUsize::new(0),
            exchange_calls: AtomicUsize::new(0),
            aad_forms: Mutex::new(Vec::new()),
            aad_tenants: Mutex::new(Vec::new()),
            msi_queries: Mutex::new(Vec::new()),
            exchange_forms: Mutex::new(Vec::new()),
            exchange_delay: Mutex::new(None),
        })
    }

    pub fn refresh_token(&self) -> String {
        self.refresh_token.lock().unwrap().clone()
    }

    pub fn script_aad(&self, status: u16, body: serde_json::Value) {
        self.aad_script.lock().unwrap().push_back(Scripted {
            status,
            body: body.to_string(),
        });
    }

    pub fn script_exchange(&self, status: u16, body: &str) {
        self.exchange_script.lock().unwrap().push_back(Scripted {
            status,
            body: body.to_string(),
        });
    }

    /// The next scripted answer of `script` (`aad_script` or `exchange_script`), if any.
    fn next_scripted(script: &Mutex<VecDeque<Scripted>>) -> Option<Response> {
        let s = script.lock().unwrap().pop_front()?;
        Some(
            (
                StatusCode::from_u16(s.status).unwrap(),
                [("content-type", "application/json")],
                s.body,
            )
                .into_response(),
        )
    }

    /// A managed identity token answer for query `q` (App Service and IMDS alike).
    fn managed_identity_token(&self, q: &HashMap<String, String>) -> serde_json::Value {
        json!({
            "access_token": self.access_token,
            "expires_on": FAR_EXP.to_string(),
            "resource": q.get("resource").cloned().unwrap_or_default(),
            "token_type": "Bearer",
        })
    }

    fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/{tenant}/oauth2/v2.0/token", post(aad_token))
            .route("/msi/token", get(msi_token))
            .route("/metadata/identity/oauth2/token", get(imds_token))
            .route("/oauth2/exchange", post(acr_exchange))
            .with_state(self.clone())
    }
}

fn aad_error(status: StatusCode, code: i32, text: &str) -> Response {
    (
        status,
        Json(json!({
            "error": "invalid_client",
            "error_description": format!("AADSTS{code}: {text}"),
            "error_codes": [code],
        })),
    )
        .into_response()
}

/// Entra ID `/{tenant}/oauth2/v2.0/token`, client credentials with a client assertion
/// (workload identity) or a client secret.
async fn aad_token(
    State(fake): State<Arc<FakeCloud>>,
    Path(tenant): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    fake.aad_calls.fetch_add(1, Ordering::SeqCst);
    fake.aad_forms.lock().unwrap().push(form.clone());
    fake.aad_tenants.lock().unwrap().push(tenant.clone());
    if let Some(scripted) = FakeCloud::next_scripted(&fake.aad_script) {
        return scripted;
    }
    if tenant != TENANT {
        return aad_error(StatusCode::BAD_REQUEST, 90002, "Tenant not found.");
    }
    if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return aad_error(StatusCode::BAD_REQUEST, 900144, "grant_type missing.");
    }
    if form.get("client_id").map(String::as_str) != Some(CLIENT_ID) {
        return aad_error(
            StatusCode::BAD_REQUEST,
            700016,
            "Application not found in the directory.",
        );
    }
    if form.get("scope") != Some(&*fake.expect_scope.lock().unwrap()) {
        return aad_error(
            StatusCode::BAD_REQUEST,
            70011,
            "The provided scope is invalid.",
        );
    }
    let by_assertion = form
        .get("client_assertion")
        .is_some_and(|a| a == SA_TOKEN || fake.accepted_assertions.lock().unwrap().contains(a))
        && form.get("client_assertion_type").map(String::as_str)
            == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer");
    let by_secret = form.get("client_secret").map(String::as_str) == Some(CLIENT_SECRET);
    if !by_assertion && !by_secret {
        return aad_error(
            StatusCode::UNAUTHORIZED,
            700213,
            "No matching federated identity record found.",
        );
    }
    Json(json!({
        "token_type": "Bearer",
        "expires_in": 3599,
        "ext_expires_in": 3599,
        "access_token": fake.access_token,
    }))
    .into_response()
}

/// App Service style managed identity endpoint (`IDENTITY_ENDPOINT`, API 2019-08-01).
async fn msi_token(
    State(fake): State<Arc<FakeCloud>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    fake.msi_calls.fetch_add(1, Ordering::SeqCst);
    fake.msi_queries.lock().unwrap().push(q.clone());
    if headers
        .get("x-identity-header")
        .and_then(|v| v.to_str().ok())
        != Some(MSI_HEADER)
    {
        return (StatusCode::UNAUTHORIZED, "missing X-IDENTITY-HEADER").into_response();
    }
    if q.get("api-version").map(String::as_str) != Some("2019-08-01") {
        return (StatusCode::BAD_REQUEST, "bad api-version").into_response();
    }
    let mut answer = fake.managed_identity_token(&q);
    answer["client_id"] = json!(q.get("client_id").cloned().unwrap_or_default());
    Json(answer).into_response()
}

/// IMDS `GET /metadata/identity/oauth2/token` (what `169.254.169.254` serves on a VM).
async fn imds_token(
    State(fake): State<Arc<FakeCloud>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    fake.imds_calls.fetch_add(1, Ordering::SeqCst);
    fake.msi_queries.lock().unwrap().push(q.clone());
    if let Some(scripted) = FakeCloud::next_scripted(&fake.imds_script) {
        return scripted;
    }
    if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
        return (
            StatusCode::BAD_REQUEST,
            "Required metadata header not specified",
        )
            .into_response();
    }
    Json(fake.managed_identity_token(&q)).into_response()
}

/// ACR `POST /oauth2/exchange`.
async fn acr_exchange(
    State(fake): State<Arc<FakeCloud>>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    fake.exchange_calls.fetch_add(1, Ordering::SeqCst);
    fake.exchange_forms.lock().unwrap().push(form.clone());
    let delay = *fake.exchange_delay.lock().unwrap();
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    if let Some(scripted) = FakeCloud::next_scripted(&fake.exchange_script) {
        return scripted;
    }
    let unauthorized = || {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"errors":[{"code":"UNAUTHORIZED","message":"authentication required, visit https://aka.ms/acr/authorization for more information."}]})),
        )
            .into_response()
    };
    if form.get("grant_type").map(String::as_str) != Some("access_token")
        || form.get("service").map(String::as_str) != Some(REGISTRY)
        || form.get("access_token") != Some(&fake.access_token)
    {
        return unauthorized();
    }
    Json(json!({"refresh_token": fake.refresh_token()})).into_response()
}

/// A running fake: https base URL (Entra ID + exchange), http base URL (managed
/// identity), the CA to trust, and the state.
#[derive(Debug)]
pub struct Running {
    pub fake: Arc<FakeCloud>,
    pub https: String,
    pub http: String,
    pub ca_pem: String,
}

impl Running {
    pub fn exchange_url(&self) -> String {
        format!("{}/oauth2/exchange", self.https)
    }
    pub fn msi_endpoint(&self) -> String {
        format!("{}/msi/token", self.http)
    }
}

/// Starts the fakes on 127.0.0.1 with a fresh test CA. They stop with the runtime.
pub async fn start() -> Running {
    let fake = FakeCloud::new();
    let (ca_pem, acceptor) = test_tls();
    let app = fake.router();
    let tls_listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let plain_listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let https = format!("https://{}", tls_listener.local_addr().unwrap());
    let http = format!("http://{}", plain_listener.local_addr().unwrap());
    tokio::spawn(serve(tls_listener, app.clone(), Some(acceptor)));
    tokio::spawn(serve(plain_listener, app, None));
    Running {
        fake,
        https,
        http,
        ca_pem,
    }
}

async fn serve(listener: TcpListener, app: Router, tls: Option<TlsAcceptor>) {
    loop {
        let Ok((tcp, _)): std::io::Result<(tokio::net::TcpStream, SocketAddr)> =
            listener.accept().await
        else {
            return;
        };
        let app = app.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let svc = hyper_util::service::TowerToHyperService::new(app);
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                Some(acceptor) => {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                }
                None => {
                    let _ = http.serve_connection(TokioIo::new(tcp), svc).await;
                }
            }
        });
    }
}

/// A CA and a server certificate for 127.0.0.1 / localhost, generated now.
fn test_tls() -> (String, TlsAcceptor) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "regbroker azure test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().unwrap();
    let mut server_params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    server_params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![server_cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )
        .unwrap();
    (ca_cert.pem(), TlsAcceptor::from(Arc::new(config)))
}

/// A reqwest client that trusts only the test CA and ignores proxy env vars.
pub fn client_trusting(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// An SDK transport that sends IMDS requests (`http://169.254.169.254/...`) to the fake
/// on loopback instead, and refuses any request to a non-loopback host: a test must
/// never reach the real IMDS address.
#[derive(Debug)]
pub struct ImdsToLoopback {
    pub inner: reqwest::Client,
    pub fake_http: url::Url,
}

#[async_trait::async_trait]
impl regbroker_azure::azure_core::http::HttpClient for ImdsToLoopback {
    async fn execute_request(
        &self,
        request: &regbroker_azure::azure_core::http::Request,
    ) -> regbroker_azure::azure_core::Result<regbroker_azure::azure_core::http::AsyncRawResponse>
    {
        use regbroker_azure::azure_core::{Error, error::ErrorKind};
        let mut req = request.clone();
        if req.url().host_str() == Some("169.254.169.254") {
            let url = req.url_mut();
            url.set_host(self.fake_http.host_str()).unwrap();
            url.set_port(self.fake_http.port()).unwrap();
        }
        let loopback = match req.url().host() {
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        };
        if !loopback {
            return Err(Error::with_message(
                ErrorKind::Other,
                "test transport refuses a non-loopback host",
            ));
        }
        regbroker_azure::azure_core::http::HttpClient::execute_request(&self.inner, &req).await
    }
}
