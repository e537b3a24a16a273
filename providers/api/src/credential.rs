//! A registry credential and the secret it carries.

use std::time::SystemTime;

use secrecy::SecretString;

/// The username docker clients use to mark [`Credential::secret`] as an identity
/// (refresh) token rather than a password.
pub const IDENTITY_TOKEN_USERNAME: &str = "<token>";

/// A username and a secret for one registry (or a family of registries), with the time
/// the secret stops working if the issuer said.
///
/// The secret is a [`SecretString`]: `Debug` prints `[REDACTED]`, it is zeroized on
/// drop, and reading it takes an explicit `expose_secret()`.
#[derive(Clone, Debug)]
pub struct Credential {
    username: String,
    secret: SecretString,
    expires_at: Option<SystemTime>,
}

impl Credential {
    /// A credential that the issuer says expires at `expires_at` (`None`: unknown).
    pub fn new(
        username: impl Into<String>,
        secret: impl Into<SecretString>,
        expires_at: Option<SystemTime>,
    ) -> Credential {
        Credential {
            username: username.into(),
            secret: secret.into(),
            expires_at,
        }
    }

    /// The username, e.g. `AWS`, `oauth2accesstoken` or `00000000-0000-0000-0000-000000000000`.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password or token.
    pub fn secret(&self) -> &SecretString {
        &self.secret
    }

    /// When the issuer says the secret stops working, if it said.
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }

    /// Whether the secret is an identity token (docker's `<token>` username).
    pub fn is_identity_token(&self) -> bool {
        self.username == IDENTITY_TOKEN_USERNAME
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
}
