//! A workload's own identity against ECR Public and ECR (issue 15.2), on the in-process
//! fake of `common::sts_ecr` (moto has no ECR Public): the workload's ServiceAccount token
//! goes to STS `AssumeRoleWithWebIdentity`, and the ECR call is signed with the assumed
//! role's credentials (the fake's access key ids name the role's account), never with
//! this process's own identity (here static keys the fake would also accept).

#![allow(clippy::unwrap_used)]

mod common;

use common::sts_ecr::{PASSWORD, PUBLIC_PASSWORD, start};
use regbroker_aws::AwsProvider;
use regbroker_provider::test_util::service_account_jwt;
use regbroker_provider::{ExposeSecret, Provider, Registry, WorkloadIdentity};

fn workload(token: &str, role: &str) -> WorkloadIdentity {
    WorkloadIdentity::from_token(
        token.to_string().into(),
        [(
            "eks.amazonaws.com/ecr-role-arn".to_string(),
            role.to_string(),
        )]
        .into(),
    )
    .unwrap()
}

#[tokio::test]
async fn ecr_public_and_ecr_are_called_with_the_workloads_assumed_role() {
    let (fake, url, _task) = start().await;
    let provider = AwsProvider::builder()
        .endpoint_url(url)
        .credentials(
            aws_credential_types::provider::SharedCredentialsProvider::new(
                aws_credential_types::Credentials::new(
                    "AKIATHISPROCESS00001",
                    "own-secret",
                    None,
                    None,
                    "test",
                ),
            ),
        )
        .build();
    let token = service_account_jwt("team-a", "puller", "u-1");
    let w = workload(&token, "arn:aws:iam::111111111111:role/team-a-puller");
    for (host, password) in [
        ("public.ecr.aws", PUBLIC_PASSWORD),
        ("555555555555.dkr.ecr.eu-west-1.amazonaws.com", PASSWORD),
    ] {
        let registry = Registry::parse(host).unwrap();
        let t = provider
            .bind_workload(provider.recognise(&registry).unwrap(), w.clone())
            .unwrap();
        let c = provider.fetch(&t).await.unwrap();
        assert_eq!(c.username(), "AWS");
        assert_eq!(c.secret().expose_secret(), password, "{host}");
    }
    let counts = fake.counts.lock().unwrap();
    assert_eq!(counts.sts, 2);
    assert_eq!(counts.public_ok, 1);
    assert_eq!(counts.ecr_ok, 1);
    assert!(
        counts.web_identity_tokens.iter().all(|t| *t == token),
        "STS got the workload's own token"
    );
    assert_eq!(
        counts.signed_with,
        vec!["ASIA111111111111", "ASIA111111111111"],
        "signed by the assumed role, never by this process's keys"
    );
}
