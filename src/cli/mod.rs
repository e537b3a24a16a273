//! Command line: flags and env, tracing, running a mode, exit codes.
//!
//! Exit codes: 0 success; 1 a runtime failure (no credential, cannot bind); 64 invalid
//! configuration or usage (as `EX_USAGE` in sysexits.h).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use regbroker_provider::{ExposeSecret, Registry};

use crate::backend::{Built, Settings};
use crate::broker::{Reason, Route};
use crate::server::{self, Bound, Listen};
use crate::static_secret;

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

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the sidecar: serve credentials over HTTP.
    Serve(ServeArgs),
    /// Say which rule and source serve a registry, and fetch its credential once.
    Resolve(ResolveArgs),
    /// Speak the docker credential-helper protocol (as `docker-credential-regbroker`).
    /// Settings come from the environment: REGBROKER_ENDPOINT, or REGBROKER_CONFIG,
    /// REGBROKER_DOCKER_CONFIG and REGBROKER_CACHE_DIR.
    CredentialHelper(HelperArgs),
    /// Speak the kubelet image credential provider protocol (credentialprovider.kubelet.k8s.io/v1).
    /// Settings come from the environment, as for credential-helper.
    KubeletCredentialProvider,
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

#[derive(Debug, Args)]
#[group(id = "sinks", multiple = true)]
struct ServeArgs {
    /// HOST:PORT (an IP address) or unix:PATH.
    #[arg(long, env = "REGBROKER_LISTEN", default_value = DEFAULT_LISTEN)]
    listen: Listen,

    /// Also serve /healthz, /readyz and /metrics (never credentials) on HOST:PORT or
    /// unix:PATH, for kubelet probes when --listen is loopback.
    #[arg(long, env = "REGBROKER_PROBE_LISTEN", value_name = "ADDR")]
    probe_listen: Option<Listen>,

    /// How long to let in-flight requests finish after SIGTERM or SIGINT.
    #[arg(long, env = "REGBROKER_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,

    /// Require `Authorization: Bearer <token>` on /v1/credentials, with the token read
    /// from this file (at least 16 characters; a trailing newline is ignored).
    #[arg(long, env = "REGBROKER_AUTH_TOKEN_FILE", value_name = "PATH")]
    auth_token_file: Option<PathBuf>,

    /// Allow listening on a non-loopback address without a token. Anyone who can reach
    /// the port gets registry credentials: only for networks you fully control.
    #[arg(long, env = "REGBROKER_INSECURE_LISTEN")]
    insecure_listen: bool,

    /// Numeric group id that may use the unix socket (mode 0660 instead of 0600).
    #[arg(long, env = "REGBROKER_SOCKET_GROUP", value_name = "GID")]
    socket_group: Option<u32>,

    /// Keep a docker config.json at PATH with fresh credentials for every registry with a
    /// static entry or an exact provider rule (mode 0600, atomic writes).
    #[arg(
        long,
        env = "REGBROKER_WRITE_DOCKER_CONFIG",
        value_name = "PATH",
        group = "sinks"
    )]
    write_docker_config: Option<PathBuf>,

    /// Keep this kubernetes.io/dockerconfigjson Secret fresh, with the registries the docker
    /// config file would hold; repeatable (env: comma-separated). Only Secrets labelled
    /// app.kubernetes.io/managed-by=regbroker are updated.
    #[arg(
        long = "sync-secret",
        env = "REGBROKER_SYNC_SECRET",
        value_name = "NAMESPACE/NAME",
        value_delimiter = ',',
        group = "sinks"
    )]
    sync_secret: Vec<crate::secret_sync::SecretRef>,

    /// Also write this registry to the docker config file and synced Secrets; repeatable
    /// (env: comma-separated).
    #[arg(long = "sink-registry", env = "REGBROKER_SINK_REGISTRY", value_name = "REGISTRY", value_delimiter = ',', requires = "sinks", value_parser = parse_registry)]
    sink_registry: Vec<Registry>,

    #[command(flatten)]
    sources: Sources,
}

fn parse_registry(s: &str) -> Result<Registry, String> {
    Registry::parse(s).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
struct ResolveArgs {
    /// What a client would send: host, host:port, URL or image reference.
    registry: String,

    /// Print the password or token instead of redacting it.
    #[arg(long)]
    show_secret: bool,

    #[command(flatten)]
    sources: Sources,
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
        init_tracing(LogFormat::Text, "warn");
        let action = args
            .next()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        return helper_mode(&action, None);
    }

    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
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
        _ => "warn",
    };
    init_tracing(cli.log_format, default_level);
    let command = match cli.command {
        Command::CredentialHelper(args) => return helper_mode(&args.action, args.endpoint),
        Command::KubeletCredentialProvider => {
            let code = crate::kubelet::run(
                || Settings::from_env(|k| std::env::var(k).ok()),
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            );
            return ExitCode::from(code);
        }
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
            Command::Serve(args) => serve(args).await,
            Command::Resolve(args) => resolve(args).await,
            Command::CredentialHelper(_) | Command::KubeletCredentialProvider => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(msg)) => {
            tracing::error!("{msg}");
            eprintln!("regbroker: invalid configuration: {msg}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(Failure::Runtime(msg)) => {
            tracing::error!("{msg}");
            eprintln!("regbroker: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn helper_mode(action: &str, endpoint: Option<String>) -> ExitCode {
    let settings = move || {
        let mut s = Settings::from_env(|k| std::env::var(k).ok())?;
        if let Some(e) = endpoint.filter(|e| !e.is_empty()) {
            s.endpoint = Some(e.parse().map_err(|e| format!("--endpoint: {e}"))?);
        }
        Ok(s)
    };
    let code = crate::helper::run(
        action,
        settings,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
    );
    ExitCode::from(code)
}

/// The log filter: `user` (EnvFilter syntax, e.g. `info` or `regbroker=debug`) and, on
/// top, caps on library targets that would log secrets (the AWS SDK logs session tokens at
/// TRACE; kube-client quotes unparsable response bodies, such as a Secret, at WARN). The
/// caps only ever lower a level: an event must pass both filters, so `REGBROKER_LOG=trace`
/// cannot undo a cap, and a cap never turns on a library's debug logs.
pub fn log_filter<S>(
    user: &str,
) -> impl tracing_subscriber::layer::Filter<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::filter::{FilterExt as _, LevelFilter, Targets};
    let user = tracing_subscriber::EnvFilter::try_new(user).unwrap_or_else(|e| {
        eprintln!("regbroker: ignoring invalid REGBROKER_LOG ({e}); using `info`");
        tracing_subscriber::EnvFilter::new("info")
    });
    let caps = crate::providers::log_directives()
        .into_iter()
        .chain(crate::secret_sync::LOG_DIRECTIVES.iter().copied())
        .filter_map(|d| {
            let (target, level) = d.split_once('=')?;
            Some((target.to_string(), level.parse::<LevelFilter>().ok()?))
        });
    let caps = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(caps);
    user.and(caps)
}

fn init_tracing(format: LogFormat, default_level: &str) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let user = std::env::var("REGBROKER_LOG").unwrap_or_else(|_| default_level.to_string());
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => tracing_subscriber::registry()
            .with(layer.with_filter(log_filter(&user)))
            .try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(
                layer
                    .json()
                    .flatten_event(true)
                    .with_filter(log_filter(&user)),
            )
            .try_init(),
    };
}

enum Failure {
    Config(String),
    Runtime(String),
}

fn build_core(sources: &Sources) -> Result<Built, Failure> {
    crate::backend::build_broker(sources.config.as_ref(), &sources.docker_config)
        .map_err(Failure::Config)
}

/// Reads a bearer token file; the error never quotes the file's contents.
pub fn read_token_file(path: &std::path::Path) -> Result<regbroker_provider::SecretString, String> {
    let raw = zeroize::Zeroizing::new(
        std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read the token file: {e}", path.display()))?,
    );
    let token = raw.trim_end_matches(['\n', '\r']);
    if token.len() < 16 {
        return Err(format!(
            "{}: the token must be at least 16 characters",
            path.display()
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{}: the token must not contain whitespace",
            path.display()
        ));
    }
    Ok(token.to_string().into())
}

async fn serve(args: ServeArgs) -> Result<(), Failure> {
    let bearer_token = match &args.auth_token_file {
        Some(p) => Some(Arc::new(read_token_file(p).map_err(Failure::Config)?)),
        None => None,
    };
    if let Listen::Tcp(addr) = &args.listen
        && !addr.ip().is_loopback()
        && bearer_token.is_none()
        && !args.insecure_listen
    {
        return Err(Failure::Config(format!(
            "refusing to serve credentials on non-loopback address {addr} without --auth-token-file; \
             pass --insecure-listen if every client that can reach it may have every credential"
        )));
    }
    let core = build_core(&args.sources)?;
    let bound = Bound::bind_with(&args.listen, args.socket_group)
        .await
        .map_err(|e| Failure::Runtime(format!("cannot listen on {}: {e}", args.listen)))?;
    let _watcher = if core.statics.paths().is_empty() {
        None
    } else {
        Some(static_secret::watch(core.statics.clone()).map_err(|e| {
            Failure::Runtime(format!("cannot watch static credential sources: {e}"))
        })?)
    };
    let _secret_sync = if args.sync_secret.is_empty() {
        None
    } else {
        let client = crate::secret_sync::client_from_environment()
            .await
            .map_err(Failure::Runtime)?;
        let config = crate::secret_sync::Config {
            secrets: args.sync_secret,
            extra: args.sink_registry.clone(),
        };
        // The first pass runs in the task too: a slow API server must not delay serving.
        let broker = core.broker.clone();
        Some(AbortOnDrop(tokio::spawn(async move {
            crate::secret_sync::SecretSync::start(broker, config, client)
                .await
                .run()
                .await
        })))
    };
    let _sink = match args.write_docker_config {
        None => None,
        Some(path) => {
            let config = crate::sink::Config {
                path,
                extra: args.sink_registry,
            };
            let sink = crate::sink::Sink::start(core.broker.clone(), config.clone())
                .await
                .map_err(|e| {
                    Failure::Runtime(format!(
                        "cannot write docker config {}: {e}",
                        config.path.display()
                    ))
                })?;
            Some(AbortOnDrop(tokio::spawn(sink.run())))
        }
    };
    let ready = Arc::new(AtomicBool::new(false));
    let state = server::AppState {
        broker: core.broker.clone(),
        metrics: core.metrics.clone(),
        ready: ready.clone(),
    };
    let _probe = match &args.probe_listen {
        None => None,
        Some(listen) => {
            let probe = Bound::bind(listen)
                .await
                .map_err(|e| Failure::Runtime(format!("cannot listen on {listen}: {e}")))?;
            tracing::info!(listen = %probe.local(), "Probe endpoint listening");
            let probe_app = server::probe_app(state.clone());
            Some(AbortOnDrop(tokio::spawn(async move {
                if let Err(e) = probe.serve(probe_app, std::future::pending()).await {
                    tracing::error!(error = %e, "Probe endpoint failed");
                }
            })))
        }
    };
    let app = server::app_with(
        state,
        server::Options {
            bearer_token,
            ..server::Options::default()
        },
    );
    tracing::info!(
        listen = %bound.local(),
        static_entries = core.statics.snapshot().len(),
        version = env!("CARGO_PKG_VERSION"),
        "Listening"
    );
    ready.store(true, Ordering::Release);

    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown_signal().await;
        let _ = signalled_tx.send(());
    };
    let server = tokio::spawn(bound.serve(app, shutdown));
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return finish(r),
        _ = signalled_rx => {}
    }
    tracing::info!(grace = ?args.shutdown_grace, "Shutting down; finishing in-flight requests");
    match tokio::time::timeout(args.shutdown_grace, &mut server).await {
        Ok(r) => finish(r),
        Err(_) => {
            tracing::warn!("Grace period over; dropping remaining connections");
            Ok(())
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn finish(r: Result<std::io::Result<()>, tokio::task::JoinError>) -> Result<(), Failure> {
    match r {
        Ok(Ok(())) => {
            tracing::info!("Stopped");
            Ok(())
        }
        Ok(Err(e)) => Err(Failure::Runtime(format!("server failed: {e}"))),
        Err(e) => Err(Failure::Runtime(format!("server task failed: {e}"))),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::warn!("Cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

async fn resolve(args: ResolveArgs) -> Result<(), Failure> {
    let registry = Registry::parse(&args.registry)
        .map_err(|e| Failure::Runtime(format!("invalid registry: {e}")))?;
    let core = build_core(&args.sources)?;
    let decision = core.broker.decide(&registry);
    let source = match &decision.route {
        Route::Static(_) => "static".to_string(),
        Route::Provider(p, t) => format!("{} (scope {})", p.name(), t.scope()),
        Route::NotConfigured(_) => "none".to_string(),
        Route::Failed(p, _) => p.to_string(),
    };
    let why = match &decision.reason {
        Reason::StaticEntry => "a static docker config entry names it".to_string(),
        Reason::Rule { index, pattern } => format!("rule {} (match = {pattern:?})", index + 1),
        Reason::AutoDetected => "auto-detected by the provider's host patterns".to_string(),
        Reason::NoMatch => "no static entry, rule or provider matches".to_string(),
    };
    println!("registry:  {registry}");
    println!("decided:   {why}");
    println!("source:    {source}");
    let served = core
        .broker
        .serve(&registry, decision.route)
        .await
        .map_err(|e| Failure::Runtime(format!("no credential: {e}")))?;
    println!("username:  {}", served.credential.username());
    if args.show_secret {
        println!("password:  {}", served.credential.secret().expose_secret());
    } else {
        println!("password:  <redacted; pass --show-secret to print it>");
    }
    match served.credential.expires_at() {
        Some(t) if t > core.broker.now() => println!("expires:   {}", crate::rfc3339(t)),
        Some(t) => println!(
            "expires:   {} (already past by our clock)",
            crate::rfc3339(t)
        ),
        None => println!("expires:   unknown"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Emits one event per (library, level) case under `log_filter(user)`; returns the
    /// names of the events that got through.
    fn passed(user: &str) -> String {
        let capture = Capture::default();
        let writer = capture.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(super::log_filter(user));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::debug!(target: "regbroker::broker", "own-debug");
            tracing::debug!(target: "hyper_util::client", "hyper-debug");
            tracing::debug!(target: "aws_smithy_runtime::client", "aws-debug");
            tracing::trace!(target: "aws_smithy_runtime::client", "aws-trace");
            tracing::warn!(target: "kube_client::client", "kube-warn");
            tracing::error!(target: "kube_client::client", "kube-error");
        });
        String::from_utf8(capture.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn caps_never_raise_a_level() {
        let out = passed("warn");
        for quiet in [
            "own-debug",
            "hyper-debug",
            "aws-debug",
            "aws-trace",
            "kube-warn",
        ] {
            assert!(!out.contains(quiet), "{quiet} logged at `warn`:\n{out}");
        }
        assert!(out.contains("kube-error"));
        let out = passed("regbroker=debug");
        assert!(
            out.contains("own-debug") && !out.contains("hyper-debug"),
            "{out}"
        );
    }

    #[cfg(feature = "aws")]
    #[test]
    fn caps_hold_even_at_trace() {
        let out = passed("trace");
        assert!(
            out.contains("own-debug") && out.contains("aws-debug"),
            "{out}"
        );
        assert!(
            !out.contains("aws-trace"),
            "the AWS SDK's TRACE logs hold secrets:\n{out}"
        );
        assert!(
            !out.contains("kube-warn"),
            "kube-client's WARN may quote a Secret:\n{out}"
        );
    }
}
