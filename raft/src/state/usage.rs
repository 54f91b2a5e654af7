//! Reads of the state: capacity and usage per tier and writer, and
//! lookups of objects.

use super::*;

impl MetaState {
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
    pub(super) fn held_in(&self, tier: Tier) -> u64 {
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
    pub(super) fn fits_some_empty_live_segment(&self, size: u64) -> bool {
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

    /// Bytes reserved for leaders' placements and not yet holding an object.
    pub fn reserved_free(&self) -> u64 {
        self.reservations
            .values()
            .fold(0u64, |sum, r| sum.saturating_add(r.free_bytes()))
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
}
