//! `ClusterService`: who leads, who the members are, each node's Raft status,
//! and membership / leadership administration.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crescent_proto::pb::{self, cluster_service_server::ClusterService};
use crescent_proto::ErrorCode;
use crescent_raft::state::Tier;
use crescent_raft::NodeId;
use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;
use tonic::{Request, Response, Status};

use crate::node::{MasterNode, MembershipError};

type Rpc<T> = Result<Response<T>, Status>;

pub struct ClusterApi {
    node: Arc<MasterNode>,
}

impl ClusterApi {
    pub fn new(node: Arc<MasterNode>) -> Self {
        Self { node }
    }

    fn not_leader(&self) -> pb::Status {
        crate::service::node_status(&self.node.not_leader())
    }

    fn members(&self) -> Vec<pb::Member> {
        let m = self.node.metrics();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let last = m.last_log_index.unwrap_or(0);
        membership
            .nodes()
            .map(|(id, node)| {
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).copied().flatten())
                    .map(|l| l.index);
                let (matched_index, lag) = if *id == self.node.id() {
                    (last, 0)
                } else {
                    match matched {
                        Some(i) => (i, last.saturating_sub(i)),
                        None => (0, if m.replication.is_some() { last } else { 0 }),
                    }
                };
                let last_contact_ms = if *id == self.node.id() {
                    0
                } else if m.state == ServerState::Leader {
                    self.node
                        .last_contact(*id)
                        .map(|d| d.as_millis() as i64)
                        .unwrap_or(-1)
                } else {
                    -1
                };
                pb::Member {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                    matched_index,
                    lag,
                    last_contact_ms,
                }
            })
            .collect()
    }
}

fn role(state: ServerState) -> pb::Role {
    match state {
        ServerState::Leader => pb::Role::Leader,
        ServerState::Follower => pb::Role::Follower,
        ServerState::Candidate => pb::Role::Candidate,
        ServerState::Learner => pb::Role::Learner,
        ServerState::Shutdown => pb::Role::Shutdown,
    }
}

fn write_error(e: MembershipError) -> pb::Status {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            pb::Status::not_leader(f.leader_id, f.leader_node.map(|n| n.addr))
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            pb::Status::error(ErrorCode::InvalidParams, e.to_string())
        }
        RaftError::Fatal(e) => pb::Status::error(ErrorCode::Unavailable, e.to_string()),
    }
}

fn status_only(s: pb::Status) -> Rpc<pb::StatusResponse> {
    Ok(Response::new(pb::StatusResponse { status: Some(s) }))
}

#[tonic::async_trait]
impl ClusterService for ClusterApi {
    async fn get_leader(&self, _r: Request<pb::GetLeaderRequest>) -> Rpc<pb::GetLeaderResponse> {
        let m = self.node.metrics();
        let (leader, addr) = self.node.leader_hint();
        Ok(Response::new(match leader {
            Some(id) => pb::GetLeaderResponse {
                status: Some(pb::Status::ok()),
                leader_id: id,
                leader_addr: addr.unwrap_or_default(),
                term: m.current_term,
            },
            None => pb::GetLeaderResponse {
                status: Some(pb::Status::error(
                    ErrorCode::Unavailable,
                    "no leader known to this node (election in progress or no quorum)",
                )),
                leader_id: 0,
                leader_addr: String::new(),
                term: m.current_term,
            },
        }))
    }

    async fn list_members(
        &self,
        _r: Request<pb::ListMembersRequest>,
    ) -> Rpc<pb::ListMembersResponse> {
        let m = self.node.metrics();
        Ok(Response::new(pb::ListMembersResponse {
            status: Some(pb::Status::ok()),
            members: self.members(),
            leader_id: m.current_leader.unwrap_or(0),
        }))
    }

    async fn get_status(&self, _r: Request<pb::GetStatusRequest>) -> Rpc<pb::GetStatusResponse> {
        let m = self.node.metrics();
        let (keys, segments, memory, disk, disk_keys) = {
            let state = self.node.state();
            let disk_keys = state.disk_object_count() as u64;
            (
                state.objects.len() as u64,
                state.live_segment_count() as u64,
                state.tier_usage(Tier::Memory),
                state.tier_usage(Tier::Disk),
                disk_keys,
            )
        };
        Ok(Response::new(pb::GetStatusResponse {
            status: Some(pb::Status::ok()),
            id: self.node.id(),
            addr: self.node.addr().to_string(),
            role: role(m.state) as i32,
            term: m.current_term,
            leader_id: m.current_leader.unwrap_or(0),
            last_log_index: m.last_log_index.unwrap_or(0),
            // openraft 0.9 reports the committed index only on the leader's
            // replication view; the applied index is a safe lower bound elsewhere.
            committed: m
                .replication
                .as_ref()
                .map(|r| committed_index(r, &self.node.voters(), self.node.id(), m.last_log_index))
                .unwrap_or_else(|| m.last_applied.map(|l| l.index).unwrap_or(0)),
            applied: m.last_applied.map(|l| l.index).unwrap_or(0),
            applied_term: m.last_applied.map(|l| l.leader_id.term).unwrap_or(0),
            applied_leader: m.last_applied.map(|l| l.leader_id.node_id).unwrap_or(0),
            snapshot_index: m.snapshot.map(|l| l.index).unwrap_or(0),
            purged_index: m.purged.map(|l| l.index).unwrap_or(0),
            members: self.members(),
            key_count: keys,
            segment_count: segments,
            millis_since_quorum_ack: m.millis_since_quorum_ack.map(|v| v as i64).unwrap_or(-1),
            memory_capacity: memory.0,
            memory_allocated: memory.1,
            disk_capacity: disk.0,
            disk_allocated: disk.1,
            disk_key_count: disk_keys,
        }))
    }

    async fn add_member(&self, r: Request<pb::AddMemberRequest>) -> Rpc<pb::StatusResponse> {
        let r = r.into_inner();
        if r.id == 0 || r.addr.is_empty() {
            return status_only(pb::Status::error(
                ErrorCode::InvalidParams,
                "id > 0 and addr are required",
            ));
        }
        if !self.node.is_leader() {
            return status_only(self.not_leader());
        }
        if let Some(existing) = self.node.node_addr(r.id) {
            if existing != r.addr {
                return status_only(pb::Status::error(
                    ErrorCode::InvalidParams,
                    format!(
                        "node id {} is already a member at {existing}; node ids are never reused",
                        r.id
                    ),
                ));
            }
        }
        tracing::info!(id = r.id, addr = r.addr, "adding member as learner");
        if let Err(e) = self.node.add_learner(r.id, r.addr.clone()).await {
            return status_only(write_error(e));
        }
        if !r.learner_only {
            tracing::info!(id = r.id, "promoting learner to voter");
            if let Err(e) = self.node.promote_to_voter(r.id).await {
                return status_only(write_error(e));
            }
        }
        tracing::info!(id = r.id, voter = !r.learner_only, "membership changed");
        status_only(pb::Status::ok())
    }

    async fn remove_member(&self, r: Request<pb::RemoveMemberRequest>) -> Rpc<pb::StatusResponse> {
        let id = r.into_inner().id;
        if !self.node.is_leader() {
            return status_only(self.not_leader());
        }
        if self.node.node_addr(id).is_none() {
            return status_only(pb::Status::error(
                ErrorCode::InvalidParams,
                format!("node {id} is not a member"),
            ));
        }
        let voters = self.node.voters();
        let is_voter = voters.contains(&id);
        if is_voter && voters.len() == 1 {
            return status_only(pb::Status::error(
                ErrorCode::InvalidParams,
                "cannot remove the last voter",
            ));
        }
        tracing::info!(id, "removing member");
        let removed = if is_voter {
            self.node.remove_voter(id).await
        } else {
            self.node.remove_learner(id).await
        };
        match removed {
            Ok(_) => {
                tracing::info!(id, "member removed");
                status_only(pb::Status::ok())
            }
            Err(e) => status_only(write_error(e)),
        }
    }

    async fn transfer_leader(
        &self,
        r: Request<pb::TransferLeaderRequest>,
    ) -> Rpc<pb::TransferLeaderResponse> {
        let to = r.into_inner().to;
        let reply = |status, new_leader_id| {
            Ok(Response::new(pb::TransferLeaderResponse {
                status: Some(status),
                new_leader_id,
            }))
        };
        if to == self.node.id() && self.node.is_leader() {
            return reply(pb::Status::ok(), to);
        }
        if !self.node.is_leader() {
            return reply(self.not_leader(), 0);
        }
        if !self.node.voters().contains(&to) {
            return reply(
                pb::Status::error(
                    ErrorCode::InvalidParams,
                    format!("node {to} is not a voter"),
                ),
                0,
            );
        }
        match self.node.transfer_leader(to).await {
            Ok(new_leader) => reply(pb::Status::ok(), new_leader),
            Err(msg) => reply(pb::Status::error(ErrorCode::Unavailable, msg), 0),
        }
    }

    async fn timeout_now(&self, r: Request<pb::TimeoutNowRequest>) -> Rpc<pb::StatusResponse> {
        let r = r.into_inner();
        let wait = Duration::from_millis(r.campaign_after_ms.min(10_000));
        tracing::info!(
            from = r.from,
            term = r.term,
            ?wait,
            "asked to take over leadership"
        );
        self.node.campaign_after(wait);
        status_only(pb::Status::ok())
    }
}

/// The commit index implied by the leader's replication view: the highest
/// index stored on a majority of voters.
pub(crate) fn committed_index(
    replication: &std::collections::BTreeMap<NodeId, Option<openraft::LogId<NodeId>>>,
    voters: &BTreeSet<NodeId>,
    self_id: NodeId,
    last: Option<u64>,
) -> u64 {
    let mut matched: Vec<u64> = voters
        .iter()
        .map(|v| {
            if *v == self_id {
                last.unwrap_or(0)
            } else {
                replication
                    .get(v)
                    .copied()
                    .flatten()
                    .map(|l| l.index)
                    .unwrap_or(0)
            }
        })
        .collect();
    if matched.is_empty() {
        return 0;
    }
    matched.sort_unstable();
    matched[(matched.len() - 1) / 2]
}
