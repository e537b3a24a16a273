//! Registry names: what clients send, parsed strictly and normalised to one canonical form.
//!
//! Clients name a registry in many ways: `host`, `host:port`, `https://host/v2/`,
//! `oci://host/repo/chart`, an image reference `host/repo:tag` or `host/repo@sha256:..`, or
//! one of Docker Hub's aliases. [`Registry::parse`] turns all of them into a lower-case
//! host plus an optional port. Anything that is not plainly a host name is rejected: a
//! credential broker must never guess which host a caller meant.
//!
//! Two readings differ where no `/` follows the first component. Where a client names a
//! registry (a docker credential helper's server URL, the endpoint's `registry=`, a rule's
//! pattern), [`Registry::parse`] reads `name:5000` as a host and a port, as `docker login`
//! does. Where it names an image (the kubelet's `image`), [`Registry::from_image_reference`]
//! follows the distribution reference grammar, as `docker pull` does: `name:5000` and
//! `nginx:latest` are Docker Hub repositories with a tag. [`Registry::from_registry_or_image`]
//! serves inputs that may be either.
//!
//! Error messages never repeat the whole input, since a malformed input may hold a
//! secret (`user:password@host`).

use std::fmt;

/// The canonical name of Docker Hub; `index.docker.io`, `registry-1.docker.io` and
/// `https://index.docker.io/v1/` all normalise to it.
pub const DOCKER_HUB: &str = "docker.io";

const DOCKER_HUB_ALIASES: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

/// The longest host name DNS allows.
pub const MAX_HOST_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;
/// Longest input accepted at all, so hostile input is rejected before any work.
const MAX_INPUT_LEN: usize = 4096;
/// The distribution grammar's longest repository (`library/nginx`, without registry, tag
/// or digest).
const MAX_REPOSITORY_LEN: usize = 255;

/// A normalised registry: a lower-case host and an optional port.
///
/// `example.com` and `example.com:443` are different registries, as they are to docker.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Registry {
    /// `host` or `host:port`, lower case; IPv6 literals keep their brackets.
    name: String,
    /// Length of the host part of `name`.
    host_len: usize,
    port: Option<u16>,
}

/// Why a registry name was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseError {
    /// Nothing was given.
    Empty,
    /// The input is longer than any registry name could be.
    TooLong,
    /// Whitespace or a control character somewhere in the input.
    WhitespaceOrControl,
    /// `user:password@host`: credentials must never travel inside a registry name.
    UserInfo,
    /// A scheme other than `http`, `https` or `oci`.
    UnsupportedScheme(String),
    /// A non-ASCII character in the host; the punycode (`xn--`) form is accepted.
    NonAscii,
    /// The port is not a number from 1 to 65535 written without leading zeros.
    InvalidPort(String),
    /// The host is longer than 253 characters.
    HostTooLong(usize),
    /// A label is empty (`a..b`, a leading or trailing dot) or longer than 63 characters,
    /// or holds a character other than letters, digits and inner hyphens.
    InvalidLabel(String),
    /// A bracketed IPv6 literal that does not parse.
    InvalidIpv6,
    /// The path after the host breaks the distribution grammar: an empty, `.` or `..`
    /// component, or characters a repository name, tag or digest cannot hold. The
    /// reference is refused rather than reduced to its host.
    InvalidPath,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Empty => f.write_str("registry name is empty"),
            ParseError::TooLong => write!(f, "registry name is longer than {MAX_INPUT_LEN} bytes"),
            ParseError::WhitespaceOrControl => {
                f.write_str("registry name contains whitespace or a control character")
            }
            ParseError::UserInfo => f.write_str(
                "registry name contains userinfo (user:password@host); credentials must not be embedded in a registry name",
            ),
            ParseError::UnsupportedScheme(s) => write!(
                f,
                "unsupported scheme `{s}` in registry name (expected https://, http:// or oci://)"
            ),
            ParseError::NonAscii => f.write_str(
                "registry host contains non-ASCII characters; use its punycode (xn--) form",
            ),
            ParseError::InvalidPort(p) => {
                write!(f, "invalid port `{p}` in registry name (expected 1-65535)")
            }
            ParseError::HostTooLong(n) => {
                write!(f, "registry host is {n} characters long; the limit is {MAX_HOST_LEN}")
            }
            ParseError::InvalidLabel(l) => write!(
                f,
                "invalid label `{l}` in registry host (labels are 1-63 letters, digits or inner hyphens)"
            ),
            ParseError::InvalidIpv6 => f.write_str("invalid IPv6 literal in registry host"),
            ParseError::InvalidPath => f.write_str(
                "invalid path in registry reference: each component must be a repository name (lower-case letters and digits, joined by `.`, `_`, `__` or `-`), with an optional `:tag` and `@digest`; empty, `.` and `..` components are refused",
            ),
        }
    }
}

impl std::error::Error for ParseError {}

/// Why an image reference was rejected ([`Registry::from_image_reference`]).
///
/// Like [`ParseError`], a message never repeats the input (it may hold a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReferenceError {
    /// Nothing was given.
    Empty,
    /// The input is longer than any image reference could be.
    TooLong,
    /// Whitespace or a control character somewhere in the input.
    WhitespaceOrControl,
    /// `user:password@host/repo`: credentials must never travel inside a reference.
    UserInfo,
    /// A scheme other than `oci://` before the reference.
    UnsupportedScheme(String),
    /// 64 hexadecimal characters alone: an image ID, which names no registry.
    ImageId,
    /// Not `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`: an empty, `.` or `..` component, or a
    /// character a repository component cannot hold.
    InvalidFormat,
    /// An upper-case letter in the repository (after the registry).
    UppercaseRepository,
    /// The repository is longer than 255 characters.
    RepositoryTooLong,
    /// The tag is not 1-128 of letters, digits, `_`, `.` and `-`, starting with a letter,
    /// a digit or `_`.
    InvalidTag,
    /// The digest is not `sha256`, `sha384` or `sha512` with its lower-case hex value.
    InvalidDigest,
    /// The registry part (or, read as a registry name, the whole input) is not a valid
    /// registry name.
    Registry(ParseError),
}

impl fmt::Display for ReferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReferenceError::Empty => f.write_str("image reference is empty"),
            ReferenceError::TooLong => {
                write!(f, "image reference is longer than {MAX_INPUT_LEN} bytes")
            }
            ReferenceError::WhitespaceOrControl => {
                f.write_str("image reference contains whitespace or a control character")
            }
            ReferenceError::UserInfo => f.write_str(
                "image reference contains userinfo (user:password@host); credentials must not be embedded in an image reference",
            ),
            ReferenceError::UnsupportedScheme(s) => write!(
                f,
                "unsupported scheme `{s}` in image reference (only oci:// may precede one)"
            ),
            ReferenceError::ImageId => f.write_str(
                "image reference is a 64-character hexadecimal image ID, which names no registry",
            ),
            ReferenceError::InvalidFormat => f.write_str(
                "invalid image reference: expected [REGISTRY/]REPOSITORY[:TAG][@DIGEST], each repository component lower-case letters and digits joined by `.`, `_`, `__` or `-`",
            ),
            ReferenceError::UppercaseRepository => f.write_str(
                "invalid image reference: the repository must be lower case (only the registry may have capitals)",
            ),
            ReferenceError::RepositoryTooLong => write!(
                f,
                "invalid image reference: the repository is longer than {MAX_REPOSITORY_LEN} characters"
            ),
            ReferenceError::InvalidTag => f.write_str(
                "invalid tag in image reference (1-128 letters, digits, `_`, `.` or `-`, not starting with `.` or `-`)",
            ),
            ReferenceError::InvalidDigest => f.write_str(
                "invalid digest in image reference (expected sha256:, sha384: or sha512: and the lower-case hex value of that length)",
            ),
            ReferenceError::Registry(e) => e.fmt(f),
        }
    }
}

/// `Registry(e)` shows `e` itself, so it names no source: the chain is printed once.
impl std::error::Error for ReferenceError {}

impl Registry {
    /// Parses what a client sent into a canonical registry.
    ///
    /// ```
    /// use regbroker_provider::Registry;
    /// let r = Registry::parse("https://123456789012.DKR.ecr.us-east-1.amazonaws.com/v2/").unwrap();
    /// assert_eq!(r.as_str(), "123456789012.dkr.ecr.us-east-1.amazonaws.com");
    /// assert_eq!(Registry::parse("index.docker.io").unwrap().as_str(), "docker.io");
    /// assert!(Registry::parse("user:pw@example.com").is_err());
    /// ```
    pub fn parse(input: &str) -> Result<Registry, ParseError> {
        if input.is_empty() {
            return Err(ParseError::Empty);
        }
        if input.len() > MAX_INPUT_LEN {
            return Err(ParseError::TooLong);
        }
        if has_whitespace_or_control(input) {
            return Err(ParseError::WhitespaceOrControl);
        }

        let scheme_end = input.as_bytes().windows(3).position(|w| w == b"://");
        let (rest, had_scheme) = match scheme_end {
            Some(i) => {
                let scheme = &input[..i];
                if !["https", "http", "oci"]
                    .iter()
                    .any(|s| s.eq_ignore_ascii_case(scheme))
                {
                    return Err(ParseError::UnsupportedScheme(shown_scheme(scheme)));
                }
                // An `oci://` URL is an image reference behind a scheme (Flux reads it with
                // the reference grammar), so docker's first-component rule applies to it;
                // an `http(s)://` URL's authority is always the host.
                (&input[i + 3..], !scheme.eq_ignore_ascii_case("oci"))
            }
            None => (input, false),
        };

        // The authority ends at the first '/' (a path), '?' or '#'.
        // Bytes, not chars: the three are ASCII, so their index is a char boundary (a
        // search for a set of chars costs more than the rest of the parse).
        let end = rest
            .bytes()
            .position(|b| matches!(b, b'/' | b'?' | b'#'))
            .unwrap_or(rest.len());
        let authority = &rest[..end];
        let has_path = end < rest.len();
        if authority.contains('@') {
            return Err(ParseError::UserInfo);
        }
        if rest[end..].starts_with('/') {
            let path = &rest[end + 1..];
            let path_end = path.find(['?', '#']).unwrap_or(path.len());
            check_path(&path[..path_end])?;
        }

        // An image reference without an `http(s)://` scheme follows docker's rule: the
        // first path component is a registry only if it is followed by a `/` and has a
        // dot or a colon, is `localhost`, or has an upper-case letter (a repository
        // cannot); otherwise the reference is a Docker Hub repository (`library/nginx`).
        if !had_scheme && has_path && !authority.is_empty() && !names_a_registry(authority) {
            return Ok(Registry::docker_hub());
        }
        Registry::from_authority(authority)
    }

    /// Reads an image reference as docker does (the distribution reference grammar,
    /// `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`, optionally behind `oci://`) and returns its
    /// registry. This is the reading for inputs that name an image, such as the kubelet's
    /// `image`: the first component is the registry only when a `/` follows it and it has
    /// a `.` or a `:`, is `localhost`, or has an upper-case letter; every other reference
    /// is on Docker Hub.
    ///
    /// ```
    /// use regbroker_provider::Registry;
    /// let hub = |s| Registry::from_image_reference(s).unwrap().to_string();
    /// assert_eq!(hub("nginx:latest"), "docker.io");
    /// assert_eq!(hub("name:5000"), "docker.io"); // the image `name`, tag `5000`
    /// assert_eq!(hub("name:5000/app"), "name:5000");
    /// assert_eq!(hub("fluxcd/flux@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"), "docker.io");
    /// assert_eq!(hub("localhost:5000/app"), "localhost:5000");
    /// assert!(Registry::from_image_reference("ghcr.io/Org/app").is_err());
    /// ```
    ///
    /// The registry part is held to [`Registry::parse`]'s rules (ports 1-65535 without
    /// leading zeros, DNS labels of letters, digits and inner hyphens), which are stricter
    /// than the grammar's; the rest must match the grammar exactly: lower-case repository
    /// components, a tag of at most 128 characters, a `sha256`, `sha384` or `sha512`
    /// digest of the right length, and a repository of at most 255 characters.
    pub fn from_image_reference(input: &str) -> Result<Registry, ReferenceError> {
        if input.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if input.len() > MAX_INPUT_LEN {
            return Err(ReferenceError::TooLong);
        }
        if input.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ReferenceError::WhitespaceOrControl);
        }
        let reference = match input.find("://") {
            Some(i) if input[..i].eq_ignore_ascii_case("oci") => &input[i + 3..],
            Some(i) => return Err(ReferenceError::UnsupportedScheme(shown_scheme(&input[..i]))),
            None => input,
        };
        if reference.is_empty() {
            return Err(ReferenceError::Empty);
        }
        // Credentials never travel in a name: `user:password@host/repo`.
        if let Some(slash) = reference.find('/')
            && reference[..slash].contains('@')
        {
            return Err(ReferenceError::UserInfo);
        }
        if reference.len() == 64
            && reference
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(ReferenceError::ImageId);
        }
        let (name_and_tag, digest) = match reference.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (reference, None),
        };
        // The tag is a `:` in the last component: a `:` before a `/` is a registry's port.
        let last = name_and_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_and_tag[last..].find(':') {
            Some(colon) => (
                &name_and_tag[..last + colon],
                Some(&name_and_tag[last + colon + 1..]),
            ),
            None => (name_and_tag, None),
        };
        let (domain, repository) = match name.split_once('/') {
            Some((first, rest)) if names_a_registry(first) => (Some(first), rest),
            _ => (None, name),
        };
        if !repository.split('/').all(is_path_component) {
            return Err(ReferenceError::InvalidFormat);
        }
        if repository.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(ReferenceError::UppercaseRepository);
        }
        // Docker Hub's official images are `library/NAME`: the limit counts the prefix.
        let official = domain.is_none() && !repository.contains('/');
        let length = repository.len() + if official { "library/".len() } else { 0 };
        if length > MAX_REPOSITORY_LEN {
            return Err(ReferenceError::RepositoryTooLong);
        }
        if tag.is_some_and(|t| !is_tag(t)) {
            return Err(ReferenceError::InvalidTag);
        }
        let registry = match domain {
            None => Registry::docker_hub(),
            Some(d) => Registry::from_authority(d).map_err(ReferenceError::Registry)?,
        };
        // Last: nothing else a message says may depend on the text after the `@`.
        if digest.is_some_and(|d| !is_known_digest(d)) {
            return Err(ReferenceError::InvalidDigest);
        }
        Ok(registry)
    }

    /// Reads an input that may name a registry or an image, such as `regbroker resolve`'s
    /// argument or a `[[secret]]`'s `registries`: the registry reading
    /// ([`Registry::parse`]) decides, so `name:5000` is the host `name` on port 5000 as
    /// `docker login name:5000` reads it; only where that reading is impossible because
    /// the input cannot hold a port (`nginx:latest`, `nginx@sha256:...`: no `/`, no
    /// scheme, and a `:` followed by something other than digits, or an `@`) does the
    /// image reading ([`Registry::from_image_reference`]) decide, and Docker Hub it is.
    /// An input with an `@` that is no valid image either is reported as userinfo
    /// (`user:password@host`), never echoed.
    ///
    /// ```
    /// use regbroker_provider::Registry;
    /// let read = |s| Registry::from_registry_or_image(s).unwrap().to_string();
    /// assert_eq!(read("name:5000"), "name:5000");
    /// assert_eq!(read("nginx:latest"), "docker.io");
    /// assert_eq!(read("https://r.example.com/v2/"), "r.example.com");
    /// assert!(Registry::from_registry_or_image("name:99999").is_err());
    /// ```
    pub fn from_registry_or_image(input: &str) -> Result<Registry, ReferenceError> {
        let registry_error = match Registry::parse(input) {
            Ok(registry) => return Ok(registry),
            Err(e) => e,
        };
        let bare = !input.contains('/') && !input.contains("://");
        let digest = bare && input.contains('@');
        let tag = bare
            && input
                .rsplit_once(':')
                .is_some_and(|(_, after)| !after.bytes().all(|b| b.is_ascii_digit()));
        match Registry::from_image_reference(input) {
            Ok(registry) if digest || tag => Ok(registry),
            // `user:password@host` is no image either: say what the registry reading saw.
            Err(image_error) if tag && !digest => Err(image_error),
            _ => Err(ReferenceError::Registry(registry_error)),
        }
    }

    /// `host[:port]`, checked and normalised; Docker Hub's aliases become `docker.io`.
    fn from_authority(authority: &str) -> Result<Registry, ParseError> {
        let (host, port) = split_host_port(authority)?;
        let host = normalise_host(host)?;
        if port.is_none() && DOCKER_HUB_ALIASES.contains(&host.as_str()) {
            return Ok(Registry::docker_hub());
        }
        Ok(Registry::from_parts(host, port))
    }

    /// Docker Hub under its canonical name.
    pub fn docker_hub() -> Registry {
        Registry::from_parts(DOCKER_HUB.to_string(), None)
    }

    fn from_parts(host: String, port: Option<u16>) -> Registry {
        let host_len = host.len();
        let name = match port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        };
        Registry {
            name,
            host_len,
            port,
        }
    }

    /// The canonical name, `host` or `host:port`.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The lower-case host, without the port.
    pub fn host(&self) -> &str {
        &self.name[..self.host_len]
    }

    /// The port, if the client named one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The host's dot-separated labels (an IPv6 literal is one label).
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        let host = self.host();
        let ipv6 = host.starts_with('[');
        host.split(move |c| !ipv6 && c == '.')
    }

    /// Whether this is Docker Hub.
    pub fn is_docker_hub(&self) -> bool {
        self.name == DOCKER_HUB
    }
}

impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registry({})", self.name)
    }
}

impl std::str::FromStr for Registry {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Registry::parse(s)
    }
}

/// Only echo a scheme that looks like one; never an arbitrary prefix.
fn shown_scheme(scheme: &str) -> String {
    if scheme.len() <= 16
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-')
    {
        scheme.to_string()
    } else {
        "?".to_string()
    }
}

/// Whether the first component of a reference that a `/` follows is a registry, as
/// distribution's `splitDockerDomain` decides: it has a `.` (a domain or an IPv4
/// address) or a `:` (a port, or an IPv6 literal), is `localhost`, or has an upper-case
/// letter (which no repository component may have).
fn names_a_registry(first: &str) -> bool {
    first.contains(['.', ':'])
        || first == "localhost"
        || first.bytes().any(|b| b.is_ascii_uppercase())
}

/// A `sha256`, `sha384` or `sha512` digest with its lower-case hex of the right length:
/// the grammar's digest as go-digest validates it (other algorithms are not registered).
fn is_known_digest(d: &str) -> bool {
    let Some((algorithm, hex)) = d.split_once(':') else {
        return false;
    };
    let want = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return false,
    };
    hex.len() == want
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks what follows `host/` against the distribution reference grammar: repository
/// path components (`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`, letters taken in either
/// case so a URL typed in capitals still names its host), a `:tag` on the last one and an
/// `@digest` at the end. One trailing `/` is allowed (Flux's
/// `oci://ghcr.io/my-org/charts/`), as is the empty path of `https://host/`.
fn check_path(path: &str) -> Result<(), ParseError> {
    if path.is_empty() {
        return Ok(());
    }
    let path = path.strip_suffix('/').unwrap_or(path);
    let (path, digest) = match path.split_once('@') {
        Some((p, d)) => (p, Some(d)),
        None => (path, None),
    };
    if let Some(d) = digest
        && !is_digest(d)
    {
        return Err(ParseError::InvalidPath);
    }
    let (path, tag) = match path.rsplit_once('/') {
        Some((head, last)) => match last.split_once(':') {
            Some((name, tag)) => (&path[..head.len() + 1 + name.len()], Some(tag)),
            None => (path, None),
        },
        None => match path.split_once(':') {
            Some((name, tag)) => (name, Some(tag)),
            None => (path, None),
        },
    };
    if let Some(t) = tag
        && !is_tag(t)
    {
        return Err(ParseError::InvalidPath);
    }
    if path.split('/').all(is_path_component) {
        Ok(())
    } else {
        Err(ParseError::InvalidPath)
    }
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`, case-insensitively.
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: `.`, `_`, `__` or one or more `-`, then an alphanumeric.
        let start = i;
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if b.get(i) == Some(&b'_') {
                    i += 1;
                }
            }
            b'-' => {
                while b.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || !b.get(i).copied().is_some_and(is_alnum) {
            return false;
        }
    }
    true
}

/// `[\w][\w.-]{0,127}`.
fn is_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b[1..].iter().all(|&c| word(c) || c == b'.' || c == b'-')
}

/// `algorithm:encoded`: `[a-z0-9]+(?:[+._-][a-z0-9]+)*` `:` `[a-zA-Z0-9=_-]+`.
fn is_digest(d: &str) -> bool {
    let Some((alg, enc)) = d.split_once(':') else {
        return false;
    };
    let alg_ok = !alg.is_empty()
        && alg.split(['+', '.', '_', '-']).all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        });
    let enc_ok = !enc.is_empty()
        && enc
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'=' || b == b'_' || b == b'-');
    alg_ok && enc_ok
}

fn split_host_port(authority: &str) -> Result<(&str, Option<u16>), ParseError> {
    if let Some(rest) = authority.strip_prefix('[') {
        let close = rest.find(']').ok_or(ParseError::InvalidIpv6)?;
        let host = &authority[..close + 2];
        let after = &rest[close + 1..];
        let port = match after {
            "" => None,
            p => Some(parse_port(
                p.strip_prefix(':').ok_or(ParseError::InvalidIpv6)?,
            )?),
        };
        return Ok((host, port));
    }
    match authority.split_once(':') {
        None => Ok((authority, None)),
        Some((host, port)) => Ok((host, Some(parse_port(port)?))),
    }
}

fn parse_port(p: &str) -> Result<u16, ParseError> {
    let shown = || {
        let mut s: String = p.chars().take(8).collect();
        if p.len() > 8 {
            s.push('…');
        }
        ParseError::InvalidPort(s)
    };
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) || p.starts_with('0') {
        return Err(shown());
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(shown()),
        Ok(n) => Ok(n),
    }
}

fn normalise_host(host: &str) -> Result<String, ParseError> {
    if host.is_empty() {
        return Err(ParseError::Empty);
    }
    if !host.is_ascii() {
        return Err(ParseError::NonAscii);
    }
    if host.starts_with('[') {
        let inner = &host[1..host.len() - 1];
        let addr: std::net::Ipv6Addr = inner.parse().map_err(|_| ParseError::InvalidIpv6)?;
        return Ok(format!("[{addr}]"));
    }
    if host.len() > MAX_HOST_LEN {
        return Err(ParseError::HostTooLong(host.len()));
    }
    let host = host.to_ascii_lowercase();
    for label in host.split('.') {
        let valid = !label.is_empty()
            && label.len() <= MAX_LABEL_LEN
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !valid {
            let mut shown: String = label.chars().take(MAX_LABEL_LEN).collect();
            if label.len() > MAX_LABEL_LEN {
                shown.push('…');
            }
            return Err(ParseError::InvalidLabel(shown));
        }
    }
    Ok(host)
}

/// Whether `input` holds whitespace or a control character. Every request's registry
/// passes here: an ASCII input (nearly all) is checked a byte at a time, where each such
/// character is at most a space or DEL; any other is decoded and checked in full.
fn has_whitespace_or_control(input: &str) -> bool {
    if input.is_ascii() {
        return input.bytes().any(|b| b <= b' ' || b == 0x7f);
    }
    input.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(input: &str) -> String {
        match Registry::parse(input) {
            Ok(r) => r.to_string(),
            Err(e) => panic!("{input:?} should parse: {e}"),
        }
    }

    #[test]
    fn the_ascii_check_refuses_exactly_what_the_unicode_rule_refuses() {
        let rule = |s: &str| s.chars().any(|c| c.is_whitespace() || c.is_control());
        for b in 0u8..0x80 {
            let c = char::from(b);
            for s in [
                c.to_string(),
                format!("gcr.io{c}x"),
                format!("{c}{}", "a".repeat(40)),
            ] {
                assert_eq!(has_whitespace_or_control(&s), rule(&s), "{b:#04x}");
            }
        }
        // Past ASCII: no-break space, em space, next line (a C1 control), a line separator;
        // and characters that are neither.
        for c in [
            '\u{a0}', '\u{2003}', '\u{85}', '\u{2028}', '\u{9f}', 'é', '✓',
        ] {
            let s = format!("gcr.io{c}");
            assert_eq!(has_whitespace_or_control(&s), rule(&s), "{c:?}");
        }
        assert!(has_whitespace_or_control("gcr.io\u{a0}"));
        assert!(!has_whitespace_or_control("bücher.example"));
    }

    #[test]
    fn accepted_forms_normalise_to_one_name() {
        let cases = [
            ("example.com", "example.com"),
            ("EXAMPLE.com", "example.com"),
            ("example.com:5000", "example.com:5000"),
            ("https://example.com/v2/", "example.com"),
            ("HTTPS://Example.COM/v2/", "example.com"),
            ("http://example.com", "example.com"),
            ("http://example.com:8080/", "example.com:8080"),
            ("oci://example.com/charts/podinfo", "example.com"),
            ("example.com/repo:tag", "example.com"),
            ("example.com/a/b/c@sha256:0123abcd", "example.com"),
            ("example.com:443/repo", "example.com:443"),
            ("localhost/repo", "localhost"),
            ("localhost:5000", "localhost:5000"),
            ("127.0.0.1:5000", "127.0.0.1:5000"),
            ("[::1]:5000", "[::1]:5000"),
            ("[0:0::1]", "[::1]"),
            ("docker.io", "docker.io"),
            ("index.docker.io", "docker.io"),
            ("registry-1.docker.io", "docker.io"),
            ("https://index.docker.io/v1/", "docker.io"),
            ("library/nginx", "docker.io"),
            ("fluxcd/flux:latest", "docker.io"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("registry", "registry"),
            ("oci://ghcr.io/my-org/charts/", "ghcr.io"),
            ("https://example.com/", "example.com"),
            ("example.com/a.b/c__d/e-f--g/h_i:v1.2-rc_3", "example.com"),
            ("example.com:5000/repo@sha256:abcd", "example.com:5000"),
            ("example.com/repo:tag@sha256:abcd", "example.com"),
            ("https://example.com/v2/?scope=x", "example.com"),
            (
                "123456789012.dkr.ecr.us-east-1.amazonaws.com",
                "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(ok(input), want, "input {input:?}");
        }
    }

    #[test]
    fn docker_hub_with_a_port_is_not_docker_hub() {
        assert_eq!(ok("docker.io:443"), "docker.io:443");
        assert!(!Registry::parse("docker.io:443").unwrap().is_docker_hub());
    }

    #[test]
    fn host_and_port_accessors() {
        let r = Registry::parse("Example.com:5000/x").unwrap();
        assert_eq!(r.host(), "example.com");
        assert_eq!(r.port(), Some(5000));
        assert_eq!(r.labels().collect::<Vec<_>>(), ["example", "com"]);
        let r = Registry::parse("[::1]:5000").unwrap();
        assert_eq!(r.host(), "[::1]");
        assert_eq!(r.labels().count(), 1);
    }

    #[test]
    fn hostile_inputs_are_rejected_with_a_reason() {
        let long_label = format!("{}.com", "a".repeat(64));
        let long_host = format!("{}.com", ["abcdefghi"; 26].join("."));
        type Check = fn(&ParseError) -> bool;
        let cases: Vec<(&str, Check)> = vec![
            ("", |e| *e == ParseError::Empty),
            (" example.com", |e| *e == ParseError::WhitespaceOrControl),
            ("example.com\n", |e| *e == ParseError::WhitespaceOrControl),
            ("exa mple.com", |e| *e == ParseError::WhitespaceOrControl),
            ("example.com\0", |e| *e == ParseError::WhitespaceOrControl),
            ("example.com\u{7f}", |e| {
                *e == ParseError::WhitespaceOrControl
            }),
            ("user:pass@example.com", |e| *e == ParseError::UserInfo),
            ("https://user:pass@example.com/v2/", |e| {
                *e == ParseError::UserInfo
            }),
            ("@example.com", |e| *e == ParseError::UserInfo),
            ("ftp://example.com", |e| {
                matches!(e, ParseError::UnsupportedScheme(_))
            }),
            ("file:///etc/passwd", |e| {
                matches!(e, ParseError::UnsupportedScheme(_))
            }),
            ("example.com:", |e| matches!(e, ParseError::InvalidPort(_))),
            ("example.com:0", |e| matches!(e, ParseError::InvalidPort(_))),
            ("example.com:65536", |e| {
                matches!(e, ParseError::InvalidPort(_))
            }),
            ("example.com:05000", |e| {
                matches!(e, ParseError::InvalidPort(_))
            }),
            ("example.com:http", |e| {
                matches!(e, ParseError::InvalidPort(_))
            }),
            ("example.com:5000:1", |e| {
                matches!(e, ParseError::InvalidPort(_))
            }),
            ("example.com:+80", |e| {
                matches!(e, ParseError::InvalidPort(_))
            }),
            ("example..com", |e| matches!(e, ParseError::InvalidLabel(_))),
            (".example.com", |e| matches!(e, ParseError::InvalidLabel(_))),
            ("example.com.", |e| matches!(e, ParseError::InvalidLabel(_))),
            ("-example.com", |e| matches!(e, ParseError::InvalidLabel(_))),
            ("example-.com", |e| matches!(e, ParseError::InvalidLabel(_))),
            ("exa_mple.com", |e| matches!(e, ParseError::InvalidLabel(_))),
            ("example.com%2f", |e| {
                matches!(e, ParseError::InvalidLabel(_))
            }),
            ("ex%61mple.com", |e| {
                matches!(e, ParseError::InvalidLabel(_))
            }),
            ("example.com\\evil.com", |e| {
                matches!(e, ParseError::InvalidLabel(_))
            }),
            ("*.example.com", |e| {
                matches!(e, ParseError::InvalidLabel(_))
            }),
            ("exämple.com", |e| *e == ParseError::NonAscii),
            ("ｅxample.com", |e| *e == ParseError::NonAscii),
            (&long_label, |e| matches!(e, ParseError::InvalidLabel(_))),
            (&long_host, |e| matches!(e, ParseError::HostTooLong(_))),
            ("[::1", |e| *e == ParseError::InvalidIpv6),
            ("[not-ip]:5000", |e| *e == ParseError::InvalidIpv6),
            ("[::1]x", |e| *e == ParseError::InvalidIpv6),
            ("https:///v2/", |e| *e == ParseError::Empty),
            ("/repo", |e| *e == ParseError::Empty),
            ("?x", |e| *e == ParseError::Empty),
        ];
        for (input, check) in cases {
            match Registry::parse(input) {
                Ok(r) => panic!("{input:?} should be rejected, got {r}"),
                Err(e) => assert!(check(&e), "{input:?} rejected for the wrong reason: {e:?}"),
            }
        }
    }

    #[test]
    fn references_whose_path_breaks_the_distribution_grammar_are_refused() {
        for input in [
            "ghcr.io/../../etc/passwd",
            "ghcr.io/org/../other",
            "ghcr.io/./repo",
            "ghcr.io/org//repo",
            "ghcr.io//",
            "oci://ghcr.io/org/charts//",
            "ghcr.io/org/repo/.",
            "ghcr.io/-repo",
            "ghcr.io/repo-",
            "ghcr.io/re...po",
            "ghcr.io/re___po",
            "ghcr.io/repo%2f..",
            "ghcr.io/repo:",
            "ghcr.io/repo:-tag",
            "ghcr.io/repo:ta/g",
            "ghcr.io/repo@",
            "ghcr.io/repo@sha256",
            "ghcr.io/repo@SHA256:abc",
            "ghcr.io/repo@sha256:ab/c",
            "library/../nginx",
            "https://example.com/v2/../../admin",
        ] {
            assert_eq!(
                Registry::parse(input),
                Err(ParseError::InvalidPath),
                "{input:?}"
            );
        }
        let long_tag = format!("ghcr.io/repo:{}", "t".repeat(129));
        assert_eq!(Registry::parse(&long_tag), Err(ParseError::InvalidPath));
        let msg = Registry::parse("ghcr.io/../secret-ish")
            .unwrap_err()
            .to_string();
        assert!(!msg.contains("secret-ish"), "the path is not echoed: {msg}");
    }

    #[test]
    fn errors_never_echo_userinfo() {
        for input in [
            "alice:hunter2@example.com",
            "https://alice:hunter2@example.com:5000/v2/",
            "alice:hunter2@example.com:99999",
        ] {
            let msg = Registry::parse(input).unwrap_err().to_string();
            assert!(!msg.contains("hunter2"), "{msg}");
        }
    }

    #[test]
    fn over_long_input_is_rejected_before_scanning() {
        let input = "a".repeat(MAX_INPUT_LEN + 1);
        assert_eq!(Registry::parse(&input), Err(ParseError::TooLong));
    }

    #[test]
    fn input_of_exactly_the_limit_is_parsed() {
        // A host, then a path that brings the reference to exactly 4096 bytes.
        let head = "r.example.com/";
        let input = format!("{head}{}", "a".repeat(MAX_INPUT_LEN - head.len()));
        assert_eq!(ok(&input), "r.example.com");
    }

    #[test]
    fn an_unsupported_scheme_is_named_only_when_it_looks_like_one() {
        let scheme = |input: &str| match Registry::parse(input) {
            Err(ParseError::UnsupportedScheme(s)) => s,
            other => panic!("{input}: {other:?}"),
        };
        assert_eq!(scheme("ftp://r.example.com"), "ftp");
        assert_eq!(scheme("git+ssh://r.example.com"), "git+ssh");
        assert_eq!(scheme("x-y://r.example.com"), "x-y");
        assert_eq!(
            scheme(&format!("{}://r.example.com", "s".repeat(16))),
            "s".repeat(16)
        );
        assert_eq!(scheme(&format!("{}://r.example.com", "s".repeat(17))), "?");
        assert_eq!(scheme("a_b://r.example.com"), "?");
        assert_eq!(scheme("a.b://r.example.com"), "?");
    }

    #[test]
    fn every_error_says_what_is_wrong() {
        for (err, needle) in [
            (ParseError::Empty, "registry name is empty"),
            (ParseError::TooLong, "longer than 4096 bytes"),
            (ParseError::UserInfo, "userinfo"),
            (
                ParseError::HostTooLong(300),
                "300 characters long; the limit is 253",
            ),
            (ParseError::InvalidPath, "invalid path"),
        ] {
            let msg = err.to_string();
            assert!(msg.contains(needle), "{msg}");
        }
    }

    #[test]
    fn the_name_and_docker_hub_are_what_the_parse_gave() {
        let r = Registry::parse("https://R.example.com:5000/v2/").unwrap();
        assert_eq!(r.as_str(), "r.example.com:5000");
        assert!(!r.is_docker_hub());
        assert!(Registry::parse("index.docker.io").unwrap().is_docker_hub());
    }

    #[test]
    fn references_with_tags_and_digests_of_every_allowed_form_parse() {
        assert_eq!(ok("r.example.com/a/bbbb:v1"), "r.example.com");
        // The name before a tag is checked whole: cut short, `c-dd` would end in `-`.
        assert_eq!(ok("r.example.com/ab/c-dd:v1"), "r.example.com");
        assert_eq!(ok("r.example.com/app@sha256:AB_c-d="), "r.example.com");
        assert_eq!(ok("r.example.com:65535/app"), "r.example.com:65535");
    }

    #[test]
    fn a_bad_port_is_shown_cut_to_8_characters_with_a_mark() {
        let port = |input: &str| match Registry::parse(input) {
            Err(ParseError::InvalidPort(p)) => p,
            other => panic!("{input}: {other:?}"),
        };
        assert_eq!(port("r.example.com:123456789"), "12345678…");
        assert_eq!(port("r.example.com:12345678"), "12345678");
        assert_eq!(port("r.example.com:65536"), "65536");
        assert_eq!(port("r.example.com:0"), "0");
    }

    #[test]
    fn hosts_of_253_characters_parse_and_a_bad_label_is_shown_cut_with_a_mark() {
        let host = |len: usize| {
            let mut h = "a".repeat(63);
            while h.len() < len {
                let room = (len - h.len() - 1).min(63);
                h.push('.');
                h.push_str(&"b".repeat(room));
            }
            h
        };
        assert_eq!(ok(&host(253)), host(253));
        assert_eq!(
            Registry::parse(&host(254)),
            Err(ParseError::HostTooLong(254))
        );
        let label = |input: &str| match Registry::parse(input) {
            Err(ParseError::InvalidLabel(l)) => l,
            other => panic!("{input}: {other:?}"),
        };
        let long = format!("{}.example.com", "c".repeat(64));
        assert_eq!(label(&long), format!("{}…", "c".repeat(63)));
        let exact = format!("-{}.example.com", "c".repeat(62));
        assert_eq!(label(&exact), format!("-{}", "c".repeat(62)));
        assert_eq!(label("-a.example.com"), "-a");
    }

    const SHA256: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// The three readings of one input, as `Some(registry)` or `None` (refused).
    fn readings(input: &str) -> [Option<String>; 3] {
        [
            Registry::parse(input).ok().map(|r| r.to_string()),
            Registry::from_image_reference(input)
                .ok()
                .map(|r| r.to_string()),
            Registry::from_registry_or_image(input)
                .ok()
                .map(|r| r.to_string()),
        ]
    }

    #[test]
    fn ambiguous_inputs_read_one_way_as_a_registry_and_another_as_an_image() {
        let digest = format!("nginx@sha256:{SHA256}");
        let tagged_digest = format!("nginx:1.27@sha256:{SHA256}");
        let s = |v: &str| Some(v.to_string());
        // (input, as a registry name, as an image reference, where either may be meant)
        let cases: Vec<(&str, [Option<String>; 3])> = vec![
            (
                "name:5000",
                [s("name:5000"), s("docker.io"), s("name:5000")],
            ),
            (
                "name:5000/img",
                [s("name:5000"), s("name:5000"), s("name:5000")],
            ),
            ("nginx:latest", [None, s("docker.io"), s("docker.io")]),
            ("nginx", [s("nginx"), s("docker.io"), s("nginx")]),
            (
                "localhost:5000",
                [s("localhost:5000"), s("docker.io"), s("localhost:5000")],
            ),
            (
                "localhost:5000/x",
                [
                    s("localhost:5000"),
                    s("localhost:5000"),
                    s("localhost:5000"),
                ],
            ),
            (
                "localhost/x",
                [s("localhost"), s("localhost"), s("localhost")],
            ),
            ("name/x", [s("docker.io"), s("docker.io"), s("docker.io")]),
            (
                "name.example/x",
                [s("name.example"), s("name.example"), s("name.example")],
            ),
            ("Name/x", [s("name"), s("name"), s("name")]),
            (
                "example.com",
                [s("example.com"), s("docker.io"), s("example.com")],
            ),
            (&digest, [None, s("docker.io"), s("docker.io")]),
            (&tagged_digest, [None, s("docker.io"), s("docker.io")]),
            (
                "library/nginx:1.27",
                [s("docker.io"), s("docker.io"), s("docker.io")],
            ),
            (
                "index.docker.io/library/nginx",
                [s("docker.io"), s("docker.io"), s("docker.io")],
            ),
            (
                "registry-1.docker.io/library/nginx",
                [s("docker.io"), s("docker.io"), s("docker.io")],
            ),
            (
                "oci://nginx/app",
                [s("docker.io"), s("docker.io"), s("docker.io")],
            ),
            (
                "oci://name:5000/app",
                [s("name:5000"), s("name:5000"), s("name:5000")],
            ),
            (
                "OCI://ghcr.io/org/app:v1",
                [s("ghcr.io"), s("ghcr.io"), s("ghcr.io")],
            ),
            (
                "[::1]:5000/x",
                [s("[::1]:5000"), s("[::1]:5000"), s("[::1]:5000")],
            ),
            (
                "127.0.0.1:5000/x:1",
                [
                    s("127.0.0.1:5000"),
                    s("127.0.0.1:5000"),
                    s("127.0.0.1:5000"),
                ],
            ),
            (
                "https://name:5000/v2/",
                [s("name:5000"), None, s("name:5000")],
            ),
            // A port that cannot be a port is a registry error where a registry is meant,
            // never a silent Docker Hub tag.
            ("name:99999", [None, s("docker.io"), None]),
            ("name:0", [None, s("docker.io"), None]),
            // A capital in the repository is refused where the reference grammar decides.
            ("ghcr.io/Org/app", [s("ghcr.io"), None, s("ghcr.io")]),
            ("Nginx:latest", [None, None, None]),
        ];
        for (input, want) in cases {
            assert_eq!(
                readings(input),
                want,
                "input {input:?}: [registry, image, either]"
            );
        }
    }

    #[test]
    fn image_references_of_every_grammar_form_name_their_registry() {
        let long_repo = "r".repeat(MAX_REPOSITORY_LEN);
        let official = "r".repeat(MAX_REPOSITORY_LEN - "library/".len());
        let cases = [
            ("busybox", "docker.io"),
            ("docker.io/busybox", "docker.io"),
            ("fluxcd/flux:v1.2.3", "docker.io"),
            ("a.b/c__d/e-f--g/h_i:v1.2-rc_3", "a.b"),
            ("ghcr.io/stefanprodan/podinfo:6.7.0", "ghcr.io"),
            (
                "ghcr.io/stefanprodan/podinfo@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "ghcr.io",
            ),
            ("REGISTRY.example.com:443/app", "registry.example.com:443"),
            ("xn--bcher-kva.example/app", "xn--bcher-kva.example"),
            ("LOCALDOMAIN/app", "localdomain"),
            (
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1",
                "123456789012.dkr.ecr.us-east-1.amazonaws.com",
            ),
            ("oci://ghcr.io/org/charts/podinfo", "ghcr.io"),
            // All hex but not 64 long, and 64 long but not all hex: names, not image IDs.
            ("cafe", "docker.io"),
            ("deadbeef:1", "docker.io"),
            (&*"g".repeat(64), "docker.io"),
        ];
        for (input, want) in cases {
            match Registry::from_image_reference(input) {
                Ok(r) => assert_eq!(r.as_str(), want, "{input:?}"),
                Err(e) => panic!("{input:?} should parse: {e}"),
            }
        }
        for input in [
            format!("ghcr.io/{long_repo}"),
            official.clone(),
            format!("nginx:{}", "t".repeat(128)),
            format!("nginx@sha384:{}", "a".repeat(96)),
            format!("nginx@sha512:{}", "a".repeat(128)),
        ] {
            assert!(Registry::from_image_reference(&input).is_ok(), "{input}");
        }
    }

    #[test]
    fn image_references_that_break_the_grammar_are_refused_with_a_reason() {
        use ReferenceError as E;
        let image_id = SHA256.to_string();
        let long_host = format!("{}.com/x", ["abcdefghi"; 26].join("."));
        let cases: Vec<(String, E)> = vec![
            (String::new(), E::Empty),
            ("oci://".into(), E::Empty),
            ("x".repeat(MAX_INPUT_LEN + 1), E::TooLong),
            (" nginx".into(), E::WhitespaceOrControl),
            ("nginx\n".into(), E::WhitespaceOrControl),
            ("ngi\tnx".into(), E::WhitespaceOrControl),
            ("nginx\0".into(), E::WhitespaceOrControl),
            ("nginx\u{7f}".into(), E::WhitespaceOrControl),
            ("nginx\u{85}".into(), E::WhitespaceOrControl),
            ("ghcr.io/\u{200b}x".into(), E::InvalidFormat),
            ("u:p@ghcr.io/x".into(), E::UserInfo),
            ("@ghcr.io/x".into(), E::UserInfo),
            ("oci://u:p@ghcr.io/x".into(), E::UserInfo),
            (
                "https://ghcr.io/x".into(),
                E::UnsupportedScheme("https".into()),
            ),
            (
                "docker://nginx".into(),
                E::UnsupportedScheme("docker".into()),
            ),
            ("a.b://ghcr.io/x".into(), E::UnsupportedScheme("?".into())),
            (image_id, E::ImageId),
            ("ghcr.io/".into(), E::InvalidFormat),
            ("/x".into(), E::InvalidFormat),
            ("x/".into(), E::InvalidFormat),
            ("ghcr.io//x".into(), E::InvalidFormat),
            ("ghcr.io/../x".into(), E::InvalidFormat),
            ("ghcr.io/./x".into(), E::InvalidFormat),
            ("ghcr.io/x/..".into(), E::InvalidFormat),
            ("ghcr.io/-x".into(), E::InvalidFormat),
            ("ghcr.io/x%2f..".into(), E::InvalidFormat),
            ("ghcr.io/x?y".into(), E::InvalidFormat),
            ("ghcr.io/x#y".into(), E::InvalidFormat),
            ("ghcr.io/x\\y".into(), E::InvalidFormat),
            ("ghcr.io/é".into(), E::InvalidFormat),
            (":latest".into(), E::InvalidFormat),
            ("[::1]:5000".into(), E::InvalidFormat),
            ("ghcr.io/Org/app".into(), E::UppercaseRepository),
            ("Nginx".into(), E::UppercaseRepository),
            (
                "r".repeat(MAX_REPOSITORY_LEN - "library/".len() + 1),
                E::RepositoryTooLong,
            ),
            (
                format!("ghcr.io/{}", "r".repeat(MAX_REPOSITORY_LEN + 1)),
                E::RepositoryTooLong,
            ),
            ("nginx:".into(), E::InvalidTag),
            ("nginx:-x".into(), E::InvalidTag),
            ("nginx:.x".into(), E::InvalidTag),
            ("nginx:a:b".into(), E::InvalidTag),
            (format!("nginx:{}", "t".repeat(129)), E::InvalidTag),
            ("nginx@".into(), E::InvalidDigest),
            ("nginx@sha256:abc".into(), E::InvalidDigest),
            (format!("nginx@SHA256:{SHA256}"), E::InvalidDigest),
            (
                format!("nginx@sha256:{}", SHA256.to_uppercase()),
                E::InvalidDigest,
            ),
            (format!("nginx@md5:{}", &SHA256[..32]), E::InvalidDigest),
            (format!("nginx@sha256:{SHA256}0"), E::InvalidDigest),
            (
                format!("nginx@sha256:{SHA256}@sha256:{SHA256}"),
                E::InvalidDigest,
            ),
            (
                "name:0/x".into(),
                E::Registry(ParseError::InvalidPort("0".into())),
            ),
            (
                "name:05000/x".into(),
                E::Registry(ParseError::InvalidPort("05000".into())),
            ),
            (
                "name:http/x".into(),
                E::Registry(ParseError::InvalidPort("http".into())),
            ),
            (
                "exa_mple.com/x".into(),
                E::Registry(ParseError::InvalidLabel("exa_mple".into())),
            ),
            (
                "example.com./x".into(),
                E::Registry(ParseError::InvalidLabel(String::new())),
            ),
            (
                "a..b/x".into(),
                E::Registry(ParseError::InvalidLabel(String::new())),
            ),
            ("exämple.com/x".into(), E::Registry(ParseError::NonAscii)),
            ("ｅxample.com/x".into(), E::Registry(ParseError::NonAscii)),
            ("[::1/x".into(), E::Registry(ParseError::InvalidIpv6)),
            (
                "[fe80::1%25eth0]:5000/x".into(),
                E::Registry(ParseError::InvalidIpv6),
            ),
            (long_host, E::Registry(ParseError::HostTooLong(263))),
        ];
        for (input, want) in cases {
            assert_eq!(
                Registry::from_image_reference(&input),
                Err(want),
                "{:?}",
                input.chars().take(80).collect::<String>()
            );
        }
        // Exactly the limit is read (and refused by the grammar: no reference is that
        // long), one more is too long.
        assert_eq!(
            Registry::from_image_reference(&"x".repeat(MAX_INPUT_LEN)),
            Err(E::RepositoryTooLong)
        );
    }

    #[test]
    fn a_host_that_resembles_a_cloud_registry_stays_the_host_it_is() {
        // Only the registry part decides; a cloud host in the repository names nothing,
        // and one without a `/` after it is a Docker Hub repository.
        let ecr = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
        let cases = [
            (format!("{ecr}.evil.com/x"), format!("{ecr}.evil.com")),
            (format!("evil.com/{ecr}/x"), "evil.com".to_string()),
            (
                format!("evil.com:5000/{ecr}:1"),
                "evil.com:5000".to_string(),
            ),
            (format!("docker.io/{ecr}/x"), "docker.io".to_string()),
            (ecr.to_string(), "docker.io".to_string()),
            (format!("{ecr}:latest"), "docker.io".to_string()),
            (format!("oci://evil.com/{ecr}/x"), "evil.com".to_string()),
            (
                "myregistry.azurecr.io.evil.com/x".to_string(),
                "myregistry.azurecr.io.evil.com".to_string(),
            ),
        ];
        for (input, want) in cases {
            let got = Registry::from_image_reference(&input).map(|r| r.to_string());
            assert_eq!(got.as_deref(), Ok(want.as_str()), "{input}");
        }
        for input in [
            format!("{ecr}@evil.com/x"),
            format!("evil.com@{ecr}/x"),
            format!("{ecr}\\@evil.com/x"),
            format!("{ecr} /x"),
            format!("{ecr}%2fevil.com/x"),
            format!("{ecr}#@evil.com/x"),
            format!("{ecr}?.evil.com/x"),
        ] {
            assert!(
                Registry::from_image_reference(&input).is_err(),
                "{input} should be refused"
            );
        }
    }

    #[test]
    fn image_reference_errors_never_echo_userinfo_or_the_repository() {
        for input in [
            "alice:hunter2@ghcr.io/x",
            "oci://alice:hunter2@ghcr.io/x",
            "ghcr.io/hunter2/../x",
            "ghcr.io/Hunter2",
            "hunter2:-x",
            "nginx@hunter2",
        ] {
            let msg = Registry::from_image_reference(input)
                .unwrap_err()
                .to_string();
            assert!(!msg.to_lowercase().contains("hunter2"), "{input}: {msg}");
        }
    }

    #[test]
    fn either_reading_reports_the_registry_error_unless_only_an_image_fits() {
        let err = |input: &str| Registry::from_registry_or_image(input).unwrap_err();
        assert_eq!(
            err("name:99999"),
            ReferenceError::Registry(ParseError::InvalidPort("99999".into()))
        );
        assert_eq!(
            err("user:pw@example.com/x"),
            ReferenceError::Registry(ParseError::UserInfo)
        );
        assert_eq!(err("Nginx:latest"), ReferenceError::UppercaseRepository);
        assert_eq!(err("nginx:-x"), ReferenceError::InvalidTag);
        // With an `@` that makes no image, userinfo is the likelier mistake to report.
        assert_eq!(
            err("user:pw@example.com"),
            ReferenceError::Registry(ParseError::UserInfo)
        );
        assert_eq!(
            err("nginx@sha256:abc"),
            ReferenceError::Registry(ParseError::UserInfo)
        );
        assert_eq!(
            err("ftp://x"),
            ReferenceError::Registry(ParseError::UnsupportedScheme("ftp".into()))
        );
        // A URL is no bare image: `oci://nginx:latest` names host `nginx`, port `latest`.
        assert!(
            matches!(err("oci://nginx:latest"), ReferenceError::Registry(_)),
            "{:?}",
            err("oci://nginx:latest")
        );
        // The message of a registry error is the registry error's own.
        assert_eq!(err("").to_string(), ParseError::Empty.to_string());
    }

    #[test]
    fn every_reference_error_says_what_is_wrong() {
        use ReferenceError as E;
        for (err, needle) in [
            (E::Empty, "image reference is empty"),
            (E::TooLong, "longer than 4096 bytes"),
            (E::WhitespaceOrControl, "whitespace or a control character"),
            (E::UserInfo, "userinfo"),
            (
                E::UnsupportedScheme("ftp".into()),
                "unsupported scheme `ftp`",
            ),
            (E::ImageId, "image ID"),
            (E::InvalidFormat, "[REGISTRY/]REPOSITORY[:TAG][@DIGEST]"),
            (E::UppercaseRepository, "lower case"),
            (E::RepositoryTooLong, "longer than 255 characters"),
            (E::InvalidTag, "invalid tag"),
            (E::InvalidDigest, "invalid digest"),
            (
                E::Registry(ParseError::InvalidPort("x".into())),
                "invalid port `x`",
            ),
        ] {
            let msg = err.to_string();
            assert!(msg.contains(needle), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }
}
