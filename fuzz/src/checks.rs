//! The properties the fuzz targets check, one function per target.
//!
//! Shared by the libFuzzer binaries in `fuzz/fuzz_targets/` and by the main crate's
//! `tests/fuzz_regressions.rs`, which replays the committed seed corpora and every file
//! under `fuzz/regressions/` in a plain `cargo test` (no fuzzer, no nightly needed).
//!
//! Each function takes the raw fuzz input and panics when a property fails. "No panic" is
//! the baseline; where a stronger property is cheap it is checked too:
//! - a parsed registry re-parses to itself, is lower case and holds no path or userinfo;
//! - an image reference names Docker Hub unless a `/` follows its first component, and
//!   the image and registry readings agree on every reference with a path that both read;
//! - an error message does not depend on the bytes after an `@` (nor on userinfo before
//!   it): the same input with those letters and digits rotated gives the same message;
//! - a docker config error is fixed text plus at most a registry key, never a value;
//! - a glob pattern matches exactly when a plain reference matcher says it does;
//! - the HTTP endpoint answers only the documented statuses, serves only its one static
//!   registry, and a malformed query never reaches a provider (a provider that recognises
//!   nothing counts its calls).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use regbroker::broker::routing::Pattern;
use regbroker::oneshot::backend::Settings;
use regbroker_provider::{
    BoxFuture, Credential, Error, Options, Provider, Registry, Target, system_clock,
};

/// Rotates ASCII letters and digits (`a`→`b`, `z`→`a`, `9`→`0`), keeping every other byte:
/// the structure of the input (dots, colons, slashes, `@`) stays, its text changes.
fn rotate(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='y' | 'A'..='Y' | '0'..='8' => char::from(c as u8 + 1),
            'z' => 'a',
            'Z' => 'A',
            '9' => '0',
            c => c,
        })
        .collect()
}

/// Variants of `input` that differ only in what a message must never show: the bytes
/// after the first `@`, and, when that `@` is inside the authority, the userinfo before it.
fn secret_variants(input: &str) -> Vec<String> {
    let Some(at) = input.find('@') else {
        return Vec::new();
    };
    let mut out = vec![format!("{}@{}", &input[..at], rotate(&input[at + 1..]))];
    let start = match input.find("://") {
        Some(i) if i < at => i + 3,
        _ => 0,
    };
    let userinfo = &input[start..at];
    if !userinfo.contains(['/', '?', '#']) {
        out.push(format!(
            "{}{}{}",
            &input[..start],
            rotate(userinfo),
            &input[at..]
        ));
    }
    out
}

/// `Registry::parse`, `Registry::from_image_reference` and
/// `Registry::from_registry_or_image` on any UTF-8 string.
pub fn registry_parse(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    image_readings(input);
    match Registry::parse(input) {
        Ok(r) => {
            assert_eq!(
                Registry::parse(r.as_str()).as_ref(),
                Ok(&r),
                "{input:?} parsed to {r:?}, which does not re-parse to itself"
            );
            let name = r.as_str();
            assert_eq!(name, name.to_ascii_lowercase(), "{input:?}");
            assert!(
                !name.contains(['@', '/', '?', '#']),
                "{input:?} -> {name:?}"
            );
            assert!(
                r.host().len() <= regbroker_provider::MAX_HOST_LEN + 2,
                "{input:?}"
            );
        }
        Err(e) => {
            let message = e.to_string();
            for variant in secret_variants(input) {
                let other = Registry::parse(&variant).map_err(|e| e.to_string());
                assert_eq!(
                    other.as_ref().err(),
                    Some(&message),
                    "the error for {input:?} depends on text around its `@` (variant {variant:?})"
                );
            }
        }
    }
}

/// The image reading ([`Registry::from_image_reference`]) and the reading for inputs
/// that may be either ([`Registry::from_registry_or_image`]) of the same input, checked
/// against the registry reading: a registry from an image re-parses to itself, holds
/// no path or userinfo, is Docker Hub when no `/` follows the first component, and agrees
/// with the registry reading wherever both read a path; the reading for either is the
/// registry reading whenever that succeeds, and otherwise Docker Hub or an error.
fn image_readings(input: &str) {
    let as_registry = Registry::parse(input);
    let as_image = Registry::from_image_reference(input);
    match &as_image {
        Ok(r) => {
            assert_eq!(Registry::parse(r.as_str()).as_ref(), Ok(r), "{input:?}");
            let name = r.as_str();
            assert_eq!(name, name.to_ascii_lowercase(), "{input:?}");
            assert!(
                !name.contains(['@', '/', '?', '#']),
                "{input:?} -> {name:?}"
            );
            let reference = input
                .get(..6)
                .filter(|s| s.eq_ignore_ascii_case("oci://"))
                .map_or(input, |_| &input[6..]);
            if !reference.contains('/') {
                assert!(r.is_docker_hub(), "{input:?} has no `/` but read as {r:?}");
            }
            if reference.contains('/')
                && let Ok(registry) = &as_registry
            {
                assert_eq!(registry, r, "{input:?}: the two readings disagree");
            }
        }
        Err(e) => {
            let message = e.to_string();
            for variant in secret_variants(input) {
                if let Err(other) = Registry::from_image_reference(&variant) {
                    assert_eq!(
                        other.to_string(),
                        message,
                        "the image error for {input:?} depends on text around its `@`"
                    );
                }
            }
        }
    }
    match (Registry::from_registry_or_image(input), &as_registry) {
        (either, Ok(registry)) => assert_eq!(either.as_ref(), Ok(registry), "{input:?}"),
        (Ok(either), Err(_)) => {
            assert!(either.is_docker_hub(), "{input:?} read as {either:?}");
            assert_eq!(as_image.as_ref(), Ok(&either), "{input:?}");
        }
        (Err(e), Err(_)) => {
            let message = e.to_string();
            for variant in secret_variants(input) {
                if let Err(other) = Registry::from_registry_or_image(&variant) {
                    assert_eq!(
                        other.to_string(),
                        message,
                        "the error for {input:?} depends on text around its `@`"
                    );
                }
            }
        }
    }
}

/// Splits fuzz input into a pattern and a registry at the first newline.
fn split_pair(input: &str) -> (&str, &str) {
    input.split_once('\n').unwrap_or((input, ""))
}

/// A plain recursive reference for one glob label: `*` matches any run of bytes.
fn reference_glob(pat: &[u8], s: &[u8]) -> bool {
    // Dynamic programming over (pattern prefix, string prefix); labels are at most 63
    // bytes, so this is at most 64 x 64 cells.
    let mut row = vec![false; s.len() + 1];
    row[0] = true;
    for &p in pat {
        let mut next = vec![false; s.len() + 1];
        if p == b'*' {
            let mut seen = false;
            for j in 0..=s.len() {
                seen |= row[j];
                next[j] = seen;
            }
        } else {
            for j in 1..=s.len() {
                next[j] = row[j - 1] && s[j - 1] == p;
            }
        }
        row = next;
    }
    row[s.len()]
}

/// `routing::Pattern` parsing and matching: `PATTERN\nREGISTRY`.
pub fn glob_pattern(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern_text, registry_text) = split_pair(input);
    let pattern = match Pattern::parse(pattern_text) {
        Ok(p) => p,
        Err(e) => {
            let message = e.to_string();
            for variant in secret_variants(pattern_text) {
                let other = Pattern::parse(&variant).map_err(|e| e.to_string());
                assert_eq!(
                    other.as_ref().err(),
                    Some(&message),
                    "the error for pattern {pattern_text:?} depends on text around its `@`"
                );
            }
            return;
        }
    };
    let Ok(registry) = Registry::parse(registry_text) else {
        return;
    };
    let got = pattern.matches(&registry);
    if !pattern.is_glob() {
        let exact = Registry::parse(pattern_text).ok();
        assert_eq!(got, exact.as_ref() == Some(&registry), "{input:?}");
        return;
    }
    // Reference: same port, no IPv6 literal, same number of labels, each label matching.
    let (host, port) = match pattern_text.split_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().ok()),
        None => (pattern_text, None),
    };
    let host = host.to_ascii_lowercase();
    let pats: Vec<&str> = host.split('.').collect();
    let labels: Vec<&str> = registry.labels().collect();
    let want = port == registry.port()
        && !registry.host().starts_with('[')
        && pats.len() == labels.len()
        && pats
            .iter()
            .zip(&labels)
            .all(|(p, l)| reference_glob(p.as_bytes(), l.as_bytes()));
    assert_eq!(got, want, "pattern {pattern_text:?} vs {registry:?}");
    if got {
        // A match never crosses a dot: the pattern's literal characters are all there.
        assert_eq!(pats.len(), labels.len());
    }
}

/// All object keys of a JSON document, at any depth.
fn keys(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                out.push(k.clone());
                keys(v, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

/// Every message `static_secret::parse_document` can give, with `{}` for the one
/// variable part: the registry key, normalised or shortened.
const DOCKERCONFIG_MESSAGES: &[&str] = &[
    "expected a JSON object",
    "`auths` must be an object",
    "neither a docker config (`auths`) nor a legacy .dockercfg registry map",
    "entry `{}` must be an object",
    "entry `{}`: `identitytoken` must be a string",
    "entry `{}`: `auth` must be a string",
    "entry `{}`: `username` must be a string",
    "entry `{}`: `password` must be a string",
    "entry `{}`: `auth` is not valid base64",
    "entry `{}`: `auth` does not decode to UTF-8",
    "entry `{}`: `auth` does not decode to `username:password`",
    "entry `{}`: `auth` has an empty username",
    "entry `{}`: has `username` but no `password`",
    "entry `{}`: has `password` but no `username`",
];

/// What a message may show of a key: its registry name, or the key itself shortened
/// (never a key holding an `@` or a control character).
fn shown_keys(key: &str) -> Vec<String> {
    let host = key
        .strip_prefix("http://")
        .or_else(|| key.strip_prefix("https://"))
        .unwrap_or(key);
    let host = host.split('/').next().unwrap_or(host);
    let mut out = vec!["<redacted key>".to_string()];
    if let Ok(r) = Registry::parse(host) {
        out.push(r.to_string());
    }
    if !key.contains('@') && !key.chars().any(char::is_control) {
        out.push(key.chars().take(80).collect());
    }
    out
}

/// `static_secret::parse_document` on any bytes. An error message is made only of fixed
/// text and a registry key: no value from the document (a password, a token) ever shows.
pub fn dockerconfig(data: &[u8]) {
    match regbroker::broker::static_secret::parse_document(data) {
        Ok(entries) => {
            for (registry, _) in entries {
                assert_eq!(Registry::parse(registry.as_str()).as_ref(), Ok(&registry));
            }
        }
        Err(message) => {
            let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
                let rest = message
                    .strip_prefix("not valid JSON (line ")
                    .and_then(|r| r.strip_suffix(')'))
                    .unwrap_or_default();
                assert!(
                    rest.split(" column ").count() == 2
                        && rest
                            .split(" column ")
                            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
                    "unexpected message for invalid JSON: {message:?}"
                );
                return;
            };
            let mut all = Vec::new();
            keys(&doc, &mut all);
            let shown: Vec<String> = all.iter().flat_map(|k| shown_keys(k)).collect();
            let known = DOCKERCONFIG_MESSAGES
                .iter()
                .any(|m| match m.split_once("{}") {
                    None => message == *m,
                    Some((before, after)) => shown
                        .iter()
                        .any(|k| message == format!("{before}{k}{after}")),
                });
            assert!(
                known,
                "parse_document's error {message:?} is not fixed text plus a key"
            );
        }
    }
}

const HELPER_ACTIONS: &[&str] = &["get", "store", "erase", "list", "version", "bogus"];

/// `helper::run`: the first byte picks the action, the rest is stdin. The settings point
/// at nothing (no sidecar, no config, no docker config), so `get` must answer an error
/// or "not found", on one line.
pub fn helper_stdin(data: &[u8]) {
    let (action, stdin) = match data.split_first() {
        Some((b, rest)) => (HELPER_ACTIONS[usize::from(*b) % HELPER_ACTIONS.len()], rest),
        None => ("get", data),
    };
    let run = |stdin: &[u8]| {
        let mut out = Vec::new();
        let code = regbroker::oneshot::helper::run(
            action,
            || Ok(Settings::default()),
            &mut &stdin[..],
            &mut out,
        );
        (code, out)
    };
    let (code, out) = run(stdin);
    assert!(code <= 1, "exit code {code}");
    let out = String::from_utf8(out).expect("the helper writes UTF-8");
    match action {
        "get" => {
            assert_eq!(code, 1, "nothing is configured, yet get succeeded: {out:?}");
            assert_eq!(out.lines().count(), 1, "{out:?}");
            // The same stdin with its text around the `@` rotated answers the same.
            if let Ok(text) = std::str::from_utf8(stdin) {
                for variant in secret_variants(text) {
                    let (c, o) = run(variant.as_bytes());
                    assert_eq!(
                        (c, String::from_utf8_lossy(&o)),
                        (code, out.as_str().into()),
                        "{text:?}"
                    );
                }
            }
        }
        "store" | "erase" => assert_eq!((code, out.as_str()), (0, "")),
        "list" => assert_eq!((code, out.as_str()), (0, "{}\n")),
        "version" => assert_eq!(code, 0),
        _ => assert_eq!(code, 1),
    }
}

fn kubelet_once(data: &[u8]) -> (u8, Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = regbroker::oneshot::kubelet::run(
        || Ok(Settings::default()),
        &mut &data[..],
        &mut out,
        &mut err,
    );
    (code, out, err)
}

/// `kubelet::run` on any stdin, settings pointing at nothing: either an answer with an
/// empty `auth` on stdout, or an error on stderr, never both; and nothing it writes
/// depends on the request's service account token.
pub fn kubelet_request(data: &[u8]) {
    let (code, out, err) = kubelet_once(data);
    match code {
        0 => {
            assert!(err.is_empty());
            let v: serde_json::Value = serde_json::from_slice(&out).expect("stdout is JSON");
            assert_eq!(v["kind"], "CredentialProviderResponse");
            assert_eq!(v["auth"], serde_json::json!({}), "nothing is configured");
        }
        1 => {
            assert!(out.is_empty(), "an error and an answer");
            assert!(!err.is_empty());
            String::from_utf8(err).expect("stderr is UTF-8");
        }
        c => panic!("exit code {c}"),
    }
    // The same request with another token of the same shape answers the same. (Both
    // are re-serialised, so a position in an error message means the same in each.)
    if let Ok(serde_json::Value::Object(mut req)) = serde_json::from_slice(data)
        && let Some(serde_json::Value::String(token)) = req.get("serviceAccountToken").cloned()
    {
        let with = |req: &serde_json::Map<String, serde_json::Value>| {
            kubelet_once(&serde_json::to_vec(req).expect("re-serialise"))
        };
        let same = with(&req);
        req.insert(
            "serviceAccountToken".into(),
            serde_json::Value::String(rotate(&token)),
        );
        assert_eq!(
            with(&req),
            same,
            "the kubelet answer depends on the service account token"
        );
    }
}

/// A provider that recognises nothing and counts how often it was asked.
#[derive(Debug, Default)]
struct Nobody {
    asked: AtomicUsize,
    fetched: AtomicUsize,
}

impl Provider for Nobody {
    fn name(&self) -> &'static str {
        "nobody"
    }
    fn recognise(&self, _registry: &Registry) -> Option<Target> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        None
    }
    fn check_options(&self, _options: &Options) -> Result<(), String> {
        Ok(())
    }
    fn target(&self, registry: &Registry, _options: &Options) -> Result<Target, Error> {
        Ok(Target::new(registry.clone(), "nobody"))
    }
    fn fetch<'a>(&'a self, _target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        self.fetched.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(Error::not_configured("nobody serves anything")) })
    }
}

/// The one registry the HTTP target's broker has a (static) credential for.
const STATIC_HOST: &str = "static.fuzz.test";

struct Http {
    runtime: tokio::runtime::Runtime,
    app: regbroker::server::App,
    nobody: Arc<Nobody>,
}

fn http() -> &'static Http {
    static HTTP: OnceLock<Http> = OnceLock::new();
    HTTP.get_or_init(|| {
        let nobody = Arc::new(Nobody::default());
        let metrics = Arc::new(regbroker::metrics::Metrics::new());
        // One static entry, so the success path is fuzzed too.
        let path =
            std::env::temp_dir().join(format!("regbroker-fuzz-http-{}.json", std::process::id()));
        std::fs::write(
            &path,
            format!(r#"{{"auths":{{"{STATIC_HOST}":{{"username":"u","password":"fuzz-pw"}}}}}}"#),
        )
        .expect("a temporary docker config");
        let statics =
            regbroker::broker::static_secret::Store::open(vec![path.clone()], metrics.clone())
                .expect("the docker config loads");
        let _ = std::fs::remove_file(&path);
        let broker = regbroker::broker::Broker::new(
            Arc::new(statics),
            regbroker::broker::routing::Router::default(),
            regbroker::broker::providers::Providers::new(vec![nobody.clone() as Arc<dyn Provider>]),
            regbroker::broker::cache::Config::default(),
            metrics.clone(),
            system_clock(),
        );
        let app = regbroker::server::app(regbroker::server::AppState {
            broker: Arc::new(broker),
            metrics,
            ready: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        });
        // Timers: the router bounds each request's time.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        Http {
            runtime,
            app,
            nobody,
        }
    })
}

/// `GET /v1/credentials?<input>` through the real router, in process.
pub fn http_query(data: &[u8]) {
    use tower::ServiceExt as _;
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(request) = axum::http::Request::get(format!("/v1/credentials?{query}"))
        .body(axum::body::Body::empty())
    else {
        return; // not a URI at all: the HTTP parser never hands this to the router
    };
    let h = http();
    let asked = h.nobody.asked.load(Ordering::SeqCst);
    let (status, body) = h.runtime.block_on(async {
        let response = h.app.clone().oneshot(request).await.expect("infallible");
        let status = response.status().as_u16();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("body")
            .to_bytes();
        (status, body)
    });
    assert!(
        [200, 400, 403, 404, 502, 503, 504].contains(&status),
        "status {status} for {query:?}"
    );
    let asked_now = h.nobody.asked.load(Ordering::SeqCst);
    assert_eq!(h.nobody.fetched.load(Ordering::SeqCst), 0);
    let v: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
    match status {
        400 => {
            assert_eq!(asked_now, asked, "a malformed query reached a provider");
            assert!(v["error"]["message"].is_string(), "{v}");
        }
        404 => assert_eq!(asked_now, asked + 1, "{query:?}"),
        200 => {
            assert_eq!(v["registry"], STATIC_HOST, "{query:?}");
            assert_eq!(v["password"], "fuzz-pw");
            assert_eq!(asked_now, asked, "a static entry wins before any provider");
        }
        s => panic!("status {s} for {query:?} with nothing configured: {v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_structure() {
        assert_eq!(rotate("a:Z9@x.y/z"), "b:A0@y.z/a");
        assert_eq!(
            secret_variants("https://u:p@h/x"),
            ["https://u:p@i/y", "https://v:q@h/x"]
        );
    }

    #[test]
    fn reference_glob_agrees_on_basics() {
        assert!(reference_glob(b"*", b""));
        assert!(reference_glob(b"a*c", b"abbc"));
        assert!(!reference_glob(b"a*c", b"abb"));
    }
}
