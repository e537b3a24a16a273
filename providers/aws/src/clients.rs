//! The SDK clients of an [`AwsProvider`]: the shared SDK configuration, loaded once on
//! the first fetch, and the ECR and ECR Public clients built from it, kept per
//! (role, region) in a bounded [`ClientCache`] so the SDK's identity cache (and any
//! assumed-role session) is reused across fetches.
//!
//! Env vars and settings read (through aws-config, when the configuration loads): the
//! identity chain and endpoint variables listed in the crate docs, and for the region of
//! the identity chain's own calls `AWS_REGION`, `AWS_DEFAULT_REGION` and the profile's
//! `region` (`AWS_PROFILE`, `AWS_CONFIG_FILE`), else `us-east-1`. The builder's
//! endpoint, credentials, call settings and clock take precedence.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::SystemTime;

use aws_config::BehaviorVersion;
use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_config::retry::RetryConfig;
use aws_config::sts::AssumeRoleProvider;
use aws_config::timeout::TimeoutConfig;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_types::SdkConfig;
use aws_types::region::Region;
use regbroker_provider::SharedClock;

use crate::{AwsProvider, PUBLIC_REGION, SESSION_NAME};

/// Most clients kept at once. The region comes from the client's host, so a caller could
/// name many made-up regions; past this many the map starts afresh (a client is cheap to
/// rebuild: the base identity cache lives in the shared SDK config; a `role_arn` client
/// costs one more AssumeRole).
const MAX_CLIENTS: usize = 64;

/// Clients are kept per (role, region) so the SDK's identity cache (and any assumed role
/// session) is reused across fetches.
pub(crate) type ClientKey = (Option<String>, String);

/// Clients by key, at most [`MAX_CLIENTS`] of them: past that the map starts afresh.
pub(crate) struct ClientCache<K, C>(Mutex<HashMap<K, C>>);

impl<K, C> Default for ClientCache<K, C> {
    fn default() -> Self {
        ClientCache(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + Hash, C: Clone> ClientCache<K, C> {
    /// The client kept for `key`, if any.
    fn get(&self, key: &K) -> Option<C> {
        lock(&self.0).get(key).cloned()
    }

    /// Keeps `client` for `key` unless a client was kept for it meanwhile; returns the
    /// client kept.
    fn keep(&self, key: K, client: C) -> C {
        let mut clients = lock(&self.0);
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.entry(key).or_insert(client).clone()
    }
}

impl AwsProvider {
    /// The shared SDK configuration, loaded on the first call.
    pub(crate) async fn sdk_config(&self) -> &SdkConfig {
        self.sdk
            .get_or_init(|| async {
                let s = &self.settings;
                let calls = &s.calls;
                // Region of the identity chain's own calls (STS for IRSA/AssumeRole). IMDS
                // is left out on purpose: on EKS a pod often cannot reach it, and waiting
                // for it would only delay the first fetch.
                let region =
                    RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
                        .or_else(ProfileFileRegionProvider::new())
                        .or_else(Region::from_static(PUBLIC_REGION));
                let mut loader = aws_config::defaults(BehaviorVersion::latest())
                    .region(region)
                    .retry_config(
                        RetryConfig::standard()
                            .with_max_attempts(calls.max_attempts.max(1))
                            .with_initial_backoff(calls.initial_backoff)
                            .with_max_backoff(calls.max_backoff),
                    )
                    .timeout_config(
                        TimeoutConfig::builder()
                            .connect_timeout(calls.connect_timeout)
                            .operation_attempt_timeout(calls.attempt_timeout)
                            .operation_timeout(calls.operation_timeout)
                            .build(),
                    )
                    .time_source(ClockTimeSource(s.clock.clone()));
                if let Some(url) = &s.endpoint_url {
                    loader = loader.endpoint_url(url.clone());
                }
                if let Some(creds) = &s.credentials {
                    loader = loader.credentials_provider(creds.clone());
                }
                let config = loader.load().await;
                tracing::debug!(region = ?config.region(), "Loaded AWS configuration");
                config
            })
            .await
    }

    /// Credentials for `role_arn` (assumed from the base identity) in `region`, or `None`
    /// for the base identity itself.
    async fn role_credentials(
        &self,
        role_arn: Option<&str>,
        region: &str,
    ) -> Option<SharedCredentialsProvider> {
        let role = role_arn?;
        let sdk = self.sdk_config().await;
        let provider = AssumeRoleProvider::builder(role)
            .session_name(SESSION_NAME)
            .region(Region::new(region.to_string()))
            .configure(sdk)
            .build()
            .await;
        Some(SharedCredentialsProvider::new(provider))
    }

    /// The ECR client for `role_arn` (or the base identity) in `region`.
    pub(crate) async fn ecr_client(
        &self,
        role_arn: Option<&str>,
        region: &str,
    ) -> aws_sdk_ecr::Client {
        let key = (role_arn.map(str::to_string), region.to_string());
        if let Some(c) = self.ecr.get(&key) {
            return c;
        }
        let sdk = self.sdk_config().await;
        let mut conf =
            aws_sdk_ecr::config::Builder::from(sdk).region(Region::new(region.to_string()));
        if let Some(creds) = self.role_credentials(role_arn, region).await {
            conf = conf.credentials_provider(creds);
        }
        let client = aws_sdk_ecr::Client::from_conf(conf.build());
        self.ecr.keep(key, client)
    }

    /// The ECR Public client for `role_arn` (or the base identity).
    pub(crate) async fn public_client(&self, role_arn: Option<&str>) -> aws_sdk_ecrpublic::Client {
        let key = role_arn.map(str::to_string);
        if let Some(c) = self.public.get(&key) {
            return c;
        }
        let sdk = self.sdk_config().await;
        let mut conf = aws_sdk_ecrpublic::config::Builder::from(sdk)
            .region(Region::from_static(PUBLIC_REGION));
        if let Some(creds) = self.role_credentials(role_arn, PUBLIC_REGION).await {
            conf = conf.credentials_provider(creds);
        }
        let client = aws_sdk_ecrpublic::Client::from_conf(conf.build());
        self.public.keep(key, client)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The injected clock as the SDK's time source.
#[derive(Debug)]
struct ClockTimeSource(SharedClock);

impl aws_smithy_async::time::TimeSource for ClockTimeSource {
    fn now(&self) -> SystemTime {
        self.0.now()
    }
}
