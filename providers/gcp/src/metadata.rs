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

use tokio::sync::OnceCell;

use crate::http::{self, HttpSettings, Upstream};
use crate::token::AccessToken;

/// The default metadata server address.
pub const DEFAULT_METADATA_HOST: &str = "169.254.169.254";
const TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
const ACCOUNT_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default";
/// The universe this server's identities belong to (absent on older servers: Google's).
const UNIVERSE_PATH: &str = "/computeMetadata/v1/universe/universe-domain";

/// A metadata-server identity.
#[derive(Debug)]
pub(crate) struct Metadata {
    host: String,
    client: reqwest::Client,
    universe: OnceCell<String>,
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
        Ok(Metadata {
            host,
            client,
            universe: OnceCell::new(),
        })
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
        crate::answers::oauth_token(&what, &resp.body, started)
    }

    /// The universe domain of this server's identities, asked once.
    pub(crate) async fn universe(&self, settings: &HttpSettings) -> Result<&str, Error> {
        self.universe
            .get_or_try_init(|| async {
                let url = format!("http://{}{}", self.host, UNIVERSE_PATH);
                let what = self.describe();
                let resp = http::send_optional(settings, Upstream::Metadata, &what, || {
                    self.client.get(&url).header("Metadata-Flavor", "Google")
                })
                .await?;
                match resp {
                    None => Ok(crate::universe::DEFAULT_UNIVERSE.to_string()),
                    Some(r) => crate::answers::universe_domain(&what, &r.body),
                }
            })
            .await
            .map(String::as_str)
    }
}
