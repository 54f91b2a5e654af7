//! Contributes one segment to the pool: serves it over TCP, mounts it on the
//! masters, heartbeats, and re-mounts when told NEED_REMOUNT. Used by the
//! `crescent-store` binary (a memory segment, and a disk segment with
//! `--disk-path`) and by clients with `global_segment_size > 0`.
//!
//! While no master answers, the segment keeps being served (readers holding
//! descriptors still get their bytes) and the agent keeps retrying.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_auth::capability::SegmentKey;
use crescent_proto::pb;
use crescent_store::clock::{ClockCheck, ClockVerdict};
use crescent_store::segment::round_to_pages;
use crescent_store::{Segment, TransferStats};
use tokio::task::JoinHandle;

use crate::master::MasterClient;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Segment name, unique in the cluster. Empty: `<endpoint>-<random>`.
    pub name: String,
    pub segment_size: u64,
    /// Transfer listen address.
    pub listen: SocketAddr,
    /// Host other components use to reach the transfer port [default: the listen
    /// IP, or the local hostname when listening on all interfaces].
    pub advertise_host: Option<String>,
    /// This host's name, for same-host transports.
    pub hostname: String,
    /// Same-host copies: a memory segment is backed by a file in `shm_dir`
    /// that same-host clients map; a disk segment advertises its file's
    /// path, which same-host clients read with `pread`.
    pub shm: bool,
    pub shm_dir: PathBuf,
    pub heartbeat_interval: Duration,
    /// Bounds on the transfer port, and the grant clock skew it tolerates.
    pub limits: crescent_store::server::ServeLimits,
    /// Mutual TLS on the transfer port (the process's `--tls-*` files,
    /// reloadable) when `--data-tls`/`data_tls` asks; `None`: clear text.
    pub tls: Option<Arc<crescent_auth::tls::ServingTls>>,
    /// Serve a disk segment in this directory instead of memory: a file of
    /// `segment_size` bytes that keeps its objects across a restart.
    pub disk_path: Option<PathBuf>,
    /// A disk segment file formatted for another size is formatted anew at
    /// `segment_size` (its objects are lost) instead of refused.
    pub disk_reformat: bool,
    /// The segments this process serves, shared by its agents, so a master
    /// can have one copy bytes into another (COPY: a demotion or promotion
    /// that stays on this host). Give every agent of a process the same.
    pub local_segments: crescent_store::server::LocalSegments,
    /// Allocate the memory segment's pages before mounting it
    /// ([`Segment::prefault`]): no first-touch page faults on the put path,
    /// and a segment the host cannot hold fails here, not mid-put.
    pub prefault: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            segment_size: 64 << 20,
            listen: "0.0.0.0:0".parse().expect("valid literal"),
            advertise_host: None,
            hostname: crate::config::system_hostname(),
            shm: false,
            shm_dir: PathBuf::from("/dev/shm"),
            heartbeat_interval: Duration::from_secs(1),
            limits: Default::default(),
            tls: None,
            disk_path: None,
            disk_reformat: false,
            prefault: false,
            local_segments: Default::default(),
        }
    }
}

pub struct StoreAgent {
    pub segment: Arc<Segment>,
    pub endpoint: String,
    pub name: String,
    pub stats: Arc<TransferStats>,
    /// Current segment id on the masters; 0 while not mounted.
    segment_id: Arc<AtomicU64>,
    /// Chosen here, for this process's life: masters sign this segment's
    /// data-plane grants with it, and only its holder may re-mount or
    /// unmount the segment.
    key: SegmentKey,
    master: Arc<MasterClient>,
    spec: pb::SegmentSpec,
    server: JoinHandle<()>,
    /// The server's check of this store's clock against the leader's.
    clock: Arc<ClockCheck>,
    heartbeat: std::sync::Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Segment(#[from] crescent_store::segment::SegmentError),
    #[error("cannot listen for transfers on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl AgentError {
    /// The size a disk segment file was formatted for, when that is why it
    /// was not opened ([`SegmentError::DiskCapacityDiffers`]), as a size
    /// value (`16gb`): for the caller to name its own setting in a hint.
    ///
    /// [`SegmentError::DiskCapacityDiffers`]: crescent_store::segment::SegmentError::DiskCapacityDiffers
    pub fn disk_formatted_for(&self) -> Option<String> {
        match self {
            AgentError::Segment(crescent_store::segment::SegmentError::DiskCapacityDiffers {
                found,
                ..
            }) => Some(crescent_proto::units::size_value(*found)),
            _ => None,
        }
    }
}

impl StoreAgent {
    /// Whether the server refuses every grant because this process's clock
    /// is too far from the leader's.
    pub fn clock_is_off(&self) -> bool {
        self.clock.is_off()
    }

    /// [`start`](Self::start) of a disk segment, waiting while another
    /// process still holds its file (an overlapping restart, its old
    /// process exiting): up to `attempts` tries, `every` apart.
    pub async fn start_disk(
        master: Arc<MasterClient>,
        cfg: AgentConfig,
        attempts: u32,
        every: Duration,
    ) -> Result<Arc<Self>, AgentError> {
        let mut tried = 1;
        loop {
            match Self::start(master.clone(), cfg.clone()).await {
                Err(AgentError::Segment(crescent_store::segment::SegmentError::DiskInUse {
                    path,
                })) if tried < attempts => {
                    tracing::warn!(path = %path.display(), tried, attempts, "disk segment in use by another process; retrying");
                    tried += 1;
                    tokio::time::sleep(every).await;
                }
                done => return done,
            }
        }
    }

    /// Allocates the segment, starts serving it, and starts registering it with
    /// the masters in the background (see [`wait_mounted`](Self::wait_mounted)).
    pub async fn start(
        master: Arc<MasterClient>,
        cfg: AgentConfig,
    ) -> Result<Arc<Self>, AgentError> {
        let size = round_to_pages(cfg.segment_size.max(1));
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| AgentError::Listen {
                addr: cfg.listen,
                source,
            })?;
        let local = listener.local_addr().map_err(|source| AgentError::Listen {
            addr: cfg.listen,
            source,
        })?;
        let host = match &cfg.advertise_host {
            Some(h) if !h.is_empty() => h.clone(),
            _ if local.ip().is_unspecified() => "127.0.0.1".to_string(),
            _ => local.ip().to_string(),
        };
        let endpoint = format!("{host}:{}", local.port());
        let name = if cfg.name.is_empty() {
            format!("{endpoint}-{}", &crate::master::new_client_id()[..8])
        } else {
            cfg.name.clone()
        };
        let (segment, name, kind, disk_id) = if let Some(dir) = &cfg.disk_path {
            let other = if cfg.disk_reformat {
                crescent_store::OtherCapacity::Reformat
            } else {
                crescent_store::OtherCapacity::Refuse
            };
            let (segment, opened) = Segment::disk(dir, &name, size, other)?;
            let identity = segment.disk_identity().cloned().ok_or_else(|| {
                AgentError::Segment(crescent_store::segment::SegmentError::NotInMemory {
                    path: dir.clone(),
                })
            })?;
            match &opened {
                crescent_store::DiskOpened::Reformatted { why } => tracing::warn!(
                    path = %dir.display(),
                    why,
                    "disk segment reformatted: the objects it held are gone"
                ),
                other => {
                    tracing::info!(path = %dir.display(), ?other, name = identity.name, "disk segment opened")
                }
            }
            (
                segment,
                identity.name,
                pb::ReplicaKind::Disk,
                identity.disk_id,
            )
        } else if cfg.shm {
            (
                Segment::shared(&cfg.shm_dir, &name, size)?,
                name,
                pb::ReplicaKind::Memory,
                String::new(),
            )
        } else {
            (
                Segment::anonymous(size)?,
                name,
                pb::ReplicaKind::Memory,
                String::new(),
            )
        };
        if cfg.prefault && !segment.is_disk() {
            let started = std::time::Instant::now();
            let seg = segment.clone();
            let ran = tokio::task::spawn_blocking(move || seg.prefault())
                .await
                .map_err(|e| {
                    AgentError::Segment(crescent_store::segment::SegmentError::Prefault {
                        size,
                        source: std::io::Error::other(e.to_string()),
                    })
                })??;
            if ran {
                tracing::info!(bytes = size, took = ?started.elapsed(), "memory segment's pages allocated up front");
            } else {
                tracing::warn!("this kernel cannot populate a mapping (MADV_POPULATE_WRITE, Linux 5.14); the segment's pages are allocated on first use");
            }
        }
        if let Some(tls) = &cfg.tls {
            // Clients check the certificate against the host advertised
            // here; one they will refuse is said once, now.
            if let Err(e) = tls.check_serves(&host) {
                tracing::warn!(error = %e, "clients will refuse this segment's TLS transfer port");
            }
        }
        let stats = Arc::new(TransferStats::default());
        let server = tokio::spawn(crescent_store::server::serve_tls(
            segment.clone(),
            listener,
            stats.clone(),
            cfg.limits.clone(),
            cfg.tls.clone(),
            cfg.local_segments.clone(),
        ));
        let spec = pb::SegmentSpec {
            name: name.clone(),
            endpoint: endpoint.clone(),
            capacity: size,
            hostname: cfg.hostname.clone(),
            shm_path: segment
                .shm_path()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            disk_file_path: disk_file_path(&segment, cfg.shm),
            kind: kind as i32,
            disk_id,
        };
        let agent = Arc::new(Self {
            segment,
            endpoint,
            name,
            stats,
            segment_id: Arc::new(AtomicU64::new(0)),
            key: SegmentKey::generate(),
            master,
            spec,
            server,
            clock: cfg.limits.clock.clone(),
            heartbeat: std::sync::Mutex::new(None),
        });
        let hb = tokio::spawn(registration_loop(agent.clone(), cfg.heartbeat_interval));
        *agent.heartbeat.lock().expect("lock poisoned") = Some(hb);
        tracing::info!(
            name = agent.name,
            endpoint = agent.endpoint,
            size,
            disk = cfg.disk_path.is_some(),
            shm = cfg.shm,
            tls = cfg.tls.is_some(),
            "segment serving"
        );
        Ok(agent)
    }

    pub fn segment_id(&self) -> Option<u64> {
        match self.segment_id.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }

    /// Waits until the segment is mounted, up to `timeout`.
    pub async fn wait_mounted(&self, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(id) = self.segment_id() {
                return Some(id);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops heartbeating and serving, and unmounts the segment (best effort).
    pub async fn shutdown(&self) {
        if let Some(h) = self.heartbeat.lock().expect("lock poisoned").take() {
            h.abort();
        }
        // A disk segment stays mounted: it expires, and a restart on the
        // same file takes it back with its objects (unmounting would drop them).
        if let Some(id) = self.segment_id().filter(|_| !self.segment.is_disk()) {
            if let Err(e) = self.master.unmount_segment(id, &self.key).await {
                tracing::warn!(error = %e, "unmount on shutdown failed; the master will expire the segment");
            }
        }
        self.server.abort();
    }

    async fn mount(&self) -> Result<u64, crate::master::MasterRpcError> {
        let id = self
            .master
            .mount_segment(self.spec.clone(), &self.key)
            .await?;
        self.segment.set_mounted(id, &self.key);
        self.segment_id.store(id, Ordering::Release);
        Ok(id)
    }
}

impl Drop for StoreAgent {
    fn drop(&mut self) {
        self.server.abort();
        if let Some(h) = self.heartbeat.lock().expect("lock poisoned").take() {
            h.abort();
        }
    }
}

/// A disk segment's file for same-host clients to read when `shm` asks,
/// else "" (absolute, as clients run in other directories; "" with a
/// warning when too long for the masters to take).
fn disk_file_path(segment: &Segment, shm: bool) -> String {
    match segment.disk_path() {
        Some(p) if shm => {
            let path = std::path::absolute(p)
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string();
            if path.len() > crescent_proto::MAX_SEGMENT_PATH_BYTES {
                tracing::warn!(
                    path,
                    "disk segment path too long to offer same-host clients; they read over TCP"
                );
                return String::new();
            }
            path
        }
        _ => String::new(),
    }
}

/// Takes the leader's clock from a heartbeat answer, and says so loudly
/// when this store starts or stops refusing grants over it.
fn check_clock(clock: &ClockCheck, sent_ms: u64, leader_ms: u64) {
    let received_ms = crescent_store::clock::now_ms();
    match clock.observe(sent_ms, leader_ms, received_ms) {
        (ClockVerdict::Off, true) => tracing::error!(
            leader_minus_store_ms = clock.offset_ms(),
            max_ms = crescent_store::clock::MAX_CLOCK_OFFSET_MS,
            "this store's clock is too far from the leader's: refusing every grant until they agree (fix the clock, then restart the store)"
        ),
        (ClockVerdict::Agrees, true) => tracing::warn!(
            leader_minus_store_ms = clock.offset_ms(),
            "this store's clock agrees with the leader's again: grants are honoured"
        ),
        _ => {}
    }
}

/// Mounts, then heartbeats every `interval`; re-mounts on NEED_REMOUNT.
async fn registration_loop(agent: Arc<StoreAgent>, interval: Duration) {
    let mut last_error_log = Instant::now() - Duration::from_secs(60);
    let mut backoff = Duration::from_millis(50);
    loop {
        if agent.segment_id().is_none() {
            match agent.mount().await {
                Ok(id) => {
                    tracing::info!(segment_id = id, name = agent.name, "segment mounted");
                    backoff = Duration::from_millis(50);
                }
                Err(e) => {
                    if last_error_log.elapsed() > Duration::from_secs(5) {
                        tracing::warn!(error = %e, "cannot mount segment yet; still serving and retrying");
                        last_error_log = Instant::now();
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(interval);
                    continue;
                }
            }
        }
        tokio::time::sleep(interval).await;
        let Some(id) = agent.segment_id() else {
            continue;
        };
        // Bounded by the interval, so a store notices a new leader within about one heartbeat.
        let sent_ms = crescent_store::clock::now_ms();
        let answer = agent
            .master
            .heartbeat(vec![id], interval.max(Duration::from_millis(200)))
            .await;
        if let Ok((_, leader_ms)) = &answer {
            check_clock(&agent.clock, sent_ms, *leader_ms);
        }
        match answer.map(|(result, _)| result) {
            Ok(pb::HeartbeatResult::NeedRemount) => {
                tracing::warn!(
                    segment_id = id,
                    "master asked for a re-mount (segment was expired)"
                );
                agent.segment_id.store(0, Ordering::Release);
            }
            Ok(pb::HeartbeatResult::HeartbeatOk) => {}
            Err(e) => {
                if last_error_log.elapsed() > Duration::from_secs(5) {
                    tracing::warn!(error = %e, "heartbeat failed; still serving reads");
                    last_error_log = Instant::now();
                }
            }
        }
    }
}
