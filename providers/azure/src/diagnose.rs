//! `regbroker doctor` for Azure: which Entra ID identity the provider would use and why,
//! the settings it would use it with (authority host, tenant, client id), the projected
//! token a workload identity presents, and one real Entra ID token request for the ACR
//! scope.
//!
//! Env vars read, from the provider's env snapshot: `AZURE_FEDERATED_TOKEN_FILE`,
//! `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`, `AZURE_CLIENT_SECRET` (presence only),
//! `AZURE_AUTHORITY_HOST`, `IDENTITY_ENDPOINT` (presence and value), `IDENTITY_HEADER`
//! (presence only), `REGBROKER_AZURE_SCOPE`.

use std::path::Path;
use std::time::Duration;

use azure_core::error::ErrorKind as AzKind;
use regbroker_provider::diagnosis::{Claims, TokenFile, check_token_file, human, rfc3339};
use regbroker_provider::{Diagnosis, ErrorKind, Finding, IdentityKind};

use crate::identity::{self, Identity, Kind};
use crate::options::check_https_url;
use crate::{AzureProvider, Cloud, DEFAULT_SCOPE, ENV_SCOPE};

/// The audience an Entra ID federated identity credential accepts by default (what the
/// AKS Workload Identity webhook projects the token for).
pub const WORKLOAD_IDENTITY_AUDIENCE: &str = "api://AzureADTokenExchange";

const CHECK_IDENTITY: &str = "azure.identity";
const CHECK_AUTHORITY: &str = "azure.authority_host";
const CHECK_TOKEN: &str = "azure.entra_token";

pub(crate) fn identity_kind(kind: Kind) -> IdentityKind {
    match kind {
        Kind::Workload => IdentityKind::WorkloadIdentity,
        Kind::ClientSecret => IdentityKind::StaticKeys,
        Kind::Managed => IdentityKind::ManagedIdentity,
    }
}

impl AzureProvider {
    /// See [`regbroker_provider::Provider::diagnose`].
    pub(crate) async fn diagnosis(&self, timeout: Duration) -> Diagnosis {
        let env = &self.env;
        let kind = Kind::select(env);
        let now = self.clock.now();
        let mut out = Vec::new();
        let var = |k: &str| env.get(k).map(str::to_string);
        let client_id = var(identity::AZURE_CLIENT_ID);
        let tenant = var(identity::AZURE_TENANT_ID);
        let app_service = env.get(identity::IDENTITY_ENDPOINT).is_some();
        let explicit = kind != Kind::Managed || client_id.is_some() || app_service;
        let mut found = Vec::new();
        for k in [
            identity::AZURE_CLIENT_ID,
            identity::AZURE_TENANT_ID,
            identity::AZURE_FEDERATED_TOKEN_FILE,
            identity::AZURE_AUTHORITY_HOST,
            identity::IDENTITY_ENDPOINT,
        ] {
            if let Some(v) = env.get(k) {
                found.push(format!("{k}={v}"));
            }
        }
        for k in [identity::AZURE_CLIENT_SECRET, identity::IDENTITY_HEADER] {
            if env.get(k).is_some() {
                found.push(format!("{k} (set)"));
            }
        }
        let found = if found.is_empty() {
            "no AZURE_* variables are set".to_string()
        } else {
            found.join(", ")
        };
        let what = match kind {
            Kind::Workload => "workload identity (federated service-account token)".to_string(),
            Kind::ClientSecret => "service principal client secret".to_string(),
            Kind::Managed if app_service => format!(
                "{} managed identity through IDENTITY_ENDPOINT",
                if client_id.is_some() {
                    "user-assigned"
                } else {
                    "system-assigned"
                }
            ),
            Kind::Managed => format!(
                "{} managed identity through IMDS (169.254.169.254)",
                if client_id.is_some() {
                    "user-assigned"
                } else {
                    "system-assigned"
                }
            ),
        };
        out.push(Finding::info(
            CHECK_IDENTITY,
            format!("{what}: {found} (order: AZURE_FEDERATED_TOKEN_FILE, AZURE_CLIENT_SECRET, managed identity)"),
        ));

        let authority = var(identity::AZURE_AUTHORITY_HOST)
            .unwrap_or_else(|| Cloud::Public.authority_host().to_string())
            .trim_end_matches('/')
            .to_string();
        if let Err(e) = check_https_url("AZURE_AUTHORITY_HOST", &authority, false) {
            out.push(Finding::fail(
                CHECK_AUTHORITY,
                format!("AZURE_AUTHORITY_HOST not https: {e}"),
                "set AZURE_AUTHORITY_HOST to your cloud's https Entra ID authority, e.g. https://login.microsoftonline.com/ (the AKS Workload Identity webhook sets it), or unset it",
            ));
            return Diagnosis {
                identity: identity_kind(kind),
                explicit,
                findings: out,
            };
        }
        if kind != Kind::Managed {
            let missing: Vec<&str> = [
                (identity::AZURE_CLIENT_ID, &client_id),
                (identity::AZURE_TENANT_ID, &tenant),
            ]
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| *k)
            .collect();
            if !missing.is_empty() {
                out.push(Finding::fail(
                    CHECK_IDENTITY,
                    format!("{what} needs {} too, which is not set", missing.join(" and ")),
                    "on AKS, annotate the service account with azure.workload.identity/client-id (and tenant-id) and label the pod azure.workload.identity/use: \"true\" so the webhook sets them",
                ));
                return Diagnosis {
                    identity: identity_kind(kind),
                    explicit,
                    findings: out,
                };
            }
        }
        let mut audience_ok = None;
        let mut subject = None;
        if kind == Kind::Workload {
            let path = var(identity::AZURE_FEDERATED_TOKEN_FILE).unwrap_or_default();
            let report = check_token_file(&TokenFile {
                check: "azure.token_file",
                named_by: identity::AZURE_FEDERATED_TOKEN_FILE,
                path: Path::new(&path),
                expected_audiences: &[WORKLOAD_IDENTITY_AUDIENCE],
                audience_fix: "Entra ID's federated identity credentials accept api://AzureADTokenExchange by default: project the token for that audience (the AKS webhook does), or set the federated credential's audience to the token's",
                now,
            });
            audience_ok = report.audience_ok.map(|ok| (ok, report.audiences()));
            subject = report.claims.as_ref().and_then(|c| c.subject.clone());
            let failed = report.failed();
            out.extend(report.findings);
            if failed {
                out.push(Finding::skip(
                    CHECK_TOKEN,
                    "no Entra ID token requested: the token file check failed",
                ));
                return Diagnosis {
                    identity: identity_kind(kind),
                    explicit,
                    findings: out,
                };
            }
        }

        let scope = var(ENV_SCOPE).unwrap_or_else(|| DEFAULT_SCOPE.to_string());
        let id = Identity {
            kind,
            authority_host: authority,
            tenant,
            client_id,
        };
        out.push(
            self.token_check(
                timeout,
                &id,
                &scope,
                audience_ok,
                subject.as_deref(),
                app_service,
            )
            .await,
        );
        Diagnosis {
            identity: identity_kind(kind),
            explicit,
            findings: out,
        }
    }

    async fn token_check(
        &self,
        timeout: Duration,
        id: &Identity,
        scope: &str,
        audience: Option<(bool, String)>,
        subject: Option<&str>,
        app_service: bool,
    ) -> Finding {
        let who = id.describe();
        let credential = match self.credential(id) {
            Ok(c) => c,
            Err(e) => {
                return Finding::fail(
                    CHECK_TOKEN,
                    e.message().to_string(),
                    "check the identity variables named above",
                );
            }
        };
        let imds = id.kind == Kind::Managed && !app_service;
        let answer = match tokio::time::timeout(timeout, credential.get_token(&[scope], None)).await
        {
            Ok(a) => a,
            Err(_) => {
                let fix = if imds {
                    "no AZURE_FEDERATED_TOKEN_FILE, AZURE_CLIENT_SECRET or IDENTITY_ENDPOINT is set, so IMDS (169.254.169.254) was asked and did not answer: is this an Azure VM or AKS node? In a pod, use AKS Workload Identity (annotate the service account with azure.workload.identity/client-id, label the pod azure.workload.identity/use: \"true\")"
                } else {
                    "check egress to the Entra ID authority (login.microsoftonline.com or AZURE_AUTHORITY_HOST): NetworkPolicy, proxy, DNS"
                };
                return Finding::fail(
                    CHECK_TOKEN,
                    format!(
                        "Entra ID token for {who} (scope {scope}) did not arrive within {}",
                        human(timeout)
                    ),
                    fix,
                );
            }
        };
        match answer {
            Ok(token) => {
                let claims = Claims::of_jwt(token.token.secret()).unwrap_or_default();
                let mut about = Vec::new();
                for claim in ["tid", "appid", "oid"] {
                    if let Some(v) = crate::exchange::jwt_claim(token.token.secret(), claim)
                        .and_then(|v| v.as_str().map(shown))
                    {
                        about.push(format!("{claim} {v}"));
                    }
                }
                if let Some(exp) = claims.expires_at {
                    about.push(format!("expires {}", rfc3339(exp)));
                }
                Finding::pass(
                    CHECK_TOKEN,
                    format!(
                        "Entra ID issued a token for {scope} to {who}{}",
                        if about.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", about.join(", "))
                        }
                    ),
                )
            }
            Err(e) => self.token_failure(id, scope, &e, audience, subject, imds),
        }
    }

    fn token_failure(
        &self,
        id: &Identity,
        scope: &str,
        e: &azure_core::Error,
        audience: Option<(bool, String)>,
        subject: Option<&str>,
        imds: bool,
    ) -> Finding {
        let error = identity::token_error(id, scope, e);
        let chain = error.chain();
        let status = http_status(e);
        let body = error_body(e).to_ascii_lowercase();
        if imds
            && id.client_id.is_none()
            && (body.contains("multiple user assigned identities") || status == Some(400))
        {
            let cause = if body.contains("multiple user assigned identities") {
                "several managed identities and no AZURE_CLIENT_ID: IMDS says several user-assigned identities are assigned to this machine and the request named none".to_string()
            } else {
                "IMDS refused a system-assigned request (HTTP 400): this machine has several user-assigned managed identities and no AZURE_CLIENT_ID says which to use, or it has none".to_string()
            };
            return Finding::fail(
                CHECK_TOKEN,
                cause,
                "set AZURE_CLIENT_ID to the client id of the managed identity that has AcrPull (on AKS nodes, the kubelet identity: az aks show --query identityProfile.kubeletidentity.clientId)",
            );
        }
        if error.kind() == ErrorKind::IdentityRejected && id.kind == Kind::Workload {
            let mismatched = matches!(&audience, Some((false, _))) || chain.contains("700212");
            if mismatched {
                let got = audience
                    .map(|(_, a)| a)
                    .unwrap_or_else(|| "(unknown)".into());
                return Finding::fail(
                    CHECK_TOKEN,
                    format!(
                        "audience mismatch: Entra ID refused the federated token, whose audience is {got}; expected {WORKLOAD_IDENTITY_AUDIENCE}: {}",
                        error.message()
                    ),
                    format!(
                        "project the service-account token for {WORKLOAD_IDENTITY_AUDIENCE} (the AKS webhook does), or set the federated identity credential's audience to {got}"
                    ),
                );
            }
            return Finding::fail(
                CHECK_TOKEN,
                error.message().to_string(),
                format!(
                    "the app registration or managed identity {} needs a federated identity credential with the cluster's OIDC issuer and subject {}, in tenant {}",
                    id.client_id.as_deref().unwrap_or("?"),
                    subject.unwrap_or("system:serviceaccount:NAMESPACE:NAME"),
                    id.tenant.as_deref().unwrap_or("?")
                ),
            );
        }
        let fix = token_fix(error.kind(), id.kind, id.client_id.as_deref(), imds);
        Finding::fail(CHECK_TOKEN, error.message().to_string(), fix)
    }
}

/// What to do about a failed token request, for the identity in use: a managed
/// identity has no secret to check, a service principal has no token file.
fn token_fix(error: ErrorKind, kind: Kind, client_id: Option<&str>, imds: bool) -> String {
    const WORKLOAD: &str = "annotate the service account with azure.workload.identity/client-id, label the pod azure.workload.identity/use: \"true\"";
    match (error, kind) {
        (ErrorKind::IdentityMissing, Kind::Managed) if imds => format!(
            "no managed identity endpoint answered: on AKS, use Workload Identity ({WORKLOAD})"
        ),
        (ErrorKind::IdentityMissing, Kind::Workload) => {
            "check that the token file (AZURE_FEDERATED_TOKEN_FILE) is projected and readable".into()
        }
        (ErrorKind::IdentityRejected, Kind::ClientSecret) => {
            "check AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET: Entra ID refused the service principal (a wrong or expired secret, or another tenant)".into()
        }
        (ErrorKind::IdentityRejected, Kind::Managed) => match client_id {
            Some(id) => format!(
                "check that the user-assigned managed identity with client id {} is assigned to this VM or node (AZURE_CLIENT_ID names it)",
                shown(id)
            ),
            None => "check that this VM or node has a system-assigned managed identity, or set AZURE_CLIENT_ID to the client id of a user-assigned one assigned to it (on AKS nodes, the kubelet identity: az aks show --query identityProfile.kubeletidentity.clientId); in a pod, prefer Workload Identity".into(),
        },
        (ErrorKind::IdentityRejected, Kind::Workload) => {
            "check AZURE_CLIENT_ID and AZURE_TENANT_ID and the identity's federated credential: Entra ID refused them".into()
        }
        (k, _) if k.is_transient() => {
            "check egress to the Entra ID authority (login.microsoftonline.com or AZURE_AUTHORITY_HOST): NetworkPolicy, proxy, DNS".into()
        }
        _ => "check the identity settings named above".into(),
    }
}

/// The first HTTP status in an SDK error's chain.
fn http_status(e: &azure_core::Error) -> Option<u16> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(az) = err.downcast_ref::<azure_core::Error>()
            && let AzKind::HttpResponse { status, .. } = az.kind()
        {
            return Some(u16::from(*status));
        }
        next = err.source();
    }
    None
}

/// The body of the first error answer in the chain (an error body: never a token), for
/// matching known phrases only; it is never printed.
fn error_body(e: &azure_core::Error) -> String {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(az) = err.downcast_ref::<azure_core::Error>()
            && let AzKind::HttpResponse {
                raw_response: Some(r),
                ..
            } = az.kind()
        {
            let body: &[u8] = r.body().as_ref();
            return String::from_utf8_lossy(&body[..body.len().min(4096)]).into_owned();
        }
        next = err.source();
    }
    String::new()
}

fn shown(s: &str) -> String {
    s.chars()
        .take(80)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The advice fits the identity: no secret for a managed identity, no token file for
    /// a service principal.
    #[test]
    fn a_refused_identity_gets_advice_for_its_kind() {
        let rejected = ErrorKind::IdentityRejected;
        let system = token_fix(rejected, Kind::Managed, None, true);
        assert!(
            !system.contains("secret") && system.contains("system-assigned"),
            "{system}"
        );
        let user = token_fix(rejected, Kind::Managed, Some("1111-2222"), true);
        assert!(
            !user.contains("secret") && user.contains("1111-2222"),
            "{user}"
        );
        let app_service = token_fix(rejected, Kind::Managed, None, false);
        assert!(!app_service.contains("secret"), "{app_service}");
        let principal = token_fix(rejected, Kind::ClientSecret, None, false);
        assert!(principal.contains("AZURE_CLIENT_SECRET"), "{principal}");
        let workload = token_fix(rejected, Kind::Workload, None, false);
        assert!(
            !workload.contains("secret") && workload.contains("federated"),
            "{workload}"
        );
        let missing = token_fix(ErrorKind::IdentityMissing, Kind::Workload, None, false);
        assert!(missing.contains("AZURE_FEDERATED_TOKEN_FILE"), "{missing}");
    }
}
