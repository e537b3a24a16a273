//! Writing `kubernetes.io/dockerconfigjson` Secrets that regbroker owns: the ownership
//! rule (regbroker's label, and for a `RegistryCredential`'s Secret its controller
//! ownerReference), the leader guard on every write, and the entries kept for registries
//! whose fetch failed. Shared by the Secret sync and the controller.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use regbroker_provider::Registry;
use zeroize::Zeroizing;

use super::lease::Leadership;

/// The label regbroker sets on the Secrets it owns, and requires before updating one.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "regbroker";
/// The Secret type written.
pub const SECRET_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The data key holding the docker config.
pub const DATA_KEY: &str = ".dockerconfigjson";
/// The annotation naming the leader election holder that wrote the Secret last (set only
/// with leader election).
pub const WRITTEN_BY: &str = "regbroker/written-by";

/// How many times a conflicting write is retried at once within one pass.
const CONFLICT_RETRIES: usize = 3;

/// A Secret to keep: `NAMESPACE/NAME`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl SecretRef {
    /// Its sink name in readiness checks, metrics and `/v1/providers`:
    /// `secret/NAMESPACE/NAME`.
    pub fn sink_name(&self) -> String {
        format!("secret/{}/{}", self.namespace, self.name)
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A DNS-1123 label (namespaces) or subdomain (Secret names).
fn valid_name(s: &str, max: usize, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && (dots || !s.contains('.'))
}

impl FromStr for SecretRef {
    type Err = String;

    fn from_str(s: &str) -> Result<SecretRef, String> {
        let (namespace, name) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not NAMESPACE/NAME"))?;
        if !valid_name(namespace, 63, false) {
            return Err(format!(
                "namespace {namespace:?} is not a DNS-1123 label (lower-case letters, digits, '-', at most 63)"
            ));
        }
        if !valid_name(name, 253, true) {
            return Err(format!(
                "Secret name {name:?} is not a DNS-1123 subdomain (lower-case letters, digits, '-', '.', at most 253)"
            ));
        }
        Ok(SecretRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

/// What the last pass did to one Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Created (it did not exist).
    Created,
    /// Updated (it held other data).
    Updated,
    /// Already up to date: nothing written.
    Unchanged,
    /// It exists without regbroker's label: left alone.
    Foreign,
    /// The API call failed (message, no secrets); retried with backoff.
    Failed(String),
    /// Not written: this replica is not the leader (or its renew deadline passed).
    NotLeader,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    #[error(
        "Secret exists and is not managed by regbroker (no label {MANAGED_BY_LABEL}={MANAGED_BY}); leaving it alone: delete it or add the label"
    )]
    Foreign,
    #[error("Secret has type {0:?}, not {SECRET_TYPE}; delete it to let regbroker recreate it")]
    WrongType(String),
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("gave up after {CONFLICT_RETRIES} conflicting writes")]
    Conflicts,
    #[error("not the leader")]
    NotLeader,
}

impl SyncError {
    /// A short stable code for the sink's status (never a message).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            SyncError::Foreign => "secret_not_managed",
            SyncError::WrongType(_) => "secret_wrong_type",
            SyncError::Api(_) => "kubernetes_api_error",
            SyncError::Conflicts => "write_conflicts",
            SyncError::NotLeader => "not_leader",
        }
    }
}

/// `call`, bounded by the leader's write deadline when there is a guard.
pub(crate) async fn guarded<T>(
    guard: Option<&Leadership>,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, SyncError> {
    let Some(g) = guard else {
        return Ok(call.await?);
    };
    let deadline = g.write_deadline().ok_or(SyncError::NotLeader)?;
    match tokio::time::timeout_at(deadline, call).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SyncError::NotLeader),
    }
}

/// Immediately before a write: still the leader, within the renew deadline?
pub(crate) fn may_write(guard: Option<&Leadership>) -> Result<(), SyncError> {
    match guard {
        Some(g) if !g.may_write() => Err(SyncError::NotLeader),
        _ => Ok(()),
    }
}

/// Records the writer in `meta` (with a guard).
pub(crate) fn sign(meta: &mut ObjectMeta, guard: Option<&Leadership>) {
    if let Some(g) = guard {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(WRITTEN_BY.to_string(), g.identity().to_string());
    }
}

pub(crate) fn is_ours(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY)
}

/// `contents` plus the entries the Secret already holds for `missing` registries (wanted,
/// but with no credential this pass because the fetch failed), or `None` if there are
/// none. A restart during a cloud outage then does not wipe credentials that may still
/// be valid; an expired entry is no worse than none.
pub(crate) fn keep_missing(
    contents: &str,
    existing: Option<&ByteString>,
    missing: &[Registry],
) -> Option<(Zeroizing<String>, Vec<Registry>)> {
    if missing.is_empty() {
        return None;
    }
    let old: serde_json::Value = serde_json::from_slice(&existing?.0).ok()?;
    let old_auths = old.get("auths")?.as_object()?;
    let mut new: serde_json::Value = serde_json::from_str(contents).ok()?;
    let auths = new.get_mut("auths")?.as_object_mut()?;
    let mut kept = Vec::new();
    for registry in missing {
        let key = registry.to_string();
        if let Some(entry) = old_auths.get(&key) {
            auths.insert(key, entry.clone());
            kept.push(registry.clone());
        }
    }
    (!kept.is_empty()).then(|| (Zeroizing::new(format!("{new:#}\n")), kept))
}

/// The object a Secret belongs to (a `RegistryCredential`): the Secret carries its
/// controller ownerReference, so Kubernetes' garbage collector deletes the Secret with
/// it, and these labels; an existing Secret without that ownerReference is not written.
#[derive(Clone, Debug)]
pub(crate) struct Owner {
    /// The controller ownerReference.
    pub(crate) reference: OwnerReference,
    /// Labels besides [`MANAGED_BY_LABEL`].
    pub(crate) labels: BTreeMap<String, String>,
    /// Annotations the owner keeps on the Secret: set when `Some`, removed when `None`.
    /// A difference is a change, written even when the data is the same.
    pub(crate) annotations: BTreeMap<String, Option<String>>,
}

impl Owner {
    /// Whether `meta` carries the owner's annotations as they should be.
    fn annotated(&self, meta: &ObjectMeta) -> bool {
        self.annotations
            .iter()
            .all(|(k, v)| meta.annotations.as_ref().and_then(|a| a.get(k)) == v.as_ref())
    }

    /// Sets and removes the owner's annotations on `meta`.
    fn annotate(&self, meta: &mut ObjectMeta) {
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in &self.annotations {
            match v {
                Some(v) => annotations.insert(k.clone(), v.clone()),
                None => annotations.remove(k),
            };
        }
    }
}

/// Whether `meta` names `uid` as its controller.
pub(crate) fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// What [`upsert`] did, and which missing registries' entries it kept from the Secret.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) outcome: Outcome,
    pub(crate) kept: Vec<Registry>,
}

/// Makes `secret` hold `contents`, creating it if absent. Never touches a Secret
/// without regbroker's label, nor, for an `owner`, one that `owner` does not control.
/// Entries for `missing` registries are kept (see [`keep_missing`]). With a `guard`,
/// writes only while it may, and signs each write.
pub(crate) async fn upsert(
    client: &kube::Client,
    secret: &SecretRef,
    contents: &str,
    missing: &[Registry],
    guard: Option<&Leadership>,
    owner: Option<&Owner>,
) -> Result<Written, SyncError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &secret.namespace);
    let data =
        |contents: &[u8]| BTreeMap::from([(DATA_KEY.to_string(), ByteString(contents.to_vec()))]);
    let written = |outcome, kept| Ok(Written { outcome, kept });
    for _ in 0..CONFLICT_RETRIES {
        match guarded(guard, api.get_opt(&secret.name)).await? {
            None => {
                let mut labels =
                    BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]);
                labels.extend(owner.iter().flat_map(|o| o.labels.clone()));
                let mut new = Secret {
                    metadata: ObjectMeta {
                        name: Some(secret.name.clone()),
                        namespace: Some(secret.namespace.clone()),
                        labels: Some(labels),
                        owner_references: owner.map(|o| vec![o.reference.clone()]),
                        ..ObjectMeta::default()
                    },
                    type_: Some(SECRET_TYPE.to_string()),
                    data: Some(data(contents.as_bytes())),
                    ..Secret::default()
                };
                if let Some(o) = owner {
                    o.annotate(&mut new.metadata);
                }
                sign(&mut new.metadata, guard);
                may_write(guard)?;
                match guarded(guard, api.create(&PostParams::default(), &new)).await {
                    Ok(_) => return written(Outcome::Created, Vec::new()),
                    // Someone created it between our read and write: read again.
                    Err(SyncError::Api(kube::Error::Api(s)))
                        if s.is_already_exists() || s.is_conflict() => {}
                    Err(e) => return Err(e),
                }
            }
            Some(mut existing) => {
                let owned =
                    owner.is_none_or(|o| controlled_by(&existing.metadata, &o.reference.uid));
                if !is_ours(&existing.metadata) || !owned {
                    return Err(SyncError::Foreign);
                }
                let type_ = existing.type_.clone().unwrap_or_default();
                if type_ != SECRET_TYPE {
                    return Err(SyncError::WrongType(type_));
                }
                let current = existing.data.as_ref().and_then(|d| d.get(DATA_KEY));
                let (kept_contents, kept) = keep_missing(contents, current, missing).unzip();
                if kept_contents.is_some() {
                    tracing::debug!(%secret, "Keeping the Secret's entries for registries whose fetch failed");
                }
                let kept = kept.unwrap_or_default();
                let contents = kept_contents
                    .as_deref()
                    .map_or(contents, |k| k.as_str())
                    .as_bytes();
                let same = current.is_some_and(|c| c.0 == contents)
                    && existing.data.as_ref().is_some_and(|d| d.len() == 1)
                    && existing.string_data.is_none()
                    && owner.is_none_or(|o| o.annotated(&existing.metadata));
                if same {
                    return written(Outcome::Unchanged, kept);
                }
                // Keep its metadata (resourceVersion included, so a concurrent write
                // conflicts instead of being overwritten).
                existing.data = Some(data(contents));
                existing.string_data = None;
                if let Some(o) = owner {
                    o.annotate(&mut existing.metadata);
                }
                sign(&mut existing.metadata, guard);
                may_write(guard)?;
                let params = PostParams::default();
                let replace = api.replace(&secret.name, &params, &existing);
                match guarded(guard, replace).await {
                    Ok(_) => return written(Outcome::Updated, kept),
                    Err(SyncError::Api(kube::Error::Api(s)))
                        if s.is_conflict() || s.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Err(SyncError::Conflicts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_a_leading_replica_may_write_and_its_writes_are_signed() {
        let leading = Leadership::for_tests("replica-a", true);
        let follower = Leadership::for_tests("replica-b", false);
        assert!(
            may_write(None).is_ok(),
            "without leader election every write goes"
        );
        assert!(may_write(Some(&leading)).is_ok());
        assert!(matches!(
            may_write(Some(&follower)),
            Err(SyncError::NotLeader)
        ));
        let mut meta = ObjectMeta::default();
        sign(&mut meta, None);
        assert_eq!(meta.annotations, None);
        sign(&mut meta, Some(&leading));
        assert_eq!(
            meta.annotations
                .unwrap()
                .get(WRITTEN_BY)
                .map(String::as_str),
            Some("replica-a")
        );
    }

    #[test]
    fn a_secret_is_ours_only_with_our_managed_by_label() {
        let meta = |labels: &[(&str, &str)]| ObjectMeta {
            labels: (!labels.is_empty()).then(|| {
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..ObjectMeta::default()
        };
        assert!(is_ours(&meta(&[(MANAGED_BY_LABEL, MANAGED_BY)])));
        assert!(!is_ours(&meta(&[(MANAGED_BY_LABEL, "helm")])));
        assert!(!is_ours(&meta(&[("app", MANAGED_BY)])));
        assert!(!is_ours(&meta(&[])));
    }

    #[test]
    fn an_owner_sets_and_removes_its_annotations_and_leaves_others_alone() {
        let owner = Owner {
            reference: OwnerReference::default(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([
                ("set".to_string(), Some("1".to_string())),
                ("gone".to_string(), None),
            ]),
        };
        let mut meta = ObjectMeta {
            annotations: Some(BTreeMap::from([
                ("gone".to_string(), "x".to_string()),
                ("theirs".to_string(), "y".to_string()),
            ])),
            ..ObjectMeta::default()
        };
        assert!(!owner.annotated(&meta), "one to set, one to remove");
        owner.annotate(&mut meta);
        assert!(owner.annotated(&meta));
        let a = meta.annotations.as_ref().unwrap();
        assert_eq!(a.get("set").map(String::as_str), Some("1"));
        assert!(!a.contains_key("gone"));
        assert_eq!(a.get("theirs").map(String::as_str), Some("y"));
        meta.annotations
            .as_mut()
            .unwrap()
            .insert("set".into(), "2".into());
        assert!(!owner.annotated(&meta), "a changed value");
        meta.annotations.as_mut().unwrap().remove("set");
        assert!(!owner.annotated(&meta), "a missing one");
        assert!(
            Owner {
                annotations: BTreeMap::from([("gone".to_string(), None)]),
                ..owner
            }
            .annotated(&ObjectMeta::default()),
            "nothing to remove from a Secret without annotations"
        );
    }

    #[test]
    fn entries_of_registries_that_failed_this_pass_are_kept_from_the_secret() {
        let r = |h: &str| Registry::parse(h).unwrap();
        let existing = ByteString(
            br#"{"auths": {"a.example.com": {"auth": "old-a"}, "b.example.com": {"auth": "old-b"}, "gone.example.com": {"auth": "old-g"}}}"#
                .to_vec(),
        );
        let contents = r#"{"auths": {"c.example.com": {"auth": "new-c"}}}"#;
        let (kept, which) = keep_missing(
            contents,
            Some(&existing),
            &[r("a.example.com"), r("b.example.com"), r("x.example.com")],
        )
        .expect("two entries kept");
        assert_eq!(which, [r("a.example.com"), r("b.example.com")]);
        let v: serde_json::Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(v["auths"]["a.example.com"]["auth"], "old-a");
        assert_eq!(v["auths"]["b.example.com"]["auth"], "old-b");
        assert_eq!(v["auths"]["c.example.com"]["auth"], "new-c");
        assert!(
            v["auths"].get("gone.example.com").is_none(),
            "not wanted: dropped"
        );
        // Nothing missing, or nothing of it in the Secret: the contents as they are.
        assert!(keep_missing(contents, Some(&existing), &[]).is_none());
        assert!(keep_missing(contents, Some(&existing), &[r("x.example.com")]).is_none());
        assert!(keep_missing(contents, None, &[r("a.example.com")]).is_none());
    }

    #[test]
    fn secret_refs_parse_and_reject_with_clear_errors() {
        let r: SecretRef = "flux-system/regbroker-ecr".parse().unwrap();
        assert_eq!(r.namespace, "flux-system");
        assert_eq!(r.name, "regbroker-ecr");
        assert_eq!(r.to_string(), "flux-system/regbroker-ecr");
        assert!("a/b.c".parse::<SecretRef>().is_ok());
        for bad in [
            "name", "/name", "ns/", "NS/name", "ns/Name", "a.b/name", "ns/-x", "ns/a/b", "ns/x_y",
        ] {
            let e = bad.parse::<SecretRef>().unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!("ns/name".parse::<SecretRef>().is_ok());
    }
}
