//! Routing-rule options of the aws provider: `region`, `account`, `role_arn`.
//!
//! Reads no env var; the values come from a rule in the config file.

use regbroker_provider::{Options, check_known_options};

use crate::host::{is_account, is_region};

/// The option keys a rule may give.
pub const KNOWN: &[&str] = &["region", "account", "role_arn"];

/// A rule's options, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleOptions {
    /// `region`: the region whose ECR API serves the registry.
    pub region: Option<String>,
    /// `account`: the 12-digit account that owns the registry.
    pub account: Option<String>,
    /// `role_arn`: a role to assume (with STS AssumeRole) before the exchange.
    pub role_arn: Option<String>,
}

impl RuleOptions {
    /// Checks every key and value; the error names the bad key.
    pub fn parse(options: &Options) -> Result<RuleOptions, String> {
        check_known_options("aws", options, KNOWN)?;
        // A present value must pass `valid`; the error names the key and what it expects.
        let checked = |key: &str, valid: fn(&str) -> bool, expected: &str| match options.get(key) {
            Some(v) if !valid(v) => Err(format!(
                "option `{key}` of the aws provider {expected} (got `{}`)",
                shown(v)
            )),
            v => Ok(v.cloned()),
        };
        let region = checked("region", is_region, "is not a region name like `us-east-1`")?;
        let account = checked("account", is_account, "must be a 12-digit AWS account id")?;
        let role_arn = checked(
            "role_arn",
            is_role_arn,
            "must look like `arn:aws:iam::123456789012:role/NAME`",
        )?;
        Ok(RuleOptions {
            region,
            account,
            role_arn,
        })
    }
}

/// An IAM role ARN: `arn:<partition>:iam::<12 digits>:role/<path/name>`, where the
/// partition is `aws`, `aws-cn`, `aws-us-gov`, `aws-iso`, `aws-iso-b`, `aws-iso-e`,
/// `aws-iso-f` or `aws-eusc`, and the name uses IAM's characters (`\w+=,.@-` and `/`).
pub fn is_role_arn(s: &str) -> bool {
    const PARTITIONS: &[&str] = &[
        "aws",
        "aws-cn",
        "aws-us-gov",
        "aws-iso",
        "aws-iso-b",
        "aws-iso-e",
        "aws-iso-f",
        "aws-eusc",
    ];
    if s.len() > 2048 {
        return false;
    }
    let mut parts = s.splitn(6, ':');
    let (Some("arn"), Some(partition), Some("iam"), Some(""), Some(account), Some(resource)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let Some(name) = resource.strip_prefix("role/") else {
        return false;
    };
    PARTITIONS.contains(&partition)
        && is_account(account)
        && !name.is_empty()
        && !name.ends_with('/')
        && !name.starts_with('/')
        && !name.contains("//")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+=,.@-/".contains(&b))
}

/// A value for an error message: printable ASCII only, at most 80 characters.
fn shown(v: &str) -> String {
    let mut s: String = v
        .chars()
        .take(80)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    if v.chars().count() > 80 {
        s.push('…');
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_support::opts;

    #[test]
    fn good_options_are_accepted() {
        let o = RuleOptions::parse(&opts(&[
            ("region", "eu-west-1"),
            ("account", "123456789012"),
            (
                "role_arn",
                "arn:aws:iam::210987654321:role/path/to/ecr-puller",
            ),
        ]))
        .unwrap();
        assert_eq!(o.region.as_deref(), Some("eu-west-1"));
        assert_eq!(o.account.as_deref(), Some("123456789012"));
        assert_eq!(
            o.role_arn.as_deref(),
            Some("arn:aws:iam::210987654321:role/path/to/ecr-puller")
        );
        assert_eq!(
            RuleOptions::parse(&opts(&[])).unwrap(),
            RuleOptions::default()
        );
    }

    #[test]
    fn bad_options_are_rejected_naming_the_key() {
        let cases = [
            (("regoin", "eu-west-1"), "regoin"),
            (("Region", "eu-west-1"), "Region"),
            (("region", "EU-WEST-1"), "region"),
            (("region", ""), "region"),
            (("region", "eu-west"), "region"),
            (("account", "12345678901"), "account"),
            (("account", "1234567890123"), "account"),
            (("account", "abcdefghijkl"), "account"),
            (("role_arn", "ecr-puller"), "role_arn"),
            (
                ("role_arn", "arn:aws:iam::123456789012:user/bob"),
                "role_arn",
            ),
            (("role_arn", "arn:aws:iam::12345678901:role/x"), "role_arn"),
            (("role_arn", "arn:aws:sts::123456789012:role/x"), "role_arn"),
            (
                ("role_arn", "arn:evil:iam::123456789012:role/x"),
                "role_arn",
            ),
            (
                ("role_arn", "arn:aws:iam:us-east-1:123456789012:role/x"),
                "role_arn",
            ),
            (("role_arn", "arn:aws:iam::123456789012:role/"), "role_arn"),
            (
                ("role_arn", "arn:aws:iam::123456789012:role/a b"),
                "role_arn",
            ),
            (
                ("role_arn", "arn:aws:iam::123456789012:role/x:y"),
                "role_arn",
            ),
        ];
        for ((k, v), key) in cases {
            let err = RuleOptions::parse(&opts(&[(k, v)])).unwrap_err();
            assert!(err.contains(&format!("`{key}`")), "{k}={v}: {err}");
        }
    }

    #[test]
    fn role_arns_of_every_partition() {
        for p in [
            "aws",
            "aws-cn",
            "aws-us-gov",
            "aws-iso",
            "aws-iso-b",
            "aws-iso-e",
            "aws-iso-f",
        ] {
            let arn = format!("arn:{p}:iam::123456789012:role/service-role/puller.v2+x=y,z@w-1_");
            assert!(is_role_arn(&arn), "{arn}");
        }
    }

    #[test]
    fn error_values_are_bounded_and_printable() {
        let long = "x".repeat(500);
        let err = RuleOptions::parse(&opts(&[("region", &long)])).unwrap_err();
        assert!(err.len() < 200, "{err}");
        let err = RuleOptions::parse(&opts(&[("account", "12\n34")])).unwrap_err();
        assert!(!err.contains('\n'), "{err}");
    }
}
