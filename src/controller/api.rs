//! The `RegistryCredential` API, `regbroker.dev/v1alpha1`: the Rust types are the source
//! of the CustomResourceDefinition (`regbroker crd` prints it; `deploy/` and the chart hold
//! copies a test keeps equal to it).
//!
//! The schema refuses what it can say (an empty or oversized `registries`, duplicates,
//! names that cannot be Kubernetes names or registries); the controller stalls the rest
//! with a reason. No field names another namespace.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "regbroker.dev";
/// The annotation that asks for a refresh now (Flux's convention: any new value), echoed
/// in `status.lastHandledReconcileAt` once handled.
pub const REQUESTED_AT: &str = "regbroker.dev/requestedAt";
/// The label on each Secret the controller keeps: the name of its `RegistryCredential`
/// (the controller watches Secrets by this label, metadata only).
pub const OWNER_LABEL: &str = "regbroker.dev/registrycredential";
/// On each Secret the controller keeps, while every provider entry in it is good: when
/// the earliest of them is due for refresh (RFC 3339).
pub const REFRESH_AT: &str = "regbroker.dev/refresh-at";
/// On each Secret the controller keeps, beside [`REFRESH_AT`]: a digest of whose identity
/// fetched its provider entries (the ServiceAccount's namespace, name, UID and identity
/// annotations, and each registry's provider). A controller that starts with an empty
/// cache keeps such a Secret's entries until that point, instead of fetching and writing
/// them all again, but only while the digest matches what would fetch them now.
pub const FETCHED_AS: &str = "regbroker.dev/fetched-as";
/// The most registries one object may list.
pub const MAX_REGISTRIES: usize = 64;

/// What a tenant asks for: a `kubernetes.io/dockerconfigjson` Secret in this namespace,
/// holding credentials for exactly these registries, fetched with this namespace's own
/// ServiceAccount and kept fresh.
// One `printcolumn(...)` per column: clippy reads their repeated keys as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "regbroker.dev",
    version = "v1alpha1",
    kind = "RegistryCredential",
    namespaced,
    status = "RegistryCredentialStatus",
    shortname = "regcred",
    category = "regbroker",
    derive = "PartialEq",
    doc = "A kubernetes.io/dockerconfigjson Secret that regbroker keeps fresh with short-lived registry credentials, fetched with a ServiceAccount of this namespace.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Expires", type_ = "date", json_path = ".status.expiresAt"),
    printcolumn(name = "Secret", type_ = "string", json_path = ".status.secretName"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RegistryCredentialSpec {
    /// The registries the Secret holds, and no other: host names as `GET /v1/credentials`
    /// takes them (`111111111111.dkr.ecr.eu-west-1.amazonaws.com`,
    /// `europe-west1-docker.pkg.dev`, `myregistry.azurecr.io`, `host:port`), 1 to 64.
    #[schemars(schema_with = "registries_schema")]
    pub registries: Vec<String>,
    /// The ServiceAccount of this namespace whose identity fetches the credentials (its
    /// cloud annotations, and its token from TokenRequest). Without it, regbroker's
    /// `--default-service-account`; without that, the object is Stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "dns_subdomain_schema")]
    pub service_account_name: Option<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret of this namespace whose entries win over
    /// contextual login, per registry (Flux RFC-0002).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,
    /// The Secret to keep; by default, named like this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<LocalObjectReference>,
    /// Stop writing the Secret (it is kept as it is).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// An object of this namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectReference {
    /// Its name.
    #[schemars(schema_with = "dns_subdomain_schema")]
    pub name: String,
}

/// How the object stands (kstatus: in progress while `observedGeneration` lags
/// `metadata.generation`; `Reconciling` and `Stalled` are present only while True).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryCredentialStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The Secret kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// The earliest expiry of the credentials the Secret holds (none: none expires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// When the Secret last got a refreshed credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_time: Option<Time>,
    /// The last `regbroker.dev/requestedAt` value handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
    /// One entry per registry of the spec: where its credential comes from, until when it
    /// is valid, and why it is missing if it is. Never a credential.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "registry_statuses_schema")]
    pub registries: Vec<RegistryStatus>,
    /// Ready, and while true, Reconciling or Stalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// One registry's state in the Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryStatus {
    /// The registry, as the Secret names it.
    pub name: String,
    /// What serves it: a provider (`aws`, `azure`, `gcp`) or `secretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// When the credential the Secret holds for it expires (none: it does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// `Succeeded`, or why the Secret holds no fresh credential for it.
    pub reason: String,
}

impl RegistryCredential {
    /// The Secret this object keeps: `spec.target.name`, else its own name.
    pub fn target_name(&self) -> Option<&str> {
        match &self.spec.target {
            Some(t) => Some(t.name.as_str()),
            None => self.metadata.name.as_deref(),
        }
    }

    /// Whether `regbroker.dev/requestedAt` holds a value the status has not echoed yet:
    /// a refresh asked for, so the credentials are fetched anew, not taken from the cache
    /// before their refresh point. `status` is the latest known (this object's, or what
    /// the controller wrote last if the watch has not caught up).
    pub fn refresh_requested(&self, status: &RegistryCredentialStatus) -> bool {
        let handled = status.last_handled_reconcile_at.as_deref();
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REQUESTED_AT))
            .is_some_and(|r| Some(r.as_str()) != handled)
    }
}

/// The CustomResourceDefinition, as `regbroker crd` prints it.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt as _;
    RegistryCredential::crd()
}

/// A registry name: what `Registry::parse` reads, without whitespace, user info, query or
/// fragment (the controller parses each and stalls one it refuses).
const REGISTRY_PATTERN: &str = r"^[A-Za-z0-9\[]([A-Za-z0-9._:/\[\]-]*[A-Za-z0-9\]/])?$";

fn registries_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_REGISTRIES,
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": 255,
            "pattern": REGISTRY_PATTERN,
        },
    })
}

/// A DNS-1123 subdomain: the names of Secrets and ServiceAccounts.
fn dns_subdomain_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "minLength": 1,
        "maxLength": 253,
        "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    })
}

fn registry_statuses_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    list_map(g.subschema_for::<RegistryStatus>(), "name")
}

fn conditions_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    list_map(g.subschema_for::<Condition>(), "type")
}

/// A list keyed by `key` (`x-kubernetes-list-type: map`), so server-side apply merges its
/// items by that key.
fn list_map(items: schemars::Schema, key: &str) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": [key],
        "items": items,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_target_is_the_spec_s_name_else_the_object_s() {
        let spec = RegistryCredentialSpec {
            registries: vec!["a.test".into()],
            service_account_name: None,
            secret_ref: None,
            target: None,
            suspend: false,
        };
        let mut obj = RegistryCredential::new("charts", spec);
        assert_eq!(obj.target_name(), Some("charts"));
        obj.spec.target = Some(LocalObjectReference {
            name: "charts-pull".into(),
        });
        assert_eq!(obj.target_name(), Some("charts-pull"));
    }

    /// What the API server enforces comes from these markers (tests/kube_registry_credentials.rs
    /// shows it refusing; tests/cli.rs keeps the shipped copies equal to this).
    #[test]
    fn the_schema_bounds_registries_and_keys_its_lists() {
        let crd = serde_json::to_value(crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "registrycredentials.regbroker.dev");
        let version = &crd["spec"]["versions"][0];
        assert!(version["subresources"]["status"].is_object());
        let schema = &version["schema"]["openAPIV3Schema"]["properties"];
        let registries = &schema["spec"]["properties"]["registries"];
        assert_eq!(registries["minItems"], 1);
        assert_eq!(registries["maxItems"], 64);
        assert_eq!(registries["x-kubernetes-list-type"], "set");
        assert_eq!(registries["items"]["maxLength"], 255);
        assert_eq!(registries["items"]["pattern"], REGISTRY_PATTERN);
        for name in [
            &schema["spec"]["properties"]["serviceAccountName"],
            &schema["spec"]["properties"]["target"]["properties"]["name"],
            &schema["spec"]["properties"]["secretRef"]["properties"]["name"],
        ] {
            assert_eq!(name["maxLength"], 253, "{name}");
            assert!(name["pattern"].as_str().unwrap().starts_with("^[a-z0-9]"));
        }
        let status = &schema["status"]["properties"];
        for (list, key) in [("conditions", "type"), ("registries", "name")] {
            assert_eq!(status[list]["x-kubernetes-list-type"], "map", "{list}");
            assert_eq!(status[list]["x-kubernetes-list-map-keys"][0], key, "{list}");
            assert!(
                status[list]["items"]["properties"][key].is_object(),
                "{list}"
            );
        }
    }
}
