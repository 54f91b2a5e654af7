//! The counters a master exposes at `/metrics`.

use super::*;

/// Counters the master exposes at `/metrics` (names follow Mooncake's).
#[derive(Default)]
pub struct MasterMetrics {
    pub put_start_requests: AtomicU64,
    pub put_end_requests: AtomicU64,
    pub get_replica_list_requests: AtomicU64,
    pub exist_requests: AtomicU64,
    pub remove_requests: AtomicU64,
    pub mount_requests: AtomicU64,
    pub heartbeat_requests: AtomicU64,
    pub leader_changes: AtomicU64,
    pub eviction_rounds: AtomicU64,
    /// Requests refused by a per-client quota, by quota.
    pub quota_rejections_objects: AtomicU64,
    pub quota_rejections_unfinished_puts: AtomicU64,
    pub quota_rejections_key_bytes: AtomicU64,
    pub quota_rejections_segments: AtomicU64,
    /// Reads answered under the leader lease, and reads that needed a
    /// quorum round (read-index mode, or the lease did not hold).
    pub lease_reads: AtomicU64,
    pub read_index_reads: AtomicU64,
    /// One-commit puts: placed without a commit, asked and fell back, and
    /// the reservations they live in.
    pub one_commit_placements: AtomicU64,
    pub two_commit_fallbacks: AtomicU64,
    /// Of the one-commit placements, those made ahead of their put (asked
    /// for in a PutEnd), and those given back unused.
    pub placements_ahead: AtomicU64,
    pub placements_ahead_given_back: AtomicU64,
    /// Puts placed on disk because memory had no room (see
    /// `MetaState::put_start_one`).
    pub puts_to_disk: AtomicU64,
    pub reservations_made: AtomicU64,
    pub reservations_retired: AtomicU64,
    /// Objects moved from memory to disk, bytes copied, copies that failed,
    /// and objects dropped from disk at the disk watermark.
    pub demotions: AtomicU64,
    pub demotion_bytes: AtomicU64,
    pub demotion_failures: AtomicU64,
    pub disk_evictions: AtomicU64,
    /// Objects copied from disk back to memory, bytes copied, copies that
    /// failed, and promoted objects whose memory copy eviction released.
    pub promotions: AtomicU64,
    pub promotion_bytes: AtomicU64,
    pub promotion_failures: AtomicU64,
    pub memory_copies_dropped: AtomicU64,
    /// Promoted objects whose disk copy the disk watermark released.
    pub disk_copies_dropped: AtomicU64,
    /// Copies between tiers a store made between its own segments (COPY),
    /// counted when the copy is done, before its `TierMoveEnd` commits (so
    /// it may exceed the demotions and promotions above); the rest went
    /// through the leader.
    pub tier_copies_on_store: AtomicU64,
    /// Time of one object's copy between tiers that was done (by a store
    /// or by the leader), from its start to its last byte checked.
    pub tier_copy_latency: crescent_proto::metrics::Histogram,
    pub proposal_latency: crescent_proto::metrics::Histogram,
    pub read_index_latency: crescent_proto::metrics::Histogram,
}
