//! A per-user credential cache on disk for the one-shot modes (docker credential helper,
//! kubelet credential provider), so repeated invocations do not repeat the cloud exchange.
//!
//! Opt-in with `REGBROKER_CACHE_DIR`. One file per (provider, scope) key, named by the
//! SHA-256 of the key: the scope names the identity (role, client id), never a volatile
//! access key id, so rotating session keys of one identity hit the same entry. The
//! directory is created with mode 0700 and files with 0600; every write goes to a temporary
//! file in the same directory and is renamed over the old one, so concurrent helper
//! processes never see a torn file (the last writer wins, and every version is valid).
//! Files hold secrets, like docker's own `config.json`; delete the directory to forget them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use regbroker_provider::{Credential, ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::broker::cache::{Entry, Key, Lifetime, Persist};

/// The env var that turns the disk cache on.
pub const ENV: &str = "REGBROKER_CACHE_DIR";

const VERSION: u32 = 1;

/// A directory of cached credentials.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct Record {
    version: u32,
    provider: String,
    scope: String,
    username: String,
    /// Zeroized on drop on every path, including records that are read and then ignored.
    secret: zeroize::Zeroizing<String>,
    expires_at: Option<u64>,
    refresh_at: u64,
    stale_at: u64,
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn time(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(s)
}

impl DiskCache {
    /// Opens (and creates, mode 0700) the cache directory.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<DiskCache> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = dir.into();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let mode = std::fs::metadata(&dir)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(DiskCache { dir })
    }

    fn path(&self, key: &Key) -> PathBuf {
        let mut h = Sha256::new();
        h.update(key.provider.as_bytes());
        h.update([0]);
        h.update(key.scope.as_bytes());
        let name: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.json"))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, key: &Key, entry: &Entry) -> std::io::Result<()> {
        let record = Record {
            version: VERSION,
            provider: key.provider.to_string(),
            scope: key.scope.clone(),
            username: entry.credential.username().to_string(),
            secret: zeroize::Zeroizing::new(entry.credential.secret().expose_secret().to_string()),
            expires_at: entry.credential.expires_at().map(secs),
            refresh_at: secs(entry.lifetime.refresh_at),
            stale_at: secs(entry.lifetime.stale_at),
        };
        let json =
            zeroize::Zeroizing::new(serde_json::to_vec(&record).map_err(std::io::Error::other)?);
        drop(record);
        // NamedTempFile creates the file with mode 0600.
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(&json)?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.path(key)).map_err(|e| e.error)?;
        Ok(())
    }

    fn read(&self, key: &Key) -> std::io::Result<Option<Entry>> {
        let bytes = match std::fs::read(self.path(key)) {
            Ok(b) => zeroize::Zeroizing::new(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut record: Record = serde_json::from_slice(&bytes).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {} column {}", e.line(), e.column()),
            )
        })?;
        // A hash collision, or a file from another version: ignore it.
        if record.version != VERSION || record.provider != key.provider || record.scope != key.scope
        {
            return Ok(None);
        }
        Ok(Some(Entry {
            credential: Credential::new(
                record.username,
                SecretString::from(std::mem::take(&mut *record.secret)),
                record.expires_at.map(time),
            ),
            lifetime: Lifetime {
                refresh_at: time(record.refresh_at),
                stale_at: time(record.stale_at),
            },
        }))
    }
}

impl Persist for DiskCache {
    fn load(&self, key: &Key) -> Option<Entry> {
        match self.read(key) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), provider = key.provider, error = %e, "Ignoring unreadable disk cache entry");
                None
            }
        }
    }

    fn store(&self, key: &Key, entry: &Entry) {
        if let Err(e) = self.write(key, entry) {
            tracing::warn!(dir = %self.dir.display(), provider = key.provider, error = %e, "Cannot write disk cache entry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn entry(secret: &str) -> Entry {
        let t = time(1_800_000_000);
        Entry {
            credential: Credential::new(
                "AWS",
                SecretString::from(secret.to_string()),
                Some(t + Duration::from_secs(3600)),
            ),
            lifetime: Lifetime {
                refresh_at: t + Duration::from_secs(2000),
                stale_at: t + Duration::from_secs(3000),
            },
        }
    }

    fn key(scope: &str) -> Key {
        Key {
            provider: "aws",
            scope: scope.into(),
        }
    }

    #[test]
    fn round_trip_with_private_modes() {
        let dir = tempfile::tempdir().unwrap();
        let cache_dir = dir.path().join("cache");
        let cache = DiskCache::open(&cache_dir).unwrap();
        cache.store(&key("role-a/us-east-1/123456789012"), &entry("pw-1"));
        let got = cache.load(&key("role-a/us-east-1/123456789012")).unwrap();
        assert_eq!(got.credential.secret().expose_secret(), "pw-1");
        assert_eq!(got.lifetime, entry("pw-1").lifetime);
        assert_eq!(
            got.credential.expires_at(),
            entry("x").credential.expires_at()
        );
        assert!(cache.load(&key("role-b/us-east-1/123456789012")).is_none());

        let dir_mode = std::fs::metadata(&cache_dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        for f in std::fs::read_dir(&cache_dir).unwrap() {
            let f = f.unwrap();
            assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
            // File names do not reveal the identity.
            assert!(!f.file_name().to_string_lossy().contains("role"));
        }
    }

    #[test]
    fn corrupt_or_foreign_files_read_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path()).unwrap();
        let k = key("s");
        std::fs::write(cache.path(&k), "{ torn").unwrap();
        assert!(cache.load(&k).is_none());
        // A record for another key under this key's name (as after a collision).
        cache.store(&key("other"), &entry("pw"));
        std::fs::rename(cache.path(&key("other")), cache.path(&k)).unwrap();
        assert!(cache.load(&k).is_none());
    }

    #[test]
    fn concurrent_writers_never_leave_a_torn_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = std::sync::Arc::new(DiskCache::open(dir.path()).unwrap());
        let k = key("shared");
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let cache = cache.clone();
                let k = k.clone();
                std::thread::spawn(move || {
                    for j in 0..50 {
                        cache.store(&k, &entry(&format!("pw-{i}-{j}")));
                        let got = cache.read(&k).expect("every version on disk parses");
                        assert!(got.is_some());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Only the final file remains: no temporary files left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn loose_directory_permissions_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("c");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        DiskCache::open(&d).unwrap();
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
