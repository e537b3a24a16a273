//! [`Builder`], the explicit settings of an [`AwsProvider`], and [`CallSettings`], the
//! retry and timeout settings of every AWS call.
//!
//! Reads no env var: whatever the builder leaves unset is read later by aws-config, on
//! the first fetch (see the crate docs for the list).

use std::fmt;
use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;
use regbroker_provider::{Rate, SharedClock, system_clock};

use crate::AwsProvider;

/// Retry and timeout settings of every AWS call (identity chain included).
#[derive(Clone, Debug)]
pub struct CallSettings {
    /// Attempts per call, first one included (throttling and 5xx are retried).
    pub max_attempts: u32,
    /// First backoff; later ones grow exponentially, with full jitter.
    pub initial_backoff: Duration,
    /// Longest single backoff.
    pub max_backoff: Duration,
    /// Limit for one attempt.
    pub attempt_timeout: Duration,
    /// Limit for a whole call, retries included.
    pub operation_timeout: Duration,
    /// TCP/TLS connect limit.
    pub connect_timeout: Duration,
}

impl Default for CallSettings {
    fn default() -> Self {
        CallSettings {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(25),
            connect_timeout: Duration::from_secs(3),
        }
    }
}

/// Explicit settings for an [`AwsProvider`]; everything unset comes from the environment
/// as aws-config reads it.
pub struct Builder {
    pub(crate) endpoint_url: Option<String>,
    pub(crate) credentials: Option<SharedCredentialsProvider>,
    pub(crate) calls: CallSettings,
    pub(crate) clock: SharedClock,
    pub(crate) ecr_rate: Option<Rate>,
    pub(crate) sts_rate: Option<Rate>,
}

/// The env var setting the ECR `GetAuthorizationToken` budget, `RATE/BURST` per caller
/// account and region (default [`DEFAULT_ECR_RATE`]).
pub const ECR_RATE_ENV: &str = "REGBROKER_AWS_ECR_RATE";
/// The env var setting the STS `AssumeRoleWithWebIdentity` budget, `RATE/BURST` per
/// region (default [`DEFAULT_STS_RATE`]).
pub const STS_RATE_ENV: &str = "REGBROKER_AWS_STS_RATE";
/// ECR's own limit for `GetAuthorizationToken`: 20 per second, burst 200, per account
/// and region.
pub const DEFAULT_ECR_RATE: Rate = Rate {
    per_second: 20.0,
    burst: 200,
};
/// Well inside STS's own quota for `AssumeRoleWithWebIdentity`.
pub const DEFAULT_STS_RATE: Rate = Rate {
    per_second: 50.0,
    burst: 100,
};

/// The rate `var` sets, `None` when it is unset or empty, or an error naming the
/// variable when its value is not a rate within range (a configuration error: a rate is
/// never silently replaced by the default).
pub(crate) fn rate_from_env(var: &str) -> Result<Option<Rate>, String> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{var} is not valid UTF-8")),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Rate::parse(&v, var).map(Some),
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("endpoint_url", &self.endpoint_url)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "explicit"),
            )
            .field("calls", &self.calls)
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            endpoint_url: None,
            credentials: None,
            calls: CallSettings::default(),
            clock: system_clock(),
            ecr_rate: None,
            sts_rate: None,
        }
    }
}

impl Builder {
    /// Sends every AWS call (ECR, ECR Public, STS) to `url`, like `AWS_ENDPOINT_URL`.
    pub fn endpoint_url(mut self, url: impl Into<String>) -> Builder {
        self.endpoint_url = Some(url.into());
        self
    }

    /// Uses these credentials instead of aws-config's default chain.
    pub fn credentials(mut self, credentials: SharedCredentialsProvider) -> Builder {
        self.credentials = Some(credentials);
        self
    }

    /// Retry and timeout settings.
    pub fn calls(mut self, calls: CallSettings) -> Builder {
        self.calls = calls;
        self
    }

    /// The clock the SDK signs requests and judges identity expiry with.
    pub fn clock(mut self, clock: SharedClock) -> Builder {
        self.clock = clock;
        self
    }

    /// Takes the budgets `REGBROKER_AWS_ECR_RATE` and `REGBROKER_AWS_STS_RATE` set, for
    /// those not set explicitly; an invalid value is an error naming the variable.
    pub fn rates_from_env(mut self) -> Result<Builder, String> {
        if self.ecr_rate.is_none() {
            self.ecr_rate = rate_from_env(ECR_RATE_ENV)?;
        }
        if self.sts_rate.is_none() {
            self.sts_rate = rate_from_env(STS_RATE_ENV)?;
        }
        Ok(self)
    }

    /// The budget of ECR `GetAuthorizationToken` calls per caller account and region
    /// (default: [`DEFAULT_ECR_RATE`]; see [`Builder::rates_from_env`]).
    pub fn ecr_rate(mut self, rate: Rate) -> Builder {
        self.ecr_rate = Some(rate);
        self
    }

    /// The budget of STS `AssumeRoleWithWebIdentity` calls per region (default:
    /// [`DEFAULT_STS_RATE`]; see [`Builder::rates_from_env`]).
    pub fn sts_rate(mut self, rate: Rate) -> Builder {
        self.sts_rate = Some(rate);
        self
    }

    /// The provider. Does no I/O: the SDK configuration is loaded on the first fetch.
    pub fn build(self) -> AwsProvider {
        AwsProvider::new(self)
    }
}
