//! The disk-tier check of [`FaultKind::RestartStoreWithDisk`].
//!
//! The masters demote cold objects from memory to the stores' disk
//! segments, and a store SIGKILLed and started again on the same disk
//! directory must get its disk segment back with its objects.
//!
//! First it puts *probes*, a few dozen small objects of its own on that
//! store's memory segment, never read and never touched by a worker, so
//! they are the coldest objects and every one is judged (the workers'
//! keys are rewritten or removed so often that few of them are on disk,
//! unchanged, by the time the check looks). Then it makes the masters
//! demote: it puts *fillers* (1 MiB objects, `chaos-disk-fill-…`, which
//! no worker reads, leased so they are not demoted themselves) until
//! memory passes the masters' watermark and the leader has demoted a few
//! dozen objects (the probes and the least recently read of the
//! workers'), then removes them and waits until no demotion runs. The
//! probes are removed after the restart's check.
//!
//! Why demotions only in that window, not all run long: the leader evicts
//! an object whose demotion copy fails, and an evicted key is
//! indistinguishable from a lost one to the checker (any eviction fails a
//! run). Copies fail when a store dies amid one; when they read from a
//! restarted store's old memory segment, still listed for the masters'
//! expired-segment grace (the fillers wait until it is dropped), a master
//! weakness, not the guarantee under test. (A leader whose connection pool
//! still holds a connection to a store from before its restart needs no
//! help here: the transfer replaces a stale pooled connection and retries,
//! and a demotion copy retries a failed piece on a fresh one.)
//!
//! Then this finds acknowledged objects (the probes, then the recorded
//! histories': an acknowledged put and no remove since) that the leader
//! lists with a disk replica on that store's disk segment, and reads each
//! (its bytes must
//! match the checksum the master gave). After the restart, once the store
//! says its disk segment is mounted again, it reads each once more: every
//! one must hold the same value. The reads are recorded as gets in
//! [`DISK_HISTORY`] (so the checker's other checks see them too) and each
//! object's pair of reads as a [`DiskCheck`] in [`DISK_CHECKS`], which the
//! checker judges ([`crate::checker`]: a disk object missing, unreadable or
//! different while no remove of its key could have run is `disk_lost`).
//! Reading an object twice makes the leader promote it (copy it back to
//! memory, on the same store when it has room), so the check waits
//! [`PROMOTIONS_SETTLE`] before the kill: a promoted object must keep its
//! disk replica across the restart too.
//!
//! [`FaultKind::RestartStoreWithDisk`]: crate::schedule::FaultKind::RestartStoreWithDisk

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crescent_client::{Client, ClientConfig, MasterClient, ReplicateConfig};
use crescent_proto::{pb, ErrorCode};
use crescent_store::transport::TcpTransport;

use crate::history::{now_us, value_bytes, DiskCheck, Op, OpKind, Outcome, ReadPromise, Recorder};
use crate::workload::{put_outcome, read_every_replica, remove_outcome};

/// The reads this check makes, as gets (next to the workers' histories,
/// so a re-check reads them too).
pub const DISK_HISTORY: &str = "history-disk.jsonl";
/// One [`DiskCheck`] a line.
pub const DISK_CHECKS: &str = "disk-checks.jsonl";

/// Process ids of the reads: round `n` is `BASE + n`, far above the
/// workers' (100 × worker + task) and the stalled writer's (1,000,000 + …).
const PROCESS_BASE: u32 = 2_000_000;
/// Acknowledged keys looked up at most per try (one batched lookup; each
/// gets a read lease, which only delays removes and demotions of the key).
const MAX_LOOKUPS: usize = 512;
/// Disk objects checked at most per restart.
const MAX_OBJECTS: usize = 64;
/// Tries to find disk objects on the store's segment, this far apart (a
/// lookup that failed, or found none: the workers' histories may lag).
const FIND_TRIES: usize = 3;
const FIND_PAUSE: Duration = Duration::from_secs(2);
/// One RPC or read that takes longer is given up (as the workers' timeout).
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the restarted store has to mount its segments again.
const BACK_WITHIN: Duration = Duration::from_secs(60);
/// How long, once the store is back, an unreadable object is retried
/// (answered REPLICAS_UNAVAILABLE, or its read failed) before it counts as
/// lost: the masters re-attach the disk segment as it mounts, so an honest
/// cluster answers at once; the margin covers a slow lookup.
const READ_BACK_WITHIN: Duration = Duration::from_secs(15);
/// How long the objects read before a restart are left for the leader to
/// promote (a promotion round starts within 20 ms and copies a few MiB).
const PROMOTIONS_SETTLE: Duration = Duration::from_secs(1);
/// Pause between rounds of those retries.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// New history bytes read at most per file and call (the rest next time):
/// bounds one call's work in a long soak.
const MAX_TAIL_BYTES: u64 = 64 << 20;
/// The check's own objects per restart, and their size: the workers'
/// few dozen keys are overwritten and removed all the time, so on a busy
/// run few of those the leader demoted are still there, unchanged, when
/// the check looks (a CI run found 0-6 a restart, and a broken run with
/// nothing to judge passes). 24 × 64 KiB stays far below the watermark.
const PROBES: usize = 24;
const PROBE_BYTES: usize = 64 << 10;
/// One filler's size, and at most how many are put per restart: 64 MiB
/// passes the chaos masters' 2 % watermark even with a few expired memory
/// segments of restarted stores still counted (256 MiB each, for their
/// grace), and fits the disk segments should some of it be demoted.
const FILLER_BYTES: usize = 1 << 20;
const MAX_FILLERS: usize = 64;
/// Filling stops once the leader has demoted, since it began, at least
/// this many objects, and as many as were only in memory when it began
/// (plus the probes): the leader demotes the least recently used first,
/// and a long soak piles up keys no worker touches again (shared keys of
/// past epochs), all older than the probes, which the probes wait behind
/// (a soak found none of them on disk once a few hundred had piled up) ...
const WANT_DEMOTIONS: u64 = 48;
/// ... but never waits for more than this many.
const MAX_WANT_DEMOTIONS: u64 = 4096;
/// ... or after this long, and demotions are awaited at most this long
/// after it (a new leader demotes only once its predecessor's read leases
/// are over), or until the leader's count, once it moved, stands still for
/// [`STALLED_FOR`] with the fillers still in memory (nothing unleased is
/// left to demote).
const FILL_WITHIN: Duration = Duration::from_secs(30);
const DEMOTIONS_WITHIN: Duration = Duration::from_secs(20);
const STALLED_FOR: Duration = Duration::from_secs(3);
/// Demotion is over when the leader's count has not moved for this long
/// (rounds run every 10 ms while memory is past the watermark) ...
const QUIET_FOR: Duration = Duration::from_millis(1500);
/// ... awaited at most this long (then the store is killed anyway).
const QUIET_WITHIN: Duration = Duration::from_secs(30);
/// How long to wait for a restarted store's old memory segment to be
/// dropped (the chaos masters' --expired-segment-grace is 10 s, after the
/// 3 s client TTL) before filling.
const OLD_SEGMENTS_WITHIN: Duration = Duration::from_secs(30);

/// Finds, reads and re-reads disk objects across store restarts; keeps an
/// incremental view of the recorded histories (which keys hold an
/// acknowledged put with no remove since).
pub struct DiskChecker {
    client: MasterClient,
    /// Puts and removes the fillers.
    filler: Client,
    /// Every master's (gRPC, HTTP) address: the leader's /metrics count
    /// its demotions.
    masters: Vec<(String, String)>,
    transport: TcpTransport,
    dir: PathBuf,
    history: Mutex<Recorder>,
    checks: Mutex<Recorder>,
    acked: Mutex<AckedKeys>,
    rounds: std::sync::atomic::AtomicU32,
}

/// What one restart did, for the run's output.
#[derive(Debug, Default)]
pub struct RestartSummary {
    /// Fillers put, and objects the leader demoted meanwhile (None: its
    /// count could not be read).
    pub fillers: usize,
    /// Demotions the filling aimed at (see [`WANT_DEMOTIONS`]).
    pub wanted: u64,
    pub demoted: Option<u64>,
    /// Demotion was over before the kill.
    pub quiet: bool,
    pub segment: String,
    pub segment_after: String,
    /// The check's own objects put (acknowledged) before the fillers, and
    /// how many of them the leader listed on the disk segment.
    pub probes: usize,
    pub probes_on_disk: usize,
    pub looked_up: usize,
    pub on_disk: usize,
    pub checked: usize,
    pub back_after: Option<Duration>,
    pub intact: usize,
    pub missing: usize,
    pub unreadable: usize,
    pub different: usize,
}

impl std::fmt::Display for RestartSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let back = match self.back_after {
            Some(d) => format!("mounted again {} ms after the restart", d.as_millis()),
            None => format!("NOT mounted again within {BACK_WITHIN:?}"),
        };
        let name = if self.segment_after.is_empty() || self.segment_after == self.segment {
            String::new()
        } else {
            format!(" as {}", self.segment_after)
        };
        let demoted = self
            .demoted
            .map_or_else(|| "an unknown number of".to_string(), |n| n.to_string());
        let quiet = if self.quiet {
            ""
        } else {
            " (still demoting at the kill)"
        };
        write!(
            f,
            "{} probes and {} fillers, {demoted} objects demoted of {} wanted{quiet}; disk \
             segment {:?}: \
             {} of {} acknowledged keys looked up have a replica on it ({} probes), {} read \
             and checked; {back}{name}; after: {} intact, {} missing, {} unreadable, {} \
             different",
            self.probes,
            self.fillers,
            self.wanted,
            self.segment,
            self.on_disk,
            self.looked_up,
            self.probes_on_disk,
            self.checked,
            self.intact,
            self.missing,
            self.unreadable,
            self.different
        )
    }
}

/// What a store's /health says of its segments.
#[derive(Debug)]
struct StoreHealth {
    memory_segment: Option<String>,
    memory_mounted: bool,
    disk_segment: Option<String>,
    disk_mounted: bool,
}

/// A disk object read before the kill.
struct Tracked {
    key: String,
    value: u64,
    before_us: u64,
}

impl DiskChecker {
    /// `masters`: every master's (gRPC, HTTP) address; `dir`: the run
    /// directory (the histories are read from it, the checks written to it).
    pub async fn new(
        masters: Vec<(String, String)>,
        token_file: Option<&Path>,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let token = crescent_auth::BearerToken::from_optional_file(token_file)?;
        let list = masters
            .iter()
            .map(|(a, _)| a.clone())
            .collect::<Vec<_>>()
            .join(",");
        let connect = Client::connect(ClientConfig {
            master: list.clone(),
            // As the workers: never a local-only cache.
            degrade_after: Duration::ZERO,
            master_deadline: STEP_TIMEOUT.saturating_sub(Duration::from_secs(1)),
            default_replicas: 1,
            token_file: token_file.map(Path::to_path_buf),
            ..ClientConfig::default()
        });
        // The cluster is up by now; bounded all the same.
        let filler = tokio::time::timeout(BACK_WITHIN, connect)
            .await
            .map_err(|_| anyhow::anyhow!("the disk check's client did not connect"))??;
        Ok(Self {
            client: MasterClient::new(&list)?.with_token(token),
            filler,
            masters,
            // The chaos suite runs the data port in clear text.
            transport: TcpTransport::new(),
            dir: dir.to_path_buf(),
            history: Mutex::new(Recorder::create(&dir.join(DISK_HISTORY))?),
            checks: Mutex::new(Recorder::create(&dir.join(DISK_CHECKS))?),
            acked: Mutex::new(AckedKeys::default()),
            rounds: Default::default(),
        })
    }

    fn record<T: serde::Serialize>(&self, recorder: &Mutex<Recorder>, item: &T) {
        if let Err(e) = recorder.lock().expect("lock poisoned").record(item) {
            // The run's check would miss this record; say so loudly.
            eprintln!("chaos: cannot record a disk check: {e:#}");
        }
    }

    /// Keys with an acknowledged put and no remove since, oldest put first,
    /// at most `max`.
    fn acked_keys(&self, max: usize) -> Vec<String> {
        let mut acked = self.acked.lock().expect("lock poisoned");
        acked.read_new(&self.dir);
        acked.oldest(max)
    }

    /// The leader's status (the master of the highest term that says it
    /// leads) and its HTTP address.
    async fn leader_status(&self) -> Option<(pb::GetStatusResponse, &str)> {
        let polls = self.masters.iter().map(|(addr, http)| async move {
            let status =
                tokio::time::timeout(Duration::from_millis(500), self.client.node_status(addr))
                    .await
                    .ok()?
                    .ok()?;
            (status.role == pb::Role::Leader as i32).then_some((status, http.as_str()))
        });
        futures::future::join_all(polls)
            .await
            .into_iter()
            .flatten()
            .max_by_key(|(s, _)| s.term)
    }

    /// `master_demotions_total` of the leader, with its id: the count is
    /// the leader's own, so two readings compare only under one leader.
    async fn demotions(&self) -> Option<(u64, u64)> {
        let (leader, http) = self.leader_status().await?;
        let id = leader.id;
        let (status, body) = tokio::time::timeout(
            Duration::from_secs(2),
            crescent_integration::http_request(http, "GET", "/metrics", &[]),
        )
        .await
        .ok()?
        .ok()?;
        if status != 200 {
            return None;
        }
        let n = body
            .lines()
            .find_map(|l| l.strip_prefix("master_demotions_total "))?
            .trim()
            .parse::<f64>()
            .ok()?;
        Some((id, n as u64))
    }

    /// Demotions since `start` (0 when the leader changed: its count
    /// restarts).
    async fn demoted_since(&self, start: Option<(u64, u64)>) -> Option<u64> {
        let (id, n) = self.demotions().await?;
        match start {
            Some((id0, n0)) if id0 == id => Some(n.saturating_sub(n0)),
            _ => Some(0),
        }
    }

    /// Whether the masters still list a memory segment besides the live
    /// ones (`memory_bytes` in all): a restarted store's old segment stays
    /// listed, expired, for the masters' --expired-segment-grace, and a
    /// demotion may pick its replica as the copy's source, fail to read it
    /// and evict the object, although its other replica is intact. Waits
    /// for them to go, at most [`OLD_SEGMENTS_WITHIN`]; false if they did not.
    async fn old_memory_segments_gone(&self, memory_bytes: u64) -> bool {
        let waited = Instant::now();
        loop {
            if let Some((s, _)) = self.leader_status().await {
                if s.memory_capacity <= memory_bytes {
                    return true;
                }
            }
            if waited.elapsed() >= OLD_SEGMENTS_WITHIN {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until store `http` (just restarted) has its memory segment
    /// mounted and the masters list no other memory segment than the live
    /// ones (`memory_bytes` in all), so new placements name its new
    /// segment; false if that did not happen in time.
    pub async fn store_back(&self, http: &str, memory_bytes: u64) -> bool {
        let (_, mounted) = Self::wait_for_health(http, |h| h.memory_mounted).await;
        mounted && self.old_memory_segments_gone(memory_bytes).await
    }

    /// Puts fillers until the leader has demoted every object that was
    /// only in memory (at least [`WANT_DEMOTIONS`], or [`MAX_FILLERS`], or
    /// [`FILL_WITHIN`]), waits for those demotions a while, removes the
    /// fillers and waits until no demotion runs. Fills in `summary`.
    ///
    /// The fillers are looked up after every put: a lookup grants a read
    /// lease, and the leader demotes no leased object. Unleased, the
    /// fillers, never read, would be the coldest objects and the leader
    /// would demote them rather than the workers' objects (which the
    /// workers read all the time). Their space stays held for the lease
    /// after the forced remove, so demotion goes on for that long; the
    /// quiet wait covers it.
    async fn demote_some(&self, round: u32, summary: &mut RestartSummary) {
        let start = self.demotions().await;
        let memory_only = self
            .leader_status()
            .await
            .map_or(0, |(s, _)| s.key_count.saturating_sub(s.disk_key_count));
        let want = (memory_only + PROBES as u64).clamp(WANT_DEMOTIONS, MAX_WANT_DEMOTIONS);
        summary.wanted = want;
        let value = vec![0xA5u8; FILLER_BYTES];
        let one = ReplicateConfig {
            replica_num: 1,
            ..Default::default()
        };
        let began = Instant::now();
        let mut fillers = Vec::new();
        let enough = |n: Option<u64>| n.is_some_and(|n| n >= want);
        for i in 0..MAX_FILLERS {
            if began.elapsed() >= FILL_WITHIN {
                break;
            }
            let key = format!("chaos-disk-fill-{}-{round}-{i}", now_us());
            // A failed put may still have taken effect: removed with the rest.
            let _ = tokio::time::timeout(STEP_TIMEOUT, self.filler.put(&key, &value, &one)).await;
            fillers.push(key);
            let _ = tokio::time::timeout(
                STEP_TIMEOUT,
                self.client.batch_get_replica_list(fillers.clone()),
            )
            .await;
            if i % 2 == 1 && enough(self.demoted_since(start).await) {
                break;
            }
        }
        summary.fillers = fillers.len();
        // The fillers' leases are renewed meanwhile: expired, the fillers
        // would be the coldest objects and demoted themselves.
        let waited = Instant::now();
        let mut last = self.demoted_since(start).await;
        let mut still = Instant::now();
        // Stalled only once demotion began: a new leader demotes nothing
        // until its predecessor's leases are over.
        let stalled = |last: Option<u64>, still: Instant| {
            last.is_some_and(|n| n > 0) && still.elapsed() >= STALLED_FOR
        };
        while waited.elapsed() < DEMOTIONS_WITHIN && !enough(last) && !stalled(last, still) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let _ = tokio::time::timeout(
                STEP_TIMEOUT,
                self.client.batch_get_replica_list(fillers.clone()),
            )
            .await;
            let now = self.demoted_since(start).await;
            if now != last {
                last = now;
                still = Instant::now();
            }
        }
        // Removed (forced: nobody reads them) so memory falls back below
        // the watermark; retried a few times, since fillers left in memory
        // would keep the leader demoting through later faults.
        for attempt in 0..5 {
            let removed = tokio::time::timeout(
                STEP_TIMEOUT,
                self.client.batch_remove(fillers.clone(), true),
            )
            .await;
            match removed {
                Ok(Ok(statuses)) => {
                    // Not found: a filler whose put failed.
                    let refused: Vec<&pb::Status> = statuses
                        .iter()
                        .filter(|s| !s.is_ok() && s.error_code() != ErrorCode::ObjectNotFound)
                        .collect();
                    if refused.is_empty() {
                        break;
                    }
                    println!(
                        "chaos:      disk: {} fillers not removed, e.g. {:?}",
                        refused.len(),
                        refused[0]
                    );
                    let again: Vec<String> = fillers
                        .iter()
                        .zip(&statuses)
                        .filter(|(_, s)| !s.is_ok() && s.error_code() != ErrorCode::ObjectNotFound)
                        .map(|(k, _)| k.clone())
                        .collect();
                    fillers = again;
                }
                Ok(Err(e)) => println!("chaos:      disk: removing fillers failed: {e}"),
                Err(_) => println!("chaos:      disk: removing fillers timed out"),
            }
            if attempt < 4 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        // Quiet: the leader's count stands still for QUIET_FOR.
        let waited = Instant::now();
        let mut last = self.demotions().await;
        let mut still = Instant::now();
        while waited.elapsed() < QUIET_WITHIN {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.demotions().await;
            if now.is_none() || now != last {
                last = now;
                still = Instant::now();
            } else if still.elapsed() >= QUIET_FOR {
                summary.quiet = true;
                break;
            }
        }
        summary.demoted = match (start, last) {
            (Some((id0, n0)), Some((id, n))) if id0 == id => Some(n.saturating_sub(n0)),
            _ => None,
        };
    }

    /// The store's health, polled every 200 ms until `ready` holds of it,
    /// for at most [`BACK_WITHIN`]: the last answer (or none), and whether
    /// it was ready.
    async fn wait_for_health(
        http: &str,
        ready: impl Fn(&StoreHealth) -> bool,
    ) -> (Option<StoreHealth>, bool) {
        let asked = Instant::now();
        loop {
            let health = Self::health(http).await;
            let is_ready = health.as_ref().is_some_and(&ready);
            if is_ready || asked.elapsed() >= BACK_WITHIN {
                return (health, is_ready);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The store's segments as its /health tells them; None when it does
    /// not answer.
    async fn health(http: &str) -> Option<StoreHealth> {
        let (status, body) = tokio::time::timeout(
            Duration::from_secs(2),
            crescent_integration::http_request(http, "GET", "/health", &[]),
        )
        .await
        .ok()?
        .ok()?;
        if status != 200 {
            return None;
        }
        // The body is one JSON object; tolerate anything around it.
        let json = &body[body.find('{')?..=body.rfind('}')?];
        let v: serde_json::Value = serde_json::from_str(json).ok()?;
        let disk = v.get("disk").filter(|d| !d.is_null());
        Some(StoreHealth {
            memory_segment: v["segment"].as_str().map(str::to_string),
            memory_mounted: v["mounted"] == true,
            disk_segment: disk.and_then(|d| d["segment"].as_str()).map(str::to_string),
            disk_mounted: disk.is_some_and(|d| d["mounted"] == true),
        })
    }

    /// Puts [`PROBES`] objects of the check's own on the store's memory
    /// segment (preferred), recorded as puts in [`DISK_HISTORY`]: the keys
    /// acknowledged. Put before the fillers and never read, they are the
    /// coldest objects when memory passes the watermark, so the leader
    /// demotes them, to the same store's disk first; no worker touches
    /// them, so a remove never excuses one.
    async fn put_probes(&self, process: u32, memory_segment: &str) -> Vec<String> {
        let config = ReplicateConfig {
            replica_num: 1,
            preferred_segments: vec![memory_segment.to_string()],
            ..Default::default()
        };
        let mut acked = Vec::new();
        for i in 0..PROBES {
            let key = format!("chaos-disk-probe-{}-{process}-{i}", now_us());
            let value = ((process as u64) << 40) | i as u64;
            let bytes = value_bytes(value, PROBE_BYTES);
            let put =
                within_step(async { put_outcome(self.filler.put(&key, &bytes, &config).await) });
            if self
                .recorded(process, &key, OpKind::Put { value }, put)
                .await
                .outcome
                == Outcome::Ok
            {
                acked.push(key);
            }
        }
        acked
    }

    /// Removes the probes once checked (recorded): left behind, one
    /// dropped at the disk watermark later would count as evicted.
    async fn remove_probes(&self, process: u32, probes: &[String]) {
        for key in probes {
            let remove = within_step(async { remove_outcome(self.filler.remove(key, true).await) });
            self.recorded(process, key, OpKind::Remove { force: true }, remove)
                .await;
        }
    }

    /// Runs `op` and records it in [`DISK_HISTORY`], timed from its start
    /// to its outcome.
    async fn recorded(
        &self,
        process: u32,
        key: &str,
        kind: OpKind,
        op: impl std::future::Future<Output = Outcome>,
    ) -> Op {
        let invoke_us = now_us();
        let outcome = op.await;
        let op = Op {
            process,
            key: key.to_string(),
            kind,
            invoke_us,
            complete_us: now_us(),
            outcome,
            promise: ReadPromise::Linearizable,
        };
        self.record(&self.history, &op);
        op
    }

    /// Acknowledged keys the leader lists with a disk replica on `segment`,
    /// the `probes` first (tried [`FIND_TRIES`] times while none is found),
    /// and how many were looked up.
    async fn find_on_disk(&self, segment: &str, probes: &[String]) -> (Vec<String>, usize) {
        let mut looked_up = 0;
        for attempt in 0..FIND_TRIES {
            if attempt > 0 {
                tokio::time::sleep(FIND_PAUSE).await;
            }
            let mut keys = probes.to_vec();
            keys.extend(
                self.acked_keys(MAX_LOOKUPS)
                    .into_iter()
                    .filter(|k| !probes.contains(k)),
            );
            keys.truncate(MAX_LOOKUPS);
            if keys.is_empty() {
                continue;
            }
            looked_up = keys.len();
            let found = tokio::time::timeout(
                STEP_TIMEOUT,
                self.client.batch_get_replica_list(keys.clone()),
            )
            .await;
            let results = match found {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    println!("chaos:      disk: lookup of acknowledged keys failed: {e}");
                    continue;
                }
                Err(_) => {
                    println!("chaos:      disk: lookup of acknowledged keys timed out");
                    continue;
                }
            };
            let on_disk: Vec<String> = keys
                .into_iter()
                .zip(results)
                .filter(|(_, r)| r.status.as_ref().is_none_or(|s| s.is_ok()))
                .filter(|(_, r)| on_segment(r, segment))
                .map(|(k, _)| k)
                .collect();
            if !on_disk.is_empty() {
                return (on_disk, looked_up);
            }
        }
        (Vec::new(), looked_up)
    }

    /// Looks `key` up and reads every replica it lists: the outcome, and
    /// whether the lookup listed a disk replica on `segment` (the object as
    /// the check wants it before the kill).
    async fn read(&self, key: &str, segment: Option<&str>) -> (Outcome, bool) {
        let asked = Instant::now();
        let found =
            match tokio::time::timeout(STEP_TIMEOUT, self.client.get_replica_list(key)).await {
                Err(_) => {
                    return (
                        Outcome::Unknown {
                            error: format!("no answer within {STEP_TIMEOUT:?}"),
                        },
                        false,
                    )
                }
                Ok(Err(e)) => {
                    return (
                        match e.code() {
                            ErrorCode::ObjectNotFound | ErrorCode::ReplicaIsNotReady => {
                                Outcome::Missing
                            }
                            _ => Outcome::Fail {
                                error: e.to_string(),
                            },
                        },
                        false,
                    )
                }
                Ok(Ok(found)) => found,
            };
        let listed = segment.is_some_and(|s| on_segment(&found, s));
        let outcome = tokio::time::timeout(
            STEP_TIMEOUT,
            read_every_replica(&self.transport, &found, asked, "a disk-tier check"),
        )
        .await
        .unwrap_or_else(|_| Outcome::Unknown {
            error: format!("replica reads not done within {STEP_TIMEOUT:?}"),
        });
        (outcome, listed)
    }

    /// A recorded get of `key` (its outcome and when it ran).
    async fn recorded_read(&self, process: u32, key: &str, segment: Option<&str>) -> (Op, bool) {
        let mut listed = false;
        let read = async {
            let (outcome, on_it) = self.read(key, segment).await;
            listed = on_it;
            outcome
        };
        let op = self.recorded(process, key, OpKind::Get, read).await;
        (op, listed)
    }
}

/// `op`'s outcome, or unknown once it has run [`STEP_TIMEOUT`] (it may
/// still take effect).
async fn within_step(op: impl std::future::Future<Output = Outcome>) -> Outcome {
    tokio::time::timeout(STEP_TIMEOUT, op)
        .await
        .unwrap_or_else(|_| Outcome::Unknown {
            error: format!("no answer within {STEP_TIMEOUT:?}"),
        })
}

/// Whether a lookup lists a disk replica on `segment`.
fn on_segment(found: &pb::GetReplicaListResponse, segment: &str) -> bool {
    found
        .replicas
        .iter()
        .any(|r| r.kind == pb::ReplicaKind::Disk as i32 && r.segment_name == segment)
}

/// [`FaultKind::RestartStoreWithDisk`] on store `idx`: make the leader
/// demote (once no restarted store's old memory segment is listed; the
/// stores' memory segments are `memory_bytes` in all), find and read its
/// disk objects, SIGKILL it, start it again after `hold` (same flags, same
/// disk directory), wait until its segments are mounted, read them again
/// and record a [`DiskCheck`] for each.
///
/// [`FaultKind::RestartStoreWithDisk`]: crate::schedule::FaultKind::RestartStoreWithDisk
pub async fn restart_store_with_disk(
    dep: &mut dyn crate::deploy::Deployment,
    checker: &DiskChecker,
    idx: usize,
    hold: Duration,
    memory_bytes: u64,
) -> anyhow::Result<RestartSummary> {
    let round = checker
        .rounds
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let process = PROCESS_BASE + round;
    let http = dep.store_http(idx);
    let mut summary = RestartSummary::default();
    // Which disk segment is this store's: its name is kept in the disk
    // file, so it is the same after an honest restart. A store killed by
    // the fault just before this one may still be mounting it: wait for
    // that (bounded), or this restart would check nothing.
    let (health, _) =
        DiskChecker::wait_for_health(&http, |h| h.disk_segment.is_some() && h.disk_mounted).await;
    let segment = match &health {
        Some(StoreHealth {
            disk_segment: Some(name),
            disk_mounted: true,
            ..
        }) => Some(name.clone()),
        other => {
            println!("chaos:      disk: store {idx} has no mounted disk segment ({other:?})");
            None
        }
    };
    let memory_segment = health.and_then(|h| h.memory_segment).unwrap_or_default();
    let mut tracked = Vec::new();
    let mut probes = Vec::new();
    if let Some(segment) = &segment {
        summary.segment = segment.clone();
        if checker.old_memory_segments_gone(memory_bytes).await {
            probes = checker.put_probes(process, &memory_segment).await;
            summary.probes = probes.len();
            checker.demote_some(round, &mut summary).await;
        } else {
            println!(
                "chaos:      disk: a restarted store's old memory segment is still listed \
                 after {OLD_SEGMENTS_WITHIN:?}; no demotions this time"
            );
        }
        let (keys, looked_up) = checker.find_on_disk(segment, &probes).await;
        summary.looked_up = looked_up;
        summary.on_disk = keys.len();
        summary.probes_on_disk = keys.iter().filter(|k| probes.contains(k)).count();
        for key in keys.into_iter().take(MAX_OBJECTS) {
            let (op, listed) = checker.recorded_read(process, &key, Some(segment)).await;
            // Only an object read whole while the leader still listed it on
            // this disk segment is checked (it may have been removed since
            // the lookup; a corrupt read is a wrong-bytes violation already).
            if let (Outcome::Found { value }, true) = (&op.outcome, listed) {
                tracked.push(Tracked {
                    key,
                    value: *value,
                    before_us: op.invoke_us,
                });
            }
        }
    }
    summary.checked = tracked.len();
    if !tracked.is_empty() {
        // Each tracked object was looked up twice (found, then read), so
        // the leader promotes it back to memory: let those copies finish,
        // so the restart also checks that a promoted object keeps its disk
        // replica.
        tokio::time::sleep(PROMOTIONS_SETTLE).await;
    }

    dep.kill_store(idx)?;
    let killed_us = now_us();
    tokio::time::sleep(hold).await;
    dep.start_store(idx)?;
    let restarted = Instant::now();
    // Back when both of its segments are mounted again (bounded: an object
    // whose segment never comes back is read anyway, and counts as lost).
    let mut back_us = None;
    if let (Some(health), true) =
        DiskChecker::wait_for_health(&http, |h| h.memory_mounted && h.disk_mounted).await
    {
        summary.segment_after = health.disk_segment.unwrap_or_default();
        summary.back_after = Some(restarted.elapsed());
        back_us = Some(now_us());
    }

    // Read each again; retry the unreadable ones for a while (bounded in
    // time and in passes), then judge the last read.
    let mut last: Vec<Option<Op>> = tracked.iter().map(|_| None).collect();
    let deadline = Instant::now() + READ_BACK_WITHIN;
    for pass in 0..(READ_BACK_WITHIN.as_millis() / RETRY_PAUSE.as_millis()).max(1) {
        if pass > 0 {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        let mut pending = 0;
        for (t, slot) in tracked.iter().zip(last.iter_mut()) {
            let settled = slot.as_ref().is_some_and(|op| {
                !matches!(op.outcome, Outcome::Fail { .. } | Outcome::Unknown { .. })
            });
            if settled {
                continue;
            }
            let (op, _) = checker.recorded_read(process, &t.key, None).await;
            if matches!(op.outcome, Outcome::Fail { .. } | Outcome::Unknown { .. }) {
                pending += 1;
            }
            *slot = Some(op);
        }
        if pending == 0 || Instant::now() >= deadline {
            break;
        }
    }
    for (t, op) in tracked.iter().zip(last) {
        let Some(op) = op else { continue };
        match &op.outcome {
            Outcome::Found { value } if *value == t.value => summary.intact += 1,
            Outcome::Missing => summary.missing += 1,
            Outcome::Fail { .. } | Outcome::Unknown { .. } => summary.unreadable += 1,
            _ => summary.different += 1,
        }
        checker.record(
            &checker.checks,
            &DiskCheck {
                key: t.key.clone(),
                store: idx,
                segment: summary.segment.clone(),
                value: t.value,
                before_us: t.before_us,
                killed_us,
                back_us,
                after_invoke_us: op.invoke_us,
                after_complete_us: op.complete_us,
                after: op.outcome,
            },
        );
    }
    checker.remove_probes(process, &probes).await;
    Ok(summary)
}

/// What one round of [`FaultKind::FailingDisk`] did, for the run's output.
///
/// [`FaultKind::FailingDisk`]: crate::schedule::FaultKind::FailingDisk
#[derive(Debug, Default)]
pub struct FailingDiskSummary {
    /// The disk could be made to fail (processes mode with FUSE).
    pub failed: bool,
    pub segment: String,
    /// Demotions made while it failed (see [`RestartSummary`]).
    pub demotion: RestartSummary,
    /// The probes read while the disk failed: found with their value,
    /// missing, or unreadable.
    pub found: usize,
    pub missing: usize,
    pub unreadable: usize,
    /// Probes the leader still listed on the failing disk segment.
    pub probes_on_failing_disk: usize,
    pub failing_for: Duration,
}

impl std::fmt::Display for FailingDiskSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.failed {
            return write!(f, "the disk cannot be made to fail here; not run");
        }
        let d = &self.demotion;
        let demoted = d
            .demoted
            .map_or_else(|| "an unknown number of".to_string(), |n| n.to_string());
        write!(
            f,
            "disk segment {:?} failed {} ms: {} probes and {} fillers, {demoted} objects \
             demoted of {} wanted meanwhile, {} probes listed on the failing disk; probes \
             read: {} found, {} missing, {} unreadable",
            self.segment,
            self.failing_for.as_millis(),
            d.probes,
            d.fillers,
            d.wanted,
            self.probes_on_failing_disk,
            self.found,
            self.missing,
            self.unreadable
        )
    }
}

/// [`FaultKind::FailingDisk`] on store `idx`: its disk answers EIO to
/// every read, write, sync and allocation while the leader demotes (the
/// probes and fillers of a disk check: see the module comment), for at
/// least `hold`. The leader must keep each object whose copy the failing
/// disk refused in memory and move it to the other store's disk, never
/// evict it: the probes, put and recorded like any acknowledged put, are
/// read while the disk still fails, and any eviction fails the run.
///
/// [`FaultKind::FailingDisk`]: crate::schedule::FaultKind::FailingDisk
pub async fn failing_disk(
    dep: &mut dyn crate::deploy::Deployment,
    checker: &DiskChecker,
    idx: usize,
    hold: Duration,
    memory_bytes: u64,
) -> anyhow::Result<FailingDiskSummary> {
    let round = checker
        .rounds
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let process = PROCESS_BASE + round;
    let mut summary = FailingDiskSummary::default();
    if !dep.can_fail_store_disk(idx) {
        return Ok(summary);
    }
    let (health, _) = DiskChecker::wait_for_health(&dep.store_http(idx), |h| {
        h.disk_segment.is_some() && h.disk_mounted
    })
    .await;
    let Some(StoreHealth {
        disk_segment: Some(segment),
        memory_segment: Some(memory_segment),
        ..
    }) = health
    else {
        println!("chaos:      disk: store {idx} has no mounted disk segment ({health:?})");
        return Ok(summary);
    };
    summary.segment = segment.clone();
    if !checker.old_memory_segments_gone(memory_bytes).await {
        println!(
            "chaos:      disk: a restarted store's old memory segment is still listed after              {OLD_SEGMENTS_WITHIN:?}; the disk is not failed this time"
        );
        return Ok(summary);
    }
    if !dep.fail_store_disk(idx, true)? {
        return Ok(summary);
    }
    summary.failed = true;
    let failing_since = Instant::now();
    let probes = checker.put_probes(process, &memory_segment).await;
    summary.demotion.probes = probes.len();
    checker.demote_some(round, &mut summary.demotion).await;
    let (on_failing, _) = checker.find_on_disk(&segment, &probes).await;
    summary.probes_on_failing_disk = on_failing.iter().filter(|k| probes.contains(k)).count();
    for key in &probes {
        let (op, _) = checker.recorded_read(process, key, None).await;
        match op.outcome {
            Outcome::Found { .. } => summary.found += 1,
            Outcome::Missing => summary.missing += 1,
            _ => summary.unreadable += 1,
        }
    }
    tokio::time::sleep(hold.saturating_sub(failing_since.elapsed())).await;
    summary.failing_for = failing_since.elapsed();
    let healed = dep.fail_store_disk(idx, false);
    checker.remove_probes(process, &probes).await;
    healed?;
    Ok(summary)
}

/// The part of a history file not read yet.
#[derive(Default)]
struct Tail {
    offset: u64,
    /// A line whose end was not written yet.
    partial: Vec<u8>,
}

/// One key's acknowledged puts and removes, as far as the histories go.
#[derive(Default)]
struct KeyState {
    /// Invocation and completion of its latest acknowledged put.
    put_invoke_us: u64,
    put_complete_us: u64,
    /// Until when a remove may have run (u64::MAX for one of unknown
    /// outcome: it may land any time).
    removed_until_us: u64,
}

/// The recorded histories read incrementally: every key's [`KeyState`].
#[derive(Default)]
struct AckedKeys {
    tails: HashMap<PathBuf, Tail>,
    keys: HashMap<String, KeyState>,
}

impl AckedKeys {
    /// Reads what was appended to the run's `history-*.jsonl` since the
    /// last call (each file's new bytes up to [`MAX_TAIL_BYTES`]).
    fn read_new(&mut self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !(name.starts_with("history-") && name.ends_with(".jsonl")) {
                continue;
            }
            let tail = self.tails.entry(path.clone()).or_default();
            let mut bytes = std::mem::take(&mut tail.partial);
            let read = std::fs::File::open(&path).and_then(|mut f| {
                f.seek(SeekFrom::Start(tail.offset))?;
                f.take(MAX_TAIL_BYTES).read_to_end(&mut bytes)
            });
            let Ok(n) = read else {
                tail.partial = bytes;
                continue;
            };
            tail.offset += n as u64;
            // Lines end in '\n'; what follows the last one is not whole yet.
            let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            tail.partial = bytes.split_off(whole);
            for line in bytes.split(|b| *b == b'\n') {
                if let Ok(op) = serde_json::from_slice::<Op>(line) {
                    self.apply(&op);
                }
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match (&op.kind, &op.outcome) {
            (OpKind::Put { .. }, Outcome::Ok) => {
                let k = self.keys.entry(op.key.clone()).or_default();
                if op.invoke_us > k.put_invoke_us {
                    k.put_invoke_us = op.invoke_us;
                    k.put_complete_us = op.complete_us;
                }
            }
            // A failed remove had no effect; any other may have removed it.
            (OpKind::Remove { .. }, Outcome::Fail { .. }) => {}
            (OpKind::Remove { .. }, outcome) => {
                let k = self.keys.entry(op.key.clone()).or_default();
                let until = match outcome {
                    Outcome::Unknown { .. } => u64::MAX,
                    _ => op.complete_us,
                };
                k.removed_until_us = k.removed_until_us.max(until);
            }
            _ => {}
        }
    }

    /// Up to `max` keys whose latest acknowledged put began after every
    /// remove, oldest put first.
    fn oldest(&self, max: usize) -> Vec<String> {
        let mut live: Vec<(u64, &str)> = self
            .keys
            .iter()
            .filter(|(_, s)| s.put_invoke_us > 0 && s.put_invoke_us > s.removed_until_us)
            .map(|(k, s)| (s.put_complete_us, k.as_str()))
            .collect();
        live.sort_unstable();
        live.into_iter()
            .take(max)
            .map(|(_, k)| k.to_string())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, kind: OpKind, invoke: u64, complete: u64, outcome: Outcome) -> Op {
        Op {
            process: 1,
            key: key.into(),
            kind,
            invoke_us: invoke,
            complete_us: complete,
            outcome,
            promise: ReadPromise::Linearizable,
        }
    }

    #[test]
    fn acknowledged_keys_without_a_later_remove_are_candidates_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history-0.jsonl");
        let put = |k: &str, i: u64, o: Outcome| op(k, OpKind::Put { value: i }, i, i + 1, o);
        let remove =
            |k: &str, i: u64, o: Outcome| op(k, OpKind::Remove { force: true }, i, i + 1, o);
        let first = [
            put("b", 20, Outcome::Ok),
            put("a", 10, Outcome::Ok),
            put("gone", 5, Outcome::Ok),
            remove("gone", 30, Outcome::Ok),
            put("never", 6, Outcome::Fail { error: "x".into() }),
            put("kept", 7, Outcome::Ok),
            remove(
                "kept",
                8,
                Outcome::Fail {
                    error: "leased".into(),
                },
            ),
            put("maybe", 9, Outcome::Ok),
            // Of unknown outcome: it may still land.
            remove("maybe", 3, Outcome::Unknown { error: "t".into() }),
            // Removed, then put again.
            remove("again", 1, Outcome::Ok),
            put("again", 40, Outcome::Ok),
        ];
        let mut text: String = first
            .iter()
            .map(|o| serde_json::to_string(o).unwrap() + "\n")
            .collect();
        // A torn last line is left for the next read.
        let late = serde_json::to_string(&remove("a", 50, Outcome::Ok)).unwrap();
        text.push_str(&late[..10]);
        std::fs::write(&path, &text).unwrap();
        let mut acked = AckedKeys::default();
        acked.read_new(dir.path());
        assert_eq!(acked.oldest(10), ["kept", "a", "b", "again"]);
        assert_eq!(acked.oldest(2), ["kept", "a"]);
        // The rest of the line arrives: "a" was removed.
        text.push_str(&late[10..]);
        text.push('\n');
        std::fs::write(&path, &text).unwrap();
        acked.read_new(dir.path());
        assert_eq!(acked.oldest(10), ["kept", "b", "again"]);
    }
}
