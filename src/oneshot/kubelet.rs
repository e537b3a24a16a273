//! The kubelet image credential provider protocol (`credentialprovider.kubelet.k8s.io/v1`),
//! as `regbroker kubelet-credential-provider`.
//!
//! The kubelet writes a `CredentialProviderRequest` to stdin (`image`, and with KEP-4412
//! `serviceAccountToken` / `serviceAccountAnnotations`) and reads
//! a `CredentialProviderResponse` from stdout: `cacheKeyType: Registry`, a `cacheDuration`
//! (Go duration) from the credential's remaining usable life, and `auth` keyed by the
//! registry, or an empty `auth` for images regbroker does not serve. The `image` is read
//! as docker reads an image reference ([`Registry::from_image_reference`]): `nginx:latest`
//! is Docker Hub's, so on a node where nothing serves `docker.io` it gets the empty `auth`
//! (exit 0). A wrong apiVersion or kind, malformed JSON, or an image the reference grammar
//! refuses, is an error on stderr with exit code 1 (64: invalid settings).
//!
//! With a `serviceAccountToken` (KEP-4412, the kubelet's `tokenAttributes`), the pull is
//! the workload's own: the ServiceAccount is read from the token's claims, the cloud
//! identity from the annotations (see each provider's `bind_workload`), and the cache
//! scope (memory and `REGBROKER_CACHE_DIR`) names both, so one ServiceAccount never
//! reads another's entry. A malformed token or annotation is exit 1 with a message
//! naming it, never the node's identity instead. The token is never written to stdout,
//! stderr, a log line or the disk cache.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use regbroker_provider::{ExposeSecret, Registry, SecretString, WorkloadIdentity};
use serde::Deserialize;

use super::backend::{Lookup, Settings};
use super::stdin::{block_on, read_limited};
use crate::broker::cache;

/// The API version spoken.
pub const API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";

const MAX_INPUT: u64 = 1024 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    api_version: Option<String>,
    kind: Option<String>,
    image: Option<String>,
    /// KEP-4412: the pod's ServiceAccount token for the audience in the kubelet's
    /// `tokenAttributes`. Moved into a `SecretString` as soon as it is read.
    service_account_token: Option<String>,
    /// KEP-4412: the annotations of that ServiceAccount the kubelet was told to pass.
    #[serde(default)]
    service_account_annotations: BTreeMap<String, String>,
}

/// Formats a duration as Go's `time.Duration.String()` does for whole seconds:
/// `0s`, `45s`, `1m30s`, `5h59m0s`.
pub fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Runs one request; returns the exit code.
pub fn run(
    settings: impl FnOnce() -> Result<Settings, String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    match respond(settings, stdin) {
        Ok(body) => match writeln!(stdout, "{body}") {
            Ok(()) => 0,
            Err(e) => {
                let _ = writeln!(stderr, "regbroker: cannot write the response: {e}");
                1
            }
        },
        Err(failed) => {
            let _ = writeln!(stderr, "regbroker: {}", failed.message);
            failed.code()
        }
    }
}

fn respond(
    settings: impl FnOnce() -> Result<Settings, String>,
    stdin: &mut dyn Read,
) -> Result<serde_json::Value, super::Failed> {
    // The request may carry the pod's service account token (KEP-4412): wipe it after use.
    let buf = zeroize::Zeroizing::new(read_limited(stdin, MAX_INPUT, "request")?);
    let mut req: Request = serde_json::from_slice(&buf).map_err(|e| {
        format!(
            "request is not a CredentialProviderRequest (invalid JSON at line {} column {})",
            e.line(),
            e.column()
        )
    })?;
    match req.api_version.as_deref() {
        Some(API_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "unsupported apiVersion `{}` (this provider speaks {API_VERSION})",
                other.chars().take(64).collect::<String>()
            )
            .into());
        }
        None => {
            return Err(format!("request has no apiVersion (expected {API_VERSION})").into());
        }
    }
    if req.kind.as_deref() != Some("CredentialProviderRequest") {
        return Err("request kind must be CredentialProviderRequest".into());
    }
    // The token leaves the request at once, into a SecretString (zeroized on drop).
    let token = req.service_account_token.take().map(SecretString::from);
    let image = req
        .image
        .filter(|i| !i.is_empty())
        .ok_or("request has no image")?;
    // The kubelet names an image: `nginx:latest` is Docker Hub's, as docker reads it.
    let registry = Registry::from_image_reference(&image).map_err(|e| format!("image: {e}"))?;
    // KEP-4412: with a token, the pull is the workload's own: its identity or nothing,
    // never the node's. A malformed token is an error before any lookup.
    let workload = match token {
        Some(t) if !t.expose_secret().is_empty() => Some(
            WorkloadIdentity::from_token(t, req.service_account_annotations)
                .map_err(|e| format!("serviceAccountToken: {e}"))?,
        ),
        _ => None,
    };

    let backend = super::backend_from(settings)?;
    // The pass-through needs the pod's own token: without one, refuse before any
    // lookup, which would read a token file of the node's or ask for `token_file`.
    if workload.is_none() && backend.passes_subject_token(&registry) {
        return Err(PASS_THROUGH_NEEDS_TOKEN.into());
    }
    let config = backend.cache_config();
    let mut response = serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Registry",
    });
    match block_on(backend.lookup_as(&registry, workload.as_ref()))?? {
        Lookup::NotFound => {
            // Nothing to offer: let the kubelet try other providers or go anonymous, and
            // ask again after a short while in case configuration changes.
            response["cacheDuration"] = go_duration(config.fallback_ttl).into();
            response["auth"] = serde_json::json!({});
        }
        Lookup::Found(c) => {
            let now = backend.now();
            let life = cache::plan(&config, now, c.expires_at());
            let usable = life.stale_at.duration_since(now).unwrap_or(Duration::ZERO);
            response["cacheDuration"] = go_duration(usable).into();
            check_pass_through(&c, workload.as_ref())?;
            response["auth"] = serde_json::json!({
                registry.as_str(): {
                    "username": c.username(),
                    "password": c.secret().expose_secret(),
                }
            });
        }
    }
    Ok(response)
}

/// The refusal of a pass-through route when the kubelet sent no token.
const PASS_THROUGH_NEEDS_TOKEN: &str = "the oidc provider passes the pulling pod's ServiceAccount token through as the password, and the kubelet sent no token: give this provider's entry in the kubelet's CredentialProviderConfig `tokenAttributes` with `serviceAccountTokenAudience` (the rule's audience) and `cacheType: Token`";

/// The kubelet takes the ServiceAccount token itself as a password only from a provider
/// entry with `tokenAttributes.cacheType: Token` (it caches the answer per token then).
/// The pass-through provider (`oidc`) needs the pulling pod's own token: without one
/// (no `tokenAttributes`), it would hand the node's token to every pod, so it is refused
/// naming the fields to set. Any other provider answering the token is a bug, refused.
fn check_pass_through(
    c: &regbroker_provider::Credential,
    workload: Option<&WorkloadIdentity>,
) -> Result<(), super::Failed> {
    match workload {
        None if c.passes_subject_token() => Err(PASS_THROUGH_NEEDS_TOKEN.into()),
        Some(w)
            if !c.passes_subject_token()
                && c.secret().expose_secret() == w.token().expose_secret() =>
        {
            Err("the provider answered the ServiceAccount token itself as the password; refusing to return it".into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_as_password_is_answered_only_by_the_pass_through_for_the_pod_itself() {
        let jwt = regbroker_provider::test_util::service_account_jwt("team-a", "puller", "u-1");
        let w = WorkloadIdentity::from_token(jwt.clone().into(), BTreeMap::new()).unwrap();
        let echo = regbroker_provider::Credential::new("oidc", jwt.clone(), None);
        let pass = echo.clone().passing_subject_token();
        let other = regbroker_provider::Credential::new("robot", "answer".to_string(), None);
        assert!(check_pass_through(&pass, Some(&w)).is_ok());
        assert!(check_pass_through(&other, Some(&w)).is_ok());
        assert!(check_pass_through(&other, None).is_ok());
        let e = check_pass_through(&pass, None).unwrap_err().message;
        assert!(
            e.contains("cacheType: Token") && e.contains("tokenAttributes"),
            "{e}"
        );
        let e = check_pass_through(&echo, Some(&w)).unwrap_err().message;
        assert!(e.contains("refusing"), "{e}");
        assert!(!e.contains(&jwt));
    }

    #[cfg(feature = "federated")]
    #[test]
    fn a_pass_through_route_without_the_kubelets_token_is_refused_before_any_lookup() {
        // With or without a token file of the node's (a missing one here): never read,
        // the refusal names the kubelet's fields, not `token_file`.
        let dir = tempfile::tempdir().unwrap();
        for options in [
            r#"{ audience = "zot.example.com" }"#.to_string(),
            format!(
                r#"{{ audience = "zot.example.com", token_file = "{}" }}"#,
                dir.path().join("absent").display()
            ),
        ] {
            let config = dir.path().join("regbroker.toml");
            std::fs::write(
                &config,
                format!("[[rule]]\nmatch = \"zot.example.com\"\nsource = \"oidc\"\noptions = {options}\n"),
            )
            .unwrap();
            let settings = Settings {
                config: Some(config),
                ..Settings::default()
            };
            let (code, out, err) = run_with(
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"zot.example.com/app:1"}"#,
                settings,
            );
            assert_eq!(code, 1, "{options}: {out}");
            assert!(out.is_empty(), "{out}");
            assert!(
                err.contains("tokenAttributes") && err.contains("cacheType: Token"),
                "{options}: {err}"
            );
            assert!(!err.contains("absent"), "the token file was read: {err}");
        }
    }

    #[test]
    fn go_durations() {
        for (secs, want) in [
            (0, "0s"),
            (45, "45s"),
            (90, "1m30s"),
            (3600, "1h0m0s"),
            (21540, "5h59m0s"),
            (43170, "11h59m30s"),
        ] {
            assert_eq!(go_duration(Duration::from_secs(secs)), want);
        }
    }

    #[test]
    fn a_request_may_fill_1_mib_of_stdin_and_not_a_byte_more() {
        // A KEP-4412 request carries a token and the ServiceAccount's annotations: the
        // limit is generous. Padding with JSON whitespace keeps the request valid up to
        // the limit, so only the size can refuse it.
        let request = r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1"}"#;
        let padded = |len: usize| format!("{request}{}", " ".repeat(len - request.len()));
        let err = respond(
            || Err("no settings".into()),
            &mut padded(1024 * 1024).as_bytes(),
        )
        .unwrap_err()
        .message;
        assert!(err.contains("unsupported apiVersion"), "{err}");
        let err = respond(
            || Err("no settings".into()),
            &mut padded(1024 * 1024 + 1).as_bytes(),
        )
        .unwrap_err()
        .message;
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
    }

    fn run_with(input: &str, settings: Settings) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(|| Ok(settings), &mut input.as_bytes(), &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn wrong_api_version_kind_or_json_is_rejected_on_stderr() {
        for (input, needle) in [
            (
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1","kind":"CredentialProviderRequest","image":"a.example.com/x"}"#,
                "unsupported apiVersion",
            ),
            (
                r#"{"kind":"CredentialProviderRequest","image":"a.example.com/x"}"#,
                "no apiVersion",
            ),
            (
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"Pod","image":"a.example.com/x"}"#,
                "kind",
            ),
            (
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest"}"#,
                "no image",
            ),
            (
                r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"u:p@a.example.com/x"}"#,
                "userinfo",
            ),
            ("not json", "invalid JSON"),
        ] {
            let (code, out, err) = run_with(input, Settings::default());
            assert_eq!(code, 1, "{input}");
            assert!(out.is_empty(), "{out}");
            assert!(err.contains(needle), "{input}: {err}");
        }
    }
}
