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
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use regbroker_provider::Registry;
use zeroize::Zeroizing;

use super::status::{Kind as SinkKind, Pass};
use super::{Held, MAX_SLEEP, MIN_SLEEP};
use crate::broker::Broker;
use crate::kubernetes::lease::Leadership;

/// The label regbroker sets on the Secrets it owns, and requires before updating one.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "regbroker";
/// The Secret type written.
pub const SECRET_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The data key holding the docker config.
pub const DATA_KEY: &str = ".dockerconfigjson";
/// The annotation naming the leader election holder that wrote the Secret last (set only
/// with leader election).
pub const WRITTEN_BY: &str = "regbroker/written-by";

/// How many times a conflicting write is retried at once within one pass.
const CONFLICT_RETRIES: usize = 3;

/// A Secret to keep: `NAMESPACE/NAME`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl SecretRef {
    /// Its sink name in readiness checks, metrics and `/v1/providers`:
    /// `secret/NAMESPACE/NAME`.
    pub fn sink_name(&self) -> String {
        format!("secret/{}/{}", self.namespace, self.name)
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A DNS-1123 label (namespaces) or subdomain (Secret names).
fn valid_name(s: &str, max: usize, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && (dots || !s.contains('.'))
}

impl FromStr for SecretRef {
    type Err = String;

    fn from_str(s: &str) -> Result<SecretRef, String> {
        let (namespace, name) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not NAMESPACE/NAME"))?;
        if !valid_name(namespace, 63, false) {
            return Err(format!(
                "namespace {namespace:?} is not a DNS-1123 label (lower-case letters, digits, '-', at most 63)"
            ));
        }
        if !valid_name(name, 253, true) {
            return Err(format!(
                "Secret name {name:?} is not a DNS-1123 subdomain (lower-case letters, digits, '-', '.', at most 253)"
            ));
        }
        Ok(SecretRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

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

/// What the last pass did to one Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Created (it did not exist).
    Created,
    /// Updated (it held other data).
    Updated,
    /// Already up to date: nothing written.
    Unchanged,
    /// It exists without regbroker's label: left alone.
    Foreign,
    /// The API call failed (message, no secrets); retried with backoff.
    Failed(String),
    /// Not written: this replica is not the leader (or its renew deadline passed).
    NotLeader,
}

#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error(
        "Secret exists and is not managed by regbroker (no label {MANAGED_BY_LABEL}={MANAGED_BY}); leaving it alone: delete it or add the label"
    )]
    Foreign,
    #[error("Secret has type {0:?}, not {SECRET_TYPE}; delete it to let regbroker recreate it")]
    WrongType(String),
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("gave up after {CONFLICT_RETRIES} conflicting writes")]
    Conflicts,
    #[error("not the leader")]
    NotLeader,
}

impl SyncError {
    /// A short stable code for the sink's status (never a message).
    fn code(&self) -> &'static str {
        match self {
            SyncError::Foreign => "secret_not_managed",
            SyncError::WrongType(_) => "secret_wrong_type",
            SyncError::Api(_) => "kubernetes_api_error",
            SyncError::Conflicts => "write_conflicts",
            SyncError::NotLeader => "not_leader",
        }
    }
}

/// `call`, bounded by the leader's write deadline when there is a guard.
async fn guarded<T>(
    guard: Option<&Leadership>,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, SyncError> {
    let Some(g) = guard else {
        return Ok(call.await?);
    };
    let deadline = g.write_deadline().ok_or(SyncError::NotLeader)?;
    match tokio::time::timeout_at(deadline, call).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SyncError::NotLeader),
    }
}

/// Immediately before a write: still the leader, within the renew deadline?
fn may_write(guard: Option<&Leadership>) -> Result<(), SyncError> {
    match guard {
        Some(g) if !g.may_write() => Err(SyncError::NotLeader),
        _ => Ok(()),
    }
}

/// Records the writer in `meta` (with a guard).
fn sign(meta: &mut ObjectMeta, guard: Option<&Leadership>) {
    if let Some(g) = guard {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(WRITTEN_BY.to_string(), g.identity().to_string());
    }
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

/// Annotation prefixes of the cloud identity keys a ServiceAccount may carry; only these
/// reach a provider (a ServiceAccount's other annotations, such as kubectl's
/// last-applied-configuration, are none of its business).
const IDENTITY_ANNOTATION_PREFIXES: &[&str] = &[
    "eks.amazonaws.com/",
    "azure.workload.identity/",
    "kubernetes.azure.com/",
    "iam.gke.io/",
    "gcp.auth.fluxcd.io/",
];

/// How long a requested ServiceAccount token lives, and when it is requested anew.
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
const TOKEN_RENEW_AFTER: Duration = Duration::from_secs(40 * 60);

/// (namespace, name, UID, audience) of a requested token.
type TokenKey = (String, String, String, String);

/// A requested token: when to request it anew, when it expires, and whether a pass used
/// it since the last [`TokenCache::sweep`].
struct CachedToken {
    token: regbroker_provider::SecretString,
    renew_at: tokio::time::Instant,
    expires_at: tokio::time::Instant,
    used: bool,
}

/// The tokens kept, pruned after every pass: only what a configured Secret still uses
/// (issue 30, finding 5: before, every (ServiceAccount, UID, audience) ever seen stayed
/// in memory with its token, so a tenant rewriting its audience annotation each pass, or
/// recreating its ServiceAccount, grew it without bound).
#[derive(Default)]
struct TokenCache(BTreeMap<TokenKey, CachedToken>);

impl TokenCache {
    /// The token kept for `key` while it is young enough, marked as used.
    fn get(
        &mut self,
        key: &TokenKey,
        now: tokio::time::Instant,
    ) -> Option<regbroker_provider::SecretString> {
        let cached = self.0.get_mut(key).filter(|c| now < c.renew_at)?;
        cached.used = true;
        Some(cached.token.clone())
    }

    /// Keeps `token`, just requested at `now`, for `key`, marked as used.
    fn insert(
        &mut self,
        key: TokenKey,
        token: regbroker_provider::SecretString,
        now: tokio::time::Instant,
    ) {
        let cached = CachedToken {
            token,
            renew_at: now + TOKEN_RENEW_AFTER,
            expires_at: now + TOKEN_LIFETIME,
            used: true,
        };
        self.0.insert(key, cached);
    }

    /// Drops the tokens no lookup used since the last sweep (their Secret is gone, or
    /// asks for another ServiceAccount, UID or audience now) and those expired by `now`.
    fn sweep(&mut self, now: tokio::time::Instant) {
        self.0.retain(|_, c| c.used && now < c.expires_at);
        for c in self.0.values_mut() {
            c.used = false;
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// ServiceAccount tokens from TokenRequest, one per (ServiceAccount, UID, audience), kept
/// in memory only, requested anew well before they expire, and dropped once no pass uses
/// them: what the Secret sync uses for a `[[secret]]` with a `service_account` (public
/// for its tests).
pub struct Tokens {
    client: kube::Client,
    cache: tokio::sync::Mutex<TokenCache>,
    /// TokenRequest calls, at most [`TOKEN_REQUEST_RATE`]: a restart with thousands of
    /// tenants does not flood the API server.
    budget: regbroker_provider::Budget<()>,
}

/// TokenRequests per second (and burst) the Secret sync may make.
const TOKEN_REQUEST_RATE: regbroker_provider::Rate = regbroker_provider::Rate {
    per_second: 10.0,
    burst: 20,
};

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens").finish_non_exhaustive()
    }
}

impl Tokens {
    /// Tokens requested through `client`.
    pub fn new(client: kube::Client) -> Tokens {
        Tokens {
            client,
            cache: tokio::sync::Mutex::new(TokenCache::default()),
            budget: regbroker_provider::Budget::new(TOKEN_REQUEST_RATE),
        }
    }

    /// The ServiceAccount's UID and its identity annotations.
    pub async fn account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(String, BTreeMap<String, String>), regbroker_provider::Error> {
        use k8s_openapi::api::core::v1::ServiceAccount;
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let sa = api.get_opt(name).await.map_err(|e| {
            regbroker_provider::Error::unavailable(format!(
                "cannot read ServiceAccount {namespace}/{name}"
            ))
            .with_source(e)
        })?;
        let Some(sa) = sa else {
            return Err(regbroker_provider::Error::identity_missing(format!(
                "ServiceAccount {namespace}/{name} does not exist"
            )));
        };
        let uid = sa.metadata.uid.unwrap_or_default();
        let annotations = sa
            .metadata
            .annotations
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| {
                IDENTITY_ANNOTATION_PREFIXES
                    .iter()
                    .any(|p| k.starts_with(p))
            })
            .collect();
        Ok((uid, annotations))
    }

    /// A token of ServiceAccount `namespace/name` (UID `uid`) for `audience`: the one kept
    /// for that key while it is young enough, else a new one from TokenRequest.
    pub async fn token(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        audience: &str,
    ) -> Result<regbroker_provider::SecretString, regbroker_provider::Error> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let key = (
            namespace.to_string(),
            name.to_string(),
            uid.to_string(),
            audience.to_string(),
        );
        let mut cache = self.cache.lock().await;
        let now = tokio::time::Instant::now();
        if let Some(token) = cache.get(&key, now) {
            return Ok(token);
        }
        self.budget.acquire(&()).await;
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.to_string()],
                expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                regbroker_provider::Error::identity_missing(format!(
                    "TokenRequest for ServiceAccount {namespace}/{name} (audience {audience}) failed; regbroker needs `create` on serviceaccounts/token for it"
                ))
                .with_source(e)
            })?;
        let token = answer
            .status
            .map(|s| regbroker_provider::SecretString::from(s.token))
            .ok_or_else(|| {
                regbroker_provider::Error::bad_response(format!(
                    "TokenRequest for ServiceAccount {namespace}/{name} answered without a token"
                ))
            })?;
        tracing::debug!(service_account = %format!("{namespace}/{name}"), audience, "Requested a ServiceAccount token");
        cache.insert(key, token.clone(), now);
        Ok(token)
    }

    /// Forgets the tokens no [`Self::token`] call asked for since the last sweep, and the
    /// expired ones. The Secret sync sweeps after each whole pass, in which every
    /// configured Secret asks for the tokens it needs.
    pub async fn sweep(&self) {
        self.cache.lock().await.sweep(tokio::time::Instant::now());
    }

    /// How many tokens are kept.
    pub async fn len(&self) -> usize {
        self.cache.lock().await.len()
    }

    /// Whether no token is kept.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }
}

/// The credential for `registry` as ServiceAccount `namespace/name`: a static entry or a
/// registry nobody serves as for every Secret; a provider's credential with that
/// ServiceAccount's own token, for the audience the provider asks, never this process's
/// identity.
async fn credential_as(
    broker: &Broker,
    tokens: &Tokens,
    namespace: &str,
    name: &str,
    registry: &Registry,
) -> Result<crate::broker::Served, crate::broker::BrokerError> {
    use crate::broker::{BrokerError, Route};
    let decision = broker.decide(registry);
    let provider = match &decision.route {
        Route::Provider(p, _) => p.clone(),
        _ => return broker.serve(registry, decision.route).await,
    };
    let fail = |e: regbroker_provider::Error| BrokerError::Provider {
        provider: provider.name(),
        error: Arc::new(e),
    };
    let (uid, annotations) = tokens.account(namespace, name).await.map_err(fail)?;
    let audience = provider.workload_audience(&annotations).map_err(|e| {
        fail(regbroker_provider::Error::new(
            e.kind(),
            format!("ServiceAccount {namespace}/{name}: {}", e.message()),
        ))
    })?;
    let token = tokens
        .token(namespace, name, &uid, &audience)
        .await
        .map_err(fail)?;
    // Every stored ServiceAccount has a UID; one without (an API anomaly) is refused
    // rather than cached under a scope a later ServiceAccount of that name would share.
    let account =
        regbroker_provider::ServiceAccount::new(namespace, name, Some(uid)).map_err(fail)?;
    let workload =
        regbroker_provider::WorkloadIdentity::new(account, token, annotations).map_err(fail)?;
    broker.fresh_credential_for(registry, &workload).await
}

/// The delay after `failures` consecutive failures: 5 s, 10 s, 20 s, 40 s, then 60 s.
fn backoff(failures: u32) -> Duration {
    MIN_SLEEP
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_SLEEP)
}

fn is_ours(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY)
}

/// `contents` plus the entries the Secret already holds for `missing` registries (wanted,
/// but with no credential this pass because the fetch failed), or `None` if there are
/// none. A restart during a cloud outage then does not wipe credentials that may still
/// be valid; an expired entry is no worse than none.
fn keep_missing(
    contents: &str,
    existing: Option<&ByteString>,
    missing: &[Registry],
) -> Option<Zeroizing<String>> {
    if missing.is_empty() {
        return None;
    }
    let old: serde_json::Value = serde_json::from_slice(&existing?.0).ok()?;
    let old_auths = old.get("auths")?.as_object()?;
    let mut new: serde_json::Value = serde_json::from_str(contents).ok()?;
    let auths = new.get_mut("auths")?.as_object_mut()?;
    let mut kept = 0;
    for registry in missing {
        let key = registry.to_string();
        if let Some(entry) = old_auths.get(&key) {
            auths.insert(key, entry.clone());
            kept += 1;
        }
    }
    (kept > 0).then(|| Zeroizing::new(format!("{new:#}\n")))
}

/// Makes `secret` hold `contents`, creating it if absent. Never touches a Secret
/// without regbroker's label. Entries for `missing` registries are kept (see
/// [`keep_missing`]). With a `guard`, writes only while it may, and signs each write.
async fn upsert(
    client: &kube::Client,
    secret: &SecretRef,
    contents: &str,
    missing: &[Registry],
    guard: Option<&Leadership>,
) -> Result<Outcome, SyncError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &secret.namespace);
    let data =
        |contents: &[u8]| BTreeMap::from([(DATA_KEY.to_string(), ByteString(contents.to_vec()))]);
    for _ in 0..CONFLICT_RETRIES {
        match guarded(guard, api.get_opt(&secret.name)).await? {
            None => {
                let mut new = Secret {
                    metadata: ObjectMeta {
                        name: Some(secret.name.clone()),
                        namespace: Some(secret.namespace.clone()),
                        labels: Some(BTreeMap::from([(
                            MANAGED_BY_LABEL.to_string(),
                            MANAGED_BY.to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    type_: Some(SECRET_TYPE.to_string()),
                    data: Some(data(contents.as_bytes())),
                    ..Secret::default()
                };
                sign(&mut new.metadata, guard);
                may_write(guard)?;
                match guarded(guard, api.create(&PostParams::default(), &new)).await {
                    Ok(_) => return Ok(Outcome::Created),
                    // Someone created it between our read and write: read again.
                    Err(SyncError::Api(kube::Error::Api(s)))
                        if s.is_already_exists() || s.is_conflict() => {}
                    Err(e) => return Err(e),
                }
            }
            Some(mut existing) => {
                if !is_ours(&existing.metadata) {
                    return Err(SyncError::Foreign);
                }
                let type_ = existing.type_.clone().unwrap_or_default();
                if type_ != SECRET_TYPE {
                    return Err(SyncError::WrongType(type_));
                }
                let current = existing.data.as_ref().and_then(|d| d.get(DATA_KEY));
                let kept = keep_missing(contents, current, missing);
                if kept.is_some() {
                    tracing::debug!(%secret, "Keeping the Secret's entries for registries whose fetch failed");
                }
                let contents = kept.as_deref().map_or(contents, |k| k.as_str()).as_bytes();
                let same = current.is_some_and(|c| c.0 == contents)
                    && existing.data.as_ref().is_some_and(|d| d.len() == 1)
                    && existing.string_data.is_none();
                if same {
                    return Ok(Outcome::Unchanged);
                }
                // Keep its metadata (resourceVersion included, so a concurrent write
                // conflicts instead of being overwritten).
                existing.data = Some(data(contents));
                existing.string_data = None;
                sign(&mut existing.metadata, guard);
                may_write(guard)?;
                let params = PostParams::default();
                let replace = api.replace(&secret.name, &params, &existing);
                match guarded(guard, replace).await {
                    Ok(_) => return Ok(Outcome::Updated),
                    Err(SyncError::Api(kube::Error::Api(s)))
                        if s.is_conflict() || s.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Err(SyncError::Conflicts)
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
            let outcome = match upsert(client, secret, &contents, &missing, guard).await {
                Ok(o) => {
                    target.failures = 0;
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
    fn only_a_leading_replica_may_write_and_its_writes_are_signed() {
        let leading = Leadership::for_tests("replica-a", true);
        let follower = Leadership::for_tests("replica-b", false);
        assert!(
            may_write(None).is_ok(),
            "without leader election every write goes"
        );
        assert!(may_write(Some(&leading)).is_ok());
        assert!(matches!(
            may_write(Some(&follower)),
            Err(SyncError::NotLeader)
        ));
        let mut meta = ObjectMeta::default();
        sign(&mut meta, None);
        assert_eq!(meta.annotations, None);
        sign(&mut meta, Some(&leading));
        assert_eq!(
            meta.annotations
                .unwrap()
                .get(WRITTEN_BY)
                .map(String::as_str),
            Some("replica-a")
        );
    }

    #[test]
    fn a_secret_is_ours_only_with_our_managed_by_label() {
        let meta = |labels: &[(&str, &str)]| ObjectMeta {
            labels: (!labels.is_empty()).then(|| {
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..ObjectMeta::default()
        };
        assert!(is_ours(&meta(&[(MANAGED_BY_LABEL, MANAGED_BY)])));
        assert!(!is_ours(&meta(&[(MANAGED_BY_LABEL, "helm")])));
        assert!(!is_ours(&meta(&[("app", MANAGED_BY)])));
        assert!(!is_ours(&meta(&[])));
    }

    #[test]
    fn entries_of_registries_that_failed_this_pass_are_kept_from_the_secret() {
        let r = |h: &str| Registry::parse(h).unwrap();
        let existing = ByteString(
            br#"{"auths": {"a.example.com": {"auth": "old-a"}, "b.example.com": {"auth": "old-b"}, "gone.example.com": {"auth": "old-g"}}}"#
                .to_vec(),
        );
        let contents = r#"{"auths": {"c.example.com": {"auth": "new-c"}}}"#;
        let kept = keep_missing(
            contents,
            Some(&existing),
            &[r("a.example.com"), r("b.example.com"), r("x.example.com")],
        )
        .expect("two entries kept");
        let v: serde_json::Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(v["auths"]["a.example.com"]["auth"], "old-a");
        assert_eq!(v["auths"]["b.example.com"]["auth"], "old-b");
        assert_eq!(v["auths"]["c.example.com"]["auth"], "new-c");
        assert!(
            v["auths"].get("gone.example.com").is_none(),
            "not wanted: dropped"
        );
        // Nothing missing, or nothing of it in the Secret: the contents as they are.
        assert!(keep_missing(contents, Some(&existing), &[]).is_none());
        assert!(keep_missing(contents, Some(&existing), &[r("x.example.com")]).is_none());
        assert!(keep_missing(contents, None, &[r("a.example.com")]).is_none());
    }

    #[test]
    fn secret_refs_parse_and_reject_with_clear_errors() {
        let r: SecretRef = "flux-system/regbroker-ecr".parse().unwrap();
        assert_eq!(r.namespace, "flux-system");
        assert_eq!(r.name, "regbroker-ecr");
        assert_eq!(r.to_string(), "flux-system/regbroker-ecr");
        assert!("a/b.c".parse::<SecretRef>().is_ok());
        for bad in [
            "name", "/name", "ns/", "NS/name", "ns/Name", "a.b/name", "ns/-x", "ns/a/b", "ns/x_y",
        ] {
            let e = bad.parse::<SecretRef>().unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!("ns/name".parse::<SecretRef>().is_ok());
    }

    #[test]
    fn service_account_tokens_are_renewed_well_before_they_expire_and_not_too_often() {
        // At least ten minutes of life left at renewal (a slow API server, a clock step),
        // and no more than two requests per token lifetime (TokenRequest load).
        assert!(TOKEN_LIFETIME - TOKEN_RENEW_AFTER >= Duration::from_secs(600));
        assert!(TOKEN_RENEW_AFTER >= TOKEN_LIFETIME / 2);
    }

    fn token_key(uid: &str, audience: &str) -> TokenKey {
        (
            "team-a".into(),
            "puller".into(),
            uid.into(),
            audience.into(),
        )
    }

    fn token(s: &str) -> regbroker_provider::SecretString {
        regbroker_provider::SecretString::from(s.to_string())
    }

    #[test]
    fn tokens_no_pass_asks_for_are_forgotten_after_it() {
        use regbroker_provider::ExposeSecret;
        let mut cache = TokenCache::default();
        let t0 = tokio::time::Instant::now();
        // A tenant rewrites its audience annotation before every pass, and recreates its
        // ServiceAccount (a new UID) now and then: one token a pass, never more kept.
        for pass in 0..50u32 {
            let now = t0 + Duration::from_secs(u64::from(pass) * 60);
            let key = token_key(&format!("uid-{}", pass / 10), &format!("aud-{pass}"));
            assert!(cache.get(&key, now).is_none());
            cache.insert(key.clone(), token(&format!("t-{pass}")), now);
            assert_eq!(
                cache.get(&key, now).unwrap().expose_secret(),
                format!("t-{pass}")
            );
            cache.sweep(now);
            assert_eq!(cache.len(), 1, "pass {pass}");
        }
        // A token used in every pass is kept across them, and reused while young.
        let mut cache = TokenCache::default();
        let steady = token_key("uid-1", "sts.amazonaws.com");
        cache.insert(steady.clone(), token("steady"), t0);
        for minute in 1..30u64 {
            let now = t0 + Duration::from_secs(minute * 60);
            assert_eq!(cache.get(&steady, now).unwrap().expose_secret(), "steady");
            cache.sweep(now);
        }
        assert_eq!(cache.len(), 1);
        // A pass that does not ask for it (its Secret was removed) forgets it.
        cache.sweep(t0 + Duration::from_secs(1800));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn an_expired_token_is_forgotten_even_if_used() {
        let mut cache = TokenCache::default();
        let t0 = tokio::time::Instant::now();
        let key = token_key("uid-1", "sts.amazonaws.com");
        cache.insert(key.clone(), token("t"), t0);
        // Past its renewal point a lookup misses (the caller requests a new one); a sweep
        // just before expiry keeps it once more, one at expiry drops it.
        assert!(cache.get(&key, t0 + TOKEN_RENEW_AFTER).is_none());
        cache.0.get_mut(&key).unwrap().used = true;
        cache.sweep(t0 + TOKEN_LIFETIME - Duration::from_secs(1));
        assert_eq!(cache.len(), 1);
        cache.0.get_mut(&key).unwrap().used = true;
        cache.sweep(t0 + TOKEN_LIFETIME);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn backoff_doubles_from_min_to_max() {
        let got: Vec<u64> = (1..=6).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(got, [5, 10, 20, 40, 60, 60]);
        assert_eq!(backoff(u32::MAX), MAX_SLEEP);
    }
}
