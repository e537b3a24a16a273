//! [`AwsProvider`]: the [`Provider`] for ECR and ECR Public. It recognises ECR hosts,
//! turns a host and a rule's options into a [`Target`] (kind, region, account, role and
//! the cache scope), and dispatches a fetch to the private or public exchange (see
//! `authorization_token`).
//!
//! Reads no env var itself; the SDK configuration it holds is loaded on the first fetch
//! (see `clients`).

use std::fmt;

use aws_types::SdkConfig;
use std::time::Duration;

use regbroker_provider::{
    BoxFuture, Budget, Credential, Diagnosis, Error, IdentityKind, Options, Provider, Registry,
    Target, WorkloadIdentity,
};
use tokio::sync::OnceCell;

use crate::PUBLIC_REGION;
use crate::builder::Builder;
use crate::clients::{ClientCache, ClientKey};
use crate::host::{self, EcrHost};
use crate::options::RuleOptions;
use crate::web_identity;

pub(crate) const P_KIND: &str = "kind";
pub(crate) const P_REGION: &str = "region";
pub(crate) const P_ACCOUNT: &str = "account";
const P_ROLE: &str = "role_arn";
const KIND_PRIVATE: &str = "private";
pub(crate) const KIND_PUBLIC: &str = "public";

/// The env vars that decide which identity the default chain uses and where its calls
/// go: the identity fingerprint in every cache scope is taken over their values, so two
/// processes with different identities never share a cached credential (say through one
/// `REGBROKER_CACHE_DIR`). Names and ids only: the secret key and session token are not
/// read.
const IDENTITY_ENV: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_ECR",
    "AWS_ENDPOINT_URL_ECR_PUBLIC",
    "AWS_ENDPOINT_URL_STS",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
];

/// The AWS provider: ECR and ECR Public.
pub struct AwsProvider {
    pub(crate) settings: Builder,
    pub(crate) sdk: OnceCell<SdkConfig>,
    pub(crate) ecr: ClientCache<ClientKey, aws_sdk_ecr::Client>,
    pub(crate) public: ClientCache<Option<String>, aws_sdk_ecrpublic::Client>,
    /// See [`IDENTITY_ENV`]; computed on first use.
    fingerprint: std::sync::OnceLock<String>,
    /// ECR `GetAuthorizationToken` calls per (caller account, region).
    pub(crate) ecr_budget: Budget<(String, String)>,
    /// STS `AssumeRoleWithWebIdentity` calls per region.
    pub(crate) sts_budget: Budget<String>,
}

impl fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsProvider")
            .field("settings", &self.settings)
            .field("loaded", &self.sdk.initialized())
            .finish()
    }
}

impl AwsProvider {
    /// The provider as deployed: identity, region and endpoints from the environment
    /// (aws-config's default chain), read on first use. Does no I/O.
    /// Fails only on an invalid `REGBROKER_AWS_ECR_RATE` or `REGBROKER_AWS_STS_RATE`,
    /// naming it (a configuration error).
    pub fn from_env() -> Result<AwsProvider, String> {
        Ok(Builder::default().rates_from_env()?.build())
    }

    /// Explicit settings, for tests and embedding.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The provider with these settings, nothing loaded yet (see [`Builder::build`]).
    pub(crate) fn new(settings: Builder) -> AwsProvider {
        use crate::builder::{DEFAULT_ECR_RATE, DEFAULT_STS_RATE};
        let settings_ecr_rate = settings.ecr_rate.unwrap_or(DEFAULT_ECR_RATE);
        let settings_sts_rate = settings.sts_rate.unwrap_or(DEFAULT_STS_RATE);
        AwsProvider {
            settings,
            sdk: OnceCell::new(),
            ecr: ClientCache::default(),
            public: ClientCache::default(),
            fingerprint: std::sync::OnceLock::new(),
            ecr_budget: Budget::new(settings_ecr_rate),
            sts_budget: Budget::new(settings_sts_rate),
        }
    }

    /// The fingerprint of the identity settings (see [`IDENTITY_ENV`]), with the
    /// builder's explicit endpoint and credentials in it too.
    fn fingerprint(&self) -> &str {
        self.fingerprint.get_or_init(|| {
            let env: Vec<(&str, Option<String>)> = IDENTITY_ENV
                .iter()
                .map(|k| (*k, std::env::var(k).ok().filter(|v| !v.is_empty())))
                .collect();
            let mut parts: Vec<(&str, Option<&str>)> =
                env.iter().map(|(k, v)| (*k, v.as_deref())).collect();
            parts.push((
                "builder.endpoint_url",
                self.settings.endpoint_url.as_deref(),
            ));
            parts.push((
                "builder.credentials",
                self.settings.credentials.as_ref().map(|_| "explicit"),
            ));
            regbroker_provider::fingerprint(&parts)
        })
    }

    /// Exchanges the identity for an ECR credential for `target` (see [`Provider::fetch`]).
    pub async fn fetch_credential(&self, target: &Target) -> Result<Credential, Error> {
        let role = target.param(P_ROLE);
        let kind = target.param(P_KIND);
        let place = match kind {
            Some(KIND_PRIVATE) => match (target.param(P_REGION), target.param(P_ACCOUNT)) {
                (Some(region), Some(account)) => Some((region, account)),
                _ => {
                    return Err(Error::invalid_config(
                        "aws target without region or account",
                    ));
                }
            },
            Some(KIND_PUBLIC) => None,
            _ => {
                return Err(Error::invalid_config(format!(
                    "{} was not prepared by the aws provider",
                    target.registry()
                )));
            }
        };
        let Some(workload) = target.workload() else {
            return match place {
                Some((region, account)) => self.fetch_private(role, region, account).await,
                None => self.fetch_public(role).await,
            };
        };
        // A workload's own identity: its role, assumed with its token through STS in the
        // registry's region, and nothing of this process's identity.
        let Some(role) = role else {
            return Err(Error::invalid_config(
                "a workload target without a role (not bound by the aws provider)",
            ));
        };
        let sts_region = place.map_or(PUBLIC_REGION, |(region, _)| region);
        let sdk = self.sdk_config().await;
        self.sts_budget.acquire(&sts_region.to_string()).await;
        let (creds, session_end) = web_identity::assume(sdk, workload, role, sts_region).await?;
        let credential = match place {
            Some((region, account)) => self.fetch_private_as(creds, role, region, account).await?,
            None => self.fetch_public_as(creds, role).await?,
        };
        Ok(web_identity::within_session(credential, session_end))
    }

    /// [`regbroker_provider::Provider::bind_workload`] for AWS: the target of the same
    /// registry, with the workload's role in its scope and parameters.
    pub(crate) fn bind(&self, target: Target, workload: WorkloadIdentity) -> Result<Target, Error> {
        let role = web_identity::role_of(&workload)?;
        let rebuilt = match (target.param(P_REGION), target.param(P_ACCOUNT)) {
            _ if target.param(P_KIND) == Some(KIND_PUBLIC) => {
                self.public_target(target.registry(), Some(role), true)
            }
            (Some(region), Some(account)) => {
                self.private_target(target.registry(), Some(role), region, account, true)
            }
            _ => {
                return Err(Error::invalid_config(format!(
                    "{} was not prepared by the aws provider",
                    target.registry()
                )));
            }
        };
        Ok(rebuilt.for_workload(workload))
    }

    /// The scope's identity part: the role (or `default`, the chain's own identity),
    /// marked `web-identity:` when a workload's token assumes it, then `@` and the
    /// identity fingerprint.
    fn identity_scope(&self, role: Option<&str>, web_identity: bool) -> String {
        let who = match (role, web_identity) {
            (Some(r), true) => format!("web-identity:{r}"),
            (Some(r), false) => r.to_string(),
            (None, _) => "default".to_string(),
        };
        format!("{who}@{}", self.fingerprint())
    }

    pub(crate) fn private_target(
        &self,
        registry: &Registry,
        role: Option<&str>,
        region: &str,
        account: &str,
        web_identity: bool,
    ) -> Target {
        let identity = self.identity_scope(role, web_identity);
        let mut t = Target::new(registry.clone(), format!("{identity}|{region}|{account}"))
            .with_param(P_KIND, KIND_PRIVATE)
            .with_param(P_REGION, region.to_string())
            .with_param(P_ACCOUNT, account.to_string());
        if let Some(r) = role {
            t = t.with_param(P_ROLE, r.to_string());
        }
        t
    }

    pub(crate) fn public_target(
        &self,
        registry: &Registry,
        role: Option<&str>,
        web_identity: bool,
    ) -> Target {
        let identity = self.identity_scope(role, web_identity);
        let mut t = Target::new(
            registry.clone(),
            format!("{identity}|{PUBLIC_REGION}|public"),
        )
        .with_param(P_KIND, KIND_PUBLIC);
        if let Some(r) = role {
            t = t.with_param(P_ROLE, r.to_string());
        }
        t
    }
}

impl Provider for AwsProvider {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn recognise(&self, registry: &Registry) -> Option<Target> {
        match host::parse(registry.host(), registry.port())? {
            EcrHost::Private {
                account, region, ..
            } => Some(self.private_target(registry, None, &region, &account, false)),
            EcrHost::Public => Some(self.public_target(registry, None, false)),
        }
    }

    fn check_options(&self, options: &Options) -> Result<(), String> {
        RuleOptions::parse(options).map(|_| ())
    }

    fn target(&self, registry: &Registry, options: &Options) -> Result<Target, Error> {
        let opts = RuleOptions::parse(options).map_err(Error::invalid_config)?;
        let role = opts.role_arn.as_deref();
        // An explicit rule may name an ECR host with a port (a tunnel); its shape still
        // gives region and account.
        match host::parse(registry.host(), None) {
            Some(EcrHost::Public) => {
                if opts.region.is_some() || opts.account.is_some() {
                    return Err(Error::invalid_config(format!(
                        "{registry} is ECR Public: options `region` and `account` do not apply"
                    )));
                }
                Ok(self.public_target(registry, role, false))
            }
            Some(EcrHost::Private {
                account, region, ..
            }) => {
                for (key, given, from_host) in [
                    ("region", &opts.region, &region),
                    ("account", &opts.account, &account),
                ] {
                    if let Some(g) = given
                        && g != from_host
                    {
                        return Err(Error::invalid_config(format!(
                            "option `{key}` = `{g}` contradicts the host {registry} ({from_host})"
                        )));
                    }
                }
                Ok(self.private_target(registry, role, &region, &account, false))
            }
            None => match (&opts.region, &opts.account) {
                (Some(region), Some(account)) => {
                    Ok(self.private_target(registry, role, region, account, false))
                }
                _ => Err(Error::invalid_config(format!(
                    "{registry} is not an ECR host: a rule sending it to the aws provider needs options `region` and `account`"
                ))),
            },
        }
    }

    fn bind_workload(&self, target: Target, workload: WorkloadIdentity) -> Result<Target, Error> {
        self.bind(target, workload)
    }

    fn workload_audience(
        &self,
        _target: &Target,
        _annotations: &std::collections::BTreeMap<String, String>,
    ) -> Result<String, Error> {
        Ok(web_identity::AUDIENCE.to_string())
    }

    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(self.fetch_credential(target))
    }

    fn identity_kind(&self) -> IdentityKind {
        crate::detect(&|k| std::env::var(k).ok()).kind
    }

    fn auto_detect_patterns(&self) -> Vec<String> {
        let mut out: Vec<String> = host::PRIVATE_SUFFIXES
            .iter()
            .flat_map(|s| [format!("*.dkr.ecr.*.{s}"), format!("*.dkr.ecr-fips.*.{s}")])
            .collect();
        out.extend(
            host::DUAL_STACK_SUFFIXES
                .iter()
                .flat_map(|s| [format!("*.dkr-ecr.*.{s}"), format!("*.dkr-ecr-fips.*.{s}")]),
        );
        out.push(host::PUBLIC_HOST.to_string());
        out
    }

    fn diagnose(&self, timeout: Duration) -> BoxFuture<'_, Diagnosis> {
        Box::pin(self.diagnosis(timeout))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_support::{opts, reg};

    #[test]
    fn from_env_is_lazy() {
        let p = AwsProvider::from_env().unwrap();
        assert!(!p.sdk.initialized());
        assert_eq!(p.name(), "aws");
    }

    #[test]
    fn recognised_targets_carry_region_account_and_scope() {
        let p = AwsProvider::from_env().unwrap();
        let t = p
            .recognise(&reg("123456789012.dkr.ecr.eu-west-1.amazonaws.com"))
            .unwrap();
        assert_eq!(t.param("region"), Some("eu-west-1"));
        assert_eq!(t.param("account"), Some("123456789012"));
        assert_eq!(t.param("role_arn"), None);
        assert_eq!(
            t.scope(),
            format!("default@{}|eu-west-1|123456789012", p.fingerprint())
        );
        // FIPS and dual-stack hosts of the same account and region share the credential.
        let fips = p
            .recognise(&reg("123456789012.dkr.ecr-fips.eu-west-1.amazonaws.com"))
            .unwrap();
        let dual = p
            .recognise(&reg("123456789012.dkr-ecr.eu-west-1.on.aws"))
            .unwrap();
        assert_eq!(fips.scope(), t.scope());
        assert_eq!(dual.scope(), t.scope());
        let other = p
            .recognise(&reg("123456789012.dkr.ecr.eu-west-2.amazonaws.com"))
            .unwrap();
        assert_ne!(other.scope(), t.scope());
        let public = p.recognise(&reg("public.ecr.aws")).unwrap();
        assert_eq!(public.param("kind"), Some("public"));
        assert_ne!(public.scope(), t.scope());
        assert!(p.recognise(&reg("example.com")).is_none());
        assert!(
            p.recognise(&reg("123456789012.dkr.ecr.eu-west-1.amazonaws.com:443"))
                .is_none()
        );
    }

    #[test]
    fn custom_domain_needs_region_and_account() {
        let p = AwsProvider::from_env().unwrap();
        let proxy = reg("registry.internal.example:5000");
        assert!(p.recognise(&proxy).is_none());
        for missing in [
            opts(&[]),
            opts(&[("region", "eu-west-1")]),
            opts(&[("account", "123456789012")]),
        ] {
            let e = p.target(&proxy, &missing).unwrap_err();
            assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
            assert!(e.message().contains("`region` and `account`"), "{e}");
        }
        let t = p
            .target(
                &proxy,
                &opts(&[("region", "eu-west-1"), ("account", "123456789012")]),
            )
            .unwrap();
        assert_eq!(t.registry(), &proxy);
        assert_eq!(t.param("region"), Some("eu-west-1"));
        assert_eq!(
            t.scope(),
            format!("default@{}|eu-west-1|123456789012", p.fingerprint())
        );
    }

    #[test]
    fn role_arn_is_part_of_the_scope() {
        let p = AwsProvider::from_env().unwrap();
        let ecr = reg("123456789012.dkr.ecr.us-east-1.amazonaws.com");
        let role = "arn:aws:iam::123456789012:role/puller";
        let t = p.target(&ecr, &opts(&[("role_arn", role)])).unwrap();
        assert_eq!(t.param("role_arn"), Some(role));
        assert_eq!(
            t.scope(),
            format!("{role}@{}|us-east-1|123456789012", p.fingerprint())
        );
        assert_ne!(t.scope(), p.recognise(&ecr).unwrap().scope());
        let public = p
            .target(&reg("public.ecr.aws"), &opts(&[("role_arn", role)]))
            .unwrap();
        assert_ne!(
            public.scope(),
            p.recognise(&reg("public.ecr.aws")).unwrap().scope()
        );
    }

    #[test]
    fn the_identity_settings_are_fingerprinted_into_every_scope() {
        // Different endpoints (or keys, profiles, roles: see IDENTITY_ENV) are different
        // identities; the fingerprint never holds a value itself.
        let a = AwsProvider::builder()
            .endpoint_url("http://127.0.0.1:1")
            .build();
        let b = AwsProvider::builder()
            .endpoint_url("http://127.0.0.1:2")
            .build();
        let ecr = reg("123456789012.dkr.ecr.us-east-1.amazonaws.com");
        let (ta, tb) = (a.recognise(&ecr).unwrap(), b.recognise(&ecr).unwrap());
        assert_ne!(ta.scope(), tb.scope());
        assert_eq!(ta.scope(), a.recognise(&ecr).unwrap().scope(), "stable");
        assert!(!ta.scope().contains("127.0.0.1"), "{}", ta.scope());
    }

    #[test]
    fn a_workload_target_names_its_service_account_role_and_web_identity() {
        use regbroker_provider::test_util::service_account_jwt;
        let p = AwsProvider::from_env().unwrap();
        let ecr = reg("555555555555.dkr.ecr.eu-west-1.amazonaws.com");
        let role = "arn:aws:iam::111111111111:role/team-a";
        let w = WorkloadIdentity::from_token(
            service_account_jwt("team-a", "puller", "u-1").into(),
            [(
                web_identity::ECR_ROLE_ANNOTATION.to_string(),
                role.to_string(),
            )]
            .into(),
        )
        .unwrap();
        let t = p
            .bind_workload(p.recognise(&ecr).unwrap(), w.clone())
            .unwrap();
        assert_eq!(
            t.scope(),
            format!(
                "sa=team-a/puller/u-1|web-identity:{role}@{}|eu-west-1|555555555555",
                p.fingerprint()
            )
        );
        assert_eq!(t.param("role_arn"), Some(role));
        assert_eq!(t.workload(), Some(&w));
        // The same role as a rule's `role_arn` (assumed from this process's identity) is
        // another scope: a workload never reads an entry of this process's own.
        let rule = p.target(&ecr, &opts(&[("role_arn", role)])).unwrap();
        assert_ne!(rule.scope(), t.scope());
        let public = p
            .bind_workload(p.recognise(&reg("public.ecr.aws")).unwrap(), w)
            .unwrap();
        assert_eq!(public.param("kind"), Some("public"));
        assert!(
            public
                .scope()
                .starts_with("sa=team-a/puller/u-1|web-identity:")
        );
    }

    #[test]
    fn options_contradicting_an_ecr_host_are_rejected() {
        let p = AwsProvider::from_env().unwrap();
        let ecr = reg("123456789012.dkr.ecr.us-east-1.amazonaws.com");
        assert!(p.target(&ecr, &opts(&[("region", "us-east-1")])).is_ok());
        let e = p
            .target(&ecr, &opts(&[("region", "eu-west-1")]))
            .unwrap_err();
        assert!(e.message().contains("`region`"), "{e}");
        let e = p
            .target(&ecr, &opts(&[("account", "000000000000")]))
            .unwrap_err();
        assert!(e.message().contains("`account`"), "{e}");
        let e = p
            .target(&reg("public.ecr.aws"), &opts(&[("region", "us-east-1")]))
            .unwrap_err();
        assert!(e.message().contains("ECR Public"), "{e}");
        let e = p.target(&ecr, &opts(&[("bogus", "1")])).unwrap_err();
        assert!(e.message().contains("`bogus`"), "{e}");
        assert!(
            p.check_options(&opts(&[("bogus", "1")]))
                .unwrap_err()
                .contains("`bogus`")
        );
    }
}
