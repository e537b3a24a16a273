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
//!
//! The directory is cleaned as it is used, a bounded amount each time. After each write
//! (which follows an upstream fetch) a sweep lists the directory's names and examines at
//! most [`SWEEP_SAMPLE`] files chosen at random among those named like ours (a record:
//! 64 hex digits and `.json`; a writer's temporary file: `.tmp` and 6 letters or
//! digits). It deletes a record past its stale point (never served again), and a
//! temporary file or a record that can never be served (corrupt, another format
//! version's, under a name not its key's) once older than [`ABANDONED_AFTER`]. Then, if
//! more than [`MAX_RECORDS`] records remain, it deletes the oldest by modification time
//! until that many do. It deletes only regular files this user owns, looked at with
//! `lstat` (a symlink is neither followed nor deleted), and only if the name still
//! names the file it examined (a record another process has just rewritten is kept).
//! Sampling rather than reading every record keeps a write's cost flat however many
//! records pile up: with `n` files, each expired one is gone after about `n / 16` writes.

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

/// Most files one sweep examines (reads, and deletes if due): the work a write adds is
/// bounded whatever the directory holds, beyond listing its names.
pub const SWEEP_SAMPLE: usize = 16;

/// Most records the directory keeps: past this, a sweep deletes the oldest (by
/// modification time) until it holds this many. One record is one identity's credential
/// for one provider scope: a kubelet with per-workload identity writes one per
/// ServiceAccount and cloud identity, and 4096 is far more than one node pulls images
/// with within a credential's life (at most 12 hours); a record is about 1 KiB to a few.
pub const MAX_RECORDS: usize = 4096;

/// How old a file must be before a sweep deletes it as abandoned: a temporary file (its
/// writer crashed, or still writes if younger) or a record that can never be served (a
/// corrupt one, another format version's, one under a name not its key's).
pub const ABANDONED_AFTER: Duration = Duration::from_secs(10 * 60);

/// The name of a temporary file is this prefix and [`TMP_RANDOM_CHARS`] random letters
/// and digits (what the writer asks `tempfile` for, so the sweep knows it).
const TMP_PREFIX: &str = ".tmp";
const TMP_RANDOM_CHARS: usize = 6;

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
    /// See [`DiskCache::with_refetch_interval`].
    refetch_interval: Duration,
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

/// The file name of the record for (`provider`, `scope`): 64 hex digits and `.json`.
fn file_name(provider: &str, scope: &str) -> String {
    let mut h = Sha256::new();
    h.update(provider.as_bytes());
    h.update([0]);
    h.update(scope.as_bytes());
    let name: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("{name}.json")
}

/// The files of the directory a sweep may delete, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A record: 64 lowercase hex digits and `.json`.
    Record,
    /// A writer's temporary file: `.tmp` and 6 letters or digits.
    Temp,
}

fn kind(name: &std::ffi::OsStr) -> Option<Kind> {
    let name = name.to_str()?;
    if let Some(hash) = name.strip_suffix(".json")
        && hash.len() == 64
        && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Some(Kind::Record);
    }
    if let Some(random) = name.strip_prefix(TMP_PREFIX)
        && random.len() == TMP_RANDOM_CHARS
        && random.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Some(Kind::Temp);
    }
    None
}

/// A new temporary file in `dir`, mode 0600, named as [`kind`] recognises.
fn temp_file(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .rand_bytes(TMP_RANDOM_CHARS)
        .tempfile_in(dir)
}

/// What one sweep deleted.
#[derive(Debug, Default, PartialEq, Eq)]
struct Swept {
    /// Records past their stale point.
    expired: usize,
    /// Temporary files and unservable records older than [`ABANDONED_AFTER`].
    abandoned: usize,
    /// The oldest records, beyond [`MAX_RECORDS`].
    evicted: usize,
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
            refetch_interval: Duration::from_secs(30),
        })
    }

    /// Forgets a record on a client's report (`erase`) only once it is at least
    /// `interval` old (the cache's `refetch_interval`): a client that keeps reporting
    /// cannot drive a fetch per invocation.
    pub fn with_refetch_interval(mut self, interval: Duration) -> DiskCache {
        self.refetch_interval = interval;
        self
    }

    /// Also believes records of credentials without expiry kept for `fallback_ttl` (the
    /// cache's setting), if that is longer than [`MAX_LIFETIME`]: a record whose times
    /// lie further ahead than both is invalid.
    pub fn with_fallback_ttl(mut self, fallback_ttl: Duration) -> DiskCache {
        self.horizon = MAX_LIFETIME.max(fallback_ttl);
        self
    }

    fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(file_name(key.provider, &key.scope))
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
        // Created with mode 0600, under a name the sweep recognises.
        let mut tmp = temp_file(&self.dir)?;
        tmp.write_all(&json)?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.path(key)).map_err(|e| e.error)?;
        Ok(())
    }

    fn read(&self, key: &Key) -> std::io::Result<Option<Entry>> {
        let Some((mut record, _)) = read_record(&self.path(key))? else {
            return Ok(None);
        };
        // A hash collision, or a file from another version: ignore it.
        if record.version != VERSION || record.provider != key.provider || record.scope != key.scope
        {
            return Ok(None);
        }
        let times = record
            .check(self.clock.now(), self.horizon)
            .map_err(|m| std::io::Error::new(std::io::ErrorKind::InvalidData, m))?;
        Ok(Some(Entry {
            credential: Credential::new(
                std::mem::take(&mut record.username),
                SecretString::from(std::mem::take(&mut *record.secret)),
                times.expires_at,
            ),
            lifetime: times.lifetime,
        }))
    }

    /// Deletes what will never be served again, examining at most [`SWEEP_SAMPLE`] files
    /// chosen at random among those named like ours, then the oldest records beyond
    /// [`MAX_RECORDS`]. Only regular files this user owns are deleted; a symlink is
    /// never followed nor removed, and names not like ours are never touched.
    fn sweep(&self) -> std::io::Result<Swept> {
        let now = self.clock.now();
        let mut names: Vec<(std::ffi::OsString, Kind)> = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let name = e?.file_name();
            if let Some(kind) = kind(&name) {
                names.push((name, kind));
            }
        }
        // The first `sample` names, after a partial Fisher-Yates shuffle, are a uniform
        // random sample.
        let n = names.len();
        let sample = n.min(SWEEP_SAMPLE);
        for i in 0..sample {
            names.swap(i, fastrand::usize(i..n));
        }
        let mut swept = Swept::default();
        let mut records = Vec::with_capacity(names.len());
        for (i, (name, kind)) in names.into_iter().enumerate() {
            if i >= sample {
                if kind == Kind::Record {
                    records.push(name);
                }
                continue;
            }
            match self.examine(&name, kind, now) {
                Ok(Some(Verdict::Expired)) => swept.expired += 1,
                Ok(Some(Verdict::Abandoned)) => swept.abandoned += 1,
                Ok(None) if kind == Kind::Record => records.push(name),
                Ok(None) => {}
                // Removed meanwhile (by another process's sweep), or unreadable: it is
                // left for a later sweep.
                Err(e) => {
                    tracing::debug!(dir = %self.dir.display(), error = %e, "Cannot sweep disk cache file");
                    if kind == Kind::Record {
                        records.push(name);
                    }
                }
            }
        }
        if records.len() > MAX_RECORDS {
            swept.evicted = self.evict_oldest(records);
        }
        Ok(swept)
    }

    /// Whether the file `name` is to be deleted now, and why; deletes it if so.
    fn examine(
        &self,
        name: &std::ffi::OsStr,
        kind: Kind,
        now: SystemTime,
    ) -> std::io::Result<Option<Verdict>> {
        let path = self.dir.join(name);
        // lstat: a symlink is looked at as itself, never followed.
        let meta = std::fs::symlink_metadata(&path)?;
        if !own_regular_file(&meta) {
            return Ok(None);
        }
        let abandoned = now
            .duration_since(meta.modified()?)
            .is_ok_and(|age| age >= ABANDONED_AFTER);
        let verdict = match kind {
            Kind::Temp => abandoned.then_some(Verdict::Abandoned),
            Kind::Record => match self.servable_until(&path, name, now) {
                // Another file than the one looked at: a writer replaced it meanwhile.
                Ok(Some((_, opened))) if !same_file(&opened, &meta) => None,
                Ok(Some((stale_at, _))) if stale_at <= now => Some(Verdict::Expired),
                Ok(Some(_)) => None,
                Ok(None) | Err(_) => abandoned.then_some(Verdict::Abandoned),
            },
        };
        if verdict.is_some() && !remove_if_same(&path, &meta)? {
            return Ok(None);
        }
        Ok(verdict)
    }

    /// The stale point of the record at `path` (and the opened file's metadata), if it
    /// could ever be served: this version's, valid, under its own key's name.
    fn servable_until(
        &self,
        path: &Path,
        name: &std::ffi::OsStr,
        now: SystemTime,
    ) -> std::io::Result<Option<(SystemTime, std::fs::Metadata)>> {
        let Some((record, meta)) = read_record(path)? else {
            return Ok(None);
        };
        if record.version != VERSION || *name != *file_name(&record.provider, &record.scope) {
            return Ok(None);
        }
        Ok(record
            .check(now, self.horizon)
            .ok()
            .map(|t| (t.lifetime.stale_at, meta)))
    }

    /// Deletes the oldest of `records` (names) until [`MAX_RECORDS`] remain, counting
    /// only regular files this user owns (the others are never deleted); returns how many
    /// it deleted.
    fn evict_oldest(&self, records: Vec<std::ffi::OsString>) -> usize {
        let mut owned: Vec<_> = records
            .into_iter()
            .filter_map(|name| {
                let path = self.dir.join(name);
                let meta = std::fs::symlink_metadata(&path).ok()?;
                let modified = meta.modified().ok()?;
                own_regular_file(&meta).then_some((modified, path, meta))
            })
            .collect();
        let excess = owned.len().saturating_sub(MAX_RECORDS);
        if excess == 0 {
            return 0;
        }
        owned.sort_by_key(|(modified, ..)| *modified);
        owned
            .iter()
            .take(excess)
            .filter(|(_, path, meta)| remove_if_same(path, meta).unwrap_or(false))
            .count()
    }
}

/// Why a sweep deleted a file.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Expired,
    Abandoned,
}

fn own_regular_file(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.file_type().is_file() && meta.uid() == euid()
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Deletes `path` if it is still the file `meta` describes (not replaced by a writer
/// since); `Ok(false)` if it was replaced or is gone.
fn remove_if_same(path: &Path, meta: &std::fs::Metadata) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(now) if same_file(&now, meta) => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads the record file at `path`, `Ok(None)` if there is none. It is opened with
/// `O_NOFOLLOW | O_NONBLOCK` (a symlink fails to open, a FIFO does not block), then the
/// opened handle must be a regular file this user owns, at most [`MAX_RECORD_BYTES`].
fn read_record(path: &Path) -> std::io::Result<Option<(Record, std::fs::Metadata)>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    // No symlink is followed (ELOOP), and a FIFO opens without waiting for a writer.
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
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
    (&file).take(MAX_RECORD_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(invalid(format!("larger than {MAX_RECORD_BYTES} bytes")));
    }
    let record = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(format!("line {} column {}", e.line(), e.column())))?;
    Ok(Some((record, meta)))
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

    /// Removes the record (a client reported the credential refused), unless it is not
    /// this user's own regular file, or it was written less than `refetch_interval` ago.
    fn forget(&self, key: &Key) {
        use std::os::unix::fs::MetadataExt;
        let path = self.path(key);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            return;
        };
        if !meta.is_file() || meta.uid() != euid() {
            return;
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|m| self.clock.now().duration_since(m).ok())
            .unwrap_or(Duration::ZERO);
        if age < self.refetch_interval {
            tracing::info!(
                provider = key.provider,
                age_secs = age.as_secs(),
                "Keeping the disk cache entry: fetched less than refetch_interval ago"
            );
            return;
        }
        if let Err(e) = remove_if_same(&path, &meta) {
            tracing::warn!(dir = %self.dir.display(), provider = key.provider, error = %e, "Cannot remove disk cache entry");
        }
    }

    fn store(&self, key: &Key, entry: &Entry) {
        if let Err(e) = self.write(key, entry) {
            tracing::warn!(dir = %self.dir.display(), provider = key.provider, error = %e, "Cannot write disk cache entry");
            return;
        }
        match self.sweep() {
            Ok(s) if s == Swept::default() => {}
            Ok(s) => {
                tracing::debug!(dir = %self.dir.display(), expired = s.expired, abandoned = s.abandoned, evicted = s.evicted, "Swept disk cache")
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "Cannot sweep disk cache")
            }
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
    fn forget_removes_its_own_record_and_never_another_users() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock())
            .unwrap()
            .with_refetch_interval(Duration::ZERO);
        let k = key("s");
        cache.store(&k, &entry("pw"));
        cache.forget(&k);
        assert!(!cache.path(&k).exists(), "its own record is forgotten");
        cache.store(&k, &entry("pw"));
        if can_chown() {
            std::os::unix::fs::chown(cache.path(&k), Some(OTHER_UID), None).unwrap();
            cache.forget(&k);
            assert!(cache.path(&k).exists(), "another user's record is left");
        }
    }

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

    /// Whether every directory from `/` down to `dir` lets others (`nobody`) through.
    fn others_may_traverse(dir: &Path) -> bool {
        let Ok(dir) = dir.canonicalize() else {
            return false;
        };
        dir.ancestors().all(|d| {
            std::fs::metadata(d).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0)
        })
    }

    /// Runs this test binary's test `name` as the user `nobody` (with `setpriv`, from
    /// util-linux) and asserts that it passed within a minute.
    ///
    /// The child gets a directory of its own: a copy of the binary in a directory under
    /// the first of `$TMPDIR`, `/tmp`, `/var/tmp` and `/dev/shm` that `nobody` can reach
    /// (the build directory, or a `/tmp` of mode 0700, may be private), and as its
    /// `TMPDIR` a subdirectory it owns, so it never depends on a shared, world-writable
    /// `/tmp`. Its output goes to files there, read once it ends (no pipe to fill).
    fn run_as_nobody(name: &str) {
        const DEADLINE: Duration = Duration::from_secs(60);
        let candidates = [
            std::env::temp_dir(),
            "/tmp".into(),
            "/var/tmp".into(),
            "/dev/shm".into(),
        ];
        let base = candidates
            .iter()
            .find(|d| others_may_traverse(d))
            .unwrap_or_else(|| panic!("none of {candidates:?} lets uid {OTHER_UID} through"));
        let dir = tempfile::tempdir_in(base).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("tests");
        std::fs::copy(std::env::current_exe().unwrap(), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&tmp, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
        let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let mut child = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .args(["--exact", name, "--test-threads=1"])
            .env("TMPDIR", &tmp)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("setpriv (util-linux) runs this test as another user when root");
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = format!(
            "{}{}",
            std::fs::read_to_string(&stdout).unwrap_or_default(),
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        match status {
            None => panic!("as nobody: no result within {DEADLINE:?}, killed; output:\n{output}"),
            Some(status) => assert!(
                status.success() && output.contains("1 passed"),
                "as nobody: {status}; output:\n{output}"
            ),
        }
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
    fn a_record_within_five_minutes_past_the_horizon_is_believed() {
        // A record written just before this clock stepped back by up to five minutes.
        use serde_json::json;
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        cache.store(&k, &entry("pw"));
        let path = cache.path(&k);
        let valid: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        // 4 minutes past, and exactly the 5 minutes.
        for past in [4 * 60, 5 * 60] {
            let ahead = secs(t0()) + 12 * 3600 + past;
            std::fs::write(&path, edited(&valid, "expires_at", Some(&json!(ahead)))).unwrap();
            let got = cache.read(&k).unwrap().expect("within the slack: read");
            assert_eq!(got.credential.expires_at(), time(ahead));
        }
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
            // Past the 12 h horizon plus the five minutes' slack for a clock step.
            (
                "expires_at",
                Some(json!(t + 12 * 3600 + 6 * 60)),
                "`expires_at` is more than 12h ahead",
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

    /// The sweep compares modification times, set by the file system's clock, with the
    /// injected one: these tests stand the injected clock at the file system's now.
    fn fs_clock(dir: &Path) -> (SharedClock, SystemTime) {
        let probe = dir.join("probe");
        std::fs::write(&probe, "").unwrap();
        let now = std::fs::metadata(&probe).unwrap().modified().unwrap();
        std::fs::remove_file(&probe).unwrap();
        (
            std::sync::Arc::new(regbroker_provider::ManualClock::new(now)),
            now,
        )
    }

    /// A credential fetched at `fetched`, servable for 50 minutes.
    fn entry_at(fetched: SystemTime) -> Entry {
        Entry {
            credential: Credential::new(
                "AWS",
                SecretString::from("pw".to_string()),
                Some(fetched + Duration::from_secs(3600)),
            ),
            lifetime: Lifetime {
                refresh_at: fetched + Duration::from_secs(2000),
                stale_at: fetched + Duration::from_secs(3000),
            },
        }
    }

    /// Writes the record of `entry` for `k` as `write` would (without its fsync, and
    /// without a sweep), last modified at `modified`.
    fn plant(cache: &DiskCache, k: &Key, entry: &Entry, modified: SystemTime) -> PathBuf {
        let record = Record {
            version: VERSION,
            provider: k.provider.to_string(),
            scope: k.scope.clone(),
            username: entry.credential.username().to_string(),
            secret: zeroize::Zeroizing::new("pw".to_string()),
            expires_at: entry.credential.expires_at().map(secs),
            refresh_at: secs(entry.lifetime.refresh_at),
            stale_at: secs(entry.lifetime.stale_at),
        };
        let path = cache.path(k);
        std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
        touch(&path, modified);
        path
    }

    /// Sets the modification time of `path` itself (a symlink's own, not its target's).
    fn touch(path: &Path, modified: SystemTime) {
        let d = modified.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        let t = rustix::fs::Timespec {
            tv_sec: d.as_secs() as _,
            tv_nsec: d.subsec_nanos() as _,
        };
        let times = rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            path,
            &times,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }

    fn names_in(dir: &Path) -> std::collections::BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }

    const HOUR: Duration = Duration::from_secs(3600);
    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn expired_records_are_removed_as_the_cache_is_used_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (clock, now) = fs_clock(dir.path());
        let cache = DiskCache::open(dir.path(), clock).unwrap();
        // Fewer files than one sweep examines: one store looks at every one.
        let mut expired = Vec::new();
        for i in 0..5 {
            // Fetched two hours ago: stale 50 minutes after that.
            let k = key(&format!("gone-{i}"));
            expired.push(plant(&cache, &k, &entry_at(now - 2 * HOUR), now - 2 * HOUR));
        }
        for i in 0..5 {
            plant(
                &cache,
                &key(&format!("live-{i}")),
                &entry_at(now - MINUTE),
                now - MINUTE,
            );
        }
        // Stale exactly now: never served again.
        let edge = plant(
            &cache,
            &key("edge"),
            &entry_at(now - 3000 * Duration::from_secs(1)),
            now - HOUR,
        );
        cache.store(&key("new"), &entry_at(now));
        for p in expired.iter().chain([&edge]) {
            assert!(!p.exists(), "an expired record was kept");
        }
        for i in 0..5 {
            assert!(cache.load(&key(&format!("live-{i}"))).is_some(), "live-{i}");
        }
        assert!(cache.load(&key("new")).is_some());
        assert_eq!(names_in(dir.path()).len(), 6);
    }

    #[test]
    fn a_file_replaced_or_removed_since_it_was_examined_is_not_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        std::fs::write(&path, "examined").unwrap();
        let examined = std::fs::symlink_metadata(&path).unwrap();
        // A writer renamed a new version over it meanwhile: that one stays.
        let newer = dir.path().join(".tmpAbC123");
        std::fs::write(&newer, "written since").unwrap();
        std::fs::rename(&newer, &path).unwrap();
        assert!(!remove_if_same(&path, &examined).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "written since");
        // The very file examined is deleted.
        let current = std::fs::symlink_metadata(&path).unwrap();
        assert!(remove_if_same(&path, &current).unwrap());
        assert!(!path.exists());
        // Gone meanwhile (another sweep): nothing to do, not an error.
        assert!(!remove_if_same(&path, &current).unwrap());
        // Any other failure to look is an error.
        let under_a_file = dir.path().join("f");
        std::fs::write(&under_a_file, "").unwrap();
        assert!(remove_if_same(&under_a_file.join("x"), &current).is_err());
    }

    #[test]
    fn an_empty_record_file_is_invalid_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), clock()).unwrap();
        let k = key("s");
        std::fs::write(cache.path(&k), "").unwrap();
        let e = cache.read(&k).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        assert!(cache.load(&k).is_none());
    }

    #[test]
    fn a_sweep_counts_what_it_deleted_and_why() {
        // The counts feed the "Swept disk cache" log line.
        let dir = tempfile::tempdir().unwrap();
        let (clock, now) = fs_clock(dir.path());
        let cache = DiskCache::open(dir.path(), clock).unwrap();
        for i in 0..3 {
            let k = key(&format!("gone-{i}"));
            plant(&cache, &k, &entry_at(now - 2 * HOUR), now - 2 * HOUR);
        }
        plant(&cache, &key("live"), &entry_at(now - MINUTE), now - MINUTE);
        for name in [".tmpAbC123", ".tmpDeF456"] {
            let p = dir.path().join(name);
            std::fs::write(&p, "{").unwrap();
            touch(&p, now - HOUR);
        }
        assert_eq!(
            cache.sweep().unwrap(),
            Swept {
                expired: 3,
                abandoned: 2,
                evicted: 0
            }
        );
        assert_eq!(names_in(dir.path()).len(), 1);
        assert_eq!(
            cache.sweep().unwrap(),
            Swept::default(),
            "nothing left to do"
        );
    }

    #[test]
    fn one_store_removes_at_most_a_sample_and_repeated_stores_remove_all() {
        let dir = tempfile::tempdir().unwrap();
        let (clock, now) = fs_clock(dir.path());
        let cache = DiskCache::open(dir.path(), clock).unwrap();
        for i in 0..200 {
            plant(
                &cache,
                &key(&format!("gone-{i}")),
                &entry_at(now - 2 * HOUR),
                now - 2 * HOUR,
            );
        }
        let mut left = 200;
        let mut stores = 0;
        while left > 0 {
            cache.store(&key("live"), &entry_at(now));
            stores += 1;
            let now_left = names_in(dir.path()).len() - 1;
            let removed = left - now_left;
            assert!(removed <= SWEEP_SAMPLE, "store {stores} removed {removed}");
            // Among 17 files or more, a sample of 16 holds at least 15 expired ones.
            assert!(
                removed >= SWEEP_SAMPLE.min(left) - 1,
                "store {stores} removed {removed}"
            );
            left = now_left;
            assert!(
                stores <= 20,
                "{left} expired records left after {stores} stores"
            );
        }
        assert!(stores >= 200 / SWEEP_SAMPLE, "{stores}");
        assert!(cache.load(&key("live")).is_some());
    }

    #[test]
    fn the_directory_keeps_at_most_max_records_evicting_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let (clock, now) = fs_clock(dir.path());
        let cache = DiskCache::open(dir.path(), clock).unwrap();
        // All live; record `i` was last written `i + 1` seconds ago.
        let planted = MAX_RECORDS + 10;
        let paths: Vec<PathBuf> = (0..planted)
            .map(|i| {
                let at = now - Duration::from_secs(i as u64 + 1);
                plant(&cache, &key(&format!("r-{i}")), &entry_at(now - MINUTE), at)
            })
            .collect();
        cache.store(&key("new"), &entry_at(now));
        assert_eq!(names_in(dir.path()).len(), MAX_RECORDS);
        assert!(
            cache.load(&key("new")).is_some(),
            "the newest record was evicted"
        );
        // 4107 records: the 11 oldest went.
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(p.exists(), i < MAX_RECORDS - 1, "record {i}");
        }
    }

    #[test]
    fn files_not_ours_to_delete_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (clock, now) = fs_clock(dir.path());
        let cache = DiskCache::open(dir.path().join("c"), clock.clone()).unwrap();
        let elsewhere = DiskCache::open(dir.path().join("elsewhere"), clock).unwrap();
        let long_ago = now - 2 * HOUR;
        // An expired record elsewhere, linked under a record's name and a temp file's.
        let target = plant(&elsewhere, &key("linked"), &entry_at(long_ago), long_ago);
        std::os::unix::fs::symlink(&target, cache.path(&key("linked"))).unwrap();
        std::os::unix::fs::symlink(&target, cache.dir().join(".tmpAbC123")).unwrap();
        // A directory named like a record; names that are not ours. All old, unreadable
        // as records: ours, they would be abandoned.
        std::fs::create_dir(cache.path(&key("a-directory"))).unwrap();
        for p in [
            cache.path(&key("linked")),
            cache.dir().join(".tmpAbC123"),
            cache.path(&key("a-directory")),
        ] {
            touch(&p, long_ago);
        }
        for name in [
            "notes.txt",
            ".tmpAbC12",
            ".tmpAbC1234",
            "ABCDEF.json",
            ".tmp-other",
        ] {
            std::fs::write(cache.dir().join(name), "{ torn").unwrap();
            touch(&cache.dir().join(name), long_ago);
        }
        let mut expected = names_in(cache.dir());
        // An expired record another user owns (planted while the directory was loose).
        let foreign = plant(&cache, &key("foreign"), &entry_at(long_ago), long_ago);
        if can_chown() {
            std::os::unix::fs::chown(&foreign, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
            expected.insert(foreign.file_name().unwrap().to_str().unwrap().into());
        }
        let new = cache.path(&key("new"));
        expected.insert(new.file_name().unwrap().to_str().unwrap().into());
        // Fewer than a sample: each store examines every file.
        for _ in 0..3 {
            cache.store(&key("new"), &entry_at(now));
        }
        assert_eq!(names_in(cache.dir()), expected);
        assert!(target.exists(), "a symlink's target was deleted");
        assert!(
            std::fs::symlink_metadata(cache.path(&key("linked")))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn abandoned_temporary_files_and_unservable_records_are_removed_and_fresh_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (clock, now) = fs_clock(dir.path());
        let cache = DiskCache::open(dir.path(), clock).unwrap();
        // The book's 10 minutes (docs/src/protocols.md), as numbers: 11 minutes old is abandoned, 9 is not.
        let old = now - 11 * MINUTE;
        let recent = now - 9 * MINUTE;
        let file = |name: &str, text: &str, modified| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            touch(&p, modified);
            p
        };
        // Crashed writers' temporary files.
        let old_tmp = file(".tmpAbC123", "{\"version\"", old);
        let fresh_tmp = file(".tmpXyZ789", "{\"version\"", recent);
        // Records that can never be served: torn, and a live record under another name.
        let old_torn = file(&file_name("aws", "torn-old"), "{ torn", old);
        let fresh_torn = file(&file_name("aws", "torn-fresh"), "{ torn", recent);
        let live = plant(&cache, &key("moved"), &entry_at(now), old);
        let moved = cache.path(&key("moved-here"));
        std::fs::rename(&live, &moved).unwrap();
        // Another format version's record.
        let other_version = plant(&cache, &key("v2"), &entry_at(now), old);
        let text = std::fs::read_to_string(&other_version).unwrap();
        std::fs::write(
            &other_version,
            text.replace("\"version\":1", "\"version\":2"),
        )
        .unwrap();
        touch(&other_version, old);
        cache.store(&key("new"), &entry_at(now));
        for p in [&old_tmp, &old_torn, &moved, &other_version] {
            assert!(!p.exists(), "{} was kept", p.display());
        }
        for p in [&fresh_tmp, &fresh_torn] {
            assert!(p.exists(), "{} was deleted", p.display());
        }
    }

    #[test]
    fn the_writers_temporary_files_have_names_the_sweep_recognises() {
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..20 {
            let tmp = temp_file(dir.path()).unwrap();
            assert_eq!(
                kind(tmp.path().file_name().unwrap()),
                Some(Kind::Temp),
                "{}",
                tmp.path().display()
            );
        }
        assert_eq!(
            kind(std::ffi::OsStr::new(&file_name("aws", "s"))),
            Some(Kind::Record)
        );
    }
}
