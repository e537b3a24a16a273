//! Per-connection limits (open connections, header size and read time, how long an answer
//! may wait unwritten) that the listener enforces with hyper. The per-request limits
//! (requests in flight, the request timeout) are the front layer's (`front.rs`).

use std::time::Duration;

/// Per-connection limits, enforced by the listener with hyper.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Most open connections; further clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Longest time a client may take to send its request headers; it also bounds how
    /// long a keep-alive connection may sit idle waiting for its next request.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers) read; more is answered 431.
    pub max_header_bytes: usize,
    /// Longest time an answer may wait to be written without a byte of progress (the
    /// client does not read, so the socket's send buffer stays full); the connection is
    /// then closed with a reset and its slot freed. A request waiting on upstream does no
    /// I/O and is not cut by this (the request timeout bounds it).
    pub write_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 16_384,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            write_timeout: Duration::from_secs(10),
        }
    }
}
