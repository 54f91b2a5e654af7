//! The client library an inference engine links: put/get of real bytes.
//!
//! Metadata goes to the masters ([`MasterClient`]); bytes go straight to the
//! stores: the client's own segment first (a memcpy), then a same-host store's
//! shared memory or disk file (`pread`), then TCP (mutual TLS with
//! `data_tls`).
//! Every object carries a crc32c recorded at PutEnd;
//! a get verifies it and falls back to another replica on mismatch, so a get
//! never returns bytes that differ from what was put.
//!
//! This file holds the types, connecting and the metadata-only calls; the
//! rest is split by concern: `put`, `get`, `routing` (reaching a replica and
//! moving its bytes), `degraded` (local-only mode), `renewal` (remembered
//! lookups, renewed in the background with `descriptor_cache`) and `error`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crescent_proto::pb;
use crescent_proto::request_id::{self, RequestId};
use crescent_store::{DiskFileReader, ShmMapping, TcpTransport};

use crate::agent::{AgentConfig, StoreAgent};
use crate::config::{ClientConfig, Protocol};
use crate::local_cache::LocalCache;
use crate::master::{MasterClient, MasterRpcError};

mod ahead;
mod degraded;
mod error;
mod get;
mod put;
mod renewal;
mod routing;

pub use ahead::AheadStats;
pub use error::{Error, Result};

use renewal::Remembered;
use routing::Route;

/// Where a put left its bytes (`crescentctl put` once printed "stored"
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
    /// Bytes read from a same-host store's disk segment file (pread).
    pub disk_file_bytes: std::sync::atomic::AtomicU64,
    /// Reads of a same-host disk file that failed or did not match the
    /// object's checksum (the file was replaced, say), then asked of the
    /// store over TCP.
    pub disk_file_fallbacks: std::sync::atomic::AtomicU64,
    pub tcp_bytes: std::sync::atomic::AtomicU64,
    pub checksum_failures: std::sync::atomic::AtomicU64,
    /// Puts (and batch items) tried again on other segments after a write
    /// to a segment failed.
    pub puts_retried_elsewhere: std::sync::atomic::AtomicU64,
    /// Objects read with a cached descriptor, no master call (`descriptor_cache`).
    pub cached_reads: std::sync::atomic::AtomicU64,
    /// Cached descriptors that no longer read (forgotten, the key looked up
    /// again): a store restarted, say.
    pub cached_read_fallbacks: std::sync::atomic::AtomicU64,
    /// Keys looked up again in the background because they were read
    /// through the cache and their lease neared its end.
    pub descriptor_renewals: std::sync::atomic::AtomicU64,
    /// Placements made ahead of puts (`place_ahead`).
    pub ahead: Arc<AheadStats>,
}

/// The client's state and operations; [`Client`] owns it together with the
/// background task that watches master reachability.
pub struct ClientCore {
    pub stats: ClientStats,
    master: Arc<MasterClient>,
    tcp: TcpTransport,
    shm: Mutex<HashMap<String, Arc<ShmMapping>>>,
    /// Same-host disk segment files open for reading (or found unreadable),
    /// by path.
    disk_files: Mutex<HashMap<String, routing::DiskFileState>>,
    local: Option<Arc<StoreAgent>>,
    /// The embedded disk segment, when `disk_path` is set; taken by
    /// `close`, which so releases its file at once.
    disk: Mutex<Option<Arc<StoreAgent>>>,
    /// Removes this client started: a lookup answered across one is not
    /// remembered (it may describe the object removed).
    removals: std::sync::atomic::AtomicU64,
    config: ClientConfig,
    degraded: AtomicBool,
    last_master_ok: Mutex<Instant>,
    /// Objects put while degraded (and not yet published), bounded by local_buffer_size.
    local_only: Mutex<LocalCache>,
    /// Recent GetReplicaList answers, usable while degraded until their
    /// lease ends (and with `descriptor_cache`, for reads with no lookup).
    descriptors: Mutex<HashMap<String, Remembered>>,
    /// The next put's placement, asked for ahead (`place_ahead`).
    ahead: ahead::AheadPlacements,
}

/// A connected client. Dereferences to [`ClientCore`] for every operation.
pub struct Client {
    core: Arc<ClientCore>,
    monitor: tokio::task::JoinHandle<()>,
    /// Renews cached descriptors (`descriptor_cache` only).
    renewal: Option<tokio::task::JoinHandle<()>>,
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
        if let Some(r) = &self.renewal {
            r.abort();
        }
    }
}

const MAX_DESCRIPTORS: usize = 65_536;
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

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
        let token = crescent_auth::BearerToken::from_optional_file(config.token_file.as_deref())
            .map_err(|e| Error::Config(e.to_string()))?;
        let tls = config.tls().map_err(|e| Error::Config(e.to_string()))?;
        let etcd_tls = crescent_auth::tls::for_etcd(config.etcd_tls, tls.as_ref())
            .map_err(|e| Error::Config(e.to_string()))?;
        let data_tls = crescent_auth::tls::for_data_port(config.data_tls, tls.as_ref())
            .map_err(|e| Error::Config(e.to_string()))?;
        let mut master = MasterClient::connect_with_etcd_tls(&config.master, etcd_tls)
            .await
            .map_err(|e| match e {
                MasterRpcError::BadAddress(a) => Error::Config(format!("bad master address {a:?}")),
                other => Error::Unavailable(other.to_string()),
            })?
            .with_token(token)
            .with_tls(tls.as_ref());
        master.policy.deadline = if config.degrade_after.is_zero() {
            config.master_deadline
        } else {
            // A call during an outage gives up when degraded mode would start.
            config
                .master_deadline
                .min(config.degrade_after.max(Duration::from_millis(500)))
        };
        let master = Arc::new(master);
        // Before any segment is served: nothing below may fail and leave
        // one running.
        let tcp = TcpTransport::with_tls(data_tls).map_err(|e| Error::Config(e.to_string()))?;
        let contributes = config.global_segment_size > 0 || config.disk_path.is_some();
        let listen: std::net::SocketAddr = if contributes {
            config.transfer_listen.parse().map_err(|_| {
                Error::Config(format!(
                    "bad transfer listen address {:?}",
                    config.transfer_listen
                ))
            })?
        } else {
            std::net::SocketAddr::from(([0, 0, 0, 0], 0))
        };
        // With `data_tls` the segments' transfer ports are mutual TLS with
        // this client's files, as every store's is with its own: its
        // certificate must then be fit to serve (see docs/security.md).
        let serving_tls = match data_tls.filter(|_| contributes) {
            Some(files) => Some(Arc::new(
                crescent_auth::tls::ServingTls::new(files)
                    .map_err(|e| Error::Config(e.to_string()))?,
            )),
            None => None,
        };
        // This engine's memory and disk segments: the masters have it copy
        // between them (demotion, promotion) without the bytes leaving it.
        let local_segments = crescent_store::server::LocalSegments::default();
        let local = if config.global_segment_size > 0 {
            let agent = StoreAgent::start(
                master.clone(),
                AgentConfig {
                    segment_size: config.global_segment_size,
                    listen,
                    hostname: config.local_hostname.clone(),
                    shm: config.shm,
                    tls: serving_tls.clone(),
                    local_segments: local_segments.clone(),
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
        let disk = match &config.disk_path {
            Some(dir) => {
                let disk_cfg = AgentConfig {
                    // Beside the memory segment's name, as crescent-store
                    // names its disk (a reopened file keeps the name it has).
                    name: local
                        .as_ref()
                        .map(|m| format!("{}-disk", m.name))
                        .unwrap_or_default(),
                    segment_size: config.disk_size,
                    listen: std::net::SocketAddr::new(listen.ip(), 0),
                    hostname: config.local_hostname.clone(),
                    tls: serving_tls.clone(),
                    // Same-host readers (this process too) pread the file.
                    shm: config.shm,
                    disk_path: Some(dir.clone()),
                    disk_reformat: config.disk_reformat,
                    local_segments: local_segments.clone(),
                    ..Default::default()
                };
                let attempts =
                    (DISK_IN_USE_WAIT.as_millis() / DISK_IN_USE_EVERY.as_millis()) as u32;
                match StoreAgent::start_disk(master.clone(), disk_cfg, attempts, DISK_IN_USE_EVERY)
                    .await
                {
                    Ok(agent) => {
                        if agent
                            .wait_mounted(config.master_deadline.min(Duration::from_secs(5)))
                            .await
                            .is_none()
                        {
                            tracing::warn!("this client's disk segment is not mounted yet; it keeps trying in the background");
                        }
                        Some(agent)
                    }
                    Err(e) => {
                        if let Some(memory) = &local {
                            memory.shutdown().await;
                        }
                        let hint = e.disk_formatted_for().map_or_else(String::new, |size| {
                            format!(
                                " (set CRESCENT_DISK_SIZE / disk_size to {size} to serve its \
                                 objects, or CRESCENT_DISK_REFORMAT=1 / disk_reformat once to \
                                 discard them)"
                            )
                        });
                        return Err(Error::Config(format!(
                            "disk segment in {}: {e}{hint}",
                            dir.display()
                        )));
                    }
                }
            }
            None => None,
        };
        let core = Arc::new(ClientCore {
            stats: ClientStats::default(),
            master,
            tcp,
            shm: Mutex::new(HashMap::new()),
            disk_files: Mutex::new(HashMap::new()),
            local,
            disk: Mutex::new(disk),
            removals: std::sync::atomic::AtomicU64::new(0),
            degraded: AtomicBool::new(false),
            last_master_ok: Mutex::new(Instant::now()),
            local_only: Mutex::new(LocalCache::new(config.local_buffer_size)),
            descriptors: Mutex::new(HashMap::new()),
            ahead: ahead::AheadPlacements::default(),
            config,
        });
        let monitor = tokio::spawn(monitor_loop(Arc::downgrade(&core)));
        let renewal = core
            .config
            .descriptor_cache
            .then(|| tokio::spawn(renewal::renew_loop(Arc::downgrade(&core))));
        Ok(Client {
            core,
            monitor,
            renewal,
        })
    }

    /// Connects with configuration from the environment (`MOONCAKE_*`/`CRESCENT_*`).
    pub async fn from_env() -> Result<Self> {
        let config = ClientConfig::from_env().map_err(|e| Error::Config(e.0))?;
        Self::connect(config).await
    }

    /// Unmounts this client's memory segment (if any) and stops serving
    /// it and its disk segment, whose file is released at once (even while
    /// other threads still hold this client). The disk segment stays
    /// mounted until it expires, and a client started again on the same
    /// directory takes it back with its objects.
    pub async fn close(&self) {
        self.core
            .ahead
            .give_back_ready(&self.core.master, &self.core.stats.ahead)
            .await;
        self.monitor.abort();
        if let Some(r) = &self.renewal {
            r.abort();
        }
        if let Some(agent) = &self.core.local {
            agent.shutdown().await;
        }
        let disk = self.core.disk.lock().expect("lock poisoned").take();
        if let Some(agent) = disk {
            agent.shutdown().await;
        }
    }
}

/// How long a client waits for a disk segment another process still holds
/// (the previous process of a restarted engine, exiting), trying again
/// every `DISK_IN_USE_EVERY`.
const DISK_IN_USE_WAIT: Duration = Duration::from_secs(10);
const DISK_IN_USE_EVERY: Duration = Duration::from_millis(200);

/// Watches master reachability: enters local-only mode after `degrade_after`
/// without a master, leaves it as soon as a leader answers (within one probe),
/// then publishes or drops what was stored locally meanwhile. Also gives
/// back placements made ahead that grew too old while no put came.
async fn monitor_loop(core: std::sync::Weak<ClientCore>) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(core) = core.upgrade() else { return };
        core.ahead.give_back_old(&core.master, &core.stats.ahead);
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

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The embedded store, when this client contributes memory.
    pub fn local_store(&self) -> Option<&Arc<StoreAgent>> {
        self.local.as_ref()
    }

    /// The embedded disk segment, when this client contributes one
    /// (`disk_path`) and is not closed.
    pub fn local_disk(&self) -> Option<Arc<StoreAgent>> {
        self.disk.lock().expect("lock poisoned").clone()
    }

    /// Marks a remove of `key` (every key: `None`) by this client as
    /// started or finished: the cached descriptors it concerns are dropped,
    /// and lookups answered across it are not remembered.
    fn removing(&self, key: Option<&str>) {
        self.removals
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let mut d = self.descriptors.lock().expect("lock poisoned");
        match key {
            Some(k) => {
                d.remove(k);
                // An object kept while degraded and not published is not
                // read back after the key's own remove either.
                self.local_only.lock().expect("lock poisoned").remove(k);
            }
            None => d.clear(),
        }
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
            avoid_segments: Vec::new(),
        }
    }

    pub async fn exists(&self, key: &str) -> Result<bool> {
        traced("exists", key, async move {
            self.master
                .exists(key)
                .await
                .map_err(|e| Error::from_master(e, key))
        })
        .await
    }

    pub async fn batch_exists(&self, keys: &[&str]) -> Result<Vec<Result<bool>>> {
        traced(
            "batch_exists",
            keys.first().copied().unwrap_or_default(),
            async move {
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
            },
        )
        .await
    }

    /// Size of the object in bytes.
    pub async fn get_size(&self, key: &str) -> Result<u64> {
        traced("get_size", key, async move {
            Ok(self
                .master
                .get_replica_list(key)
                .await
                .map_err(|e| Error::from_master(e, key))?
                .size)
        })
        .await
    }

    /// Removes `key`. Its cached descriptor is dropped before and after,
    /// so this client does not read it again from one.
    pub async fn remove(&self, key: &str, force: bool) -> Result<()> {
        traced("remove", key, async move {
            self.removing(Some(key));
            let removed = self.master.remove(key, force).await;
            self.removing(Some(key));
            removed.map_err(|e| Error::from_master(e, key))
        })
        .await
    }

    pub async fn remove_by_regex(&self, regex: &str, force: bool) -> Result<u64> {
        traced("remove_by_regex", regex, async move {
            self.removing(None);
            let removed = self.master.remove_by_regex(regex, force).await;
            self.removing(None);
            removed.map_err(|e| Error::from_master(e, ""))
        })
        .await
    }

    pub async fn remove_all(&self, force: bool) -> Result<u64> {
        traced("remove_all", "", async move {
            self.removing(None);
            self.local_only.lock().expect("lock poisoned").clear();
            let removed = self.master.remove_all(force).await;
            self.removing(None);
            removed.map_err(|e| Error::from_master(e, ""))
        })
        .await
    }
}

/// Runs one engine call in a `request` span under a fresh request id, which
/// every master RPC made for it carries (see [`crescent_proto::request_id`]):
/// one slow call can be followed through the masters' and stores' logs.
pub(super) async fn traced<F: Future>(op: &'static str, key: &str, fut: F) -> F::Output {
    let id = RequestId::random();
    let span = tracing::info_span!("request", op, request_id = %id, key);
    request_id::scope(id, fut).instrument(span).await
}
