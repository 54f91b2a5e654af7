//! Serves one segment over TCP: requests are read in order and answered in
//! order; payloads move straight between the socket and segment memory.
//!
//! A connection that sends garbage, a truncated frame or a range outside the
//! segment gets an error answer (when the header was readable) and is closed;
//! every other connection keeps being served.
//!
//! Every connection is bounded ([`ServeLimits`]): it is closed when idle too
//! long between requests, when one request (header, payload and answer)
//! moves slower than a floor rate, and connections beyond a cap are closed
//! as soon as they are accepted. A trickling or silent peer holds neither a
//! task nor a file descriptor for long (issue 11: 20 k idle connections
//! exhausted the store's descriptors, and truncated frames were held forever).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};

use crate::protocol::{Op, Request, Response, Status, HEADER_LEN};
use crate::segment::Segment;

const IO_BUFFER: usize = 64 * 1024;

/// Counters for metrics.
#[derive(Default, Debug)]
pub struct TransferStats {
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub requests: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub connections: AtomicU64,
    /// Time to serve one request (from its header to its answer being written).
    pub transfer_latency: crescent_proto::metrics::Histogram,
}

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
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(300),
            request_base: Duration::from_secs(10),
            min_bytes_per_sec: 16 << 20,
        }
    }
}

impl ServeLimits {
    /// Deadline for one request moving `len` payload bytes.
    fn request_deadline(&self, len: u64) -> Duration {
        self.request_base + Duration::from_secs(len / self.min_bytes_per_sec.max(1))
    }
}

/// Accepts connections forever (until the task is dropped).
pub async fn serve(
    segment: Arc<Segment>,
    listener: TcpListener,
    stats: Arc<TransferStats>,
    limits: ServeLimits,
) {
    let limits = Arc::new(limits);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if stats.connections.load(Ordering::Relaxed) >= limits.max_connections {
                    stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, max = limits.max_connections, "too many transfer connections; closing a new one");
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let segment = segment.clone();
                let stats = stats.clone();
                let limits = limits.clone();
                stats.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    if let Err(e) = handle(segment, stream, &stats, &limits).await {
                        stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, error = %e, "closing transfer connection");
                    }
                    stats.connections.fetch_sub(1, Ordering::Relaxed);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Protocol(#[from] crate::protocol::ProtocolError),
    #[error("request for segment tag {asked:#x}, but this store serves {serving:#x}")]
    WrongSegment { asked: u32, serving: u32 },
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
}

/// Answers a request with a refusal and flushes it; the caller then closes
/// the connection.
async fn refuse<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    status: Status,
    request_id: u64,
) -> std::io::Result<()> {
    let resp = Response {
        status,
        request_id,
        len: 0,
    };
    w.write_all(&resp.encode()).await?;
    w.flush().await
}

async fn handle(
    segment: Arc<Segment>,
    stream: TcpStream,
    stats: &TransferStats,
    limits: &ServeLimits,
) -> Result<(), ConnError> {
    let (r, w) = stream.into_split();
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
        let mut hdr = [0u8; HEADER_LEN];
        match tokio::time::timeout(limits.request_base, r.read_exact(&mut hdr)).await {
            Err(_) => return Err(ConnError::HeaderTooSlow(limits.request_base)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e.into()),
        }
        let req = Request::decode(&hdr)?;
        let deadline = limits.request_deadline(req.len);
        tokio::time::timeout(deadline, serve_one(&segment, &req, &mut r, &mut w, stats))
            .await
            .map_err(|_| ConnError::TooSlow {
                request_id: req.request_id,
                len: req.len,
                deadline,
            })??;
    }
}

/// Serves one decoded request: checks it, moves its bytes, writes the answer.
async fn serve_one<R, W>(
    segment: &Segment,
    req: &Request,
    r: &mut R,
    w: &mut W,
    stats: &TransferStats,
) -> Result<(), ConnError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    {
        let started = std::time::Instant::now();
        stats.requests.fetch_add(1, Ordering::Relaxed);
        if req.op != Op::Ping && req.segment_tag != 0 && req.segment_tag != segment.tag() {
            // Meant for a segment this process does not serve (typically the
            // previous incarnation of a restarted store). Refuse and close:
            // a write's payload is not read, so the stream cannot continue.
            refuse(w, Status::WrongSegment, req.request_id).await?;
            return Err(ConnError::WrongSegment {
                asked: req.segment_tag,
                serving: segment.tag(),
            });
        }
        if !req.fits(segment.len()) {
            refuse(w, Status::OutOfRange, req.request_id).await?;
            return Err(ConnError::OutOfRange {
                offset: req.offset,
                len: req.len,
                size: segment.len(),
            });
        }
        match req.op {
            Op::Read => {
                let resp = Response {
                    status: Status::Ok,
                    request_id: req.request_id,
                    len: req.len,
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
                r.read_exact(dst).await?;
                let resp = Response {
                    status: Status::Ok,
                    request_id: req.request_id,
                    len: 0,
                };
                w.write_all(&resp.encode()).await?;
                stats.bytes_written.fetch_add(req.len, Ordering::Relaxed);
            }
            Op::Ping => {
                let resp = Response {
                    status: Status::Ok,
                    request_id: req.request_id,
                    len: 0,
                };
                w.write_all(&resp.encode()).await?;
            }
        }
        stats.transfer_latency.observe(started.elapsed());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Real sockets on loopback, with small limits so the bounds show within
    //! a test; every wait is capped by a generous deadline.

    use super::*;
    use std::time::Instant;

    async fn start(limits: ServeLimits) -> (String, Arc<TransferStats>) {
        let segment = Segment::anonymous(4 << 20).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stats = Arc::new(TransferStats::default());
        tokio::spawn(serve(segment, listener, stats.clone(), limits));
        (addr, stats)
    }

    fn small_limits() -> ServeLimits {
        ServeLimits {
            max_connections: 2,
            idle_timeout: Duration::from_millis(300),
            request_base: Duration::from_millis(300),
            min_bytes_per_sec: 1 << 30,
        }
    }

    fn request(op: Op, id: u64, offset: u64, len: u64) -> [u8; HEADER_LEN] {
        Request {
            op,
            segment_tag: 0,
            request_id: id,
            offset,
            len,
        }
        .encode()
    }

    /// Waits (at most 10 s) for the store to close `s`.
    async fn closed_by_the_store(s: &mut TcpStream) -> bool {
        let mut rest = Vec::new();
        matches!(
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await,
            Ok(Ok(_)) | Ok(Err(_))
        )
    }

    async fn ping(s: &mut TcpStream, id: u64) -> Response {
        s.write_all(&request(Op::Ping, id, 0, 0)).await.unwrap();
        let mut hdr = [0u8; HEADER_LEN];
        s.read_exact(&mut hdr).await.unwrap();
        Response::decode(&hdr).unwrap()
    }

    #[tokio::test]
    async fn idle_and_trickling_connections_are_closed() {
        let (addr, _) = start(small_limits()).await;
        // Silent after connecting.
        let mut idle = TcpStream::connect(&addr).await.unwrap();
        assert!(closed_by_the_store(&mut idle).await, "idle connection kept");
        // Half a header, then nothing.
        let mut half = TcpStream::connect(&addr).await.unwrap();
        half.write_all(&request(Op::Ping, 1, 0, 0)[..10])
            .await
            .unwrap();
        assert!(
            closed_by_the_store(&mut half).await,
            "truncated header kept"
        );
        // A WRITE whose payload stops arriving.
        let mut slow = TcpStream::connect(&addr).await.unwrap();
        slow.write_all(&request(Op::Write, 2, 0, 1 << 20))
            .await
            .unwrap();
        slow.write_all(&[7u8; 100]).await.unwrap();
        assert!(closed_by_the_store(&mut slow).await, "stalled write kept");
        // A connection that keeps working is served throughout.
        let mut busy = TcpStream::connect(&addr).await.unwrap();
        let until = Instant::now() + Duration::from_millis(900);
        let mut id = 10;
        while Instant::now() < until {
            id += 1;
            let r = ping(&mut busy, id).await;
            assert_eq!((r.status, r.request_id), (Status::Ok, id));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_and_the_others_served() {
        let (addr, stats) = start(ServeLimits {
            idle_timeout: Duration::from_secs(60),
            ..small_limits()
        })
        .await;
        let mut a = TcpStream::connect(&addr).await.unwrap();
        let mut b = TcpStream::connect(&addr).await.unwrap();
        ping(&mut a, 1).await;
        ping(&mut b, 2).await;
        let mut c = TcpStream::connect(&addr).await.unwrap();
        assert!(closed_by_the_store(&mut c).await, "a third connection kept");
        assert!(stats.rejected_connections.load(Ordering::Relaxed) >= 1);
        assert_eq!(ping(&mut a, 3).await.status, Status::Ok);
        assert_eq!(ping(&mut b, 4).await.status, Status::Ok);
        // Once one closes, a new one is taken again.
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.connections.load(Ordering::Relaxed) >= 2 {
            assert!(Instant::now() < deadline, "closed connection still counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut d = TcpStream::connect(&addr).await.unwrap();
        assert_eq!(ping(&mut d, 5).await.status, Status::Ok);
    }
}
