//! A workload's own identity on AWS: STS `AssumeRoleWithWebIdentity` with its
//! ServiceAccount token, then ECR's `GetAuthorizationToken` with the assumed role's
//! credentials. This is what the EKS kubelet plugin (KEP-4412) and Flux (RFC-0010) do.
//!
//! Annotations read from the ServiceAccount, first one present wins:
//! - `eks.amazonaws.com/ecr-role-arn` (the kubelet plugin's key),
//! - `eks.amazonaws.com/role-arn` (IRSA's, which Flux reads).
//!
//! The role must be an IAM role ARN. STS is called in the registry's own region (ECR
//! Public: `us-east-1`), so the partition and the endpoint follow the host; the session is
//! named after the ServiceAccount (`regbroker-<namespace>-<name>`, shortened with a hash
//! when longer than STS allows), which CloudTrail then shows. Endpoint overrides
//! (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_STS`) apply as to every other call.
//!
//! EKS Pod Identity cannot act for another ServiceAccount: its credentials are bound to
//! the pod that asks the EKS Auth API, so a workload without a role annotation is an
//! error here, never the node's or this pod's identity.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sdk_sts::config::Region;
use aws_types::SdkConfig;
use regbroker_provider::{Credential, Error, ExposeSecret, WorkloadIdentity};

use crate::errors;
use crate::options::is_role_arn;

/// The kubelet plugin's annotation for the role to assume for image pulls.
pub const ECR_ROLE_ANNOTATION: &str = "eks.amazonaws.com/ecr-role-arn";
/// IRSA's annotation (and Flux's) for a ServiceAccount's role.
pub const ROLE_ANNOTATION: &str = "eks.amazonaws.com/role-arn";
/// The annotations read, in order of precedence.
pub const ROLE_ANNOTATIONS: &[&str] = &[ECR_ROLE_ANNOTATION, ROLE_ANNOTATION];
/// The audience STS accepts for a web identity token from EKS.
pub const AUDIENCE: &str = "sts.amazonaws.com";

/// STS's limit on a role session name.
const MAX_SESSION_NAME: usize = 64;

/// The role `workload` asks for: the first role annotation present, checked to be an IAM
/// role ARN. Absent: an error saying which annotation to set and that Pod Identity cannot
/// stand in.
pub fn role_of(workload: &WorkloadIdentity) -> Result<&str, Error> {
    let sa = workload.service_account();
    match workload.first_annotation(ROLE_ANNOTATIONS) {
        Some((_, role)) if is_role_arn(role) => Ok(role),
        Some((key, role)) => Err(Error::invalid_config(format!(
            "ServiceAccount {sa}: annotation {key} = `{}` is not an IAM role ARN (arn:aws:iam::123456789012:role/NAME)",
            regbroker_provider::printable(role, 80)
        ))),
        None => Err(Error::identity_missing(format!(
            "ServiceAccount {sa} has neither {ECR_ROLE_ANNOTATION} nor {ROLE_ANNOTATION}: annotate it with the IAM role its pulls should use (EKS Pod Identity cannot act for another ServiceAccount, so a workload's own identity needs a role annotation)"
        ))),
    }
}

/// `regbroker-<namespace>-<name>`, or when that is longer than STS allows, its first
/// characters and a hash of the whole, so two ServiceAccounts never share a session name.
pub fn session_name(workload: &WorkloadIdentity) -> String {
    let sa = workload.service_account();
    let full = format!("regbroker-{}-{}", sa.namespace(), sa.name());
    if full.len() <= MAX_SESSION_NAME {
        return full;
    }
    let hash = regbroker_provider::fingerprint(&[
        ("namespace", Some(sa.namespace())),
        ("name", Some(sa.name())),
    ]);
    // Kubernetes names are ASCII, so any byte index is a character boundary.
    format!("{}-{hash}", &full[..MAX_SESSION_NAME - hash.len() - 1])
}

/// Assumes `role` with `workload`'s token, through STS in `region` with the SDK
/// configuration `sdk` (the caller waits for its STS budget first): credentials that
/// are the workload's own, and when they stop working.
pub(crate) async fn assume(
    sdk: &SdkConfig,
    workload: &WorkloadIdentity,
    role: &str,
    region: &str,
) -> Result<(Credentials, Option<SystemTime>), Error> {
    let sa = workload.service_account();
    let what = format!("STS AssumeRoleWithWebIdentity for ServiceAccount {sa} in {region}");
    let conf = aws_sdk_sts::config::Builder::from(sdk)
        .region(Region::new(region.to_string()))
        .build();
    let out = aws_sdk_sts::Client::from_conf(conf)
        .assume_role_with_web_identity()
        .role_arn(role)
        .role_session_name(session_name(workload))
        .web_identity_token(workload.token().expose_secret())
        .send()
        .await
        .map_err(|e| errors::map_sdk_error(&what, e))?;
    let Some(c) = out.credentials() else {
        return Err(Error::bad_response(format!(
            "{what}: no credentials in the answer"
        )));
    };
    let expires = SystemTime::try_from(*c.expiration()).ok();
    let credentials = Credentials::new(
        c.access_key_id(),
        c.secret_access_key(),
        Some(c.session_token().to_string()),
        expires,
        "regbroker-web-identity",
    );
    tracing::debug!(service_account = %sa, role, region, "Assumed the workload's role");
    Ok((credentials, expires))
}

/// The assumed role's credentials stop working at `session_end`, and so does anything
/// signed with them: the registry credential never outlives them.
pub(crate) fn within_session(
    credential: Credential,
    session_end: Option<SystemTime>,
) -> Credential {
    match (credential.expires_at(), session_end) {
        (Some(e), Some(s)) if s < e => Credential::new(
            credential.username().to_string(),
            credential.secret().clone(),
            Some(s),
        ),
        (None, Some(s)) => Credential::new(
            credential.username().to_string(),
            credential.secret().clone(),
            Some(s),
        ),
        _ => credential,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use regbroker_provider::test_util::service_account_jwt;
    use std::collections::BTreeMap;

    fn workload(ns: &str, name: &str, annotations: &[(&str, &str)]) -> WorkloadIdentity {
        WorkloadIdentity::from_token(
            service_account_jwt(ns, name, "u-1").into(),
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        )
        .unwrap()
    }

    #[test]
    fn the_kubelet_plugins_annotation_wins_over_irsas() {
        let w = workload(
            "a",
            "sa",
            &[
                (ROLE_ANNOTATION, "arn:aws:iam::111111111111:role/irsa"),
                (ECR_ROLE_ANNOTATION, "arn:aws:iam::222222222222:role/ecr"),
            ],
        );
        assert_eq!(role_of(&w).unwrap(), "arn:aws:iam::222222222222:role/ecr");
        let w = workload(
            "a",
            "sa",
            &[(ROLE_ANNOTATION, "arn:aws:iam::111111111111:role/irsa")],
        );
        assert_eq!(role_of(&w).unwrap(), "arn:aws:iam::111111111111:role/irsa");
    }

    #[test]
    fn a_malformed_role_annotation_is_an_error_naming_it() {
        for bad in [
            "puller",
            "arn:aws:iam::123456789012:user/bob",
            "arn:aws:iam::12345678901:role/x",
            "arn:aws:sts::123456789012:assumed-role/x/y",
        ] {
            let w = workload("a", "sa", &[(ECR_ROLE_ANNOTATION, bad)]);
            let e = role_of(&w).unwrap_err();
            assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
            assert!(e.message().contains(ECR_ROLE_ANNOTATION), "{e}");
            assert!(e.message().contains("a/sa"), "{e}");
        }
        // A malformed kubelet-plugin annotation is not skipped in favour of IRSA's.
        let w = workload(
            "a",
            "sa",
            &[
                (ECR_ROLE_ANNOTATION, "nonsense"),
                (ROLE_ANNOTATION, "arn:aws:iam::111111111111:role/irsa"),
            ],
        );
        assert!(role_of(&w).is_err());
    }

    #[test]
    fn no_role_annotation_says_pod_identity_cannot_stand_in() {
        let e = role_of(&workload("a", "sa", &[])).unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::IdentityMissing);
        assert!(e.message().contains("Pod Identity cannot act"), "{e}");
        assert!(e.message().contains(ECR_ROLE_ANNOTATION), "{e}");
    }

    #[test]
    fn session_names_fit_sts_and_stay_distinct() {
        assert_eq!(
            session_name(&workload("team-a", "puller", &[])),
            "regbroker-team-a-puller"
        );
        let long = format!("{}.{}", "n".repeat(63), "n".repeat(63));
        let long_a = workload("team-a", &format!("{long}.a"), &[]);
        let long_b = workload("team-a", &format!("{long}.b"), &[]);
        let (a, b) = (session_name(&long_a), session_name(&long_b));
        assert!(
            a.len() <= MAX_SESSION_NAME && b.len() <= MAX_SESSION_NAME,
            "{a} {b}"
        );
        assert_ne!(a, b);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"_+=,.@-".contains(&c))
        );
    }

    #[test]
    fn the_registry_credential_never_outlives_the_session() {
        let t = SystemTime::UNIX_EPOCH;
        let at = |s| Some(t + std::time::Duration::from_secs(s));
        let c = Credential::new("AWS", "x".to_string(), at(43_200));
        assert_eq!(within_session(c.clone(), at(3600)).expires_at(), at(3600));
        assert_eq!(
            within_session(c.clone(), at(90_000)).expires_at(),
            at(43_200)
        );
        assert_eq!(within_session(c.clone(), None).expires_at(), at(43_200));
        let unknown = Credential::new("AWS", "x".to_string(), None);
        assert_eq!(within_session(unknown, at(3600)).expires_at(), at(3600));
    }
}
