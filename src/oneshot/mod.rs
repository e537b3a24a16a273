//! The one-shot modes: a process per request, run by a client that passes no flags.
//!
//! - [`helper`]: the docker credential-helper protocol (`docker-credential-regbroker`);
//! - [`kubelet`]: the kubelet image credential provider protocol;
//! - [`backend`]: where both get credentials: a running sidecar, or the broker run in
//!   this process, optionally with the per-user [`disk_cache`];
//! - [`stdin`]: reading stdin with a limit and running one future, shared by both.
//!
//! Settings come from the environment (`REGBROKER_ENDPOINT`, `REGBROKER_CONFIG`,
//! `REGBROKER_DOCKER_CONFIG`, `REGBROKER_CACHE_DIR`, `REGBROKER_AUTH_TOKEN_FILE`,
//! `REGBROKER_CA_FILE`, `REGBROKER_INSECURE_ENDPOINT`, and the providers' own). Invalid
//! settings are exit code 64, as for the other modes; any other failure is 1.

pub mod backend;
pub mod disk_cache;
pub mod helper;
pub mod kubelet;
pub mod stdin;

/// Why a one-shot request failed: its one-line message, and whether the settings are
/// invalid (exit 64) rather than this request (exit 1).
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) message: String,
    pub(crate) config: bool,
}

impl Failed {
    /// Invalid settings: the environment or a file it names.
    pub(crate) fn config(message: String) -> Failed {
        Failed {
            message,
            config: true,
        }
    }

    /// The exit code: 64 for invalid settings, else 1.
    pub(crate) fn code(&self) -> u8 {
        if self.config {
            crate::cli::EXIT_CONFIG
        } else {
            1
        }
    }
}

impl From<String> for Failed {
    fn from(message: String) -> Failed {
        Failed {
            message,
            config: false,
        }
    }
}

impl From<&str> for Failed {
    fn from(message: &str) -> Failed {
        Failed::from(message.to_string())
    }
}

/// The backend the settings ask for; any failure is invalid settings.
pub(crate) fn backend_from(
    settings: impl FnOnce() -> Result<backend::Settings, String>,
) -> Result<backend::Backend, Failed> {
    backend::Backend::new(&settings().map_err(Failed::config)?).map_err(Failed::config)
}
