//! [`Builder`]: the explicit settings of an [`AzureProvider`] (env snapshot, clock,
//! private-cloud ACR suffixes, HTTP clients, SDK retries, the bound on a fetch), and the
//! validation of the ACR suffixes.
//!
//! Reads `REGBROKER_AZURE_ACR_SUFFIXES` from the builder's env snapshot, not from the
//! process env.

use std::sync::Arc;
use std::time::Duration;

use azure_core::http::{ExponentialRetryOptions, HttpClient, RetryOptions};
use regbroker_provider::{Error, SharedClock, system_clock};

use crate::{AzureProvider, DEFAULT_TIMEOUT, ENV_ACR_SUFFIXES, Env, host, reqwest};

/// Explicit settings for [`AzureProvider`] (tests, embedding).
#[derive(Debug)]
pub struct Builder {
    pub(crate) env: Env,
    pub(crate) clock: SharedClock,
    pub(crate) suffixes: Vec<String>,
    pub(crate) http: Option<reqwest::Client>,
    pub(crate) tls_roots: Vec<Vec<u8>>,
    pub(crate) sdk_http: Option<Arc<dyn HttpClient>>,
    pub(crate) retry: RetryOptions,
    pub(crate) timeout: Duration,
}

impl Builder {
    /// The defaults of [`AzureProvider::builder`].
    pub(crate) fn new() -> Builder {
        Builder {
            env: Env::default(),
            clock: system_clock(),
            suffixes: Vec::new(),
            http: None,
            tls_roots: Vec::new(),
            sdk_http: None,
            retry: retry_options(3, Duration::from_millis(500)),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Use this env snapshot instead of the process environment.
    pub fn env(mut self, env: Env) -> Builder {
        self.env = env;
        self
    }

    /// Read time from this clock.
    pub fn clock(mut self, clock: SharedClock) -> Builder {
        self.clock = clock;
        self
    }

    /// Adds a private-cloud ACR suffix (in addition to `REGBROKER_AZURE_ACR_SUFFIXES`).
    pub fn acr_suffix(mut self, suffix: impl Into<String>) -> Builder {
        self.suffixes.push(suffix.into());
        self
    }

    /// Use this HTTP client for Entra ID, managed identity and the exchange (e.g. one
    /// that trusts a test CA). It should not follow redirects, and should not use a
    /// proxy for the loopback and link-local identity endpoints (the provider's own
    /// clients never do).
    pub fn http_client(mut self, client: reqwest::Client) -> Builder {
        self.http = Some(client);
        self
    }

    /// Trust only this CA (PEM) in the provider's own HTTP clients (a private CA, a test
    /// CA); may be given more than once. Ignored with [`Builder::http_client`].
    pub fn tls_root_pem(mut self, pem: impl Into<Vec<u8>>) -> Builder {
        self.tls_roots.push(pem.into());
        self
    }

    /// Use this transport for the SDK's requests only (Entra ID, managed identity),
    /// e.g. to instrument or redirect them; the exchange keeps the reqwest client. By
    /// default the SDK uses the same reqwest client as the exchange.
    pub fn sdk_http_client(mut self, client: Arc<dyn HttpClient>) -> Builder {
        self.sdk_http = Some(client);
        self
    }

    /// SDK retries for Entra ID and App Service managed identity: `max_retries` with
    /// exponential backoff from `initial_delay` (IMDS keeps the SDK's own policy).
    pub fn retry(mut self, max_retries: u32, initial_delay: Duration) -> Builder {
        self.retry = retry_options(max_retries, initial_delay);
        self
    }

    /// Bound on one whole fetch.
    pub fn timeout(mut self, timeout: Duration) -> Builder {
        self.timeout = timeout;
        self
    }

    /// The provider. Fails on an invalid ACR suffix (from the env or [`Builder::acr_suffix`]).
    pub fn build(self) -> Result<AzureProvider, Error> {
        let mut suffixes = Vec::new();
        for raw in self.raw_suffixes() {
            let s = host::parse_suffix(&raw).map_err(Error::invalid_config)?;
            push_suffix(&mut suffixes, s);
        }
        Ok(AzureProvider::new(self, suffixes))
    }

    /// The env's comma list followed by the builder's suffixes, blanks dropped.
    fn raw_suffixes(&self) -> Vec<String> {
        let from_env = self.env.get(ENV_ACR_SUFFIXES).unwrap_or_default();
        from_env
            .split(',')
            .map(str::to_string)
            .chain(self.suffixes.iter().cloned())
            .filter(|s| !s.trim().is_empty())
            .collect()
    }
}

/// Adds a validated suffix unless it is built in or already there.
fn push_suffix(suffixes: &mut Vec<String>, s: String) {
    if !host::BUILTIN_SUFFIXES.iter().any(|(b, _)| *b == s) && !suffixes.contains(&s) {
        suffixes.push(s);
    }
}

fn retry_options(max_retries: u32, initial_delay: Duration) -> RetryOptions {
    let ms = i64::try_from(initial_delay.as_millis()).unwrap_or(i64::MAX);
    RetryOptions::exponential(ExponentialRetryOptions {
        initial_delay: azure_core::time::Duration::milliseconds(ms),
        max_retries,
        max_total_elapsed: azure_core::time::Duration::seconds(20),
        max_delay: azure_core::time::Duration::seconds(5),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_support::reg;
    use regbroker_provider::Provider;

    #[test]
    fn suffixes_come_from_env_and_builder_and_are_validated() {
        let p = AzureProvider::builder()
            .env(Env::from_pairs([(
                ENV_ACR_SUFFIXES,
                "azurecr.contoso.example, ,azurecr.io",
            )]))
            .acr_suffix("AzureCR.Fabrikam.Example")
            .build()
            .expect("provider");
        assert_eq!(
            p.acr_suffixes(),
            ["azurecr.contoso.example", "azurecr.fabrikam.example"]
        );
        assert!(
            p.recognise(&reg("myregistry.azurecr.fabrikam.example"))
                .is_some()
        );
        let e = AzureProvider::builder()
            .env(Env::from_pairs([(ENV_ACR_SUFFIXES, "com")]))
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
    }
}
