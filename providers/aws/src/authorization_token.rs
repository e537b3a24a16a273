//! The exchange itself: ECR's and ECR Public's `GetAuthorizationToken`, and decoding of
//! the token they answer (`base64("AWS:<password>")`) into the credential's password.
//!
//! Reads no env var: the calls go through the clients of `clients`.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_types::region::Region;
use base64::Engine;
use regbroker_provider::{Credential, Error, SecretString};

use crate::{AwsProvider, PUBLIC_REGION, USERNAME, errors};

impl AwsProvider {
    /// The ECR credential of `account` in `region`, as `role` (or the base identity).
    pub(crate) async fn fetch_private(
        &self,
        role: Option<&str>,
        region: &str,
        account: &str,
    ) -> Result<Credential, Error> {
        let what = format!("ECR GetAuthorizationToken for account {account} in {region}");
        let client = self.ecr_client(role, region).await;
        self.ecr_budget
            .acquire(&(caller_account(role, account), region.to_string()))
            .await;
        // `registryIds` is deprecated (a token works for every registry the identity can
        // read), but it still selects the account whose proxy endpoint is returned, as
        // docker-credential-ecr-login does.
        #[allow(deprecated)]
        let out = client
            .get_authorization_token()
            .registry_ids(account)
            .send()
            .await
            .map_err(|e| errors::map_sdk_error(&what, e))?;
        self.private_answer(&what, out, region, account)
    }

    /// The ECR credential in `region` as a workload's assumed role (`credentials`).
    ///
    /// No `registryIds` here: the token is the role's own, good for every registry the
    /// role may read (the parameter is deprecated), and a registry id would only make
    /// the answer name the host's account rather than the caller's.
    pub(crate) async fn fetch_private_as(
        &self,
        credentials: Credentials,
        role: &str,
        region: &str,
        account: &str,
    ) -> Result<Credential, Error> {
        let what = format!("ECR GetAuthorizationToken for account {account} in {region}");
        let sdk = self.sdk_config().await;
        self.ecr_budget
            .acquire(&(caller_account(Some(role), account), region.to_string()))
            .await;
        let conf = aws_sdk_ecr::config::Builder::from(sdk)
            .region(Region::new(region.to_string()))
            .credentials_provider(SharedCredentialsProvider::new(credentials))
            .build();
        let out = aws_sdk_ecr::Client::from_conf(conf)
            .get_authorization_token()
            .send()
            .await
            .map_err(|e| errors::map_sdk_error(&what, e))?;
        self.private_answer(&what, out, region, account)
    }

    fn private_answer(
        &self,
        what: &str,
        out: aws_sdk_ecr::operation::get_authorization_token::GetAuthorizationTokenOutput,
        region: &str,
        account: &str,
    ) -> Result<Credential, Error> {
        let data = out
            .authorization_data()
            .iter()
            .find_map(|d| Some((d.authorization_token()?, d.expires_at())));
        let credential = credential_from_authorization_data(
            what,
            data.map(|(t, at)| (t, at.copied())),
            self.settings.clock.now(),
        )?;
        tracing::debug!(%account, %region, expires_at = ?credential.expires_at(), "Fetched ECR token");
        Ok(credential)
    }

    /// The ECR Public credential, as `role` (or the base identity).
    pub(crate) async fn fetch_public(&self, role: Option<&str>) -> Result<Credential, Error> {
        let client = self.public_client(role).await;
        self.fetch_public_with(client, caller_account(role, "public"))
            .await
    }

    /// The ECR Public credential as a workload's assumed role (`credentials`).
    pub(crate) async fn fetch_public_as(
        &self,
        credentials: Credentials,
        role: &str,
    ) -> Result<Credential, Error> {
        let sdk = self.sdk_config().await;
        let conf = aws_sdk_ecrpublic::config::Builder::from(sdk)
            .region(Region::from_static(PUBLIC_REGION))
            .credentials_provider(SharedCredentialsProvider::new(credentials))
            .build();
        self.fetch_public_with(
            aws_sdk_ecrpublic::Client::from_conf(conf),
            caller_account(Some(role), "public"),
        )
        .await
    }

    async fn fetch_public_with(
        &self,
        client: aws_sdk_ecrpublic::Client,
        caller: String,
    ) -> Result<Credential, Error> {
        let what = format!("ECR Public GetAuthorizationToken in {PUBLIC_REGION}");
        self.ecr_budget
            .acquire(&(caller, format!("public|{PUBLIC_REGION}")))
            .await;
        let out = client
            .get_authorization_token()
            .send()
            .await
            .map_err(|e| errors::map_sdk_error(&what, e))?;
        let data = out
            .authorization_data()
            .and_then(|d| Some((d.authorization_token()?, d.expires_at())));
        let credential = credential_from_authorization_data(
            &what,
            data.map(|(t, at)| (t, at.copied())),
            self.settings.clock.now(),
        )?;
        tracing::debug!(expires_at = ?credential.expires_at(), "Fetched ECR Public token");
        Ok(credential)
    }
}

/// The account whose `GetAuthorizationToken` budget a call spends: the role's (a rule's
/// `role_arn` or a workload's), else `fallback` (the registry's account; this process's
/// own account is not known without a call).
fn caller_account(role: Option<&str>, fallback: &str) -> String {
    role.and_then(|r| r.split(':').nth(4))
        .filter(|a| !a.is_empty())
        .unwrap_or(fallback)
        .to_string()
}

/// Decodes ECR's `base64("AWS:<password>")`. The error never holds the token.
pub fn decode_token(token: &str) -> Result<SecretString, &'static str> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map(secrecy::zeroize::Zeroizing::new)
        .map_err(|_| "the authorization token is not base64")?;
    let text = std::str::from_utf8(&bytes).map_err(|_| "the authorization token is not UTF-8")?;
    match text.strip_prefix("AWS:") {
        Some(password) if !password.is_empty() => Ok(SecretString::from(password.to_string())),
        _ => Err("the authorization token is not `AWS:<password>`"),
    }
}

/// The credential of an ECR or ECR Public answer's authorization data (its
/// `authorizationToken` and `expiresAt`, as the SDK parsed them; `None`: no data with a
/// token) received at `now`: username `AWS`, the decoded password, the expiry capped at
/// [`regbroker_provider::MAX_LIFETIME`]. The error names `what`, never the token. Both
/// fetches use it; public for the fuzz targets.
pub fn credential_from_authorization_data(
    what: &str,
    data: Option<(&str, Option<aws_smithy_types::DateTime>)>,
    now: SystemTime,
) -> Result<Credential, Error> {
    let (token, at) = data.ok_or_else(|| {
        Error::bad_response(format!("{what}: no authorization data in the answer"))
    })?;
    let password =
        decode_token(token).map_err(|why| Error::bad_response(format!("{what}: {why}")))?;
    Ok(Credential::issued(USERNAME, password, expiry(at), now))
}

fn expiry(at: Option<aws_smithy_types::DateTime>) -> Option<SystemTime> {
    at.and_then(|d| SystemTime::try_from(d).ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use regbroker_provider::ExposeSecret;

    #[test]
    fn tokens_decode_only_in_the_aws_shape() {
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            decode_token(&enc("AWS:pa:ss")).unwrap().expose_secret(),
            "pa:ss"
        );
        for bad in [
            "not base64!".to_string(),
            enc("aws:s3cr3t"),
            enc("AWS"),
            enc("AWS:"),
            enc("user:s3cr3t"),
            enc(":AWS:s3cr3t"),
        ] {
            let err = decode_token(&bad).unwrap_err();
            assert!(!err.contains("s3cr3t"), "{err}");
        }
    }

    #[test]
    fn the_credential_expires_when_the_answer_says() {
        use base64::Engine as _;
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let at = aws_smithy_types::DateTime::from_secs(1_700_000_000 + 3600);
        let token = base64::engine::general_purpose::STANDARD.encode("AWS:pw");
        let c = credential_from_authorization_data("ECR", Some((&token, Some(at))), now).unwrap();
        assert_eq!(
            c.expires_at(),
            Some(now + std::time::Duration::from_secs(3600))
        );
        assert_eq!(c.secret().expose_secret(), "pw");
    }
}
