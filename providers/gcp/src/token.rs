//! A Google access token and when it stops working.
//!
//! Reads no env var.

use std::time::{Duration, SystemTime};

use regbroker_provider::{Error, ExposeSecret, SecretString};

/// The lifetime assumed when an upstream answers without `expires_in`: short, so that a
/// token whose real lifetime is unknown is replaced well before Google's usual hour.
pub const FALLBACK_TTL: Duration = Duration::from_secs(5 * 60);

/// The longest lifetime believed, whatever an upstream says (Google tokens last at most
/// 12 hours, usually 1): the common cap of every provider.
const MAX_TTL: Duration = regbroker_provider::MAX_LIFETIME;

/// An OAuth 2.0 access token.
#[derive(Debug)]
pub(crate) struct AccessToken {
    pub(crate) secret: SecretString,
    pub(crate) expires_at: SystemTime,
}

impl AccessToken {
    /// A token issued at about `issued` that lasts `expires_in` seconds
    /// ([`FALLBACK_TTL`] when not said).
    pub(crate) fn from_expires_in(
        secret: SecretString,
        expires_in: Option<u64>,
        issued: SystemTime,
    ) -> AccessToken {
        let ttl = expires_in
            .map(Duration::from_secs)
            .unwrap_or(FALLBACK_TTL)
            .min(MAX_TTL);
        AccessToken {
            secret,
            expires_at: issued + ttl,
        }
    }

    /// Rejects an empty token: a registry would treat it as anonymous.
    pub(crate) fn non_empty(self, what: &str) -> Result<AccessToken, Error> {
        if self.secret.expose_secret().trim().is_empty() {
            return Err(Error::bad_response(format!(
                "{what} answered with an empty access token"
            )));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_lives_what_it_says_or_five_minutes_when_it_says_nothing() {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let token = |expires_in| {
            AccessToken::from_expires_in(SecretString::from("t".to_string()), expires_in, issued)
        };
        assert_eq!(
            token(Some(1800)).expires_at,
            issued + Duration::from_secs(1800)
        );
        assert_eq!(token(None).expires_at, issued + Duration::from_secs(300));
    }
}
