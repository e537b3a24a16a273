//! Command line: flags and env, logging, running a mode, exit codes.
//!
//! This module parses the command line and dispatches; each mode that is more than a
//! few lines has its own file: [`serve`] (the sidecar), [`resolve`] (one decision and
//! fetch, for humans), [`doctor`] (the setup checked, for humans and scripts), and
//! [`logging`] (the log filter and its caps). The one-shot modes (`credential-helper`,
//! `kubelet-credential-provider`) run [`crate::oneshot`] on this process's stdin and
//! stdout.
//!
//! Exit codes: 0 success; 1 a runtime failure (no credential, cannot bind) or a failed
//! `doctor` check; 64 invalid configuration or usage (as `EX_USAGE` in sysexits.h).

mod doctor;
mod leader_elect;
mod logging;
mod resolve;
mod serve;

pub use logging::log_filter;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::broker::Built;
use crate::oneshot::backend::Settings;
use doctor::DoctorArgs;
use logging::{LogFormat, init_tracing};
use resolve::ResolveArgs;
use serve::ServeArgs;

/// Exit code for invalid configuration or usage.
pub const EXIT_CONFIG: u8 = 64;

/// The default listen address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8477";

#[derive(Debug, Parser)]
#[command(name = "regbroker", version, about = "Credential broker for OCI registries", long_about = None)]
struct Cli {
    /// Log format.
    #[arg(long, env = "REGBROKER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the sidecar: serve credentials over HTTP.
    // Boxed: the sidecar's flags are most of the enum's size (clippy large_enum_variant).
    Serve(Box<ServeArgs>),
    /// Say which rule and source serve a registry, and fetch its credential once.
    Resolve(ResolveArgs),
    /// Check the setup: each cloud's identity (with one real call) and, for each REGISTRY,
    /// the routing decision and one exchange. Exit 0 all passed, 1 a check failed.
    Doctor(DoctorArgs),
    /// Speak the docker credential-helper protocol (as `docker-credential-regbroker`).
    /// Settings come from the environment: REGBROKER_ENDPOINT, or REGBROKER_CONFIG,
    /// REGBROKER_DOCKER_CONFIG and REGBROKER_CACHE_DIR.
    CredentialHelper(HelperArgs),
    /// Speak the kubelet image credential provider protocol (credentialprovider.kubelet.k8s.io/v1).
    /// Settings come from the environment, as for credential-helper.
    KubeletCredentialProvider,
    /// Print the RegistryCredential CustomResourceDefinition (YAML), generated from the
    /// types the controller uses: `regbroker crd | kubectl apply -f -`.
    Crd,
}

#[derive(Debug, Args)]
struct HelperArgs {
    /// A running sidecar: http://HOST:PORT or unix:PATH (default: an in-process broker).
    #[arg(long, env = "REGBROKER_ENDPOINT")]
    endpoint: Option<String>,

    /// get, store, erase, list or version.
    action: String,
}

/// Settings shared by every mode.
#[derive(Debug, Args)]
struct Sources {
    /// Routing rules and cache settings (TOML).
    #[arg(long, env = "REGBROKER_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// A docker config / dockerconfigjson file, or a mounted Secret directory; repeatable
    /// (the env var takes a comma-separated list). Earlier sources win.
    #[arg(
        long = "docker-config",
        env = "REGBROKER_DOCKER_CONFIG",
        value_name = "PATH",
        value_delimiter = ','
    )]
    docker_config: Vec<PathBuf>,
}

/// Runs the command line and returns the process exit code.
pub fn main() -> ExitCode {
    // Invoked as docker-credential-regbroker (a symlink or copy): helper mode.
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let invoked_as = std::path::Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if invoked_as.starts_with("docker-credential-") {
        let action = args.next().map(|a| a.to_string_lossy().into_owned());
        match action.as_deref() {
            Some("--help" | "-h" | "help") => {
                println!("{}", helper_usage(&invoked_as));
                return ExitCode::SUCCESS;
            }
            Some("--version" | "-v") => return helper_mode("version", None),
            // As docker-credential-helpers: usage on stderr, exit 1.
            None | Some("") => {
                eprintln!("{}", helper_usage(&invoked_as));
                return ExitCode::FAILURE;
            }
            Some(_) => {}
        }
        if let Err(msg) = init_tracing(LogFormat::Text, "warn") {
            return report(LogFormat::Text, Failure::Config(msg));
        }
        return helper_mode(action.as_deref().unwrap_or_default(), None);
    }

    let parsed = command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(msg) = env_value_error(&e, &std::env::args_os().collect::<Vec<_>>()) {
                return report(LogFormat::Text, Failure::Config(msg));
            }
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        // The report (doctor) or the final line (resolve, with the causes) says what
        // failed; the broker's warnings would only repeat it.
        Command::Doctor(_) | Command::Resolve(_) => "error",
        _ => "warn",
    };
    let format = cli.log_format;
    if let Err(msg) = init_tracing(format, default_level) {
        return report(format, Failure::Config(msg));
    }
    let command = match cli.command {
        Command::CredentialHelper(args) => return helper_mode(&args.action, args.endpoint),
        Command::KubeletCredentialProvider => {
            let code = crate::oneshot::kubelet::run(
                || Settings::from_env(|k| std::env::var(k).ok()),
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            );
            return ExitCode::from(code);
        }
        Command::Crd => return print_crd(&mut std::io::stdout().lock()),
        other => other,
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("regbroker: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Resolve(args) => resolve::run(args).await,
            Command::Doctor(args) => doctor::run(args).await,
            Command::CredentialHelper(_) | Command::KubeletCredentialProvider | Command::Crd => {
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => report(format, failure),
    }
}

/// Writes the CRD as YAML.
fn print_crd(out: &mut impl std::io::Write) -> ExitCode {
    // The header keeps yamllint (deploy/check.sh) off the generated lines: the schema's
    // descriptions are long, and sequences are not indented.
    const HEADER: &str = "# The RegistryCredential CRD, generated by `regbroker crd` from regbroker's types: do not edit.\n\
                          # yamllint disable rule:line-length rule:indentation\n";
    let written = yaml_serde::to_string(&crate::controller::api::crd())
        .map_err(|e| e.to_string())
        .and_then(|yaml| {
            out.write_all(format!("{HEADER}{yaml}").as_bytes())
                .map_err(|e| e.to_string())
        });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("regbroker: cannot print the CRD: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line, each mode's `--help` ending with the variables it reads besides
/// its flags' env forms.
fn command() -> clap::Command {
    use crate::env::{Mode, help_section};
    let mut cmd = Cli::command();
    for (name, mode) in [
        ("serve", Mode::Serve),
        ("resolve", Mode::Check),
        ("doctor", Mode::Check),
        ("credential-helper", Mode::OneShot),
        ("kubelet-credential-provider", Mode::OneShot),
    ] {
        cmd = cmd.mut_subcommand(name, |c| c.after_help(help_section(mode)));
    }
    cmd
}

/// Every variable the mode `name` (a subcommand) reads: its flags' env forms and the
/// rest (see [`crate::env::read_by`]); `--help` lists them all.
pub fn env_vars(name: &str) -> Vec<String> {
    let cmd = command();
    let mut out: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if let Some(sub) = cmd.find_subcommand(name) {
        out.extend(
            sub.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|v| v.to_string_lossy().into_owned()),
        );
    }
    let mode = match name {
        "serve" => crate::env::Mode::Serve,
        "credential-helper" | "kubelet-credential-provider" => crate::env::Mode::OneShot,
        _ => crate::env::Mode::Check,
    };
    for g in crate::env::read_by(mode) {
        out.extend(g.vars.iter().map(|v| v.to_string()));
    }
    out.sort();
    out.dedup();
    out
}

/// `docker-credential-regbroker --help`: the protocol's usage, then the environment.
fn helper_usage(name: &str) -> String {
    format!(
        "Usage: {name} <get|store|erase|list|version>\n\n\
         The docker credential helper protocol: `get` reads a registry (host, host:port or URL)\n\
         on stdin and prints its credential as JSON; `list` prints the static entries;\n\
         `store` and `erase` succeed and change nothing; `version` prints the version.\n\n{}",
        crate::env::help_section(crate::env::Mode::OneShot)
    )
}

/// For clap's "invalid value" error about a flag that is not on the command line (so its
/// value came from its env form), the message naming the variable rather than the flag.
/// The value is not repeated: no flag with an env form holds a secret today, but a
/// message about the environment should not depend on that.
fn env_value_error(e: &clap::Error, argv: &[std::ffi::OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let ContextValue::String(shown) = e.get(ContextKind::InvalidArg)? else {
        return None;
    };
    // `--shutdown-grace <SHUTDOWN_GRACE>` or `--insecure-listen`.
    let long = shown.split_whitespace().next()?.strip_prefix("--")?;
    let on_command_line = argv.iter().skip(1).any(|a| {
        let a = a.to_string_lossy();
        a == format!("--{long}") || a.starts_with(&format!("--{long}="))
    });
    if on_command_line {
        return None;
    }
    let var = find_env(&Cli::command(), long)?;
    let why = match (e.kind(), std::error::Error::source(e)) {
        (ErrorKind::ValueValidation, Some(source)) => source.to_string(),
        _ => match e.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(v)) => format!("expected one of {}", v.join(", ")),
            _ => "invalid value".to_string(),
        },
    };
    Some(format!("{var} (the env form of --{long}): {why}"))
}

/// The env var of the flag `--long` anywhere in `cmd`'s tree.
fn find_env(cmd: &clap::Command, long: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .or_else(|| cmd.get_subcommands().find_map(|c| find_env(c, long)))
}

/// Says what failed, once: a final line on stderr for text logs, or one error event for
/// JSON logs (a log collector then sees it with the rest). Returns the exit code.
fn report(format: LogFormat, failure: Failure) -> ExitCode {
    let (line, code) = match failure {
        // The report on stdout already says which check failed and why.
        Failure::Checks => return ExitCode::FAILURE,
        Failure::Config(msg) => (format!("invalid configuration: {msg}"), EXIT_CONFIG),
        Failure::Usage(msg) => (msg, EXIT_CONFIG),
        Failure::Runtime(msg) => (msg, 1),
    };
    match format {
        LogFormat::Json if tracing::dispatcher::has_been_set() => tracing::error!("{line}"),
        _ => eprintln!("regbroker: {line}"),
    }
    ExitCode::from(code)
}

fn helper_mode(action: &str, endpoint: Option<String>) -> ExitCode {
    let settings = move || {
        let mut s = Settings::from_env(|k| std::env::var(k).ok())?;
        if let Some(e) = endpoint.filter(|e| !e.is_empty()) {
            s.endpoint = Some(e.parse().map_err(|e| format!("--endpoint: {e}"))?);
        }
        Ok(s)
    };
    let code = crate::oneshot::helper::run(
        action,
        settings,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
    );
    ExitCode::from(code)
}

enum Failure {
    Config(String),
    Runtime(String),
    /// Bad usage (exit 64), e.g. a malformed argument.
    Usage(String),
    /// `doctor`: a check failed (exit 1); the report said which.
    Checks,
}

fn build_core(sources: &Sources) -> Result<Built, Failure> {
    crate::broker::build(sources.config.as_ref(), &sources.docker_config).map_err(Failure::Config)
}
