#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Never the wrong host: no cloud credential is ever produced for a host that no provider
//! recognises by its own strict patterns and no rule routes explicitly.
//!
//! Every case goes through the real broker with the real providers
//! (`Providers::from_env()`, configured from an empty environment: no identity is needed
//! because nothing here is fetched from a cloud) and through each provider's
//! `recognise()` directly. A hostile name must either be rejected by `Registry::parse`
//! or be decided `NotConfigured`, and `Broker::credential` must then answer "not
//! configured" without asking anybody. Positive controls (real ECR, ACR and GAR/GCR
//! hosts, an explicitly routed custom domain, static entries) prove the suite cannot pass
//! by recognising nothing at all.

use std::sync::Arc;

use regbroker::broker::providers::Providers;
use regbroker::broker::static_secret;
use regbroker::broker::{Broker, BrokerError, Reason, Route};
use regbroker::metrics::Metrics;
use regbroker_provider::{ExposeSecret, Registry, system_clock};

/// Builds a broker with the real providers, `rules` (TOML) and a docker config.
fn broker(rules: &str, docker_config: Option<&str>) -> (Broker, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::from_env().unwrap();
    let config = regbroker::broker::config::parse(rules, &providers).expect("test config");
    let metrics = Arc::new(Metrics::new());
    let statics = match docker_config {
        None => static_secret::Store::empty(metrics.clone()),
        Some(doc) => {
            let path = dir.path().join("config.json");
            std::fs::write(&path, doc).unwrap();
            static_secret::Store::open(vec![path], metrics.clone()).unwrap()
        }
    };
    let broker = Broker::new(
        Arc::new(statics),
        config.router,
        providers,
        config.cache,
        metrics,
        system_clock(),
    );
    (broker, dir)
}

/// Which providers recognise `registry` by their own patterns.
fn recognisers(registry: &Registry) -> Vec<&'static str> {
    Providers::from_env()
        .unwrap()
        .iter()
        .filter(|p| p.recognise(registry).is_some())
        .map(|p| p.name())
        .collect()
}

/// Host names that must never be served by a cloud provider. Each is either rejected by
/// the parser or parses to a host that no provider recognises.
const HOSTILE: &[&str] = &[
    // --- ECR: suffix lookalikes and extra labels
    "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.com",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com.cn.evil.com",
    "123456789012.dkr.ecr.us-east-1.amazonaws.co",
    "123456789012.dkr.ecr.us-east-1.amazonaws.comm",
    "123456789012.dkr.ecr.us-east-1.amazonaws-com.evil",
    "123456789012.dkr.ecr.us-east-1.evil.amazonaws.com",
    "123456789012.evil.dkr.ecr.us-east-1.amazonaws.com",
    "x.123456789012.dkr.ecr.us-east-1.amazonaws.com",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com.cn.amazonaws.com",
    "123456789012-dkr.ecr.us-east-1.amazonaws.com",
    "123456789012.dkr.ecr.amazonaws.com",
    "123456789012.dkr.ecr.us-east-x.amazonaws.com",
    "12345678901.dkr.ecr.us-east-1.amazonaws.com",
    "1234567890123.dkr.ecr.us-east-1.amazonaws.com",
    "12345678901a.dkr.ecr.us-east-1.amazonaws.com",
    "123456789012.dkr.ecr-evil.us-east-1.amazonaws.com",
    "123456789012.dkr-ecr.us-east-1.on.aws.evil.com",
    "123456789012.dkr-ecr.us-east-1.amazonaws.com",
    "ecr.us-east-1.amazonaws.com",
    "api.ecr.us-east-1.amazonaws.com",
    "sts.amazonaws.com",
    "public.ecr.aws.evil.com",
    "x.public.ecr.aws",
    "evilpublic.ecr.aws",
    "public-ecr.aws",
    "public.ecr.aw",
    "ecr.aws",
    // --- ECR: ports, trailing dots, case, encodings, userinfo
    "123456789012.dkr.ecr.us-east-1.amazonaws.com:443",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com:5000",
    "https://123456789012.dkr.ecr.us-east-1.amazonaws.com:443/v2/",
    "public.ecr.aws:443",
    "123456789012.dkr-ecr.us-east-1.on.aws:443",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com.",
    "public.ecr.aws.",
    "123456789012.DKR.ECR.US-EAST-1.AMAZONAWS.COM.EVIL.COM",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com%2eevil.com",
    "123456789012.dkr.ecr.us-east-1.amazonaws%2ecom",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com\u{3002}evil.com",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com@evil.com",
    "evil.com@123456789012.dkr.ecr.us-east-1.amazonaws.com",
    "https://evil.com@123456789012.dkr.ecr.us-east-1.amazonaws.com/v2/",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com\\@evil.com",
    // --- ECR: unicode confusables (Cyrillic а) and their punycode form
    "123456789012.dkr.ecr.us-east-1.amazon\u{0430}ws.com",
    "123456789012.dkr.ecr.us-east-1.xn--amazonws-66g.com",
    // --- ACR
    "myregistry.azurecr.io.evil.com",
    "myregistry.azurecr.de.evil.com",
    "evil.myregistry.azurecr.io",
    "myregistry.westeurope.data.azurecr.io",
    "my-registry.azurecr.io",
    "abcd.azurecr.io",
    "a23456789012345678901234567890123456789012345678901.azurecr.io",
    "myregistryazurecr.io",
    "myregistry.azurecr.iox",
    "myregistry.azurecr.com",
    "myregistry-azurecr.io",
    "azurecr.io",
    "myregistry.azurecr.io:443",
    "https://myregistry.azurecr.io:8443/v2/",
    "myregistry.azurecr.io.",
    "MYREGISTRY.AZURECR.IO.EVIL.COM",
    "https://myregistry.azurecr.io.evil.com/v2/",
    "myregistry.azurecr.io%2f",
    "myregistry.azurecr.io@evil.com",
    "myregistry.azurecr.\u{0131}o",
    "myregistry.azur\u{0435}cr.io",
    "myregistry.xn--azurcr-6of.io",
    "login.microsoftonline.com",
    "management.azure.com",
    // --- GCR / Artifact Registry
    "gcr.io.evil.com",
    "evilgcr.io",
    "a.b.gcr.io",
    "gcr.iox",
    "gcr.com",
    "gcr-io.evil.com",
    "gcr.io:443",
    "https://gcr.io:443/v2/",
    "gcr.io.",
    "GCR.IO.EVIL.COM",
    "g\u{0441}r.io",
    "xn--gr-omc.io",
    "gcr%2eio",
    "%67cr.io",
    "https://gcr.io%2eevil.com/v2/",
    "https://gcr.io@evil.com/v2/",
    "https://evil.com@gcr.io/v2/",
    "gcr.io\\evil.com",
    "gcr.io\u{200b}",
    "gcr.io\0evil.com",
    "\tgcr.io",
    "europe-west1-docker.pkg.dev.evil.com",
    "x.europe-west1-docker.pkg.dev",
    "europe-west1-docker.pkg.dev:443",
    "europe-west1-docker.pkg.dev.",
    "europe-west1.pkg.dev",
    "europe-west-docker.pkg.dev",
    "europe-west01-docker.pkg.dev",
    "europe-west1-docker-pkg.dev",
    "docker.pkg.dev",
    "pkg.dev",
    "docker.s3nsregistry.fr.evil.com",
    "docker.s3nsregistry.fr:443",
    "metadata.google.internal",
    "oauth2.googleapis.com",
    // --- scheme tricks
    "ftp://gcr.io",
    "file://gcr.io/etc/passwd",
    "gcr.io://evil.com",
    "https:gcr.io",
    "//gcr.io",
    "https:///gcr.io",
    // --- Docker Hub and its aliases (no cloud serves Docker Hub)
    "docker.io",
    "index.docker.io",
    "registry-1.docker.io",
    "https://index.docker.io/v1/",
    "library/nginx",
    "docker.io:443",
    "docker.io.evil.com",
    "xn--dcker-jye.io",
    // --- IP literals and local names, including cloud metadata endpoints
    "localhost",
    "localhost:5000",
    "127.0.0.1",
    "[::1]:5000",
    "169.254.169.254",
    "169.254.170.2",
    "[fd00:ec2::254]",
    "[::ffff:169.254.169.254]",
    "52.94.0.1",
    "2130706433",
    "0x7f.0.0.1",
];

#[tokio::test]
async fn no_cloud_credential_for_a_hostile_host() {
    let (broker, _dir) = broker("", None);
    assert!(HOSTILE.len() >= 80, "{} cases", HOSTILE.len());
    let (mut rejected, mut decided) = (0, 0);
    for input in HOSTILE {
        let registry = match Registry::parse(input) {
            Err(e) => {
                // Rejected before anything is decided; the message names no secret.
                assert!(!e.to_string().contains("evil.com@"), "{input:?}: {e}");
                rejected += 1;
                continue;
            }
            Ok(r) => r,
        };
        assert_eq!(
            recognisers(&registry),
            Vec::<&str>::new(),
            "{input:?} (as {registry}) is recognised by a provider"
        );
        let decision = broker.decide(&registry);
        assert_eq!(decision.reason, Reason::NoMatch, "{input:?}");
        assert!(
            matches!(decision.route, Route::NotConfigured(_)),
            "{input:?} (as {registry}) routed to {:?}",
            decision.route
        );
        match broker.credential(&registry).await {
            Err(BrokerError::NotConfigured(_)) => {}
            other => panic!("{input:?}: {other:?}"),
        }
        decided += 1;
    }
    // Both halves of the suite are exercised.
    assert!(
        rejected >= 20 && decided >= 40,
        "{rejected} rejected, {decided} decided"
    );
}

/// Image references that put a cloud host where docker does not read a registry, or a
/// lookalike where it does. The kubelet's `image`, a `[[secret]]`'s `registries` and
/// `resolve` read these with the reference grammar.
const HOSTILE_IMAGES: &[&str] = &[
    "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.com/x",
    "evil.com/123456789012.dkr.ecr.us-east-1.amazonaws.com/x",
    "evil.com:5000/123456789012.dkr.ecr.us-east-1.amazonaws.com:1",
    "docker.io/123456789012.dkr.ecr.us-east-1.amazonaws.com/x",
    "library/123456789012.dkr.ecr.us-east-1.amazonaws.com",
    // No `/` after it: a Docker Hub repository named like a cloud host.
    "123456789012.dkr.ecr.us-east-1.amazonaws.com:latest",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "myregistry.azurecr.io:v1",
    "gcr.io:latest",
    "europe-west1-docker.pkg.dev:1.0",
    "oci://evil.com/gcr.io/x",
    "public.ecr.aws.evil.com/x",
    "myregistry.azurecr.io.evil.com/x:1",
    "gcr.io.evil.com/p/app",
    // Userinfo, trailing dots, confusables and stray characters before the `/`.
    "u:p@gcr.io/x",
    "gcr.io@evil.com/x",
    "evil.com@gcr.io/x",
    "gcr.io./x",
    "gcr.io\u{200b}/x",
    "g\u{0441}r.io/x",
    "gcr.io%2eevil.com/x",
    "gcr.io\\evil.com/x",
    " gcr.io/x",
    "gcr.io/x\n",
];

#[tokio::test]
async fn no_cloud_credential_for_a_hostile_image_reference() {
    let (broker, _dir) = broker("", None);
    type Read = fn(&str) -> Result<Registry, regbroker_provider::ReferenceError>;
    let readings: [(&str, Read); 2] = [
        ("image", Registry::from_image_reference),
        ("either", Registry::from_registry_or_image),
    ];
    let (mut rejected, mut decided) = (0, 0);
    for (reading, read) in readings {
        for input in HOSTILE.iter().chain(HOSTILE_IMAGES) {
            let registry = match read(input) {
                Err(e) => {
                    assert!(!e.to_string().contains("evil.com@"), "{input:?}: {e}");
                    rejected += 1;
                    continue;
                }
                Ok(r) => r,
            };
            assert_eq!(
                recognisers(&registry),
                Vec::<&str>::new(),
                "{input:?} (read as {reading}, as {registry}) is recognised by a provider"
            );
            match broker.credential(&registry).await {
                Err(BrokerError::NotConfigured(_)) => {}
                other => panic!("{input:?} (read as {reading}): {other:?}"),
            }
            decided += 1;
        }
    }
    assert!(
        rejected >= 40 && decided >= 80,
        "{rejected} rejected, {decided} decided"
    );
    // The registry reading takes `?` and `#` as the end of a URL's host (so these name
    // gcr.io itself, as a URL parser would); an image reference has no query or
    // fragment, so the image reading refuses them.
    for input in ["gcr.io#.evil.com/x", "gcr.io?.evil.com/x", "gcr.io/x#y"] {
        assert!(
            Registry::from_image_reference(input).is_err(),
            "{input:?} must be refused as an image"
        );
    }
}

#[test]
fn real_cloud_images_are_recognised_by_exactly_their_provider() {
    for (input, provider) in [
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1", "aws"),
        ("public.ecr.aws/nginx/nginx:latest", "aws"),
        (
            "myregistry.azurecr.io/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "azure",
        ),
        ("europe-west1-docker.pkg.dev/p/r/app:1", "gcp"),
        ("oci://gcr.io/my-project/charts/app", "gcp"),
    ] {
        let registry = Registry::from_image_reference(input).unwrap();
        assert_eq!(recognisers(&registry), [provider], "{input:?}");
        assert_eq!(
            Registry::from_registry_or_image(input).as_ref(),
            Ok(&registry)
        );
    }
}

#[test]
fn specific_rejections_hold() {
    // Inputs whose safety depends on the parser rejecting them: if one of these ever
    // parsed, the host it parsed to might be one a provider recognises.
    for input in [
        "123456789012.dkr.ecr.us-east-1.amazonaws.com.",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com@evil.com",
        "evil.com@123456789012.dkr.ecr.us-east-1.amazonaws.com",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com\u{3002}evil.com",
        "123456789012.dkr.ecr.us-east-1.amazon\u{0430}ws.com",
        "myregistry.azurecr.io.",
        "myregistry.azurecr.\u{0131}o",
        "gcr.io.",
        "g\u{0441}r.io",
        "https://evil.com@gcr.io/v2/",
        "https://gcr.io@evil.com/v2/",
        "gcr.io\u{200b}",
        "gcr.io\\evil.com",
        "ftp://gcr.io",
        "gcr%2eio",
    ] {
        assert!(
            Registry::parse(input).is_err(),
            "{input:?} must be rejected"
        );
    }
}

/// Real registry hosts and the one provider that must recognise each.
const RECOGNISED: &[(&str, &str)] = &[
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com", "aws"),
    (
        "https://123456789012.DKR.ECR.eu-west-1.amazonaws.com/v2/",
        "aws",
    ),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1", "aws"),
    (
        "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com",
        "aws",
    ),
    ("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn", "aws"),
    ("123456789012.dkr-ecr.us-east-1.on.aws", "aws"),
    ("public.ecr.aws", "aws"),
    ("myregistry.azurecr.io", "azure"),
    ("HTTPS://MYREGISTRY.AZURECR.IO/v2/", "azure"),
    ("myregistry.azurecr.cn", "azure"),
    ("myregistry.azurecr.us", "azure"),
    ("gcr.io", "gcp"),
    ("us.gcr.io", "gcp"),
    ("gcr.io/my-project/app:1.0", "gcp"),
    ("europe-west1-docker.pkg.dev", "gcp"),
    ("us-docker.pkg.dev", "gcp"),
    ("docker.s3nsregistry.fr", "gcp"),
];

#[test]
fn real_cloud_registries_are_recognised_by_exactly_their_provider() {
    let (broker, _dir) = broker("", None);
    for (input, provider) in RECOGNISED {
        let registry = Registry::parse(input).unwrap();
        assert_eq!(recognisers(&registry), [*provider], "{input:?}");
        let decision = broker.decide(&registry);
        assert_eq!(decision.reason, Reason::AutoDetected, "{input:?}");
        match decision.route {
            Route::Provider(p, target) => {
                assert_eq!(p.name(), *provider, "{input:?}");
                assert_eq!(target.registry(), &registry);
            }
            other => panic!("{input:?}: {other:?}"),
        }
    }
}

const RULES: &str = r#"
[[rule]]
match = "*.mirror.example.com"
source = "gcp"

[[rule]]
match = "ecr-proxy.example.com"
source = "aws"
options = { region = "eu-west-1", account = "123456789012" }

[[rule]]
match = "*.azurecr.io"
source = "none"
"#;

#[tokio::test]
async fn explicit_rules_route_exactly_their_hosts() {
    let (broker, _dir) = broker(RULES, None);
    // Positive controls: the rules do route.
    for (input, provider) in [
        ("eu.mirror.example.com", "gcp"),
        ("https://EU.Mirror.Example.com/v2/", "gcp"),
        ("ecr-proxy.example.com", "aws"),
    ] {
        let registry = Registry::parse(input).unwrap();
        match broker.decide(&registry).route {
            Route::Provider(p, _) => assert_eq!(p.name(), provider, "{input:?}"),
            other => panic!("{input:?}: {other:?}"),
        }
    }
    // Lookalikes of the routed names reach nobody.
    for input in [
        "mirror.example.com",
        "a.b.mirror.example.com",
        "eu.mirror.example.com.evil.com",
        "eu.mirror.example.com:443",
        "eumirror.example.com",
        "eu-mirror.example.com",
        "ecr-proxy.example.com:443",
        "ecr-proxy.example.com.evil.com",
        "x.ecr-proxy.example.com",
        "ecr-proxy.example.co",
    ] {
        let registry = Registry::parse(input).unwrap();
        let decision = broker.decide(&registry);
        assert!(
            matches!(decision.route, Route::NotConfigured(_)),
            "{input:?}: {:?}",
            decision.route
        );
        assert!(matches!(
            broker.credential(&registry).await,
            Err(BrokerError::NotConfigured(_))
        ));
    }
    // A `none` rule beats auto-detection: the ACR host gets no cloud credential.
    let acr = Registry::parse("myregistry.azurecr.io").unwrap();
    assert!(matches!(broker.decide(&acr).route, Route::NotConfigured(_)));
}

const STATIC: &str = r#"{"auths": {
    "https://static.example.com/v2/": {"username": "u1", "password": "pw-static"},
    "withport.example.com:443": {"username": "u2", "password": "pw-withport"},
    "UPPER.Example.COM": {"username": "u3", "password": "pw-upper"}
}}"#;

#[tokio::test]
async fn static_secrets_apply_only_to_their_exact_normalised_host() {
    let (broker, _dir) = broker("", Some(STATIC));
    // Same normalised host: served from the static entry.
    for (input, secret) in [
        ("static.example.com", "pw-static"),
        ("STATIC.example.COM", "pw-static"),
        ("https://static.example.com/v2/", "pw-static"),
        ("http://static.example.com", "pw-static"),
        ("static.example.com/team/app:1", "pw-static"),
        ("withport.example.com:443", "pw-withport"),
        ("https://withport.example.com:443/v2/", "pw-withport"),
        ("upper.example.com", "pw-upper"),
    ] {
        let registry = Registry::parse(input).unwrap();
        let served = broker.credential(&registry).await.unwrap();
        assert_eq!(served.source, "static", "{input:?}");
        assert_eq!(
            served.credential.secret().expose_secret(),
            secret,
            "{input:?}"
        );
    }
    // Anything else: not this entry, and nothing else either.
    for input in [
        "static.example.com:443",
        "static.example.com:5000",
        "https://static.example.com:443/v2/",
        "withport.example.com",
        "https://withport.example.com/v2/",
        "withport.example.com:8443",
        "x.static.example.com",
        "static.example.com.evil.com",
        "staticexample.com",
        "static.example.co",
        "upper.example.com:443",
    ] {
        let registry = Registry::parse(input).unwrap();
        match broker.credential(&registry).await {
            Err(BrokerError::NotConfigured(_)) => {}
            other => panic!("{input:?} must not be served: {other:?}"),
        }
    }
    for input in [
        "static.example.com.",
        "u:p@static.example.com",
        "static.example.com%2e",
    ] {
        assert!(Registry::parse(input).is_err(), "{input:?}");
    }
}
