//! Real clients against a real registry, through regbroker's client protocols.
//!
//! Peers, none written here: the distribution registry (Debian `docker-registry`) with
//! htpasswd auth (`apache2-utils`), skopeo (Debian), the oras Python client (PyPI
//! `oras`), and the AWS reference helper `docker-credential-ecr-login` (Debian
//! `amazon-ecr-credential-helper`), plus the emulators gcplocal and moto (PyPI). Every test
//! here needs one of them, so each is `#[ignore]`d with the peers it needs: plain
//! `cargo test` lists them as ignored, and `scripts/test.sh` (which installs the peers)
//! runs them with `--include-ignored`. A peer missing from PATH when a test runs is a
//! failure naming the peer, never a silent pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod registry_peer;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::ServeProcess;
use common::process::{CLI_BOUND, KillOnDrop, PEER_CLIENT_BOUND, run_bounded};
use registry_peer::{
    Emulator, PASSWORD, Registry, USER, http_status, oci_layout, peer, python_with_oras,
};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

/// A directory holding `docker-credential-regbroker`, a symlink to the binary (the
/// documented install).
fn helper_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(BIN, bin.join("docker-credential-regbroker")).unwrap();
    bin
}

fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn static_config(dir: &Path, host: &str, password: &str) -> PathBuf {
    let path = dir.join(format!("static-{password}.json"));
    std::fs::write(
        &path,
        serde_json::json!({"auths": {host: {"username": USER, "password": password}}}).to_string(),
    )
    .unwrap();
    path
}

fn skopeo(args: &[&str], env: &[(&str, String)], home: &Path) -> Output {
    let mut cmd = Command::new("skopeo");
    cmd.arg("--insecure-policy")
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("TMPDIR", std::env::temp_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(&mut cmd, None, PEER_CLIENT_BOUND)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Pushes a fresh image and pulls it back; returns skopeo's outputs.
fn push_pull(
    reg: &Registry,
    dir: &Path,
    marker: &str,
    authfile: &Path,
    env: &[(&str, String)],
) -> (Output, Option<Output>) {
    let layout = oci_layout(dir, marker);
    let src = format!("oci:{}:v1", layout.display());
    let dst = format!("docker://{}/test/{marker}:v1", reg.host);
    let auth = authfile.to_str().unwrap();
    let push = skopeo(
        &[
            "copy",
            "--authfile",
            auth,
            "--dest-tls-verify=false",
            &src,
            &dst,
        ],
        env,
        dir,
    );
    if !push.status.success() {
        return (push, None);
    }
    let out = dir.join(format!("pulled-{marker}"));
    let pull = skopeo(
        &[
            "copy",
            "--authfile",
            auth,
            "--src-tls-verify=false",
            &dst,
            &format!("oci:{}:v1", out.display()),
        ],
        env,
        dir,
    );
    if pull.status.success() {
        assert!(out.join("index.json").is_file());
    }
    (push, Some(pull))
}

fn cred_helpers_authfile(dir: &Path, hosts: &[&str]) -> PathBuf {
    let helpers: serde_json::Map<String, serde_json::Value> = hosts
        .iter()
        .map(|h| (h.to_string(), "regbroker".into()))
        .collect();
    let path = dir.join("auth.json");
    std::fs::write(
        &path,
        serde_json::json!({"credHelpers": helpers}).to_string(),
    )
    .unwrap();
    path
}

#[test]
#[ignore = "needs skopeo, docker-registry, htpasswd: run scripts/test.sh"]
fn skopeo_copies_through_the_helper_in_process_and_via_the_sidecar() {
    peer("skopeo", "apt-get install skopeo");
    let reg = Registry::start(false);
    let dir = tempfile::tempdir().unwrap();
    let bin = helper_dir(dir.path());
    let authfile = cred_helpers_authfile(dir.path(), &[&reg.host]);
    let good = static_config(dir.path(), &reg.host, PASSWORD);
    let bad = static_config(dir.path(), &reg.host, "wrong-password");

    // Control: with a wrong password the registry refuses, so a success below proves the
    // helper's credential reached it.
    let env = [
        ("PATH", path_with(&bin)),
        ("REGBROKER_DOCKER_CONFIG", bad.display().to_string()),
    ];
    let (push, _) = push_pull(&reg, dir.path(), "control", &authfile, &env);
    assert!(
        !push.status.success(),
        "push with a wrong password must fail"
    );

    // In-process backend, with the disk cache on.
    let cache = dir.path().join("cache");
    let env = [
        ("PATH", path_with(&bin)),
        ("REGBROKER_DOCKER_CONFIG", good.display().to_string()),
        ("REGBROKER_CACHE_DIR", cache.display().to_string()),
    ];
    let (push, pull) = push_pull(&reg, dir.path(), "inprocess", &authfile, &env);
    assert!(push.status.success(), "push: {}", text(&push.stderr));
    let pull = pull.unwrap();
    assert!(pull.status.success(), "pull: {}", text(&pull.stderr));

    // Sidecar backend over HTTP: the helper has no static config of its own.
    let mut sidecar = ServeProcess::start(&["--docker-config", good.to_str().unwrap()], &[]);
    let env = [
        ("PATH", path_with(&bin)),
        ("REGBROKER_ENDPOINT", format!("http://{}", sidecar.addr)),
    ];
    let (push, pull) = push_pull(&reg, dir.path(), "sidecar", &authfile, &env);
    assert!(push.status.success(), "push: {}", text(&push.stderr));
    assert!(pull.unwrap().status.success());
    assert!(sidecar.stop().success());

    // Sidecar backend over a unix socket.
    let sock = dir.path().join("regbroker.sock");
    let _child = KillOnDrop(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                &format!("unix:{}", sock.display()),
                "--docker-config",
                good.to_str().unwrap(),
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let env = [
        ("PATH", path_with(&bin)),
        ("REGBROKER_ENDPOINT", format!("unix:{}", sock.display())),
    ];
    let (push, _) = push_pull(&reg, dir.path(), "unixsocket", &authfile, &env);
    assert!(push.status.success(), "push: {}", text(&push.stderr));
}

#[test]
#[ignore = "needs skopeo, docker-registry: run scripts/test.sh"]
fn skopeo_goes_anonymous_when_the_helper_has_nothing() {
    peer("skopeo", "apt-get install skopeo");
    let reg = Registry::start(true);
    let dir = tempfile::tempdir().unwrap();
    let bin = helper_dir(dir.path());
    let authfile = cred_helpers_authfile(dir.path(), &[&reg.host]);
    // regbroker knows nothing about this registry: the helper answers "credentials not
    // found in native keychain" and skopeo proceeds anonymously.
    let env = [("PATH", path_with(&bin))];
    let (push, pull) = push_pull(&reg, dir.path(), "anonymous", &authfile, &env);
    assert!(push.status.success(), "push: {}", text(&push.stderr));
    assert!(pull.unwrap().status.success());

    // And the helper's answer is exactly the protocol's text.
    let out = run_bounded(
        Command::new(bin.join("docker-credential-regbroker"))
            .arg("get")
            .env_remove("REGBROKER_DOCKER_CONFIG")
            .env_remove("REGBROKER_CONFIG")
            .env_remove("REGBROKER_ENDPOINT"),
        Some(reg.host.as_bytes()),
        CLI_BOUND,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stdout),
        "credentials not found in native keychain\n"
    );
}

#[test]
#[ignore = "needs python3, oras (PyPI), docker-registry, htpasswd: run scripts/test.sh"]
fn oras_pushes_and_pulls_with_the_docker_config_sink() {
    let python = python_with_oras();
    let reg = Registry::start(false);
    let dir = tempfile::tempdir().unwrap();
    let good = static_config(dir.path(), &reg.host, PASSWORD);
    let sink = dir.path().join("docker").join("config.json");
    std::fs::create_dir_all(sink.parent().unwrap()).unwrap();
    let mut srv = ServeProcess::start(
        &[
            "--docker-config",
            good.to_str().unwrap(),
            "--write-docker-config",
            sink.to_str().unwrap(),
        ],
        &[],
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&sink).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&sink).unwrap()).unwrap();
    assert!(written["auths"][&reg.host]["auth"].is_string(), "{written}");

    let artifact = dir.path().join("artifact.txt");
    std::fs::write(&artifact, "hello from regbroker").unwrap();
    let script = r#"
import os, sys
import oras.client
host, config, artifact, out = sys.argv[1:5]
client = oras.client.OrasClient(hostname=host, insecure=True, auth_backend="basic")
target = f"{host}/test/artifact:v1"
os.chdir(os.path.dirname(artifact))
res = client.push(target=target, files=[os.path.basename(artifact)], config_path=config)
assert res.status_code in (200, 201), res.status_code
files = client.pull(target=target, outdir=out, config_path=config)
print(open(files[0]).read())
"#;
    let out = run_bounded(
        Command::new(&python)
            .args([
                "-c",
                script,
                &reg.host,
                sink.to_str().unwrap(),
                artifact.to_str().unwrap(),
            ])
            .arg(dir.path().join("out")),
        None,
        PEER_CLIENT_BOUND,
    );
    assert!(
        out.status.success(),
        "oras: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("hello from regbroker"));

    // Control: the registry really requires a credential (oras itself retries a 401 for
    // minutes, so ask the registry directly).
    assert_eq!(http_status(&reg.host, "/v2/"), 401);
    assert!(srv.stop().success());
}

#[test]
#[ignore = "needs docker-credential-ecr-login: run scripts/test.sh"]
fn helper_agrees_with_the_reference_ecr_helper_where_it_should() {
    let reference = peer(
        "docker-credential-ecr-login",
        "apt-get install amazon-ecr-credential-helper",
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = helper_dir(dir.path());
    let ours = bin.join("docker-credential-regbroker");
    let run = |helper: &Path, action: &str, input: &str| {
        let out = run_bounded(
            Command::new(helper)
                .arg(action)
                .env_clear()
                .env("HOME", dir.path())
                .env("PATH", "/usr/bin:/bin"),
            Some(input.as_bytes()),
            CLI_BOUND,
        );
        (out.status.code(), text(&out.stdout))
    };
    // Hosts neither serves: the same exit code and the same text, to the byte.
    for input in [
        "registry.example.com\n",
        "127.0.0.1:5000\n",
        "https://index.docker.io/v1/\n",
        "registry.example.com",
    ] {
        assert_eq!(
            run(&ours, "get", input),
            run(&reference, "get", input),
            "get {input:?}"
        );
    }
    // `list` with nothing stored: an empty JSON object from both.
    assert_eq!(run(&ours, "list", ""), run(&reference, "list", ""));
    // `version`: one line from both.
    for helper in [&ours, &reference] {
        let (code, out) = run(helper, "version", "");
        assert_eq!(code, Some(0));
        assert_eq!(out.lines().count(), 1, "{out}");
    }
    // Where they differ on purpose: the reference refuses `store`/`erase` ("not
    // implemented", exit 1); regbroker accepts them as no-ops so `docker login` flows do
    // not break.
    assert_eq!(run(&reference, "store", "{}").0, Some(1));
    assert_eq!(
        run(
            &ours,
            "store",
            r#"{"ServerURL":"x","Username":"u","Secret":"s"}"#
        )
        .0,
        Some(0)
    );
}

const GCPLOCAL_TOKEN: &str = "ya29.gcplocal-mock-token";
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

fn gcplocal() -> Emulator {
    let bin = peer("gcplocal", "pip install gcplocal");
    Emulator::start(
        &bin,
        &["start", "--host", "127.0.0.1", "--port", "PORT"],
        METADATA_TOKEN_PATH,
        &[],
    )
}

/// Runs the regbroker binary with exactly `env` (plus PATH).
fn regbroker(args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> (Option<i32>, String, String) {
    let out = run_bounded(
        Command::new(BIN)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(env.iter().copied()),
        Some(stdin),
        CLI_BOUND,
    );
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
#[ignore = "needs gcplocal: run scripts/test.sh"]
fn resolve_artifact_registry_against_gcplocal() {
    let meta = gcplocal();
    let (code, out, err) = regbroker(
        &["resolve", "europe-west1-docker.pkg.dev", "--show-secret"],
        &[("GCE_METADATA_HOST", &meta.addr)],
        b"",
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("decided:   auto-detected"), "{out}");
    assert!(out.contains("source:    gcp"), "{out}");
    assert!(out.contains("username:  oauth2accesstoken"), "{out}");
    assert!(
        out.contains(&format!("password:  {GCPLOCAL_TOKEN}")),
        "{out}"
    );
}

#[test]
#[ignore = "needs moto_server: run scripts/test.sh"]
fn resolve_and_serve_ecr_against_moto() {
    let bin = peer("moto_server", "pip install 'moto[server]'");
    // moto computes its fixed 2015 expiry in local time: pin the zone.
    let moto = Emulator::start(
        &bin,
        &["-H", "127.0.0.1", "-p", "PORT"],
        "/moto-api/data.json",
        &[("TZ", "UTC")],
    );
    let endpoint = format!("http://{}", moto.addr);
    let env = [
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY", "moto-secret-key"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let host = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
    let (code, out, err) = regbroker(&["resolve", host], &env, b"");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("source:    aws"), "{out}");
    assert!(out.contains("username:  AWS"), "{out}");
    assert!(
        out.contains("already past"),
        "moto's 2015 expiry is reported as past: {out}"
    );

    // The sidecar serves it too, with the untrusted past expiry reported as null.
    let mut srv = ServeProcess::start(&[], &env);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body: serde_json::Value = rt.block_on(async {
        let res = reqwest::get(format!(
            "http://{}/v1/credentials?registry={host}",
            srv.addr
        ))
        .await
        .unwrap();
        assert_eq!(res.status().as_u16(), 200);
        res.json().await.unwrap()
    });
    assert_eq!(body["username"], "AWS");
    assert_eq!(body["provider"], "aws");
    assert!(body["expiresAt"].is_null(), "{body}");
    assert!(!body["password"].as_str().unwrap().is_empty());
    assert!(srv.stop().success());
}

/// The whole chain with a cloud identity: gcplocal (a third-party GCE metadata emulator)
/// hands out the access token, the gcp provider exchanges the identity, the cache and the
/// helper protocol carry it, skopeo uses it, and the registry accepts it because its
/// htpasswd holds `oauth2accesstoken` with that token.
#[test]
#[ignore = "needs skopeo, gcplocal, docker-registry, htpasswd: run scripts/test.sh"]
fn skopeo_and_kubelet_through_a_cloud_identity_from_gcplocal() {
    peer("skopeo", "apt-get install skopeo");
    let meta = gcplocal();
    let reg = Registry::start_with(Some(("oauth2accesstoken", GCPLOCAL_TOKEN)));
    let dir = tempfile::tempdir().unwrap();
    let bin = helper_dir(dir.path());
    let authfile = cred_helpers_authfile(dir.path(), &[&reg.host]);
    let config = dir.path().join("regbroker.toml");
    std::fs::write(
        &config,
        format!("[[rule]]\nmatch = \"{}\"\nsource = \"gcp\"\n", reg.host),
    )
    .unwrap();
    let env = [
        ("PATH", path_with(&bin)),
        ("REGBROKER_CONFIG", config.display().to_string()),
        ("GCE_METADATA_HOST", meta.addr.clone()),
    ];
    let (push, pull) = push_pull(&reg, dir.path(), "cloudchain", &authfile, &env);
    assert!(push.status.success(), "push: {}", text(&push.stderr));
    assert!(pull.unwrap().status.success());

    // The kubelet mode, same identity: a cacheDuration from the token's 3600 s life.
    let request = format!(
        r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"{}/test/cloudchain:v1"}}"#,
        reg.host
    );
    let config_s = config.display().to_string();
    let (code, out, err) = regbroker(
        &["kubelet-credential-provider"],
        &[
            ("REGBROKER_CONFIG", &config_s),
            ("GCE_METADATA_HOST", &meta.addr),
        ],
        request.as_bytes(),
    );
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["auth"][&reg.host]["username"], "oauth2accesstoken");
    assert_eq!(v["auth"][&reg.host]["password"], GCPLOCAL_TOKEN);
    // 3600 s of life less the 30 s margin, less the few seconds the fetch took.
    let d = v["cacheDuration"].as_str().unwrap();
    assert!(d.starts_with("59m") || d.starts_with("58m"), "{d}");
}
