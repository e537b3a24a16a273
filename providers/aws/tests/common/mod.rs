//! Shared test helpers: finding and starting test peers, and running one scenario in a
//! child process with its own environment.
//!
//! aws-config reads its identity chain from the process environment and offers no public
//! way to inject an env map (`ProviderConfig::with_env` and `ConfigLoader::env` are
//! crate-private), and `std::env::set_var` races with the other tests of a binary. So
//! every scenario that needs env vars re-runs this test binary as a child, with a cleared
//! environment plus the scenario's variables, and runs only `child_fetch` in it.
//!
//! Env vars used: `REGBROKER_AWS_CHILD`, `REGBROKER_AWS_CHILD_REGISTRY`, `REGBROKER_AWS_CHILD_OPTIONS`
//! (`k=v,k=v`) drive the child.

#![allow(dead_code, clippy::unwrap_used)]

pub mod fake;
pub mod sts_ecr;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use regbroker_aws::AwsProvider;
use regbroker_provider::{ExposeSecret, Options, Provider, Registry};

pub use regbroker_provider::test_util::require_peer;

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback URL nothing listens on.
pub fn closed_url() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// moto_server on a free loopback port, killed on drop.
pub struct Moto {
    child: Child,
    pub url: String,
}

pub const MOTO_INSTALL: &str = "pip install 'moto[server]'";

impl Moto {
    /// Starts moto; panics naming the peer when it is not installed.
    pub fn start() -> Moto {
        let bin = require_peer("moto_server", MOTO_INSTALL);
        let port = free_port();
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            // moto computes `expiresAt` with the local time zone: pin it.
            .env("TZ", "UTC")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)));
        moto
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for_port(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("nothing answered on {addr} within 20 s");
}

/// What the child saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// username, password, expiry in Unix seconds
    Ok(String, String, Option<u64>),
    /// error code, message
    Err(String, String),
}

/// Runs `child_fetch` of this test binary in a child process with only `env` (plus PATH
/// and a fresh HOME with no ~/.aws), fetching `registry` with rule `options`.
pub async fn run_child(registry: &str, options: &str, env: &[(&str, String)]) -> Outcome {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_fetch",
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_clear()
    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
    .env("HOME", home.path())
    .env("REGBROKER_AWS_CHILD", "1")
    .env("REGBROKER_AWS_CHILD_REGISTRY", registry)
    .env("REGBROKER_AWS_CHILD_OPTIONS", options)
    .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // `kill_on_drop`: the child is killed when the timeout drops the future.
    let bound = Duration::from_secs(60);
    let out = tokio::time::timeout(bound, cmd.output())
        .await
        .unwrap_or_else(|_| {
            panic!("child `child_fetch` of this test binary (registry {registry}) did not exit within {bound:?}: killed it")
        })
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let line = stdout
        .lines()
        .find_map(|l| l.find("RESULT ").map(|i| &l[i + 7..]))
        .unwrap_or_else(|| panic!("child printed no RESULT\n{stdout}\n{stderr}"));
    let mut parts = line.splitn(4, ' ');
    match parts.next() {
        Some("ok") => {
            let user = parts.next().unwrap().to_string();
            let pass = parts.next().unwrap().to_string();
            let exp = parts.next().unwrap();
            Outcome::Ok(user, pass, exp.parse().ok())
        }
        Some("err") => Outcome::Err(
            parts.next().unwrap().to_string(),
            parts.collect::<Vec<_>>().join(" "),
        ),
        _ => panic!("bad RESULT line {line}"),
    }
}

/// The child side: fetch with `AwsProvider::from_env()` and print one RESULT line.
/// Does nothing unless started by [`run_child`].
pub async fn child_main() {
    if std::env::var("REGBROKER_AWS_CHILD").as_deref() != Ok("1") {
        eprintln!("child_fetch runs only as a child of another scenario");
        return;
    }
    let registry =
        Registry::parse(&std::env::var("REGBROKER_AWS_CHILD_REGISTRY").unwrap()).unwrap();
    let options: Options = std::env::var("REGBROKER_AWS_CHILD_OPTIONS")
        .unwrap_or_default()
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    let provider = AwsProvider::from_env().expect("the rates in the environment are valid");
    let target = if options.is_empty() {
        provider
            .recognise(&registry)
            .expect("registry not recognised")
    } else {
        provider.target(&registry, &options).unwrap()
    };
    match provider.fetch(&target).await {
        Ok(c) => {
            let exp = c
                .expires_at()
                .map(|t| {
                    t.duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs()
                        .to_string()
                })
                .unwrap_or_else(|| "none".into());
            println!(
                "RESULT ok {} {} {exp}",
                c.username(),
                c.secret().expose_secret()
            );
        }
        Err(e) => {
            eprintln!("chain: {}", e.chain());
            println!("RESULT err {} {}", e.kind().code(), e.message());
        }
    }
}

/// The role every IRSA scenario names in `AWS_ROLE_ARN`.
pub const IRSA_ROLE_ARN: &str = "arn:aws:iam::123456789012:role/irsa-puller";

/// [`hermetic_env`] plus IRSA: `AWS_ROLE_ARN` = [`IRSA_ROLE_ARN`] and
/// `AWS_WEB_IDENTITY_TOKEN_FILE` naming a JWT-shaped token file in the returned dir, which
/// must live as long as the scenario.
pub fn irsa_env() -> (tempfile::TempDir, Vec<(&'static str, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.e30.c2ln").unwrap();
    let mut env = hermetic_env();
    env.extend([
        ("AWS_ROLE_ARN", IRSA_ROLE_ARN.to_string()),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            token_file.display().to_string(),
        ),
    ]);
    (dir, env)
}

/// Env that keeps the default chain away from the machine's own identity sources.
pub fn hermetic_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ("AWS_CONFIG_FILE", "/nonexistent/regbroker/config".into()),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/regbroker/credentials".into(),
        ),
        ("AWS_REGION", "us-east-1".into()),
    ]
}
