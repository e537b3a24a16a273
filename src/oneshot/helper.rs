//! The docker credential-helper protocol, as `docker-credential-regbroker ACTION` (a
//! symlink or copy of the binary) or `regbroker credential-helper ACTION`.
//!
//! - `get`: stdin is the bare server URL (`host`, `host:port`,
//!   `https://index.docker.io/v1/`); stdout is one JSON line
//!   `{"ServerURL":"...","Username":"...","Secret":"..."}`. A registry regbroker does not
//!   serve answers exactly `credentials not found in native keychain`, which docker,
//!   skopeo/containers-image, oras and helm read as "go anonymous".
//! - `store`: a documented no-op that succeeds, so `docker login` flows do not break
//!   (regbroker's credentials come from identities and secrets, not logins).
//! - `erase`: the client's registry refused the credential (or `docker logout`): the
//!   cached one is forgotten, its disk cache record too once at least `refetch_interval`
//!   old, so the next `get` fetches anew. It always succeeds, so `logout` flows do not
//!   break; what it could not do is logged.
//! - `list`: `{"registry":"username",...}` for the static entries.
//! - `version`: one line.
//!
//! Errors go to stdout with exit code 1, as the protocol wants (64 when the settings are
//! invalid). Settings come from the environment ([`super::backend`]).

use std::io::{Read, Write};

use regbroker_provider::{ExposeSecret, Registry};

use super::Failed;
use super::backend::{Lookup, Settings};
use super::stdin::{block_on, read_limited};

/// The protocol's "no credentials" message, to the byte.
pub const NOT_FOUND: &str = "credentials not found in native keychain";

/// Largest stdin accepted.
const MAX_INPUT: u64 = 64 * 1024;

/// Runs one helper action; returns the exit code. `settings` is `None` to read them from
/// the process environment only when the action needs a backend.
pub fn run(
    action: &str,
    settings: impl FnOnce() -> Result<Settings, String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> u8 {
    let result = match action {
        "get" => get(settings, stdin, stdout),
        "erase" => erase(settings, stdin),
        "store" => {
            // Drain stdin so the caller does not see a broken pipe; ignore the content.
            let mut sink = Vec::new();
            let _ = stdin.take(MAX_INPUT).read_to_end(&mut sink);
            Ok(())
        }
        "list" => list(settings, stdout),
        "version" => writeln!(
            stdout,
            "docker-credential-regbroker (regbroker) {}",
            env!("CARGO_PKG_VERSION")
        )
        .map_err(|e| e.to_string().into()),
        other => Err(format!(
            "unknown credential helper action `{}` (expected get, store, erase, list or version)",
            other.chars().take(32).collect::<String>()
        )
        .into()),
    };
    match result {
        Ok(()) => 0,
        Err(failed) => {
            let _ = writeln!(stdout, "{}", failed.message);
            failed.code()
        }
    }
}

fn read_server_url(stdin: &mut dyn Read) -> Result<String, String> {
    let buf = read_limited(stdin, MAX_INPUT, "server URL")?;
    let text =
        String::from_utf8(buf).map_err(|_| "server URL on stdin is not UTF-8".to_string())?;
    // Clients end the URL with a newline (docker) or not at all (containers-image).
    Ok(text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text)
        .to_string())
}

fn get(
    settings: impl FnOnce() -> Result<Settings, String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> Result<(), Failed> {
    let server_url = read_server_url(stdin)?;
    let registry = Registry::parse(&server_url).map_err(|e| e.to_string())?;
    let backend = super::backend_from(settings)?;
    let lookup = block_on(backend.lookup(&registry))??;
    match lookup {
        Lookup::NotFound => Err(NOT_FOUND.into()),
        Lookup::Found(c) => {
            let line = serde_json::to_string(&HelperCredential {
                server_url: &server_url,
                username: c.username(),
                secret: c.secret().expose_secret(),
            })
            .map(zeroize::Zeroizing::new)
            .map_err(|e| e.to_string())?;
            writeln!(stdout, "{}", line.as_str()).map_err(|e| e.to_string().into())
        }
    }
}

fn erase(
    settings: impl FnOnce() -> Result<Settings, String>,
    stdin: &mut dyn Read,
) -> Result<(), Failed> {
    let server_url = read_server_url(stdin)?;
    let Ok(registry) = Registry::parse(&server_url) else {
        return Ok(());
    };
    let done = super::backend_from(settings)
        .and_then(|backend| block_on(backend.report_refused(&registry))?.map_err(Failed::from));
    if let Err(e) = done {
        tracing::warn!(%registry, error = %e.message, "erase: the cached credential was not forgotten");
    }
    Ok(())
}

/// The `get` answer, fields in the order docker's own helpers print them.
#[derive(serde::Serialize)]
struct HelperCredential<'a> {
    #[serde(rename = "ServerURL")]
    server_url: &'a str,
    #[serde(rename = "Username")]
    username: &'a str,
    #[serde(rename = "Secret")]
    secret: &'a str,
}

fn list(
    settings: impl FnOnce() -> Result<Settings, String>,
    stdout: &mut dyn Write,
) -> Result<(), Failed> {
    let settings = settings().map_err(Failed::config)?;
    let snapshot = crate::broker::static_secret::load(&settings.docker_config)
        .map_err(|e| Failed::config(e.to_string()))?;
    let map: serde_json::Map<String, serde_json::Value> = snapshot
        .registries()
        .into_iter()
        .filter_map(|r| {
            snapshot
                .get(r)
                .map(|c| (r.to_string(), c.username().into()))
        })
        .collect();
    writeln!(stdout, "{}", serde_json::Value::Object(map)).map_err(|e| e.to_string().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_url_may_fill_64_kib_of_stdin_and_not_a_byte_more() {
        let at_limit = "a".repeat(64 * 1024);
        assert_eq!(
            read_server_url(&mut at_limit.as_bytes()).unwrap().len(),
            64 * 1024
        );
        let over = "a".repeat(64 * 1024 + 1);
        let err = read_server_url(&mut over.as_bytes()).unwrap_err();
        assert!(err.contains("larger than 65536 bytes"), "{err}");
    }

    fn run_with(action: &str, input: &str, settings: Settings) -> (u8, String) {
        let mut out = Vec::new();
        let code = run(action, || Ok(settings), &mut input.as_bytes(), &mut out);
        (code, String::from_utf8(out).unwrap())
    }

    fn static_settings(dir: &std::path::Path) -> Settings {
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"auths": {"registry.example.com:5000": {"username": "alice", "password": "pw1"},
                "https://index.docker.io/v1/": {"username": "bob", "password": "pw2"}}}"#,
        )
        .unwrap();
        Settings {
            docker_config: vec![path],
            ..Settings::default()
        }
    }

    #[test]
    fn get_prints_one_json_line_echoing_the_server_url() {
        let dir = tempfile::tempdir().unwrap();
        let (code, out) = run_with(
            "get",
            "registry.example.com:5000\n",
            static_settings(dir.path()),
        );
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            out,
            "{\"ServerURL\":\"registry.example.com:5000\",\"Username\":\"alice\",\"Secret\":\"pw1\"}\n"
        );
        let (code, out) = run_with(
            "get",
            "https://index.docker.io/v1/",
            static_settings(dir.path()),
        );
        assert_eq!(code, 0, "{out}");
        assert!(
            out.starts_with("{\"ServerURL\":\"https://index.docker.io/v1/\",\"Username\":\"bob\""),
            "{out}"
        );
    }

    #[test]
    fn unknown_registry_answers_the_exact_not_found_text() {
        let dir = tempfile::tempdir().unwrap();
        let (code, out) = run_with("get", "other.example.com\n", static_settings(dir.path()));
        assert_eq!(
            (code, out.as_str()),
            (1, "credentials not found in native keychain\n")
        );
    }

    #[test]
    fn malformed_input_is_an_error_on_stdout_without_secrets() {
        let dir = tempfile::tempdir().unwrap();
        for input in [
            "",
            "\n",
            "user:hunter2@registry.example.com\n",
            "a b\n",
            "registry.example.com:0\n",
        ] {
            let (code, out) = run_with("get", input, static_settings(dir.path()));
            assert_eq!(code, 1, "{input:?}");
            assert!(!out.is_empty() && !out.contains("hunter2"), "{out}");
            assert_ne!(
                out.trim(),
                NOT_FOUND,
                "{input:?} is malformed, not merely unknown"
            );
        }
    }

    #[test]
    fn store_erase_succeed_list_and_version_print_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let (code, out) = run_with(
            "store",
            r#"{"ServerURL":"x","Username":"u","Secret":"s"}"#,
            static_settings(dir.path()),
        );
        assert_eq!((code, out.as_str()), (0, ""));
        let (code, out) = run_with("erase", "x\n", static_settings(dir.path()));
        assert_eq!((code, out.as_str()), (0, ""));
        let (code, out) = run_with("list", "", static_settings(dir.path()));
        assert_eq!(code, 0);
        assert_eq!(
            out,
            "{\"docker.io\":\"bob\",\"registry.example.com:5000\":\"alice\"}\n"
        );
        let (code, out) = run_with("version", "", Settings::default());
        assert_eq!(code, 0);
        assert!(
            out.starts_with("docker-credential-regbroker (regbroker) ") && out.lines().count() == 1
        );
        let (code, out) = run_with("bogus", "", Settings::default());
        assert_eq!(code, 1);
        assert!(out.contains("unknown credential helper action"));
    }
}
