//! `regbroker doctor`: exit codes (0 all passed, 1 a check failed, 64 bad usage), the
//! text and JSON reports, routing decisions with a rule to add for an unknown host, and
//! the identity diagnoses that need the process environment (AWS), against moto (AWS
//! STS, a real third-party emulator) and gcplocal (a GCE metadata emulator). The Azure
//! and GCP diagnoses against in-process fakes are tested in their crates.
//!
//! Every scenario runs the binary with a cleared environment and checks that no secret
//! (a password, a token, a token file's text) reaches stdout or stderr.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod registry_peer;

use std::process::Command;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use common::process::{CLI_BOUND, run_bounded};
use registry_peer::{Emulator, closed_port, moto, peer};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");
const ECR_HOST: &str = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
const IRSA_ROLE: &str = "arn:aws:iam::123456789012:role/irsa-puller";

struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

/// The binary with exactly `env` (plus PATH and a HOME without ~/.aws), AWS IMDS off
/// unless the scenario sets it, and a closed metadata server for GCP.
fn doctor(args: &[&str], env: &[(&str, String)]) -> Run {
    let home = tempfile::tempdir().unwrap();
    let closed_metadata = format!("127.0.0.1:{}", closed_port());
    let mut cmd = Command::new(BIN);
    cmd.arg("doctor")
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("GCE_METADATA_HOST", closed_metadata);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = std::time::Instant::now();
    let out = run_bounded(&mut cmd, None, CLI_BOUND);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "doctor took {:?}",
        started.elapsed()
    );
    Run {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn assert_no_secret(run: &Run, secrets: &[&str]) {
    for s in secrets {
        assert!(
            !run.out.contains(s) && !run.err.contains(s),
            "secret {s:?} in output:\n{}\n{}",
            run.out,
            run.err
        );
    }
}

fn unix_now() -> u64 {
    #[allow(clippy::disallowed_methods)] // the test's own reference time for its tokens
    let now = SystemTime::now();
    now.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A JWT-shaped projected token (unsigned: only the claims matter to doctor and moto).
fn projected_token(aud: &str, iat: u64, exp: u64) -> String {
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let claims = serde_json::json!({
        "iss": "https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE",
        "aud": [aud],
        "sub": "system:serviceaccount:flux-system:source-controller",
        "iat": iat,
        "exp": exp,
    });
    format!(
        "{}.{}.c2lnbmF0dXJlLW5ldmVyLXNob3du",
        e.encode(r#"{"alg":"RS256","kid":"k"}"#),
        e.encode(claims.to_string())
    )
}

/// IRSA env with a token file holding `token`; the dir must outlive the run.
fn irsa(token: &str) -> (tempfile::TempDir, Vec<(&'static str, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, token).unwrap();
    (
        dir,
        vec![
            ("AWS_ROLE_ARN", IRSA_ROLE.to_string()),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", file.display().to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
        ],
    )
}

fn closed_endpoint() -> (&'static str, String) {
    (
        "AWS_ENDPOINT_URL",
        format!("http://127.0.0.1:{}", closed_port()),
    )
}

#[test]
fn bad_usage_exits_64() {
    for args in [
        &["--output", "xml"][..],
        &["--no-such-flag"],
        &["--provider", "oracle"],
        &["--timeout", "soon"],
        &["https://alice:hunter2-password@registry.example.com/v2/"],
    ] {
        let run = doctor(args, &[]);
        assert_eq!(run.code, Some(64), "{args:?}: {}{}", run.out, run.err);
        assert_no_secret(&run, &["hunter2-password"]);
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[rule]]\nmatch = \"x.example.com\"\nsource = \"nowhere\"\n",
    )
    .unwrap();
    let run = doctor(&["--config", bad.to_str().unwrap()], &[]);
    assert_eq!(run.code, Some(64), "{}{}", run.out, run.err);
    assert!(run.err.contains("bad.toml"), "{}", run.err);
}

#[test]
fn unknown_host_fails_naming_the_rule_that_would_route_it() {
    let run = doctor(&["--provider", "gcp", "registry.example.com"], &[]);
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(
        run.out
            .contains("a host no provider recognises: registry.example.com"),
        "{}",
        run.out
    );
    let rule = suggested_rule(&run.out);
    assert_eq!(rule.0, "registry.example.com", "{}", run.out);
    // A custom ECR-ish name gets the aws rule with the options it needs.
    let run = doctor(&["--provider", "gcp", "ecr-proxy.internal.example"], &[]);
    let rule = suggested_rule(&run.out);
    assert_eq!(
        rule,
        ("ecr-proxy.internal.example".into(), "aws".into()),
        "{}",
        run.out
    );
    assert!(run.out.contains("options = { region = "), "{}", run.out);
}

/// The rule `doctor` suggests, pasted as it is printed into a config file and read by
/// the config parser: the host it routes and the source it names.
fn suggested_rule(out: &str) -> (String, String) {
    // The fix's lines after its first, as printed (indented by ten spaces).
    let snippet: String = out
        .lines()
        .skip_while(|l| l.trim() != "[[rule]]")
        .take_while(|l| l.starts_with("          "))
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    let providers = regbroker::broker::providers::Providers::from_env().unwrap();
    let config = regbroker::broker::config::parse(&snippet, &providers)
        .unwrap_or_else(|e| panic!("the suggested rule is not a valid config: {e}\n{snippet}"));
    let rules = config.router.rules();
    assert_eq!(rules.len(), 1, "{snippet}");
    let host = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("match = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let registry = regbroker_provider::Registry::parse(&host).unwrap();
    let (_, rule) = config
        .router
        .route(&registry)
        .expect("the rule routes its host");
    let source = match &rule.source {
        regbroker::broker::routing::Source::Provider { name, .. } => name.to_string(),
        other => format!("{other:?}"),
    };
    (host, source)
}

#[test]
fn static_entry_passes_with_the_password_redacted_and_json_has_the_shape() {
    let dir = tempfile::tempdir().unwrap();
    let dc = dir.path().join("config.json");
    std::fs::write(
        &dc,
        r#"{"auths": {"registry.example.com": {"username": "demo", "password": "static-PASSWORD-xyz"}}}"#,
    )
    .unwrap();
    let config = dir.path().join("regbroker.toml");
    std::fs::write(
        &config,
        "[[rule]]\nmatch = \"*.internal.example\"\nsource = \"none\"\n",
    )
    .unwrap();
    let args = [
        "--docker-config",
        dc.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--provider",
        "gcp",
        "--timeout",
        "1s",
        "https://registry.example.com/v2/",
        "a.internal.example",
    ];
    let run = doctor(&args, &[]);
    // The closed metadata server fails, but GCP is neither configured nor needed.
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    assert!(
        run.out
            .contains("decided: a static docker config entry names it"),
        "{}",
        run.out
    );
    assert!(
        run.out.contains("username demo, password <redacted>"),
        "{}",
        run.out
    );
    assert!(run.out.contains("clients go anonymous"), "{}", run.out);
    assert!(run.out.contains("skip  gcp.metadata_server"), "{}", run.out);
    assert_no_secret(&run, &["static-PASSWORD-xyz"]);

    let mut json_args = args.to_vec();
    json_args.splice(0..0, ["--output", "json"]);
    let run = doctor(&json_args, &[]);
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    let v: serde_json::Value = serde_json::from_str(&run.out).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["summary"]["fail"], 0);
    assert!(v["summary"]["pass"].as_u64().unwrap() >= 2, "{v}");
    assert!(
        v["config"]["findings"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("1 rules")
    );
    let gcp = &v["providers"][0];
    assert_eq!(gcp["name"], "gcp");
    assert_eq!(gcp["compiledIn"], true);
    assert_eq!(gcp["identity"], "metadata_server");
    assert_eq!(gcp["explicit"], false);
    assert_eq!(gcp["needed"], false);
    for f in gcp["findings"].as_array().unwrap() {
        for key in ["check", "status", "detail", "fix"] {
            assert!(f.get(key).is_some(), "{key} missing in {f}");
        }
    }
    let reg = &v["registries"][0];
    assert_eq!(reg["input"], "https://registry.example.com/v2/");
    assert_eq!(reg["registry"], "registry.example.com");
    assert_eq!(reg["source"], "static");
    assert_eq!(reg["findings"][1]["check"], "registry.exchange");
    assert_eq!(reg["findings"][1]["status"], "pass");
    assert_no_secret(&run, &["static-PASSWORD-xyz"]);

    // Needed (a GCR registry asked for), the same closed metadata server fails: exit 1.
    let run = doctor(&["--provider", "gcp", "--timeout", "1s", "gcr.io"], &[]);
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(
        run.out
            .contains("FAIL  gcp.metadata_server: no metadata server"),
        "{}",
        run.out
    );
    assert!(run.out.contains("hostNetwork"), "{}", run.out);
}

#[test]
fn irsa_token_file_missing_expired_or_from_the_future() {
    let now = unix_now();
    let mut env = vec![
        ("AWS_ROLE_ARN", IRSA_ROLE.to_string()),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "/nonexistent/regbroker/token".to_string(),
        ),
        ("AWS_REGION", "us-east-1".to_string()),
        closed_endpoint(),
    ];
    let run = doctor(&["--provider", "aws", "--timeout", "2s"], &env);
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(run.out.contains("identity: irsa"), "{}", run.out);
    assert!(run.out.contains("token file missing"), "{}", run.out);
    assert!(
        run.out.contains("/nonexistent/regbroker/token"),
        "{}",
        run.out
    );

    let expired = projected_token("sts.amazonaws.com", now - 7200, now - 3600);
    let (_d1, mut e) = irsa(&expired);
    e.push(closed_endpoint());
    let run = doctor(&["--provider", "aws", "--timeout", "2s"], &e);
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(run.out.contains("token expired"), "{}", run.out);
    assert_no_secret(&run, &expired.split('.').collect::<Vec<_>>());

    let future = projected_token("sts.amazonaws.com", now + 3 * 3600, now + 4 * 3600);
    let (_d2, mut e) = irsa(&future);
    e.push(closed_endpoint());
    let run = doctor(&["--provider", "aws", "--timeout", "2s"], &e);
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(
        run.out.contains("clock far from the token's iat"),
        "{}",
        run.out
    );
    assert!(run.out.contains("NTP"), "{}", run.out);

    // China partition, no region: STS would go to us-east-1.
    env.retain(|(k, _)| *k != "AWS_REGION" && *k != "AWS_ROLE_ARN");
    env.push((
        "AWS_ROLE_ARN",
        "arn:aws-cn:iam::123456789012:role/r".to_string(),
    ));
    let run = doctor(&["--provider", "aws", "--timeout", "2s"], &env);
    assert!(run.out.contains("no region for STS"), "{}", run.out);
    assert!(run.out.contains("aws-cn"), "{}", run.out);

    // The commercial partition, no region: us-east-1 works there, so a warning (not a
    // failure) naming STS and ECR Public, and the fix.
    env.retain(|(k, _)| *k != "AWS_ROLE_ARN");
    env.push(("AWS_ROLE_ARN", IRSA_ROLE.to_string()));
    let run = doctor(&["--provider", "aws", "--timeout", "2s"], &env);
    assert!(
        run.out.contains("no region for STS or ECR Public"),
        "{}",
        run.out
    );
    assert!(run.out.contains("set AWS_REGION"), "{}", run.out);
    assert!(
        !run.out.contains("not in the role's partition"),
        "{}",
        run.out
    );
}

#[test]
#[ignore = "needs moto_server: run scripts/test.sh"]
fn irsa_against_moto_names_the_assumed_role_and_fetches_ecr() {
    let moto = moto();
    let now = unix_now();
    let token = projected_token("sts.amazonaws.com", now - 60, now + 3600);
    let (_dir, mut env) = irsa(&token);
    env.push(("AWS_ENDPOINT_URL", format!("http://{}", moto.addr)));
    let run = doctor(&["--provider", "aws", ECR_HOST], &env);
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    assert!(run.out.contains("pass  aws.sts"), "{}", run.out);
    assert!(run.out.contains("assumed role irsa-puller"), "{}", run.out);
    assert!(
        run.out
            .contains("subject system:serviceaccount:flux-system:source-controller"),
        "{}",
        run.out
    );
    assert!(
        run.out
            .contains("credential from aws: username AWS, password <redacted>"),
        "{}",
        run.out
    );
    let mut secrets: Vec<&str> = token.split('.').collect();
    secrets.push("123456789012-auth-token");
    assert_no_secret(&run, &secrets);

    // The token projected for another audience: moto accepts it, doctor warns with the
    // audience AWS expects.
    let azure = projected_token("api://AzureADTokenExchange", now - 60, now + 3600);
    let (_dir2, mut env) = irsa(&azure);
    env.push(("AWS_ENDPOINT_URL", format!("http://{}", moto.addr)));
    let run = doctor(&["--provider", "aws", "--output", "json"], &env);
    let v: serde_json::Value = serde_json::from_str(&run.out).unwrap();
    let findings = v["providers"][0]["findings"].as_array().unwrap();
    let aud = findings
        .iter()
        .find(|f| f["check"] == "aws.token_file.audience")
        .unwrap_or_else(|| panic!("{}", run.out));
    assert_eq!(aud["status"], "warn");
    let detail = aud["detail"].as_str().unwrap();
    assert!(detail.contains("audience mismatch"), "{detail}");
    assert!(detail.contains("expected sts.amazonaws.com"), "{detail}");
    assert_no_secret(&run, &azure.split('.').collect::<Vec<_>>());
}

#[test]
#[ignore = "needs gcplocal: run scripts/test.sh"]
fn gcplocal_metadata_server_and_an_artifact_registry_exchange() {
    let bin = peer("gcplocal", "pip install gcplocal");
    let meta = Emulator::start(
        &bin,
        &["start", "--host", "127.0.0.1", "--port", "PORT"],
        "/computeMetadata/v1/instance/service-accounts/default/token",
        &[],
    );
    let run = doctor(
        &["--provider", "gcp", "europe-west1-docker.pkg.dev"],
        &[("GCE_METADATA_HOST", meta.addr.clone())],
    );
    assert_eq!(run.code, Some(0), "{}{}", run.out, run.err);
    assert!(
        run.out.contains("pass  gcp.token: metadata server token"),
        "{}",
        run.out
    );
    assert!(
        run.out
            .contains("username oauth2accesstoken, password <redacted>"),
        "{}",
        run.out
    );
    assert_no_secret(&run, &["ya29.gcplocal-mock-token"]);
}

#[test]
fn a_rule_whose_provider_refuses_the_host_fails_with_the_missing_options() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("regbroker.toml");
    std::fs::write(
        &config,
        "[[rule]]\nmatch = \"ecr-proxy.example.com\"\nsource = \"aws\"\n",
    )
    .unwrap();
    let run = doctor(
        &[
            "--config",
            config.to_str().unwrap(),
            "--provider",
            "aws",
            "ecr-proxy.example.com",
        ],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(
        run.out
            .contains(r#"decided: rule 1 (match = "ecr-proxy.example.com")"#),
        "{}",
        run.out
    );
    assert!(
        run.out.contains("needs options `region` and `account`"),
        "{}",
        run.out
    );
    assert!(run.out.contains("(invalid_config)"), "{}", run.out);
    // The rule makes aws needed: its missing identity counts.
    assert!(
        run.out.contains("FAIL  aws.identity: no AWS identity"),
        "{}",
        run.out
    );
}

#[test]
fn a_federated_rule_is_checked_token_file_first_then_one_exchange() {
    let now = unix_now();
    let dir = tempfile::tempdir().unwrap();
    let token = projected_token("quay.example.com", now - 60, now + 3600);
    let file = dir.path().join("token");
    std::fs::write(&file, &token).unwrap();
    let config = |token_file: &str, audience: &str| {
        let path = dir.path().join(format!("{audience}.toml"));
        std::fs::write(
            &path,
            format!(
                "[[rule]]\nmatch = \"quay.example.com\"\nsource = \"quay\"\noptions = {{ audience = \"{audience}\", robot = \"acme+puller\", url = \"http://127.0.0.1:{}\", token_file = \"{token_file}\" }}\n",
                closed_port()
            ),
        )
        .unwrap();
        path.display().to_string()
    };
    let file_str = file.display().to_string();

    // A readable token for the rule's audience: the file passes, the exchange (a closed
    // port) fails, naming the exchange.
    let good = config(&file_str, "quay.example.com");
    let run = doctor(
        &[
            "--config",
            &good,
            "--timeout",
            "2s",
            "--output",
            "json",
            "quay.example.com",
        ],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    let report: serde_json::Value = serde_json::from_str(&run.out).unwrap();
    let findings: Vec<(String, String, String)> = report["registries"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["check"].as_str().unwrap().to_string(),
                f["status"].as_str().unwrap().to_string(),
                f["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let find = |check: &str| {
        findings
            .iter()
            .filter(|(c, ..)| c == check)
            .cloned()
            .collect::<Vec<_>>()
    };
    let token_checks = find("quay.token_file");
    assert!(
        token_checks
            .iter()
            .any(|(_, _, d)| d.contains("audience quay.example.com")),
        "{token_checks:?}"
    );
    assert!(
        token_checks.iter().all(|(_, s, _)| s != "fail"),
        "{token_checks:?}"
    );
    let exchange = find("registry.exchange");
    assert_eq!(exchange.len(), 1, "{findings:?}");
    assert_eq!(exchange[0].1, "fail");
    assert!(
        exchange[0].2.contains("Quay robot federation"),
        "{exchange:?}"
    );
    assert_no_secret(&run, &token.split('.').collect::<Vec<_>>());

    // A missing token file is a failed check naming the file.
    let missing = config("/nonexistent/regbroker/quay", "quay.example.com");
    let run = doctor(
        &["--config", &missing, "--timeout", "2s", "quay.example.com"],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(run.out.contains("token file missing"), "{}", run.out);
    assert!(
        run.out.contains("/nonexistent/regbroker/quay"),
        "{}",
        run.out
    );

    // A token for another audience: doctor says so before the exchange refuses it.
    let other = config(&file_str, "other.example.com");
    let run = doctor(
        &["--config", &other, "--timeout", "2s", "quay.example.com"],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}{}", run.out, run.err);
    assert!(run.out.contains("other.example.com"), "{}", run.out);
    assert!(
        run.out.contains("not the rule's `other.example.com`"),
        "{}",
        run.out
    );
    assert_no_secret(&run, &token.split('.').collect::<Vec<_>>());
}
