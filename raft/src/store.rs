//! Durable Raft storage in the node's data dir, in an append-only journal
//! (`raft.log`, [`crate::journal`]).
//!
//! * Log: every entry is kept in memory (until purged) and written through one
//!   writer thread that groups concurrent appends into one journal batch (one
//!   write, one fdatasync) before telling openraft the entries are flushed.
//!   openraft only counts an entry towards a commit quorum after that
//!   callback, so an acknowledged write is on disk on a majority.
//! * Vote, committed log id and last purged id: small records in the same file,
//!   written by the same thread (so they are ordered with the log). The
//!   committed id is only a hint: it rides in one of every
//!   `HINT_EVERY_TXNS` batches the writer makes anyway, and in one at
//!   close. A batch of its own per commit cost a second fsync per
//!   entry, queued ahead of the next append (about 10 % of a 3-node put).
//! * State machine: held in memory ([`SharedState`]) and made durable by
//!   snapshots stored in the same file; on restart the snapshot is loaded and
//!   openraft re-applies the committed log after it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, RwLock};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::codec;
use crate::journal::{Journal, JournalError, Record};
use crate::state::{MetaState, Response};
use crate::{NodeId, TypeConfig};

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "last_purged";
const KEY_SNAPSHOT: &str = "snapshot";

/// A commit slower than this is logged: it delays every write's acknowledgement.
const SLOW_COMMIT_MS: u64 = 20;

/// The committed hint is written with one transaction in this many (and at
/// close). Each write of it adds a page to that transaction; a restarted node
/// that finds an older hint applies the rest once a leader reaches it.
const HINT_EVERY_TXNS: u32 = 1024;

/// Most writer requests folded into one batch.
const MAX_GROUP: usize = 256;

type SResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open raft store: {0}")]
    Journal(#[from] JournalError),
    #[error("raft store {path} is corrupt: {reason}")]
    Corrupt { path: String, reason: String },
    #[error(
        "{path} holds a raft store of an earlier build ({old}) and no {journal}: this build \
         cannot read it, and starting empty here could found a new, empty cluster; run the \
         build that wrote it, or start this master on a new data dir under a new node id"
    )]
    EarlierStore {
        path: String,
        old: &'static str,
        journal: &'static str,
    },
}

/// The file earlier builds kept the log in.
const EARLIER_STORE_FILE: &str = "raft.redb";

enum WriteReq {
    Append(Vec<(u64, Vec<u8>)>, LogFlushed<TypeConfig>),
    TruncateFrom(u64, oneshot::Sender<Result<(), String>>),
    PurgeUpTo(u64, Vec<u8>),
    PutMeta(&'static str, Vec<u8>, oneshot::Sender<Result<(), String>>),
}

struct LogMem {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

/// The writer thread's inbox. When the last store holding it is dropped, the
/// thread is stopped and joined, so the file can be reopened at once.
struct Writer {
    tx: Option<mpsc::Sender<WriteReq>>,
    handle: Option<std::thread::JoinHandle<()>>,
    /// The newest committed id not yet written (encoded), for the next transaction.
    committed_hint: Arc<Mutex<Option<Vec<u8>>>>,
    /// Becomes true once the thread has closed the file.
    closed: tokio::sync::watch::Receiver<bool>,
}

/// Resolves once the store's file is closed, i.e. once openraft (and every
/// other holder) has dropped the log and state machine stores. Holds no
/// store itself, so waiting on it does not keep the file open.
#[derive(Clone)]
pub struct StoreClosed(tokio::sync::watch::Receiver<bool>);

impl StoreClosed {
    /// Waits at most `limit`; returns whether the file is closed.
    pub async fn wait(mut self, limit: std::time::Duration) -> bool {
        // An error means the thread ended without saying so (it panicked):
        // the file is closed then too.
        tokio::time::timeout(limit, self.0.wait_for(|closed| *closed))
            .await
            .is_ok()
    }
}

impl Writer {
    fn send(&self, req: WriteReq) -> Result<(), String> {
        self.tx
            .as_ref()
            .ok_or_else(|| "raft store writer stopped".to_string())?
            .send(req)
            .map_err(|_| "raft store writer stopped".to_string())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Raft log storage. Clones share the same log.
#[derive(Clone)]
pub struct LogStore {
    mem: Arc<Mutex<LogMem>>,
    writer: Arc<Writer>,
}

impl LogStore {
    /// What to wait on, after the Raft node shut down, before the data dir
    /// is opened again.
    pub fn closed(&self) -> StoreClosed {
        StoreClosed(self.writer.closed.clone())
    }
}

/// The state machine data shared between openraft (which applies) and the
/// master (which reads under the read lock).
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SmData {
    pub last_applied: Option<LogId<NodeId>>,
    pub last_membership: StoredMembership<NodeId, openraft::BasicNode>,
    pub state: MetaState,
}

#[derive(Serialize, Deserialize, Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    data: Vec<u8>,
}

pub struct SharedState {
    pub sm: RwLock<SmData>,
}

/// Raft state machine storage: in memory, durable through snapshots.
#[derive(Clone)]
pub struct StateMachineStore {
    pub shared: Arc<SharedState>,
    current: Arc<Mutex<Option<StoredSnapshot>>>,
    writer: Arc<Writer>,
    snapshot_seq: Arc<std::sync::atomic::AtomicU64>,
}

fn io_err<E: std::fmt::Display>(e: E) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// How the vote found on disk is handed back to openraft at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum VoteAtOpen {
    /// Uncommitted: a node that led before it stopped leads again only
    /// after an election (see [`without_leadership`]). Always, except in tests.
    #[default]
    Uncommitted,
    /// TEST ONLY; breaks linearizable reads. As saved, so openraft restores a
    /// restarted leader in its old term with only its persisted commit hint,
    /// and it may answer reads from a state that lacks acknowledged writes.
    /// The chaos suite uses it to show its checker sees that.
    AsSavedUnsafely,
}

/// Opens (or creates) `<dir>/raft.log` and returns the log and state machine stores.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), OpenError> {
    open_with(dir, VoteAtOpen::Uncommitted)
}

/// [`open`], choosing how the persisted vote comes back (tests only pass
/// anything but the default).
pub fn open_with(
    dir: &Path,
    vote_at_open: VoteAtOpen,
) -> Result<(LogStore, StateMachineStore), OpenError> {
    std::fs::create_dir_all(dir).map_err(|source| OpenError::DataDir {
        path: dir.display().to_string(),
        source,
    })?;
    // Locked before anything is read or written.
    let lock = crate::journal::lock_dir(dir)?;
    if dir.join(EARLIER_STORE_FILE).exists() && !dir.join(crate::journal::FILE_NAME).exists() {
        return Err(OpenError::EarlierStore {
            path: dir.display().to_string(),
            old: EARLIER_STORE_FILE,
            journal: crate::journal::FILE_NAME,
        });
    }
    let path_s = dir.join(crate::journal::FILE_NAME).display().to_string();
    let corrupt = |reason: String| OpenError::Corrupt {
        path: path_s.clone(),
        reason,
    };
    let (journal, contents) = Journal::open(lock, dir, KEY_PURGED)?;
    let mut entries = BTreeMap::new();
    for (index, bytes) in &contents.entries {
        let entry: Entry<TypeConfig> =
            codec::decode(bytes).map_err(|e| corrupt(format!("log {index}: {e}")))?;
        entries.insert(*index, entry);
    }
    let metas = contents.metas;
    let decode_meta =
        |key: &str| -> Result<Option<Vec<u8>>, OpenError> { Ok(metas.get(key).cloned()) };
    let vote: Option<Vote<NodeId>> = decode_meta(KEY_VOTE)?
        .map(|b| codec::decode(&b))
        .transpose()
        .map_err(|e| corrupt(format!("vote: {e}")))?;
    if let Some(v) = &vote {
        // openraft adds 1 to the term when it campaigns; a term near u64::MAX
        // would panic there on every start.
        crate::terms::check_persisted(v.leader_id.term).map_err(corrupt)?;
    }
    let vote = match vote_at_open {
        VoteAtOpen::Uncommitted => vote.map(without_leadership),
        VoteAtOpen::AsSavedUnsafely => vote,
    };
    let committed: Option<LogId<NodeId>> = decode_meta(KEY_COMMITTED)?
        .map(|b| codec::decode::<Option<LogId<NodeId>>>(&b))
        .transpose()
        .map_err(|e| corrupt(format!("committed: {e}")))?
        .flatten();
    let last_purged: Option<LogId<NodeId>> = decode_meta(KEY_PURGED)?
        .map(|b| codec::decode(&b))
        .transpose()
        .map_err(|e| corrupt(format!("last purged: {e}")))?;
    let snapshot: Option<StoredSnapshot> = decode_meta(KEY_SNAPSHOT)?
        .map(|b| codec::decode(&b))
        .transpose()
        .map_err(|e| corrupt(format!("snapshot: {e}")))?;
    if let Some(p) = last_purged {
        entries.retain(|idx, _| *idx > p.index);
    }

    let sm = match &snapshot {
        Some(snap) => decode_sm(&snap.data).map_err(|e| corrupt(format!("snapshot data: {e}")))?,
        None => SmData {
            state: MetaState::new(),
            ..Default::default()
        },
    };

    let (tx, rx) = mpsc::channel();
    let committed_hint = Arc::new(Mutex::new(None));
    let hint = committed_hint.clone();
    let (closed_tx, closed) = tokio::sync::watch::channel(false);
    let handle = std::thread::Builder::new()
        .name("raft-log-writer".into())
        .spawn(move || {
            writer_loop(journal, rx, &hint);
            // The journal was dropped by the loop: the file may be opened again.
            let _ = closed_tx.send(true);
        })
        .map_err(|source| OpenError::DataDir {
            path: dir.display().to_string(),
            source,
        })?;
    let writer = Arc::new(Writer {
        tx: Some(tx),
        handle: Some(handle),
        committed_hint,
        closed,
    });

    let log = LogStore {
        mem: Arc::new(Mutex::new(LogMem {
            entries,
            last_purged,
            vote,
            committed,
        })),
        writer: writer.clone(),
    };
    let sm_store = StateMachineStore {
        shared: Arc::new(SharedState {
            sm: RwLock::new(sm),
        }),
        current: Arc::new(Mutex::new(snapshot)),
        writer,
        snapshot_seq: Arc::new(std::sync::atomic::AtomicU64::new(0)),
    };
    Ok((log, sm_store))
}

fn decode_sm(data: &[u8]) -> Result<SmData, String> {
    let mut sm: SmData = codec::decode(data).map_err(|e| e.to_string())?;
    sm.state.rebuild_derived().map_err(|e| e.to_string())?;
    Ok(sm)
}

/// The persisted vote as it is handed to openraft after a restart: the same
/// term and candidate, but not committed, so a node never resumes its
/// leadership without an election.
///
/// openraft 0.9 restores a node whose persisted vote is committed and its
/// own as leader at once (`Engine::startup`), in the same term and with no
/// new blank entry. Its commit index is then the persisted hint, which may
/// trail what the previous incarnation had committed and acknowledged, and
/// both read paths (lease reads, and openraft's read index, which is
/// max(commit index, this leader's first entry)) would answer from a state
/// machine that has not applied those writes: a get could miss an object
/// whose put was acknowledged. Uncommitted, the vote still binds the node in
/// its term (openraft grants no other candidate of that term), and the
/// leadership is won again by an election whose blank entry every read
/// waits for. The cost is one election timeout when a leader restarts.
fn without_leadership(mut vote: Vote<NodeId>) -> Vote<NodeId> {
    vote.committed = false;
    vote
}

/// The single writer: folds queued requests into one journal batch, writes
/// and syncs it, then reports. Runs until every sender is dropped, then
/// writes the last committed hint.
fn writer_loop(
    mut journal: Journal,
    rx: mpsc::Receiver<WriteReq>,
    committed_hint: &Mutex<Option<Vec<u8>>>,
) {
    let take_hint = || committed_hint.lock().expect("hint lock poisoned").take();
    let mut batches_without_hint = 0u32;
    while let Ok(first) = rx.recv() {
        // Taken before the queue is drained: a hint is set after the appends
        // it covers were queued, so they are in this batch or an earlier one,
        // and the persisted hint never runs ahead of the persisted log.
        batches_without_hint += 1;
        let hint = if batches_without_hint >= HINT_EVERY_TXNS {
            take_hint()
        } else {
            None
        };
        if hint.is_some() {
            batches_without_hint = 0;
        }
        let mut batch = vec![first];
        while batch.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(req) => batch.push(req),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let result = write_batch(&mut journal, &batch, hint.as_deref()).map_err(|e| e.to_string());
        let took = started.elapsed();
        if took > std::time::Duration::from_millis(SLOW_COMMIT_MS) {
            tracing::warn!(
                ?took,
                requests = batch.len(),
                "slow raft log write (disk or fsync stall)"
            );
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "raft store write failed");
        }
        for req in batch {
            match req {
                WriteReq::Append(_, cb) => cb.log_io_completed(result.clone().map_err(io_err)),
                WriteReq::TruncateFrom(_, ack) => {
                    let _ = ack.send(result.clone());
                }
                WriteReq::PutMeta(_, _, ack) => {
                    let _ = ack.send(result.clone());
                }
                WriteReq::PurgeUpTo(..) => {}
            }
        }
        // Between batches, so no request waits on it but the next ones.
        if result.is_ok() {
            if let Err(e) = journal.compact_if_worth_it() {
                tracing::error!(error = %e, "raft log compaction failed");
            }
        }
    }
    if let Some(hint) = take_hint() {
        if let Err(e) = write_batch(&mut journal, &[], Some(&hint)) {
            tracing::warn!(error = %e, "could not save the committed hint at shutdown");
        }
    }
}

fn write_batch(
    journal: &mut Journal,
    batch: &[WriteReq],
    committed_hint: Option<&[u8]>,
) -> Result<(), JournalError> {
    let mut records = Vec::new();
    for req in batch {
        match req {
            WriteReq::Append(entries, _) => {
                records.extend(
                    entries
                        .iter()
                        .map(|(idx, bytes)| Record::Entry(*idx, bytes)),
                );
            }
            WriteReq::TruncateFrom(from, _) => records.push(Record::TruncateFrom(*from)),
            WriteReq::PurgeUpTo(upto, purged) => records.push(Record::PurgeUpTo(*upto, purged)),
            WriteReq::PutMeta(key, value, _) => records.push(Record::Meta(key, value)),
        }
    }
    if let Some(hint) = committed_hint {
        records.push(Record::Meta(KEY_COMMITTED, hint));
    }
    journal.write(&records)
}

fn write_failed(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write(&io_err(e)).into()
}

impl LogStore {
    async fn put_meta_sync(&self, key: &'static str, value: Vec<u8>) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.writer.send(WriteReq::PutMeta(key, value, tx))?;
        rx.await
            .map_err(|_| "raft store writer stopped".to_string())?
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> SResult<Vec<Entry<TypeConfig>>> {
        let mem = self.mem.lock().expect("log lock poisoned");
        let start = match range.start_bound() {
            Bound::Included(x) => Bound::Included(*x),
            Bound::Excluded(x) => Bound::Excluded(*x),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => Bound::Included(*x),
            Bound::Excluded(x) => Bound::Excluded(*x),
            Bound::Unbounded => Bound::Unbounded,
        };
        Ok(mem
            .entries
            .range((start, end))
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> SResult<LogState<TypeConfig>> {
        let mem = self.mem.lock().expect("log lock poisoned");
        let last = mem.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: mem.last_purged,
            last_log_id: last.or(mem.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> SResult<()> {
        let bytes = codec::encode(vote).map_err(write_failed)?;
        self.put_meta_sync(KEY_VOTE, bytes)
            .await
            .map_err(|e| StorageIOError::write_vote(&io_err(e)))?;
        self.mem.lock().expect("log lock poisoned").vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> SResult<Option<Vote<NodeId>>> {
        Ok(self.mem.lock().expect("log lock poisoned").vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> SResult<()> {
        let bytes = codec::encode(&committed).map_err(write_failed)?;
        self.mem.lock().expect("log lock poisoned").committed = committed;
        // Not waited for, and no transaction of its own: losing it only means
        // re-applying less on restart.
        *self
            .writer
            .committed_hint
            .lock()
            .expect("hint lock poisoned") = Some(bytes);
        Ok(())
    }

    async fn read_committed(&mut self) -> SResult<Option<LogId<NodeId>>> {
        Ok(self.mem.lock().expect("log lock poisoned").committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> SResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        {
            let mut mem = self.mem.lock().expect("log lock poisoned");
            for entry in entries {
                let bytes =
                    codec::encode(&entry).map_err(|e| StorageIOError::write_logs(&io_err(e)))?;
                encoded.push((entry.log_id.index, bytes));
                mem.entries.insert(entry.log_id.index, entry);
            }
        }
        // Readers see the entries at once; openraft counts them as persisted
        // only when the writer calls back after fsync.
        self.writer
            .send(WriteReq::Append(encoded, callback))
            .map_err(|e| StorageIOError::write_logs(&io_err(e)))?;
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> SResult<()> {
        self.mem
            .lock()
            .expect("log lock poisoned")
            .entries
            .retain(|idx, _| *idx < log_id.index);
        let (tx, rx) = oneshot::channel();
        self.writer
            .send(WriteReq::TruncateFrom(log_id.index, tx))
            .map_err(|e| StorageIOError::write_logs(&io_err(e)))?;
        rx.await
            .map_err(|e| StorageIOError::write_logs(&io_err(e)))?
            .map_err(|e| StorageIOError::write_logs(&io_err(e)))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> SResult<()> {
        let bytes = codec::encode(&log_id).map_err(write_failed)?;
        {
            let mut mem = self.mem.lock().expect("log lock poisoned");
            mem.entries.retain(|idx, _| *idx > log_id.index);
            mem.last_purged = Some(log_id);
        }
        self.writer
            .send(WriteReq::PurgeUpTo(log_id.index, bytes))
            .map_err(|e| StorageIOError::write_logs(&io_err(e)))?;
        Ok(())
    }
}

impl StateMachineStore {
    async fn persist_snapshot(&self, snap: &StoredSnapshot) -> SResult<()> {
        let bytes = codec::encode(snap)
            .map_err(|e| StorageIOError::write_snapshot(Some(snap.meta.signature()), &io_err(e)))?;
        let (tx, rx) = oneshot::channel();
        self.writer
            .send(WriteReq::PutMeta(KEY_SNAPSHOT, bytes, tx))
            .map_err(|e| StorageIOError::write_snapshot(Some(snap.meta.signature()), &io_err(e)))?;
        rx.await
            .map_err(|e| StorageIOError::write_snapshot(Some(snap.meta.signature()), &io_err(e)))?
            .map_err(|e| StorageIOError::write_snapshot(Some(snap.meta.signature()), &io_err(e)))?;
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> SResult<Snapshot<TypeConfig>> {
        let (data, last_applied, membership) = {
            let sm = self.shared.sm.read().expect("state lock poisoned");
            let data =
                codec::encode(&*sm).map_err(|e| StorageIOError::read_state_machine(&io_err(e)))?;
            (data, sm.last_applied, sm.last_membership.clone())
        };
        let seq = self
            .snapshot_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, seq),
            None => format!("--{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        self.persist_snapshot(&stored).await?;
        *self.current.lock().expect("snapshot lock poisoned") = Some(stored);
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> SResult<(
        Option<LogId<NodeId>>,
        StoredMembership<NodeId, openraft::BasicNode>,
    )> {
        let sm = self.shared.sm.read().expect("state lock poisoned");
        Ok((sm.last_applied, sm.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> SResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut sm = self.shared.sm.write().expect("state lock poisoned");
        let mut out = Vec::new();
        for entry in entries {
            sm.last_applied = Some(entry.log_id);
            let resp = match entry.payload {
                EntryPayload::Blank => Response::Empty,
                EntryPayload::Normal(cmd) => {
                    // The proposer's request span logged this index.
                    tracing::debug!(
                        log_index = entry.log_id.index,
                        op = cmd.op.name(),
                        client_id = cmd.origin.as_ref().map(|o| o.client_id.as_str()),
                        seq = cmd.origin.as_ref().map(|o| o.seq),
                        "apply"
                    );
                    sm.state.apply(&cmd)
                }
                EntryPayload::Membership(m) => {
                    sm.last_membership = StoredMembership::new(Some(entry.log_id), m);
                    Response::Empty
                }
            };
            out.push(resp);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> SResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> SResult<()> {
        let data = snapshot.into_inner();
        let mut new_sm = decode_sm(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &io_err(e)))?;
        new_sm.last_applied = meta.last_log_id;
        new_sm.last_membership = meta.last_membership.clone();
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.persist_snapshot(&stored).await?;
        *self.shared.sm.write().expect("state lock poisoned") = new_sm;
        *self.current.lock().expect("snapshot lock poisoned") = Some(stored);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> SResult<Option<Snapshot<TypeConfig>>> {
        let current = self.current.lock().expect("snapshot lock poisoned");
        Ok(current.as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}
