//! Segments: what a store contributes (memory or a disk file), its key,
//! and mounting, expiring and unmounting them.

use super::*;

pub type SegmentId = u64;

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

/// A segment's key as the state keeps it; `Debug` does not print it.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Default)]
pub struct SegmentKeyBytes(pub Vec<u8>);

impl std::fmt::Debug for SegmentKeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SegmentKeyBytes({} bytes)", self.0.len())
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub id: SegmentId,
    pub spec: SegmentSpec,
    pub owner: String,
    pub mounted_ms: u64,
    /// The key its store chose at mount: masters sign its grants with it.
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

/// The largest segment a mount may declare (256 TiB): far above any machine's
/// memory; with sums saturating besides, a total can never wrap around.
pub const MAX_SEGMENT_CAPACITY: u64 = 1 << 48;

impl MetaState {
    pub(super) fn mount(
        &mut self,
        now: u64,
        spec: &SegmentSpec,
        owner: &str,
        key: &SegmentKeyBytes,
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
            if !crescent_auth::constant_time_eq(&existing.key.0, &key.0) {
                return Err(MetaError::SegmentKeyMismatch(spec.name.clone()));
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
                seg.key = key.clone();
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
                key: key.clone(),
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
    pub(super) fn mount_tiered(
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
        let id = self.mount(now, spec, owner, key)?;
        if let Some(seg) = self.segments.get_mut(&id) {
            seg.tier = tier;
            seg.disk_id = disk_id.to_string();
        }
        Ok(id)
    }

    pub(super) fn unmount(&mut self, segment_id: SegmentId) -> Result<(), MetaError> {
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
}
