//! One master: its Raft node, the shared metadata state, and the leader's
//! memory (read leases, heartbeats, access times) that is never replicated.
//!
//! Its fields are private: the gRPC and HTTP handlers and the leader loops
//! ask it for what they need, so the lock order (state before leader memory)
//! and the pairing of doom marks with their release live in one place.

mod eviction;
mod leader_memory;
mod membership;
mod metrics;
mod one_commit;
pub mod placer;
mod promotion;
mod transfer;

pub use leader_memory::{LeaderMemory, COPY_TARGET_BACKOFF};
pub use metrics::MasterMetrics;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLockReadGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use crescent_raft::eviction::{
    plan_eviction, select_disk_copies, select_victims_in, should_evict, should_evict_disk, stamped,
    AccessInfo, EvictionPlan,
};
use crescent_raft::lease::{lease_holds, LeaseClock};
use crescent_raft::network::{ContactBook, GrpcNetworkFactory, RaftGrpcServer};
use crescent_raft::sizing;
use crescent_raft::state::{
    Command, MetaError, MetaState, ObjectStamp, ObjectView, Op, Origin, SegmentId, Tier,
};
use crescent_raft::store::{SharedState, SmData};
use crescent_raft::{BasicNode, NodeId, Raft, Response};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState, SnapshotPolicy};
use tokio::sync::futures::Notified;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::config::{MasterConfig, ReadMode};

/// Largest object copied between tiers: a bigger one is dropped at the
/// watermark, as without a disk tier, and never promoted (its copy could
/// not finish well within its grant).
pub const MAX_MOVED_SIZE: u64 = 256 << 20;

/// Why a request could not be served here.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeError {
    #[error("not the leader")]
    NotLeader {
        leader_id: Option<NodeId>,
        leader_addr: Option<String>,
    },
    #[error("timed out waiting for the Raft quorum; the write may still commit (retry with the same request id)")]
    Timeout,
    #[error("{0}")]
    Unavailable(String),
    /// The command would make a log entry no follower is sure to receive in
    /// time (see `crescent_raft::sizing`); nothing was proposed.
    #[error("request encodes to {bytes} bytes, above the {limit}-byte limit of one Raft log entry; send it in smaller batches")]
    TooLarge { bytes: u64, limit: u64 },
}

/// A read lock on the applied metadata state. Never hold it across an
/// await; take it before the leader-memory lock when both are needed.
pub struct StateRead<'a>(RwLockReadGuard<'a, SmData>);

impl std::ops::Deref for StateRead<'_> {
    type Target = MetaState;

    fn deref(&self) -> &MetaState {
        &self.0.state
    }
}

/// Why a membership change was refused (openraft's own error).
pub type MembershipError = RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>;

pub struct MasterNode {
    id: NodeId,
    addr: String,
    raft: Raft,
    shared: Arc<SharedState>,
    config: MasterConfig,
    contacts: Arc<ContactBook>,
    /// Send times of AppendEntries the followers accepted: the read lease.
    lease_clock: Arc<LeaseClock>,
    /// The term in which a leadership transfer was last attempted here: no
    /// lease reads in it (the transfer lets a successor campaign; see
    /// `docs/lease-reads.md`).
    transfer_term: AtomicU64,
    leader_mem: Mutex<LeaderMemory>,
    /// Where one-commit puts go (leader memory too; reset with it).
    placer: Mutex<placer::Placer>,
    /// One Reserve proposal at a time, so concurrent puts that all found no
    /// room do not each reserve.
    reserving: tokio::sync::Mutex<()>,
    /// Woken whenever doomed keys are taken back (or leader memory reset):
    /// lookups of a doomed key wait on it.
    doom_settled: tokio::sync::Notify,
    read_barrier: mpsc::UnboundedSender<oneshot::Sender<Result<(), NodeError>>>,
    /// Set while handing leadership over: writes are refused, naming the successor.
    transferring_to: Mutex<Option<(NodeId, Instant)>>,
    /// etcd membership, when started with --etcd.
    etcd: Option<Arc<crate::etcd::EtcdMembership>>,
    counters: MasterMetrics,
    /// Who may call what (token mode, or everything with `--insecure`).
    verifier: Arc<crescent_auth::Verifier>,
    /// The cluster token this master presents to its peers.
    peer_token: crescent_auth::BearerToken,
    /// Mutual TLS (`--tls-*`): what this master presents to its peers
    /// (Raft, TimeoutNow); re-read on SIGHUP.
    tls: ArcSwapOption<crescent_auth::tls::TlsFiles>,
    /// The Raft transport's handle, to present reloaded TLS files with.
    peers: GrpcNetworkFactory,
    /// What the gRPC and HTTP ports serve with `--tls-*` (re-read on SIGHUP).
    serving_tls: Option<Arc<crescent_auth::tls::ServingTls>>,
    /// Resolves once the Raft storage's file is closed after a shutdown.
    store_closed: crescent_raft::store::StoreClosed,
}

/// How long a shutdown waits for openraft's tasks to let the storage go.
pub const STORE_CLOSE_WAIT: Duration = Duration::from_secs(10);

/// The placer's test-only switches, from the `--unsafe-*` flags.
fn placer_switches(config: &MasterConfig) -> placer::UnsafeSwitches {
    placer::UnsafeSwitches {
        adopt_foreign: config.unsafe_adopt_foreign_reservations,
        reuse_revoked: config.unsafe_reuse_revoked_ranges,
    }
}

/// The masters' clock for entries, fences and grant expiries: the one
/// stores check grants on, immune to wall-clock steps of a running process.
pub use crescent_store::clock::now_ms;

pub fn raft_config(cfg: &MasterConfig) -> anyhow::Result<openraft::Config> {
    let c = openraft::Config {
        cluster_name: "crescent".into(),
        heartbeat_interval: cfg.heartbeat_interval.as_millis() as u64,
        election_timeout_min: cfg.election_timeout_min.as_millis() as u64,
        election_timeout_max: cfg.election_timeout_max.as_millis() as u64,
        install_snapshot_timeout: 2_000,
        max_payload_entries: 256,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_logs),
        // Keep some log after a snapshot so a briefly lagging follower catches
        // up from the log instead of receiving a whole snapshot.
        max_in_snapshot_log_to_keep: (cfg.snapshot_logs / 4).min(1_000),
        snapshot_max_chunk_size: 4 * 1024 * 1024,
        ..Default::default()
    };
    Ok(c.validate()?)
}

impl MasterNode {
    /// Opens the data dir, starts the Raft node, and bootstraps the cluster if
    /// this node is the designated initializer of a pristine one.
    pub async fn start(config: MasterConfig) -> anyhow::Result<Arc<Self>> {
        let id = config.node_id;
        let addr = config.advertise_addr();
        let vote_at_open = if config.unsafe_resume_leadership {
            tracing::warn!(
                "--unsafe-resume-leadership: a restarted leader leads again without an \
                 election; reads may miss acknowledged writes (test only)"
            );
            crescent_raft::store::VoteAtOpen::AsSavedUnsafely
        } else {
            crescent_raft::store::VoteAtOpen::Uncommitted
        };
        let (log, sm) = crescent_raft::store::open_with(&config.data_dir, vote_at_open)?;
        let shared = sm.shared.clone();
        let store_closed = log.closed();
        let verifier = Arc::new(config.verifier()?);
        if verifier.is_insecure() {
            tracing::warn!(
                "--insecure: no authentication; anyone who reaches this master's ports may read, \
                 write, wipe and take over the cluster"
            );
        }
        let peer_token = config.peer_token()?;
        let tls = config.tls()?;
        let serving_tls = match &tls {
            Some(files) => Some(Arc::new(crescent_auth::tls::ServingTls::new(files)?)),
            None => None,
        };
        let network = GrpcNetworkFactory::new(
            id,
            peer_token.clone(),
            tls.as_ref().map(|t| t.client_config()),
        );
        let contacts = network.contacts.clone();
        let lease_clock = network.lease_clock.clone();
        let peers = network.clone();
        let raft = Raft::new(id, Arc::new(raft_config(&config)?), network, log, sm).await?;

        let etcd = match config.etcd_endpoints() {
            e if e.is_empty() => None,
            endpoints => Some(
                crate::etcd::EtcdMembership::connect(
                    &endpoints,
                    crescent_auth::tls::for_etcd(config.etcd_tls, tls.as_ref())?,
                    &config.cluster,
                    id,
                    &addr,
                    verifier.member_tag(&config.cluster, id, &addr),
                )
                .await?,
            ),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let node = Arc::new(Self {
            store_closed,
            id,
            addr: addr.clone(),
            raft: raft.clone(),
            shared,
            config: config.clone(),
            contacts,
            lease_clock,
            transfer_term: AtomicU64::new(0),
            leader_mem: Mutex::new(
                LeaderMemory::new(0, 0).promoting(config.promotion_reads, config.promotion_window),
            ),
            placer: Mutex::new(placer::Placer::new(
                0,
                0,
                config.put_reservation_size,
                placer_switches(&config),
            )),
            reserving: tokio::sync::Mutex::new(()),
            doom_settled: tokio::sync::Notify::new(),
            read_barrier: tx,
            transferring_to: Mutex::new(None),
            etcd: etcd.clone(),
            counters: Default::default(),
            verifier,
            peer_token,
            tls: ArcSwapOption::from(tls.map(Arc::new)),
            peers,
            serving_tls,
        });
        tokio::spawn(read_barrier_loop(raft.clone(), rx));

        if let Some(etcd) = &etcd {
            tokio::spawn(etcd.clone().keep_alive_loop());
            if !config.join && !raft.is_initialized().await? && etcd.claim_bootstrap().await? {
                tracing::info!(
                    node_id = id,
                    cluster = config.cluster,
                    "won the etcd bootstrap; initializing a new Raft cluster"
                );
                let members = BTreeMap::from([(id, BasicNode { addr: addr.clone() })]);
                if let Err(e) = raft.initialize(members).await {
                    tracing::warn!(error = %e, "initialize refused");
                }
            }
            return Ok(node);
        }

        let peers = config.initial_peers()?;
        let initializer = peers.keys().next().copied().unwrap_or(id);
        if !config.join && initializer == id && !raft.is_initialized().await? {
            let members: BTreeMap<NodeId, BasicNode> = if peers.is_empty() {
                BTreeMap::from([(id, BasicNode { addr: addr.clone() })])
            } else {
                peers
                    .iter()
                    .map(|(i, a)| (*i, BasicNode { addr: a.clone() }))
                    .collect()
            };
            tracing::info!(node_id = id, members = ?members.keys().collect::<Vec<_>>(), "initializing a new Raft cluster");
            if let Err(e) = raft.initialize(members).await {
                // Another process may have raced us on the same data dir's
                // cluster; an already-initialized node is fine.
                tracing::warn!(error = %e, "initialize refused");
            }
        }
        Ok(node)
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The address peers and clients reach this master at.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    pub fn counters(&self) -> &MasterMetrics {
        &self.counters
    }

    /// Who may call what: the gRPC gate and the admin HTTP routes ask it.
    pub fn verifier(&self) -> &Arc<crescent_auth::Verifier> {
        &self.verifier
    }

    /// What the gRPC and HTTP ports serve with `--tls-*`.
    pub fn serving_tls(&self) -> Option<&Arc<crescent_auth::tls::ServingTls>> {
        self.serving_tls.as_ref()
    }

    /// etcd membership, when started with --etcd.
    pub fn etcd(&self) -> Option<&Arc<crate::etcd::EtcdMembership>> {
        self.etcd.as_ref()
    }

    /// The applied metadata state, read-locked (see [`StateRead`]).
    pub fn state(&self) -> StateRead<'_> {
        StateRead(self.shared.sm.read().expect("state lock poisoned"))
    }

    /// The RaftService that serves this node's peers.
    pub fn raft_service(&self) -> RaftGrpcServer {
        RaftGrpcServer::new(self.raft.clone(), self.config.election_timeout_max)
    }

    /// Stops the Raft node and waits (at most [`STORE_CLOSE_WAIT`]) until
    /// its storage file is closed, so that the same data dir can be opened
    /// again at once (a restart in the same process, as tests do).
    pub async fn shutdown(&self) -> Result<(), tokio::task::JoinError> {
        let stopped = self.raft.shutdown().await;
        if !self.store_closed.clone().wait(STORE_CLOSE_WAIT).await {
            tracing::warn!(
                "the Raft store is still open {STORE_CLOSE_WAIT:?} after shutdown; \
                 something still holds it"
            );
        }
        stopped
    }

    /// Raft metrics as they change (the leader loops follow leadership with it).
    pub fn metrics_watch(&self) -> watch::Receiver<openraft::RaftMetrics<NodeId, BasicNode>> {
        self.raft.metrics()
    }

    /// SIGHUP: re-reads the token files and the TLS files served, each
    /// keeping what it had when its files are broken.
    pub fn reload_credentials(&self) {
        // The peer token only once the verifier took the files: a broken
        // file must leave both as they were.
        let reloaded = self
            .verifier
            .reload()
            .and_then(|r| self.peer_token.reload().map(|_| r));
        match reloaded {
            Ok(true) => tracing::info!("SIGHUP: token files reloaded"),
            Ok(false) => tracing::info!("SIGHUP: --insecure, no tokens to reload"),
            Err(e) => {
                tracing::warn!(error = %e, "SIGHUP: tokens not reloaded; the old ones stay")
            }
        }
        if let Some(tls) = &self.serving_tls {
            match tls.reload() {
                Ok(files) => {
                    tracing::info!(
                        "SIGHUP: TLS certificate, key and CA reloaded for new connections"
                    );
                    self.present_to_peers(files);
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "SIGHUP: TLS files not reloaded; the ones in use stay (served and presented)"
                ),
            }
        }
    }

    /// What this master presents to its peers (Raft, TimeoutNow) moves to
    /// `files`, which the serving side has just taken (so they are whole):
    /// an old CA can then be dropped without restarting. Unchanged files
    /// keep the peer connections as they are.
    fn present_to_peers(&self, files: crescent_auth::tls::TlsFiles) {
        if self
            .tls
            .load()
            .as_deref()
            .is_some_and(|current| current.same_as(&files))
        {
            return;
        }
        self.peers.reload_tls(files.client_config());
        self.tls.store(Some(Arc::new(files)));
        tracing::info!("SIGHUP: the peers are reached with the reloaded TLS files");
    }

    pub fn metrics(&self) -> openraft::RaftMetrics<NodeId, BasicNode> {
        // Cloned at once: never hold the borrow across an await.
        self.raft.metrics().borrow().clone()
    }

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The leader this node knows of, with its address.
    pub fn leader_hint(&self) -> (Option<NodeId>, Option<String>) {
        let m = self.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader;
        let addr = leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.addr.clone())
        });
        (leader, addr)
    }

    pub fn node_addr(&self, id: NodeId) -> Option<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
    }

    /// NOT_LEADER naming the leader this node knows (the successor while a
    /// transfer is under way), never itself.
    pub fn not_leader(&self) -> NodeError {
        if let Some((to, _)) = *self.transferring_to.lock().expect("lock poisoned") {
            return NodeError::NotLeader {
                leader_id: Some(to),
                leader_addr: self.node_addr(to),
            };
        }
        let (leader_id, leader_addr) = self.leader_hint();
        NodeError::NotLeader {
            leader_id: leader_id.filter(|l| *l != self.id),
            leader_addr: leader_addr.filter(|_| leader_id != Some(self.id)),
        }
    }

    fn transferring(&self) -> bool {
        self.transferring_to
            .lock()
            .expect("lock poisoned")
            .is_some()
    }

    /// The command for `op`, or `TooLarge` when its log entry would exceed
    /// [`sizing::MAX_ENTRY_BYTES`].
    fn command(origin: Option<Origin>, op: Op) -> Result<Command, NodeError> {
        let cmd = Command {
            now_ms: now_ms(),
            seed: rand::random(),
            origin,
            op,
        };
        let bytes = crescent_raft::codec::encoded_len(&cmd).unwrap_or(u64::MAX);
        if bytes > sizing::MAX_ENTRY_BYTES {
            return Err(NodeError::TooLarge {
                bytes,
                limit: sizing::MAX_ENTRY_BYTES,
            });
        }
        Ok(cmd)
    }

    /// Proposes a command and waits for it to be committed by a quorum and applied.
    pub async fn propose(&self, origin: Option<Origin>, op: Op) -> Result<Response, NodeError> {
        if self.transferring() {
            return Err(self.not_leader());
        }
        let write = self.write_until_decided(Self::command(origin, op)?);
        tokio::time::timeout(self.config.write_timeout, write)
            .await
            .unwrap_or(Err(NodeError::Timeout))
    }

    /// Like [`propose`](Self::propose), and runs `settle` once the entry's
    /// fate is known (applied, or refused because this node does not or no
    /// longer leads), even after the caller stopped waiting: its request
    /// was cancelled, or `--write-timeout` passed and the entry may still
    /// commit. For leader memory that must stay set while an entry is in
    /// flight (doomed keys).
    pub async fn propose_settled(
        self: &Arc<Self>,
        origin: Option<Origin>,
        op: Op,
        settle: impl FnOnce(&MasterNode, &Result<Response, NodeError>) + Send + 'static,
    ) -> Result<Response, NodeError> {
        if self.transferring() {
            let refused = Err(self.not_leader());
            settle(self, &refused);
            return refused;
        }
        let node = self.clone();
        let cmd = match Self::command(origin, op) {
            Ok(cmd) => cmd,
            Err(refused) => {
                let refused = Err(refused);
                settle(self, &refused);
                return refused;
            }
        };
        let task = tokio::spawn(
            async move {
                let outcome = node.write_until_decided(cmd).await;
                settle(&node, &outcome);
                outcome
            }
            .in_current_span(),
        );
        match tokio::time::timeout(self.config.write_timeout, task).await {
            Err(_) => Err(NodeError::Timeout),
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => Err(NodeError::Unavailable(format!("proposal task failed: {e}"))),
        }
    }

    /// Hands `cmd` to Raft and waits, with no time limit, until it is
    /// applied or refused.
    async fn write_until_decided(&self, cmd: Command) -> Result<Response, NodeError> {
        let started = Instant::now();
        let outcome = self.raft.client_write(cmd).await;
        self.counters.proposal_latency.observe(started.elapsed());
        match outcome {
            Ok(resp) => {
                // `apply` logs the same index: the link from this request's
                // span to the state machine.
                tracing::debug!(log_index = resp.log_id.index, "applied");
                Ok(resp.data)
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(NodeError::NotLeader {
                    leader_id: f.leader_id,
                    leader_addr: f.leader_node.map(|n| n.addr),
                })
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(NodeError::Unavailable(e.to_string()))
            }
            Err(RaftError::Fatal(e)) => {
                Err(NodeError::Unavailable(format!("raft node stopped: {e}")))
            }
        }
    }

    /// Waits until this node is the leader and has applied everything committed
    /// before the call (a Raft read index, shared by concurrent readers).
    pub async fn linearizable_read(&self) -> Result<(), NodeError> {
        if !self.is_leader()
            || self
                .transferring_to
                .lock()
                .expect("lock poisoned")
                .is_some()
        {
            return Err(self.not_leader());
        }
        if self.config.read_mode == ReadMode::Lease {
            if let Some(index) = self.lease_read_index().await {
                self.wait_applied(index).await?;
                self.counters
                    .lease_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(());
            }
        }
        self.counters
            .read_index_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.read_barrier
            .send(tx)
            .map_err(|_| NodeError::Unavailable("node is shutting down".into()))?;
        let started = Instant::now();
        let outcome = tokio::time::timeout(self.config.write_timeout, rx).await;
        self.counters.read_index_latency.observe(started.elapsed());
        match outcome {
            Err(_) => Err(NodeError::Timeout),
            Ok(Err(_)) => Err(NodeError::Unavailable("node is shutting down".into())),
            Ok(Ok(Err(NodeError::NotLeader { .. }))) => Err(self.not_leader()),
            Ok(Ok(r)) => r,
        }
    }

    /// The log index a read must wait for if it may be answered under the
    /// leader lease now, else None (then a quorum round is needed). Asked of
    /// the Raft core itself, so a vote this node granted a moment ago (and
    /// with it the leadership) is seen at once, not when metrics catch up.
    async fn lease_read_index(&self) -> Option<u64> {
        let id = self.id;
        let (vote, committed, configs) = self
            .raft
            .with_raft_state(move |st| {
                let vote = *st.vote_ref();
                let leading = st.server_state == ServerState::Leader
                    && vote.is_committed()
                    && vote.leader_id().voted_for() == Some(id);
                leading.then(|| {
                    // One voter set, or two during a membership change
                    // (joint consensus): a quorum of each is needed.
                    let configs: Vec<BTreeSet<NodeId>> = st
                        .membership_state
                        .effective()
                        .get_joint_config()
                        .iter()
                        .map(|c| c.iter().copied().collect())
                        .collect();
                    (vote, st.committed, configs)
                })
            })
            .await
            .ok()??;
        let term = vote.leader_id().term;
        // Until an entry of this term is committed the leader may not know
        // everything its predecessors committed (openraft's read index is
        // max(committed, this term's first entry) for the same reason).
        let committed = committed.filter(|c| c.leader_id.term == term)?;
        if self.transfer_term.load(std::sync::atomic::Ordering::SeqCst) == term {
            return None;
        }
        if !self.config.unsafe_lease_reads_ignore_expiry {
            let now = Instant::now();
            let acked = self.lease_clock.quorum_acked_at(&vote, &configs, id, now);
            let lease = self
                .config
                .election_timeout_max
                .saturating_sub(self.config.lease_read_margin);
            if !lease_holds(acked, lease, now) {
                return None;
            }
        }
        Some(committed.index)
    }

    /// Waits until the state machine has applied `index`.
    async fn wait_applied(&self, index: u64) -> Result<(), NodeError> {
        let applied = |node: &Self| {
            node.shared
                .sm
                .read()
                .expect("state lock poisoned")
                .last_applied
                .map_or(0, |l| l.index)
        };
        if applied(self) >= index {
            return Ok(());
        }
        match tokio::time::timeout(
            self.config.write_timeout,
            self.raft
                .wait(None)
                .applied_index_at_least(Some(index), "lease read"),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(NodeError::Unavailable(format!("raft node stopped: {e}"))),
            Err(_) => Err(NodeError::Timeout),
        }
    }

    /// Called when this node starts handing leadership over: lease reads
    /// stop for the rest of the current term.
    fn forgo_lease_this_term(&self) {
        self.transfer_term
            .store(self.current_term(), std::sync::atomic::Ordering::SeqCst);
    }

    /// The Raft term this node is in.
    pub fn current_term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Whether `mem` (locked by the caller, who read `term` from
    /// [`current_term`](Self::current_term) before locking) may still owe
    /// its predecessor's leases; see [`LeaderMemory::in_takeover_grace`].
    /// Decide lease verdicts under the same lock.
    fn honours_predecessor_leases(&self, mem: &LeaderMemory, term: u64) -> bool {
        !self.config.unsafe_forget_leases && mem.in_takeover_grace(term, self.config.lease_ttl)
    }

    /// Whether this leader may still owe its predecessor's leases (see
    /// [`LeaderMemory::in_takeover_grace`]), for callers that decide nothing
    /// under the leader-memory lock (tests).
    pub fn may_hold_predecessor_leases(&self) -> bool {
        let term = self.current_term();
        let mem = self.leader_mem.lock().expect("lock poisoned");
        self.honours_predecessor_leases(&mem, term)
    }

    /// Reads leader memory, for callers that decide nothing under its lock
    /// (tests, reports).
    pub fn with_leader_memory<T>(&self, read: impl FnOnce(&LeaderMemory) -> T) -> T {
        read(&self.leader_mem.lock().expect("lock poisoned"))
    }

    /// Looks `keys` up and leases those found, `answer` turning each lookup
    /// into the reply; or None, with `settled` enabled under the same lock,
    /// when a key is doomed (its removal or eviction is in flight; wait for
    /// `settled` and ask again). The leases are granted before the lock is
    /// let go: a removal that takes it next must see them (see
    /// [`propose_remove`](Self::propose_remove)).
    pub fn lookup_leasing<T>(
        &self,
        keys: &[String],
        settled: Pin<&mut Notified<'_>>,
        mut answer: impl FnMut(&MetaState, Result<ObjectView, MetaError>) -> T,
    ) -> Option<Vec<T>> {
        let mut found = Vec::new();
        let sm = self.shared.sm.read().expect("state lock poisoned");
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        if keys.iter().any(|k| mem.is_doomed(k)) {
            settled.enable();
            return None;
        }
        let now = Instant::now();
        let answers = keys
            .iter()
            .map(|k| {
                let looked = sm.state.lookup(k);
                if let Ok(view) = &looked {
                    found.push(k.as_str());
                    // Memory replicas are listed first: a disk one first
                    // means the object is only on disk.
                    if view
                        .replicas
                        .first()
                        .is_some_and(|r| sm.state.tier_of(r.segment_id) == Tier::Disk)
                    {
                        mem.disk_reads.record(k, now);
                    }
                }
                answer(&sm.state, looked)
            })
            .collect();
        mem.grant_leases(found, now + self.config.lease_ttl, now_ms());
        Some(answers)
    }

    /// Records that `client` is alive (a heartbeat, or a fresh mount).
    pub fn record_heartbeat(&self, client: &str) {
        self.leader_mem
            .lock()
            .expect("lock poisoned")
            .record_heartbeat(client, Instant::now());
    }

    /// A client's heartbeat, naming the segments it serves: whether it must
    /// re-mount (one of them is gone, expired, or another client's). Only
    /// owners' liveness is recorded (their segments expire without it);
    /// recording every made-up client id grew leader memory without bound
    /// (100 k ids, never pruned).
    pub fn client_heartbeat(
        &self,
        client_id: &str,
        segment_ids: &[u64],
    ) -> Result<bool, NodeError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let (need_remount, owns_a_segment) = {
            let state = self.state();
            let need_remount = segment_ids.iter().any(|id| {
                state
                    .segments
                    .get(id)
                    .is_none_or(|s| s.owner != client_id || !s.is_live())
            });
            let owns = state.segments.values().any(|s| s.owner == client_id);
            (need_remount, owns)
        };
        if owns_a_segment {
            self.record_heartbeat(client_id);
        }
        Ok(need_remount)
    }

    /// Clients heard from within `--client-ttl`.
    pub fn active_clients(&self) -> usize {
        let mem = self.leader_mem.lock().expect("lock poisoned");
        mem.active_clients(self.config.client_ttl, Instant::now())
    }

    /// Owners of live segments not heard from within `ttl` (see
    /// [`LeaderMemory::silent_owners`]).
    pub fn silent_owners(&self, ttl: Duration) -> Vec<String> {
        let owners: BTreeSet<String> = {
            let state = self.state();
            state
                .segments
                .values()
                .filter(|s| s.is_live())
                .map(|s| s.owner.clone())
                .collect()
        };
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        mem.silent_owners(owners, ttl, Instant::now())
    }

    /// How long this node has led (since its leader memory was reset).
    pub fn leading_for(&self) -> Duration {
        self.leader_mem.lock().expect("lock poisoned").leading_for()
    }

    /// Forgets the read leases that ran out.
    pub fn expire_leases(&self) {
        let now = Instant::now();
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        mem.expire_leases(now);
    }

    /// Removes `keys` (at least one). Without `force`, keys that may be under
    /// a read lease are refused: those this leader leased, those another
    /// remove or an eviction is about to take, and every key during the
    /// first lease TTL of a new leader (its predecessor's leases are unknown
    /// to it). The verdict is proposed with the keys, never answered before
    /// proposing: a retry of this request must get the answer of its first
    /// attempt, which only the replicated dedup table knows (the first
    /// attempt may still be in flight here, or have been proposed by a
    /// previous leader).
    ///
    /// Keys that will go are marked doomed until the entry's fate is known
    /// (even if this call is cancelled or times out first): lookups of them
    /// wait until then, so none leases an object whose space is about to be
    /// freed, nor answers "not found" for a removal that does not happen (a
    /// retry that dedup answers, or a refusal). The state machine keeps a
    /// removed object's space unallocated for a lease TTL, for readers
    /// leased before.
    pub async fn propose_remove(
        self: &Arc<Self>,
        origin: Option<Origin>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Response, NodeError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let (leased, doomed_here) = {
            let term = self.current_term();
            let mut mem = self.leader_mem.lock().expect("lock poisoned");
            let in_grace = self.honours_predecessor_leases(&mem, term);
            mem.claim_for_removal(&keys, force, in_grace, Instant::now())
        };
        let hold_ms = if self.config.unsafe_forget_leases {
            0
        } else {
            self.config.lease_ttl.as_millis() as u64
        };
        let op = Op::Remove {
            keys,
            force,
            leased,
            hold_ms,
        };
        self.propose_settled(origin, op, move |node, _| node.undoom(&doomed_here))
            .await
    }

    /// Resets leader memory when this node gains leadership in a new term.
    pub fn on_leadership(&self, term: u64) {
        let failures = self
            .shared
            .sm
            .read()
            .expect("state lock poisoned")
            .state
            .alloc_failures;
        *self.leader_mem.lock().expect("lock poisoned") = LeaderMemory::new(term, failures)
            .promoting(self.config.promotion_reads, self.config.promotion_window);
        *self.placer.lock().expect("lock poisoned") = placer::Placer::new(
            term,
            now_ms(),
            self.config.put_reservation_size,
            placer_switches(&self.config),
        );
        self.doom_settled.notify_waiters();
    }

    /// Marks `keys` doomed as a removal in flight does; each mark is taken
    /// back by one [`undoom`](Self::undoom). Tests hold a removal's place
    /// with it.
    pub fn doom(&self, keys: &[String]) {
        self.leader_mem.lock().expect("lock poisoned").doom(keys);
    }

    /// Of `keys` (eviction victims whose demotion failed, their doom marks
    /// taken back meanwhile), dooms and returns those no read lease covers
    /// now, so they can be evicted as if just chosen; None while this
    /// leader may still owe its predecessor's leases.
    pub fn doom_unleased(&self, keys: &[String]) -> Option<Vec<String>> {
        let term = self.current_term();
        let mut mem = self.leader_mem.lock().expect("lock poisoned");
        if self.honours_predecessor_leases(&mem, term) {
            return None;
        }
        let now = Instant::now();
        let free: Vec<String> = keys
            .iter()
            .filter(|k| !mem.access_info(k, now).leased)
            .cloned()
            .collect();
        mem.doom(&free);
        Some(free)
    }

    /// Takes back one doom mark on each of `keys` and wakes the lookups
    /// waiting for them.
    pub fn undoom(&self, keys: &[String]) {
        self.leader_mem.lock().expect("lock poisoned").undoom(keys);
        self.doom_settled.notify_waiters();
    }

    /// A wake-up for the next [`undoom`](Self::undoom). Create it before
    /// [`lookup_leasing`](Self::lookup_leasing), which enables it under the
    /// leader-memory lock where it saw a doomed key, so no wake-up is missed.
    pub fn doom_settled(&self) -> Notified<'_> {
        self.doom_settled.notified()
    }
}

/// Serves read-index requests in rounds: every waiter queued before a round
/// starts is answered by that round, so N concurrent readers cost one quorum
/// heartbeat instead of N.
async fn read_barrier_loop(
    raft: Raft,
    mut rx: mpsc::UnboundedReceiver<oneshot::Sender<Result<(), NodeError>>>,
) {
    while let Some(first) = rx.recv().await {
        let mut waiters = vec![first];
        while let Ok(w) = rx.try_recv() {
            waiters.push(w);
        }
        let result = match raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(_)) => Err(NodeError::NotLeader {
                leader_id: None,
                leader_addr: None,
            }),
            Err(RaftError::Fatal(e)) => {
                Err(NodeError::Unavailable(format!("raft node stopped: {e}")))
            }
        };
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }
}
