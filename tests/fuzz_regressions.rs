#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Replays the fuzz targets' committed inputs in a plain `cargo test`: every seed under
//! `fuzz/corpus/TARGET/` and every crash kept under `fuzz/regressions/TARGET/`, through
//! the same property checks the fuzzers run (`fuzz/src/checks.rs`). No fuzzer or
//! nightly toolchain is needed; `fuzz/run.sh` does the fuzzing.
//!
//! This binary is built with the real cloud providers, while the fuzz crate has none (so
//! that no fuzzed input reaches a cloud). The helper and kubelet checks expect "nothing
//! configured", so an input naming a host a real provider recognises is skipped here
//! (it is still replayed by `fuzz/run.sh --replay`).

#[path = "../fuzz/src/checks.rs"]
#[allow(dead_code)]
mod checks;

// The provider answer checks call the three provider crates: built with all of them only.
#[cfg(all(feature = "aws", feature = "azure", feature = "gcp"))]
#[path = "../fuzz/src/provider_checks.rs"]
mod provider_checks;

use std::path::{Path, PathBuf};

use regbroker::broker::providers::Providers;
use regbroker_provider::Registry;

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        out.extend(entries.map(|e| e.unwrap().path()));
    }
    out.sort();
    out
}

fn replay(target: &str, check: fn(&[u8]), skip: fn(&[u8]) -> bool) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "no seeds for {target}: fuzz/corpus/{target}/ is missing"
    );
    for file in files {
        let data = std::fs::read(&file).unwrap();
        if skip(&data) {
            eprintln!("{}: names a cloud host; skipped here", file.display());
            continue;
        }
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{} fails its check", file.display());
    }
}

fn never(_: &[u8]) -> bool {
    false
}

fn cloud_host(text: &str) -> bool {
    Registry::parse(text.trim_end_matches(['\r', '\n'])).is_ok_and(|r| recognised(&r))
}

/// Whether the kubelet would read `image` as a registry a real provider recognises.
fn cloud_image(image: &str) -> bool {
    Registry::from_image_reference(image).is_ok_and(|r| recognised(&r))
}

fn recognised(registry: &Registry) -> bool {
    Providers::from_env()
        .unwrap()
        .iter()
        .any(|p| p.recognise(registry).is_some())
}

#[test]
fn registry_parse_inputs_replay() {
    replay("registry_parse", checks::registry_parse, never);
}

#[test]
fn dockerconfig_inputs_replay() {
    replay("dockerconfig", checks::dockerconfig, never);
}

#[test]
fn glob_pattern_inputs_replay() {
    replay("glob_pattern", checks::glob_pattern, never);
}

#[test]
fn http_query_inputs_replay() {
    replay("http_query", checks::http_query, never);
}

#[test]
fn helper_stdin_inputs_replay() {
    replay("helper_stdin", checks::helper_stdin, |data| {
        data.get(1..)
            .and_then(|d| std::str::from_utf8(d).ok())
            .is_some_and(cloud_host)
    });
}

#[test]
fn kubelet_request_inputs_replay() {
    replay("kubelet_request", checks::kubelet_request, |data| {
        serde_json::from_slice::<serde_json::Value>(data)
            .ok()
            .and_then(|v| v["image"].as_str().map(cloud_image))
            .unwrap_or(false)
    });
}

#[cfg(all(feature = "aws", feature = "azure", feature = "gcp"))]
mod provider_answers {
    use super::{never, provider_checks, replay};

    #[test]
    fn ecr_authorization_data_inputs_replay() {
        replay(
            "ecr_authorization_data",
            provider_checks::ecr_authorization_data,
            never,
        );
    }

    #[test]
    fn acr_exchange_inputs_replay() {
        replay("acr_exchange", provider_checks::acr_exchange, never);
    }

    #[test]
    fn acr_refresh_token_inputs_replay() {
        replay(
            "acr_refresh_token",
            provider_checks::acr_refresh_token,
            never,
        );
    }

    #[test]
    fn google_answer_inputs_replay() {
        replay("google_answer", provider_checks::google_answer, never);
    }

    #[test]
    fn entra_error_inputs_replay() {
        replay("entra_error", provider_checks::entra_error, never);
    }
}
