//! Upstream call budgets: a token bucket per key (an account and region, say), so that
//! thousands of identities refreshing at once stay inside a cloud's rate limits instead of
//! being throttled (ECR `GetAuthorizationToken`: 20 per second, burst 200, per account and
//! region).
//!
//! Each call reserves its slot (GCRA: a "theoretical arrival time" per key) and sleeps
//! once until that slot, so a queue of thousands of waiters costs one timer each, never a
//! herd of retries; the first calls of an idle key go at once (the burst less a tenth,
//! kept as a margin for arrival jitter), then one per interval. Time is tokio's, so
//! tests drive it with paused time. A waiter that is dropped keeps its slot (the budget
//! errs on the side of fewer calls).
//!
//! Written here rather than taken from `governor`: governor waits on its own clock
//! (quanta and futures-timer), which paused-time tests cannot drive, and the reservation
//! form needed here is about forty lines.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Calls per second and burst of one key's bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Sustained calls per second (> 0).
    pub per_second: f64,
    /// Calls an idle key may make at once (>= 1).
    pub burst: u32,
}

/// The slowest rate accepted: one call per 1,000 seconds.
pub const MIN_PER_SECOND: f64 = 0.001;
/// The fastest rate accepted: a million calls per second (no cloud allows more).
pub const MAX_PER_SECOND: f64 = 1_000_000.0;
/// The largest burst accepted.
pub const MAX_BURST: u32 = 1_000_000;

impl Rate {
    /// `per_second` sustained (from [`MIN_PER_SECOND`] to [`MAX_PER_SECOND`]), `burst`
    /// at once (1 to [`MAX_BURST`]); `None` for anything else (zero, negative, NaN,
    /// infinite, or so small that one interval would not fit a `Duration`).
    pub fn new(per_second: f64, burst: u32) -> Option<Rate> {
        ((MIN_PER_SECOND..=MAX_PER_SECOND).contains(&per_second)
            && (1..=MAX_BURST).contains(&burst))
        .then_some(Rate { per_second, burst })
    }

    /// Parses `RATE` or `RATE/BURST` (`20/200`), for a setting named `what`.
    pub fn parse(s: &str, what: &str) -> Result<Rate, String> {
        let (rate, burst) = match s.split_once('/') {
            Some((r, b)) => (r.trim(), Some(b.trim())),
            None => (s.trim(), None),
        };
        let per_second: f64 = rate
            .parse()
            .map_err(|_| format!("{what}: `{rate}` is not a number of calls per second"))?;
        let burst = match burst {
            None => per_second.ceil().max(1.0) as u32,
            Some(b) => b
                .parse()
                .map_err(|_| format!("{what}: burst `{b}` is not a whole number"))?,
        };
        Rate::new(per_second, burst).ok_or_else(|| {
            format!(
                "{what}: `{s}` is out of range: the rate must be from {MIN_PER_SECOND} to {MAX_PER_SECOND} calls per second and the burst from 1 to {MAX_BURST}"
            )
        })
    }

    /// The time between two calls. The fields are public, so a `Rate` built by hand may
    /// hold anything: it is read within [`Rate::new`]'s range, never panicking (a NaN
    /// reads as the slowest rate).
    fn interval(&self) -> Duration {
        let per_second = if self.per_second >= MIN_PER_SECOND {
            self.per_second.min(MAX_PER_SECOND)
        } else {
            MIN_PER_SECOND
        };
        Duration::from_secs_f64(1.0 / per_second)
    }

    fn burst(&self) -> u32 {
        self.burst.clamp(1, MAX_BURST)
    }
}

/// Tokens of a burst kept back (a tenth, at least one): calls reach the upstream a little
/// after their slot, each after a delay of its own (a busy runtime, signing, a new
/// connection), and the upstream's bucket starts when the first one arrives. A call that
/// arrives sooner after its slot than the first one did finds the upstream's bucket
/// short by the difference; the margin covers differences up to `burst / 10` intervals
/// (1 s at ECR's 20 per second, burst 200).
fn margin(burst: u32) -> u32 {
    (burst / 10).max(1)
}

/// Most keys remembered; idle keys (whose bucket is full again) are forgotten first.
const MAX_KEYS: usize = 4096;

/// A token bucket per key (see the module docs).
#[derive(Debug)]
pub struct Budget<K> {
    rate: Rate,
    /// Per key: the theoretical arrival time of its next call.
    next: Mutex<HashMap<K, Instant>>,
}

impl<K: Eq + Hash + Clone> Budget<K> {
    /// A budget of `rate` per key.
    pub fn new(rate: Rate) -> Budget<K> {
        Budget {
            rate,
            next: Mutex::new(HashMap::new()),
        }
    }

    /// The rate of each key.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Waits until `key` may make one call, and takes it.
    pub async fn acquire(&self, key: &K) {
        let at = self.reserve(key);
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
    }

    /// Reserves `key`'s next slot and returns when it begins.
    fn reserve(&self, key: &K) -> Instant {
        let now = Instant::now();
        let interval = self.rate.interval();
        let burst = self.rate.burst();
        let span = interval.saturating_mul(burst.saturating_sub(1 + margin(burst)));
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        if next.len() >= MAX_KEYS && !next.contains_key(key) {
            // A key whose arrival time is past has a full bucket: forgetting it changes
            // nothing. If none is idle, the map starts afresh (more calls, never fewer
            // allowed than a fresh key's burst).
            next.retain(|_, t| *t > now);
            if next.len() >= MAX_KEYS {
                next.clear();
            }
        }
        let tat = next.get(key).copied().map_or(now, |t| t.max(now));
        next.insert(key.clone(), tat + interval);
        tat.checked_sub(span).map_or(now, |start| start.max(now))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_the_rate_holds() {
        let b: Budget<&str> = Budget::new(Rate::new(20.0, 200).unwrap());
        let t0 = Instant::now();
        for _ in 0..180 {
            b.acquire(&"acct|us-east-1").await;
        }
        assert_eq!(
            Instant::now(),
            t0,
            "the burst (less a tenth, the margin) is free"
        );
        b.acquire(&"acct|us-east-1").await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(50));
        for _ in 0..20 {
            b.acquire(&"acct|us-east-1").await;
        }
        assert_eq!(Instant::now() - t0, Duration::from_millis(50 * 21));
        // Another key has a bucket of its own.
        let before = Instant::now();
        b.acquire(&"acct|eu-west-1").await;
        assert_eq!(Instant::now(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_waiters_each_get_their_own_slot() {
        let b = std::sync::Arc::new(Budget::new(Rate::new(10.0, 5).unwrap()));
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..25)
            .map(|_| {
                let b = b.clone();
                tokio::spawn(async move {
                    b.acquire(&1u8).await;
                    Instant::now() - t0
                })
            })
            .collect();
        let mut at: Vec<Duration> = Vec::new();
        for t in tasks {
            at.push(t.await.unwrap());
        }
        at.sort();
        assert!(at[..4].iter().all(|d| d.is_zero()), "{at:?}");
        // 21 more at 10 per second, none earlier than its slot.
        for (i, d) in at[4..].iter().enumerate() {
            assert_eq!(*d, Duration::from_millis(100 * (i as u64 + 1)), "{at:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_key_refills_its_burst() {
        let b: Budget<u8> = Budget::new(Rate::new(1.0, 4).unwrap());
        for _ in 0..3 {
            b.acquire(&0).await;
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        let t0 = Instant::now();
        for _ in 0..3 {
            b.acquire(&0).await;
        }
        assert_eq!(Instant::now(), t0);
        b.acquire(&0).await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(1));
    }

    #[test]
    fn rates_parse_with_clear_errors() {
        assert_eq!(
            Rate::parse("20/200", "x").unwrap(),
            Rate::new(20.0, 200).unwrap()
        );
        assert_eq!(Rate::parse("0.5", "x").unwrap().burst, 1);
        for bad in [
            "",
            "fast",
            "0/1",
            "1/0",
            "-1/5",
            "1/x",
            "inf",
            "NaN",
            "0/0",
            "1e-300",
            "1e-300/5",
            "0.0009",
            "1000001",
            "5/1000001",
            "1e300",
        ] {
            let e = Rate::parse(bad, "REGBROKER_X").unwrap_err();
            assert!(e.starts_with("REGBROKER_X"), "{bad}: {e}");
        }
        // The ends of the range are accepted.
        assert_eq!(
            Rate::parse("0.001", "x").unwrap().per_second,
            MIN_PER_SECOND
        );
        assert_eq!(
            Rate::parse("1000000/1000000", "x").unwrap(),
            Rate::new(MAX_PER_SECOND, MAX_BURST).unwrap()
        );
        let e = Rate::parse("1e-300", "REGBROKER_AWS_ECR_RATE").unwrap_err();
        assert!(e.contains("from 0.001 to 1000000 calls per second"), "{e}");
    }

    /// Issue 30, finding 4: a rate that passed validation panicked converting `1 / rate`
    /// to a `Duration` at the first call. A `Rate` built by hand, bypassing `Rate::new`,
    /// must not either.
    #[tokio::test(start_paused = true)]
    async fn a_rate_built_by_hand_out_of_range_never_panics() {
        for per_second in [
            1e-300,
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::MIN_POSITIVE,
        ] {
            for burst in [0, 1, u32::MAX] {
                let b: Budget<u8> = Budget::new(Rate { per_second, burst });
                for _ in 0..3 {
                    // Reserving is what computed the interval; acquiring would sleep up to
                    // 1,000 s of paused time for the slowest rate, which is fine too.
                    b.reserve(&0);
                }
            }
        }
        let b: Budget<u8> = Budget::new(Rate {
            per_second: 1e-300,
            burst: 1,
        });
        let t0 = Instant::now();
        b.acquire(&0).await;
        b.acquire(&0).await;
        let waited = Instant::now() - t0;
        assert!(
            waited.abs_diff(Duration::from_secs(1000)) < Duration::from_millis(1),
            "read as the slowest rate: {waited:?}"
        );
    }
}
