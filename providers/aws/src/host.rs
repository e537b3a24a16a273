//! ECR host recognition: strict, anchored patterns only.
//!
//! Reads no env var and no setting: the region and account come from the host alone.
//!
//! Accepted shapes (a host with any port is never recognised):
//! - private ECR: `<12-digit account>.dkr.ecr[-fips].<region>.<suffix>` with suffix one of
//!   [`PRIVATE_SUFFIXES`];
//! - dual-stack private ECR: `<12-digit account>.dkr-ecr[-fips].<region>.on.aws`, or
//!   `...on.amazonwebservices.com.cn` in China;
//! - ECR Public: exactly `public.ecr.aws`.
//!
//! The input is a parsed `Registry`, so the host is already lower case and every label is
//! valid DNS; everything else is checked here, label by label, from both ends.

/// DNS suffixes of private ECR registries, one per partition.
pub const PRIVATE_SUFFIXES: &[&str] = &[
    "amazonaws.com",
    "amazonaws.com.cn",
    "amazonaws.eu",
    "sc2s.sgov.gov",
    "c2s.ic.gov",
    "cloud.adc-e.uk",
    "csp.hci.ic.gov",
];

/// DNS suffixes of dual-stack private ECR registries.
pub const DUAL_STACK_SUFFIXES: &[&str] = &["on.aws", "on.amazonwebservices.com.cn"];

/// The one ECR Public host.
pub const PUBLIC_HOST: &str = "public.ecr.aws";

/// What an ECR host names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EcrHost {
    /// A private registry of `account` in `region`.
    Private {
        /// The 12-digit AWS account id.
        account: String,
        /// The region, e.g. `us-east-1`.
        region: String,
        /// Whether the host is a FIPS endpoint (`dkr.ecr-fips`, `dkr-ecr-fips`).
        fips: bool,
    },
    /// ECR Public (`public.ecr.aws`).
    Public,
}

/// Recognises an ECR host. `port` must be `None`: ECR never listens on an explicit port,
/// so `host:port` is somebody else's server.
pub fn parse(host: &str, port: Option<u16>) -> Option<EcrHost> {
    if port.is_some() {
        return None;
    }
    if host == PUBLIC_HOST {
        return Some(EcrHost::Public);
    }
    // Most hosts asked for are not ECR's: look at the account label before collecting
    // the labels (every request for another registry passes here in auto-detection).
    if !host.split('.').next().is_some_and(is_account) {
        return None;
    }
    let labels: Vec<&str> = host.split('.').collect();
    // Shortest private host: account.dkr.ecr.region.<2-label suffix> = 6 labels;
    // shortest dual-stack host: account.dkr-ecr.region.on.aws = 5 labels.
    let account = *labels.first()?;
    let rest = &labels[1..];
    // Private: dkr . ecr[-fips] . region . suffix
    if let ["dkr", ecr, region, suffix @ ..] = rest {
        let fips = match *ecr {
            "ecr" => false,
            "ecr-fips" => true,
            _ => return None,
        };
        if is_region(region) && suffix_is(suffix, PRIVATE_SUFFIXES) {
            return Some(EcrHost::Private {
                account: account.to_string(),
                region: region.to_string(),
                fips,
            });
        }
        return None;
    }
    // Dual-stack: dkr-ecr[-fips] . region . suffix
    if let [dkr_ecr, region, suffix @ ..] = rest {
        let fips = match *dkr_ecr {
            "dkr-ecr" => false,
            "dkr-ecr-fips" => true,
            _ => return None,
        };
        if is_region(region) && suffix_is(suffix, DUAL_STACK_SUFFIXES) {
            return Some(EcrHost::Private {
                account: account.to_string(),
                region: region.to_string(),
                fips,
            });
        }
    }
    None
}

/// Whether the remaining labels are exactly one of `suffixes` (no extra label either side).
fn suffix_is(labels: &[&str], suffixes: &[&str]) -> bool {
    !labels.is_empty()
        && suffixes
            .iter()
            .any(|s| s.split('.').eq(labels.iter().copied()))
}

/// A 12-digit AWS account id.
pub fn is_account(s: &str) -> bool {
    s.len() == 12 && s.bytes().all(|b| b.is_ascii_digit())
}

/// An AWS region name: `us-east-1`, `us-gov-west-1`, `cn-north-1`, `eu-isoe-west-1`,
/// `eusc-de-east-1`. Lower-case words joined by hyphens, the first a 2-4 letter area, at
/// least one more word, and a final 1-2 digit number.
pub fn is_region(s: &str) -> bool {
    if s.is_empty() || s.len() > 32 {
        return false;
    }
    let parts: Vec<&str> = s.split('-').collect();
    let [area, words @ .., number] = parts.as_slice() else {
        return false;
    };
    let word = |w: &str, min: usize, max: usize| {
        (min..=max).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase())
    };
    word(area, 2, 4)
        && !words.is_empty()
        && words.iter().all(|w| word(w, 1, 16))
        && (1..=2).contains(&number.len())
        && number.bytes().all(|b| b.is_ascii_digit())
        && !number.starts_with('0')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use regbroker_provider::Registry;

    fn recognise(input: &str) -> Option<EcrHost> {
        let r = Registry::parse(input).ok()?;
        parse(r.host(), r.port())
    }

    fn private(account: &str, region: &str, fips: bool) -> Option<EcrHost> {
        Some(EcrHost::Private {
            account: account.into(),
            region: region.into(),
            fips,
        })
    }

    #[test]
    fn every_private_suffix_is_recognised() {
        let cases = [
            ("123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1"),
            (
                "123456789012.dkr.ecr.us-gov-west-1.amazonaws.com",
                "us-gov-west-1",
            ),
            (
                "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn",
                "cn-north-1",
            ),
            (
                "123456789012.dkr.ecr.eusc-de-east-1.amazonaws.eu",
                "eusc-de-east-1",
            ),
            (
                "123456789012.dkr.ecr.us-isob-east-1.sc2s.sgov.gov",
                "us-isob-east-1",
            ),
            (
                "123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov",
                "us-iso-east-1",
            ),
            (
                "123456789012.dkr.ecr.eu-isoe-west-1.cloud.adc-e.uk",
                "eu-isoe-west-1",
            ),
            (
                "123456789012.dkr.ecr.us-isof-south-1.csp.hci.ic.gov",
                "us-isof-south-1",
            ),
        ];
        for (host, region) in cases {
            assert_eq!(
                recognise(host),
                private("123456789012", region, false),
                "{host}"
            );
        }
        // Every suffix in the table has a positive example above.
        for suffix in PRIVATE_SUFFIXES {
            assert!(
                cases
                    .iter()
                    .any(|(h, r)| h.ends_with(&format!(".{r}.{suffix}"))),
                "{suffix}"
            );
        }
    }

    #[test]
    fn fips_dual_stack_and_public_hosts_are_recognised() {
        let cases = [
            (
                "000000000000.dkr.ecr-fips.us-east-1.amazonaws.com",
                private("000000000000", "us-east-1", true),
            ),
            (
                "210987654321.dkr.ecr-fips.us-gov-east-1.amazonaws.com",
                private("210987654321", "us-gov-east-1", true),
            ),
            (
                "123456789012.dkr-ecr.eu-west-1.on.aws",
                private("123456789012", "eu-west-1", false),
            ),
            (
                "123456789012.dkr-ecr-fips.us-west-2.on.aws",
                private("123456789012", "us-west-2", true),
            ),
            (
                "123456789012.dkr-ecr.cn-northwest-1.on.amazonwebservices.com.cn",
                private("123456789012", "cn-northwest-1", false),
            ),
            (
                "123456789012.dkr.ecr.ap-southeast-5.amazonaws.com",
                private("123456789012", "ap-southeast-5", false),
            ),
            (
                "123456789012.dkr.ecr.me-central-1.amazonaws.com",
                private("123456789012", "me-central-1", false),
            ),
            (
                "https://123456789012.DKR.ECR.US-EAST-1.AMAZONAWS.COM/v2/",
                private("123456789012", "us-east-1", false),
            ),
            (
                "123456789012.dkr.ecr.eu-central-1.amazonaws.com/team/app:1.0",
                private("123456789012", "eu-central-1", false),
            ),
            ("public.ecr.aws", Some(EcrHost::Public)),
            ("https://public.ecr.aws/v2/", Some(EcrHost::Public)),
            ("public.ecr.aws/nginx/nginx:latest", Some(EcrHost::Public)),
        ];
        for (host, want) in cases {
            assert_eq!(recognise(host), want, "{host}");
        }
    }

    #[test]
    fn hosts_that_only_resemble_ecr_are_not_recognised() {
        let hostile = [
            // Extra labels after the suffix.
            "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.com",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com.cn.evil.com",
            "123456789012.dkr-ecr.us-east-1.on.aws.evil.com",
            "public.ecr.aws.evil.com",
            // A prefix before the account.
            "evil.123456789012.dkr.ecr.us-east-1.amazonaws.com",
            "x123456789012.dkr.ecr.us-east-1.amazonaws.com",
            "a.public.ecr.aws",
            "evilpublic.ecr.aws",
            // Wrong digit count / non-digits in the account.
            "12345678901.dkr.ecr.us-east-1.amazonaws.com",
            "1234567890123.dkr.ecr.us-east-1.amazonaws.com",
            "12345678901a.dkr.ecr.us-east-1.amazonaws.com",
            "dkr.ecr.us-east-1.amazonaws.com",
            // Suffix lookalikes.
            "123456789012.dkr.ecr.us-east-1.amazonaws.co",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com-evil.com",
            "123456789012.dkr.ecr.us-east-1.amazonaws-com.evil",
            "123456789012.dkr.ecr.us-east-1.evilamazonaws.com",
            "123456789012.dkr.ecr.us-east-1.amazonaws.cn",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com.c",
            "123456789012.dkr.ecr.us-east-1.ic.gov",
            "123456789012.dkr.ecr.us-east-1.adc-e.uk",
            "123456789012.dkr.ecr.us-east-1.on.aws",
            "123456789012.dkr-ecr.us-east-1.amazonaws.com",
            "123456789012.dkr-ecr.us-east-1.on.amazonwebservices.com",
            "123456789012.dkr-ecr.us-east-1.aws",
            "public.ecr.aws.com",
            "public-ecr.aws",
            "public.ecr.amazonaws.com",
            // A port on any ECR host.
            "123456789012.dkr.ecr.us-east-1.amazonaws.com:443",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com:5000",
            "123456789012.dkr-ecr.us-east-1.on.aws:443",
            "public.ecr.aws:443",
            // `dkr.ecr` spelled differently.
            "123456789012.dkr.ecrx.us-east-1.amazonaws.com",
            "123456789012.dkr-ecr.us-east-1.amazonaws.com.cn",
            "123456789012.dkrecr.us-east-1.amazonaws.com",
            "123456789012.docker.ecr.us-east-1.amazonaws.com",
            "123456789012.ecr.dkr.us-east-1.amazonaws.com",
            "123456789012.dkr.ecr-fip.us-east-1.amazonaws.com",
            "123456789012.dkr.fips-ecr.us-east-1.amazonaws.com",
            "123456789012.dkr.ecr.fips.us-east-1.amazonaws.com",
            "123456789012.dkr-ecr-fipsx.us-east-1.on.aws",
            "123456789012.api.ecr.us-east-1.amazonaws.com",
            "api.ecr.us-east-1.amazonaws.com",
            "ecr.us-east-1.amazonaws.com",
            // Empty or malformed region.
            "123456789012.dkr.ecr.amazonaws.com",
            "123456789012.dkr-ecr.on.aws",
            "123456789012.dkr.ecr.us.amazonaws.com",
            "123456789012.dkr.ecr.useast1.amazonaws.com",
            "123456789012.dkr.ecr.us-east.amazonaws.com",
            "123456789012.dkr.ecr.us-east-01.amazonaws.com",
            "123456789012.dkr.ecr.us-east-123.amazonaws.com",
            "123456789012.dkr.ecr.u-east-1.amazonaws.com",
            "123456789012.dkr.ecr.usxyz-east-1.amazonaws.com",
            "123456789012.dkr.ecr.us-east1-1.amazonaws.com",
            "123456789012.dkr.ecr.1-east-1.amazonaws.com",
            "123456789012.dkr.ecr.us-east-1.us-west-2.amazonaws.com",
            "123456789012.dkr.ecr.evil.com.amazonaws.com",
            // Not even close, but must not panic.
            "localhost",
            "127.0.0.1",
            "[::1]",
            "docker.io",
            "aws",
        ];
        assert!(hostile.len() >= 30);
        for input in hostile {
            let r = Registry::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(
                parse(r.host(), r.port()),
                None,
                "{input} must not be recognised"
            );
        }
    }

    #[test]
    fn region_shapes() {
        for ok in [
            "us-east-1",
            "us-gov-west-1",
            "cn-north-1",
            "eu-isoe-west-1",
            "us-isob-east-1",
            "eusc-de-east-1",
            "ap-southeast-10",
        ] {
            assert!(is_region(ok), "{ok}");
        }
        for bad in [
            "",
            "us",
            "us-east",
            "us-east-",
            "-us-east-1",
            "us--east-1",
            "US-EAST-1",
            "us-east-0",
            "us-east-01",
            "us_east_1",
            "us-east-1a",
            "us-east-1.",
            "us-3ast-1",
            "us-east-1 ",
            "a-east-1",
            "abcde-east-1",
        ] {
            assert!(!is_region(bad), "{bad:?}");
        }
    }

    #[test]
    fn account_shapes() {
        assert!(is_account("000000000000"));
        for bad in [
            "",
            "12345678901",
            "1234567890123",
            "12345678901a",
            "１２３４５６７８９０１２",
        ] {
            assert!(!is_account(bad), "{bad}");
        }
    }

    #[test]
    fn a_region_name_may_be_32_characters_long_and_not_one_more() {
        let region = |len: usize| format!("us-{}-{}-1", "a".repeat(16), "b".repeat(len - 22));
        assert_eq!(region(32).len(), 32);
        assert!(is_region(&region(32)));
        assert!(!is_region(&region(33)));
    }
}
