//! The `RegistryCredential` controller (`serve --registry-credentials`): a tenant declares,
//! in its own namespace, which registries it needs; regbroker keeps a
//! `kubernetes.io/dockerconfigjson` Secret there with credentials fetched as that
//! namespace's ServiceAccount, and says in the object's status how it stands.
//!
//! - [`api`]: the resource (`regbroker.dev/v1alpha1`) and its CRD;
//! - [`status`]: conditions and Events from what a reconcile found.
//!
//! Built on kube-rs' runtime: one `Controller` per watched namespace (or one for all),
//! watching the objects, the Secrets they own (metadata only, by [`api::OWNER_LABEL`]) and
//! the ServiceAccounts (metadata only: an annotated or created ServiceAccount re-checks
//! the objects that name it). Each object is requeued at the earliest refresh point of
//! what its Secret holds; the scheduler keeps the earlier of two pending runs, so watch
//! events never postpone a refresh. A reconcile that finds everything as it was writes
//! nothing: not the Secret (compared byte for byte), not the status (compared whole,
//! `lastTransitionTime` carried forward).
//!
//! Whose identity: an object is served only with a ServiceAccount of its own namespace
//! (`spec.serviceAccountName`, else `--default-service-account`), only by the providers
//! (the routing rules apply, the operator's static entries do not), and with its own
//! `spec.secretRef`, whose entries win per registry (Flux RFC-0002). Never with this
//! process's own identity.
//!
//! With leader election only the leader runs the controllers, and every write is
//! guarded as the Secret sync's are ([`crate::kubernetes::secret`]).

pub mod api;
pub mod status;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use regbroker_provider::{Credential, ErrorKind, Registry, Target};

use self::api::{
    FETCHED_AS, OWNER_LABEL, REFRESH_AT, REQUESTED_AT, RegistryCredential,
    RegistryCredentialStatus, RegistryStatus,
};
use self::status::{Found, StallReason};
use crate::broker::{Broker, BrokerError, Route};
use crate::kubernetes::lease::Leadership;
use crate::kubernetes::secret::{self, Owner, SecretRef, SyncError};
use crate::kubernetes::tokens::{self, Tokens, WorkloadError};
use crate::sinks::{Held, MAX_SLEEP, MIN_SLEEP};

/// The field manager of the status patches, and the Events' reporting controller.
pub const MANAGER: &str = "regbroker";

/// How often a Stalled object is looked at again without a change (a foreign Secret
/// deleted, the operator's routing rules reloaded).
const STALL_RECHECK: Duration = Duration::from_secs(300);
/// The longest wait between two looks at an object.
const MAX_REQUEUE: Duration = Duration::from_secs(3600);
/// Objects reconciled at once (the ECR and STS budgets still bound upstream calls).
const CONCURRENCY: u16 = 16;
/// How often tokens no object used are forgotten.
const TOKEN_SWEEP: Duration = Duration::from_secs(600);

/// The controller's settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// The namespaces watched; empty: all.
    pub namespaces: Vec<String>,
    /// The ServiceAccount (in the object's own namespace) for objects that name none.
    pub default_service_account: Option<String>,
    /// Secrets regbroker's own configuration keeps (`--sync-secret`, `[[secret]]`): an
    /// object naming one is Stalled; the configuration wins.
    pub reserved: Vec<SecretRef>,
}

/// Why a reconcile stopped without a status to write.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This replica stopped leading: another one carries on.
    #[error("not the leader")]
    NotLeader,
    /// Writing the status failed.
    #[error("cannot write the status: {0}")]
    Status(#[source] kube::Error),
}

struct Context {
    broker: Arc<Broker>,
    client: kube::Client,
    tokens: Arc<Tokens>,
    config: Config,
    guard: Option<Leadership>,
    recorder: Recorder,
    objects: Vec<Store<RegistryCredential>>,
    /// Consecutive failures per object UID.
    failures: Mutex<HashMap<String, u32>>,
    /// The status last written per object UID: the watch may not have delivered it yet
    /// when the object's Secret event triggers the next reconcile.
    written: Mutex<HashMap<String, RegistryCredentialStatus>>,
    /// The objects looked at in this term: the first look may adopt what a Secret holds.
    looked: Mutex<HashSet<String>>,
    /// Per object UID whose Secret's entries were adopted, that Secret's resourceVersion:
    /// later looks adopt them again while nobody wrote the Secret since.
    adopted: Mutex<HashMap<String, String>>,
    /// Per object UID, when a look last succeeded and last failed (`/metrics`).
    checks: Mutex<HashMap<String, status::Checks>>,
}

impl crate::metrics::health::Tenants for Context {
    fn health(&self) -> Vec<crate::metrics::health::TenantHealth> {
        let written = lock(&self.written);
        let checks = lock(&self.checks);
        self.objects
            .iter()
            .flat_map(|s| s.state())
            .filter(|o| o.metadata.deletion_timestamp.is_none())
            .map(|o| {
                let uid = o.uid().unwrap_or_default();
                let ns = o.namespace().unwrap_or_default();
                let name = o.name_any();
                let sink = SecretRef {
                    namespace: ns.clone(),
                    name: o.target_name().unwrap_or(&name).to_string(),
                }
                .sink_name();
                let latest = latest(&written, &uid, o.status.as_ref());
                let checks = checks.get(&uid).copied().unwrap_or_default();
                status::health(&ns, &name, sink, &latest, checks)
            })
            .collect()
    }
}

/// What a reconcile looks at.
struct Look<'a> {
    obj: &'a RegistryCredential,
    uid: &'a str,
    ns: &'a str,
    target: &'a str,
    /// The latest status known.
    previous: &'a RegistryCredentialStatus,
    /// The first look at this object in this term (a start, a new leader).
    first: bool,
}

/// Runs the controllers until the task is dropped: while this replica leads (always,
/// without a guard); a new term starts them afresh, so the new leader looks at every
/// object at once.
pub async fn run(
    broker: Arc<Broker>,
    client: kube::Client,
    config: Config,
    guard: Option<Leadership>,
) {
    let tokens = Arc::new(Tokens::new(client.clone()));
    let Some(g) = guard.clone() else {
        run_term(&broker, &client, &config, None, &tokens).await;
        return;
    };
    let mut terms = g.terms();
    terms.mark_changed();
    loop {
        if terms.changed().await.is_err() {
            // The elector is gone: nobody will grant leadership again.
            return std::future::pending().await;
        }
        if !g.may_write() {
            continue;
        }
        tracing::info!("Leading: reconciling RegistryCredentials");
        tokio::select! {
            () = run_term(&broker, &client, &config, Some(g.clone()), &tokens) => {}
            () = lost(&g) => tracing::info!("No longer leading: RegistryCredentials left to the next leader"),
        }
    }
}

/// Resolves once `g` may no longer write.
async fn lost(g: &Leadership) {
    while let Some(deadline) = g.write_deadline() {
        tokio::time::sleep_until(deadline).await;
        if !g.may_write() {
            return;
        }
    }
}

async fn run_term(
    broker: &Arc<Broker>,
    client: &kube::Client,
    config: &Config,
    guard: Option<Leadership>,
    tokens: &Arc<Tokens>,
) {
    let scopes: Vec<Option<&str>> = if config.namespaces.is_empty() {
        vec![None]
    } else {
        config.namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let api = |ns: Option<&str>| match ns {
        Some(ns) => Api::<RegistryCredential>::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let controllers: Vec<_> = scopes
        .iter()
        .map(|ns| Controller::new(api(*ns), watcher::Config::default().any_semantic()))
        .collect();
    let reporter = Reporter {
        controller: MANAGER.to_string(),
        instance: guard.as_ref().map(|g| g.identity().to_string()),
    };
    let ctx = Arc::new(Context {
        broker: broker.clone(),
        client: client.clone(),
        tokens: tokens.clone(),
        config: config.clone(),
        guard,
        recorder: Recorder::new(client.clone(), reporter),
        objects: controllers.iter().map(Controller::store).collect(),
        failures: Mutex::new(HashMap::new()),
        written: Mutex::new(HashMap::new()),
        looked: Mutex::new(HashSet::new()),
        adopted: Mutex::new(HashMap::new()),
        checks: Mutex::new(HashMap::new()),
    });
    // Reported while this term lasts: a replica that stops leading stops reporting.
    let tenants: Arc<dyn crate::metrics::health::Tenants> = ctx.clone();
    broker.metrics().report_tenants(Arc::downgrade(&tenants));
    let runs = controllers.into_iter().zip(scopes).map(|(c, ns)| {
        // Metadata only: the Secrets' data and the ServiceAccounts' tokens are never
        // watched.
        let secrets: Api<PartialObjectMeta<Secret>> = scoped(client, ns);
        let accounts: Api<PartialObjectMeta<ServiceAccount>> = scoped(client, ns);
        let store = c.store();
        let default_sa = config.default_service_account.clone();
        let owned =
            watcher(secrets, watcher::Config::default().labels(OWNER_LABEL)).touched_objects();
        let account_changes = watcher(accounts, watcher::Config::default()).touched_objects();
        c.owns_stream(owned)
            .watches_stream(account_changes, move |sa| {
                let (ns, name) = (sa.namespace(), sa.name_any());
                store
                    .state()
                    .into_iter()
                    .filter(|o| {
                        o.namespace() == ns
                            && service_account(o, default_sa.as_deref()) == Some(name.as_str())
                    })
                    .map(|o| ObjectRef::from_obj(&*o))
                    .collect::<Vec<_>>()
            })
            .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "RegistryCredential reconcile");
                }
            })
    });
    let sweep = async {
        loop {
            tokio::time::sleep(TOKEN_SWEEP).await;
            tokens.sweep().await;
            ctx.forget_deleted();
        }
    };
    tokio::select! {
        _ = futures_util::future::join_all(runs) => {}
        () = sweep => {}
    }
}

fn scoped<K>(client: &kube::Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The ServiceAccount whose identity serves `obj`.
fn service_account<'a>(obj: &'a RegistryCredential, default: Option<&'a str>) -> Option<&'a str> {
    obj.spec.service_account_name.as_deref().or(default)
}

fn error_policy(_: Arc<RegistryCredential>, error: &Error, _: Arc<Context>) -> Action {
    match error {
        Error::NotLeader => Action::await_change(),
        Error::Status(_) => Action::requeue(MIN_SLEEP),
    }
}

async fn reconcile(obj: Arc<RegistryCredential>, ctx: Arc<Context>) -> Result<Action, Error> {
    if obj.metadata.deletion_timestamp.is_some() {
        // Kubernetes' garbage collector deletes the Secret with it.
        return Ok(Action::await_change());
    }
    let ns = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let target = obj.target_name().unwrap_or(&name).to_string();
    let requested = obj.annotations().get(REQUESTED_AT).cloned();
    let uid = obj.uid().unwrap_or_default();
    let previous = ctx.previous(&obj, &uid);
    let first = lock(&ctx.looked).insert(uid.clone());
    let look = Look {
        obj: &obj,
        uid: &uid,
        ns: &ns,
        target: &target,
        previous: &previous,
        first,
    };
    let (found, requeue) = ctx.examine(&look).await?;
    let failing = matches!(
        &found,
        Found::Failed { .. }
            | Found::Synced {
                retrying: Some(_),
                ..
            }
    );
    let requeue = ctx
        .backoff(&uid, failing)
        .map_or(requeue, |b| requeue.min(b));
    let now = ctx.broker.now();
    lock(&ctx.checks)
        .entry(uid.clone())
        .or_default()
        .record(&found, now);
    let next = status::next(
        &previous,
        obj.metadata.generation,
        &target,
        requested.as_deref(),
        found,
        now,
    );
    if next != previous {
        let api: Api<RegistryCredential> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({
            "apiVersion": "regbroker.dev/v1alpha1",
            "kind": "RegistryCredential",
            "status": next,
        });
        let params = PatchParams::apply(MANAGER).force();
        secret::may_write(ctx.guard.as_ref()).map_err(|_| Error::NotLeader)?;
        match secret::guarded(
            ctx.guard.as_ref(),
            api.patch_status(&name, &params, &Patch::Apply(&patch)),
        )
        .await
        {
            Ok(_) => {
                lock(&ctx.written).insert(uid, next.clone());
            }
            Err(SyncError::Api(e)) => return Err(Error::Status(e)),
            Err(_) => return Err(Error::NotLeader),
        }
        let reference = obj.object_ref(&());
        for t in status::transitions(&previous, &next) {
            let event = Event {
                type_: if t.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: t.reason,
                note: Some(t.note.chars().take(1024).collect()),
                action: "Reconcile".to_string(),
                secondary: None,
            };
            if let Err(e) = ctx.recorder.publish(&event, &reference).await {
                tracing::warn!(object = %format!("{ns}/{name}"), error = %e, "Cannot record an Event");
            }
        }
    }
    Ok(Action::requeue(requeue.clamp(MIN_SLEEP, MAX_REQUEUE)))
}

/// Where each registry's credential comes from: `spec.secretRef`'s entries, else its
/// provider with the ServiceAccount (name, UID and identity annotations); and the
/// Secret's metadata as [`Context::examine`] found it.
struct Sources<'a> {
    statics: BTreeMap<Registry, Credential>,
    providers: BTreeMap<Registry, (Arc<dyn regbroker_provider::Provider>, Target)>,
    account: Option<(&'a str, tokens::Account)>,
    current: Option<ObjectMeta>,
}

/// The delay after one more failure of object `uid` in a row (5 s doubling to 60 s), or
/// `None` when it did not fail (its count is reset).
fn backoff(failures: &mut HashMap<String, u32>, uid: &str, failing: bool) -> Option<Duration> {
    if !failing {
        failures.remove(uid);
        return None;
    }
    let n = failures.entry(uid.to_string()).or_insert(0);
    *n = n.saturating_add(1);
    Some(
        MIN_SLEEP
            .saturating_mul(1 << (*n - 1).min(16))
            .min(MAX_SLEEP),
    )
}

/// The latest status known for object `uid`: what this term wrote last, else the object's
/// `own`. Only the leader writes the status, and the watch may not have delivered its
/// last write yet when a Secret event triggers the next reconcile: from the object's own,
/// that reconcile would apply the same status again, or handle a `requestedAt` twice.
fn latest(
    written: &HashMap<String, RegistryCredentialStatus>,
    uid: &str,
    own: Option<&RegistryCredentialStatus>,
) -> RegistryCredentialStatus {
    written.get(uid).or(own).cloned().unwrap_or_default()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The [`FETCHED_AS`] digest: whose identity fetches the provider entries of an object in
/// `ns`. Nothing in it is secret (no token); any change in it is a change of identity.
fn fetched_as(
    ns: &str,
    sa: &str,
    (uid, annotations): &tokens::Account,
    providers: &BTreeMap<Registry, (Arc<dyn regbroker_provider::Provider>, Target)>,
) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let mut field = |s: &str| {
        h.update(s.len().to_le_bytes());
        h.update(s.as_bytes());
    };
    field("regbroker.dev/fetched-as/v1");
    field(ns);
    field(sa);
    field(uid);
    for (k, v) in annotations {
        field(k);
        field(v);
    }
    for (registry, (provider, _)) in providers {
        field(registry.as_str());
        field(provider.name());
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A stall with its recheck delay.
fn stalled(reason: StallReason, message: String) -> (Found, Duration) {
    (Found::Stalled { reason, message }, STALL_RECHECK)
}

/// `upstream_unavailable` as `UpstreamUnavailable`.
fn camel(code: &str) -> String {
    code.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

impl Context {
    /// See [`backoff`].
    fn backoff(&self, uid: &str, failing: bool) -> Option<Duration> {
        backoff(&mut lock(&self.failures), uid, failing)
    }

    /// See [`latest`].
    fn previous(&self, obj: &RegistryCredential, uid: &str) -> RegistryCredentialStatus {
        latest(&lock(&self.written), uid, obj.status.as_ref())
    }

    /// Forgets what is kept per object for objects that no longer exist (deleted objects
    /// are not reconciled again).
    fn forget_deleted(&self) {
        let live: HashSet<String> = self
            .objects
            .iter()
            .flat_map(|s| s.state())
            .filter_map(|o| o.uid())
            .collect();
        lock(&self.failures).retain(|k, _| live.contains(k));
        lock(&self.written).retain(|k, _| live.contains(k));
        lock(&self.looked).retain(|k| live.contains(k));
        lock(&self.adopted).retain(|k, _| live.contains(k));
        lock(&self.checks).retain(|k, _| live.contains(k));
    }

    /// The object that keeps `target` in `ns` first (created earliest, then by name), if
    /// not `obj`.
    fn first_claim(&self, ns: &str, target: &str, obj: &RegistryCredential) -> Option<String> {
        let key = |o: &RegistryCredential| (o.metadata.creation_timestamp.clone(), o.name_any());
        self.objects
            .iter()
            .flat_map(|s| s.state())
            .filter(|o| {
                o.namespace().as_deref() == Some(ns)
                    && o.target_name() == Some(target)
                    && o.metadata.deletion_timestamp.is_none()
            })
            .min_by_key(|o| key(o))
            .filter(|first| first.uid() != obj.uid())
            .map(|first| first.name_any())
    }

    /// Looks at `obj` and brings its Secret up to date: what was found, and when to look
    /// again.
    async fn examine(&self, look: &Look<'_>) -> Result<(Found, Duration), Error> {
        use StallReason::*;
        let Look {
            obj, ns, target, ..
        } = *look;
        if self
            .config
            .reserved
            .iter()
            .any(|r| r.namespace == ns && r.name == target)
        {
            return Ok(stalled(
                SecretConflict,
                format!(
                    "Secret {target} is kept by regbroker's own configuration (--sync-secret or a [[secret]] entry), which wins: set spec.target.name to another name"
                ),
            ));
        }
        if let Some(other) = self.first_claim(ns, target, obj) {
            return Ok(stalled(
                SecretConflict,
                format!(
                    "Secret {target} is already kept by RegistryCredential {other}: set spec.target.name to another name"
                ),
            ));
        }
        // A Secret of that name that this object does not own is never written: found
        // out before anything is fetched for it.
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let current = match secrets.get_metadata_opt(target).await {
            Ok(Some(existing))
                if !(secret::is_ours(&existing.metadata)
                    && secret::controlled_by(
                        &existing.metadata,
                        &obj.uid().unwrap_or_default(),
                    )) =>
            {
                return Ok(stalled(
                    SecretConflict,
                    format!(
                        "Secret {target} exists and is not kept by this RegistryCredential (it lacks regbroker's label or a controller ownerReference to it): delete it or set spec.target.name to another name"
                    ),
                ));
            }
            Ok(existing) => existing.map(|e| e.metadata),
            Err(e) => {
                return Ok((
                    Found::Failed {
                        reason: "KubernetesApiError".into(),
                        message: format!("cannot read Secret {target}: {e}"),
                    },
                    MIN_SLEEP,
                ));
            }
        };
        let mut registries: Vec<Registry> = Vec::new();
        for (i, r) in obj.spec.registries.iter().enumerate() {
            match Registry::parse(r) {
                Ok(r) if !registries.contains(&r) => registries.push(r),
                Ok(_) => {}
                Err(e) => {
                    return Ok(stalled(
                        InvalidRegistry,
                        format!("spec.registries[{i}]: {e}"),
                    ));
                }
            }
        }
        if obj.spec.suspend {
            let now = status::time(self.broker.now());
            let until = look
                .previous
                .expires_at
                .as_ref()
                .filter(|e| **e > now)
                .map_or(MAX_REQUEUE, |e| {
                    Duration::from_secs(
                        u64::try_from(e.0.as_second() - now.0.as_second()).unwrap_or(0),
                    )
                });
            return Ok((Found::Suspended, until));
        }
        // spec.secretRef's entries win, per registry (RFC-0002).
        let mut statics: BTreeMap<Registry, Credential> = BTreeMap::new();
        if let Some(r) = &obj.spec.secret_ref {
            if r.name == target {
                return Ok(stalled(
                    InvalidSecretRef,
                    format!(
                        "spec.secretRef names {target}, the Secret this object keeps: name another Secret"
                    ),
                ));
            }
            match self.read_secret_ref(ns, &r.name).await {
                Ok(entries) => statics.extend(entries),
                Err(found) => return Ok(found),
            }
        }
        // Which provider serves each registry not in spec.secretRef: a routing problem is
        // the operator's or the spec's, whatever the identity.
        let mut providers: BTreeMap<Registry, (Arc<dyn regbroker_provider::Provider>, Target)> =
            BTreeMap::new();
        for (i, registry) in registries.iter().enumerate() {
            if statics.contains_key(registry) {
                continue;
            }
            let not_served = |m: String| {
                Ok(stalled(
                    RegistryNotServed,
                    format!("spec.registries[{i}] {registry}: {m}"),
                ))
            };
            match self.broker.decide_contextual(registry).route {
                Route::Provider(p, target) => {
                    providers.insert(registry.clone(), (p, target));
                }
                Route::NotConfigured(m) => {
                    return not_served(format!(
                        "{m}; tenants get credentials from the providers only, never from regbroker's static entries"
                    ));
                }
                Route::Failed(p, e) => return not_served(format!("{p}: {e}")),
                Route::Static(_) => return not_served("only a static entry serves it".into()),
            }
        }
        let default_sa = self.config.default_service_account.as_deref();
        let account = match (!providers.is_empty(), service_account(obj, default_sa)) {
            (false, _) => None,
            (true, None) => {
                return Ok(stalled(
                    ServiceAccountRequired,
                    "spec.serviceAccountName is not set, and regbroker runs without --default-service-account: name the ServiceAccount of this namespace whose identity fetches the credentials".into(),
                ));
            }
            (true, Some(sa)) => match self.tokens.account(ns, sa).await {
                Ok(a) => Some((sa, a)),
                Err(e) if e.kind() == ErrorKind::IdentityMissing => {
                    return Ok(stalled(
                        ServiceAccountNotFound,
                        format!(
                            "spec.serviceAccountName: ServiceAccount {sa} does not exist in namespace {ns}"
                        ),
                    ));
                }
                Err(e) => {
                    return Ok((
                        Found::Failed {
                            reason: "KubernetesApiError".into(),
                            message: e.to_string(),
                        },
                        MIN_SLEEP,
                    ));
                }
            },
        };
        let sources = Sources {
            statics,
            providers,
            account,
            current,
        };
        self.sync(look, &registries, sources).await
    }

    /// The entries of the dockerconfigjson Secret `ns/name` (`spec.secretRef`).
    async fn read_secret_ref(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Vec<(Registry, Credential)>, (Found, Duration)> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let secret = match api.get_opt(name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err((
                    Found::Failed {
                        reason: "SecretRefNotFound".into(),
                        message: format!(
                            "spec.secretRef: Secret {name} does not exist in namespace {ns}"
                        ),
                    },
                    MIN_SLEEP,
                ));
            }
            Err(e) => {
                return Err((
                    Found::Failed {
                        reason: "KubernetesApiError".into(),
                        message: format!("cannot read spec.secretRef Secret {name}: {e}"),
                    },
                    MIN_SLEEP,
                ));
            }
        };
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(secret::DATA_KEY))
            .filter(|_| secret.type_.as_deref() == Some(secret::SECRET_TYPE));
        let Some(data) = data else {
            return Err(stalled(
                StallReason::InvalidSecretRef,
                format!(
                    "spec.secretRef: Secret {name} is not of type {} with a {} key",
                    secret::SECRET_TYPE,
                    secret::DATA_KEY
                ),
            ));
        };
        crate::broker::static_secret::parse_document(&data.0).map_err(|e| {
            stalled(
                StallReason::InvalidSecretRef,
                format!("spec.secretRef: Secret {name}: {e}"),
            )
        })
    }

    /// `registry`'s credential as `workload`, fetched anew when `refetch` (a refresh
    /// asked for), else the cached one until its refresh point.
    async fn credential(
        &self,
        registry: &Registry,
        workload: &regbroker_provider::WorkloadIdentity,
        refetch: bool,
    ) -> Result<crate::broker::Served, BrokerError> {
        let served = if refetch {
            self.broker
                .refetched_contextual_credential_for(registry, workload)
                .await
        } else {
            self.broker
                .fresh_contextual_credential_for(registry, workload)
                .await
        }?;
        // A credential the registry refuses is never written (CredentialRejected).
        self.broker.checked(served).await
    }

    /// Fetches every registry and writes the Secret; on the first look in a term, keeps
    /// what the Secret holds instead while it may ([`Context::adoptable`]).
    async fn sync(
        &self,
        look: &Look<'_>,
        registries: &[Registry],
        sources: Sources<'_>,
    ) -> Result<(Found, Duration), Error> {
        let digest = sources
            .account
            .as_ref()
            .filter(|_| !sources.providers.is_empty())
            .map(|(sa, account)| fetched_as(look.ns, sa, account, &sources.providers));
        if let Some(adopted) = self.adoptable(look, &sources, digest.as_deref()) {
            let done = self
                .sync_once(
                    look,
                    registries,
                    &sources,
                    digest.as_deref(),
                    Some(&adopted),
                )
                .await?;
            if let Some(done) = done {
                return Ok(done);
            }
            // The Secret lost an entry since: fetch.
        }
        let done = self
            .sync_once(look, registries, &sources, digest.as_deref(), None)
            .await?;
        Ok(done.unwrap_or_else(|| {
            (
                Found::Failed {
                    reason: "SecretChanged".into(),
                    message: format!("Secret {} changed while it was written", look.target),
                },
                MIN_SLEEP,
            )
        }))
    }

    /// On the first look at an object in this term, with an empty cache, whether its
    /// Secret's provider entries may be kept as they are rather than fetched and written
    /// again (a restart or a new leader would otherwise rewrite every Secret): only when
    /// no refresh was asked for, the status describes the current spec with a good entry
    /// for each such registry, and the Secret says it was fetched as the identity that
    /// would fetch it now ([`FETCHED_AS`]) with a refresh point still ahead
    /// ([`REFRESH_AT`]). Later looks (the watches' first events follow the first look)
    /// adopt them again while nobody wrote the Secret since; a Secret edited or deleted
    /// is fetched for and restored. Returns that refresh point, for the requeue.
    fn adoptable(
        &self,
        look: &Look<'_>,
        sources: &Sources<'_>,
        digest: Option<&str>,
    ) -> Option<std::time::SystemTime> {
        let (obj, previous) = (look.obj, look.previous);
        let current = sources.current.as_ref()?;
        let untouched = current.resource_version.is_some()
            && lock(&self.adopted).get(look.uid) == current.resource_version.as_ref();
        if !(look.first || untouched)
            || obj.refresh_requested(previous)
            || previous.observed_generation != obj.metadata.generation
        {
            return None;
        }
        let annotations = current.annotations.as_ref()?;
        if annotations.get(FETCHED_AS).map(String::as_str) != Some(digest?) {
            return None;
        }
        let refresh_at: k8s_openapi::jiff::Timestamp = annotations.get(REFRESH_AT)?.parse().ok()?;
        let refresh_at = std::time::SystemTime::from(refresh_at);
        let good = sources.providers.keys().all(|r| {
            previous.registries.iter().any(|p| {
                p.name == r.as_str() && p.reason == status::SUCCEEDED && p.expires_at.is_some()
            })
        });
        (good && refresh_at > self.broker.now()).then_some(refresh_at)
    }

    /// One pass over the registries: provider entries fetched, or with `adopted` (their
    /// refresh point), kept from the Secret. `None` if an adopted entry was no longer
    /// there.
    async fn sync_once(
        &self,
        look: &Look<'_>,
        registries: &[Registry],
        sources: &Sources<'_>,
        digest: Option<&str>,
        adopted: Option<&std::time::SystemTime>,
    ) -> Result<Option<(Found, Duration)>, Error> {
        let Look {
            obj,
            ns,
            target,
            previous,
            ..
        } = *look;
        let Sources {
            statics,
            providers,
            account,
            current,
        } = sources;
        use StallReason::*;
        let now = self.broker.now();
        let refetch = obj.refresh_requested(previous);
        let mut held: BTreeMap<Registry, Held> = BTreeMap::new();
        let mut states: Vec<RegistryStatus> = Vec::with_capacity(registries.len());
        let mut failed: Vec<(Registry, String, String)> = Vec::new();
        let mut kept: Vec<Registry> = Vec::new();
        let mut next = adopted.map_or(MAX_REQUEUE, |at| {
            at.duration_since(now).unwrap_or(Duration::ZERO)
        });
        for (i, registry) in registries.iter().enumerate() {
            if adopted.is_some() && providers.contains_key(registry) {
                if let Some(p) = previous
                    .registries
                    .iter()
                    .find(|p| p.name == registry.as_str())
                {
                    states.push(p.clone());
                    kept.push(registry.clone());
                }
                continue;
            }
            let got = if let Some(c) = statics.get(registry) {
                Ok((c.clone(), "secretRef", None))
            } else {
                let (Some((sa, account)), Some((provider, target))) =
                    (account, providers.get(registry))
                else {
                    continue; // unreachable: every other registry has a provider and an identity
                };
                match tokens::workload_identity(
                    &self.tokens,
                    ns,
                    sa,
                    account.clone(),
                    &**provider,
                    target,
                )
                .await
                {
                    Err(WorkloadError::Annotations(e)) => {
                        return Ok(Some(stalled(
                            IdentityNotConfigured,
                            format!("spec.serviceAccountName: {e}"),
                        )));
                    }
                    Err(WorkloadError::Token(e)) => {
                        Err(("TokenRequestFailed".to_string(), e.to_string()))
                    }
                    Ok(workload) => match self.credential(registry, &workload, refetch).await {
                        Ok(served) => Ok((served.credential, served.source, served.lifetime)),
                        Err(e)
                            if matches!(
                                e.kind(),
                                ErrorKind::IdentityMissing | ErrorKind::InvalidConfig
                            ) =>
                        {
                            return Ok(Some(stalled(
                                IdentityNotConfigured,
                                format!("spec.serviceAccountName {sa}: {}", e.detail(false)),
                            )));
                        }
                        Err(e @ BrokerError::NotConfigured(_)) => {
                            return Ok(Some(stalled(
                                RegistryNotServed,
                                format!("spec.registries[{i}] {registry}: {}", e.detail(false)),
                            )));
                        }
                        Err(e) => Err((camel(e.kind().code()), e.detail(false))),
                    },
                }
            };
            match got {
                Ok((credential, source, lifetime)) => {
                    let (h, refresh_at) =
                        crate::sinks::hold(&self.broker, &credential, lifetime, now);
                    if let Some(at) = refresh_at {
                        next = next.min(at.duration_since(now).unwrap_or(Duration::ZERO));
                    }
                    held.insert(registry.clone(), h);
                    states.push(RegistryStatus {
                        name: registry.to_string(),
                        provider: Some(source.to_string()),
                        expires_at: credential.expires_at().map(status::time),
                        reason: status::SUCCEEDED.to_string(),
                    });
                }
                Err((reason, message)) => {
                    failed.push((registry.clone(), reason.clone(), message));
                    states.push(RegistryStatus {
                        name: registry.to_string(),
                        provider: None,
                        expires_at: None,
                        reason,
                    });
                }
            }
        }
        let contents = crate::sinks::render(&held);
        let missing: Vec<Registry> = failed
            .iter()
            .map(|(r, _, _)| r.clone())
            .chain(kept.iter().cloned())
            .collect();
        // Adopted: the Secret's annotations stay as they are. Fetched: they record this
        // pass, unless a fetch failed (then nothing may be adopted from it).
        let annotation = |key: &str| {
            current
                .as_ref()
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(key))
                .cloned()
        };
        let (refresh_at, fetched) = match (adopted, digest) {
            (Some(_), _) => (annotation(REFRESH_AT), annotation(FETCHED_AS)),
            (None, Some(d)) if failed.is_empty() && next < MAX_REQUEUE => {
                (Some(crate::rfc3339(now + next)), Some(d.to_string()))
            }
            (None, _) => (None, None),
        };
        let owner = Owner {
            reference: owner_reference(obj),
            labels: BTreeMap::from([(OWNER_LABEL.to_string(), obj.name_any())]),
            annotations: BTreeMap::from([
                (REFRESH_AT.to_string(), refresh_at),
                (FETCHED_AS.to_string(), fetched),
            ]),
        };
        let secret_ref = SecretRef {
            namespace: ns.to_string(),
            name: target.to_string(),
        };
        let written = secret::upsert(
            &self.client,
            &secret_ref,
            &contents,
            &missing,
            self.guard.as_ref(),
            Some(&owner),
        )
        .await;
        let written = match written {
            Ok(w) => w,
            Err(SyncError::NotLeader) => return Err(Error::NotLeader),
            Err(e @ (SyncError::Foreign | SyncError::WrongType(_))) => {
                return Ok(Some(stalled(
                    SecretConflict,
                    format!(
                        "Secret {target}: {e}; it is not kept by this RegistryCredential (regbroker's label and a controller ownerReference to it): delete it or set spec.target.name to another name"
                    ),
                )));
            }
            Err(e) => {
                return Ok(Some((
                    Found::Failed {
                        reason: "SecretWriteFailed".into(),
                        message: format!("Secret {target}: {e}"),
                    },
                    MIN_SLEEP,
                )));
            }
        };
        if kept.iter().any(|r| !written.kept.contains(r)) {
            lock(&self.adopted).remove(look.uid);
            return Ok(None);
        }
        let version = current.as_ref().and_then(|m| m.resource_version.clone());
        match version {
            Some(v) if adopted.is_some() && written.outcome == secret::Outcome::Unchanged => {
                lock(&self.adopted).insert(look.uid.to_string(), v);
            }
            _ => {
                lock(&self.adopted).remove(look.uid);
            }
        }
        // A registry whose fetch failed keeps the entry the Secret held, valid until the
        // expiry the previous status recorded for it.
        for state in &mut states {
            let kept = written.kept.iter().any(|r| r.as_str() == state.name);
            if let Some(before) = previous
                .registries
                .iter()
                .find(|b| kept && b.name == state.name)
            {
                state.provider = before.provider.clone();
                state.expires_at = before.expires_at.clone();
            }
        }
        let retrying = (!failed.is_empty()).then(|| {
            let reason = failed[0].1.clone();
            let message = failed
                .iter()
                .map(|(r, _, m)| format!("{r}: {m}"))
                .collect::<Vec<_>>()
                .join("; ");
            (reason, message)
        });
        let written = matches!(
            written.outcome,
            secret::Outcome::Created | secret::Outcome::Updated
        );
        if written {
            self.broker.metrics().sink_write("registry_credential");
        }
        Ok(Some((
            Found::Synced {
                registries: states,
                written,
                retrying,
            },
            next,
        )))
    }
}

/// The controller ownerReference to `obj` that its Secret carries.
fn owner_reference(obj: &RegistryCredential) -> OwnerReference {
    let mut r = obj.controller_owner_ref(&()).unwrap_or_default();
    r.block_owner_deletion = Some(false);
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_requested_at_not_yet_echoed_asks_for_a_refetch() {
        let spec = api::RegistryCredentialSpec {
            registries: vec!["registry.example.com".into()],
            service_account_name: None,
            secret_ref: None,
            target: None,
            suspend: false,
        };
        let mut obj = RegistryCredential::new("pull", spec);
        let none = api::RegistryCredentialStatus::default();
        assert!(!obj.refresh_requested(&none), "no annotation");
        obj.metadata.annotations = Some(BTreeMap::from([(
            REQUESTED_AT.to_string(),
            "now-1".to_string(),
        )]));
        assert!(obj.refresh_requested(&none), "never handled");
        let handled = api::RegistryCredentialStatus {
            last_handled_reconcile_at: Some("now-1".into()),
            ..Default::default()
        };
        assert!(
            !obj.refresh_requested(&handled),
            "handled: the cache serves again"
        );
        obj.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(REQUESTED_AT.to_string(), "now-2".to_string());
        assert!(obj.refresh_requested(&handled), "a new value");
    }

    #[test]
    fn failures_in_a_row_back_off_from_5_s_doubling_to_60_s_and_a_success_resets() {
        let mut failures = HashMap::new();
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
        let waits: Vec<_> = (0..6)
            .map(|_| secs(backoff(&mut failures, "a", true)))
            .collect();
        assert_eq!(
            waits,
            [Some(5), Some(10), Some(20), Some(40), Some(60), Some(60)]
        );
        assert_eq!(
            secs(backoff(&mut failures, "b", true)),
            Some(5),
            "per object"
        );
        assert_eq!(backoff(&mut failures, "a", false), None);
        assert!(!failures.contains_key("a"), "a success forgets the count");
        assert_eq!(secs(backoff(&mut failures, "a", true)), Some(5));
    }

    #[test]
    fn the_status_last_written_wins_over_an_older_copy_from_the_watch() {
        let status = |handled: &str| api::RegistryCredentialStatus {
            last_handled_reconcile_at: Some(handled.into()),
            ..Default::default()
        };
        let written = HashMap::from([("a".to_string(), status("written"))]);
        let own = status("watched");
        assert_eq!(latest(&written, "a", Some(&own)), status("written"));
        assert_eq!(latest(&written, "a", None), status("written"));
        assert_eq!(latest(&written, "b", Some(&own)), own, "nothing written");
        assert_eq!(
            latest(&written, "b", None),
            api::RegistryCredentialStatus::default()
        );
    }

    #[cfg(feature = "federated")]
    #[test]
    fn the_fetched_as_digest_changes_with_each_part_of_the_identity_and_only_then() {
        use regbroker_federated::{FederatedProvider, Kind};
        let registry = |h: &str| Registry::parse(h).unwrap();
        let served = |kind: Kind, host: &str| {
            let p: Arc<dyn regbroker_provider::Provider> =
                Arc::new(FederatedProvider::new(kind).unwrap());
            BTreeMap::from([(registry(host), (p, Target::new(registry(host), "scope")))])
        };
        let account = |uid: &str, annotations: &[(&str, &str)]| -> tokens::Account {
            (
                uid.to_string(),
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        let quay = served(Kind::Quay, "quay.example.com");
        let a1 = account("uid-1", &[("a", "1")]);
        let base = fetched_as("ns", "sa", &a1, &quay);
        assert_eq!(base.len(), 32, "{base}");
        assert!(base.bytes().all(|b| b.is_ascii_hexdigit()), "{base}");
        assert_eq!(base, fetched_as("ns", "sa", &a1, &quay), "deterministic");
        let others = [
            fetched_as("ns2", "sa", &a1, &quay),
            fetched_as("ns", "sb", &a1, &quay),
            // The boundary between fields counts: "ns"+"sa" is not "nss"+"a".
            fetched_as("nss", "a", &a1, &quay),
            fetched_as("ns", "sa", &account("uid-2", &[("a", "1")]), &quay),
            fetched_as("ns", "sa", &account("uid-1", &[("a", "2")]), &quay),
            fetched_as("ns", "sa", &account("uid-1", &[("b", "1")]), &quay),
            fetched_as("ns", "sa", &account("uid-1", &[]), &quay),
            fetched_as("ns", "sa", &a1, &served(Kind::Oidc, "quay.example.com")),
            fetched_as("ns", "sa", &a1, &served(Kind::Quay, "quay2.example.com")),
            fetched_as("ns", "sa", &a1, &BTreeMap::new()),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(&base, other, "change {i} kept the digest");
        }
    }

    #[test]
    fn error_codes_become_camel_case_reasons() {
        assert_eq!(camel("upstream_unavailable"), "UpstreamUnavailable");
        assert_eq!(camel("identity_rejected"), "IdentityRejected");
        assert_eq!(camel("overloaded"), "Overloaded");
    }
}
