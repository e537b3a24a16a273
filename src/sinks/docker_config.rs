//! The docker config file sink: `serve --write-docker-config PATH` keeps a docker
//! `config.json` with `auths` for every registry that has a static entry or an exact
//! routing rule to a provider, plus any named with `--sink-registry`, fresh before each
//! credential goes stale. Tools that only read a docker config (helm, oras, crane) then
//! use short-lived credentials with no code change.
//!
//! Writes are atomic (a temporary file in the same directory renamed over the target) with
//! mode 0600, and happen only when the contents change. A registry whose fetch fails keeps
//! its previous entry until that entry's credential goes stale.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use regbroker_provider::Registry;
use zeroize::Zeroizing;

use super::status::{Kind, Pass};
use super::{Held, MIN_SLEEP, pass, registries, render, wait_for_next_pass};
use crate::broker::Broker;

/// The sink's name in readiness checks, metrics and `/v1/providers`.
pub const NAME: &str = "docker-config";

/// Sink settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The docker config file to keep.
    pub path: PathBuf,
    /// Registries to include besides static entries and exact provider rules.
    pub extra: Vec<Registry>,
}

/// Writes `contents` to `path` atomically with mode 0600.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(contents)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A docker config file kept fresh.
pub struct Sink {
    broker: Arc<Broker>,
    config: Config,
    held: BTreeMap<Registry, Held>,
    last: Zeroizing<String>,
    next: Duration,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("config", &self.config)
            .field("registries", &self.held.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Sink {
    /// Writes the file once (start-up); fails if it cannot be written.
    pub async fn start(broker: Arc<Broker>, config: Config) -> std::io::Result<Sink> {
        let mut held = BTreeMap::new();
        broker.metrics().sink_registered(NAME, Kind::DockerConfig);
        let wanted = registries(&broker, &config.extra);
        let b = &broker;
        let passed = pass(b, &wanted, &mut held, &|r| {
            Box::pin(async move { b.fresh_credential(&r).await })
        })
        .await;
        let next = passed.next;
        let last = render(&held);
        write_atomic(&config.path, last.as_bytes())?;
        tracing::info!(path = %config.path.display(), registries = held.len(), "Wrote docker config");
        broker.metrics().sink_write(Kind::DockerConfig.as_str());
        record(&broker, passed, None);
        Ok(Sink {
            broker,
            config,
            held,
            last,
            next,
        })
    }

    /// One pass now: fetch every registry (from the cache where fresh) and rewrite the
    /// file if its contents changed. The run loop calls this at each refresh point.
    pub async fn refresh(&mut self) {
        let broker = &self.broker;
        let wanted = registries(broker, &self.config.extra);
        let passed = pass(broker, &wanted, &mut self.held, &|r| {
            Box::pin(async move { broker.fresh_credential(&r).await })
        })
        .await;
        self.next = passed.next;
        let contents = render(&self.held);
        let mut write_error = None;
        if *contents != *self.last {
            match write_atomic(&self.config.path, contents.as_bytes()) {
                Ok(()) => {
                    tracing::info!(path = %self.config.path.display(), registries = self.held.len(), "Wrote docker config");
                    broker.metrics().sink_write(Kind::DockerConfig.as_str());
                    self.last = contents;
                }
                Err(e) => {
                    tracing::warn!(path = %self.config.path.display(), error = %e, "Cannot write docker config; retrying");
                    self.next = MIN_SLEEP;
                    write_error = Some("write_failed");
                }
            }
        }
        record(&self.broker, passed, write_error);
    }

    /// When the next pass is due.
    pub fn next_pass_in(&self) -> Duration {
        self.next
    }

    /// Keeps the file fresh until the task is dropped.
    pub async fn run(mut self) {
        loop {
            wait_for_next_pass(&self.broker, self.next).await;
            self.refresh().await;
        }
    }
}

/// Records a pass of the file sink.
fn record(broker: &Broker, passed: super::Passed, write_error: Option<&'static str>) {
    let pass = Pass::Ran {
        registries: passed.fetched,
        write_error,
        expiries: passed.expiries,
    };
    broker
        .metrics()
        .sink_pass(NAME, Kind::DockerConfig, pass, broker.now());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_written_through_a_temporary_file_beside_it() {
        // Renamed into place, the temporary file must be on the target's filesystem: made
        // in the working directory instead, the rename would fail across filesystems.
        // /dev/shm (tmpfs) is on another filesystem than the working directory here.
        use std::os::unix::fs::MetadataExt as _;
        let cwd = std::fs::metadata(".").unwrap().dev();
        let shm = std::fs::metadata("/dev/shm")
            .expect("/dev/shm (a tmpfs) for a filesystem other than the working directory's");
        assert_ne!(
            shm.dev(),
            cwd,
            "/dev/shm shares the working directory's filesystem"
        );
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("config.json");
        write_atomic(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
