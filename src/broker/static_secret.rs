//! Static credentials from `kubernetes.io/dockerconfigjson` documents (Flux's `secretRef`).
//!
//! Sources, in precedence order (the first source naming a registry wins):
//! - a file holding a docker config (`{"auths": {...}}`) or a legacy `.dockercfg` map;
//! - a directory, such as a mounted Secret: its `.dockerconfigjson` key, else `.dockercfg`.
//!
//! Entries may carry `auth` (base64 `user:password`), `username` + `password`, or
//! `identitytoken` (served with docker's `<token>` username). Keys are normalised like
//! docker does (scheme and path stripped), then like every registry name here; a host with
//! a port is a different key from the same host without one.
//!
//! Files are reloaded when they change. Kubernetes updates a mounted Secret by swapping
//! the `..data` symlink in its directory, so the watch is on directories, not files. A
//! broken new version keeps the last good contents, logs a warning and is counted.
//!
//! Messages never include a value from the documents: a malformed entry is reported by
//! its registry key and field name only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use base64::Engine as _;
use regbroker_provider::{Credential, IDENTITY_TOKEN_USERNAME, Registry, SecretString};
use serde_json::Value;

use super::memo::Memo;
use crate::metrics::Metrics;

/// Largest document accepted; a docker config is a few KiB.
const MAX_DOCUMENT_BYTES: u64 = 4 * 1024 * 1024;

/// Why a document could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The path could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A directory without `.dockerconfigjson` or `.dockercfg`.
    #[error("{path}: directory holds neither .dockerconfigjson nor .dockercfg")]
    NoKey {
        /// The directory.
        path: PathBuf,
    },
    /// The document is too large.
    #[error("{path}: larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge {
        /// The path.
        path: PathBuf,
    },
    /// The document is JSON but not a docker config.
    #[error("{path}: {message}")]
    Invalid {
        /// The path.
        path: PathBuf,
        /// What is wrong, naming the registry key and field.
        message: String,
    },
}

/// One snapshot of all static credentials.
#[derive(Debug, Default)]
pub struct Snapshot {
    entries: HashMap<Registry, Credential>,
}

impl Snapshot {
    /// The static credential for exactly this registry.
    pub fn get(&self, registry: &Registry) -> Option<&Credential> {
        self.entries.get(registry)
    }

    /// Number of registries with a static credential.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The registries, sorted.
    pub fn registries(&self) -> Vec<&Registry> {
        let mut v: Vec<_> = self.entries.keys().collect();
        v.sort();
        v
    }
}

/// Loads every source into one snapshot; the first source naming a registry wins.
pub fn load(paths: &[PathBuf]) -> Result<Snapshot, LoadError> {
    let mut snapshot = Snapshot::default();
    for path in paths {
        let (file, bytes) = read_source(path)?;
        for (registry, credential) in
            parse_document(&bytes).map_err(|message| LoadError::Invalid {
                path: file.clone(),
                message,
            })?
        {
            if snapshot.entries.contains_key(&registry) {
                tracing::debug!(%registry, path = %file.display(), "Static entry shadowed by an earlier source");
                continue;
            }
            snapshot.entries.insert(registry, credential);
        }
    }
    Ok(snapshot)
}

fn read_source(path: &Path) -> Result<(PathBuf, zeroize::Zeroizing<Vec<u8>>), LoadError> {
    let read_err = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    let file = if meta.is_dir() {
        [".dockerconfigjson", ".dockercfg"]
            .iter()
            .map(|k| path.join(k))
            .find(|p| p.is_file())
            .ok_or_else(|| LoadError::NoKey {
                path: path.to_path_buf(),
            })?
    } else {
        path.to_path_buf()
    };
    let meta = std::fs::metadata(&file).map_err(|source| LoadError::Read {
        path: file.clone(),
        source,
    })?;
    if meta.len() > MAX_DOCUMENT_BYTES {
        return Err(LoadError::TooLarge { path: file });
    }
    let bytes = std::fs::read(&file)
        .map(zeroize::Zeroizing::new)
        .map_err(|source| LoadError::Read {
            path: file.clone(),
            source,
        })?;
    // Re-check the size actually read: the file may have grown since the metadata call.
    if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(LoadError::TooLarge { path: file });
    }
    Ok((file, bytes))
}

/// Parses one docker config (`{"auths": {...}}`) or legacy `.dockercfg` document.
///
/// Returns entries in document order (keys sorted, as serde_json keeps them). Keys that
/// are not registry names are skipped with a warning; empty entries (as docker writes when
/// a credential store holds the secret) are skipped silently. Keys that normalise to one
/// registry are all returned ([`load`] keeps the first) and warned about, once per parse,
/// naming both keys but no value.
pub fn parse_document(bytes: &[u8]) -> Result<Vec<(Registry, Credential)>, String> {
    let mut value: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("not valid JSON (line {} column {})", e.line(), e.column()))?;
    let result = parse_value(&value);
    // The parsed document holds every password in plain strings: wipe them.
    scrub(&mut value);
    result
}

/// Overwrites every string in a JSON value with zeros before it is dropped.
fn scrub(value: &mut Value) {
    use zeroize::Zeroize as _;
    match value {
        Value::String(s) => s.zeroize(),
        Value::Array(items) => items.iter_mut().for_each(scrub),
        Value::Object(map) => map.values_mut().for_each(scrub),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn parse_value(value: &Value) -> Result<Vec<(Registry, Credential)>, String> {
    let Value::Object(top) = value else {
        return Err("expected a JSON object".into());
    };
    let auths = match top.get("auths") {
        Some(Value::Object(auths)) => auths,
        Some(_) => return Err("`auths` must be an object".into()),
        // Legacy .dockercfg: the registry map itself.
        None if top.values().all(Value::is_object) => top,
        // A docker config.json that keeps its secrets elsewhere (credsStore, credHelpers).
        None if top.contains_key("credsStore") || top.contains_key("credHelpers") => {
            return Ok(Vec::new());
        }
        None => {
            return Err(
                "neither a docker config (`auths`) nor a legacy .dockercfg registry map".into(),
            );
        }
    };
    let mut out = Vec::with_capacity(auths.len());
    // The key that gave each registry its credential: another key that normalises to the
    // same registry (`r.example.com/team-a` and `/team-b`, `docker.io` and
    // `https://index.docker.io/v1/`) is shadowed by the first in key order, with a warning.
    let mut first_key: HashMap<Registry, &str> = HashMap::new();
    for (key, entry) in auths {
        let Value::Object(entry) = entry else {
            return Err(format!("entry `{}` must be an object", safe_key(key)));
        };
        let registry = match Registry::parse(docker_key_to_host(key)) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(key = %safe_key(key), error = %e, "Skipping static entry with an invalid registry key");
                continue;
            }
        };
        match parse_entry(entry).map_err(|m| format!("entry `{registry}`: {m}"))? {
            Some(c) => {
                if let Some(kept) = first_key.get(&registry) {
                    tracing::warn!(
                        %registry,
                        kept = %safe_key(kept),
                        ignored = %safe_key(key),
                        "Two static entries normalise to the same registry; using the first"
                    );
                } else {
                    first_key.insert(registry.clone(), key);
                }
                out.push((registry, c));
            }
            None => tracing::debug!(%registry, "Skipping empty static entry"),
        }
    }
    Ok(out)
}

/// Docker's `ConvertToHostname`: strip `http://` or `https://`, keep up to the first `/`.
fn docker_key_to_host(key: &str) -> &str {
    let rest = key
        .strip_prefix("http://")
        .or_else(|| key.strip_prefix("https://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or(rest)
}

/// A key for messages: only if it cannot hold a secret (no `@`), and short.
fn safe_key(key: &str) -> String {
    if key.contains('@') || key.chars().any(|c| c.is_control()) {
        return "<redacted key>".into();
    }
    key.chars().take(80).collect()
}

fn string_field<'a>(
    entry: &'a serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<&'a str>, String> {
    match entry.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("`{name}` must be a string")),
    }
}

fn parse_entry(entry: &serde_json::Map<String, Value>) -> Result<Option<Credential>, String> {
    if let Some(token) = string_field(entry, "identitytoken")? {
        return Ok(Some(Credential::new(
            IDENTITY_TOKEN_USERNAME,
            SecretString::from(token.to_string()),
            None,
        )));
    }
    if let Some(auth) = string_field(entry, "auth")? {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim_end_matches('='))
            .or_else(|_| {
                base64::engine::general_purpose::STANDARD_NO_PAD.decode(auth.trim_end_matches('='))
            })
            .map(zeroize::Zeroizing::new)
            .map_err(|_| "`auth` is not valid base64".to_string())?;
        let decoded = std::str::from_utf8(&decoded)
            .map_err(|_| "`auth` does not decode to UTF-8".to_string())?;
        let (user, pass) = decoded
            .split_once(':')
            .ok_or_else(|| "`auth` does not decode to `username:password`".to_string())?;
        if user.is_empty() {
            return Err("`auth` has an empty username".into());
        }
        return Ok(Some(Credential::new(
            user,
            SecretString::from(pass.to_string()),
            None,
        )));
    }
    match (
        string_field(entry, "username")?,
        string_field(entry, "password")?,
    ) {
        (Some(u), Some(p)) => Ok(Some(Credential::new(
            u,
            SecretString::from(p.to_string()),
            None,
        ))),
        (Some(_), None) => Err("has `username` but no `password`".into()),
        (None, Some(_)) => Err("has `password` but no `username`".into()),
        (None, None) => Ok(None),
    }
}

/// The live set of static credentials, swapped atomically on reload so readers never
/// wait and in-flight requests keep the snapshot they started with.
#[derive(Debug)]
pub struct Store {
    paths: Vec<PathBuf>,
    current: ArcSwap<Snapshot>,
    metrics: Arc<Metrics>,
    /// Answers made from a snapshot, forgotten when it is replaced.
    memos: Mutex<Vec<Weak<Memo>>>,
}

impl Store {
    /// Loads `paths` once; fails if any cannot be loaded (a start-up error).
    pub fn open(paths: Vec<PathBuf>, metrics: Arc<Metrics>) -> Result<Store, LoadError> {
        let snapshot = load(&paths)?;
        metrics.static_entries.set(snapshot.len() as i64);
        Ok(Store {
            paths,
            current: ArcSwap::from_pointee(snapshot),
            metrics,
            memos: Mutex::default(),
        })
    }

    /// An empty store (no static sources).
    pub fn empty(metrics: Arc<Metrics>) -> Store {
        Store {
            paths: Vec::new(),
            current: ArcSwap::from_pointee(Snapshot::default()),
            metrics,
            memos: Mutex::default(),
        }
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Has every reload forget the answers `memo` keeps (they may be made from an entry
    /// the reload changes or drops).
    pub fn forget_on_reload(&self, memo: &Arc<Memo>) {
        let mut memos = self.memos.lock().unwrap_or_else(PoisonError::into_inner);
        memos.retain(|m| m.strong_count() > 0);
        memos.push(Arc::downgrade(memo));
    }

    /// Reloads every source; on failure keeps the last good snapshot.
    pub fn reload(&self) -> Result<(), LoadError> {
        match load(&self.paths) {
            Ok(snapshot) => {
                let n = snapshot.len();
                self.current.store(Arc::new(snapshot));
                let memos = self.memos.lock().unwrap_or_else(PoisonError::into_inner);
                memos
                    .iter()
                    .filter_map(Weak::upgrade)
                    .for_each(|m| m.changed());
                drop(memos);
                self.metrics.static_entries.set(n as i64);
                self.metrics.static_reload("ok");
                tracing::info!(entries = n, "Reloaded static credentials");
                Ok(())
            }
            Err(e) => {
                self.metrics.static_reload("error");
                tracing::warn!(error = %e, "Static credentials not reloaded; keeping the last good version");
                Err(e)
            }
        }
    }

    /// The configured sources.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
}

/// Watches the store's sources and reloads on change until dropped.
#[derive(Debug)]
pub struct Watcher {
    _watcher: Option<notify::RecommendedWatcher>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long to wait for a burst of file events to settle before reloading.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Whether a file event may have changed what a source holds. Opening, reading and
/// closing a file do not (a write also reports a modification): each reload reads the
/// sources, so taking those for changes made one edit reload every debounce period
/// forever.
pub(crate) fn may_change(kind: &notify::EventKind) -> bool {
    !matches!(kind, notify::EventKind::Access(_))
}

/// Starts watching the directories that hold `store`'s sources.
pub fn watch(store: Arc<Store>) -> Result<Watcher, notify::Error> {
    use notify::Watcher as _;

    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| may_change(&e.kind)) {
            // A full channel already holds a pending reload: nothing is lost.
            let _ = tx.try_send(());
        }
    })?;
    let mut dirs: Vec<PathBuf> = store
        .paths()
        .iter()
        .map(|p| {
            if p.is_dir() {
                p.clone()
            } else {
                p.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."))
            }
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        tracing::debug!(dir = %dir.display(), "Watching static credential sources");
    }
    let task = tokio::spawn(async move {
        while rx.recv().await.is_some() {
            tokio::time::sleep(DEBOUNCE).await;
            while rx.try_recv().is_ok() {}
            let store = store.clone();
            // Reading files is blocking work.
            let _ = tokio::task::spawn_blocking(move || store.reload()).await;
        }
    });
    Ok(Watcher {
        _watcher: Some(watcher),
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use regbroker_provider::ExposeSecret;

    fn parse(doc: &str) -> Result<Vec<(Registry, Credential)>, String> {
        parse_document(doc.as_bytes())
    }

    #[test]
    fn a_reload_forgets_the_answers_of_every_memo_registered_and_alive() {
        use crate::broker::memo::Answer;
        use std::time::SystemTime;

        let store = Store::empty(Arc::new(Metrics::new()));
        let keep_one = |memo: &Memo| {
            let miss = memo
                .kept("registry=r", || SystemTime::UNIX_EPOCH, |_| {})
                .unwrap_err();
            memo.keep(
                "registry=r",
                miss,
                Answer {
                    body: bytes::Bytes::from_static(b"{}"),
                    registry: Registry::parse("r.example.com").unwrap(),
                    source: "static",
                    cached: false,
                    until: None,
                },
                SystemTime::UNIX_EPOCH,
            );
            assert_eq!(memo.len(), 1);
        };
        let gone = Arc::new(Memo::default());
        store.forget_on_reload(&gone);
        drop(gone);
        let (first, second) = (Arc::new(Memo::default()), Arc::new(Memo::default()));
        store.forget_on_reload(&first);
        store.forget_on_reload(&second);
        keep_one(&first);
        keep_one(&second);
        store.reload().unwrap();
        assert!(
            first.is_empty(),
            "the first memo kept an answer across a reload"
        );
        assert!(
            second.is_empty(),
            "the second memo kept an answer across a reload"
        );
        assert_eq!(
            store.memos.lock().unwrap().len(),
            2,
            "a dropped memo stayed registered"
        );
    }

    #[test]
    fn a_document_of_4_mib_is_read_and_one_byte_more_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let doc = r#"{"auths":{}}"#;
        let limit = 4 * 1024 * 1024;
        std::fs::write(&path, format!("{doc}{}", " ".repeat(limit - doc.len()))).unwrap();
        let (_, bytes) = read_source(&path).expect("a 4 MiB document is read");
        assert_eq!(bytes.len(), limit);
        std::fs::write(&path, format!("{doc}{}", " ".repeat(limit + 1 - doc.len()))).unwrap();
        assert!(matches!(
            read_source(&path),
            Err(LoadError::TooLarge { .. })
        ));
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn all_entry_forms_are_understood() {
        let doc = format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "registry.example.com": {{"username": "bob", "password": "pw2"}},
                "http://token.example.com/v2/": {{"identitytoken": "tok3"}},
                "registry.example.com:5000": {{"auth": "{}", "email": "x@example.com"}},
                "empty.example.com": {{}}
            }}}}"#,
            b64("alice:pw1"),
            b64("carol:pw:with:colons")
        );
        let got = parse(&doc).unwrap();
        let find = |name: &str| {
            got.iter().find(|(r, _)| r.as_str() == name).map(|(_, c)| {
                (
                    c.username().to_string(),
                    c.secret().expose_secret().to_string(),
                )
            })
        };
        assert_eq!(find("docker.io"), Some(("alice".into(), "pw1".into())));
        assert_eq!(
            find("registry.example.com"),
            Some(("bob".into(), "pw2".into()))
        );
        assert_eq!(
            find("token.example.com"),
            Some(("<token>".into(), "tok3".into()))
        );
        assert_eq!(
            find("registry.example.com:5000"),
            Some(("carol".into(), "pw:with:colons".into()))
        );
        assert_eq!(find("empty.example.com"), None);
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn legacy_dockercfg_is_accepted() {
        let doc = format!(
            r#"{{"registry.example.com": {{"auth": "{}", "email": ""}}}}"#,
            b64("u:p")
        );
        let got = parse(&doc).unwrap();
        assert_eq!(got[0].0.as_str(), "registry.example.com");
        assert_eq!(got[0].1.username(), "u");
    }

    #[test]
    fn auth_without_padding_is_accepted() {
        let doc = r#"{"auths": {"r.example.com": {"auth": "dTpwdw"}}}"#; // "u:pw"
        let got = parse(doc).unwrap();
        assert_eq!(got[0].1.secret().expose_secret(), "pw");
    }

    #[test]
    fn malformed_documents_are_rejected_without_echoing_values() {
        let secret = "hunter2-secret";
        let cases = [
            format!(r#"{{"auths": {{"r.example.com": {{"auth": "{secret}!!"}}}}}}"#),
            format!(
                r#"{{"auths": {{"r.example.com": {{"auth": "{}"}}}}}}"#,
                b64(secret)
            ),
            r#"{"auths": {"r.example.com": {"username": "u", "password": 5}}}"#.to_string(),
            format!(r#"{{"auths": {{"r.example.com": {{"password": "{secret}"}}}}}}"#),
            format!(r#"{{"auths": {{"r.example.com": "{secret}"}}}}"#),
            format!(r#"{{"auths": "{secret}"}}"#),
            format!(r#"["{secret}"]"#),
            format!(r#"{{"auths": {{"r.example.com": {{"auth": "{secret}"#),
        ];
        for doc in cases {
            let err = parse(&doc).expect_err(&doc);
            assert!(!err.contains(secret), "{err}");
            assert!(!err.contains(&b64(secret)), "{err}");
        }
    }

    #[test]
    fn a_config_keeping_its_secrets_elsewhere_has_no_entries_and_anything_else_is_refused() {
        for doc in [
            r#"{"credsStore": "desktop"}"#,
            r#"{"credHelpers": {"r.example.com": "ecr-login"}, "credsStore": "pass"}"#,
            r#"{"credHelpers": {"r.example.com": "ecr-login"}, "HttpHeaders": "x"}"#,
        ] {
            assert_eq!(parse(doc).map(|e| e.len()), Ok(0), "{doc}");
        }
        let err = parse(r#"{"detachKeys": "ctrl-p"}"#).unwrap_err();
        assert!(err.contains("neither a docker config"), "{err}");
    }

    #[test]
    fn an_empty_string_field_counts_as_absent() {
        let doc = r#"{"auths": {"r.example.com": {"auth": "", "username": "u", "password": "p", "identitytoken": ""}}}"#;
        let got = parse(doc).unwrap();
        assert_eq!(got[0].1.username(), "u");
        assert_eq!(got[0].1.secret().expose_secret(), "p");
    }

    #[test]
    fn a_key_that_may_hold_a_secret_is_never_shown_in_messages() {
        assert_eq!(safe_key("user:pw@evil.example.com"), "<redacted key>");
        assert_eq!(safe_key("r.example.com\u{1b}[2J"), "<redacted key>");
        assert_eq!(safe_key("r.example.com/v2"), "r.example.com/v2");
        assert_eq!(safe_key(&"a".repeat(100)).len(), 80);
    }

    #[test]
    fn a_snapshot_is_empty_exactly_when_it_has_no_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"auths": {}}"#).unwrap();
        let none = load(std::slice::from_ref(&path)).unwrap();
        assert!(none.is_empty());
        assert_eq!(none.len(), 0);
        std::fs::write(
            &path,
            r#"{"auths": {"r.example.com": {"username": "u", "password": "p"}}}"#,
        )
        .unwrap();
        let one = load(&[path]).unwrap();
        assert!(!one.is_empty());
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn invalid_keys_are_skipped_not_fatal() {
        let doc = format!(
            r#"{{"auths": {{"user:pw@evil.example.com": {{"auth": "{}"}}, "ok.example.com": {{"auth": "{}"}}}}}}"#,
            b64("a:b"),
            b64("c:d")
        );
        let got = parse(&doc).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.as_str(), "ok.example.com");
    }

    #[test]
    fn first_source_wins_and_dirs_use_the_secret_key() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        std::fs::write(
            &a,
            r#"{"auths": {"r.example.com": {"username": "first", "password": "1"}}}"#,
        )
        .unwrap();
        let secret_dir = dir.path().join("secret");
        std::fs::create_dir(&secret_dir).unwrap();
        std::fs::write(
            secret_dir.join(".dockerconfigjson"),
            r#"{"auths": {"r.example.com": {"username": "second", "password": "2"}, "s.example.com": {"username": "s", "password": "3"}}}"#,
        )
        .unwrap();
        let snap = load(&[a, secret_dir]).unwrap();
        let r = Registry::parse("r.example.com").unwrap();
        assert_eq!(snap.get(&r).unwrap().username(), "first");
        assert_eq!(snap.len(), 2);
    }

    /// Log lines at WARN and above emitted while `f` runs on this thread.
    fn warnings(f: impl FnOnce()) -> String {
        use tracing_subscriber::layer::SubscriberExt as _;
        #[derive(Clone, Default)]
        struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Capture {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture::default();
        let writer = capture.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry()
            .with(layer)
            .with(tracing_subscriber::filter::LevelFilter::WARN);
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(capture.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn keys_that_normalise_to_one_registry_are_warned_about_by_key_never_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths": {{
                    "r.example.com/team-a": {{"username": "a", "password": "pw-team-a"}},
                    "r.example.com/team-b": {{"username": "b", "password": "pw-team-b"}},
                    "docker.io": {{"auth": "{}"}},
                    "https://index.docker.io/v1/": {{"auth": "{}"}},
                    "other.example.com": {{"username": "o", "password": "pw-other"}}
                }}}}"#,
                b64("hub1:pw-hub-1"),
                b64("hub2:pw-hub-2")
            ),
        )
        .unwrap();
        let mut snap = None;
        let logs = warnings(|| snap = Some(load(std::slice::from_ref(&path)).unwrap()));
        let snap = snap.unwrap();
        // The first key in sort order still wins.
        let r = Registry::parse("r.example.com").unwrap();
        assert_eq!(snap.get(&r).unwrap().username(), "a");
        assert_eq!(
            snap.get(&Registry::parse("docker.io").unwrap())
                .unwrap()
                .username(),
            "hub1"
        );
        assert_eq!(snap.len(), 3);

        let lines: Vec<&str> = logs.lines().collect();
        assert_eq!(lines.len(), 2, "one warning per collision per load: {logs}");
        let team = lines.iter().find(|l| l.contains("r.example.com/team-b"));
        let team = team.unwrap_or_else(|| panic!("no warning names team-b: {logs}"));
        assert!(team.contains("r.example.com/team-a"), "{team}");
        let hub = lines
            .iter()
            .find(|l| l.contains("https://index.docker.io/v1/"));
        let hub = hub.unwrap_or_else(|| panic!("no warning names the docker hub alias: {logs}"));
        assert!(hub.contains("docker.io"), "{hub}");
        for secret in ["pw-team-a", "pw-team-b", "pw-hub-1", "pw-hub-2", "pw-other"] {
            assert!(!logs.contains(secret), "{logs}");
            assert!(!logs.contains(&b64(secret)), "{logs}");
        }
        assert!(!logs.contains(&b64("hub1:pw-hub-1")), "{logs}");
        assert!(!logs.contains(&b64("hub2:pw-hub-2")), "{logs}");

        // A second load warns again, once.
        let again = warnings(|| drop(load(std::slice::from_ref(&path)).unwrap()));
        assert_eq!(again.lines().count(), 2, "{again}");
    }

    #[test]
    fn missing_key_in_dir_is_an_error_naming_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(&[dir.path().to_path_buf()]).unwrap_err().to_string();
        assert!(err.contains(".dockerconfigjson"), "{err}");
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
    }
}
