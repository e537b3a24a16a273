//! Errors for humans, through the real binary and a pipe: an error is said once and
//! without colour codes; an invalid value of any variable regbroker reads is exit 64 and
//! names the variable (in every mode that reads it); each mode's `--help` lists the
//! variables it reads; `docker-credential-regbroker` prints usage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::process::{CLI_BOUND, run_bounded};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

/// The modes, as arguments and stdin.
const SERVE: (&[&str], &str) = (&["serve", "--listen", "127.0.0.1:0"], "");
/// `serve` without `--listen`, so that `REGBROKER_LISTEN` is read.
const SERVE_ENV_LISTEN: (&[&str], &str) = (&["serve"], "");
const RESOLVE: (&[&str], &str) = (&["resolve", "gcr.io"], "");
const DOCTOR: (&[&str], &str) = (&["doctor"], "");
const HELPER: (&[&str], &str) = (&["credential-helper", "get"], "gcr.io\n");
const KUBELET: (&[&str], &str) = (
    &["kubelet-credential-provider"],
    r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"gcr.io/project/app:1"}"#,
);
const EVERY_MODE: &[(&[&str], &str)] = &[SERVE, RESOLVE, DOCTOR, HELPER, KUBELET];
const ONE_SHOT: &[(&[&str], &str)] = &[HELPER, KUBELET];

/// Runs `regbroker ARGS` with only `env` set (and no colour preference), stdin and
/// stdout/stderr piped; returns (exit code, stdout, stderr).
fn run(args: &[&str], env: &[(&str, &str)], stdin: &str) -> (Option<i32>, String, String) {
    let out = run_bounded(
        Command::new(BIN)
            .args(args)
            .env_clear()
            .envs(env.iter().copied()),
        Some(stdin.as_bytes()),
        CLI_BOUND,
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// How often the variable `var` is named in `text` (not as the start of a longer name:
/// `REGBROKER_LOG` in `REGBROKER_LOG_FORMAT` does not count).
fn named(text: &str, var: &str) -> usize {
    text.match_indices(var)
        .filter(|(i, _)| {
            !text[i + var.len()..]
                .starts_with(|c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .count()
}

#[test]
fn a_failure_is_said_once_without_colour_into_a_pipe() {
    // A runtime failure (the metadata server refuses) and a configuration error.
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Env, &str, i32); 2] = [
        (
            &[("GCE_METADATA_HOST", "127.0.0.1:1")],
            "no credential: gcp",
            1,
        ),
        (
            &[("REGBROKER_AWS_ECR_RATE", "nonsense")],
            "REGBROKER_AWS_ECR_RATE",
            64,
        ),
    ];
    for (env, needle, code) in cases {
        let (got, _, stderr) = run(&["resolve", "gcr.io"], env, "");
        assert_eq!(got, Some(code), "{env:?}: {stderr}");
        assert_eq!(
            stderr.matches(needle).count(),
            1,
            "{env:?}: said once:\n{stderr}"
        );
        assert!(
            !stderr.contains('\x1b'),
            "{env:?}: colour into a pipe:\n{stderr:?}"
        );
    }
    // NO_COLOR changes nothing in a pipe, and JSON logs say it once, as one event.
    let (_, _, stderr) = run(
        &["resolve", "gcr.io"],
        &[("REGBROKER_AWS_ECR_RATE", "nonsense"), ("NO_COLOR", "1")],
        "",
    );
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
    let (code, _, stderr) = run(
        &["resolve", "gcr.io"],
        &[
            ("REGBROKER_AWS_ECR_RATE", "nonsense"),
            ("REGBROKER_LOG_FORMAT", "json"),
        ],
        "",
    );
    assert_eq!(code, Some(64));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let event: serde_json::Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(event["level"], "ERROR");
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("REGBROKER_AWS_ECR_RATE")
    );
}

/// A value no reader accepts, for every variable regbroker reads, with the modes that
/// read it and any other setting the check needs. Values that look like secrets must not
/// be repeated.
struct Case {
    var: &'static str,
    value: &'static str,
    modes: &'static [(&'static [&'static str], &'static str)],
    with: &'static [(&'static str, &'static str)],
}

const fn case(
    var: &'static str,
    value: &'static str,
    modes: &'static [(&'static [&'static str], &'static str)],
) -> Case {
    Case {
        var,
        value,
        modes,
        with: &[],
    }
}

const CASES: &[Case] = &[
    // Every mode: logs, the config files, the providers.
    case("REGBROKER_LOG", "a=b=c", EVERY_MODE),
    case("REGBROKER_LOG_FORMAT", "xml", &[SERVE, RESOLVE, DOCTOR]),
    case(
        "REGBROKER_CONFIG",
        "/nonexistent/regbroker.toml",
        EVERY_MODE,
    ),
    case(
        "REGBROKER_DOCKER_CONFIG",
        "/nonexistent/config.json",
        EVERY_MODE,
    ),
    case("REGBROKER_AWS_ECR_RATE", "nonsense", EVERY_MODE),
    case("REGBROKER_AWS_STS_RATE", "0/0", EVERY_MODE),
    case("REGBROKER_AZURE_ACR_SUFFIXES", "*", EVERY_MODE),
    case(
        "REGBROKER_AZURE_EXCHANGE_URL",
        "https://user:hunter2-secret@acr.example.com/oauth2/exchange with a blank",
        EVERY_MODE,
    ),
    case("REGBROKER_AZURE_SCOPE", "two scopes", EVERY_MODE),
    case(
        "AZURE_AUTHORITY_HOST",
        "http://login.example.com",
        EVERY_MODE,
    ),
    case(
        "REGBROKER_GCP_STS_URL",
        "https://user:hunter2-secret@sts.example.com/v1/token",
        EVERY_MODE,
    ),
    case(
        "REGBROKER_GCP_IAM_CREDENTIALS_URL",
        "ftp://iam.example.com",
        EVERY_MODE,
    ),
    case("REGBROKER_GKE_CLUSTER", "my-cluster", EVERY_MODE),
    // serve's flags.
    case("REGBROKER_LISTEN", "nope", &[SERVE_ENV_LISTEN]),
    case("REGBROKER_PROBE_LISTEN", "nope", &[SERVE]),
    case("REGBROKER_SHUTDOWN_GRACE", "abc", &[SERVE]),
    case("REGBROKER_AUTH_TOKEN_FILE", "/nonexistent/token", &[SERVE]),
    case("REGBROKER_INSECURE_LISTEN", "maybe", &[SERVE]),
    Case {
        var: "REGBROKER_TLS_CERT_FILE",
        value: "/nonexistent/cert.pem",
        modes: &[SERVE],
        with: &[("REGBROKER_TLS_KEY_FILE", "/nonexistent/key.pem")],
    },
    Case {
        var: "REGBROKER_TLS_KEY_FILE",
        value: "/nonexistent/key.pem",
        modes: &[SERVE],
        with: &[("REGBROKER_TLS_CERT_FILE", "/nonexistent/cert.pem")],
    },
    case("REGBROKER_SOCKET_GROUP", "wheel", &[SERVE]),
    case("REGBROKER_SYNC_SECRET", "no-namespace", &[SERVE]),
    Case {
        var: "REGBROKER_SINK_REGISTRY",
        value: "a:b:c",
        modes: &[SERVE],
        with: &[("REGBROKER_WRITE_DOCKER_CONFIG", "/nonexistent/out.json")],
    },
    case("REGBROKER_LEADER_ELECT", "maybe", &[SERVE]),
    case("REGBROKER_READY_REQUIRES_SINKS", "maybe", &[SERVE]),
    case("REGBROKER_LEADER_ELECT_LEASE", "Not_A_Name", &[SERVE]),
    case("REGBROKER_REGISTRY_CREDENTIALS", "maybe", &[SERVE]),
    Case {
        var: "REGBROKER_REGISTRY_CREDENTIALS_NAMESPACE",
        value: "not.a.label",
        modes: &[SERVE],
        with: &[("REGBROKER_REGISTRY_CREDENTIALS", "true")],
    },
    Case {
        var: "REGBROKER_DEFAULT_SERVICE_ACCOUNT",
        value: "Not_A_Name",
        modes: &[SERVE],
        with: &[("REGBROKER_REGISTRY_CREDENTIALS", "true")],
    },
    case("REGBROKER_LEADER_ELECT_NAMESPACE", "not.a.label", &[SERVE]),
    case("REGBROKER_LEADER_ELECT_LEASE_DURATION", "x", &[SERVE]),
    case("REGBROKER_LEADER_ELECT_RENEW_DEADLINE", "x", &[SERVE]),
    case("REGBROKER_LEADER_ELECT_RETRY_PERIOD", "x", &[SERVE]),
    // The one-shot modes' settings.
    case("REGBROKER_ENDPOINT", "ftp://127.0.0.1:1", ONE_SHOT),
    Case {
        var: "REGBROKER_INSECURE_ENDPOINT",
        value: "maybe",
        modes: ONE_SHOT,
        with: &[("REGBROKER_ENDPOINT", "http://127.0.0.1:1")],
    },
    Case {
        var: "REGBROKER_CA_FILE",
        value: "/nonexistent/ca.pem",
        modes: ONE_SHOT,
        with: &[("REGBROKER_ENDPOINT", "https://127.0.0.1:1")],
    },
    Case {
        var: "REGBROKER_AUTH_TOKEN_FILE",
        value: "/nonexistent/token",
        modes: ONE_SHOT,
        with: &[("REGBROKER_ENDPOINT", "http://127.0.0.1:1")],
    },
    case("REGBROKER_CACHE_DIR", "/dev/null/cache", ONE_SHOT),
];

/// Variables with no invalid value: any path is a valid place to write (failing to write
/// there is a runtime failure, exit 1).
const ANY_VALUE: &[&str] = &["REGBROKER_WRITE_DOCKER_CONFIG"];

#[test]
fn every_invalid_variable_is_exit_64_naming_it_once() {
    for c in CASES {
        let mut env = vec![(c.var, c.value)];
        env.extend_from_slice(c.with);
        for (args, stdin) in c.modes {
            let (code, stdout, stderr) = run(args, &env, stdin);
            let what = format!("{}={:?} {}", c.var, c.value, args.join(" "));
            // The helper protocol answers errors on stdout; the other modes on stderr.
            let said = format!("{stdout}{stderr}");
            assert_eq!(code, Some(64), "{what}:\n{said}");
            assert_eq!(named(&said, c.var), 1, "{what}: named once:\n{said}");
            assert!(
                !said.contains('\x1b'),
                "{what}: colour into a pipe:\n{said:?}"
            );
            if c.value.contains("secret") {
                assert!(
                    !said.contains("hunter2"),
                    "{what}: the value leaked:\n{said}"
                );
            }
        }
    }
}

/// Booleans read one way: every boolean variable takes the same words, and means by
/// them what the others do.
#[test]
fn booleans_take_the_same_words_everywhere() {
    let words = [
        ("1", true),
        ("true", true),
        ("YES", true),
        ("on", true),
        ("0", false),
        ("false", false),
        ("no", false),
        ("Off", false),
    ];
    for (word, on) in words {
        // serve --insecure-listen: on, the exposure check passes and the next setting
        // (a missing config file) speaks; off, the exposure check refuses.
        let (code, _, stderr) = run(
            &["serve", "--listen", "0.0.0.0:0"],
            &[
                ("REGBROKER_INSECURE_LISTEN", word),
                ("REGBROKER_CONFIG", "/nonexistent/regbroker.toml"),
            ],
            "",
        );
        assert_eq!(code, Some(64), "{word}: {stderr}");
        let next = if on { "REGBROKER_CONFIG" } else { "refusing" };
        assert!(
            stderr.contains(next),
            "REGBROKER_INSECURE_LISTEN={word}: {stderr}"
        );
        // --leader-elect: read as a boolean (then it wants --sync-secret, either way).
        let (code, _, stderr) = run(
            &["serve", "--listen", "127.0.0.1:0"],
            &[("REGBROKER_LEADER_ELECT", word)],
            "",
        );
        assert_eq!(code, Some(64), "{word}: {stderr}");
        assert!(
            !stderr.contains("invalid value") && !stderr.contains("REGBROKER_LEADER_ELECT ("),
            "REGBROKER_LEADER_ELECT={word} refused: {stderr}"
        );
        // --ready-requires-sinks: on, start-up stops because no sink is configured (an
        // off value would start the server, so only the on words are run).
        if on {
            let (code, _, stderr) = run(
                &["serve", "--listen", "127.0.0.1:0"],
                &[("REGBROKER_READY_REQUIRES_SINKS", word)],
                "",
            );
            assert_eq!(code, Some(64), "{word}: {stderr}");
            assert!(
                stderr.contains("needs a sink"),
                "REGBROKER_READY_REQUIRES_SINKS={word}: {stderr}"
            );
        }
        // The helper's REGBROKER_INSECURE_ENDPOINT: on, a cleartext sidecar off loopback
        // is tried (and cannot be reached); off, it is refused.
        let (code, stdout, _) = run(
            &["credential-helper", "get"],
            &[
                ("REGBROKER_ENDPOINT", "http://0.0.0.0:1"),
                ("REGBROKER_INSECURE_ENDPOINT", word),
            ],
            "gcr.io\n",
        );
        let (want_code, next) = if on {
            (1, "cannot reach")
        } else {
            (64, "not loopback")
        };
        assert_eq!(code, Some(want_code), "{word}: {stdout}");
        assert!(
            stdout.contains(next),
            "REGBROKER_INSECURE_ENDPOINT={word}: {stdout}"
        );
    }
}

/// Every `REGBROKER_*` name in the sources (outside tests) is either in [`CASES`] or in
/// [`ANY_VALUE`], and every mode's `--help` lists the variables that mode reads.
#[test]
fn every_variable_is_covered_and_listed_by_help() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut in_sources = BTreeSet::new();
    let mut dirs = vec![root.join("src")];
    for p in std::fs::read_dir(root.join("providers")).unwrap() {
        dirs.push(p.unwrap().path().join("src"));
    }
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, _) in text.match_indices("\"REGBROKER_") {
                    let name: String = text[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    in_sources.insert(name);
                }
            }
        }
    }
    // A unit test's made-up name.
    in_sources.remove("REGBROKER_X");
    let covered: BTreeSet<String> = CASES
        .iter()
        .map(|c| c.var)
        .chain(ANY_VALUE.iter().copied())
        .map(String::from)
        .collect();
    let missing: Vec<_> = in_sources.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "variables without an invalid-value case: {missing:?}"
    );

    let mut listed = BTreeSet::new();
    for mode in [
        "serve",
        "resolve",
        "doctor",
        "credential-helper",
        "kubelet-credential-provider",
    ] {
        let (code, help, _) = run(&[mode, "--help"], &[], "");
        assert_eq!(code, Some(0), "{mode} --help");
        let vars = regbroker::cli::env_vars(mode);
        assert!(vars.len() > 10, "{mode}: {vars:?}");
        for var in &vars {
            assert!(
                named(&help, var) >= 1,
                "{mode} --help does not list {var}:\n{help}"
            );
        }
        listed.extend(vars);
    }
    let unlisted: Vec<_> = in_sources.difference(&listed).collect();
    assert!(unlisted.is_empty(), "read but in no --help: {unlisted:?}");
}

#[test]
fn docker_credential_regbroker_prints_usage() {
    let dir = tempfile::tempdir().unwrap();
    let helper = dir.path().join("docker-credential-regbroker");
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    let run_helper = |args: &[&str]| {
        let out = run_bounded(
            Command::new(&helper).args(args).env_clear(),
            Some(b""),
            CLI_BOUND,
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run_helper(&["--help"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Usage: docker-credential-regbroker <get|store|erase|list|version>"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("unknown credential helper action"),
        "{stdout}"
    );
    // It has no flags: the variables read outside them, all of them.
    for group in regbroker::env::read_by(regbroker::env::Mode::OneShot) {
        for var in group.vars {
            assert!(
                named(&stdout, var) >= 1,
                "--help does not list {var}:\n{stdout}"
            );
        }
    }
    // No action: usage on stderr, nothing on stdout, exit 1 (as docker's own helpers).
    let (code, stdout, stderr) = run_helper(&[]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.starts_with("Usage: docker-credential-regbroker"),
        "{stderr}"
    );
    // An unknown action is still the protocol's error on stdout.
    let (code, stdout, _) = run_helper(&["fetch"]);
    assert_eq!(code, Some(1));
    assert!(
        stdout.contains("unknown credential helper action"),
        "{stdout}"
    );
}

/// An identity failure says to run `regbroker doctor`, once, in every one-off mode (the
/// endpoint's answer is tested in tests/endpoint.rs).
#[test]
fn an_identity_failure_points_to_doctor_once() {
    let closed = [("GCE_METADATA_HOST", "127.0.0.1:1")];
    for (args, stdin) in [RESOLVE, HELPER, KUBELET] {
        let (code, stdout, stderr) = run(args, &closed, stdin);
        let said = format!("{stdout}{stderr}");
        assert_eq!(code, Some(1), "{args:?}: {said}");
        assert!(said.contains("no GCP identity"), "{args:?}: {said}");
        assert_eq!(
            said.matches("run `regbroker doctor`").count(),
            1,
            "{args:?}: {said}"
        );
    }
    // doctor itself does not send the user to doctor.
    let (_, stdout, stderr) = run(&["doctor", "gcr.io"], &closed, "");
    assert!(
        !stdout.contains("run `regbroker doctor`"),
        "{stdout}{stderr}"
    );
}
