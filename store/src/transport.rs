//! Client side of the TCP transfer protocol: pooled connections per store,
//! requests pipelined (all sent before, and while, answers are read), payloads
//! read straight into the caller's buffers. A pooled connection that breaks
//! before any answer (its store restarted, or closed it while idle) is
//! replaced by a new one and the exchange sent again, once.
//!
//! With TLS files ([`TcpTransport::with_tls`]) every connection is mutual
//! TLS: the store's certificate must be one the CA signed for the host the
//! store is reached at, and this client presents its own. A refused
//! handshake, and clear text meeting TLS either way round, is a
//! [`TransferError::Tls`]: a configuration error, not an outage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;

use crate::protocol::{
    CopyTarget, Grant, Op, Request, Response, Status, REQUEST_LEN, RESPONSE_LEN,
};

const IO_BUFFER: usize = 64 * 1024;
/// Checksum granularity on receive: small enough to still be in L2 when hashed.
const CRC_PIECE: usize = 128 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("cannot connect to store {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("transfer with store {endpoint} failed: {reason}")]
    Io { endpoint: String, reason: String },
    #[error("store {endpoint} refused the request: {status:?}")]
    Refused { endpoint: String, status: Status },
    #[error("transfer with store {endpoint} timed out")]
    Timeout { endpoint: String },
    /// The TLS layer refused the connection: a certificate one side does
    /// not trust, or one side speaking TLS and the other not. Retrying
    /// cannot help.
    #[error("TLS with store {endpoint} refused: {reason}")]
    Tls { endpoint: String, reason: String },
}

/// One half of a connection, clear text or TLS.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

struct Conn {
    r: BufReader<ReadHalf>,
    w: BufWriter<WriteHalf>,
    next_id: u64,
    /// This end's address: the store logs its requests under it (`peer`).
    local: Option<std::net::SocketAddr>,
}

/// Connection pools to stores.
pub struct TcpTransport {
    pools: Mutex<HashMap<String, Vec<Conn>>>,
    max_idle: usize,
    /// Mutual TLS to every store; `None`: clear text.
    tls: Option<tokio_rustls::TlsConnector>,
    pub connect_timeout: Duration,
    /// Base timeout of one pipelined exchange; grows with the bytes moved.
    pub io_timeout: Duration,
}

impl Default for TcpTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl TcpTransport {
    pub fn new() -> Self {
        Self {
            pools: Mutex::new(HashMap::new()),
            max_idle: 16,
            tls: None,
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(5),
        }
    }

    /// A transport that speaks mutual TLS to every store with `tls`'s
    /// certificate and CA (as stores started with `--data-tls` require),
    /// clear text without.
    pub fn with_tls(
        tls: Option<&crescent_auth::tls::TlsFiles>,
    ) -> Result<Self, crescent_auth::tls::TlsError> {
        let mut transport = Self::new();
        if let Some(files) = tls {
            let config: Arc<_> = files.data_client_config()?;
            transport.tls = Some(tokio_rustls::TlsConnector::from(config));
        }
        Ok(transport)
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// An idle pooled connection to `endpoint`, if any.
    fn pooled(&self, endpoint: &str) -> Option<Conn> {
        self.pools
            .lock()
            .expect("pool lock poisoned")
            .get_mut(endpoint)
            .and_then(|v| v.pop())
    }

    /// A pooled connection (true) or a new one (false).
    async fn checkout(&self, endpoint: &str) -> Result<(Conn, bool), TransferError> {
        match self.pooled(endpoint) {
            Some(c) => Ok((c, true)),
            None => Ok((self.connect(endpoint).await?, false)),
        }
    }

    /// A new connection, with the TLS handshake when configured.
    async fn connect(&self, endpoint: &str) -> Result<Conn, TransferError> {
        let connect = TcpStream::connect(endpoint);
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => {
                return Err(TransferError::Connect {
                    endpoint: endpoint.to_string(),
                    source,
                })
            }
            Err(_) => {
                return Err(TransferError::Connect {
                    endpoint: endpoint.to_string(),
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                })
            }
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().ok();
        let (r, w): (ReadHalf, WriteHalf) = match &self.tls {
            None => {
                let (r, w) = stream.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(connector) => {
                let tls = self.handshake(connector, endpoint, stream).await?;
                let (r, w) = tokio::io::split(tls);
                (Box::new(r), Box::new(w))
            }
        };
        Ok(Conn {
            r: BufReader::with_capacity(IO_BUFFER, r),
            w: BufWriter::with_capacity(IO_BUFFER, w),
            next_id: 1,
            local,
        })
    }

    /// The TLS handshake on a new connection, within `connect_timeout`,
    /// checking the store's certificate against the host of `endpoint`
    /// (an IP address or a name, as the store advertised it).
    async fn handshake(
        &self,
        connector: &tokio_rustls::TlsConnector,
        endpoint: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, TransferError> {
        let host = endpoint
            .rsplit_once(':')
            .map_or(endpoint, |(host, _port)| host);
        let name = crescent_auth::tls::server_name(host).map_err(|e| TransferError::Tls {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        })?;
        match tokio::time::timeout(self.connect_timeout, connector.connect(name, stream)).await {
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err(e)) => Err(match tls_refusal(&e) {
                Some(reason) => TransferError::Tls {
                    endpoint: endpoint.to_string(),
                    reason,
                },
                // Closed or reset during the handshake without a word: a
                // store over its connection cap closes new connections so.
                None => TransferError::Connect {
                    endpoint: endpoint.to_string(),
                    source: std::io::Error::new(
                        e.kind(),
                        format!("TLS handshake interrupted: {e}"),
                    ),
                },
            }),
            Err(_) => Err(TransferError::Timeout {
                endpoint: endpoint.to_string(),
            }),
        }
    }

    fn checkin(&self, endpoint: &str, conn: Conn) {
        let mut pools = self.pools.lock().expect("pool lock poisoned");
        let v = pools.entry(endpoint.to_string()).or_default();
        if v.len() < self.max_idle {
            v.push(conn);
        }
    }

    /// Drops idle connections to a store (e.g. after it failed).
    pub fn forget(&self, endpoint: &str) {
        self.pools
            .lock()
            .expect("pool lock poisoned")
            .remove(endpoint);
    }

    fn deadline_for(&self, bytes: u64) -> Duration {
        // At least 100 MB/s, plus the base timeout.
        self.io_timeout + Duration::from_millis(bytes / 100_000)
    }

    /// A COPY moves its bytes from one of the store's segments to another,
    /// a disk on one side: it is given the rate a store gives any request
    /// (`DEFAULT_MIN_BYTES_PER_SEC`, see `ServeLimits`), not a network's.
    /// The rate is taken per 1/1024 s, which leaves the deadline a little
    /// longer than the store's own. The caller bounds it further by its
    /// grants.
    fn copy_deadline(&self, bytes: u64) -> Duration {
        let bytes_per_ms = crate::server::DEFAULT_MIN_BYTES_PER_SEC >> 10;
        self.io_timeout + Duration::from_millis(bytes / bytes_per_ms)
    }

    /// Reads `[offset, offset+buf.len())` into each buffer, pipelined on one
    /// connection, each under its grant (the signed capability that came with
    /// the replica descriptor; its segment id also makes a store that serves
    /// another segment refuse instead of answering with someone else's bytes).
    pub async fn read(
        &self,
        endpoint: &str,
        reads: &mut [(Grant, u64, &mut [u8])],
    ) -> Result<(), TransferError> {
        self.read_checksummed(endpoint, reads).await.map(|_| ())
    }

    /// Like [`read`](Self::read), also returning each buffer's crc32c, computed
    /// piece by piece as the bytes arrive (while they are still in cache).
    pub async fn read_checksummed(
        &self,
        endpoint: &str,
        reads: &mut [(Grant, u64, &mut [u8])],
    ) -> Result<Vec<u32>, TransferError> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let (mut conn, mut pooled) = self.checkout(endpoint).await?;
        loop {
            let answered = AtomicUsize::new(0);
            match self
                .read_on(&mut conn, endpoint, &mut *reads, &answered)
                .await
            {
                Ok(crcs) => {
                    self.checkin(endpoint, conn);
                    return Ok(crcs);
                }
                Err(e) if pooled && went_stale(&e, &answered) => {
                    conn = self.replace_stale(endpoint, &e).await?;
                    pooled = false;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Drops every idle connection to `endpoint` (the one that failed says
    /// they are likely stale too) and opens a new one for the retry.
    async fn replace_stale(
        &self,
        endpoint: &str,
        e: &TransferError,
    ) -> Result<Conn, TransferError> {
        tracing::debug!(endpoint, error = %e, "pooled connection failed before any answer; retrying on a new one");
        self.forget(endpoint);
        self.connect(endpoint).await
    }

    /// One pipelined exchange of reads on `conn`, counting the answers
    /// read in `answered`.
    async fn read_on(
        &self,
        conn: &mut Conn,
        endpoint: &str,
        reads: &mut [(Grant, u64, &mut [u8])],
        answered: &AtomicUsize,
    ) -> Result<Vec<u32>, TransferError> {
        let total: u64 = reads.iter().map(|(_, _, b)| b.len() as u64).sum();
        let mut crcs = vec![0u32; reads.len()];
        let first_id = conn.next_id;
        conn.next_id += reads.len() as u64;
        log_exchange(conn, endpoint, "read", first_id, reads.len(), total);
        let headers: Vec<[u8; REQUEST_LEN]> = reads
            .iter()
            .enumerate()
            .map(|(i, (grant, off, buf))| {
                Request {
                    op: Op::Read,
                    request_id: first_id + i as u64,
                    offset: *off,
                    len: buf.len() as u64,
                    grant: *grant,
                }
                .encode()
            })
            .collect();
        let Conn { r, w, .. } = conn;
        let send = async {
            for h in &headers {
                w.write_all(h).await?;
            }
            w.flush().await
        };
        let crcs_ref = &mut crcs;
        let recv = async move {
            for (i, (_, _, buf)) in reads.iter_mut().enumerate() {
                let resp = read_response(r).await?;
                answered.fetch_add(1, Ordering::Relaxed);
                check_response(&resp, first_id + i as u64, buf.len() as u64)?;
                let mut crc = 0u32;
                for piece in buf.chunks_mut(CRC_PIECE) {
                    r.read_exact(piece).await?;
                    crc = crc32c::crc32c_append(crc, piece);
                }
                crcs_ref[i] = crc;
            }
            Ok::<(), IoOrRefused>(())
        };
        self.exchange(endpoint, total, send, recv).await?;
        Ok(crcs)
    }

    /// Writes each buffer at its offset under its grant, pipelined on one
    /// connection.
    pub async fn write(
        &self,
        endpoint: &str,
        writes: &[(Grant, u64, &[u8])],
    ) -> Result<(), TransferError> {
        if writes.is_empty() {
            return Ok(());
        }
        let (mut conn, mut pooled) = self.checkout(endpoint).await?;
        loop {
            let answered = AtomicUsize::new(0);
            match self.write_on(&mut conn, endpoint, writes, &answered).await {
                Ok(()) => {
                    self.checkin(endpoint, conn);
                    return Ok(());
                }
                // Sending the same bytes to the same ranges under the same
                // grants again is harmless: the ranges are the caller's
                // until it finishes, and the grants bound when a write lands.
                Err(e) if pooled && went_stale(&e, &answered) => {
                    conn = self.replace_stale(endpoint, &e).await?;
                    pooled = false;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One pipelined exchange of writes on `conn`, counting the answers
    /// read in `answered`.
    async fn write_on(
        &self,
        conn: &mut Conn,
        endpoint: &str,
        writes: &[(Grant, u64, &[u8])],
        answered: &AtomicUsize,
    ) -> Result<(), TransferError> {
        let total: u64 = writes.iter().map(|(_, _, b)| b.len() as u64).sum();
        let first_id = conn.next_id;
        conn.next_id += writes.len() as u64;
        log_exchange(conn, endpoint, "write", first_id, writes.len(), total);
        let Conn { r, w, .. } = conn;
        let send = async {
            for (i, (grant, off, buf)) in writes.iter().enumerate() {
                let h = Request {
                    op: Op::Write,
                    request_id: first_id + i as u64,
                    offset: *off,
                    len: buf.len() as u64,
                    grant: *grant,
                }
                .encode();
                w.write_all(&h).await?;
                w.write_all(buf).await?;
            }
            w.flush().await
        };
        let recv = async {
            for i in 0..writes.len() {
                let resp = read_response(r).await?;
                answered.fetch_add(1, Ordering::Relaxed);
                check_response(&resp, first_id + i as u64, 0)?;
            }
            Ok::<(), IoOrRefused>(())
        };
        self.exchange(endpoint, total, send, recv).await
    }

    /// The features a store serves (a PING's answer, see
    /// [`crate::protocol::FEATURE_COPY`]): 0 from a store that predates them.
    pub async fn features(&self, endpoint: &str) -> Result<u64, TransferError> {
        let ping = Request {
            op: Op::Ping,
            request_id: 0,
            offset: 0,
            len: 0,
            grant: Grant::default(),
        };
        let (mut conn, mut pooled) = self.checkout(endpoint).await?;
        loop {
            let deadline = self.deadline_for(0);
            match self
                .one_request(&mut conn, endpoint, ping, None, deadline)
                .await
            {
                Ok(value) => {
                    self.checkin(endpoint, conn);
                    return Ok(value);
                }
                Err((e, answered)) if pooled && went_stale(&e, &answered) => {
                    conn = self.replace_stale(endpoint, &e).await?;
                    pooled = false;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Asks the store at `endpoint` to copy `[offset, offset+len)` of the
    /// segment `grant` names into `target`, a segment of the same store
    /// process, and returns the crc32c of the bytes it copied.
    ///
    /// Sent once, on a new connection: a pooled one may have gone stale,
    /// and a COPY that broke without an answer is not sent again (the store
    /// may still be running it). So a [`TransferError::Refused`], a
    /// [`TransferError::Connect`] or a [`TransferError::Tls`] (only from
    /// the handshake: one after the request went out is an `Io`) means
    /// nothing was written, and any other error leaves it unknown how much
    /// was.
    pub async fn copy(
        &self,
        endpoint: &str,
        grant: Grant,
        offset: u64,
        len: u64,
        target: CopyTarget,
    ) -> Result<u32, TransferError> {
        let req = Request {
            op: Op::Copy,
            request_id: 0,
            offset,
            len,
            grant,
        };
        let mut conn = self.connect(endpoint).await?;
        let deadline = self.copy_deadline(len);
        let crc = self
            .one_request(&mut conn, endpoint, req, Some(target), deadline)
            .await
            .map_err(|(e, _)| match e {
                // Once the COPY is sent, a TLS error (a record that fails
                // mid-stream) no longer proves the store did nothing.
                TransferError::Tls { endpoint, reason } => TransferError::Io {
                    endpoint,
                    reason: format!("TLS failed after the COPY was sent: {reason}"),
                },
                other => other,
            })?;
        self.checkin(endpoint, conn);
        // The store answers a crc32c: a wider value is no answer to this.
        u32::try_from(crc).map_err(|_| TransferError::Io {
            endpoint: endpoint.to_string(),
            reason: format!("COPY answered {crc:#x}, not a crc32c"),
        })
    }

    /// Sends `req` (with a COPY's target after it) alone on `conn` and
    /// returns its answer's `value`; on failure, the error and how many
    /// answers were read; all within `deadline`.
    async fn one_request(
        &self,
        conn: &mut Conn,
        endpoint: &str,
        mut req: Request,
        target: Option<CopyTarget>,
        deadline: Duration,
    ) -> Result<u64, (TransferError, AtomicUsize)> {
        req.request_id = conn.next_id;
        conn.next_id += 1;
        log_exchange(conn, endpoint, "one", req.request_id, 1, req.len);
        let answered = AtomicUsize::new(0);
        let mut value = 0;
        let Conn { r, w, .. } = conn;
        let send = async {
            w.write_all(&req.encode()).await?;
            if let Some(target) = &target {
                w.write_all(&target.encode()).await?;
            }
            w.flush().await
        };
        let recv = async {
            let resp = read_response(r).await?;
            answered.fetch_add(1, Ordering::Relaxed);
            check_response(&resp, req.request_id, 0)?;
            value = resp.value;
            Ok::<(), IoOrRefused>(())
        };
        match self.exchange_within(endpoint, deadline, send, recv).await {
            Ok(()) => Ok(value),
            Err(e) => Err((e, answered)),
        }
    }

    /// Runs the sending and receiving halves of one pipelined exchange
    /// concurrently, under a deadline that grows with the bytes moved. On any
    /// error the connection is not returned to the pool (the caller drops it).
    async fn exchange(
        &self,
        endpoint: &str,
        total: u64,
        send: impl std::future::Future<Output = std::io::Result<()>>,
        recv: impl std::future::Future<Output = Result<(), IoOrRefused>>,
    ) -> Result<(), TransferError> {
        self.exchange_within(endpoint, self.deadline_for(total), send, recv)
            .await
    }

    /// [`exchange`](Self::exchange) under a deadline of the caller's.
    async fn exchange_within(
        &self,
        endpoint: &str,
        deadline: Duration,
        send: impl std::future::Future<Output = std::io::Result<()>>,
        recv: impl std::future::Future<Output = Result<(), IoOrRefused>>,
    ) -> Result<(), TransferError> {
        let both = async {
            let (s, rcv) = tokio::join!(send, recv);
            match (s, rcv) {
                // A TLS refusal shows on whichever half meets the alert;
                // the other half then only sees the connection go (a
                // broken pipe, a reset), which must not hide why.
                (Err(e), _) if tls_refusal(&e).is_some() => Err(IoOrRefused::Io(e)),
                (_, Err(e)) if e.is_tls() => Err(e),
                (Err(e), _) => Err(IoOrRefused::Io(e)),
                (Ok(()), rcv) => rcv,
            }
        };
        match tokio::time::timeout(deadline, both).await {
            Err(_) => Err(TransferError::Timeout {
                endpoint: endpoint.to_string(),
            }),
            Ok(Err(e)) => Err(e.into_error(endpoint)),
            Ok(Ok(())) => Ok(()),
        }
    }
}

/// Whether a failed exchange on a pooled connection looks like that
/// connection having gone stale while idle (its store restarted, or closed
/// it): it broke, with no answer read at all. Not a refusal, a TLS error or
/// a timeout (a store that hangs would only be waited for twice).
fn went_stale(e: &TransferError, answered: &AtomicUsize) -> bool {
    matches!(e, TransferError::Io { .. }) && answered.load(Ordering::Relaxed) == 0
}

enum IoOrRefused {
    Io(std::io::Error),
    Refused(Status),
    Protocol(String),
    /// The store's data port answered with a TLS alert: it requires TLS
    /// and this transport speaks clear text.
    TlsRequired,
}

impl From<std::io::Error> for IoOrRefused {
    fn from(e: std::io::Error) -> Self {
        IoOrRefused::Io(e)
    }
}

impl IoOrRefused {
    fn is_tls(&self) -> bool {
        match self {
            IoOrRefused::TlsRequired => true,
            IoOrRefused::Io(e) => tls_refusal(e).is_some(),
            IoOrRefused::Refused(_) | IoOrRefused::Protocol(_) => false,
        }
    }

    fn into_error(self, endpoint: &str) -> TransferError {
        match self {
            IoOrRefused::Io(e) => match tls_refusal(&e) {
                Some(reason) => TransferError::Tls {
                    endpoint: endpoint.to_string(),
                    reason,
                },
                None => TransferError::Io {
                    endpoint: endpoint.to_string(),
                    reason: e.to_string(),
                },
            },
            IoOrRefused::TlsRequired => TransferError::Tls {
                endpoint: endpoint.to_string(),
                reason: "the store's data port requires TLS and this client speaks clear text: \
                         set data_tls (CRESCENT_DATA_TLS=1, --data-tls) with the cluster's \
                         TLS files (CRESCENT_TLS_CERT, CRESCENT_TLS_KEY, CRESCENT_TLS_CA or --tls-*)"
                    .into(),
            },
            IoOrRefused::Refused(status) => TransferError::Refused {
                endpoint: endpoint.to_string(),
                status,
            },
            IoOrRefused::Protocol(reason) => TransferError::Io {
                endpoint: endpoint.to_string(),
                reason,
            },
        }
    }
}

async fn read_response(r: &mut BufReader<ReadHalf>) -> Result<Response, IoOrRefused> {
    let mut hdr = [0u8; RESPONSE_LEN];
    let read = r.read_exact(&mut hdr).await;
    // A TLS store answers a clear-text request with an alert record (7
    // bytes) and closes: the header is cut short, or, were more to
    // follow, does not decode. Either way its first bytes say TLS.
    // (`read_exact` fills `hdr` from the front, and it starts zeroed.)
    if is_tls_alert(&hdr) {
        return Err(IoOrRefused::TlsRequired);
    }
    read?;
    Response::decode(&hdr).map_err(|e| IoOrRefused::Protocol(e.to_string()))
}

/// The start of a TLS alert record: content type 21, version 3.x.
fn is_tls_alert(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 0x15 && bytes[1] == 0x03
}

/// Why the TLS layer refused a connection, when `e` is its error (rustls's
/// own, as tokio-rustls passes it on), with a hint for the usual causes;
/// `None` for an I/O error (a reset, a closed connection, a timeout) and
/// for TLS errors that are no refusal of this client or store.
fn tls_refusal(e: &std::io::Error) -> Option<String> {
    use tokio_rustls::rustls::{AlertDescription, Error};
    let tls = e.get_ref()?.downcast_ref::<Error>()?;
    let hint = match tls {
        Error::InvalidCertificate(_) => {
            " (the store's certificate is not one this client's CA signed for the \
             store's address: check CRESCENT_TLS_CA or --tls-ca, and the store's \
             certificate names the host it advertises)"
        }
        Error::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateRequired
            | AlertDescription::CertificateUnknown
            | AlertDescription::DecryptError,
        ) => " (the store does not trust this client's certificate)",
        Error::AlertReceived(AlertDescription::HandshakeFailure) | Error::InvalidMessage(_) => {
            " (the store may serve its data port in clear text: started without --data-tls?)"
        }
        // Anything else (a record that fails to decrypt, a peer
        // misbehaving mid-transfer) is a transfer failure like a reset:
        // retried, and another replica read, never a refusal for good.
        _ => return None,
    };
    Some(format!("{tls}{hint}"))
}

fn check_response(resp: &Response, id: u64, len: u64) -> Result<(), IoOrRefused> {
    if resp.status != Status::Ok {
        return Err(IoOrRefused::Refused(resp.status));
    }
    if resp.request_id != id || resp.len != len {
        return Err(IoOrRefused::Protocol(format!(
            "answer out of order: expected request {id} with {len} bytes, got {} with {}",
            resp.request_id, resp.len
        )));
    }
    Ok(())
}

/// The debug line that ties a caller's span to the store's log: the store
/// logs each request under this connection's address and the same ids.
fn log_exchange(conn: &Conn, endpoint: &str, kind: &str, first_id: u64, count: usize, bytes: u64) {
    tracing::debug!(
        store = endpoint,
        local = ?conn.local,
        kind,
        first_request_id = first_id,
        count,
        bytes,
        "store exchange"
    );
}
