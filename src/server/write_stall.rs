//! Write stalls: how long a connection's answer has waited, unwritten, for its client to
//! read. A client that never reads fills the socket's send buffer; every write then stays
//! `Pending` and hyper, busy writing, never reads the next request head, so its header
//! read timeout never starts and the connection (with its slot of `max_connections`) is
//! held for ever.
//!
//! [`Watched`] wraps the accepted stream (under TLS too: it is the raw stream that is
//! wrapped) and notes in a shared [`Stall`] when a write, flush or shutdown first went
//! `Pending` without a byte of progress; any write of at least one byte, or a finished
//! flush or shutdown, clears it. The connection's task races hyper's connection against
//! [`Stall::lasted`], which resolves once one stall has lasted the write timeout; the
//! task then drops the connection, and [`Watched`] closes the socket with a reset so the
//! kernel drops the unsent answer at once instead of keeping it for an orphaned socket.
//!
//! A connection that does no I/O at all (a request waiting on an upstream fetch, an idle
//! keep-alive connection) is not stalled: the first is bounded by the request timeout,
//! the second by hyper's header read timeout, which runs while it waits for a next head.
//!
//! Progress is what the kernel accepts: on Linux a full send buffer takes more only once
//! about a third of it is free again, so a client must read that much (roughly 0.9 MB of
//! a 2.6 MB loopback buffer) within the write timeout to count as reading. Answers that
//! fit in the send buffer never stall at all.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// One connection's write stall, shared by its stream and its watchdog.
#[derive(Debug)]
pub(super) struct Stall {
    /// When the connection started; stall times are kept as nanoseconds after it.
    base: Instant,
    /// 0 when writes make progress; else 1 + nanoseconds after `base` when the current
    /// stall began. Read on every write (an atomic load); the clock is read only when a
    /// stall begins.
    since: AtomicU64,
    /// Woken when a stall begins, so an idle watchdog costs nothing but a waiter.
    began: Notify,
    /// Set when the watchdog gave up: the socket is then closed with a reset.
    abort: AtomicBool,
}

impl Stall {
    pub(super) fn new() -> Arc<Stall> {
        Arc::new(Stall {
            base: Instant::now(),
            since: AtomicU64::new(0),
            began: Notify::new(),
            abort: AtomicBool::new(false),
        })
    }

    /// A write went `Pending`: the stall begins now unless one is already running.
    fn pending(&self) {
        if self.since.load(Ordering::Relaxed) == 0 {
            let nanos = Instant::now()
                .saturating_duration_since(self.base)
                .as_nanos();
            let since = u64::try_from(nanos)
                .unwrap_or(u64::MAX - 1)
                .saturating_add(1);
            self.since.store(since, Ordering::Relaxed);
            // A stored permit if the watchdog is not waiting yet: no wake-up is lost.
            self.began.notify_one();
        }
    }

    /// A write moved at least one byte, or a flush or shutdown finished.
    fn progress(&self) {
        if self.since.load(Ordering::Relaxed) != 0 {
            self.since.store(0, Ordering::Relaxed);
        }
    }

    /// Whether a stall is running now.
    #[cfg(test)]
    fn is_stalled(&self) -> bool {
        self.since.load(Ordering::Relaxed) != 0
    }

    /// Resolves once one stall has lasted `limit` with no byte of progress, and marks the
    /// socket to be closed with a reset. Stalls that end sooner are forgotten.
    pub(super) async fn lasted(&self, limit: Duration) {
        loop {
            let since = self.since.load(Ordering::Relaxed);
            if since == 0 {
                self.began.notified().await;
                continue;
            }
            let began = self.base + Duration::from_nanos(since - 1);
            tokio::time::sleep_until(began + limit).await;
            // The same stall still running (a new one has a later start).
            if self.since.load(Ordering::Relaxed) == since {
                self.abort.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
}

/// A stream that can be told to drop its unsent data when it is closed.
pub(super) trait AbortOnClose {
    /// Makes closing the stream discard what the peer has not taken.
    fn abort_on_close(&self);
}

impl AbortOnClose for tokio::net::TcpStream {
    /// SO_LINGER 0: close sends a reset and frees the queued answer at once, instead of
    /// leaving an orphaned socket probing a zero window with it for minutes.
    fn abort_on_close(&self) {
        let _ = self.set_zero_linger();
    }
}

impl AbortOnClose for tokio::net::UnixStream {
    /// A unix socket's queued data is freed when it is closed.
    fn abort_on_close(&self) {}
}

/// An accepted stream whose writes are watched for stalls.
#[derive(Debug)]
pub(super) struct Watched<S: AbortOnClose> {
    inner: S,
    stall: Arc<Stall>,
}

impl<S: AbortOnClose> Watched<S> {
    pub(super) fn new(inner: S, stall: Arc<Stall>) -> Watched<S> {
        Watched { inner, stall }
    }

    fn note(&self, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match &r {
            Poll::Ready(Ok(n)) if *n > 0 => self.stall.progress(),
            Poll::Pending => self.stall.pending(),
            Poll::Ready(_) => {}
        }
        r
    }

    fn note_done(&self, r: Poll<io::Result<()>>) -> Poll<io::Result<()>> {
        match &r {
            Poll::Ready(Ok(())) => self.stall.progress(),
            Poll::Pending => self.stall.pending(),
            Poll::Ready(Err(_)) => {}
        }
        r
    }
}

impl<S: AbortOnClose> Drop for Watched<S> {
    fn drop(&mut self) {
        if self.stall.abort.load(Ordering::Relaxed) {
            self.inner.abort_on_close();
        }
    }
}

impl<S: AsyncRead + AbortOnClose + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + AbortOnClose + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.note_done(r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.note_done(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream whose writes take `accept` bytes at most (0: `Pending`).
    #[derive(Debug, Default)]
    struct Gate {
        accept: usize,
        flushed: bool,
        aborted: Arc<AtomicBool>,
    }

    impl AbortOnClose for Gate {
        fn abort_on_close(&self) {
            self.aborted.store(true, Ordering::Relaxed);
        }
    }

    impl AsyncWrite for Gate {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            match self.accept.min(buf.len()) {
                0 => Poll::Pending,
                n => Poll::Ready(Ok(n)),
            }
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            if self.flushed {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    fn poll_write(w: &mut Watched<Gate>) -> Poll<io::Result<usize>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(w).poll_write(&mut cx, b"answer")
    }

    fn poll_flush(w: &mut Watched<Gate>) -> Poll<io::Result<()>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(w).poll_flush(&mut cx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_write_starts_a_stall_and_a_written_byte_ends_it() {
        let stall = Stall::new();
        let mut w = Watched::new(Gate::default(), stall.clone());
        assert!(!stall.is_stalled());
        assert!(poll_write(&mut w).is_pending());
        assert!(stall.is_stalled());
        let began = stall.since.load(Ordering::Relaxed);
        // Pending again later: the same stall, its start unchanged.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(poll_write(&mut w).is_pending());
        assert_eq!(stall.since.load(Ordering::Relaxed), began);
        w.inner.accept = 1;
        assert!(matches!(poll_write(&mut w), Poll::Ready(Ok(1))));
        assert!(!stall.is_stalled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_flush_stalls_and_a_finished_one_ends_it() {
        let stall = Stall::new();
        let mut w = Watched::new(Gate::default(), stall.clone());
        assert!(poll_flush(&mut w).is_pending());
        assert!(stall.is_stalled());
        w.inner.flushed = true;
        assert!(matches!(poll_flush(&mut w), Poll::Ready(Ok(()))));
        assert!(!stall.is_stalled());
        // Shutdown likewise.
        w.inner.flushed = false;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut w).poll_shutdown(&mut cx).is_pending());
        assert!(stall.is_stalled());
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_fires_once_one_stall_lasts_the_limit() {
        let stall = Stall::new();
        let mut w = Watched::new(Gate::default(), stall.clone());
        let limit = Duration::from_secs(10);
        let watchdog = tokio::spawn({
            let stall = stall.clone();
            async move {
                stall.lasted(limit).await;
                Instant::now()
            }
        });
        // No stall: an hour of nothing (a request waiting upstream, say) is no stall.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!watchdog.is_finished());
        // Stalls of 9 s each, separated by one written byte: never 10 s in one.
        for _ in 0..5 {
            w.inner.accept = 0;
            assert!(poll_write(&mut w).is_pending());
            tokio::time::sleep(Duration::from_secs(9)).await;
            w.inner.accept = 1;
            assert!(poll_write(&mut w).is_ready());
        }
        assert!(!watchdog.is_finished());
        assert!(!stall.abort.load(Ordering::Relaxed));
        // Then one that lasts.
        w.inner.accept = 0;
        let began = Instant::now();
        assert!(poll_write(&mut w).is_pending());
        let fired = watchdog.await.unwrap() - began;
        assert!(
            fired >= limit && fired <= limit + Duration::from_millis(1),
            "fired after {fired:?}"
        );
        assert!(stall.abort.load(Ordering::Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_given_up_on_is_closed_with_a_reset() {
        let stall = Stall::new();
        let aborted = Arc::new(AtomicBool::new(false));
        let gate = Gate {
            aborted: aborted.clone(),
            ..Gate::default()
        };
        // Dropped without a stall: an ordinary close.
        drop(Watched::new(gate, stall.clone()));
        assert!(!aborted.load(Ordering::Relaxed));

        let gate = Gate {
            aborted: aborted.clone(),
            ..Gate::default()
        };
        let mut w = Watched::new(gate, stall.clone());
        assert!(poll_write(&mut w).is_pending());
        stall.lasted(Duration::from_secs(1)).await;
        drop(w);
        assert!(aborted.load(Ordering::Relaxed));
    }
}
