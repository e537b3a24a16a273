//! Which hosts are Google registries: strict, anchored patterns.
//!
//! Reads no env var and no setting. A host is recognised only when its labels match one
//! of these shapes exactly, with no port:
//!
//! - `gcr.io`
//! - `<x>.gcr.io`, `x` a single DNS label (`us`, `eu`, `asia`, `marketplace`, `staging-k8s`)
//! - `<location>-docker.pkg.dev`, `location` a multi-region (`us`, `europe`, `asia`) or a
//!   region (`europe-west1`, `us-central1`, `northamerica-northeast2`)
//! - `docker.s3nsregistry.fr` (Artifact Registry in Trusted Cloud by S3NS: another
//!   universe, see [`crate::universe`]; its hosts never share a token with Google's)
//!
//! Anything else, including every name that merely contains one of these (`gcr.io.evil.com`,
//! `x.europe-west1-docker.pkg.dev`, `gcr.io:443`), is not a Google registry: sending a
//! Google access token to it would hand the token to whoever runs that host.

use regbroker_provider::Registry;

/// The family a recognised host belongs to. Google's families share one credential; S3NS
/// is another universe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostKind {
    /// Container Registry: `gcr.io` and `<x>.gcr.io`.
    ContainerRegistry,
    /// Artifact Registry docker repositories: `<location>-docker.pkg.dev`.
    ArtifactRegistry,
    /// Artifact Registry in S3NS: `docker.s3nsregistry.fr`.
    S3ns,
}

impl HostKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HostKind::ContainerRegistry => "gcr",
            HostKind::ArtifactRegistry => "artifact-registry",
            HostKind::S3ns => "s3ns",
        }
    }

    /// The universe domain whose tokens this registry accepts.
    pub(crate) fn universe(self) -> &'static str {
        match self {
            HostKind::ContainerRegistry | HostKind::ArtifactRegistry => {
                crate::universe::DEFAULT_UNIVERSE
            }
            HostKind::S3ns => crate::universe::S3NS_UNIVERSE,
        }
    }
}

/// The universe a host belongs to by its domain, recognised or not: `*.s3nsregistry.fr`
/// is S3NS's, `gcr.io`, `*.gcr.io` and `*.pkg.dev` are Google's (an explicit rule may send
/// such a host, say `u-france-east1-docker.s3nsregistry.fr`, to the provider).
pub(crate) fn domain_universe(registry: &Registry) -> Option<&'static str> {
    if let Some(kind) = classify(registry) {
        return Some(kind.universe());
    }
    let host = registry.host();
    let under = |suffix: &str| host == suffix || host.ends_with(&format!(".{suffix}"));
    if under("s3nsregistry.fr") {
        Some(crate::universe::S3NS_UNIVERSE)
    } else if under("gcr.io") || under("pkg.dev") {
        Some(crate::universe::DEFAULT_UNIVERSE)
    } else {
        None
    }
}

/// The kind of Google registry `registry` is, or `None`.
pub(crate) fn classify(registry: &Registry) -> Option<HostKind> {
    if registry.port().is_some() {
        return None;
    }
    // At most three labels, kept on the stack: auto-detection asks about every host.
    // Registry::parse already guarantees lower-case LDH labels of 1-63 characters; check
    // again here so this function is safe on its own.
    let mut labels = [""; 3];
    let mut n = 0;
    for label in registry.labels() {
        if n == labels.len() || !is_dns_label(label) {
            return None;
        }
        labels[n] = label;
        n += 1;
    }
    match &labels[..n] {
        ["gcr", "io"] => Some(HostKind::ContainerRegistry),
        [_, "gcr", "io"] => Some(HostKind::ContainerRegistry),
        [first, "pkg", "dev"] => {
            let location = first.strip_suffix("-docker")?;
            is_location(location).then_some(HostKind::ArtifactRegistry)
        }
        ["docker", "s3nsregistry", "fr"] => Some(HostKind::S3ns),
        _ => None,
    }
}

/// A lower-case LDH label: 1-63 of `a-z0-9-`, no leading or trailing hyphen.
fn is_dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// An Artifact Registry location: a multi-region (`us`, `europe`, `asia`) or a region,
/// `<area>-<direction><number>` such as `europe-west1` or `northamerica-northeast2`.
fn is_location(location: &str) -> bool {
    if matches!(location, "us" | "europe" | "asia") {
        return true;
    }
    let Some((area, rest)) = location.split_once('-') else {
        return false;
    };
    let digits_at = rest
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (direction, number) = rest.split_at(digits_at);
    let letters = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase());
    letters(area)
        && letters(direction)
        && (1..=2).contains(&number.len())
        && number.bytes().all(|b| b.is_ascii_digit())
        && !number.starts_with('0')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(host: &str) -> Option<HostKind> {
        let registry = Registry::parse(host).unwrap_or_else(|e| panic!("{host:?}: {e}"));
        classify(&registry)
    }

    #[test]
    fn google_registries_are_recognised() {
        let cases = [
            ("gcr.io", HostKind::ContainerRegistry),
            ("us.gcr.io", HostKind::ContainerRegistry),
            ("eu.gcr.io", HostKind::ContainerRegistry),
            ("asia.gcr.io", HostKind::ContainerRegistry),
            ("marketplace.gcr.io", HostKind::ContainerRegistry),
            ("staging-k8s.gcr.io", HostKind::ContainerRegistry),
            ("GCR.IO", HostKind::ContainerRegistry),
            ("https://gcr.io/v2/", HostKind::ContainerRegistry),
            ("gcr.io/my-project/app:1.0", HostKind::ContainerRegistry),
            ("europe-west1-docker.pkg.dev", HostKind::ArtifactRegistry),
            ("us-central1-docker.pkg.dev", HostKind::ArtifactRegistry),
            (
                "northamerica-northeast2-docker.pkg.dev",
                HostKind::ArtifactRegistry,
            ),
            ("europe-west12-docker.pkg.dev", HostKind::ArtifactRegistry),
            ("us-docker.pkg.dev", HostKind::ArtifactRegistry),
            ("europe-docker.pkg.dev", HostKind::ArtifactRegistry),
            ("asia-docker.pkg.dev", HostKind::ArtifactRegistry),
            (
                "oci://europe-west1-docker.pkg.dev/proj/charts/podinfo",
                HostKind::ArtifactRegistry,
            ),
            ("docker.s3nsregistry.fr", HostKind::S3ns),
        ];
        for (host, want) in cases {
            assert_eq!(kind(host), Some(want), "{host}");
        }
    }

    #[test]
    fn lookalikes_are_not_recognised() {
        let hostile = [
            // Suffix and prefix tricks around gcr.io.
            "gcr.io.evil.com",
            "evilgcr.io",
            "gcr-io.evil.com",
            "a.b.gcr.io",
            "us.gcr.io.evil.com",
            "gcr.com",
            "gcr.io.",
            "gcr.iox",
            "xgcr.io",
            "gcr.evil.io",
            // Ports: a port is a different registry, never auto-detected.
            "gcr.io:443",
            "us.gcr.io:5000",
            "europe-west1-docker.pkg.dev:443",
            "docker.s3nsregistry.fr:443",
            // Artifact Registry lookalikes.
            "europe-west1-docker.pkg.dev.evil.com",
            "europe-west1-docker.pkg.devx",
            "docker.pkg.dev",
            "-docker.pkg.dev",
            "europe-west1-dockerpkg.dev",
            "x.europe-west1-docker.pkg.dev",
            "europe-west1-npm.pkg.dev",
            "europe-west1-python.pkg.dev",
            "europe-west1-maven.pkg.dev",
            "europe-west1-docker.pkg.evil",
            "europe-west1-docker.evil.dev",
            "europe-west1-docker-docker.pkg.dev",
            "evil-docker.pkg.dev",
            "europe-docker-docker.pkg.dev",
            "europe-west-docker.pkg.dev",
            "europe-west001-docker.pkg.dev",
            "europe-west1x-docker.pkg.dev",
            "europe--west1-docker.pkg.dev",
            "eu-rope-west1-docker.pkg.dev",
            "1-docker.pkg.dev",
            "pkg.dev",
            "evil.com/europe-west1-docker.pkg.dev",
            // S3NS lookalikes.
            "docker.s3nsregistry.fr.evil.com",
            "x.docker.s3nsregistry.fr",
            "s3nsregistry.fr",
            "evil.s3nsregistry.fr",
            "docker.s3nsregistry.frx",
            // Not Google at all, but shaped like hosts the broker sees.
            "docker.io",
            "localhost:5000",
            "127.0.0.1",
            "[::1]:5000",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com",
        ];
        assert!(hostile.len() >= 20);
        for host in hostile {
            if let Ok(registry) = Registry::parse(host) {
                assert_eq!(classify(&registry), None, "{host} must not be recognised");
            }
        }
    }

    #[test]
    fn locations() {
        for ok in [
            "us",
            "europe",
            "asia",
            "europe-west1",
            "me-central2",
            "us-east4",
        ] {
            assert!(is_location(ok), "{ok}");
        }
        for bad in [
            "",
            "eu",
            "u",
            "us-",
            "-west1",
            "europe-west",
            "europe-west1a",
            "europe-west0",
            "europe-west123",
            "europe-1",
            "eu1-west1",
            "europe-west1-b",
            "europe_west1",
        ] {
            assert!(!is_location(bad), "{bad}");
        }
    }

    #[test]
    fn dns_labels_are_lower_case_ldh_of_1_to_63() {
        for ok in ["a", "a-b", "0", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", &"a".repeat(64), "A", "a_b", "a.b", "-a", "a-"] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn each_kind_has_its_own_label() {
        assert_eq!(HostKind::ContainerRegistry.as_str(), "gcr");
        assert_eq!(HostKind::ArtifactRegistry.as_str(), "artifact-registry");
        assert_ne!(HostKind::S3ns.as_str(), "");
        assert_ne!(HostKind::S3ns.as_str(), HostKind::ArtifactRegistry.as_str());
    }

    #[test]
    fn custom_hosts_under_google_domains_belong_to_googles_universe() {
        let universe = |host: &str| domain_universe(&Registry::parse(host).unwrap());
        // Not registries this provider recognises, but under its domains.
        assert_eq!(
            universe("mirror.pkg.dev"),
            Some(crate::universe::DEFAULT_UNIVERSE)
        );
        assert_eq!(universe("pkg.dev"), Some(crate::universe::DEFAULT_UNIVERSE));
        assert_eq!(
            universe("x.y.gcr.io"),
            Some(crate::universe::DEFAULT_UNIVERSE)
        );
        assert_eq!(universe("example.com"), None);
    }
}
