//! The configuration file (TOML) and its validation.
//!
//! ```toml
//! [cache]
//! refresh_fraction = 0.8     # refresh after this fraction of a credential's lifetime
//! min_refresh = "30s"
//! max_refresh = "12h"
//! min_remaining = "30s"      # stop serving this long before expiry
//! fallback_ttl = "60s"       # no expiry, or an expiry already past
//! capacity = 10000
//! max_concurrent_fetches = 32
//!
//! [[rule]]                   # tried in order; the first match decides
//! match = "registry.example.com:5000"   # exact host[:port] or kubelet-style glob
//! source = "static"          # aws | azure | gcp | quay | artifactory | cloudsmith | oidc | static | none
//!
//! [[rule]]
//! match = "ecr-proxy.example.com"
//! source = "aws"
//! options = { region = "eu-west-1", account = "123456789012" }
//!
//! [[secret]]                 # a Secret `serve` keeps (besides --sync-secret)
//! namespace = "team-a"
//! name = "regbroker-pull"
//! registries = ["111111111111.dkr.ecr.eu-west-1.amazonaws.com"]  # only these
//! service_account = "puller" # optional: its identity, not the pod's; same namespace
//! ```
//!
//! TOML was chosen over YAML because the `toml` crate is maintained by the cargo team and
//! reports errors with line and column, while serde_yaml is unmaintained.

use std::path::{Path, PathBuf};

use regbroker_provider::Options;
use serde::Deserialize;

use crate::broker::cache;
use crate::broker::providers::Providers;
use crate::broker::routing::{Pattern, Router, Rule, Source};

/// A configuration error: always names the file and, where known, the line or key.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct Error {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, where.
    pub message: String,
}

/// The file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    cache: cache::Config,
    #[serde(default, rename = "rule")]
    rules: Vec<RawRule>,
    #[serde(default, rename = "secret")]
    secrets: Vec<RawSecret>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecret {
    namespace: toml::Spanned<String>,
    name: String,
    registries: Vec<String>,
    #[serde(default)]
    service_account: Option<String>,
}

/// A Secret declared in the config file: the registries it holds (only these), and the
/// ServiceAccount whose own identity fetches them, if any (else the pod's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretEntry {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// The registries written into it, and no other.
    pub registries: Vec<regbroker_provider::Registry>,
    /// A ServiceAccount of the Secret's own namespace, by name.
    pub service_account: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(rename = "match")]
    pattern: toml::Spanned<String>,
    source: toml::Spanned<String>,
    #[serde(default)]
    options: Options,
    /// Check a fetched credential with the registry before a sink writes it.
    #[serde(default = "yes")]
    check: bool,
    /// Token realm hosts besides the registry's own that may receive the credential
    /// during the check.
    #[serde(default)]
    check_realms: Vec<String>,
}

fn yes() -> bool {
    true
}

/// Validated configuration: plain data.
#[derive(Debug, Default)]
pub struct Config {
    /// Cache settings.
    pub cache: cache::Config,
    /// Routing rules.
    pub router: Router,
    /// Secrets to keep (`[[secret]]`).
    pub secrets: Vec<SecretEntry>,
}

/// Reads and validates `path` against the providers compiled in.
pub fn load(path: &Path, providers: &Providers) -> Result<Config, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error {
        path: path.to_path_buf(),
        message: format!("cannot read: {e}"),
    })?;
    parse(&text, providers).map_err(|message| Error {
        path: path.to_path_buf(),
        message,
    })
}

/// Parses and validates configuration text.
pub fn parse(text: &str, providers: &Providers) -> Result<Config, String> {
    let file: File = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    file.cache.validate()?;
    let line_of = |offset: usize| text[..offset.min(text.len())].lines().count().max(1);
    let mut rules = Vec::with_capacity(file.rules.len());
    for raw in file.rules {
        let line = line_of(raw.pattern.span().start);
        let at = |msg: String| {
            format!(
                "rule at line {line} (match = {:?}): {msg}",
                raw.pattern.get_ref()
            )
        };
        let pattern = Pattern::parse(raw.pattern.get_ref()).map_err(|e| at(e.to_string()))?;
        let source = match raw.source.get_ref().as_str() {
            "static" | "none" if !raw.options.is_empty() => {
                return Err(at(format!(
                    "source `{}` takes no options",
                    raw.source.get_ref()
                )));
            }
            "static" => Source::Static,
            "none" => Source::None,
            name => {
                let provider = providers.get(name).ok_or_else(|| {
                    at(if crate::broker::providers::KNOWN.contains(&name) {
                        format!(
                            "source `{name}` is not available: this build lacks the `{}` feature",
                            crate::broker::providers::feature_of(name)
                        )
                    } else {
                        format!(
                            "unknown source `{name}` (expected {}, static or none)",
                            crate::broker::providers::KNOWN.join(", ")
                        )
                    })
                })?;
                provider.check_options(&raw.options).map_err(at)?;
                Source::Provider {
                    name: provider.name().to_string(),
                    options: raw.options,
                }
            }
        };
        if pattern.is_glob() && matches!(source, Source::Provider { .. }) {
            let host = pattern.as_str().split(':').next().unwrap_or_default();
            let labels: Vec<&str> = host.split('.').collect();
            if labels.iter().rev().take(2).any(|l| l.contains('*')) {
                return Err(at(
                    "a cloud source needs a pattern whose last two labels are literal; a wildcard there could send cloud credentials to hosts you do not control".into(),
                ));
            }
        }
        let check = check_policy(raw.check, raw.check_realms).map_err(at)?;
        rules.push(Rule {
            pattern,
            source,
            check,
        });
    }
    let mut secrets: Vec<SecretEntry> = Vec::with_capacity(file.secrets.len());
    for raw in file.secrets {
        let line = line_of(raw.namespace.span().start);
        let entry = secret_entry(raw)
            .map_err(|(what, msg)| format!("secret at line {line} ({what}): {msg}"))?;
        if secrets
            .iter()
            .any(|s| s.namespace == entry.namespace && s.name == entry.name)
        {
            return Err(format!(
                "secret at line {line} ({}/{}): declared twice",
                entry.namespace, entry.name
            ));
        }
        secrets.push(entry);
    }
    Ok(Config {
        cache: file.cache,
        router: Router::new(rules),
        secrets,
    })
}

/// A rule's `check` and `check_realms`: each realm a host or `host:port` as a registry
/// name is written, and only where the check is on.
fn check_policy(enabled: bool, realms: Vec<String>) -> Result<super::check::Policy, String> {
    if !enabled && !realms.is_empty() {
        return Err("check_realms is set but check = false: the realms would never be used".into());
    }
    let mut out = Vec::with_capacity(realms.len());
    for realm in realms {
        let r = regbroker_provider::Registry::parse(&realm)
            .ok()
            .filter(|r| r.as_str() == realm.to_ascii_lowercase())
            .ok_or_else(|| {
                format!(
                    "check_realms: {:?} is not a host or host:port (no scheme, no path)",
                    realm.chars().take(100).collect::<String>()
                )
            })?;
        out.push(r.as_str().to_string());
    }
    Ok(super::check::Policy {
        enabled,
        realms: out,
    })
}

/// Checks one `[[secret]]`; the error is (the entry, what is wrong).
fn secret_entry(raw: RawSecret) -> Result<SecretEntry, (String, String)> {
    let namespace = raw.namespace.into_inner();
    let what = format!("{namespace}/{}", raw.name);
    let fail = |msg: String| (what.clone(), msg);
    // The provider API's ServiceAccount check is the Kubernetes name check.
    regbroker_provider::ServiceAccount::new(namespace.clone(), raw.name.clone(), None)
        .map_err(|e| fail(e.message().replace("ServiceAccount ", "Secret ")))?;
    if namespace.contains('.') || namespace.len() > 63 {
        return Err(fail(format!(
            "namespace `{namespace}` is not a DNS-1123 label"
        )));
    }
    if raw.registries.is_empty() {
        return Err(fail(
            "`registries` is empty: list the registries this Secret holds".into(),
        ));
    }
    let mut registries = Vec::with_capacity(raw.registries.len());
    for r in &raw.registries {
        // A registry name, or an image reference where no registry reading fits
        // (`nginx:latest` is Docker Hub's; `name:5000` is a host and port).
        let registry = regbroker_provider::Registry::from_registry_or_image(r).map_err(|e| {
            fail(format!(
                "registry {:?}: {e}",
                r.chars().take(80).collect::<String>()
            ))
        })?;
        if !registries.contains(&registry) {
            registries.push(registry);
        }
    }
    let service_account = match raw.service_account {
        None => None,
        Some(sa) => {
            let (sa_ns, sa_name) = match sa.split_once('/') {
                Some((n, a)) => (n.to_string(), a.to_string()),
                None => (namespace.clone(), sa.clone()),
            };
            if sa_ns != namespace {
                return Err(fail(format!(
                    "service_account `{sa_ns}/{sa_name}` is in namespace {sa_ns}: a Secret may only use a ServiceAccount of its own namespace ({namespace}), or one tenant could act as another"
                )));
            }
            regbroker_provider::ServiceAccount::new(sa_ns, sa_name.clone(), None)
                .map_err(|e| fail(format!("service_account: {}", e.message())))?;
            Some(sa_name)
        }
    };
    Ok(SecretEntry {
        namespace,
        name: raw.name,
        registries,
        service_account,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::providers::Providers;

    fn parse_err(text: &str) -> String {
        parse(text, &Providers::from_env().unwrap()).unwrap_err()
    }

    #[test]
    fn full_example_parses() {
        let text = r#"
[cache]
refresh_fraction = 0.5
min_refresh = "1m"

[[rule]]
match = "registry.example.com:5000"
source = "static"

[[rule]]
match = "*.internal.example.com"
source = "none"
"#;
        let c = parse(text, &Providers::from_env().unwrap()).unwrap();
        assert_eq!(c.cache.refresh_fraction, 0.5);
        assert_eq!(c.cache.min_refresh, std::time::Duration::from_secs(60));
        assert_eq!(c.router.rules().len(), 2);
        assert_eq!(c.router.rules()[0].source, Source::Static);
    }

    #[test]
    fn empty_file_is_valid() {
        let c = parse("", &Providers::from_env().unwrap()).unwrap();
        assert!(c.router.rules().is_empty());
        assert_eq!(c.cache, cache::Config::default());
    }

    #[test]
    fn unknown_source_names_the_line() {
        let e = parse_err("\n\n[[rule]]\nmatch = \"a.example.com\"\nsource = \"awz\"\n");
        assert!(e.contains("line 4"), "{e}");
        assert!(e.contains("unknown source `awz`"), "{e}");
    }

    #[test]
    fn bad_pattern_names_the_line_and_reason() {
        let e = parse_err("[[rule]]\nmatch = \"https://*.example.com\"\nsource = \"none\"\n");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("no scheme"), "{e}");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_position() {
        let e = parse_err("[cache]\nrefresh_fractoin = 0.5\n");
        assert!(e.contains("refresh_fractoin"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = parse_err("[[rule]]\nmatch = \"a.example.com\"\nsorce = \"none\"\n");
        assert!(e.contains("sorce"), "{e}");
    }

    #[test]
    fn bad_values_are_rejected() {
        let e = parse_err("[cache]\nmin_refresh = \"soon\"\n");
        assert!(e.contains("min_refresh") || e.contains("line 2"), "{e}");
        let e = parse_err("[cache]\nrefresh_fraction = 0.0\n");
        assert!(e.contains("refresh_fraction"), "{e}");
        // Issue 30, finding 4: durations that overflow a clock reading (a fallback_ttl of
        // 300 billion years aborted the process at its first fetch) are refused, each
        // naming its key; a year is the most any takes.
        for key in [
            "min_refresh",
            "max_refresh",
            "min_remaining",
            "fallback_ttl",
            "fetch_timeout",
            "failure_backoff",
            "max_failure_backoff",
        ] {
            let e = parse_err(&format!("[cache]\n{key} = \"300000000000y\"\n"));
            assert!(
                e.contains(&format!("cache.{key} must be at most 1year")),
                "{key}: {e}"
            );
            let e = parse_err(&format!("[cache]\n{key} = \"366days\"\n"));
            assert!(e.contains(&format!("cache.{key}")), "{key}: {e}");
        }
        // A year itself is taken.
        let c = parse(
            "[cache]\nfallback_ttl = \"1year\"\nmax_refresh = \"1year\"\n",
            &Providers::from_env().unwrap(),
        )
        .unwrap();
        assert_eq!(c.cache.fallback_ttl, crate::broker::cache::MAX_SETTING);
        let e = parse_err(
            "[[rule]]\nmatch = \"a.example.com\"\nsource = \"static\"\noptions = { region = \"x\" }\n",
        );
        assert!(e.contains("takes no options"), "{e}");
    }

    #[cfg(feature = "aws")]
    #[test]
    fn a_rule_says_whether_and_where_its_credential_is_checked() {
        let providers = Providers::from_env().unwrap();
        let c = parse(
            "[[rule]]\nmatch = \"a.example.com\"\nsource = \"static\"\n\
             [[rule]]\nmatch = \"b.example.com\"\nsource = \"static\"\ncheck = false\n\
             [[rule]]\nmatch = \"c.example.com\"\nsource = \"static\"\n\
             check_realms = [\"Auth.Example.com\", \"tok.example.com:8443\"]\n",
            &providers,
        )
        .unwrap();
        let policy = |h: &str| {
            let r = regbroker_provider::Registry::parse(h).unwrap();
            c.router.route(&r).unwrap().1.check.clone()
        };
        assert_eq!(
            policy("a.example.com"),
            crate::broker::check::Policy::default()
        );
        assert!(policy("a.example.com").enabled);
        assert!(!policy("b.example.com").enabled);
        assert_eq!(
            policy("c.example.com").realms,
            ["auth.example.com", "tok.example.com:8443"]
        );
        for (bad, why) in [
            (
                "check_realms = [\"https://auth.example.com\"]",
                "not a host",
            ),
            ("check_realms = [\"auth.example.com/token\"]", "not a host"),
            (
                "check = false\ncheck_realms = [\"auth.example.com\"]",
                "never be used",
            ),
        ] {
            let e = parse_err(&format!(
                "[[rule]]\nmatch = \"a.example.com\"\nsource = \"static\"\n{bad}\n"
            ));
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn provider_options_are_checked_by_the_provider() {
        let e = parse_err(
            "[[rule]]\nmatch = \"proxy.example.com\"\nsource = \"aws\"\noptions = { regoin = \"eu-west-1\" }\n",
        );
        assert!(e.contains("regoin"), "{e}");
    }

    // Any cloud compiled in will do.
    const CLOUD: &str = crate::broker::providers::KNOWN[0];

    #[cfg(any(feature = "aws", feature = "azure", feature = "gcp"))]
    #[test]
    fn cloud_rule_with_wildcard_in_registrable_part_is_refused() {
        for m in [
            "*.com",
            "registry.*",
            "a.*.com",
            "*.*",
            "*.com:5000",
            "x.*:5000",
        ] {
            let e = parse_err(
                &format!("[[rule]]\nmatch = \"{m}\"\nsource = \"static\"\n")
                    .replace("static", CLOUD),
            );
            assert!(e.contains("last two labels"), "{m}: {e}");
        }
        // Fine for non-cloud sources.
        parse(
            "[[rule]]\nmatch = \"*.com\"\nsource = \"none\"\n",
            &Providers::from_env().unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn secrets_are_parsed_with_their_registries_and_service_account() {
        let c = parse(
            "[[secret]]\nnamespace = \"team-a\"\nname = \"pull\"\nregistries = [\"a.example.com\", \"https://b.example.com/v2/\"]\nservice_account = \"puller\"\n\n\
             [[secret]]\nnamespace = \"team-b\"\nname = \"pull\"\nregistries = [\"a.example.com\"]\nservice_account = \"team-b/puller\"\n",
            &Providers::from_env().unwrap(),
        )
        .unwrap();
        assert_eq!(c.secrets.len(), 2);
        assert_eq!(c.secrets[0].registries.len(), 2);
        assert_eq!(c.secrets[0].registries[1].as_str(), "b.example.com");
        assert_eq!(c.secrets[0].service_account.as_deref(), Some("puller"));
        assert_eq!(c.secrets[1].service_account.as_deref(), Some("puller"));
    }

    #[test]
    fn a_secret_may_name_its_registries_by_image_reference_or_host_and_port() {
        // `nginx:latest` can hold no port: it is Docker Hub's image. `name:5000` can: it
        // is that host and port, as `docker login name:5000` reads it.
        let c = parse(
            "[[secret]]\nnamespace = \"team-a\"\nname = \"pull\"\nregistries = [\"nginx:latest\", \"name:5000\", \"name:5000/app:1\", \"library/redis\"]\n",
            &Providers::from_env().unwrap(),
        )
        .unwrap();
        let names: Vec<&str> = c.secrets[0].registries.iter().map(|r| r.as_str()).collect();
        assert_eq!(names, ["docker.io", "name:5000"]);
        for (registry, needle) in [
            ("Nginx:latest", "lower case"),
            ("name:99999", "invalid port `99999`"),
            ("nginx:-x", "invalid tag"),
            ("u:hunter2@a.example.com", "userinfo"),
        ] {
            let e = parse_err(&format!(
                "[[secret]]\nnamespace = \"a\"\nname = \"p\"\nregistries = [\"{registry}\"]\n"
            ));
            assert!(e.contains(needle), "{registry}: {e}");
        }
    }

    #[test]
    fn a_service_account_of_another_namespace_is_refused_naming_the_entry() {
        let e = parse_err(
            "\n[[secret]]\nnamespace = \"team-a\"\nname = \"pull\"\nregistries = [\"a.example.com\"]\nservice_account = \"team-b/puller\"\n",
        );
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("team-a/pull"), "{e}");
        assert!(e.contains("team-b/puller"), "{e}");
        assert!(e.contains("its own namespace"), "{e}");
    }

    #[test]
    fn bad_secret_entries_are_refused() {
        for (body, needle) in [
            (
                "namespace = \"Team\"\nname = \"p\"\nregistries = [\"a.example.com\"]",
                "namespace",
            ),
            ("namespace = \"a\"\nname = \"p\"\nregistries = []", "empty"),
            (
                "namespace = \"a\"\nname = \"p\"\nregistries = [\"u:p@a.example.com\"]",
                "registry",
            ),
            (
                "namespace = \"a\"\nname = \"p\"\nregistries = [\"a.example.com\"]\nservice_account = \"Bad_Name\"",
                "service_account",
            ),
            (
                "namespace = \"a\"\nname = \"p\"\nregistries = [\"a.example.com\"]\nextra = 1",
                "extra",
            ),
        ] {
            let e = parse_err(&format!("[[secret]]\n{body}\n"));
            assert!(e.contains(needle), "{body}: {e}");
        }
        let twice =
            "[[secret]]\nnamespace = \"a\"\nname = \"p\"\nregistries = [\"a.example.com\"]\n";
        assert!(parse_err(&format!("{twice}{twice}")).contains("declared twice"));
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("regbroker.toml");
        std::fs::write(&p, "[[rule]]\nmatch = 5\n").unwrap();
        let e = load(&p, &Providers::from_env().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&p.display().to_string()), "{e}");
        let e = load(
            &dir.path().join("missing.toml"),
            &Providers::from_env().unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("missing.toml") && e.contains("cannot read"),
            "{e}"
        );
    }
}
