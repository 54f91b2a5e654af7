//! Copies between tiers. At the memory high watermark the leader moves the
//! coldest objects to a disk segment instead of dropping them (demotion);
//! an object only on disk that readers keep asking for is copied back to
//! memory (promotion), and keeps its disk replica, so reading an object
//! never makes a store restart lose it. Evicting a promoted object from
//! memory later copies nothing: its memory replicas are simply released.
//!
//! A round: `TierMoveStart` allocates each object's range in the target
//! tier (one entry for the batch); the bytes are copied under grants the
//! leader signs (a read grant for the source, a write grant for the
//! target), and their crc32c is checked against the one the object was put
//! with; then `TierMoveEnd` adds the new replica (and, for a demotion,
//! releases the memory ones) in one entry.
//!
//! Who copies: when source and target are segments of the same store
//! process (a store's memory and its own disk, the usual case), the leader
//! sends that store one COPY and the bytes never leave its host; the store
//! answers the crc32c of what it copied. Otherwise, or when the store
//! predates COPY (its PING answers no [`FEATURE_COPY`]) or refuses it, the
//! leader copies itself: it reads the source replica and writes the target
//! range over the stores' TCP data ports.
//!
//! Why the copy cannot overwrite anything: the target range stays
//! allocated until `TierMoveEnd` or, if this leader dies or stalls, until
//! the copy's release time, and the write grant expires well before that
//! (see [`grant_expiry`]); a store refuses a write under an expired grant.
//! A copy whose write may or may not have happened is not reported at all:
//! its range waits for the release time. Readers keep every replica until
//! `TierMoveEnd`, and a released one's space stays unallocated for a lease
//! TTL after.
//!
//! A store's COPY is judged like the leader's own copy: refused, or never
//! sent (nothing written: the leader then copies itself); answered with the
//! object's crc32c (done); anything else, a wrong crc32c included (unknown:
//! the range waits for its release time, which costs little and is the
//! simplest to argue). A COPY goes out once, on a connection of its own,
//! and is never sent again: a store whose deadline cut a copy short may
//! still be running it, until its write grant expires.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crescent_auth::capability::{Access, Capability, SegmentKey};
use crescent_raft::state::{MetaState, Op, SegmentId, Tier, TierMove, TierMoveId};
use crescent_raft::Response;
use crescent_store::protocol::{CopyTarget, Grant, FEATURE_COPY};
use crescent_store::{TcpTransport, TransferError};
use futures::StreamExt;

use crate::node::{now_ms, MasterMetrics, MasterNode};

/// Copies in flight at once.
const PARALLEL_COPIES: usize = 4;

/// Source segments remembered, whether their store serves COPY; more are
/// forgotten all at once (a PING each to ask again costs little).
const MAX_REMEMBERED_SEGMENTS: usize = 4096;

/// How long the answer of a store's PING is trusted: a disk segment keeps
/// its id when another process (a newer or an older binary) takes its file
/// over, so the answer is asked again now and then, and after any COPY
/// that failed.
const FEATURES_TRUSTED_FOR: Duration = Duration::from_secs(30);

/// What copies between tiers: the leader's connection pool to the stores'
/// data ports, and what it learnt of which stores copy themselves.
pub struct Copier {
    transport: Arc<TcpTransport>,
    /// Per source segment: whether its store answered a PING with
    /// [`FEATURE_COPY`], and when it answered.
    serves_copy: Mutex<HashMap<SegmentId, (bool, Instant)>>,
}

impl Copier {
    pub fn new(transport: Arc<TcpTransport>) -> Self {
        Self {
            transport,
            serves_copy: Mutex::default(),
        }
    }

    /// Whether the store serving `segment` at `endpoint` serves COPY, as a
    /// PING asked within [`FEATURES_TRUSTED_FOR`] said. A PING that fails is
    /// not remembered: the leader copies itself this time.
    async fn serves_copy(&self, segment: SegmentId, endpoint: &str) -> bool {
        if let Some(known) = self.remembered(segment) {
            return known;
        }
        match self.transport.features(endpoint).await {
            Ok(features) => {
                let serves = features & FEATURE_COPY != 0;
                let mut known = self.serves_copy.lock().expect("lock poisoned");
                if known.len() >= MAX_REMEMBERED_SEGMENTS {
                    known.clear();
                }
                known.insert(segment, (serves, Instant::now()));
                serves
            }
            Err(e) => {
                tracing::debug!(segment, endpoint, error = %e, "PING for the store's features failed");
                false
            }
        }
    }

    fn remembered(&self, segment: SegmentId) -> Option<bool> {
        let known = self.serves_copy.lock().expect("lock poisoned");
        let (serves, asked) = known.get(&segment)?;
        (asked.elapsed() < FEATURES_TRUSTED_FOR).then_some(*serves)
    }

    /// Asks `segment`'s store for its features again before the next COPY.
    fn forget(&self, segment: SegmentId) {
        self.serves_copy
            .lock()
            .expect("lock poisoned")
            .remove(&segment);
    }
}

/// How one copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyOutcome {
    /// Read, checked and written: the target range holds the object.
    Done,
    /// Nothing was written (the read failed, the bytes did not match the
    /// object's checksum, or the target refused the write): the target
    /// range can be freed now.
    NotWritten { target_failed: bool },
    /// The write may have reached the store or not: leave the range to
    /// the copy's release time.
    Unknown { target_failed: bool },
}

impl CopyOutcome {
    /// Whether the target segment is to blame: it refused or failed the
    /// write (a disk answering I/O errors, say), not the source's read.
    fn target_failed(self) -> bool {
        matches!(
            self,
            CopyOutcome::NotWritten {
                target_failed: true
            } | CopyOutcome::Unknown {
                target_failed: true
            }
        )
    }
}

/// The segment of tier `to` for an object whose source replica is on
/// `source`, among the live ones with room and not `avoided`: one of the
/// same store process (its other tier), else one on the same host (no
/// network hop for a store-local copy later), else the one with the most
/// free space.
pub fn pick_segment(
    state: &MetaState,
    to: Tier,
    source: SegmentId,
    size: u64,
    avoided: &BTreeSet<SegmentId>,
) -> Option<SegmentId> {
    let len = crescent_raft::alloc::aligned_len(size)?;
    let source = state.segments.get(&source);
    let owner = source.map(|s| s.owner.as_str());
    let host = source.map(|s| s.spec.hostname.as_str());
    let candidates = state
        .segments
        .values()
        .filter(|s| s.is_live() && s.tier == to && !avoided.contains(&s.id))
        .filter_map(|s| state.allocator(s.id).map(|a| (s, a)))
        .filter(|(_, a)| a.largest_free() >= len);
    candidates
        .max_by_key(|(s, a)| {
            (
                owner == Some(s.owner.as_str()),
                host == Some(s.spec.hostname.as_str()),
                a.free_bytes(),
            )
        })
        .map(|(s, _)| s.id)
}

/// When a copy's write grant expires: at most a third of the copy timeout
/// from now, and a third of it before the range's release time, so a
/// store's clock may run that far behind and a stalled leader's write is
/// still refused before the range can be reused.
fn grant_expiry(now: u64, d: &TierMove, timeout: Duration) -> u64 {
    let third = (timeout.as_millis() / 3) as u64;
    now.saturating_add(third)
        .min(d.release_at_ms.saturating_sub(third))
}

fn grant(
    key: &SegmentKey,
    segment_id: u64,
    offset: u64,
    len: u64,
    access: Access,
    expiry_ms: u64,
) -> Grant {
    let mac = key.sign(&Capability {
        segment_id,
        offset,
        len,
        access,
        expiry_ms,
    });
    Grant {
        segment_id,
        offset,
        len,
        expiry_ms,
        mac,
    }
}

/// Most objects copied per round; the next round takes the rest.
pub const MAX_MOVES_PER_ROUND: usize = 64;

/// Bytes read and written at a time: the leader holds at most
/// `PARALLEL_COPIES` of these, whatever the objects' sizes.
const COPY_PIECE: usize = 4 << 20;

/// What a round did.
#[derive(Debug, Default)]
pub struct Moved {
    /// Objects copied to the target tier.
    pub moved: u64,
    /// Keys whose copy could not be done (no room after all, a failed
    /// copy, a changed object). A demotion's caller evicts them as it
    /// would have without a disk tier; a promotion's leaves them on disk.
    pub failed: Vec<String>,
    /// Keys whose copy failed at its target segment, which is passed over
    /// for a while (see [`COPY_TARGET_BACKOFF`]): the object is whole
    /// where it was, and the next round may copy it elsewhere.
    ///
    /// [`COPY_TARGET_BACKOFF`]: crate::node::COPY_TARGET_BACKOFF
    pub target_failed: Vec<String>,
}

/// Moves `keys` to disk (at most [`MAX_MOVES_PER_ROUND`] of them),
/// releasing their memory replicas.
pub async fn demote(node: &Arc<MasterNode>, copier: &Arc<Copier>, keys: Vec<String>) -> Moved {
    move_to(node, copier, Tier::Disk, keys).await
}

/// Copies `keys` (only on disk) back to memory (at most
/// [`MAX_MOVES_PER_ROUND`] of them); their disk replicas stay.
pub async fn promote(node: &Arc<MasterNode>, copier: &Arc<Copier>, keys: Vec<String>) -> Moved {
    move_to(node, copier, Tier::Memory, keys).await
}

/// The counters of copies to `to`: objects, bytes, failures.
fn counters(m: &MasterMetrics, to: Tier) -> (&AtomicU64, &AtomicU64, &AtomicU64) {
    match to {
        Tier::Disk => (&m.demotions, &m.demotion_bytes, &m.demotion_failures),
        Tier::Memory => (&m.promotions, &m.promotion_bytes, &m.promotion_failures),
    }
}

async fn move_to(
    node: &Arc<MasterNode>,
    copier: &Arc<Copier>,
    to: Tier,
    keys: Vec<String>,
) -> Moved {
    let timeout = node.config().demotion_timeout;
    let mut out = Moved::default();
    let avoided = node.avoided_copy_targets();
    let items: Vec<(String, SegmentId)> = {
        let state = node.state();
        keys.into_iter()
            .filter_map(|key| {
                let target = state.objects.get(&key).and_then(|obj| {
                    let source = obj.replicas.iter().find(|r| state.live_in(r, to.other()))?;
                    pick_segment(&state, to, source.segment_id, obj.size, &avoided)
                });
                match target {
                    Some(t) => Some((key, t)),
                    None => {
                        out.failed.push(key);
                        None
                    }
                }
            })
            .collect()
    };
    if items.is_empty() {
        return out;
    }
    let started = match node
        .propose(
            None,
            Op::TierMoveStart {
                to,
                items: items.clone(),
                release_after_ms: timeout.as_millis() as u64,
            },
        )
        .await
    {
        Ok(Response::TierMoves(r)) if r.len() == items.len() => r,
        other => {
            tracing::warn!(?other, ?to, "TierMoveStart failed");
            out.failed.extend(items.into_iter().map(|(k, _)| k));
            return out;
        }
    };
    let mut moves = Vec::new();
    for ((key, _), result) in items.into_iter().zip(started) {
        match result {
            Ok(d) => moves.push(d),
            Err(e) => {
                tracing::debug!(key, ?to, error = %e, "not copied");
                out.failed.push(key);
            }
        }
    }
    let now = now_ms();
    let copies = futures::stream::iter(moves.into_iter().map(|d| {
        let node = node.clone();
        let copier = copier.clone();
        let expiry = grant_expiry(now, &d, timeout);
        async move {
            // Nothing is started once the grant has expired (the store
            // would refuse it anyway), and nothing runs past it.
            let left = Duration::from_millis(expiry.saturating_sub(now_ms()));
            let started = std::time::Instant::now();
            let outcome = if left.is_zero() {
                CopyOutcome::NotWritten {
                    target_failed: false,
                }
            } else {
                tokio::time::timeout(left, copy(&node, &copier, &d, expiry))
                    .await
                    .unwrap_or(CopyOutcome::Unknown {
                        target_failed: false,
                    })
            };
            if outcome == CopyOutcome::Done {
                node.counters().tier_copy_latency.observe(started.elapsed());
            }
            (d, outcome)
        }
    }))
    .buffer_unordered(PARALLEL_COPIES)
    .collect::<Vec<_>>()
    .await;
    let (objects, bytes, failures) = counters(node.counters(), to);
    let mut ends: Vec<(TierMoveId, bool)> = Vec::new();
    let mut ended: Vec<(String, bool)> = Vec::new();
    let mut failed_targets = BTreeSet::new();
    let mut target_failed_keys = std::collections::HashSet::new();
    for (d, outcome) in copies {
        if outcome.target_failed() {
            failed_targets.insert(d.target.segment_id);
            target_failed_keys.insert(d.key.clone());
        }
        match outcome {
            CopyOutcome::Done => {
                bytes.fetch_add(d.size, Ordering::Relaxed);
                ends.push((d.id, true));
                ended.push((d.key, true));
            }
            CopyOutcome::NotWritten { .. } => {
                failures.fetch_add(1, Ordering::Relaxed);
                ends.push((d.id, false));
                ended.push((d.key, false));
            }
            CopyOutcome::Unknown { target_failed } => {
                // Not reported: its range waits for the release time.
                failures.fetch_add(1, Ordering::Relaxed);
                if target_failed {
                    out.target_failed.push(d.key);
                } else {
                    out.failed.push(d.key);
                }
            }
        }
    }
    if node.config().unsafe_evict_on_failed_copy {
        // A failing target is blamed like any other failure.
        failed_targets.clear();
        target_failed_keys.clear();
        out.failed.append(&mut out.target_failed);
    }
    node.avoid_copy_targets(&failed_targets);
    if ends.is_empty() {
        return out;
    }
    let hold_ms = node.config().lease_ttl.as_millis() as u64;
    // A demotion frees memory; a promotion keeps the disk replica (unless
    // the test-only switch breaks that guarantee).
    let release_source = match to {
        Tier::Disk => true,
        Tier::Memory => node.config().unsafe_exclusive_promotion,
    };
    // Released replicas are held a lease TTL from the entry's time stamp;
    // a lease granted between the stamp and the apply would outlast that,
    // so the copied keys are doomed (lookups wait) until the entry settles.
    let doomed: Vec<String> = if release_source {
        ended
            .iter()
            .filter(|(_, copied)| *copied)
            .map(|(k, _)| k.clone())
            .collect()
    } else {
        Vec::new()
    };
    node.doom(&doomed);
    match node
        .propose_settled(
            None,
            Op::TierMoveEnd {
                items: ends.clone(),
                release_source,
                hold_ms,
            },
            move |node, _| node.undoom(&doomed),
        )
        .await
    {
        Ok(Response::Items(results)) if results.len() == ended.len() => {
            for ((key, copied), r) in ended.into_iter().zip(results) {
                if copied && r.is_ok() {
                    out.moved += 1;
                } else if !copied && target_failed_keys.contains(&key) {
                    out.target_failed.push(key);
                } else {
                    out.failed.push(key);
                }
            }
        }
        other => {
            // The entry may still commit; if not, the ranges wait for their
            // release time. Either way the next round looks again.
            tracing::warn!(?other, ?to, "TierMoveEnd failed");
        }
    }
    objects.fetch_add(out.moved, Ordering::Relaxed);
    out
}

/// Copies `d`'s source replica to its target range under grants expiring
/// at `expiry`, checking the whole object's crc32c: by one COPY to the
/// store when it holds both segments and serves COPY, else through this
/// leader.
async fn copy(node: &MasterNode, copier: &Copier, d: &TierMove, expiry: u64) -> CopyOutcome {
    let (source, target, same_store) = {
        let state = node.state();
        let seg = |id: SegmentId| {
            let s = state.segments.get(&id)?;
            Some((s.spec.endpoint.clone(), SegmentKey::from_slice(&s.key.0)?))
        };
        let owner = |id: SegmentId| state.segments.get(&id).map(|s| s.owner.clone());
        (
            seg(d.source.segment_id),
            seg(d.target.segment_id),
            owner(d.source.segment_id) == owner(d.target.segment_id),
        )
    };
    let (Some((src_endpoint, src_key)), Some((dst_endpoint, dst_key))) = (source, target) else {
        return CopyOutcome::NotWritten {
            target_failed: false,
        };
    };
    let read_grant = grant(
        &src_key,
        d.source.segment_id,
        d.source.offset,
        d.size,
        Access::Read,
        expiry,
    );
    let write_grant = grant(
        &dst_key,
        d.target.segment_id,
        d.target.offset,
        d.size,
        Access::Write,
        expiry,
    );
    if same_store
        && node.config().tier_copy_on_store
        && copier.serves_copy(d.source.segment_id, &src_endpoint).await
    {
        let target = CopyTarget {
            offset: d.target.offset,
            grant: write_grant,
        };
        let copied = copier
            .transport
            .copy(&src_endpoint, read_grant, d.source.offset, d.size, target)
            .await;
        match copied {
            Ok(crc) if crc == d.checksum => {
                node.counters()
                    .tier_copies_on_store
                    .fetch_add(1, Ordering::Relaxed);
                return CopyOutcome::Done;
            }
            Ok(_) => {
                tracing::warn!(
                    key = d.key,
                    "a store copied bytes between its tiers that do not match the object's checksum; not copied"
                );
                // Answered, so every write is done; but see the module
                // comment: the range waits for its release time.
                return CopyOutcome::Unknown {
                    target_failed: false,
                };
            }
            // Refused before a byte was written, or never sent: copy here.
            Err(
                e @ (TransferError::Refused { .. }
                | TransferError::Connect { .. }
                | TransferError::Tls { .. }),
            ) => {
                tracing::debug!(key = d.key, error = %e, "store did not copy between its tiers; the leader copies");
            }
            Err(e) => {
                // Perhaps a store that no longer serves COPY (an older
                // binary took the segment over): ask before the next one.
                copier.forget(d.source.segment_id);
                tracing::debug!(key = d.key, error = %e, "copy on the store failed");
                return CopyOutcome::Unknown {
                    target_failed: true,
                };
            }
        }
    }
    let transport = &copier.transport;
    let piece_len = usize::try_from(d.size).map_or(COPY_PIECE, |s| s.min(COPY_PIECE));
    let mut buf = vec![0u8; piece_len];
    let mut crc = 0u32;
    let mut done = 0u64;
    while done < d.size {
        let n = (d.size - done).min(COPY_PIECE as u64) as usize;
        let piece = &mut buf[..n];
        // One retry on a fresh connection: a pooled one to a store that
        // restarted since fails at once, the store and the object being fine.
        let mut read = Ok(());
        for attempt in 0..2 {
            let mut reads = [(read_grant, d.source.offset + done, &mut piece[..])];
            read = transport.read(&src_endpoint, &mut reads).await;
            if read.is_ok() {
                break;
            }
            transport.forget(&src_endpoint);
            tracing::debug!(
                key = d.key,
                attempt,
                "tier copy read failed; retrying on a new connection"
            );
        }
        if let Err(e) = read {
            // Every write so far was answered: none is in flight.
            tracing::debug!(key = d.key, error = %e, "tier copy read failed");
            return CopyOutcome::NotWritten {
                target_failed: false,
            };
        }
        crc = crc32c::crc32c_append(crc, piece);
        // Also one retry on a fresh connection: writing the same bytes to
        // the same range twice is harmless, and the range stays this
        // demotion's until its end.
        let mut written = Ok(());
        for _ in 0..2 {
            written = transport
                .write(
                    &dst_endpoint,
                    &[(write_grant, d.target.offset + done, &piece[..])],
                )
                .await;
            if written.is_ok() || matches!(written, Err(TransferError::Refused { .. })) {
                break;
            }
            transport.forget(&dst_endpoint);
        }
        match written {
            Ok(()) => {}
            // Nothing reached the store, or it answered with a refusal: no
            // write is in flight.
            Err(
                e @ (TransferError::Connect { .. }
                | TransferError::Refused { .. }
                | TransferError::Tls { .. }),
            ) => {
                tracing::debug!(key = d.key, error = %e, "tier copy write refused");
                return CopyOutcome::NotWritten {
                    target_failed: true,
                };
            }
            Err(e) => {
                tracing::debug!(key = d.key, error = %e, "tier copy write failed");
                return CopyOutcome::Unknown {
                    target_failed: true,
                };
            }
        }
        done += n as u64;
    }
    if crc != d.checksum {
        tracing::warn!(
            key = d.key,
            "copy between tiers read bytes that do not match the object's checksum; not copied"
        );
        return CopyOutcome::NotWritten {
            target_failed: false,
        };
    }
    CopyOutcome::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_grant_expires_a_third_of_the_timeout_before_the_release() {
        let d = TierMove {
            id: 1,
            to: Tier::Disk,
            key: "k".into(),
            created_ms: 0,
            put_id: 0,
            checksum: 0,
            size: 1,
            source: crescent_raft::state::Replica {
                segment_id: 1,
                offset: 0,
                len: 1,
            },
            target: crescent_raft::state::Replica {
                segment_id: 2,
                offset: 0,
                len: 1,
            },
            release_at_ms: 60_000,
        };
        let t = Duration::from_secs(60);
        assert_eq!(grant_expiry(0, &d, t), 20_000);
        assert_eq!(
            grant_expiry(30_000, &d, t),
            40_000,
            "late start: bounded by the release"
        );
        assert_eq!(grant_expiry(70_000, &d, t), 40_000);
    }
}
