//! Kubernetes API access shared by everything that talks to an API server (the Secret
//! sync, and [`lease`]: leader election among replicas): the client set-up and the log
//! caps that keep response bodies, which may hold Secret data, out of the log.
//!
//! The client is kube-rs. In a pod it uses the service account (in-cluster config:
//! `KUBERNETES_SERVICE_HOST`, the mounted token and CA); elsewhere the kubeconfig
//! (`KUBECONFIG`, `~/.kube/config`).

pub mod lease;
pub mod secret;
pub mod tokens;

/// Log caps for the API client: kube-client logs a whole response body at WARN when it
/// cannot parse it, which for a Secret would be its data. Applied after the user's filter.
pub const LOG_DIRECTIVES: &[&str] = &["kube_client=error", "kube=error"];

/// A client for the cluster this process runs in: the service account's in-cluster
/// config in a pod, else the kubeconfig (`KUBECONFIG`, `~/.kube/config`).
pub async fn client_from_environment() -> Result<kube::Client, String> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| format!("no Kubernetes API configuration (in-cluster or kubeconfig): {e}"))?;
    kube::Client::try_from(config).map_err(|e| format!("cannot build the Kubernetes client: {e}"))
}
