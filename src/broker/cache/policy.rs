//! The expiry policy: when a fetched credential is refreshed and when it stops being
//! served, and how long a failure holds back the next fetch, each a pure function of the
//! `[cache]` settings, the clock and the issuer's expiry.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

/// Cache settings: the `[cache]` table of the config file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Refresh once this fraction of a credential's lifetime has passed.
    pub refresh_fraction: f64,
    /// Move each credential's refresh point earlier by a random part, up to this fraction,
    /// of the time until it (never later): credentials fetched together (a restart with
    /// thousands of identities) then do not all refresh together. 0 turns it off.
    pub refresh_jitter: f64,
    /// Never refresh sooner than this after a fetch (unless the credential dies first).
    #[serde(with = "humantime_serde")]
    pub min_refresh: Duration,
    /// Never keep a credential longer than this before refreshing.
    #[serde(with = "humantime_serde")]
    pub max_refresh: Duration,
    /// Stop serving a credential this long before it expires, so the client has time to
    /// use it.
    #[serde(with = "humantime_serde")]
    pub min_remaining: Duration,
    /// How long to keep a credential whose issuer gave no expiry, or an expiry already in
    /// the past (the issuer's clock disagrees with ours: trust neither).
    #[serde(with = "humantime_serde")]
    pub fallback_ttl: Duration,
    /// Most credentials kept at once.
    pub capacity: u64,
    /// Most upstream fetches running at once, across all keys.
    pub max_concurrent_fetches: usize,
    /// Most fetches waiting for one of those slots; a new key beyond that fails at once
    /// with `overloaded` (503) rather than joining an unbounded queue.
    pub max_queued_fetches: usize,
    /// Longest one upstream fetch may take, from the moment it is queued (the wait for a
    /// fetch slot and the provider's own retries included).
    #[serde(with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// After a failed fetch, answer the same error for this long without asking upstream
    /// again (doubling with each consecutive failure, with jitter), so a failing upstream
    /// is not hammered (ECR allows 20 requests per second per account and region).
    #[serde(with = "humantime_serde")]
    pub failure_backoff: Duration,
    /// The longest such pause.
    #[serde(with = "humantime_serde")]
    pub max_failure_backoff: Duration,
    /// A client's report of a refused credential (`DELETE /v1/credentials`, the helper's
    /// `erase`) makes the next request fetch anew at most once per this interval per
    /// credential; within it the report is answered `429` with `Retry-After`.
    #[serde(with = "humantime_serde")]
    pub refetch_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            refresh_fraction: 0.8,
            refresh_jitter: 0.1,
            min_refresh: Duration::from_secs(30),
            max_refresh: Duration::from_secs(12 * 3600),
            min_remaining: Duration::from_secs(30),
            fallback_ttl: Duration::from_secs(60),
            capacity: 10_000,
            max_concurrent_fetches: 32,
            max_queued_fetches: 1024,
            fetch_timeout: Duration::from_secs(30),
            failure_backoff: Duration::from_secs(1),
            max_failure_backoff: Duration::from_secs(30),
            refetch_interval: Duration::from_secs(30),
        }
    }
}

/// The longest duration any `[cache]` setting accepts. Every one is added to a clock
/// reading or multiplied somewhere: bounded here, none of that can overflow (a
/// `fallback_ttl` of 300 billion years once aborted the process at its first fetch).
pub const MAX_SETTING: Duration = Duration::from_secs(31_557_600); // humantime's year, 365.25 days

impl Config {
    /// Checks the settings, naming the first bad key.
    pub fn validate(&self) -> Result<(), String> {
        for (key, d) in [
            ("min_refresh", self.min_refresh),
            ("max_refresh", self.max_refresh),
            ("min_remaining", self.min_remaining),
            ("fallback_ttl", self.fallback_ttl),
            ("fetch_timeout", self.fetch_timeout),
            ("failure_backoff", self.failure_backoff),
            ("max_failure_backoff", self.max_failure_backoff),
            ("refetch_interval", self.refetch_interval),
        ] {
            if d > MAX_SETTING {
                return Err(format!(
                    "cache.{key} must be at most {} (it is {})",
                    humantime::format_duration(MAX_SETTING),
                    humantime::format_duration(d)
                ));
            }
        }
        if !(self.refresh_fraction > 0.0 && self.refresh_fraction <= 1.0) {
            return Err("cache.refresh_fraction must be greater than 0 and at most 1".into());
        }
        if !(0.0..=0.5).contains(&self.refresh_jitter) {
            return Err("cache.refresh_jitter must be from 0 to 0.5".into());
        }
        if self.min_refresh > self.max_refresh {
            return Err("cache.min_refresh must not be greater than cache.max_refresh".into());
        }
        if self.capacity == 0 {
            return Err("cache.capacity must be at least 1".into());
        }
        if self.max_concurrent_fetches == 0 {
            return Err("cache.max_concurrent_fetches must be at least 1".into());
        }
        if self.fetch_timeout.is_zero() {
            return Err("cache.fetch_timeout must be more than 0".into());
        }
        if self.failure_backoff > self.max_failure_backoff {
            return Err(
                "cache.failure_backoff must not be greater than cache.max_failure_backoff".into(),
            );
        }
        Ok(())
    }
}

/// When a freshly fetched credential should be refreshed, and when it must no longer be
/// served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// From here on, a request starts a background fetch of a new credential and is
    /// still answered with this one (until `stale_at`, also when that fetch fails).
    pub refresh_at: SystemTime,
    /// From here on, this credential is never served.
    pub stale_at: SystemTime,
}

/// The expiry policy, as one pure function of the settings, the fetch time and the
/// issuer's expiry.
///
/// - No expiry, or an expiry at or before the fetch time: keep for `fallback_ttl`.
/// - Otherwise serve until `min_remaining` before expiry (or until expiry, if the
///   credential lives shorter than that), and refresh after `refresh_fraction` of that
///   span, clamped to `[min_refresh, max_refresh]` and never after the stale point.
pub fn plan(config: &Config, fetched_at: SystemTime, expires_at: Option<SystemTime>) -> Lifetime {
    let remaining = expires_at.and_then(|e| e.duration_since(fetched_at).ok());
    match remaining {
        None | Some(Duration::ZERO) => {
            let at = fetched_at + config.fallback_ttl;
            Lifetime {
                refresh_at: at,
                stale_at: at,
            }
        }
        Some(remaining) => {
            let usable = remaining
                .checked_sub(config.min_remaining)
                .filter(|d| !d.is_zero())
                .unwrap_or(remaining);
            let refresh_in = usable
                .mul_f64(config.refresh_fraction)
                .clamp(config.min_refresh, config.max_refresh)
                .min(usable);
            Lifetime {
                refresh_at: fetched_at + refresh_in,
                stale_at: fetched_at + usable,
            }
        }
    }
}

/// `lifetime` (of a credential fetched at `fetched_at`) with its refresh point moved
/// earlier by `random` (in `[0, 1)`) × `config.refresh_jitter` of the time until it; the
/// stale point never moves.
pub fn jittered(
    config: &Config,
    fetched_at: SystemTime,
    lifetime: Lifetime,
    random: f64,
) -> Lifetime {
    let until = lifetime
        .refresh_at
        .duration_since(fetched_at)
        .unwrap_or(Duration::ZERO);
    let earlier = until.mul_f64((config.refresh_jitter * random.clamp(0.0, 1.0)).clamp(0.0, 0.5));
    Lifetime {
        refresh_at: lifetime.refresh_at - earlier,
        stale_at: lifetime.stale_at,
    }
}

/// How long to hold back after the `consecutive`-th failure in a row: the base doubled
/// per failure, capped, then scaled by `jitter` in [0.5, 1] so that keys failing together
/// do not retry together.
pub fn failure_pause(config: &Config, consecutive: u32, jitter: f64) -> Duration {
    let exp = consecutive.saturating_sub(1).min(20);
    let pause = config
        .failure_backoff
        .saturating_mul(1u32 << exp)
        .min(config.max_failure_backoff);
    pause.mul_f64(jitter.clamp(0.5, 1.0))
}

/// [`failure_pause`] with a random jitter in [0.5, 1): what the cache and the registry
/// check hold back for.
pub fn random_failure_pause(config: &Config, consecutive: u32) -> Duration {
    failure_pause(config, consecutive, 0.5 + fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3600;

    fn t0() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn twelve_hour_token_refreshes_at_four_fifths_of_usable_life() {
        let c = Config::default();
        let l = plan(&c, t0(), Some(t0() + secs(12 * H)));
        let usable = secs(12 * H) - c.min_remaining;
        assert_eq!(l.stale_at, t0() + usable);
        assert_eq!(l.refresh_at, t0() + usable.mul_f64(0.8));
    }

    #[test]
    fn refresh_is_clamped_to_the_ceiling() {
        let c = Config {
            max_refresh: secs(H),
            ..Config::default()
        };
        let l = plan(&c, t0(), Some(t0() + secs(12 * H)));
        assert_eq!(l.refresh_at, t0() + secs(H));
    }

    #[test]
    fn refresh_is_clamped_to_the_floor_but_never_past_stale() {
        let c = Config {
            min_refresh: secs(120),
            ..Config::default()
        };
        // 100 s of life, 70 s usable: the floor (120 s) would pass the stale point.
        let l = plan(&c, t0(), Some(t0() + secs(100)));
        assert_eq!(l.stale_at, t0() + secs(70));
        assert_eq!(l.refresh_at, l.stale_at);
        // 1000 s of life: 0.8 * 970 = 776 s, above the floor.
        let l = plan(&c, t0(), Some(t0() + secs(1000)));
        assert_eq!(l.refresh_at, t0() + secs(776));
        // 200 s of life: 0.8 * 170 = 136 s, above the floor of 120.
        let c = Config {
            min_refresh: secs(150),
            ..Config::default()
        };
        let l = plan(&c, t0(), Some(t0() + secs(200)));
        assert_eq!(l.refresh_at, t0() + secs(150));
    }

    #[test]
    fn credential_shorter_lived_than_the_margin_is_served_until_expiry() {
        let c = Config::default();
        let l = plan(&c, t0(), Some(t0() + secs(10)));
        assert_eq!(l.stale_at, t0() + secs(10));
        assert_eq!(l.refresh_at, t0() + secs(10));
    }

    #[test]
    fn no_expiry_gets_the_fallback_ttl() {
        let c = Config::default();
        let l = plan(&c, t0(), None);
        assert_eq!(l.refresh_at, t0() + c.fallback_ttl);
        assert_eq!(l.stale_at, t0() + c.fallback_ttl);
    }

    #[test]
    fn expiry_in_the_past_gets_the_fallback_ttl_not_its_stated_life() {
        let c = Config::default();
        for past in [
            t0(),
            t0() - secs(1),
            SystemTime::UNIX_EPOCH + secs(1_420_070_400),
        ] {
            let l = plan(&c, t0(), Some(past));
            assert_eq!(l.stale_at, t0() + c.fallback_ttl, "expiry {past:?}");
        }
    }

    #[test]
    fn failure_pause_doubles_caps_and_jitters() {
        let c = Config {
            failure_backoff: secs(1),
            max_failure_backoff: secs(30),
            ..Config::default()
        };
        assert_eq!(failure_pause(&c, 1, 1.0), secs(1));
        assert_eq!(failure_pause(&c, 2, 1.0), secs(2));
        assert_eq!(failure_pause(&c, 5, 1.0), secs(16));
        assert_eq!(failure_pause(&c, 6, 1.0), secs(30));
        assert_eq!(failure_pause(&c, 1000, 1.0), secs(30));
        assert_eq!(failure_pause(&c, 3, 0.5), secs(2));
        assert_eq!(
            failure_pause(&c, 3, 0.0),
            secs(2),
            "jitter never below half"
        );
    }

    #[test]
    fn jitter_moves_only_the_refresh_point_and_only_earlier() {
        let c = Config::default();
        let l = plan(&c, t0(), Some(t0() + secs(12 * H)));
        assert_eq!(jittered(&c, t0(), l, 0.0), l);
        let most = jittered(&c, t0(), l, 0.999_999);
        assert_eq!(most.stale_at, l.stale_at);
        let until = l.refresh_at.duration_since(t0()).unwrap();
        let moved = l.refresh_at.duration_since(most.refresh_at).unwrap();
        assert!(
            moved <= until.mul_f64(0.1) && moved > until.mul_f64(0.099),
            "{moved:?}"
        );
        let off = Config {
            refresh_jitter: 0.0,
            ..Config::default()
        };
        assert_eq!(jittered(&off, t0(), l, 0.7), l);
        // Out-of-range randomness is clamped, never a later refresh point.
        assert!(jittered(&c, t0(), l, 7.0).refresh_at >= l.refresh_at - until.mul_f64(0.1));
        assert_eq!(jittered(&c, t0(), l, -1.0), l);
    }

    #[test]
    fn config_validation_names_the_key() {
        let bad = Config {
            refresh_fraction: 1.5,
            ..Config::default()
        };
        assert!(bad.validate().unwrap_err().contains("refresh_fraction"));
        let bad = Config {
            refresh_jitter: 0.6,
            ..Config::default()
        };
        assert!(bad.validate().unwrap_err().contains("refresh_jitter"));
        let bad = Config {
            min_refresh: secs(10 * H),
            max_refresh: secs(H),
            ..Config::default()
        };
        assert!(bad.validate().unwrap_err().contains("min_refresh"));
        let bad = Config {
            failure_backoff: secs(60),
            max_failure_backoff: secs(30),
            ..Config::default()
        };
        assert!(bad.validate().unwrap_err().contains("failure_backoff"));
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn equal_bounds_are_valid_settings() {
        // A fixed refresh interval and a fixed failure pause: each pair of bounds equal.
        let fixed = Config {
            min_refresh: secs(H),
            max_refresh: secs(H),
            failure_backoff: secs(30),
            max_failure_backoff: secs(30),
            ..Config::default()
        };
        assert_eq!(fixed.validate(), Ok(()));
    }
}
