//! A workload's own identity on Google Cloud (issue 15): its ServiceAccount token is the
//! subject token of an STS exchange for the provider its annotation names, then, with
//! `iam.gke.io/gcp-service-account`, a generateAccessToken for that account. Google's STS
//! and IAM Credentials cannot run here: in-process fakes (`common::federation`) record
//! what they were sent, and the tests check it is that ServiceAccount's token, for the
//! annotated provider's audience. This process's own identity (the metadata server,
//! here closed) is never used for a workload.

#![allow(clippy::unwrap_used)]

mod common;

use common::federation::{Federation, start_federation};
use common::{closed_port, form, provider};
use regbroker_gcp::workload::{
    IAM_CREDENTIALS_URL_ENV, PROVIDER_ANNOTATION, SERVICE_ACCOUNT_ANNOTATION, STS_URL_ENV,
};
use regbroker_provider::{
    ErrorKind, ExposeSecret, ManualClock, Provider, Registry, WorkloadIdentity,
};

const PROVIDER: &str =
    "projects/123456789/locations/global/workloadIdentityPools/my-pool/providers/cluster-a";
const EMAIL: &str = "puller@my-project.iam.gserviceaccount.com";

fn token(namespace: &str) -> String {
    regbroker_provider::test_util::jwt(&serde_json::json!({
        "aud": [format!("//iam.googleapis.com/{PROVIDER}")],
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": format!("system:serviceaccount:{namespace}:puller"),
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": "puller", "uid": "u-1"}},
    }))
}

fn workload(token: &str, annotations: &[(&str, &str)]) -> WorkloadIdentity {
    WorkloadIdentity::from_token(
        token.to_string().into(),
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_workloads_token_is_exchanged_for_its_provider_and_impersonates_its_account() {
    let fed = Federation::default();
    let fake = start_federation(fed.clone()).await;
    let clock = ManualClock::fixed();
    let metadata = format!("127.0.0.1:{}", closed_port());
    let p = provider(
        &[
            ("GCE_METADATA_HOST", metadata.as_str()),
            (STS_URL_ENV, &fake.url("/v1/token")),
            (IAM_CREDENTIALS_URL_ENV, &fake.url("")),
        ],
        &clock,
    );
    let registry = Registry::parse("europe-docker.pkg.dev").unwrap();
    let jwt = token("team-a");

    // Federated token only (no service account annotation).
    let w = workload(&jwt, &[(PROVIDER_ANNOTATION, PROVIDER)]);
    let t = p.bind_workload(p.recognise(&registry).unwrap(), w).unwrap();
    assert!(
        t.scope()
            .starts_with("sa=team-a/puller/u-1|sts=//iam.googleapis.com/"),
        "{}",
        t.scope()
    );
    let c = p.fetch(&t).await.unwrap();
    assert_eq!(c.username(), "oauth2accesstoken");
    assert_eq!(c.secret().expose_secret(), "ya29.sts-1");
    let sent = form(&fed.sts.all()[0].body);
    assert_eq!(
        sent.get("subject_token"),
        Some(&jwt),
        "the workload's own token"
    );
    assert_eq!(
        sent.get("audience").map(String::as_str),
        Some(format!("//iam.googleapis.com/{PROVIDER}").as_str())
    );
    assert_eq!(
        sent.get("subject_token_type").map(String::as_str),
        Some("urn:ietf:params:oauth:token-type:jwt")
    );
    assert_eq!(fed.iam.count(), 0);

    // With a Google service account: impersonated with the STS token.
    let w = workload(
        &jwt,
        &[
            (PROVIDER_ANNOTATION, PROVIDER),
            (SERVICE_ACCOUNT_ANNOTATION, EMAIL),
        ],
    );
    let bound = p.bind_workload(p.recognise(&registry).unwrap(), w).unwrap();
    assert_ne!(bound.scope(), t.scope(), "another identity, another entry");
    let c = p.fetch(&bound).await.unwrap();
    assert_eq!(c.secret().expose_secret(), "ya29.impersonated");
    let iam = fed.iam.all();
    assert_eq!(iam.len(), 1);
    assert_eq!(
        iam[0]
            .headers
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap(),
        "Bearer ya29.sts-2"
    );
}

#[tokio::test]
async fn a_missing_or_malformed_annotation_is_an_error_naming_it() {
    let clock = ManualClock::fixed();
    let p = provider(&[], &clock);
    let target = || p.recognise(&Registry::parse("gcr.io").unwrap()).unwrap();
    let jwt = token("team-a");
    let e = p.bind_workload(target(), workload(&jwt, &[])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMissing);
    assert!(e.message().contains(PROVIDER_ANNOTATION), "{e}");
    let e = p
        .bind_workload(
            target(),
            workload(&jwt, &[(PROVIDER_ANNOTATION, "my-pool")]),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e.message().contains(PROVIDER_ANNOTATION), "{e}");
    let e = p
        .bind_workload(
            target(),
            workload(
                &jwt,
                &[
                    (PROVIDER_ANNOTATION, PROVIDER),
                    (SERVICE_ACCOUNT_ANNOTATION, "not an email"),
                ],
            ),
        )
        .unwrap_err();
    assert!(e.message().contains(SERVICE_ACCOUNT_ANNOTATION), "{e}");
    assert!(!e.message().contains(&jwt));
}

/// GKE's own workload pool, when `REGBROKER_GKE_CLUSTER` names the cluster and the
/// ServiceAccount names no provider: token audience `<project>.svc.id.goog`, STS audience
/// `identitynamespace:...` with the cluster's URL (what GKE's metadata server does).
#[tokio::test]
async fn gkes_own_pool_is_used_when_the_cluster_is_named() {
    use regbroker_gcp::workload::GKE_CLUSTER_ENV;
    let fed = Federation::default();
    let fake = start_federation(fed.clone()).await;
    let clock = ManualClock::fixed();
    let cluster = "projects/my-project/locations/europe-west1/clusters/prod";
    let p = provider(
        &[
            (GKE_CLUSTER_ENV, cluster),
            (STS_URL_ENV, &fake.url("/v1/token")),
            (IAM_CREDENTIALS_URL_ENV, &fake.url("")),
        ],
        &clock,
    );
    let registry = Registry::parse("europe-docker.pkg.dev").unwrap();
    assert_eq!(
        p.workload_audience(&p.recognise(&registry).unwrap(), &Default::default())
            .unwrap(),
        "my-project.svc.id.goog"
    );
    let jwt = token("team-a");
    let w = workload(&jwt, &[(SERVICE_ACCOUNT_ANNOTATION, EMAIL)]);
    let t = p.bind_workload(p.recognise(&registry).unwrap(), w).unwrap();
    let c = p.fetch(&t).await.unwrap();
    assert_eq!(c.secret().expose_secret(), "ya29.impersonated");
    let sent = form(&fed.sts.all()[0].body);
    assert_eq!(
        sent.get("audience").map(String::as_str),
        Some(
            "identitynamespace:my-project.svc.id.goog:https://container.googleapis.com/v1/projects/my-project/locations/europe-west1/clusters/prod"
        )
    );
    assert_eq!(sent.get("subject_token"), Some(&jwt));
    // The annotation still wins over the cluster's pool.
    let w = workload(&jwt, &[(PROVIDER_ANNOTATION, PROVIDER)]);
    let t = p.bind_workload(p.recognise(&registry).unwrap(), w).unwrap();
    assert!(
        t.scope()
            .contains("//iam.googleapis.com/projects/123456789/"),
        "{}",
        t.scope()
    );

    // A setting that is not a cluster is an error naming it.
    let bad = provider(&[(GKE_CLUSTER_ENV, "prod")], &clock);
    let e = bad
        .bind_workload(bad.recognise(&registry).unwrap(), workload(&jwt, &[]))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e.message().contains(GKE_CLUSTER_ENV), "{e}");
}
