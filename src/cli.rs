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
use regbroker_provider::{ExposeSecret, Registry, system_clock};

use crate::broker::{Broker, Reason, Route};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::providers::Providers;
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
struct ServeArgs {
    /// HOST:PORT (an IP address) or unix:PATH.
    #[arg(long, env = "REGBROKER_LISTEN", default_value = DEFAULT_LISTEN)]
    listen: Listen,

    /// How long to let in-flight requests finish after SIGTERM or SIGINT.
    #[arg(long, env = "REGBROKER_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,

    #[command(flatten)]
    sources: Sources,
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
        Command::Resolve(_) => "warn",
    };
    init_tracing(cli.log_format, default_level);

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
        match cli.command {
            Command::Serve(args) => serve(args).await,
            Command::Resolve(args) => resolve(args).await,
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

fn init_tracing(format: LogFormat, default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("REGBROKER_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

enum Failure {
    Config(String),
    Runtime(String),
}

/// What every mode builds before it serves anything.
struct Core {
    broker: Arc<Broker>,
    statics: Arc<static_secret::Store>,
    metrics: Arc<Metrics>,
}

fn build_core(sources: &Sources) -> Result<Core, Failure> {
    let providers = Providers::builtin();
    let config = match &sources.config {
        Some(path) => {
            crate::config::load(path, &providers).map_err(|e| Failure::Config(e.to_string()))?
        }
        None => Config::default(),
    };
    let metrics = Arc::new(Metrics::new());
    let statics = Arc::new(
        static_secret::Store::open(sources.docker_config.clone(), metrics.clone())
            .map_err(|e| Failure::Config(e.to_string()))?,
    );
    let broker = Arc::new(Broker::new(
        statics.clone(),
        config.router,
        providers,
        config.cache,
        metrics.clone(),
        system_clock(),
    ));
    Ok(Core {
        broker,
        statics,
        metrics,
    })
}

async fn serve(args: ServeArgs) -> Result<(), Failure> {
    let core = build_core(&args.sources)?;
    let bound = Bound::bind(&args.listen)
        .await
        .map_err(|e| Failure::Runtime(format!("cannot listen on {}: {e}", args.listen)))?;
    let _watcher = if core.statics.paths().is_empty() {
        None
    } else {
        Some(static_secret::watch(core.statics.clone()).map_err(|e| {
            Failure::Runtime(format!("cannot watch static credential sources: {e}"))
        })?)
    };
    let ready = Arc::new(AtomicBool::new(false));
    let app = server::app(server::AppState {
        broker: core.broker.clone(),
        metrics: core.metrics.clone(),
        ready: ready.clone(),
    });
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
