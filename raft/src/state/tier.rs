//! Copies between the memory and disk tiers: their start, their end, and
//! the copies released after them.

use super::*;

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

impl MetaState {
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

    pub(super) fn tier_moves_start(
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

    pub(super) fn tier_moves_end(
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
    pub(super) fn tier_move_start(
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
    pub(super) fn tier_move_end(
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
    pub(super) fn release_held(&mut self, now: u64, replicas: Vec<Replica>, hold_until: u64) {
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
    pub(super) fn drop_copies_in(
        &mut self,
        now: u64,
        key: &str,
        tier: Tier,
        hold_until: u64,
    ) -> bool {
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
}
