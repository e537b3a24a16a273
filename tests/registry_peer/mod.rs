//! A real OCI registry for the tests: the distribution registry (Debian `docker-registry`)
//! on a free loopback port, with htpasswd auth (`htpasswd` from Debian `apache2-utils`)
//! or anonymous, storing into a temporary directory that goes with it.
//!
//! Shared by the test binaries that drive real clients (`tests/helm_cli.rs`, and
//! `tests/clients.rs` once it switches over): `mod common; mod registry_peer;` (it runs
//! its setup commands with `common`'s bounded helpers) then
//! `registry_peer::Registry::start_with(Some((USER, PASSWORD)))`. The tests using it are
//! `#[ignore]`d with the peers they need, so plain `cargo test` lists them as ignored and
//! `scripts/test.sh` (which installs the peers) runs them; a peer missing from PATH when a
//! test runs is a panic naming the peer and how to install it, never a silent pass.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::process::{CLI_BOUND, run_bounded};

/// The user [`Registry::start`] accepts (htpasswd), unless anonymous.
pub const USER: &str = "testuser";
/// That user's password.
pub const PASSWORD: &str = "registry-password-1";

/// The path of the test peer `name` on PATH, or a panic naming it and how to install it.
pub fn peer(name: &str, install: &str) -> PathBuf {
    regbroker_provider::test_util::require_peer(name, install)
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
/// (it binds it itself). Another process may take it in between: each peer's start-up
/// retries with a new port when it fails to listen. "Nothing listens here" tests use
/// [`closed_port`] instead.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status code of a plain unauthenticated `GET path` to `host` (`127.0.0.1:PORT`);
/// 0 when the connection fails or the answer is not HTTP.
pub fn http_status(host: &str, path: &str) -> u16 {
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return 0;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A distribution registry on loopback; with htpasswd auth unless anonymous. Stopped
/// (killed) when dropped, and its storage removed.
pub struct Registry {
    /// `127.0.0.1:PORT`: the registry's name as clients write it.
    pub host: String,
    _process: Emulator,
}

impl Registry {
    /// With [`USER`]/[`PASSWORD`] in its htpasswd, or anonymous.
    pub fn start(anonymous: bool) -> Registry {
        Registry::start_with(if anonymous {
            None
        } else {
            Some((USER, PASSWORD))
        })
    }

    /// With exactly this user and password in its htpasswd, or anonymous (`None`). A port
    /// taken between choosing and binding it is retried with another.
    pub fn start_with(auth: Option<(&str, &str)>) -> Registry {
        let bin = peer("docker-registry", "apt-get install docker-registry");
        let htpasswd = auth.map(|_| peer("htpasswd", "apt-get install apache2-utils"));
        let mut last = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let mut config = format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.path().join("data").display()
            );
            if let (Some((user, password)), Some(htpasswd)) = (auth, &htpasswd) {
                let out = run_bounded(
                    Command::new(htpasswd).args(["-Bbn", user, password]),
                    None,
                    CLI_BOUND,
                );
                assert!(
                    out.status.success(),
                    "htpasswd failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                std::fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
                config.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: regbroker-test\n    path: {}\n",
                    dir.path().join("htpasswd").display()
                ));
            }
            std::fs::write(dir.path().join("config.yml"), config).unwrap();
            let config = dir.path().join("config.yml").display().to_string();
            // The registry answers /v2/ with 401 when it wants credentials, 200 otherwise.
            match Emulator::try_spawn(
                &bin,
                &["serve", &config],
                dir,
                port,
                "/v2/",
                &[200, 401],
                &[],
            ) {
                Ok(process) => {
                    return Registry {
                        host: process.addr.clone(),
                        _process: process,
                    };
                }
                Err(e) => {
                    eprintln!("registry: start failed, retrying: {e}");
                    last = e;
                }
            }
        }
        panic!("the distribution registry did not start: {last}");
    }

    /// Replaces the registry's htpasswd with exactly `user`:`password` (bcrypt), so from
    /// now on only that password is accepted: the distribution registry rereads the file
    /// when its modification time changes, so nothing restarts. The new file is renamed
    /// into place, so the registry never reads half of it. Panics on an anonymous registry.
    pub fn set_password(&self, user: &str, password: &str) {
        let path = self._process.dir().join("htpasswd");
        assert!(path.is_file(), "set_password on an anonymous registry");
        let out = run_bounded(
            Command::new(peer("htpasswd", "apt-get install apache2-utils"))
                .args(["-Bbn", user, password]),
            None,
            CLI_BOUND,
        );
        assert!(
            out.status.success(),
            "htpasswd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let next = self._process.dir().join("htpasswd.next");
        std::fs::write(&next, &out.stdout).unwrap();
        std::fs::rename(&next, &path).unwrap();
    }
}

/// A third-party server process (the registry; emulators such as moto or gcplocal) on a
/// loopback port, in a directory of its own; killed when dropped. Its stderr goes to
/// `stderr.log` in that directory and is quoted when it fails to start.
pub struct Emulator {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    cwd: tempfile::TempDir,
}

impl Emulator {
    /// Starts `bin ARGS` (with `PORT` in ARGS replaced by a free port) in a fresh
    /// directory and waits until `ready_path` answers 200.
    pub fn start(bin: &Path, args: &[&str], ready_path: &str, env: &[(&str, &str)]) -> Emulator {
        let port = free_port();
        let port_s = port.to_string();
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "PORT" { port_s.as_str() } else { a })
            .collect();
        let cwd = tempfile::tempdir().unwrap();
        Emulator::spawn(bin, &args, cwd, port, ready_path, &[200], env)
    }

    /// Starts `bin ARGS` in `cwd`, listening on `port`, and waits until `ready_path`
    /// answers one of `ready`; panics when it does not.
    pub fn spawn(
        bin: &Path,
        args: &[&str],
        cwd: tempfile::TempDir,
        port: u16,
        ready_path: &str,
        ready: &[u16],
        env: &[(&str, &str)],
    ) -> Emulator {
        Emulator::try_spawn(bin, args, cwd, port, ready_path, ready, env)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Emulator::spawn`], but a process that exits or never gets ready (within 30 s)
    /// is an error quoting its stderr.
    pub fn try_spawn(
        bin: &Path,
        args: &[&str],
        cwd: tempfile::TempDir,
        port: u16,
        ready_path: &str,
        ready: &[u16],
        env: &[(&str, &str)],
    ) -> Result<Emulator, String> {
        let log = std::fs::File::create(cwd.path().join("stderr.log")).unwrap();
        let child = Command::new(bin)
            .args(args)
            .envs(env.iter().copied())
            .current_dir(cwd.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let mut emulator = Emulator {
            child,
            addr: format!("127.0.0.1:{port}"),
            cwd,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Checked again after a ready answer: that answer may come from whoever took
            // the port first, while this process fails to bind it and exits.
            let answered = ready.contains(&http_status(&emulator.addr, ready_path));
            if let Some(status) = emulator.child.try_wait().unwrap() {
                return Err(format!(
                    "{} exited ({status}) before answering {ready_path} on {}: {}",
                    bin.display(),
                    emulator.addr,
                    emulator.stderr()
                ));
            }
            if answered {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not answer {ready_path} on {} with one of {ready:?} within 30 s: {}",
                    bin.display(),
                    emulator.addr,
                    emulator.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(emulator)
    }

    /// The directory the process runs in (its files and `stderr.log`).
    pub fn dir(&self) -> &Path {
        self.cwd.path()
    }

    /// What the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.cwd.path().join("stderr.log")).unwrap_or_default()
    }

    /// The whole answer (status line, headers, body) to a plain `GET path`.
    pub fn get(&self, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}

/// moto_server (PyPI `moto[server]`) on a free loopback port, in UTC (moto stamps ECR's
/// `expiresAt` with the local time zone). `moto.get("/moto-api/data.json")` is its state,
/// every role session it handed out included.
pub fn moto() -> Emulator {
    let bin = peer("moto_server", "pip install 'moto[server]'");
    Emulator::start(
        &bin,
        &["-H", "127.0.0.1", "-p", "PORT"],
        "/moto-api/data.json",
        &[("TZ", "UTC")],
    )
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `service` a token-auth registry ([`Registry::start_token`]) names in its Bearer
/// challenge, and the audience it wants in a token.
pub const TOKEN_SERVICE: &str = "regbroker-test-registry";
/// The issuer the token server ([`TokenServer`]) signs as and the registry trusts.
pub const TOKEN_ISSUER: &str = "regbroker-test-token-server";

/// A bcrypt htpasswd line for `user`:`password` (`htpasswd -Bbn`).
fn htpasswd_line(user: &str, password: &str) -> Vec<u8> {
    let out = run_bounded(
        Command::new(peer("htpasswd", "apt-get install apache2-utils"))
            .args(["-Bbn", user, password]),
        None,
        CLI_BOUND,
    );
    assert!(
        out.status.success(),
        "htpasswd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Writes a token signing key into `dir` with openssl: `key.pem`, an EC P-256 key in the
/// traditional `EC PRIVATE KEY` PEM (the token server's libtrust reads no PKCS#8), and
/// `cert.pem`, a self-signed certificate of it (the registry's `rootcertbundle`).
/// Returns (key, certificate).
pub fn token_signing_key(dir: &Path) -> (PathBuf, PathBuf) {
    let openssl = peer("openssl", "apt-get install openssl");
    let key = dir.join("key.pem");
    let cert = dir.join("cert.pem");
    let out = run_bounded(
        Command::new(&openssl).args([
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            key.to_str().unwrap(),
        ]),
        None,
        CLI_BOUND,
    );
    assert!(
        out.status.success(),
        "openssl ecparam failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_bounded(
        Command::new(&openssl).args([
            "req",
            "-new",
            "-x509",
            "-key",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
            "-days",
            "2",
            "-subj",
            &format!("/CN={TOKEN_ISSUER}"),
        ]),
        None,
        CLI_BOUND,
    );
    assert!(
        out.status.success(),
        "openssl req failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pem = std::fs::read_to_string(&key).unwrap();
    assert!(
        pem.contains("BEGIN EC PRIVATE KEY"),
        "openssl wrote no traditional (SEC1) EC key to {}",
        key.display()
    );
    (key, cert)
}

/// distribution's own token server (the peer `registry-token-server` that
/// `scripts/peers.sh` builds: `contrib/token-server` of github.com/docker/distribution
/// v2.8.3) on a free loopback port: it hands a Bearer token, signed with a key of its own
/// ([`token_signing_key`]), to whoever authenticates with Basic auth as the one user of
/// its htpasswd. Plain HTTP; its realm is `http://127.0.0.1:PORT/token/`. Killed when
/// dropped.
pub struct TokenServer {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The certificate of its signing key: what a registry trusting it is given.
    pub cert: PathBuf,
    process: Emulator,
}

impl TokenServer {
    /// Starts `bin` (the peer's path, from `control_plane::Peers`) with exactly
    /// `user`:`password` in its htpasswd. It exits 0 when its port is taken (it logs the
    /// listen error and returns): that start is retried with another port.
    pub fn start(bin: &Path, user: &str, password: &str) -> TokenServer {
        let mut last = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let (key, cert) = token_signing_key(dir.path());
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, htpasswd_line(user, password)).unwrap();
            let port = free_port();
            let addr = format!("127.0.0.1:{port}");
            let realm = format!("http://{addr}/token/");
            let args = [
                "-addr",
                addr.as_str(),
                "-issuer",
                TOKEN_ISSUER,
                "-realm",
                realm.as_str(),
                "-passwd",
                htpasswd.to_str().unwrap(),
                "-key",
                key.to_str().unwrap(),
            ];
            // Without credentials, `/token/` answers 401 with a Basic challenge.
            match Emulator::try_spawn(bin, &args, dir, port, "/token/", &[401], &[]) {
                Ok(process) => {
                    return TokenServer {
                        addr: process.addr.clone(),
                        cert,
                        process,
                    };
                }
                Err(e) => {
                    eprintln!("token server: start failed, retrying: {e}");
                    last = e;
                }
            }
        }
        panic!("the token server did not start: {last}");
    }

    /// Its realm, as a registry's Bearer challenge names it (`/token/`, slash included).
    pub fn realm(&self) -> String {
        format!("http://{}/token/", self.addr)
    }

    /// Replaces its htpasswd with exactly `user`:`password`, renamed into place: like the
    /// registry's ([`Registry::set_password`]), its htpasswd access controller rereads the
    /// file when its modification time changes, so nothing restarts.
    pub fn set_password(&self, user: &str, password: &str) {
        let path = self.process.dir().join("htpasswd");
        let next = self.process.dir().join("htpasswd.next");
        std::fs::write(&next, htpasswd_line(user, password)).unwrap();
        std::fs::rename(&next, &path).unwrap();
    }

    /// What it logged so far (logrus text lines: `get token complete` for a token handed
    /// out, `error authenticating user` for a refused password).
    pub fn log(&self) -> String {
        self.process.stderr()
    }
}

impl Registry {
    /// A distribution registry with token auth (`auth: token`): `/v2/` without a token
    /// answers 401 `Bearer realm="REALM",service="TOKEN_SERVICE"`, and a request with a
    /// token signed by the key of `rootcertbundle` (a PEM certificate, copied into the
    /// registry's directory), issued by [`TOKEN_ISSUER`] for [`TOKEN_SERVICE`], is
    /// authenticated. The realm may be anything: the registry never calls it. A port taken
    /// between choosing and binding it is retried with another.
    pub fn start_token(realm: &str, rootcertbundle: &Path) -> Registry {
        let bin = peer("docker-registry", "apt-get install docker-registry");
        let mut last = String::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let cert = dir.path().join("rootcertbundle.pem");
            std::fs::copy(rootcertbundle, &cert).unwrap();
            let port = free_port();
            let config = format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n\
                 auth:\n  token:\n    realm: \"{realm}\"\n    service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
                dir.path().join("data").display(),
                cert.display()
            );
            std::fs::write(dir.path().join("config.yml"), config).unwrap();
            let config = dir.path().join("config.yml").display().to_string();
            match Emulator::try_spawn(&bin, &["serve", &config], dir, port, "/v2/", &[401], &[]) {
                Ok(process) => {
                    return Registry {
                        host: process.addr.clone(),
                        _process: process,
                    };
                }
                Err(e) => {
                    eprintln!("registry (token auth): start failed, retrying: {e}");
                    last = e;
                }
            }
        }
        panic!("the distribution registry (token auth) did not start: {last}");
    }
}

/// A one-layer OCI image layout under `dir` (tag `v1`), its layer holding `marker` so
/// that images differ: what a test pushes with skopeo and pulls back.
pub fn oci_layout(dir: &Path, marker: &str) -> PathBuf {
    let root = dir.join(format!("layout-{marker}"));
    let blobs = root.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    use sha2::{Digest as _, Sha256};
    let put = |bytes: &[u8]| {
        let digest = format!("{:x}", Sha256::digest(bytes));
        std::fs::write(blobs.join(&digest), bytes).unwrap();
        (format!("sha256:{digest}"), bytes.len())
    };
    // An empty tar archive (two zero blocks) plus a marker file so images differ.
    let mut layer = vec![0u8; 1024];
    layer.extend_from_slice(marker.as_bytes());
    let (layer_digest, layer_size) = put(&layer);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = put(config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = put(manifest.to_string().as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": "v1"},
        }],
    });
    std::fs::write(root.join("index.json"), index.to_string()).unwrap();
    std::fs::write(root.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    root
}

/// python3 from PATH, which must import the oras client.
pub fn python_with_oras() -> PathBuf {
    let python = peer("python3", "apt-get install python3");
    let has_oras = run_bounded(
        Command::new(&python).args(["-c", "import oras.client"]),
        None,
        CLI_BOUND,
    )
    .status
    .success();
    assert!(
        has_oras,
        "test peer `oras` (the Python client) is missing from {}; install it with \
         `pip install oras`, or run `bash scripts/test.sh`, which installs every peer",
        python.display()
    );
    python
}
