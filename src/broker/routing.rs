//! Routing rules: which source serves a registry.
//!
//! Rules are tried in order; the first whose pattern matches decides. A pattern is an
//! exact registry (`registry.example.com`, `10.0.0.5:5000`, normalised like any registry
//! name) or a kubelet-style glob: the host is matched label by label, `*` in a label
//! matches any run of characters within that label (never a dot), the number of labels
//! must be equal, and the port must be equal (a pattern without a port matches only hosts
//! without one). When no rule matches, the broker asks each provider to recognise the host.

use std::fmt;

use regbroker_provider::{Options, ParseError, Registry};

/// A host pattern of a routing rule.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern {
    kind: PatternKind,
    text: String,
}

#[derive(Clone, PartialEq, Eq)]
enum PatternKind {
    Exact(Registry),
    Glob {
        labels: Vec<String>,
        port: Option<u16>,
    },
}

/// Why a pattern was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// The pattern (without `*`) is not a valid registry name.
    #[error(transparent)]
    Registry(#[from] ParseError),
    /// A glob with a scheme, path, userinfo or other non-host part.
    #[error("a glob pattern is a host with an optional port: no scheme, path or userinfo")]
    NotAHost,
    /// A glob label with a character other than letters, digits, `-` and `*`.
    #[error("invalid label `{0}` in glob pattern (letters, digits, `-` and `*` only)")]
    InvalidLabel(String),
    /// A bad port in a glob.
    #[error("invalid port `{0}` in glob pattern (expected 1-65535; ports cannot be globbed)")]
    InvalidPort(String),
}

impl Pattern {
    /// Parses a rule's `match` value.
    pub fn parse(text: &str) -> Result<Pattern, PatternError> {
        if !text.contains('*') {
            return Ok(Pattern {
                kind: PatternKind::Exact(Registry::parse(text)?),
                text: text.to_string(),
            });
        }
        if text.contains(['/', '@', '?', '#']) || text.contains("://") {
            return Err(PatternError::NotAHost);
        }
        let (host, port) = match text.split_once(':') {
            None => (text, None),
            Some((h, p)) => {
                let port = p
                    .parse::<u16>()
                    .ok()
                    .filter(|n| *n != 0 && !p.starts_with('0') && !p.starts_with('+'))
                    .ok_or_else(|| PatternError::InvalidPort(p.chars().take(8).collect()))?;
                (h, Some(port))
            }
        };
        if host.len() > regbroker_provider::MAX_HOST_LEN {
            return Err(ParseError::HostTooLong(host.len()).into());
        }
        let labels = host
            .split('.')
            .map(|l| {
                let ok = !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'*');
                if ok {
                    Ok(l.to_ascii_lowercase())
                } else {
                    Err(PatternError::InvalidLabel(l.chars().take(63).collect()))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pattern {
            kind: PatternKind::Glob { labels, port },
            text: text.to_string(),
        })
    }

    /// Whether `registry` matches.
    pub fn matches(&self, registry: &Registry) -> bool {
        match &self.kind {
            PatternKind::Exact(r) => r == registry,
            PatternKind::Glob { labels, port } => {
                if *port != registry.port() || registry.host().starts_with('[') {
                    return false;
                }
                let mut host = registry.labels();
                let mut pats = labels.iter();
                loop {
                    match (pats.next(), host.next()) {
                        (None, None) => return true,
                        (Some(p), Some(h)) if glob_label(p.as_bytes(), h.as_bytes()) => {}
                        _ => return false,
                    }
                }
            }
        }
    }

    /// The pattern as written in the config.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern has a wildcard.
    pub fn is_glob(&self) -> bool {
        matches!(self.kind, PatternKind::Glob { .. })
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({})", self.text)
    }
}

/// `*` matches any run of bytes (possibly empty); everything else matches itself.
fn glob_label(pat: &[u8], s: &[u8]) -> bool {
    // Iterative matcher with single backtrack point: linear in practice, no recursion.
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if p < pat.len() && pat[p] == s[i] {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&b| b == b'*')
}

/// Where a rule sends matching registries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A contextual-login provider (`aws`, `azure`, `gcp`) with its options.
    Provider {
        /// Provider name.
        name: String,
        /// Provider options from the rule.
        options: Options,
    },
    /// Only a static (dockerconfigjson) entry may serve the host.
    Static,
    /// No contextual login: the host gets "not configured" unless a static entry exists.
    None,
}

/// One routing rule.
#[derive(Clone, Debug)]
pub struct Rule {
    /// What it matches.
    pub pattern: Pattern,
    /// What serves the match.
    pub source: Source,
    /// Whether the sinks check a fetched credential with the registry before writing it,
    /// and which token realms besides the registry's host may receive it.
    pub check: super::check::Policy,
}

/// Ordered routing rules.
#[derive(Clone, Debug, Default)]
pub struct Router {
    rules: Vec<Rule>,
}

impl Router {
    /// Rules tried in the given order.
    pub fn new(rules: Vec<Rule>) -> Router {
        Router { rules }
    }

    /// The first matching rule and its index.
    pub fn route(&self, registry: &Registry) -> Option<(usize, &Rule)> {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.pattern.matches(registry))
    }

    /// All rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, registry: &str) -> bool {
        Pattern::parse(pattern)
            .unwrap()
            .matches(&Registry::parse(registry).unwrap())
    }

    #[test]
    fn glob_matches_label_by_label() {
        let yes = [
            (
                "*.dkr.ecr.*.amazonaws.com",
                "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            ),
            ("*.azurecr.io", "myregistry.azurecr.io"),
            ("*-docker.pkg.dev", "europe-west1-docker.pkg.dev"),
            ("registry-*.example.com", "registry-eu.example.com"),
            ("*.example.com:5000", "a.example.com:5000"),
            ("a*b*c.example.com", "aXXbYYc.example.com"),
            ("*", "localhost"),
            ("*.EXAMPLE.com", "a.example.com"),
        ];
        for (p, r) in yes {
            assert!(matches(p, r), "{p} should match {r}");
        }
    }

    #[test]
    fn glob_rejects_hostile_and_near_misses() {
        let no = [
            // `*` never crosses a dot
            (
                "*.dkr.ecr.*.amazonaws.com",
                "a.b.dkr.ecr.us-east-1.amazonaws.com",
            ),
            ("*.azurecr.io", "evil.com.azurecr.io"),
            ("*.azurecr.io", "azurecr.io"),
            // suffix lookalikes and extra labels
            ("*.azurecr.io", "myregistry.azurecr.io.evil.com"),
            ("*.azurecr.io", "myregistry.azurecr.iox"),
            ("*.azurecr.io", "myregistryazurecr.io"),
            ("*-docker.pkg.dev", "europe-west1-docker.pkg.dev.evil.com"),
            // ports must be equal
            ("*.example.com", "a.example.com:5000"),
            ("*.example.com:5000", "a.example.com"),
            ("*.example.com:5000", "a.example.com:5001"),
            ("registry-*.example.com", "other.example.com"),
            ("a*b*c.example.com", "aXXbYY.example.com"),
            ("*", "a.b"),
        ];
        for (p, r) in no {
            assert!(!matches(p, r), "{p} must not match {r}");
        }
    }

    #[test]
    fn exact_patterns_are_normalised_like_registries() {
        assert!(matches("Registry.Example.com", "registry.example.com"));
        assert!(matches(
            "https://registry.example.com/v2/",
            "registry.example.com"
        ));
        assert!(matches("index.docker.io", "docker.io"));
        assert!(!matches("registry.example.com", "registry.example.com:443"));
        assert!(!matches("registry.example.com:443", "registry.example.com"));
        assert!(!matches("example.com", "a.example.com"));
    }

    #[test]
    fn bad_patterns_are_rejected() {
        for p in [
            "",
            "https://*.example.com",
            "*.example.com/path",
            "user@*.example.com",
            "*.example.com:0",
            "*.example.com:080",
            "*.example.com:+80",
            "*.example.com:99999",
            "*.example.com:*",
            "*..example.com",
            "*.exa_mple.com",
            "*.example.com.",
            "exa mple.com",
        ] {
            assert!(Pattern::parse(p).is_err(), "{p:?} should be rejected");
        }
    }

    #[test]
    fn a_glob_with_url_parts_is_refused_as_not_a_host() {
        for p in [
            "*.example.com/path",
            "user@*.example.com",
            "*.example.com?x",
            "*.example.com#x",
            "https://*.example.com",
        ] {
            assert!(
                matches!(Pattern::parse(p), Err(PatternError::NotAHost)),
                "{p:?}: {:?}",
                Pattern::parse(p)
            );
        }
    }

    #[test]
    fn a_glob_host_may_be_253_characters_long_and_not_one_more() {
        // `*.` then 63-character labels, the last one cut to make the length.
        let host = |len: usize| {
            let mut h = String::from("*");
            while h.len() < len {
                let room = (len - h.len() - 1).min(63);
                h.push('.');
                h.push_str(&"a".repeat(room.max(1)));
            }
            assert_eq!(h.len(), len);
            h
        };
        assert!(Pattern::parse(&host(253)).unwrap().is_glob());
        assert!(matches!(
            Pattern::parse(&host(254)),
            Err(PatternError::Registry(ParseError::HostTooLong(254)))
        ));
    }

    #[test]
    fn first_matching_rule_wins() {
        let rule = |p: &str, s: Source| Rule {
            pattern: Pattern::parse(p).unwrap(),
            source: s,
            check: Default::default(),
        };
        let router = Router::new(vec![
            rule("special.example.com", Source::None),
            rule("*.example.com", Source::Static),
        ]);
        let r = |s| Registry::parse(s).unwrap();
        assert_eq!(router.route(&r("special.example.com")).unwrap().0, 0);
        assert_eq!(router.route(&r("other.example.com")).unwrap().0, 1);
        assert!(router.route(&r("example.com")).is_none());
    }

    #[test]
    fn glob_matcher_is_linear_enough_for_hostile_patterns() {
        let pat = "*a*a*a*a*a*a*a*a*a*a*a*a*b".as_bytes();
        let s = "a".repeat(63);
        assert!(!glob_label(pat, s.as_bytes()));
    }
}
