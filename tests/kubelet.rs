//! The kubelet credential provider mode answers recorded requests (fixtures under
//! `tests/fixtures/kubelet/`), as the kubelet would send them on stdin.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::process::{CLI_BOUND, run_bounded};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/kubelet/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn provide(input: &[u8], docker_config: &std::path::Path) -> (Option<i32>, String, String) {
    let out = run_bounded(
        Command::new(BIN)
            .arg("kubelet-credential-provider")
            .env_clear()
            .env("REGBROKER_DOCKER_CONFIG", docker_config),
        Some(input),
        CLI_BOUND,
    );
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Parses a Go duration string of the forms `time.Duration.String()` prints for whole
/// seconds (`0s`, `45s`, `1m30s`, `5h59m0s`), as the kubelet's `time.ParseDuration` would
/// accept them; returns seconds.
fn parse_go_duration(s: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut num = String::new();
    let mut units = Vec::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        let mult = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        units.push(c);
        total += n * mult;
    }
    let ordered = units
        .windows(2)
        .all(|w| "hms".find(w[0]) < "hms".find(w[1]));
    (num.is_empty() && !units.is_empty() && ordered && units.last() == Some(&'s')).then_some(total)
}

fn static_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        r#"{"auths": {"registry.example.com:5000": {"username": "puller", "password": "kubelet-pw"}}}"#,
    )
    .unwrap();
    path
}

#[test]
fn go_duration_parser_accepts_only_go_forms() {
    assert_eq!(parse_go_duration("5h59m0s"), Some(21540));
    assert_eq!(parse_go_duration("1m0s"), Some(60));
    assert_eq!(parse_go_duration("0s"), Some(0));
    for bad in ["", "5", "5h", "1s5m", "1x", "-1s", "1.5s"] {
        assert_eq!(parse_go_duration(bad), None, "{bad}");
    }
}

#[test]
fn served_image_gets_registry_scoped_auth_and_a_go_duration() {
    let dir = tempfile::tempdir().unwrap();
    let config = static_config(dir.path());
    for name in ["static-image.json", "service-account-token.json"] {
        let (code, out, err) = provide(&fixture(name), &config);
        assert_eq!(code, Some(0), "{name}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
        assert_eq!(v["kind"], "CredentialProviderResponse");
        assert_eq!(v["cacheKeyType"], "Registry");
        assert!(
            parse_go_duration(v["cacheDuration"].as_str().unwrap()).is_some(),
            "{v}"
        );
        assert_eq!(v["auth"]["registry.example.com:5000"]["username"], "puller");
        assert_eq!(
            v["auth"]["registry.example.com:5000"]["password"],
            "kubelet-pw"
        );
        assert_eq!(v["auth"].as_object().unwrap().len(), 1);
        // The service account token is not echoed anywhere (a static entry serves this
        // image, so the token is read, checked, and not used).
        let request: serde_json::Value = serde_json::from_slice(&fixture(name)).unwrap();
        if let Some(token) = request["serviceAccountToken"].as_str() {
            for part in token.split('.') {
                assert!(!out.contains(part) && !err.contains(part), "{name}");
            }
        }
    }
}

#[test]
fn unserved_image_gets_an_empty_auth() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = provide(&fixture("unserved-image.json"), &static_config(dir.path()));
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["auth"], serde_json::json!({}));
    assert_eq!(v["cacheKeyType"], "Registry");
    assert!(parse_go_duration(v["cacheDuration"].as_str().unwrap()).is_some());
}

fn request_for(image: &str) -> Vec<u8> {
    serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderRequest",
        "image": image,
    })
    .to_string()
    .into_bytes()
}

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn an_image_docker_reads_as_docker_hubs_gets_an_empty_auth_when_nothing_serves_docker_hub() {
    // `nginx:latest` is docker.io/library/nginx:latest, not host `nginx` on port `latest`;
    // nothing serves docker.io here, so the kubelet is told to go anonymous (exit 0).
    let dir = tempfile::tempdir().unwrap();
    let config = static_config(dir.path());
    for image in [
        "nginx:latest".to_string(),
        "nginx".to_string(),
        "library/nginx:1.27".to_string(),
        format!("nginx@{DIGEST}"),
        // `name:5000` as an image is Docker Hub's repository `name`, tag `5000`.
        "registry.example.com:5000".to_string(),
    ] {
        let (code, out, err) = provide(&request_for(&image), &config);
        assert_eq!(code, Some(0), "{image}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["kind"], "CredentialProviderResponse", "{image}");
        assert_eq!(v["auth"], serde_json::json!({}), "{image}");
        assert_eq!(v["cacheKeyType"], "Registry", "{image}");
        assert_eq!(v["cacheDuration"], "1m0s", "{image}");
    }
}

#[test]
fn an_image_is_served_by_the_registry_docker_reads_in_it() {
    // Positive control: with a Docker Hub entry, the same images get Docker Hub's
    // credential under `docker.io`; `host:5000/app` gets that host's.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"auths": {"https://index.docker.io/v1/": {"username": "hub-user", "password": "hub-pw"},
                      "registry.example.com:5000": {"username": "puller", "password": "kubelet-pw"}}}"#,
    )
    .unwrap();
    for (image, registry, user) in [
        ("nginx:latest", "docker.io", "hub-user"),
        ("docker.io/library/nginx:latest", "docker.io", "hub-user"),
        ("registry.example.com:5000", "docker.io", "hub-user"),
        (
            "registry.example.com:5000/app",
            "registry.example.com:5000",
            "puller",
        ),
        (
            "registry.example.com:5000/team/app:1",
            "registry.example.com:5000",
            "puller",
        ),
    ] {
        let (code, out, err) = provide(&request_for(image), &config);
        assert_eq!(code, Some(0), "{image}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["auth"].as_object().unwrap().len(), 1, "{image}: {v}");
        assert_eq!(v["auth"][registry]["username"], user, "{image}: {v}");
    }
}

#[test]
fn an_image_reference_that_breaks_the_grammar_fails_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let config = static_config(dir.path());
    for (image, needle) in [
        ("ghcr.io/Org/app", "lower case"),
        ("nginx@sha256:abc", "invalid digest"),
        ("u:hunter2@registry.example.com:5000/app", "userinfo"),
    ] {
        let (code, out, err) = provide(&request_for(image), &config);
        assert_eq!(code, Some(1), "{image}");
        assert!(out.is_empty(), "{image}: {out}");
        assert!(err.contains(needle), "{image}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}

#[test]
fn wrong_api_version_fails_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = provide(&fixture("wrong-version.json"), &static_config(dir.path()));
    assert_eq!(code, Some(1));
    assert!(out.is_empty());
    assert!(err.contains("unsupported apiVersion"), "{err}");
}

#[test]
fn an_empty_service_account_token_is_no_token() {
    // A kubelet without tokenAttributes for this provider sends no token; an empty one
    // means the same, not a malformed token.
    let dir = tempfile::tempdir().unwrap();
    let config = static_config(dir.path());
    let request = br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"registry.example.com:5000/team/app:1","serviceAccountToken":""}"#;
    let (code, out, err) = provide(request, &config);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["auth"]["registry.example.com:5000"]["password"],
        "kubelet-pw"
    );
    // A token that is there but not a ServiceAccount token is refused.
    let request = br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"registry.example.com:5000/team/app:1","serviceAccountToken":"x.y.z"}"#;
    let (code, out, err) = provide(request, &config);
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("serviceAccountToken"), "{err}");
}

#[test]
fn a_pass_through_answer_from_a_sidecar_is_not_handed_to_every_pod() {
    // A node plugin pointed at a sidecar (REGBROKER_ENDPOINT) whose `oidc` rule passes the
    // sidecar's own token through: the kubelet sent no pod token, so the answer would go
    // to every pod on the node. Refused, naming the kubelet fields to set.
    let dir = tempfile::tempdir().unwrap();
    let token = regbroker_provider::test_util::service_account_jwt("team-a", "puller", "u-1");
    let token = token.replace(
        &base64_claims_part(&token),
        &base64_claims_part(&regbroker_provider::test_util::jwt(&serde_json::json!({
            "aud": ["zot.example.com"],
            "sub": "system:serviceaccount:team-a:puller",
            "exp": 4_102_444_800u64,
        }))),
    );
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let config = dir.path().join("regbroker.toml");
    std::fs::write(
        &config,
        format!(
            "[[rule]]\nmatch = \"zot.example.com\"\nsource = \"oidc\"\noptions = {{ audience = \"zot.example.com\", token_file = \"{}\" }}\n",
            token_file.display()
        ),
    )
    .unwrap();
    let sidecar = common::ServeProcess::start(&["--config", config.to_str().unwrap()], &[]);
    let out = run_bounded(
        Command::new(BIN)
            .arg("kubelet-credential-provider")
            .env_clear()
            .env("REGBROKER_ENDPOINT", format!("http://{}", sidecar.addr)),
        Some(&request_for("zot.example.com/team/app:1")),
        CLI_BOUND,
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("cacheType: Token"), "{stderr}");
    assert!(!stdout.contains(&token) && !stderr.contains(&token));
}

/// The claims part of a JWT.
fn base64_claims_part(jwt: &str) -> String {
    jwt.split('.').nth(1).unwrap().to_string()
}
