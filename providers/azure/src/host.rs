//! Which hosts are Azure Container Registry login servers, and which cloud each is in.
//!
//! Reads no env var itself; the extra private-cloud suffixes come from
//! `REGBROKER_AZURE_ACR_SUFFIXES` or the builder (see the crate docs).
//!
//! A login server is exactly `<name>.<suffix>` where `<name>` is one label of 5 to 50
//! lower-case ASCII letters or digits (ACR's own naming rule: no hyphen) and `<suffix>`
//! is `azurecr.io` (public), `azurecr.cn` (China), `azurecr.us` (US Government),
//! `azurecr.de` (the retired Azure Germany) or a configured private-cloud suffix. No
//! port, no extra label: data endpoints (`<name>.<region>.data.azurecr.io`) are blob
//! hosts, not registries, and are not recognised.

use regbroker_provider::Registry;

/// An Azure cloud: it decides the default Entra ID authority host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cloud {
    /// Azure public cloud (`azurecr.io`, `login.microsoftonline.com`).
    Public,
    /// Azure operated by 21Vianet (`azurecr.cn`, `login.chinacloudapi.cn`).
    China,
    /// Azure US Government (`azurecr.us`, `login.microsoftonline.us`).
    UsGovernment,
    /// The retired Azure Germany cloud (`azurecr.de`, `login.microsoftonline.de`).
    Germany,
}

impl Cloud {
    /// The Entra ID authority host this cloud's identities sign in at.
    pub fn authority_host(self) -> &'static str {
        match self {
            Cloud::Public => "https://login.microsoftonline.com",
            Cloud::China => "https://login.chinacloudapi.cn",
            Cloud::UsGovernment => "https://login.microsoftonline.us",
            Cloud::Germany => "https://login.microsoftonline.de",
        }
    }

    /// A short name for cache scopes and logs.
    pub fn name(self) -> &'static str {
        match self {
            Cloud::Public => "public",
            Cloud::China => "china",
            Cloud::UsGovernment => "usgov",
            Cloud::Germany => "germany",
        }
    }
}

/// The built-in ACR suffixes and their clouds.
pub const BUILTIN_SUFFIXES: &[(&str, Cloud)] = &[
    ("azurecr.io", Cloud::Public),
    ("azurecr.cn", Cloud::China),
    ("azurecr.us", Cloud::UsGovernment),
    ("azurecr.de", Cloud::Germany),
];

/// Shortest and longest ACR registry name.
const NAME_LEN: std::ops::RangeInclusive<usize> = 5..=50;

/// A recognised ACR login server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcrHost {
    /// The registry name (first label).
    pub name: String,
    /// The suffix after the name.
    pub suffix: String,
    /// The cloud the suffix belongs to; `None` for a configured private-cloud suffix.
    pub cloud: Option<Cloud>,
}

/// Whether `name` follows ACR's registry naming rule.
pub fn is_acr_name(name: &str) -> bool {
    NAME_LEN.contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Recognises `registry` as an ACR login server under a built-in suffix or one of
/// `extra_suffixes` (already validated by [`parse_suffix`]).
pub fn recognise(registry: &Registry, extra_suffixes: &[String]) -> Option<AcrHost> {
    if registry.port().is_some() {
        return None;
    }
    let host = registry.host();
    let (name, suffix) = host.split_once('.')?;
    if !is_acr_name(name) {
        return None;
    }
    if let Some((s, cloud)) = BUILTIN_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some(AcrHost {
            name: name.to_string(),
            suffix: (*s).to_string(),
            cloud: Some(*cloud),
        });
    }
    extra_suffixes
        .iter()
        .find(|s| s.as_str() == suffix)
        .map(|s| AcrHost {
            name: name.to_string(),
            suffix: s.clone(),
            cloud: None,
        })
}

/// The cloud a host's suffix implies, for explicitly routed hosts too: the last two
/// labels are compared with the built-in suffixes.
pub fn cloud_of_suffix(host: &str) -> Option<Cloud> {
    BUILTIN_SUFFIXES
        .iter()
        .find(|(s, _)| {
            host.strip_suffix(s)
                .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
        })
        .map(|(_, c)| *c)
}

/// Validates one configured private-cloud suffix such as `azurecr.contoso.example`:
/// at least two labels of letters, digits and inner hyphens, lower-cased, without a
/// leading dot, port or wildcard.
pub fn parse_suffix(raw: &str) -> Result<String, String> {
    let s = raw.trim().trim_start_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = s.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if labels.len() < 2 || !labels.iter().all(label_ok) || !s.is_ascii() {
        return Err(format!(
            "invalid ACR suffix `{}`: expected a domain of at least two labels, such as azurecr.contoso.example",
            raw.trim().chars().take(64).collect::<String>()
        ));
    }
    Ok(s)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn reg(s: &str) -> Option<Registry> {
        Registry::parse(s).ok()
    }

    #[test]
    fn builtin_login_servers_are_recognised_with_their_cloud() {
        let cases = [
            ("myregistry.azurecr.io", "myregistry", Cloud::Public),
            (
                "https://myregistry.azurecr.io/v2/",
                "myregistry",
                Cloud::Public,
            ),
            ("MyRegistry.AzureCR.io", "myregistry", Cloud::Public),
            (
                "myregistry.azurecr.io/team/app:1.0",
                "myregistry",
                Cloud::Public,
            ),
            ("abcde.azurecr.io", "abcde", Cloud::Public),
            ("contoso2024.azurecr.cn", "contoso2024", Cloud::China),
            ("contoso.azurecr.us", "contoso", Cloud::UsGovernment),
            ("contoso.azurecr.de", "contoso", Cloud::Germany),
            ("12345.azurecr.io", "12345", Cloud::Public),
        ];
        for (input, name, cloud) in cases {
            let r = reg(input).unwrap_or_else(|| panic!("{input} should parse"));
            let got = recognise(&r, &[]).unwrap_or_else(|| panic!("{input} not recognised"));
            assert_eq!(got.name, name, "{input}");
            assert_eq!(got.cloud, Some(cloud), "{input}");
        }
        let fifty = format!("{}.azurecr.io", "a".repeat(50));
        assert!(recognise(&Registry::parse(&fifty).unwrap(), &[]).is_some());
    }

    #[test]
    fn lookalikes_are_not_recognised() {
        let fifty_one = format!("{}.azurecr.io", "a".repeat(51));
        let hostile: Vec<String> = [
            "evil.com.azurecr.io",
            "myregistry.azurecr.io.evil.com",
            "myregistry-azurecr.io",
            "my.registry.azurecr.io",
            "abcd.azurecr.io",
            "my-reg.azurecr.io",
            "myregistry.azurecr.io:443",
            "myregistry.azurecr.io:5000",
            "myregistry.azurecr.com",
            "azurecr.io",
            "myregistry.eastus.data.azurecr.io",
            "myregistry.westeurope.geo.azurecr.io",
            "myregistryazurecr.io",
            "myregistry.azurecrio",
            "myregistry.azurecr.io.",
            "myregistry.notazurecr.io",
            "myregistry.xazurecr.io",
            "myregistry.azurecr.iox",
            "myregistry.azurecr",
            "myregistry.azurecr.cn.evil.cn",
            "myregistry.azurecr.net",
            "myregistry.azurecr.us.com",
            "myregistry.azure.io",
            "myregistry.azurecr-io.com",
            "https://myregistry.azurecr.io:8443/v2/",
            "xn--myregistr-ab1.azurecr.io",
            "127.0.0.1",
            "[::1]",
            "localhost",
            "docker.io",
            "myregistry.mcr.microsoft.com",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([fifty_one])
        .collect();
        for input in &hostile {
            if let Some(r) = reg(input) {
                assert_eq!(recognise(&r, &[]), None, "{input} must not be recognised");
            }
        }
        // Names that the registry parser accepts but ACR forbids.
        for input in ["my_reg.azurecr.io", "ab.azurecr.io", "-myreg.azurecr.io"] {
            if let Some(r) = reg(input) {
                assert_eq!(recognise(&r, &[]), None, "{input}");
            }
        }
    }

    #[test]
    fn configured_suffix_is_anchored_too() {
        let extra = vec![parse_suffix("azurecr.contoso.example").unwrap()];
        let r = reg("myregistry.azurecr.contoso.example").unwrap();
        let got = recognise(&r, &extra).expect("recognised");
        assert_eq!(got.cloud, None);
        assert_eq!(got.suffix, "azurecr.contoso.example");
        for input in [
            "myregistry.azurecr.contoso.example.evil.com",
            "evil.myregistry.azurecr.contoso.example",
            "my-registry.azurecr.contoso.example",
            "abcd.azurecr.contoso.example",
            "myregistry.azurecr.contoso.example:443",
            "myregistry.xazurecr.contoso.example",
            "azurecr.contoso.example",
        ] {
            let r = reg(input).unwrap();
            assert_eq!(recognise(&r, &extra), None, "{input}");
        }
        // Without the configured suffix the same host is not recognised.
        assert_eq!(
            recognise(&reg("myregistry.azurecr.contoso.example").unwrap(), &[]),
            None
        );
    }

    #[test]
    fn bad_suffixes_are_rejected() {
        for bad in [
            "",
            "com",
            "azurecr.*.example",
            "azurecr.io:443",
            "a..b",
            "-a.b",
            "ä.b",
        ] {
            assert!(parse_suffix(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_suffix(" .AzureCR.Contoso.Example ").unwrap(),
            "azurecr.contoso.example"
        );
    }

    #[test]
    fn cloud_follows_the_suffix_label_by_label() {
        assert_eq!(cloud_of_suffix("x.azurecr.cn"), Some(Cloud::China));
        assert_eq!(
            cloud_of_suffix("x.eastus.data.azurecr.us"),
            Some(Cloud::UsGovernment)
        );
        assert_eq!(cloud_of_suffix("x.notazurecr.io"), None);
        assert_eq!(cloud_of_suffix("proxy.example.com"), None);
    }

    #[test]
    fn each_cloud_has_a_short_name_of_its_own() {
        assert_eq!(Cloud::Public.name(), "public");
        assert_eq!(Cloud::China.name(), "china");
        assert_eq!(Cloud::UsGovernment.name(), "usgov");
    }
}
