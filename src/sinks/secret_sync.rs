//! Kubernetes Secret sync: `serve --sync-secret NAMESPACE/NAME` keeps a
//! `kubernetes.io/dockerconfigjson` Secret with fresh credentials, so consumers that only
//! read a Secret (a Flux `HelmRepository` of type `oci` or an `OCIRepository` with
//! `secretRef`, Kubeapps, `imagePullSecrets`) work unmodified.
//!
//! The registries and the refresh schedule are the sinks' ([`super`]):
//! every registry with a static entry or an exact provider rule, plus `--sink-registry`,
//! rewritten before each credential's refresh point. Each pass reads every Secret and
//! writes it only when its `.dockerconfigjson` differs, so a deleted Secret is recreated
//! and a hand-edited one repaired at the next pass.
//!
//! Ownership: regbroker creates Secrets with the label
//! `app.kubernetes.io/managed-by: regbroker` and only ever updates Secrets carrying it. An
//! existing Secret without the label is left alone, with an error in the log at every
//! pass, until someone deletes or labels it.
//!
//! API errors (unreachable server, 5xx, 403, conflicts that persist) never stop the
//! sidecar: the Secret is retried with exponential backoff from 5 s up to 60 s, and the
//! HTTP endpoint keeps serving. Update conflicts (another writer changed the
//! `resourceVersion`) and create races are retried at once, a few times.
//!
//! With leader election (`serve --leader-elect`, [`crate::kubernetes::lease`]) only the
//! leader writes: [`SecretSync::guarded`] checks [`Leadership::may_write`] again
//! immediately before every create or update, bounds every API call by the leader's write
//! deadline, records the writer's holder identity in the annotation [`WRITTEN_BY`], and
//! runs a pass as soon as this replica starts leading.
//!
//! The API client is kube-rs, set up by [`crate::kubernetes::client_from_environment`]. Needed
//! RBAC: `get`, `create`, `update` on `secrets` in each namespace named (see deploy/).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use regbroker_provider::Registry;
use zeroize::Zeroizing;

use super::status::{Kind as SinkKind, Pass};
use super::{Held, MAX_SLEEP, MIN_SLEEP};
use crate::broker::Broker;
use crate::kubernetes::lease::Leadership;
pub use crate::kubernetes::secret::{
    DATA_KEY, MANAGED_BY, MANAGED_BY_LABEL, Outcome, SECRET_TYPE, SecretRef, WRITTEN_BY,
};
use crate::kubernetes::secret::{SyncError, upsert};
pub use crate::kubernetes::tokens::Tokens;
use crate::kubernetes::tokens::credential_as;

/// Secret sync settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// The Secrets of the shorthand (`--sync-secret`): each gets every registry the sinks
    /// write, with this process's identity.
    pub secrets: Vec<SecretRef>,
    /// Registries to include besides static entries and exact provider rules (for
    /// [`Config::secrets`]).
    pub extra: Vec<Registry>,
    /// Secrets declared one by one (the config file's `[[secret]]`): each holds only its
    /// own registries, fetched with its own ServiceAccount's identity when it names one.
    pub entries: Vec<Entry>,
}

/// A Secret with its own registries and, optionally, a ServiceAccount of its namespace
/// whose identity fetches them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The Secret.
    pub secret: SecretRef,
    /// The registries it holds, and no other.
    pub registries: Vec<Registry>,
    /// The ServiceAccount (by name, in the Secret's namespace); `None`: this process's
    /// identity.
    pub service_account: Option<String>,
}

struct Target {
    secret: SecretRef,
    /// Only these registries; `None`: the shorthand's (every registry the sinks write).
    registries: Option<Vec<Registry>>,
    /// Whose identity fetches them (a ServiceAccount of the Secret's namespace).
    service_account: Option<String>,
    /// This Secret's own credentials: never shared with another Secret's.
    held: BTreeMap<Registry, Held>,
    failures: u32,
    last: Option<Outcome>,
}

/// Keeps Kubernetes Secrets fresh.
pub struct SecretSync {
    broker: Arc<Broker>,
    client: kube::Client,
    extra: Vec<Registry>,
    targets: Vec<Target>,
    tokens: Tokens,
    next: Duration,
    guard: Option<Leadership>,
}

impl fmt::Debug for SecretSync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSync")
            .field(
                "secrets",
                &self
                    .targets
                    .iter()
                    .map(|t| {
                        (
                            &t.secret,
                            &t.service_account,
                            t.held.keys().collect::<Vec<_>>(),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
            .field("guard", &self.guard.as_ref().map(|g| g.identity()))
            .finish()
    }
}

/// The delay after `failures` consecutive failures: 5 s, 10 s, 20 s, 40 s, then 60 s.
fn backoff(failures: u32) -> Duration {
    MIN_SLEEP
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_SLEEP)
}

impl SecretSync {
    /// Syncs once (start-up). API errors do not fail start-up: they are logged and the
    /// Secret is retried with backoff by [`SecretSync::run`].
    pub async fn start(broker: Arc<Broker>, config: Config, client: kube::Client) -> SecretSync {
        let mut sync = SecretSync::new(broker, config, client, None);
        sync.refresh().await;
        sync
    }

    /// A sync that writes only while `leadership` may ([`Leadership::may_write`], checked
    /// again before every write), and signs each write with its identity. No pass runs
    /// until [`SecretSync::run`], which runs one whenever this replica starts leading.
    pub fn guarded(
        broker: Arc<Broker>,
        config: Config,
        client: kube::Client,
        leadership: Leadership,
    ) -> SecretSync {
        SecretSync::new(broker, config, client, Some(leadership))
    }

    fn new(
        broker: Arc<Broker>,
        config: Config,
        client: kube::Client,
        guard: Option<Leadership>,
    ) -> SecretSync {
        let shorthand = config.secrets.into_iter().map(|secret| Target {
            secret,
            registries: None,
            service_account: None,
            held: BTreeMap::new(),
            failures: 0,
            last: None,
        });
        let declared = config.entries.into_iter().map(|e| Target {
            secret: e.secret,
            registries: Some(e.registries),
            service_account: e.service_account,
            held: BTreeMap::new(),
            failures: 0,
            last: None,
        });
        let targets: Vec<Target> = shorthand.chain(declared).collect();
        for t in &targets {
            broker
                .metrics()
                .sink_registered(&t.secret.sink_name(), SinkKind::Secret);
        }
        SecretSync {
            broker,
            tokens: Tokens::new(client.clone()),
            client,
            extra: config.extra,
            targets,
            next: MIN_SLEEP,
            guard,
        }
    }

    /// One pass now: fetch every registry (from the cache where fresh), then read each
    /// Secret and write it if its data differs. The run loop calls this at each refresh
    /// point and after failures.
    pub async fn refresh(&mut self) {
        if let Some(g) = &self.guard
            && !g.may_write()
        {
            for target in &mut self.targets {
                target.last = Some(Outcome::NotLeader);
                self.broker.metrics().sink_pass(
                    &target.secret.sink_name(),
                    SinkKind::Secret,
                    Pass::Standby,
                    self.broker.now(),
                );
            }
            self.next = MAX_SLEEP;
            return;
        }
        let SecretSync {
            broker,
            client,
            extra,
            targets,
            tokens,
            guard,
            ..
        } = self;
        let (broker, client, extra, tokens) = (&*broker, &*client, &*extra, &*tokens);
        let mut next = MAX_SLEEP;
        for target in targets.iter_mut() {
            // Each Secret is fetched and rendered on its own: one Secret's registries and
            // credentials never reach another's.
            let wanted = match &target.registries {
                Some(r) => r.clone(),
                None => super::registries(broker, extra),
            };
            let passed = match &target.service_account {
                None => {
                    super::pass(broker, &wanted, &mut target.held, &|r| {
                        Box::pin(async move { broker.fresh_credential(&r).await })
                    })
                    .await
                }
                Some(sa) => {
                    let namespace = target.secret.namespace.as_str();
                    super::pass(broker, &wanted, &mut target.held, &|r| {
                        Box::pin(
                            async move { credential_as(broker, tokens, namespace, sa, &r).await },
                        )
                    })
                    .await
                }
            };
            next = next.min(passed.next);
            let contents: Zeroizing<String> = super::render(&target.held);
            let missing: Vec<Registry> = wanted
                .into_iter()
                .filter(|r| !target.held.contains_key(r))
                .collect();
            let registries = target.held.len();
            let secret = &target.secret;
            let guard = guard.as_ref();
            let mut write_error = None;
            let written = upsert(client, secret, &contents, &missing, guard, None).await;
            let outcome = match written.map(|w| w.outcome) {
                Ok(o) => {
                    target.failures = 0;
                    if matches!(o, Outcome::Created | Outcome::Updated) {
                        broker.metrics().sink_write(SinkKind::Secret.as_str());
                    }
                    match o {
                        Outcome::Created => {
                            tracing::info!(%secret, registries, "Created Secret")
                        }
                        Outcome::Updated => {
                            tracing::info!(%secret, registries, "Updated Secret")
                        }
                        _ => tracing::debug!(%secret, "Secret up to date"),
                    }
                    o
                }
                Err(SyncError::NotLeader) => {
                    tracing::info!(%secret, "Not writing the Secret: no longer leading");
                    Outcome::NotLeader
                }
                Err(SyncError::Foreign) => {
                    target.failures = 0;
                    tracing::error!(%secret, error = %SyncError::Foreign, "Cannot sync Secret");
                    write_error = Some(SyncError::Foreign.code());
                    Outcome::Foreign
                }
                Err(e) => {
                    target.failures = target.failures.saturating_add(1);
                    let delay = backoff(target.failures);
                    next = next.min(delay);
                    tracing::warn!(%secret, error = %e, retry_in = ?delay, "Cannot sync Secret; retrying");
                    write_error = Some(e.code());
                    Outcome::Failed(e.to_string())
                }
            };
            let pass = if outcome == Outcome::NotLeader {
                Pass::Standby
            } else {
                Pass::Ran {
                    registries: passed.fetched,
                    write_error,
                    expiries: passed.expiries,
                }
            };
            broker
                .metrics()
                .sink_pass(&secret.sink_name(), SinkKind::Secret, pass, broker.now());
            target.last = Some(outcome);
        }
        // Every Secret has asked for its tokens in this pass: the rest are no one's.
        tokens.sweep().await;
        self.next = next.clamp(MIN_SLEEP, MAX_SLEEP);
    }

    /// How many ServiceAccount tokens this sync keeps (for tests: bounded by what the
    /// configured Secrets use).
    pub async fn kept_tokens(&self) -> usize {
        self.tokens.len().await
    }

    /// What the last pass did, per Secret, in the configured order.
    pub fn outcomes(&self) -> Vec<(SecretRef, Option<Outcome>)> {
        self.targets
            .iter()
            .map(|t| (t.secret.clone(), t.last.clone()))
            .collect()
    }

    /// When the next pass is due.
    pub fn next_pass_in(&self) -> Duration {
        self.next
    }

    /// Keeps the Secrets fresh until the task is dropped. With a guard, a pass also runs
    /// as soon as this replica starts leading, and none while it does not.
    pub async fn run(mut self) {
        let Some(mut terms) = self.guard.as_ref().map(Leadership::terms) else {
            loop {
                super::wait_for_next_pass(&self.broker, self.next).await;
                self.refresh().await;
            }
        };
        terms.mark_changed();
        loop {
            tokio::select! {
                changed = terms.changed() => {
                    if changed.is_err() {
                        // The elector is gone: nobody will grant leadership again.
                        std::future::pending::<()>().await;
                    }
                }
                _ = super::wait_for_next_pass(&self.broker, self.next) => {}
            }
            self.refresh().await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn backoff_doubles_from_min_to_max() {
        let got: Vec<u64> = (1..=6).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(got, [5, 10, 20, 40, 60, 60]);
        assert_eq!(backoff(u32::MAX), MAX_SLEEP);
    }
}
