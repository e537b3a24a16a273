//! TLS on the TCP listener (issue 18, finding 6): a client trusting the CA gets answers
//! and a plaintext one does not; a rotated certificate reaches new connections while open
//! ones carry on, and a broken new pair keeps the old one; a non-loopback listener needs
//! a token and TLS unless `--insecure-listen`; the credential helper reaches an https
//! sidecar with `REGBROKER_CA_FILE`, and fails clearly without it.
//!
//! Certificates are made here with rcgen (a CA per test, leaves for 127.0.0.1); none is
//! committed. Files are laid out as a Kubernetes Secret volume is (`tls.crt` ->
//! `..data/tls.crt`, `..data` -> a timestamped directory) and rotated the way the kubelet
//! does it, by swapping the `..data` symlink.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{CLI_BOUND, KillOnDrop, describe, run_bounded};
use common::{ServeProcess, docker_config, wait_exit};
use http_body_util::BodyExt;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");
const TOKEN: &str = "tls-test-bearer-token-0123456789";

/// A throwaway CA.
struct Ca {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyUsagePurpose};
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf for 127.0.0.1 and localhost: (cert PEM, key PEM).
    fn leaf(&self, cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

/// A Secret-volume-shaped directory holding `tls.crt` and `tls.key`.
struct Volume {
    dir: tempfile::TempDir,
    generation: usize,
}

impl Volume {
    fn new(cert: &str, key: &str) -> Volume {
        let dir = tempfile::tempdir().unwrap();
        let mut v = Volume { dir, generation: 0 };
        v.publish(cert, key);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), v.dir.path().join(name)).unwrap();
        }
        v
    }

    /// Writes a new generation and swaps `..data` to it in one rename, as the kubelet does.
    fn publish(&mut self, cert: &str, key: &str) {
        self.generation += 1;
        let name = format!("..gen_{}", self.generation);
        let gen_dir = self.dir.path().join(&name);
        std::fs::create_dir(&gen_dir).unwrap();
        std::fs::write(gen_dir.join("tls.crt"), cert).unwrap();
        std::fs::write(gen_dir.join("tls.key"), key).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    fn cert(&self) -> String {
        self.dir.path().join("tls.crt").display().to_string()
    }
    fn key(&self) -> String {
        self.dir.path().join("tls.key").display().to_string()
    }
}

fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// An open HTTPS connection: the certificate the server presented, and a sender.
struct Conn {
    peer_cert: Vec<u8>,
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
}

async fn connect(addr: &str, ca_pem: &str) -> Result<Conn, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(client_config(ca_pem))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let peer_cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(Conn { peer_cert, sender })
}

impl Conn {
    async fn get(&mut self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut req = hyper::Request::get(path).header(hyper::header::HOST, "127.0.0.1");
        if let Some(t) = token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let res = self
            .sender
            .send_request(req.body(http_body_util::Empty::new()).unwrap())
            .await
            .unwrap();
        let status = res.status().as_u16();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

fn static_config(dir: &Path) -> (String, String) {
    let dc = dir.join("config.json");
    std::fs::write(&dc, docker_config(&[("r.example.com", "u", "pw")])).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    (dc.display().to_string(), token.display().to_string())
}

fn serve_tls(vol: &Volume, dc: &str, token: &str) -> ServeProcess {
    ServeProcess::start(
        &[
            "--docker-config",
            dc,
            "--auth-token-file",
            token,
            "--tls-cert-file",
            &vol.cert(),
            "--tls-key-file",
            &vol.key(),
        ],
        &[],
    )
}

const CREDS: &str = "/v1/credentials?registry=r.example.com";

#[tokio::test]
async fn a_client_trusting_the_ca_gets_answers_and_a_plaintext_client_does_not() {
    let ca = Ca::new("regbroker test CA");
    let (cert, key) = ca.leaf("first");
    let vol = Volume::new(&cert, &key);
    let work = tempfile::tempdir().unwrap();
    let (dc, token) = static_config(work.path());
    let mut srv = serve_tls(&vol, &dc, &token);

    let mut conn = connect(&srv.addr, &ca.pem).await.unwrap();
    assert_eq!(conn.peer_cert, der(&cert));
    let (status, body) = conn.get(CREDS, Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"password\":\"pw\""), "{body}");
    assert_eq!(
        conn.get(CREDS, None).await.0,
        401,
        "TLS does not replace the token"
    );
    assert_eq!(conn.get("/healthz", None).await.0, 200);

    // A client that does not trust this CA is refused during the handshake.
    let other = Ca::new("someone else's CA");
    let e = connect(&srv.addr, &other.pem).await.err().unwrap();
    assert!(e.to_lowercase().contains("certificate"), "{e}");

    // Plain HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{}{CREDS}", srv.addr))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(15))
        .send()
        .await;
    assert!(plain.is_err(), "plaintext was answered: {plain:?}");
    assert!(srv.stop().success());
}

/// Waits (bounded) for a log line containing `needle`; returns it.
fn wait_log(srv: &ServeProcess, needle: &str, deadline: Instant) -> String {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match srv.log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(_) => panic!("no log line with {needle:?} in time"),
        }
    }
}

#[tokio::test]
async fn a_rotated_certificate_reaches_new_connections_and_a_broken_one_is_ignored() {
    let ca = Ca::new("regbroker test CA");
    let (cert_a, key_a) = ca.leaf("generation A");
    let (cert_b, key_b) = ca.leaf("generation B");
    let mut vol = Volume::new(&cert_a, &key_a);
    let work = tempfile::tempdir().unwrap();
    let (dc, token) = static_config(work.path());
    let mut srv = serve_tls(&vol, &dc, &token);

    let mut old = connect(&srv.addr, &ca.pem).await.unwrap();
    assert_eq!(old.peer_cert, der(&cert_a));
    assert_eq!(old.get(CREDS, Some(TOKEN)).await.0, 200);

    vol.publish(&cert_b, &key_b);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = connect(&srv.addr, &ca.pem).await.unwrap();
        if c.peer_cert == der(&cert_b) {
            break;
        }
        assert_eq!(c.peer_cert, der(&cert_a), "neither generation served");
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_log(&srv, "Reloaded TLS certificate", deadline);
    // The connection opened before the rotation carries on.
    assert_eq!(old.get(CREDS, Some(TOKEN)).await.0, 200);

    // A broken pair (B's certificate with another key) is refused and B stays.
    let (_, stray_key) = ca.leaf("stray");
    vol.publish(&cert_b, &stray_key);
    let line = wait_log(
        &srv,
        "Cannot load the new TLS",
        Instant::now() + Duration::from_secs(20),
    );
    assert!(line.contains("does not belong"), "{line}");
    let key_body: String = stray_key
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(
        !line.contains(&key_body[..32]),
        "the key leaked into the log: {line}"
    );
    let mut c = connect(&srv.addr, &ca.pem).await.unwrap();
    assert_eq!(c.peer_cert, der(&cert_b));
    assert_eq!(c.get(CREDS, Some(TOKEN)).await.0, 200);
    assert!(srv.stop().success());
}

/// Starts `regbroker serve ARGS` and reports whether it got to "Listening" (killing it)
/// or exited, with its exit code and stderr. Doing neither within [`CLI_BOUND`] (it runs
/// on without logging, or keeps stderr open) fails the test, and the process is killed.
fn serve_outcome(args: &[&str]) -> Result<(), (Option<i32>, String)> {
    use std::sync::mpsc::RecvTimeoutError;
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args(args)
        .env_clear()
        .env("REGBROKER_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    let what = describe(&cmd);
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let mut stderr = child.stderr.take().unwrap();
    // Read on a thread, so that the wait for the next line has a deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stderr.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + CLI_BOUND;
    let mut all = Vec::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(chunk) => {
                all.extend_from_slice(&chunk);
                if String::from_utf8_lossy(&all).contains("Listening") {
                    // Killed when `child` drops.
                    return Ok(());
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = wait_exit(&mut child, CLI_BOUND).unwrap_or_else(|| {
                    panic!("`{what}` closed stderr but did not exit within {CLI_BOUND:?}")
                });
                return Err((status.code(), String::from_utf8_lossy(&all).into_owned()));
            }
            Err(RecvTimeoutError::Timeout) => panic!(
                "`{what}` neither listened nor exited within {CLI_BOUND:?}: killed it; stderr:\n{}",
                String::from_utf8_lossy(&all)
            ),
        }
    }
}

#[test]
fn non_loopback_listen_needs_a_token_and_tls_or_an_explicit_opt_out() {
    let ca = Ca::new("regbroker test CA");
    let (cert, key) = ca.leaf("pod");
    let vol = Volume::new(&cert, &key);
    let work = tempfile::tempdir().unwrap();
    let (dc, token) = static_config(work.path());
    let (c, k) = (vol.cert(), vol.key());
    let base = ["--docker-config", dc.as_str(), "--listen", "0.0.0.0:0"];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let refused: [(&[&str], &str); 3] = [
        (&[], "--auth-token-file"),
        (
            &["--auth-token-file", &token],
            "without TLS (--tls-cert-file, --tls-key-file)",
        ),
        (
            &["--tls-cert-file", &c, "--tls-key-file", &k],
            "without --auth-token-file",
        ),
    ];
    for (extra, needle) in refused {
        let args = with(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = serve_outcome(&args).unwrap_err();
        assert_eq!(code, Some(64), "{extra:?}: {err}");
        assert!(
            err.contains("refusing") && err.contains(needle) && err.contains("--insecure-listen"),
            "{extra:?}: {err}"
        );
        assert!(!err.contains(TOKEN), "{err}");
    }
    let accepted: [&[&str]; 3] = [
        &["--insecure-listen"],
        &["--auth-token-file", &token, "--insecure-listen"],
        &[
            "--auth-token-file",
            &token,
            "--tls-cert-file",
            &c,
            "--tls-key-file",
            &k,
        ],
    ];
    for extra in accepted {
        let args = with(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(serve_outcome(&args), Ok(()), "{extra:?}");
    }

    // A certificate without its key, or a broken pair, is invalid configuration (64),
    // and the key's contents are never quoted.
    let (code, err) =
        serve_outcome(&["--listen", "127.0.0.1:0", "--tls-cert-file", &c]).unwrap_err();
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--tls-key-file"), "{err}");
    let garbage = work.path().join("garbage.key");
    std::fs::write(
        &garbage,
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleQ==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let g = garbage.display().to_string();
    let (code, err) = serve_outcome(&[
        "--listen",
        "127.0.0.1:0",
        "--tls-cert-file",
        &c,
        "--tls-key-file",
        &g,
    ])
    .unwrap_err();
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("garbage.key") && !err.contains("c2VjcmV0"),
        "{err}"
    );
    // TLS on a unix socket is refused rather than ignored.
    let sock = work.path().join("s.sock").display().to_string();
    let (code, err) = serve_outcome(&[
        "--listen",
        &format!("unix:{sock}"),
        "--tls-cert-file",
        &c,
        "--tls-key-file",
        &k,
    ])
    .unwrap_err();
    assert_eq!(code, Some(64), "{err}");
}

/// Runs `regbroker credential-helper get` for `r.example.com` with `env`.
fn helper(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = run_bounded(
        Command::new(BIN)
            .args(["credential-helper", "get"])
            .env_clear()
            .envs(env.iter().copied()),
        Some(b"r.example.com"),
        CLI_BOUND,
    );
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn the_credential_helper_reaches_an_https_sidecar_with_the_ca_file() {
    let ca = Ca::new("regbroker test CA");
    let (cert, key) = ca.leaf("sidecar");
    let vol = Volume::new(&cert, &key);
    let work = tempfile::tempdir().unwrap();
    let (dc, token) = static_config(work.path());
    let ca_file: PathBuf = work.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let other_ca = work.path().join("other-ca.crt");
    std::fs::write(&other_ca, Ca::new("someone else's CA").pem).unwrap();
    let mut srv = serve_tls(&vol, &dc, &token);
    let endpoint = format!("https://{}", srv.addr);
    let ca_path = ca_file.display().to_string();

    let (code, out) = helper(&[
        ("REGBROKER_ENDPOINT", &endpoint),
        ("REGBROKER_CA_FILE", &ca_path),
        ("REGBROKER_AUTH_TOKEN_FILE", &token),
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("\"Secret\":\"pw\""), "{out}");

    // Without the CA file: a clear error naming the variable, before any connection
    // (invalid settings: exit 64).
    let (code, out) = helper(&[
        ("REGBROKER_ENDPOINT", &endpoint),
        ("REGBROKER_AUTH_TOKEN_FILE", &token),
    ]);
    assert_eq!(code, Some(64), "{out}");
    assert!(out.contains("REGBROKER_CA_FILE"), "{out}");

    // With a CA that did not sign the sidecar's certificate: the handshake fails, the
    // token is never sent, and the error says why.
    let other = other_ca.display().to_string();
    let (code, out) = helper(&[
        ("REGBROKER_ENDPOINT", &endpoint),
        ("REGBROKER_CA_FILE", &other),
        ("REGBROKER_AUTH_TOKEN_FILE", &token),
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("TLS") && out.contains("REGBROKER_CA_FILE"),
        "{out}"
    );
    assert!(!out.contains(TOKEN), "{out}");

    // Plain http to the TLS port fails too.
    let (code, out) = helper(&[
        ("REGBROKER_ENDPOINT", &format!("http://{}", srv.addr)),
        ("REGBROKER_AUTH_TOKEN_FILE", &token),
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(srv.stop().success());
}
