//! Test support shared by every crate's tests (feature `test-util`): finding a test peer
//! on PATH, and capturing log output to search it for secrets.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The path of the test peer `name` on PATH; panics naming it and how to install it when
/// it is missing. Tests that need a peer are `#[ignore]`d, so this runs only when they are
/// asked for (`scripts/test.sh`), and a missing peer is then a failure, never a pass.
pub fn require_peer(name: &str, install: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "test peer `{name}` is not on PATH; install it with `{install}`, \
                 or run `bash scripts/test.sh`, which installs every peer"
            )
        })
}

/// A log writer that keeps everything written to it; clones share the buffer. Give
/// `move || capture.clone()` to a tracing subscriber's `with_writer`.
#[derive(Clone, Debug, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    /// Everything written so far, lossily as UTF-8.
    pub fn text(&self) -> String {
        let buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An unsigned JWT (`alg: none`) with `payload` as its claims: what a claim reader sees,
/// for tests that never reach a verifier.
pub fn jwt(payload: &serde_json::Value) -> String {
    use base64::Engine;
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
    };
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(&serde_json::json!({"alg": "none", "typ": "JWT"})),
        b64(payload)
    )
}

/// A token shaped as the API server issues for ServiceAccount `namespace/name` (its
/// `sub` and `kubernetes.io` claims, audience `sts.amazonaws.com`, an hour of life from
/// the wall clock), unsigned.
pub fn service_account_jwt(namespace: &str, name: &str, uid: &str) -> String {
    let now = crate::Clock::now(&crate::SystemClock)
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    jwt(&serde_json::json!({
        "aud": ["sts.amazonaws.com"],
        "iss": "https://kubernetes.default.svc.cluster.local",
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": "p", "uid": "00000000-0000-0000-0000-00000000000a"},
            "serviceaccount": {"name": name, "uid": uid},
        },
    }))
}
