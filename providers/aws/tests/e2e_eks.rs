//! Opt-in end-to-end test against real AWS, meant to run in a pod on EKS with IRSA or
//! EKS Pod Identity (see "End-to-end test on EKS" in the crate README).
//!
//! Env vars: `REGBROKER_E2E_EKS=1` enables it; `REGBROKER_E2E_ECR_REGISTRY` names the
//! registry (`<account>.dkr.ecr.<region>.amazonaws.com` or `public.ecr.aws`);
//! `REGBROKER_E2E_ROLE_ARN` (optional) also checks the `role_arn` rule option. The
//! identity comes from the pod's environment through aws-config's default chain.
//!
//! `#[ignore]`d in every mode (plain `cargo test` and `scripts/test.sh`, which skips
//! `e2e_real_cloud_*`): run it with `--ignored`. Run without its env vars, it fails.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, UNIX_EPOCH};

use regbroker_aws::AwsProvider;
use regbroker_provider::{ExposeSecret, Options, Provider, Registry, system_clock};

#[tokio::test]
#[ignore = "real cloud: set REGBROKER_E2E_EKS=1 and REGBROKER_E2E_ECR_REGISTRY (see deploy/e2e/README.md)"]
async fn e2e_real_cloud_ecr_credential_is_fetched_on_eks() {
    assert_eq!(
        std::env::var("REGBROKER_E2E_EKS").as_deref(),
        Ok("1"),
        "this real-cloud test needs REGBROKER_E2E_EKS=1 and REGBROKER_E2E_ECR_REGISTRY=<host>, \
         in a pod on EKS (see providers/aws/README.md)"
    );
    let host = std::env::var("REGBROKER_E2E_ECR_REGISTRY")
        .expect("REGBROKER_E2E_ECR_REGISTRY=<account>.dkr.ecr.<region>.amazonaws.com is required");
    let registry = Registry::parse(&host).unwrap();
    let provider = AwsProvider::from_env().expect("the rates in the environment are valid");
    let target = provider
        .recognise(&registry)
        .unwrap_or_else(|| panic!("{host} is not an ECR host"));

    let mut targets = vec![("identity of the pod", target)];
    if let Ok(role) = std::env::var("REGBROKER_E2E_ROLE_ARN") {
        let options: Options = [("role_arn".to_string(), role)].into_iter().collect();
        targets.push((
            "role_arn option",
            provider.target(&registry, &options).unwrap(),
        ));
    }
    let now = system_clock().now();
    for (what, target) in targets {
        let c = provider
            .fetch(&target)
            .await
            .unwrap_or_else(|e| panic!("{what}: {} ({})", e.chain(), e.kind().code()));
        assert_eq!(c.username(), "AWS", "{what}");
        // ECR passwords are long base64 blobs (a JSON payload with a signature).
        assert!(
            c.secret().expose_secret().len() > 100,
            "{what}: password too short"
        );
        let expires = c.expires_at().expect("ECR gives an expiry");
        // ECR tokens live 12 hours.
        assert!(
            expires > now + Duration::from_secs(11 * 3600),
            "{what}: expiry too close"
        );
        assert!(
            expires < now + Duration::from_secs(13 * 3600),
            "{what}: expiry too far"
        );
        eprintln!(
            "{what}: fetched a credential for {host}, expiring at unix {}",
            expires.duration_since(UNIX_EPOCH).unwrap().as_secs()
        );
    }
}
