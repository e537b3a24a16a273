//! A workload's own identity on Azure: its ServiceAccount token as the client assertion of
//! an Entra ID app (or user-assigned managed identity) federated with that ServiceAccount,
//! then the ACR exchange. This is what AKS's kubelet plugin (KEP-4412) and Flux
//! (RFC-0010) do.
//!
//! Annotations read from the ServiceAccount, first one present wins:
//! - client id: `kubernetes.azure.com/acr-client-id` (the kubelet plugin's key), then
//!   `azure.workload.identity/client-id` (Azure Workload Identity's, which Flux reads);
//! - tenant: `kubernetes.azure.com/acr-tenant-id`, then `azure.workload.identity/tenant-id`,
//!   then `AZURE_TENANT_ID` from this process's environment (one tenant per cluster is
//!   the usual case).
//!
//! The client id must be a GUID, the tenant a GUID or a domain name. The token must be for
//! the audience `api://AzureADTokenExchange` (Entra ID checks it, with the federated
//! credential's issuer and subject).

use async_trait::async_trait;
use azure_identity::{
    ClientAssertion, ClientAssertionCredential, ClientAssertionCredentialOptions,
};
use regbroker_provider::{Error, ExposeSecret, SecretString, WorkloadIdentity};

/// The kubelet plugin's annotation for the client id.
pub const ACR_CLIENT_ID_ANNOTATION: &str = "kubernetes.azure.com/acr-client-id";
/// The kubelet plugin's annotation for the tenant.
pub const ACR_TENANT_ID_ANNOTATION: &str = "kubernetes.azure.com/acr-tenant-id";
/// Azure Workload Identity's annotation for the client id (Flux reads it).
pub const CLIENT_ID_ANNOTATION: &str = "azure.workload.identity/client-id";
/// Azure Workload Identity's annotation for the tenant.
pub const TENANT_ID_ANNOTATION: &str = "azure.workload.identity/tenant-id";
/// The client id annotations, in order of precedence.
pub const CLIENT_ID_ANNOTATIONS: &[&str] = &[ACR_CLIENT_ID_ANNOTATION, CLIENT_ID_ANNOTATION];
/// The tenant annotations, in order of precedence.
pub const TENANT_ID_ANNOTATIONS: &[&str] = &[ACR_TENANT_ID_ANNOTATION, TENANT_ID_ANNOTATION];
/// The audience Entra ID accepts for a federated ServiceAccount token.
pub const AUDIENCE: &str = "api://AzureADTokenExchange";

/// The client id and tenant `workload` asks for; `default_tenant` is `AZURE_TENANT_ID`.
pub(crate) fn client_of(
    workload: &WorkloadIdentity,
    default_tenant: Option<&str>,
) -> Result<(String, String), Error> {
    let sa = workload.service_account();
    let client_id = match workload.first_annotation(CLIENT_ID_ANNOTATIONS) {
        Some((_, v)) if is_guid(v) => v.to_string(),
        Some((key, v)) => {
            return Err(Error::invalid_config(format!(
                "ServiceAccount {sa}: annotation {key} = `{}` is not a client id (a GUID)",
                regbroker_provider::printable(v, 80)
            )));
        }
        None => {
            return Err(Error::identity_missing(format!(
                "ServiceAccount {sa} has neither {ACR_CLIENT_ID_ANNOTATION} nor {CLIENT_ID_ANNOTATION}: annotate it with the client id of the Entra ID app or managed identity federated with it"
            )));
        }
    };
    let tenant = match workload.first_annotation(TENANT_ID_ANNOTATIONS) {
        Some((_, v)) if is_tenant(v) => v.to_string(),
        Some((key, v)) => {
            return Err(Error::invalid_config(format!(
                "ServiceAccount {sa}: annotation {key} = `{}` is not a tenant (a GUID or a domain name)",
                regbroker_provider::printable(v, 80)
            )));
        }
        None => match default_tenant {
            Some(t) if is_tenant(t) => t.to_string(),
            _ => {
                return Err(Error::identity_missing(format!(
                    "ServiceAccount {sa}: no tenant: annotate it with {ACR_TENANT_ID_ANNOTATION} or {TENANT_ID_ANNOTATION}, or set AZURE_TENANT_ID"
                )));
            }
        },
    };
    Ok((client_id, tenant))
}

/// The ServiceAccount token, handed to the SDK as the client assertion.
struct Assertion(SecretString);

impl std::fmt::Debug for Assertion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Assertion([REDACTED])")
    }
}

#[async_trait]
impl ClientAssertion for Assertion {
    async fn secret(
        &self,
        _options: Option<azure_core::http::ClientMethodOptions<'_>>,
    ) -> azure_core::Result<String> {
        Ok(self.0.expose_secret().to_string())
    }
}

/// An SDK credential asserting `workload`'s token for `client_id` in `tenant`.
pub(crate) fn credential(
    workload: &WorkloadIdentity,
    tenant: &str,
    client_id: &str,
    options: ClientAssertionCredentialOptions,
) -> Result<std::sync::Arc<dyn azure_core::credentials::TokenCredential>, Error> {
    ClientAssertionCredential::new(
        tenant.to_string(),
        client_id.to_string(),
        Assertion(workload.token().clone()),
        Some(options),
    )
    .map(|c| c as std::sync::Arc<dyn azure_core::credentials::TokenCredential>)
    .map_err(|e| {
        Error::invalid_config(format!(
            "ServiceAccount {}: the SDK refused the client assertion settings",
            workload.service_account()
        ))
        .with_source(e)
    })
}

fn is_guid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn is_tenant(s: &str) -> bool {
    is_guid(s)
        || (s.len() <= 253
            && s.contains('.')
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use regbroker_provider::test_util::service_account_jwt;

    const CLIENT: &str = "11111111-2222-3333-4444-555555555555";
    const TENANT: &str = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";

    fn workload(annotations: &[(&str, &str)]) -> WorkloadIdentity {
        WorkloadIdentity::from_token(
            service_account_jwt("team-a", "puller", "u-1").into(),
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn the_kubelet_plugins_annotations_win_and_the_tenant_falls_back_to_the_env() {
        let other = "99999999-2222-3333-4444-555555555555";
        let w = workload(&[
            (CLIENT_ID_ANNOTATION, other),
            (ACR_CLIENT_ID_ANNOTATION, CLIENT),
            (TENANT_ID_ANNOTATION, TENANT),
        ]);
        assert_eq!(
            client_of(&w, None).unwrap(),
            (CLIENT.to_string(), TENANT.to_string())
        );
        let w = workload(&[(CLIENT_ID_ANNOTATION, CLIENT)]);
        assert_eq!(
            client_of(&w, Some("contoso.onmicrosoft.com")).unwrap(),
            (CLIENT.to_string(), "contoso.onmicrosoft.com".to_string())
        );
    }

    #[test]
    fn malformed_or_missing_annotations_are_errors_naming_them() {
        let e = client_of(
            &workload(&[(ACR_CLIENT_ID_ANNOTATION, "not-a-guid")]),
            Some(TENANT),
        )
        .unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
        assert!(e.message().contains(ACR_CLIENT_ID_ANNOTATION), "{e}");
        let e = client_of(
            &workload(&[
                (CLIENT_ID_ANNOTATION, CLIENT),
                (TENANT_ID_ANNOTATION, "a b"),
            ]),
            Some(TENANT),
        )
        .unwrap_err();
        assert!(e.message().contains(TENANT_ID_ANNOTATION), "{e}");
        let e = client_of(&workload(&[]), Some(TENANT)).unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::IdentityMissing);
        assert!(e.message().contains(CLIENT_ID_ANNOTATION), "{e}");
        let e = client_of(&workload(&[(CLIENT_ID_ANNOTATION, CLIENT)]), None).unwrap_err();
        assert!(e.message().contains("AZURE_TENANT_ID"), "{e}");
        assert!(e.message().contains("team-a/puller"), "{e}");
    }

    #[test]
    fn the_assertion_never_shows_the_token() {
        let jwt = service_account_jwt("team-a", "puller", "u-1");
        let shown = format!("{:?}", Assertion(jwt.clone().into()));
        assert!(!shown.contains(&jwt), "{shown}");
    }
}
