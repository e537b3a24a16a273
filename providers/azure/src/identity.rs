//! Which Entra ID identity the pod has, and an `azure_identity` credential for it.
//!
//! Env vars read (from the provider's env snapshot, see [`Env`]):
//! - `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`: workload
//!   identity (AKS Workload Identity sets all three).
//! - `AZURE_CLIENT_SECRET` with `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`: a service principal
//!   secret.
//! - otherwise managed identity: user-assigned when a client id is known
//!   (`AZURE_CLIENT_ID` or the rule's `client_id`), system-assigned otherwise. The SDK
//!   picks the App Service style endpoint when `IDENTITY_ENDPOINT` and `IDENTITY_HEADER`
//!   are set, IMDS (`169.254.169.254`) otherwise. NOTE: `azure_identity` reads these two
//!   from the *process* environment, not from our snapshot.
//! - `AZURE_AUTHORITY_HOST`: the Entra ID authority (must be https).
//!
//! The chosen order is: workload identity, then client secret, then managed identity.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{Secret, TokenCredential};
use azure_core::error::ErrorKind as AzKind;
use azure_core::http::{ClientOptions, RetryOptions, Transport};
use azure_identity::{
    ClientAssertionCredentialOptions, ClientSecretCredential, ClientSecretCredentialOptions,
    ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId,
    WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};
use regbroker_provider::Error;

/// Env var: client (application) id of the identity.
pub const AZURE_CLIENT_ID: &str = "AZURE_CLIENT_ID";
/// Env var: tenant id.
pub const AZURE_TENANT_ID: &str = "AZURE_TENANT_ID";
/// Env var: path of the projected service-account token (workload identity).
pub const AZURE_FEDERATED_TOKEN_FILE: &str = "AZURE_FEDERATED_TOKEN_FILE";
/// Env var: Entra ID authority host.
pub const AZURE_AUTHORITY_HOST: &str = "AZURE_AUTHORITY_HOST";
/// Env var: service principal secret.
pub const AZURE_CLIENT_SECRET: &str = "AZURE_CLIENT_SECRET";
/// Env var: App Service style managed identity endpoint.
pub const IDENTITY_ENDPOINT: &str = "IDENTITY_ENDPOINT";
/// Env var: App Service style managed identity header secret.
pub const IDENTITY_HEADER: &str = "IDENTITY_HEADER";

/// A snapshot of the env vars this provider reads. `Debug` shows names only, since
/// `AZURE_CLIENT_SECRET` and `IDENTITY_HEADER` are secrets.
#[derive(Clone, Default)]
pub struct Env(BTreeMap<String, String>);

impl Env {
    /// Every env var this crate reads.
    pub const NAMES: &'static [&'static str] = &[
        AZURE_CLIENT_ID,
        AZURE_TENANT_ID,
        AZURE_FEDERATED_TOKEN_FILE,
        AZURE_AUTHORITY_HOST,
        AZURE_CLIENT_SECRET,
        IDENTITY_ENDPOINT,
        IDENTITY_HEADER,
        crate::ENV_ACR_SUFFIXES,
        crate::ENV_EXCHANGE_URL,
        crate::ENV_SCOPE,
    ];

    /// Reads [`Env::NAMES`] from the process environment (no I/O beyond that).
    pub fn from_process() -> Env {
        Env(Self::NAMES
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect())
    }

    /// An env from explicit pairs (tests, embedding).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Env {
        Env(pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect())
    }

    /// A non-empty value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.trim()).filter(|v| !v.is_empty())
    }
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Which kind of identity a target uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Federated service-account token (AKS Workload Identity).
    Workload,
    /// Service principal secret from `AZURE_CLIENT_SECRET`.
    ClientSecret,
    /// Managed identity (App Service style endpoint or IMDS).
    Managed,
}

impl Kind {
    /// Stable name for cache scopes and params.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Workload => "workload",
            Kind::ClientSecret => "client_secret",
            Kind::Managed => "managed",
        }
    }

    /// The inverse of [`Kind::as_str`].
    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::Workload, Kind::ClientSecret, Kind::Managed]
            .into_iter()
            .find(|k| k.as_str() == s)
    }

    /// Which kind the env selects.
    pub fn select(env: &Env) -> Kind {
        if env.get(AZURE_FEDERATED_TOKEN_FILE).is_some() {
            Kind::Workload
        } else if env.get(AZURE_CLIENT_SECRET).is_some() {
            Kind::ClientSecret
        } else {
            Kind::Managed
        }
    }
}

/// Everything needed to build one SDK credential.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Which credential type.
    pub kind: Kind,
    /// Entra ID authority, e.g. `https://login.microsoftonline.com`.
    pub authority_host: String,
    /// Tenant id, when known.
    pub tenant: Option<String>,
    /// Client id, when known (user-assigned managed identity, app registration).
    pub client_id: Option<String>,
}

impl Identity {
    /// A short description for messages (never a secret).
    pub fn describe(&self) -> String {
        let what = match self.kind {
            Kind::Workload => "workload identity",
            Kind::ClientSecret => "client secret identity",
            Kind::Managed if self.client_id.is_some() => "user-assigned managed identity",
            Kind::Managed => "system-assigned managed identity",
        };
        match &self.client_id {
            Some(c) => format!("{what} {c}"),
            None => what.to_string(),
        }
    }
}

/// SDK settings shared by every credential.
#[derive(Clone, Debug)]
pub(crate) struct SdkSettings {
    pub transport: Arc<dyn azure_core::http::HttpClient>,
    pub retry: RetryOptions,
}

impl SdkSettings {
    pub(crate) fn client_options(&self, authority_host: &str) -> ClientOptions {
        let mut custom = CustomConfiguration::default();
        custom.authority_host = authority_host.to_string();
        ClientOptions {
            transport: Some(Transport::new(self.transport.clone())),
            retry: self.retry.clone(),
            cloud: Some(Arc::new(CloudConfiguration::Custom(custom))),
            ..Default::default()
        }
    }
}

fn missing(identity: &Identity, what: &str) -> Error {
    Error::identity_missing(format!(
        "{} needs {what}; looked for AZURE_FEDERATED_TOKEN_FILE with AZURE_CLIENT_ID and AZURE_TENANT_ID (workload identity), AZURE_CLIENT_SECRET with AZURE_CLIENT_ID and AZURE_TENANT_ID (service principal), else managed identity (IDENTITY_ENDPOINT + IDENTITY_HEADER, or IMDS)",
        identity.describe()
    ))
}

/// Builds the SDK credential for `identity`. May read the federated token file.
pub(crate) fn build(
    identity: &Identity,
    env: &Env,
    sdk: &SdkSettings,
) -> Result<Arc<dyn TokenCredential>, Error> {
    let client_options = sdk.client_options(&identity.authority_host);
    match identity.kind {
        Kind::Workload => {
            let tenant = identity.tenant.clone().ok_or_else(|| {
                missing(
                    identity,
                    "a tenant (AZURE_TENANT_ID or rule option `tenant`)",
                )
            })?;
            let client_id = identity.client_id.clone().ok_or_else(|| {
                missing(
                    identity,
                    "a client id (AZURE_CLIENT_ID or rule option `client_id`)",
                )
            })?;
            let path = PathBuf::from(env.get(AZURE_FEDERATED_TOKEN_FILE).unwrap_or_default());
            let options = WorkloadIdentityCredentialOptions {
                credential_options: ClientAssertionCredentialOptions { client_options },
                client_id: Some(client_id),
                tenant_id: Some(tenant),
                token_file_path: Some(path.clone()),
            };
            WorkloadIdentityCredential::new(Some(options))
                .map(|c| c as Arc<dyn TokenCredential>)
                .map_err(|e| {
                    Error::identity_missing(format!(
                        "workload identity: cannot use AZURE_FEDERATED_TOKEN_FILE {} (is the service account token projected?)",
                        path.display()
                    ))
                    .with_source(Cause::of(&e))
                })
        }
        Kind::ClientSecret => {
            let tenant = identity.tenant.clone().ok_or_else(|| {
                missing(
                    identity,
                    "a tenant (AZURE_TENANT_ID or rule option `tenant`)",
                )
            })?;
            let client_id = identity.client_id.clone().ok_or_else(|| {
                missing(
                    identity,
                    "a client id (AZURE_CLIENT_ID or rule option `client_id`)",
                )
            })?;
            let secret = Secret::new(env.get(AZURE_CLIENT_SECRET).unwrap_or_default().to_string());
            ClientSecretCredential::new(
                &tenant,
                client_id,
                secret,
                Some(ClientSecretCredentialOptions { client_options }),
            )
            .map(|c| c as Arc<dyn TokenCredential>)
            .map_err(|e| {
                Error::invalid_config("client secret identity: the SDK refused its settings")
                    .with_source(Cause::of(&e))
            })
        }
        Kind::Managed => {
            let options = ManagedIdentityCredentialOptions {
                user_assigned_id: identity.client_id.clone().map(UserAssignedId::ClientId),
                client_options,
            };
            ManagedIdentityCredential::new(Some(options))
                .map(|c| c as Arc<dyn TokenCredential>)
                .map_err(|e| {
                    Error::identity_missing(format!(
                        "{}: the SDK could not set it up",
                        identity.describe()
                    ))
                    .with_source(Cause::of(&e))
                })
        }
    }
}

/// Maps an SDK `get_token` failure to an error kind with a one-line message. The SDK's
/// own text (Entra ID's error description, never a token) goes into the source only.
pub(crate) fn token_error(identity: &Identity, scope: &str, err: &azure_core::Error) -> Error {
    let who = identity.describe();
    let cause = Cause::of(err);
    let mut status = None;
    let mut code = None;
    let mut transport = false;
    let mut data = false;
    let mut file = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(az) = e.downcast_ref::<azure_core::Error>() {
            match az.kind() {
                AzKind::HttpResponse {
                    status: s,
                    error_code,
                    ..
                } if status.is_none() => {
                    status = Some(u16::from(*s));
                    code = error_code.clone();
                }
                AzKind::Connection | AzKind::Io => transport = true,
                AzKind::DataConversion => data = true,
                _ => {}
            }
        } else if e.is::<std::io::Error>() {
            // Outside a transport error, an I/O error is the token file.
            file = true;
        }
        next = e.source();
    }
    let code = code
        .map(|c| {
            format!(
                ", Entra ID error codes {}",
                c.chars().take(64).collect::<String>()
            )
        })
        .unwrap_or_default();
    let e = match status {
        Some(s @ (400 | 401 | 403)) => Error::identity_rejected(format!(
            "Entra ID refused a token for {who} (scope {scope}, HTTP {s}{code})"
        )),
        Some(429) => Error::throttled(format!(
            "Entra ID is throttling token requests for {who} (HTTP 429)"
        )),
        Some(s @ 500..=599) => Error::unavailable(format!(
            "Entra ID token request for {who} failed (HTTP {s}{code})"
        )),
        Some(s) => Error::bad_response(format!(
            "Entra ID token request for {who} answered HTTP {s}{code}"
        )),
        None if transport && identity.kind == Kind::Managed => Error::identity_missing(format!(
            "{who}: no managed identity endpoint answered; looked for AZURE_FEDERATED_TOKEN_FILE (workload identity), AZURE_CLIENT_SECRET (service principal), IDENTITY_ENDPOINT + IDENTITY_HEADER, then IMDS"
        )),
        None if transport => Error::unavailable(format!(
            "Entra ID token request for {who} could not be sent"
        )),
        None if file && identity.kind == Kind::Workload => Error::identity_missing(format!(
            "{who}: cannot read AZURE_FEDERATED_TOKEN_FILE (is the service account token still projected?)"
        )),
        None if data => {
            Error::bad_response(format!("Entra ID token answer for {who} could not be read"))
        }
        None => Error::identity_rejected(format!("Entra ID token request for {who} failed")),
    };
    e.with_source(cause)
}

/// The error the provider reports when Entra ID's token endpoint answers HTTP `status`
/// with `body` (`None` when the SDK takes the answer for a token): a service principal
/// (`client_id` `regbroker-fuzz`, the secret [`ENTRA_ANSWER_SECRET`]) asks the real
/// azure_identity credential for a token over a transport that gives exactly that answer
/// (no retries), and the failure goes through the same [`token_error`] as every real
/// one. For the fuzz targets and tests: nothing leaves the process.
pub async fn entra_token_answer(status: u16, body: Vec<u8>) -> Option<Error> {
    #[derive(Debug)]
    struct Canned(u16, Vec<u8>);
    #[async_trait::async_trait]
    impl azure_core::http::HttpClient for Canned {
        async fn execute_request(
            &self,
            _request: &azure_core::http::Request,
        ) -> azure_core::Result<azure_core::http::AsyncRawResponse> {
            // What the provider's own transport ([`crate::http::Http`]) hands the SDK.
            let status = azure_core::http::StatusCode::from(self.0);
            let body = azure_core::Bytes::from(self.1.clone());
            let body = if status.is_success() {
                crate::http::bounded_expires_in(body)
            } else {
                body
            };
            Ok(azure_core::http::AsyncRawResponse::from_bytes(
                status,
                azure_core::http::headers::Headers::new(),
                body,
            ))
        }
    }
    let identity = Identity {
        kind: Kind::ClientSecret,
        authority_host: "https://login.microsoftonline.com".to_string(),
        tenant: Some("regbroker-fuzz-tenant".to_string()),
        client_id: Some("regbroker-fuzz".to_string()),
    };
    let env = Env::from_pairs([(AZURE_CLIENT_SECRET, ENTRA_ANSWER_SECRET)]);
    let sdk = SdkSettings {
        transport: Arc::new(Canned(status, body)),
        retry: RetryOptions::none(),
    };
    let scope = "https://containerregistry.azure.net/.default";
    let credential = match build(&identity, &env, &sdk) {
        Ok(c) => c,
        Err(e) => return Some(e),
    };
    match credential.get_token(&[scope], None).await {
        Ok(_) => None,
        Err(e) => Some(token_error(&identity, scope, &e)),
    }
}

/// The client secret [`entra_token_answer`] sends: it must never appear in its error.
pub const ENTRA_ANSWER_SECRET: &str = "regbroker-fuzz-client-secret-0123456789";

/// An SDK error flattened to its text, so our errors carry no SDK response object
/// (whose `Debug` could print a body).
#[derive(Debug)]
pub(crate) struct Cause(String);

impl Cause {
    pub(crate) fn of(e: &azure_core::Error) -> Cause {
        let mut s = e.to_string();
        let mut next = std::error::Error::source(e);
        while let Some(inner) = next {
            let t = inner.to_string();
            if !s.contains(&t) {
                s.push_str(": ");
                s.push_str(&t);
            }
            next = inner.source();
        }
        // One line.
        Cause(s.split_whitespace().collect::<Vec<_>>().join(" "))
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Cause {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn env_debug_shows_names_only() {
        let env = Env::from_pairs([(AZURE_CLIENT_SECRET, "hunter2-secret")]);
        let shown = format!("{env:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains(AZURE_CLIENT_SECRET));
    }

    #[test]
    fn kind_follows_env_in_order() {
        let wi = Env::from_pairs([
            (AZURE_FEDERATED_TOKEN_FILE, "/var/run/token"),
            (AZURE_CLIENT_SECRET, "s"),
        ]);
        assert_eq!(Kind::select(&wi), Kind::Workload);
        assert_eq!(
            Kind::select(&Env::from_pairs([(AZURE_CLIENT_SECRET, "s")])),
            Kind::ClientSecret
        );
        assert_eq!(
            Kind::select(&Env::from_pairs([(AZURE_FEDERATED_TOKEN_FILE, "  ")])),
            Kind::Managed
        );
        assert_eq!(Kind::select(&Env::default()), Kind::Managed);
        for k in [Kind::Workload, Kind::ClientSecret, Kind::Managed] {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
    }

    #[test]
    fn http_statuses_map_to_kinds() {
        use azure_core::http::StatusCode;
        use regbroker_provider::ErrorKind;
        let id = Identity {
            kind: Kind::Workload,
            authority_host: "https://login.microsoftonline.com".into(),
            tenant: Some("t".into()),
            client_id: Some("c".into()),
        };
        let http = |s: StatusCode| {
            let inner = azure_core::Error::with_message(
                AzKind::HttpResponse {
                    status: s,
                    error_code: Some("700016".into()),
                    raw_response: None,
                },
                "AADSTS700016: application not found",
            );
            azure_core::Error::with_error(
                AzKind::Credential,
                inner,
                "WorkloadIdentityCredential authentication failed.",
            )
        };
        let cases = [
            (StatusCode::BadRequest, ErrorKind::IdentityRejected),
            (StatusCode::Unauthorized, ErrorKind::IdentityRejected),
            (StatusCode::TooManyRequests, ErrorKind::Throttled),
            (StatusCode::InternalServerError, ErrorKind::Unavailable),
            (StatusCode::NotFound, ErrorKind::BadResponse),
        ];
        for (status, kind) in cases {
            let e = token_error(&id, "s/.default", &http(status));
            assert_eq!(e.kind(), kind, "{status:?}");
            assert!(e.message().contains("workload identity c"), "{e}");
        }
        let e = token_error(&id, "s", &http(StatusCode::Unauthorized));
        assert!(e.message().contains("700016"), "{e}");
        assert!(e.chain().contains("AADSTS700016"), "{}", e.chain());

        let conn = azure_core::Error::with_message(AzKind::Connection, "refused");
        assert_eq!(token_error(&id, "s", &conn).kind(), ErrorKind::Unavailable);
        let managed = Identity {
            kind: Kind::Managed,
            client_id: None,
            ..id.clone()
        };
        let e = token_error(&managed, "s", &conn);
        assert_eq!(e.kind(), ErrorKind::IdentityMissing);
        assert!(e.message().contains("IDENTITY_ENDPOINT"), "{e}");

        // The SDK re-reads the token file every 10 minutes; a vanished file is a
        // missing identity, not an upstream failure.
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let read = azure_core::Error::with_error(
            AzKind::Credential,
            io,
            "failed to read federated token from file /t",
        );
        let outer = azure_core::Error::with_error(
            AzKind::Credential,
            read,
            "WorkloadIdentityCredential authentication failed.",
        );
        let e = token_error(&id, "s", &outer);
        assert_eq!(e.kind(), ErrorKind::IdentityMissing, "{e}");
        assert!(e.message().contains("AZURE_FEDERATED_TOKEN_FILE"), "{e}");
    }
}
