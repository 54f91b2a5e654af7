//! The stalled writer of [`FaultKind::StalledWriterAcrossFailover`]: a
//! client of the chaos process (its own client id) that has the leader place
//! a few puts without a commit (one-commit puts, inside the leader's
//! reservation), is then cut off from them by a failover, and writes its
//! bytes and sends its PutEnds only after the new leader has served the
//! workers for a while.
//!
//! The new leader must not hand out the ranges the stalled puts were placed
//! in (it never places puts in an earlier term's reservations): the stalled
//! PutEnds then commit or fail, and nobody else's bytes are touched. A
//! leader that adopts the old term's reservations (the test-only
//! `--unsafe-adopt-foreign-reservations`) gives those ranges to other puts
//! of the same size; the stalled bytes then overwrite acknowledged objects,
//! which the reads after the stalled writes see as replicas that no longer
//! hold what the master describes ([`Outcome::Corrupt`], a wrong-bytes
//! violation).
//!
//! Stalled puts after the first write into a *placement made ahead*: the
//! filler before each asked the leader, in its PutEnd, to place the writer's
//! next put before its key was known (docs/one-commit-puts.md, "Placements
//! ahead"), and the stalled put's PutEnd names the key. Those must cross a
//! failover as safely as placements made at PutStart.
//!
//! To make the stalled ranges exact holes (best fit gives a same-size put
//! exactly such a hole), each stalled put is followed by a *filler*: a put
//! of the same size finished at once, so it is committed and the new leader
//! sees it as taken. The size is one allocation unit, which the workers
//! almost never put, so the holes are the smallest free ranges and go to
//! the writer's own *victim* puts of that size after the failover; after
//! the stalled writes it reads every replica of its own keys and of the
//! workers' hot keys. Every operation is recorded in
//! [`FAULT_HISTORY`] as workers record theirs, so the checker checks these
//! keys like any other: an acknowledged stalled put must be readable later.
//!
//! The same writer plays [`FaultKind::LateWriteAfterRevoke`]: its placed
//! puts' writes are held halfway on connections of their own, the puts are
//! revoked (as a client does after a transfer timed out), victims of the
//! same size and the workers put, and then the held halves arrive under grants
//! that are still valid. A store writes them: the masters must have kept
//! the revoked ranges out of use until the grants can no longer be
//! honoured (the write fence, docs/one-commit-puts.md). A leader that
//! places them again (the test-only `--unsafe-reuse-revoked-ranges`) lets
//! the late halves overwrite acknowledged objects, which the reads see.
//!
//! [`FaultKind::StalledWriterAcrossFailover`]: crate::schedule::FaultKind::StalledWriterAcrossFailover
//! [`FaultKind::LateWriteAfterRevoke`]: crate::schedule::FaultKind::LateWriteAfterRevoke

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crescent_client::master::Placement;
use crescent_client::{MasterClient, MasterRpcError};
use crescent_proto::{pb, ErrorCode};
use crescent_store::protocol::Grant;
use crescent_store::transport::TcpTransport;

use crate::history::{now_us, value_bytes, Op, OpKind, Outcome, ReadPromise, Recorder};
use crate::workload::{definite_refusal, hot_keys_between, read_every_replica};

/// The history file of the operations faults make (next to the workers'
/// `history-<n>.jsonl`).
pub const FAULT_HISTORY: &str = "history-faults.jsonl";

/// Process ids of the stalled writer's rounds: far above the workers'
/// (100 × worker + task), so the report never takes them for a worker.
/// Round `n` uses `BASE + 3n` (stalled puts), `+ 1` (fillers and victims)
/// and `+ 2` (reads). Value ids are `process << 40 | counter`, as workers'.
const PROCESS_BASE: u32 = 1_000_000;

/// The size of the stalled puts, fillers and victims: one allocation unit,
/// which the workers' puts (4 KiB, or 64 bytes to 4 KiB at random) almost
/// never have. A stalled range is then the smallest free range of its
/// reservation, and best fit gives it to the next put of this size: a
/// victim's, which the writer reads back, not a worker's that may never be
/// read again.
const STALLED_VALUE_LEN: usize = crescent_raft::alloc::ALIGNMENT as usize;

/// Puts placed and then stalled across the failover, per round.
pub const STALLED_PUTS: usize = 3;
/// Puts of the same size the new leader places without a commit (so in a
/// reservation, where the stalled ranges are), per round, made as soon as it
/// answers ...
const VICTIM_PUTS: usize = 6;
/// ... trying at most this many (a new leader places two-commit puts until it
/// holds its lease and has taken up its term's reservations).
const MAX_VICTIM_TRIES: usize = 40;
/// How long the workers (and victims) put before the stalled writer writes.
pub const WORKERS_PUT_FOR: Duration = Duration::from_secs(2);
/// One step of an operation (an RPC, a transfer) that takes longer is
/// recorded as of unknown outcome, as the workers' operation timeout does.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct StalledWriter {
    client: MasterClient,
    transport: TcpTransport,
    recorder: Mutex<Recorder>,
    rounds: std::sync::atomic::AtomicU32,
}

/// A put the leader placed, not yet written nor ended.
pub struct Placed {
    key: String,
    process: u32,
    value: u64,
    put_id: u64,
    placement: Placement,
    invoke_us: u64,
}

/// A put's bytes held on their way to its stores: on a connection of its
/// own to each replica's store, the request header and the first half of
/// the payload sent, the rest not yet (a link that stalled mid-transfer).
pub struct LateWrite {
    streams: Vec<(tokio::net::TcpStream, Vec<u8>)>,
}

/// A put's whole write request to one replica's store, built but not sent
/// (as a partition holds a request that TCP delivers when it heals).
pub struct HeldRequest {
    endpoint: String,
    bytes: Vec<u8>,
}

/// What one round did, for the run's output.
#[derive(Debug, Default)]
pub struct RoundSummary {
    /// Replica writes held mid-payload, revoked, and delivered late
    /// ([`FaultKind::LateWriteAfterRevoke`]), and how many of those the
    /// stores answered OK (a store writes late bytes into a range whose
    /// grant is still valid: the masters must not have reused it).
    ///
    /// [`FaultKind::LateWriteAfterRevoke`]: crate::schedule::FaultKind::LateWriteAfterRevoke
    pub late_writes: usize,
    pub late_landed: usize,
    pub stalled: usize,
    /// Stalled puts the leader placed without a commit (in a reservation):
    /// only those exercise the fence.
    pub stalled_pending: usize,
    /// Of those, placed ahead of their key (by the filler's PutEnd before).
    pub stalled_ahead: usize,
    pub fillers_ok: usize,
    pub victims: usize,
    /// Victims the new leader placed without a commit.
    pub victims_pending: usize,
    pub victims_ok: usize,
    pub stalled_ends: Outcomes,
    pub reads: Outcomes,
}

#[derive(Debug, Default)]
pub struct Outcomes {
    pub ok: usize,
    pub missing: usize,
    pub corrupt: usize,
    pub failed: usize,
    pub unknown: usize,
}

impl Outcomes {
    fn count(&mut self, o: &Outcome) {
        match o {
            Outcome::Ok | Outcome::Found { .. } | Outcome::Present { .. } => self.ok += 1,
            Outcome::Missing => self.missing += 1,
            Outcome::Corrupt { .. } => self.corrupt += 1,
            Outcome::Fail { .. } => self.failed += 1,
            Outcome::Unknown { .. } => self.unknown += 1,
        }
    }
}

impl std::fmt::Display for Outcomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ok, {} missing, {} corrupt, {} failed, {} unknown",
            self.ok, self.missing, self.corrupt, self.failed, self.unknown
        )
    }
}

impl std::fmt::Display for RoundSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} stalled puts placed ({} without a commit, {} of them ahead), {} fillers acknowledged; \
             {} victims ({} placed without a commit, {} acknowledged); \
             stalled PutEnds: {}; reads: {}",
            self.stalled,
            self.stalled_pending,
            self.stalled_ahead,
            self.fillers_ok,
            self.victims,
            self.victims_pending,
            self.victims_ok,
            self.stalled_ends,
            self.reads
        )
    }
}

impl StalledWriter {
    /// `masters`: the masters' addresses, comma-separated; `history`: the
    /// file its operations are recorded in.
    pub fn new(masters: &str, token_file: Option<&Path>, history: &Path) -> anyhow::Result<Self> {
        let token = crescent_auth::BearerToken::from_optional_file(token_file)?;
        Ok(Self {
            client: MasterClient::new(masters)?.with_token(token),
            // The chaos suite runs the data port in clear text.
            transport: TcpTransport::new(),
            recorder: Mutex::new(Recorder::create(history)?),
            rounds: Default::default(),
        })
    }

    /// A new round: fresh keys (`stall-<time>-…`, which no worker uses) and
    /// process ids.
    pub fn round(&self) -> Round<'_> {
        let n = self
            .rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started_us = now_us();
        Round {
            w: self,
            tag: started_us,
            process: PROCESS_BASE + 3 * n,
            counter: 0,
            started_us,
            summary: RoundSummary::default(),
        }
    }

    fn record(&self, op: &Op) {
        if let Err(e) = self.recorder.lock().expect("lock poisoned").record(op) {
            // The run's check would miss this operation; say so loudly.
            eprintln!("chaos: cannot record a stalled writer's operation: {e:#}");
        }
    }
}

pub struct Round<'a> {
    w: &'a StalledWriter,
    tag: u64,
    /// The stalled puts' process; `+ 1` fillers and victims, `+ 2` reads.
    process: u32,
    counter: u64,
    started_us: u64,
    pub summary: RoundSummary,
}

fn config() -> pb::ReplicateConfig {
    pb::ReplicateConfig {
        // As the workers put: a replica on each store.
        replica_num: 2,
        ..Default::default()
    }
}

/// A put's outcome from a master's error, as the workload classifies a
/// client put's errors: refusals certainly had no effect, anything else may
/// have committed.
fn put_failure(e: MasterRpcError) -> Outcome {
    match e {
        MasterRpcError::Status { code, message } if definite_refusal(code) => Outcome::Fail {
            error: format!("{}: {message}", code.as_str_name()),
        },
        e => Outcome::Unknown {
            error: e.to_string(),
        },
    }
}

/// The header of a WRITE of replica `r` (the `n`th of its put) under its
/// grant, as a client sends it.
fn write_request(n: usize, r: &pb::ReplicaDescriptor) -> crescent_store::protocol::Request {
    crescent_store::protocol::Request {
        op: crescent_store::protocol::Op::Write,
        request_id: n as u64 + 1,
        offset: r.offset,
        len: r.length,
        grant: Grant::from(r),
    }
}

/// Sends `bytes` (the rest of a write request) and reads the store's
/// answer: whether it answered OK within [`STEP_TIMEOUT`].
async fn send_for_ok(s: &mut tokio::net::TcpStream, bytes: &[u8]) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answered = tokio::time::timeout(STEP_TIMEOUT, async {
        s.write_all(bytes).await?;
        let mut answer = [0u8; crescent_store::protocol::RESPONSE_LEN];
        s.read_exact(&mut answer).await?;
        std::io::Result::Ok(answer)
    })
    .await;
    matches!(answered, Ok(Ok(answer)) if crescent_store::protocol::Response::decode(&answer)
        .is_ok_and(|r| r.status == crescent_store::protocol::Status::Ok))
}

async fn step<T>(
    f: impl std::future::Future<Output = Result<T, MasterRpcError>>,
) -> Result<T, MasterRpcError> {
    tokio::time::timeout(STEP_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| {
            Err(MasterRpcError::Unavailable(format!(
                "no answer within {STEP_TIMEOUT:?}"
            )))
        })
}

impl Round<'_> {
    fn key(&self, what: &str, i: usize) -> String {
        format!("stall-{}-{what}{i}", self.tag)
    }

    fn next_value(&mut self, process: u32) -> u64 {
        self.counter += 1;
        (u64::from(process) << 40) | self.counter
    }

    /// Before the failover: has the leader place [`STALLED_PUTS`] puts of
    /// [`STALLED_VALUE_LEN`], each followed by a finished filler of that
    /// size, so each stalled range is a hole between committed objects.
    pub async fn place_stalled(&mut self) -> Vec<Placed> {
        let mut placed = Vec::new();
        // A placement ahead the last filler's PutEnd got, and its put id.
        let mut ahead: Option<(u64, Placement)> = None;
        for i in 0..STALLED_PUTS {
            let key = self.key("s", i);
            let stalled = match ahead.take() {
                Some((put_id, placement)) => Some(Placed {
                    key,
                    process: self.process,
                    value: self.next_value(self.process),
                    put_id,
                    placement,
                    invoke_us: now_us(),
                }),
                None => self.place(key, self.process).await,
            };
            if let Some(p) = stalled {
                self.summary.stalled += 1;
                if p.placement.pending {
                    self.summary.stalled_pending += 1;
                }
                if p.placement.ahead {
                    self.summary.stalled_ahead += 1;
                }
                placed.push(p);
            }
            // Each filler but the last asks for the next stalled put's
            // placement (which the next put takes if the leader made one).
            let next_put_id = if i + 1 < STALLED_PUTS {
                self.w.client.new_put_id()
            } else {
                0
            };
            let filler = self.key("f", i);
            let (outcome, next) = self.put_now_asking(filler, next_put_id).await;
            if outcome == Outcome::Ok {
                self.summary.fillers_ok += 1;
            }
            ahead = next.map(|p| (next_put_id, p));
        }
        if let Some((put_id, _)) = ahead {
            // Not used: given back (or released by the leader later).
            let _ = step(self.w.client.put_revoke_ahead(put_id)).await;
        }
        placed
    }

    /// Right after the failover, for at most `within`: puts of the same
    /// size that best fit places in the stalled ranges if the new leader
    /// hands them out, until [`VICTIM_PUTS`] of them were placed without a
    /// commit (only those can land in a reservation).
    pub async fn put_victims(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.summary.victims_pending < VICTIM_PUTS
            && self.summary.victims < MAX_VICTIM_TRIES
            && Instant::now() < deadline
        {
            let key = self.key("v", self.summary.victims);
            self.summary.victims += 1;
            let (outcome, pending) = self.put_now(key).await;
            if pending {
                self.summary.victims_pending += 1;
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if outcome == Outcome::Ok {
                self.summary.victims_ok += 1;
            }
        }
    }

    /// Writes the stalled puts' bytes and sends their PutEnds.
    pub async fn finish_stalled(&mut self, placed: Vec<Placed>) {
        for p in placed {
            let outcome = self.finish(p).await;
            self.summary.stalled_ends.count(&outcome);
        }
    }

    /// Starts each placed put's replica writes and holds them mid-payload
    /// ([`LateWrite`]); a replica that cannot be reached is left out.
    pub async fn start_late_writes(&mut self, placed: &[Placed]) -> Vec<LateWrite> {
        use tokio::io::AsyncWriteExt;
        let mut late = Vec::new();
        for p in placed {
            let bytes = value_bytes(p.value, STALLED_VALUE_LEN);
            let half = bytes.len() / 2;
            let mut streams = Vec::new();
            for (n, r) in p.placement.replicas.iter().enumerate() {
                let header = write_request(n, r);
                let started = tokio::time::timeout(STEP_TIMEOUT, async {
                    let mut s = tokio::net::TcpStream::connect(&r.endpoint).await?;
                    s.write_all(&header.encode()).await?;
                    s.write_all(&bytes[..half]).await?;
                    std::io::Result::Ok(s)
                })
                .await;
                if let Ok(Ok(s)) = started {
                    streams.push((s, bytes[half..].to_vec()));
                    self.summary.late_writes += 1;
                }
            }
            late.push(LateWrite { streams });
        }
        late
    }

    /// Builds each placed put's replica write requests (header and whole
    /// payload) without sending a byte. Returns them and the latest grant
    /// expiry among them (the leader's Unix ms).
    pub fn hold_requests(&mut self, placed: &[Placed]) -> (Vec<HeldRequest>, u64) {
        let mut held = Vec::new();
        let mut latest_expiry_ms = 0;
        for p in placed {
            let payload = value_bytes(p.value, STALLED_VALUE_LEN);
            for (n, r) in p.placement.replicas.iter().enumerate() {
                let header = write_request(n, r);
                latest_expiry_ms = latest_expiry_ms.max(header.grant.expiry_ms);
                let mut bytes = header.encode().to_vec();
                bytes.extend_from_slice(&payload);
                held.push(HeldRequest {
                    endpoint: r.endpoint.clone(),
                    bytes,
                });
                self.summary.late_writes += 1;
            }
        }
        (held, latest_expiry_ms)
    }

    /// Sends each held request whole on a connection of its own and reads
    /// the store's answer.
    pub async fn deliver_held(&mut self, held: Vec<HeldRequest>) {
        for h in held {
            let connected =
                tokio::time::timeout(STEP_TIMEOUT, tokio::net::TcpStream::connect(&h.endpoint))
                    .await;
            if let Ok(Ok(mut s)) = connected {
                if send_for_ok(&mut s, &h.bytes).await {
                    self.summary.late_landed += 1;
                }
            }
        }
    }

    /// The writer gives up on its placed puts: each is revoked (it never
    /// sends a PutEnd, so none can become readable) and recorded as failed.
    pub async fn revoke_placed(&mut self, placed: Vec<Placed>) {
        for p in placed {
            self.revoke(&p).await;
            self.record_put(
                p,
                Outcome::Fail {
                    error: "revoked before its PutEnd".into(),
                },
            );
        }
    }

    /// Records a placed put's operation (invoked at its PutStart), ended now.
    fn record_put(&self, p: Placed, outcome: Outcome) {
        self.w.record(&Op {
            process: p.process,
            key: p.key,
            kind: OpKind::Put { value: p.value },
            invoke_us: p.invoke_us,
            complete_us: now_us(),
            outcome,
            promise: ReadPromise::Linearizable,
        });
    }

    /// Revokes a placed put (as made: ahead of its key, or named); a
    /// failed revoke leaves it to the leader's release time.
    async fn revoke(&self, p: &Placed) {
        let _ = if p.placement.ahead {
            step(self.w.client.put_revoke_ahead(p.put_id)).await
        } else {
            step(self.w.client.put_revoke_named(&p.key, p.put_id)).await
        };
    }

    /// Sends the held halves and reads the stores' answers.
    pub async fn deliver_late(&mut self, late: Vec<LateWrite>) {
        for w in late {
            for (mut s, rest) in w.streams {
                if send_for_ok(&mut s, &rest).await {
                    self.summary.late_landed += 1;
                }
            }
        }
    }

    /// Reads every replica of this round's keys and of the workers' hot
    /// keys since the round began, and records each read.
    pub async fn read_back(&mut self) {
        let mut keys: Vec<String> = Vec::new();
        let victims = self.summary.victims;
        for (what, n) in [("s", STALLED_PUTS), ("f", STALLED_PUTS), ("v", victims)] {
            keys.extend((0..n).map(|i| self.key(what, i)));
        }
        keys.extend(hot_keys_between(self.started_us, now_us()));
        for key in keys {
            let op = self.read(key).await;
            self.summary.reads.count(&op.outcome);
            self.w.record(&op);
        }
    }

    /// PutStart (one commit asked for). A refused or failed start is
    /// recorded at once; a placed put is returned for [`finish`](Self::finish).
    async fn place(&mut self, key: String, process: u32) -> Option<Placed> {
        let value = self.next_value(process);
        let invoke_us = now_us();
        let put_id = self.w.client.new_put_id();
        let started = step(self.w.client.put_start_placed(
            &key,
            STALLED_VALUE_LEN as u64,
            config(),
            put_id,
        ))
        .await;
        let outcome = match started {
            Ok(placement) => {
                return Some(Placed {
                    key,
                    process,
                    value,
                    put_id,
                    placement,
                    invoke_us,
                })
            }
            // Objects are immutable: "already exists" is success (fresh
            // keys, so only a retried PutStart could see it).
            Err(MasterRpcError::Status {
                code: ErrorCode::ObjectAlreadyExists,
                ..
            }) => Outcome::Ok,
            Err(e) => put_failure(e),
        };
        self.w.record(&Op {
            process,
            key,
            kind: OpKind::Put { value },
            invoke_us,
            complete_us: now_us(),
            outcome,
            promise: ReadPromise::Linearizable,
        });
        None
    }

    /// Writes a placed put's bytes to every replica, then PutEnd with the
    /// placement; records the put (invoked at its PutStart).
    async fn finish(&mut self, p: Placed) -> Outcome {
        self.finish_asking(p, 0).await.0
    }

    /// [`finish`](Self::finish), its PutEnd asking for a placement ahead
    /// named `next_put_id` (0: not): what the leader placed, if anything.
    async fn finish_asking(&mut self, p: Placed, next_put_id: u64) -> (Outcome, Option<Placement>) {
        let mut next = None;
        let bytes = value_bytes(p.value, STALLED_VALUE_LEN);
        let mut written = Ok(());
        for r in &p.placement.replicas {
            if r.length != bytes.len() as u64 {
                written = Err(format!(
                    "replica length {} for a {}-byte value",
                    r.length,
                    bytes.len()
                ));
                break;
            }
            let writes = [(Grant::from(r), r.offset, bytes.as_slice())];
            let sent =
                tokio::time::timeout(STEP_TIMEOUT, self.w.transport.write(&r.endpoint, &writes))
                    .await;
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.w.transport.forget(&r.endpoint);
                    written = Err(e.to_string());
                    break;
                }
                Err(_) => {
                    self.w.transport.forget(&r.endpoint);
                    written = Err(format!("write not done within {STEP_TIMEOUT:?}"));
                    break;
                }
            }
        }
        let outcome = match written {
            // As the client library does: nothing half-written may become
            // readable. The put never ends; a transfer failure is of
            // unknown outcome for the workload too.
            Err(error) => {
                self.revoke(&p).await;
                Outcome::Unknown {
                    error: format!("TRANSFER_FAIL: {error}"),
                }
            }
            Ok(()) => {
                let ended = tokio::time::timeout(
                    STEP_TIMEOUT,
                    self.w.client.put_end_placing_next(
                        &p.key,
                        crc32c::crc32c(&bytes),
                        p.put_id,
                        &p.placement,
                        STALLED_VALUE_LEN as u64,
                        &config(),
                        next_put_id,
                    ),
                )
                .await
                .map_or_else(
                    |_| {
                        Err(MasterRpcError::Unavailable(format!(
                            "no answer within {STEP_TIMEOUT:?}"
                        )))
                    },
                    |(ended, placed)| {
                        next = placed;
                        ended
                    },
                );
                match ended {
                    Ok(()) => Outcome::Ok,
                    // As the client library: another put of the key committed
                    // first (placed by an earlier leader); the key exists.
                    Err(MasterRpcError::Status {
                        code: ErrorCode::ObjectAlreadyExists,
                        ..
                    }) if p.placement.pending => Outcome::Ok,
                    Err(e) => put_failure(e),
                }
            }
        };
        self.record_put(p, outcome.clone());
        (outcome, next)
    }

    /// A put finished at once (fillers, victims), and whether the leader
    /// placed it without a commit.
    async fn put_now(&mut self, key: String) -> (Outcome, bool) {
        match self.place(key, self.process + 1).await {
            Some(p) => {
                let pending = p.placement.pending;
                (self.finish(p).await, pending)
            }
            // Recorded already; only its success matters to the caller.
            None => (
                Outcome::Fail {
                    error: "not placed".into(),
                },
                false,
            ),
        }
    }

    /// A filler put finished at once, its PutEnd asking for a placement
    /// ahead named `next_put_id` (0: not); what the leader placed ahead.
    async fn put_now_asking(
        &mut self,
        key: String,
        next_put_id: u64,
    ) -> (Outcome, Option<Placement>) {
        match self.place(key, self.process + 1).await {
            Some(p) => self.finish_asking(p, next_put_id).await,
            None => (
                Outcome::Fail {
                    error: "not placed".into(),
                },
                None,
            ),
        }
    }

    /// Looks `key` up and reads every replica at once (well within the
    /// read lease): each must hold the bytes the master describes.
    async fn read(&mut self, key: String) -> Op {
        let invoke_us = now_us();
        let outcome = tokio::time::timeout(STEP_TIMEOUT, async {
            let asked = Instant::now();
            match self.w.client.get_replica_list(&key).await {
                Ok(found) => {
                    read_every_replica(
                        &self.w.transport,
                        &found,
                        asked,
                        "a read after the stalled writes",
                    )
                    .await
                }
                Err(e) => match e.code() {
                    ErrorCode::ObjectNotFound | ErrorCode::ReplicaIsNotReady => Outcome::Missing,
                    _ => Outcome::Fail {
                        error: e.to_string(),
                    },
                },
            }
        })
        .await
        .unwrap_or_else(|_| Outcome::Unknown {
            error: format!("no answer within {STEP_TIMEOUT:?}"),
        });
        Op {
            process: self.process + 2,
            key,
            kind: OpKind::Get,
            invoke_us,
            complete_us: now_us(),
            outcome,
            promise: ReadPromise::Linearizable,
        }
    }
}
