//! A workload's own identity: which Kubernetes ServiceAccount, its token for the cloud's
//! audience, and the identity parameters read from its annotations (a role ARN, a client
//! id, a Google service account).
//!
//! It flows from the edge that knows the workload (the kubelet's request under KEP-4412,
//! a Secret's entry in the config file) to the provider, which reads the annotations it
//! knows ([`crate::Provider::bind_workload`]). The cache scope of a bound
//! [`crate::Target`] names the ServiceAccount (namespace, name, UID) as well as the cloud
//! identity, so two workloads share a credential only when they are the same identity.
//!
//! The token is a [`SecretString`]: `Debug` prints `[REDACTED]`, and nothing here ever
//! formats it into a message, a scope or a key.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine;
use secrecy::{ExposeSecret, SecretString};

use crate::Error;

/// Longest ServiceAccount token accepted (projected tokens are about 1 KiB).
const MAX_TOKEN_LEN: usize = 16 * 1024;
/// Most annotations accepted with one identity, and the longest value read.
const MAX_ANNOTATIONS: usize = 64;
const MAX_ANNOTATION_LEN: usize = 4096;

/// A Kubernetes ServiceAccount, by namespace, name and (when known) UID.
///
/// The UID tells a ServiceAccount from a later one of the same name: a credential cached
/// for a deleted ServiceAccount is never served to its successor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceAccount {
    namespace: String,
    name: String,
    uid: Option<String>,
}

impl ServiceAccount {
    /// A ServiceAccount reference; namespace and name must be DNS-1123 names (lower-case
    /// letters, digits, `-` and `.`, at most 253 characters), the UID (if given) letters,
    /// digits and `-`.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: Option<String>,
    ) -> Result<ServiceAccount, Error> {
        let (namespace, name) = (namespace.into(), name.into());
        if !is_dns_subdomain(&namespace) {
            return Err(Error::invalid_config(format!(
                "ServiceAccount namespace `{}` is not a Kubernetes name",
                crate::printable(&namespace, 64)
            )));
        }
        if !is_dns_subdomain(&name) {
            return Err(Error::invalid_config(format!(
                "ServiceAccount name `{}` is not a Kubernetes name",
                crate::printable(&name, 64)
            )));
        }
        if let Some(u) = &uid
            && (u.is_empty()
                || u.len() > 64
                || !u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err(Error::invalid_config(format!(
                "ServiceAccount UID `{}` is not a UID",
                crate::printable(u, 64)
            )));
        }
        Ok(ServiceAccount {
            namespace,
            name,
            uid,
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The UID, when known.
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }
}

impl fmt::Display for ServiceAccount {
    /// `namespace/name`, as kubectl names it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A workload's own identity: its ServiceAccount, that ServiceAccount's token for the
/// cloud's audience, and its annotations.
///
/// Cheap to clone (shared). Equality compares the ServiceAccount and the annotations,
/// never the token: two tokens of one ServiceAccount are the same identity.
#[derive(Clone)]
pub struct WorkloadIdentity(Arc<Inner>);

struct Inner {
    service_account: ServiceAccount,
    token: SecretString,
    annotations: BTreeMap<String, String>,
}

impl fmt::Debug for WorkloadIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadIdentity")
            .field("service_account", &self.0.service_account)
            .field("token", &self.0.token)
            .field("annotations", &self.0.annotations)
            .finish()
    }
}

impl PartialEq for WorkloadIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.0.service_account == other.0.service_account
            && self.0.annotations == other.0.annotations
    }
}

impl Eq for WorkloadIdentity {}

impl WorkloadIdentity {
    /// An identity whose ServiceAccount the caller knows (the Secret sync, which asked the
    /// API server for the token itself).
    pub fn new(
        service_account: ServiceAccount,
        token: SecretString,
        annotations: BTreeMap<String, String>,
    ) -> Result<WorkloadIdentity, Error> {
        check_token(&token)?;
        check_annotations(&annotations)?;
        Ok(WorkloadIdentity(Arc::new(Inner {
            service_account,
            token,
            annotations,
        })))
    }

    /// An identity from a ServiceAccount token handed over by the kubelet (KEP-4412): the
    /// ServiceAccount is read from the token's `kubernetes.io` claims (namespace, name,
    /// UID), cross-checked against its `sub`. The signature is not checked here: the cloud
    /// checks it when the token is exchanged, and the kubelet is the only caller.
    pub fn from_token(
        token: SecretString,
        annotations: BTreeMap<String, String>,
    ) -> Result<WorkloadIdentity, Error> {
        check_token(&token)?;
        let service_account = service_account_of(token.expose_secret())?;
        WorkloadIdentity::new(service_account, token, annotations)
    }

    /// The ServiceAccount.
    pub fn service_account(&self) -> &ServiceAccount {
        &self.0.service_account
    }

    /// The ServiceAccount's token for the cloud's audience.
    pub fn token(&self) -> &SecretString {
        &self.0.token
    }

    /// One annotation of the ServiceAccount.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.0.annotations.get(key).map(String::as_str)
    }

    /// Every annotation handed over.
    pub fn annotations(&self) -> &BTreeMap<String, String> {
        &self.0.annotations
    }

    /// The first of `keys` that is annotated, with its value: `(key, value)`.
    pub fn first_annotation<'a>(&'a self, keys: &[&'a str]) -> Option<(&'a str, &'a str)> {
        keys.iter()
            .find_map(|k| self.annotation(k).map(|v| (*k, v)))
    }

    /// The part of a cache scope that names this ServiceAccount:
    /// `sa=namespace/name/uid` (`-` for an unknown UID). Never holds the token.
    pub fn scope_part(&self) -> String {
        let sa = &self.0.service_account;
        format!(
            "sa={}/{}/{}",
            sa.namespace,
            sa.name,
            sa.uid.as_deref().unwrap_or("-")
        )
    }
}

fn check_token(token: &SecretString) -> Result<(), Error> {
    let t = token.expose_secret();
    if t.is_empty() {
        return Err(Error::identity_missing("the ServiceAccount token is empty"));
    }
    if t.len() > MAX_TOKEN_LEN || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid_config(
            "the ServiceAccount token is not a JWT (too long, or not printable ASCII)",
        ));
    }
    Ok(())
}

fn check_annotations(annotations: &BTreeMap<String, String>) -> Result<(), Error> {
    if annotations.len() > MAX_ANNOTATIONS {
        return Err(Error::invalid_config(format!(
            "{} ServiceAccount annotations given; at most {MAX_ANNOTATIONS} are read",
            annotations.len()
        )));
    }
    if let Some((k, _)) = annotations
        .iter()
        .find(|(k, v)| k.len() > 317 || v.len() > MAX_ANNOTATION_LEN)
    {
        return Err(Error::invalid_config(format!(
            "ServiceAccount annotation `{}` is too long",
            crate::printable(k, 64)
        )));
    }
    Ok(())
}

/// The ServiceAccount a Kubernetes-issued token is about, from its `kubernetes.io` claims
/// and `sub` (`system:serviceaccount:<namespace>:<name>`), which must agree.
fn service_account_of(jwt: &str) -> Result<ServiceAccount, Error> {
    let not_k8s = || {
        Error::invalid_config(
            "the ServiceAccount token is not a Kubernetes ServiceAccount token (no `kubernetes.io` claims naming the ServiceAccount)",
        )
    };
    let mut parts = jwt.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Error::invalid_config(
            "the ServiceAccount token is not a JWT (header.payload.signature)",
        ));
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|_| not_k8s())?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| not_k8s())?;
    let k8s = claims.get("kubernetes.io").ok_or_else(not_k8s)?;
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_string);
    let namespace = text(k8s.get("namespace")).ok_or_else(not_k8s)?;
    let sa = k8s.get("serviceaccount").ok_or_else(not_k8s)?;
    let name = text(sa.get("name")).ok_or_else(not_k8s)?;
    let uid = text(sa.get("uid"));
    let want_sub = format!("system:serviceaccount:{namespace}:{name}");
    if text(claims.get("sub")).as_deref() != Some(want_sub.as_str()) {
        return Err(Error::invalid_config(
            "the ServiceAccount token's `sub` does not name the ServiceAccount of its `kubernetes.io` claims",
        ));
    }
    ServiceAccount::new(namespace, name, uid)
}

/// A DNS-1123 subdomain, as Kubernetes names namespaces and ServiceAccounts.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_util::service_account_jwt;

    #[test]
    fn the_service_account_is_read_from_the_token_claims() {
        let jwt = service_account_jwt("team-a", "puller", "0b5c6a1e-1111-2222-3333-444455556666");
        let id = WorkloadIdentity::from_token(jwt.into(), BTreeMap::new()).unwrap();
        let sa = id.service_account();
        assert_eq!(
            (sa.namespace(), sa.name(), sa.uid()),
            (
                "team-a",
                "puller",
                Some("0b5c6a1e-1111-2222-3333-444455556666")
            )
        );
        assert_eq!(
            id.scope_part(),
            "sa=team-a/puller/0b5c6a1e-1111-2222-3333-444455556666"
        );
    }

    #[test]
    fn a_token_that_is_not_a_service_account_token_is_refused() {
        for (token, needle) in [
            ("", "empty"),
            ("not-a-jwt", "not a JWT"),
            ("a.b.c.d", "not a JWT"),
            ("eyJhbGciOiJub25lIn0.e30.x", "no `kubernetes.io` claims"),
            ("tok en", "not a JWT"),
        ] {
            let e = WorkloadIdentity::from_token(token.to_string().into(), BTreeMap::new())
                .unwrap_err();
            assert!(e.message().contains(needle), "{token}: {e}");
        }
    }

    #[test]
    fn a_sub_that_disagrees_with_the_claims_is_refused() {
        // kubernetes.io names team-a/puller, sub names team-b/puller.
        let payload = serde_json::json!({
            "sub": "system:serviceaccount:team-b:puller",
            "kubernetes.io": {"namespace": "team-a", "serviceaccount": {"name": "puller", "uid": "u-1"}},
        });
        let jwt = crate::test_util::jwt(&payload);
        let e = WorkloadIdentity::from_token(jwt.into(), BTreeMap::new()).unwrap_err();
        assert!(e.message().contains("`sub`"), "{e}");
    }

    #[test]
    fn names_that_are_not_kubernetes_names_are_refused() {
        for (ns, name) in [
            ("Team-A", "x"),
            ("a", "../b"),
            ("a", ""),
            ("-a", "b"),
            ("a", "b|c"),
        ] {
            assert!(ServiceAccount::new(ns, name, None).is_err(), "{ns}/{name}");
        }
        assert!(ServiceAccount::new("a", "b", Some("u|v".into())).is_err());
        assert!(ServiceAccount::new("kube-system", "default", Some("u-1".into())).is_ok());
    }

    #[test]
    fn debug_and_the_scope_never_hold_the_token() {
        let jwt = service_account_jwt("team-a", "puller", "u-1");
        let id = WorkloadIdentity::from_token(
            jwt.clone().into(),
            BTreeMap::from([("eks.amazonaws.com/role-arn".to_string(), "r".to_string())]),
        )
        .unwrap();
        let shown = format!("{id:?} {}", id.scope_part());
        assert!(!shown.contains(&jwt), "{shown}");
        for part in jwt.split('.') {
            assert!(!shown.contains(part), "{shown}");
        }
        assert!(
            shown.contains("team-a") && shown.contains("role-arn"),
            "{shown}"
        );
    }

    #[test]
    fn equality_ignores_the_token_but_not_the_service_account_or_annotations() {
        let a1 = WorkloadIdentity::from_token(
            service_account_jwt("a", "sa", "u-1").into(),
            BTreeMap::new(),
        )
        .unwrap();
        let mut other_token = service_account_jwt("a", "sa", "u-1");
        other_token.push('x');
        let a2 = WorkloadIdentity::from_token(other_token.into(), BTreeMap::new()).unwrap();
        assert_eq!(a1, a2);
        let b = WorkloadIdentity::from_token(
            service_account_jwt("a", "sa", "u-2").into(),
            BTreeMap::new(),
        )
        .unwrap();
        assert_ne!(a1, b, "a new UID is another ServiceAccount");
        let annotated = WorkloadIdentity::from_token(
            service_account_jwt("a", "sa", "u-1").into(),
            BTreeMap::from([("k".to_string(), "v".to_string())]),
        )
        .unwrap();
        assert_ne!(a1, annotated);
        assert_eq!(annotated.first_annotation(&["x", "k"]), Some(("k", "v")));
    }

    #[test]
    fn too_many_or_too_long_annotations_are_refused() {
        let jwt = service_account_jwt("a", "sa", "u-1");
        let many: BTreeMap<_, _> = (0..65)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert!(WorkloadIdentity::from_token(jwt.clone().into(), many).is_err());
        let long = BTreeMap::from([("k".to_string(), "v".repeat(5000))]);
        let e = WorkloadIdentity::from_token(jwt.into(), long).unwrap_err();
        assert!(e.message().contains("`k`"), "{e}");
    }
}
