//! A disk segment's payloads: moved through a buffer of at most
//! [`DISK_PIECE`] bytes by pread/pwrite on tokio's blocking pool, each
//! piece written only while its grant holds.

use super::*;

/// Which way a disk piece moves.
#[derive(Clone, Copy)]
pub(super) enum DiskOp {
    Read,
    Write,
}

/// Runs one pread (into `buf`, all of it) or pwrite (of `buf`) at `offset`
/// of the disk segment on the blocking pool, and counts it. `buf` is moved
/// there and handed back: a request cut short by its deadline leaves the
/// blocking call running on memory it owns.
#[allow(clippy::too_many_arguments)]
pub(super) async fn disk_piece(
    segment: &Arc<Segment>,
    op: DiskOp,
    offset: u64,
    mut buf: Vec<u8>,
    request_id: u64,
    write_until_ms: u64,
    stats: &TransferStats,
) -> Result<Vec<u8>, ConnError> {
    let seg = segment.clone();
    let started = std::time::Instant::now();
    let done = tokio::task::spawn_blocking(move || {
        let moved = match op {
            DiskOp::Read => seg.read_at(offset, &mut buf),
            // The grant is checked when a write starts, but its bytes may
            // arrive much later (a stalled link, a stalled writer): no piece
            // is written once the grant has expired, because the masters may
            // have given the range to another object since (a demotion's
            // range is freed a while after its write grant expires).
            DiskOp::Write if now_ms() > write_until_ms => Err(SegmentError::GrantExpired),
            DiskOp::Write => seg.write_at(offset, &buf),
        };
        (moved, buf)
    })
    .await;
    let reason = match done {
        Ok((Ok(()), buf)) => {
            let n = buf.len() as u64;
            match op {
                DiskOp::Read => {
                    stats.disk_reads.fetch_add(1, Ordering::Relaxed);
                    stats.disk_bytes_read.fetch_add(n, Ordering::Relaxed);
                    stats.disk_read_latency.observe(started.elapsed());
                }
                DiskOp::Write => {
                    stats.disk_writes.fetch_add(1, Ordering::Relaxed);
                    stats.disk_bytes_written.fetch_add(n, Ordering::Relaxed);
                    stats.disk_write_latency.observe(started.elapsed());
                }
            }
            return Ok(buf);
        }
        Ok((Err(e), _)) => e.to_string(),
        // The closure panicked, or the runtime is shutting down.
        Err(e) => format!("disk I/O task failed: {e}"),
    };
    stats.disk_errors.fetch_add(1, Ordering::Relaxed);
    tracing::error!(request_id, offset, error = %reason, "disk segment I/O failed; closing the connection");
    Err(ConnError::Disk { request_id, reason })
}

/// Serves a READ of a disk segment (range and grant already checked): the
/// answer, then the bytes piece by piece, each piece's pread running while
/// the one before is sent. (Also asking the kernel to read the whole range
/// ahead, `POSIX_FADV_WILLNEED`, was measured: a little faster for one get
/// at a time, less than half as fast for batches of 16; docs/benchmarks.md.)
/// A failed pread closes the connection mid-payload, which the client sees
/// as a failed transfer.
pub(super) async fn disk_read<W>(
    segment: &Arc<Segment>,
    req: &Request,
    w: &mut W,
    stats: &TransferStats,
) -> Result<(), ConnError>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let resp = Response {
        status: Status::Ok,
        request_id: req.request_id,
        len: req.len,
        value: 0,
    };
    w.write_all(&resp.encode()).await?;
    // At most DISK_READ_PIECE: fits a usize.
    let piece = |at: u64| (req.len - at).min(DISK_READ_PIECE as u64) as usize;
    let read = |at: u64, buf: Vec<u8>| {
        disk_piece(
            segment,
            DiskOp::Read,
            req.offset + at,
            buf,
            req.request_id,
            u64::MAX,
            stats,
        )
    };
    let mut done = 0u64;
    let mut current = read(0, vec![0; piece(0)]).await?;
    let mut spare = Vec::new();
    loop {
        let next_at = done + current.len() as u64;
        if next_at >= req.len {
            w.write_all(&current).await?;
            break;
        }
        spare.resize(piece(next_at), 0);
        let (next, sent) = tokio::join!(
            read(next_at, std::mem::take(&mut spare)),
            w.write_all(&current)
        );
        sent?;
        spare = std::mem::replace(&mut current, next?);
        done = next_at;
    }
    stats.bytes_read.fetch_add(req.len, Ordering::Relaxed);
    Ok(())
}

/// Serves a WRITE to a disk segment (range and grant already checked): the
/// payload piece by piece, each written before the next is read, then the
/// answer.
pub(super) async fn disk_write<R, W>(
    segment: &Arc<Segment>,
    req: &Request,
    write_until_ms: u64,
    r: &mut R,
    w: &mut W,
    stats: &TransferStats,
) -> Result<(), ConnError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let ticket = segment.disk_write_ticket();
    let mut buf = Vec::new();
    let mut done = 0u64;
    while done < req.len {
        let n = (req.len - done).min(DISK_PIECE as u64) as usize;
        buf.resize(n, 0);
        r.read_exact(&mut buf).await?;
        let offset = req.offset + done;
        buf = disk_piece(
            segment,
            DiskOp::Write,
            offset,
            buf,
            req.request_id,
            write_until_ms,
            stats,
        )
        .await?;
        done += n as u64;
    }
    // Durable before it is acknowledged: the masters record a disk replica
    // once its write is answered, and a restarted store's disk objects are
    // taken back on the strength of its file's identity alone.
    let seg = segment.clone();
    let synced = tokio::task::spawn_blocking(move || seg.sync_disk(ticket)).await;
    let failure = match synced {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(format!("disk sync task failed: {e}")),
    };
    if let Some(reason) = failure {
        stats.disk_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!(request_id = req.request_id, error = %reason, "disk segment sync failed; closing the connection");
        return Err(ConnError::Disk {
            request_id: req.request_id,
            reason,
        });
    }
    let resp = Response {
        status: Status::Ok,
        request_id: req.request_id,
        len: 0,
        value: 0,
    };
    w.write_all(&resp.encode()).await?;
    stats.bytes_written.fetch_add(req.len, Ordering::Relaxed);
    Ok(())
}
