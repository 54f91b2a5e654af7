//! Serves one segment over TCP: requests are read in order and answered in
//! order; payloads move straight between the socket and segment memory.
//!
//! A connection that sends garbage, a truncated frame or a range outside the
//! segment gets an error answer (when the header was readable) and is closed;
//! every other connection keeps being served.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
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

/// Accepts connections forever (until the task is dropped).
pub async fn serve(segment: Arc<Segment>, listener: TcpListener, stats: Arc<TransferStats>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let segment = segment.clone();
                let stats = stats.clone();
                stats.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    if let Err(e) = handle(segment, stream, &stats).await {
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
) -> Result<(), ConnError> {
    let (r, w) = stream.into_split();
    let mut r = BufReader::with_capacity(IO_BUFFER, r);
    let mut w = BufWriter::with_capacity(IO_BUFFER, w);
    loop {
        // Answers are flushed when no further pipelined request is waiting.
        if r.buffer().is_empty() {
            w.flush().await?;
        }
        let mut hdr = [0u8; HEADER_LEN];
        match r.read_exact(&mut hdr).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let req = Request::decode(&hdr)?;
        let started = std::time::Instant::now();
        stats.requests.fetch_add(1, Ordering::Relaxed);
        if req.op != Op::Ping && req.segment_tag != 0 && req.segment_tag != segment.tag() {
            // Meant for a segment this process does not serve (typically the
            // previous incarnation of a restarted store). Refuse and close:
            // a write's payload is not read, so the stream cannot continue.
            refuse(&mut w, Status::WrongSegment, req.request_id).await?;
            return Err(ConnError::WrongSegment {
                asked: req.segment_tag,
                serving: segment.tag(),
            });
        }
        if !req.fits(segment.len()) {
            refuse(&mut w, Status::OutOfRange, req.request_id).await?;
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
}
