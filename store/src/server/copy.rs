//! COPY: bytes moved from the segment a connection serves to another
//! segment of this process, under both grants.

use super::*;

/// Serves a COPY (source range and grant already checked): finds the
/// target segment among this process's, checks the write grant and range,
/// then copies piece by piece on the blocking pool, syncing a disk target
/// before answering with the crc32c of the bytes copied. Nothing is written
/// before both grants are checked; a refusal answers and closes, a failure
/// after that only closes (the master cannot know how much was written).
#[allow(clippy::too_many_arguments)]
pub(super) async fn copy_local<R, W>(
    segment: &Arc<Segment>,
    local: &LocalSegments,
    req: &Request,
    target: &CopyTarget,
    r: &mut R,
    w: &mut W,
    stats: &TransferStats,
    limits: &ServeLimits,
) -> Result<(), ConnError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let Some((into, into_stats, mounted)) = local
        .find(target.grant.segment_id)
        .and_then(|(s, t)| s.mounted().map(|m| (s, t, m)))
    else {
        refuse(r, w, req, Status::WrongSegment).await?;
        return Err(ConnError::WrongSegment {
            asked: target.grant.segment_id,
            serving: None,
        });
    };
    let write = crescent_auth::capability::Access::Write;
    if let Some(refusal) = grant_refusal(
        &mounted,
        &target.grant,
        write,
        target.offset,
        req.len,
        limits,
    ) {
        return Err(forbid(r, w, req, stats, refusal).await);
    }
    let fits = target
        .offset
        .checked_add(req.len)
        .is_some_and(|end| end <= into.len());
    if !fits {
        refuse(r, w, req, Status::OutOfRange).await?;
        return Err(ConnError::OutOfRange {
            offset: target.offset,
            len: req.len,
            size: into.len(),
        });
    }
    let from = segment.clone();
    let (from_offset, to_offset, len) = (req.offset, target.offset, req.len);
    let read_until_ms = limits.honoured_until(req.grant.expiry_ms);
    let write_until_ms = limits.honoured_until(target.grant.expiry_ms);
    let (from_disk, into_disk) = (segment.is_disk(), into.is_disk());
    // Set when this future is dropped (the request's deadline, the server
    // shut down): the blocking copy then stops at its next piece instead of
    // writing on for a master that has stopped waiting for it.
    let mut in_flight = CopyInFlight {
        stop: Arc::default(),
        errors: &stats.copy_errors,
        ended: false,
    };
    let stop = in_flight.stop.clone();
    let copied = tokio::task::spawn_blocking(move || {
        let ticket = into.disk_write_ticket();
        let mut buf = vec![0u8; len.min(DISK_PIECE as u64) as usize];
        let mut crc = 0u32;
        let mut done = 0u64;
        while done < len {
            // At most DISK_PIECE: fits a usize.
            let piece = &mut buf[..(len - done).min(DISK_PIECE as u64) as usize];
            // As for a disk write, nothing is read or written once a grant
            // has expired: the masters may have given either range away.
            if stop.load(Ordering::Relaxed) || now_ms() > read_until_ms {
                return Err(SegmentError::GrantExpired);
            }
            from.read_at(from_offset + done, piece)?;
            crc = crc32c::crc32c_append(crc, piece);
            if stop.load(Ordering::Relaxed) || now_ms() > write_until_ms {
                return Err(SegmentError::GrantExpired);
            }
            into.write_at(to_offset + done, piece)?;
            done += piece.len() as u64;
        }
        // Durable before it is answered, as a disk write (see there).
        into.sync_disk(ticket)?;
        Ok(crc)
    })
    .await;
    // Counted below, success or failure, rather than as cut short.
    in_flight.ended = true;
    let pieces = len.div_ceil(DISK_PIECE as u64);
    let reason = match copied {
        Ok(Ok(crc)) => {
            stats.copies.fetch_add(1, Ordering::Relaxed);
            stats.copy_bytes.fetch_add(req.len, Ordering::Relaxed);
            // The disk tier's own counters see the copy as reads or writes.
            if from_disk {
                stats.disk_reads.fetch_add(pieces, Ordering::Relaxed);
                stats.disk_bytes_read.fetch_add(req.len, Ordering::Relaxed);
            }
            if into_disk {
                into_stats.disk_writes.fetch_add(pieces, Ordering::Relaxed);
                into_stats
                    .disk_bytes_written
                    .fetch_add(req.len, Ordering::Relaxed);
            }
            let resp = Response {
                status: Status::Ok,
                request_id: req.request_id,
                len: 0,
                value: u64::from(crc),
            };
            w.write_all(&resp.encode()).await?;
            return Ok(());
        }
        Ok(Err(e)) => e.to_string(),
        Err(e) => format!("copy task failed: {e}"),
    };
    stats.copy_errors.fetch_add(1, Ordering::Relaxed);
    tracing::error!(request_id = req.request_id, error = %reason, "copy between this store's segments failed; closing the connection");
    Err(ConnError::Disk {
        request_id: req.request_id,
        reason,
    })
}

/// A COPY's blocking task seen from its request: dropped before it
/// `ended` (the request cut short), it tells the task to stop and counts
/// the copy as failed.
pub(super) struct CopyInFlight<'a> {
    stop: Arc<std::sync::atomic::AtomicBool>,
    errors: &'a AtomicU64,
    ended: bool,
}

impl Drop for CopyInFlight<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if !self.ended {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
