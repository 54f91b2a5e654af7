//! Raft transport over tonic: a client per peer on one reused HTTP/2 channel,
//! and the server side that hands requests to the local Raft node.
//!
//! Payloads are openraft's own types, bincode-encoded (see `raft.proto`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use crescent_auth::{AuthedChannel, BearerToken};
use crescent_proto::pb::raft_service_client::RaftServiceClient;
use crescent_proto::pb::raft_service_server::RaftService;
use crescent_proto::pb::RaftPayload;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, LogId};
use serde::{de::DeserializeOwned, Serialize};
use tonic::transport::{Channel, ClientTlsConfig};

use crate::lease::LeaseClock;
use crate::{codec, sizing, NodeId, Raft, TypeConfig};

/// Largest Raft message accepted on the wire (senders keep to
/// [`sizing::MAX_MESSAGE_BYTES`] of entries and 4 MiB snapshot chunks).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// When each peer last answered an RPC: reported as "last contact" by ListMembers.
#[derive(Default)]
pub struct ContactBook {
    last: Mutex<HashMap<NodeId, Instant>>,
}

impl ContactBook {
    fn touch(&self, id: NodeId) {
        self.last
            .lock()
            .expect("contact lock poisoned")
            .insert(id, Instant::now());
    }

    /// Time since `id` last answered, if it ever did.
    pub fn since(&self, id: NodeId) -> Option<Duration> {
        self.last
            .lock()
            .expect("contact lock poisoned")
            .get(&id)
            .map(|t| t.elapsed())
    }
}

/// Creates per-peer clients; channels are cached per address and reused.
/// A replication stream looks its peer's channel up on every message, so
/// [`GrpcNetworkFactory::reload_tls`] reaches streams already running.
#[derive(Clone)]
pub struct GrpcNetworkFactory {
    self_id: NodeId,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The cluster token every message carries (none with `--insecure`).
    token: BearerToken,
    /// Mutual TLS towards the peers (`--tls-*`), none without; swapped by a
    /// reload (SIGHUP).
    tls: Arc<ArcSwapOption<ClientTlsConfig>>,
    pub contacts: Arc<ContactBook>,
    /// Send times of accepted AppendEntries, for the leader's read lease.
    pub lease_clock: Arc<LeaseClock>,
}

impl GrpcNetworkFactory {
    pub fn new(self_id: NodeId, token: BearerToken, tls: Option<ClientTlsConfig>) -> Self {
        Self {
            self_id,
            channels: Default::default(),
            token,
            tls: Arc::new(ArcSwapOption::from(tls.map(Arc::new))),
            contacts: Default::default(),
            lease_clock: Default::default(),
        }
    }

    /// Presents `tls` to the peers from now on: the cached channels are
    /// dropped, so the next message to each peer connects with it (messages
    /// already on their way finish on the connection they have). A leader
    /// whose peers stopped trusting its old certificate keeps replicating.
    pub fn reload_tls(&self, tls: ClientTlsConfig) {
        let mut channels = self.channels.lock().expect("channel lock poisoned");
        self.tls.store(Some(Arc::new(tls)));
        channels.clear();
    }

    fn channel(&self, addr: &str) -> Result<AuthedChannel, String> {
        let mut channels = self.channels.lock().expect("channel lock poisoned");
        if let Some(c) = channels.get(addr) {
            return Ok(self.token.wrap(c.clone()));
        }
        let tls = self.tls.load_full();
        let endpoint = crescent_auth::tls::endpoint(addr, tls.as_deref())
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let channel = endpoint.connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(self.token.wrap(channel))
    }
}

pub struct GrpcNetwork {
    target: NodeId,
    /// The peer's address (an error for a node asked to reach itself).
    peer: Result<String, String>,
    factory: GrpcNetworkFactory,
    contacts: Arc<ContactBook>,
    lease_clock: Arc<LeaseClock>,
    /// The AppendEntries with entries still on its way to `target`, if any.
    in_flight: Option<InFlightAppend>,
}

/// A message with entries, sent by a task of its own so that openraft's
/// heartbeat-long wait ending does not cancel it (see [`crate::sizing`]).
struct InFlightAppend {
    /// When the message left: the follower's lease starts no earlier.
    sent_at: Instant,
    prev: Option<LogId<NodeId>>,
    first: LogId<NodeId>,
    last: LogId<NodeId>,
    task: tokio::task::JoinHandle<AppendResult>,
}

type AppendError = RPCError<NodeId, BasicNode, RaftError<NodeId>>;
type AppendResult = Result<AppendEntriesResponse<NodeId>, AppendError>;

impl Drop for GrpcNetwork {
    fn drop(&mut self) {
        // The replication stream ended (new term, member removed): stop sending.
        if let Some(f) = self.in_flight.take() {
            f.task.abort();
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetworkFactory {
    type Network = GrpcNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> GrpcNetwork {
        let peer = if target == self.self_id {
            // A node must never replicate to itself; treat it as unreachable.
            Err(format!("refusing to connect node {target} to itself"))
        } else {
            Ok(node.addr.clone())
        };
        GrpcNetwork {
            target,
            peer,
            factory: self.clone(),
            contacts: self.contacts.clone(),
            lease_clock: self.lease_clock.clone(),
            in_flight: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl GrpcNetwork {
    /// A client of the peer over its current channel (see
    /// [`GrpcNetworkFactory::reload_tls`]).
    fn client(&self) -> Result<RaftServiceClient<AuthedChannel>, String> {
        let addr = self.peer.as_ref().map_err(Clone::clone)?;
        self.factory.channel(addr).map(|c| {
            RaftServiceClient::new(c)
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        })
    }

    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
        Result<Resp, E>: DeserializeOwned,
    {
        let client = self.client().map_err(unreachable)?;
        let data = codec::encode(req)
            .map_err(|e| RPCError::Network(NetworkError::new(&TransportError(e.to_string()))))?;
        send(
            client,
            self.contacts.clone(),
            self.target,
            method,
            data,
            option.hard_ttl(),
        )
        .await
    }

    /// Sends the entries of `rpc` that fit one message (at least one) by a
    /// task with a deadline sized for their bytes, or waits for the task
    /// already sending the same start of the same range (openraft retries a
    /// range whose 50 ms wait ended). A success for fewer entries than asked
    /// is answered `PartialSuccess`, and openraft sends the rest next.
    /// Returns the answer and when the message that got it was sent.
    async fn append_in_task(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
    ) -> Result<(AppendEntriesResponse<NodeId>, Instant), AppendError> {
        let (Some(first), Some(asked_last)) = (
            rpc.entries.first().map(|e| e.log_id),
            rpc.entries.last().map(|e| e.log_id),
        ) else {
            return Err(RPCError::Network(NetworkError::new(&TransportError(
                "no entries to send".into(),
            ))));
        };
        let reusable = self
            .in_flight
            .as_ref()
            .is_some_and(|f| f.prev == rpc.prev_log_id && f.first == first && f.last <= asked_last);
        if !reusable {
            if let Some(stale) = self.in_flight.take() {
                stale.task.abort();
            }
            let sizes: Vec<u64> = rpc
                .entries
                .iter()
                .map(|e| codec::encoded_len(e).unwrap_or(u64::MAX))
                .collect();
            let n = sizing::sendable_prefix(sizes.iter().copied(), sizing::MAX_MESSAGE_BYTES);
            let bytes = sizes[..n].iter().fold(0u64, |a, b| a.saturating_add(*b));
            rpc.entries.truncate(n);
            let last = rpc.entries[n - 1].log_id;
            let client = self.client().map_err(unreachable)?;
            let data = codec::encode(&rpc).map_err(|e| {
                RPCError::Network(NetworkError::new(&TransportError(e.to_string())))
            })?;
            let task = tokio::spawn(send(
                client,
                self.contacts.clone(),
                self.target,
                Method::Append,
                data,
                sizing::replication_timeout(bytes),
            ));
            self.in_flight = Some(InFlightAppend {
                sent_at: Instant::now(),
                prev: rpc.prev_log_id,
                first,
                last,
                task,
            });
        }
        let Some(f) = self.in_flight.as_mut() else {
            return Err(RPCError::Network(NetworkError::new(&TransportError(
                "no replication task".into(),
            ))));
        };
        // Awaiting a handle that stays in `self` keeps the send going if
        // openraft gives up on this call.
        let joined = (&mut f.task).await;
        let sent_last = f.last;
        let sent_at = f.sent_at;
        self.in_flight = None;
        let outcome = joined.map_err(|e| {
            RPCError::Network(NetworkError::new(&TransportError(format!(
                "replication task ended: {e}"
            ))))
        })??;
        let answer = match outcome {
            AppendEntriesResponse::Success if sent_last != asked_last => {
                AppendEntriesResponse::PartialSuccess(Some(sent_last))
            }
            other => other,
        };
        Ok((answer, sent_at))
    }
}

fn unreachable<E: std::error::Error>(reason: String) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&TransportError(reason)))
}

/// One Raft RPC of already-encoded `data`, answered within `timeout`.
async fn send<Resp, E>(
    mut client: RaftServiceClient<AuthedChannel>,
    contacts: Arc<ContactBook>,
    target: NodeId,
    method: Method,
    data: Vec<u8>,
    timeout: Duration,
) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
where
    Resp: DeserializeOwned,
    E: std::error::Error + DeserializeOwned,
    Result<Resp, E>: DeserializeOwned,
{
    let mut request = raft_request(data);
    request.set_timeout(timeout);
    let resp = match method {
        Method::Append => client.append_entries(request).await,
        Method::Vote => client.vote(request).await,
        Method::Snapshot => client.install_snapshot(request).await,
    };
    let payload = match resp {
        Ok(r) => {
            if let Err(refused) = check_format(r.metadata()) {
                let err = TransportError(refused.message().to_string());
                return Err(RPCError::Network(NetworkError::new(&err)));
            }
            r.into_inner()
        }
        Err(status) => {
            let err = TransportError(format!("{}: {}", status.code(), status.message()));
            return Err(match status.code() {
                tonic::Code::Unavailable | tonic::Code::Unknown => {
                    RPCError::Unreachable(Unreachable::new(&err))
                }
                _ => RPCError::Network(NetworkError::new(&err)),
            });
        }
    };
    contacts.touch(target);
    let result: Result<Resp, E> = codec::decode(&payload.data)
        .map_err(|e| RPCError::Network(NetworkError::new(&TransportError(e.to_string()))))?;
    result.map_err(|e| RPCError::RemoteError(RemoteError::new(target, e)))
}

enum Method {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for GrpcNetwork {
    /// Retry an unreachable peer every 100 ms (openraft's default is 500 ms):
    /// a restarted master must hear from the leader before its own election
    /// timer fires, or its campaign disrupts the cluster.
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(100)))
    }

    /// Heartbeats (no entries) go at once with openraft's deadline; entries
    /// go through [`GrpcNetwork::append_in_task`].
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> AppendResult {
        let vote = rpc.vote;
        let (answer, sent_at) = if rpc.entries.is_empty() {
            let sent_at = Instant::now();
            let answer = self
                .call::<_, _, RaftError<NodeId>>(Method::Append, &rpc, &option)
                .await?;
            (answer, sent_at)
        } else {
            self.append_in_task(rpc).await?
        };
        // Any answer but "higher vote" means the follower took `vote` as its
        // leader's and restarted its lease when it processed the message.
        if !matches!(answer, AppendEntriesResponse::HigherVote(_)) {
            self.lease_clock.record(self.target, vote, sent_at);
        }
        Ok(answer)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call::<_, _, RaftError<NodeId, InstallSnapshotError>>(Method::Snapshot, &rpc, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call::<_, _, RaftError<NodeId>>(Method::Vote, &rpc, &option)
            .await
    }
}

/// Server side of `RaftService`: decodes, hands to the local node, encodes the result.
pub struct RaftGrpcServer {
    raft: Raft,
    /// Vote requests are refused until then (see [`RaftGrpcServer::new`]).
    votes_from: Instant,
}

impl RaftGrpcServer {
    /// `leader_lease` is openraft's (`election_timeout_max`). A restarted
    /// node has forgotten when it last heard from the leader, and openraft
    /// would grant a vote at once; refusing votes for one lease after start
    /// keeps the promise it made before the restart, which the leader's read
    /// lease relies on (see [`crate::lease`]).
    pub fn new(raft: Raft, leader_lease: Duration) -> Self {
        Self {
            raft,
            votes_from: Instant::now() + leader_lease,
        }
    }

    /// Refuses a message whose term no peer can legitimately have reached
    /// (see [`crate::terms`]) before openraft adopts and persists it.
    fn check_term(&self, theirs: u64) -> Result<(), tonic::Status> {
        let ours = self.raft.metrics().borrow().current_term;
        crate::terms::check_incoming(ours, theirs).map_err(|reason| {
            tracing::warn!(ours, theirs, "refused a raft message: {reason}");
            tonic::Status::invalid_argument(reason)
        })
    }
}

impl RaftGrpcServer {
    /// Refuses a vote request from a node this one does not count as a
    /// member: a removed master (or a stranger holding the cluster token)
    /// would otherwise depose the leader with a higher term. A node with no
    /// membership yet (joining) has nobody to check against. AppendEntries
    /// is not checked this way: a lagging follower may not yet know the
    /// member that now leads, and must still accept its log.
    fn check_candidate(&self, candidate: NodeId) -> Result<(), tonic::Status> {
        let members: Vec<NodeId> = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, _)| *id)
                .collect()
        };
        if members.is_empty() || members.contains(&candidate) {
            return Ok(());
        }
        tracing::warn!(
            candidate,
            "refused a vote request from a node outside the membership"
        );
        Err(tonic::Status::permission_denied(format!(
            "node {candidate} is not a member of this cluster"
        )))
    }
}

/// The gRPC metadata naming the sender's [`codec::FORMAT_VERSION`].
const FORMAT_HEADER: &str = "crescent-format";

/// A Raft message carrying `data` (a [`codec`]-encoded request), marked with
/// this build's format.
pub fn raft_request(data: Vec<u8>) -> tonic::Request<RaftPayload> {
    let mut request = tonic::Request::new(RaftPayload { data });
    request.metadata_mut().insert(
        FORMAT_HEADER,
        tonic::metadata::MetadataValue::from_static(codec::FORMAT_VERSION),
    );
    request
}

/// Refuses a Raft message (or its answer) of another format than this
/// build's: a master of another build would misread its entries. A message
/// without the header comes from a build before format 2.
fn check_format(metadata: &tonic::metadata::MetadataMap) -> Result<(), tonic::Status> {
    let theirs = metadata
        .get(FORMAT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("1");
    if theirs == codec::FORMAT_VERSION {
        return Ok(());
    }
    Err(tonic::Status::failed_precondition(format!(
        "a master of log format v{theirs} sent this, and this one speaks v{}: every master \
         must run a build of the same format",
        codec::FORMAT_VERSION
    )))
}

fn decode_req<T: DeserializeOwned>(req: tonic::Request<RaftPayload>) -> Result<T, tonic::Status> {
    check_format(req.metadata())?;
    codec::decode(&req.into_inner().data)
        .map_err(|e| tonic::Status::invalid_argument(format!("undecodable raft message: {e}")))
}

fn encode_resp<T: Serialize>(value: &T) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
    codec::encode(value)
        .map(|data| {
            let mut resp = tonic::Response::new(RaftPayload { data });
            resp.metadata_mut().insert(
                FORMAT_HEADER,
                tonic::metadata::MetadataValue::from_static(codec::FORMAT_VERSION),
            );
            resp
        })
        .map_err(|e| tonic::Status::internal(format!("cannot encode raft response: {e}")))
}

#[tonic::async_trait]
impl RaftService for RaftGrpcServer {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let req: AppendEntriesRequest<TypeConfig> = decode_req(request)?;
        self.check_term(req.vote.leader_id.term)?;
        let result = self.raft.append_entries(req).await;
        encode_resp(&result)
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let req: VoteRequest<NodeId> = decode_req(request)?;
        if Instant::now() < self.votes_from {
            return Err(tonic::Status::unavailable(
                "just started: votes are refused for one leader lease",
            ));
        }
        self.check_term(req.vote.leader_id.term)?;
        self.check_candidate(req.vote.leader_id.node_id)?;
        let result = self.raft.vote(req).await;
        encode_resp(&result)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let req: InstallSnapshotRequest<TypeConfig> = decode_req(request)?;
        self.check_term(req.vote.leader_id.term)?;
        let result = self.raft.install_snapshot(req).await;
        encode_resp(&result)
    }
}

#[cfg(test)]
mod format_tests {
    use super::*;

    #[test]
    fn a_raft_message_of_another_format_is_refused_by_name() {
        let mut ours = tonic::metadata::MetadataMap::new();
        ours.insert(
            FORMAT_HEADER,
            tonic::metadata::MetadataValue::from_static(codec::FORMAT_VERSION),
        );
        assert!(check_format(&ours).is_ok());

        let old = tonic::metadata::MetadataMap::new();
        let refused = check_format(&old).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(refused.message().contains("log format v1"), "{refused:?}");

        let mut newer = tonic::metadata::MetadataMap::new();
        newer.insert(
            FORMAT_HEADER,
            tonic::metadata::MetadataValue::from_static("3"),
        );
        assert!(check_format(&newer).unwrap_err().message().contains("v3"));
    }
}
