//! Shared test helpers: in-process fake Google endpoints, throwaway keys, a provider with
//! explicit settings.
//!
//! The fakes are axum servers on 127.0.0.1:0. They stand in for Google's token services
//! (the GKE/GCE metadata server's checks, oauth2.googleapis.com, sts.googleapis.com,
//! iamcredentials.googleapis.com), which cannot run here; gcplocal, the third-party
//! metadata emulator, is exercised separately in tests/gcplocal.rs.

#![allow(dead_code, clippy::unwrap_used)]

pub mod federation;
pub mod metadata;
pub mod token_endpoint;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::KeyPair as _;
use base64::Engine as _;
use regbroker_gcp::{GcpProvider, HttpSettings};
use regbroker_provider::{Credential, Error, ManualClock, Provider, Registry, SharedClock};

/// A running fake server, stopped on drop.
pub struct Fake {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Fake {
    pub async fn start(router: axum::Router) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Fake { addr, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a fake saw: one entry per request.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<Request>>>);

#[derive(Clone, Debug)]
pub struct Request {
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Seen {
    pub fn push(&self, headers: &axum::http::HeaderMap, body: &str) -> usize {
        let mut v = self.0.lock().unwrap();
        v.push(Request {
            headers: headers.clone(),
            body: body.to_string(),
        });
        v.len()
    }
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    pub fn all(&self) -> Vec<Request> {
        self.0.lock().unwrap().clone()
    }
}

/// Short retries and timeouts so failure tests stay fast.
pub fn fast_http() -> HttpSettings {
    HttpSettings {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(3),
        attempts: 3,
        backoff: Duration::from_millis(10),
    }
}

pub fn provider(env: &[(&str, &str)], clock: &ManualClock) -> GcpProvider {
    let shared: SharedClock = Arc::new(clock.clone());
    GcpProvider::builder()
        .env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .clock(shared)
        .http(fast_http())
        .build()
}

/// [`provider`] whose metadata server (`GCE_METADATA_HOST`) is `fake`.
pub fn metadata_provider(fake: &Fake, clock: &ManualClock) -> GcpProvider {
    provider(&[("GCE_METADATA_HOST", &fake.addr.to_string())], clock)
}

/// [`provider`] whose credentials file (`GOOGLE_APPLICATION_CREDENTIALS`) is `path`.
pub fn credentials_provider(path: &str, clock: &ManualClock) -> GcpProvider {
    provider(&[("GOOGLE_APPLICATION_CREDENTIALS", path)], clock)
}

pub async fn fetch(p: &GcpProvider, host: &str) -> Result<Credential, Error> {
    let registry = Registry::parse(host).unwrap();
    let target = p.recognise(&registry).expect("a Google host");
    p.fetch(&target).await
}

/// A throwaway RSA key generated for one test (never a real key).
pub struct TestKey {
    pub pem: String,
    /// DER `RSAPublicKey`, for verifying assertions.
    pub public: Vec<u8>,
}

pub fn test_key() -> TestKey {
    let key = KeyPair::generate(KeySize::Rsa2048).unwrap();
    let pkcs8 = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&key).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref());
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(chunk).unwrap());
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    TestKey {
        pem,
        public: key.public_key().as_ref().to_vec(),
    }
}

/// Writes `contents` to a new file in `dir` and returns its path.
pub fn write(dir: &tempfile::TempDir, name: &str, contents: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_str().unwrap().to_string()
}

/// Writes a `service_account` key file (`key.json`) in `dir` with `key`, `client_email`
/// and `token_uri`, and returns its path.
pub fn service_account_key(
    dir: &tempfile::TempDir,
    key: &TestKey,
    client_email: &str,
    token_uri: &str,
) -> String {
    let json = serde_json::json!({
        "type": "service_account",
        "private_key": key.pem,
        "client_email": client_email,
        "token_uri": token_uri,
    });
    write(dir, "key.json", &json.to_string())
}

/// Decodes `application/x-www-form-urlencoded`.
pub fn form(body: &str) -> std::collections::BTreeMap<String, String> {
    body.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.replace('+', " ");
    let bytes = bytes.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// A loopback port that refuses connections for the rest of the test process: bound by
/// a socket that never listens (a connection gets RST) and is never closed, so no other
/// process can take the port in the meantime, as it could after a bind and release.
pub fn closed_port() -> u16 {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    // Held until the process exits.
    std::mem::forget(socket);
    port
}

/// A loopback port nobody listened on a moment ago, for a peer that must be told its port
/// (it binds it itself; its start-up fails visibly if another process took it).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The manual clock's time.
pub fn clock_now(clock: &ManualClock) -> std::time::SystemTime {
    use regbroker_provider::Clock;
    clock.now()
}
