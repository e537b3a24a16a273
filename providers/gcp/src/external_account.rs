//! Workload identity federation: an `"type": "external_account"` credentials file (from
//! `gcloud iam workload-identity-pools create-cred-config`), as used from EKS, AKS or
//! on-premises clusters.
//!
//! Reads, from the credentials file: `audience`, `subject_token_type`, `token_url`
//! (default `https://sts.googleapis.com/v1/token`), `credential_source` (`file`, or `url`
//! with optional `headers`; `format` `text` or `json` with `subject_token_field_name`),
//! optional `service_account_impersonation_url` and
//! `service_account_impersonation.token_lifetime_seconds`, optional `client_id` /
//! `client_secret` and `workforce_pool_user_project`. Executable- and AWS-sourced
//! credentials (`credential_source.executable`, `environment_id`) are not supported:
//! use a file-sourced token (the pod's projected service-account token) instead.
//!
//! Flow: read the subject token afresh on every fetch (projected tokens rotate), exchange
//! it at the STS (RFC 8693 token exchange), then, if an impersonation URL is set, call
//! IAM Credentials `generateAccessToken` with the STS token.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use regbroker_provider::{Error, ExposeSecret, SecretString, SharedClock};
use serde::Deserialize;

use crate::http::{self, HttpSettings, Upstream};
use crate::service_account::host_of;
use crate::token::AccessToken;
use crate::url::{checked_endpoint, checked_subject_token_url};

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
const DEFAULT_IMPERSONATION_LIFETIME: u64 = 3600;

#[derive(Deserialize)]
struct File {
    audience: String,
    subject_token_type: String,
    #[serde(default)]
    token_url: Option<String>,
    credential_source: CredentialSourceFile,
    #[serde(default)]
    service_account_impersonation_url: Option<String>,
    #[serde(default)]
    service_account_impersonation: Option<ImpersonationOptions>,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    client_secret: Option<SecretString>,
    #[serde(default)]
    workforce_pool_user_project: Option<String>,
    #[serde(default)]
    universe_domain: Option<String>,
}

#[derive(Deserialize)]
struct ImpersonationOptions {
    #[serde(default)]
    token_lifetime_seconds: Option<u64>,
}

#[derive(Deserialize)]
struct CredentialSourceFile {
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    format: Option<Format>,
    #[serde(default)]
    executable: Option<serde_json::Value>,
    #[serde(default)]
    environment_id: Option<String>,
}

#[derive(Deserialize)]
struct Format {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    subject_token_field_name: Option<String>,
}

#[derive(Debug)]
enum Source {
    File(String),
    Url {
        url: reqwest::Url,
        headers: BTreeMap<String, String>,
    },
    /// A workload's own ServiceAccount token, handed over with the request.
    Given(SecretString),
}

/// How the subject token is written: the whole body, or one field of a JSON object.
#[derive(Debug)]
enum TokenFormat {
    Text,
    Json(String),
}

/// A loaded external_account configuration.
#[derive(Debug)]
pub(crate) struct ExternalAccount {
    audience: String,
    subject_token_type: String,
    token_url: reqwest::Url,
    source: Source,
    format: TokenFormat,
    impersonation: Option<(reqwest::Url, u64)>,
    client: Option<(String, SecretString)>,
    workforce_pool_user_project: Option<String>,
    universe: String,
}

impl ExternalAccount {
    /// Parses a credentials file's JSON. `path` only names the file in messages.
    pub(crate) fn from_json(json: &[u8], path: &str) -> Result<ExternalAccount, Error> {
        let what = format!("external_account credentials {path}");
        let file: File = http::parse_json(&what, json).map_err(|e| {
            Error::invalid_config(format!(
                "{what} are not valid (audience, subject_token_type and credential_source are required)"
            ))
            .with_source(e)
        })?;
        let cs = file.credential_source;
        if cs.executable.is_some() || cs.environment_id.is_some() {
            return Err(Error::invalid_config(format!(
                "{what}: executable- and AWS-sourced credentials are not supported; use a file-sourced subject token (credential_source.file)"
            )));
        }
        let source = match (cs.file, cs.url) {
            (Some(f), None) if !f.is_empty() => Source::File(f),
            (None, Some(u)) => Source::Url {
                url: checked_subject_token_url(&u, &format!("credential_source.url in {what}"))?,
                headers: cs.headers,
            },
            _ => {
                return Err(Error::invalid_config(format!(
                    "{what}: credential_source must have exactly one of `file` or `url`"
                )));
            }
        };
        let format = match cs.format {
            None => TokenFormat::Text,
            Some(f) if f.kind == "text" => TokenFormat::Text,
            Some(f) if f.kind == "json" => match f.subject_token_field_name {
                Some(name) if !name.is_empty() => TokenFormat::Json(name),
                _ => {
                    return Err(Error::invalid_config(format!(
                        "{what}: credential_source.format of type json needs subject_token_field_name"
                    )));
                }
            },
            Some(_) => {
                return Err(Error::invalid_config(format!(
                    "{what}: credential_source.format.type must be `text` or `json`"
                )));
            }
        };
        let universe = match &file.universe_domain {
            None => crate::universe::DEFAULT_UNIVERSE.to_string(),
            Some(u) => crate::universe::checked(u, &format!("universe_domain in {what}"))?,
        };
        // Without a token_url, the credentials' own universe's STS.
        let default_url = crate::universe::endpoint("sts", &universe, "/v1/token");
        let token_url = checked_endpoint(
            file.token_url.as_deref().unwrap_or(&default_url),
            &format!("token_url in {what}"),
        )?;
        let impersonation = match file.service_account_impersonation_url {
            None => None,
            Some(u) => {
                let url =
                    checked_endpoint(&u, &format!("service_account_impersonation_url in {what}"))?;
                let lifetime = file
                    .service_account_impersonation
                    .and_then(|o| o.token_lifetime_seconds)
                    .unwrap_or(DEFAULT_IMPERSONATION_LIFETIME);
                if !(600..=43_200).contains(&lifetime) {
                    return Err(Error::invalid_config(format!(
                        "{what}: service_account_impersonation.token_lifetime_seconds must be 600 to 43200"
                    )));
                }
                Some((url, lifetime))
            }
        };
        let client = match (file.client_id, file.client_secret) {
            (Some(id), Some(secret)) => Some((id, secret)),
            (None, None) => None,
            _ => {
                return Err(Error::invalid_config(format!(
                    "{what}: client_id and client_secret go together"
                )));
            }
        };
        Ok(ExternalAccount {
            audience: file.audience,
            subject_token_type: file.subject_token_type,
            token_url,
            source,
            format,
            impersonation,
            client,
            workforce_pool_user_project: file.workforce_pool_user_project,
            universe,
        })
    }

    /// A workload's own federation (issue 15): its ServiceAccount `token` exchanged at
    /// `token_url` for `audience` (the workload identity provider), then, with
    /// `impersonation`, a `generateAccessToken` for that Google service account.
    pub(crate) fn for_workload(
        audience: String,
        token_url: reqwest::Url,
        impersonation: Option<reqwest::Url>,
        universe: String,
        token: SecretString,
    ) -> ExternalAccount {
        ExternalAccount {
            audience,
            subject_token_type: "urn:ietf:params:oauth:token-type:jwt".to_string(),
            token_url,
            source: Source::Given(token),
            format: TokenFormat::Text,
            impersonation: impersonation.map(|u| (u, DEFAULT_IMPERSONATION_LIFETIME)),
            client: None,
            workforce_pool_user_project: None,
            universe,
        }
    }

    /// The `audience` of the credentials file (the workload identity provider).
    pub(crate) fn audience(&self) -> &str {
        &self.audience
    }

    /// The subject token file, when the token comes from a file.
    pub(crate) fn token_file(&self) -> Option<&str> {
        match &self.source {
            Source::File(f) => Some(f),
            Source::Url { .. } | Source::Given(_) => None,
        }
    }

    /// The STS host the subject token is exchanged at.
    pub(crate) fn token_host(&self) -> String {
        host_of(&self.token_url)
    }

    /// The universe the credentials belong to (`universe_domain`, default Google's).
    pub(crate) fn universe(&self) -> &str {
        &self.universe
    }

    pub(crate) fn describe(&self) -> String {
        match &self.impersonation {
            Some((url, _)) => format!(
                "external_account (audience {}) impersonating {}",
                self.audience,
                impersonated_account(url)
            ),
            None => format!("external_account (audience {})", self.audience),
        }
    }

    pub(crate) async fn token(
        &self,
        api: &reqwest::Client,
        local: &reqwest::Client,
        settings: &HttpSettings,
        clock: &SharedClock,
        scope: &str,
    ) -> Result<AccessToken, Error> {
        let subject = self.subject_token(api, local, settings).await?;
        let started = clock.now();
        let sts = self
            .exchange(api, settings, &subject, scope, started)
            .await?;
        match &self.impersonation {
            None => Ok(sts),
            Some((url, lifetime)) => {
                self.impersonate(api, settings, url, *lifetime, &sts.secret, scope, started)
                    .await
            }
        }
    }

    async fn subject_token(
        &self,
        api: &reqwest::Client,
        local: &reqwest::Client,
        settings: &HttpSettings,
    ) -> Result<SecretString, Error> {
        let (raw, what) = match &self.source {
            Source::Given(token) => return Ok(token.clone()),
            Source::File(path) => {
                // The token-file reader every provider shares: bounded, wiped on drop,
                // errors naming the file and never its content.
                let raw =
                    regbroker_provider::subject_token::read_bytes(std::path::Path::new(path))?;
                (raw, format!("subject token file {path}"))
            }
            Source::Url { url, headers } => {
                let what = format!("subject token URL on {}", host_of(url));
                let client = if url.scheme() == "http" { local } else { api };
                let resp = http::send(settings, Upstream::SubjectTokenUrl, &what, || {
                    subject_token_request(client, url, headers)
                })
                .await?;
                (resp.body, what)
            }
        };
        let from_json;
        let token: &str = match &self.format {
            TokenFormat::Text => std::str::from_utf8(&raw)
                .map_err(|_| Error::identity_missing(format!("{what} is not UTF-8 text")))?,
            TokenFormat::Json(field) => {
                let value: serde_json::Value = http::parse_json(&what, &raw)?;
                from_json = value
                    .get(field)
                    .and_then(|v| v.as_str())
                    .map(|s| secrecy::zeroize::Zeroizing::new(s.to_string()))
                    .ok_or_else(|| {
                        Error::identity_missing(format!("{what} has no string field `{field}`"))
                    })?;
                from_json.as_str()
            }
        };
        let token = token.trim();
        if token.is_empty() {
            return Err(Error::identity_missing(format!("{what} is empty")));
        }
        Ok(SecretString::from(token.to_string()))
    }

    async fn exchange(
        &self,
        client: &reqwest::Client,
        settings: &HttpSettings,
        subject: &SecretString,
        scope: &str,
        started: SystemTime,
    ) -> Result<AccessToken, Error> {
        let what = format!("STS {}", host_of(&self.token_url));
        let options = self
            .workforce_pool_user_project
            .as_ref()
            .filter(|_| self.client.is_none())
            .map(|p| serde_json::json!({"userProject": p}).to_string());
        let resp = http::send(settings, Upstream::TokenEndpoint, &what, || {
            let mut form: Vec<(&str, &str)> = vec![
                ("grant_type", TOKEN_EXCHANGE),
                ("audience", &self.audience),
                ("scope", scope),
                ("requested_token_type", ACCESS_TOKEN_TYPE),
                ("subject_token", subject.expose_secret()),
                ("subject_token_type", &self.subject_token_type),
            ];
            if let Some(o) = &options {
                form.push(("options", o));
            }
            let req = client.post(self.token_url.clone()).form(&form);
            match &self.client {
                Some((id, secret)) => req.header(
                    reqwest::header::AUTHORIZATION,
                    sensitive(&format!(
                        "Basic {}",
                        STANDARD.encode(format!("{id}:{}", secret.expose_secret()))
                    )),
                ),
                None => req,
            }
        })
        .await?;
        crate::answers::oauth_token(&what, &resp.body, started)
    }

    #[allow(clippy::too_many_arguments)]
    async fn impersonate(
        &self,
        client: &reqwest::Client,
        settings: &HttpSettings,
        url: &reqwest::Url,
        lifetime: u64,
        sts_token: &SecretString,
        scope: &str,
        started: SystemTime,
    ) -> Result<AccessToken, Error> {
        let what = format!(
            "IAM Credentials {} for {}",
            host_of(url),
            impersonated_account(url)
        );
        let body = serde_json::json!({"scope": [scope], "lifetime": format!("{lifetime}s")});
        let resp = http::send(settings, Upstream::Impersonation, &what, || {
            client
                .post(url.clone())
                .header(
                    reqwest::header::AUTHORIZATION,
                    sensitive(&format!("Bearer {}", sts_token.expose_secret())),
                )
                .json(&body)
        })
        .await?;
        // Never believes a lifetime longer than the one asked for.
        crate::answers::generated_token(&what, &resp.body, started, Duration::from_secs(lifetime))
    }
}

/// The GET for a URL-sourced subject token. The config's headers may carry a credential
/// (`Authorization`, a metadata token), so every value is marked sensitive.
fn subject_token_request(
    client: &reqwest::Client,
    url: &reqwest::Url,
    headers: &BTreeMap<String, String>,
) -> reqwest::RequestBuilder {
    headers.iter().fold(client.get(url.clone()), |r, (k, v)| {
        match reqwest::header::HeaderValue::from_str(v) {
            Ok(mut value) => {
                value.set_sensitive(true);
                r.header(k.as_str(), value)
            }
            // Let reqwest report the bad value as it always did.
            Err(_) => r.header(k.as_str(), v.as_str()),
        }
    })
}

/// `sa@p.iam.gserviceaccount.com` from `.../serviceAccounts/sa@p.iam.gserviceaccount.com:generateAccessToken`.
fn impersonated_account(url: &reqwest::Url) -> String {
    url.path()
        .rsplit('/')
        .next()
        .and_then(|s| s.strip_suffix(":generateAccessToken"))
        .unwrap_or("?")
        .to_string()
}

/// A header value marked sensitive, so that HTTP-level logging never prints it.
fn sensitive(value: &str) -> reqwest::header::HeaderValue {
    match reqwest::header::HeaderValue::from_str(value) {
        Ok(mut v) => {
            v.set_sensitive(true);
            v
        }
        // A token with bytes a header cannot hold: send an empty value, the upstream
        // rejects it and says so.
        Err(_) => reqwest::header::HeaderValue::from_static(""),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn credentials_without_token_url_use_their_own_universes_sts() {
        let file = |universe: Option<&str>| {
            let mut j = serde_json::json!({
                "type": "external_account",
                "audience": "//iam.example/aud",
                "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
                "credential_source": {"file": "/var/run/token"},
            });
            if let Some(u) = universe {
                j["universe_domain"] = serde_json::json!(u);
            }
            j.to_string().into_bytes()
        };
        let google = ExternalAccount::from_json(&file(None), "/c").unwrap();
        assert_eq!(google.universe(), "googleapis.com");
        assert_eq!(
            google.token_url.as_str(),
            "https://sts.googleapis.com/v1/token"
        );
        let s3ns = ExternalAccount::from_json(&file(Some("s3nsapis.fr")), "/c").unwrap();
        assert_eq!(s3ns.universe(), "s3nsapis.fr");
        assert_eq!(s3ns.token_url.as_str(), "https://sts.s3nsapis.fr/v1/token");
    }

    #[test]
    fn subject_token_url_headers_are_sent_marked_sensitive() {
        let client = reqwest::Client::new();
        let url = reqwest::Url::parse("http://169.254.169.254/token").unwrap();
        let headers = BTreeMap::from([
            ("Authorization".to_string(), "Bearer sekrit".to_string()),
            ("Metadata".to_string(), "true".to_string()),
        ]);
        let req = subject_token_request(&client, &url, &headers)
            .build()
            .unwrap();
        for name in ["authorization", "metadata"] {
            assert!(req.headers()[name].is_sensitive(), "{name}");
        }
        // A value no header can hold is still reqwest's error, as before.
        let bad = BTreeMap::from([("X".to_string(), "a\nb".to_string())]);
        assert!(subject_token_request(&client, &url, &bad).build().is_err());
    }
}
