//! Listeners: a TCP address or a unix socket, bound and served with hyper, with the
//! connection limits of [`super::limits::ConnLimits`] and a graceful shutdown that lets
//! in-flight requests finish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use tokio::sync::Semaphore;

use super::limits::ConnLimits;

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address (loopback by default).
    Tcp(SocketAddr),
    /// A unix socket path.
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/regbroker/sock".into());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        s.parse::<SocketAddr>().map(Listen::Tcp).map_err(|_| {
            format!("`{s}` is neither HOST:PORT (an IP address and port) nor unix:PATH")
        })
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Bound {
    /// TCP.
    Tcp(tokio::net::TcpListener),
    /// Unix socket.
    Unix(tokio::net::UnixListener, PathBuf),
}

impl Bound {
    /// Binds `listen`. A unix socket gets mode 0600; a stale socket file is replaced.
    pub async fn bind(listen: &Listen) -> std::io::Result<Bound> {
        Bound::bind_with(listen, None).await
    }

    /// As [`Bound::bind`]; with `socket_group`, a unix socket is given to that group with
    /// mode 0660 so members of the group may connect.
    pub async fn bind_with(listen: &Listen, socket_group: Option<u32>) -> std::io::Result<Bound> {
        match listen {
            Listen::Tcp(addr) => Ok(Bound::Tcp(tokio::net::TcpListener::bind(addr).await?)),
            Listen::Unix(path) => {
                use std::os::unix::fs::{FileTypeExt, PermissionsExt};
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if meta.file_type().is_socket() {
                        std::fs::remove_file(path)?;
                    } else {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            format!("{} exists and is not a socket", path.display()),
                        ));
                    }
                }
                let listener = tokio::net::UnixListener::bind(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                if let Some(gid) = socket_group {
                    std::os::unix::fs::chown(path, None, Some(gid))?;
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
                }
                Ok(Bound::Unix(listener, path.clone()))
            }
        }
    }

    /// What was bound, with the real port for `:0`.
    pub fn local(&self) -> String {
        match self {
            Bound::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            Bound::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }

    /// Serves `app` until `shutdown` completes, then finishes in-flight requests.
    pub async fn serve(
        self,
        app: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.serve_with(app, shutdown, ConnLimits::default()).await
    }

    /// As [`Bound::serve`], with connection limits.
    pub async fn serve_with(
        self,
        app: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        limits: ConnLimits,
    ) -> std::io::Result<()> {
        match self {
            Bound::Tcp(l) => accept_loop(l, app, shutdown, limits).await,
            Bound::Unix(l, path) => {
                let r = accept_loop(l, app, shutdown, limits).await;
                let _ = std::fs::remove_file(path);
                r
            }
        }
    }
}

async fn accept_loop<L>(
    listener: L,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: ConnLimits,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Io: Send + 'static,
{
    let mut listener = listener;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let service = hyper_util::service::TowerToHyperService::new(app);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (io, _peer) = tokio::select! {
            conn = listener.accept() => conn,
            _ = &mut shutdown => break,
        };
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service.clone());
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "Connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
