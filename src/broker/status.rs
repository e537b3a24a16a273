//! What the broker knows about each provider, for `GET /v1/providers`: whether it is
//! compiled in, the identity kind it detects, the outcome and time of its last fetch,
//! and the registry patterns its rules and auto-detection serve.
//!
//! The last fetch is recorded by one call where the broker finishes a fetch
//! ([`LastFetches::record`]); it holds an error code or `ok`, never a message, a secret
//! or an upstream body. The store lives in [`Metrics`](crate::metrics::Metrics), which
//! the broker already hands to every fetch and the endpoint already holds.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use regbroker_provider::IdentityKind;

use super::Broker;
use super::providers::{KNOWN, Providers};
use super::routing::Source;

/// The outcome and time of one provider's last fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastFetch {
    /// When it finished, by the broker's clock.
    pub at: SystemTime,
    /// `ok` or an error code (`identity_missing`, `upstream_timeout`, ...).
    pub outcome: &'static str,
}

/// The last fetch of each provider.
#[derive(Debug, Default)]
pub struct LastFetches(Mutex<BTreeMap<&'static str, LastFetch>>);

impl LastFetches {
    /// Records that `provider`'s fetch finished at `at` with `outcome` (`ok` or an
    /// error code).
    pub fn record(&self, provider: &'static str, outcome: &'static str, at: SystemTime) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(provider, LastFetch { at, outcome });
    }

    /// `provider`'s last fetch, if it made one.
    pub fn get(&self, provider: &str) -> Option<LastFetch> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(provider)
            .copied()
    }
}

/// One provider as `GET /v1/providers` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderStatus {
    /// `aws`, `azure`, `gcp`.
    pub name: &'static str,
    /// Whether this build has it (cargo feature).
    pub compiled_in: bool,
    /// The identity it detects from env vars and files (`None` when not compiled in).
    pub identity: Option<IdentityKind>,
    /// Its last fetch.
    pub last_fetch: Option<LastFetch>,
    /// The `match` patterns of the rules that send registries to it, in rule order.
    pub rule_patterns: Vec<String>,
    /// The host patterns it recognises on its own (empty when not compiled in).
    pub auto_detected: Vec<String>,
}

impl Broker {
    /// The providers compiled in.
    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    /// Every known provider, compiled in or not, in [`KNOWN`] order. Reads env vars and
    /// (for GCP) the credentials file's `type`; no network call.
    pub fn provider_statuses(&self) -> Vec<ProviderStatus> {
        let names = KNOWN
            .iter()
            .copied()
            .chain(self.providers.iter().map(|p| p.name()))
            .fold(Vec::<&'static str>::new(), |mut v, n| {
                if !v.contains(&n) {
                    v.push(n);
                }
                v
            });
        names
            .into_iter()
            .map(|name| {
                let provider = self.providers.get(name);
                let rule_patterns = self
                    .router
                    .rules()
                    .iter()
                    .filter(|r| matches!(&r.source, Source::Provider { name: n, .. } if n == name))
                    .map(|r| r.pattern.as_str().to_string())
                    .collect();
                ProviderStatus {
                    name,
                    compiled_in: provider.is_some(),
                    identity: provider.map(|p| p.identity_kind()),
                    last_fetch: self.metrics.last_fetches.get(name),
                    rule_patterns,
                    auto_detected: provider
                        .map(|p| p.auto_detect_patterns())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_last_outcome_wins() {
        let f = LastFetches::default();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        assert_eq!(f.get("aws"), None);
        f.record("aws", "upstream_timeout", t);
        f.record("aws", "ok", t + Duration::from_secs(5));
        f.record("gcp", "identity_missing", t);
        assert_eq!(
            f.get("aws"),
            Some(LastFetch {
                at: t + Duration::from_secs(5),
                outcome: "ok"
            })
        );
        assert_eq!(f.get("gcp").map(|l| l.outcome), Some("identity_missing"));
    }
}
