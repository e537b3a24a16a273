//! The Helm CLI through the docker credential helper, against a real registry.
//!
//! Peers, none written here: the Helm CLI (v4, built by `scripts/peers.sh`, found through
//! `REGBROKER_PEERS_FILE`), the distribution registry (Debian `docker-registry`) with
//! htpasswd auth (`apache2-utils`). Helm reads a docker-style registry config
//! (`--registry-config`) whose `credHelpers` names `regbroker` for the registry, so it
//! runs `docker-credential-regbroker` from PATH; regbroker answers from a static docker
//! config, in-process (`REGBROKER_DOCKER_CONFIG`) or through a `regbroker serve` sidecar
//! (`REGBROKER_ENDPOINT`). The helper on PATH is a small shell script that appends each
//! action and its stdin to a log, then runs the documented install (a symlink named
//! `docker-credential-regbroker` to the regbroker binary), so the tests can say which
//! actions Helm called.
//!
//! Every helm invocation runs with a cleared environment: HOME, the XDG and HELM_*_HOME
//! directories in the test's temporary directory, and PATH = the helper's directory plus
//! the original PATH, so nothing reads or writes the real user's configuration.
//!
//! Every test is `#[ignore]`d with the peers it needs: plain `cargo test` lists them as
//! ignored, `scripts/test.sh` runs them with `--include-ignored`, and a missing peer is
//! then a failure naming it, never a silent pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod registry_peer;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::ServeProcess;
use registry_peer::{PASSWORD, Registry, USER};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");
/// The chart this repository ships, and its version (deploy/chart/regbroker/Chart.yaml).
const CHART_VERSION: &str = "0.1.0";

/// What one helm run did.
struct Run {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// stdout and stderr together (helm prints its status lines on either).
    fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A temporary directory with the helm binary, a private HOME, and the logging helper.
struct Fixture {
    dir: tempfile::TempDir,
    helm: PathBuf,
    /// Holds `docker-credential-regbroker` (the logging script).
    bin: PathBuf,
    /// One line per helper run: `ACTION STDIN`.
    helper_log: PathBuf,
    runs: usize,
}

impl Fixture {
    fn new() -> Fixture {
        // scripts/peers.sh once per test binary, not once per test.
        static HELM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        let helm = HELM
            .get_or_init(|| control_plane::Peers::find().get("helm").to_path_buf())
            .clone();
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        // The documented install, a symlink named as the helper...
        let real = dir.path().join("real-helper");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink(BIN, real.join("docker-credential-regbroker")).unwrap();
        // ...run by a script on PATH that logs what it was asked first.
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let helper_log = dir.path().join("helper.log");
        let script = format!(
            "#!/bin/sh\n\
             input=$(cat)\n\
             printf '%s %s\\n' \"$1\" \"$input\" >> '{log}'\n\
             printf '%s' \"$input\" | exec '{real}' \"$@\"\n",
            log = helper_log.display(),
            real = real.join("docker-credential-regbroker").display(),
        );
        let helper = bin.join("docker-credential-regbroker");
        std::fs::write(&helper, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Fixture {
            dir,
            helm,
            bin,
            helper_log,
            runs: 0,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A docker config with one static entry: `host` = `USER:password`.
    fn static_config(&self, host: &str, password: &str) -> PathBuf {
        let path = self.path().join(format!("static-{password}.json"));
        std::fs::write(
            &path,
            common::docker_config(&[(host, USER, password)]).as_bytes(),
        )
        .unwrap();
        path
    }

    /// A registry config for helm; `credHelpers` maps `host` to regbroker unless `None`.
    fn registry_config(&self, name: &str, host: Option<&str>) -> PathBuf {
        let path = self.path().join(format!("{name}.json"));
        let doc = match host {
            Some(host) => serde_json::json!({"credHelpers": {host: "regbroker"}}),
            None => serde_json::json!({}),
        };
        std::fs::write(&path, doc.to_string()).unwrap();
        path
    }

    /// Runs helm with exactly the private environment plus `env`, `stdin` on its stdin;
    /// fails the test after two minutes.
    fn helm(&mut self, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Run {
        self.runs += 1;
        let home = self.path().join("home");
        let out = self.path().join(format!("helm-{}.out", self.runs));
        let err = self.path().join(format!("helm-{}.err", self.runs));
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new(&self.helm)
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("HOME", &home)
            .env("TMPDIR", std::env::temp_dir())
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env("HELM_CONFIG_HOME", home.join(".config/helm"))
            .env("HELM_CACHE_HOME", home.join(".cache/helm"))
            .env("HELM_DATA_HOME", home.join(".local/share/helm"))
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.helm.display()));
        {
            use std::io::Write as _;
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(stdin.as_bytes()).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "helm {args:?} did not finish in 120 s; stderr: {}",
                    std::fs::read_to_string(&err).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Run {
            ok: status.success(),
            code: status.code(),
            stdout: std::fs::read_to_string(&out).unwrap(),
            stderr: std::fs::read_to_string(&err).unwrap(),
        }
    }

    /// Packages deploy/chart/regbroker; returns the .tgz.
    fn package(&mut self) -> PathBuf {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/chart/regbroker");
        let dest = self.path().join("package");
        let run = self.helm(
            &[
                "package",
                chart.to_str().unwrap(),
                "-d",
                dest.to_str().unwrap(),
            ],
            &[],
            "",
        );
        assert!(run.ok, "helm package: {run}");
        let tgz = dest.join(format!("regbroker-{CHART_VERSION}.tgz"));
        assert!(tgz.is_file(), "helm package made no {}", tgz.display());
        tgz
    }

    /// `helm push TGZ oci://HOST/REPO --plain-http --registry-config CONFIG`.
    fn push(
        &mut self,
        tgz: &Path,
        reg: &Registry,
        repo: &str,
        config: &Path,
        env: &[(&str, &str)],
    ) -> Run {
        self.helm(
            &[
                "push",
                tgz.to_str().unwrap(),
                &format!("oci://{}/{repo}", reg.host),
                "--plain-http",
                "--registry-config",
                config.to_str().unwrap(),
            ],
            env,
            "",
        )
    }

    /// `helm pull oci://HOST/REPO/regbroker --version V --plain-http --registry-config
    /// CONFIG -d OUT` into a new directory OUT; returns the run and the pulled .tgz path.
    fn pull(
        &mut self,
        reg: &Registry,
        repo: &str,
        config: &Path,
        env: &[(&str, &str)],
    ) -> (Run, PathBuf) {
        // helm pull does not create its -d directory.
        let out = self.path().join(format!("pulled-{}", self.runs + 1));
        std::fs::create_dir_all(&out).unwrap();
        let run = self.helm(
            &[
                "pull",
                &format!("oci://{}/{repo}/regbroker", reg.host),
                "--version",
                CHART_VERSION,
                "--plain-http",
                "--registry-config",
                config.to_str().unwrap(),
                "-d",
                out.to_str().unwrap(),
            ],
            env,
            "",
        );
        (run, out.join(format!("regbroker-{CHART_VERSION}.tgz")))
    }

    /// Asserts the pull succeeded and brought back exactly `pushed`, a chart helm reads as
    /// this repository's.
    fn assert_pulled(&mut self, (run, pulled): (Run, PathBuf), pushed: &Path) {
        assert!(run.ok, "helm pull: {run}");
        assert!(
            std::fs::read(&pulled).unwrap() == std::fs::read(pushed).unwrap(),
            "the pulled {} differs from the pushed {}",
            pulled.display(),
            pushed.display()
        );
        let show = self.helm(&["show", "chart", pulled.to_str().unwrap()], &[], "");
        assert!(show.ok, "helm show chart: {show}");
        assert!(
            show.stdout.contains("name: regbroker\n")
                && show.stdout.contains(&format!("version: {CHART_VERSION}\n")),
            "not the regbroker chart: {}",
            show.stdout
        );
    }

    /// The helper runs logged since the last call, as `ACTION STDIN` lines; clears the log.
    fn helper_calls(&self) -> Vec<String> {
        let calls = std::fs::read_to_string(&self.helper_log).unwrap_or_default();
        let _ = std::fs::remove_file(&self.helper_log);
        calls.lines().map(str::to_string).collect()
    }
}

/// Push and pull the project's chart with helm, the credential coming from
/// `docker-credential-regbroker`: in-process from a static docker config, then from a
/// sidecar over HTTP (the helper then has no configuration of its own, and fails once the
/// sidecar is gone).
#[test]
#[ignore = "needs helm from scripts/peers.sh, docker-registry and htpasswd: run scripts/test.sh"]
fn helm_pushes_and_pulls_the_chart_through_the_helper_in_process_and_via_the_sidecar() {
    let mut fx = Fixture::new();
    let reg = Registry::start(false);
    let config = fx.registry_config("helm-registry", Some(&reg.host));
    let good = fx.static_config(&reg.host, PASSWORD);
    let good_s = good.to_str().unwrap();
    let tgz = fx.package();
    fx.helper_calls();

    // In-process: the helper runs the broker itself on the static config.
    let env = [("REGBROKER_DOCKER_CONFIG", good_s)];
    let push = fx.push(&tgz, &reg, "charts", &config, &env);
    assert!(push.ok, "helm push: {push}");
    assert!(
        push.output().contains(&format!(
            "Pushed: {}/charts/regbroker:{CHART_VERSION}",
            reg.host
        )),
        "{push}"
    );
    assert_eq!(fx.helper_calls(), [format!("get {}", reg.host)]);
    let pulled = fx.pull(&reg, "charts", &config, &env);
    fx.assert_pulled(pulled, &tgz);
    assert_eq!(fx.helper_calls(), [format!("get {}", reg.host)]);

    // Via the sidecar: a `regbroker serve` holding the static config; the helper only
    // knows its address. Push to a repository of its own so the pull proves the push.
    let mut sidecar = ServeProcess::start(&["--docker-config", good_s], &[]);
    let endpoint = format!("http://{}", sidecar.addr);
    let env = [("REGBROKER_ENDPOINT", endpoint.as_str())];
    let push = fx.push(&tgz, &reg, "sidecar-charts", &config, &env);
    assert!(push.ok, "helm push via the sidecar: {push}");
    let pulled = fx.pull(&reg, "sidecar-charts", &config, &env);
    fx.assert_pulled(pulled, &tgz);
    assert_eq!(
        fx.helper_calls(),
        [format!("get {}", reg.host), format!("get {}", reg.host)]
    );
    assert!(sidecar.stop().success());

    // With the sidecar gone, helm reports the helper's error and pulls nothing: the
    // credential above came through it.
    let (pull, pulled) = fx.pull(&reg, "sidecar-charts", &config, &env);
    assert!(!pull.ok, "pull with the sidecar stopped: {pull}");
    assert!(
        pull.stderr.contains("cannot reach the regbroker sidecar"),
        "{pull}"
    );
    assert!(!pulled.exists());
}

/// The helper is what authenticates helm: without `credHelpers` helm has no credential,
/// and with the helper serving a wrong password the registry refuses it.
#[test]
#[ignore = "needs helm from scripts/peers.sh, docker-registry and htpasswd: run scripts/test.sh"]
fn helm_pull_fails_when_the_helper_has_the_wrong_password() {
    let mut fx = Fixture::new();
    let reg = Registry::start(false);
    let config = fx.registry_config("helm-registry", Some(&reg.host));
    let good = fx.static_config(&reg.host, PASSWORD);
    let bad = fx.static_config(&reg.host, "wrong-password");
    let tgz = fx.package();
    let good_env = [("REGBROKER_DOCKER_CONFIG", good.to_str().unwrap())];
    let push = fx.push(&tgz, &reg, "charts", &config, &good_env);
    assert!(push.ok, "helm push: {push}");
    fx.helper_calls();

    // The same helper, holding a wrong password: asked, and refused by the registry.
    let bad_env = [("REGBROKER_DOCKER_CONFIG", bad.to_str().unwrap())];
    let (pull, pulled) = fx.pull(&reg, "charts", &config, &bad_env);
    assert!(!pull.ok, "pull with a wrong password: {pull}");
    assert!(pull.stderr.contains("401"), "{pull}");
    assert!(!pulled.exists());
    assert_eq!(fx.helper_calls(), [format!("get {}", reg.host)]);

    // No credHelpers: helm never runs the helper and has no credential at all.
    let plain = fx.registry_config("no-helpers", None);
    let (pull, pulled) = fx.pull(&reg, "charts", &plain, &good_env);
    assert!(!pull.ok, "pull without credHelpers: {pull}");
    assert!(pull.stderr.contains("basic credential not found"), "{pull}");
    assert!(!pulled.exists());
    assert_eq!(fx.helper_calls(), Vec::<String>::new());

    // Control: the good password through the same helper pulls.
    let pulled = fx.pull(&reg, "charts", &config, &good_env);
    fx.assert_pulled(pulled, &tgz);
}

/// `helm registry login` and `logout` with regbroker as the credHelper: helm hands the
/// credential to the helper's `store` and asks `erase` on logout, both no-ops that succeed;
/// nothing lands in the registry config, and pulls keep working through `get`.
#[test]
#[ignore = "needs helm from scripts/peers.sh, docker-registry and htpasswd: run scripts/test.sh"]
fn helm_registry_login_and_logout_succeed_with_regbroker_as_the_cred_helper() {
    let mut fx = Fixture::new();
    let reg = Registry::start(false);
    let config = fx.registry_config("helm-registry", Some(&reg.host));
    let before = std::fs::read_to_string(&config).unwrap();
    let good = fx.static_config(&reg.host, PASSWORD);
    let env = [("REGBROKER_DOCKER_CONFIG", good.to_str().unwrap())];
    let tgz = fx.package();
    let config_s = config.to_str().unwrap();
    fx.helper_calls();

    let login = fx.helm(
        &[
            "registry",
            "login",
            &reg.host,
            "-u",
            USER,
            "--password-stdin",
            "--plain-http",
            "--registry-config",
            config_s,
        ],
        &env,
        PASSWORD,
    );
    assert!(login.ok, "helm registry login: {login}");
    assert!(login.output().contains("Login Succeeded"), "{login}");
    let calls = fx.helper_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let stored: serde_json::Value = serde_json::from_str(
        calls[0]
            .strip_prefix("store ")
            .unwrap_or_else(|| panic!("login ran {calls:?}, not store")),
    )
    .unwrap();
    assert_eq!(stored["ServerURL"], reg.host.as_str());
    assert_eq!(stored["Username"], USER);
    // The helper took the credential, so helm kept it out of its own file.
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);

    let push = fx.push(&tgz, &reg, "charts", &config, &env);
    assert!(push.ok, "helm push after login: {push}");
    let pulled = fx.pull(&reg, "charts", &config, &env);
    fx.assert_pulled(pulled, &tgz);
    assert_eq!(
        fx.helper_calls(),
        [format!("get {}", reg.host), format!("get {}", reg.host)]
    );

    let logout = fx.helm(
        &[
            "registry",
            "logout",
            &reg.host,
            "--registry-config",
            config_s,
        ],
        &env,
        "",
    );
    assert!(logout.ok, "helm registry logout: {logout}");
    assert_eq!(fx.helper_calls(), [format!("erase {}", reg.host)]);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);

    // erase forgot nothing: regbroker still serves the registry from its own source.
    let pulled = fx.pull(&reg, "charts", &config, &env);
    fx.assert_pulled(pulled, &tgz);
    assert_eq!(fx.helper_calls(), [format!("get {}", reg.host)]);
}
