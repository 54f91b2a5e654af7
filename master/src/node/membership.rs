//! Raft membership: learners added and promoted, voters removed, and who
//! leads.

use super::*;

impl MasterNode {
    /// Members (learners too) and voters, from one view of the membership.
    pub fn members_and_voters(&self) -> (BTreeSet<NodeId>, BTreeSet<NodeId>) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let mem = m.membership_config.membership();
        (
            mem.nodes().map(|(id, _)| *id).collect(),
            mem.voter_ids().collect(),
        )
    }

    /// How long ago this node last heard from peer `id`, if ever.
    pub fn last_contact(&self, id: NodeId) -> Option<Duration> {
        self.contacts.since(id)
    }

    /// Adds `id` at `addr` as a learner and waits until it has caught up.
    pub async fn add_learner(&self, id: NodeId, addr: String) -> Result<(), MembershipError> {
        self.raft
            .add_learner(id, BasicNode { addr }, true)
            .await
            .map(|_| ())
    }

    /// Makes learner `id` a voter.
    pub async fn promote_to_voter(&self, id: NodeId) -> Result<(), MembershipError> {
        self.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await
    }

    /// Removes voter `id` from the voters and the members.
    pub async fn remove_voter(&self, id: NodeId) -> Result<(), MembershipError> {
        self.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])))
            .await
    }

    /// Removes `id`, a learner, from the members.
    pub async fn remove_learner(&self, id: NodeId) -> Result<(), MembershipError> {
        self.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])))
            .await
    }

    pub(super) async fn change_membership(
        &self,
        change: ChangeMembers<NodeId, BasicNode>,
    ) -> Result<(), MembershipError> {
        self.raft.change_membership(change, false).await.map(|_| ())
    }

    /// Starts an election after `wait` (a leader handing over asked for
    /// it), without waiting for it.
    pub fn campaign_after(&self, wait: Duration) {
        let raft = self.raft.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if let Err(e) = raft.trigger().elect().await {
                tracing::warn!(error = %e, "could not start the election");
            }
        });
    }

    /// Voter ids of the current membership.
    pub fn voters(&self) -> BTreeSet<NodeId> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config.membership().voter_ids().collect()
    }

    /// Waits until some leader is known (any node), up to `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Option<NodeId> {
        let deadline = Instant::now() + timeout;
        let mut rx = self.raft.metrics();
        loop {
            if let Some(l) = rx.borrow().current_leader {
                return Some(l);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return None;
            }
        }
    }
}
