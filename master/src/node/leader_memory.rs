//! What the leader remembers that is not in the log: read leases,
//! heartbeats, access times, doom marks, disk reads and failed copy
//! targets.

use super::*;

/// What the leader remembers that is not in the log. A new leader starts empty
/// and compensates by waiting (see `LeaderMemory::in_takeover_grace`).
pub struct LeaderMemory {
    since: Instant,
    term: u64,
    heartbeats: HashMap<String, Instant>,
    leases: HashMap<String, Instant>,
    last_access_ms: HashMap<String, u64>,
    /// Keys about to be removed or evicted, with how many removals or
    /// evictions in flight claim each: reads treat them as gone so no new
    /// lease is granted on them meanwhile.
    doomed: HashMap<String, u32>,
    seen_alloc_failures: u64,
    /// Lookups of objects only on disk, and those due for promotion.
    pub(super) disk_reads: promotion::DiskReads,
    /// Segments a copy between tiers failed to write, and until when they
    /// are not picked as copy targets (see [`MasterNode::avoid_copy_targets`]).
    pub(super) failed_copy_targets: HashMap<SegmentId, Instant>,
}

/// How long, past the failed copies' release time, a segment that failed
/// a copy between tiers (a disk answering I/O errors, say) is passed over
/// as a copy target: its victims go to another segment meanwhile, or are
/// evicted when none has room, rather than fail against it every round.
pub const COPY_TARGET_BACKOFF: Duration = Duration::from_secs(30);

impl LeaderMemory {
    pub(super) fn new(term: u64, seen_alloc_failures: u64) -> Self {
        Self {
            since: Instant::now(),
            term,
            heartbeats: HashMap::new(),
            leases: HashMap::new(),
            last_access_ms: HashMap::new(),
            doomed: HashMap::new(),
            seen_alloc_failures,
            disk_reads: promotion::DiskReads::new(0, Duration::ZERO),
            failed_copy_targets: HashMap::new(),
        }
    }

    /// Counts lookups of disk-only objects for promotion: see
    /// [`promotion::DiskReads`].
    pub(super) fn promoting(mut self, reads: u32, window: Duration) -> Self {
        self.disk_reads = promotion::DiskReads::new(reads, window);
        self
    }

    pub fn is_leased(&self, key: &str, now: Instant) -> bool {
        self.leases.get(key).is_some_and(|exp| *exp > now)
    }

    pub fn is_doomed(&self, key: &str) -> bool {
        self.doomed.contains_key(key)
    }

    /// Marks `keys` doomed for one removal or eviction; each mark is taken
    /// back by exactly one [`undoom`](Self::undoom) of the same keys.
    pub fn doom(&mut self, keys: &[String]) {
        for k in keys {
            *self.doomed.entry(k.clone()).or_insert(0) += 1;
        }
    }

    pub fn undoom(&mut self, keys: &[String]) {
        for k in keys {
            if let Some(n) = self.doomed.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.doomed.remove(k);
                }
            }
        }
    }

    /// True while leases granted by an earlier leader may still be in force:
    /// this memory belongs to another term than `current_term` (not reset
    /// yet), or was reset less than `lease_ttl` ago. A lease's holder sent
    /// its request before the old leader's read index was confirmed by a
    /// quorum, and so before any later leader was elected; so its lease ends
    /// before this grace does.
    pub fn in_takeover_grace(&self, current_term: u64, lease_ttl: Duration) -> bool {
        self.term != current_term || self.since.elapsed() < lease_ttl
    }

    /// How long ago this memory was reset (leadership gained).
    pub fn leading_for(&self) -> Duration {
        self.since.elapsed()
    }

    /// Read leases on `keys` until `until`, and their last access at
    /// `access_ms` (Unix ms, what eviction orders by).
    pub fn grant_leases<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a str>,
        until: Instant,
        access_ms: u64,
    ) {
        for k in keys {
            self.leases.insert(k.to_string(), until);
            self.last_access_ms.insert(k.to_string(), access_ms);
        }
    }

    /// Forgets leases that ran out by `now` (an expired lease decides
    /// nothing, but would stay in memory until the next election).
    pub fn expire_leases(&mut self, now: Instant) {
        self.leases.retain(|_, exp| *exp > now);
    }

    /// Splits the `keys` of a removal into those it must refuse, because a
    /// reader may hold a lease on them (this leader leased them, another
    /// removal or an eviction claims them, or `in_grace`: a predecessor's
    /// leases are unknown), and those that go; `force` refuses none. The
    /// keys that go are doomed until the removal is settled, and the caller
    /// must [`undoom`](Self::undoom) exactly them then.
    pub fn claim_for_removal(
        &mut self,
        keys: &[String],
        force: bool,
        in_grace: bool,
        now: Instant,
    ) -> (BTreeSet<String>, Vec<String>) {
        let mut leased = BTreeSet::new();
        let mut going = Vec::new();
        for k in keys {
            if !force && (in_grace || self.is_leased(k, now) || self.is_doomed(k)) {
                leased.insert(k.clone());
            } else {
                going.push(k.clone());
            }
        }
        self.doom(&going);
        (leased, going)
    }

    /// What eviction may know of `key`: a key leased or doomed is not a
    /// candidate.
    pub fn access_info(&self, key: &str, now: Instant) -> AccessInfo {
        AccessInfo {
            leased: self.is_leased(key, now) || self.is_doomed(key),
            last_access_ms: self.last_access_ms.get(key).copied(),
        }
    }

    /// Forgets the access times of `keys` (evicted, or no longer there).
    pub fn forget_access(&mut self, keys: &[String]) {
        for k in keys {
            self.last_access_ms.remove(k);
        }
    }

    /// True when the state counts more failed allocations (`total`) than
    /// the last eviction round saw: a put found no space since.
    pub fn alloc_failures_unseen(&self, total: u64) -> bool {
        total > self.seen_alloc_failures
    }

    /// Records the failed allocations an eviction round answered.
    pub fn saw_alloc_failures(&mut self, total: u64) {
        self.seen_alloc_failures = total;
    }

    /// Records that `client` was alive at `now`.
    pub fn record_heartbeat(&mut self, client: &str, now: Instant) {
        self.heartbeats.insert(client.to_string(), now);
    }

    /// Clients heard from within `ttl` before `now`.
    pub fn active_clients(&self, ttl: Duration, now: Instant) -> usize {
        self.heartbeats
            .values()
            .filter(|t| now.duration_since(**t) <= ttl)
            .count()
    }

    /// Of `owners`, those not heard from within `ttl` before `now`; one
    /// never heard from counts from when this memory was reset, so a new
    /// leader gives every owner one TTL. Forgets clients silent for two TTLs
    /// first: their segments are expired by then (or they own none), so the
    /// entry no longer decides anything.
    pub fn silent_owners(
        &mut self,
        owners: impl IntoIterator<Item = String>,
        ttl: Duration,
        now: Instant,
    ) -> Vec<String> {
        self.heartbeats
            .retain(|_, last| now.duration_since(*last) <= 2 * ttl);
        owners
            .into_iter()
            .filter(|o| {
                let last = self.heartbeats.get(o).copied().unwrap_or(self.since);
                now.duration_since(last) > ttl
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An eviction and a removal can claim one key at once; the key stays
    /// doomed until both are settled (a set once let the first to finish
    /// un-doom it while the other's entry was still in flight).
    #[test]
    fn doom_marks_are_counted() {
        let mut mem = LeaderMemory::new(1, 0);
        let k = vec!["k".to_string()];
        mem.doom(&k);
        mem.doom(&k);
        mem.undoom(&k);
        assert!(mem.is_doomed("k"));
        mem.undoom(&k);
        assert!(!mem.is_doomed("k"));
        mem.undoom(&k);
        assert!(!mem.is_doomed("k"), "an extra undoom is harmless");
    }

    #[test]
    fn takeover_grace_covers_an_unreset_memory_and_the_first_lease_ttl() {
        let mem = LeaderMemory::new(5, 0);
        let ttl = Duration::from_secs(60);
        assert!(mem.in_takeover_grace(5, ttl), "just reset");
        assert!(
            mem.in_takeover_grace(6, Duration::ZERO),
            "another term's memory"
        );
        assert!(!mem.in_takeover_grace(5, Duration::ZERO));
    }

    fn keys(ks: &[&str]) -> Vec<String> {
        ks.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn leases_run_out_and_the_sweep_forgets_only_expired_ones() {
        let mut mem = LeaderMemory::new(1, 0);
        let now = Instant::now();
        mem.grant_leases(["short"], now + Duration::from_secs(1), 42);
        mem.grant_leases(["long"], now + Duration::from_secs(60), 43);
        assert!(mem.is_leased("short", now));
        assert!(!mem.is_leased("short", now + Duration::from_secs(2)));
        assert_eq!(mem.access_info("short", now).last_access_ms, Some(42));
        mem.expire_leases(now + Duration::from_secs(2));
        assert_eq!(mem.leases.len(), 1);
        assert!(mem.is_leased("long", now + Duration::from_secs(2)));
        // The access time outlives the lease: eviction still orders by it.
        assert_eq!(mem.access_info("short", now).last_access_ms, Some(42));
    }

    #[test]
    fn a_removal_refuses_keys_that_may_be_leased_and_dooms_the_rest() {
        let mut mem = LeaderMemory::new(1, 0);
        let now = Instant::now();
        mem.grant_leases(["leased"], now + Duration::from_secs(60), 1);
        mem.doom(&keys(&["doomed"]));
        let (refused, going) =
            mem.claim_for_removal(&keys(&["leased", "doomed", "free"]), false, false, now);
        assert_eq!(
            refused,
            keys(&["leased", "doomed"])
                .into_iter()
                .collect::<BTreeSet<_>>()
        );
        assert_eq!(going, keys(&["free"]));
        assert!(mem.is_doomed("free"));
        // The refusal added no mark: one undoom settles the earlier claim.
        mem.undoom(&keys(&["doomed"]));
        assert!(!mem.is_doomed("doomed"));

        let (refused, going) = mem.claim_for_removal(&keys(&["other"]), false, true, now);
        assert!(refused.contains("other") && going.is_empty(), "in grace");
        assert!(!mem.is_doomed("other"));

        let (refused, going) = mem.claim_for_removal(&keys(&["leased", "other"]), true, true, now);
        assert!(refused.is_empty(), "force refuses nothing");
        assert_eq!(going, keys(&["leased", "other"]));
        assert!(mem.is_doomed("leased") && mem.is_doomed("other"));
    }

    #[test]
    fn eviction_passes_over_leased_and_doomed_keys_and_forgets_access() {
        let mut mem = LeaderMemory::new(1, 0);
        let now = Instant::now();
        mem.grant_leases(["leased"], now + Duration::from_secs(60), 7);
        mem.grant_leases(["read-once"], now, 8);
        mem.doom(&keys(&["doomed"]));
        assert!(mem.access_info("leased", now).leased);
        assert!(mem.access_info("doomed", now).leased);
        let free = mem.access_info("read-once", now);
        assert!(!free.leased);
        assert_eq!(free.last_access_ms, Some(8));
        mem.forget_access(&keys(&["read-once"]));
        assert_eq!(mem.access_info("read-once", now).last_access_ms, None);
    }

    #[test]
    fn alloc_failures_count_once_per_round() {
        let mut mem = LeaderMemory::new(1, 3);
        assert!(!mem.alloc_failures_unseen(3));
        assert!(mem.alloc_failures_unseen(4));
        mem.saw_alloc_failures(4);
        assert!(!mem.alloc_failures_unseen(4));
    }

    #[test]
    fn heartbeats_decide_who_is_active_and_who_is_silent() {
        let mut mem = LeaderMemory::new(1, 0);
        let ttl = Duration::from_secs(10);
        let t0 = mem.since;
        assert!(
            mem.silent_owners(keys(&["never"]), ttl, t0 + Duration::from_secs(1))
                .is_empty(),
            "a new leader gives every owner one TTL"
        );
        mem.record_heartbeat("a", t0);
        mem.record_heartbeat("b", t0 + Duration::from_secs(5));
        let now = t0 + Duration::from_secs(12);
        assert_eq!(mem.active_clients(ttl, now), 1);
        assert_eq!(
            mem.silent_owners(keys(&["a", "b", "never"]), ttl, now),
            keys(&["a", "never"])
        );
        // Two TTLs after its last heartbeat a client is forgotten.
        let later = t0 + Duration::from_secs(25);
        mem.silent_owners(Vec::new(), ttl, later);
        assert!(!mem.heartbeats.contains_key("a"));
        assert!(mem.heartbeats.contains_key("b"));
    }
}
