//! `regbroker serve`: the sidecar. Binds the credential endpoint (and the optional probe
//! endpoint), starts the static-source watcher and the sinks (docker config file, Secret
//! sync), flips readiness once start-up work is done, and on SIGTERM or SIGINT lets
//! in-flight requests finish for `--shutdown-grace`. With `--ready-requires-sinks`,
//! readiness also waits for every sink this replica writes to be written once.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use regbroker_provider::Registry;

use super::{Failure, Sources, build_core};
use crate::broker::static_secret;
use crate::server::{self, Bound, Listen};

#[derive(Debug, Args)]
#[group(id = "sinks", multiple = true)]
// What leader election guards: the Secret sync and the controller.
#[command(group(clap::ArgGroup::new("kube_writers").multiple(true).args(["sync_secret", "registry_credentials"])))]
pub(super) struct ServeArgs {
    /// HOST:PORT (an IP address) or unix:PATH.
    #[arg(long, env = "REGBROKER_LISTEN", default_value = super::DEFAULT_LISTEN)]
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

    /// Allow listening on a non-loopback address without a token or without TLS. Anyone
    /// who can reach (or watch) the port gets registry credentials: only for networks you
    /// fully control.
    #[arg(long, env = "REGBROKER_INSECURE_LISTEN", value_parser = crate::env::parse_bool)]
    insecure_listen: bool,

    /// Serve TLS on the TCP listener with this PEM certificate chain (leaf first); read
    /// again when it changes, for new connections.
    #[arg(
        long,
        env = "REGBROKER_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "tls_key_file"
    )]
    tls_cert_file: Option<PathBuf>,

    /// The PEM private key of --tls-cert-file.
    #[arg(
        long,
        env = "REGBROKER_TLS_KEY_FILE",
        value_name = "PATH",
        requires = "tls_cert_file"
    )]
    tls_key_file: Option<PathBuf>,

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
    sync_secret: Vec<crate::sinks::secret_sync::SecretRef>,

    /// Also write this registry to the docker config file and synced Secrets; repeatable
    /// (env: comma-separated).
    #[arg(long = "sink-registry", env = "REGBROKER_SINK_REGISTRY", value_name = "REGISTRY", value_delimiter = ',', requires = "sinks", value_parser = parse_registry)]
    sink_registry: Vec<Registry>,

    /// Report not ready (/readyz 503) while a sink this replica writes (the docker config
    /// file, a synced Secret) has not been written with every registry since start. A
    /// replica that does not lead (--leader-elect) writes no Secret and stays ready.
    #[arg(long, env = "REGBROKER_READY_REQUIRES_SINKS", value_parser = crate::env::parse_bool)]
    ready_requires_sinks: bool,

    /// Run the RegistryCredential controller (regbroker.dev/v1alpha1): keep the Secret each
    /// object asks for in its namespace, with that namespace's ServiceAccount's identity.
    /// All namespaces, or those of --registry-credentials-namespace. Install the CRD first
    /// (`regbroker crd`).
    #[arg(long, env = "REGBROKER_REGISTRY_CREDENTIALS", value_parser = crate::env::parse_bool)]
    registry_credentials: bool,

    /// Watch RegistryCredentials in this namespace only; repeatable (env: comma-separated).
    #[arg(
        long = "registry-credentials-namespace",
        env = "REGBROKER_REGISTRY_CREDENTIALS_NAMESPACE",
        value_name = "NAMESPACE",
        value_delimiter = ',',
        requires = "registry_credentials",
        value_parser = namespace
    )]
    registry_credentials_namespaces: Vec<String>,

    /// The ServiceAccount, in each object's own namespace, for RegistryCredentials that name
    /// none (without it, such an object is Stalled: ServiceAccountRequired).
    #[arg(
        long,
        env = "REGBROKER_DEFAULT_SERVICE_ACCOUNT",
        value_name = "NAME",
        requires = "registry_credentials",
        value_parser = service_account_name
    )]
    default_service_account: Option<String>,

    #[command(flatten)]
    leader: Box<super::leader_elect::LeaderElectArgs>,

    #[command(flatten)]
    sources: Sources,
}

fn namespace(s: &str) -> Result<String, String> {
    format!("{s}/x")
        .parse::<crate::kubernetes::secret::SecretRef>()
        .map(|r| r.namespace)
}

fn service_account_name(s: &str) -> Result<String, String> {
    format!("x/{s}")
        .parse::<crate::kubernetes::secret::SecretRef>()
        .map(|r| r.name)
        .map_err(|e| e.replace("Secret name", "ServiceAccount name"))
}

fn parse_registry(s: &str) -> Result<Registry, String> {
    Registry::parse(s).map_err(|e| e.to_string())
}

/// Runs the sidecar until SIGTERM or SIGINT, then drains for `--shutdown-grace`.
pub(super) async fn run(args: ServeArgs) -> Result<(), Failure> {
    let bearer_token = match &args.auth_token_file {
        Some(p) => Some(Arc::new(
            crate::server::access::read_token_file(p).map_err(|e| {
                Failure::Config(format!(
                    "{e} (--auth-token-file / REGBROKER_AUTH_TOKEN_FILE)"
                ))
            })?,
        )),
        None => None,
    };
    server::access::check_exposure(
        &args.listen,
        bearer_token.is_some(),
        args.tls_cert_file.is_some(),
        args.insecure_listen,
    )
    .map_err(Failure::Config)?;
    let tls = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => Some(Arc::new(
            server::tls::Tls::load(server::tls::Files {
                cert: cert.clone(),
                key: key.clone(),
            })
            .map_err(|e| {
                Failure::Config(format!(
                    "{e} (--tls-cert-file / REGBROKER_TLS_CERT_FILE, --tls-key-file / REGBROKER_TLS_KEY_FILE)"
                ))
            })?,
        )),
        _ => None,
    };
    args.leader.check_durations().map_err(Failure::Config)?;
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
    let mut elector = None;
    let entries: Vec<crate::sinks::secret_sync::Entry> = core
        .secrets
        .iter()
        .map(|e| crate::sinks::secret_sync::Entry {
            secret: crate::sinks::secret_sync::SecretRef {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
            },
            registries: e.registries.clone(),
            service_account: e.service_account.clone(),
        })
        .collect();
    if let Some(e) = entries
        .iter()
        .find(|e| args.sync_secret.contains(&e.secret))
    {
        return Err(Failure::Config(format!(
            "Secret {} is both in --sync-secret and a [[secret]] of the config file: name it once",
            e.secret
        )));
    }
    if args.ready_requires_sinks
        && args.write_docker_config.is_none()
        && args.sync_secret.is_empty()
        && entries.is_empty()
    {
        return Err(Failure::Config(
            "--ready-requires-sinks needs a sink: --write-docker-config, --sync-secret or a [[secret]] in the config file".into(),
        ));
    }
    core.metrics.sinks.set_required(args.ready_requires_sinks);
    let syncs = !(args.sync_secret.is_empty() && entries.is_empty());
    // clap's `requires` takes a switch given as off (REGBROKER_REGISTRY_CREDENTIALS=false)
    // as given; without these checks the settings below would be ignored in silence.
    let controller_only = [
        (
            !args.registry_credentials_namespaces.is_empty(),
            "--registry-credentials-namespace (REGBROKER_REGISTRY_CREDENTIALS_NAMESPACE)",
        ),
        (
            args.default_service_account.is_some(),
            "--default-service-account (REGBROKER_DEFAULT_SERVICE_ACCOUNT)",
        ),
    ];
    if let Some((_, setting)) = controller_only
        .iter()
        .find(|(set, _)| *set && !args.registry_credentials)
    {
        return Err(Failure::Config(format!(
            "{setting} needs --registry-credentials (REGBROKER_REGISTRY_CREDENTIALS), which is off"
        )));
    }
    if args.leader.enabled() && !syncs && !args.registry_credentials {
        return Err(Failure::Config(
            "--leader-elect (REGBROKER_LEADER_ELECT) has nothing to guard: --registry-credentials (REGBROKER_REGISTRY_CREDENTIALS) is off and no Secret is synced".into(),
        ));
    }
    let client = if syncs || args.registry_credentials {
        Some(
            crate::kubernetes::client_from_environment()
                .await
                .map_err(Failure::Runtime)?,
        )
    } else {
        None
    };
    if let Some(client) = client.as_ref().filter(|_| args.leader.enabled()) {
        elector = Some(super::leader_elect::start(&args.leader, client, &core)?);
    }
    let guard = elector.as_ref().map(|e| e.leadership());
    let reserved: Vec<crate::kubernetes::secret::SecretRef> = args
        .sync_secret
        .iter()
        .chain(entries.iter().map(|e| &e.secret))
        .cloned()
        .collect();
    let mut controller = match client.as_ref().filter(|_| args.registry_credentials) {
        None => None,
        Some(client) => {
            let config = crate::controller::Config {
                namespaces: args.registry_credentials_namespaces,
                default_service_account: args.default_service_account,
                reserved,
            };
            tracing::info!(namespaces = ?config.namespaces, "RegistryCredential controller starting");
            Some(AbortOnDrop(tokio::spawn(crate::controller::run(
                core.broker.clone(),
                client.clone(),
                config,
                guard.clone(),
            ))))
        }
    };
    let mut secret_sync = match client.filter(|_| syncs) {
        None => None,
        Some(client) => {
            let config = crate::sinks::secret_sync::Config {
                secrets: args.sync_secret,
                extra: args.sink_registry.clone(),
                entries,
            };
            // Each Secret is known (pending) before readiness flips, so a readiness that
            // requires the sinks never answers 200 before the first pass has run.
            let names = config
                .secrets
                .iter()
                .chain(config.entries.iter().map(|e| &e.secret));
            for secret in names {
                core.metrics
                    .sink_registered(&secret.sink_name(), crate::sinks::status::Kind::Secret);
            }
            // The first pass runs in the task too: a slow API server must not delay serving.
            let broker = core.broker.clone();
            if let Some(leadership) = guard {
                let sync = crate::sinks::secret_sync::SecretSync::guarded(
                    broker, config, client, leadership,
                );
                Some(AbortOnDrop(tokio::spawn(sync.run())))
            } else {
                Some(AbortOnDrop(tokio::spawn(async move {
                    crate::sinks::secret_sync::SecretSync::start(broker, config, client)
                        .await
                        .run()
                        .await
                })))
            }
        }
    };
    let _sink = match args.write_docker_config {
        None => None,
        Some(path) => {
            let config = crate::sinks::docker_config::Config {
                path,
                extra: args.sink_registry,
            };
            let sink =
                crate::sinks::docker_config::Sink::start(core.broker.clone(), config.clone())
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
    let signals = install_signals();
    tracing::info!(
        listen = %bound.local(),
        tls = tls.is_some(),
        static_entries = core.statics.snapshot().len(),
        version = env!("CARGO_PKG_VERSION"),
        "Listening"
    );
    ready.store(true, Ordering::Release);

    let (signalled_tx, mut signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown_signal(signals).await;
        let _ = signalled_tx.send(());
    };
    let _tls_watch = match &tls {
        Some(t) => Some(server::tls::watch(t.clone()).map_err(Failure::Runtime)?),
        None => None,
    };
    let acceptor = tls.as_ref().map(|t| t.acceptor());
    let server =
        tokio::spawn(bound.serve_tls(app, shutdown, server::ConnLimits::default(), acceptor));
    tokio::pin!(server);
    // A signal both starts the server's graceful shutdown and resolves `signalled_rx`,
    // so with idle connections both branches can be ready at once. The signal is looked
    // at first (`biased`), and whatever ended the serving, the release below runs: once
    // the server branch won that race and returned early, the Lease was never released,
    // and the next leader waited out the whole lease duration (about one SIGTERM in three).
    let ended = tokio::select! {
        biased;
        _ = &mut signalled_rx => None,
        r = &mut server => Some(r),
    };
    if let Some(elector) = elector {
        // The guarded writes stop first, then the Lease is released for the next leader.
        if let Some(sync) = secret_sync.take() {
            sync.stop().await;
        }
        if let Some(controller) = controller.take() {
            controller.stop().await;
        }
        elector.shutdown().await;
    }
    if let Some(r) = ended {
        return finish(r);
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

impl AbortOnDrop {
    /// Aborts the task and waits until it has stopped.
    async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

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

/// SIGTERM and SIGINT, installed before the sidecar says it is listening, so a signal
/// sent as soon as it is up stops it cleanly instead of killing it.
type Signals = Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>;

fn install_signals() -> Signals {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => Some((term, int)),
        _ => {
            tracing::warn!("Cannot install signal handlers; stop with SIGKILL");
            None
        }
    }
}

async fn shutdown_signal(signals: Signals) {
    match signals {
        Some((mut term, mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        None => std::future::pending::<()>().await,
    }
}
