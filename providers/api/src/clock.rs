//! Injected time, so expiry logic is tested without sleeping.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The real wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place allowed to read the wall clock
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock, shared.
pub fn system_clock() -> SharedClock {
    Arc::new(SystemClock)
}

#[cfg(any(test, feature = "test-util"))]
pub use manual::ManualClock;

#[cfg(any(test, feature = "test-util"))]
mod manual {
    use super::Clock;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, SystemTime};

    /// A clock that moves only when told to. Clones share the same time.
    #[derive(Clone, Debug)]
    pub struct ManualClock(Arc<Mutex<SystemTime>>);

    impl ManualClock {
        /// A clock standing at `start`.
        pub fn new(start: SystemTime) -> ManualClock {
            ManualClock(Arc::new(Mutex::new(start)))
        }

        /// A clock at an arbitrary fixed point (2026-01-01T00:00:00Z).
        pub fn fixed() -> ManualClock {
            ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600))
        }

        /// Moves the clock forward.
        pub fn advance(&self, by: Duration) {
            let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
            *t += by;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap_or_else(|p| p.into_inner())
        }
    }
}
