//! One master: its Raft node, the shared metadata state, and the leader's
//! memory (read leases, heartbeats, access times) that is never replicated.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crescent_raft::lease::{lease_holds, LeaseClock};
use crescent_raft::network::{ContactBook, GrpcNetworkFactory};
use crescent_raft::sizing;
use crescent_raft::state::{Command, Op, Origin};
use crescent_raft::store::SharedState;
use crescent_raft::{BasicNode, NodeId, Raft, Response};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ServerState, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot};

use crate::config::{MasterConfig, ReadMode};

/// Counters the master exposes at `/metrics` (names follow Mooncake's).
#[derive(Default)]
pub struct MasterMetrics {
    pub put_start_requests: AtomicU64,
    pub put_end_requests: AtomicU64,
    pub get_replica_list_requests: AtomicU64,
    pub exist_requests: AtomicU64,
    pub remove_requests: AtomicU64,
    pub mount_requests: AtomicU64,
    pub heartbeat_requests: AtomicU64,
    pub leader_changes: AtomicU64,
    pub eviction_rounds: AtomicU64,
    /// Requests refused by a per-client quota, by quota.
    pub quota_rejections_objects: AtomicU64,
    pub quota_rejections_unfinished_puts: AtomicU64,
    pub quota_rejections_key_bytes: AtomicU64,
    pub quota_rejections_segments: AtomicU64,
    /// Reads answered under the leader lease, and reads that needed a
    /// quorum round (read-index mode, or the lease did not hold).
    pub lease_reads: AtomicU64,
    pub read_index_reads: AtomicU64,
    pub proposal_latency: crescent_proto::metrics::Histogram,
    pub read_index_latency: crescent_proto::metrics::Histogram,
}

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

/// What the leader remembers that is not in the log. A new leader starts empty
/// and compensates by waiting (see `LeaderMemory::grace`).
pub struct LeaderMemory {
    pub since: Instant,
    pub term: u64,
    pub heartbeats: HashMap<String, Instant>,
    pub leases: HashMap<String, Instant>,
    pub last_access_ms: HashMap<String, u64>,
    /// Keys about to be removed or evicted, with how many removals or
    /// evictions in flight claim each: reads treat them as gone so no new
    /// lease is granted on them meanwhile.
    doomed: HashMap<String, u32>,
    pub seen_alloc_failures: u64,
}

impl LeaderMemory {
    fn new(term: u64, seen_alloc_failures: u64) -> Self {
        Self {
            since: Instant::now(),
            term,
            heartbeats: HashMap::new(),
            leases: HashMap::new(),
            last_access_ms: HashMap::new(),
            doomed: HashMap::new(),
            seen_alloc_failures,
        }
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
}

pub struct MasterNode {
    pub id: NodeId,
    pub addr: String,
    pub raft: Raft,
    pub shared: Arc<SharedState>,
    pub config: MasterConfig,
    pub contacts: Arc<ContactBook>,
    /// Send times of AppendEntries the followers accepted: the read lease.
    lease_clock: Arc<LeaseClock>,
    /// The term in which a leadership transfer was last attempted here: no
    /// lease reads in it (the transfer lets a successor campaign; see
    /// `docs/lease-reads.md`).
    transfer_term: AtomicU64,
    pub leader_mem: Mutex<LeaderMemory>,
    /// Woken whenever doomed keys are taken back (or leader memory reset):
    /// lookups of a doomed key wait on it.
    doom_settled: tokio::sync::Notify,
    read_barrier: mpsc::UnboundedSender<oneshot::Sender<Result<(), NodeError>>>,
    /// Set while handing leadership over: writes are refused, naming the successor.
    pub transferring_to: Mutex<Option<(NodeId, Instant)>>,
    /// etcd membership, when started with --etcd.
    pub etcd: Option<Arc<crate::etcd::EtcdMembership>>,
    pub counters: MasterMetrics,
    /// Who may call what (token mode, or everything with `--insecure`).
    pub verifier: Arc<crescent_auth::Verifier>,
    /// The cluster token this master presents to its peers.
    pub peer_token: crescent_auth::BearerToken,
    /// Mutual TLS (`--tls-*`): presented to the peers (read at start).
    pub tls: Option<crescent_auth::tls::TlsFiles>,
    /// What the gRPC and HTTP ports serve with `--tls-*` (re-read on SIGHUP).
    pub serving_tls: Option<Arc<crescent_auth::tls::ServingTls>>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

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
        let (log, sm) = crescent_raft::store::open(&config.data_dir)?;
        let shared = sm.shared.clone();
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
            id,
            addr: addr.clone(),
            raft: raft.clone(),
            shared,
            config: config.clone(),
            contacts,
            lease_clock,
            transfer_term: AtomicU64::new(0),
            leader_mem: Mutex::new(LeaderMemory::new(0, 0)),
            doom_settled: tokio::sync::Notify::new(),
            read_barrier: tx,
            transferring_to: Mutex::new(None),
            etcd: etcd.clone(),
            counters: Default::default(),
            verifier,
            peer_token,
            tls,
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
        let task = tokio::spawn(async move {
            let outcome = node.write_until_decided(cmd).await;
            settle(&node, &outcome);
            outcome
        });
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
            Ok(resp) => Ok(resp.data),
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
    pub fn forgo_lease_this_term(&self) {
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
    pub fn honours_predecessor_leases(&self, mem: &LeaderMemory, term: u64) -> bool {
        !self.config.unsafe_forget_leases && mem.in_takeover_grace(term, self.config.lease_ttl)
    }

    /// [`honours_predecessor_leases`](Self::honours_predecessor_leases) on
    /// its own, for callers that decide nothing under the lock (tests).
    pub fn may_hold_predecessor_leases(&self) -> bool {
        let term = self.current_term();
        let mem = self.leader_mem.lock().expect("lock poisoned");
        self.honours_predecessor_leases(&mem, term)
    }

    /// Grants read leases and records access, under the caller's lock on
    /// leader memory (taken together with the lookup that found the keys).
    pub fn grant_leases<'a>(&self, mem: &mut LeaderMemory, keys: impl Iterator<Item = &'a str>) {
        let now = Instant::now();
        let exp = now + self.config.lease_ttl;
        let ms = now_ms();
        for k in keys {
            mem.leases.insert(k.to_string(), exp);
            mem.last_access_ms.insert(k.to_string(), ms);
        }
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
        *self.leader_mem.lock().expect("lock poisoned") = LeaderMemory::new(term, failures);
        self.doom_settled.notify_waiters();
    }

    /// Takes back one doom mark on each of `keys` and wakes the lookups
    /// waiting for them.
    pub fn undoom(&self, keys: &[String]) {
        self.leader_mem.lock().expect("lock poisoned").undoom(keys);
        self.doom_settled.notify_waiters();
    }

    /// A wake-up for the next [`undoom`](Self::undoom). Create it while
    /// holding the leader-memory lock under which a doomed key was seen, and
    /// `enable` it before letting go, so no wake-up is missed.
    pub fn doom_settled(&self) -> tokio::sync::futures::Notified<'_> {
        self.doom_settled.notified()
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

#[cfg(test)]
mod leader_memory_tests {
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
}
