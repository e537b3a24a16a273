//! An in-process fake of STS `AssumeRoleWithWebIdentity` and of ECR's and ECR Public's
//! `GetAuthorizationToken`, for what moto cannot do: enforce ECR's rate limit (a token
//! bucket of 20 per second, burst 200, per caller account, exactly, answering
//! `ThrottlingException` beyond it) and serve ECR Public. The assumed credentials' access key id names the role's
//! account (`ASIA<account>`), and the fake records the key id each ECR call was signed
//! with, so a test can tell whose credentials reached ECR.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

/// ECR's limit as the fake enforces it: GCRA with the same rate and burst.
pub struct Bucket {
    tat: Option<Instant>,
    interval: Duration,
    burst: u32,
}

impl Bucket {
    fn allow(&mut self, now: Instant) -> bool {
        let tat = self.tat.map_or(now, |t| t.max(now));
        let span = self.interval * (self.burst - 1);
        if tat > now + span {
            return false;
        }
        self.tat = Some(tat + self.interval);
        true
    }
}

/// What the fake answered.
#[derive(Default)]
pub struct Counts {
    pub sts: usize,
    pub ecr_ok: usize,
    pub public_ok: usize,
    pub throttled: usize,
    /// The access key id of each successful ECR or ECR Public call.
    pub signed_with: Vec<String>,
    /// The `WebIdentityToken` of each STS call.
    pub web_identity_tokens: Vec<String>,
}

pub struct Fake {
    /// One bucket per caller account (the access key id names it), as ECR's limit is.
    buckets: Mutex<std::collections::HashMap<String, Bucket>>,
    pub counts: Mutex<Counts>,
}

/// The ECR token the fake hands out (`AWS:<password>`).
pub const PASSWORD: &str = "ecr-password";
/// The ECR Public one.
pub const PUBLIC_PASSWORD: &str = "ecr-public-password";

fn form_value(body: &str, key: &str) -> Option<String> {
    body.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| url_decode(v))
    })
}

fn url_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let body = String::from_utf8_lossy(&body);
    if body.contains("Action=AssumeRoleWithWebIdentity") {
        let role = form_value(&body, "RoleArn").unwrap_or_default();
        let account = role.split(':').nth(4).unwrap_or("000000000000").to_string();
        {
            let mut c = fake.counts.lock().unwrap();
            c.sts += 1;
            c.web_identity_tokens
                .push(form_value(&body, "WebIdentityToken").unwrap_or_default());
        }
        let xml = format!(
            r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIA{account}</AccessKeyId><SecretAccessKey>fake-secret</SecretAccessKey><SessionToken>fake-session</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration></Credentials><SubjectFromWebIdentityToken>s</SubjectFromWebIdentityToken><AssumedRoleUser><Arn>arn:aws:sts::{account}:assumed-role/r/s</Arn><AssumedRoleId>AROA:s</AssumedRoleId></AssumedRoleUser></AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>"#
        );
        return ([("content-type", "text/xml")], xml).into_response();
    }
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !target.ends_with("GetAuthorizationToken") {
        return (axum::http::StatusCode::NOT_FOUND, "unknown call").into_response();
    }
    let key_id = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split('/').next())
        .unwrap_or("")
        .to_string();
    let allowed = fake
        .buckets
        .lock()
        .unwrap()
        .entry(key_id.clone())
        .or_insert_with(|| Bucket {
            tat: None,
            interval: Duration::from_millis(50),
            burst: 200,
        })
        .allow(Instant::now());
    let mut counts = fake.counts.lock().unwrap();
    if !allowed {
        counts.throttled += 1;
        return (
            axum::http::StatusCode::BAD_REQUEST,
            [("content-type", "application/x-amz-json-1.1")],
            r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#,
        )
            .into_response();
    }
    counts.signed_with.push(key_id);
    let public = target.starts_with("SpencerFrontendService");
    let b64 = |p: &str| base64::engine::general_purpose::STANDARD.encode(format!("AWS:{p}"));
    let body = if public {
        counts.public_ok += 1;
        format!(
            r#"{{"authorizationData":{{"authorizationToken":"{}","expiresAt":4102444800}}}}"#,
            b64(PUBLIC_PASSWORD)
        )
    } else {
        counts.ecr_ok += 1;
        format!(
            r#"{{"authorizationData":[{{"authorizationToken":"{}","expiresAt":4102444800,"proxyEndpoint":"https://ecr.example"}}]}}"#,
            b64(PASSWORD)
        )
    };
    ([("content-type", "application/x-amz-json-1.1")], body).into_response()
}

/// The fake on a loopback port: its state, its URL (for `AWS_ENDPOINT_URL`), and the
/// server task (aborted on drop of the handle's owner).
pub async fn start() -> (Arc<Fake>, String, tokio::task::JoinHandle<()>) {
    let fake = Arc::new(Fake {
        buckets: Mutex::new(std::collections::HashMap::new()),
        counts: Mutex::new(Counts::default()),
    });
    let app = Router::new().fallback(handle).with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (fake, url, task)
}
