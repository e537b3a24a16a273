//! Universe domains: which Google-technology cloud an identity and a registry belong to.
//!
//! Reads no env var. Google's public cloud is the universe `googleapis.com`; a sovereign
//! cloud run by another operator on Google's technology (Trusted Cloud by S3NS, "Cloud de
//! Confiance", universe `s3nsapis.fr`) is another universe, with its own token services
//! (`oauth2.s3nsapis.fr`, `sts.s3nsapis.fr`), its own identities and its own registries
//! (`s3nsregistry.fr` instead of `pkg.dev`). A token minted in one universe must never be
//! sent to a registry of another: the other operator would receive it.
//!
//! An identity's universe is the `universe_domain` of its credentials file (default
//! `googleapis.com`, as Google's auth libraries read it) or, from the metadata server,
//! `GET /computeMetadata/v1/universe/universe-domain` (a 404 means `googleapis.com`).

use regbroker_provider::Error;

/// Google's public cloud.
pub const DEFAULT_UNIVERSE: &str = "googleapis.com";
/// Trusted Cloud by S3NS (Cloud de Confiance).
pub const S3NS_UNIVERSE: &str = "s3nsapis.fr";

/// `raw` as a universe domain: a lower-case DNS name of at least two labels.
pub(crate) fn parse(raw: &str) -> Option<String> {
    let u = raw.trim().to_ascii_lowercase();
    let labels: Vec<&str> = u.split('.').collect();
    let ok = u.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    ok.then_some(u)
}

/// Like [`parse`], for a setting named `what` (invalid configuration when wrong; the
/// value is not repeated).
pub(crate) fn checked(raw: &str, what: &str) -> Result<String, Error> {
    parse(raw).ok_or_else(|| {
        Error::invalid_config(format!(
            "{what} must be a universe domain such as {DEFAULT_UNIVERSE} or {S3NS_UNIVERSE}"
        ))
    })
}

/// `https://<service>.<universe><path>`: a universe's own endpoint for `service`.
pub(crate) fn endpoint(service: &str, universe: &str, path: &str) -> String {
    format!("https://{service}.{universe}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn universe_domains_are_dns_names() {
        assert_eq!(parse("googleapis.com").as_deref(), Some("googleapis.com"));
        assert_eq!(parse(" S3NSAPIS.fr\n").as_deref(), Some("s3nsapis.fr"));
        for bad in [
            "", "com", "a..b", "-a.b", "a.b/c", "évil.fr", "a.b:443", "a b.c",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn each_universe_has_its_own_token_endpoints() {
        assert_eq!(
            endpoint("oauth2", DEFAULT_UNIVERSE, "/token"),
            "https://oauth2.googleapis.com/token"
        );
        assert_eq!(
            endpoint("sts", S3NS_UNIVERSE, "/v1/token"),
            "https://sts.s3nsapis.fr/v1/token"
        );
    }
}
