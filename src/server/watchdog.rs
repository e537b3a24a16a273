//! One watchdog per connection, for the two ways a client can hold a connection (and its
//! slot of `max_connections`) without progress:
//!
//! - **A head that never comes.** Once the connection waits for a request head (after
//!   it opens, or once an answer is written and hyper reads again), the whole head must
//!   arrive within `header_read_timeout`; a keep-alive connection idle that long is
//!   closed too. hyper's own `header_read_timeout` boxed and registered a timer for
//!   every request head and dropped it when the head was read, which was the largest
//!   single item of a cache hit's extra cost at 64 connections (BENCHMARKS.md "The hit
//!   path"); here a request costs two flag stores and one clock read, and the timer is
//!   one per connection, re-armed only when a deadline it is set for has passed.
//! - **An answer that is never read.** A client that never reads fills the socket's
//!   send buffer; every write then stays `Pending` and hyper, busy writing, never reads
//!   the next head, so the first check never starts. A write, flush or shutdown that
//!   went `Pending` without a byte of progress starts a stall; any write of at least one
//!   byte, or a finished flush or shutdown, ends it. One stall lasting `write_timeout`
//!   closes the connection with a reset, so the kernel drops the unsent answer at once
//!   instead of keeping it for an orphaned socket.
//!
//! [`Watched`] wraps the accepted stream (under TLS too: it is the raw stream that is
//! wrapped, so the handshake's writes count) and notes stalls in a shared [`Watch`];
//! [`Tracked`] wraps the service and marks the connection answering from the moment a
//! head is read until its answer's body is dropped. hyper drops the body once it has
//! taken its last byte, which is also when hyper's own timer started: it began waiting
//! for the next head as soon as the answer was queued, with the last of it possibly
//! still being flushed. The connection's task polls [`Watch::expired`] after hyper's
//! connection on every wake-up, so it sees each change as it happens and needs no
//! wake-up of its own.
//!
//! A connection that does no I/O while busy (a request waiting on an upstream fetch) is
//! neither stalled nor waiting for a head: the request timeout bounds it.
//!
//! Progress is what the kernel accepts: on Linux a full send buffer takes more only once
//! about a third of it is free again, so a client must read that much (roughly 0.9 MB of
//! a 2.6 MB loopback buffer) within the write timeout to count as reading. Answers that
//! fit in the send buffer never stall at all.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// One connection's state, shared by its stream, its service and its watchdog. Times
/// are kept as 1 + nanoseconds after `base` (0: not running), so each is one atomic.
#[derive(Debug)]
pub(super) struct Watch {
    /// When the connection was accepted.
    base: Instant,
    /// When the current write stall began, or 0.
    stall: AtomicU64,
    /// When the connection began waiting for a request head, or 0 (a request is being
    /// answered).
    waiting: AtomicU64,
    /// Requests being answered: from a head read to its answer's body dropped.
    answering: AtomicUsize,
    /// Set when a stall lasted: the socket is then closed with a reset.
    abort: AtomicBool,
}

/// How long each wait may last.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// The longest wait for a whole request head.
    pub(super) header_read: Duration,
    /// The longest write stall.
    pub(super) write: Duration,
}

/// Why a watchdog gave up on its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expired {
    /// No whole request head within `header_read_timeout`.
    HeaderRead,
    /// An answer waited unwritten, without progress, for `write_timeout`.
    Write,
}

impl Watch {
    /// A connection accepted now, waiting for its first head.
    pub(super) fn new() -> Arc<Watch> {
        Arc::new(Watch {
            base: Instant::now(),
            stall: AtomicU64::new(0),
            waiting: AtomicU64::new(1),
            answering: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
        })
    }

    /// Now, as stored.
    fn stamp(&self) -> u64 {
        let nanos = Instant::now()
            .saturating_duration_since(self.base)
            .as_nanos();
        u64::try_from(nanos)
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    fn at(&self, stamp: u64) -> Instant {
        self.base + Duration::from_nanos(stamp - 1)
    }

    /// The wait for a head starts again now (a TLS handshake ended: it had a timeout of
    /// its own).
    pub(super) fn restart_wait(&self) {
        self.waiting.store(self.stamp(), Ordering::Relaxed);
    }

    /// A head was read: its request is answered until [`Busy`] is dropped.
    fn begin(self: &Arc<Watch>) -> Busy {
        self.answering.fetch_add(1, Ordering::Relaxed);
        self.waiting.store(0, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// An answer's body was dropped: once no other request is being answered, the wait
    /// for the next head begins.
    fn end(&self) {
        if self.answering.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.waiting.store(self.stamp(), Ordering::Relaxed);
        }
    }

    /// A write went `Pending`: a stall begins now unless one is already running.
    fn pending(&self) {
        if self.stall.load(Ordering::Relaxed) == 0 {
            self.stall.store(self.stamp(), Ordering::Relaxed);
        }
    }

    /// A write moved at least one byte, or a flush or shutdown finished.
    fn progress(&self) {
        if self.stall.load(Ordering::Relaxed) != 0 {
            self.stall.store(0, Ordering::Relaxed);
        }
    }

    /// Whether a stall is running now.
    #[cfg(test)]
    fn is_stalled(&self) -> bool {
        self.stall.load(Ordering::Relaxed) != 0
    }

    /// The deadlines of the running checks: (stall, head).
    fn deadlines(&self, limits: Limits) -> (Option<Instant>, Option<Instant>) {
        let deadline = |stamp: u64, limit| (stamp != 0).then(|| self.at(stamp) + limit);
        (
            deadline(self.stall.load(Ordering::Relaxed), limits.write),
            deadline(self.waiting.load(Ordering::Relaxed), limits.header_read),
        )
    }

    /// Resolves once a running check has lasted its limit; a write stall also marks the
    /// socket to be closed with a reset. Checks that end sooner are forgotten.
    ///
    /// One timer: it is moved earlier when a check starts that is due before it, and
    /// re-armed when it fires before anything is due (a check ended, or none ran), so a
    /// connection busy with request after request never touches it.
    pub(super) fn expired(self: Arc<Watch>, limits: Limits) -> impl Future<Output = Expired> {
        let idle_check = limits.write.min(limits.header_read);
        // Set for the accept: its first poll fires it and sets it for what is due.
        let mut sleep = Box::pin(tokio::time::sleep_until(self.base));
        std::future::poll_fn(move |cx| {
            loop {
                let (stall, head) = self.deadlines(limits);
                let due = match (stall, head) {
                    (Some(s), Some(h)) => Some(s.min(h)),
                    (s, h) => s.or(h),
                };
                if let Some(due) = due
                    && due < sleep.deadline()
                {
                    sleep.as_mut().reset(due);
                }
                ready!(sleep.as_mut().poll(cx));
                let now = Instant::now();
                if stall.is_some_and(|s| s <= now) {
                    self.abort.store(true, Ordering::Relaxed);
                    return Poll::Ready(Expired::Write);
                }
                if head.is_some_and(|h| h <= now) {
                    return Poll::Ready(Expired::HeaderRead);
                }
                sleep.as_mut().reset(due.unwrap_or(now + idle_check));
            }
        })
    }
}

/// A request being answered; dropped with its answer's body.
#[derive(Debug)]
pub(super) struct Busy(Arc<Watch>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end();
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

/// An accepted stream whose reads and writes are watched.
#[derive(Debug)]
pub(super) struct Watched<S: AbortOnClose> {
    inner: S,
    watch: Arc<Watch>,
}

impl<S: AbortOnClose> Watched<S> {
    pub(super) fn new(inner: S, watch: Arc<Watch>) -> Watched<S> {
        Watched { inner, watch }
    }

    fn note(&self, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match &r {
            Poll::Ready(Ok(n)) if *n > 0 => self.watch.progress(),
            Poll::Pending => self.watch.pending(),
            Poll::Ready(_) => {}
        }
        r
    }

    fn note_done(&self, r: Poll<io::Result<()>>) -> Poll<io::Result<()>> {
        match &r {
            Poll::Ready(Ok(())) => self.watch.progress(),
            Poll::Pending => self.watch.pending(),
            Poll::Ready(Err(_)) => {}
        }
        r
    }
}

impl<S: AbortOnClose> Drop for Watched<S> {
    fn drop(&mut self) {
        if self.watch.abort.load(Ordering::Relaxed) {
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

/// The service of one connection: marks it busy from each head read until the answer's
/// body is dropped, which is when the wait for the next head may begin.
#[derive(Clone, Debug)]
pub(super) struct Tracked<S> {
    inner: hyper_util::service::TowerToHyperService<S>,
    watch: Arc<Watch>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, watch: Arc<Watch>) -> Tracked<S> {
        Tracked {
            inner: hyper_util::service::TowerToHyperService::new(inner),
            watch,
        }
    }
}

impl<S, B, R> hyper::service::Service<Request<R>> for Tracked<S>
where
    S: tower_service::Service<Request<R>, Response = Response<B>> + Clone,
{
    type Response = Response<Answer<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<hyper_util::service::TowerToHyperServiceFuture<S, Request<R>>>;

    fn call(&self, req: Request<R>) -> Self::Future {
        let busy = self.watch.begin();
        TrackedFuture {
            inner: hyper::service::Service::call(&self.inner, req),
            busy: Some(busy),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer on its way; the connection stays busy until its body goes.
    pub(super) struct TrackedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Answer<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let busy = this.busy.take();
        Poll::Ready(Ok(response.map(|body| Answer { body, _busy: busy })))
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, holding its connection busy until hyper drops it.
    pub(super) struct Answer<B> {
        #[pin]
        body: B,
        _busy: Option<Busy>,
    }
}

impl<B: hyper::body::Body> hyper::body::Body for Answer<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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

    /// A write timeout of `write`, and a header read timeout far longer.
    fn limits(write: Duration) -> Limits {
        Limits {
            header_read: Duration::from_secs(86_400),
            write,
        }
    }

    fn poll_flush(w: &mut Watched<Gate>) -> Poll<io::Result<()>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(w).poll_flush(&mut cx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_write_starts_a_stall_and_a_written_byte_ends_it() {
        let stall = Watch::new();
        let _answering = stall.begin();
        let mut w = Watched::new(Gate::default(), stall.clone());
        assert!(!stall.is_stalled());
        assert!(poll_write(&mut w).is_pending());
        assert!(stall.is_stalled());
        let began = stall.stall.load(Ordering::Relaxed);
        // Pending again later: the same stall, its start unchanged.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(poll_write(&mut w).is_pending());
        assert_eq!(stall.stall.load(Ordering::Relaxed), began);
        w.inner.accept = 1;
        assert!(matches!(poll_write(&mut w), Poll::Ready(Ok(1))));
        assert!(!stall.is_stalled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_flush_stalls_and_a_finished_one_ends_it() {
        let stall = Watch::new();
        let _answering = stall.begin();
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

    /// Polls the watchdog once from the test's task, as the connection's task does after
    /// each of its wake-ups; `None` while it waits.
    async fn poke(dog: &mut Pin<Box<impl Future<Output = Expired>>>) -> Option<Expired> {
        match std::future::poll_fn(|cx| Poll::Ready(dog.as_mut().poll(cx))).await {
            Poll::Ready(why) => Some(why),
            Poll::Pending => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_fires_once_one_stall_lasts_the_limit() {
        let stall = Watch::new();
        let _answering = stall.begin();
        let mut w = Watched::new(Gate::default(), stall.clone());
        let limit = Duration::from_secs(10);
        let mut dog = Box::pin(stall.clone().expired(limits(limit)));
        assert_eq!(poke(&mut dog).await, None);
        // No stall: an hour of nothing (a request waiting upstream, say) is no stall.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(poke(&mut dog).await, None);
        // Stalls of 9 s each, separated by one written byte: never 10 s in one.
        for _ in 0..5 {
            w.inner.accept = 0;
            assert!(poll_write(&mut w).is_pending());
            assert_eq!(poke(&mut dog).await, None);
            tokio::time::sleep(Duration::from_secs(9)).await;
            w.inner.accept = 1;
            assert!(poll_write(&mut w).is_ready());
            assert_eq!(poke(&mut dog).await, None);
        }
        assert!(!stall.abort.load(Ordering::Relaxed));
        // Then one that lasts.
        w.inner.accept = 0;
        let began = Instant::now();
        assert!(poll_write(&mut w).is_pending());
        assert_eq!(dog.await, Expired::Write);
        let fired = began.elapsed();
        assert!(
            fired >= limit && fired <= limit + Duration::from_millis(1),
            "fired after {fired:?}"
        );
        assert!(stall.abort.load(Ordering::Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_given_up_on_is_closed_with_a_reset() {
        let stall = Watch::new();
        let _answering = stall.begin();
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
        let why = stall.clone().expired(limits(Duration::from_secs(1))).await;
        assert_eq!(why, Expired::Write);
        drop(w);
        assert!(aborted.load(Ordering::Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_for_a_head_runs_from_accept_and_after_each_answer_never_while_answering() {
        let limit = Duration::from_secs(10);
        let limits = Limits {
            header_read: limit,
            write: Duration::from_secs(3),
        };
        let watch = Watch::new();
        let watchdog = tokio::spawn({
            let watch = watch.clone();
            async move {
                let why = watch.expired(limits).await;
                (why, Instant::now())
            }
        });
        // Heads 9 s apart, each answered at once: never 10 s without one.
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_secs(9)).await;
            drop(watch.begin());
        }
        assert!(!watchdog.is_finished());
        // An answer that takes an hour (a request waiting upstream): no head is awaited.
        let answering = watch.begin();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!watchdog.is_finished());
        // Two at once: the wait begins when the last of them is answered.
        let second = watch.begin();
        drop(answering);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!watchdog.is_finished());
        let answered = Instant::now();
        drop(second);
        let (why, fired) = watchdog.await.unwrap();
        assert_eq!(why, Expired::HeaderRead);
        let after = fired - answered;
        assert!(
            after >= limit && after <= limit + Duration::from_millis(1),
            "fired {after:?} after the answer"
        );
        assert!(
            !watch.abort.load(Ordering::Relaxed),
            "an idle connection is closed, not reset"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_sends_a_head_is_given_up_on_from_its_accept() {
        let limit = Duration::from_secs(10);
        let accepted = Instant::now();
        let watch = Watch::new();
        let why = watch
            .clone()
            .expired(Limits {
                header_read: limit,
                write: Duration::from_secs(1),
            })
            .await;
        assert_eq!(why, Expired::HeaderRead);
        assert_eq!(accepted.elapsed(), limit);
        // After a TLS handshake the wait starts again.
        tokio::time::sleep(Duration::from_secs(4)).await;
        watch.restart_wait();
        let restarted = Instant::now();
        let why = watch
            .expired(Limits {
                header_read: limit,
                write: Duration::from_secs(1),
            })
            .await;
        assert_eq!(why, Expired::HeaderRead);
        assert_eq!(restarted.elapsed(), limit);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_that_begins_while_the_timer_is_set_later_is_caught_on_time() {
        // The timer is set for the head wait, 100 s out; a stall then begins, due in 2 s.
        let watch = Watch::new();
        let mut w = Watched::new(Gate::default(), watch.clone());
        let write = Duration::from_secs(2);
        let mut dog = Box::pin(watch.clone().expired(Limits {
            header_read: Duration::from_secs(100),
            write,
        }));
        assert_eq!(poke(&mut dog).await, None);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let began = Instant::now();
        assert!(poll_write(&mut w).is_pending());
        assert_eq!(dog.await, Expired::Write);
        assert_eq!(began.elapsed(), write);
    }
}
