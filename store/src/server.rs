//! Serves one segment over TCP: requests are read in order and answered in
//! order; payloads move straight between the socket and segment memory.
//!
//! A connection that sends garbage, a truncated frame or a range outside the
//! segment gets an error answer (when the header was readable) and is closed;
//! every other connection keeps being served.
//!
//! A READ or WRITE is served only under a grant (see [`crate::protocol`])
//! for this segment, signed with the key it was mounted with, for that
//! operation, unexpired and covering the range; anything else is answered
//! FORBIDDEN and the connection closed. Nothing is served before the
//! segment is mounted.
//!
//! Every connection is bounded ([`ServeLimits`]): it is closed when idle too
//! long between requests, when one request (header, payload and answer)
//! moves slower than a floor rate, and connections beyond a cap are closed
//! as soon as they are accepted. A trickling or silent peer holds neither a
//! task nor a file descriptor for long (20 k idle connections
//! exhausted the store's descriptors, and truncated frames were held forever).
//!
//! With TLS ([`serve_tls`]), every connection is mutual TLS: a
//! peer without a certificate the CA signed is refused at the handshake,
//! before a byte of the protocol is read, and a peer speaking clear text is
//! sent a TLS alert and closed. The handshake holds one of the capped
//! connection slots and must finish within [`ServeLimits::handshake_timeout`].
//! Requests are then served by the same code as in clear text, over the
//! decrypted stream.
//!
//! A disk segment ([`Segment::is_disk`]) has no memory to move bytes to or
//! from: its payloads go through a buffer of at most [`DISK_PIECE`] bytes,
//! filled or written out by pread/pwrite on tokio's blocking pool (a disk
//! can stall for milliseconds; the runtime's few threads must keep serving
//! the other connections meanwhile). A disk error closes the connection
//! (the client sees a failed transfer) and is logged; nothing panics.
//!
//! COPY (see [`crate::protocol`]) moves bytes from the segment a connection
//! serves to another segment of the same process, found in the
//! [`LocalSegments`] the servers of one process share: a master's demotion
//! from memory to disk, or promotion back, without the bytes crossing the
//! network. Both grants are checked before a byte is written; a failure
//! after that closes the connection, like a failed disk write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};

use crate::clock::{now_ms, ClockCheck};
use crate::protocol::{
    CopyTarget, Op, ProtocolError, Request, Response, Status, COPY_TARGET_LEN, FEATURE_COPY,
    REQUEST_LEN,
};
use crate::segment::{Segment, SegmentError};
use crescent_auth::capability::Refusal;
use crescent_auth::tls::ServingTls;

mod copy;
mod disk_io;
#[cfg(test)]
mod tests;
mod tls;

use copy::*;
use disk_io::*;
pub use tls::serve_tls;
use tls::*;

const IO_BUFFER: usize = 64 * 1024;
/// Most bytes of a disk segment one pread or pwrite moves: what a transfer
/// to or from disk holds in memory, whatever its length (up to
/// [`crate::protocol::MAX_TRANSFER`]).
pub const DISK_PIECE: usize = 1 << 20;
/// A read of a disk segment goes out in pieces this large, the next one
/// read from disk while the last is sent: small enough that the two
/// overlap for a 1 MiB object, large enough that the blocking pool's
/// hand-offs cost little.
const DISK_READ_PIECE: usize = 256 << 10;

/// Counters for metrics.
#[derive(Default, Debug)]
pub struct TransferStats {
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub requests: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub connections: AtomicU64,
    /// Requests refused for their grant (bad MAC, expired, wrong segment,
    /// operation or range).
    pub forbidden: AtomicU64,
    /// Connections refused at the TLS handshake (no or an untrusted
    /// certificate, clear text on a TLS port, TLS on a clear-text port, or
    /// too slow), also counted in `rejected_connections`.
    pub tls_refused: AtomicU64,
    /// Time to serve one request (from its header to its answer being written).
    pub transfer_latency: crescent_proto::metrics::Histogram,
    /// Bytes read from a disk segment (also counted in `bytes_read`).
    pub disk_bytes_read: AtomicU64,
    /// Bytes written to a disk segment (also counted in `bytes_written`).
    pub disk_bytes_written: AtomicU64,
    /// preads of a disk segment (one per piece of at most [`DISK_PIECE`]
    /// bytes of a request).
    pub disk_reads: AtomicU64,
    /// pwrites to a disk segment (likewise per piece).
    pub disk_writes: AtomicU64,
    /// preads and pwrites that failed (each closed its connection).
    pub disk_errors: AtomicU64,
    /// Time of one pread of a disk segment.
    pub disk_read_latency: crescent_proto::metrics::Histogram,
    /// Time of one pwrite to a disk segment.
    pub disk_write_latency: crescent_proto::metrics::Histogram,
    /// COPYs served: copies from this segment into another of this process.
    /// A copy's pieces are also counted in the disk counters of the segment
    /// it read (`disk_reads`, `disk_bytes_read`) or wrote (`disk_writes`,
    /// `disk_bytes_written`) when that is a disk, but not in `bytes_read`,
    /// `bytes_written` (what the data port moved) or the latency histograms.
    pub copies: AtomicU64,
    /// Bytes those copies moved.
    pub copy_bytes: AtomicU64,
    /// COPYs that failed after their checks (a disk error, a grant that
    /// expired or a request cut short mid-copy; each closed its connection).
    pub copy_errors: AtomicU64,
}

/// The segments one process serves (with their counters), so a COPY sent
/// to one of them can find its target. Holds them weakly: a segment no
/// longer served is released (and a disk segment's file lock with it) as if
/// it were not listed.
#[derive(Clone, Default, Debug)]
pub struct LocalSegments(Arc<std::sync::Mutex<Vec<ServedSegment>>>);

type ServedSegment = (std::sync::Weak<Segment>, std::sync::Weak<TransferStats>);

impl LocalSegments {
    /// Lists `segment`, counted in `stats` (and forgets the ones released
    /// since).
    pub fn add(&self, segment: &Arc<Segment>, stats: &Arc<TransferStats>) {
        let mut all = self.0.lock().expect("lock poisoned");
        all.retain(|(s, _)| s.strong_count() > 0);
        all.push((Arc::downgrade(segment), Arc::downgrade(stats)));
    }

    /// The listed segment mounted as `segment_id`, with its counters.
    pub fn find(&self, segment_id: u64) -> Option<(Arc<Segment>, Arc<TransferStats>)> {
        let all = self.0.lock().expect("lock poisoned");
        all.iter()
            .filter_map(|(s, t)| Some((s.upgrade()?, t.upgrade()?)))
            .find(|(s, _)| s.mounted().is_some_and(|m| m.id == segment_id))
    }
}

/// The slowest transfer rate a store tolerates by default
/// ([`ServeLimits::min_bytes_per_sec`]), bytes/s. A master's `COPY`
/// deadline follows it too (`TcpTransport::copy_deadline`).
pub const DEFAULT_MIN_BYTES_PER_SEC: u64 = 16 << 20;

/// Bounds on each transfer connection.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// Open connections; more are closed when accepted.
    pub max_connections: u64,
    /// Longest wait for the next request on an open connection.
    pub idle_timeout: Duration,
    /// Time every request gets, whatever its size (header, payload, answer).
    pub request_base: Duration,
    /// Slowest transfer rate tolerated on top of `request_base`, bytes/s.
    pub min_bytes_per_sec: u64,
    /// How far past its expiry a grant is still honoured: the store's clock
    /// may run ahead of the master's that signed it.
    pub grant_clock_skew: Duration,
    /// Longest a TLS handshake may take (with TLS): a peer that connects
    /// and stalls holds its slot no longer.
    pub handshake_timeout: Duration,
    /// Whether this store's clock agrees with the leader's (its registration
    /// keeps it current): while it does not, no grant is honoured.
    pub clock: Arc<ClockCheck>,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(300),
            request_base: Duration::from_secs(10),
            min_bytes_per_sec: DEFAULT_MIN_BYTES_PER_SEC,
            grant_clock_skew: Duration::from_secs(2),
            handshake_timeout: crescent_auth::tls::HANDSHAKE_TIMEOUT,
            clock: Arc::default(),
        }
    }
}

impl ServeLimits {
    /// Deadline for one request moving `len` payload bytes.
    fn request_deadline(&self, len: u64) -> Duration {
        self.request_base + Duration::from_secs(len / self.min_bytes_per_sec.max(1))
    }

    /// The last moment (this store's Unix ms) a grant expiring at
    /// `expiry_ms` is honoured: its expiry plus the clock skew allowed.
    fn honoured_until(&self, expiry_ms: u64) -> u64 {
        expiry_ms.saturating_add(self.grant_clock_skew.as_millis() as u64)
    }
}

/// Accepts clear-text connections forever (until the task is dropped).
pub async fn serve(
    segment: Arc<Segment>,
    listener: TcpListener,
    stats: Arc<TransferStats>,
    limits: ServeLimits,
) {
    serve_tls(
        segment,
        listener,
        stats,
        limits,
        None,
        LocalSegments::default(),
    )
    .await
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Protocol(#[from] crate::protocol::ProtocolError),
    #[error("request for segment {asked}, but this store serves {serving:?}")]
    WrongSegment { asked: u64, serving: Option<u64> },
    #[error("request {request_id} refused: {refusal}")]
    Forbidden { request_id: u64, refusal: Refusal },
    #[error("request [{offset}, +{len}) outside the {size}-byte segment")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("request {request_id} of {len} bytes not done within {deadline:?}")]
    TooSlow {
        request_id: u64,
        len: u64,
        deadline: Duration,
    },
    #[error("no complete request header within {0:?}")]
    HeaderTooSlow(Duration),
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    #[error(
        "a TLS client on the clear-text data port (this store runs without \
         --data-tls; the client sets data_tls): sent it a TLS alert"
    )]
    TlsOnClearText,
    #[error("request {request_id}: {reason}")]
    Disk { request_id: u64, reason: String },
    #[error("a write's bytes arrived after its grant expired (at {until_ms} ms, skew included); the rest is not written")]
    GrantExpired { until_ms: u64 },
}

/// Reads exactly `dst.len()` bytes from `r` into `dst` (segment memory),
/// copying none once this store's clock is past `until_ms`. The clock is
/// read in the same poll that copies the bytes, so bytes that arrive late
/// (a stalled link, data retransmitted after a partition heals, a writer
/// paused mid-write) are never written after the grant expired: the masters
/// may have given the range to another object by then.
async fn read_exact_until<R>(r: &mut R, dst: &mut [u8], until_ms: u64) -> Result<(), ConnError>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut filled = 0;
    std::future::poll_fn(|cx| {
        while filled < dst.len() {
            if now_ms() > until_ms {
                return std::task::Poll::Ready(Err(ConnError::GrantExpired { until_ms }));
            }
            let mut buf = tokio::io::ReadBuf::new(&mut dst[filled..]);
            std::task::ready!(std::pin::Pin::new(&mut *r).poll_read(cx, &mut buf))?;
            match buf.filled().len() {
                0 => {
                    return std::task::Poll::Ready(Err(ConnError::Io(
                        std::io::ErrorKind::UnexpectedEof.into(),
                    )))
                }
                n => filled += n,
            }
        }
        std::task::Poll::Ready(Ok(()))
    })
    .await
}

/// Most payload bytes of a refused write read and dropped before closing.
const REFUSED_PAYLOAD_DRAIN: u64 = 4 << 20;

/// Answers a request with a refusal and flushes it; the caller then closes
/// the connection. A refused write's payload (up to
/// [`REFUSED_PAYLOAD_DRAIN`], for at most a second) is read and dropped
/// first: closing with unread bytes makes the kernel send a reset, which can
/// destroy the refusal before the client reads it.
async fn refuse<R, W>(r: &mut R, w: &mut W, req: &Request, status: Status) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let resp = Response {
        status,
        request_id: req.request_id,
        len: 0,
        value: 0,
    };
    w.write_all(&resp.encode()).await?;
    w.flush().await?;
    if req.op == Op::Write {
        drain(r, req.len.min(REFUSED_PAYLOAD_DRAIN)).await;
    }
    Ok(())
}

/// Reads and drops up to `max` bytes, for at most a second.
async fn drain<R: tokio::io::AsyncRead + Unpin>(r: &mut R, max: u64) {
    let mut rest = (&mut *r).take(max);
    let mut sink = tokio::io::sink();
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::io::copy(&mut rest, &mut sink),
    )
    .await;
}

/// Serves the requests of one connection, clear text or decrypted TLS.
async fn handle<R, W>(
    segment: Arc<Segment>,
    local: &LocalSegments,
    r: R,
    w: W,
    stats: &TransferStats,
    limits: &ServeLimits,
    clear_text: bool,
) -> Result<(), ConnError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut r = BufReader::with_capacity(IO_BUFFER, r);
    let mut w = BufWriter::with_capacity(IO_BUFFER, w);
    loop {
        // Answers are flushed when no further pipelined request is waiting.
        if r.buffer().is_empty() {
            let flush = limits.request_deadline(0);
            tokio::time::timeout(flush, w.flush())
                .await
                .map_err(|_| std::io::Error::other("answer not taken by the peer in time"))??;
        }
        // Idle: wait for the next request's first byte (or the end).
        match tokio::time::timeout(limits.idle_timeout, r.fill_buf()).await {
            Err(_) => return Ok(()),
            Ok(Ok([])) => return Ok(()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
        }
        let mut hdr = [0u8; REQUEST_LEN];
        match tokio::time::timeout(limits.request_base, r.read_exact(&mut hdr)).await {
            Err(_) => return Err(ConnError::HeaderTooSlow(limits.request_base)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e.into()),
        }
        let req = match Request::decode(&hdr) {
            Ok(req) => req,
            Err(ProtocolError::BadMagic(_)) if clear_text && is_tls_client_hello(&hdr) => {
                refuse_tls_client(&mut r, &mut w, &hdr).await;
                return Err(ConnError::TlsOnClearText);
            }
            Err(e) => return Err(e.into()),
        };
        tracing::debug!(
            op = ?req.op,
            request_id = req.request_id,
            segment_id = req.grant.segment_id,
            offset = req.offset,
            len = req.len,
            "request"
        );
        let deadline = limits.request_deadline(req.len);
        let serve = serve_one(&segment, local, &req, &mut r, &mut w, stats, limits);
        tokio::time::timeout(deadline, serve)
            .await
            .map_err(|_| ConnError::TooSlow {
                request_id: req.request_id,
                len: req.len,
                deadline,
            })??;
    }
}

/// Why `grant` does not allow `access` to `[offset, offset+len)` of the
/// segment mounted as `m` now, if it does not.
fn grant_refusal(
    m: &crate::segment::Mounted,
    grant: &crate::protocol::Grant,
    access: crescent_auth::capability::Access,
    offset: u64,
    len: u64,
    limits: &ServeLimits,
) -> Option<Refusal> {
    if limits.clock.is_off() {
        return Some(Refusal::ClockOff {
            offset_ms: limits.clock.offset_ms(),
        });
    }
    let skew_ms = limits.grant_clock_skew.as_millis() as u64;
    m.signer
        .check(
            &grant.capability(access),
            &grant.mac,
            m.id,
            access,
            offset,
            len,
            now_ms(),
            skew_ms,
        )
        .err()
}

/// Answers `req` Forbidden for `refusal` (counted) and returns the error
/// that closes the connection (the one a failed answer gives, if it failed).
async fn forbid<R, W>(
    r: &mut R,
    w: &mut W,
    req: &Request,
    stats: &TransferStats,
    refusal: Refusal,
) -> ConnError
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    stats.forbidden.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = refuse(r, w, req, Status::Forbidden).await {
        return e.into();
    }
    ConnError::Forbidden {
        request_id: req.request_id,
        refusal,
    }
}

/// Serves one decoded request: checks it, moves its bytes, writes the answer.
async fn serve_one<R, W>(
    segment: &Arc<Segment>,
    local: &LocalSegments,
    req: &Request,
    r: &mut R,
    w: &mut W,
    stats: &TransferStats,
    limits: &ServeLimits,
) -> Result<(), ConnError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    {
        let started = std::time::Instant::now();
        stats.requests.fetch_add(1, Ordering::Relaxed);
        // Read before any check, so a refusal leaves no unread bytes.
        let copy_target = if req.op == Op::Copy {
            let mut b = [0u8; COPY_TARGET_LEN];
            r.read_exact(&mut b).await?;
            Some(CopyTarget::decode(&b))
        } else {
            None
        };
        if let Some(access) = req.op.access() {
            let mounted = segment.mounted();
            let refusal = match &mounted {
                Some(m) if req.grant.segment_id != m.id => {
                    // Meant for a segment this process does not serve
                    // (typically the previous incarnation of a restarted
                    // store). Refuse and close: a write's payload is not
                    // stored, so the stream cannot continue.
                    refuse(r, w, req, Status::WrongSegment).await?;
                    return Err(ConnError::WrongSegment {
                        asked: req.grant.segment_id,
                        serving: Some(m.id),
                    });
                }
                Some(m) => grant_refusal(m, &req.grant, access, req.offset, req.len, limits),
                None => Some(Refusal::NoKey),
            };
            if let Some(refusal) = refusal {
                return Err(forbid(r, w, req, stats, refusal).await);
            }
        }
        if !req.fits(segment.len()) {
            refuse(r, w, req, Status::OutOfRange).await?;
            return Err(ConnError::OutOfRange {
                offset: req.offset,
                len: req.len,
                size: segment.len(),
            });
        }
        match req.op {
            Op::Copy => {
                let Some(target) = copy_target else {
                    return Err(std::io::Error::other("COPY without its target").into());
                };
                copy_local(segment, local, req, &target, r, w, stats, limits).await?
            }
            Op::Read if segment.is_disk() => disk_read(segment, req, w, stats).await?,
            Op::Write if segment.is_disk() => {
                let until = limits.honoured_until(req.grant.expiry_ms);
                disk_write(segment, req, until, r, w, stats).await?
            }
            Op::Read => {
                let resp = Response {
                    status: Status::Ok,
                    request_id: req.request_id,
                    len: req.len,
                    value: 0,
                };
                w.write_all(&resp.encode()).await?;
                // SAFETY: range checked by `fits`; see segment.rs on concurrency.
                let src = unsafe { segment.slice(req.offset, req.len) }
                    .map_err(|_| std::io::Error::other("range"))?;
                w.write_all(src).await?;
                stats.bytes_read.fetch_add(req.len, Ordering::Relaxed);
            }
            Op::Write => {
                // SAFETY: range checked by `fits`; the allocator gave this
                // range to exactly one writer.
                let dst = unsafe { segment.slice_mut(req.offset, req.len) }
                    .map_err(|_| std::io::Error::other("range"))?;
                let until = limits.honoured_until(req.grant.expiry_ms);
                if let Err(e) = read_exact_until(r, dst, until).await {
                    if matches!(e, ConnError::GrantExpired { .. }) {
                        stats.forbidden.fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(e);
                }
                let resp = Response {
                    status: Status::Ok,
                    request_id: req.request_id,
                    len: 0,
                    value: 0,
                };
                w.write_all(&resp.encode()).await?;
                stats.bytes_written.fetch_add(req.len, Ordering::Relaxed);
            }
            Op::Ping => {
                let resp = Response {
                    status: Status::Ok,
                    request_id: req.request_id,
                    len: 0,
                    value: FEATURE_COPY,
                };
                w.write_all(&resp.encode()).await?;
            }
        }
        stats.transfer_latency.observe(started.elapsed());
    }
    Ok(())
}
