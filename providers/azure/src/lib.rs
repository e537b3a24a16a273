//! regbroker provider for Azure Container Registry (ACR).
//!
//! Turns the pod's Entra ID identity (AKS Workload Identity, managed identity or a
//! service principal secret) into an ACR refresh token: an Entra ID access token is
//! fetched with `azure_identity`, then exchanged at `POST https://<registry>/oauth2/exchange`.
//! The credential is username `00000000-0000-0000-0000-000000000000` with the refresh
//! token as password, expiring at the token's JWT `exp`.
//!
//! Env vars read (snapshotted by [`AzureProvider::from_env`], never mutated):
//! - identity: `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
//!   `AZURE_CLIENT_SECRET`, `AZURE_AUTHORITY_HOST` (https only), and, read by the SDK from
//!   the process env, `IDENTITY_ENDPOINT` + `IDENTITY_HEADER` (see [`identity`]).
//! - `REGBROKER_AZURE_ACR_SUFFIXES`: comma list of extra private-cloud ACR suffixes
//!   (e.g. `azurecr.contoso.example`); invalid entries are logged and ignored.
//! - `REGBROKER_AZURE_EXCHANGE_URL`: send every exchange to this URL instead of
//!   `https://<registry>/oauth2/exchange` (proxies, tests); https, or http to loopback.
//! - `REGBROKER_AZURE_SCOPE`: Entra ID scope, default
//!   `https://containerregistry.azure.net/.default`.
//!
//! Rule options: `tenant`, `client_id`, `scope`, `authority_host`, `exchange_url`,
//! `service` (see [`OPTIONS`] and the README).
//!
//! A workload's own identity (a ServiceAccount token and its client id annotation, from
//! the kubelet or a Secret's entry) is asserted to Entra ID for that client id, then
//! exchanged at ACR: see [`workload`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builder;
mod diagnose;
pub mod exchange;
pub mod host;
mod http;
pub mod identity;
mod options;
mod provider;
#[cfg(test)]
mod test_support;
pub mod workload;

use std::time::Duration;

/// The `azure_core` version the provider uses, for [`Builder::sdk_http_client`].
pub use azure_core;
pub use builder::Builder;
pub use diagnose::WORKLOAD_IDENTITY_AUDIENCE;
pub use exchange::{ACR_USERNAME, FALLBACK_TTL};
pub use host::Cloud;
pub use identity::{Env, Kind};
pub use provider::AzureProvider;
/// The reqwest version the provider (and the SDK) uses, for [`Builder::http_client`].
pub use reqwest;

/// Env var: comma list of extra ACR suffixes for private clouds.
pub const ENV_ACR_SUFFIXES: &str = "REGBROKER_AZURE_ACR_SUFFIXES";
/// Env var: override of the exchange endpoint URL.
pub const ENV_EXCHANGE_URL: &str = "REGBROKER_AZURE_EXCHANGE_URL";
/// Env var: override of the default Entra ID scope.
pub const ENV_SCOPE: &str = "REGBROKER_AZURE_SCOPE";

/// The Entra ID scope ACR accepts by default.
pub const DEFAULT_SCOPE: &str = "https://containerregistry.azure.net/.default";

/// The rule options this provider accepts.
pub const OPTIONS: &[&str] = &[
    "tenant",
    "client_id",
    "scope",
    "authority_host",
    "exchange_url",
    "service",
];

/// Default bound on one whole fetch (token + exchange, with SDK retries).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
