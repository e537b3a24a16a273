//! Which Google identity this process has: the Application Default Credentials order,
//! cut down to what a registry sidecar needs.
//!
//! Reads:
//! - `GOOGLE_APPLICATION_CREDENTIALS`: path of a credentials file. Its `type` decides the
//!   source: `service_account` (a key) or `external_account` (workload identity
//!   federation). Other types (`authorized_user`, `impersonated_service_account`,
//!   `gdch_service_account`) are rejected as invalid configuration.
//! - `GCE_METADATA_HOST`: when no credentials file is named, the metadata server is used
//!   (GKE Workload Identity, GCE), at this address or `169.254.169.254`.
//!
//! gcloud's user credentials (`~/.config/gcloud/application_default_credentials.json`)
//! are deliberately not read: a sidecar must not pick up a developer's login by accident.

use std::collections::BTreeMap;

use regbroker_provider::{Error, SharedClock};
use serde::Deserialize;

use crate::external_account::ExternalAccount;
use crate::http::{self, HttpSettings};
use crate::metadata::{DEFAULT_METADATA_HOST, Metadata};
use crate::service_account::ServiceAccount;
use crate::token::AccessToken;

/// The env var naming a credentials file.
pub const CREDENTIALS_ENV: &str = "GOOGLE_APPLICATION_CREDENTIALS";
/// The env var overriding the metadata server address.
pub const METADATA_HOST_ENV: &str = "GCE_METADATA_HOST";

/// Where settings come from: the process environment, or a fixed map (tests).
#[derive(Clone, Debug)]
pub(crate) enum Env {
    Process,
    Map(BTreeMap<String, String>),
}

impl Env {
    /// A set, non-empty variable.
    pub(crate) fn get(&self, key: &str) -> Option<String> {
        let v = match self {
            Env::Process => std::env::var(key).ok(),
            Env::Map(m) => m.get(key).cloned(),
        };
        v.filter(|v| !v.trim().is_empty())
    }
}

#[derive(Debug)]
enum Source {
    Metadata(Metadata),
    ServiceAccount(ServiceAccount),
    ExternalAccount(Box<ExternalAccount>),
}

/// A loaded identity with the HTTP clients it uses.
#[derive(Debug)]
pub(crate) struct Identity {
    source: Source,
    /// For Google APIs: honours HTTPS_PROXY / NO_PROXY.
    api: reqwest::Client,
    /// For loopback and link-local endpoints: never through a proxy.
    local: reqwest::Client,
}

impl Identity {
    /// Reads the env and the credentials file it names. No network call.
    pub(crate) async fn load(env: &Env, settings: &HttpSettings) -> Result<Identity, Error> {
        let source = match env.get(CREDENTIALS_ENV) {
            Some(path) => load_file(&path).await?,
            None => Source::Metadata(Metadata::new(
                env.get(METADATA_HOST_ENV)
                    .unwrap_or_else(|| DEFAULT_METADATA_HOST.to_string()),
                settings,
            )?),
        };
        let identity = Identity {
            source,
            api: http::client(settings, true)?,
            local: http::client(settings, false)?,
        };
        tracing::info!(identity = %identity.describe(), "Loaded GCP identity");
        Ok(identity)
    }

    /// What the identity is, for logs (no secret).
    pub(crate) fn describe(&self) -> String {
        match &self.source {
            Source::Metadata(m) => m.describe(),
            Source::ServiceAccount(s) => s.describe(),
            Source::ExternalAccount(e) => e.describe(),
        }
    }

    /// The kind of this identity, for `doctor` and `/v1/providers`.
    pub(crate) fn kind(&self) -> regbroker_provider::IdentityKind {
        use regbroker_provider::IdentityKind;
        match &self.source {
            Source::Metadata(_) => IdentityKind::MetadataServer,
            Source::ServiceAccount(_) => IdentityKind::KeyFile,
            Source::ExternalAccount(_) => IdentityKind::ExternalAccount,
        }
    }

    /// The metadata server, when that is the identity.
    pub(crate) fn metadata(&self) -> Option<&Metadata> {
        match &self.source {
            Source::Metadata(m) => Some(m),
            _ => None,
        }
    }

    /// The external_account configuration, when that is the identity.
    pub(crate) fn external(&self) -> Option<&ExternalAccount> {
        match &self.source {
            Source::ExternalAccount(e) => Some(e),
            _ => None,
        }
    }

    /// The universe domain the identity belongs to (see [`crate::universe`]). For the
    /// metadata server this asks it, once.
    pub(crate) async fn universe(&self, settings: &HttpSettings) -> Result<&str, Error> {
        match &self.source {
            Source::Metadata(m) => m.universe(settings).await,
            Source::ServiceAccount(s) => Ok(s.universe()),
            Source::ExternalAccount(e) => Ok(e.universe()),
        }
    }

    /// A fresh access token for `scope`.
    pub(crate) async fn token(
        &self,
        settings: &HttpSettings,
        clock: &SharedClock,
        scope: &str,
    ) -> Result<AccessToken, Error> {
        match &self.source {
            Source::Metadata(m) => m.token(settings, clock).await,
            Source::ServiceAccount(s) => s.token(&self.api, settings, clock, scope).await,
            Source::ExternalAccount(e) => {
                e.token(&self.api, &self.local, settings, clock, scope)
                    .await
            }
        }
    }
}

/// The fingerprint of the identity `env` names, for cache scopes: the credentials file's
/// `type`, `client_email`, `private_key_id` (a key's id, not the key), `audience`,
/// `subject_token_type`, `token_url`, `service_account_impersonation_url`,
/// `universe_domain` and subject token source (its `file` or `url`), or the metadata
/// server's address. Two key files of different service accounts (or two keys of one)
/// then never share a cached token, for example through one `REGBROKER_CACHE_DIR`. Reads
/// the file (at most 64 KiB) without keeping it; a file that cannot be read is
/// fingerprinted by its path, and the fetch then reports why.
pub(crate) fn fingerprint(env: &Env) -> String {
    let metadata_host = env.get(METADATA_HOST_ENV);
    let Some(path) = env.get(CREDENTIALS_ENV) else {
        return regbroker_provider::fingerprint(&[
            ("source", Some("metadata")),
            (METADATA_HOST_ENV, metadata_host.as_deref()),
        ]);
    };
    let json: Option<serde_json::Value> = std::fs::File::open(&path).ok().and_then(|f| {
        use std::io::Read;
        let mut buf = Vec::new();
        f.take(64 * 1024).read_to_end(&mut buf).ok()?;
        serde_json::from_slice(&buf).ok()
    });
    let Some(json) = json else {
        return regbroker_provider::fingerprint(&[
            ("source", Some("unreadable")),
            (CREDENTIALS_ENV, Some(&path)),
        ]);
    };
    let field = |k: &str| json.get(k).and_then(|v| v.as_str());
    let source = json.get("credential_source");
    let source_field = |k: &str| source.and_then(|s| s.get(k)).and_then(|v| v.as_str());
    regbroker_provider::fingerprint(&[
        ("source", Some("file")),
        ("type", field("type")),
        ("client_email", field("client_email")),
        ("private_key_id", field("private_key_id")),
        ("audience", field("audience")),
        ("subject_token_type", field("subject_token_type")),
        ("token_url", field("token_url")),
        (
            "service_account_impersonation_url",
            field("service_account_impersonation_url"),
        ),
        ("universe_domain", field("universe_domain")),
        ("credential_source.file", source_field("file")),
        ("credential_source.url", source_field("url")),
    ])
}

async fn load_file(path: &str) -> Result<Source, Error> {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: String,
    }
    let json = tokio::fs::read(path).await.map_err(|e| {
        Error::identity_missing(format!(
            "{CREDENTIALS_ENV} names {path}, which cannot be read"
        ))
        .with_source(e)
    })?;
    let what = format!("credentials file {path} ({CREDENTIALS_ENV})");
    let typed: Typed = http::parse_json(&what, &json).map_err(|e| {
        Error::invalid_config(format!("{what} is not a JSON object with a `type`")).with_source(e)
    })?;
    match typed.kind.as_str() {
        "service_account" => Ok(Source::ServiceAccount(ServiceAccount::from_json(
            &json, path,
        )?)),
        "external_account" => Ok(Source::ExternalAccount(Box::new(
            ExternalAccount::from_json(&json, path)?,
        ))),
        other => {
            let shown = if other.len() <= 40
                && other
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                other
            } else {
                "?"
            };
            Err(Error::invalid_config(format!(
                "{what} has type `{shown}`; supported: service_account, external_account (or unset {CREDENTIALS_ENV} to use the metadata server)"
            )))
        }
    }
}
