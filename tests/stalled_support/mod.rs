//! Raw-socket clients for the stalled-reader tests (`tests/stalled_clients.rs`,
//! `tests/stalled_probe.rs`): one that pipelines requests and never reads, a check for the
//! server's reset that does not read, and a one-shot GET. Every wait is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout};

/// A client with a tiny receive buffer that pipelines `count` requests for `path` and
/// never reads; connecting takes at most 5 s and sending them at most `send_within`.
pub async fn stalled_client(
    addr: SocketAddr,
    path: &str,
    count: usize,
    send_within: Duration,
) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(1024).unwrap();
    let mut stream = timeout(Duration::from_secs(5), socket.connect(addr))
        .await
        .expect("connect timed out")
        .unwrap();
    let requests = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").repeat(count);
    timeout(send_within, stream.write_all(requests.as_bytes()))
        .await
        .expect("sending the requests timed out")
        .unwrap();
    stream
}

/// Whether the server resets the connection within `within`. Looked at without reading
/// (SO_ERROR), since reading would let the server make progress.
pub async fn reset_within(stream: &TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match stream.take_error() {
            Ok(Some(e)) => return e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(_) => return false,
        }
    }
    false
}

/// Sends one `Connection: close` GET and reads the whole answer, within `within`; None
/// when it does not come.
pub async fn get_once(addr: SocketAddr, path: &str, within: Duration) -> Option<String> {
    let ask = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.ok()?;
        Some(String::from_utf8_lossy(&answer).into_owned())
    };
    timeout(within, ask).await.ok().flatten()
}
