//! regbroker: a credential broker for OCI registries.
//!
//! It turns the workload identity a pod already has into short-lived registry
//! credentials, caches them until shortly before they expire, lets static
//! `kubernetes.io/dockerconfigjson` secrets override contextual login for a host, and
//! serves the result over a local HTTP endpoint.
//!
//! The pieces, from the outside in: [`cli`] parses flags and runs a mode; [`server`] is
//! the axum endpoint; [`broker`] decides which source serves a registry (static entry >
//! routing rule > provider auto-detection); [`cache`] holds fetched credentials with an
//! expiry policy and single-flight fetches; [`static_secret`] loads and watches docker
//! configs; [`routing`] and [`config`] read the rules; providers live in their own crates
//! behind the narrow interface of [`regbroker_provider`].

#![forbid(unsafe_code)]

pub mod backend;
pub mod broker;
pub mod cache;
pub mod cli;
pub mod config;
pub mod disk_cache;
pub mod helper;
pub mod kubelet;
pub mod metrics;
pub mod providers;
pub mod routing;
pub mod secret_sync;
pub mod server;
pub mod sink;
pub mod static_secret;

pub use regbroker_provider as provider;

/// Formats a time as RFC 3339 in UTC, to the second.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
