//! The leader's read lease: how long after a quorum last acknowledged it a
//! leader may answer reads from its own state without asking the quorum again.
//!
//! Why it is safe (see `docs/lease-reads.md` for the whole argument): a
//! follower that accepts an AppendEntries from the leader refuses every vote
//! request for openraft's `leader_lease` (= `election_timeout_max`) after it
//! received it. If a quorum accepted messages the leader *sent* at `t`, every
//! quorum that could elect a successor contains one of those followers or the
//! leader itself, so no successor exists before `t + election_timeout_max`
//! (the leader itself only votes for a successor after it stopped leading).
//! The leader uses `t + election_timeout_max - margin`, the margin covering
//! clock-rate differences. Send times are recorded, never receive times:
//! a follower's lease starts when it processed the message, which is later.
//!
//! This module is the pure bookkeeping ([`LeaseClock`]) and the quorum rule
//! ([`quorum_acked_at`]); the transport records into it, the master asks it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::Vote;

use crate::NodeId;

/// Send times of the latest AppendEntries each follower accepted, per leader vote.
#[derive(Default)]
pub struct LeaseClock {
    acked: Mutex<HashMap<NodeId, (Vote<NodeId>, Instant)>>,
}

impl LeaseClock {
    /// `target` accepted (did not answer "higher vote" to) a message sent
    /// at `sent_at` under `vote`. Older send times never replace newer ones.
    pub fn record(&self, target: NodeId, vote: Vote<NodeId>, sent_at: Instant) {
        let mut acked = self.acked.lock().expect("lease clock lock poisoned");
        match acked.get(&target) {
            Some((v, t)) if *v == vote && *t >= sent_at => {}
            _ => {
                acked.insert(target, (vote, sent_at));
            }
        }
    }

    /// When a quorum of each of `configs` (one voter set, or two during a
    /// membership change: joint consensus) last acknowledged `vote`, led by
    /// `self_id` (the leader counts as acknowledging at `now`): the earliest
    /// of the configurations' times; None if any has no quorum (or none given).
    pub fn quorum_acked_at(
        &self,
        vote: &Vote<NodeId>,
        configs: &[BTreeSet<NodeId>],
        self_id: NodeId,
        now: Instant,
    ) -> Option<Instant> {
        let acked = self.acked.lock().expect("lease clock lock poisoned");
        let at = |id: NodeId| {
            if id == self_id {
                Some(now)
            } else {
                acked.get(&id).filter(|(v, _)| v == vote).map(|(_, t)| *t)
            }
        };
        // Option's order puts None first: one config without a quorum wins.
        configs.iter().map(|c| quorum_acked_at(c, at)).min()?
    }
}

/// The latest instant acknowledged by a majority of `voters`, given each
/// voter's latest acknowledged instant (None: nothing acknowledged).
pub fn quorum_acked_at(
    voters: &BTreeSet<NodeId>,
    acked: impl Fn(NodeId) -> Option<Instant>,
) -> Option<Instant> {
    if voters.is_empty() {
        return None;
    }
    let mut times: Vec<Option<Instant>> = voters.iter().map(|v| acked(*v)).collect();
    // Newest first; None (never) sorts last.
    times.sort_unstable_by(|a, b| b.cmp(a));
    let majority = voters.len() / 2 + 1;
    times[majority - 1]
}

/// Whether a lease acknowledged at `acked_at` and lasting `lease` still holds at `now`.
pub fn lease_holds(acked_at: Option<Instant>, lease: Duration, now: Instant) -> bool {
    acked_at.is_some_and(|t| now < t + lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(term: u64, leader: NodeId) -> Vote<NodeId> {
        Vote::new_committed(term, leader)
    }

    #[test]
    fn the_quorum_time_is_the_majoritys_oldest_acknowledgement() {
        let t0 = Instant::now();
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let at = |id: NodeId| match id {
            1 => Some(t0 + Duration::from_millis(30)),
            2 => Some(t0 + Duration::from_millis(10)),
            _ => None,
        };
        assert_eq!(
            quorum_acked_at(&voters, at),
            Some(t0 + Duration::from_millis(10))
        );
        let five: BTreeSet<NodeId> = [1, 2, 3, 4, 5].into();
        assert_eq!(quorum_acked_at(&five, at), None, "two of five is no quorum");
        assert_eq!(quorum_acked_at(&BTreeSet::new(), at), None);
    }

    #[test]
    fn acknowledgements_of_another_vote_do_not_count() {
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        clock.record(2, vote(4, 1), t0);
        clock.record(3, vote(4, 1), t0);
        assert_eq!(
            clock.quorum_acked_at(&vote(5, 1), std::slice::from_ref(&voters), 1, t0),
            None
        );
        assert_eq!(
            clock.quorum_acked_at(&vote(4, 1), &[voters], 1, t0 + Duration::from_millis(5)),
            Some(t0)
        );
    }

    #[test]
    fn a_joint_membership_needs_a_quorum_of_each_configuration() {
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        let now = t0 + Duration::from_millis(100);
        let old: BTreeSet<NodeId> = [1, 2, 3].into();
        let new: BTreeSet<NodeId> = [1, 4, 5].into();
        clock.record(2, vote(4, 1), t0 + Duration::from_millis(20));
        clock.record(3, vote(4, 1), t0 + Duration::from_millis(30));
        // A majority of the union {1..5} (1, 2, 3), but only 1 of {1, 4, 5}.
        assert_eq!(
            clock.quorum_acked_at(&vote(4, 1), &[old.clone(), new.clone()], 1, now),
            None
        );
        clock.record(4, vote(4, 1), t0 + Duration::from_millis(10));
        assert_eq!(
            clock.quorum_acked_at(&vote(4, 1), &[old, new], 1, now),
            Some(t0 + Duration::from_millis(10)),
            "the older of the two quorums' times"
        );
        assert_eq!(clock.quorum_acked_at(&vote(4, 1), &[], 1, now), None);
    }

    #[test]
    fn a_late_answer_to_an_older_message_does_not_move_the_time_back() {
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        clock.record(2, vote(4, 1), t0 + Duration::from_millis(50));
        clock.record(2, vote(4, 1), t0);
        assert_eq!(
            clock.quorum_acked_at(&vote(4, 1), &[voters], 1, t0 + Duration::from_secs(1)),
            Some(t0 + Duration::from_millis(50))
        );
    }

    #[test]
    fn a_lease_ends_exactly_lease_after_the_acknowledged_send() {
        let t0 = Instant::now();
        let lease = Duration::from_millis(250);
        assert!(lease_holds(
            Some(t0),
            lease,
            t0 + Duration::from_millis(249)
        ));
        assert!(!lease_holds(Some(t0), lease, t0 + lease));
        assert!(!lease_holds(None, lease, t0));
    }
}
