//! Helpers shared by the crate's unit tests: a parsed registry, an options map.
//!
//! Reads no env var.

#![allow(clippy::unwrap_used)]

use regbroker_provider::{Options, Registry};

/// `s` as a registry; panics when it does not parse.
pub(crate) fn reg(s: &str) -> Registry {
    Registry::parse(s).unwrap()
}

/// A rule's options from `(key, value)` pairs.
pub(crate) fn opts(pairs: &[(&str, &str)]) -> Options {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
