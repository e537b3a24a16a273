//! A service-account key (`"type": "service_account"` JSON, as `GOOGLE_APPLICATION_CREDENTIALS`
//! names it) exchanged for an access token with the OAuth 2.0 JWT-bearer grant (RFC 7523).
//!
//! Reads, from the key file: `client_email`, `private_key` (PEM, PKCS#8 or PKCS#1 RSA),
//! `private_key_id`, `token_uri` (default `https://oauth2.googleapis.com/token`). Signs an
//! RS256 assertion `{iss, scope, aud: token_uri, iat, exp}` with aws-lc-rs and posts it
//! to `token_uri` (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`).
//!
//! The key never leaves this process: only the short-lived signed assertion is sent.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use regbroker_provider::{Error, ExposeSecret, SecretString, SharedClock};
use secrecy::zeroize::Zeroize;
use serde::Deserialize;

use crate::http::{self, HttpSettings, Upstream};
use crate::token::AccessToken;
use crate::url::checked_endpoint;

const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Lifetime of the signed assertion (Google accepts at most one hour).
const ASSERTION_TTL: Duration = Duration::from_secs(3600);

#[derive(Deserialize)]
struct KeyFile {
    client_email: String,
    private_key: SecretString,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    token_uri: Option<String>,
    #[serde(default)]
    universe_domain: Option<String>,
}

/// A loaded service-account key.
pub(crate) struct ServiceAccount {
    client_email: String,
    key_id: Option<String>,
    key: RsaKeyPair,
    token_uri: reqwest::Url,
    universe: String,
}

impl fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("key_id", &self.key_id)
            .field("key", &"[REDACTED]")
            .field("token_uri", &self.token_uri.as_str())
            .finish()
    }
}

impl ServiceAccount {
    /// Parses a key file's JSON. `path` only names the file in messages.
    pub(crate) fn from_json(json: &[u8], path: &str) -> Result<ServiceAccount, Error> {
        let file: KeyFile = http::parse_json(&format!("service-account key {path}"), json)
            .map_err(|e| {
                Error::invalid_config(format!(
                    "service-account key {path} is not valid (client_email and private_key are required)"
                ))
                .with_source(e)
            })?;
        let der = pem_to_der(file.private_key.expose_secret()).ok_or_else(|| {
            Error::invalid_config(format!(
                "service-account key {path}: private_key is not a PEM RSA key"
            ))
        })?;
        let key = RsaKeyPair::from_pkcs8(der.expose_secret())
            .or_else(|_| RsaKeyPair::from_der(der.expose_secret()))
            .map_err(|e| {
                Error::invalid_config(format!(
                    "service-account key {path}: private_key is not a usable RSA key"
                ))
                .with_source(std::io::Error::other(e.to_string()))
            })?;
        let universe = match &file.universe_domain {
            None => crate::universe::DEFAULT_UNIVERSE.to_string(),
            Some(u) => crate::universe::checked(
                u,
                &format!("universe_domain in service-account key {path}"),
            )?,
        };
        // Without a token_uri, the key's own universe's token service.
        let default_uri = crate::universe::endpoint("oauth2", &universe, "/token");
        let token_uri = checked_endpoint(
            file.token_uri.as_deref().unwrap_or(&default_uri),
            &format!("token_uri in service-account key {path}"),
        )?;
        Ok(ServiceAccount {
            client_email: file.client_email,
            key_id: file.private_key_id,
            key,
            token_uri,
            universe,
        })
    }

    pub(crate) fn describe(&self) -> String {
        format!("service account {}", self.client_email)
    }

    /// The universe the key belongs to (`universe_domain`, default Google's).
    pub(crate) fn universe(&self) -> &str {
        &self.universe
    }

    pub(crate) async fn token(
        &self,
        client: &reqwest::Client,
        settings: &HttpSettings,
        clock: &SharedClock,
        scope: &str,
    ) -> Result<AccessToken, Error> {
        let now = clock.now();
        let assertion = self.assertion(now, scope)?;
        let what = format!(
            "token endpoint {} for {}",
            host_of(&self.token_uri),
            self.client_email
        );
        let resp = http::send(settings, Upstream::TokenEndpoint, &what, || {
            client.post(self.token_uri.clone()).form(&[
                ("grant_type", JWT_BEARER),
                ("assertion", assertion.expose_secret()),
            ])
        })
        .await?;
        crate::answers::oauth_token(&what, &resp.body, now)
    }

    /// The signed JWT: `base64url(header).base64url(claims).base64url(RS256 signature)`.
    fn assertion(&self, now: SystemTime, scope: &str) -> Result<SecretString, Error> {
        let iat = now
            .duration_since(UNIX_EPOCH)
            .map_err(|_| Error::invalid_config("the clock is before 1970"))?
            .as_secs();
        let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.key_id {
            header["kid"] = serde_json::Value::String(kid.clone());
        }
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": scope,
            "aud": self.token_uri.as_str(),
            "iat": iat,
            "exp": iat + ASSERTION_TTL.as_secs(),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; self.key.public_modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signing_input.as_bytes(),
                &mut signature,
            )
            .map_err(|_| Error::invalid_config("signing the service-account assertion failed"))?;
        Ok(SecretString::from(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        )))
    }
}

/// The host of an endpoint, for messages (never its path or query).
pub(crate) fn host_of(url: &reqwest::Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => "?".to_string(),
    }
}

/// The DER bytes inside a PEM block (`-----BEGIN ... PRIVATE KEY-----`).
fn pem_to_der(pem: &str) -> Option<SecretBytes> {
    let mut inside = false;
    let mut b64 = String::new();
    for line in pem.lines() {
        let line = line.trim();
        if line.starts_with("-----BEGIN ") && line.ends_with("PRIVATE KEY-----") {
            inside = true;
        } else if line.starts_with("-----END ") {
            break;
        } else if inside {
            b64.push_str(line);
        }
    }
    let der = STANDARD.decode(b64.as_bytes()).ok();
    b64.zeroize();
    der.filter(|d| !d.is_empty()).map(SecretBytes)
}

/// Private key bytes: never printed, zeroed on drop.
struct SecretBytes(Vec<u8>);

impl SecretBytes {
    fn expose_secret(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_keys_are_invalid_config_and_not_echoed() {
        let json = br#"{"type":"service_account","client_email":"a@b.iam.gserviceaccount.com","private_key":"-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n"}"#;
        let e = ServiceAccount::from_json(json, "/key.json").err();
        let e = e
            .map(|e| (e.kind(), e.chain()))
            .unwrap_or_else(|| panic!("accepted"));
        assert_eq!(e.0, regbroker_provider::ErrorKind::InvalidConfig);
        assert!(!e.1.contains("c2VjcmV0"), "{}", e.1);
    }

    fn key_json(extra: serde_json::Value) -> Vec<u8> {
        use aws_lc_rs::encoding::AsDer;
        let key = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
        let der = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&key).unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(der.as_ref())
        );
        let mut json = serde_json::json!({
            "type": "service_account",
            "client_email": "a@b.iam.gserviceaccount.com",
            "private_key": pem,
        });
        for (k, v) in extra.as_object().unwrap() {
            json[k] = v.clone();
        }
        json.to_string().into_bytes()
    }

    #[test]
    fn a_key_without_token_uri_uses_its_own_universes_token_service() {
        let google = ServiceAccount::from_json(&key_json(serde_json::json!({})), "/k").unwrap();
        assert_eq!(google.universe(), "googleapis.com");
        assert_eq!(
            google.token_uri.as_str(),
            "https://oauth2.googleapis.com/token"
        );
        let s3ns = ServiceAccount::from_json(
            &key_json(serde_json::json!({"universe_domain": "s3nsapis.fr"})),
            "/k",
        )
        .unwrap();
        assert_eq!(s3ns.universe(), "s3nsapis.fr");
        assert_eq!(s3ns.token_uri.as_str(), "https://oauth2.s3nsapis.fr/token");
        let bad = ServiceAccount::from_json(
            &key_json(serde_json::json!({"universe_domain": "x/y"})),
            "/k",
        );
        assert_eq!(
            bad.err().map(|e| e.kind()),
            Some(regbroker_provider::ErrorKind::InvalidConfig)
        );
    }

    #[test]
    fn missing_fields_are_invalid_config() {
        let e = ServiceAccount::from_json(br#"{"type":"service_account"}"#, "/key.json").err();
        assert_eq!(
            e.map(|e| e.kind()),
            Some(regbroker_provider::ErrorKind::InvalidConfig)
        );
    }
}
