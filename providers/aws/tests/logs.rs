//! Secrets never reach logs: a whole fetch (ECR and ECR Public, success and a malformed
//! answer) is run with every tracing event of every crate captured, and no line may hold
//! the password, the raw token or the signing secret. The AWS SDK does log them at
//! TRACE, so the broker must add `regbroker_aws::LOG_DIRECTIVES` to its filter.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use base64::Engine;
use common::fake::{self, Fake, Mode};
use regbroker_aws::AwsProvider;
use regbroker_provider::{Provider, Registry};
use tracing_subscriber::fmt::MakeWriter;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

async fn run_all(filter: tracing_subscriber::EnvFilter) -> String {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(capture.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    for mode in [Mode::Ok, Mode::Token(b64("Basic:leaky-s3cr3t"))] {
        let fake = Fake::start(mode).await;
        let p = AwsProvider::builder()
            .endpoint_url(&fake.url)
            .credentials(SharedCredentialsProvider::new(Credentials::new(
                "AKIDLOGTEST000000001",
                "signing-secret-s3cr3t",
                Some("session-token-s3cr3t".into()),
                None,
                "test",
            )))
            .build();
        for host in [
            "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            "public.ecr.aws",
        ] {
            let t = p.recognise(&Registry::parse(host).unwrap()).unwrap();
            match p.fetch(&t).await {
                Ok(c) => tracing::info!(?c, "fetched"),
                Err(e) => tracing::warn!(error = %e.chain(), ?e, "failed"),
            }
        }
    }
    String::from_utf8(capture.0.lock().unwrap().clone()).unwrap()
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn assert_clean(logs: &str) {
    assert!(logs.contains("fetched"), "nothing was captured:\n{logs}");
    for secret in [
        fake::PASSWORD.to_string(),
        fake::PUBLIC_PASSWORD.to_string(),
        b64(&format!("AWS:{}", fake::PASSWORD)),
        b64(&format!("AWS:{}", fake::PUBLIC_PASSWORD)),
        "leaky-s3cr3t".to_string(),
        b64("Basic:leaky-s3cr3t"),
        "signing-secret-s3cr3t".to_string(),
        "session-token-s3cr3t".to_string(),
    ] {
        if let Some(line) = logs.lines().find(|l| l.contains(&secret)) {
            panic!("a log line holds a secret: {line}");
        }
    }
}

#[tokio::test]
async fn no_secret_in_logs_up_to_debug() {
    assert_clean(&run_all(tracing_subscriber::EnvFilter::new("debug")).await);
}

#[tokio::test]
async fn trace_is_clean_with_the_exported_log_directives() {
    let mut filter = "trace".to_string();
    for d in regbroker_aws::LOG_DIRECTIVES {
        filter.push(',');
        filter.push_str(d);
    }
    let logs = run_all(tracing_subscriber::EnvFilter::new(filter)).await;
    // Our own crate still logs at TRACE level and below.
    assert!(logs.contains("Fetched ECR token"), "{logs}");
    assert_clean(&logs);
}
