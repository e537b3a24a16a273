//! A registry credential and the secret it carries.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use secrecy::SecretString;

/// The username docker clients use to mark [`Credential::secret`] as an identity
/// (refresh) token rather than a password.
pub const IDENTITY_TOKEN_USERNAME: &str = "<token>";

/// The longest lifetime believed for an issued registry credential, whatever the issuer
/// says: 12 hours, the longest any supported issuer grants (an ECR token lives exactly
/// 12 h, a Google access token 1 h and at most 12 h, an ACR refresh token about 3 h).
/// An expiry further ahead (say in the year 10000) is a broken answer, not a long-lived
/// token; capping it only ever shortens a lifetime, never extends one.
pub const MAX_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

/// Caps an issuer's `expires_at` at `now + MAX_LIFETIME` (see [`MAX_LIFETIME`]).
pub fn cap_expiry(expires_at: Option<SystemTime>, now: SystemTime) -> Option<SystemTime> {
    let bound = now.checked_add(MAX_LIFETIME)?;
    expires_at.map(|e| e.min(bound))
}

/// A username and a secret for one registry (or a family of registries), with the time
/// the secret stops working if the issuer said.
///
/// The secret is a [`SecretString`]: `Debug` prints `[REDACTED]`, it is zeroized on
/// drop, and reading it takes an explicit `expose_secret()`. Clones share one copy of
/// the username and the secret (a cached credential is served to every request without
/// copying its secret); the last clone to go zeroizes it.
#[derive(Clone)]
pub struct Credential {
    shared: Arc<Shared>,
    expires_at: Option<SystemTime>,
    subject_token: bool,
}

struct Shared {
    username: String,
    secret: SecretString,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.shared.username)
            .field("secret", &self.shared.secret)
            .field("expires_at", &self.expires_at)
            .field("subject_token", &self.subject_token)
            .finish()
    }
}

impl Credential {
    /// A credential that the issuer says expires at `expires_at` (`None`: unknown).
    pub fn new(
        username: impl Into<String>,
        secret: impl Into<SecretString>,
        expires_at: Option<SystemTime>,
    ) -> Credential {
        Credential {
            shared: Arc::new(Shared {
                username: username.into(),
                secret: secret.into(),
            }),
            expires_at,
            subject_token: false,
        }
    }

    /// A credential an issuer answered at `now`, its expiry capped at
    /// `now + `[`MAX_LIFETIME`]: what every provider builds from an upstream answer.
    pub fn issued(
        username: impl Into<String>,
        secret: impl Into<SecretString>,
        expires_at: Option<SystemTime>,
        now: SystemTime,
    ) -> Credential {
        Credential::new(username, secret, cap_expiry(expires_at, now))
    }

    /// This credential with its expiry capped at `now + `[`MAX_LIFETIME`] (the broker
    /// applies it to every fetched credential, whatever the provider).
    pub fn capped(mut self, now: SystemTime) -> Credential {
        self.expires_at = cap_expiry(self.expires_at, now);
        self
    }

    /// The username, e.g. `AWS`, `oauth2accesstoken` or `00000000-0000-0000-0000-000000000000`.
    pub fn username(&self) -> &str {
        &self.shared.username
    }

    /// The password or token.
    pub fn secret(&self) -> &SecretString {
        &self.shared.secret
    }

    /// When the issuer says the secret stops working, if it said.
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }

    /// This credential marked as passing the caller's own subject token through as the
    /// password (the `oidc` provider): such a credential is never written to a disk
    /// cache, and the kubelet takes it only with `cacheType: Token`.
    pub fn passing_subject_token(mut self) -> Credential {
        self.subject_token = true;
        self
    }

    /// Whether the secret is the caller's own subject token
    /// ([`Credential::passing_subject_token`]).
    pub fn passes_subject_token(&self) -> bool {
        self.subject_token
    }

    /// Whether the secret is an identity token (docker's `<token>` username).
    pub fn is_identity_token(&self) -> bool {
        self.shared.username == IDENTITY_TOKEN_USERNAME
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    #[test]
    fn debug_does_not_print_the_secret() {
        let c = Credential::new("AWS", "s3cr3t-value".to_string(), None);
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
        assert!(shown.contains("AWS"));
        assert_eq!(c.secret().expose_secret(), "s3cr3t-value");
    }

    #[test]
    fn clones_share_one_copy_of_the_secret() {
        let c = Credential::new("AWS", "s3cr3t-value".to_string(), None);
        let d = c.clone().capped(SystemTime::UNIX_EPOCH);
        assert!(std::ptr::eq(
            c.secret().expose_secret().as_ptr(),
            d.secret().expose_secret().as_ptr()
        ));
    }

    #[test]
    fn issued_expiry_is_capped_at_the_max_lifetime() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let year_10000 = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        let c = Credential::issued("AWS", "x".to_string(), Some(year_10000), now);
        assert_eq!(c.expires_at(), Some(now + MAX_LIFETIME));
        let soon = now + Duration::from_secs(3600);
        let c = Credential::issued("AWS", "x".to_string(), Some(soon), now);
        assert_eq!(c.expires_at(), Some(soon), "a plausible expiry is kept");
        let c = Credential::issued("AWS", "x".to_string(), None, now);
        assert_eq!(c.expires_at(), None);
        let c = Credential::new("AWS", "x".to_string(), Some(year_10000)).capped(now);
        assert_eq!(c.expires_at(), Some(now + MAX_LIFETIME));
    }
}
