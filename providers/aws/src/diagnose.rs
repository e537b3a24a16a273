//! `regbroker doctor` for AWS: which identity aws-config's default chain would pick and
//! why, the projected token it would present, the region its STS calls go to, and one
//! real STS `GetCallerIdentity` naming the account and the assumed role.
//!
//! Env vars read (from the process env, as aws-config reads them): `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY` (presence only), `AWS_PROFILE`, `AWS_SHARED_CREDENTIALS_FILE`,
//! `HOME`, `AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`,
//! `AWS_CONTAINER_CREDENTIALS_FULL_URI`, `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`,
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`, `AWS_EC2_METADATA_DISABLED`, `AWS_REGION`,
//! `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`.

use std::path::PathBuf;
use std::time::Duration;

use regbroker_provider::diagnosis::{TokenFile, check_token_file};
use regbroker_provider::{Diagnosis, ErrorKind, Finding, IdentityKind};

use crate::AwsProvider;
use crate::errors;
use crate::options::is_role_arn;

/// The audience EKS's pod identity webhook projects IRSA tokens for.
pub const IRSA_AUDIENCE: &str = "sts.amazonaws.com";
/// The audience of EKS Pod Identity's projected token.
pub const POD_IDENTITY_AUDIENCE: &str = "pods.eks.amazonaws.com";

/// Which identity the default chain would use, judged from the env alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detected {
    /// The kind.
    pub kind: IdentityKind,
    /// What was found, as `NAME=value` (never a secret's value).
    pub found: Vec<String>,
    /// `AWS_ROLE_ARN` (IRSA).
    pub role_arn: Option<String>,
    /// The projected token file (IRSA or Pod Identity) and the env var naming it.
    pub token_file: Option<(&'static str, PathBuf)>,
}

/// The default chain's choice (env keys, profile, IRSA, Pod Identity / ECS, IMDS, in
/// that order) from `get`, an env lookup.
pub fn detect(get: &dyn Fn(&str) -> Option<String>) -> Detected {
    let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    let mut d = Detected {
        kind: IdentityKind::None,
        found: Vec::new(),
        role_arn: None,
        token_file: None,
    };
    if let (Some(id), Some(_)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        // An access key id is not a secret, but show only its prefix anyway.
        let prefix: String = id.chars().take(4).collect();
        d.kind = IdentityKind::StaticKeys;
        d.found = vec![
            format!("AWS_ACCESS_KEY_ID={prefix}…"),
            "AWS_SECRET_ACCESS_KEY (set)".into(),
        ];
        return d;
    }
    let credentials_file = var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".aws/credentials")));
    if let Some(p) = var("AWS_PROFILE") {
        d.kind = IdentityKind::Profile;
        d.found = vec![format!("AWS_PROFILE={p}")];
        return d;
    }
    if let Some(f) = credentials_file.filter(|f| f.is_file()) {
        d.kind = IdentityKind::Profile;
        d.found = vec![format!("credentials file {}", f.display())];
        return d;
    }
    if let (Some(role), Some(file)) = (var("AWS_ROLE_ARN"), var("AWS_WEB_IDENTITY_TOKEN_FILE")) {
        d.kind = IdentityKind::Irsa;
        d.found = vec![
            format!("AWS_ROLE_ARN={role}"),
            format!("AWS_WEB_IDENTITY_TOKEN_FILE={file}"),
        ];
        d.role_arn = Some(role);
        d.token_file = Some(("AWS_WEB_IDENTITY_TOKEN_FILE", PathBuf::from(file)));
        return d;
    }
    let full = var("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    let relative = var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    if full.is_some() || relative.is_some() {
        d.kind = IdentityKind::PodIdentity;
        if let Some(u) = full {
            d.found
                .push(format!("AWS_CONTAINER_CREDENTIALS_FULL_URI={u}"));
        }
        if let Some(u) = relative {
            d.found
                .push(format!("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI={u}"));
        }
        if let Some(f) = var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            d.found
                .push(format!("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE={f}"));
            d.token_file = Some(("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", PathBuf::from(f)));
        }
        return d;
    }
    if var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        d.found = vec!["AWS_EC2_METADATA_DISABLED=true".into()];
        return d;
    }
    d.kind = IdentityKind::InstanceMetadata;
    d
}

fn process_env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// The partition of a role ARN (`aws`, `aws-cn`, ...).
fn partition(arn: &str) -> Option<&str> {
    arn.strip_prefix("arn:")?.split(':').next()
}

impl AwsProvider {
    /// See [`regbroker_provider::Provider::diagnose`].
    pub async fn diagnosis(&self, timeout: Duration) -> Diagnosis {
        let d = detect(&process_env);
        let now = self.settings.clock.now();
        let mut out = Vec::new();
        let explicit = !matches!(d.kind, IdentityKind::InstanceMetadata | IdentityKind::None);
        let chain = "aws-config's default chain: env keys, profile, IRSA, Pod Identity, IMDS";
        let found = if d.found.is_empty() {
            String::new()
        } else if d.kind == IdentityKind::None {
            format!(" (found {})", d.found.join(", "))
        } else {
            format!(": {}", d.found.join(", "))
        };
        match d.kind {
            IdentityKind::None => {
                out.push(Finding::fail(
                    "aws.identity",
                    format!(
                        "no AWS identity: looked for {}{found}",
                        errors::IDENTITY_SOURCES
                    ),
                    "give the pod an identity: IRSA (annotate its service account with eks.amazonaws.com/role-arn) or an EKS Pod Identity association, or unset AWS_EC2_METADATA_DISABLED on an EC2 node",
                ));
                return Diagnosis {
                    identity: d.kind,
                    explicit,
                    findings: out,
                };
            }
            IdentityKind::InstanceMetadata => out.push(Finding::info(
                "aws.identity",
                format!(
                    "instance metadata (IMDSv2): no env keys, profile, IRSA or Pod Identity variables are set ({chain})"
                ),
            )),
            kind => out.push(Finding::info(
                "aws.identity",
                format!("{}{found} ({chain})", label(kind)),
            )),
        }
        if let Some(role) = &d.role_arn
            && !is_role_arn(role)
        {
            out.push(Finding::fail(
                "aws.role_arn",
                format!("AWS_ROLE_ARN `{role}` is not an IAM role ARN"),
                "set eks.amazonaws.com/role-arn on the service account to arn:aws:iam::ACCOUNT:role/NAME",
            ));
        }
        let mut audience_ok = None;
        let mut subject = None;
        if let Some((named_by, path)) = &d.token_file {
            let (expected, fix) = if d.kind == IdentityKind::Irsa {
                (
                    IRSA_AUDIENCE,
                    "EKS projects IRSA tokens for sts.amazonaws.com: drop the service account's eks.amazonaws.com/audience annotation, or add this audience to the client IDs of the cluster's IAM OIDC provider",
                )
            } else {
                (
                    POD_IDENTITY_AUDIENCE,
                    "the EKS Pod Identity agent expects tokens for pods.eks.amazonaws.com: let the Pod Identity webhook project the token instead of mounting another one",
                )
            };
            let report = check_token_file(&TokenFile {
                check: "aws.token_file",
                named_by,
                path,
                expected_audiences: &[expected],
                audience_fix: fix,
                now,
            });
            audience_ok = report
                .audience_ok
                .map(|ok| (ok, report.audiences(), expected));
            subject = report.claims.as_ref().and_then(|c| c.subject.clone());
            out.extend(report.findings);
        }
        out.push(region_finding(d.role_arn.as_deref()));
        out.push(
            self.caller_identity(timeout, &d, audience_ok.as_ref(), subject.as_deref())
                .await,
        );
        Diagnosis {
            identity: d.kind,
            explicit,
            findings: out,
        }
    }

    /// One STS `GetCallerIdentity` with the identity the fetches would use.
    async fn caller_identity(
        &self,
        timeout: Duration,
        d: &Detected,
        audience: Option<&(bool, String, &str)>,
        subject: Option<&str>,
    ) -> Finding {
        const CHECK: &str = "aws.sts";
        let call = async {
            let sdk = self.sdk_config().await;
            let region = sdk
                .region()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "?".into());
            let out = aws_sdk_sts::Client::new(sdk)
                .get_caller_identity()
                .send()
                .await;
            (region, out)
        };
        let (region, result) = match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => {
                let hint = if d.kind == IdentityKind::InstanceMetadata {
                    "no IRSA or Pod Identity variables are set, so the chain asked IMDS (169.254.169.254), which did not answer: on EKS pods usually cannot reach it (hop limit 1); give the service account an IRSA role or a Pod Identity association"
                } else {
                    "check egress to STS (sts.REGION.amazonaws.com, or AWS_ENDPOINT_URL_STS) and to the identity endpoint: NetworkPolicy, proxy, DNS"
                };
                return Finding::fail(
                    CHECK,
                    format!(
                        "STS GetCallerIdentity did not answer within {}",
                        regbroker_provider::diagnosis::human(timeout)
                    ),
                    hint,
                );
            }
        };
        match result {
            Ok(who) => {
                let arn = who.arn().unwrap_or("?");
                let account = who.account().unwrap_or("?");
                let role = assumed_role(arn)
                    .map(|r| format!(", assumed role {r}"))
                    .unwrap_or_default();
                Finding::pass(
                    CHECK,
                    format!(
                        "STS GetCallerIdentity in {region}: account {account}, arn {arn}{role}"
                    ),
                )
            }
            Err(e) => {
                let what = format!("STS GetCallerIdentity in {region}");
                let error = errors::map_sdk_error(&what, e);
                let code = errors::known_code(&error.chain())
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default();
                let detail = format!("{}{code}", error.message());
                let fix = match (error.kind(), audience) {
                    (ErrorKind::IdentityRejected, Some((false, got, expected))) => {
                        return Finding::fail(
                            CHECK,
                            format!(
                                "audience mismatch: STS refused the web identity token, whose audience is {got}; expected {expected}: {detail}"
                            ),
                            format!(
                                "project the token for {expected} (EKS does by default; remove a custom eks.amazonaws.com/audience annotation), or add {got} to the IAM OIDC provider's audiences"
                            ),
                        );
                    }
                    (ErrorKind::IdentityRejected, _) if d.kind == IdentityKind::Irsa => format!(
                        "the role's trust policy must allow sts:AssumeRoleWithWebIdentity from the cluster's IAM OIDC provider for this service account (condition on sub = {}), and the OIDC provider must exist in the role's account",
                        subject.unwrap_or("system:serviceaccount:NAMESPACE:NAME")
                    ),
                    (ErrorKind::IdentityRejected, _) => "check the identity's keys or role: AWS refused it".to_string(),
                    (ErrorKind::IdentityMissing, _) => format!(
                        "give the pod an identity; looked for {}",
                        errors::IDENTITY_SOURCES
                    ),
                    (k, _) if k.is_transient() => "check egress to STS (sts.REGION.amazonaws.com, or AWS_ENDPOINT_URL_STS) and to the identity endpoint: NetworkPolicy, proxy, DNS".to_string(),
                    _ => "check the AWS settings named above (region, endpoint URLs)".to_string(),
                };
                Finding::fail(CHECK, detail, fix)
            }
        }
    }
}

/// `NAME` of `arn:aws:sts::123456789012:assumed-role/NAME/SESSION`.
fn assumed_role(arn: &str) -> Option<&str> {
    arn.split_once(":assumed-role/")?.1.split('/').next()
}

fn label(kind: IdentityKind) -> &'static str {
    match kind {
        IdentityKind::StaticKeys => "env keys",
        IdentityKind::Profile => "profile",
        IdentityKind::Irsa => "IRSA (web identity)",
        IdentityKind::PodIdentity => "EKS Pod Identity / container endpoint",
        IdentityKind::InstanceMetadata => "instance metadata (IMDSv2)",
        _ => "none",
    }
}

/// Where the identity chain's STS calls go, and whether that fits the role's partition.
fn region_finding(role_arn: Option<&str>) -> Finding {
    const CHECK: &str = "aws.region";
    let region = ["AWS_REGION", "AWS_DEFAULT_REGION"]
        .iter()
        .find_map(|k| process_env(k).filter(|v| !v.is_empty()).map(|v| (*k, v)));
    let partition = role_arn.and_then(partition);
    match (region, partition) {
        (Some((k, v)), _) => Finding::pass(
            CHECK,
            format!(
                "STS calls go to {v} ({k}); ECR calls to each registry's own region, ECR Public to us-east-1"
            ),
        ),
        (None, Some(p)) if p != "aws" => Finding::fail(
            CHECK,
            format!(
                "no region for STS: AWS_REGION and AWS_DEFAULT_REGION are unset, so STS calls go to us-east-1, which is not in the role's partition {p}"
            ),
            "set AWS_REGION to the cluster's region (the EKS webhook and Pod Identity set it; check the pod's env)",
        ),
        (None, _) => Finding::warn(
            CHECK,
            "no region for STS or ECR Public: AWS_REGION and AWS_DEFAULT_REGION are unset, so STS calls go to us-east-1 (or the profile's region)",
            "set AWS_REGION to the cluster's region: regional STS is required in China, GovCloud and ISO partitions; ECR Public always uses us-east-1",
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn detect_from(pairs: &[(&str, &str)]) -> Detected {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(&move |k| map.get(k).cloned())
    }

    #[test]
    fn the_chain_order_decides_the_kind() {
        let irsa = [
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/r"),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
            ("HOME", "/nonexistent"),
        ];
        let d = detect_from(&irsa);
        assert_eq!(d.kind, IdentityKind::Irsa);
        assert_eq!(
            d.role_arn.as_deref(),
            Some("arn:aws:iam::123456789012:role/r")
        );
        assert_eq!(
            d.token_file,
            Some((
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                PathBuf::from("/var/run/token")
            ))
        );
        let mut keys = irsa.to_vec();
        keys.extend([
            ("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEY"),
            ("AWS_SECRET_ACCESS_KEY", "never-shown-secret"),
        ]);
        let d = detect_from(&keys);
        assert_eq!(d.kind, IdentityKind::StaticKeys);
        let shown = format!("{d:?}");
        assert!(!shown.contains("never-shown-secret"), "{shown}");
        assert!(!shown.contains("AKIAEXAMPLEKEY"), "{shown}");
        let d = detect_from(&[
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "http://169.254.170.23/v1/credentials",
            ),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                "/var/run/pod-identity/token",
            ),
        ]);
        assert_eq!(d.kind, IdentityKind::PodIdentity);
        assert_eq!(
            d.token_file.unwrap().0,
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"
        );
        assert_eq!(detect_from(&[]).kind, IdentityKind::InstanceMetadata);
        assert_eq!(
            detect_from(&[("AWS_EC2_METADATA_DISABLED", "true")]).kind,
            IdentityKind::None
        );
        assert_eq!(
            detect_from(&[("AWS_PROFILE", "ci"), ("AWS_ROLE_ARN", "x")]).kind,
            IdentityKind::Profile
        );
    }

    #[test]
    fn assumed_role_is_read_from_the_caller_arn() {
        assert_eq!(
            assumed_role("arn:aws:sts::123456789012:assumed-role/irsa-puller/botocore-session-1"),
            Some("irsa-puller")
        );
        assert_eq!(assumed_role("arn:aws:iam::123456789012:user/bob"), None);
        assert_eq!(
            partition("arn:aws-cn:iam::123456789012:role/r"),
            Some("aws-cn")
        );
    }
}
