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
//! - [`env`], how environment values read (one boolean rule) and which variables each
//!   mode reads besides its flags' env forms (what `--help` lists);
//! - [`metrics`], counted by the core and the endpoint alike, so it sits beside both.
//!
//! Providers live in their own crates behind the narrow interface of
//! [`regbroker_provider`]. Dependencies point inwards: nothing in the core imports a way
//! in or out, and nothing below [`cli`] imports from it.

#![forbid(unsafe_code)]

pub mod broker;
pub mod cli;
pub mod controller;
pub mod env;
pub mod kubernetes;
pub mod metrics;
pub mod oneshot;
pub mod server;
pub mod sinks;

pub use regbroker_provider as provider;

/// Formats a time as RFC 3339 in UTC, to the second. Never fails: a time after
/// 9999-12-31T23:59:59Z (which RFC 3339's four-digit year cannot show) prints as that, a
/// time before 1970 as 1970-01-01T00:00:00Z.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    use std::time::{Duration, UNIX_EPOCH};
    // 10000-01-01T00:00:00Z, the first second humantime refuses to format.
    const YEAR_10000: u64 = 253_402_300_800;
    let last = UNIX_EPOCH + Duration::from_secs(YEAR_10000 - 1);
    let t = t.clamp(UNIX_EPOCH, last);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    #[test]
    fn rfc3339_never_panics() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(super::rfc3339(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(at(253_402_300_799)), "9999-12-31T23:59:59Z");
        // The year 10000 and later (and anything before 1970) are clamped.
        assert_eq!(super::rfc3339(at(253_402_300_800)), "9999-12-31T23:59:59Z");
        assert_eq!(super::rfc3339(at(u64::MAX / 4)), "9999-12-31T23:59:59Z");
        assert_eq!(
            super::rfc3339(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00Z"
        );
    }
}
