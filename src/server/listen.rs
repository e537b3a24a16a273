//! Listeners: a TCP address or a unix socket, bound and served with hyper, with the
//! connection limits of [`super::limits::ConnLimits`] and a graceful shutdown that lets
//! in-flight requests finish.
//!
//! A connection holds one of `max_connections` slots until it ends, so none may stay
//! without progress for ever: its request head must arrive within `header_read_timeout`
//! (the wait also runs while a keep-alive connection idles between requests, so an idle
//! connection is closed after it), and an answer that waits unwritten, without a byte of
//! progress, for `write_timeout` (a client that does not read) gets the connection
//! closed with a reset; one watchdog per connection enforces both (`watchdog.rs`), in
//! plain and TLS alike. A request waiting on an upstream fetch does no I/O and is
//! bounded by the request timeout instead.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::limits::ConnLimits;
use super::watchdog::{self, AbortOnClose, Tracked, Watch, Watched};
use axum::http::Request;
use axum::response::Response;
use hyper::body::Incoming;
use std::convert::Infallible;

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

/// What a listener serves: [`super::App`], or any service of the same shape (tests serve
/// routers of their own).
pub trait Service:
    tower_service::Service<
        Request<Incoming>,
        Response = Response,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Service for S where
    S: tower_service::Service<
            Request<Incoming>,
            Response = Response,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

impl Bound {
    /// Binds `listen`. A unix socket gets mode 0600; a stale socket file is replaced; any
    /// other file at the path is refused. The socket appears at its path already with its
    /// final mode (bound in a private directory and renamed into place).
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
                if let Ok(meta) = std::fs::symlink_metadata(path)
                    && !meta.file_type().is_socket()
                {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("{} exists and is not a socket", path.display()),
                    ));
                }
                // bind() creates the socket with the process umask's mode. Bound at its
                // path and chmod'ed there, it would be connectable by others in between; so
                // it is bound in a private (0700) directory next to the path, given its
                // mode and group there, and renamed into place, replacing a stale socket
                // atomically. The directory is short-named: a socket path has ~107 bytes.
                let parent = path
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(std::path::Path::new("."));
                let private = tempfile::Builder::new()
                    .prefix(".rb-")
                    .rand_bytes(6)
                    .permissions(std::fs::Permissions::from_mode(0o700))
                    .tempdir_in(parent)?;
                let staged = private.path().join("s");
                let listener = tokio::net::UnixListener::bind(&staged)?;
                std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
                if let Some(gid) = socket_group {
                    std::os::unix::fs::chown(&staged, None, Some(gid))?;
                    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o660))?;
                }
                std::fs::rename(&staged, path)?;
                private.close()?;
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
    pub async fn serve<S: Service>(
        self,
        app: S,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.serve_with(app, shutdown, ConnLimits::default()).await
    }

    /// As [`Bound::serve`], with connection limits.
    pub async fn serve_with<S: Service>(
        self,
        app: S,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        limits: ConnLimits,
    ) -> std::io::Result<()> {
        self.serve_tls(app, shutdown, limits, None).await
    }

    /// As [`Bound::serve_with`]; with `tls`, every connection is TLS (the handshake must
    /// finish within the header read timeout, in the connection's own task).
    pub async fn serve_tls<S: Service>(
        self,
        app: S,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        limits: ConnLimits,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> std::io::Result<()> {
        match self {
            Bound::Tcp(l) => accept_loop(l, app, shutdown, limits, tls).await,
            Bound::Unix(l, path) => {
                let r = accept_loop(l, app, shutdown, limits, tls).await;
                let _ = std::fs::remove_file(path);
                r
            }
        }
    }
}

async fn accept_loop<L, S: Service>(
    listener: L,
    app: S,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: ConnLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Io: AbortOnClose + Send + 'static,
{
    let mut listener = listener;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    // hyper's own header read timeout is off: it boxed and registered a timer for every
    // request head; the connection's watchdog enforces the same limit with one timer.
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let watch_limits = watchdog::Limits {
        header_read: limits.header_read_timeout,
        write: limits.write_timeout,
    };
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
        // The raw stream is watched, below TLS, so every write (handshake and records
        // included) counts.
        let watch = Watch::new();
        let io = Watched::new(io, watch.clone());
        let service = Tracked::new(app.clone(), watch.clone());
        let Some(tls) = &tls else {
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                serve_watched(conn, watch, watch_limits).await;
                drop(permit);
            });
            continue;
        };
        // The handshake runs in the connection's task, so a slow client never holds up
        // accepting others; it gets the header read timeout to finish.
        let (tls, builder) = (tls.clone(), builder.clone());
        let watcher = graceful.watcher();
        let handshake_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            match tokio::time::timeout(handshake_timeout, tls.accept(io)).await {
                Ok(Ok(stream)) => {
                    // The handshake had its own timeout: the wait for a head starts now.
                    watch.restart_wait();
                    let conn =
                        builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    serve_watched(watcher.watch(conn), watch, watch_limits).await;
                }
                // No secret in a handshake error: it says what the client got wrong.
                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Runs one connection until it ends, or until its watchdog gives up on it (no request
/// head within the header read timeout, or an answer waiting unwritten for the write
/// timeout); the connection is then dropped, which closes its socket (with a reset after
/// a write stall). The watchdog is polled after the connection on every wake-up, so it
/// sees what the connection just did.
async fn serve_watched<E: std::fmt::Display>(
    conn: impl std::future::Future<Output = Result<(), E>>,
    watch: Arc<Watch>,
    limits: watchdog::Limits,
) {
    tokio::select! {
        biased;
        ended = conn => if let Err(e) = ended {
            tracing::debug!(error = %e, "Connection ended with an error");
        },
        why = watch.expired(limits) => match why {
            watchdog::Expired::HeaderRead => tracing::debug!(
                header_read_timeout = ?limits.header_read,
                "Connection closed: no request head within the header read timeout"
            ),
            watchdog::Expired::Write => tracing::debug!(
                write_timeout = ?limits.write,
                "Connection closed: its answer waited unread for the write timeout"
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use std::time::{Duration, Instant};

    /// The socket must never be connectable by others, even for a moment. Binding creates
    /// it with the process umask's mode, so it must not be created at its path and
    /// re-moded there: it is bound in a private directory, given its mode there, and
    /// renamed into place. inotify on the parent tells the two apart: the path first
    /// appears as a rename target (IN_MOVED_TO), never as a creation (IN_CREATE).
    #[tokio::test]
    async fn the_socket_appears_at_its_path_only_by_rename() {
        use notify::Watcher as _;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("regbroker.sock");
        let (tx, rx) = std::sync::mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if let Ok(e) = e {
                let _ = tx.send(e);
            }
        })
        .unwrap();
        watcher
            .watch(dir.path(), notify::RecursiveMode::NonRecursive)
            .unwrap();
        let bound = Bound::bind(&Listen::Unix(sock.clone())).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        let first = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(e) if e.paths.contains(&sock) => break e.kind,
                Ok(e) => seen.push(e),
                Err(_) => panic!("no event named the socket; saw {seen:?}"),
            }
        };
        assert!(
            matches!(
                first,
                notify::EventKind::Modify(notify::event::ModifyKind::Name(_))
            ),
            "the socket was created in place ({first:?}), so it existed with the umask's mode before its chmod"
        );
        drop(bound);
    }

    #[tokio::test]
    async fn the_socket_gets_its_mode_and_leaves_nothing_else_behind() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let bound = Bound::bind(&Listen::Unix(sock.clone())).await.unwrap();
        let meta = std::fs::symlink_metadata(&sock).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(bound.local(), format!("unix:{}", sock.display()));
        // The private directory it was bound in is gone.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s.sock")]);
        // It answers at its final path.
        std::os::unix::net::UnixStream::connect(&sock).unwrap();
        drop(bound);

        // With a group: 0660, that group.
        let gid = std::fs::metadata(dir.path()).unwrap().gid();
        let grouped = dir.path().join("g.sock");
        let bound = Bound::bind_with(&Listen::Unix(grouped.clone()), Some(gid))
            .await
            .unwrap();
        let meta = std::fs::metadata(&grouped).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        assert_eq!(meta.gid(), gid);
        drop(bound);
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_anything_else_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_err());
        let bound = Bound::bind(&Listen::Unix(sock.clone())).await.unwrap();
        std::os::unix::net::UnixStream::connect(&sock).unwrap();
        drop(bound);

        let file = dir.path().join("f");
        std::fs::write(&file, "keep me").unwrap();
        let err = Bound::bind(&Listen::Unix(file.clone())).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
