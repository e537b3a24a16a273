//! A workload's own identity on Google Cloud: its ServiceAccount token exchanged at the
//! STS of its universe (workload identity federation), then, when the ServiceAccount names
//! a Google service account, `generateAccessToken` for that account. This is what Flux
//! (RFC-0010) does.
//!
//! Annotations read from the ServiceAccount:
//! - `gcp.auth.fluxcd.io/workload-identity-provider` (required): the provider resource,
//!   `projects/<number>/locations/global/workloadIdentityPools/<pool>/providers/<provider>`;
//!   the token's and STS's audience is `//iam.<universe>/` followed by it. Without it, GKE's
//!   own pool when `REGBROKER_GKE_CLUSTER` names the cluster
//!   (`projects/PROJECT_ID/locations/LOCATION/clusters/NAME`): token audience
//!   `<project>.svc.id.goog`, STS audience
//!   `identitynamespace:<project>.svc.id.goog:https://container.googleapis.com/v1/<cluster>`;
//! - `iam.gke.io/gcp-service-account` (optional): the Google service account to
//!   impersonate. Without it the federated token itself is the registry credential (the
//!   principal of the ServiceAccount needs `roles/artifactregistry.reader`).
//!
//! Env vars (tests, proxies): `REGBROKER_GCP_STS_URL` replaces `https://sts.<universe>/v1/token`,
//! `REGBROKER_GCP_IAM_CREDENTIALS_URL` replaces `https://iamcredentials.<universe>`; both
//! https, or http to loopback.

use regbroker_provider::{Error, Target, WorkloadIdentity};

use crate::identity::Env;
use crate::url::checked_endpoint;

/// Flux's annotation naming the workload identity provider.
pub const PROVIDER_ANNOTATION: &str = "gcp.auth.fluxcd.io/workload-identity-provider";
/// GKE's annotation naming the Google service account to act as.
pub const SERVICE_ACCOUNT_ANNOTATION: &str = "iam.gke.io/gcp-service-account";
/// Env var replacing the STS token endpoint.
pub const STS_URL_ENV: &str = "REGBROKER_GCP_STS_URL";
/// Env var replacing the IAM Credentials base URL.
pub const IAM_CREDENTIALS_URL_ENV: &str = "REGBROKER_GCP_IAM_CREDENTIALS_URL";

/// Env var naming this GKE cluster (`projects/PROJECT_ID/locations/LOCATION/clusters/NAME`):
/// a ServiceAccount without [`PROVIDER_ANNOTATION`] then uses GKE's own workload pool.
pub const GKE_CLUSTER_ENV: &str = "REGBROKER_GKE_CLUSTER";

/// The STS audience of a bound target.
pub(crate) const P_PROVIDER: &str = "sts_audience";
pub(crate) const P_SERVICE_ACCOUNT: &str = "gcp_service_account";

/// Where a workload's token is exchanged.
enum Federation {
    /// A workload identity provider (the annotation): token audience and STS audience
    /// `//iam.<universe>/<provider>`.
    Provider(String),
    /// GKE's own pool: token audience `<project>.svc.id.goog`, STS audience
    /// `identitynamespace:<project>.svc.id.goog:https://container.googleapis.com/v1/<cluster>`.
    Gke { project: String, cluster: String },
}

impl Federation {
    /// The audience of the ServiceAccount token.
    fn token_audience(&self, universe: &str) -> String {
        match self {
            Federation::Provider(p) => format!("//iam.{universe}/{p}"),
            Federation::Gke { project, .. } => format!("{project}.svc.id.goog"),
        }
    }

    /// The audience of the STS exchange.
    fn sts_audience(&self, universe: &str) -> String {
        match self {
            Federation::Provider(p) => format!("//iam.{universe}/{p}"),
            Federation::Gke { project, cluster } => format!(
                "identitynamespace:{project}.svc.id.goog:https://container.googleapis.com/v1/{cluster}"
            ),
        }
    }
}

/// The federation the annotations name (checked), else GKE's own pool when
/// [`GKE_CLUSTER_ENV`] names the cluster; `who` names the ServiceAccount in messages.
fn federation_of(
    env: &Env,
    annotations: &std::collections::BTreeMap<String, String>,
    who: &str,
) -> Result<Federation, Error> {
    match annotations.get(PROVIDER_ANNOTATION) {
        Some(p) if is_provider(p) => Ok(Federation::Provider(p.to_string())),
        Some(p) => Err(Error::invalid_config(format!(
            "{who}: annotation {PROVIDER_ANNOTATION} = `{}` is not a workload identity provider (projects/NUMBER/locations/global/workloadIdentityPools/POOL/providers/PROVIDER)",
            regbroker_provider::printable(p, 80)
        ))),
        None => match env.get(GKE_CLUSTER_ENV) {
            Some(c) => match gke_cluster(&c) {
                Some(project) => Ok(Federation::Gke {
                    project,
                    cluster: c.trim().to_string(),
                }),
                None => Err(Error::invalid_config(format!(
                    "{GKE_CLUSTER_ENV} = `{}` is not projects/PROJECT_ID/locations/LOCATION/clusters/NAME",
                    regbroker_provider::printable(&c, 80)
                ))),
            },
            None => Err(Error::identity_missing(format!(
                "{who} has no {PROVIDER_ANNOTATION}, and {GKE_CLUSTER_ENV} does not name a GKE cluster: annotate it with the workload identity provider that trusts this cluster's issuer, or set {GKE_CLUSTER_ENV} to use GKE's own workload pool"
            ))),
        },
    }
}

/// The token audience for the annotations (see [`Federation::token_audience`]).
pub(crate) fn audience(
    env: &Env,
    annotations: &std::collections::BTreeMap<String, String>,
    universe: &str,
) -> Result<String, Error> {
    Ok(federation_of(env, annotations, "the ServiceAccount")?.token_audience(universe))
}

/// `target` bound to `workload`: the federation and service account from its annotations
/// (or the GKE cluster setting), checked, in the scope and the parameters.
pub(crate) fn bind(
    env: &Env,
    target: Target,
    workload: WorkloadIdentity,
    universe: &str,
) -> Result<Target, Error> {
    let sa = workload.service_account();
    let provider = federation_of(env, workload.annotations(), &format!("ServiceAccount {sa}"))?
        .sts_audience(universe);
    let email = match workload.annotation(SERVICE_ACCOUNT_ANNOTATION) {
        None => None,
        Some(e) if is_email(e) => Some(e.to_string()),
        Some(e) => {
            return Err(Error::invalid_config(format!(
                "ServiceAccount {sa}: annotation {SERVICE_ACCOUNT_ANNOTATION} = `{}` is not a service account email",
                regbroker_provider::printable(e, 80)
            )));
        }
    };
    let scope = format!(
        "sts={provider}|as={}@{universe}",
        email.as_deref().unwrap_or("-")
    );
    let mut t = Target::new(target.registry().clone(), scope).with_param(P_PROVIDER, provider);
    for (k, v) in ["host_kind", crate::UNIVERSE_PARAM]
        .iter()
        .filter_map(|k| target.param(k).map(|v| (*k, v.to_string())))
    {
        t = t.with_param(k, v);
    }
    if let Some(e) = email {
        t = t.with_param(P_SERVICE_ACCOUNT, e);
    }
    Ok(t.for_workload(workload))
}

/// The federation for a bound target: STS and IAM Credentials endpoints of `universe`
/// (or the env's overrides), the audience of its provider.
pub(crate) fn federation(
    env: &Env,
    target: &Target,
    workload: &WorkloadIdentity,
    universe: &str,
) -> Result<crate::external_account::ExternalAccount, Error> {
    let provider = target.param(P_PROVIDER).ok_or_else(|| {
        Error::invalid_config(
            "a workload target without a provider (not bound by the gcp provider)",
        )
    })?;
    let sts = env
        .get(STS_URL_ENV)
        .unwrap_or_else(|| crate::universe::endpoint("sts", universe, "/v1/token"));
    let sts = checked_endpoint(&sts, STS_URL_ENV)?;
    let impersonation = match target.param(P_SERVICE_ACCOUNT) {
        None => None,
        Some(email) => {
            let base = env
                .get(IAM_CREDENTIALS_URL_ENV)
                .unwrap_or_else(|| crate::universe::endpoint("iamcredentials", universe, ""));
            let url = format!(
                "{}/v1/projects/-/serviceAccounts/{email}:generateAccessToken",
                base.trim_end_matches('/')
            );
            Some(checked_endpoint(&url, IAM_CREDENTIALS_URL_ENV)?)
        }
    };
    Ok(crate::external_account::ExternalAccount::for_workload(
        provider.to_string(),
        sts,
        impersonation,
        universe.to_string(),
        workload.token().clone(),
    ))
}

/// Checks the settings this module reads (see [`crate::GcpProvider::check_env`]).
pub(crate) fn check_env(env: &Env) -> Result<(), String> {
    for var in [STS_URL_ENV, IAM_CREDENTIALS_URL_ENV] {
        if let Some(v) = env.get(var) {
            checked_endpoint(&v, var).map_err(|e| e.message().to_string())?;
        }
    }
    if let Some(c) = env.get(GKE_CLUSTER_ENV)
        && gke_cluster(&c).is_none()
    {
        return Err(format!(
            "{GKE_CLUSTER_ENV} is not projects/PROJECT_ID/locations/LOCATION/clusters/NAME"
        ));
    }
    Ok(())
}

/// The project id of `projects/<project>/locations/<location>/clusters/<name>`, checked.
fn gke_cluster(s: &str) -> Option<String> {
    let label = |x: &str, max: usize| {
        !x.is_empty()
            && x.len() <= max
            && x.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    match s.trim().split('/').collect::<Vec<_>>().as_slice() {
        ["projects", project, "locations", location, "clusters", name]
            if label(project, 30) && label(location, 40) && label(name, 40) =>
        {
            Some(project.to_string())
        }
        _ => None,
    }
}

/// `projects/<digits>/locations/global/workloadIdentityPools/<id>/providers/<id>`.
fn is_provider(s: &str) -> bool {
    let id = |x: &str| {
        (4..=32).contains(&x.len())
            && x.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    let parts: Vec<&str> = s.split('/').collect();
    matches!(
        parts.as_slice(),
        ["projects", number, "locations", "global", "workloadIdentityPools", pool, "providers", provider]
            if !number.is_empty() && number.len() <= 20 && number.bytes().all(|b| b.is_ascii_digit())
                && id(pool) && id(provider)
    )
}

/// `name@domain`, as Google service account emails are (lower-case letters, digits, `-`,
/// `.`), no more than 254 characters.
fn is_email(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    s.len() <= 254
        && matches!(s.split_once('@'), Some((name, domain)) if ok(name) && ok(domain) && domain.contains('.'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn invalid_settings_are_errors_naming_the_variable() {
        let env = |k: &str, v: &str| Env::Map([(k.to_string(), v.to_string())].into());
        for (var, value) in [
            (STS_URL_ENV, "not a url"),
            (STS_URL_ENV, "http://sts.example.com/v1/token"),
            (IAM_CREDENTIALS_URL_ENV, "ftp://x"),
            (GKE_CLUSTER_ENV, "my-cluster"),
        ] {
            let e = check_env(&env(var, value)).unwrap_err();
            assert!(e.contains(var) && !e.contains(value), "{var}={value}: {e}");
        }
        assert!(check_env(&env(STS_URL_ENV, "http://127.0.0.1:9/v1/token")).is_ok());
        assert!(check_env(&env(GKE_CLUSTER_ENV, "projects/p/locations/l/clusters/c")).is_ok());
        assert!(check_env(&Env::Map(Default::default())).is_ok());
    }

    #[test]
    fn provider_names_and_emails_are_checked() {
        assert!(is_provider(
            "projects/123456789/locations/global/workloadIdentityPools/my-pool/providers/eks-a"
        ));
        for bad in [
            "projects/p/locations/global/workloadIdentityPools/my-pool/providers/eks-a",
            "projects/1/locations/us/workloadIdentityPools/my-pool/providers/eks-a",
            "projects/1/locations/global/workloadIdentityPools/my-pool/providers/eks-a/x",
            "projects/1/locations/global/workloadIdentityPools/p/providers/eks-a",
            "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/my-pool/providers/eks-a",
        ] {
            assert!(!is_provider(bad), "{bad}");
        }
        assert!(is_email("puller@my-project.iam.gserviceaccount.com"));
        for bad in ["puller", "a@b", "A@b.c", "a b@c.d", "a@b.c/../x"] {
            assert!(!is_email(bad), "{bad}");
        }
    }
}
