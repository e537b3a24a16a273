//! The GCE / GKE metadata server: the identity of a GKE pod (Workload Identity) or a GCE VM.
//!
//! Reads `GCE_METADATA_HOST` (`host` or `host:port`, default `169.254.169.254`, the
//! address Google's own libraries fall back to, which needs no DNS). Calls
//! `GET http://<host>/computeMetadata/v1/instance/service-accounts/default/token` with
//! the header `Metadata-Flavor: Google` and reads `access_token` and `expires_in`.
//!
//! No `scopes` parameter is sent: the token carries the scopes of the node or of the
//! Workload Identity service account (`cloud-platform` on GKE), like
//! `docker-credential-gcr` does.

use std::time::SystemTime;

use regbroker_provider::{Error, SharedClock};

use crate::http::{self, HttpSettings, OAuthToken, Upstream};
use crate::token::AccessToken;

/// The default metadata server address.
pub const DEFAULT_METADATA_HOST: &str = "169.254.169.254";
const TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
const ACCOUNT_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default";

/// A metadata-server identity.
#[derive(Debug)]
pub(crate) struct Metadata {
    host: String,
    client: reqwest::Client,
}

impl Metadata {
    /// A source for the metadata server at `host` (`host` or `host:port`).
    pub(crate) fn new(host: String, settings: &HttpSettings) -> Result<Metadata, Error> {
        if host.is_empty()
            || host.contains(['/', '?', '#', '@'])
            || host.chars().any(char::is_whitespace)
        {
            return Err(Error::invalid_config(
                "GCE_METADATA_HOST must be a host or host:port, without a scheme or a path",
            ));
        }
        // The metadata server is link-local: a proxy would at best not reach it and at
        // worst receive the token.
        let client = http::client(settings, false)?;
        Ok(Metadata { host, client })
    }

    /// The metadata server's address.
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// `GET .../service-accounts/default/<what>` (`email`, `scopes`), one attempt: the
    /// text, or the error (404 when the server has no such entry).
    pub(crate) async fn account_info(
        &self,
        settings: &HttpSettings,
        what: &str,
    ) -> Result<String, Error> {
        let url = format!("http://{}{ACCOUNT_PATH}/{what}", self.host);
        let one = HttpSettings {
            attempts: 1,
            ..settings.clone()
        };
        let resp = http::send(&one, Upstream::Metadata, &self.describe(), || {
            self.client.get(&url).header("Metadata-Flavor", "Google")
        })
        .await?;
        let text = String::from_utf8_lossy(&resp.body);
        Ok(text
            .split_whitespace()
            .take(32)
            .map(|w| w.chars().take(120).collect::<String>())
            .collect::<Vec<_>>()
            .join(" "))
    }

    pub(crate) fn describe(&self) -> String {
        format!("GCE metadata server at {}", self.host)
    }

    pub(crate) async fn token(
        &self,
        settings: &HttpSettings,
        clock: &SharedClock,
    ) -> Result<AccessToken, Error> {
        let url = format!("http://{}{}", self.host, TOKEN_PATH);
        let what = self.describe();
        let started: SystemTime = clock.now();
        let resp = http::send(settings, Upstream::Metadata, &what, || {
            self.client.get(&url).header("Metadata-Flavor", "Google")
        })
        .await?;
        let token: OAuthToken = http::parse_json(&what, &resp.body)?;
        Ok(AccessToken::from_expires_in(
            token.access_token,
            token.expires_in,
            started,
        ))
    }
}
