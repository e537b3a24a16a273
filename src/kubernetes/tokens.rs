//! ServiceAccount tokens from TokenRequest and the credentials fetched with them: the
//! identity of a workload other than this process (a `[[secret]]` entry's ServiceAccount,
//! a `RegistryCredential`'s), shared by the Secret sync and the controller.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, PostParams};
use regbroker_provider::Registry;

use crate::broker::Broker;

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

/// TokenRequests per second (and burst) the Secret sync and the controller may make:
/// ECR's per-caller budget (20/s), so a start with a thousand tenants' objects is bound
/// by the cloud's budget rather than by this one (BENCHMARKS.md section 8), while the API
/// server never sees more than kube-controller-manager's own default rate.
const TOKEN_REQUEST_RATE: regbroker_provider::Rate = regbroker_provider::Rate {
    per_second: 20.0,
    burst: 40,
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
    ) -> Result<Account, regbroker_provider::Error> {
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
pub(crate) async fn credential_as(
    broker: &Broker,
    tokens: &Tokens,
    namespace: &str,
    name: &str,
    registry: &Registry,
) -> Result<crate::broker::Served, crate::broker::BrokerError> {
    use crate::broker::{BrokerError, Route};
    let decision = broker.decide(registry);
    let (provider, target) = match &decision.route {
        Route::Provider(p, t) => (p.clone(), t),
        _ => return broker.serve(registry, decision.route).await,
    };
    let fail = |e: regbroker_provider::Error| BrokerError::Provider {
        provider: provider.name(),
        error: Arc::new(e),
    };
    let account = tokens.account(namespace, name).await.map_err(fail)?;
    let workload = workload_identity(tokens, namespace, name, account, &*provider, target)
        .await
        .map_err(|e| fail(e.into_inner()))?;
    broker.fresh_credential_for(registry, &workload).await
}

/// A ServiceAccount's UID and identity annotations, as [`Tokens::account`] reads them.
pub type Account = (String, BTreeMap<String, String>);

/// Why a workload identity could not be had, by step: what the controller makes of an
/// error depends on it (a missing annotation stalls, a failed TokenRequest is retried).
#[derive(Debug)]
pub(crate) enum WorkloadError {
    /// The ServiceAccount's annotations do not configure the provider (missing or
    /// malformed), or it has no UID.
    Annotations(regbroker_provider::Error),
    /// TokenRequest failed.
    Token(regbroker_provider::Error),
}

impl WorkloadError {
    pub(crate) fn into_inner(self) -> regbroker_provider::Error {
        match self {
            WorkloadError::Annotations(e) | WorkloadError::Token(e) => e,
        }
    }
}

/// ServiceAccount `namespace/name` (its UID and identity annotations, as
/// [`Tokens::account`] read them) as a workload of `provider` for `target`: its own
/// token, for the audience the provider asks (a federated rule names its own).
pub(crate) async fn workload_identity(
    tokens: &Tokens,
    namespace: &str,
    name: &str,
    (uid, annotations): Account,
    provider: &dyn regbroker_provider::Provider,
    target: &regbroker_provider::Target,
) -> Result<regbroker_provider::WorkloadIdentity, WorkloadError> {
    let audience = provider
        .workload_audience(target, &annotations)
        .map_err(|e| {
            WorkloadError::Annotations(regbroker_provider::Error::new(
                e.kind(),
                format!("ServiceAccount {namespace}/{name}: {}", e.message()),
            ))
        })?;
    // Every stored ServiceAccount has a UID; one without (an API anomaly) is refused
    // rather than cached under a scope a later ServiceAccount of that name would share.
    let account = regbroker_provider::ServiceAccount::new(namespace, name, Some(uid.clone()))
        .map_err(WorkloadError::Annotations)?;
    let token = tokens
        .token(namespace, name, &uid, &audience)
        .await
        .map_err(WorkloadError::Token)?;
    regbroker_provider::WorkloadIdentity::new(account, token, annotations)
        .map_err(WorkloadError::Annotations)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
}
