//! Puts: committed placements (PutStart, PutEnd, PutRevoke), one-commit
//! placements in leaders' reservations (Reserve, PutCommit), the fences
//! that keep a range out of use while a write into it may still land, and
//! reclaiming abandoned puts.

use super::*;

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

pub type ReservationId = u64;

/// At most this many reservations per segment (all terms together): a
/// leader keeps one or two open; earlier terms' wait for retirement.
pub const MAX_RESERVATIONS_PER_SEGMENT: usize = 16;

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

impl MetaState {
    pub(super) fn put_start(
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
    pub(super) fn put_start_one(
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
    pub(super) fn may_put(&self, now: u64, key: &str) -> Result<(), MetaError> {
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
    pub(super) fn take_over_zombie(&mut self, now: u64, key: &str) {
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
    pub(super) fn placement_order(&self, seed: u64, preferred: &[String]) -> Vec<SegmentId> {
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
    pub(super) fn disk_placement_order(&self, seed: u64, preferred: &[String]) -> Vec<SegmentId> {
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

    pub(super) fn put_end(
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

    pub(super) fn put_revoke(
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

    pub(super) fn put_commit(
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

    pub(super) fn reserve(
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

    pub(super) fn retire_reservations(&mut self, ids: &[ReservationId]) -> u64 {
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
    pub(super) fn reservation_holding(&self, r: &Replica) -> Option<ReservationId> {
        self.reservations
            .values()
            .find(|res| {
                res.segment_id == r.segment_id && res.free_range_holding(r.offset, r.len).is_some()
            })
            .map(|res| res.id)
    }

    pub(super) fn free_replicas(&mut self, replicas: &[Replica]) {
        for r in replicas {
            if let Some(alloc) = self.allocators.get_mut(&r.segment_id) {
                let freed = alloc.free(r.offset, r.len);
                debug_assert!(freed, "freeing a range that is not allocated");
            }
        }
    }

    pub(super) fn reclaim(&mut self, now: u64) -> u64 {
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

    /// True when the earliest unfinished put or parked range is due for reclaim.
    pub fn has_reclaimable(&self, now_ms: u64) -> bool {
        self.pending_release.iter().any(|p| p.release_at_ms <= now_ms)
            || self.tier_moves.values().any(|d| d.release_at_ms <= now_ms)
            || self.objects.values().any(
                |o| matches!(o.phase, PutPhase::Processing { release_at_ms, .. } if release_at_ms <= now_ms),
            )
    }
}
