//! The `regbroker` binary: flags, exit codes, the README's run command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::process::{CLI_BOUND, KillOnDrop, run_bounded};
use common::{ServeProcess, wait_exit};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn regbroker(args: &[&str]) -> std::process::Output {
    run_bounded(
        Command::new(BIN)
            .args(args)
            .env_remove("REGBROKER_CONFIG")
            .env_remove("REGBROKER_DOCKER_CONFIG")
            .env_remove("REGBROKER_LISTEN"),
        None,
        CLI_BOUND,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn version_prints_the_crate_version() {
    let out = regbroker(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        format!("regbroker {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn resolve_explains_and_redacts_by_default() {
    let dc = example("dockerconfig.json");
    let cfg = example("regbroker.toml");
    let out = regbroker(&[
        "resolve",
        "https://registry.example.com/v2/",
        "--docker-config",
        &dc,
        "--config",
        &cfg,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("registry:  registry.example.com"),
        "{stdout}"
    );
    assert!(stdout.contains("source:    static"), "{stdout}");
    assert!(stdout.contains("username:  demo-user"), "{stdout}");
    assert!(stdout.contains("<redacted"), "{stdout}");
    assert!(!stdout.contains("demo-password"), "{stdout}");

    let out = regbroker(&[
        "resolve",
        "registry.example.com",
        "--docker-config",
        &dc,
        "--show-secret",
    ]);
    assert!(text(&out.stdout).contains("password:  demo-password"));
}

#[test]
fn resolve_names_the_rule_that_disables_login() {
    let cfg = example("regbroker.toml");
    let out = regbroker(&[
        "resolve",
        "zot.registry.svc.cluster.local:5000",
        "--config",
        &cfg,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("rule 1"), "{stdout}");
    assert!(
        text(&out.stderr).contains("no credential"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn resolve_unknown_registry_fails_with_exit_1() {
    let out = regbroker(&["resolve", "unknown.example.com"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no credential"));
    let out = regbroker(&["resolve", "user:pw@unknown.example.com"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("userinfo"));
    assert!(!text(&out.stderr).contains("pw@"));
}

/// A docker config with a Docker Hub entry and a `host:port` entry.
fn hub_and_port_config(dir: &std::path::Path) -> String {
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        r#"{"auths": {"https://index.docker.io/v1/": {"username": "hub-user", "password": "hub-pw"},
                      "name:5000": {"username": "port-user", "password": "port-pw"}}}"#,
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn resolve_reads_an_image_as_docker_pull_does_and_host_port_as_docker_login_does() {
    let dir = tempfile::tempdir().unwrap();
    let dc = hub_and_port_config(dir.path());
    for (input, registry, user) in [
        ("nginx:latest", "docker.io", "hub-user"),
        ("library/nginx:1.27", "docker.io", "hub-user"),
        ("name:5000", "name:5000", "port-user"),
        ("name:5000/app:1", "name:5000", "port-user"),
    ] {
        let out = regbroker(&["resolve", input, "--docker-config", &dc]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{input}: {stdout}{}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("registry:  {registry}\n")),
            "{input}: {stdout}"
        );
        assert!(
            stdout.contains(&format!("username:  {user}\n")),
            "{input}: {stdout}"
        );
    }
    let out = regbroker(&["resolve", "Nginx:latest", "--docker-config", &dc]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("lower case"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_secret_naming_an_image_reference_is_accepted_and_a_bad_one_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let dc = hub_and_port_config(dir.path());
    let cfg = dir.path().join("tenants.toml");
    let secret = |registries: &str| {
        std::fs::write(
            &cfg,
            format!(
                "[[secret]]\nnamespace = \"team-a\"\nname = \"pull\"\nregistries = {registries}\n"
            ),
        )
        .unwrap();
        regbroker(&[
            "resolve",
            "nginx:latest",
            "--config",
            cfg.to_str().unwrap(),
            "--docker-config",
            &dc,
        ])
    };
    let out = secret(r#"["nginx:latest", "name:5000"]"#);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = secret(r#"["Nginx:latest"]"#);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("team-a/pull") && stderr.contains("lower case"),
        "{stderr}"
    );
}

#[test]
fn docker_config_env_takes_a_comma_separated_list() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.json");
    std::fs::write(
        &a,
        r#"{"auths": {"a.example.com": {"username": "ua", "password": "pa"}}}"#,
    )
    .unwrap();
    let b = dir.path().join("b.json");
    std::fs::write(
        &b,
        r#"{"auths": {"b.example.com": {"username": "ub", "password": "pb"}}}"#,
    )
    .unwrap();
    let out = run_bounded(
        Command::new(BIN).args(["resolve", "b.example.com"]).env(
            "REGBROKER_DOCKER_CONFIG",
            format!("{},{}", a.display(), b.display()),
        ),
        None,
        CLI_BOUND,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("username:  ub"));
}

#[test]
fn invalid_configuration_exits_64_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "# comment\n[[rule]]\nmatch = \"a.example.com\"\nsource = \"awz\"\n",
    )
    .unwrap();
    let out = regbroker(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(cfg.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("line 3"), "{stderr}");

    let dc = dir.path().join("broken.json");
    std::fs::write(&dc, "{ nope").unwrap();
    let out = regbroker(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--docker-config",
        dc.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("broken.json"));

    let out = regbroker(&["serve", "--docker-config", "/nonexistent/config.json"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("/nonexistent/config.json"));

    let out = regbroker(&["serve", "--listen", "localhost:http"]);
    assert_eq!(out.status.code(), Some(64));
    let out = regbroker(&["serve", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn a_secret_naming_another_namespaces_service_account_exits_64_at_start_up() {
    // Issue 15.6: a tenant's Secret may only use a ServiceAccount of its own namespace;
    // refused before anything connects (no cluster here), naming the entry.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tenants.toml");
    std::fs::write(
        &cfg,
        "[[secret]]\nnamespace = \"team-a\"\nname = \"pull\"\nregistries = [\"a.example.com\"]\nservice_account = \"team-b/puller\"\n",
    )
    .unwrap();
    let out = regbroker(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("team-a/pull"), "{stderr}");
    assert!(stderr.contains("team-b/puller"), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");

    // The same Secret in --sync-secret and in the file: named once, or refused.
    std::fs::write(
        &cfg,
        "[[secret]]\nnamespace = \"team-a\"\nname = \"pull\"\nregistries = [\"a.example.com\"]\n",
    )
    .unwrap();
    let out = regbroker(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        cfg.to_str().unwrap(),
        "--sync-secret",
        "team-a/pull",
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("name it once"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn misordered_leader_election_timings_exit_64_naming_the_flags() {
    let base = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--sync-secret",
        "apps/regbroker-pull",
        "--leader-elect",
    ];
    for (extra, names) in [
        (
            ["--leader-elect-renew-deadline", "15s"],
            "--leader-elect-lease-duration",
        ),
        (
            ["--leader-elect-retry-period", "9s"],
            "--leader-elect-retry-period",
        ),
        (["--leader-elect-lease-duration", "12500ms"], "whole number"),
    ] {
        let out = regbroker(&[&base[..], &extra[..]].concat());
        assert_eq!(out.status.code(), Some(64), "{extra:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(names), "{extra:?}: {stderr}");
    }
    // Leader election guards the Secret sync: without one it is a usage error.
    let out = regbroker(&["serve", "--listen", "127.0.0.1:0", "--leader-elect"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("--sync-secret"));
}

/// `regbroker ARGS` with `env` added (bounded).
fn regbroker_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    run_bounded(
        Command::new(BIN)
            .args(args)
            .env_remove("REGBROKER_CONFIG")
            .env_remove("REGBROKER_DOCKER_CONFIG")
            .env_remove("REGBROKER_LISTEN")
            .envs(env.iter().copied()),
        None,
        CLI_BOUND,
    )
}

/// Leader election guards the Secret sync and the RegistryCredential controller: the
/// controller alone is enough. `serve --leader-elect --registry-credentials` without
/// `--sync-secret` starts both (its API server unreachable: the client connects lazily and
/// the elector retries), serves, and stops cleanly on SIGTERM.
#[test]
fn leader_election_guarding_only_the_controller_starts() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    });
    std::fs::write(&kubeconfig, doc.to_string()).unwrap();
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--registry-credentials",
                "--leader-elect",
                "--leader-elect-namespace",
                "regbroker",
            ])
            .env_remove("REGBROKER_CONFIG")
            .env_remove("REGBROKER_DOCKER_CONFIG")
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", "replica-a")
            .env("REGBROKER_LOG", "info")
            .env("REGBROKER_LOG_FORMAT", "json")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut messages = Vec::new();
    while !messages.iter().any(|m| m == "Listening") {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no \"Listening\" within 30 s; logged: {messages:?}"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        messages.push(v["message"].as_str().unwrap_or(&line).to_string());
    }
    for wanted in ["Leader election", "RegistryCredential controller starting"] {
        assert!(
            messages.iter().any(|m| m == wanted),
            "{wanted:?} not logged: {messages:?}"
        );
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(15)).expect("exits on SIGTERM");
    assert!(status.success(), "{status}");
}

/// The controller's settings without the controller are refused (exit 64, naming what is
/// missing): by clap when `--registry-credentials` is absent, and by `serve` when it is
/// given as off (`REGBROKER_REGISTRY_CREDENTIALS=false`), which clap counts as given: they
/// were ignored in silence then, and `--leader-elect` guarded nothing.
#[test]
fn controller_settings_without_the_controller_exit_64() {
    let serve = ["serve", "--listen", "127.0.0.1:0"];
    let off = [("REGBROKER_REGISTRY_CREDENTIALS", "false")];
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&[&str], Env, &str); 6] = [
        (
            &["--registry-credentials-namespace", "team-a"],
            &[],
            "the following required arguments were not provided:\n  --registry-credentials\n",
        ),
        (
            &[],
            &[("REGBROKER_REGISTRY_CREDENTIALS_NAMESPACE", "team-a")],
            "the following required arguments were not provided:\n  --registry-credentials\n",
        ),
        (
            &["--default-service-account", "puller"],
            &[],
            "the following required arguments were not provided:\n  --registry-credentials\n",
        ),
        (
            &["--registry-credentials-namespace", "team-a"],
            &off,
            "--registry-credentials-namespace (REGBROKER_REGISTRY_CREDENTIALS_NAMESPACE) needs --registry-credentials (REGBROKER_REGISTRY_CREDENTIALS), which is off",
        ),
        (
            &["--default-service-account", "puller"],
            &off,
            "--default-service-account (REGBROKER_DEFAULT_SERVICE_ACCOUNT) needs --registry-credentials (REGBROKER_REGISTRY_CREDENTIALS), which is off",
        ),
        (
            &["--leader-elect"],
            &off,
            "--leader-elect (REGBROKER_LEADER_ELECT) has nothing to guard: --registry-credentials (REGBROKER_REGISTRY_CREDENTIALS) is off and no Secret is synced",
        ),
    ];
    for (args, env, message) in cases {
        let out = regbroker_env(&[&serve[..], args].concat(), env);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?} {env:?}: {stderr}");
        assert_eq!(
            stderr.matches(message).count(),
            1,
            "said once: {args:?} {env:?}: {stderr}"
        );
    }
}

/// The README's run command, then the README's curl, then SIGTERM.
#[test]
fn serve_readme_example_answers_and_stops_on_sigterm() {
    let mut srv = ServeProcess::start(
        &[
            "--config",
            &example("regbroker.toml"),
            "--docker-config",
            &example("dockerconfig.json"),
        ],
        &[],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body: serde_json::Value = rt.block_on(async {
        let url = format!(
            "http://{}/v1/credentials?registry=registry.example.com",
            srv.addr
        );
        let res = reqwest::get(url).await.unwrap();
        assert_eq!(res.status().as_u16(), 200);
        assert_eq!(res.headers()["cache-control"], "no-store");
        res.json().await.unwrap()
    });
    assert_eq!(body["username"], "demo-user");
    assert_eq!(body["password"], "demo-password");
    assert_eq!(body["provider"], "static");

    let status = srv.stop();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let rest: Vec<String> = srv.log.try_iter().collect();
    assert!(rest.iter().any(|l| l.contains("Stopped")), "{rest:?}");
}

/// The quick start, in the README and in the book, shows the run command and the curl the
/// test above runs: change them together.
#[test]
fn the_quick_start_shows_the_command_and_the_curl_that_are_tested() {
    let run = "cargo run -- serve --config examples/regbroker.toml --docker-config examples/dockerconfig.json";
    let curl = "curl -s 'http://127.0.0.1:8477/v1/credentials?registry=registry.example.com'";
    for doc in ["README.md", "docs/src/quick-start.md"] {
        let path = format!("{}/{doc}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        for line in [run, curl] {
            assert!(
                text.lines().any(|l| l.trim() == line),
                "{doc} no longer shows `{line}`: keep it as serve_readme_example_answers_and_stops_on_sigterm runs it"
            );
        }
    }
}

#[test]
fn unix_socket_listener_has_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("regbroker.sock");
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["serve", "--listen", &format!("unix:{}", sock.display())])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "socket never appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // It answers HTTP over the socket.
    let mut stream = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    use std::io::{Read, Write};
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    stream.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(10)).expect("serve ignored SIGTERM");
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "socket file left behind");
}

/// `regbroker crd` prints the CRD generated from the controller's types; the copies users
/// apply (deploy/registry-credentials, the chart's files/) are that output, byte for byte.
/// After changing the API types, regenerate both: `regbroker crd > COPY`.
#[test]
fn crd_copies_equal_the_generated_one() {
    let out = regbroker(&["crd"]);
    assert!(out.status.success(), "{out:?}");
    let generated = String::from_utf8(out.stdout).unwrap();
    assert!(generated.contains("name: registrycredentials.regbroker.dev"));
    for copy in [
        "deploy/registry-credentials/crd.yaml",
        "deploy/chart/regbroker/files/registrycredentials.regbroker.dev.yaml",
    ] {
        let path = format!("{}/{copy}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text == generated,
            "{copy} differs from `regbroker crd`; regenerate it: regbroker crd > {copy}"
        );
    }
}
