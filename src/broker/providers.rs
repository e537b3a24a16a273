//! The providers compiled into this build: the clouds (cargo features `aws`, `azure`,
//! `gcp`) and the federated registries (`federated`: `quay`, `artifactory`, `cloudsmith`,
//! `oidc`, which serve only the hosts a rule names).

use std::sync::Arc;

use regbroker_provider::Provider;

/// Every provider name regbroker knows, whether compiled in or not.
pub const KNOWN: &[&str] = &[
    "aws",
    "azure",
    "gcp",
    "quay",
    "artifactory",
    "cloudsmith",
    "oidc",
];

/// The cargo feature that compiles provider `name` in.
pub fn feature_of(name: &str) -> &str {
    match name {
        "quay" | "artifactory" | "cloudsmith" | "oidc" => "federated",
        other => other,
    }
}

/// An ordered set of providers; auto-detection asks them in this order.
#[derive(Clone, Debug, Default)]
pub struct Providers {
    list: Vec<Arc<dyn Provider>>,
}

impl Providers {
    /// The providers compiled in, configured from the environment. Does no I/O: each
    /// provider reads its identity on first use. Fails on a provider setting that is not
    /// valid (a configuration error naming the variable).
    pub fn from_env() -> Result<Providers, String> {
        let list: Vec<Arc<dyn Provider>> = vec![
            #[cfg(feature = "aws")]
            Arc::new(regbroker_aws::AwsProvider::from_env()?),
            #[cfg(feature = "azure")]
            Arc::new(regbroker_azure::AzureProvider::from_env()?),
            #[cfg(feature = "gcp")]
            Arc::new(regbroker_gcp::GcpProvider::from_env()?),
        ];
        #[cfg(feature = "federated")]
        let list = {
            let mut list = list;
            for p in regbroker_federated::FederatedProvider::all()? {
                list.push(Arc::new(p));
            }
            list
        };
        Ok(Providers { list })
    }

    /// Exactly these providers (tests, embedding).
    pub fn new(list: Vec<Arc<dyn Provider>>) -> Providers {
        Providers { list }
    }

    /// The provider named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.list.iter().find(|p| p.name() == name)
    }

    /// All providers, in auto-detection order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.list.iter()
    }
}

/// Tracing filter directives that keep the compiled-in providers' libraries from logging
/// secrets at any level (the AWS SDK logs credentials at TRACE). Applied after the
/// user's own filter, so even `REGBROKER_LOG=trace` cannot undo them.
pub fn log_directives() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut out: Vec<&'static str> = Vec::new();
    #[cfg(feature = "aws")]
    out.extend_from_slice(regbroker_aws::LOG_DIRECTIVES);
    out
}
