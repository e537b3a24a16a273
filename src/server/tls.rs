//! TLS for the TCP listener (rustls on aws-lc-rs, the crypto provider the rest of the tree
//! already builds): a PEM certificate chain and private key read from files, and read
//! again when they change, as cert-manager (or the kubelet's Secret volume) rotates them.
//!
//! Settings: `--tls-cert-file` / `REGBROKER_TLS_CERT_FILE` (the leaf first, then any
//! intermediates) and `--tls-key-file` / `REGBROKER_TLS_KEY_FILE` (PKCS#8, PKCS#1 or
//! SEC1). Each new connection is handshaken with the pair current at that moment;
//! connections already open keep theirs. A new pair that does not load (unparsable, or a
//! key that does not belong to the certificate, as between two writes of a rotation) is
//! logged and the previous pair kept. Errors name the file and what is wrong with it, and
//! never quote its contents.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest as _, Sha256};

/// Largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1024 * 1024;
/// Files are read again at least this often, in case a change notification was missed.
const POLL: Duration = Duration::from_secs(30);
/// Events are collected this long before a reload (a rotation writes several files).
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Where the certificate and key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Files {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The listener's TLS settings and the pair it currently serves.
pub struct Tls {
    files: Files,
    resolver: Arc<Resolver>,
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Resolver {
    current: ArcSwap<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    /// SHA-256 of the two files' bytes: a reload that reads the same bytes changes nothing.
    digest: [u8; 32],
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load().key.clone())
    }
}

impl Tls {
    /// Reads and checks the pair (at start-up: an error here is invalid configuration).
    pub fn load(files: Files) -> Result<Tls, String> {
        let loaded = load_pair(&files)?;
        let resolver = Arc::new(Resolver {
            current: ArcSwap::from_pointee(loaded),
        });
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            files,
            resolver,
            config: Arc::new(config),
        })
    }

    /// An acceptor for new connections (it sees every later reload).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// The files.
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// Reads the files again; `Ok(true)` when a new pair is now served, `Ok(false)` when
    /// the files hold the pair already served. On `Err` the previous pair is kept.
    pub fn reload(&self) -> Result<bool, String> {
        let digest = digest_files(&self.files)?;
        if digest == self.resolver.current.load().digest {
            return Ok(false);
        }
        let loaded = load_pair(&self.files)?;
        self.resolver.current.store(Arc::new(loaded));
        Ok(true)
    }
}

/// Watches the files' directories (a Secret volume swaps a `..data` symlink, so the files
/// themselves are never modified in place) and polls every [`POLL`]; reloads on change.
/// Stops when dropped.
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

/// Starts reloading `tls` when its files change (needs a tokio runtime).
pub fn watch(tls: Arc<Tls>) -> Result<Watcher, String> {
    use notify::Watcher as _;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    // Without notifications (inotify limits), polling alone still picks up a rotation.
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // inotify also reports opens and reads (ours included, at every reload): only a
        // change counts, or each reload would schedule the next.
        if event.is_ok_and(|e| crate::broker::static_secret::may_change(&e.kind)) {
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| {
        let mut dirs = vec![parent(&tls.files.cert), parent(&tls.files.key)];
        dirs.dedup();
        for dir in dirs {
            w.watch(&dir, notify::RecursiveMode::NonRecursive)?;
        }
        Ok(w)
    });
    let watcher = match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(error = %e, interval = ?POLL, "Cannot watch the TLS files; polling them");
            None
        }
    };
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // The last pair that failed, so a broken pair is logged once, not at every poll.
        let mut last_failed: Option<[u8; 32]> = None;
        loop {
            tokio::select! {
                Some(()) = rx.recv() => {
                    tokio::time::sleep(DEBOUNCE).await;
                    while rx.try_recv().is_ok() {}
                }
                _ = tick.tick() => {}
            }
            let t = tls.clone();
            let outcome =
                tokio::task::spawn_blocking(move || (t.reload(), digest_files(&t.files))).await;
            let Ok((result, digest)) = outcome else {
                continue;
            };
            match result {
                Ok(true) => {
                    last_failed = None;
                    tracing::info!(cert = %tls.files.cert.display(), "Reloaded TLS certificate");
                }
                Ok(false) => tracing::trace!("TLS files unchanged"),
                Err(e) => {
                    let digest = digest.ok();
                    if digest.is_none() || digest != last_failed {
                        tracing::warn!(
                            error = %e,
                            "Cannot load the new TLS certificate and key; still serving the previous ones"
                        );
                    }
                    last_failed = digest;
                }
            }
        }
    });
    Ok(Watcher {
        _watcher: watcher,
        task,
    })
}

fn parent(p: &Path) -> PathBuf {
    p.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn read(path: &Path, what: &str) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?;
    let mut buf = zeroize::Zeroizing::new(Vec::new());
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(format!(
            "{what} {}: larger than {MAX_PEM_BYTES} bytes",
            path.display()
        ));
    }
    Ok(buf)
}

fn digest_files(files: &Files) -> Result<[u8; 32], String> {
    let mut h = Sha256::new();
    for (path, what) in [(&files.cert, "TLS certificate"), (&files.key, "TLS key")] {
        let bytes = read(path, what)?;
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(&bytes[..]);
    }
    Ok(h.finalize().into())
}

fn load_pair(files: &Files) -> Result<Loaded, String> {
    let cert_pem = read(&files.cert, "TLS certificate")?;
    let key_pem = read(&files.key, "TLS key")?;
    let cert_path = files.cert.display();
    let key_path = files.key.display();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| format!("TLS certificate {cert_path}: not a valid PEM file"))?;
    if certs.is_empty() {
        return Err(format!(
            "TLS certificate {cert_path}: no CERTIFICATE block in it"
        ));
    }
    // The pem error's text may quote a line of the file: only say which file.
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
        format!("TLS key {key_path}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in it")
    })?;
    let signer = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)
        .map_err(|_| format!("TLS key {key_path}: not a usable RSA, ECDSA or Ed25519 key"))?;
    let certified = CertifiedKey::new(certs, signer);
    certified.keys_match().map_err(|_| {
        format!("TLS key {key_path} does not belong to the certificate in {cert_path}")
    })?;
    // Hash what was parsed: a file changing between the two reads is caught next time.
    let mut h = Sha256::new();
    for bytes in [&cert_pem, &key_pem] {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(&bytes[..]);
    }
    Ok(Loaded {
        key: Arc::new(certified),
        digest: h.finalize().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn files(dir: &Path) -> Files {
        Files {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }

    #[test]
    fn bad_files_are_refused_naming_the_file_and_never_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        let (cert, key) = pair("a.test");
        let (_, other_key) = pair("b.test");
        std::fs::write(&f.cert, &cert).unwrap();
        std::fs::write(
            &f.key,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleQ==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = Tls::load(f.clone()).unwrap_err();
        assert!(e.contains("tls.key"), "{e}");
        assert!(!e.contains("c2VjcmV0"), "{e}");

        std::fs::write(&f.key, &other_key).unwrap();
        let e = Tls::load(f.clone()).unwrap_err();
        assert!(e.contains("does not belong"), "{e}");

        std::fs::write(&f.key, &key).unwrap();
        std::fs::write(&f.cert, "not pem at all").unwrap();
        let e = Tls::load(f.clone()).unwrap_err();
        assert!(e.contains("tls.crt") && e.contains("no CERTIFICATE"), "{e}");

        std::fs::write(&f.cert, &cert).unwrap();
        let tls = Tls::load(f.clone()).unwrap();
        assert_eq!(tls.reload(), Ok(false), "same bytes: nothing to do");
        // A broken new pair keeps the old one.
        std::fs::write(&f.key, &other_key).unwrap();
        let before = tls.resolver.current.load().digest;
        assert!(tls.reload().is_err());
        assert_eq!(tls.resolver.current.load().digest, before);
    }
}
