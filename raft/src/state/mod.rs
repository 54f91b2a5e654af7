//! The replicated metadata state machine: pure and deterministic.
//!
//! [`MetaState::apply`] reads no clock and draws no randomness: the leader
//! stamps every [`Command`] with its clock (Unix ms that wall-clock steps do
//! not move, `crescent_store::clock`) and a random seed, and
//! every master applies the same commands to the same state with the same
//! result. Leader-only knowledge (read leases, heartbeats, access times) is
//! deliberately absent: it lives in the master's memory and reaches this state
//! only as explicit commands (`EvictObjects`, `UnmountClient`, `ReclaimStalePuts`).

use std::collections::{BTreeMap, BTreeSet};

use crescent_proto::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::alloc::Allocator;

mod command;
mod error;
mod object;
mod put;
mod remove;
mod segment;
mod tier;
mod usage;

pub use command::*;
pub use error::*;
pub use object::*;
pub use put::*;
pub use segment::*;
pub use tier::*;

/// Results kept per client for deduplicating retried writes.
pub const DEDUP_RESULTS_PER_CLIENT: usize = 64;

/// How far past its latest recorded request a known client's sequence
/// number may jump: a client numbers its requests one by one, so even a
/// million in flight at once stays within it.
pub const MAX_SEQ_AHEAD: u64 = 1 << 20;
/// A client that sent no write for this long loses its dedup table.
pub const DEDUP_CLIENT_TTL_MS: u64 = 60 * 60 * 1000;
const DEDUP_GC_INTERVAL_MS: u64 = 60 * 1000;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ClientRequests {
    pub last_seen_ms: u64,
    /// Sequence numbers below this were dropped from `results`.
    pub trimmed_below: u64,
    pub results: BTreeMap<u64, Response>,
}

/// All replicated metadata.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct MetaState {
    /// Monotonic max of the leader timestamps applied so far.
    pub clock_ms: u64,
    pub objects: BTreeMap<String, Object>,
    pub segments: BTreeMap<SegmentId, Segment>,
    pub next_segment_id: SegmentId,
    pub pending_release: Vec<PendingRelease>,
    pub dedup: BTreeMap<String, ClientRequests>,
    next_dedup_gc_ms: u64,
    /// PutStarts that found no space; the leader evicts when this grows.
    pub alloc_failures: u64,
    pub evicted_total: u64,
    /// Leaders' reservations for puts placed without a commit.
    pub reservations: BTreeMap<ReservationId, Reservation>,
    pub next_reservation_id: ReservationId,
    /// Term -> the time of its leader's first `LeaderStart` entry.
    pub term_starts: BTreeMap<u64, u64>,
    /// Copies between tiers in flight.
    pub tier_moves: BTreeMap<TierMoveId, TierMove>,
    pub next_tier_move_id: TierMoveId,
    pub demoted_total: u64,
    pub promoted_total: u64,
    /// Derived from `objects`, `pending_release` and `reservations`; rebuilt after a snapshot install.
    #[serde(skip)]
    allocators: BTreeMap<SegmentId, Allocator>,
    /// Derived from `objects`; rebuilt with the allocators.
    #[serde(skip)]
    usage: BTreeMap<String, WriterUsage>,
}

#[derive(Debug, thiserror::Error)]
#[error("snapshot is inconsistent: {0}")]
pub struct CorruptState(String);

impl MetaState {
    pub fn new() -> Self {
        Self {
            next_segment_id: 1,
            ..Default::default()
        }
    }

    /// Rebuilds what is derived from the objects (the allocators and the
    /// per-writer usage); needed after deserializing.
    pub fn rebuild_derived(&mut self) -> Result<(), CorruptState> {
        self.usage.clear();
        for (key, obj) in &self.objects {
            count_in(&mut self.usage, key, obj);
        }
        self.allocators = self
            .segments
            .values()
            .map(|s| (s.id, Allocator::new(s.spec.capacity)))
            .collect();
        let reserved: Vec<Replica> = self
            .reservations
            .values()
            .flat_map(|res| {
                res.free.iter().map(|(&offset, &len)| Replica {
                    segment_id: res.segment_id,
                    offset,
                    len,
                })
            })
            .collect();
        let held = self
            .objects
            .values()
            .flat_map(|o| o.replicas.iter())
            .chain(self.pending_release.iter().map(|p| &p.replica))
            .chain(self.tier_moves.values().map(|d| &d.target))
            .chain(reserved.iter());
        for r in held {
            let alloc = self.allocators.get_mut(&r.segment_id).ok_or_else(|| {
                CorruptState(format!("replica on unknown segment {}", r.segment_id))
            })?;
            if !alloc.reserve(r.offset, r.len) {
                return Err(CorruptState(format!(
                    "overlapping replica at segment {} offset {}",
                    r.segment_id, r.offset
                )));
            }
        }
        Ok(())
    }

    /// When a term after `term` started (its leader's first entry): every
    /// placement of `term`'s leader was made before then.
    pub fn later_term_started_ms(&self, term: u64) -> Option<u64> {
        self.term_starts
            .range(term.saturating_add(1)..)
            .next()
            .map(|(_, ms)| *ms)
    }

    /// Applies one command. Deterministic: same state + same command = same result.
    pub fn apply(&mut self, cmd: &Command) -> Response {
        self.clock_ms = self.clock_ms.max(cmd.now_ms);
        let now = self.clock_ms;

        if let Some(origin) = &cmd.origin {
            if let Some(prev) = self.dedup.get(&origin.client_id) {
                if let Some(resp) = prev.results.get(&origin.seq) {
                    return resp.clone();
                }
                if origin.seq < prev.trimmed_below {
                    return Response::Rejected(MetaError::InvalidParams(format!(
                        "request {} of client {} is older than the deduplication window; not applied",
                        origin.seq, origin.client_id
                    )));
                }
                // A sequence number far ahead would push the window past the
                // client's real requests, which would then all be refused as
                // too old. Not recorded, so it moves nothing.
                let highest = prev
                    .results
                    .last_key_value()
                    .map_or(0, |(seq, _)| *seq)
                    .max(prev.trimmed_below);
                if origin.seq > highest.saturating_add(MAX_SEQ_AHEAD) {
                    return Response::Rejected(MetaError::InvalidParams(format!(
                        "request {} of client {} is more than {MAX_SEQ_AHEAD} ahead of its latest ({highest}); not applied",
                        origin.seq, origin.client_id
                    )));
                }
            }
        }

        let writer = cmd.origin.as_ref().map(|o| o.client_id.as_str());
        let resp = match &cmd.op {
            Op::PutStart {
                items,
                config,
                policy,
            } => self.put_start(now, cmd.seed, writer, items, config, policy),
            Op::PutEnd { items } => Response::Items(
                items
                    .iter()
                    .map(|(k, crc, id)| self.put_end(now, writer, k, *crc, *id))
                    .collect(),
            ),
            Op::PutRevoke { items } => Response::Items(
                items
                    .iter()
                    .map(|(k, id)| self.put_revoke(now, writer, k, *id))
                    .collect(),
            ),
            Op::PutCommit {
                items,
                config,
                policy,
            } => Response::Items(
                items
                    .iter()
                    .map(|item| self.put_commit(now, writer, item, config, policy))
                    .collect(),
            ),
            Op::Reserve {
                segment_id,
                len,
                term,
            } => Response::Reserved(self.reserve(now, *segment_id, *len, *term)),
            Op::RetireReservations { ids } => Response::Count(self.retire_reservations(ids)),
            Op::LeaderStart { term } => {
                self.term_starts.entry(*term).or_insert(now);
                while self.term_starts.len() > TERM_STARTS_KEPT {
                    self.term_starts.pop_first();
                }
                Response::Empty
            }
            Op::Remove {
                keys,
                force,
                leased,
                hold_ms,
            } => self.remove_keys(now, keys, *force, leased, *hold_ms),
            Op::EvictObjects { items } => {
                Response::Count(self.evict(items.iter().map(|(k, stamp)| (k, stamp))))
            }
            Op::ReclaimStalePuts {} => Response::Count(self.reclaim(now)),
            Op::MountSegment {
                spec,
                owner,
                key,
                tier,
                disk_id,
            } => Response::Mounted(self.mount_tiered(now, spec, owner, key, *tier, disk_id)),
            Op::UnmountSegment { segment_id } => Response::Done(self.unmount(*segment_id)),
            Op::UnmountClient { client_id } => {
                // Expire, not unmount: see `Segment::expired_ms`.
                let mut n = 0;
                for s in self.segments.values_mut() {
                    if &s.owner == client_id && s.expired_ms.is_none() {
                        s.expired_ms = Some(now);
                        n += 1;
                    }
                }
                Response::Count(n)
            }
            Op::TierMoveStart {
                to,
                items,
                release_after_ms,
            } => self.tier_moves_start(now, items, *to, *release_after_ms),
            Op::TierMoveEnd {
                items,
                release_source,
                hold_ms,
            } => self.tier_moves_end(now, items, *release_source, *hold_ms),
            Op::DropMemoryCopies { keys, hold_ms } => {
                let hold_until = now.saturating_add(*hold_ms);
                Response::Count(
                    keys.iter()
                        .filter(|k| self.drop_copies_in(now, k, Tier::Memory, hold_until))
                        .count() as u64,
                )
            }
            Op::DropDiskCopies { keys, hold_ms } => {
                let hold_until = now.saturating_add(*hold_ms);
                Response::Count(
                    keys.iter()
                        .filter(|k| self.drop_copies_in(now, k, Tier::Disk, hold_until))
                        .count() as u64,
                )
            }
        };

        if let Some(origin) = &cmd.origin {
            let entry = self.dedup.entry(origin.client_id.clone()).or_default();
            entry.last_seen_ms = now;
            entry.results.insert(origin.seq, resp.clone());
            while entry.results.len() > DEDUP_RESULTS_PER_CLIENT {
                if let Some((seq, _)) = entry.results.pop_first() {
                    entry.trimmed_below = entry.trimmed_below.max(seq + 1);
                }
            }
        }
        if now >= self.next_dedup_gc_ms {
            let horizon = now.saturating_sub(DEDUP_CLIENT_TTL_MS);
            self.dedup.retain(|_, c| c.last_seen_ms >= horizon);
            self.next_dedup_gc_ms = now + DEDUP_GC_INTERVAL_MS;
        }
        resp
    }
}
