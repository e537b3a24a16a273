//! Where the leader election record lives: the [`LeaseStore`] trait the elector runs
//! over, and its real implementation on a `coordination.k8s.io/v1` Lease through kube-rs
//! ([`KubeLeaseStore`], tested against a real API server in `tests/kube_leader.rs`).

use std::fmt;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use regbroker_provider::BoxFuture;

use super::Config;

/// The leader election record a Lease holds (its spec).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Who holds it; empty when released.
    pub holder: String,
    /// How long the holder's lease lasts after each renewal, in seconds.
    pub lease_duration_seconds: i32,
    /// When the current holder took it (the holder's clock; informative only).
    pub acquire_time: Option<SystemTime>,
    /// When the holder last renewed it (the holder's clock; informative only).
    pub renew_time: Option<SystemTime>,
    /// How many times the holder changed.
    pub transitions: i32,
}

/// A record as read from (or written to) the store, with its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The record.
    pub record: Record,
    /// The object's `resourceVersion`, sent back with the next update.
    pub resource_version: String,
}

/// Why a Lease call failed, sorted by what the elector does next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Someone else wrote it since it was read (409), or created it first: this round is
    /// lost.
    #[error("the Lease was changed by another replica")]
    Conflict,
    /// The call did not finish within its timeout.
    #[error("the Lease call timed out after {0:?}")]
    Timeout(Duration),
    /// The API refused or failed.
    #[error("Kubernetes API: {0}")]
    Api(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Where the record lives: a Lease in the real API server, a map in tests.
pub trait LeaseStore: Send + Sync + fmt::Debug {
    /// The record, or `None` when there is no Lease.
    fn get(&self) -> BoxFuture<'_, Result<Option<Observed>, StoreError>>;
    /// Creates the Lease holding `record`; [`StoreError::Conflict`] if it exists.
    fn create<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Observed, StoreError>>;
    /// Replaces the record, only if the Lease is still at `resource_version`.
    fn update<'a>(
        &'a self,
        record: &'a Record,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<Observed, StoreError>>;
}

/// The Lease `namespace/name` through kube-rs, each call bounded by a timeout.
#[derive(Clone)]
pub struct KubeLeaseStore {
    api: Api<Lease>,
    name: String,
    timeout: Duration,
}

impl fmt::Debug for KubeLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeLeaseStore")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn micro_time(t: Option<SystemTime>) -> Option<MicroTime> {
    t.and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
        .map(MicroTime)
}

fn lease_of(name: &str, record: &Record, resource_version: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: resource_version.map(str::to_string),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(record.holder.clone()),
            lease_duration_seconds: Some(record.lease_duration_seconds),
            acquire_time: micro_time(record.acquire_time),
            renew_time: micro_time(record.renew_time),
            lease_transitions: Some(record.transitions),
            ..LeaseSpec::default()
        }),
    }
}

fn observed_of(lease: Lease) -> Observed {
    let spec = lease.spec.unwrap_or_default();
    Observed {
        record: Record {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.map(|t| SystemTime::from(t.0)),
            renew_time: spec.renew_time.map(|t| SystemTime::from(t.0)),
            transitions: spec.lease_transitions.unwrap_or(0),
        },
        resource_version: lease.metadata.resource_version.unwrap_or_default(),
    }
}

fn api_error(e: kube::Error) -> StoreError {
    match e {
        kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() => StoreError::Conflict,
        e => StoreError::Api(Box::new(e)),
    }
}

impl KubeLeaseStore {
    /// The Lease of `config` through `client`.
    pub fn new(client: kube::Client, config: &Config) -> KubeLeaseStore {
        KubeLeaseStore {
            api: Api::namespaced(client, &config.namespace),
            name: config.name.clone(),
            timeout: config.call_timeout(),
        }
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(api_error),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

impl LeaseStore for KubeLeaseStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<Observed>, StoreError>> {
        Box::pin(async move {
            Ok(self
                .bounded(self.api.get_opt(&self.name))
                .await?
                .map(observed_of))
        })
    }

    fn create<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Observed, StoreError>> {
        Box::pin(async move {
            let lease = lease_of(&self.name, record, None);
            let created = self
                .bounded(self.api.create(&PostParams::default(), &lease))
                .await?;
            Ok(observed_of(created))
        })
    }

    fn update<'a>(
        &'a self,
        record: &'a Record,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<Observed, StoreError>> {
        Box::pin(async move {
            let lease = lease_of(&self.name, record, Some(resource_version));
            let replaced = self
                .bounded(self.api.replace(&self.name, &PostParams::default(), &lease))
                .await?;
            Ok(observed_of(replaced))
        })
    }
}
