//! Provider errors, sorted by what the caller should do next.

use std::fmt;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, in terms of what the caller should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// This provider does not serve the registry: the client should go anonymous.
    NotConfigured,
    /// No identity was found (the message names what was looked for).
    IdentityMissing,
    /// An identity was found but the cloud refused it or refused the exchange.
    IdentityRejected,
    /// The upstream asked us to slow down.
    Throttled,
    /// The upstream could not be reached or answered with a server error.
    Unavailable,
    /// The upstream did not answer in time.
    TimedOut,
    /// The upstream answered with something that is not a credential.
    BadResponse,
    /// The provider's settings are wrong (a rule option, an env var).
    InvalidConfig,
    /// regbroker itself has too much upstream work queued to take on more: try again
    /// shortly.
    Overloaded,
    /// The cloud issued a credential, but the registry refused it when regbroker checked
    /// it (or a client reported it refused): it is not served, and is fetched anew after
    /// the failure pause.
    CredentialRejected,
}

impl ErrorKind {
    /// A short stable code for logs, metrics and error bodies.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::NotConfigured => "not_configured",
            ErrorKind::IdentityMissing => "identity_missing",
            ErrorKind::IdentityRejected => "identity_rejected",
            ErrorKind::Throttled => "upstream_throttled",
            ErrorKind::Unavailable => "upstream_unavailable",
            ErrorKind::TimedOut => "upstream_timeout",
            ErrorKind::BadResponse => "upstream_bad_response",
            ErrorKind::InvalidConfig => "invalid_config",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::CredentialRejected => "credential_rejected",
        }
    }

    /// Whether trying again later may help.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::Throttled
                | ErrorKind::Unavailable
                | ErrorKind::TimedOut
                | ErrorKind::Overloaded
        )
    }
}

/// A provider error: a kind, a one-line message that never holds a secret, and the
/// underlying cause (printed once, at the edge, with [`Error::chain`]).
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<BoxError>,
}

impl Error {
    /// An error of `kind` with a message. The message must not hold a secret.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Error {
        self.source = Some(source.into());
        self
    }

    /// See [`ErrorKind::NotConfigured`].
    pub fn not_configured(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::NotConfigured, message)
    }
    /// See [`ErrorKind::IdentityMissing`].
    pub fn identity_missing(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::IdentityMissing, message)
    }
    /// See [`ErrorKind::IdentityRejected`].
    pub fn identity_rejected(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::IdentityRejected, message)
    }
    /// See [`ErrorKind::Throttled`].
    pub fn throttled(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Throttled, message)
    }
    /// See [`ErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unavailable, message)
    }
    /// See [`ErrorKind::TimedOut`].
    pub fn timed_out(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::TimedOut, message)
    }
    /// See [`ErrorKind::BadResponse`].
    pub fn bad_response(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::BadResponse, message)
    }
    /// See [`ErrorKind::InvalidConfig`].
    pub fn invalid_config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidConfig, message)
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The one-line message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The message followed by every cause, `: `-separated, for logs at the edge.
    pub fn chain(&self) -> String {
        let mut out = self.message.clone();
        let mut next = self.source.as_deref().map(|e| e as &dyn std::error::Error);
        while let Some(e) = next {
            out.push_str(": ");
            out.push_str(&e.to_string());
            next = e.source();
        }
        out
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("source", &self.source)
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line_and_chain_has_the_causes() {
        let io = std::io::Error::other("connection refused");
        let e = Error::unavailable("ECR in us-east-1 unreachable").with_source(io);
        assert_eq!(e.to_string(), "ECR in us-east-1 unreachable");
        assert_eq!(
            e.chain(),
            "ECR in us-east-1 unreachable: connection refused"
        );
        assert!(e.kind().is_transient());
        assert!(!ErrorKind::IdentityMissing.is_transient());
    }
}
