//! The replicated metadata state machine: pure and deterministic.
//!
//! [`MetaState::apply`] reads no clock and draws no randomness: the leader
//! stamps every [`Command`] with its clock (Unix ms that wall-clock steps do
//! not move, `crescent_store::clock`) and a random seed, and
//! every master applies the same commands to the same state with the same
//! result. Leader-only knowledge (read leases, heartbeats, access times) is
//! deliberately absent: it lives in the master's memory and reaches this state
//! only as explicit commands (`Evict`, `UnmountClient`, `ReclaimStalePuts`).

use std::collections::{BTreeMap, BTreeSet};

use crescent_proto::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::alloc::Allocator;

pub type SegmentId = u64;

/// Results kept per client for deduplicating retried writes.
pub const DEDUP_RESULTS_PER_CLIENT: usize = 64;

/// How far past its latest recorded request a known client's sequence
/// number may jump: a client numbers its requests one by one, so even a
/// million in flight at once stays within it.
pub const MAX_SEQ_AHEAD: u64 = 1 << 20;
/// A client that sent no write for this long loses its dedup table.
pub const DEDUP_CLIENT_TTL_MS: u64 = 60 * 60 * 1000;
const DEDUP_GC_INTERVAL_MS: u64 = 60 * 1000;

/// How long past its write grants' expiry (the put's discard time) the
/// range of a put that ended uncommitted stays out of use: a store honours
/// a grant until its own clock passes the expiry plus its
/// `--grant-clock-skew` (at most [`crescent_proto::MAX_GRANT_CLOCK_SKEW_MS`]),
/// and its clock may lag the masters' by as much again. A timed-out or
/// failed transfer does not mean the store stopped writing (bytes queued in
/// a kernel, or retransmitted after a partition heals, still arrive), so a
/// revoke frees nothing before then.
pub const WRITE_FENCE_MARGIN_MS: u64 = 2 * crescent_proto::MAX_GRANT_CLOCK_SKEW_MS;

/// When the range of a put that ended uncommitted may be placed again: its
/// discard time (its write grants' expiry) plus [`WRITE_FENCE_MARGIN_MS`],
/// never later than its release time, which already bounds any writer.
/// The state machine's revokes and the leader's placer both use it.
pub fn write_fence_until(discard_at_ms: u64, release_at_ms: u64) -> u64 {
    discard_at_ms
        .saturating_add(WRITE_FENCE_MARGIN_MS)
        .min(release_at_ms)
}

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

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct SegmentSpec {
    pub name: String,
    pub endpoint: String,
    pub capacity: u64,
    pub hostname: String,
    /// A memory segment's shared-memory file; for a disk segment,
    /// [`DISK_FILE_PREFIX`] and its file, or empty (see there).
    pub shm_path: String,
}

/// What a disk segment's `shm_path` starts with when its store lets
/// same-host clients read the file (`--shm`). The path is kept in the
/// same field, so the replicated state's encoding is unchanged; the prefix
/// makes it a path no client opens as shared memory: a master from before
/// the same-host disk reads lists it as a shared-memory path, and a client
/// from before then fails to map it and reads over TCP (mapping the disk
/// file as shared memory would read and write it 4 KiB off, past its header).
pub const DISK_FILE_PREFIX: &str = "disk-file:";

impl SegmentSpec {
    /// The segment's shared-memory file, or "" (a disk segment has none).
    pub fn shm_file(&self) -> &str {
        if self.shm_path.starts_with(DISK_FILE_PREFIX) {
            ""
        } else {
            &self.shm_path
        }
    }

    /// A disk segment's file that same-host clients may read, or "".
    pub fn disk_file(&self) -> &str {
        self.shm_path.strip_prefix(DISK_FILE_PREFIX).unwrap_or("")
    }

    /// Records a disk segment's file for [`disk_file`](Self::disk_file).
    pub fn set_disk_file(&mut self, path: &str) {
        self.shm_path = format!("{DISK_FILE_PREFIX}{path}");
    }
}

/// Which tier a segment is: memory, or a disk file that survives its
/// store's restart. A replica's tier is its segment's.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Tier {
    #[default]
    Memory,
    Disk,
}

impl Tier {
    /// The tier a copy to `self` comes from.
    pub fn other(self) -> Tier {
        match self {
            Tier::Memory => Tier::Disk,
            Tier::Disk => Tier::Memory,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    PutStart {
        items: Vec<(String, u64)>,
        config: ReplicateConfig,
        policy: PutPolicy,
    },
    PutEnd {
        items: Vec<(String, u32)>,
    },
    PutRevoke {
        keys: Vec<String>,
    },
    /// The Remove of logs written before lease verdicts were replicated
    /// (bincode encodes the variant's position, so it keeps this one):
    /// applied as it was then, space freed at once. Never proposed now.
    LegacyRemove {
        keys: Vec<String>,
        force: bool,
    },
    /// Eviction from logs written before `EvictObjects` (bincode encodes
    /// the variant's position, so it keeps this one): drops whatever object
    /// each key names when applied, a later put of the key included. Never
    /// proposed now.
    Evict {
        keys: Vec<String>,
    },
    MountSegment {
        spec: SegmentSpec,
        owner: String,
    },
    UnmountSegment {
        segment_id: SegmentId,
    },
    /// The leader saw no heartbeat from this client for client-ttl.
    UnmountClient {
        client_id: String,
    },
    /// Frees space of abandoned puts whose release deadline has passed.
    ReclaimStalePuts,
    /// The Remove of logs written before a forced remove left puts in
    /// flight alone (bincode encodes the variant's position, so it keeps
    /// this one): applied as it was then, taking unfinished puts when
    /// forced. Never proposed now.
    RemoveTakingUnfinished {
        keys: Vec<String>,
        force: bool,
        leased: BTreeSet<String>,
        hold_ms: u64,
    },
    /// PutStart, PutEnd and PutRevoke with the writer's put id (key, size or
    /// checksum, put id): an end or revoke applies only to the put it names,
    /// never to a later put of the key by the same client (id 0: unnamed,
    /// any of the writer's, as the variants above, kept at their bincode
    /// positions so older logs decode, always were).
    PutStartNamed {
        items: Vec<(String, u64, PutId)>,
        config: ReplicateConfig,
        policy: PutPolicy,
    },
    PutEndNamed {
        items: Vec<(String, u32, PutId)>,
    },
    PutRevokeNamed {
        items: Vec<(String, PutId)>,
    },
    /// MountSegment with the key the store chose for the segment (masters
    /// sign its data-plane grants with it). A re-mount of an existing
    /// segment by its owner must carry the same key. `MountSegment` above
    /// stays for older logs: it mounts with no key (nothing is granted on
    /// such a segment until its store re-mounts with one).
    MountSegmentKeyed {
        spec: SegmentSpec,
        owner: String,
        key: SegmentKeyBytes,
    },
    /// Reserves `len` bytes of a live segment for the leader of `term`, which
    /// then places puts inside it without a commit each (one commit per put;
    /// docs/one-commit-puts.md). Answered with the reservation's id and offset.
    Reserve {
        segment_id: SegmentId,
        len: u64,
        term: u64,
    },
    /// Returns what reservations still hold free to their segments. The
    /// leader proposes it for its own reservations once no placement in them
    /// is in flight, and for an earlier term's once no writer placed by that
    /// term's leader can still be writing (`--put-start-release-timeout`).
    RetireReservations {
        ids: Vec<ReservationId>,
    },
    /// The one commit of puts placed inside reservations: each records the
    /// placement and the finished object together, if every replica's range
    /// is still free in a reservation of its segment and the placement's
    /// deadline has not passed. An item with no replicas is the PutEnd of a
    /// put whose start was committed (a batch may hold both kinds).
    PutCommit {
        items: Vec<CommitItem>,
        config: ReplicateConfig,
        policy: PutPolicy,
    },
    /// Proposed by a new leader when it takes over: the entry's time bounds
    /// when every earlier term's placements were made (each earlier leader
    /// placed only under a lease that ended before this term's election),
    /// so their reservations may be retired a release timeout later.
    LeaderStart {
        term: u64,
    },
    /// MountSegmentKeyed for a tier: a disk segment carries the identity
    /// written in its file's header, and a store restarted on that file
    /// (same name, same identity, same capacity) takes the segment over with
    /// its objects, whoever mounted it before.
    MountTieredSegment {
        spec: SegmentSpec,
        owner: String,
        key: SegmentKeyBytes,
        tier: Tier,
        disk_id: String,
    },
    /// A demotion's start from logs written before promotion existed
    /// (bincode encodes the variant's position, so it keeps this one):
    /// applied as `TierMoveStart` to disk. Never proposed now.
    DemoteStart {
        items: Vec<(String, SegmentId)>,
        release_after_ms: u64,
    },
    /// Likewise `TierMoveEnd` of a demotion (memory released). Never
    /// proposed now.
    DemoteEnd {
        items: Vec<(TierMoveId, bool)>,
        hold_ms: u64,
    },
    /// Starts copying objects to tier `to` (key, target segment of that
    /// tier): a demotion (to disk, from a memory replica) or a promotion (to
    /// memory, from a disk replica). Allocates each its target range, held
    /// until `TierMoveEnd` or, if that never comes, until
    /// `release_after_ms` (the copier may still be writing until then).
    TierMoveStart {
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
    TierMoveEnd {
        items: Vec<(TierMoveId, bool)>,
        release_source: bool,
        hold_ms: u64,
    },
    /// Releases the memory replicas of objects that also have a replica on
    /// a disk segment, live or expired (memory eviction of a promoted
    /// object: nothing to copy; an expired disk segment comes back with
    /// its store's restart), their space unallocated for `hold_ms`. Other
    /// keys are left as they are.
    DropMemoryCopies {
        keys: Vec<String>,
        hold_ms: u64,
    },
    /// Releases the disk replicas of objects that also have a replica on a
    /// live memory segment (disk eviction of a promoted object: it stays
    /// readable from memory, and only loses its survival of a store
    /// restart), their space unallocated for `hold_ms`. Other keys (only
    /// on disk, being copied, unfinished) are left as they are.
    DropDiskCopies {
        keys: Vec<String>,
        hold_ms: u64,
    },
    /// Chosen by the leader's eviction policy: drops each key's object if
    /// it is still the one chosen (same stamp) and still evictable. A key
    /// removed and put again after the choice names another object, which
    /// stays: the choice was made before that put was acknowledged.
    EvictObjects {
        items: Vec<(String, ObjectStamp)>,
    },
    /// Removes finished objects; a put in flight is refused, forced or not.
    Remove {
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
}

/// Which object a key named when the leader looked: a later put of the
/// same key makes another object, with another stamp.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectStamp {
    pub created_ms: u64,
    pub put_id: PutId,
    pub checksum: u32,
    pub size: u64,
}

impl ObjectStamp {
    /// Most bytes one stamp and its key's length prefix encode to (bincode
    /// varints: 9 bytes a u64 at most, 5 a u32), for sizing entries.
    pub const MAX_ENCODED_BYTES: usize = 9 + 9 + 5 + 9 + 9;

    pub fn of(obj: &Object) -> Self {
        Self {
            created_ms: obj.created_ms,
            put_id: obj.put_id,
            checksum: obj.checksum,
            size: obj.size,
        }
    }

    /// Whether `obj` is the object this stamp was taken of.
    pub fn names(&self, obj: &Object) -> bool {
        *self == Self::of(obj)
    }
}

pub type TierMoveId = u64;

/// Most copies between tiers in flight at once (all leaders' together).
pub const MAX_TIER_MOVES_IN_FLIGHT: usize = 4096;

/// An object being copied to another tier: from memory to a disk segment
/// (a demotion) or back (a promotion).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TierMove {
    pub id: TierMoveId,
    /// The tier copied to.
    pub to: Tier,
    pub key: String,
    /// Which object (a later put of the same key is another one).
    pub created_ms: u64,
    pub put_id: PutId,
    pub checksum: u32,
    pub size: u64,
    /// A live replica in the other tier, to copy from.
    pub source: Replica,
    /// Its range in tier `to`.
    pub target: Replica,
    pub release_at_ms: u64,
}

/// Term starts kept (the latest): a reservation older than all of them is
/// judged by the earliest kept, which is later than its real bound, so
/// forgetting errs on the side of waiting.
pub const TERM_STARTS_KEPT: usize = 64;

pub type ReservationId = u64;

/// At most this many reservations per segment (all terms together): a
/// leader keeps one or two open; earlier terms' wait for retirement.
pub const MAX_RESERVATIONS_PER_SEGMENT: usize = 16;

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

/// Space reserved by the leader of `term` for puts it places without a
/// commit. Committed objects take their ranges out of `free`; what remains
/// returns to the segment when the reservation is retired.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: ReservationId,
    pub segment_id: SegmentId,
    pub term: u64,
    pub reserved_ms: u64,
    /// The reserved range, `[base, base+len)` (len aligned).
    pub base: u64,
    pub len: u64,
    /// Ranges holding no committed object yet: offset -> aligned length.
    pub free: BTreeMap<u64, u64>,
}

impl Reservation {
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// The free range containing `[offset, offset+len)` (len aligned), if any.
    pub fn free_range_holding(&self, offset: u64, len: u64) -> Option<(u64, u64)> {
        let len = crate::alloc::aligned_len(len)?;
        let end = offset.checked_add(len)?;
        let (&start, &flen) = self.free.range(..=offset).next_back()?;
        (end <= start + flen).then_some((start, flen))
    }

    /// Takes `[offset, offset+len)` out of the free ranges; false (and no
    /// change) unless it lies wholly inside one.
    fn take(&mut self, offset: u64, len: u64) -> bool {
        let Some((start, flen)) = self.free_range_holding(offset, len) else {
            return false;
        };
        let Some(len) = crate::alloc::aligned_len(len) else {
            return false;
        };
        self.free.remove(&start);
        if offset > start {
            self.free.insert(start, offset - start);
        }
        let end = offset + len;
        if start + flen > end {
            self.free.insert(end, start + flen - end);
        }
        true
    }
}

/// A segment's key as the state keeps it; `Debug` does not print it.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Default)]
pub struct SegmentKeyBytes(pub Vec<u8>);

impl std::fmt::Debug for SegmentKeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SegmentKeyBytes({} bytes)", self.0.len())
    }
}

/// A writer's name for one of its puts; 0 means unnamed.
pub type PutId = u64;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("object {0:?} not found")]
    ObjectNotFound(String),
    #[error("object {0:?} already exists")]
    ObjectAlreadyExists(String),
    #[error("object {0:?} has a read lease; remove it with force")]
    ObjectHasLease(String),
    #[error("object {0:?} is hard-pinned; remove it with force")]
    ObjectPinned(String),
    #[error("no segment has {0} free bytes")]
    NoAvailableHandle(u64),
    #[error("object {0:?} is still being written")]
    ReplicaNotReady(String),
    #[error("every replica of {0:?} is on a store that missed its heartbeats")]
    ReplicasUnavailable(String),
    #[error(
        "object {0:?} is being written by another client, or by another put than the one named"
    )]
    InvalidWrite(String),
    #[error("segment {0} not found")]
    SegmentNotFound(SegmentId),
    #[error("segment {0:?} is mounted by another client")]
    SegmentAlreadyExists(String),
    #[error("{0}")]
    InvalidParams(String),
    /// A re-mount or unmount without the key the segment was mounted with.
    #[error("segment {0:?} was mounted with another key")]
    SegmentKeyMismatch(String),
}

impl MetaError {
    pub fn code(&self) -> ErrorCode {
        match self {
            MetaError::ObjectNotFound(_) => ErrorCode::ObjectNotFound,
            MetaError::ObjectAlreadyExists(_) => ErrorCode::ObjectAlreadyExists,
            MetaError::ObjectHasLease(_) => ErrorCode::ObjectHasLease,
            MetaError::ObjectPinned(_) => ErrorCode::ObjectPinned,
            MetaError::NoAvailableHandle(_) => ErrorCode::NoAvailableHandle,
            MetaError::ReplicaNotReady(_) => ErrorCode::ReplicaIsNotReady,
            MetaError::ReplicasUnavailable(_) => ErrorCode::ReplicasUnavailable,
            MetaError::InvalidWrite(_) => ErrorCode::InvalidWrite,
            MetaError::SegmentNotFound(_) => ErrorCode::SegmentNotFound,
            MetaError::SegmentAlreadyExists(_) => ErrorCode::SegmentAlreadyExists,
            MetaError::InvalidParams(_) => ErrorCode::InvalidParams,
            MetaError::SegmentKeyMismatch(_) => ErrorCode::PermissionDenied,
        }
    }
}

/// What applying a command produced; stored in the dedup table and returned to a retry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Response {
    PutStart(Vec<Result<Vec<Replica>, MetaError>>),
    Items(Vec<Result<(), MetaError>>),
    Mounted(Result<SegmentId, MetaError>),
    Done(Result<(), MetaError>),
    Count(u64),
    /// The whole command was refused (e.g. a retry older than the dedup window).
    Rejected(MetaError),
    /// Blank and membership entries.
    Empty,
    /// A reservation's id and offset.
    Reserved(Result<(ReservationId, u64), MetaError>),
    /// Per item of a `TierMoveStart`.
    TierMoves(Vec<Result<TierMove, MetaError>>),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub segment_id: SegmentId,
    pub offset: u64,
    pub len: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum PutPhase {
    /// PutStart done, bytes being written. After `discard_at_ms` another writer may take
    /// the key over; at `release_at_ms` the space is reclaimed.
    Processing {
        started_ms: u64,
        discard_at_ms: u64,
        release_at_ms: u64,
    },
    Complete {
        completed_ms: u64,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub size: u64,
    pub replicas: Vec<Replica>,
    pub phase: PutPhase,
    pub checksum: u32,
    /// 0 when not soft-pinned.
    pub soft_pin_until_ms: u64,
    pub hard_pin: bool,
    pub created_ms: u64,
    /// Client that started the put.
    pub writer: String,
    /// The writer's name for the put that made this object (0: unnamed).
    pub put_id: PutId,
}

impl Object {
    pub fn is_complete(&self) -> bool {
        matches!(self.phase, PutPhase::Complete { .. })
    }

    /// Whether a PutEnd or PutRevoke from `writer` naming `put_id` is about
    /// this object's put. Unnamed requests (0) match any put of the writer;
    /// a named one must match the put that made the object.
    pub fn is_put_of(&self, writer: Option<&str>, put_id: PutId) -> bool {
        writer.is_none_or(|w| self.writer == w) && (put_id == 0 || self.put_id == put_id)
    }

    pub fn soft_pinned_at(&self, now_ms: u64) -> bool {
        self.soft_pin_until_ms > now_ms
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub id: SegmentId,
    pub spec: SegmentSpec,
    pub owner: String,
    pub mounted_ms: u64,
    /// The key its store chose at mount (empty for a segment mounted by an
    /// older log entry: then no grant is signed for it).
    pub key: SegmentKeyBytes,
    /// Set when its owner missed its heartbeats: no new replicas go there and
    /// lookups skip it, but its replicas are kept, because a live store that
    /// merely could not reach the leader for a while (failover, partition)
    /// still holds every byte. A re-mount by the same owner clears it; the
    /// leader removes the segment for good after a grace period.
    pub expired_ms: Option<u64>,
    pub tier: Tier,
    /// A disk segment's file identity (empty for memory).
    pub disk_id: String,
}

impl Segment {
    pub fn is_live(&self) -> bool {
        self.expired_ms.is_none()
    }

    pub fn is_disk(&self) -> bool {
        self.tier == Tier::Disk
    }
}

/// Space that must not be reused before `release_at_ms` (a writer may still be
/// writing into it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PendingRelease {
    pub replica: Replica,
    pub release_at_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ClientRequests {
    pub last_seen_ms: u64,
    /// Sequence numbers below this were dropped from `results`.
    pub trimmed_below: u64,
    pub results: BTreeMap<u64, Response>,
}

/// What one writer (client id) holds in `objects`: the leader refuses its
/// PutStarts beyond the per-client quotas, so one client cannot fill the
/// leader's memory with objects, keys or puts it never finishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterUsage {
    pub objects: u64,
    pub unfinished: u64,
    pub key_bytes: u64,
}

fn count_in(usage: &mut BTreeMap<String, WriterUsage>, key: &str, obj: &Object) {
    let u = usage.entry(obj.writer.clone()).or_default();
    u.objects += 1;
    u.unfinished += u64::from(!obj.is_complete());
    u.key_bytes += key.len() as u64;
}

fn count_out(usage: &mut BTreeMap<String, WriterUsage>, key: &str, obj: &Object) {
    if let Some(u) = usage.get_mut(&obj.writer) {
        u.objects = u.objects.saturating_sub(1);
        u.unfinished = u.unfinished.saturating_sub(u64::from(!obj.is_complete()));
        u.key_bytes = u.key_bytes.saturating_sub(key.len() as u64);
        if u.objects == 0 {
            usage.remove(&obj.writer);
        }
    }
}

/// The largest segment a mount may declare (256 TiB): far above any machine's
/// memory; with sums saturating besides, a total can never wrap around.
pub const MAX_SEGMENT_CAPACITY: u64 = 1 << 48;

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

/// A read of one object for GetReplicaList.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectView {
    pub size: u64,
    pub checksum: u32,
    pub replicas: Vec<Replica>,
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

    /// What `writer` holds now (zero for a client that holds nothing).
    pub fn writer_usage(&self, writer: &str) -> WriterUsage {
        self.usage.get(writer).copied().unwrap_or_default()
    }

    /// How many writers hold at least one object.
    pub fn writer_count(&self) -> usize {
        self.usage.len()
    }

    pub fn allocator(&self, id: SegmentId) -> Option<&Allocator> {
        self.allocators.get(&id)
    }

    /// Segments that are mounted (not expired: an expired one is kept for a
    /// grace period but takes no new replicas).
    pub fn live_segment_count(&self) -> usize {
        self.segments.values().filter(|s| s.is_live()).count()
    }

    /// Live memory segments: where puts are placed.
    pub fn live_memory_segment_count(&self) -> usize {
        self.segments
            .values()
            .filter(|s| s.is_live() && !s.is_disk())
            .count()
    }

    /// Capacity and allocated bytes of one tier's segments (expired ones
    /// too), saturating.
    pub fn tier_usage(&self, tier: Tier) -> (u64, u64) {
        self.segments
            .values()
            .filter(|s| s.tier == tier)
            .filter_map(|s| self.allocators.get(&s.id))
            .fold((0u64, 0u64), |(cap, used), a| {
                (
                    cap.saturating_add(a.capacity()),
                    used.saturating_add(a.allocated()),
                )
            })
    }

    /// Share of the disk tier in use (0.0 with no disk segment).
    pub fn disk_usage_ratio(&self) -> f64 {
        let (cap, used) = self.tier_usage(Tier::Disk);
        if cap == 0 {
            0.0
        } else {
            used as f64 / cap as f64
        }
    }

    /// Share of the disk tier in use for the disk watermark: without the
    /// ranges held for readers (released disk copies and removed disk
    /// objects, free once their hold ends), as
    /// [`eviction_usage_ratio`](Self::eviction_usage_ratio) does for
    /// memory. Counting them would keep the tier over its watermark for a
    /// whole hold after each release, and the leader would release every
    /// disk copy and then drop disk-only objects it did not need to.
    pub fn disk_eviction_usage_ratio(&self) -> f64 {
        let (cap, used) = self.tier_usage(Tier::Disk);
        if cap == 0 {
            return 0.0;
        }
        used.saturating_sub(self.held_in(Tier::Disk)) as f64 / cap as f64
    }

    /// Bytes of `tier` allocated but only held for readers until a release
    /// time (`pending_release`), saturating.
    fn held_in(&self, tier: Tier) -> u64 {
        self.pending_release
            .iter()
            .filter(|p| self.tier_of(p.replica.segment_id) == tier)
            .filter_map(|p| crate::alloc::aligned_len(p.replica.len))
            .fold(0u64, u64::saturating_add)
    }

    /// Objects with a disk replica: a scan of every object, so 0 at once
    /// when no disk segment exists (metrics and status ask on every call).
    pub fn disk_object_count(&self) -> usize {
        if self.tier_usage(Tier::Disk).0 == 0 {
            return 0;
        }
        self.objects
            .values()
            .filter(|o| {
                o.replicas
                    .iter()
                    .any(|r| self.tier_of(r.segment_id) == Tier::Disk)
            })
            .count()
    }

    /// The tier of the segment `r` is on (memory if unknown).
    pub fn tier_of(&self, segment_id: SegmentId) -> Tier {
        self.segments
            .get(&segment_id)
            .map_or(Tier::Memory, |s| s.tier)
    }

    /// Whether any live disk segment could take `size` bytes now.
    pub fn disk_room_for(&self, size: u64, avoided: &BTreeSet<SegmentId>) -> bool {
        self.segments
            .values()
            .filter(|s| s.is_live() && s.is_disk() && !avoided.contains(&s.id))
            .filter_map(|s| self.allocators.get(&s.id))
            .any(|a| a.largest_free() >= crate::alloc::aligned_len(size).unwrap_or(u64::MAX))
    }

    /// Capacity of every segment (expired ones too), saturating: mounts
    /// bound each capacity (see `mount`), and a sum must never wrap.
    pub fn total_capacity(&self) -> u64 {
        self.allocators
            .values()
            .fold(0u64, |sum, a| sum.saturating_add(a.capacity()))
    }

    /// Whether `size` bytes would fit in some live segment were it empty:
    /// when not, no eviction can make room.
    fn fits_some_empty_live_segment(&self, size: u64) -> bool {
        let Some(len) = crate::alloc::aligned_len(size) else {
            return false;
        };
        self.segments
            .values()
            .filter(|s| s.is_live() && !s.is_disk())
            .filter_map(|s| self.allocators.get(&s.id))
            .any(|a| a.capacity() >= len)
    }

    pub fn total_allocated(&self) -> u64 {
        self.allocators
            .values()
            .fold(0u64, |sum, a| sum.saturating_add(a.allocated()))
    }

    /// Share of the memory tier in use, 0.0 with no memory segments. Free
    /// space inside reservations counts as free: the leader places puts there.
    pub fn usage_ratio(&self) -> f64 {
        let (cap, used) = self.tier_usage(Tier::Memory);
        if cap == 0 {
            0.0
        } else {
            used.saturating_sub(self.reserved_free()) as f64 / cap as f64
        }
    }

    /// [`usage_ratio`](Self::usage_ratio) without the memory held for
    /// readers after a removal or a demotion: it is free a lease TTL later,
    /// whatever else happens, so eviction does not count it (it would move
    /// or drop ever more objects while the holds last). A put that finds no
    /// room meanwhile still triggers eviction, by its failure.
    pub fn eviction_usage_ratio(&self) -> f64 {
        let (cap, used) = self.tier_usage(Tier::Memory);
        if cap == 0 {
            return 0.0;
        }
        used.saturating_sub(self.reserved_free())
            .saturating_sub(self.held_in(Tier::Memory)) as f64
            / cap as f64
    }

    /// When a term after `term` started (its leader's first entry): every
    /// placement of `term`'s leader was made before then.
    pub fn later_term_started_ms(&self, term: u64) -> Option<u64> {
        self.term_starts
            .range(term.saturating_add(1)..)
            .next()
            .map(|(_, ms)| *ms)
    }

    /// Bytes reserved for leaders' placements and not yet holding an object.
    pub fn reserved_free(&self) -> u64 {
        self.reservations
            .values()
            .fold(0u64, |sum, r| sum.saturating_add(r.free_bytes()))
    }

    pub fn segment_by_name(&self, name: &str) -> Option<&Segment> {
        self.segments.values().find(|s| s.spec.name == name)
    }

    /// Segments that expired at least their tier's grace before `now_ms`:
    /// the leader removes them (and the replicas only they held) for good.
    /// A disk segment's grace is longer: its store may come back after a
    /// restart with every disk object intact.
    pub fn expired_segments(
        &self,
        now_ms: u64,
        grace_ms: u64,
        disk_grace_ms: u64,
    ) -> Vec<SegmentId> {
        self.segments
            .values()
            .filter(|s| {
                let grace = if s.is_disk() { disk_grace_ms } else { grace_ms };
                s.expired_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) >= grace)
            })
            .map(|s| s.id)
            .collect()
    }

    /// Complete replicas of a readable object.
    pub fn lookup(&self, key: &str) -> Result<ObjectView, MetaError> {
        let obj = self
            .objects
            .get(key)
            .ok_or_else(|| MetaError::ObjectNotFound(key.to_string()))?;
        if !obj.is_complete() {
            return Err(MetaError::ReplicaNotReady(key.to_string()));
        }
        let mut replicas: Vec<Replica> = obj
            .replicas
            .iter()
            .filter(|r| {
                self.segments
                    .get(&r.segment_id)
                    .is_some_and(Segment::is_live)
            })
            .cloned()
            .collect();
        // Memory first: readers try replicas in order.
        replicas.sort_by_key(|r| self.tier_of(r.segment_id) == Tier::Disk);
        if replicas.is_empty() {
            return Err(MetaError::ReplicasUnavailable(key.to_string()));
        }
        Ok(ObjectView {
            size: obj.size,
            checksum: obj.checksum,
            replicas,
        })
    }

    /// True when the key names a complete (readable) object.
    pub fn exists(&self, key: &str) -> bool {
        self.objects.get(key).is_some_and(|o| o.is_complete())
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
            } => {
                let items: Vec<(String, u64, PutId)> = items
                    .iter()
                    .map(|(k, size)| (k.clone(), *size, 0))
                    .collect();
                self.put_start(now, cmd.seed, writer, &items, config, policy)
            }
            Op::PutStartNamed {
                items,
                config,
                policy,
            } => self.put_start(now, cmd.seed, writer, items, config, policy),
            Op::PutEnd { items } => Response::Items(
                items
                    .iter()
                    .map(|(k, crc)| self.put_end(now, writer, k, *crc, 0))
                    .collect(),
            ),
            Op::PutEndNamed { items } => Response::Items(
                items
                    .iter()
                    .map(|(k, crc, id)| self.put_end(now, writer, k, *crc, *id))
                    .collect(),
            ),
            Op::PutRevoke { keys } => Response::Items(
                keys.iter()
                    .map(|k| self.put_revoke(now, writer, k, 0))
                    .collect(),
            ),
            Op::PutRevokeNamed { items } => Response::Items(
                items
                    .iter()
                    .map(|(k, id)| self.put_revoke(now, writer, k, *id))
                    .collect(),
            ),
            Op::LegacyRemove { keys, force } => Response::Items(
                keys.iter()
                    .map(|k| self.remove(now, k, *force, false, now, true))
                    .collect(),
            ),
            Op::Remove {
                keys,
                force,
                leased,
                hold_ms,
            } => self.remove_keys(now, keys, *force, leased, *hold_ms, false),
            Op::RemoveTakingUnfinished {
                keys,
                force,
                leased,
                hold_ms,
            } => self.remove_keys(now, keys, *force, leased, *hold_ms, true),
            Op::Evict { keys } => Response::Count(self.evict(keys.iter().map(|k| (k, None)))),
            Op::EvictObjects { items } => {
                Response::Count(self.evict(items.iter().map(|(k, stamp)| (k, Some(stamp)))))
            }
            Op::MountSegment { spec, owner } => {
                Response::Mounted(self.mount(now, spec, owner, None))
            }
            Op::MountSegmentKeyed { spec, owner, key } => {
                Response::Mounted(self.mount(now, spec, owner, Some(key)))
            }
            Op::MountTieredSegment {
                spec,
                owner,
                key,
                tier,
                disk_id,
            } => Response::Mounted(self.mount_tiered(now, spec, owner, key, *tier, disk_id)),
            Op::TierMoveStart {
                to,
                items,
                release_after_ms,
            } => self.tier_moves_start(now, items, *to, *release_after_ms),
            Op::DemoteStart {
                items,
                release_after_ms,
            } => self.tier_moves_start(now, items, Tier::Disk, *release_after_ms),
            Op::TierMoveEnd {
                items,
                release_source,
                hold_ms,
            } => self.tier_moves_end(now, items, *release_source, *hold_ms),
            Op::DemoteEnd { items, hold_ms } => self.tier_moves_end(now, items, true, *hold_ms),
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
            Op::ReclaimStalePuts => Response::Count(self.reclaim(now)),
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

    fn put_start(
        &mut self,
        now: u64,
        seed: u64,
        writer: Option<&str>,
        items: &[(String, u64, PutId)],
        config: &ReplicateConfig,
        policy: &PutPolicy,
    ) -> Response {
        if config.replica_num == 0 {
            return Response::Rejected(MetaError::InvalidParams(
                "replica_num must be at least 1".into(),
            ));
        }
        let live = self.live_memory_segment_count();
        if config.replica_num as usize > live {
            return Response::Rejected(MetaError::InvalidParams(format!(
                "replica_num {} exceeds the {live} mounted segments",
                config.replica_num
            )));
        }
        let results = items
            .iter()
            .enumerate()
            .map(|(i, (key, size, put_id))| {
                self.put_start_one(
                    now,
                    seed.wrapping_add(i as u64),
                    (writer, *put_id),
                    key,
                    *size,
                    config,
                    policy,
                )
            })
            .collect();
        Response::PutStart(results)
    }

    #[allow(clippy::too_many_arguments)]
    fn put_start_one(
        &mut self,
        now: u64,
        seed: u64,
        (writer, put_id): (Option<&str>, PutId),
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        policy: &PutPolicy,
    ) -> Result<Vec<Replica>, MetaError> {
        if size == 0 {
            return Err(MetaError::InvalidParams(format!(
                "object {key:?} has size 0"
            )));
        }
        self.may_put(now, key)?;
        self.take_over_zombie(now, key);

        let order = self.placement_order(seed, &config.preferred_segments);
        let mut replicas = Vec::with_capacity(config.replica_num as usize);
        for sid in order {
            if replicas.len() == config.replica_num as usize {
                break;
            }
            if let Some(alloc) = self.allocators.get_mut(&sid) {
                if let Some(offset) = alloc.allocate(size) {
                    replicas.push(Replica {
                        segment_id: sid,
                        offset,
                        len: size,
                    });
                }
            }
        }
        if replicas.is_empty() {
            // Only a failure eviction could cure asks for an eviction round:
            // a size no live segment could hold even empty evicted 85 of 100
            // objects of a nearly empty pool when repeated. Asked
            // for also when the put goes to disk below: memory is full, and
            // the next puts want it.
            if self.fits_some_empty_live_segment(size) {
                self.alloc_failures += 1;
            }
            // Memory is full: the bytes go straight to disk, where a
            // demotion would have put them, rather than the put failing
            // while the disk has room. One disk replica, as a demotion
            // leaves (and as tier moves assume), whatever `replica_num`:
            // a put gets fewer replicas than asked when memory has room
            // for fewer, too. Never for a hard-pinned object, which must
            // stay in memory.
            if !config.hard_pin {
                for sid in self.disk_placement_order(seed, &config.preferred_segments) {
                    if let Some(offset) =
                        self.allocators.get_mut(&sid).and_then(|a| a.allocate(size))
                    {
                        replicas.push(Replica {
                            segment_id: sid,
                            offset,
                            len: size,
                        });
                        break;
                    }
                }
            }
            if replicas.is_empty() {
                return Err(MetaError::NoAvailableHandle(size));
            }
        }
        let granted = replicas.clone();
        let obj = Object {
            size,
            replicas,
            phase: PutPhase::Processing {
                started_ms: now,
                discard_at_ms: now.saturating_add(policy.discard_after_ms),
                release_at_ms: now.saturating_add(policy.release_after_ms),
            },
            checksum: 0,
            soft_pin_until_ms: if config.soft_pin {
                now.saturating_add(policy.soft_pin_ttl_ms)
            } else {
                0
            },
            hard_pin: config.hard_pin,
            created_ms: now,
            writer: writer.unwrap_or_default().to_string(),
            put_id,
        };
        count_in(&mut self.usage, key, &obj);
        self.objects.insert(key.to_string(), obj);
        Ok(granted)
    }

    /// Whether a new put of `key` may start now: not over a finished object,
    /// nor over an unfinished put before its discard time.
    fn may_put(&self, now: u64, key: &str) -> Result<(), MetaError> {
        match self.objects.get(key).map(|o| &o.phase) {
            None => Ok(()),
            Some(PutPhase::Complete { .. }) => Err(MetaError::ObjectAlreadyExists(key.to_string())),
            // Not "already exists": the other writer may still fail and
            // revoke, and a client treats "exists" as success, so answering
            // it here would acknowledge a put whose bytes may never become
            // readable (found by the chaos checker). The caller retries or
            // reports the error.
            Some(PutPhase::Processing { discard_at_ms, .. }) if now < *discard_at_ms => {
                Err(MetaError::ReplicaNotReady(key.to_string()))
            }
            Some(PutPhase::Processing { .. }) => Ok(()),
        }
    }

    /// Takes `key` from a zombie put (unfinished past its discard time, as
    /// [`may_put`](Self::may_put) allowed), keeping its space out of reach
    /// until the old writer can no longer be writing.
    fn take_over_zombie(&mut self, now: u64, key: &str) {
        let Some(old) = self.objects.remove(key) else {
            return;
        };
        count_out(&mut self.usage, key, &old);
        if let PutPhase::Processing { release_at_ms, .. } = old.phase {
            for replica in old.replicas {
                self.pending_release.push(PendingRelease {
                    replica,
                    release_at_ms: release_at_ms.max(now),
                });
            }
        }
    }

    /// Preferred segments (by name, in the given order) first, then the rest
    /// rotated by the seed so load spreads over segments.
    fn placement_order(&self, seed: u64, preferred: &[String]) -> Vec<SegmentId> {
        let mut order: Vec<SegmentId> = Vec::with_capacity(self.segments.len());
        for name in preferred {
            if let Some(s) = self
                .segment_by_name(name)
                .filter(|s| s.is_live() && !s.is_disk())
            {
                if !order.contains(&s.id) {
                    order.push(s.id);
                }
            }
        }
        let rest: Vec<SegmentId> = self
            .segments
            .values()
            .filter(|s| s.is_live() && !s.is_disk() && !order.contains(&s.id))
            .map(|s| s.id)
            .collect();
        if !rest.is_empty() {
            let start = (seed % rest.len() as u64) as usize;
            order.extend(rest[start..].iter().chain(rest[..start].iter()));
        }
        order
    }

    /// Live disk segments for a put memory has no room for: those of the
    /// store processes owning the preferred (memory) segments first (a
    /// store's disk segment has its own name and port), the rest rotated
    /// by the seed.
    fn disk_placement_order(&self, seed: u64, preferred: &[String]) -> Vec<SegmentId> {
        let preferred_owners: Vec<&str> = preferred
            .iter()
            .filter_map(|name| self.segment_by_name(name))
            .map(|s| s.owner.as_str())
            .collect();
        let (mut order, rest): (Vec<&Segment>, Vec<&Segment>) = self
            .segments
            .values()
            .filter(|s| s.is_live() && s.is_disk())
            .partition(|s| preferred_owners.contains(&s.owner.as_str()));
        if !rest.is_empty() {
            let start = (seed % rest.len() as u64) as usize;
            order.extend(rest[start..].iter().chain(rest[..start].iter()));
        }
        order.into_iter().map(|s| s.id).collect()
    }

    fn put_end(
        &mut self,
        now: u64,
        writer: Option<&str>,
        key: &str,
        checksum: u32,
        put_id: PutId,
    ) -> Result<(), MetaError> {
        let obj = self
            .objects
            .get_mut(key)
            .ok_or_else(|| MetaError::ObjectNotFound(key.to_string()))?;
        if !obj.is_put_of(writer, put_id) {
            return Err(MetaError::InvalidWrite(key.to_string()));
        }
        match obj.phase {
            // A retried PutEnd outside the dedup window: already done.
            PutPhase::Complete { .. } => Ok(()),
            PutPhase::Processing { .. } => {
                obj.phase = PutPhase::Complete { completed_ms: now };
                obj.checksum = checksum;
                if let Some(u) = self.usage.get_mut(&obj.writer) {
                    u.unfinished = u.unfinished.saturating_sub(1);
                }
                Ok(())
            }
        }
    }

    fn put_revoke(
        &mut self,
        now: u64,
        writer: Option<&str>,
        key: &str,
        put_id: PutId,
    ) -> Result<(), MetaError> {
        let obj = self
            .objects
            .get(key)
            .ok_or_else(|| MetaError::ObjectNotFound(key.to_string()))?;
        if !obj.is_put_of(writer, put_id) {
            return Err(MetaError::InvalidWrite(key.to_string()));
        }
        if obj.is_complete() {
            return Err(MetaError::InvalidWrite(format!(
                "{key} is complete; revoke applies only to an unfinished put"
            )));
        }
        let obj = self.objects.remove(key).expect("checked above");
        count_out(&mut self.usage, key, &obj);
        // The writer gave up, but bytes it sent may still reach a store
        // (see WRITE_FENCE_MARGIN_MS): the space waits out its grants.
        if let PutPhase::Processing {
            discard_at_ms,
            release_at_ms,
            ..
        } = obj.phase
        {
            let fence = write_fence_until(discard_at_ms, release_at_ms);
            if fence <= now {
                self.free_replicas(&obj.replicas);
                return Ok(());
            }
            for replica in obj.replicas {
                self.pending_release.push(PendingRelease {
                    replica,
                    release_at_ms: fence,
                });
            }
        }
        Ok(())
    }

    /// [`remove`](Self::remove) of each key, its space held `hold_ms`.
    fn remove_keys(
        &mut self,
        now: u64,
        keys: &[String],
        force: bool,
        leased: &BTreeSet<String>,
        hold_ms: u64,
        unfinished_too: bool,
    ) -> Response {
        let hold_until = now.saturating_add(hold_ms);
        Response::Items(
            keys.iter()
                .map(|k| {
                    self.remove(
                        now,
                        k,
                        force,
                        leased.contains(k),
                        hold_until,
                        unfinished_too,
                    )
                })
                .collect(),
        )
    }

    /// `leased`: the leader could not rule out a read lease on `key`; kept
    /// unless forced. A removed finished object's space stays unallocated
    /// until `hold_until`. An unfinished put is refused even when forced
    /// (unless `unfinished_too`): its writer may still commit it or retry
    /// it elsewhere, and a remove that answered OK before that put's value
    /// appeared would not be linearizable. Stale puts go by reclaim.
    fn remove(
        &mut self,
        now: u64,
        key: &str,
        force: bool,
        leased: bool,
        hold_until: u64,
        unfinished_too: bool,
    ) -> Result<(), MetaError> {
        let obj = self
            .objects
            .get(key)
            .ok_or_else(|| MetaError::ObjectNotFound(key.to_string()))?;
        let takeable = obj.is_complete() || (force && unfinished_too);
        if !takeable {
            return Err(MetaError::ReplicaNotReady(key.to_string()));
        }
        if !force {
            if leased {
                return Err(MetaError::ObjectHasLease(key.to_string()));
            }
            if obj.hard_pin {
                return Err(MetaError::ObjectPinned(key.to_string()));
            }
        }
        let obj = self.objects.remove(key).expect("checked above");
        count_out(&mut self.usage, key, &obj);
        match obj.phase {
            PutPhase::Complete { .. } if hold_until > now => {
                for replica in obj.replicas {
                    self.pending_release.push(PendingRelease {
                        replica,
                        release_at_ms: hold_until,
                    });
                }
            }
            _ => self.retire(now, obj),
        }
        Ok(())
    }

    /// Frees a removed object's space, or parks it while its writer may still write.
    fn retire(&mut self, now: u64, obj: Object) {
        match obj.phase {
            PutPhase::Complete { .. } => self.free_replicas(&obj.replicas),
            PutPhase::Processing { release_at_ms, .. } => {
                for replica in obj.replicas {
                    self.pending_release.push(PendingRelease {
                        replica,
                        release_at_ms: release_at_ms.max(now),
                    });
                }
            }
        }
    }

    /// Drops each key's object if it is complete, not hard-pinned and, when
    /// a stamp is given, the object the stamp names.
    fn evict<'a>(
        &mut self,
        items: impl Iterator<Item = (&'a String, Option<&'a ObjectStamp>)>,
    ) -> u64 {
        let mut evicted = 0;
        for (key, stamp) in items {
            let evictable = self.objects.get(key).is_some_and(|o| {
                o.is_complete() && !o.hard_pin && stamp.is_none_or(|s| s.names(o))
            });
            if evictable {
                let obj = self.objects.remove(key).expect("checked above");
                count_out(&mut self.usage, key, &obj);
                self.free_replicas(&obj.replicas);
                evicted += 1;
            }
        }
        self.evicted_total += evicted;
        evicted
    }

    fn mount(
        &mut self,
        now: u64,
        spec: &SegmentSpec,
        owner: &str,
        key: Option<&SegmentKeyBytes>,
    ) -> Result<SegmentId, MetaError> {
        if spec.name.is_empty() {
            return Err(MetaError::InvalidParams("segment name is empty".into()));
        }
        if spec.capacity < crate::alloc::ALIGNMENT {
            return Err(MetaError::InvalidParams(format!(
                "segment capacity {} is below the minimum of {} bytes",
                spec.capacity,
                crate::alloc::ALIGNMENT
            )));
        }
        if spec.capacity > MAX_SEGMENT_CAPACITY {
            // A capacity near 2^64 wrapped the total capacity to 1 KiB, and
            // eviction started on a nearly empty pool.
            return Err(MetaError::InvalidParams(format!(
                "segment capacity {} is above the maximum of {MAX_SEGMENT_CAPACITY} bytes (256 TiB)",
                spec.capacity
            )));
        }
        if let Some(existing) = self.segment_by_name(&spec.name) {
            if existing.owner != owner && existing.expired_ms.is_some() {
                // A new process took over the name of one that stopped
                // heartbeating: the old memory is gone, and so are its replicas.
                let old = existing.id;
                let _ = self.unmount(old);
                return self.mount(now, spec, owner, key);
            }
            if existing.owner != owner {
                return Err(MetaError::SegmentAlreadyExists(spec.name.clone()));
            }
            // The owner's client id is no proof: the key the store chose is.
            if let Some(key) = key {
                if !existing.key.0.is_empty()
                    && !crescent_auth::constant_time_eq(&existing.key.0, &key.0)
                {
                    return Err(MetaError::SegmentKeyMismatch(spec.name.clone()));
                }
            }
            if existing.spec.capacity != spec.capacity {
                return Err(MetaError::InvalidParams(format!(
                    "segment {:?} is mounted with capacity {}; unmount it before changing it",
                    spec.name, existing.spec.capacity
                )));
            }
            let id = existing.id;
            // Re-mount by the same owner: refresh its transport details and
            // take it back into service if it had expired (its bytes are intact).
            if let Some(seg) = self.segments.get_mut(&id) {
                seg.spec = spec.clone();
                seg.expired_ms = None;
                if let Some(key) = key {
                    seg.key = key.clone();
                }
            }
            return Ok(id);
        }
        let id = self.next_segment_id.max(1);
        self.next_segment_id = id + 1;
        self.segments.insert(
            id,
            Segment {
                id,
                spec: spec.clone(),
                owner: owner.to_string(),
                mounted_ms: now,
                key: key.cloned().unwrap_or_default(),
                expired_ms: None,
                tier: Tier::Memory,
                disk_id: String::new(),
            },
        );
        self.allocators.insert(id, Allocator::new(spec.capacity));
        Ok(id)
    }

    /// Mounts a segment of `tier`. A disk segment presented again with the
    /// identity of its file (same name, disk id and capacity) by another
    /// owner is a restarted store that re-opened its file: the store holds
    /// the file's exclusive lock, so the previous process is gone, and the
    /// bytes of every disk object are still there. It takes the segment
    /// over, objects and all. Anything else is [`mount`](Self::mount)'s
    /// rules; a reformatted file (new disk id) is a new segment, and the old
    /// one's objects go with it once it has expired.
    fn mount_tiered(
        &mut self,
        now: u64,
        spec: &SegmentSpec,
        owner: &str,
        key: &SegmentKeyBytes,
        tier: Tier,
        disk_id: &str,
    ) -> Result<SegmentId, MetaError> {
        const MAX_DISK_ID_LEN: usize = 128;
        match tier {
            Tier::Disk if disk_id.is_empty() || disk_id.len() > MAX_DISK_ID_LEN => {
                return Err(MetaError::InvalidParams(format!(
                    "a disk segment needs a disk id of 1 to {MAX_DISK_ID_LEN} bytes"
                )))
            }
            Tier::Memory if !disk_id.is_empty() => {
                return Err(MetaError::InvalidParams(
                    "a memory segment has no disk id".into(),
                ))
            }
            _ => {}
        }
        if let Some(existing) = self.segment_by_name(&spec.name) {
            let id = existing.id;
            let same_file = existing.is_disk()
                && tier == Tier::Disk
                && existing.disk_id == disk_id
                && existing.spec.capacity == spec.capacity;
            // Live and owned by another process: only from the same host,
            // where the file's lock proves that process gone (a copy of the
            // file on another host proves nothing; that one waits for the
            // segment to expire).
            let same_host = existing.spec.hostname == spec.hostname;
            if same_file && existing.owner != owner && (same_host || !existing.is_live()) {
                if let Some(seg) = self.segments.get_mut(&id) {
                    seg.owner = owner.to_string();
                    seg.spec = spec.clone();
                    seg.key = key.clone();
                    seg.expired_ms = None;
                }
                return Ok(id);
            }
            if existing.owner == owner && !same_file && (existing.is_disk() || tier == Tier::Disk) {
                return Err(MetaError::InvalidParams(format!(
                    "segment {:?} is mounted as another tier or disk; unmount it first",
                    spec.name
                )));
            }
        }
        let id = self.mount(now, spec, owner, Some(key))?;
        if let Some(seg) = self.segments.get_mut(&id) {
            seg.tier = tier;
            seg.disk_id = disk_id.to_string();
        }
        Ok(id)
    }

    /// Whether a copy of `key` between tiers is in flight: started, and
    /// neither ended nor released yet. A scan, bounded by
    /// [`MAX_TIER_MOVES_IN_FLIGHT`].
    pub fn is_moving(&self, key: &str) -> bool {
        self.tier_moves.values().any(|m| m.key == key)
    }

    /// Keys with a copy between tiers in flight.
    pub fn moving_keys(&self) -> std::collections::HashSet<&str> {
        self.tier_moves.values().map(|m| m.key.as_str()).collect()
    }

    /// Whether `obj` has a replica on a disk segment, live or expired (one
    /// that expired comes back, with its bytes, when its store restarts).
    pub fn has_disk_replica(&self, obj: &Object) -> bool {
        obj.replicas
            .iter()
            .any(|r| self.tier_of(r.segment_id) == Tier::Disk)
    }

    /// Whether `r` is on a live segment of `tier`.
    pub fn live_in(&self, r: &Replica, tier: Tier) -> bool {
        self.segments
            .get(&r.segment_id)
            .is_some_and(|s| s.is_live() && s.tier == tier)
    }

    fn tier_moves_start(
        &mut self,
        now: u64,
        items: &[(String, SegmentId)],
        to: Tier,
        release_after_ms: u64,
    ) -> Response {
        let release_at = now.saturating_add(release_after_ms);
        Response::TierMoves(
            items
                .iter()
                .map(|(key, target)| self.tier_move_start(key, *target, to, release_at))
                .collect(),
        )
    }

    fn tier_moves_end(
        &mut self,
        now: u64,
        items: &[(TierMoveId, bool)],
        release_source: bool,
        hold_ms: u64,
    ) -> Response {
        let hold_until = now.saturating_add(hold_ms);
        Response::Items(
            items
                .iter()
                .map(|(id, copied)| {
                    self.tier_move_end(now, *id, *copied, release_source, hold_until)
                })
                .collect(),
        )
    }

    /// Allocates `key`'s range on `target` (a segment of tier `to`) for a
    /// copy from one of its live replicas in the other tier.
    fn tier_move_start(
        &mut self,
        key: &str,
        target: SegmentId,
        to: Tier,
        release_at_ms: u64,
    ) -> Result<TierMove, MetaError> {
        if self.tier_moves.len() >= MAX_TIER_MOVES_IN_FLIGHT {
            return Err(MetaError::InvalidParams(format!(
                "{MAX_TIER_MOVES_IN_FLIGHT} copies between tiers are in flight already"
            )));
        }
        if !self
            .segments
            .get(&target)
            .is_some_and(|s| s.is_live() && s.tier == to)
        {
            return Err(MetaError::SegmentNotFound(target));
        }
        let obj = self
            .objects
            .get(key)
            .ok_or_else(|| MetaError::ObjectNotFound(key.to_string()))?;
        if !obj.is_complete() {
            return Err(MetaError::ReplicaNotReady(key.to_string()));
        }
        // A hard pin keeps an object in memory: never demoted.
        if to == Tier::Disk && obj.hard_pin {
            return Err(MetaError::ObjectPinned(key.to_string()));
        }
        if obj.replicas.iter().any(|r| self.live_in(r, to)) || self.is_moving(key) {
            return Err(MetaError::InvalidParams(format!(
                "{key:?} has a replica in {to:?} already, or is being copied"
            )));
        }
        let source = obj
            .replicas
            .iter()
            .find(|r| self.live_in(r, to.other()))
            .cloned()
            .ok_or_else(|| MetaError::ReplicasUnavailable(key.to_string()))?;
        let (size, created_ms, put_id, checksum) =
            (obj.size, obj.created_ms, obj.put_id, obj.checksum);
        let offset = self
            .allocators
            .get_mut(&target)
            .and_then(|a| a.allocate(size))
            .ok_or(MetaError::NoAvailableHandle(size))?;
        let id = self.next_tier_move_id.max(1);
        self.next_tier_move_id = id + 1;
        let moved = TierMove {
            id,
            to,
            key: key.to_string(),
            created_ms,
            put_id,
            checksum,
            size,
            source,
            target: Replica {
                segment_id: target,
                offset,
                len: size,
            },
            release_at_ms,
        };
        self.tier_moves.insert(id, moved.clone());
        Ok(moved)
    }

    /// Finishes copy `id`: see [`Op::TierMoveEnd`].
    fn tier_move_end(
        &mut self,
        now: u64,
        id: TierMoveId,
        copied: bool,
        release_source: bool,
        hold_until: u64,
    ) -> Result<(), MetaError> {
        let d = self
            .tier_moves
            .remove(&id)
            .ok_or_else(|| MetaError::InvalidParams(format!("no copy {id} in flight")))?;
        let target = std::slice::from_ref(&d.target);
        if !copied {
            self.free_replicas(target);
            return Ok(());
        }
        if now > d.release_at_ms {
            self.free_replicas(target);
            return Err(MetaError::InvalidWrite(format!(
                "{}: its copy to {:?} outlived its release time",
                d.key, d.to
            )));
        }
        if !self
            .segments
            .get(&d.target.segment_id)
            .is_some_and(Segment::is_live)
        {
            // Its store went silent meanwhile: the copy would be
            // unreadable until it comes back. Keep the object as it is.
            self.free_replicas(target);
            return Err(MetaError::SegmentNotFound(d.target.segment_id));
        }
        let same_object = self.objects.get(&d.key).is_some_and(|o| {
            o.is_complete()
                && o.created_ms == d.created_ms
                && o.put_id == d.put_id
                && o.checksum == d.checksum
                && o.size == d.size
        });
        if !same_object {
            self.free_replicas(target);
            return Err(MetaError::ObjectNotFound(d.key));
        }
        let tiers: Vec<Tier> = self.objects[&d.key]
            .replicas
            .iter()
            .map(|r| self.tier_of(r.segment_id))
            .collect();
        let obj = self.objects.get_mut(&d.key).expect("checked above");
        let mut released = Vec::new();
        let mut kept = vec![d.target];
        for (r, tier) in std::mem::take(&mut obj.replicas).into_iter().zip(tiers) {
            if release_source && tier != d.to {
                released.push(r);
            } else {
                kept.push(r);
            }
        }
        obj.replicas = kept;
        self.release_held(now, released, hold_until);
        match d.to {
            Tier::Disk => self.demoted_total += 1,
            Tier::Memory => self.promoted_total += 1,
        }
        Ok(())
    }

    /// Frees `replicas` at `hold_until` (at once if that is not later than
    /// `now`): readers leased before may still be reading them.
    fn release_held(&mut self, now: u64, replicas: Vec<Replica>, hold_until: u64) {
        for replica in replicas {
            if !self.allocators.contains_key(&replica.segment_id) {
                continue;
            }
            if hold_until > now {
                self.pending_release.push(PendingRelease {
                    replica,
                    release_at_ms: hold_until,
                });
            } else {
                self.free_replicas(std::slice::from_ref(&replica));
            }
        }
    }

    /// See [`Op::DropMemoryCopies`] and [`Op::DropDiskCopies`]: true when
    /// `key`'s replicas in `tier` went, the object keeping those in the
    /// other tier.
    fn drop_copies_in(&mut self, now: u64, key: &str, tier: Tier, hold_until: u64) -> bool {
        let Some(obj) = self.objects.get(key) else {
            return false;
        };
        // What must stay: for memory copies a disk replica, live or expired
        // (an expired one comes back with its store); for disk copies a
        // replica on a live memory segment (the object stays readable).
        let other_stays = match tier {
            Tier::Memory => self.has_disk_replica(obj),
            Tier::Disk => obj.replicas.iter().any(|r| self.live_in(r, Tier::Memory)),
        };
        if !obj.is_complete() || !other_stays || self.is_moving(key) {
            return false;
        }
        let (dropped, kept): (Vec<Replica>, Vec<Replica>) = obj
            .replicas
            .iter()
            .cloned()
            .partition(|r| self.tier_of(r.segment_id) == tier);
        if dropped.is_empty() {
            return false;
        }
        if let Some(obj) = self.objects.get_mut(key) {
            obj.replicas = kept;
        }
        self.release_held(now, dropped, hold_until);
        true
    }

    fn unmount(&mut self, segment_id: SegmentId) -> Result<(), MetaError> {
        if self.segments.remove(&segment_id).is_none() {
            return Err(MetaError::SegmentNotFound(segment_id));
        }
        self.allocators.remove(&segment_id);
        self.pending_release
            .retain(|p| p.replica.segment_id != segment_id);
        self.reservations.retain(|_, r| r.segment_id != segment_id);
        self.tier_moves
            .retain(|_, d| d.target.segment_id != segment_id);
        // Objects lose their replicas there; those left with none vanish (an
        // unfinished put then fails at PutEnd with OBJECT_NOT_FOUND).
        let usage = &mut self.usage;
        self.objects.retain(|key, obj| {
            obj.replicas.retain(|r| r.segment_id != segment_id);
            let keep = !obj.replicas.is_empty();
            if !keep {
                count_out(usage, key, obj);
            }
            keep
        });
        Ok(())
    }

    fn reclaim(&mut self, now: u64) -> u64 {
        let mut reclaimed = 0;
        let stale: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, o)| matches!(o.phase, PutPhase::Processing { release_at_ms, .. } if release_at_ms <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            if let Some(obj) = self.objects.remove(&key) {
                count_out(&mut self.usage, &key, &obj);
                self.free_replicas(&obj.replicas);
                reclaimed += 1;
            }
        }
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending_release)
            .into_iter()
            .partition(|p| p.release_at_ms <= now);
        self.pending_release = keep;
        for p in due {
            self.free_replicas(std::slice::from_ref(&p.replica));
            reclaimed += 1;
        }
        let stale: Vec<TierMoveId> = self
            .tier_moves
            .values()
            .filter(|d| d.release_at_ms <= now)
            .map(|d| d.id)
            .collect();
        for id in stale {
            if let Some(d) = self.tier_moves.remove(&id) {
                self.free_replicas(std::slice::from_ref(&d.target));
                reclaimed += 1;
            }
        }
        reclaimed
    }

    fn reserve(
        &mut self,
        now: u64,
        segment_id: SegmentId,
        len: u64,
        term: u64,
    ) -> Result<(ReservationId, u64), MetaError> {
        if !self
            .segments
            .get(&segment_id)
            .is_some_and(|s| s.is_live() && !s.is_disk())
        {
            return Err(MetaError::SegmentNotFound(segment_id));
        }
        let held = self
            .reservations
            .values()
            .filter(|r| r.segment_id == segment_id)
            .count();
        if held >= MAX_RESERVATIONS_PER_SEGMENT {
            return Err(MetaError::InvalidParams(format!(
                "segment {segment_id} already holds {held} reservations"
            )));
        }
        let aligned = crate::alloc::aligned_len(len)
            .ok_or_else(|| MetaError::InvalidParams(format!("reservation of {len} bytes")))?;
        let offset = self
            .allocators
            .get_mut(&segment_id)
            .and_then(|a| a.allocate(aligned))
            .ok_or(MetaError::NoAvailableHandle(aligned))?;
        let id = self.next_reservation_id.max(1);
        self.next_reservation_id = id + 1;
        self.reservations.insert(
            id,
            Reservation {
                id,
                segment_id,
                term,
                reserved_ms: now,
                base: offset,
                len: aligned,
                free: BTreeMap::from([(offset, aligned)]),
            },
        );
        Ok((id, offset))
    }

    fn retire_reservations(&mut self, ids: &[ReservationId]) -> u64 {
        let mut retired = 0;
        for id in ids {
            if let Some(res) = self.reservations.remove(id) {
                if let Some(alloc) = self.allocators.get_mut(&res.segment_id) {
                    for (&offset, &len) in &res.free {
                        let freed = alloc.free(offset, len);
                        debug_assert!(freed, "a reservation's free range was not allocated");
                    }
                }
                retired += 1;
            }
        }
        retired
    }

    /// The reservation of `r`'s segment whose free ranges hold `r` wholly.
    fn reservation_holding(&self, r: &Replica) -> Option<ReservationId> {
        self.reservations
            .values()
            .find(|res| {
                res.segment_id == r.segment_id && res.free_range_holding(r.offset, r.len).is_some()
            })
            .map(|res| res.id)
    }

    fn put_commit(
        &mut self,
        now: u64,
        writer: Option<&str>,
        item: &CommitItem,
        config: &ReplicateConfig,
        policy: &PutPolicy,
    ) -> Result<(), MetaError> {
        let key = item.key.as_str();
        if item.replicas.is_empty() {
            // A put whose start was committed, finished in the same entry.
            return self.put_end(now, writer, key, item.checksum, item.put_id);
        }
        if item.size == 0 {
            return Err(MetaError::InvalidParams(format!(
                "object {key:?} has size 0"
            )));
        }
        if item.replicas.is_empty() || item.replicas.len() > config.replica_num.max(1) as usize {
            return Err(MetaError::InvalidParams(format!(
                "object {key:?} names {} replicas for replica_num {}",
                item.replicas.len(),
                config.replica_num
            )));
        }
        for (i, r) in item.replicas.iter().enumerate() {
            if r.len != item.size {
                return Err(MetaError::InvalidParams(format!(
                    "a replica of {key:?} is {} bytes long, the object {}",
                    r.len, item.size
                )));
            }
            if item.replicas[..i]
                .iter()
                .any(|o| o.segment_id == r.segment_id)
            {
                return Err(MetaError::InvalidParams(format!(
                    "two replicas of {key:?} on segment {}",
                    r.segment_id
                )));
            }
        }
        if now > item.deadline_ms {
            // The placing leader may have given the range to another put.
            return Err(MetaError::InvalidWrite(format!(
                "{key}: its placement expired before the commit; put it again"
            )));
        }
        self.may_put(now, key)?;
        let mut holders = Vec::with_capacity(item.replicas.len());
        for r in &item.replicas {
            match self.reservation_holding(r) {
                Some(id) => holders.push(id),
                None => {
                    return Err(MetaError::InvalidWrite(format!(
                        "{key}: its placement is not free space of a reservation (retired, or taken by another put)"
                    )))
                }
            }
        }
        self.take_over_zombie(now, key);
        for (r, id) in item.replicas.iter().zip(holders) {
            let taken = self
                .reservations
                .get_mut(&id)
                .is_some_and(|res| res.take(r.offset, r.len));
            debug_assert!(taken, "checked free above");
        }
        let obj = Object {
            size: item.size,
            replicas: item.replicas.clone(),
            phase: PutPhase::Complete { completed_ms: now },
            checksum: item.checksum,
            soft_pin_until_ms: if config.soft_pin {
                now.saturating_add(policy.soft_pin_ttl_ms)
            } else {
                0
            },
            hard_pin: config.hard_pin,
            created_ms: now,
            writer: writer.unwrap_or_default().to_string(),
            put_id: item.put_id,
        };
        count_in(&mut self.usage, key, &obj);
        self.objects.insert(key.to_string(), obj);
        Ok(())
    }

    fn free_replicas(&mut self, replicas: &[Replica]) {
        for r in replicas {
            if let Some(alloc) = self.allocators.get_mut(&r.segment_id) {
                let freed = alloc.free(r.offset, r.len);
                debug_assert!(freed, "freeing a range that is not allocated");
            }
        }
    }

    /// True when the earliest unfinished put or parked range is due for reclaim.
    pub fn has_reclaimable(&self, now_ms: u64) -> bool {
        self.pending_release.iter().any(|p| p.release_at_ms <= now_ms)
            || self.tier_moves.values().any(|d| d.release_at_ms <= now_ms)
            || self.objects.values().any(
                |o| matches!(o.phase, PutPhase::Processing { release_at_ms, .. } if release_at_ms <= now_ms),
            )
    }
}
