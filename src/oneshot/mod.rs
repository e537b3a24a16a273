//! The one-shot modes: a process per request, run by a client that passes no flags.
//!
//! - [`helper`]: the docker credential-helper protocol (`docker-credential-regbroker`);
//! - [`kubelet`]: the kubelet image credential provider protocol;
//! - [`backend`]: where both get credentials: a running sidecar, or the broker run in
//!   this process, optionally with the per-user [`disk_cache`];
//! - [`stdin`]: reading stdin with a limit and running one future, shared by both.
//!
//! Settings come from the environment (`REGBROKER_ENDPOINT`, `REGBROKER_CONFIG`,
//! `REGBROKER_DOCKER_CONFIG`, `REGBROKER_CACHE_DIR`, `REGBROKER_AUTH_TOKEN_FILE`).

pub mod backend;
pub mod disk_cache;
pub mod helper;
pub mod kubelet;
pub mod stdin;
