//! regbroker provider for AWS ECR (private registries) and ECR Public.
//!
//! Env vars and settings read (all through aws-config, lazily, on the first `fetch`):
//! - identity: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`;
//!   `AWS_PROFILE`, `AWS_CONFIG_FILE`, `AWS_SHARED_CREDENTIALS_FILE`;
//!   `AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_SESSION_NAME` (IRSA);
//!   `AWS_CONTAINER_CREDENTIALS_FULL_URI`, `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`,
//!   `AWS_CONTAINER_AUTHORIZATION_TOKEN`, `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (EKS Pod
//!   Identity, ECS); `AWS_EC2_METADATA_SERVICE_ENDPOINT`, `AWS_EC2_METADATA_DISABLED` (IMDSv2);
//! - region of the identity chain's STS calls: `AWS_REGION`, `AWS_DEFAULT_REGION`, the
//!   profile's `region`, else `us-east-1` (the ECR call itself always uses the registry's
//!   region);
//! - endpoints: `AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_ECR`, `AWS_ENDPOINT_URL_ECR_PUBLIC`,
//!   `AWS_ENDPOINT_URL_STS`, `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`, `AWS_USE_FIPS_ENDPOINT`,
//!   `AWS_USE_DUALSTACK_ENDPOINT`;
//! - budgets (read at construction): `REGBROKER_AWS_ECR_RATE` (`RATE/BURST` of ECR
//!   `GetAuthorizationToken` calls per caller account and region, default `20/200`, ECR's
//!   own limit) and `REGBROKER_AWS_STS_RATE` (`AssumeRoleWithWebIdentity` per region,
//!   default `50/100`): with thousands of identities, calls wait for their slot instead of
//!   being throttled.
//!
//! [`AwsProvider::from_env`] does no I/O. [`AwsProvider::builder`] takes explicit settings
//! for tests (endpoint, credentials, retry and timeout settings, clock).
//!
//! Rule options: `region`, `account`, `role_arn` (see [`options`]).
//!
//! A workload's own identity (a ServiceAccount token and its role annotation, from the
//! kubelet or a Secret's entry) is exchanged with STS `AssumeRoleWithWebIdentity` in the
//! registry's region before the ECR call: see [`web_identity`].
//!
//! Every cache scope carries a fingerprint of the identity settings above (names, ids and
//! endpoints, never a secret), so processes with different identities sharing one disk
//! cache never read each other's credentials.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod authorization_token;
mod builder;
mod clients;
mod diagnose;
mod errors;
pub mod host;
pub mod options;
mod provider;
#[cfg(test)]
mod test_support;
pub mod web_identity;

pub use authorization_token::{credential_from_authorization_data, decode_token};
/// The SDK's timestamp type (`expiresAt`), for [`credential_from_authorization_data`].
pub use aws_smithy_types::DateTime;
pub use builder::{
    Builder, CallSettings, DEFAULT_ECR_RATE, DEFAULT_STS_RATE, ECR_RATE_ENV, STS_RATE_ENV,
};
pub use diagnose::{Detected, detect};
pub use errors::IDENTITY_SOURCES;
pub use provider::AwsProvider;

/// The username of every ECR credential.
pub const USERNAME: &str = "AWS";
/// The region of the ECR Public API.
pub const PUBLIC_REGION: &str = "us-east-1";
/// Session name used when assuming a rule's `role_arn`.
pub const SESSION_NAME: &str = "regbroker";

/// Tracing filter directives the broker must add after the user's own (e.g. to an
/// `EnvFilter`), so that even `RUST_LOG=trace` cannot log secrets: at TRACE the AWS SDK
/// logs request headers (the session token), the SigV4 canonical request and the raw
/// response body (the ECR token). Capped at DEBUG, nothing secret is logged
/// (`tests/logs.rs` checks both).
pub const LOG_DIRECTIVES: &[&str] = &[
    "aws_config=debug",
    "aws_credential_types=debug",
    "aws_runtime=debug",
    "aws_sigv4=debug",
    "aws_smithy_runtime=debug",
    "aws_smithy_runtime_api=debug",
    "aws_smithy_http=debug",
    "aws_smithy_http_client=debug",
    "aws_smithy_types=debug",
    "aws_smithy_json=debug",
    "aws_sdk_ecr=debug",
    "aws_sdk_ecrpublic=debug",
    "aws_sdk_sts=debug",
    "aws_sdk_sso=debug",
    "aws_sdk_ssooidc=debug",
    "hyper=debug",
    "hyper_util=debug",
    "h2=debug",
];
