//! `regbroker doctor` for GCP: which Application Default Credentials source the provider
//! would use and why, what it says about itself (the metadata server's service account
//! email and scopes; a key's client email; an external_account's audience, subject token
//! and impersonated account), and one real token call (the metadata server's token, the
//! key's JWT grant, or the STS exchange).
//!
//! Env vars read: `GOOGLE_APPLICATION_CREDENTIALS`, `GCE_METADATA_HOST` (from the
//! provider's env, as every fetch reads them).

use std::path::Path;
use std::time::Duration;

use regbroker_provider::diagnosis::{TokenFile, check_token_file, human, rfc3339};
use regbroker_provider::{Diagnosis, ErrorKind, Finding, IdentityKind};

use crate::identity::{CREDENTIALS_ENV, Env, Identity, METADATA_HOST_ENV};
use crate::{DEFAULT_METADATA_HOST, GcpProvider, HttpSettings, OAUTH_SCOPE};

const CHECK_IDENTITY: &str = "gcp.identity";
const CHECK_METADATA: &str = "gcp.metadata_server";
const CHECK_TOKEN: &str = "gcp.token";

/// What to check when Google refused the identity, for the kind in use: a metadata
/// server identity has no key and no workload identity provider of its own to check.
fn rejected_fix(kind: IdentityKind) -> &'static str {
    match kind {
        IdentityKind::MetadataServer => {
            "on GKE, check that Workload Identity is enabled on the node pool and that the pod's Kubernetes service account is bound to a Google service account (iam.gke.io/gcp-service-account) that may use it; on a VM, check the VM's service account and its access scopes"
        }
        IdentityKind::KeyFile => {
            "check that the service account key in GOOGLE_APPLICATION_CREDENTIALS is not disabled or deleted, and that the service account is enabled"
        }
        _ => {
            "check the identity's IAM bindings: the workload identity provider's attribute conditions and roles/iam.workloadIdentityUser on the impersonated service account"
        }
    }
}

/// The hint for a metadata server that does not answer.
const NO_METADATA_FIX: &str = "on GKE, Workload Identity's metadata server does not reach pods with hostNetwork: true (they reach the node's own metadata, or nothing): run the pod without hostNetwork, and enable Workload Identity on the node pool (GKE_METADATA); elsewhere set GOOGLE_APPLICATION_CREDENTIALS to a service-account key or an external_account file, or GCE_METADATA_HOST to the metadata server's address";

/// The kind the env selects, reading at most the credentials file's `type`.
pub(crate) fn identity_kind(env: &Env) -> IdentityKind {
    let Some(path) = env.get(CREDENTIALS_ENV) else {
        return IdentityKind::MetadataServer;
    };
    let kind = std::fs::read(&path)
        .ok()
        .filter(|b| b.len() <= 1 << 20)
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string));
    match kind.as_deref() {
        Some("service_account") => IdentityKind::KeyFile,
        Some("external_account") => IdentityKind::ExternalAccount,
        _ => IdentityKind::None,
    }
}

impl GcpProvider {
    /// See [`regbroker_provider::Provider::diagnose`].
    pub(crate) async fn diagnosis(&self, timeout: Duration) -> Diagnosis {
        let mut out = Vec::new();
        let explicit = self.env.get(CREDENTIALS_ENV).is_some();
        // One attempt per call, each bounded: doctor must never hang.
        let http = HttpSettings {
            connect_timeout: self.http.connect_timeout.min(timeout),
            request_timeout: self.http.request_timeout.min(timeout),
            attempts: 1,
            backoff: self.http.backoff,
        };
        let identity = match Identity::load(&self.env, &http).await {
            Ok(i) => i,
            Err(e) => {
                let fix = match e.kind() {
                    ErrorKind::IdentityMissing => format!(
                        "mount the credentials file at that path, or correct {CREDENTIALS_ENV} (unset it to use the metadata server)"
                    ),
                    _ => format!(
                        "{CREDENTIALS_ENV} must name a service_account key or an external_account file (gcloud iam workload-identity-pools create-cred-config)"
                    ),
                };
                out.push(Finding::fail(CHECK_IDENTITY, e.message().to_string(), fix));
                return Diagnosis {
                    identity: identity_kind(&self.env),
                    explicit,
                    findings: out,
                };
            }
        };
        let kind = identity.kind();
        let why = match kind {
            IdentityKind::MetadataServer => format!(
                "{CREDENTIALS_ENV} is not set, so the metadata server is used (GKE Workload Identity or the VM's service account); {METADATA_HOST_ENV} {}",
                self.env
                    .get(METADATA_HOST_ENV)
                    .map(|h| format!("= {h}"))
                    .unwrap_or_else(|| format!("unset, default {DEFAULT_METADATA_HOST}"))
            ),
            _ => format!(
                "{CREDENTIALS_ENV} = {}",
                self.env.get(CREDENTIALS_ENV).unwrap_or_default()
            ),
        };
        out.push(Finding::info(
            CHECK_IDENTITY,
            format!("{}: {why}", identity.describe()),
        ));

        let mut audience = None;
        if let Some(meta) = identity.metadata() {
            match meta.account_info(&http, "email").await {
                Ok(email) => {
                    let scopes = meta
                        .account_info(&http, "scopes")
                        .await
                        .unwrap_or_else(|_| "(not given)".into());
                    let wi = if email.ends_with(".svc.id.goog") {
                        " (a Workload Identity principal with no Google service account bound: grant it roles/artifactregistry.reader, or annotate the Kubernetes service account with iam.gke.io/gcp-service-account)"
                    } else {
                        ""
                    };
                    out.push(Finding::info(
                        CHECK_METADATA,
                        format!("service account {email}{wi}, scopes {scopes}"),
                    ));
                }
                Err(e) if e.kind() == ErrorKind::IdentityMissing && e.message().contains("could be reached") || e.kind() == ErrorKind::TimedOut => {
                    out.push(Finding::fail(
                        CHECK_METADATA,
                        format!(
                            "no metadata server: nothing answered at {} (refused, or silent for {})",
                            meta.host(),
                            human(timeout)
                        ),
                        NO_METADATA_FIX,
                    ));
                    out.push(Finding::skip(CHECK_TOKEN, "no token requested: no metadata server"));
                    return Diagnosis {
                        identity: kind,
                        explicit,
                        findings: out,
                    };
                }
                Err(e) => out.push(Finding::warn(
                    CHECK_METADATA,
                    format!("the metadata server did not say which service account it serves: {}", e.message()),
                    "on GKE, check that Workload Identity is enabled on the node pool and the pod's service account is bound",
                )),
            }
        }
        if let Some(ext) = identity.external() {
            let expected = [
                ext.audience().to_string(),
                format!("https:{}", ext.audience()),
            ];
            if let Some(file) = ext.token_file() {
                let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
                let report = check_token_file(&TokenFile {
                    check: "gcp.token_file",
                    named_by: "credential_source.file",
                    path: Path::new(file),
                    expected_audiences: &expected,
                    audience_fix: "a workload identity pool provider accepts by default its own resource name (https://iam.googleapis.com/projects/.../providers/...): project the service-account token for that audience, or add the token's audience to the provider's allowed audiences",
                    now: self.clock.now(),
                });
                audience = report
                    .audience_ok
                    .map(|ok| (ok, report.audiences(), expected[1].to_string()));
                let failed = report.failed();
                out.extend(report.findings);
                if failed {
                    out.push(Finding::skip(
                        CHECK_TOKEN,
                        "no STS exchange: the subject token check failed",
                    ));
                    return Diagnosis {
                        identity: kind,
                        explicit,
                        findings: out,
                    };
                }
            }
        }

        let what = match (kind, identity.external()) {
            (_, Some(ext)) => format!("STS token exchange at {}", ext.token_host()),
            (IdentityKind::MetadataServer, _) => "metadata server token".to_string(),
            _ => "service-account key's token grant".to_string(),
        };
        let call = identity.token(&http, &self.clock, OAUTH_SCOPE);
        let token = match tokio::time::timeout(timeout, call).await {
            Ok(t) => t,
            Err(_) => Err(regbroker_provider::Error::timed_out(format!(
                "{what} did not answer within {}",
                human(timeout)
            ))),
        };
        let finding = match token {
            Ok(t) => Finding::pass(
                CHECK_TOKEN,
                format!(
                    "{what}: access token issued, expires {}",
                    rfc3339(t.expires_at)
                ),
            ),
            Err(e) => match (e.kind(), &audience) {
                (ErrorKind::IdentityRejected, Some((false, got, expected))) => Finding::fail(
                    CHECK_TOKEN,
                    format!(
                        "audience mismatch: {what} refused the subject token, whose audience is {got}; expected {expected}: {}",
                        e.message()
                    ),
                    format!(
                        "project the service-account token for {expected}, or add {got} to the workload identity provider's allowed audiences"
                    ),
                ),
                (ErrorKind::IdentityMissing, _) if kind == IdentityKind::MetadataServer => {
                    Finding::fail(
                        CHECK_TOKEN,
                        format!("no metadata server: {}", e.message()),
                        NO_METADATA_FIX,
                    )
                }
                (ErrorKind::IdentityMissing, _) => Finding::fail(
                    CHECK_TOKEN,
                    e.message().to_string(),
                    "on GKE, bind the pod's Kubernetes service account to a Google service account (iam.gke.io/gcp-service-account) or grant the Workload Identity principal access",
                ),
                (ErrorKind::IdentityRejected, _) => {
                    Finding::fail(CHECK_TOKEN, e.message().to_string(), rejected_fix(kind))
                }
                (k, _) if k.is_transient() => Finding::fail(
                    CHECK_TOKEN,
                    e.message().to_string(),
                    "check egress to Google (metadata server, oauth2.googleapis.com, sts.googleapis.com): NetworkPolicy, proxy, DNS",
                ),
                _ => Finding::fail(
                    CHECK_TOKEN,
                    e.message().to_string(),
                    format!("check the file {CREDENTIALS_ENV} names"),
                ),
            },
        };
        out.push(finding);
        Diagnosis {
            identity: kind,
            explicit,
            findings: out,
        }
    }
}

#[cfg(test)]
mod advice_tests {
    use super::*;

    /// The advice for a refused identity fits its kind: no key or workload identity
    /// provider for the metadata server, no metadata server for a key file.
    #[test]
    fn a_refused_identity_gets_advice_for_its_kind() {
        let metadata = rejected_fix(IdentityKind::MetadataServer);
        assert!(
            !metadata.contains("key") && !metadata.contains("attribute conditions"),
            "{metadata}"
        );
        assert!(rejected_fix(IdentityKind::KeyFile).contains("GOOGLE_APPLICATION_CREDENTIALS"));
        assert!(rejected_fix(IdentityKind::ExternalAccount).contains("attribute conditions"));
    }
}
