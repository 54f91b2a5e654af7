//! The Raft store's file (`raft.log`): an append-only journal of the log
//! writer's operations, replayed at open.
//!
//! Why not a database: every fact the store keeps is in memory anyway
//! ([`crate::store`]), so the file only has to make operations durable in
//! order. A batch of operations is one `pwrite` into blocks that were zeroed
//! in advance, then one `fdatasync`. Overwriting written blocks leaves the
//! file's size and block map alone, so the sync writes the data and nothing
//! else: about half of what a redb commit cost here (5-6 scattered pages, a
//! header and a sync; docs/benchmarks-history.md), and a replicated put
//! waits for two of these flushes in series.
//!
//! Layout: a 16-byte file header naming the format (`crescent-rlog-v2`:
//! entries whose commands carry fixed tags, see [`crate::tagged`]), then batches, each at an 8-byte-aligned
//! offset: `len: u32`, `crc: u32`, then `len` bytes of records. The CRC
//! (crc32c) covers the batch's offset, its length and its records, so a
//! batch is valid only at the place it was written. Records are
//! `kind: u8`, `len: u32`, payload:
//! an entry (index, bytes), a truncation (from index), a purge (up to index,
//! the purged log id) or a named value (vote, committed hint, snapshot).
//!
//! Crashes: a batch is acknowledged only after its sync, so a crash can tear
//! at most the last write (one batch, or a few if a write was split at
//! [`BATCH_TARGET`]; any prefix of them may survive, which is only ever a
//! prefix of unacknowledged operations). Replay stops at the first batch that is not valid
//! and everything from there to the end of the file is zeroed (and synced)
//! before the journal is written again, so no remnant of a torn batch can
//! ever be read as data. A valid batch found *after* an invalid one cannot
//! come from a torn write (the region past the tail is always zero), so it
//! means the file was damaged in the middle: open refuses it rather than
//! silently drop synced, acknowledged entries.
//!
//! Batches are 8-byte aligned, so the next batch rewrites the sector that
//! holds the end of the last one (with the same bytes there). Like
//! PostgreSQL's and etcd's logs, this assumes a device writes a sector
//! atomically: old or new content, not a mix.
//!
//! The file is synced once at open, before it is read: a master killed
//! between a write and its sync may find that batch in the page cache, and
//! what it replays must be durable before it reports it to a leader.
//!
//! Space: the file grows in zeroed chunks; when most of it is dead (purged
//! or overwritten entries, old snapshots), the live records are written to a
//! new file that replaces the old one by rename. The copy runs on a thread
//! of its own, from the part of the file written before it started (which
//! no write touches again), while the writer goes on appending; the writer
//! then only carries over the batches it wrote meanwhile and renames. So a
//! compaction holds the writer up for that short catch-up, not for the
//! whole copy (0.3-0.9 s for a 64-107 MB file in a soak on a 2-vCPU VM,
//! when it ran on the writer: docs/benchmarks-history.md).
//!
//! After a failed write or sync the journal refuses every later write: the
//! kernel may have dropped the failed pages, so what is on disk is no longer
//! known, and only a restart (which replays what is really there) is safe.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The journal's file name in the data dir.
pub const FILE_NAME: &str = "raft.log";
/// Held (flock) while a journal is open: two masters on one data dir would
/// interleave their writes.
const LOCK_NAME: &str = "raft.lock";
/// The file's header: the format of its records and of the entries and
/// snapshots in them. A file of another format is refused, never misread.
const MAGIC: &[u8; 16] = b"crescent-rlog-v2";
/// The header of every format, before its version.
const MAGIC_FAMILY: &[u8] = b"crescent-rlog-v";
const BATCH_HEADER: usize = 8;
const ALIGN: u64 = 8;
/// The file grows by this much at a time, zero-filled and synced once.
const CHUNK: u64 = 16 << 20;
/// No compaction below this size: rewriting a small file buys nothing.
const COMPACT_MIN: u64 = 64 << 20;
/// A write of more records than this many bytes goes out as several
/// batches, so that neither a long write nor a compaction of a large live
/// set makes a batch whose length does not fit its header.
const BATCH_TARGET: usize = 64 << 20;
/// A compaction's copy carries over what the writer wrote meanwhile until
/// at most this much is left for the writer itself (in at most
/// [`CATCH_UP_ROUNDS`] rounds; a writer faster than the copy leaves more).
const CATCH_UP_ON_WRITER: u64 = 1 << 20;
const CATCH_UP_ROUNDS: usize = 8;

const KIND_ENTRY: u8 = 1;
const KIND_TRUNCATE: u8 = 2;
const KIND_PURGE: u8 = 3;
const KIND_META: u8 = 4;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is in use by another process (its lock {lock} is held)")]
    Locked { path: String, lock: String },
    #[error("{path} is damaged: {reason}")]
    Corrupt { path: String, reason: String },
    #[error(
        "{path} is a raft log of format v{found}, and this build reads format v{ours} only: \
         run the build that wrote it, or start a new cluster of this build (emptying one \
         master's data dir under the same node id would forget its vote; see \
         docs/operations.md, Upgrading)"
    )]
    OtherFormat {
        path: String,
        found: String,
        ours: String,
    },
    #[error("the raft log is unusable after an earlier failed write; restart the master")]
    Failed,
    #[error("a raft log record of {bytes} bytes is larger than the 4 GiB a record can hold")]
    TooLarge { bytes: u64 },
}

/// One operation of a batch, in the order it is applied at replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// Log entry `index`, encoded (replaces an entry of that index).
    Entry(u64, &'a [u8]),
    /// Removes the entries from this index on.
    TruncateFrom(u64),
    /// Removes the entries up to this index and records the purged log id.
    PurgeUpTo(u64, &'a [u8]),
    /// Sets a named value (vote, committed hint, snapshot).
    Meta(&'a str, &'a [u8]),
}

/// What a replay found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Contents {
    pub entries: BTreeMap<u64, Vec<u8>>,
    pub metas: BTreeMap<String, Vec<u8>>,
    /// The payload of the last purge, if any (also the `purged_key` meta).
    pub purged_up_to: Option<u64>,
}

impl Contents {
    fn apply(&mut self, purged_key: &str, rec: Record<'_>) {
        match rec {
            Record::Entry(index, bytes) => {
                self.entries.insert(index, bytes.to_vec());
            }
            Record::TruncateFrom(from) => {
                self.entries.split_off(&from);
            }
            Record::PurgeUpTo(upto, purged) => {
                self.entries = match upto.checked_add(1) {
                    Some(next) => self.entries.split_off(&next),
                    None => BTreeMap::new(),
                };
                self.metas.insert(purged_key.to_string(), purged.to_vec());
                self.purged_up_to = Some(upto);
            }
            Record::Meta(key, value) => {
                self.metas.insert(key.to_string(), value.to_vec());
            }
        }
    }
}

/// Sizes of what is live, to tell when the file is mostly dead.
#[derive(Default)]
struct LiveSizes {
    entries: BTreeMap<u64, u64>,
    entry_bytes: u64,
    metas: BTreeMap<String, u64>,
}

impl LiveSizes {
    fn from_contents(c: &Contents) -> Self {
        let entries: BTreeMap<u64, u64> = c
            .entries
            .iter()
            .map(|(i, v)| (*i, v.len() as u64 + 13))
            .collect();
        LiveSizes {
            entry_bytes: entries.values().sum(),
            entries,
            metas: c
                .metas
                .iter()
                .map(|(k, v)| (k.clone(), (k.len() + v.len()) as u64 + 6))
                .collect(),
        }
    }

    fn apply(&mut self, purged_key: &str, rec: &Record<'_>) {
        match *rec {
            Record::Entry(index, bytes) => {
                let size = bytes.len() as u64 + 13;
                if let Some(old) = self.entries.insert(index, size) {
                    self.entry_bytes -= old;
                }
                self.entry_bytes += size;
            }
            Record::TruncateFrom(from) => {
                let gone = self.entries.split_off(&from);
                self.entry_bytes -= gone.values().sum::<u64>();
            }
            Record::PurgeUpTo(upto, purged) => {
                let kept = match upto.checked_add(1) {
                    Some(next) => self.entries.split_off(&next),
                    None => BTreeMap::new(),
                };
                let gone = std::mem::replace(&mut self.entries, kept);
                self.entry_bytes -= gone.values().sum::<u64>();
                self.metas.insert(
                    purged_key.to_string(),
                    (purged_key.len() + purged.len()) as u64 + 6,
                );
            }
            Record::Meta(key, value) => {
                self.metas
                    .insert(key.to_string(), (key.len() + value.len()) as u64 + 6);
            }
        }
    }

    fn total(&self) -> u64 {
        self.entry_bytes + self.metas.values().sum::<u64>()
    }
}

/// The open journal. Only the store's writer thread holds it.
pub struct Journal {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    /// Held for the journal's lifetime (the flock goes with it).
    _lock: DirLock,
    /// Where the next batch goes.
    tail: u64,
    /// The file's length: everything from `tail` to here is zero.
    zeroed_to: u64,
    live: LiveSizes,
    purged_key: String,
    failed: bool,
    /// The file grows by this much at a time ([`CHUNK`]; smaller in tests).
    chunk: u64,
    /// No compaction below this tail ([`COMPACT_MIN`]; smaller in tests),
    /// nor below `next_compaction_at` (raised after a failed attempt).
    compact_min: u64,
    next_compaction_at: u64,
    /// How many compactions this journal has made (for tests and logs).
    compactions: u64,
    /// The compaction whose copy is running, if any.
    compacting: Option<Compaction>,
    /// `tail` as of the last successful write, for a running compaction's
    /// copy: everything below it is written, synced and never written again.
    synced_tail: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// How much a compaction's copy leaves for the writer to carry over
    /// ([`CATCH_UP_ON_WRITER`]; tests set it to 0).
    leave_for_writer: u64,
    /// Bytes of batches the writer itself carried over at the last switch.
    last_writer_carry: u64,
    /// Tests: the copy thread waits for a message here between the copy
    /// and its catch-up, so that a test can write while it runs.
    #[cfg(test)]
    hold_copy: Option<std::sync::mpsc::Receiver<()>>,
}

/// A compaction whose copy runs on its own thread: the live records of the
/// file's first `upto` bytes, written to the temporary file. Nothing below
/// `upto` is written again while it runs (the writer only appends, and
/// zeroes past its tail).
struct Compaction {
    upto: u64,
    copy: std::thread::JoinHandle<Result<Copied, JournalError>>,
}

/// How far a compaction's copy got.
struct Copied {
    /// The journal's batches up to here are in the new file.
    from: u64,
    tmp: TempFile,
    /// How long the copy and its catch-up rounds took.
    took: std::time::Duration,
}

/// Where the new file's batches end, and its length (zero past them, as
/// the writer keeps its file).
#[derive(Clone, Copy)]
struct TempFile {
    tail: u64,
    len: u64,
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

fn batch_crc(offset: u64, records: &[u8]) -> u32 {
    let mut crc = crc32c::crc32c(&offset.to_le_bytes());
    crc = crc32c::crc32c_append(crc, &(records.len() as u32).to_le_bytes());
    crc32c::crc32c_append(crc, records)
}

/// Appends `rec` to a batch body.
fn encode_record(body: &mut Vec<u8>, rec: &Record<'_>) -> Result<(), JournalError> {
    let start = body.len();
    let kind = match rec {
        Record::Entry(..) => KIND_ENTRY,
        Record::TruncateFrom(_) => KIND_TRUNCATE,
        Record::PurgeUpTo(..) => KIND_PURGE,
        Record::Meta(..) => KIND_META,
    };
    body.push(kind);
    body.extend_from_slice(&[0; 4]);
    match *rec {
        Record::Entry(index, bytes) => {
            body.extend_from_slice(&index.to_le_bytes());
            body.extend_from_slice(bytes);
        }
        Record::TruncateFrom(from) => body.extend_from_slice(&from.to_le_bytes()),
        Record::PurgeUpTo(upto, purged) => {
            body.extend_from_slice(&upto.to_le_bytes());
            body.extend_from_slice(purged);
        }
        Record::Meta(key, value) => {
            // Keys are the store's own short constants.
            let key = &key.as_bytes()[..key.len().min(255)];
            body.push(key.len() as u8);
            body.extend_from_slice(key);
            body.extend_from_slice(value);
        }
    }
    let payload_len = body.len() - start - 5;
    let Ok(len) = u32::try_from(payload_len) else {
        body.truncate(start);
        return Err(JournalError::TooLarge {
            bytes: payload_len as u64,
        });
    };
    body[start + 1..start + 5].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Appends one batch holding `body` to `out`, whose first byte goes to
/// file offset `base`.
fn seal_batch(out: &mut Vec<u8>, base: u64, body: &[u8]) -> Result<(), JournalError> {
    let len = u32::try_from(body.len()).map_err(|_| JournalError::TooLarge {
        bytes: body.len() as u64,
    })?;
    let offset = base + out.len() as u64;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&batch_crc(offset, body).to_le_bytes());
    out.extend_from_slice(body);
    out.resize(align_up(out.len() as u64) as usize, 0);
    Ok(())
}

/// Encodes `records` as batches to be written at `offset`: one, unless they
/// exceed [`BATCH_TARGET`] bytes.
fn encode_batches(offset: u64, records: &[Record<'_>]) -> Result<Vec<u8>, JournalError> {
    let mut out = Vec::new();
    let mut body = Vec::new();
    for rec in records {
        encode_record(&mut body, rec)?;
        if body.len() >= BATCH_TARGET {
            seal_batch(&mut out, offset, &body)?;
            body.clear();
        }
    }
    if !body.is_empty() {
        seal_batch(&mut out, offset, &body)?;
    }
    Ok(out)
}

/// Decodes a valid batch's records; `None` if they do not parse (damage
/// that happens to match the CRC is not assumed, but is refused anyway).
fn decode_records(body: &[u8]) -> Option<Vec<Record<'_>>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < body.len() {
        let kind = *body.get(at)?;
        let len = u32::from_le_bytes(body.get(at + 1..at + 5)?.try_into().ok()?) as usize;
        let payload = body.get(at + 5..(at + 5).checked_add(len)?)?;
        at += 5 + len;
        let u64_at =
            |p: &[u8]| -> Option<u64> { Some(u64::from_le_bytes(p.get(..8)?.try_into().ok()?)) };
        out.push(match kind {
            KIND_ENTRY => Record::Entry(u64_at(payload)?, &payload[8..]),
            KIND_TRUNCATE => Record::TruncateFrom(u64_at(payload)?),
            KIND_PURGE => Record::PurgeUpTo(u64_at(payload)?, &payload[8..]),
            KIND_META => {
                let klen = *payload.first()? as usize;
                let key = std::str::from_utf8(payload.get(1..1 + klen)?).ok()?;
                Record::Meta(key, &payload[1 + klen..])
            }
            _ => return None,
        });
    }
    Some(out)
}

/// The records of the valid batch at `at` (its body), or why they do not
/// parse: damage that happens to match the CRC is not assumed, but is
/// refused anyway.
fn records_of_batch<'a>(
    body: &'a [u8],
    at: u64,
    path: &Path,
) -> Result<Vec<Record<'a>>, JournalError> {
    decode_records(body).ok_or_else(|| JournalError::Corrupt {
        path: path.display().to_string(),
        reason: format!("batch at offset {at} has a valid checksum but does not parse"),
    })
}

/// The batch at file offset `offset`, if one is valid there, in `data`,
/// which holds the file from offset `base` on: its records' bytes and the
/// offset after it.
fn batch_at(data: &[u8], base: u64, offset: u64) -> Option<(&[u8], u64)> {
    let start = usize::try_from(offset.checked_sub(base)?).ok()?;
    let header = data.get(start..start.checked_add(BATCH_HEADER)?)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as u64;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len == 0 {
        return None;
    }
    let body_start = start + BATCH_HEADER;
    let body = data.get(body_start..body_start.checked_add(len as usize)?)?;
    if batch_crc(offset, body) != crc {
        return None;
    }
    Some((body, align_up(offset + BATCH_HEADER as u64 + len)))
}

/// Replays `data` (a whole journal file). Returns what it holds and where
/// the valid batches end.
fn replay(data: &[u8], purged_key: &str, path: &Path) -> Result<(Contents, u64), JournalError> {
    let corrupt = |reason: String| JournalError::Corrupt {
        path: path.display().to_string(),
        reason,
    };
    if data.len() < MAGIC.len() || &data[..MAGIC.len()] != MAGIC {
        if data.starts_with(MAGIC_FAMILY) && data.len() >= MAGIC.len() {
            return Err(JournalError::OtherFormat {
                path: path.display().to_string(),
                found: String::from_utf8_lossy(&data[MAGIC_FAMILY.len()..MAGIC.len()]).into(),
                ours: String::from_utf8_lossy(&MAGIC[MAGIC_FAMILY.len()..]).into(),
            });
        }
        return Err(corrupt("not a Crescent raft log (bad file header)".into()));
    }
    let mut contents = Contents::default();
    let mut at = MAGIC.len() as u64;
    while let Some((body, next)) = batch_at(data, 0, at) {
        for rec in records_of_batch(body, at, path)? {
            contents.apply(purged_key, rec);
        }
        at = next;
    }
    // Nothing valid may follow: past the tail the file is kept zero, so only
    // damage can put a valid batch there.
    let mut probe = at + ALIGN;
    while probe + BATCH_HEADER as u64 <= data.len() as u64 {
        let p = probe as usize;
        if data[p..p + 4] != [0, 0, 0, 0] && batch_at(data, 0, probe).is_some() {
            return Err(corrupt(format!(
                "the batch at offset {at} is unreadable but a valid one follows at {probe}: \
                 the file was damaged, not torn by a crash; replace this master (README, \
                 Operations)"
            )));
        }
        probe += ALIGN;
    }
    Ok((contents, at))
}

/// The exclusive lock on a data dir's journal (an flock on `raft.lock`,
/// released when this is dropped or the process dies). Taken before anything
/// in the dir is read or written, migration included.
pub struct DirLock {
    _file: File,
}

/// Locks `dir`'s journal, or says who holds it.
pub fn lock_dir(dir: &Path) -> Result<DirLock, JournalError> {
    let lock_path = dir.join(LOCK_NAME);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_error(&lock_path))?;
    match file.try_lock() {
        Ok(()) => Ok(DirLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(JournalError::Locked {
            path: dir.join(FILE_NAME).display().to_string(),
            lock: lock_path.display().to_string(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(io_error(&lock_path)(e)),
    }
}

impl Journal {
    /// Opens (or creates) the journal in `dir`, locked by `lock`, and
    /// replays it. `purged_key` is the name under which a purge's log id is
    /// kept among the values.
    pub fn open(
        lock: DirLock,
        dir: &Path,
        purged_key: &str,
    ) -> Result<(Journal, Contents), JournalError> {
        Self::open_tuned(lock, dir, purged_key, CHUNK, COMPACT_MIN)
    }

    /// [`Journal::open`], growing the file `chunk` bytes at a time and
    /// compacting from `compact_min` bytes on.
    fn open_tuned(
        lock: DirLock,
        dir: &Path,
        purged_key: &str,
        chunk: u64,
        compact_min: u64,
    ) -> Result<(Journal, Contents), JournalError> {
        let path = dir.join(FILE_NAME);
        // A compaction that failed or crashed before its rename leaves this.
        let _ = std::fs::remove_file(temp_path(dir));
        if !path.exists() {
            write_fresh(dir, &path, &Contents::default(), purged_key)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error(&path))?;
        // What the page cache holds of a batch written but not synced before
        // a kill is durable from here on, before it is replayed.
        file.sync_all().map_err(io_error(&path))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io_error(&path))?;
        let (contents, tail) = replay(&data, purged_key, &path)?;
        let len = data.len() as u64;
        // Past the tail only a torn write can have left anything.
        let dirty_to = data[tail as usize..]
            .iter()
            .rposition(|b| *b != 0)
            .map_or(tail, |i| align_up(tail + i as u64 + 1));
        drop(data);
        let mut journal = Journal {
            dir: dir.to_path_buf(),
            path,
            file,
            _lock: lock,
            tail,
            zeroed_to: tail,
            live: LiveSizes::from_contents(&contents),
            purged_key: purged_key.to_string(),
            failed: false,
            chunk,
            compact_min,
            next_compaction_at: 0,
            compactions: 0,
            compacting: None,
            synced_tail: std::sync::Arc::new(tail.into()),
            leave_for_writer: CATCH_UP_ON_WRITER,
            last_writer_carry: 0,
            #[cfg(test)]
            hold_copy: None,
        };
        // Whatever a torn write left past the tail becomes zero (synced
        // before anything is written after it), and the file is grown to a
        // whole number of chunks of written zeros.
        if dirty_to > tail {
            tracing::warn!(
                path = %journal.path.display(),
                tail,
                torn_bytes = dirty_to - tail,
                "raft log: dropping a write torn by a crash (never acknowledged)"
            );
            journal.zero(tail, dirty_to)?;
        }
        journal.zeroed_to = journal.zeroed_to.max(len);
        let end = len.div_ceil(chunk).max(1) * chunk;
        if end > journal.zeroed_to {
            journal.zero(journal.zeroed_to, end)?;
        }
        Ok((journal, contents))
    }

    /// Writes zeros over `[from, to)`, syncs, and records `to` as the end.
    fn zero(&mut self, from: u64, to: u64) -> Result<(), JournalError> {
        let zeros = vec![0u8; 1 << 20];
        let mut at = from;
        while at < to {
            let n = (to - at).min(zeros.len() as u64) as usize;
            self.file
                .write_all_at(&zeros[..n], at)
                .map_err(io_error(&self.path))?;
            at += n as u64;
        }
        // The size changed (maybe): a full sync, for the metadata too.
        self.file.sync_all().map_err(io_error(&self.path))?;
        self.zeroed_to = self.zeroed_to.max(to);
        Ok(())
    }

    /// Makes `records` durable, in order: one write and one sync. Nothing
    /// of a write that returns an error may be relied on. After a failed
    /// write or sync the journal refuses every later write; a record too
    /// large, or a failure to grow the file, changes nothing.
    pub fn write(&mut self, records: &[Record<'_>]) -> Result<(), JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        if records.is_empty() {
            return Ok(());
        }
        let batches = encode_batches(self.tail, records)?;
        let end = self.tail + batches.len() as u64;
        if end > self.zeroed_to {
            // Nothing of the batches is written yet: a failure here (a full
            // disk) leaves the journal as it was.
            let to = end.div_ceil(self.chunk) * self.chunk;
            self.zero(self.zeroed_to, to)?;
        }
        let written = self
            .file
            .write_all_at(&batches, self.tail)
            // Blocks already written and a size that does not change: the
            // data sync needs no metadata.
            .and_then(|()| self.file.sync_data());
        if let Err(source) = written {
            self.failed = true;
            return Err(io_error(&self.path)(source));
        }
        for rec in records {
            self.live.apply(&self.purged_key, rec);
        }
        self.tail = end;
        self.synced_tail
            .store(end, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Compacts the file once it is mostly dead: starts the copy of its live
    /// records on a thread, or, when a copy has finished, carries over what
    /// was written since and puts the new file in place. Returns whether a
    /// new file was put in place. Called by the writer between batches.
    /// A failure before the new file replaces the old one changes nothing
    /// (the next attempt waits for the file to grow further); a failure
    /// after it, or damage found in the file, leaves the journal refusing
    /// writes.
    pub fn compact_if_worth_it(&mut self) -> Result<bool, JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        match &self.compacting {
            Some(running) if running.copy.is_finished() => self.finish_compaction(),
            Some(_) => Ok(false),
            None => {
                if self.tail >= self.compact_min.max(self.next_compaction_at)
                    && self.tail >= 4 * self.live.total()
                {
                    self.start_compaction()?;
                }
                Ok(false)
            }
        }
    }

    /// Starts copying the live records of the file's first `tail` bytes to
    /// the temporary file, on a thread.
    fn start_compaction(&mut self) -> Result<(), JournalError> {
        let upto = self.tail;
        let spawned = self.file.try_clone().and_then(|file| {
            let (path, tmp, key, chunk) = (
                self.path.clone(),
                temp_path(&self.dir),
                self.purged_key.clone(),
                self.chunk,
            );
            let synced_tail = self.synced_tail.clone();
            let leave = self.leave_for_writer;
            #[cfg(test)]
            let hold = self.hold_copy.take();
            std::thread::Builder::new()
                .name("raft-log-compact".into())
                .spawn(move || {
                    let started = std::time::Instant::now();
                    let copied = copy_live(&file, &path, upto, &tmp, &key, chunk)?;
                    #[cfg(test)]
                    if let Some(hold) = hold {
                        let _ = hold.recv();
                    }
                    let synced = (&*synced_tail, leave);
                    let caught_up = catch_up(&file, &path, upto, synced, &tmp, copied, chunk)?;
                    Ok(Copied {
                        took: started.elapsed(),
                        ..caught_up
                    })
                })
        });
        match spawned {
            Ok(copy) => {
                self.compacting = Some(Compaction { upto, copy });
                Ok(())
            }
            Err(e) => {
                self.next_compaction_at = self.tail + self.compact_min;
                Err(io_error(&self.path)(e))
            }
        }
    }

    /// Waits for the running compaction's copy, appends to the new file the
    /// batches written since the copy began, and puts it in place.
    fn finish_compaction(&mut self) -> Result<bool, JournalError> {
        let Some(running) = self.compacting.take() else {
            return Ok(false);
        };
        let tmp = temp_path(&self.dir);
        let copied = running.copy.join().unwrap_or_else(|_| {
            Err(JournalError::Io {
                path: tmp.display().to_string(),
                source: std::io::Error::other("the compaction thread panicked"),
            })
        });
        let paused = std::time::Instant::now();
        let ready = copied.and_then(|copy| {
            let to = self.tail;
            let carried = to.saturating_sub(copy.from);
            carry_over(
                &self.file, &self.path, copy.from, to, &tmp, copy.tmp, self.chunk,
            )
            .map(|new_file| (new_file.tail, copy.took, carried))
        });
        let (new_tail, copy_took, writer_carried) = match ready {
            Ok(done) => done,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                if matches!(e, JournalError::Corrupt { .. }) {
                    self.failed = true;
                } else {
                    self.next_compaction_at = self.tail + self.compact_min;
                }
                return Err(e);
            }
        };
        let before = self.tail;
        self.last_writer_carry = writer_carried;
        if let Err(e) = self.install(&tmp, new_tail) {
            self.failed = true;
            return Err(e);
        }
        tracing::info!(
            before,
            copy_began_at = running.upto,
            after = self.tail,
            ?copy_took,
            writer_carried,
            writer_paused = ?paused.elapsed(),
            "raft log compacted"
        );
        Ok(true)
    }

    /// Puts the compacted file `tmp`, whose batches end at `tail`, in place
    /// of the journal and writes on in it. What is live does not change.
    fn install(&mut self, tmp: &Path, tail: u64) -> Result<(), JournalError> {
        replace_with(tmp, &self.path, &self.dir)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(io_error(&self.path))?;
        let len = file.metadata().map_err(io_error(&self.path))?.len();
        let old = std::mem::replace(&mut self.file, file);
        // The old file's last close frees its blocks (tens of ms for a
        // 64 MiB file here): not on the writer. Should the thread not
        // start, the closure, and the file with it, is dropped right here.
        let _ = std::thread::Builder::new()
            .name("raft-log-release".into())
            .spawn(move || drop(old));
        self.tail = tail;
        self.synced_tail
            .store(tail, std::sync::atomic::Ordering::Release);
        self.zeroed_to = len.max(tail);
        self.next_compaction_at = 0;
        self.compactions += 1;
        let end = self.zeroed_to.div_ceil(self.chunk).max(1) * self.chunk;
        if end > self.zeroed_to {
            self.zero(self.zeroed_to, end)?;
        }
        Ok(())
    }

    /// Waits for a running compaction and finishes it (tests).
    #[cfg(test)]
    fn settle(&mut self) -> Result<bool, JournalError> {
        match &self.compacting {
            Some(_) => self.finish_compaction(),
            None => Ok(false),
        }
    }

    /// Bytes from the file's start to the next batch.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// How many compactions this journal has made.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Bytes of batches the writer carried over itself at the last switch
    /// to a compacted file (the copy's thread carried the rest).
    pub fn last_writer_carry(&self) -> u64 {
        self.last_writer_carry
    }

    /// The file's length: it is zero from the tail to here.
    pub fn zeroed_len(&self) -> u64 {
        self.zeroed_to
    }
}

impl Drop for Journal {
    /// A running compaction's copy is waited for, so that it never writes
    /// the temporary file after the lock is gone (a new journal on the dir
    /// may be compacting to it), and its file is removed.
    fn drop(&mut self) {
        if let Some(running) = self.compacting.take() {
            let _ = running.copy.join();
            let _ = std::fs::remove_file(temp_path(&self.dir));
        }
    }
}

/// The compaction thread's copy: replays the first `upto` bytes of the
/// journal file and writes their live records to `tmp`, followed by zeros
/// up to a chunk boundary at least some way past them (so that the
/// writer's catch-up and first writes in the new file overwrite zeroed
/// blocks, as always), synced. Returns where the batches end and the
/// file's length.
fn copy_live(
    file: &File,
    path: &Path,
    upto: u64,
    tmp: &Path,
    purged_key: &str,
    chunk: u64,
) -> Result<TempFile, JournalError> {
    let mut data = vec![0u8; upto as usize];
    file.read_exact_at(&mut data, 0).map_err(io_error(path))?;
    let (contents, end) = replay(&data, purged_key, path)?;
    if end != upto {
        return Err(JournalError::Corrupt {
            path: path.display().to_string(),
            reason: format!("replay ends at {end}, the writer was at {upto}"),
        });
    }
    drop(data);
    let (tail, len) = write_temp(tmp, &contents, purged_key, |tail| {
        (tail / chunk + 1) * chunk
    })?;
    Ok(TempFile { tail, len })
}

/// The copy thread's catch-up: carries into the new file what the writer
/// has synced since `from` (`synced.0`, the writer's synced tail), in
/// rounds, until at most `synced.1` bytes are left, few enough for the
/// writer to carry over itself without a noticeable pause.
fn catch_up(
    file: &File,
    path: &Path,
    mut from: u64,
    synced: (&std::sync::atomic::AtomicU64, u64),
    tmp: &Path,
    mut new_file: TempFile,
    chunk: u64,
) -> Result<Copied, JournalError> {
    for _ in 0..CATCH_UP_ROUNDS {
        let to = synced.0.load(std::sync::atomic::Ordering::Acquire);
        if to.saturating_sub(from) <= synced.1 {
            break;
        }
        new_file = carry_over(file, path, from, to, tmp, new_file, chunk)?;
        from = to;
    }
    Ok(Copied {
        from,
        tmp: new_file,
        took: std::time::Duration::ZERO,
    })
}

/// Appends to the new file `tmp` the journal's batches from `from` to `to`
/// (all written and synced), re-sealed for their new offsets, and syncs it.
/// A file that has to grow grows by zeroed `chunk`s, as the journal does.
fn carry_over(
    file: &File,
    path: &Path,
    from: u64,
    to: u64,
    tmp: &Path,
    new_file: TempFile,
    chunk: u64,
) -> Result<TempFile, JournalError> {
    if from >= to {
        return Ok(new_file);
    }
    let corrupt = |reason: String| JournalError::Corrupt {
        path: path.display().to_string(),
        reason,
    };
    let mut data = vec![0u8; (to - from) as usize];
    file.read_exact_at(&mut data, from)
        .map_err(io_error(path))?;
    let mut records = Vec::new();
    let mut at = from;
    while at < to {
        let (body, next) = batch_at(&data, from, at)
            .filter(|(_, next)| *next <= to)
            .ok_or_else(|| {
                corrupt(format!(
                    "no valid batch at {at}, below the writer's tail {to}"
                ))
            })?;
        records.extend(records_of_batch(body, at, path)?);
        at = next;
    }
    let mut batches = encode_batches(new_file.tail, &records)?;
    let end = new_file.tail + batches.len() as u64;
    let len = if end > new_file.len {
        (end / chunk + 1) * chunk
    } else {
        new_file.len
    };
    if len > new_file.len {
        // Past `end` only the grown part needs zeros: the rest already is.
        batches.resize((len - new_file.tail) as usize, 0);
    }
    let out = OpenOptions::new()
        .write(true)
        .open(tmp)
        .map_err(io_error(tmp))?;
    out.write_all_at(&batches, new_file.tail)
        .map_err(io_error(tmp))?;
    if len > new_file.len {
        // The file grew: a full sync, for its size too.
        out.sync_all().map_err(io_error(tmp))?;
    } else {
        out.sync_data().map_err(io_error(tmp))?;
    }
    Ok(TempFile { tail: end, len })
}

/// Where the valid batches of the journal in `dir` end: the offset a torn
/// write would start at. For tools and tests that look at a stopped
/// master's log: it takes no lock and changes nothing.
pub fn valid_end(dir: &Path) -> Result<u64, JournalError> {
    let path = dir.join(FILE_NAME);
    let data = std::fs::read(&path).map_err(io_error(&path))?;
    replay(&data, "", &path).map(|(_, end)| end)
}

fn temp_path(dir: &Path) -> PathBuf {
    dir.join(format!("{FILE_NAME}.new"))
}

/// Writes `contents` as a whole journal file at `tmp`, zero-filled up to
/// `length(where its batches end)`, synced. Returns where its batches end
/// and its length.
fn write_temp(
    tmp: &Path,
    contents: &Contents,
    purged_key: &str,
    length: impl Fn(u64) -> u64,
) -> Result<(u64, u64), JournalError> {
    let mut records: Vec<Record<'_>> = Vec::new();
    // The purge first (it also sets its value), then the other values and
    // the entries: replaying these gives back `contents`.
    if let (Some(upto), Some(purged)) = (contents.purged_up_to, contents.metas.get(purged_key)) {
        records.push(Record::PurgeUpTo(upto, purged));
    }
    for (k, v) in &contents.metas {
        if k != purged_key || contents.purged_up_to.is_none() {
            records.push(Record::Meta(k, v));
        }
    }
    for (i, v) in &contents.entries {
        records.push(Record::Entry(*i, v));
    }
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&encode_batches(MAGIC.len() as u64, &records)?);
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(tmp)
        .map_err(io_error(tmp))?;
    let tail = out.len() as u64;
    out.resize(length(tail).max(tail) as usize, 0);
    file.write_all_at(&out, 0).map_err(io_error(tmp))?;
    file.sync_all().map_err(io_error(tmp))?;
    Ok((tail, out.len() as u64))
}

/// Renames `tmp` over `path` and syncs the directory, so the rename is
/// durable before anything is written to the new file.
fn replace_with(tmp: &Path, path: &Path, dir: &Path) -> Result<(), JournalError> {
    std::fs::rename(tmp, path).map_err(io_error(path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))
}

/// Writes `contents` as a new journal at `path`, atomically: a temporary
/// file, synced, renamed over `path`, and the directory synced. The caller
/// holds the dir's lock.
pub fn write_fresh(
    dir: &Path,
    path: &Path,
    contents: &Contents,
    purged_key: &str,
) -> Result<(), JournalError> {
    let tmp = temp_path(dir);
    write_temp(&tmp, contents, purged_key, |tail| tail)?;
    replace_with(&tmp, path, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PURGED: &str = "last_purged";

    #[test]
    fn the_header_names_the_codec_format() {
        let version = &MAGIC[MAGIC_FAMILY.len()..];
        assert_eq!(version, crate::codec::FORMAT_VERSION.as_bytes());
    }

    #[test]
    fn a_journal_of_another_format_is_refused_by_name() {
        let mut old = b"crescent-rlog-v1".to_vec();
        old.resize(4096, 0);
        let err = replay(&old, PURGED, Path::new("raft.log")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("format v1") && text.contains("format v2"),
            "{text}"
        );
    }

    /// Small chunks: each open of a new file zeroes one.
    const TEST_CHUNK: u64 = 256 << 10;

    fn open(dir: &Path) -> (Journal, Contents) {
        open_compacting_from(dir, COMPACT_MIN)
    }

    fn open_compacting_from(dir: &Path, compact_min: u64) -> (Journal, Contents) {
        let lock = lock_dir(dir).expect("lock");
        Journal::open_tuned(lock, dir, PURGED, TEST_CHUNK, compact_min).expect("open journal")
    }

    /// Everything past the journal's tail is zero.
    fn zero_past_tail(dir: &Path, j: &Journal) -> bool {
        let img = std::fs::read(dir.join(FILE_NAME)).unwrap();
        img[j.tail() as usize..].iter().all(|b| *b == 0)
    }

    fn file_len(dir: &Path) -> u64 {
        std::fs::metadata(dir.join(FILE_NAME)).unwrap().len()
    }

    /// The end of the batch at `offset` of a file image, without its padding:
    /// a crash that cuts only padding (zeros anyway) tears nothing.
    fn unpadded_end(img: &[u8], offset: u64) -> u64 {
        let at = offset as usize;
        let len = u32::from_le_bytes(img[at..at + 4].try_into().unwrap());
        offset + BATCH_HEADER as u64 + u64::from(len)
    }

    /// A model of what the journal must give back, fed the same records.
    fn model(records: &[Record<'_>]) -> Contents {
        let mut c = Contents::default();
        for r in records {
            c.apply(PURGED, *r);
        }
        c
    }

    #[test]
    fn records_come_back_in_order_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let batches: Vec<Vec<Record<'static>>> = vec![
            vec![
                Record::Meta("vote", b"v1"),
                Record::Entry(1, b"one"),
                Record::Entry(2, b"two"),
            ],
            vec![
                Record::Entry(3, b"three"),
                Record::TruncateFrom(3),
                Record::Entry(3, b"THREE"),
            ],
            vec![Record::PurgeUpTo(1, b"p1"), Record::Meta("vote", b"v2")],
        ];
        {
            let (mut j, c) = open(dir.path());
            assert_eq!(c, Contents::default());
            for b in &batches {
                j.write(b).unwrap();
            }
        }
        let all: Vec<Record<'_>> = batches.iter().flatten().copied().collect();
        let (_j, c) = open(dir.path());
        assert_eq!(c, model(&all));
        assert_eq!(c.entries.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(c.entries[&3], b"THREE");
        assert_eq!(c.metas["vote"], b"v2");
        assert_eq!(c.metas[PURGED], b"p1");
        assert_eq!(file_len(dir.path()) % TEST_CHUNK, 0);
    }

    #[test]
    fn a_second_open_of_the_same_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = open(dir.path());
        match lock_dir(dir.path()) {
            Err(JournalError::Locked { .. }) => {}
            Err(e) => panic!("expected Locked, got {e}"),
            Ok(_) => panic!("a second lock of a held journal succeeded"),
        }
        drop(j);
        assert!(
            lock_dir(dir.path()).is_ok(),
            "the lock goes with the journal"
        );
    }

    /// A crash can leave any prefix of the last batch's bytes on disk (and,
    /// since blocks may land out of order, any subset of its blocks). Every
    /// such file must reopen to exactly the synced batches, and later writes
    /// must come back too (the torn bytes are zeroed, never read as data).
    #[test]
    fn a_torn_last_batch_is_dropped_whole_and_never_read_later() {
        let dir = tempfile::tempdir().unwrap();
        let synced: Vec<Record<'static>> = vec![Record::Entry(1, b"a"), Record::Meta("vote", b"x")];
        let big = vec![7u8; 10_000];
        let torn_records = vec![
            Record::Entry(2, &big[..]),
            Record::Entry(3, b"b"),
            Record::Entry(4, b"c"),
        ];
        let (tail_before, tail_after, image) = {
            let (mut j, _) = open(dir.path());
            j.write(&synced).unwrap();
            let before = j.tail();
            j.write(&torn_records).unwrap();
            let after = j.tail();
            drop(j);
            (
                before,
                after,
                std::fs::read(dir.path().join(FILE_NAME)).unwrap(),
            )
        };
        assert!(tail_after > tail_before);
        let torn_len = (unpadded_end(&image, tail_before) - tail_before) as usize;
        let cuts = [1usize, 7, 8, 9, 100, 4096, torn_len - 1];
        for (case, cut) in cuts.iter().enumerate() {
            // Keep `cut` bytes of the torn batch; the rest reads as zeros,
            // except in odd cases where only the batch's tail made it.
            let mut img = image.clone();
            let start = tail_before as usize;
            if case % 2 == 0 {
                img[start + cut..start + torn_len].fill(0);
            } else {
                img[start..start + cut].fill(0);
            }
            std::fs::write(dir.path().join(FILE_NAME), &img).unwrap();
            let (mut j, c) = open(dir.path());
            assert_eq!(c, model(&synced), "cut {cut} (case {case})");
            assert!(
                zero_past_tail(dir.path(), &j),
                "torn bytes left past the tail"
            );
            assert_eq!(j.tail(), tail_before);
            // A shorter batch now, then reopen: only it follows the synced one.
            j.write(&[Record::Entry(2, b"short")]).unwrap();
            drop(j);
            let (_j, c) = open(dir.path());
            let mut expect = synced.clone();
            expect.push(Record::Entry(2, b"short"));
            assert_eq!(c, model(&expect), "after a new write, cut {cut}");
        }
    }

    #[test]
    fn damage_before_synced_batches_is_refused_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let first_at = {
            let (mut j, _) = open(dir.path());
            let at = j.tail();
            j.write(&[Record::Entry(1, b"first")]).unwrap();
            j.write(&[Record::Entry(2, b"second")]).unwrap();
            at
        };
        let mut img = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
        // Flip a byte of the first batch's records: the second batch is
        // still valid.
        img[first_at as usize + BATCH_HEADER + 2] ^= 0xff;
        std::fs::write(dir.path().join(FILE_NAME), &img).unwrap();
        match Journal::open(lock_dir(dir.path()).unwrap(), dir.path(), PURGED) {
            Err(JournalError::Corrupt { reason, .. }) => {
                assert!(reason.contains("a valid one follows"), "{reason}")
            }
            Err(e) => panic!("expected Corrupt, got {e}"),
            Ok(_) => panic!("a journal damaged in the middle opened"),
        }
        // A file that is not a journal at all.
        std::fs::write(dir.path().join(FILE_NAME), b"hello").unwrap();
        match Journal::open(lock_dir(dir.path()).unwrap(), dir.path(), PURGED) {
            Err(JournalError::Corrupt { reason, .. }) => {
                assert!(reason.contains("bad file header"), "{reason}")
            }
            Err(e) => panic!("expected Corrupt, got {e}"),
            Ok(_) => panic!("a file that is not a journal opened"),
        }
    }

    #[test]
    fn a_mostly_dead_file_is_compacted_to_its_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let value = vec![3u8; 64 << 10];
        let mut all: Vec<(u64, Vec<u8>)> = Vec::new();
        {
            let (mut j, _) = open(dir.path());
            let mut index = 0u64;
            // Each round appends 16 entries and purges all but the newest.
            for round in 0..80u64 {
                let batch: Vec<Record<'_>> = (0..16)
                    .map(|_| {
                        index += 1;
                        Record::Entry(index, &value[..])
                    })
                    .collect();
                j.write(&batch).unwrap();
                let purged = format!("p{round}");
                j.write(&[Record::PurgeUpTo(index - 1, purged.as_bytes())])
                    .unwrap();
                all.push((index, purged.into_bytes()));
                j.compact_if_worth_it().unwrap();
            }
            j.settle().unwrap();
            assert!(
                j.compactions() >= 1,
                "64 MiB written, most of it purged: no compaction"
            );
            assert!(j.tail() < COMPACT_MIN, "tail {} after compaction", j.tail());
            j.write(&[Record::Meta("vote", b"after")]).unwrap();
        }
        let (_j, c) = open(dir.path());
        let (last, purged) = all.last().unwrap();
        assert_eq!(c.entries.keys().copied().collect::<Vec<_>>(), vec![*last]);
        assert_eq!(c.metas[PURGED], *purged);
        assert_eq!(c.metas["vote"], b"after");
        assert_eq!(c.purged_up_to, Some(last - 1));
        assert!(file_len(dir.path()) < COMPACT_MIN);
    }

    /// Batches written after the copy's cut, once the copy has finished,
    /// are carried into the new file by the writer, re-sealed at their new
    /// offsets, and a write after the switch lands in the new file.
    #[test]
    fn batches_written_after_the_copy_are_carried_over_by_the_writer() {
        writes_after_the_cut_come_back(false);
    }

    /// Batches written while the copy's thread is alive (held between the
    /// copy and its catch-up) are carried over by that thread.
    #[test]
    fn batches_written_while_the_copy_runs_are_carried_over_by_its_thread() {
        writes_after_the_cut_come_back(true);
    }

    fn writes_after_the_cut_come_back(by_the_thread: bool) {
        let dir = tempfile::tempdir().unwrap();
        let mut expect = Model::default();
        let (mut j, _) = open_compacting_from(dir.path(), 16 << 10);
        let release = by_the_thread.then(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            j.hold_copy = Some(rx);
            j.leave_for_writer = 0;
            tx
        });
        let mut feed = |j: &mut Journal, ops| write_one_batch(j, &mut expect, ops);
        for i in 1..=40u64 {
            feed(&mut j, vec![(0, i, vec![i as u8; 1000])]);
            if i > 2 {
                feed(&mut j, vec![(2, i - 2, format!("p{i}").into_bytes())]);
            }
        }
        let before = j.tail();
        assert!(
            !j.compact_if_worth_it().unwrap(),
            "nothing to put in place yet"
        );
        let running = j
            .compacting
            .as_ref()
            .expect("a mostly dead file starts a compaction");
        assert_eq!(running.upto, before);
        let wait_for_the_copy = |j: &Journal| {
            let waited = std::time::Instant::now();
            while !j.compacting.as_ref().unwrap().copy.is_finished() {
                assert!(
                    waited.elapsed() < std::time::Duration::from_secs(20),
                    "copy never finished"
                );
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        };
        if !by_the_thread {
            wait_for_the_copy(&j);
        }
        // Written after the copy's cut: each kind of record.
        feed(
            &mut j,
            vec![(0, 41, b"41".to_vec()), (0, 42, b"42".to_vec())],
        );
        feed(&mut j, vec![(0, 43, b"43".to_vec()), (1, 42, vec![])]);
        feed(&mut j, vec![(3, 0, b"vote-during".to_vec())]);
        feed(
            &mut j,
            vec![(2, 39, b"p-during".to_vec()), (0, 42, b"42b".to_vec())],
        );
        if let Some(tx) = release {
            assert!(
                !j.compacting.as_ref().unwrap().copy.is_finished(),
                "the held copy finished"
            );
            tx.send(()).unwrap();
            wait_for_the_copy(&j);
        }
        assert!(
            j.compact_if_worth_it().unwrap(),
            "the finished copy is put in place"
        );
        assert_eq!(j.compactions(), 1);
        if by_the_thread {
            assert_eq!(j.last_writer_carry(), 0, "the thread carried it all");
        } else {
            assert!(j.last_writer_carry() > 0, "the writer carried nothing");
        }
        assert!(j.tail() < before / 4, "tail {} from {before}", j.tail());
        assert!(zero_past_tail(dir.path(), &j));
        assert!(!temp_path(dir.path()).exists());
        feed(&mut j, vec![(0, 44, b"after".to_vec())]);
        drop(j);
        let (_j, c) = open(dir.path());
        expect.check(&c).unwrap();
        assert_eq!(
            c.entries.keys().copied().collect::<Vec<_>>(),
            vec![40, 41, 42, 44]
        );
    }

    /// The copy thread's own catch-up: what the writer synced after the
    /// copy's cut is carried into the new file, in rounds, re-sealed at its
    /// new offsets, and the new file replays to everything.
    #[test]
    fn the_copy_carries_over_what_was_synced_after_its_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut expect = Model::default();
        let (mut j, _) = open(dir.path());
        let mut feed = |j: &mut Journal, ops| write_one_batch(j, &mut expect, ops);
        for i in 1..=20u64 {
            feed(&mut j, vec![(0, i, vec![i as u8; 3000])]);
        }
        feed(&mut j, vec![(2, 15, b"p15".to_vec())]);
        let cut = j.tail();
        let tmp = temp_path(dir.path());
        let copied = copy_live(&j.file, &j.path, cut, &tmp, PURGED, TEST_CHUNK).unwrap();
        // After the cut: two rounds' worth, each kind of record.
        feed(&mut j, vec![(0, 21, b"21".to_vec()), (1, 18, vec![])]);
        feed(&mut j, vec![(3, 0, b"vote".to_vec())]);
        let first = j.synced_tail.load(std::sync::atomic::Ordering::Acquire);
        let one_round = carry_over(&j.file, &j.path, cut, first, &tmp, copied, TEST_CHUNK).unwrap();
        feed(
            &mut j,
            vec![(0, 18, b"18 again".to_vec()), (2, 16, b"p16".to_vec())],
        );
        let synced = (&*j.synced_tail, 0);
        let done = catch_up(&j.file, &j.path, first, synced, &tmp, one_round, TEST_CHUNK).unwrap();
        assert_eq!(done.from, j.tail(), "everything synced is carried over");
        assert!(done.tmp.len.is_multiple_of(TEST_CHUNK) && done.tmp.len > done.tmp.tail);
        drop(j);
        std::fs::rename(&tmp, dir.path().join(FILE_NAME)).unwrap();
        let (j, c) = open(dir.path());
        expect.check(&c).unwrap();
        assert_eq!(j.tail(), done.tmp.tail);
        assert_eq!(c.entries.keys().copied().collect::<Vec<_>>(), vec![17, 18]);
    }

    /// A write larger than a batch goes out as several, all of which come
    /// back.
    #[test]
    fn a_write_larger_than_a_batch_is_split_and_comes_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![9u8; BATCH_TARGET * 5 / 8];
        let records = [
            Record::Entry(1, &big[..]),
            Record::Entry(2, &big[..]),
            Record::Meta("vote", b"v"),
        ];
        {
            let (mut j, _) = open(dir.path());
            let before = j.tail();
            j.write(&records).unwrap();
            let img = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
            let first_end = align_up(unpadded_end(&img, before));
            assert!(
                first_end < j.tail(),
                "one batch for {} bytes",
                2 * big.len()
            );
        }
        let (_j, c) = open(dir.path());
        assert_eq!(c, model(&records));
    }

    /// What the journal must give back, computed without its code.
    #[derive(Default)]
    struct Model {
        entries: BTreeMap<u64, Vec<u8>>,
        vote: Option<Vec<u8>>,
        purged: Option<Vec<u8>>,
    }

    impl Model {
        fn feed(&mut self, (kind, index, bytes): &(u8, u64, Vec<u8>)) {
            match kind {
                0 => {
                    self.entries.insert(*index, bytes.clone());
                }
                1 => self.entries.retain(|i, _| i < index),
                2 => {
                    self.entries.retain(|i, _| i > index);
                    self.purged = Some(bytes.clone());
                }
                _ => self.vote = Some(bytes.clone()),
            }
        }

        fn check(&self, c: &Contents) -> Result<(), String> {
            let mut metas = BTreeMap::new();
            if let Some(v) = &self.vote {
                metas.insert("vote".to_string(), v.clone());
            }
            if let Some(p) = &self.purged {
                metas.insert(PURGED.to_string(), p.clone());
            }
            if c.entries != self.entries || c.metas != metas {
                return Err(format!(
                    "entries {:?} metas {:?}, expected {:?} {metas:?}",
                    c.entries.keys().collect::<Vec<_>>(),
                    c.metas,
                    self.entries.keys().collect::<Vec<_>>()
                ));
            }
            Ok(())
        }
    }

    /// Writes `ops` as one batch and feeds them to `model`.
    fn write_one_batch(j: &mut Journal, model: &mut Model, ops: Vec<(u8, u64, Vec<u8>)>) {
        let records: Vec<Record<'_>> = ops.iter().map(as_record).collect();
        j.write(&records).unwrap();
        ops.iter().for_each(|op| model.feed(op));
    }

    fn as_record((kind, index, bytes): &(u8, u64, Vec<u8>)) -> Record<'_> {
        match kind {
            0 => Record::Entry(*index, bytes),
            1 => Record::TruncateFrom(*index),
            2 => Record::PurgeUpTo(*index, bytes),
            _ => Record::Meta("vote", bytes),
        }
    }

    /// Random operations with random crashes and compactions: after each
    /// crash the reopened journal holds exactly the batches whose write
    /// returned (checked against a model that shares no code with it).
    #[test]
    fn random_batches_and_crashes_match_a_model() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let op = prop_oneof![
            (1u64..40, proptest::collection::vec(any::<u8>(), 0..300))
                .prop_map(|(i, v)| (0u8, i, v)),
            (1u64..40).prop_map(|i| (1u8, i, vec![])),
            (1u64..40).prop_map(|i| (2u8, i, b"purged".to_vec())),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|v| (3u8, 0, v)),
        ];
        // Each batch, and whether the machine crashes while it is written
        // (and where in it).
        let batch = (
            proptest::collection::vec(op, 1..6),
            proptest::option::weighted(0.3, any::<u16>()),
        );
        let case = proptest::collection::vec(batch, 1..12);
        let mut runner = TestRunner::new(Config {
            cases: 48,
            ..Config::default()
        });
        let compactions = std::sync::atomic::AtomicU64::new(0);
        // Small enough that most cases compact now and then (at 2 KiB, half
        // the runs of 48 cases had no compaction at all).
        let compact_min = 256;
        runner
            .run(&case, |batches| {
                let dir = tempfile::tempdir().unwrap();
                let mut synced = Model::default();
                let (mut j, _) = open_compacting_from(dir.path(), compact_min);
                j.leave_for_writer = 0;
                for (batch, crash) in &batches {
                    let records: Vec<Record<'_>> = batch.iter().map(as_record).collect();
                    let before = j.tail();
                    j.write(&records).unwrap();
                    let Some(point) = crash else {
                        batch.iter().for_each(|op| synced.feed(op));
                        if j.compact_if_worth_it().unwrap() {
                            compactions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        continue;
                    };
                    // Crash during this batch: only a prefix of it landed.
                    // (A running compaction's copy is waited for, and its
                    // file removed: as after a crash, the old file rules.)
                    drop(j);
                    prop_assert!(!temp_path(dir.path()).exists());
                    let mut img = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
                    let end = unpadded_end(&img, before);
                    let keep = before + u64::from(*point) % (end - before);
                    let cut = &mut img[keep as usize..end as usize];
                    if cut.iter().all(|b| *b == 0) {
                        // Only bytes that were zero anyway: the batch landed
                        // whole, as a crash after its last block would leave it.
                        batch.iter().for_each(|op| synced.feed(op));
                    }
                    cut.fill(0);
                    std::fs::write(dir.path().join(FILE_NAME), &img).unwrap();
                    let (reopened, c) = open_compacting_from(dir.path(), compact_min);
                    synced.check(&c).map_err(TestCaseError::fail)?;
                    prop_assert!(zero_past_tail(dir.path(), &reopened));
                    j = reopened;
                    j.leave_for_writer = 0;
                }
                if j.settle().unwrap() {
                    compactions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                drop(j);
                let (_j, c) = open_compacting_from(dir.path(), compact_min);
                synced.check(&c).map_err(TestCaseError::fail)?;
                Ok(())
            })
            .unwrap();
        assert!(
            compactions.into_inner() > 0,
            "no case compacted: the test does not reach compaction"
        );
    }
}
