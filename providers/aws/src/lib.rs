//! regbroker provider for AWS ECR.
//!
//! Not implemented yet: this crate recognises no host and serves no credential, so
//! auto-detection never routes a registry here and an explicit rule answers "not
//! configured". It exists so the plumbing (cargo feature, registration, rule options)
//! is in place; the exchange lands with its own issue.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use regbroker_provider::{
    BoxFuture, Credential, Error, Options, Provider, Registry, Target, check_known_options,
};

/// The AWS ECR provider (not implemented yet).
#[derive(Debug, Default)]
pub struct AwsProvider {
    _private: (),
}

impl AwsProvider {
    /// A provider that reads its identity from the environment when first used.
    pub fn from_env() -> AwsProvider {
        AwsProvider::default()
    }
}

impl Provider for AwsProvider {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn recognise(&self, _registry: &Registry) -> Option<Target> {
        None
    }

    fn check_options(&self, options: &Options) -> Result<(), String> {
        check_known_options("aws", options, &[])
    }

    fn target(&self, registry: &Registry, _options: &Options) -> Result<Target, Error> {
        Err(Error::not_configured(format!(
            "the aws provider is not implemented in this build; {registry} cannot be served by it"
        )))
    }

    fn fetch<'a>(&'a self, _target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(async {
            Err(Error::not_configured(
                "the aws provider is not implemented in this build",
            ))
        })
    }
}
