//! Helpers shared by the crate's unit tests: a provider over an env map, a parsed
//! registry, an options map.
//!
//! Reads no env var: the provider's env is the map given.

use regbroker_provider::{Options, Registry};

use crate::{AzureProvider, Env};

/// A provider whose env snapshot is `env`.
pub(crate) fn provider(env: &[(&str, &str)]) -> AzureProvider {
    AzureProvider::builder()
        .env(Env::from_pairs(env.iter().copied()))
        .build()
        .expect("provider")
}

/// `s` as a registry; panics when it does not parse.
pub(crate) fn reg(s: &str) -> Registry {
    Registry::parse(s).expect("registry")
}

/// A rule's options from `(key, value)` pairs.
pub(crate) fn opts(pairs: &[(&str, &str)]) -> Options {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
