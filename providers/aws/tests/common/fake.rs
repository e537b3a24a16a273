//! An in-process fake of the AWS endpoints moto lacks or cannot misbehave with:
//! ECR Public (moto has no ecr-public API), IMDSv2 (moto's IMDS lacks the token-TTL
//! response header aws-config insists on), the EKS Pod Identity agent, and ECR answers
//! that moto never gives (throttling, 5xx, malformed tokens, slow answers).
//!
//! One axum server on 127.0.0.1:0 serves all of them; it records what it saw.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use base64::Engine;

pub const IMDS_SESSION_TOKEN: &str = "imds-session-token-123";
pub const IMDS_ROLE: &str = "fake-node-role";
pub const IMDS_ACCESS_KEY: &str = "ASIAIMDSFAKEKEY00001";
pub const POD_ACCESS_KEY: &str = "ASIAPODIDFAKEKEY0001";
pub const POD_AUTH_TOKEN: &str = "pod-identity-auth-token-xyz";
pub const PASSWORD: &str = "fake-ecr-password-s3cr3t";
pub const PUBLIC_PASSWORD: &str = "fake-ecr-public-password-s3cr3t";
/// The fake's default `expiresAt`: this long after it started (ECR's tokens live 12 h).
pub const LIFETIME: Duration = Duration::from_secs(6 * 60 * 60);

/// How the fake ECR / ECR Public API answers.
#[derive(Clone, Debug)]
pub enum Mode {
    Ok,
    /// `n` ThrottlingExceptions, then Ok.
    ThrottleFirst(usize),
    /// HTTP 500 ServerException every time.
    ServerError,
    /// A 200 whose token is this string (not a proper base64 `AWS:` token).
    Token(String),
    /// A service error with this `__type` and HTTP status.
    Fail(&'static str, u16),
    /// Answers after this long.
    Slow(Duration),
}

#[derive(Debug, Default)]
pub struct Seen {
    pub ecr_calls: usize,
    pub public_calls: usize,
    /// `Credential=` access key ids of ECR / ECR Public calls.
    pub access_keys: Vec<String>,
    /// Signing scopes (`date/region/service`) of ECR / ECR Public calls.
    pub scopes: Vec<String>,
    /// Token PUTs that carried the TTL request header.
    pub imds_token_puts: usize,
    /// IMDS credential GETs that carried the session token.
    pub imds_creds_gets: usize,
    /// IMDS requests without a valid session token.
    pub imds_unauthorised: usize,
    /// Pod Identity GETs with the right Authorization header.
    pub pod_gets: usize,
    pub pod_unauthorised: usize,
}

struct Inner {
    mode: Mutex<Mode>,
    /// The JSON number answered as `expiresAt`.
    expires_at: Mutex<String>,
    seen: Mutex<Seen>,
}

#[derive(Clone)]
pub struct Fake {
    inner: Arc<Inner>,
    pub url: String,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl Fake {
    pub async fn start(mode: Mode) -> Fake {
        let expires_at = regbroker_provider::Clock::now(&*regbroker_provider::system_clock())
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + LIFETIME.as_secs();
        let inner = Arc::new(Inner {
            mode: Mutex::new(mode),
            expires_at: Mutex::new(format!("{expires_at}.0")),
            seen: Mutex::new(Seen::default()),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Fake {
            inner,
            url,
            task: Arc::new(task),
        }
    }

    pub fn seen<R>(&self, f: impl FnOnce(&Seen) -> R) -> R {
        f(&self.inner.seen.lock().unwrap())
    }

    /// The `expiresAt` the fake answers, in whole Unix seconds.
    pub fn expires_at(&self) -> u64 {
        let raw = self.inner.expires_at.lock().unwrap().clone();
        raw.trim_end_matches(".0").parse().unwrap()
    }

    /// Answers `raw` (a JSON number, e.g. `253402300800.0`) as `expiresAt` from now on.
    pub fn set_expires_at(&self, raw: &str) {
        *self.inner.expires_at.lock().unwrap() = raw.to_string();
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

fn reply(status: u16, content_type: &str, body: String) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap()
}

fn json(status: u16, body: String) -> Response {
    reply(status, "application/x-amz-json-1.1", body)
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let path = uri.path();

    // IMDSv2.
    if path == "/latest/api/token" {
        if method == Method::PUT && header("x-aws-ec2-metadata-token-ttl-seconds").is_some() {
            inner.seen.lock().unwrap().imds_token_puts += 1;
            return Response::builder()
                .status(200)
                .header("x-aws-ec2-metadata-token-ttl-seconds", "21600")
                .body(Body::from(IMDS_SESSION_TOKEN))
                .unwrap();
        }
        return reply(400, "text/plain", "bad token request".into());
    }
    if let Some(rest) = path.strip_prefix("/latest/meta-data/iam/security-credentials/") {
        if header("x-aws-ec2-metadata-token").as_deref() != Some(IMDS_SESSION_TOKEN) {
            inner.seen.lock().unwrap().imds_unauthorised += 1;
            return reply(401, "text/plain", String::new());
        }
        if rest.is_empty() {
            return reply(200, "text/plain", IMDS_ROLE.into());
        }
        if rest == IMDS_ROLE {
            inner.seen.lock().unwrap().imds_creds_gets += 1;
            return reply(
                200,
                "text/plain",
                format!(
                    r#"{{"Code":"Success","LastUpdated":"2026-01-01T00:00:00Z","Type":"AWS-HMAC","AccessKeyId":"{IMDS_ACCESS_KEY}","SecretAccessKey":"imds-secret-s3cr3t","Token":"imds-session-s3cr3t","Expiration":"2099-01-01T00:00:00Z"}}"#
                ),
            );
        }
        return reply(404, "text/plain", String::new());
    }
    if path.starts_with("/latest/") {
        return reply(404, "text/plain", String::new());
    }

    // EKS Pod Identity agent.
    if path == "/v1/credentials" {
        if header("authorization").as_deref() != Some(POD_AUTH_TOKEN) {
            inner.seen.lock().unwrap().pod_unauthorised += 1;
            return reply(
                401,
                "application/json",
                r#"{"message":"unauthorised"}"#.into(),
            );
        }
        inner.seen.lock().unwrap().pod_gets += 1;
        return reply(
            200,
            "application/json",
            format!(
                r#"{{"AccessKeyId":"{POD_ACCESS_KEY}","SecretAccessKey":"pod-secret-s3cr3t","Token":"pod-session-s3cr3t","AccountId":"123456789012","Expiration":"2099-01-01T00:00:00Z"}}"#
            ),
        );
    }

    // STS refusing every web identity token (awsQuery error document).
    if path.starts_with("/sts-denies") {
        return reply(
            400,
            "text/xml",
            r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error><RequestId>1</RequestId></ErrorResponse>"#.into(),
        );
    }

    // ECR and ECR Public (awsJson1_1, POST /).
    let target = header("x-amz-target").unwrap_or_default();
    let public = match target.as_str() {
        "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken" => false,
        "SpencerFrontendService.GetAuthorizationToken" => true,
        _ => {
            return reply(
                404,
                "text/plain",
                format!("unexpected {method} {path} {target}"),
            );
        }
    };
    let auth = header("authorization").unwrap_or_default();
    let (key, scope) = auth
        .split("Credential=")
        .nth(1)
        .and_then(|c| c.split(',').next())
        .and_then(|c| c.split_once('/'))
        .map(|(k, s)| {
            (
                k.to_string(),
                s.trim_end_matches("/aws4_request").to_string(),
            )
        })
        .unwrap_or_default();
    let (n, mode) = {
        let mut seen = inner.seen.lock().unwrap();
        if public {
            seen.public_calls += 1;
        } else {
            seen.ecr_calls += 1;
        }
        seen.access_keys.push(key);
        seen.scopes.push(scope);
        (
            seen.ecr_calls + seen.public_calls,
            inner.mode.lock().unwrap().clone(),
        )
    };
    let token = match mode {
        Mode::Ok => b64(&format!(
            "AWS:{}",
            if public { PUBLIC_PASSWORD } else { PASSWORD }
        )),
        Mode::ThrottleFirst(k) if n <= k => {
            return json(
                400,
                r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#.into(),
            );
        }
        Mode::ThrottleFirst(_) => b64(&format!("AWS:{PASSWORD}")),
        Mode::ServerError => {
            return json(
                500,
                r#"{"__type":"ServerException","message":"internal failure"}"#.into(),
            );
        }
        Mode::Token(t) => t,
        Mode::Fail(code, status) => {
            return json(status, format!(r#"{{"__type":"{code}","message":"no"}}"#));
        }
        Mode::Slow(d) => {
            tokio::time::sleep(d).await;
            b64(&format!("AWS:{PASSWORD}"))
        }
    };
    let expires_at = inner.expires_at.lock().unwrap().clone();
    let data = format!(
        r#"{{"authorizationToken":"{token}","expiresAt":{expires_at},"proxyEndpoint":"https://x"}}"#
    );
    if public {
        json(200, format!(r#"{{"authorizationData":{data}}}"#))
    } else {
        json(200, format!(r#"{{"authorizationData":[{data}]}}"#))
    }
}
