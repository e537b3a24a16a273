//! Mapping of SDK errors to provider error kinds.
//!
//! Reads no env var. Never attaches an `SdkError` itself as a source: it can hold the raw
//! HTTP response, whose body might be a token. The attached cause is the `Display` chain
//! of the error, which holds codes and short messages only.

use std::error::Error as StdError;
use std::fmt;

use aws_credential_types::provider::error::CredentialsError;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use regbroker_provider::Error;

/// What the default chain looks for, for `identity_missing` messages.
pub const IDENTITY_SOURCES: &str = "env AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, \
profile AWS_PROFILE in AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE (~/.aws), \
IRSA AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, \
EKS Pod Identity AWS_CONTAINER_CREDENTIALS_FULL_URI + AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, \
ECS AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, \
and EC2 IMDSv2 (AWS_EC2_METADATA_SERVICE_ENDPOINT, AWS_EC2_METADATA_DISABLED)";

/// Error codes that mean the identity was refused.
const REJECTED_CODES: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "InvalidIdentityToken",
    "IDPRejectedClaim",
    "NotAuthorized",
];

const THROTTLED_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "LimitExceededException",
];

/// The `Display` chain of an error, as a plain cause that holds no raw response.
#[derive(Debug)]
pub struct Cause(String);

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Cause {}

impl Cause {
    fn of(e: &(dyn StdError + 'static)) -> Cause {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(e) = next {
            out.push_str(": ");
            out.push_str(&e.to_string());
            next = e.source();
        }
        Cause(out)
    }
}

/// Maps a failed call of `what` (e.g. "ECR GetAuthorizationToken in us-east-1").
pub fn map_sdk_error<E>(
    what: &str,
    err: SdkError<E, aws_smithy_runtime_api::http::Response>,
) -> Error
where
    E: StdError + ProvideErrorMetadata + 'static,
{
    // Identity resolution failures come wrapped in a dispatch or construction failure.
    if let Some(cred) = find::<CredentialsError>(&err) {
        return map_credentials_error(cred).with_source(Cause::of(&err));
    }
    let kind_error = match &err {
        SdkError::TimeoutError(_) => Error::timed_out(format!("{what} timed out")),
        SdkError::DispatchFailure(d) if d.is_timeout() => {
            Error::timed_out(format!("{what} timed out"))
        }
        SdkError::DispatchFailure(d) if d.is_user() => Error::invalid_config(format!(
            "{what} could not be sent (check the endpoint settings, e.g. AWS_ENDPOINT_URL)"
        )),
        SdkError::DispatchFailure(_) => {
            Error::unavailable(format!("{what} failed: the endpoint could not be reached"))
        }
        SdkError::ConstructionFailure(_) => Error::invalid_config(format!(
            "{what} could not be built (check region and endpoint settings)"
        )),
        SdkError::ResponseError(r) => {
            let status = r.raw().status().as_u16();
            if status == 429 {
                Error::throttled(format!("{what} was throttled (HTTP 429)"))
            } else if status >= 500 {
                Error::unavailable(format!("{what} failed with HTTP {status}"))
            } else {
                Error::bad_response(format!("{what}: unreadable response (HTTP {status})"))
            }
        }
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = s.err().code().unwrap_or("");
            // The code is a short identifier chosen by AWS; keep it printable and short.
            let shown: String = code
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                .take(64)
                .collect();
            if THROTTLED_CODES.contains(&code) || status == 429 {
                Error::throttled(format!("{what} was throttled ({shown})"))
            } else if REJECTED_CODES.contains(&code) || status == 401 || status == 403 {
                Error::identity_rejected(format!(
                    "{what} was refused: {shown} (HTTP {status}); check the IAM policy of the identity"
                ))
            } else if status >= 500 {
                Error::unavailable(format!("{what} failed: {shown} (HTTP {status})"))
            } else if code == "InvalidParameterException" || code == "ValidationException" {
                Error::invalid_config(format!(
                    "{what} refused the request as invalid: {shown} (HTTP {status}); check the account and region"
                ))
            } else {
                Error::bad_response(format!("{what} failed: {shown} (HTTP {status})"))
            }
        }
        _ => Error::unavailable(format!("{what} failed")),
    };
    kind_error.with_source(Cause::of(&err))
}

/// Maps a credentials error (from the identity chain or AssumeRole).
pub fn map_credentials_error(err: &CredentialsError) -> Error {
    match err {
        CredentialsError::CredentialsNotLoaded(_) => Error::identity_missing(format!(
            "no AWS identity found; looked for {IDENTITY_SOURCES}"
        )),
        CredentialsError::ProviderTimedOut(_) => {
            Error::timed_out("loading the AWS identity timed out")
        }
        CredentialsError::InvalidConfiguration(_) => {
            Error::invalid_config("the AWS identity settings are invalid")
        }
        CredentialsError::ProviderError(_) => {
            // The provider found an identity but exchanging it failed (STS refused the
            // web identity token, AssumeRole denied, ...). Transport trouble underneath
            // is still transient.
            if has_transport_trouble(err) {
                Error::unavailable(
                    "loading the AWS identity failed: its endpoint could not be reached",
                )
            } else if has_code(err, THROTTLED_CODES) {
                Error::throttled("loading the AWS identity was throttled")
            } else {
                // Only a known AWS error code is quoted: a short identifier, never the
                // rest of an upstream answer. The whole cause goes to the log.
                let code = known_code(&Cause::of(err).0)
                    .map(|c| format!(": AWS answered {c}"))
                    .unwrap_or_default();
                Error::identity_rejected(format!(
                    "the AWS identity the default chain found could not be used or was refused{code} (the log has the whole cause)"
                ))
            }
        }
        _ => Error::unavailable("loading the AWS identity failed"),
    }
}

fn find<'a, T: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        next = e.source();
    }
    None
}

fn has_transport_trouble(err: &(dyn StdError + 'static)) -> bool {
    let text = Cause::of(err).0;
    text.contains("dispatch failure") || text.contains("io error") || text.contains("timed out")
}

fn has_code(err: &(dyn StdError + 'static), codes: &[&str]) -> bool {
    let text = Cause::of(err).0;
    codes.iter().any(|c| text.contains(c))
}

/// The longest known AWS error code (refusal or throttling) in `text`, for `doctor`'s
/// messages: a short identifier, never anything else of an upstream answer.
pub fn known_code(text: &str) -> Option<&'static str> {
    REJECTED_CODES
        .iter()
        .chain(THROTTLED_CODES)
        .filter(|c| text.contains(*c))
        .max_by_key(|c| c.len())
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_identity_names_the_aws_code_and_nothing_else_of_the_answer() {
        let err = CredentialsError::provider_error(
            "InvalidIdentityToken: Incorrect token audience; token eyJhbGciOi.secret-part",
        );
        let e = map_credentials_error(&err);
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::IdentityRejected);
        let msg = e.to_string();
        assert!(msg.contains("AWS answered InvalidIdentityToken"), "{msg}");
        assert!(
            !msg.contains("secret-part") && !msg.contains("audience"),
            "{msg}"
        );
        // Without a known code the message says so without guessing.
        let e = map_credentials_error(&CredentialsError::provider_error("something odd"));
        assert!(!e.to_string().contains("AWS answered"), "{e}");
        // The chain may have found only the instance metadata identity: the message
        // says an identity was found, not that one "is configured" (doctor would then
        // contradict it when it notes that no identity variables are set).
        assert!(!e.to_string().contains("configured"), "{e}");
    }
}
