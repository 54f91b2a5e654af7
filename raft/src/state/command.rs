//! What a log entry asks of the state: the command, its origin (for
//! deduplication) and its operation.

use super::*;
use crate::tagged::tagged_enum;

/// One Raft log entry's application payload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// The leader's clock (Unix ms, `crescent_store::clock::now_ms`) when it
    /// proposed this entry.
    pub now_ms: u64,
    /// Leader-drawn randomness (replica placement).
    pub seed: u64,
    /// Set for client requests: a retry with the same origin is applied once.
    pub origin: Option<Origin>,
    pub op: Op,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub client_id: String,
    pub seq: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ReplicateConfig {
    pub replica_num: u32,
    pub soft_pin: bool,
    pub hard_pin: bool,
    pub preferred_segments: Vec<String>,
}

/// The leader's put timeouts, carried in the entry so every master applies the same rules
/// even if their flags differ.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PutPolicy {
    /// A PutStart without PutEnd for this long may be taken over by another PutStart.
    pub discard_after_ms: u64,
    /// ... and its space is freed this long after it started.
    pub release_after_ms: u64,
    pub soft_pin_ttl_ms: u64,
}

tagged_enum! {
    /// What one log entry does to the state. Each variant's tag is fixed
    /// (see [`crate::tagged`]): add variants with new tags, never reuse one.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Op {
        /// Committed placements of puts (key, size, the writer's put id): the
        /// leader's fallback when it cannot place for one commit (disk tier,
        /// an item larger than a reservation, no lease yet). An end or revoke
        /// applies only to the put it names (id 0, as Mooncake's clients send:
        /// any unfinished put of the writer).
        PutStart = 1 {
            items: Vec<(String, u64, PutId)>,
            config: ReplicateConfig,
            policy: PutPolicy,
        },
        PutEnd = 2 {
            items: Vec<(String, u32, PutId)>,
        },
        PutRevoke = 3 {
            items: Vec<(String, PutId)>,
        },
        /// The one commit of puts placed inside reservations: each records the
        /// placement and the finished object together, if every replica's range
        /// is still free in a reservation of its segment and the placement's
        /// deadline has not passed. An item with no replicas is the PutEnd of a
        /// put whose start was committed (a batch may hold both kinds).
        PutCommit = 4 {
            items: Vec<CommitItem>,
            config: ReplicateConfig,
            policy: PutPolicy,
        },
        /// Reserves `len` bytes of a live segment for the leader of `term`, which
        /// then places puts inside it without a commit each (one commit per put;
        /// docs/one-commit-puts.md). Answered with the reservation's id and offset.
        Reserve = 5 {
            segment_id: SegmentId,
            len: u64,
            term: u64,
        },
        /// Returns what reservations still hold free to their segments. The
        /// leader proposes it for its own reservations once no placement in them
        /// is in flight, and for an earlier term's once no writer placed by that
        /// term's leader can still be writing (`--put-start-release-timeout`).
        RetireReservations = 6 {
            ids: Vec<ReservationId>,
        },
        /// Proposed by a new leader when it takes over: the entry's time bounds
        /// when every earlier term's placements were made (each earlier leader
        /// placed only under a lease that ended before this term's election),
        /// so their reservations may be retired a release timeout later.
        LeaderStart = 7 {
            term: u64,
        },
        /// Removes finished objects; a put in flight is refused, forced or not.
        Remove = 8 {
            keys: Vec<String>,
            force: bool,
            /// Keys the leader could not rule out being under a read lease when it
            /// proposed (leases are leader memory): answered OBJECT_HAS_LEASE
            /// unless forced. The verdict travels in the entry, not in a reply
            /// sent before proposing, so a retry of the same request gets the
            /// first attempt's answer from the dedup table whichever leader
            /// judged it.
            leased: BTreeSet<String>,
            /// How long a removed object's space stays unallocated (the leader's
            /// lease TTL): a reader leased before the removal may still be
            /// reading, and must find the old bytes, not the next put's.
            hold_ms: u64,
        },
        /// Chosen by the leader's eviction policy: drops each key's object if
        /// it is still the one chosen (same stamp) and still evictable. A key
        /// removed and put again after the choice names another object, which
        /// stays: the choice was made before that put was acknowledged.
        EvictObjects = 9 {
            items: Vec<(String, ObjectStamp)>,
        },
        /// Frees space of abandoned puts whose release deadline has passed.
        ReclaimStalePuts = 10 {},
        /// Mounts a segment of a tier with the key the store chose for it
        /// (masters sign its data-plane grants with it; a re-mount by its owner
        /// must carry the same key). A disk segment carries the identity
        /// written in its file's header, and a store restarted on that file
        /// (same name, same identity, same capacity) takes the segment over with
        /// its objects, whoever mounted it before.
        MountSegment = 11 {
            spec: SegmentSpec,
            owner: String,
            key: SegmentKeyBytes,
            tier: Tier,
            disk_id: String,
        },
        UnmountSegment = 12 {
            segment_id: SegmentId,
        },
        /// The leader saw no heartbeat from this client for client-ttl.
        UnmountClient = 13 {
            client_id: String,
        },
        /// Starts copying objects to tier `to` (key, target segment of that
        /// tier): a demotion (to disk, from a memory replica) or a promotion (to
        /// memory, from a disk replica). Allocates each its target range, held
        /// until `TierMoveEnd` or, if that never comes, until
        /// `release_after_ms` (the copier may still be writing until then).
        TierMoveStart = 14 {
            to: Tier,
            items: Vec<(String, SegmentId)>,
            release_after_ms: u64,
        },
        /// Finishes copies (id, whether the bytes were copied and checked): the
        /// target range becomes a replica of the object. With `release_source`
        /// the object's replicas in the tier it was copied from are released,
        /// their space unallocated for `hold_ms` (readers holding a lease may
        /// still be reading it): a demotion frees memory. Without, they stay: a
        /// promotion keeps the disk replica, so reading an object never makes
        /// a store restart lose it. An object removed or replaced meanwhile
        /// keeps nothing; the target range is freed.
        TierMoveEnd = 15 {
            items: Vec<(TierMoveId, bool)>,
            release_source: bool,
            hold_ms: u64,
        },
        /// Releases the memory replicas of objects that also have a replica on
        /// a disk segment, live or expired (memory eviction of a promoted
        /// object: nothing to copy; an expired disk segment comes back with
        /// its store's restart), their space unallocated for `hold_ms`. Other
        /// keys are left as they are.
        DropMemoryCopies = 16 {
            keys: Vec<String>,
            hold_ms: u64,
        },
        /// Releases the disk replicas of objects that also have a replica on a
        /// live memory segment (disk eviction of a promoted object: it stays
        /// readable from memory, and only loses its survival of a store
        /// restart), their space unallocated for `hold_ms`. Other keys (only
        /// on disk, being copied, unfinished) are left as they are.
        DropDiskCopies = 17 {
            keys: Vec<String>,
            hold_ms: u64,
        },
    }
}

/// One put of a [`Op::PutCommit`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CommitItem {
    pub key: String,
    pub size: u64,
    pub checksum: u32,
    pub put_id: PutId,
    pub replicas: Vec<Replica>,
    /// The placement's write grants expire then (leader clock): a commit
    /// applied later is refused, because the leader that placed it may have
    /// handed the range to another put by then.
    pub deadline_ms: u64,
}

/// A writer's name for one of its puts; 0 means unnamed.
pub type PutId = u64;

/// Term starts kept (the latest): a reservation older than all of them is
/// judged by the earliest kept, which is later than its real bound, so
/// forgetting errs on the side of waiting.
pub const TERM_STARTS_KEPT: usize = 64;
