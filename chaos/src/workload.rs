//! A workload worker: several logical clients (tasks) sharing one Crescent
//! `Client`, each issuing one operation at a time on its own keys and on a
//! few shared ones, recording every operation to a JSON-lines history.
//!
//! Keys rotate (private keys by generation, shared keys by 10 s epoch) so no
//! key's history grows too long for the linearizability search, and old
//! private generations are removed so the pool stays far below the eviction
//! watermark: an evicted key would look like a lost write.
//!
//! Some gets are *slow reads*: look the key up, pause within the read lease
//! (an engine busy elsewhere, a slow link), then read every replica. A
//! forced remove and a new put in that pause must not hand the object's
//! space to the new bytes, and no replica may hold other bytes than the
//! master describes (a client get would fall back to an intact replica and
//! hide one overwritten replica). While the orchestrator's focus file exists, tasks favour
//! a few hot keys with puts, slow reads and removes, all on the same keys.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crescent_client::{Client, ClientConfig, Error, ReplicateConfig, Stored};
use crescent_proto::{pb, ErrorCode};
use crescent_store::protocol::Grant;
use crescent_store::transport::TcpTransport;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;

use crate::history::{
    decode_value, now_us, value_bytes, Op, OpKind, Outcome, ReadPromise, Recorder,
};

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub master: String,
    /// The client token's file (token-mode clusters).
    pub token_file: Option<std::path::PathBuf>,
    pub worker: u32,
    pub tasks: u32,
    pub seed: u64,
    pub out: PathBuf,
    /// The worker stops when this file appears (or at `max_duration`).
    pub stop_file: PathBuf,
    /// While this file exists, tasks favour a few hot keys.
    pub focus_file: PathBuf,
    pub max_duration: Duration,
    /// An operation that has not completed after this long is recorded as
    /// unknown (it may still take effect).
    pub op_timeout: Duration,
    pub replicas: u32,
    /// The client keeps a descriptor cache and goes degraded (local-only)
    /// when no master answers, as an engine may run it: its reads then
    /// promise less (see [`ReadPromise`]), and the checker holds them to
    /// that.
    pub cache_and_degrade: bool,
}

/// The masters' read lease in a run (their default `--lease-ttl`): how far
/// behind a read through the descriptor cache may be.
pub const MASTER_LEASE_TTL: Duration = Duration::from_secs(10);
/// How long a `cache_and_degrade` client goes without a master before it
/// turns degraded: well inside the masters' pause of a degraded period.
const DEGRADE_AFTER: Duration = Duration::from_secs(2);

const PRIVATE_KEYS: u64 = 12;
const SHARED_KEYS: u64 = 6;
const OPS_PER_GENERATION: u64 = 150;
const SHARED_EPOCH_US: u64 = 10_000_000;
const HOT_KEYS: u64 = 2;
/// Hot values have one size, so a freed range fits the next hot put exactly
/// (and so does the range of a stalled writer's put of the same size: see
/// [`crate::stall`]).
pub const HOT_VALUE_LEN: usize = 4096;
/// Share of ordinary puts of `HOT_VALUE_LEN` bytes; the rest vary.
const REPEATED_SIZE_SHARE: f64 = 0.7;
/// Well inside the masters' 10 s read lease.
const SLOW_READ_PAUSE_MS: std::ops::Range<u64> = 50..400;
/// Share of ordinary puts made as a batch of private keys (2 to
/// `MAX_BATCH_PUT`, `HOT_VALUE_LEN` bytes each).
const BATCH_PUT_SHARE: f64 = 0.3;
const MAX_BATCH_PUT: usize = 4;

pub async fn run_worker(cfg: WorkerConfig) -> anyhow::Result<()> {
    let client_cfg = ClientConfig {
        master: cfg.master.clone(),
        // A plain worker never falls back to its local-only cache: its
        // every read is judged linearizable.
        degrade_after: if cfg.cache_and_degrade {
            DEGRADE_AFTER
        } else {
            Duration::ZERO
        },
        descriptor_cache: cfg.cache_and_degrade,
        master_deadline: cfg.op_timeout.saturating_sub(Duration::from_secs(1)),
        default_replicas: cfg.replicas,
        token_file: cfg.token_file.clone(),
        ..ClientConfig::default()
    };
    let client = Arc::new(connect_with_retry(client_cfg, Duration::from_secs(60)).await?);
    let recorder = Arc::new(Mutex::new(Recorder::create(&cfg.out)?));
    let transport = Arc::new(TcpTransport::new());
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for t in 0..cfg.tasks {
        let (client, recorder, cfg) = (client.clone(), recorder.clone(), cfg.clone());
        let transport = transport.clone();
        tasks.push(tokio::spawn(async move {
            let process = cfg.worker * 100 + t;
            let mut rng = StdRng::seed_from_u64(cfg.seed ^ ((process as u64) << 32));
            let mut counter: u64 = 0;
            while !cfg.stop_file.exists() && started.elapsed() < cfg.max_duration {
                let before = DegradedSeen::now(&client);
                let mut ops = if cfg.focus_file.exists() && rng.random_bool(0.7) {
                    hot_op(&client, &transport, &cfg, process, &mut rng, &mut counter).await
                } else {
                    one_op(&client, &transport, &cfg, process, &mut rng, &mut counter).await
                };
                if cfg.cache_and_degrade {
                    let promise = if before.degraded_since(&client) {
                        ReadPromise::Degraded
                    } else {
                        ReadPromise::Stale {
                            within_us: MASTER_LEASE_TTL.as_micros() as u64,
                        }
                    };
                    for op in ops.iter_mut().filter(|o| o.kind == OpKind::Get) {
                        op.promise = promise;
                    }
                }
                for op in ops {
                    if let Err(e) = recorder.lock().await.record(&op) {
                        tracing::error!(error = %e, "cannot record history");
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(1..4))).await;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    // Which paths the run's bytes went through, on the worker's log
    // (stderr; logging shows warnings only).
    let read = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let stats = &client.stats;
    eprintln!(
        "worker {} done: tcp_bytes={} shm_bytes={} disk_file_bytes={} disk_file_fallbacks={} checksum_failures={} puts_placed_ahead={} (in batches {}) placements_ahead_given_back={} placements_ahead_retried={} cached_reads={} cached_read_fallbacks={} descriptor_renewals={} degraded_puts={} degraded_gets={} published={}",
        cfg.worker,
        read(&stats.tcp_bytes),
        read(&stats.shm_bytes),
        read(&stats.disk_file_bytes),
        read(&stats.disk_file_fallbacks),
        read(&stats.checksum_failures),
        read(&stats.ahead.used),
        read(&stats.ahead.used_in_batches),
        read(&stats.ahead.given_back),
        read(&stats.ahead.retried),
        read(&stats.cached_reads),
        read(&stats.cached_read_fallbacks),
        read(&stats.descriptor_renewals),
        read(&stats.degraded_puts),
        read(&stats.degraded_gets),
        read(&stats.published),
    );
    client.close().await;
    Ok(())
}

/// Whether a client served anything in degraded mode between two moments:
/// degraded then or at any read or put since (the counters are the whole
/// client's, so another task's degraded read counts too: this errs toward
/// the weaker promise, never the stronger).
struct DegradedSeen {
    degraded: bool,
    served: u64,
}

impl DegradedSeen {
    fn now(client: &Client) -> Self {
        let read = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Acquire);
        Self {
            degraded: client.is_degraded(),
            served: read(&client.stats.degraded_gets) + read(&client.stats.degraded_puts),
        }
    }

    fn degraded_since(&self, client: &Client) -> bool {
        let after = Self::now(client);
        self.degraded || after.degraded || after.served != self.served
    }
}

/// The hot keys workers use at some moment of `[from_us, to_us]` (while the
/// focus file exists).
pub fn hot_keys_between(from_us: u64, to_us: u64) -> Vec<String> {
    (from_us / SHARED_EPOCH_US..=to_us / SHARED_EPOCH_US)
        .flat_map(|epoch| (0..HOT_KEYS).map(move |k| format!("hot-e{epoch}-k{k}")))
        .collect()
}

async fn connect_with_retry(cfg: ClientConfig, within: Duration) -> anyhow::Result<Client> {
    let deadline = std::time::Instant::now() + within;
    loop {
        match Client::connect(cfg.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "cluster not ready; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Picks and runs one operation (a batch put records one per key); none
/// when there was nothing to record.
async fn one_op(
    client: &Client,
    transport: &TcpTransport,
    cfg: &WorkerConfig,
    process: u32,
    rng: &mut StdRng,
    counter: &mut u64,
) -> Vec<Op> {
    *counter += 1;
    let generation = *counter / OPS_PER_GENERATION;
    // The first operations of a generation remove the previous one's keys.
    let step = *counter % OPS_PER_GENERATION;
    if generation > 0 && step < PRIVATE_KEYS {
        let key = format!("p{process}-g{}-k{step}", generation - 1);
        return vec![
            timed(
                cfg,
                process,
                key.clone(),
                OpKind::Remove { force: true },
                async { remove_outcome(client.remove(&key, true).await) },
            )
            .await,
        ];
    }
    let key = if rng.random_bool(0.25) {
        let epoch = now_us() / SHARED_EPOCH_US;
        format!("shared-e{epoch}-k{}", rng.random_range(0..SHARED_KEYS))
    } else {
        format!(
            "p{process}-g{generation}-k{}",
            rng.random_range(0..PRIVATE_KEYS)
        )
    };
    let roll: f64 = rng.random();
    if roll < 0.35 && rng.random_bool(BATCH_PUT_SHARE) {
        // An engine's batch of KV blocks: one size, a few keys (the first
        // may be a shared one, the rest are private; two or more unless a
        // key came up twice).
        // Batches that repeat the last one's sizes write into placements
        // made ahead by its PutEnd, and the faults must hit those too.
        let mut keys = vec![key];
        for _ in 1..rng.random_range(2..=MAX_BATCH_PUT) {
            let k = format!(
                "p{process}-g{generation}-k{}",
                rng.random_range(0..PRIVATE_KEYS)
            );
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        return put_batch(client, cfg, process, keys, *counter).await;
    }
    let op = if roll < 0.35 {
        let value = ((process as u64) << 40) | *counter;
        // Mostly one size, as an engine's KV blocks are: a put that repeats
        // its client's last size and config writes into a placement made
        // ahead (docs/one-commit-puts.md), and the faults must hit those too.
        let len = if rng.random_bool(REPEATED_SIZE_SHARE) {
            HOT_VALUE_LEN
        } else {
            rng.random_range(64..4096)
        };
        put(client, cfg, process, key, value, len).await
    } else if roll < 0.71 {
        get(client, cfg, process, key).await
    } else if roll < 0.75 {
        slow_get(client, transport, cfg, process, key, rng).await
    } else if roll < 0.87 {
        timed(cfg, process, key.clone(), OpKind::Exists, async {
            match client.exists(&key).await {
                Ok(exists) => Outcome::Present { exists },
                Err(e) => Outcome::Fail {
                    error: e.to_string(),
                },
            }
        })
        .await
    } else {
        remove(client, cfg, process, key, rng.random_bool(0.5)).await
    };
    vec![op]
}

/// A batch put of `keys`, `HOT_VALUE_LEN` bytes each: one operation per key,
/// all with the batch's start and end, each with its own outcome. Item `j`'s
/// value is `counter`'s with `j` in bits 32-39 (the process stays in bits
/// 40 and up), so every value is still unique.
async fn put_batch(
    client: &Client,
    cfg: &WorkerConfig,
    process: u32,
    keys: Vec<String>,
    counter: u64,
) -> Vec<Op> {
    let values: Vec<u64> = (0..keys.len() as u64)
        .map(|j| ((process as u64) << 40) | (j << 32) | (counter & 0xffff_ffff))
        .collect();
    let bytes: Vec<Vec<u8>> = values
        .iter()
        .map(|&v| value_bytes(v, HOT_VALUE_LEN))
        .collect();
    let rc = ReplicateConfig {
        replica_num: cfg.replicas,
        ..Default::default()
    };
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&bytes)
        .map(|(k, b)| (k.as_str(), b.as_slice()))
        .collect();
    let invoke_us = now_us();
    let outcomes: Vec<Outcome> =
        match tokio::time::timeout(cfg.op_timeout, client.put_batch_placed(&items, &rc)).await {
            Ok(Ok(results)) if results.len() == keys.len() => {
                results.into_iter().map(stored_outcome).collect()
            }
            Ok(Ok(_)) => (0..keys.len())
                .map(|_| Outcome::Unknown {
                    error: "a batch put answered a different number of items".into(),
                })
                .collect(),
            Ok(Err(e)) => (0..keys.len())
                .map(|_| put_outcome(Err(e.clone())))
                .collect(),
            Err(_) => (0..keys.len())
                .map(|_| Outcome::Unknown {
                    error: format!("no answer within {:?}", cfg.op_timeout),
                })
                .collect(),
        };
    let complete_us = now_us();
    keys.into_iter()
        .zip(values)
        .zip(outcomes)
        .map(|((key, value), outcome)| Op {
            process,
            key,
            kind: OpKind::Put { value },
            invoke_us,
            complete_us,
            outcome,
            promise: ReadPromise::Linearizable,
        })
        .collect()
}

async fn put(
    client: &Client,
    cfg: &WorkerConfig,
    process: u32,
    key: String,
    value: u64,
    len: usize,
) -> Op {
    let bytes = value_bytes(value, len);
    let rc = ReplicateConfig {
        replica_num: cfg.replicas,
        ..Default::default()
    };
    timed(cfg, process, key.clone(), OpKind::Put { value }, async {
        stored_outcome(client.put_placed(&key, &bytes, &rc).await)
    })
    .await
}

async fn get(client: &Client, cfg: &WorkerConfig, process: u32, key: String) -> Op {
    timed(cfg, process, key.clone(), OpKind::Get, async {
        get_outcome(client.get(&key).await)
    })
    .await
}

async fn remove(client: &Client, cfg: &WorkerConfig, process: u32, key: String, force: bool) -> Op {
    timed(cfg, process, key.clone(), OpKind::Remove { force }, async {
        remove_outcome(client.remove(&key, force).await)
    })
    .await
}

/// One operation on the hot keys shared by every task of every worker.
async fn hot_op(
    client: &Client,
    transport: &TcpTransport,
    cfg: &WorkerConfig,
    process: u32,
    rng: &mut StdRng,
    counter: &mut u64,
) -> Vec<Op> {
    *counter += 1;
    let epoch = now_us() / SHARED_EPOCH_US;
    let key = format!("hot-e{epoch}-k{}", rng.random_range(0..HOT_KEYS));
    let roll: f64 = rng.random();
    vec![if roll < 0.35 {
        let value = ((process as u64) << 40) | *counter;
        put(client, cfg, process, key, value, HOT_VALUE_LEN).await
    } else if roll < 0.55 {
        slow_get(client, transport, cfg, process, key, rng).await
    } else if roll < 0.7 {
        get(client, cfg, process, key).await
    } else {
        remove(client, cfg, process, key, rng.random_bool(0.5)).await
    }]
}

/// Looks `key` up, pauses within its read lease, then reads every replica
/// directly and checks its bytes against the checksum the master gave.
async fn slow_get(
    client: &Client,
    transport: &TcpTransport,
    cfg: &WorkerConfig,
    process: u32,
    key: String,
    rng: &mut StdRng,
) -> Op {
    let pause = Duration::from_millis(rng.random_range(SLOW_READ_PAUSE_MS));
    timed(cfg, process, key.clone(), OpKind::Get, async {
        // The lease counts from here, as the client library counts it.
        let asked = std::time::Instant::now();
        let found = match client.master().get_replica_list(&key).await {
            Ok(found) => found,
            Err(e) => {
                return match e.code() {
                    ErrorCode::ObjectNotFound | ErrorCode::ReplicaIsNotReady => Outcome::Missing,
                    _ => Outcome::Fail {
                        error: e.to_string(),
                    },
                }
            }
        };
        tokio::time::sleep(pause).await;
        read_every_replica(
            transport,
            &found,
            asked,
            &format!("slow read after {pause:?}"),
        )
        .await
    })
    .await
}

/// Reads every replica `found` lists and checks each one's bytes against
/// the checksum the master gave. Within the read lease (counted from
/// `asked`, before the lookup) every replica must hold the object: one that
/// answers with other bytes is corrupt even when another replica is intact,
/// which a client get would fall back to, hiding the overwrite. A replica
/// that cannot be read proves nothing (a killed store's replicas are lost,
/// and a restarted store refuses requests for its previous segment rather
/// than answer them); past the lease the space may legitimately hold new
/// bytes.
pub(crate) async fn read_every_replica(
    transport: &TcpTransport,
    found: &pb::GetReplicaListResponse,
    asked: std::time::Instant,
    what: &str,
) -> Outcome {
    let mut value = None;
    let mut last = String::from("no replica");
    for r in found.replicas.iter().filter(|r| r.length == found.size) {
        let mut buf = vec![0u8; found.size as usize];
        let mut reads = [(Grant::from(r), r.offset, buf.as_mut_slice())];
        match transport.read_checksummed(&r.endpoint, &mut reads).await {
            Ok(crcs) if crcs.first() == Some(&found.checksum) => match decode_value(&buf) {
                Ok(v) => value = value.or(Some(v)),
                Err(detail) => return Outcome::Corrupt { detail },
            },
            // Past the lease the space may legitimately hold new bytes.
            Ok(_) if asked.elapsed() >= Duration::from_millis(found.lease_ttl_ms) => {
                return Outcome::Fail {
                    error: format!("{what} finished after its {} ms lease", found.lease_ttl_ms),
                }
            }
            Ok(_) => {
                return Outcome::Corrupt {
                    detail: format!(
                        "{what}, within its lease: the replica on segment {} no longer holds \
                         the bytes the master described",
                        r.segment_id
                    ),
                }
            }
            Err(e) => last = e.to_string(),
        }
    }
    match value {
        Some(value) => Outcome::Found { value },
        None => Outcome::Fail { error: last },
    }
}

async fn timed(
    cfg: &WorkerConfig,
    process: u32,
    key: String,
    kind: OpKind,
    f: impl std::future::Future<Output = Outcome>,
) -> Op {
    let invoke_us = now_us();
    let outcome = match tokio::time::timeout(cfg.op_timeout, f).await {
        Ok(o) => o,
        Err(_) => Outcome::Unknown {
            error: format!("no answer within {:?}", cfg.op_timeout),
        },
    };
    Op {
        process,
        key,
        kind,
        invoke_us,
        complete_us: now_us(),
        outcome,
        promise: ReadPromise::Linearizable,
    }
}

/// Errors after which the operation certainly had no effect: the state
/// machine refused it. Anything else may have committed. INVALID_PARAMS is
/// not here: a retry older than the master's deduplication window gets it,
/// and the original attempt may have been applied.
pub(crate) fn definite_refusal(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::ReplicaIsNotReady
            | ErrorCode::NoAvailableHandle
            | ErrorCode::ObjectHasLease
            | ErrorCode::ObjectPinned
            | ErrorCode::InvalidKey
    )
}

pub(crate) fn put_outcome(r: Result<(), Error>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(Error::Master { code, message }) if definite_refusal(code) => Outcome::Fail {
            error: format!("{}: {message}", code.as_str_name()),
        },
        Err(e) => Outcome::Unknown {
            error: e.to_string(),
        },
    }
}

/// The error of a put kept in a degraded client's memory.
pub const LOCAL_ONLY_PUT: &str = "kept in the client's memory only (degraded mode)";

/// A put that says where its bytes went: one kept only in the client's
/// memory (degraded mode) is in the cluster later, when it is published,
/// or never.
fn stored_outcome(r: Result<Stored, Error>) -> Outcome {
    match r {
        Ok(Stored::InCluster) => Outcome::Ok,
        Ok(Stored::LocalOnly) => Outcome::Unknown {
            error: LOCAL_ONLY_PUT.into(),
        },
        Err(e) => put_outcome(Err(e)),
    }
}

pub(crate) fn remove_outcome(r: Result<(), Error>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(Error::NotFound(_)) => Outcome::Missing,
        Err(Error::Master { code, message }) if definite_refusal(code) => Outcome::Fail {
            error: format!("{}: {message}", code.as_str_name()),
        },
        Err(e) => Outcome::Unknown {
            error: e.to_string(),
        },
    }
}

fn get_outcome(r: Result<Vec<u8>, Error>) -> Outcome {
    match r {
        Ok(bytes) => match decode_value(&bytes) {
            Ok(value) => Outcome::Found { value },
            Err(detail) => Outcome::Corrupt { detail },
        },
        Err(Error::NotFound(_)) => Outcome::Missing,
        // Still being written: not readable, which a reader sees as absent.
        Err(Error::Master {
            code: ErrorCode::ReplicaIsNotReady,
            ..
        }) => Outcome::Missing,
        Err(Error::ChecksumMismatch(k)) => Outcome::Corrupt {
            detail: format!("every replica of {k:?} failed its checksum"),
        },
        Err(e) => Outcome::Fail {
            error: e.to_string(),
        },
    }
}
