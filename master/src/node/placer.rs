//! Where the leader puts one-commit puts: inside reservations of its own
//! term, without a Raft commit per placement (the argument
//! is in docs/one-commit-puts.md).
//!
//! Owns the leader-memory half of one-commit puts: which ranges of its own
//! reservations are promised to puts not committed yet, and which keys have
//! such a put in flight. The replicated half (reservations, and the commit
//! that takes a range out of one) is `crescent_raft::state`. Pure: no I/O and
//! no clock; callers pass "now" (leader wall clock, ms).
//!
//! The fence: a leader places only inside reservations tagged with its own
//! term. A reservation of an earlier term may hold ranges its leader promised
//! to writers who are still writing; this leader knows nothing of them, so it
//! never places there and retires such a reservation only after
//! `--put-start-release-timeout` (the same wait a zombie two-commit put's space
//! gets). [`UnsafeSwitches`] break that rule and the write fence; they
//! exist so the chaos checker can show it catches each bug class.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crescent_raft::alloc::{aligned_len, Allocator};
use crescent_raft::state::{
    MetaError, MetaState, PutId, Replica, ReservationId, SegmentId, MAX_RESERVATIONS_PER_SEGMENT,
};

/// A reservation this leader places in, with its own view of what is promised.
struct Open {
    segment_id: SegmentId,
    base: u64,
    /// Offsets relative to `base`; allocated = committed or promised.
    alloc: Allocator,
    inflight: u32,
    /// A placement did not fit: no new ones go here; retired once `inflight` is 0.
    full: bool,
}

/// A put placed and not committed, revoked or expired yet.
struct Pending {
    key: String,
    client: String,
    put_id: PutId,
    ranges: Vec<(ReservationId, Replica)>,
    discard_at_ms: u64,
    release_at_ms: u64,
    /// A PutCommit naming exactly this placement is in flight: its outcome
    /// decides, not a revoke or the release time.
    committing: bool,
    /// Its PutStart was answered with it: only then may a retry of the same
    /// put be given it again (a placement the request then undid must not
    /// reach a writer).
    answered: bool,
}

/// What [`Placer::place_tracked`] did besides answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracked {
    /// Made a new placement with this id (undo it by id if the request
    /// falls back; mark it answered if not).
    Created(u64),
    /// Gave an answered placement again; its grants must expire when the
    /// first answer's did.
    Again {
        grant_expiry_ms: u64,
    },
    Nothing,
}

/// Whether a placement may be committed (see [`Placer::commit_status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitStatus {
    Ready,
    /// A commit of it is in flight (a retry with a new request id).
    InFlight,
    /// This leader holds no such placement.
    Unknown,
}

/// TEST ONLY switches that break the placer's fences (the master's
/// `--unsafe-*` flags of the same names); both off in production.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnsafeSwitches {
    /// Place inside earlier terms' reservations at once.
    pub adopt_foreign: bool,
    /// Free a revoked or refused placement's range at once, while a write
    /// under its grants may still land.
    pub reuse_revoked: bool,
}

/// How a placement that leaves flight gives its ranges back.
#[derive(Clone, Copy)]
enum Settle {
    /// A commit took them.
    Taken,
    /// No writer can be writing them (never answered, or past the release
    /// time): free now.
    Free,
    /// A write under its grants may still land (the writer revoked after a
    /// failed or timed-out transfer, or its commit was refused): free once
    /// the grants can no longer be honoured.
    Fence,
}

/// A writer's name for one of its puts, as the placer files placements.
type PutKey = (String, String, PutId);

/// The key a placement made ahead of its put is filed under (no key is
/// empty: the service refuses one). Such a placement is found by its
/// writer and put id only, refuses no other put of any key, and checks no
/// key's existence: its PutEnd names the key, and the state machine's
/// commit decides (docs/one-commit-puts.md, "Placements ahead").
pub const AHEAD_KEY: &str = "";

/// What one placement request came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Placed {
    Replicas(Vec<Replica>),
    /// A retry of a put placed before: the same replicas.
    Again(Vec<Replica>),
    /// The put cannot start (another put of the key in flight, or it exists).
    Refused(MetaError),
    /// Reserve on these segments, then ask again.
    NeedReservations(Vec<SegmentId>),
    /// Not placeable here (no room for a reservation, an item too large for
    /// one, a two-commit put of the key unfinished): use the two-commit path.
    TwoCommit,
}

/// One put to place.
pub struct PlaceRequest<'a> {
    pub key: &'a str,
    pub size: u64,
    pub client: &'a str,
    pub put_id: PutId,
    pub replica_num: u32,
    /// Live segments in the order to try (preferred first).
    pub order: &'a [SegmentId],
}

/// Timing of placements, from the master's flags.
#[derive(Clone, Copy, Debug)]
pub struct PlaceTimes {
    pub now_ms: u64,
    /// Until then another put of the key is refused; also the commit deadline
    /// (the write grants expire then).
    pub discard_after_ms: u64,
    /// Until then the range stays promised if no commit or revoke comes.
    pub release_after_ms: u64,
}

pub struct Placer {
    term: u64,
    since_ms: u64,
    switches: UnsafeSwitches,
    reservation_bytes: u64,
    open: BTreeMap<ReservationId, Open>,
    pending: HashMap<u64, Pending>,
    by_key: HashMap<String, u64>,
    /// (client, key, put id) -> its placements (more than one only after a
    /// discard-time takeover by a retry of the same put).
    by_put: HashMap<PutKey, Vec<u64>>,
    per_client: HashMap<String, u64>,
    /// Ranges of placements that ended without a commit while a write under
    /// their grants may still land (revoked, or the commit refused), with
    /// when they may be placed again; they keep their reservation in use.
    fenced: Vec<(ReservationId, Replica, u64)>,
    next_pending: u64,
    /// Reservations this leader's own Reserve entries made. Its term alone
    /// would not tell if a leader could restart into the same term (openraft
    /// restores a committed vote's leadership on restart; the Raft store now
    /// prevents that, see `without_leadership`): it must not adopt what its
    /// previous incarnation reserved, whose placements it no longer knows
    /// and whose writers may still be writing. Kept as a second guard.
    made: BTreeSet<ReservationId>,
}

impl Placer {
    pub fn new(term: u64, since_ms: u64, reservation_bytes: u64, switches: UnsafeSwitches) -> Self {
        Self {
            term,
            since_ms,
            switches,
            reservation_bytes,
            open: BTreeMap::new(),
            pending: HashMap::new(),
            by_key: HashMap::new(),
            by_put: HashMap::new(),
            per_client: HashMap::new(),
            fenced: Vec::new(),
            next_pending: 1,
            made: BTreeSet::new(),
        }
    }

    /// Records a reservation this leader's own Reserve entry made.
    pub fn record_reservation(&mut self, id: ReservationId) {
        self.made.insert(id);
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// Puts of `client` placed and not finished.
    pub fn inflight_of(&self, client: &str) -> u64 {
        self.per_client.get(client).copied().unwrap_or(0)
    }

    pub fn inflight(&self) -> usize {
        self.pending.len()
    }

    /// How much to reserve at least on a segment of `capacity` bytes: the
    /// configured size, at most 1/64 of the segment (an earlier term's
    /// reservations stay out of use for the release timeout, so each must be
    /// small). Items larger than this take two commits (their transfer
    /// dwarfs one more commit).
    pub fn reservation_len(&self, capacity: u64) -> u64 {
        let len = self.reservation_bytes.min(capacity / 64);
        len & !(crescent_raft::alloc::ALIGNMENT - 1)
    }

    /// The most to reserve at once on a segment of `capacity` bytes, for a
    /// batch that needs more than [`reservation_len`](Self::reservation_len).
    pub fn reservation_cap(&self, capacity: u64) -> u64 {
        (capacity / 8) & !(crescent_raft::alloc::ALIGNMENT - 1)
    }

    fn mine(&self, res: &crescent_raft::state::Reservation) -> bool {
        (res.term == self.term && self.made.contains(&res.id)) || self.switches.adopt_foreign
    }

    /// Takes up reservations of this term that appeared in the state (this
    /// leader's Reserve entries, applied) and forgets those that left it.
    pub fn sync(&mut self, state: &MetaState) {
        self.open
            .retain(|id, _| state.reservations.contains_key(id));
        self.made.retain(|id| state.reservations.contains_key(id));
        for (id, res) in &state.reservations {
            if self.open.contains_key(id) || !self.mine(res) {
                continue;
            }
            let mut alloc = Allocator::new(res.len);
            let mut cursor = res.base;
            let end = res.base + res.len;
            for (&off, &len) in &res.free {
                if off > cursor {
                    alloc.reserve(cursor - res.base, off - cursor);
                }
                cursor = off + len;
            }
            if cursor < end {
                alloc.reserve(cursor - res.base, end - cursor);
            }
            self.open.insert(
                *id,
                Open {
                    segment_id: res.segment_id,
                    base: res.base,
                    alloc,
                    inflight: 0,
                    full: false,
                },
            );
        }
    }

    /// Places one put, or says what is missing. Call [`sync`](Self::sync) first.
    pub fn place(&mut self, state: &MetaState, req: &PlaceRequest<'_>, t: PlaceTimes) -> Placed {
        self.place_tracked(state, req, t).0
    }

    /// [`place`](Self::place), saying which placement it made or gave again.
    pub fn place_tracked(
        &mut self,
        state: &MetaState,
        req: &PlaceRequest<'_>,
        t: PlaceTimes,
    ) -> (Placed, Tracked) {
        let ahead = req.key == AHEAD_KEY;
        if ahead && req.put_id == 0 {
            // Only its put id can name an ahead placement again.
            return (Placed::TwoCommit, Tracked::Nothing);
        }
        if ahead {
            // A retried PutEnd asks again for the placement ahead its first
            // attempt got: the same one, not another left unused.
            let again = self
                .by_put
                .get(&(req.client.to_string(), AHEAD_KEY.to_string(), req.put_id))
                .into_iter()
                .flatten()
                .filter_map(|id| self.pending.get(id))
                .find(|p| t.now_ms < p.discard_at_ms && !p.committing && p.answered);
            if let Some(p) = again {
                return (
                    Placed::Again(p.ranges.iter().map(|(_, r)| r.clone()).collect()),
                    Tracked::Again {
                        grant_expiry_ms: p.discard_at_ms,
                    },
                );
            }
        }
        if let Some(pid) = self.by_key.get(req.key).filter(|_| !ahead) {
            match self.pending.get(pid) {
                // A retry of the same put gets the same placement, once its
                // first request answered with it.
                Some(p)
                    if t.now_ms < p.discard_at_ms
                        && p.client == req.client
                        && p.put_id == req.put_id
                        && req.put_id != 0
                        && !p.committing
                        && p.answered =>
                {
                    return (
                        Placed::Again(p.ranges.iter().map(|(_, r)| r.clone()).collect()),
                        Tracked::Again {
                            grant_expiry_ms: p.discard_at_ms,
                        },
                    );
                }
                Some(p) if t.now_ms < p.discard_at_ms => {
                    return (
                        Placed::Refused(MetaError::ReplicaNotReady(req.key.to_string())),
                        Tracked::Nothing,
                    )
                }
                // Past its discard time another put may take the key; the
                // old range stays promised until its release time.
                _ => {
                    self.by_key.remove(req.key);
                }
            }
        }
        match state.objects.get(req.key).filter(|_| !ahead) {
            Some(o) if o.is_complete() => {
                return (
                    Placed::Refused(MetaError::ObjectAlreadyExists(req.key.to_string())),
                    Tracked::Nothing,
                )
            }
            Some(_) => return (Placed::TwoCommit, Tracked::Nothing),
            None => {}
        }
        let Some(size) = aligned_len(req.size) else {
            return (Placed::TwoCommit, Tracked::Nothing);
        };
        let need = req.replica_num.max(1) as usize;
        if need > req.order.len() {
            return (Placed::TwoCommit, Tracked::Nothing);
        }
        let mut chosen: Vec<(ReservationId, Replica)> = Vec::with_capacity(need);
        let mut missing: Vec<SegmentId> = Vec::new();
        for &sid in req.order {
            if chosen.len() + missing.len() == need {
                break;
            }
            if let Some(placed) = self.allocate_on(sid, size, req.size) {
                chosen.push(placed);
                continue;
            }
            let Some(alloc) = state.allocator(sid) else {
                continue;
            };
            let want = self.reservation_len(alloc.capacity());
            if size > want {
                // Too large for this segment's reservations: two commits.
                self.undo(&chosen);
                return (Placed::TwoCommit, Tracked::Nothing);
            }
            let held = state
                .reservations
                .values()
                .filter(|r| r.segment_id == sid)
                .count();
            if alloc.largest_free() >= want && held < MAX_RESERVATIONS_PER_SEGMENT {
                missing.push(sid);
            }
        }
        if !missing.is_empty() {
            self.undo(&chosen);
            return (Placed::NeedReservations(missing), Tracked::Nothing);
        }
        if chosen.len() < need {
            self.undo(&chosen);
            return (Placed::TwoCommit, Tracked::Nothing);
        }
        for (rid, _) in &chosen {
            if let Some(o) = self.open.get_mut(rid) {
                o.inflight += 1;
            }
        }
        let id = self.next_pending;
        self.next_pending += 1;
        let replicas = chosen.iter().map(|(_, r)| r.clone()).collect();
        self.pending.insert(
            id,
            Pending {
                key: req.key.to_string(),
                client: req.client.to_string(),
                put_id: req.put_id,
                ranges: chosen,
                discard_at_ms: t.now_ms.saturating_add(t.discard_after_ms),
                release_at_ms: t.now_ms.saturating_add(t.release_after_ms),
                committing: false,
                answered: false,
            },
        );
        if !ahead {
            self.by_key.insert(req.key.to_string(), id);
        }
        self.by_put
            .entry((req.client.to_string(), req.key.to_string(), req.put_id))
            .or_default()
            .push(id);
        *self.per_client.entry(req.client.to_string()).or_insert(0) += 1;
        (Placed::Replicas(replicas), Tracked::Created(id))
    }

    /// A range of `size` (aligned) in an open, not full reservation on
    /// `sid`: the smallest free range that fits across the segment's
    /// reservations (best fit over all of them, not the first that fits),
    /// so holes are filled before a reservation's tail is cut into.
    fn allocate_on(
        &mut self,
        sid: SegmentId,
        size: u64,
        len: u64,
    ) -> Option<(ReservationId, Replica)> {
        let mut best: Option<(u64, ReservationId)> = None;
        for (id, o) in self.open.iter_mut() {
            if o.segment_id != sid || o.full {
                continue;
            }
            match o.alloc.best_fit(size) {
                Some(fit) if best.is_none_or(|(b, _)| fit < b) => best = Some((fit, *id)),
                Some(_) => {}
                None => o.full = true,
            }
        }
        let (_, id) = best?;
        let o = self.open.get_mut(&id)?;
        let rel = o.alloc.allocate(size)?;
        Some((
            id,
            Replica {
                segment_id: sid,
                offset: o.base + rel,
                len,
            },
        ))
    }

    fn undo(&mut self, chosen: &[(ReservationId, Replica)]) {
        for (rid, r) in chosen {
            if let Some(o) = self.open.get_mut(rid) {
                o.alloc.free(r.offset - o.base, r.len);
            }
        }
    }

    /// The placement of `client`'s put `put_id` of `key` with exactly
    /// `replicas`, if this leader made it.
    fn find(&self, client: &str, key: &str, put_id: PutId, replicas: &[Replica]) -> Option<u64> {
        let ids = self
            .by_put
            .get(&(client.to_string(), key.to_string(), put_id))?;
        ids.iter().copied().find(|id| {
            self.pending.get(id).is_some_and(|p| {
                p.ranges.len() == replicas.len()
                    && p.ranges.iter().zip(replicas).all(|((_, a), b)| a == b)
            })
        })
    }

    /// Whether `replicas` lie in reservations this leader places in: then
    /// only a commit of its own matching placement may take them.
    pub fn owns_any(&self, replicas: &[Replica]) -> bool {
        replicas.iter().any(|r| {
            self.open.values().any(|o| {
                o.segment_id == r.segment_id
                    && r.offset >= o.base
                    && r.offset < o.base + o.alloc.capacity()
            })
        })
    }

    /// A PutCommit of this placement is about to be proposed: from now on
    /// only its outcome settles it. False (propose nothing) when this
    /// leader made no such placement, or a commit of it is in flight.
    pub fn begin_commit(
        &mut self,
        client: &str,
        key: &str,
        put_id: PutId,
        replicas: &[Replica],
    ) -> bool {
        let Some(id) = self.find(client, key, put_id, replicas) else {
            return false;
        };
        match self.pending.get_mut(&id) {
            Some(p) if !p.committing => {
                p.committing = true;
                true
            }
            _ => false,
        }
    }

    /// Whether a commit of this placement may be proposed now.
    pub fn commit_status(
        &self,
        client: &str,
        key: &str,
        put_id: PutId,
        replicas: &[Replica],
    ) -> CommitStatus {
        match self
            .find(client, key, put_id, replicas)
            .and_then(|id| self.pending.get(&id))
        {
            None => CommitStatus::Unknown,
            Some(p) if p.committing => CommitStatus::InFlight,
            Some(_) => CommitStatus::Ready,
        }
    }

    /// The commit begun by [`begin_commit`](Self::begin_commit) is decided:
    /// applied (`taken`: its ranges hold the object now) or refused. A range
    /// is free again only if the state still has it free in its reservation.
    pub fn end_commit(
        &mut self,
        state: &MetaState,
        client: &str,
        key: &str,
        put_id: PutId,
        replicas: &[Replica],
        taken: bool,
    ) {
        if let Some(id) = self.find(client, key, put_id, replicas) {
            let settle = if taken { Settle::Taken } else { Settle::Fence };
            self.drop_pending(state, id, settle);
        }
    }

    /// The writer revoked its put: its ranges are placed again once no
    /// write under its grants can land any more
    /// ([`crescent_raft::state::write_fence_until`]), unless a
    /// commit of it is in flight (then that decides). False when this
    /// leader holds no such uncommitted placement.
    pub fn revoke(&mut self, state: &MetaState, client: &str, key: &str, put_id: PutId) -> bool {
        let Some(ids) = self
            .by_put
            .get(&(client.to_string(), key.to_string(), put_id))
            .cloned()
        else {
            return false;
        };
        let mut found = false;
        for id in ids {
            if self.pending.get(&id).is_some_and(|p| !p.committing) {
                self.drop_pending(state, id, Settle::Fence);
                found = true;
            }
        }
        found
    }

    fn drop_pending(&mut self, state: &MetaState, id: u64, settle: Settle) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        let fenced_until =
            crescent_raft::state::write_fence_until(p.discard_at_ms, p.release_at_ms);
        let settle = match settle {
            Settle::Fence if self.switches.reuse_revoked => Settle::Free,
            other => other,
        };
        if self.by_key.get(&p.key) == Some(&id) {
            self.by_key.remove(&p.key);
        }
        let put = (p.client.clone(), p.key.clone(), p.put_id);
        if let Some(ids) = self.by_put.get_mut(&put) {
            ids.retain(|x| *x != id);
            if ids.is_empty() {
                self.by_put.remove(&put);
            }
        }
        if let Some(n) = self.per_client.get_mut(&p.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_client.remove(&p.client);
            }
        }
        for (rid, r) in p.ranges {
            match settle {
                Settle::Fence => self.fenced.push((rid, r, fenced_until)),
                Settle::Taken => self.release_range(state, rid, &r, false),
                Settle::Free => self.release_range(state, rid, &r, true),
            }
        }
    }

    /// A placement's range leaves flight; with `free`, it may be placed
    /// again if the replicated state still has it free in its reservation
    /// (no commit took it, whatever its writer did: the state is the judge).
    fn release_range(&mut self, state: &MetaState, rid: ReservationId, r: &Replica, free: bool) {
        let still_free = state
            .reservations
            .get(&rid)
            .is_some_and(|res| res.free_range_holding(r.offset, r.len).is_some());
        if let Some(o) = self.open.get_mut(&rid) {
            o.inflight = o.inflight.saturating_sub(1);
            if free && still_free {
                o.alloc.free(r.offset - o.base, r.len);
            }
        }
    }

    /// The request that made these placements answered with them.
    pub fn mark_answered(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(p) = self.pending.get_mut(id) {
                p.answered = true;
            }
        }
    }

    /// Undoes placements a request made and did not answer with.
    pub fn undo_placements(&mut self, state: &MetaState, ids: &[u64]) {
        for &id in ids {
            // Never answered: no writer holds its grants.
            if self
                .pending
                .get(&id)
                .is_some_and(|p| !p.committing && !p.answered)
            {
                self.drop_pending(state, id, Settle::Free);
            }
        }
    }

    /// Frees the ranges of placements neither committed nor revoked by their
    /// release time (their writer can no longer be writing), and fenced
    /// ranges whose fence has passed. One whose commit is in flight waits
    /// for its outcome.
    pub fn expire(&mut self, state: &MetaState, now_ms: u64) {
        let due: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.release_at_ms <= now_ms && !p.committing)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.drop_pending(state, id, Settle::Free);
        }
        let (due, fenced): (Vec<_>, Vec<_>) = std::mem::take(&mut self.fenced)
            .into_iter()
            .partition(|(_, _, until)| *until <= now_ms);
        self.fenced = fenced;
        for (rid, r, _) in due {
            self.release_range(state, rid, &r, true);
        }
    }

    /// Ranges fenced now (revoked or refused placements waiting out their
    /// grants).
    pub fn fenced(&self) -> usize {
        self.fenced.len()
    }

    /// Reservations to retire now: this leader's full ones with nothing in
    /// flight, ones on segments no longer live, and an earlier term's once
    /// `release_after_ms` has passed since this leader took over. Those of
    /// its own it names take no placement from now on.
    pub fn retirable(
        &mut self,
        state: &MetaState,
        now_ms: u64,
        release_after_ms: u64,
    ) -> Vec<ReservationId> {
        // An earlier term's placements were all made before this leader
        // took over, and before any later term's recorded start.
        let due_after = |start: u64| now_ms >= start.saturating_add(release_after_ms);
        let foreign_due = |term: u64| {
            due_after(self.since_ms) || state.later_term_started_ms(term).is_some_and(due_after)
        };
        let due: Vec<ReservationId> = state
            .reservations
            .values()
            .filter(|res| match self.open.get(&res.id) {
                Some(o) => {
                    o.inflight == 0
                        && (o.full
                            || !state
                                .segments
                                .get(&res.segment_id)
                                .is_some_and(|s| s.is_live()))
                }
                None => !self.mine(res) && foreign_due(res.term),
            })
            .map(|res| res.id)
            .collect();
        for id in &due {
            if let Some(o) = self.open.get_mut(id) {
                o.full = true;
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_raft::state::{Command, Op, Response, SegmentKeyBytes, SegmentSpec, Tier};

    const MB: u64 = 1 << 20;

    fn apply(state: &mut MetaState, now: u64, op: Op) -> Response {
        state.apply(&Command {
            now_ms: now,
            seed: 0,
            origin: None,
            op,
        })
    }

    fn state_with_segment() -> MetaState {
        let mut s = MetaState::new();
        let r = apply(
            &mut s,
            1,
            Op::MountSegment {
                spec: SegmentSpec {
                    name: "a".into(),
                    endpoint: "a:1".into(),
                    capacity: 512 * MB,
                    ..Default::default()
                },
                owner: "o".into(),
                key: SegmentKeyBytes(vec![7; 32]),
                tier: Tier::Memory,
                disk_id: String::new(),
            },
        );
        assert_eq!(r, Response::Mounted(Ok(1)));
        s
    }

    fn times(now_ms: u64) -> PlaceTimes {
        PlaceTimes {
            now_ms,
            discard_after_ms: 30_000,
            release_after_ms: 600_000,
        }
    }

    fn req<'a>(key: &'a str, client: &'a str, put_id: PutId) -> PlaceRequest<'a> {
        PlaceRequest {
            key,
            size: 4096,
            client,
            put_id,
            replica_num: 1,
            order: &[1],
        }
    }

    /// Records the reservations of `p`'s term as its own (made by its
    /// Reserve entries), then syncs.
    fn claim_own(p: &mut Placer, s: &MetaState) {
        let term = p.term();
        for r in s.reservations.values().filter(|r| r.term == term) {
            p.record_reservation(r.id);
        }
        p.sync(s);
    }

    fn reserve(s: &mut MetaState, term: u64) {
        let r = apply(
            s,
            2,
            Op::Reserve {
                segment_id: 1,
                len: 8 * MB,
                term,
            },
        );
        assert!(matches!(r, Response::Reserved(Ok(_))), "{r:?}");
    }

    #[test]
    fn places_only_in_reservations_of_its_own_term() {
        let mut s = state_with_segment();
        reserve(&mut s, 4);
        let mut p = Placer::new(5, 10, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        assert_eq!(
            p.place(&s, &req("k", "c", 1), times(10)),
            Placed::NeedReservations(vec![1]),
            "a term-4 reservation must not be used by the term-5 leader"
        );
        reserve(&mut s, 5);
        claim_own(&mut p, &s);
        let Placed::Replicas(r) = p.place(&s, &req("k", "c", 1), times(10)) else {
            panic!("placed nothing")
        };
        let own = s.reservations.values().find(|r| r.term == 5).unwrap();
        assert!(r[0].offset >= own.base && r[0].offset < own.base + own.len);
        // The broken switch places in the foreign one too.
        let mut broken = Placer::new(
            5,
            10,
            8 * MB,
            UnsafeSwitches {
                adopt_foreign: true,
                ..Default::default()
            },
        );
        claim_own(&mut broken, &s);
        assert_eq!(broken.open.len(), 2);
    }

    /// openraft restores a committed vote's leadership on restart: the
    /// restarted leader is in the same term but knows nothing of what its
    /// previous incarnation placed. It must treat that incarnation's
    /// reservations as foreign (found by the chaos suite: a leader killed
    /// and back as leader of term 1 handed a stalled writer's range out
    /// again, and an acknowledged object read back with wrong bytes).
    #[test]
    fn a_leader_restarted_into_its_term_does_not_adopt_its_earlier_reservations() {
        let mut s = state_with_segment();
        reserve(&mut s, 5);
        let mut before = Placer::new(5, 10, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut before, &s);
        let Placed::Replicas(stalled) = before.place(&s, &req("k1", "c", 1), times(10)) else {
            panic!("placed nothing")
        };
        // The process dies; the same node leads term 5 again.
        let mut after = Placer::new(5, 20, 8 * MB, UnsafeSwitches::default());
        after.sync(&s);
        assert_eq!(
            after.place(&s, &req("k2", "c", 2), times(20)),
            Placed::NeedReservations(vec![1]),
            "the earlier incarnation's reservation (holding {stalled:?}) must not be used"
        );
        // Retired a release timeout after this incarnation took over.
        assert!(after.retirable(&s, 20 + 599_999, 600_000).is_empty());
        assert_eq!(after.retirable(&s, 20 + 600_000, 600_000).len(), 1);
    }

    /// Best fit over all of a segment's reservations, not the first that
    /// fits: a same-size hole (here a whole small reservation) is filled
    /// before an older reservation's tail is cut into.
    #[test]
    fn a_put_takes_the_smallest_fitting_range_across_reservations() {
        let mut s = state_with_segment();
        reserve(&mut s, 1);
        let r = apply(
            &mut s,
            2,
            Op::Reserve {
                segment_id: 1,
                len: 4096,
                term: 1,
            },
        );
        let Response::Reserved(Ok((small, _))) = r else {
            panic!("{r:?}")
        };
        let mut p = Placer::new(1, 0, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        let Placed::Replicas(r) = p.place(&s, &req("k", "c", 1), times(0)) else {
            panic!("placed nothing")
        };
        let small = &s.reservations[&small];
        assert_eq!(r[0].offset, small.base, "placed in the large reservation");
    }

    #[test]
    fn a_key_in_flight_is_refused_until_its_discard_time() {
        let mut s = state_with_segment();
        reserve(&mut s, 1);
        let mut p = Placer::new(1, 0, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        assert!(matches!(
            p.place(&s, &req("k", "a", 1), times(0)),
            Placed::Replicas(_)
        ));
        assert_eq!(
            p.place(&s, &req("k", "b", 1), times(1)),
            Placed::Refused(MetaError::ReplicaNotReady("k".into()))
        );
        assert!(matches!(
            p.place(&s, &req("k", "b", 1), times(30_000)),
            Placed::Replicas(_)
        ));
        assert_eq!(p.inflight(), 2, "the zombie's range stays promised");
        p.expire(&s, 600_000);
        assert_eq!(p.inflight(), 1);
        assert_eq!(p.inflight_of("a"), 0);
    }

    /// Placements ahead (no key yet) are told apart by writer and put id
    /// alone: they refuse no put of any key, are not refused by one, and
    /// are committed, revoked and found again only by that put id.
    #[test]
    fn placements_ahead_are_named_by_their_put_id_only() {
        let mut s = state_with_segment();
        reserve(&mut s, 1);
        let mut p = Placer::new(1, 0, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        assert_eq!(
            p.place(&s, &req(AHEAD_KEY, "c", 0), times(0)),
            Placed::TwoCommit,
            "an ahead placement without a put id could never be named again"
        );
        let Placed::Replicas(a1) = p.place(&s, &req(AHEAD_KEY, "c", 1), times(0)) else {
            panic!("placed nothing")
        };
        let Placed::Replicas(a2) = p.place(&s, &req(AHEAD_KEY, "c", 2), times(1)) else {
            panic!("a second ahead placement must not be refused as a key in flight")
        };
        assert_ne!(a1, a2);
        let Placed::Replicas(k) = p.place(&s, &req("k", "c", 3), times(2)) else {
            panic!("a keyed put must not be refused by ahead placements")
        };
        assert_eq!(p.inflight_of("c"), 3);
        // Asked again for the same put (a retried PutEnd), once answered:
        // the same placement, with its first grants' expiry.
        p.mark_answered(&[1]);
        assert_eq!(
            p.place_tracked(&s, &req(AHEAD_KEY, "c", 1), times(5)),
            (
                Placed::Again(a1.clone()),
                Tracked::Again {
                    grant_expiry_ms: 30_000
                }
            )
        );
        assert_eq!(p.inflight_of("c"), 3, "no second placement");
        // Another writer, or another put id, cannot commit or revoke it.
        assert!(!p.begin_commit("d", AHEAD_KEY, 1, &a1));
        assert!(!p.begin_commit("c", AHEAD_KEY, 2, &a1));
        assert!(!p.revoke(&s, "c", AHEAD_KEY, 3));
        assert!(p.begin_commit("c", AHEAD_KEY, 1, &a1));
        assert!(!p.revoke(&s, "c", AHEAD_KEY, 1), "its commit is in flight");
        assert!(p.revoke(&s, "c", AHEAD_KEY, 2));
        assert_eq!(p.inflight_of("c"), 2);
        // The revoked range is fenced while its grants may be honoured,
        // then free again; the committing one is not.
        assert_eq!(p.fenced(), 1);
        let fence = 1 + 30_000 + crescent_raft::state::WRITE_FENCE_MARGIN_MS;
        let Placed::Replicas(other) = p.place(&s, &req(AHEAD_KEY, "c", 4), times(3)) else {
            panic!("placed nothing")
        };
        assert!(other != a2 && other != a1 && other != k);
        p.expire(&s, fence - 1);
        assert_eq!(p.fenced(), 1);
        p.expire(&s, fence);
        assert_eq!(p.fenced(), 0);
        let Placed::Replicas(again) = p.place(&s, &req(AHEAD_KEY, "c", 5), times(fence)) else {
            panic!("placed nothing")
        };
        assert_eq!(again, a2);
    }

    #[test]
    fn settled_ranges_return_only_when_not_committed() {
        let mut s = state_with_segment();
        reserve(&mut s, 1);
        let mut p = Placer::new(1, 0, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        let Placed::Replicas(a) = p.place(&s, &req("a", "c", 1), times(0)) else {
            panic!()
        };
        assert!(p.revoke(&s, "c", "a", 1));
        let Placed::Replicas(fenced) = p.place(&s, &req("f", "c", 9), times(0)) else {
            panic!()
        };
        assert_ne!(
            a, fenced,
            "a revoked range is not placed while its grant lasts"
        );
        p.expire(&s, 30_000 + crescent_raft::state::WRITE_FENCE_MARGIN_MS);
        let Placed::Replicas(b) = p.place(&s, &req("b", "c", 2), times(0)) else {
            panic!()
        };
        assert_eq!(
            a, b,
            "a revoked range is placed again once fenced long enough"
        );
        assert!(p.begin_commit("c", "b", 2, &b));
        assert!(
            !p.begin_commit("c", "b", 2, &b),
            "one commit in flight at a time"
        );
        assert!(
            !p.revoke(&s, "c", "b", 2),
            "a revoke does not free a range being committed"
        );
        commit_to(&mut s, "b", &b);
        p.end_commit(&s, "c", "b", 2, &b, true);
        let Placed::Replicas(c) = p.place(&s, &req("c", "c", 3), times(0)) else {
            panic!()
        };
        assert_ne!(
            b[0].offset, c[0].offset,
            "a committed range is never placed again"
        );
        assert!(
            !p.revoke(&s, "other", "c", 3),
            "only the writer revokes its put"
        );
        assert!(
            !p.begin_commit("c", "other-key", 3, &c),
            "a placement commits only for its own put"
        );
        // A range another entry took is not freed by a refused commit.
        assert!(p.begin_commit("c", "c", 3, &c));
        commit_to(&mut s, "stolen", &c);
        p.end_commit(&s, "c", "c", 3, &c, false);
        let Placed::Replicas(d) = p.place(&s, &req("d", "c", 4), times(0)) else {
            panic!()
        };
        assert_ne!(
            c[0].offset, d[0].offset,
            "a range the state holds must stay taken"
        );
    }

    #[test]
    fn a_retried_place_of_the_same_put_gets_the_same_placement() {
        let mut s = state_with_segment();
        reserve(&mut s, 1);
        let mut p = Placer::new(1, 0, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        let (Placed::Replicas(first), Tracked::Created(id)) =
            p.place_tracked(&s, &req("k", "c", 9), times(0))
        else {
            panic!()
        };
        assert_eq!(
            p.place(&s, &req("k", "c", 9), times(1)),
            Placed::Refused(MetaError::ReplicaNotReady("k".into())),
            "not given again before its request answered with it"
        );
        p.mark_answered(&[id]);
        assert_eq!(
            p.place_tracked(&s, &req("k", "c", 9), times(5)),
            (
                Placed::Again(first),
                Tracked::Again {
                    grant_expiry_ms: 30_000
                }
            )
        );
        p.undo_placements(&s, &[id]);
        assert_eq!(p.inflight(), 1);
    }

    fn commit_to(s: &mut MetaState, key: &str, replicas: &[Replica]) {
        let r = apply(
            s,
            3,
            Op::PutCommit {
                items: vec![crescent_raft::state::CommitItem {
                    key: key.into(),
                    size: replicas[0].len,
                    checksum: 0,
                    put_id: 1,
                    replicas: replicas.to_vec(),
                    deadline_ms: u64::MAX,
                }],
                config: crescent_raft::state::ReplicateConfig {
                    replica_num: 1,
                    ..Default::default()
                },
                policy: crescent_raft::state::PutPolicy {
                    discard_after_ms: 1,
                    release_after_ms: 1,
                    soft_pin_ttl_ms: 1,
                },
            },
        );
        assert_eq!(r, Response::Items(vec![Ok(())]));
    }

    #[test]
    fn full_reservations_and_foreign_ones_are_retired_in_time() {
        let mut s = state_with_segment();
        reserve(&mut s, 1);
        reserve(&mut s, 2);
        let mut p = Placer::new(2, 1_000, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        let big = PlaceRequest {
            size: 2 * MB,
            ..req("k", "c", 1)
        };
        for i in 0..4 {
            let key = format!("k{i}");
            let r = PlaceRequest { key: &key, ..big };
            assert!(matches!(p.place(&s, &r, times(1_000)), Placed::Replicas(_)));
        }
        let more = PlaceRequest { key: "k9", ..big };
        assert_eq!(
            p.place(&s, &more, times(1_000)),
            Placed::NeedReservations(vec![1])
        );
        let own = s.reservations.values().find(|r| r.term == 2).unwrap().id;
        assert!(p.retirable(&s, 1_000, 600_000).is_empty(), "puts in flight");
        for i in 0..4 {
            assert!(p.revoke(&s, "c", &format!("k{i}"), 1));
        }
        assert!(
            p.retirable(&s, 1_000, 600_000).is_empty(),
            "revoked ranges fenced"
        );
        p.expire(&s, 31_000 + crescent_raft::state::WRITE_FENCE_MARGIN_MS);
        assert_eq!(p.retirable(&s, 1_000, 600_000), vec![own]);
        let foreign = s.reservations.values().find(|r| r.term == 1).unwrap().id;
        let mut due = p.retirable(&s, 601_000, 600_000);
        due.sort();
        assert_eq!(due, vec![foreign.min(own), foreign.max(own)]);
        // A later term's recorded start also bounds the foreign one, earlier
        // than this leader's own start.
        apply(&mut s, 500, Op::LeaderStart { term: 2 });
        let mut p = Placer::new(3, 900_000, 8 * MB, UnsafeSwitches::default());
        claim_own(&mut p, &s);
        assert!(p.retirable(&s, 600_499, 600_000).is_empty());
        assert_eq!(
            p.retirable(&s, 600_500, 600_000),
            vec![foreign],
            "term 1 is bounded by term 2's start; term 2 only by this leader's own"
        );
    }
}
