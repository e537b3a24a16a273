//! A per-user credential cache on disk for the one-shot modes (docker credential helper,
//! kubelet credential provider), so repeated invocations do not repeat the cloud exchange.
//!
//! Opt-in with `REGBROKER_CACHE_DIR`. One file per (provider, scope) key, named by the
//! SHA-256 of the key: the scope names the identity actually used (role, client id, and a
//! fingerprint of key ids, client emails, profiles and endpoint overrides; for a
//! workload's own identity its ServiceAccount's namespace, name and UID too), never a
//! secret, so two identities sharing the directory never read each other's entry. The
//! directory is created with mode 0700 and files with 0600; every write goes to a temporary
//! file in the same directory and is renamed over the old one, so concurrent helper
//! processes never see a torn file (the last writer wins, and every version is valid).
//! Files hold secrets, like docker's own `config.json`; delete the directory to forget them.
//!
//! Nothing in the directory is trusted that this user did not write:
//! - a directory owned by another user is refused (an error naming both uids), never
//!   re-moded or used. Refusing, rather than making a private `<dir>/<uid>` inside it, is
//!   deliberate: whoever owns the parent can pre-create, rename or replace that
//!   subdirectory at will, so it would need the same checks and still silently move the
//!   cache somewhere the user did not name; an error tells them to pick a directory of
//!   their own (e.g. under `$XDG_CACHE_HOME`).
//! - a record is opened with `O_NOFOLLOW | O_NONBLOCK` (a symlink fails to open, a FIFO
//!   does not block), then the opened handle is checked: a regular file, owned by this
//!   user, at most [`MAX_RECORD_BYTES`]. Anything else reads as "no entry" (with a
//!   warning), so the credential is fetched afresh and the next write replaces the file.
//! - so does a record holding what this code never writes, field by field: a time this
//!   system cannot represent or further ahead than a credential is believed to live
//!   ([`MAX_LIFETIME`], or the cache's `fallback_ttl` if longer), a refresh point after
//!   the stale point, an empty secret or one with a control character, an empty username
//!   or one with a control character or `:`. The warning names the field, never its
//!   value. A credential that would be refused when read back is not written.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use regbroker_provider::{Credential, ExposeSecret, MAX_LIFETIME, SecretString, SharedClock};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::broker::cache::{Entry, Key, Lifetime, Persist};

/// The env var that turns the disk cache on.
pub const ENV: &str = "REGBROKER_CACHE_DIR";

const VERSION: u32 = 1;

/// Largest record read; a record is a few hundred bytes (a long token, a few KiB).
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// How far a record's clock may be ahead of this one's (a record written just before the
/// clock stepped back) and its times still be believed.
const CLOCK_SLACK: Duration = Duration::from_secs(5 * 60);

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A directory of cached credentials.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    clock: SharedClock,
    /// The furthest ahead of now a record may say it is served (or its credential
    /// expires): see [`DiskCache::with_fallback_ttl`].
    horizon: Duration,
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

/// A record's times, checked.
struct Times {
    expires_at: Option<SystemTime>,
    lifetime: Lifetime,
}

impl Record {
    /// Checks every field the rest of the code relies on: what this code could not have
    /// written is invalid. The reason names the field and never quotes its value (the
    /// secret's least of all).
    fn check(&self, now: SystemTime, horizon: Duration) -> Result<Times, String> {
        // Past `latest` no record of ours can reach: the longest a credential is believed
        // to live, from now (or the fallback TTL of one without expiry, if longer).
        let latest = now.checked_add(horizon.saturating_add(CLOCK_SLACK));
        let at = |field: &str, s: u64| {
            let t = time(s).ok_or_else(|| format!("`{field}` is not a representable time"))?;
            match latest {
                Some(latest) if t > latest => Err(format!(
                    "`{field}` is more than {} ahead",
                    humantime::format_duration(horizon)
                )),
                _ => Ok(t),
            }
        };
        let refresh_at = at("refresh_at", self.refresh_at)?;
        let stale_at = at("stale_at", self.stale_at)?;
        let expires_at = self.expires_at.map(|s| at("expires_at", s)).transpose()?;
        if refresh_at > stale_at {
            return Err("`refresh_at` is after `stale_at`".into());
        }
        if self.secret.is_empty() {
            return Err("`secret` is empty".into());
        }
        if self.secret.chars().any(char::is_control) {
            return Err("`secret` contains a control character".into());
        }
        if self.username.is_empty() {
            return Err("`username` is empty".into());
        }
        // A `:` would split `username:password` (docker's `auth`, HTTP Basic) elsewhere.
        if self.username.chars().any(|c| c.is_control() || c == ':') {
            return Err("`username` contains a control character or `:`".into());
        }
        Ok(Times {
            expires_at,
            lifetime: Lifetime {
                refresh_at,
                stale_at,
            },
        })
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `s` seconds after the epoch, if this system can represent it.
fn time(s: u64) -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s))
}

impl DiskCache {
    /// Opens (and creates, mode 0700) the cache directory; times are read from `clock`.
    /// Refuses a directory owned by another user; tightens the mode of one's own to 0700.
    pub fn open(dir: impl Into<PathBuf>, clock: SharedClock) -> std::io::Result<DiskCache> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        let dir = dir.into();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let meta = std::fs::metadata(&dir)?;
        let me = euid();
        if meta.uid() != me {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "the directory is owned by uid {}, not by this user (uid {me}); \
                     refusing a cache another user controls",
                    meta.uid()
                ),
            ));
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(DiskCache {
            dir,
            clock,
            horizon: MAX_LIFETIME,
        })
    }

    /// Also believes records of credentials without expiry kept for `fallback_ttl` (the
    /// cache's setting), if that is longer than [`MAX_LIFETIME`]: a record whose times
    /// lie further ahead than both is invalid.
    pub fn with_fallback_ttl(mut self, fallback_ttl: Duration) -> DiskCache {
        self.horizon = MAX_LIFETIME.max(fallback_ttl);
        self
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
        // What would be refused when read back is not written.
        record
            .check(self.clock.now(), self.horizon)
            .map_err(|m| std::io::Error::new(std::io::ErrorKind::InvalidInput, m))?;
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
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        // No symlink is followed (ELOOP), and a FIFO opens without waiting for a writer.
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags.bits() as i32)
            .open(self.path(key))
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // The opened file itself, not the path (which may have changed since).
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(invalid("not a regular file".into()));
        }
        if meta.uid() != euid() {
            return Err(invalid(format!(
                "owned by uid {}, not by this user",
                meta.uid()
            )));
        }
        if meta.len() > MAX_RECORD_BYTES {
            return Err(invalid(format!("larger than {MAX_RECORD_BYTES} bytes")));
        }
        // Sized up front so the buffer holding the secret is not reallocated (and copied).
        let mut bytes = zeroize::Zeroizing::new(Vec::with_capacity(meta.len() as usize + 1));
        file.take(MAX_RECORD_BYTES + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(invalid(format!("larger than {MAX_RECORD_BYTES} bytes")));
        }
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
        let times = record
            .check(self.clock.now(), self.horizon)
            .map_err(invalid)?;
        Ok(Some(Entry {
            credential: Credential::new(
                std::mem::take(&mut record.username),
                SecretString::from(std::mem::take(&mut *record.secret)),
                times.expires_at,
            ),
            lifetime: times.lifetime,
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

    /// Now, for the tests: 2027-01-15T08:00:00Z.
    fn t0() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn clock() -> SharedClock {
        std::sync::Arc::new(regbroker_provider::ManualClock::new(t0()))
    }

    fn entry(secret: &str) -> Entry {
        let t = t0();
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
        let cache = DiskCache::open(&cache_dir, clock()).unwrap();
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
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
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
        let cache = std::sync::Arc::new(DiskCache::open(dir.path(), clock()).unwrap());
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

    /// Whether this process may give files away (root, as in CI): only then can a test
    /// build a directory or file "owned by another local user".
    fn can_chown() -> bool {
        rustix::process::geteuid().is_root()
    }

    const OTHER_UID: u32 = 65534; // nobody

    #[test]
    fn a_directory_owned_by_someone_else_is_refused_and_never_served() {
        use std::os::unix::fs::MetadataExt;
        if !can_chown() {
            // Unprivileged, a test cannot make a directory another user owns; "/" is one
            // (root's), so it stands in. (Before the fix this failed too, but on the chmod,
            // and only because the mode was loose; the test asserts the ownership error.)
            assert_ne!(
                std::fs::metadata("/").unwrap().uid(),
                rustix::process::geteuid().as_raw()
            );
            let err = DiskCache::open("/", clock()).unwrap_err().to_string();
            assert!(err.contains("owned by uid"), "{err}");
            return;
        }
        // Another user made the directory, world-writable, and planted a record.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("shared");
        let k = key("role-a/us-east-1/123456789012");
        DiskCache::open(&d, clock())
            .unwrap()
            .store(&k, &entry("attacker-chosen"));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        for f in std::fs::read_dir(&d).unwrap() {
            std::os::unix::fs::chown(f.unwrap().path(), Some(OTHER_UID), Some(OTHER_UID)).unwrap();
        }
        std::os::unix::fs::chown(&d, Some(OTHER_UID), Some(OTHER_UID)).unwrap();

        match DiskCache::open(&d, clock()) {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("owned by uid 65534"), "{e}");
                assert!(!e.contains("attacker-chosen"), "{e}");
            }
            Ok(cache) => panic!(
                "a foreign-owned cache directory was accepted; it serves {:?}",
                cache
                    .load(&k)
                    .map(|e| e.credential.secret().expose_secret().to_string())
            ),
        }
        // Someone else's directory is left as it was, not re-moded.
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o777
        );
    }

    #[test]
    fn a_record_file_owned_by_someone_else_is_ignored() {
        // Our own directory, but once world-writable: another user planted a file in it.
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        cache.store(&k, &entry("planted"));
        if can_chown() {
            std::os::unix::fs::chown(cache.path(&k), Some(OTHER_UID), Some(OTHER_UID)).unwrap();
            assert!(
                cache.load(&k).is_none(),
                "a record owned by uid 65534 was served"
            );
        } else {
            // Unprivileged, no file can be given away: only our own record exists, and it
            // is served.
            assert!(cache.load(&k).is_some());
        }
        // Our next write replaces the planted file, and is served.
        cache.store(&k, &entry("ours"));
        let got = cache.load(&k).unwrap();
        assert_eq!(got.credential.secret().expose_secret(), "ours");
    }

    #[test]
    fn a_symlink_planted_as_the_record_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = DiskCache::open(dir.path().join("elsewhere"), clock()).unwrap();
        let cache = DiskCache::open(dir.path().join("cache"), clock()).unwrap();
        let k = key("s");
        // A valid record for this very key, owned by us, reached only through a symlink.
        elsewhere.store(&k, &entry("via-symlink"));
        std::os::unix::fs::symlink(elsewhere.path(&k), cache.path(&k)).unwrap();
        assert!(
            cache.load(&k).is_none(),
            "the record was read through a symlink"
        );
        // A write replaces the link itself, never the file it points to.
        cache.store(&k, &entry("ours"));
        assert!(
            !std::fs::symlink_metadata(cache.path(&k))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            elsewhere
                .load(&k)
                .unwrap()
                .credential
                .secret()
                .expose_secret(),
            "via-symlink"
        );
    }

    #[test]
    fn a_fifo_planted_as_the_record_does_not_hang() {
        let dir = tempfile::tempdir().unwrap();
        let cache = std::sync::Arc::new(DiskCache::open(dir.path(), clock()).unwrap());
        let k = key("s");
        let fifo = cache.path(&k);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let (cache, k) = (cache.clone(), k.clone());
            std::thread::spawn(move || {
                let _ = tx.send(cache.load(&k).is_none());
            });
        }
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(ignored) => assert!(ignored),
            Err(_) => {
                // Release the blocked reader (opening the write end, then closing it),
                // so the test process does not keep a stuck thread.
                drop(std::fs::OpenOptions::new().write(true).open(&fifo));
                panic!("loading a FIFO planted as the record blocked for 5 s");
            }
        }
        cache.store(&k, &entry("ours"));
        assert_eq!(
            cache.load(&k).unwrap().credential.secret().expose_secret(),
            "ours"
        );
    }

    #[test]
    fn loose_directory_permissions_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("c");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        DiskCache::open(&d, clock()).unwrap();
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn a_directory_already_private_keeps_its_mode() {
        // Loose modes are tightened to 0700; a stricter one (read-only) is not loosened.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("c");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o500)).unwrap();
        DiskCache::open(&d, clock()).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(mode, 0o500);
    }

    #[test]
    fn a_missing_record_is_none_and_one_that_cannot_be_read_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        assert!(matches!(cache.read(&k), Ok(None)));
        std::os::unix::fs::symlink("/dev/null", cache.path(&k)).unwrap();
        assert!(
            cache.read(&k).is_err(),
            "a symlink is refused, not read as empty"
        );
    }

    #[test]
    fn a_record_of_another_format_version_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        cache.store(&k, &entry("pw"));
        let path = cache.path(&k);
        let text = std::fs::read_to_string(&path).unwrap();
        let other = text.replace(&format!("\"version\":{VERSION}"), "\"version\":99");
        assert_ne!(text, other, "the record names its version: {}", text.len());
        std::fs::write(&path, other).unwrap();
        assert!(matches!(cache.read(&k), Ok(None)));
    }

    #[test]
    fn a_record_of_64_kib_is_read_and_one_byte_more_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        // A long secret (an Entra ID token is a few KiB), then JSON whitespace to the size.
        cache.store(&k, &entry(&"t".repeat(40 * 1024)));
        let path = cache.path(&k);
        let record = std::fs::read_to_string(&path).unwrap();
        let limit = MAX_RECORD_BYTES as usize;
        assert_eq!(limit, 64 * 1024);
        std::fs::write(
            &path,
            format!("{record}{}", " ".repeat(limit - record.len())),
        )
        .unwrap();
        let got = cache.read(&k).unwrap().expect("a 64 KiB record is read");
        assert_eq!(got.credential.secret().expose_secret().len(), 40 * 1024);
        std::fs::write(
            &path,
            format!("{record}{}", " ".repeat(limit + 1 - record.len())),
        )
        .unwrap();
        let err = cache.read(&k).unwrap_err().to_string();
        assert!(err.contains("larger than 65536 bytes"), "{err}");
    }

    /// Runs this test binary's test `name` as the user `nobody` (with `setpriv`, from
    /// util-linux) and asserts that it passed.
    fn run_as_nobody(name: &str) {
        // A copy nobody may run: the build directory may sit under a private one.
        let bin_dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = bin_dir.path().join("tests");
        std::fs::copy(std::env::current_exe().unwrap(), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .args(["--exact", name, "--test-threads=1"])
            .env("TMPDIR", "/tmp")
            .output()
            .expect("setpriv (util-linux) runs this test as another user when root");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "as nobody: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn a_user_other_than_root_reads_back_its_own_records() {
        // CI runs as root, where every file is root's own; the owner check must also let
        // an ordinary user read what it wrote.
        if rustix::process::geteuid().is_root() {
            run_as_nobody(
                "oneshot::disk_cache::tests::a_user_other_than_root_reads_back_its_own_records",
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path().join("c"), clock()).unwrap();
        cache.store(&key("s"), &entry("pw"));
        let got = cache.read(&key("s")).unwrap().expect("its own record");
        assert_eq!(got.credential.secret().expose_secret(), "pw");
    }

    /// `valid` with `field` set to `value` (`None`: removed).
    fn edited(
        valid: &serde_json::Value,
        field: &str,
        value: Option<&serde_json::Value>,
    ) -> Vec<u8> {
        let mut record = valid.clone();
        match value {
            Some(v) => record[field] = v.clone(),
            None => drop(record.as_object_mut().unwrap().remove(field)),
        }
        serde_json::to_vec(&record).unwrap()
    }

    #[test]
    fn a_record_with_a_bad_field_is_ignored_never_a_panic() {
        use serde_json::{Value, json};
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        let secret = "the-secret-value";
        cache.store(&k, &entry(secret));
        let path = cache.path(&k);
        let valid: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let t = secs(t0());
        // One field at a time, edited by hand or corrupted, and the reason it is refused
        // (a parse error names only where it is: "line 1 column N").
        let cases: Vec<(&str, Option<Value>, &str)> = vec![
            // Before the fix, the first three aborted the process (an overflowing add).
            (
                "refresh_at",
                Some(json!(u64::MAX)),
                "`refresh_at` is not a representable time",
            ),
            (
                "stale_at",
                Some(json!(u64::MAX)),
                "`stale_at` is not a representable time",
            ),
            (
                "expires_at",
                Some(json!(u64::MAX)),
                "`expires_at` is not a representable time",
            ),
            // Representable, but no record of ours reaches that far: served for ever.
            (
                "stale_at",
                Some(json!(253_402_300_800u64)),
                "`stale_at` is more than 12h ahead",
            ),
            (
                "stale_at",
                Some(json!(t + 2 * 86_400)),
                "`stale_at` is more than 12h ahead",
            ),
            (
                "expires_at",
                Some(json!(t + 3650 * 86_400)),
                "`expires_at` is more than 12h ahead",
            ),
            (
                "refresh_at",
                Some(json!(t + 3001)),
                "`refresh_at` is after `stale_at`",
            ),
            ("secret", Some(json!("")), "`secret` is empty"),
            (
                "secret",
                Some(json!("tok\nen")),
                "`secret` contains a control character",
            ),
            (
                "secret",
                Some(json!("tok\u{0}en")),
                "`secret` contains a control character",
            ),
            ("username", Some(json!("")), "`username` is empty"),
            (
                "username",
                Some(json!("AW\u{1b}S")),
                "`username` contains a control character",
            ),
            (
                "username",
                Some(json!("AW\nS")),
                "`username` contains a control character",
            ),
            (
                "username",
                Some(json!("a:b")),
                "`username` contains a control character or `:`",
            ),
            // Wrong types and missing fields: serde refuses them.
            ("secret", Some(json!(5)), "line 1 column"),
            ("secret", None, "line 1 column"),
            ("refresh_at", Some(json!(-1)), "line 1 column"),
            ("refresh_at", Some(json!(1.5)), "line 1 column"),
            ("stale_at", Some(Value::Null), "line 1 column"),
            ("stale_at", None, "line 1 column"),
            ("expires_at", Some(json!("soon")), "line 1 column"),
            ("username", Some(json!(["AWS"])), "line 1 column"),
            ("version", Some(json!("1")), "line 1 column"),
            ("provider", Some(json!(7)), "line 1 column"),
        ];
        let mut wrong = Vec::new();
        for (field, value, reason) in &cases {
            std::fs::write(&path, edited(&valid, field, value.as_ref())).unwrap();
            let what = format!("{field} = {value:?}");
            let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                cache.read(&k).map(|e| e.is_some())
            }));
            match got {
                Ok(Err(e)) => {
                    let e = e.to_string();
                    assert!(
                        !e.contains("the-secret") && !e.contains("tok"),
                        "{what}: {e}"
                    );
                    if !e.contains(reason) {
                        wrong.push(format!("{what}: refused, but as {e:?}"));
                    }
                    assert!(cache.load(&k).is_none(), "{what}: served by load");
                }
                Ok(Ok(served)) => wrong.push(format!("{what}: accepted (served: {served})")),
                Err(_) => wrong.push(format!("{what}: panicked")),
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
        // The table edits one field at a time: the valid record itself is served.
        std::fs::write(&path, serde_json::to_vec(&valid).unwrap()).unwrap();
        assert!(cache.read(&k).unwrap().is_some());
    }

    #[test]
    fn a_credential_that_could_not_be_read_back_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        cache.store(&k, &entry(""));
        assert!(!cache.path(&k).exists(), "an empty secret was written");
        cache.store(&k, &entry("ours"));
        cache.store(&k, &entry("tok\r\nen"));
        let got = cache.load(&k).expect("the last valid record stays");
        assert_eq!(got.credential.secret().expose_secret(), "ours");
    }

    #[test]
    fn a_fallback_ttl_longer_than_12_hours_is_believed_when_configured() {
        // A credential without expiry is kept for `fallback_ttl`; configured to a day,
        // its record lies a day ahead, which only that setting makes plausible.
        let dir = tempfile::tempdir().unwrap();
        let k = key("s");
        let day = Duration::from_secs(86_400);
        let no_expiry = Entry {
            credential: Credential::new("AWS", SecretString::from("pw".to_string()), None),
            lifetime: Lifetime {
                refresh_at: t0() + day,
                stale_at: t0() + day,
            },
        };
        let cache = DiskCache::open(dir.path(), clock())
            .unwrap()
            .with_fallback_ttl(day);
        cache.store(&k, &no_expiry);
        assert_eq!(
            cache.read(&k).unwrap().unwrap().lifetime,
            no_expiry.lifetime
        );
        let default = DiskCache::open(dir.path(), clock()).unwrap();
        let err = default.read(&k).unwrap_err().to_string();
        assert!(err.contains("`refresh_at` is more than 12h ahead"), "{err}");
    }
}
