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
    #[schemars(schema_with = "dns_label_schema")]
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
    /// before their refresh point.
    pub fn refresh_requested(&self) -> bool {
        let handled = self
            .status
            .as_ref()
            .and_then(|s| s.last_handled_reconcile_at.as_deref());
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

fn dns_label_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "minLength": 1,
        "maxLength": 253,
        "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    })
}

fn dns_subdomain_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    dns_label_schema(g)
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
