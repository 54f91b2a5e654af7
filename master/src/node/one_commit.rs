//! One-commit puts on the node: placing under the leader lease, reserving
//! space when a placement finds none, settling placements, and retiring
//! reservations ([`super::placer`] holds the rules; this file the locks,
//! the proposals and the clock).

use std::sync::atomic::Ordering::Relaxed;

use crescent_raft::state::{Op, PutId, Replica, ReplicateConfig, SegmentId};
use crescent_raft::Response;

use super::placer::{CommitStatus, PlaceRequest, PlaceTimes, Placed, Tracked, AHEAD_KEY};
use super::{now_ms, MasterNode};

/// A PutEnd names a placement whose commit is already in flight.
#[derive(Debug)]
pub struct CommitInFlight;

/// Rounds of "reserve, then place again" per request: a batch larger than
/// one reservation needs a few.
const RESERVE_ROUNDS: usize = 4;

impl MasterNode {
    /// Places `items` (key, size, put id) of `client` for one commit each.
    /// None when this node may not place now: it does not lead under a
    /// lease (another leader may exist, and would not know these
    /// placements), or is handing leadership over. Then the caller takes
    /// the two-commit path, which gives the right refusal.
    pub async fn place_one_commit(
        &self,
        client: &str,
        items: &[(String, u64, PutId)],
        config: &ReplicateConfig,
    ) -> Option<Vec<(Placed, Option<u64>)>> {
        let times = PlaceTimes {
            now_ms: now_ms(),
            discard_after_ms: self.config.put_start_discard_timeout.as_millis() as u64,
            release_after_ms: self.config.put_start_release_timeout.as_millis() as u64,
        };
        let mut results: Vec<Option<(Placed, Tracked)>> = (0..items.len()).map(|_| None).collect();
        let term = self
            .place_rounds(client, items, config, times, &mut results)
            .await;
        let created: Vec<u64> = results
            .iter()
            .filter_map(|r| match r {
                Some((_, Tracked::Created(id))) => Some(*id),
                _ => None,
            })
            .collect();
        let all_placed = term.is_some()
            && results.iter().all(|r| {
                matches!(
                    r,
                    Some((
                        Placed::Replicas(_) | Placed::Again(_) | Placed::Refused(_),
                        _
                    ))
                )
            });
        {
            let state = self.state();
            let mut placer = self.placer.lock().expect("lock poisoned");
            let same_term = term.is_some_and(|t| placer.term() == t);
            if all_placed && same_term {
                placer.mark_answered(&created);
            } else {
                // The whole request takes the two-commit path: a request is
                // either all placements (nothing in the log; a retry gets the
                // same placements once this answer is given) or one entry (a
                // retry gets its answer from the dedup table), never a mix.
                // Only what this request made, and only in its own term's
                // memory, is undone.
                if same_term {
                    placer.undo_placements(&state, &created);
                }
                // A placement ahead that was not made is no put at all.
                let puts = items.iter().filter(|(k, _, _)| k != AHEAD_KEY).count();
                self.counters
                    .two_commit_fallbacks
                    .fetch_add(puts as u64, Relaxed);
                return None;
            }
        }
        self.counters
            .one_commit_placements
            .fetch_add(created.len() as u64, Relaxed);
        Some(
            results
                .into_iter()
                .map(|r| match r {
                    Some((p, Tracked::Again { grant_expiry_ms })) => (p, Some(grant_expiry_ms)),
                    Some((p, _)) => (p, None),
                    None => (Placed::TwoCommit, None),
                })
                .collect(),
        )
    }

    /// Whether this node may place for one commit now, and in which term:
    /// it leads under its lease, with its state applied up to its read
    /// index, and its placer belongs to this term.
    async fn placing_term(&self) -> Option<u64> {
        if self.transferring() {
            return None;
        }
        let index = self.lease_read_index().await?;
        self.wait_applied(index).await.ok()?;
        let term = self.current_term();
        (self.placer.lock().expect("lock poisoned").term() == term).then_some(term)
    }

    /// Places what it can, reserving between rounds; the term it placed
    /// in, or None when this node stopped being allowed to place (the caller
    /// undoes what was placed).
    async fn place_rounds(
        &self,
        client: &str,
        items: &[(String, u64, PutId)],
        config: &ReplicateConfig,
        times: PlaceTimes,
        results: &mut [Option<(Placed, Tracked)>],
    ) -> Option<u64> {
        let mut placed_in = None;
        for round in 0..RESERVE_ROUNDS {
            // Checked every round: a Reserve commit takes time, and the
            // lease must hold whenever a placement is made.
            let term = self.placing_term().await?;
            if placed_in.is_some_and(|t| t != term) {
                return None;
            }
            placed_in = Some(term);
            // Per segment: the bytes the items that found no room need, and
            // the most to reserve for them.
            let mut wanted: Vec<(SegmentId, u64, u64)> = Vec::new();
            {
                let state = self.state();
                let mut placer = self.placer.lock().expect("lock poisoned");
                if placer.term() != term {
                    return None;
                }
                placer.sync(&state);
                for (i, (key, size, put_id)) in items.iter().enumerate() {
                    if results[i].is_some() {
                        continue;
                    }
                    let order = self.placement_order(&state, &config.preferred_segments);
                    let req = PlaceRequest {
                        key,
                        size: *size,
                        client,
                        put_id: *put_id,
                        replica_num: config.replica_num,
                        order: &order,
                    };
                    match placer.place_tracked(&state, &req, times) {
                        (Placed::NeedReservations(segs), _) if round + 1 < RESERVE_ROUNDS => {
                            let need = crescent_raft::alloc::aligned_len(*size).unwrap_or(0);
                            for sid in segs {
                                match wanted.iter_mut().find(|(s, _, _)| *s == sid) {
                                    Some(w) => w.1 = w.1.saturating_add(need),
                                    None => {
                                        let (cap, free) = state
                                            .allocator(sid)
                                            .map_or((0, 0), |a| (a.capacity(), a.largest_free()));
                                        // A reservation the segment has no
                                        // room for would be a commit only to
                                        // be refused: with memory full, the
                                        // item takes the two-commit path at
                                        // once (where it may go to disk).
                                        if free < need {
                                            continue;
                                        }
                                        let chunk = placer.reservation_len(cap);
                                        // Never more than the segment has.
                                        let most = placer.reservation_cap(cap).max(chunk).min(free);
                                        wanted.push((sid, need.max(chunk), most));
                                    }
                                }
                            }
                        }
                        (Placed::NeedReservations(_), _) => {
                            results[i] = Some((Placed::TwoCommit, Tracked::Nothing))
                        }
                        done => results[i] = Some(done),
                    }
                }
            }
            if wanted.is_empty() {
                return placed_in;
            }
            let _one_at_a_time = self.reserving.lock().await;
            for (segment_id, need, most) in wanted {
                let len = need.min(most);
                match self
                    .propose(
                        None,
                        Op::Reserve {
                            segment_id,
                            len,
                            term,
                        },
                    )
                    .await
                {
                    Ok(Response::Reserved(Ok((id, _)))) => {
                        self.counters.reservations_made.fetch_add(1, Relaxed);
                        let mut placer = self.placer.lock().expect("lock poisoned");
                        if placer.term() == term {
                            placer.record_reservation(id);
                        }
                    }
                    Ok(other) => {
                        tracing::debug!(segment_id, ?other, "reservation refused");
                    }
                    Err(e) => {
                        tracing::debug!(segment_id, error = %e, "reservation not committed");
                        return None;
                    }
                }
            }
        }
        placed_in
    }

    /// Live segments that sign grants (have a key), preferred ones first,
    /// the rest rotated at random so puts spread over stores.
    fn placement_order(
        &self,
        state: &crescent_raft::MetaState,
        preferred: &[String],
    ) -> Vec<SegmentId> {
        // Memory only: one-commit puts never go to a disk segment (the state
        // refuses reservations there); a put memory cannot hold goes to
        // disk by the two-commit path.
        let usable =
            |s: &&crescent_raft::state::Segment| s.is_live() && !s.is_disk() && !s.key.0.is_empty();
        let mut order: Vec<SegmentId> = Vec::with_capacity(state.segments.len());
        for name in preferred {
            if let Some(s) = state.segment_by_name(name).filter(usable) {
                if !order.contains(&s.id) {
                    order.push(s.id);
                }
            }
        }
        let rest: Vec<SegmentId> = state
            .segments
            .values()
            .filter(usable)
            .filter(|s| !order.contains(&s.id))
            .map(|s| s.id)
            .collect();
        if !rest.is_empty() {
            let start = rand::random_range(0..rest.len());
            order.extend(rest[start..].iter().chain(rest[..start].iter()));
        }
        order
    }

    /// The preferred segments of a put retried after its writes to `avoid`
    /// failed: `config`'s preferred ones without those, then every other
    /// live memory segment, rotated at random. Both placement paths (this
    /// leader's placer, and the state machine for two-commit puts) append
    /// the segments a list leaves out, so the avoided ones are reached
    /// only when no other segment has room. The log entry carries the
    /// resulting order, so apply stays deterministic.
    pub fn preferred_avoiding(&self, preferred: &[String], avoid: &[String]) -> Vec<String> {
        let state = self.state();
        let others: Vec<&str> = state
            .segments
            .values()
            .filter(|s| s.is_live() && !s.is_disk())
            .map(|s| s.spec.name.as_str())
            .collect();
        let start = if others.is_empty() {
            0
        } else {
            rand::random_range(0..others.len())
        };
        preference_avoiding(preferred, avoid, &others, start)
    }

    /// Puts of `client` placed for one commit and not finished.
    pub fn one_commit_inflight(&self, client: &str) -> u64 {
        self.placer
            .lock()
            .expect("lock poisoned")
            .inflight_of(client)
    }

    /// Marks the placements of a PutEnd committing, all or none: per item,
    /// whether it may be proposed (outside this leader's own reservations,
    /// or its own placement of this very put); Err when a commit of one of
    /// them is already in flight (a retry under a new request id: it should
    /// retry later and find the first commit's outcome).
    pub fn begin_commits(
        &self,
        client: &str,
        items: &[(&str, PutId, &[Replica])],
    ) -> Result<Vec<bool>, CommitInFlight> {
        let mut placer = self.placer.lock().expect("lock poisoned");
        let in_flight = items.iter().any(|(key, put_id, reps)| {
            placer.owns_any(reps)
                && placer.commit_status(client, key, *put_id, reps) == CommitStatus::InFlight
        });
        if in_flight {
            return Err(CommitInFlight);
        }
        Ok(items
            .iter()
            .map(|(key, put_id, reps)| {
                !placer.owns_any(reps) || placer.begin_commit(client, key, *put_id, reps)
            })
            .collect())
    }

    /// The commit of a placement is decided (see `Placer::end_commit`).
    pub fn end_commit(
        &self,
        client: &str,
        key: &str,
        put_id: PutId,
        replicas: &[Replica],
        taken: bool,
    ) {
        let state = self.state();
        self.placer
            .lock()
            .expect("lock poisoned")
            .end_commit(&state, client, key, put_id, replicas, taken);
    }

    /// Revokes a put this leader placed and nobody is committing; false
    /// when it holds no such placement (or does not lead in its placer's term).
    pub fn revoke_placement(&self, client: &str, key: &str, put_id: PutId) -> bool {
        if !self.is_leader() {
            return false;
        }
        let term = self.current_term();
        let state = self.state();
        let mut placer = self.placer.lock().expect("lock poisoned");
        placer.term() == term && placer.revoke(&state, client, key, put_id)
    }

    /// Leader upkeep, every second: frees placements past their release
    /// time and retires reservations that are due.
    pub async fn upkeep_reservations(&self) {
        // Only the leader of the placer's term retires: a loop of an earlier
        // term still running, before this node's memory is reset for a new
        // term, would take the newer term's reservations for foreign ones.
        let Some(term) = self.placing_term().await else {
            return;
        };
        let now = now_ms();
        let release = self.config.put_start_release_timeout.as_millis() as u64;
        let due = {
            let state = self.state();
            let mut placer = self.placer.lock().expect("lock poisoned");
            if placer.term() != term {
                return;
            }
            placer.sync(&state);
            placer.expire(&state, now);
            placer.retirable(&state, now, release)
        };
        if due.is_empty() {
            return;
        }
        match self
            .propose(None, Op::RetireReservations { ids: due })
            .await
        {
            Ok(Response::Count(n)) => {
                self.counters.reservations_retired.fetch_add(n, Relaxed);
                tracing::debug!(retired = n, "retired reservations");
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "retiring reservations not committed"),
        }
    }
}

/// `preferred` without `avoid`, then `others` (rotated to begin at
/// `start`) that are neither; see [`MasterNode::preferred_avoiding`].
fn preference_avoiding(
    preferred: &[String],
    avoid: &[String],
    others: &[&str],
    start: usize,
) -> Vec<String> {
    let start = start.min(others.len());
    let rotated = others[start..].iter().chain(&others[..start]).copied();
    let mut seen: std::collections::HashSet<&str> = avoid.iter().map(String::as_str).collect();
    preferred
        .iter()
        .map(String::as_str)
        .chain(rotated)
        .filter(|name| seen.insert(name))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::preference_avoiding;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn avoided_segments_leave_the_list_and_the_rest_follow_the_preferred() {
        let got = preference_avoiding(
            &names(&["b", "dead"]),
            &names(&["dead"]),
            &["a", "b", "c", "dead"],
            2,
        );
        assert_eq!(got, names(&["b", "c", "a"]));
        // Nothing preferred: every other segment, from the rotation's start.
        let got = preference_avoiding(&[], &names(&["a"]), &["a", "b", "c"], 1);
        assert_eq!(got, names(&["b", "c"]));
        // Every segment avoided: an empty list, so the placement paths fall
        // back to their own order over all of them.
        assert!(preference_avoiding(&[], &names(&["a"]), &["a"], 0).is_empty());
    }
}
