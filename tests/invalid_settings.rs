//! Settings that once passed validation and then aborted the process at the first fetch
//! (issue 30, finding 4): an upstream call rate too small for a `Duration`
//! (`REGBROKER_AWS_ECR_RATE=1e-300`), a `[cache]` duration past the clock's range. Each is
//! a configuration error now: `serve` exits 64 and the one-shot modes fail, each naming
//! the setting. Every wait is bounded: a process that starts instead of refusing is
//! killed and the test fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::process::run_bounded;

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

/// Runs `regbroker ARGS` with `env` and `stdin`, expecting it to exit within 30 s (a
/// process still running then is killed and the test fails: a refused setting must never
/// leave a server running); returns (exit code, stdout, stderr).
fn run(args: &[&str], env: &[(&str, &str)], stdin: &str) -> (Option<i32>, String, String) {
    let out = run_bounded(
        Command::new(BIN).args(args).envs(env.iter().copied()),
        Some(stdin.as_bytes()),
        Duration::from_secs(30),
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const BAD_RATES: &[(&str, &str)] = &[
    ("REGBROKER_AWS_ECR_RATE", "1e-300"),
    ("REGBROKER_AWS_STS_RATE", "1e-300/5"),
    ("REGBROKER_AWS_ECR_RATE", "nonsense"),
    ("REGBROKER_AWS_STS_RATE", "0/0"),
    ("REGBROKER_AWS_ECR_RATE", "NaN"),
    ("REGBROKER_AWS_STS_RATE", "5/0"),
];

#[test]
fn serve_refuses_an_invalid_rate_with_exit_64_naming_the_variable() {
    for (var, value) in BAD_RATES {
        let (code, _, stderr) = run(&["serve", "--listen", "127.0.0.1:0"], &[(var, value)], "");
        assert_eq!(code, Some(64), "{var}={value}: {stderr}");
        assert!(stderr.contains(var), "{var}={value}: {stderr}");
    }
    // A valid one is taken (and the server starts: SIGTERM stops it).
    let mut p = common::ServeProcess::start(&[], &[("REGBROKER_AWS_ECR_RATE", "5/10")]);
    p.wait_healthy();
    assert!(p.stop().success());
}

#[test]
fn the_one_shot_modes_fail_on_an_invalid_rate_naming_the_variable() {
    for (var, value) in BAD_RATES {
        let (code, stdout, stderr) = run(
            &["credential-helper", "get"],
            &[(var, value)],
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com\n",
        );
        assert_ne!(code, Some(0), "{var}={value}: {stdout}{stderr}");
        assert!(
            stdout.contains(var) || stderr.contains(var),
            "helper, {var}={value}: {stdout}{stderr}"
        );
        let request = r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"123456789012.dkr.ecr.eu-west-1.amazonaws.com/app:1"}"#;
        let (code, stdout, stderr) =
            run(&["kubelet-credential-provider"], &[(var, value)], request);
        assert_ne!(code, Some(0), "{var}={value}: {stdout}{stderr}");
        assert!(
            stderr.contains(var),
            "kubelet, {var}={value}: {stdout}{stderr}"
        );
    }
}

#[test]
fn a_cache_duration_past_the_clocks_range_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("regbroker.toml");
    for key in [
        "fallback_ttl",
        "max_failure_backoff",
        "fetch_timeout",
        "refetch_interval",
    ] {
        std::fs::write(&config, format!("[cache]\n{key} = \"300000000000y\"\n")).unwrap();
        let (code, _, stderr) = run(
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--config",
                config.to_str().unwrap(),
            ],
            &[],
            "",
        );
        assert_eq!(code, Some(64), "{key}: {stderr}");
        assert!(stderr.contains(&format!("cache.{key}")), "{key}: {stderr}");
    }
}

#[test]
fn doctor_refuses_a_timeout_past_an_hour() {
    let (code, stdout, stderr) = run(&["doctor", "--timeout", "300000000000y"], &[], "");
    assert_eq!(code, Some(64), "a usage error: {stdout}{stderr}");
    assert!(stderr.contains("--timeout"), "{stderr}");
    assert!(stderr.contains("at most 1h"), "{stderr}");
}
