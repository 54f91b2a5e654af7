//! Caps on the connections a server's listeners hold (~20 k idle
//! connections exhausted the leader's file descriptors; its clients went
//! degraded and no failover happened, because the leader still answered
//! its peers).
//!
//! A listener holds at most `max` connections: one over the cap is accepted
//! and closed at once, so neither the descriptors nor the listen backlog
//! fill up. A connection on which nothing moves in either direction for
//! `idle` is closed: a gRPC peer is pinged by the server every 20 s, so only
//! a silent or stuck peer reaches it; an HTTP client that connects and sends
//! nothing, or stops half-way through its request, does.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connections one master's gRPC port holds at most (flag `--max-connections`).
pub const DEFAULT_MAX_GRPC_CONNECTIONS: usize = 4096;
/// Connections the admin HTTP port holds at most.
pub const MAX_HTTP_CONNECTIONS: usize = 256;
/// A gRPC connection with no traffic either way for this long is closed.
pub const GRPC_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// An admin HTTP connection with no traffic either way for this long is closed.
pub const HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a client may take to send one request's headers to the admin
/// HTTP port; the idle timeout alone let a sender of one byte every 29 s keep
/// its connection for ever.
pub const HTTP_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a server takes the TLS acceptor for each new connection, so that
/// reloaded certificates (SIGHUP) reach every connection opened after it.
pub type TlsSource = Arc<dyn Fn() -> tokio_rustls::TlsAcceptor + Send + Sync>;

/// Serves `router` on `listener` over HTTP/1.1 with hyper directly:
/// `axum::serve` gives hyper no timer, and without one hyper enforces no
/// header read timeout. With `tls`, HTTPS: the handshake must also finish
/// within `header_timeout`.
pub async fn serve_http(
    mut listener: CappedListener,
    router: axum::Router,
    header_timeout: Duration,
    tls: Option<TlsSource>,
) {
    loop {
        let (io, _peer) = axum::serve::Listener::accept(&mut listener).await;
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let tls = tls.as_ref().map(|source| source());
        tokio::spawn(async move {
            let builder = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .clone();
            let served = match tls {
                None => {
                    builder
                        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                        .await
                }
                Some(tls) => match tokio::time::timeout(header_timeout, tls.accept(io)).await {
                    Ok(Ok(io)) => {
                        builder
                            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                            .await
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "admin HTTPS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("admin HTTPS handshake timed out");
                        return;
                    }
                },
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "admin HTTP connection ended");
            }
        });
    }
}

/// The TLS connections of `incoming`, for tonic's `serve_with_incoming`
/// (instead of tonic's own TLS, whose configuration is fixed at start): each
/// accepted connection is handshaken in its own task with the acceptor
/// `tls` gives at that moment, so one slow handshake delays no other and a
/// reload reaches the next connection. A handshake that fails or takes more
/// than `handshake_timeout` closes its connection (and frees its slot).
/// Accepting stops, and the listener closes, when the server drops the
/// stream (at the start of its shutdown) or the returned guard drops.
pub fn tls_incoming(
    mut incoming: CappedListener,
    tls: TlsSource,
    handshake_timeout: Duration,
) -> (TlsIncoming, AbortOnDrop) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(async move {
        use futures::StreamExt;
        loop {
            // The server drops the stream when it starts shutting down:
            // stop accepting then (closing the listener), not only when the
            // graceful drain of its connections is over.
            let conn = tokio::select! {
                conn = incoming.next() => conn,
                _ = tx.closed() => break,
            };
            let Some(conn) = conn else { break };
            // Accept errors are logged (and backed off) by the listener.
            let Ok(conn) = conn else { continue };
            let acceptor = tls();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(handshake_timeout, acceptor.accept(conn)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(stream).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "gRPC TLS handshake failed"),
                    Err(_) => tracing::debug!("gRPC TLS handshake timed out"),
                }
            });
        }
    });
    (TlsIncoming { rx }, AbortOnDrop(task))
}

/// A TLS connection accepted by [`tls_incoming`].
pub type TlsConn = tokio_rustls::server::TlsStream<Capped<TcpStream>>;

/// The stream [`tls_incoming`] returns.
pub struct TlsIncoming {
    rx: tokio::sync::mpsc::Receiver<TlsConn>,
}

impl futures::Stream for TlsIncoming {
    type Item = io::Result<TlsConn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|conn| conn.map(Ok))
    }
}

/// Aborts its task when dropped.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection that holds one of its listener's slots and closes itself
/// after `idle` without progress.
pub struct Capped<T> {
    io: T,
    idle: Duration,
    last_progress: Instant,
    timer: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl<T> Capped<T> {
    fn new(io: T, idle: Duration, slot: OwnedSemaphorePermit) -> Self {
        let now = Instant::now();
        Self {
            io,
            idle,
            last_progress: now,
            timer: Box::pin(tokio::time::sleep_until(now + idle)),
            _slot: slot,
        }
    }

    /// Pending while the connection has moved within `idle`; an error once it
    /// has not. The timer is moved lazily, only when it fires.
    fn poll_idle<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = self.last_progress + self.idle;
            if due <= Instant::now() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no traffic for {:?}; connection closed", self.idle),
                )));
            }
            self.timer.as_mut().reset(due);
        }
    }
}

impl<T> Capped<T> {
    /// A write that moved bytes is progress; one that waits counts toward idle.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Pending => self.poll_idle(cx),
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.last_progress = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Capped<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Pending => self.poll_idle(cx),
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_progress = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Capped<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.after_write(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.after_write(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Capped<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A listener whose accepted connections are [`Capped`]: a stream for
/// tonic's `serve_with_incoming`, and an axum [`Listener`](axum::serve::Listener).
pub struct CappedListener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    idle: Duration,
    /// Connections closed at accept because every slot was taken.
    pub refused: Arc<AtomicU64>,
    /// Set after an accept error other than a peer's: wait before the next.
    backoff: Option<Pin<Box<Sleep>>>,
}

impl CappedListener {
    pub fn new(listener: TcpListener, max: usize, idle: Duration) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(max)),
            idle,
            refused: Arc::default(),
            backoff: None,
        }
    }

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Capped<TcpStream>>> {
        loop {
            if let Some(b) = self.backoff.as_mut() {
                if b.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.backoff = None;
            }
            match self.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    if !is_peer_error(&e) {
                        // Out of descriptors, say: retrying at once would spin.
                        tracing::warn!(error = %e, "accept failed; pausing accepts for 100 ms");
                        self.backoff =
                            Some(Box::pin(tokio::time::sleep(Duration::from_millis(100))));
                    }
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok((stream, peer))) => match self.slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let _ = stream.set_nodelay(true);
                        return Poll::Ready(Ok(Capped::new(stream, self.idle, slot)));
                    }
                    Err(_) => {
                        let n = self.refused.fetch_add(1, Ordering::Relaxed);
                        if n.is_power_of_two() {
                            tracing::warn!(%peer, refused = n + 1, "connection limit reached; closing new connections");
                        }
                        drop(stream);
                    }
                },
            }
        }
    }
}

fn is_peer_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

impl futures::Stream for CappedListener {
    type Item = io::Result<Capped<TcpStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_accept(cx).map(Some)
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = Capped<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match std::future::poll_fn(|cx| self.poll_accept(cx)).await {
                Ok(conn) => {
                    let peer = conn
                        .io
                        .peer_addr()
                        .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
                    return (conn, peer);
                }
                Err(_) => continue,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn listener(max: usize, idle: Duration) -> (CappedListener, std::net::SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        (CappedListener::new(l, max, idle), addr)
    }

    /// Reads until the peer closes, or gives up after `within`.
    async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(within, conn.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_and_a_freed_slot_is_reused() {
        let (mut l, addr) = listener(2, Duration::from_secs(60)).await;
        let refused = l.refused.clone();
        let server = tokio::spawn(async move {
            while let Some(Ok(mut conn)) = l.next().await {
                // Held until the peer goes.
                tokio::spawn(async move {
                    let mut buf = [0u8; 16];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        let mut a = TcpStream::connect(addr).await.unwrap();
        let mut b = TcpStream::connect(addr).await.unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut c, Duration::from_secs(5)).await);
        assert_eq!(refused.load(Ordering::Relaxed), 1);
        assert!(!closed_within(&mut a, Duration::from_millis(200)).await);
        drop(a);
        // The slot comes back once the server has seen `a` go.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut d = TcpStream::connect(addr).await.unwrap();
            if !closed_within(&mut d, Duration::from_millis(200)).await {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the freed slot never came back"
            );
        }
        assert!(!closed_within(&mut b, Duration::from_millis(100)).await);
        server.abort();
    }

    /// A client that sends its request headers one byte at a time, each
    /// well within the idle timeout, is cut off by the header read timeout;
    /// a normal request on the same server is answered.
    #[tokio::test]
    async fn a_trickled_request_header_is_cut_off() {
        let (l, addr) = listener(8, Duration::from_secs(60)).await;
        let router = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
        let server = tokio::spawn(serve_http(l, router, Duration::from_millis(500), None));

        let mut normal = TcpStream::connect(addr).await.unwrap();
        normal
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        normal.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

        let mut slow = TcpStream::connect(addr).await.unwrap();
        let header = b"GET /health HTTP/1.1\r\nhost: x\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        let mut cut_off = false;
        // 100 bytes over 10 s: far longer than the 0.5 s header timeout.
        for byte in header.iter().cycle().take(100) {
            if slow.write_all(&[*byte]).await.is_err()
                || closed_within(&mut slow, Duration::from_millis(100)).await
            {
                cut_off = true;
                break;
            }
        }
        assert!(cut_off, "a trickled header held its connection for 10 s");
        server.abort();
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_and_a_busy_one_is_not() {
        let (mut l, addr) = listener(8, Duration::from_millis(300)).await;
        let server = tokio::spawn(async move {
            while let Some(Ok(mut conn)) = l.next().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    // Echo until the peer goes or the connection times out.
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut busy = TcpStream::connect(addr).await.unwrap();
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            busy.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            busy.read_exact(&mut one).await.unwrap();
        }
        assert!(closed_within(&mut silent, Duration::from_secs(2)).await);
        assert!(!closed_within(&mut busy, Duration::from_millis(100)).await);
        server.abort();
    }
}
