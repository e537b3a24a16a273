//! The narrow interface between regbroker and its cloud providers.
//!
//! A provider owns three things: the host patterns it recognises (strict and anchored),
//! the identity chain it reads, and the exchange that turns that identity into registry
//! credentials. It knows nothing of caching, HTTP serving or client protocols; the
//! broker knows nothing of a cloud's wire format. This crate has no cloud dependency so
//! that every provider depends only on this narrow interface.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod budget;
mod clock;
mod credential;
pub mod diagnosis;
mod error;
mod registry;
pub mod subject_token;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
mod workload;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use budget::{Budget, Rate};
#[cfg(any(test, feature = "test-util"))]
pub use clock::ManualClock;
pub use clock::{Clock, SharedClock, SystemClock, system_clock};
pub use credential::{Credential, IDENTITY_TOKEN_USERNAME, MAX_LIFETIME, cap_expiry};
pub use diagnosis::{Diagnosis, Finding, IdentityKind, Status};
pub use error::{Error, ErrorKind};
pub use registry::{DOCKER_HUB, MAX_HOST_LEN, ParseError, ReferenceError, Registry};
pub use secrecy::{ExposeSecret, SecretString};
pub use workload::{ServiceAccount, WorkloadIdentity};

/// Timeouts and retries for a provider's token calls (the GCP and federated providers'
/// exchanges). Retried are only what cannot have been acted on: 5xx, 429 and a refused
/// connection.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// Longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest wait for a whole request, body included.
    pub request_timeout: Duration,
    /// How many times a call is made at most when the upstream answers 5xx or 429, or
    /// refuses the connection (1 = no retry).
    pub attempts: u32,
    /// Delay before the first retry; doubles for each further retry.
    pub backoff: Duration,
}

impl Default for HttpSettings {
    fn default() -> HttpSettings {
        HttpSettings {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            attempts: 3,
            backoff: Duration::from_millis(200),
        }
    }
}

/// The most bytes a provider reads of one upstream answer (token endpoints answer a few
/// KiB). A longer answer is a `BadResponse` error, and nothing past the cap is buffered.
pub const MAX_UPSTREAM_BODY: usize = 64 * 1024;

/// A boxed future, as returned by the object-safe [`Provider::fetch`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Provider options from a routing rule (`region = "eu-west-1"`, `account = "..."`).
pub type Options = BTreeMap<String, String>;

/// What a provider will fetch: the registry asked for, plus everything the provider
/// worked out from the host or the rule (region, account, role...), and the workload
/// whose own identity is used, if any ([`Provider::bind_workload`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    registry: Registry,
    scope: String,
    /// Names are the providers' constants; values are often constants too (a host kind,
    /// a universe), so neither is copied for every request that builds a target.
    params: BTreeMap<&'static str, Cow<'static, str>>,
    workload: Option<WorkloadIdentity>,
}

impl Target {
    /// A target for `registry` whose credential is shared by every target with the same
    /// `scope`. The scope must name everything the credential depends on: the identity
    /// (role, client id), the partition or region, the account. Two targets with the
    /// same provider and scope get the same cached credential.
    pub fn new(registry: Registry, scope: impl Into<String>) -> Target {
        Target {
            registry,
            scope: scope.into(),
            params: BTreeMap::new(),
            workload: None,
        }
    }

    /// This target for `workload`'s own identity: its scope then also names the
    /// ServiceAccount (namespace, name, UID), whatever the provider put in it. Providers
    /// call this from [`Provider::bind_workload`] after putting the cloud identity (the
    /// role, the client id) into the scope; it is the one place a ServiceAccount enters a
    /// cache key.
    pub fn for_workload(mut self, workload: WorkloadIdentity) -> Target {
        self.scope = format!("{}|{}", workload.scope_part(), self.scope);
        self.workload = Some(workload);
        self
    }

    /// The workload whose own identity this target uses; `None`: the identity of this
    /// process (the pod's or node's).
    pub fn workload(&self) -> Option<&WorkloadIdentity> {
        self.workload.as_ref()
    }

    /// Adds a provider-specific parameter.
    pub fn with_param(mut self, key: &'static str, value: impl Into<Cow<'static, str>>) -> Target {
        self.params.insert(key, value.into());
        self
    }

    /// The registry the client asked for.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The cache scope (see [`Target::new`]).
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// A provider-specific parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params.get(key).map(|v| &**v)
    }
}

/// A source of contextual registry credentials: one cloud.
///
/// The trait is object safe so the broker can hold `Arc<dyn Provider>`; implementations
/// keep their real work in an inherent `async fn` and box it in [`Provider::fetch`].
pub trait Provider: Send + Sync + fmt::Debug {
    /// `aws`, `azure`, `gcp`: the name used in rules, metrics and responses.
    fn name(&self) -> &'static str;

    /// Auto-detection: `Some` only for hosts that match this provider's own strict,
    /// anchored patterns. Must never match a host that merely resembles one.
    fn recognise(&self, registry: &Registry) -> Option<Target>;

    /// Checks a routing rule's options at start-up. The error names the bad key.
    fn check_options(&self, options: &Options) -> Result<(), String>;

    /// An explicit routing rule sent `registry` here with `options` (already checked).
    /// This may serve hosts that [`Provider::recognise`] would not, such as a
    /// pull-through proxy with an explicit region and account.
    fn target(&self, registry: &Registry, options: &Options) -> Result<Target, Error>;

    /// Binds `target` (from [`Provider::recognise`] or [`Provider::target`]) to a
    /// workload's own identity: reads the cloud identity from the ServiceAccount's
    /// annotations, validates it, and returns the target to fetch, made with
    /// [`Target::for_workload`] so its scope names the ServiceAccount and the cloud
    /// identity. An annotation that is present but malformed, or missing when this cloud
    /// needs it, is an error naming the annotation: never a fall back to this process's
    /// own identity.
    fn bind_workload(&self, target: Target, workload: WorkloadIdentity) -> Result<Target, Error> {
        let _ = (target, workload);
        Err(Error::invalid_config(format!(
            "the {} provider cannot use a workload's own identity (a ServiceAccount token) yet",
            self.name()
        )))
    }

    /// The audience a workload's ServiceAccount token must have for this provider's
    /// exchange of `target` (from [`Provider::recognise`] or [`Provider::target`]: a rule
    /// may name the audience), given the ServiceAccount's `annotations` (for callers that
    /// request the token themselves, as the Secret sync does with TokenRequest). An error
    /// names the annotation or option that is missing or malformed.
    fn workload_audience(
        &self,
        target: &Target,
        annotations: &BTreeMap<String, String>,
    ) -> Result<String, Error> {
        let _ = (target, annotations);
        Err(Error::invalid_config(format!(
            "the {} provider cannot use a workload's own identity (a ServiceAccount token) yet",
            self.name()
        )))
    }

    /// Exchanges this provider's identity (or the target's workload identity) for a
    /// credential for `target`.
    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>>;

    /// The kind of identity a fetch would use, judged from env vars and files only: no
    /// network call, no token read (`GET /v1/providers`).
    fn identity_kind(&self) -> IdentityKind {
        IdentityKind::None
    }

    /// Whether this provider's credentials are the subject token itself
    /// ([`Credential::passes_subject_token`]), known before any fetch: a caller with no
    /// workload token to pass (the kubelet mode without `tokenAttributes`) refuses the
    /// route rather than read a token file of its own.
    fn passes_subject_token(&self) -> bool {
        false
    }

    /// The host patterns [`Provider::recognise`] accepts, for people (kubelet-style
    /// globs and placeholders, e.g. `<account>.dkr.ecr.<region>.amazonaws.com`).
    fn auto_detect_patterns(&self) -> Vec<String> {
        Vec::new()
    }

    /// `regbroker doctor REGISTRY`: checks of what a fetch for `target` would use that
    /// its rule names (the federated providers' token file: present, readable, its
    /// audience and expiry), before doctor's one real exchange. No network call; no
    /// finding holds a secret or a token. Clouds check their identity in
    /// [`Provider::diagnose`] instead.
    fn diagnose_target(&self, target: &Target) -> Vec<Finding> {
        let _ = target;
        Vec::new()
    }

    /// `regbroker doctor`: which identity this provider would use and why, then one real
    /// call that checks the identity endpoint accepts it, every network call bounded by
    /// `timeout`. Findings never hold a secret or a token.
    fn diagnose(&self, timeout: Duration) -> BoxFuture<'_, Diagnosis> {
        let _ = timeout;
        let name = self.name();
        let identity = self.identity_kind();
        Box::pin(async move {
            Diagnosis {
                identity,
                explicit: false,
                findings: vec![Finding::info(
                    format!("{name}.identity"),
                    "this provider has no diagnostics",
                )],
            }
        })
    }
}

/// A short, stable fingerprint of identity settings, for a cache scope: the first 16 hex
/// digits of a SHA-256 over every `(name, value)` pair (each length-prefixed, so no two
/// lists collide by concatenation). Give it what names an identity (a key id, a client
/// email, a profile, an endpoint override), never a secret: the hash is not a vault, and
/// a secret that changes must not change the scope anyway.
pub fn fingerprint(parts: &[(&str, Option<&str>)]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (name, value) in parts {
        for field in [Some(*name), *value] {
            match field {
                Some(f) => {
                    h.update((f.len() as u64).to_be_bytes());
                    h.update(f.as_bytes());
                }
                None => h.update(u64::MAX.to_be_bytes()),
            }
        }
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// At most `max` characters of an untrusted value, for a one-line error message: anything
/// but printable ASCII becomes `?`, so a value can neither break the line nor smuggle
/// control characters into a log.
pub fn printable(value: &str, max: usize) -> String {
    value
        .chars()
        .take(max)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

/// Rejects every option key not in `known`, naming the first unknown one.
pub fn check_known_options(
    provider: &str,
    options: &Options,
    known: &[&str],
) -> Result<(), String> {
    match options.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) if known.is_empty() => Err(format!(
            "unknown option `{k}`: the {provider} provider takes no options"
        )),
        Some(k) => Err(format!(
            "unknown option `{k}` for the {provider} provider (known: {})",
            known.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_tell_identities_apart_and_are_stable() {
        let a = fingerprint(&[("key_id", Some("AKIAAAAA")), ("profile", None)]);
        assert_eq!(a.len(), 16);
        assert_eq!(
            a,
            fingerprint(&[("key_id", Some("AKIAAAAA")), ("profile", None)])
        );
        assert_ne!(
            a,
            fingerprint(&[("key_id", Some("AKIABBBB")), ("profile", None)])
        );
        // An unset setting is not the empty string, and fields never run together.
        assert_ne!(
            a,
            fingerprint(&[("key_id", Some("AKIAAAAA")), ("profile", Some(""))])
        );
        assert_ne!(
            fingerprint(&[("a", Some("bc"))]),
            fingerprint(&[("ab", Some("c"))])
        );
    }

    #[test]
    fn a_workload_target_names_the_service_account_in_its_scope() {
        let registry = Registry::parse("123456789012.dkr.ecr.us-east-1.amazonaws.com").unwrap();
        let base = Target::new(registry.clone(), "role|us-east-1|123456789012");
        let jwt = test_util::service_account_jwt("team-a", "puller", "u-1");
        let workload = WorkloadIdentity::from_token(jwt.into(), BTreeMap::new()).unwrap();
        let bound = base.clone().for_workload(workload.clone());
        assert_eq!(
            bound.scope(),
            "sa=team-a/puller/u-1|role|us-east-1|123456789012"
        );
        assert_eq!(bound.workload(), Some(&workload));
        assert_eq!(base.workload(), None);
        let other = WorkloadIdentity::from_token(
            test_util::service_account_jwt("team-b", "puller", "u-2").into(),
            BTreeMap::new(),
        )
        .unwrap();
        assert_ne!(base.for_workload(other).scope(), bound.scope());
    }
}
