//! The one-shot modes with a real provider credential: the kubelet's `cacheDuration`
//! and the helper's disk cache (`REGBROKER_CACHE_DIR`) across separate processes. The
//! real GCP provider runs in each `regbroker` process and reaches an in-test metadata
//! server (`GCE_METADATA_HOST`), which counts the exchanges.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::FakeMetadata;
use common::process::{CLI_BOUND, run_bounded};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

fn run(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    run_bounded(
        Command::new(BIN)
            .args(args)
            .env_clear()
            .envs(env.iter().copied()),
        Some(stdin.as_bytes()),
        CLI_BOUND,
    )
}

fn helper_get(meta: &FakeMetadata, cache: &Path) -> Output {
    run(
        &["credential-helper", "get"],
        "https://gcr.io",
        &[
            ("GCE_METADATA_HOST", &meta.addr),
            ("REGBROKER_CACHE_DIR", cache.to_str().unwrap()),
        ],
    )
}

fn secret_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{} / {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["Secret"].as_str().unwrap().to_string()
}

/// `1h2m3s`, `59m30s`, `45s` -> seconds.
fn go_secs(s: &str) -> u64 {
    let (mut total, mut n) = (0, String::new());
    for c in s.chars() {
        match c {
            '0'..='9' => n.push(c),
            'h' | 'm' | 's' => {
                let unit = match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                total += n.parse::<u64>().unwrap() * unit;
                n.clear();
            }
            _ => panic!("not a Go duration: {s}"),
        }
    }
    total
}

#[test]
fn kubelet_cache_duration_is_the_credentials_remaining_usable_life() {
    // A 1 h token: usable until 30 s (min_remaining) before expiry, 3570 s. Its refresh
    // point (0.8 of that, 2856 s) and the fallback (60 s) are both wrong answers.
    let meta = FakeMetadata::start(3600, false);
    let request = r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"gcr.io/project/image:tag"}"#;
    let out = run(
        &["kubelet-credential-provider"],
        request,
        &[("GCE_METADATA_HOST", &meta.addr)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["auth"]["gcr.io"]["password"], "ya29.fake-1");
    let secs = go_secs(v["cacheDuration"].as_str().unwrap());
    assert!(
        (3560..=3570).contains(&secs),
        "cacheDuration {} ({secs} s), expected the usable life, about 3570 s",
        v["cacheDuration"]
    );
    assert_eq!(meta.calls(), 1);
}

#[test]
fn repeated_helper_gets_make_one_exchange_through_the_disk_cache() {
    let meta = FakeMetadata::start(3600, false);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    assert_eq!(secret_of(&helper_get(&meta, &cache)), "ya29.fake-1");
    assert_eq!(secret_of(&helper_get(&meta, &cache)), "ya29.fake-1");
    assert_eq!(meta.calls(), 1, "the second process exchanged again");
    assert!(
        std::fs::read_dir(&cache).unwrap().count() >= 1,
        "a record was written"
    );
    // Control: without the cache directory every process exchanges.
    let out = run(
        &["credential-helper", "get"],
        "gcr.io",
        &[("GCE_METADATA_HOST", &meta.addr)],
    );
    assert_eq!(secret_of(&out), "ya29.fake-2");
}

#[test]
fn concurrent_helper_processes_share_the_cached_credential() {
    let meta = FakeMetadata::start(3600, false);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    assert_eq!(secret_of(&helper_get(&meta, &cache)), "ya29.fake-1");
    // Eight processes at once, each reading the record while the others read it too.
    let spawned: Vec<_> = (0..8)
        .map(|_| {
            let (addr, cache) = (meta.addr.clone(), cache.clone());
            std::thread::spawn(move || {
                run(
                    &["credential-helper", "get"],
                    "gcr.io",
                    &[
                        ("GCE_METADATA_HOST", &addr),
                        ("REGBROKER_CACHE_DIR", cache.to_str().unwrap()),
                    ],
                )
            })
        })
        .collect();
    for p in spawned {
        assert_eq!(secret_of(&p.join().unwrap()), "ya29.fake-1");
    }
    assert_eq!(
        meta.calls(),
        1,
        "a concurrent process made a second exchange"
    );

    // A cold start with concurrent processes: each may exchange (there is no lock across
    // processes), but every one answers, and the record left behind is whole: the next
    // process reads it and exchanges nothing.
    let cold = dir.path().join("cold");
    let before = meta.calls();
    let spawned: Vec<_> = (0..6)
        .map(|_| {
            let (addr, cold) = (meta.addr.clone(), cold.clone());
            std::thread::spawn(move || {
                run(
                    &["credential-helper", "get"],
                    "gcr.io",
                    &[
                        ("GCE_METADATA_HOST", &addr),
                        ("REGBROKER_CACHE_DIR", cold.to_str().unwrap()),
                    ],
                )
            })
        })
        .collect();
    for p in spawned {
        assert!(secret_of(&p.join().unwrap()).starts_with("ya29.fake-"));
    }
    let after_burst = meta.calls();
    assert!(after_burst > before);
    assert!(secret_of(&helper_get(&meta, &cold)).starts_with("ya29.fake-"));
    assert_eq!(
        meta.calls(),
        after_burst,
        "the record left behind was not usable"
    );
}

/// `erase` for `https://gcr.io` with the disk cache, and optionally a config file.
fn helper_erase(meta: &FakeMetadata, cache: &Path, config: Option<&Path>) -> Output {
    let mut env = vec![
        ("GCE_METADATA_HOST", meta.addr.clone()),
        ("REGBROKER_CACHE_DIR", cache.to_str().unwrap().to_string()),
    ];
    if let Some(c) = config {
        env.push(("REGBROKER_CONFIG", c.to_str().unwrap().to_string()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run(&["credential-helper", "erase"], "https://gcr.io\n", &env)
}

#[test]
fn erase_makes_the_next_get_fetch_anew_but_not_within_the_refetch_interval() {
    let meta = FakeMetadata::start(3600, false);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    secret_of(&helper_get(&meta, &cache));
    assert_eq!(meta.calls(), 1);
    // Fetched just now: within the default 30 s refetch_interval, erase keeps the record
    // (a client repeating erase cannot drive a fetch per call), and still succeeds.
    let out = helper_erase(&meta, &cache, None);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    secret_of(&helper_get(&meta, &cache));
    assert_eq!(
        meta.calls(),
        1,
        "erase within the interval forgot the record"
    );
    // With a 1 s interval, once the record is older than that, erase forgets it.
    let config = dir.path().join("regbroker.toml");
    std::fs::write(&config, "[cache]\nrefetch_interval = \"1s\"\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let out = helper_erase(&meta, &cache, Some(&config));
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    secret_of(&helper_get(&meta, &cache));
    assert_eq!(
        meta.calls(),
        2,
        "the next get did not fetch anew after erase"
    );
    // A server URL that is no registry, or nothing at all: erase still succeeds.
    for stdin in ["not a registry\n", ""] {
        let out = run(
            &["credential-helper", "erase"],
            stdin,
            &[("REGBROKER_CACHE_DIR", cache.to_str().unwrap())],
        );
        assert!(out.status.success(), "{stdin:?}: {out:?}");
    }
}
