//! A federated rule's options: which are known for each provider, which are required, and
//! what a valid value looks like. Every check names the option it refuses and never
//! echoes more than a short, printable part of a bad value.

use std::path::Path;

use regbroker_provider::{Options, printable};

use crate::Kind;

/// The audience of the OIDC token the registry's exchange wants (every provider).
pub(crate) const AUDIENCE: &str = "audience";
/// The projected token file read when the request carries no workload token.
pub(crate) const TOKEN_FILE: &str = "token_file";
/// The base URL of the exchange (Quay, Artifactory, Cloudsmith).
pub(crate) const URL: &str = "url";
/// Quay: the robot account, `<org>+<name>`.
pub(crate) const ROBOT: &str = "robot";
/// Artifactory: the OIDC integration's name.
pub(crate) const PROVIDER_NAME: &str = "provider_name";
/// Artifactory: the project of the identity mapping.
pub(crate) const PROJECT_KEY: &str = "project_key";
/// Artifactory: one identity mapping by name.
pub(crate) const IDENTITY_MAPPING_NAME: &str = "identity_mapping_name";
/// Cloudsmith: the organisation (workspace) slug.
pub(crate) const ORG: &str = "org";
/// Cloudsmith: the service account's slug.
pub(crate) const SERVICE: &str = "service";
/// The docker username served (Artifactory, Cloudsmith, pass-through).
pub(crate) const USERNAME: &str = "username";

/// Every option a provider knows, in the order error messages list them.
pub(crate) fn known(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Quay => &[AUDIENCE, TOKEN_FILE, ROBOT, URL],
        Kind::Artifactory => &[
            AUDIENCE,
            TOKEN_FILE,
            PROVIDER_NAME,
            URL,
            USERNAME,
            PROJECT_KEY,
            IDENTITY_MAPPING_NAME,
        ],
        Kind::Cloudsmith => &[AUDIENCE, TOKEN_FILE, ORG, SERVICE, URL, USERNAME],
        Kind::Oidc => &[AUDIENCE, TOKEN_FILE, USERNAME],
    }
}

/// The options a provider cannot do without.
fn required(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Quay => &[AUDIENCE, ROBOT],
        Kind::Artifactory => &[AUDIENCE, PROVIDER_NAME],
        Kind::Cloudsmith => &[AUDIENCE, ORG, SERVICE],
        Kind::Oidc => &[AUDIENCE],
    }
}

/// Checks a rule's options for `kind`: known keys, required keys, and each value.
pub(crate) fn check(kind: Kind, options: &Options) -> Result<(), String> {
    let name = kind.name();
    regbroker_provider::check_known_options(name, options, known(kind))?;
    if let Some(missing) = required(kind).iter().find(|k| !options.contains_key(**k)) {
        return Err(format!(
            "the {name} provider needs option `{missing}` ({})",
            describe(missing)
        ));
    }
    for (key, value) in options {
        check_value(key, value).map_err(|why| format!("option `{key}`: {why}"))?;
    }
    Ok(())
}

fn describe(key: &str) -> &'static str {
    match key {
        AUDIENCE => "the audience of the token the registry's exchange accepts",
        ROBOT => "the robot account, `<org>+<name>`, that trusts this cluster's issuer",
        PROVIDER_NAME => "the name of the OIDC integration in the JFrog Platform",
        ORG => "the Cloudsmith organisation slug",
        SERVICE => "the slug of the Cloudsmith service account that trusts this cluster's issuer",
        _ => "see the providers page",
    }
}

fn check_value(key: &str, value: &str) -> Result<(), String> {
    let shown = || printable(value, 64);
    match key {
        TOKEN_FILE => {
            if !Path::new(value).is_absolute() {
                return Err(format!("`{}` is not an absolute path", shown()));
            }
            Ok(())
        }
        URL => base_url(value).map(|_| ()),
        ROBOT => {
            let ok = value
                .split_once('+')
                .is_some_and(|(org, name)| is_slug(org, b"_-.") && is_slug(name, b"_"));
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "`{}` is not a Quay robot account name (`<org>+<name>`: lower-case letters, digits and `_`)",
                    shown()
                ))
            }
        }
        ORG | SERVICE => {
            if is_slug(value, b"-_") {
                Ok(())
            } else {
                Err(format!(
                    "`{}` is not a Cloudsmith slug (lower-case letters, digits, `-` and `_`)",
                    shown()
                ))
            }
        }
        USERNAME => {
            if value.is_empty() || value.len() > 256 || value.contains(':') || !graphic(value) {
                Err(format!(
                    "`{}` is not a docker username (1 to 256 printable characters, no `:` and no spaces)",
                    shown()
                ))
            } else {
                Ok(())
            }
        }
        // audience, provider_name, project_key, identity_mapping_name: free text the
        // vendor names, sent as a JSON string or compared with a claim.
        _ => {
            if value.is_empty() || value.len() > 512 || !graphic(value) {
                Err(format!(
                    "`{}` must be 1 to 512 printable characters without spaces",
                    shown()
                ))
            } else {
                Ok(())
            }
        }
    }
}

fn graphic(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

fn is_slug(s: &str, extra: &[u8]) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b))
}

/// An exchange's base URL: `https://`, or `http://` to a loopback address only (a test
/// or a node-local proxy; a token never crosses a network in the clear); no userinfo,
/// query or fragment. Returned without a trailing `/`.
pub(crate) fn base_url(value: &str) -> Result<String, String> {
    let shown = printable(value, 96);
    let url = url::Url::parse(value).map_err(|e| format!("`{shown}` is not a URL ({e})"))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "`{shown}` is plain HTTP to a host that is not loopback: the token would cross the network in the clear (use https)"
            ));
        }
        other => return Err(format!("`{shown}`: scheme `{other}` is not https")),
    }
    if url.host().is_none() {
        return Err(format!("`{shown}` has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "`{shown}` has userinfo: put no credential in a URL"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("`{shown}` has a query or fragment"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> Options {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_provider_needs_its_options_and_names_the_missing_one() {
        for (kind, given, missing) in [
            (Kind::Quay, vec![(AUDIENCE, "quay")], "robot"),
            (Kind::Quay, vec![(ROBOT, "acme+puller")], "audience"),
            (
                Kind::Artifactory,
                vec![(AUDIENCE, "jfrog")],
                "provider_name",
            ),
            (
                Kind::Cloudsmith,
                vec![(AUDIENCE, "cs"), (ORG, "acme")],
                "service",
            ),
            (Kind::Oidc, vec![(USERNAME, "puller")], "audience"),
        ] {
            let e = check(kind, &options(&given)).unwrap_err();
            assert!(e.contains(&format!("needs option `{missing}`")), "{e}");
        }
        assert!(check(Kind::Oidc, &options(&[(AUDIENCE, "zot")])).is_ok());
        let e = check(
            Kind::Oidc,
            &options(&[(AUDIENCE, "zot"), (ROBOT, "acme+puller")]),
        )
        .unwrap_err();
        assert!(e.contains("unknown option `robot`"), "{e}");
    }

    #[test]
    fn a_missing_option_is_explained() {
        for (kind, given, explained) in [
            (
                Kind::Quay,
                vec![(ROBOT, "acme+puller")],
                "(the audience of the token the registry's exchange accepts)",
            ),
            (
                Kind::Quay,
                vec![(AUDIENCE, "q")],
                "(the robot account, `<org>+<name>`, that trusts this cluster's issuer)",
            ),
            (
                Kind::Artifactory,
                vec![(AUDIENCE, "j")],
                "(the name of the OIDC integration in the JFrog Platform)",
            ),
            (
                Kind::Cloudsmith,
                vec![(AUDIENCE, "c"), (SERVICE, "s")],
                "(the Cloudsmith organisation slug)",
            ),
            (
                Kind::Cloudsmith,
                vec![(AUDIENCE, "c"), (ORG, "o")],
                "(the slug of the Cloudsmith service account that trusts this cluster's issuer)",
            ),
        ] {
            let e = check(kind, &options(&given)).unwrap_err();
            assert!(e.ends_with(explained), "{e}");
        }
        assert_eq!(describe(URL), "see the providers page");
    }

    #[test]
    fn a_username_may_be_256_characters_and_not_one_more() {
        assert!(check_value(USERNAME, &"u".repeat(256)).is_ok());
        assert!(check_value(USERNAME, &"u".repeat(257)).is_err());
    }

    #[test]
    fn free_text_may_be_512_characters_and_not_one_more() {
        assert!(check_value(AUDIENCE, &"a".repeat(512)).is_ok());
        let e = check_value(AUDIENCE, &"a".repeat(513)).unwrap_err();
        assert!(e.contains("1 to 512"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_naming_the_option() {
        for (key, value, needle) in [
            (TOKEN_FILE, "var/run/token", "absolute path"),
            (ROBOT, "acme", "robot account"),
            (ROBOT, "Acme+puller", "robot account"),
            (ROBOT, "acme+pull-er", "robot account"),
            (ORG, "Acme Corp", "slug"),
            (USERNAME, "a:b", "docker username"),
            (USERNAME, "", "docker username"),
            (AUDIENCE, "with space", "printable"),
            (URL, "http://quay.example.com", "in the clear"),
            (URL, "https://u:p@quay.example.com", "userinfo"),
            (URL, "https://u@quay.example.com", "userinfo"),
            (URL, "https://:p@quay.example.com", "userinfo"),
            (AUDIENCE, "", "1 to 512"),
            (PROVIDER_NAME, "", "1 to 512"),
            (URL, "https://quay.example.com/?x=1", "query"),
            (URL, "ftp://quay.example.com", "not https"),
            (URL, "not a url", "not a URL"),
        ] {
            let e = check_value(key, value).unwrap_err();
            assert!(e.contains(needle), "{key}={value}: {e}");
        }
        for (key, value) in [
            (ROBOT, "acme+puller_1"),
            (URL, "https://quay.example.com:8443/"),
            (URL, "http://127.0.0.1:5000"),
            (URL, "http://[::1]:5000"),
            (URL, "http://localhost:5000"),
            (USERNAME, "puller"),
            (TOKEN_FILE, "/var/run/secrets/tokens/quay"),
        ] {
            assert!(check_value(key, value).is_ok(), "{key}={value}");
        }
        assert_eq!(
            base_url("https://quay.example.com:8443/").unwrap(),
            "https://quay.example.com:8443"
        );
    }

    #[test]
    fn a_bad_value_is_shown_short_and_printable() {
        let long = format!("{}\n{}", "x".repeat(100), "secret");
        let e = check_value(AUDIENCE, &long).unwrap_err();
        assert!(!e.contains('\n') && !e.contains("secret"), "{e}");
    }
}
