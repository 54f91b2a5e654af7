//! One master: its Raft node, the shared metadata state, and the leader's
//! memory (read leases, heartbeats, access times) that is never replicated.
//!
//! Its fields are private: the gRPC and HTTP handlers and the leader loops
//! ask it for what they need, so the lock order (state before leader memory)
//! and the pairing of doom marks with their release live in one place.

mod one_commit;
pub mod placer;
mod promotion;
mod transfer;

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
    /// One-commit puts: placed without a commit, asked and fell back, and
    /// the reservations they live in.
    pub one_commit_placements: AtomicU64,
    pub two_commit_fallbacks: AtomicU64,
    /// Of the one-commit placements, those made ahead of their put (asked
    /// for in a PutEnd), and those given back unused.
    pub placements_ahead: AtomicU64,
    pub placements_ahead_given_back: AtomicU64,
    /// Puts placed on disk because memory had no room (see
    /// `MetaState::put_start_one`).
    pub puts_to_disk: AtomicU64,
    pub reservations_made: AtomicU64,
    pub reservations_retired: AtomicU64,
    /// Objects moved from memory to disk, bytes copied, copies that failed,
    /// and objects dropped from disk at the disk watermark.
    pub demotions: AtomicU64,
    pub demotion_bytes: AtomicU64,
    pub demotion_failures: AtomicU64,
    pub disk_evictions: AtomicU64,
    /// Objects copied from disk back to memory, bytes copied, copies that
    /// failed, and promoted objects whose memory copy eviction released.
    pub promotions: AtomicU64,
    pub promotion_bytes: AtomicU64,
    pub promotion_failures: AtomicU64,
    pub memory_copies_dropped: AtomicU64,
    /// Promoted objects whose disk copy the disk watermark released.
    pub disk_copies_dropped: AtomicU64,
    /// Copies between tiers a store made between its own segments (COPY),
    /// counted when the copy is done, before its `TierMoveEnd` commits (so
    /// it may exceed the demotions and promotions above); the rest went
    /// through the leader.
    pub tier_copies_on_store: AtomicU64,
    /// Time of one object's copy between tiers that was done (by a store
    /// or by the leader), from its start to its last byte checked.
    pub tier_copy_latency: crescent_proto::metrics::Histogram,
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
    disk_reads: promotion::DiskReads,
    /// Segments a copy between tiers failed to write, and until when they
    /// are not picked as copy targets (see [`MasterNode::avoid_copy_targets`]).
    failed_copy_targets: HashMap<SegmentId, Instant>,
}

/// How long, past the failed copies' release time, a segment that failed
/// a copy between tiers (a disk answering I/O errors, say) is passed over
/// as a copy target: its victims go to another segment meanwhile, or are
/// evicted when none has room, rather than fail against it every round.
pub const COPY_TARGET_BACKOFF: Duration = Duration::from_secs(30);

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
            disk_reads: promotion::DiskReads::new(0, Duration::ZERO),
            failed_copy_targets: HashMap::new(),
        }
    }

    /// Counts lookups of disk-only objects for promotion: see
    /// [`promotion::DiskReads`].
    fn promoting(mut self, reads: u32, window: Duration) -> Self {
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
        plan_eviction(
            &sm.state,
            victims,
            crate::tier_move::MAX_MOVED_SIZE,
            &avoided,
        )
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
                || o.size > crate::tier_move::MAX_MOVED_SIZE
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
    fn claim_victims_in(&self, tier: Tier) -> Option<(Vec<(String, ObjectStamp)>, u64)> {
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

    async fn change_membership(
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
