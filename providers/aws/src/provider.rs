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
    BoxFuture, Credential, Diagnosis, Error, IdentityKind, Options, Provider, Registry, Target,
};
use tokio::sync::OnceCell;

use crate::PUBLIC_REGION;
use crate::builder::Builder;
use crate::clients::{ClientCache, ClientKey};
use crate::host::{self, EcrHost};
use crate::options::RuleOptions;

const P_KIND: &str = "kind";
const P_REGION: &str = "region";
const P_ACCOUNT: &str = "account";
const P_ROLE: &str = "role_arn";
const KIND_PRIVATE: &str = "private";
const KIND_PUBLIC: &str = "public";

/// The AWS provider: ECR and ECR Public.
pub struct AwsProvider {
    pub(crate) settings: Builder,
    pub(crate) sdk: OnceCell<SdkConfig>,
    pub(crate) ecr: ClientCache<ClientKey, aws_sdk_ecr::Client>,
    pub(crate) public: ClientCache<Option<String>, aws_sdk_ecrpublic::Client>,
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
    pub fn from_env() -> AwsProvider {
        Builder::default().build()
    }

    /// Explicit settings, for tests and embedding.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The provider with these settings, nothing loaded yet (see [`Builder::build`]).
    pub(crate) fn new(settings: Builder) -> AwsProvider {
        AwsProvider {
            settings,
            sdk: OnceCell::new(),
            ecr: ClientCache::default(),
            public: ClientCache::default(),
        }
    }

    /// Exchanges the identity for an ECR credential for `target` (see [`Provider::fetch`]).
    pub async fn fetch_credential(&self, target: &Target) -> Result<Credential, Error> {
        let role = target.param(P_ROLE);
        match target.param(P_KIND) {
            Some(KIND_PRIVATE) => {
                let (Some(region), Some(account)) =
                    (target.param(P_REGION), target.param(P_ACCOUNT))
                else {
                    return Err(Error::invalid_config(
                        "aws target without region or account",
                    ));
                };
                self.fetch_private(role, region, account).await
            }
            Some(KIND_PUBLIC) => self.fetch_public(role).await,
            _ => Err(Error::invalid_config(format!(
                "{} was not prepared by the aws provider",
                target.registry()
            ))),
        }
    }

    fn private_target(
        registry: &Registry,
        role: Option<&str>,
        region: &str,
        account: &str,
    ) -> Target {
        let identity = role.unwrap_or("default");
        let mut t = Target::new(registry.clone(), format!("{identity}|{region}|{account}"))
            .with_param(P_KIND, KIND_PRIVATE)
            .with_param(P_REGION, region)
            .with_param(P_ACCOUNT, account);
        if let Some(r) = role {
            t = t.with_param(P_ROLE, r);
        }
        t
    }

    fn public_target(registry: &Registry, role: Option<&str>) -> Target {
        let identity = role.unwrap_or("default");
        let mut t = Target::new(
            registry.clone(),
            format!("{identity}|{PUBLIC_REGION}|public"),
        )
        .with_param(P_KIND, KIND_PUBLIC);
        if let Some(r) = role {
            t = t.with_param(P_ROLE, r);
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
            } => Some(Self::private_target(registry, None, &region, &account)),
            EcrHost::Public => Some(Self::public_target(registry, None)),
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
                Ok(Self::public_target(registry, role))
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
                Ok(Self::private_target(registry, role, &region, &account))
            }
            None => match (&opts.region, &opts.account) {
                (Some(region), Some(account)) => {
                    Ok(Self::private_target(registry, role, region, account))
                }
                _ => Err(Error::invalid_config(format!(
                    "{registry} is not an ECR host: a rule sending it to the aws provider needs options `region` and `account`"
                ))),
            },
        }
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
        let p = AwsProvider::from_env();
        assert!(!p.sdk.initialized());
        assert_eq!(p.name(), "aws");
    }

    #[test]
    fn recognised_targets_carry_region_account_and_scope() {
        let p = AwsProvider::from_env();
        let t = p
            .recognise(&reg("123456789012.dkr.ecr.eu-west-1.amazonaws.com"))
            .unwrap();
        assert_eq!(t.param("region"), Some("eu-west-1"));
        assert_eq!(t.param("account"), Some("123456789012"));
        assert_eq!(t.param("role_arn"), None);
        assert_eq!(t.scope(), "default|eu-west-1|123456789012");
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
        let p = AwsProvider::from_env();
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
        assert_eq!(t.scope(), "default|eu-west-1|123456789012");
    }

    #[test]
    fn role_arn_is_part_of_the_scope() {
        let p = AwsProvider::from_env();
        let ecr = reg("123456789012.dkr.ecr.us-east-1.amazonaws.com");
        let role = "arn:aws:iam::123456789012:role/puller";
        let t = p.target(&ecr, &opts(&[("role_arn", role)])).unwrap();
        assert_eq!(t.param("role_arn"), Some(role));
        assert_eq!(t.scope(), format!("{role}|us-east-1|123456789012"));
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
    fn options_contradicting_an_ecr_host_are_rejected() {
        let p = AwsProvider::from_env();
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
