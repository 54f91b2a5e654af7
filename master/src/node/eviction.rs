//! Choosing what the leader evicts, demotes, promotes and releases, with
//! what its memory knows (leases, doom marks, failed copy targets).

use super::*;

impl MasterNode {
    /// The keys one eviction round takes, doomed until
    /// [`settle_eviction`](Self::settle_eviction), with the state's count of
    /// failed allocations; None when no round is due: the pool is below its
    /// watermark with no failed put since the last round, or a predecessor's
    /// leases may still be in force.
    pub fn claim_eviction_victims(&self) -> Option<(Vec<(String, ObjectStamp)>, u64)> {
        self.claim_victims_in(Tier::Memory)
    }

    /// As [`claim_eviction_victims`](Self::claim_eviction_victims), for the
    /// disk tier at its own watermark: objects only on disk, dropped for good.
    pub fn claim_disk_eviction_victims(&self) -> Option<Vec<(String, ObjectStamp)>> {
        self.claim_victims_in(Tier::Disk).map(|(v, _)| v)
    }

    /// At the disk watermark, the promoted objects (also in memory) whose
    /// disk copies go first, doomed until the entry's fate is known (as
    /// for [`claim_eviction_victims`](Self::claim_eviction_victims): a
    /// lease granted after the entry's time stamp would outlast the hold);
    /// None when no disk round is due, or a predecessor's leases may still
    /// be in force. Empty when no object is in both tiers.
    pub fn claim_disk_copies(&self) -> Option<Vec<String>> {
        let term = self.current_term();
        let sm = self.shared.sm.read().expect("state lock poisoned");
        let state = &sm.state;
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        if self.honours_predecessor_leases(&mem, term)
            || !should_evict_disk(state, self.config.disk_eviction_high_watermark)
        {
            return None;
        }
        let now = Instant::now();
        let copies = select_disk_copies(state, now_ms(), self.config.eviction_ratio, |k| {
            mem.access_info(k, now)
        });
        let copies = sizing::chunk_keys(copies, sizing::ENTRY_KEY_BUDGET)
            .into_iter()
            .next()
            .unwrap_or_default();
        mem.doom(&copies);
        Some(copies)
    }

    /// Eviction `victims` split by what frees their memory: see
    /// [`plan_eviction`].
    pub fn split_for_demotion(&self, victims: Vec<(String, ObjectStamp)>) -> EvictionPlan {
        let avoided = self.avoided_copy_targets();
        let sm = self.shared.sm.read().expect("state lock poisoned");
        plan_eviction(&sm.state, victims, MAX_MOVED_SIZE, &avoided)
    }

    /// Passes over `segments` as copy targets: a copy failed to write to
    /// each. Until the copies' release time (`--demotion-timeout`: a copy
    /// of unknown outcome holds its object as moving until then) and
    /// [`COPY_TARGET_BACKOFF`] more, so an object released from such a copy
    /// goes elsewhere, not back to the failing segment.
    pub fn avoid_copy_targets(&self, segments: &BTreeSet<SegmentId>) {
        if segments.is_empty() {
            return;
        }
        let backoff = self.config.demotion_timeout + COPY_TARGET_BACKOFF;
        let until = Instant::now() + backoff;
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        for s in segments {
            mem.failed_copy_targets.insert(*s, until);
        }
        tracing::warn!(
            ?segments,
            ?backoff,
            "copies between tiers failed to write to these segments; passing them over"
        );
    }

    /// The segments not to copy to now (see [`avoid_copy_targets`](Self::avoid_copy_targets)).
    pub fn avoided_copy_targets(&self) -> BTreeSet<SegmentId> {
        let now = Instant::now();
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        mem.failed_copy_targets.retain(|_, until| *until > now);
        mem.failed_copy_targets.keys().copied().collect()
    }

    /// Up to `max` keys due for promotion (looked up often enough while
    /// only on disk), taken off the queue: those still only on disk, not
    /// too large, whose copies keep the memory tier at or below
    /// `--promotion-max-memory-usage` and its high watermark (so promoting
    /// does not set off an eviction by itself). Keys that do not qualify
    /// are dropped; they queue again when read again.
    pub fn take_promotion_candidates(&self, max: usize) -> Vec<String> {
        let sm = self.shared.sm.read().expect("state lock poisoned");
        let state = &sm.state;
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        let queued = mem.disk_reads.take(max);
        let (capacity, _) = state.tier_usage(Tier::Memory);
        if queued.is_empty() || capacity == 0 {
            return Vec::new();
        }
        let ceiling = self
            .config
            .promotion_max_memory_usage
            .min(self.config.eviction_high_watermark);
        let mut used = state.eviction_usage_ratio() * capacity as f64;
        let mut out = Vec::new();
        for key in queued {
            if mem.is_doomed(&key) {
                continue;
            }
            let Some(o) = state.objects.get(&key) else {
                continue;
            };
            let live = |tier: Tier| o.replicas.iter().any(|r| state.live_in(r, tier));
            let Some(len) = crescent_raft::alloc::aligned_len(o.size) else {
                continue;
            };
            if !o.is_complete()
                || o.size > MAX_MOVED_SIZE
                || live(Tier::Memory)
                || !live(Tier::Disk)
                || (used + len as f64) / capacity as f64 > ceiling
            {
                continue;
            }
            used += len as f64;
            out.push(key);
        }
        out
    }

    /// The victims come with the stamps of the objects chosen, taken under
    /// the same lock: a key removed and put again later names another
    /// object, which the round must not drop.
    pub(super) fn claim_victims_in(&self, tier: Tier) -> Option<(Vec<(String, ObjectStamp)>, u64)> {
        let term = self.current_term();
        let sm = self.shared.sm.read().expect("state lock poisoned");
        let state = &sm.state;
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        // Leases granted by the previous leader may still be in force.
        if self.honours_predecessor_leases(&mem, term) {
            return None;
        }
        let due = match tier {
            Tier::Memory => {
                let failure_seen = mem.alloc_failures_unseen(state.alloc_failures);
                should_evict(state, self.config.eviction_high_watermark, failure_seen)
            }
            Tier::Disk => should_evict_disk(state, self.config.disk_eviction_high_watermark),
        };
        if !due {
            return None;
        }
        let now = Instant::now();
        let now_ms = now_ms();
        let keys = select_victims_in(state, tier, now_ms, self.config.eviction_ratio, |k| {
            mem.access_info(k, now)
        });
        // One log entry per round: the rest is chosen again next round.
        let victims = sizing::chunk_by(stamped(state, keys), sizing::ENTRY_KEY_BUDGET, |(k, _)| {
            k.len() + ObjectStamp::MAX_ENCODED_BYTES
        })
        .into_iter()
        .next()
        .unwrap_or_default();
        let keys: Vec<String> = victims.iter().map(|(k, _)| k.clone()).collect();
        mem.doom(&keys);
        Some((victims, state.alloc_failures))
    }

    /// Settles an eviction of `chosen` (by
    /// [`claim_eviction_victims`](Self::claim_eviction_victims)) once its
    /// entry's fate is known: forgets their access times and takes back
    /// their doom marks.
    pub fn settle_eviction(&self, chosen: &[String]) {
        self.leader_mem
            .lock()
            .expect("lock poisoned")
            .forget_access(chosen);
        self.undoom(chosen);
    }

    /// Records the failed allocations an eviction round answered (`total`,
    /// from [`claim_eviction_victims`](Self::claim_eviction_victims)).
    pub fn saw_alloc_failures(&self, total: u64) {
        self.leader_mem
            .lock()
            .expect("lock poisoned")
            .saw_alloc_failures(total);
    }
}
