//! regbroker: a credential broker for OCI registries.
//!
//! It turns the workload identity a pod already has into short-lived registry
//! credentials, caches them until shortly before they expire, lets static
//! `kubernetes.io/dockerconfigjson` secrets override contextual login for a host, and
//! serves the result over a local HTTP endpoint.
//!
//! The crate is arranged by layer, from the inside out:
//!
//! - [`broker`], the core: which source serves a registry (static entry > routing rule >
//!   provider auto-detection), the [`broker::cache`] and its expiry policy, the
//!   [`broker::routing`] patterns, [`broker::static_secret`] docker configs, the
//!   [`broker::config`] file and the compiled-in [`broker::providers`];
//! - the ways in: [`server`], the HTTP endpoint (router, listeners, access control,
//!   limits), and [`oneshot`], the docker credential helper and the kubelet credential
//!   provider with the backend they share (a sidecar, or the broker in-process with a disk
//!   cache);
//! - the ways out: [`sinks`], the docker config file and the Kubernetes Secret sync, with
//!   [`kubernetes`] holding the API client set-up;
//! - [`cli`], the command line: flags and env, logging, one file per mode, exit codes;
//! - [`metrics`], counted by the core and the endpoint alike, so it sits beside both.
//!
//! Providers live in their own crates behind the narrow interface of
//! [`regbroker_provider`]. Dependencies point inwards: nothing in the core imports a way
//! in or out, and nothing below [`cli`] imports from it.

#![forbid(unsafe_code)]

pub mod broker;
pub mod cli;
pub mod kubernetes;
pub mod metrics;
pub mod oneshot;
pub mod server;
pub mod sinks;

pub use regbroker_provider as provider;

/// Formats a time as RFC 3339 in UTC, to the second.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
