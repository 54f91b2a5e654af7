//! The client library an inference engine links: put/get of real bytes.
//!
//! Metadata goes to the masters ([`MasterClient`]); bytes go straight to the
//! stores: the client's own segment first (a memcpy), then a same-host store's
//! shared memory, then TCP. Every object carries a crc32c recorded at PutEnd;
//! a get verifies it and falls back to another replica on mismatch, so a get
//! never returns bytes that differ from what was put.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_store::protocol::{segment_tag, MAX_TRANSFER};
use crescent_store::{ShmMapping, TcpTransport};

use crate::agent::{AgentConfig, StoreAgent};
use crate::config::{ClientConfig, Protocol};
use crate::local_cache::LocalCache;
use crate::master::{ClientError, MasterClient};

/// Errors of the client library. `NotFound` is distinct from every failure.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("object {0:?} not found")]
    NotFound(String),
    #[error("{}: {message}", code.as_str_name())]
    Master { code: ErrorCode, message: String },
    #[error("TRANSFER_FAIL: {0}")]
    Transfer(String),
    #[error("CHECKSUM_MISMATCH: every replica of {0:?} failed its checksum")]
    ChecksumMismatch(String),
    #[error("INVALID_PARAMS: {0}")]
    InvalidArgument(String),
    #[error("buffer of {buffer} bytes is too small for the {size}-byte object")]
    BufferTooSmall { size: u64, buffer: usize },
    #[error("RPC_FAIL: no master reachable: {0}")]
    Unavailable(String),
    #[error("configuration: {0}")]
    Config(String),
}

impl Error {
    /// Mooncake's error code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound(_) => ErrorCode::ObjectNotFound,
            Error::Master { code, .. } => *code,
            Error::Transfer(_) => ErrorCode::TransferFail,
            Error::ChecksumMismatch(_) => ErrorCode::ChecksumMismatch,
            Error::InvalidArgument(_) | Error::BufferTooSmall { .. } | Error::Config(_) => {
                ErrorCode::InvalidParams
            }
            Error::Unavailable(_) => ErrorCode::RpcFail,
        }
    }

    fn from_master(e: ClientError, key: &str) -> Self {
        match e {
            ClientError::Status {
                code: ErrorCode::ObjectNotFound,
                ..
            } => Error::NotFound(key.to_string()),
            ClientError::Status { code, message } => Error::Master { code, message },
            ClientError::Unavailable(m) => Error::Unavailable(m),
            ClientError::BadAddress(a) => Error::Config(format!("bad master address {a:?}")),
        }
    }

    fn from_status(s: &pb::Status, key: &str) -> Option<Self> {
        if s.is_ok() {
            return None;
        }
        Some(Error::from_master(ClientError::from_status(s), key))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a put left its bytes (issue 11: `crescentctl put` printed "stored"
/// while no master answered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Committed by the masters: any client can read it, and it outlives this
    /// process.
    InCluster,
    /// Degraded mode: only in this process's bounded local cache, lost with
    /// the process; published to the cluster on recovery when
    /// `publish_on_recover` is set, else dropped then.
    LocalOnly,
}

/// Replication options of a put (Mooncake's `ReplicateConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicateConfig {
    /// Number of replicas, each on a distinct segment (0 = the client default).
    pub replica_num: u32,
    pub soft_pin: bool,
    pub hard_pin: bool,
    /// Segment names tried first.
    pub preferred_segments: Vec<String>,
}

/// Where reads and writes went, for tests and metrics.
#[derive(Debug, Default)]
pub struct ClientStats {
    pub degraded_puts: std::sync::atomic::AtomicU64,
    pub degraded_gets: std::sync::atomic::AtomicU64,
    pub published: std::sync::atomic::AtomicU64,
    pub local_bytes: std::sync::atomic::AtomicU64,
    pub shm_bytes: std::sync::atomic::AtomicU64,
    pub tcp_bytes: std::sync::atomic::AtomicU64,
    pub checksum_failures: std::sync::atomic::AtomicU64,
}

/// The client's state and operations; [`Client`] owns it together with the
/// background task that watches master reachability.
pub struct ClientCore {
    pub stats: ClientStats,
    master: Arc<MasterClient>,
    tcp: TcpTransport,
    shm: Mutex<HashMap<String, Arc<ShmMapping>>>,
    local: Option<Arc<StoreAgent>>,
    config: ClientConfig,
    degraded: AtomicBool,
    last_master_ok: Mutex<Instant>,
    /// Objects put while degraded (and not yet published), bounded by local_buffer_size.
    local_only: Mutex<LocalCache>,
    /// Recent GetReplicaList answers, usable while degraded until their lease ends.
    descriptors: Mutex<HashMap<String, (pb::GetReplicaListResponse, Instant)>>,
    /// Keys with a put in flight from this client. The master tells writers
    /// apart by client id, so two concurrent puts of one key from one client
    /// could have one's PutEnd complete the other's object (after a forced
    /// remove in between) with the wrong checksum; found by the chaos soak.
    puts_in_flight: Mutex<std::collections::HashSet<String>>,
}

/// Holds a key in `puts_in_flight` until dropped.
struct PutSlot<'a> {
    core: &'a ClientCore,
    key: String,
}

impl Drop for PutSlot<'_> {
    fn drop(&mut self) {
        self.core
            .puts_in_flight
            .lock()
            .expect("lock poisoned")
            .remove(&self.key);
    }
}

/// A connected client. Dereferences to [`ClientCore`] for every operation.
pub struct Client {
    core: Arc<ClientCore>,
    monitor: tokio::task::JoinHandle<()>,
}

impl std::ops::Deref for Client {
    type Target = ClientCore;
    fn deref(&self) -> &ClientCore {
        &self.core
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

const MAX_DESCRIPTORS: usize = 65_536;
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Where a replica can be reached from here.
enum Route<'a> {
    Local(&'a StoreAgent),
    Shm(Arc<ShmMapping>),
    Tcp(&'a str),
}

impl Client {
    /// Connects to the masters; with `global_segment_size > 0` also contributes
    /// a segment (an embedded store) and waits until it is mounted.
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        if config.protocol == Protocol::Rdma && !cfg!(feature = "rdma") {
            return Err(Error::Config(
                "protocol rdma requested, but this build has no RDMA support (build with --features rdma)".into(),
            ));
        }
        if config.protocol == Protocol::Rdma {
            // The RDMA data path is compiled but has never run on hardware; be explicit.
            return Err(Error::Config(
                "protocol rdma is not wired into the client data path yet; use tcp".into(),
            ));
        }
        let mut master = MasterClient::connect(&config.master)
            .await
            .map_err(|e| match e {
                ClientError::BadAddress(a) => Error::Config(format!("bad master address {a:?}")),
                other => Error::Unavailable(other.to_string()),
            })?;
        master.policy.deadline = if config.degrade_after.is_zero() {
            config.master_deadline
        } else {
            // A call during an outage gives up when degraded mode would start.
            config
                .master_deadline
                .min(config.degrade_after.max(Duration::from_millis(500)))
        };
        let master = Arc::new(master);
        let local = if config.global_segment_size > 0 {
            let listen = config.transfer_listen.parse().map_err(|_| {
                Error::Config(format!(
                    "bad transfer listen address {:?}",
                    config.transfer_listen
                ))
            })?;
            let agent = StoreAgent::start(
                master.clone(),
                AgentConfig {
                    segment_size: config.global_segment_size,
                    listen,
                    hostname: config.local_hostname.clone(),
                    shm: config.shm,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
            if agent
                .wait_mounted(config.master_deadline.min(Duration::from_secs(5)))
                .await
                .is_none()
            {
                tracing::warn!(
                    "this client's segment is not mounted yet; it keeps trying in the background"
                );
            }
            Some(agent)
        } else {
            None
        };
        let core = Arc::new(ClientCore {
            stats: ClientStats::default(),
            master,
            tcp: TcpTransport::new(),
            shm: Mutex::new(HashMap::new()),
            local,
            degraded: AtomicBool::new(false),
            last_master_ok: Mutex::new(Instant::now()),
            local_only: Mutex::new(LocalCache::new(config.local_buffer_size)),
            descriptors: Mutex::new(HashMap::new()),
            puts_in_flight: Mutex::new(Default::default()),
            config,
        });
        let monitor = tokio::spawn(monitor_loop(Arc::downgrade(&core)));
        Ok(Client { core, monitor })
    }

    /// Connects with configuration from the environment (`MOONCAKE_*`/`CRESCENT_*`).
    pub async fn from_env() -> Result<Self> {
        let config = ClientConfig::from_env().map_err(|e| Error::Config(e.0))?;
        Self::connect(config).await
    }

    /// Unmounts this client's segment (if any) and stops serving it.
    pub async fn close(&self) {
        self.monitor.abort();
        if let Some(agent) = &self.core.local {
            agent.shutdown().await;
        }
    }
}

/// Watches master reachability: enters local-only mode after `degrade_after`
/// without a master, leaves it as soon as a leader answers (within one probe),
/// then publishes or drops what was stored locally meanwhile.
async fn monitor_loop(core: std::sync::Weak<ClientCore>) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(core) = core.upgrade() else { return };
        if core.config.degrade_after.is_zero() {
            continue;
        }
        let reachable = core.master.probe(Duration::from_millis(800)).await;
        if reachable {
            core.mark_master_ok();
            if core.degraded.swap(false, Ordering::AcqRel) {
                tracing::info!(
                    "a master leader is reachable again: leaving degraded (local-only) mode"
                );
                core.recover().await;
            }
        } else {
            let silent = core.last_master_ok.lock().expect("lock poisoned").elapsed();
            if silent >= core.config.degrade_after && !core.degraded.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    ?silent,
                    "no master reachable: entering degraded (local-only) mode"
                );
            }
        }
    }
}

impl ClientCore {
    pub fn master(&self) -> &MasterClient {
        &self.master
    }

    /// True while the client serves from local memory only (no master reachable).
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Acquire)
    }

    fn mark_master_ok(&self) {
        *self.last_master_ok.lock().expect("lock poisoned") = Instant::now();
    }

    /// A master call failed for lack of masters: go degraded if it has been long enough.
    fn note_unavailable(&self, e: &Error) {
        if matches!(e, Error::Unavailable(_)) && !self.config.degrade_after.is_zero() {
            let silent = self.last_master_ok.lock().expect("lock poisoned").elapsed();
            if silent >= self.config.degrade_after && !self.degraded.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    ?silent,
                    "no master reachable: entering degraded (local-only) mode"
                );
            }
        }
    }

    /// Holds `r` for degraded reads while its read lease lasts. The lease is
    /// counted from `asked` (when the request was sent), not from the answer:
    /// the master started it later than that, so ours ends first.
    fn remember_descriptor(&self, key: &str, r: &pb::GetReplicaListResponse, asked: Instant) {
        let mut d = self.descriptors.lock().expect("lock poisoned");
        if d.len() >= MAX_DESCRIPTORS {
            d.clear();
        }
        let until = asked + Duration::from_millis(r.lease_ttl_ms);
        d.insert(key.to_string(), (r.clone(), until));
    }

    fn leased_descriptor(&self, key: &str) -> Option<pb::GetReplicaListResponse> {
        let d = self.descriptors.lock().expect("lock poisoned");
        d.get(key)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(r, _)| r.clone())
    }

    fn put_local(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut cache = self.local_only.lock().expect("lock poisoned");
        match cache.insert(key, Arc::new(value.to_vec())) {
            Ok(evicted) => {
                if !evicted.is_empty() {
                    tracing::debug!(
                        count = evicted.len(),
                        "local-only cache full; dropped oldest entries"
                    );
                }
                self.stats.degraded_puts.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(size) => Err(Error::InvalidArgument(format!(
                "degraded mode: a {size}-byte value exceeds the {}-byte local buffer",
                self.config.local_buffer_size
            ))),
        }
    }

    /// Degraded get: the local-only cache, then a replica whose descriptor we
    /// still hold under its read lease (bytes verified by checksum).
    async fn get_degraded(
        &self,
        key: &str,
        buf: Option<&mut [u8]>,
    ) -> Result<(usize, Option<Vec<u8>>)> {
        self.stats.degraded_gets.fetch_add(1, Ordering::Relaxed);
        let local = self.local_only.lock().expect("lock poisoned").get(key);
        if let Some(v) = local {
            return match buf {
                Some(b) if b.len() < v.len() => Err(Error::BufferTooSmall {
                    size: v.len() as u64,
                    buffer: b.len(),
                }),
                Some(b) => {
                    b[..v.len()].copy_from_slice(&v);
                    Ok((v.len(), None))
                }
                None => Ok((v.len(), Some(v.to_vec()))),
            };
        }
        if let Some(found) = self.leased_descriptor(key) {
            return match buf {
                Some(b) => Ok((self.read_verified(key, &found, b).await?, None)),
                None => {
                    let mut v = vec![0u8; found.size as usize];
                    self.read_verified(key, &found, &mut v).await?;
                    Ok((v.len(), Some(v)))
                }
            };
        }
        Err(Error::Unavailable(format!(
            "degraded mode: {key:?} is neither in the local cache nor under a held read lease"
        )))
    }

    /// After an outage: publish (or drop) what was put locally.
    async fn recover(&self) {
        let keys = self.local_only.lock().expect("lock poisoned").keys();
        if keys.is_empty() {
            return;
        }
        if !self.config.publish_on_recover {
            let mut cache = self.local_only.lock().expect("lock poisoned");
            for k in &keys {
                cache.remove(k);
            }
            tracing::info!(
                dropped = keys.len(),
                "dropped objects stored while degraded (publish_on_recover is off)"
            );
            return;
        }
        let mut published = 0;
        for k in keys {
            let value = self.local_only.lock().expect("lock poisoned").get(&k);
            let Some(value) = value else { continue };
            match self
                .put_cluster(&k, &value, &ReplicateConfig::default())
                .await
            {
                Ok(()) => {
                    self.local_only.lock().expect("lock poisoned").remove(&k);
                    published += 1;
                }
                Err(e) => {
                    tracing::warn!(key = k, error = %e, "could not publish a locally stored object; keeping it local");
                    if matches!(e, Error::Unavailable(_)) {
                        break;
                    }
                }
            }
        }
        self.stats.published.fetch_add(published, Ordering::Relaxed);
        tracing::info!(published, "published objects stored while degraded");
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The embedded store, when this client contributes memory.
    pub fn local_store(&self) -> Option<&Arc<StoreAgent>> {
        self.local.as_ref()
    }

    fn replicate(&self, cfg: &ReplicateConfig) -> pb::ReplicateConfig {
        pb::ReplicateConfig {
            replica_num: if cfg.replica_num == 0 {
                self.config.default_replicas.max(1)
            } else {
                cfg.replica_num
            },
            soft_pin: cfg.soft_pin,
            hard_pin: cfg.hard_pin,
            preferred_segments: cfg.preferred_segments.clone(),
        }
    }

    fn route<'a>(&'a self, r: &'a pb::ReplicaDescriptor) -> Route<'a> {
        if let Some(agent) = &self.local {
            if agent.segment_id() == Some(r.segment_id) {
                return Route::Local(agent);
            }
        }
        if !r.shm_path.is_empty() && r.hostname == self.config.local_hostname {
            if let Some(m) = self.shm_mapping(&r.shm_path) {
                return Route::Shm(m);
            }
        }
        Route::Tcp(&r.endpoint)
    }

    fn shm_mapping(&self, path: &str) -> Option<Arc<ShmMapping>> {
        let mut maps = self.shm.lock().expect("lock poisoned");
        if let Some(m) = maps.get(path) {
            return Some(m.clone());
        }
        match ShmMapping::open(std::path::Path::new(path)) {
            Ok(m) => {
                let m = Arc::new(m);
                maps.insert(path.to_string(), m.clone());
                Some(m)
            }
            Err(e) => {
                tracing::debug!(path, error = %e, "cannot map shared segment; using TCP");
                None
            }
        }
    }

    fn forget_shm(&self, path: &str) {
        self.shm.lock().expect("lock poisoned").remove(path);
    }

    /// Reads order: local segment, same-host shared memory, then remote.
    fn read_order<'a>(
        &self,
        replicas: &'a [pb::ReplicaDescriptor],
    ) -> Vec<&'a pb::ReplicaDescriptor> {
        let rank = |r: &pb::ReplicaDescriptor| match self.route(r) {
            Route::Local(_) => 0,
            Route::Shm(_) => 1,
            Route::Tcp(_) => 2,
        };
        let mut v: Vec<&pb::ReplicaDescriptor> = replicas.iter().collect();
        v.sort_by_key(|r| rank(r));
        v
    }

    fn count(&self, route: &Route<'_>, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = match route {
            Route::Local(_) => &self.stats.local_bytes,
            Route::Shm(_) => &self.stats.shm_bytes,
            Route::Tcp(_) => &self.stats.tcp_bytes,
        };
        c.fetch_add(bytes as u64, Relaxed);
    }

    async fn write_replica(&self, r: &pb::ReplicaDescriptor, data: &[u8]) -> Result<()> {
        if r.length != data.len() as u64 {
            return Err(Error::Transfer(format!(
                "replica length {} does not match the value's {} bytes",
                r.length,
                data.len()
            )));
        }
        let route = self.route(r);
        self.count(&route, data.len());
        match route {
            Route::Local(agent) => agent
                .segment
                .write_at(r.offset, data)
                .map_err(|e| Error::Transfer(e.to_string())),
            Route::Shm(m) => m.write_at(r.offset, data).map_err(|e| {
                self.forget_shm(&r.shm_path);
                Error::Transfer(e.to_string())
            }),
            Route::Tcp(ep) => {
                let writes: Vec<(u64, &[u8])> = chunks(r.offset, data.len())
                    .map(|(off, start, end)| (off, &data[start..end]))
                    .collect();
                self.tcp
                    .write(ep, segment_tag(r.segment_id), &writes)
                    .await
                    .map_err(|e| {
                        self.tcp.forget(ep);
                        Error::Transfer(e.to_string())
                    })
            }
        }
    }

    /// Reads one replica into `buf`, returning the crc32c of what was read
    /// (computed while the bytes are still in cache).
    async fn read_replica(&self, r: &pb::ReplicaDescriptor, buf: &mut [u8]) -> Result<u32> {
        let route = self.route(r);
        self.count(&route, buf.len());
        match route {
            Route::Local(agent) => {
                // SAFETY: range checked by `slice`; the object is immutable once complete.
                let src = unsafe { agent.segment.slice(r.offset, buf.len() as u64) }
                    .map_err(|e| Error::Transfer(e.to_string()))?;
                Ok(crescent_store::copy_with_crc(buf, src))
            }
            Route::Shm(m) => m.read_at_with_crc(r.offset, buf).map_err(|e| {
                self.forget_shm(&r.shm_path);
                Error::Transfer(e.to_string())
            }),
            Route::Tcp(ep) => {
                let step = MAX_TRANSFER as usize;
                let mut reads: Vec<(u64, &mut [u8])> = buf
                    .chunks_mut(step)
                    .enumerate()
                    .map(|(i, piece)| (r.offset + (i * step) as u64, piece))
                    .collect();
                let crcs = self
                    .tcp
                    .read_checksummed(ep, segment_tag(r.segment_id), &mut reads)
                    .await
                    .map_err(|e| {
                        self.tcp.forget(ep);
                        Error::Transfer(e.to_string())
                    })?;
                Ok(combine_crcs(&crcs, &reads))
            }
        }
    }

    /// Reads a verified copy into `buf[..size]`, trying replicas in order.
    async fn read_verified(
        &self,
        key: &str,
        found: &pb::GetReplicaListResponse,
        buf: &mut [u8],
    ) -> Result<usize> {
        let size = found.size;
        if (buf.len() as u64) < size {
            return Err(Error::BufferTooSmall {
                size,
                buffer: buf.len(),
            });
        }
        let dst = &mut buf[..size as usize];
        let mut mismatch = false;
        let mut last = String::from("object has no replica");
        for r in self.read_order(&found.replicas) {
            if r.length != size {
                last = format!(
                    "replica on segment {} has length {} for a {size}-byte object",
                    r.segment_id, r.length
                );
                continue;
            }
            match self.read_replica(r, dst).await {
                Ok(crc) => {
                    if crc == found.checksum {
                        return Ok(size as usize);
                    }
                    tracing::warn!(
                        key,
                        segment_id = r.segment_id,
                        "replica failed its checksum; trying another"
                    );
                    self.stats
                        .checksum_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    mismatch = true;
                }
                Err(e) => {
                    tracing::debug!(key, segment_id = r.segment_id, error = %e, "replica unreadable; trying another");
                    last = e.to_string();
                }
            }
        }
        if mismatch {
            Err(Error::ChecksumMismatch(key.to_string()))
        } else {
            Err(Error::Transfer(last))
        }
    }

    // ---------------------------------------------------------------- puts

    /// Stores `value` under `key`. A key that already exists counts as success
    /// (objects are immutable, as in Mooncake). In degraded mode the value goes
    /// to the bounded local cache only (not replicated: see the README); use
    /// [`put_placed`](Self::put_placed) to learn which happened.
    pub async fn put(&self, key: &str, value: &[u8], cfg: &ReplicateConfig) -> Result<()> {
        self.put_placed(key, value, cfg).await.map(|_| ())
    }

    /// [`put`](Self::put) that says where the bytes went: committed by the
    /// masters, or only into this process's local cache because no master
    /// was reachable.
    pub async fn put_placed(
        &self,
        key: &str,
        value: &[u8],
        cfg: &ReplicateConfig,
    ) -> Result<Stored> {
        if value.is_empty() {
            return Err(Error::InvalidArgument("value is empty".into()));
        }
        if self.is_degraded() {
            return self.put_local(key, value).map(|_| Stored::LocalOnly);
        }
        match self.put_cluster(key, value, cfg).await {
            Ok(()) => Ok(Stored::InCluster),
            Err(e @ Error::Unavailable(_)) => {
                self.note_unavailable(&e);
                if self.is_degraded() {
                    self.put_local(key, value).map(|_| Stored::LocalOnly)
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Claims `key` for one put from this client, or says another is in flight.
    fn claim_put(&self, key: &str) -> Result<PutSlot<'_>> {
        if !self
            .puts_in_flight
            .lock()
            .expect("lock poisoned")
            .insert(key.to_string())
        {
            return Err(Error::Master {
                code: ErrorCode::ReplicaIsNotReady,
                message: format!("a put of {key:?} from this client is still in flight"),
            });
        }
        Ok(PutSlot {
            core: self,
            key: key.to_string(),
        })
    }

    async fn put_cluster(&self, key: &str, value: &[u8], cfg: &ReplicateConfig) -> Result<()> {
        let _slot = self.claim_put(key)?;
        let checksum = crc32c::crc32c(value);
        let replicas = match self
            .master
            .put_start(key, value.len() as u64, self.replicate(cfg))
            .await
        {
            Ok(r) => r,
            Err(ClientError::Status {
                code: ErrorCode::ObjectAlreadyExists,
                ..
            }) => return Ok(()),
            Err(e) => return Err(Error::from_master(e, key)),
        };
        let writes =
            futures::future::join_all(replicas.iter().map(|r| self.write_replica(r, value))).await;
        if let Some(Err(e)) = writes.into_iter().find(|w| w.is_err()) {
            // Nothing half-written may become readable.
            if let Err(re) = self.master.put_revoke(key).await {
                tracing::warn!(key, error = %re, "revoke after a failed put also failed; the master will reclaim it");
            }
            return Err(e);
        }
        self.master
            .put_end(key, checksum)
            .await
            .map_err(|e| Error::from_master(e, key))?;
        self.mark_master_ok();
        Ok(())
    }

    /// Same as [`put`](Self::put): the bytes are sent from the caller's buffer without a copy.
    pub async fn put_from(&self, key: &str, buffer: &[u8], cfg: &ReplicateConfig) -> Result<()> {
        self.put(key, buffer, cfg).await
    }

    /// Puts many objects with one PutStart and one PutEnd; per-item results.
    pub async fn put_batch(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        let placed = self.put_batch_placed(items, cfg).await?;
        Ok(placed.into_iter().map(|r| r.map(|_| ())).collect())
    }

    /// [`put_batch`](Self::put_batch) that says, per item, where the bytes went.
    pub async fn put_batch_placed(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<Stored>>> {
        let (results, stored) = if self.is_degraded() {
            let local = items.iter().map(|(k, v)| self.put_local(k, v)).collect();
            (local, Stored::LocalOnly)
        } else {
            (self.put_batch_cluster(items, cfg).await?, Stored::InCluster)
        };
        Ok(results.into_iter().map(|r| r.map(|_| stored)).collect())
    }

    async fn put_batch_cluster(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut results: Vec<Option<Result<()>>> = vec![None; items.len()];
        let mut slots = Vec::with_capacity(items.len());
        for (i, (k, v)) in items.iter().enumerate() {
            if v.is_empty() {
                results[i] = Some(Err(Error::InvalidArgument("value is empty".into())));
                continue;
            }
            match self.claim_put(k) {
                Ok(slot) => slots.push(slot),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let idx: Vec<usize> = (0..items.len()).filter(|i| results[*i].is_none()).collect();
        if idx.is_empty() {
            return Ok(results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect());
        }
        let starts = match self
            .master
            .batch_put_start(
                idx.iter()
                    .map(|&i| pb::PutStartItem {
                        key: items[i].0.to_string(),
                        size: items[i].1.len() as u64,
                    })
                    .collect(),
                self.replicate(cfg),
            )
            .await
        {
            Ok(starts) => starts,
            Err(e) => {
                // A batch over 1 MiB of keys goes in parts; a part refused
                // after earlier ones started (a quota, a failover) would leave
                // those puts unfinished, holding the keys and this client's
                // unfinished-put quota until the master reclaims them. The
                // master revokes only this client's unfinished puts.
                let keys = idx.iter().map(|&i| items[i].0.to_string()).collect();
                if let Err(re) = self.master.batch_put_revoke(keys).await {
                    tracing::debug!(error = %re, "revoke after a failed batch PutStart failed; the master will reclaim");
                }
                return Err(Error::from_master(e, ""));
            }
        };
        if starts.len() != idx.len() {
            return Err(Error::Master {
                code: ErrorCode::InternalError,
                message: "master answered a different number of items".into(),
            });
        }
        // Group writes per route so each store gets one pipelined exchange.
        // Grouped by store address and segment: a restarted store serves a new
        // segment at the same address, and each exchange carries one segment tag.
        let mut tcp_groups: HashMap<(String, u64), Vec<PendingWrite<'_>>> = HashMap::new();
        let mut direct: Vec<(usize, &pb::ReplicaDescriptor)> = Vec::new();
        let mut started: Vec<usize> = Vec::new();
        for (pos, (&i, s)) in idx.iter().zip(&starts).enumerate() {
            let key = items[i].0;
            match s.status.as_ref().and_then(|st| Error::from_status(st, key)) {
                Some(Error::Master {
                    code: ErrorCode::ObjectAlreadyExists,
                    ..
                }) => results[i] = Some(Ok(())),
                Some(e) => results[i] = Some(Err(e)),
                None => {
                    started.push(pos);
                    for r in &s.replicas {
                        if r.length != items[i].1.len() as u64 {
                            results[i] =
                                Some(Err(Error::Transfer("replica length mismatch".into())));
                            continue;
                        }
                        match self.route(r) {
                            Route::Tcp(ep) => {
                                let data = items[i].1;
                                for (off, a, b) in chunks(r.offset, data.len()) {
                                    tcp_groups
                                        .entry((ep.to_string(), r.segment_id))
                                        .or_default()
                                        .push((i, off, &data[a..b]));
                                }
                            }
                            _ => direct.push((i, r)),
                        }
                    }
                }
            }
        }
        for (i, r) in direct {
            if let Err(e) = self.write_replica(r, items[i].1).await {
                results[i] = Some(Err(e));
            }
        }
        let exchanges = tcp_groups.iter().map(|(group, writes)| async move {
            let (ep, segment_id) = (&group.0, group.1);
            let w: Vec<(u64, &[u8])> = writes.iter().map(|(_, off, d)| (*off, *d)).collect();
            let bytes: usize = w.iter().map(|(_, d)| d.len()).sum();
            self.stats
                .tcp_bytes
                .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
            (group, self.tcp.write(ep, segment_tag(segment_id), &w).await)
        });
        for (group, outcome) in futures::future::join_all(exchanges).await {
            if let Err(e) = outcome {
                self.tcp.forget(&group.0);
                for (i, _, _) in &tcp_groups[group] {
                    results[*i] = Some(Err(Error::Transfer(e.to_string())));
                }
            }
        }
        let mut to_end = Vec::new();
        let mut to_revoke = Vec::new();
        for pos in started {
            let i = idx[pos];
            match &results[i] {
                Some(Err(_)) => to_revoke.push(items[i].0.to_string()),
                _ => to_end.push(i),
            }
        }
        if !to_revoke.is_empty() {
            if let Err(e) = self.master.batch_put_revoke(to_revoke).await {
                tracing::warn!(error = %e, "revoke after failed writes also failed; the master will reclaim them");
            }
        }
        if !to_end.is_empty() {
            let ends = to_end
                .iter()
                .map(|&i| pb::PutEndItem {
                    key: items[i].0.to_string(),
                    checksum: crc32c::crc32c(items[i].1),
                })
                .collect();
            match self.master.batch_put_end(ends).await {
                Ok(statuses) => {
                    for (&i, st) in to_end.iter().zip(&statuses) {
                        results[i] = Some(match Error::from_status(st, items[i].0) {
                            Some(e) => Err(e),
                            None => Ok(()),
                        });
                    }
                }
                Err(e) => {
                    let e = Error::from_master(e, "");
                    for &i in &to_end {
                        results[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        Ok(results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect())
    }

    /// Same as [`put_batch`](Self::put_batch), from caller buffers.
    pub async fn batch_put_from(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        self.put_batch(items, cfg).await
    }

    // ---------------------------------------------------------------- gets

    /// GetReplicaList, remembering the answer for degraded reads.
    async fn lookup(&self, key: &str) -> Result<pb::GetReplicaListResponse> {
        let asked = Instant::now();
        match self.master.get_replica_list(key).await {
            Ok(found) => {
                self.mark_master_ok();
                self.remember_descriptor(key, &found, asked);
                Ok(found)
            }
            Err(e) => {
                let e = Error::from_master(e, key);
                self.note_unavailable(&e);
                Err(e)
            }
        }
    }

    /// Fetches `key`'s bytes, verified against their checksum.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        if self.is_degraded() {
            return self
                .get_degraded(key, None)
                .await
                .map(|(_, v)| v.unwrap_or_default());
        }
        match self.lookup(key).await {
            Ok(found) => {
                let mut buf = vec![0u8; found.size as usize];
                self.read_verified(key, &found, &mut buf).await?;
                Ok(buf)
            }
            Err(Error::NotFound(k)) => {
                match self.local_only.lock().expect("lock poisoned").get(key) {
                    // Stored while degraded and not yet published.
                    Some(v) => Ok(v.to_vec()),
                    None => Err(Error::NotFound(k)),
                }
            }
            Err(e) if self.is_degraded() => {
                let _ = e;
                self.get_degraded(key, None)
                    .await
                    .map(|(_, v)| v.unwrap_or_default())
            }
            Err(e) => Err(e),
        }
    }

    /// Reads `key` into `buf` without an intermediate copy; returns the object's size.
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        if self.is_degraded() {
            return self.get_degraded(key, Some(buf)).await.map(|(n, _)| n);
        }
        match self.lookup(key).await {
            Ok(found) => self.read_verified(key, &found, buf).await,
            Err(e @ Error::Unavailable(_)) if self.is_degraded() => {
                let _ = e;
                self.get_degraded(key, Some(buf)).await.map(|(n, _)| n)
            }
            Err(e) => Err(e),
        }
    }

    /// Fetches many objects: one GetReplicaList, one pipelined exchange per store.
    pub async fn get_batch(&self, keys: &[&str]) -> Result<Vec<Result<Vec<u8>>>> {
        if self.is_degraded() {
            return Ok(self.get_batch_degraded(keys).await);
        }
        let found = match self.lookup_batch(keys).await {
            Ok(found) => found,
            Err(Error::Unavailable(_)) if self.is_degraded() => {
                return Ok(self.get_batch_degraded(keys).await)
            }
            Err(e) => return Err(e),
        };
        let mut bufs: Vec<Vec<u8>> = found
            .iter()
            .map(|f| match f {
                Ok(r) => vec![0u8; r.size as usize],
                Err(_) => Vec::new(),
            })
            .collect();
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let sizes = self.read_batch(keys, &found, &mut slices).await;
        Ok(sizes
            .into_iter()
            .zip(bufs)
            .map(|(r, b)| r.map(|_| b))
            .collect())
    }

    /// Reads many objects into caller buffers; per-item sizes.
    pub async fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Result<Vec<Result<usize>>> {
        if keys.len() != bufs.len() {
            return Err(Error::InvalidArgument(format!(
                "{} keys but {} buffers",
                keys.len(),
                bufs.len()
            )));
        }
        if self.is_degraded() {
            return Ok(self.batch_get_into_degraded(keys, bufs).await);
        }
        let found = match self.lookup_batch(keys).await {
            Ok(found) => found,
            Err(Error::Unavailable(_)) if self.is_degraded() => {
                return Ok(self.batch_get_into_degraded(keys, bufs).await)
            }
            Err(e) => return Err(e),
        };
        Ok(self.read_batch(keys, &found, bufs).await)
    }

    /// [`get_batch`](Self::get_batch) in degraded mode: each key as
    /// [`get`](Self::get) would serve it (local cache or a held read lease).
    async fn get_batch_degraded(&self, keys: &[&str]) -> Vec<Result<Vec<u8>>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(
                self.get_degraded(k, None)
                    .await
                    .map(|(_, v)| v.unwrap_or_default()),
            );
        }
        out
    }

    /// [`batch_get_into`](Self::batch_get_into) in degraded mode, key by key.
    async fn batch_get_into_degraded(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize>> {
        let mut out = Vec::with_capacity(keys.len());
        for (k, buf) in keys.iter().zip(bufs.iter_mut()) {
            out.push(self.get_degraded(k, Some(buf)).await.map(|(n, _)| n));
        }
        out
    }

    /// BatchGetReplicaList; like [`lookup`](Self::lookup) it remembers each
    /// answer for degraded reads and counts a failure toward degraded mode.
    async fn lookup_batch(&self, keys: &[&str]) -> Result<Vec<Result<pb::GetReplicaListResponse>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let asked = Instant::now();
        let res = match self
            .master
            .batch_get_replica_list(keys.iter().map(|k| k.to_string()).collect())
            .await
        {
            Ok(res) => {
                self.mark_master_ok();
                res
            }
            Err(e) => {
                let e = Error::from_master(e, "");
                self.note_unavailable(&e);
                return Err(e);
            }
        };
        if res.len() != keys.len() {
            return Err(Error::Master {
                code: ErrorCode::InternalError,
                message: "master answered a different number of items".into(),
            });
        }
        Ok(res
            .into_iter()
            .zip(keys)
            .map(
                |(r, k)| match r.status.as_ref().and_then(|s| Error::from_status(s, k)) {
                    Some(e) => Err(e),
                    None => {
                        self.remember_descriptor(k, &r, asked);
                        Ok(r)
                    }
                },
            )
            .collect())
    }

    /// First tries each object's preferred replica, grouped per store and
    /// pipelined; anything that fails or mismatches falls back one by one.
    async fn read_batch(
        &self,
        keys: &[&str],
        found: &[Result<pb::GetReplicaListResponse>],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize>> {
        let mut results: Vec<Option<Result<usize>>> = vec![None; keys.len()];
        let mut tcp_groups: HashMap<(String, u64), Vec<usize>> = HashMap::new();
        let mut singles: Vec<usize> = Vec::new();
        for (i, f) in found.iter().enumerate() {
            match f {
                Err(e) => results[i] = Some(Err(e.clone())),
                Ok(r) => {
                    if (bufs[i].len() as u64) < r.size {
                        results[i] = Some(Err(Error::BufferTooSmall {
                            size: r.size,
                            buffer: bufs[i].len(),
                        }));
                        continue;
                    }
                    let order = self.read_order(&r.replicas);
                    match order.first() {
                        Some(first) if first.length == r.size && r.size <= MAX_TRANSFER => {
                            match self.route(first) {
                                Route::Tcp(ep) => tcp_groups
                                    .entry((ep.to_string(), first.segment_id))
                                    .or_default()
                                    .push(i),
                                _ => singles.push(i),
                            }
                        }
                        _ => singles.push(i),
                    }
                }
            }
        }
        // Pipelined first attempts, one exchange per store, concurrently.
        let mut by_index: Vec<Option<&mut [u8]>> =
            bufs.iter_mut().map(|b| Some(&mut **b)).collect();
        let mut exchanges = Vec::new();
        for ((ep, segment_id), idxs) in &tcp_groups {
            let tag = segment_tag(*segment_id);
            let mut reads: Vec<(u64, &mut [u8])> = Vec::new();
            for &i in idxs {
                let r = found[i].as_ref().expect("grouped only found objects");
                let first = self.read_order(&r.replicas)[0];
                let buf = by_index[i].take().expect("each index grouped once");
                reads.push((first.offset, &mut buf[..r.size as usize]));
            }
            exchanges.push(async move {
                let mut reads = reads;
                let outcome = self.tcp.read_checksummed(ep, tag, &mut reads).await;
                (ep, idxs, outcome)
            });
        }
        let mut fallback = singles;
        for (ep, idxs, outcome) in futures::future::join_all(exchanges).await {
            match outcome {
                Ok(crcs) => {
                    for (&i, crc) in idxs.iter().zip(crcs) {
                        let r = found[i].as_ref().expect("found");
                        self.stats
                            .tcp_bytes
                            .fetch_add(r.size, std::sync::atomic::Ordering::Relaxed);
                        if crc == r.checksum {
                            results[i] = Some(Ok(r.size as usize));
                        } else {
                            fallback.push(i);
                        }
                    }
                }
                Err(_) => {
                    self.tcp.forget(ep);
                    fallback.extend(idxs.iter().copied());
                }
            }
        }
        for i in fallback {
            let r = found[i].as_ref().expect("found");
            results[i] = Some(self.read_verified(keys[i], r, bufs[i]).await);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Transfer("not attempted".into()))))
            .collect()
    }

    // ---------------------------------------------------------------- metadata

    pub async fn exists(&self, key: &str) -> Result<bool> {
        self.master
            .exists(key)
            .await
            .map_err(|e| Error::from_master(e, key))
    }

    pub async fn batch_exists(&self, keys: &[&str]) -> Result<Vec<Result<bool>>> {
        let r = self
            .master
            .batch_exists(keys.iter().map(|k| k.to_string()).collect())
            .await
            .map_err(|e| Error::from_master(e, ""))?;
        Ok(r.into_iter()
            .zip(keys)
            .map(
                |(x, k)| match x.status.as_ref().and_then(|s| Error::from_status(s, k)) {
                    Some(e) => Err(e),
                    None => Ok(x.exists),
                },
            )
            .collect())
    }

    /// Size of the object in bytes.
    pub async fn get_size(&self, key: &str) -> Result<u64> {
        Ok(self
            .master
            .get_replica_list(key)
            .await
            .map_err(|e| Error::from_master(e, key))?
            .size)
    }

    pub async fn remove(&self, key: &str, force: bool) -> Result<()> {
        self.master
            .remove(key, force)
            .await
            .map_err(|e| Error::from_master(e, key))
    }

    pub async fn remove_by_regex(&self, regex: &str, force: bool) -> Result<u64> {
        self.master
            .remove_by_regex(regex, force)
            .await
            .map_err(|e| Error::from_master(e, ""))
    }

    pub async fn remove_all(&self, force: bool) -> Result<u64> {
        self.master
            .remove_all(force)
            .await
            .map_err(|e| Error::from_master(e, ""))
    }
}

/// One write of a batch put: (item index, remote offset, bytes).
type PendingWrite<'a> = (usize, u64, &'a [u8]);

/// The crc32c of consecutive pieces. Objects over MAX_TRANSFER (1 GiB) arrive
/// in several pieces; rather than combining crcs algebraically we re-hash the
/// (rare) multi-piece case.
fn combine_crcs(crcs: &[u32], pieces: &[(u64, &mut [u8])]) -> u32 {
    if crcs.len() == 1 {
        return crcs[0];
    }
    pieces
        .iter()
        .fold(0u32, |crc, (_, b)| crc32c::crc32c_append(crc, b))
}

/// Splits `len` bytes at `offset` into transfers of at most MAX_TRANSFER:
/// (remote offset, start, end) of the local buffer.
fn chunks(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
    let step = MAX_TRANSFER as usize;
    (0..len.div_ceil(step).max(1)).map(move |i| {
        let start = i * step;
        let end = (start + step).min(len);
        (offset + start as u64, start, end)
    })
}
