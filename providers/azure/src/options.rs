//! Per-rule options of the azure provider ([`OPTIONS`]: `tenant`, `client_id`, `scope`,
//! `authority_host`, `exchange_url`, `service`) and the checks their values (and the
//! matching env vars, at fetch time) must pass: [`check_scope`] and [`check_https_url`].
//!
//! Reads no env var; the values come from a rule in the config file.

use regbroker_provider::{Options, Registry, check_known_options};

use crate::OPTIONS;

/// Parsed rule options.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RuleOptions {
    pub(crate) tenant: Option<String>,
    pub(crate) client_id: Option<String>,
    pub(crate) scope: Option<String>,
    pub(crate) authority_host: Option<String>,
    pub(crate) exchange_url: Option<String>,
    pub(crate) service: Option<String>,
}

impl RuleOptions {
    /// Checks every key and value; the error names the bad key.
    pub(crate) fn parse(options: &Options) -> Result<RuleOptions, String> {
        check_known_options("azure", options, OPTIONS)?;
        let get = |k: &str| -> Result<Option<String>, String> {
            match options.get(k).map(|v| v.trim()) {
                None => Ok(None),
                Some("") => Err(format!("option `{k}` for the azure provider is empty")),
                Some(v) => Ok(Some(v.to_string())),
            }
        };
        let o = RuleOptions {
            tenant: get("tenant")?,
            client_id: get("client_id")?,
            scope: get("scope")?,
            authority_host: get("authority_host")?,
            exchange_url: get("exchange_url")?,
            service: get("service")?,
        };
        let id_ok = |v: &str| {
            v.len() <= 128
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        };
        if let Some(t) = &o.tenant
            && !id_ok(t)
        {
            return Err("option `tenant`: expected a tenant id (letters, digits, `-`, `.`)".into());
        }
        if let Some(c) = &o.client_id
            && !id_ok(c)
        {
            return Err("option `client_id`: expected a client id (letters, digits, `-`)".into());
        }
        if let Some(s) = &o.scope {
            check_scope(s).map_err(|e| format!("option `scope`: {e}"))?;
        }
        if let Some(a) = &o.authority_host {
            check_https_url("authority host", a, false)
                .map_err(|e| format!("option `authority_host`: {e}"))?;
        }
        if let Some(u) = &o.exchange_url {
            check_https_url("exchange URL", u, true)
                .map_err(|e| format!("option `exchange_url`: {e}"))?;
        }
        if let Some(s) = &o.service {
            Registry::parse(s)
                .ok()
                .filter(|r| r.as_str() == s.to_ascii_lowercase() && r.port().is_none())
                .ok_or_else(|| "option `service`: expected a bare registry host name such as myregistry.azurecr.io".to_string())?;
        }
        Ok(o)
    }
}

/// Entra ID scopes are URIs like `https://containerregistry.azure.net/.default`.
pub(crate) fn check_scope(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 256
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "./-_:".contains(c));
    if ok {
        Ok(())
    } else {
        Err("expected one scope such as https://containerregistry.azure.net/.default".into())
    }
}

/// An https URL, or (when `loopback_http`) an http URL whose host is loopback.
pub(crate) fn check_https_url(
    what: &str,
    raw: &str,
    loopback_http: bool,
) -> Result<url::Url, String> {
    let shown: String = raw.chars().take(80).collect();
    let u = url::Url::parse(raw).map_err(|_| format!("{what} `{shown}` is not a URL"))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!("{what} must not hold credentials"));
    }
    let loopback = match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    match u.scheme() {
        "https" if u.host().is_some() => Ok(u),
        "http" if loopback_http && loopback => Ok(u),
        "http" if loopback_http => Err(format!(
            "{what} `{shown}` must use https (http is allowed only to loopback)"
        )),
        _ => Err(format!("{what} `{shown}` must use https")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_support::{opts, provider, reg};
    use regbroker_provider::Provider;

    #[test]
    fn unknown_and_bad_options_are_rejected_by_name() {
        let p = provider(&[]);
        let e = p.check_options(&opts(&[("region", "x")])).unwrap_err();
        assert!(e.contains("`region`"), "{e}");
        let bad = [
            ("tenant", "a/b"),
            ("client_id", "x y"),
            ("scope", "https://x/.default other"),
            ("authority_host", "http://login.microsoftonline.com"),
            ("exchange_url", "http://proxy.example/oauth2/exchange"),
            ("exchange_url", "https://user:pw@proxy.example/"),
            ("service", "https://r.azurecr.io/v2/"),
            ("service", "r.azurecr.io:443"),
            ("tenant", ""),
        ];
        for (k, v) in bad {
            let e = p.check_options(&opts(&[(k, v)])).unwrap_err();
            assert!(e.contains(&format!("`{k}`")), "{k}={v}: {e}");
            assert!(!e.contains("pw@"), "{e}");
            let t = p.target(&reg("r1234.azurecr.io"), &opts(&[(k, v)]));
            assert_eq!(
                t.map(|_| ()).unwrap_err().kind(),
                regbroker_provider::ErrorKind::InvalidConfig
            );
        }
        p.check_options(&opts(&[
            ("tenant", "72f988bf-86f1-41af-91ab-2d7cd011db47"),
            ("client_id", "00000000-1111-2222-3333-444444444444"),
            ("scope", "https://management.azure.com/.default"),
            ("authority_host", "https://login.microsoftonline.us"),
            ("exchange_url", "http://127.0.0.1:8080/oauth2/exchange"),
            ("service", "myregistry.azurecr.io"),
        ]))
        .expect("valid options");
    }

    #[test]
    fn url_checks() {
        assert!(check_https_url("x", "https://login.example", false).is_ok());
        assert!(check_https_url("x", "http://127.0.0.1:1/x", true).is_ok());
        assert!(check_https_url("x", "http://[::1]:1/x", true).is_ok());
        assert!(check_https_url("x", "http://localhost:1/x", true).is_ok());
        assert!(check_https_url("x", "http://127.0.0.1:1/x", false).is_err());
        assert!(check_https_url("x", "http://10.0.0.1/x", true).is_err());
        assert!(check_https_url("x", "http://localhost.evil.com/x", true).is_err());
        assert!(check_https_url("x", "ftp://x/", true).is_err());
        assert!(check_https_url("x", "not a url", true).is_err());
    }
}
