//! The Raft store's file (`raft.log`): an append-only journal of the log
//! writer's operations, replayed at open.
//!
//! Why not a database: every fact the store keeps is in memory anyway
//! ([`crate::store`]), so the file only has to make operations durable in
//! order. A batch of operations is one `pwrite` into blocks that were zeroed
//! in advance, then one `fdatasync`. Overwriting written blocks leaves the
//! file's size and block map alone, so the sync writes the data and nothing
//! else: about half of what a redb commit cost here (5-6 scattered pages, a
//! header and a sync; docs/benchmarks.md, stop 42), and a replicated put
//! waits for two of these flushes in series.
//!
//! Layout: a 16-byte file header, then batches, each at an 8-byte-aligned
//! offset: `len: u32`, `crc: u32`, then `len` bytes of records. The CRC
//! (crc32c) covers the batch's offset, its length and its records, so a
//! batch is valid only at the place it was written. Records are
//! `kind: u8`, `len: u32`, payload:
//! an entry (index, bytes), a truncation (from index), a purge (up to index,
//! the purged log id) or a named value (vote, committed hint, snapshot).
//!
//! Crashes: a batch is acknowledged only after its sync, so a crash can tear
//! at most the last batch. Replay stops at the first batch that is not valid
//! and everything from there to the end of the file is zeroed (and synced)
//! before the journal is written again, so no remnant of a torn batch can
//! ever be read as data. A valid batch found *after* an invalid one cannot
//! come from a torn write (the region past the tail is always zero), so it
//! means the file was damaged in the middle: open refuses it rather than
//! silently drop synced, acknowledged entries.
//!
//! Space: the file grows in zeroed chunks; when most of it is dead (purged
//! or overwritten entries, old snapshots), the live records are written to a
//! new file that replaces the old one by rename.
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
const MAGIC: &[u8; 16] = b"crescent-rlog-v1";
const BATCH_HEADER: usize = 8;
const ALIGN: u64 = 8;
/// The file grows by this much at a time, zero-filled and synced once.
const CHUNK: u64 = 16 << 20;
/// No compaction below this size: rewriting a small file buys nothing.
const COMPACT_MIN: u64 = 64 << 20;
/// Largest batch or record accepted when reading. Writers are bounded far
/// below this (an entry by `crate::sizing`, a snapshot by the state's
/// limits); a larger length read back is damage, not data.
const MAX_BATCH: u64 = 1 << 31;

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
    #[error("the raft log is unusable after an earlier failed write; restart the master")]
    Failed,
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
    _lock: File,
    /// Where the next batch goes.
    tail: u64,
    /// The file's length: everything from `tail` to here is zero.
    zeroed_to: u64,
    live: LiveSizes,
    purged_key: String,
    failed: bool,
    /// The file grows by this much at a time ([`CHUNK`]; smaller in tests).
    chunk: u64,
    /// How many compactions this journal has made (for tests and logs).
    compactions: u64,
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

/// Encodes `records` as one batch to be written at `offset`.
fn encode_batch(offset: u64, records: &[Record<'_>]) -> Vec<u8> {
    let mut body = Vec::new();
    for rec in records {
        let (kind, start) = match rec {
            Record::Entry(..) => (KIND_ENTRY, body.len()),
            Record::TruncateFrom(_) => (KIND_TRUNCATE, body.len()),
            Record::PurgeUpTo(..) => (KIND_PURGE, body.len()),
            Record::Meta(..) => (KIND_META, body.len()),
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
                body.push(key.len().min(255) as u8);
                body.extend_from_slice(&key.as_bytes()[..key.len().min(255)]);
                body.extend_from_slice(value);
            }
        }
        let payload_len = (body.len() - start - 5) as u32;
        body[start + 1..start + 5].copy_from_slice(&payload_len.to_le_bytes());
    }
    let mut out = Vec::with_capacity(BATCH_HEADER + body.len() + ALIGN as usize);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&batch_crc(offset, &body).to_le_bytes());
    out.extend_from_slice(&body);
    out.resize(align_up(out.len() as u64) as usize, 0);
    out
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

/// The batch at `offset` of `data`, if one is valid there: its records'
/// bytes and the offset after it.
fn batch_at(data: &[u8], offset: u64) -> Option<(&[u8], u64)> {
    let start = usize::try_from(offset).ok()?;
    let header = data.get(start..start.checked_add(BATCH_HEADER)?)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as u64;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len == 0 || len > MAX_BATCH {
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
        return Err(corrupt("not a Crescent raft log (bad file header)".into()));
    }
    let mut contents = Contents::default();
    let mut at = MAGIC.len() as u64;
    while let Some((body, next)) = batch_at(data, at) {
        let records = decode_records(body).ok_or_else(|| {
            corrupt(format!(
                "batch at offset {at} has a valid checksum but does not parse"
            ))
        })?;
        for rec in records {
            contents.apply(purged_key, rec);
        }
        at = next;
    }
    // Nothing valid may follow: past the tail the file is kept zero, so only
    // damage can put a valid batch there.
    let mut probe = at + ALIGN;
    while probe + BATCH_HEADER as u64 <= data.len() as u64 {
        let p = probe as usize;
        if data[p..p + 4] != [0, 0, 0, 0] && batch_at(data, probe).is_some() {
            return Err(corrupt(format!(
                "the batch at offset {at} is unreadable but a valid one follows at {probe}: \
                 the file was damaged, not torn by a crash; remove the data dir to have this \
                 master rejoin from a snapshot"
            )));
        }
        probe += ALIGN;
    }
    Ok((contents, at))
}

impl Journal {
    /// Opens (or creates) the journal in `dir` and replays it. `purged_key`
    /// is the name under which a purge's log id is kept among the values.
    pub fn open(dir: &Path, purged_key: &str) -> Result<(Journal, Contents), JournalError> {
        Self::open_growing_by(dir, purged_key, CHUNK)
    }

    /// [`Journal::open`], growing the file `chunk` bytes at a time.
    fn open_growing_by(
        dir: &Path,
        purged_key: &str,
        chunk: u64,
    ) -> Result<(Journal, Contents), JournalError> {
        let lock_path = dir.join(LOCK_NAME);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        let path = dir.join(FILE_NAME);
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(JournalError::Locked {
                    path: path.display().to_string(),
                    lock: lock_path.display().to_string(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_error(&lock_path)(e)),
        }
        // A compaction that crashed before its rename leaves this behind.
        let _ = std::fs::remove_file(dir.join(format!("{FILE_NAME}.new")));
        if !path.exists() {
            write_fresh(dir, &path, &Contents::default(), purged_key)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error(&path))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io_error(&path))?;
        let (contents, tail) = replay(&data, purged_key, &path)?;
        let len = data.len() as u64;
        // Past the tail only a torn batch can have left anything.
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
            compactions: 0,
        };
        // Whatever a torn batch left past the tail becomes zero (synced
        // before anything is written after it), and the file is grown to a
        // whole number of chunks of written zeros.
        if dirty_to > tail {
            tracing::warn!(
                path = %journal.path.display(),
                tail,
                torn_bytes = dirty_to - tail,
                "raft log: dropping a batch torn by a crash (never acknowledged)"
            );
            journal.zero(tail, dirty_to)?;
        }
        journal.zeroed_to = journal.zeroed_to.max(len);
        let end = len.div_ceil(chunk).max(1) * chunk;
        if end > len {
            journal.zero(len, end)?;
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
    /// of a batch that returns an error may be relied on, and the journal
    /// refuses every later write.
    pub fn write(&mut self, records: &[Record<'_>]) -> Result<(), JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        if records.is_empty() {
            return Ok(());
        }
        let batch = encode_batch(self.tail, records);
        let end = self.tail + batch.len() as u64;
        if end > self.zeroed_to {
            // Nothing of the batch is written yet: a failure here (a full
            // disk) leaves the journal as it was.
            let to = end.div_ceil(self.chunk) * self.chunk;
            self.zero(self.zeroed_to, to)?;
        }
        let written = self
            .file
            .write_all_at(&batch, self.tail)
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
        self.tail += batch.len() as u64;
        Ok(())
    }

    /// Rewrites the file with only its live records once it is mostly
    /// dead. Returns whether it did. Called by the writer between batches.
    pub fn compact_if_worth_it(&mut self) -> Result<bool, JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        if self.tail < COMPACT_MIN || self.tail < 4 * self.live.total() {
            return Ok(false);
        }
        let result = self.compact();
        if result.is_err() {
            self.failed = true;
        }
        result.map(|()| true)
    }

    fn compact(&mut self) -> Result<(), JournalError> {
        let started = std::time::Instant::now();
        let before = self.tail;
        let mut data = vec![0u8; self.tail as usize];
        self.file
            .read_exact_at(&mut data, 0)
            .map_err(io_error(&self.path))?;
        let (contents, tail) = replay(&data, &self.purged_key, &self.path)?;
        drop(data);
        if tail != self.tail {
            return Err(JournalError::Corrupt {
                path: self.path.display().to_string(),
                reason: format!("replay ends at {tail}, the writer at {}", self.tail),
            });
        }
        write_fresh(&self.dir, &self.path, &contents, &self.purged_key)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(io_error(&self.path))?;
        let len = file.metadata().map_err(io_error(&self.path))?.len();
        self.file = file;
        self.tail = len;
        self.zeroed_to = len;
        self.live = LiveSizes::from_contents(&contents);
        self.compactions += 1;
        let end = len.div_ceil(self.chunk).max(1) * self.chunk;
        self.zero(len, end)?;
        tracing::info!(
            before,
            after = len,
            took = ?started.elapsed(),
            "raft log compacted"
        );
        Ok(())
    }

    /// Bytes from the file's start to the next batch.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// How many compactions this journal has made.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }
}

/// Writes `contents` as a new journal at `path`, atomically: a temporary
/// file, synced, renamed over `path`, and the directory synced.
pub fn write_fresh(
    dir: &Path,
    path: &Path,
    contents: &Contents,
    purged_key: &str,
) -> Result<(), JournalError> {
    let tmp = dir.join(format!("{FILE_NAME}.new"));
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
    if !records.is_empty() {
        out.extend_from_slice(&encode_batch(MAGIC.len() as u64, &records));
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&tmp)
        .map_err(io_error(&tmp))?;
    file.write_all_at(&out, 0).map_err(io_error(&tmp))?;
    file.sync_all().map_err(io_error(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io_error(path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PURGED: &str = "last_purged";

    /// Small chunks: each open of a new file zeroes one.
    const TEST_CHUNK: u64 = 256 << 10;

    fn open(dir: &Path) -> (Journal, Contents) {
        Journal::open_growing_by(dir, PURGED, TEST_CHUNK).expect("open journal")
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
        let (_j, _) = open(dir.path());
        match Journal::open_growing_by(dir.path(), PURGED, TEST_CHUNK) {
            Err(JournalError::Locked { .. }) => {}
            Err(e) => panic!("expected Locked, got {e}"),
            Ok(_) => panic!("a second open of a held journal succeeded"),
        }
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
        match Journal::open(dir.path(), PURGED) {
            Err(JournalError::Corrupt { reason, .. }) => {
                assert!(reason.contains("damaged"), "{reason}")
            }
            Err(e) => panic!("expected Corrupt, got {e}"),
            Ok(_) => panic!("a journal damaged in the middle opened"),
        }
        // A file that is not a journal at all.
        std::fs::write(dir.path().join(FILE_NAME), b"hello").unwrap();
        assert!(matches!(
            Journal::open(dir.path(), PURGED),
            Err(JournalError::Corrupt { .. })
        ));
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

    fn as_record((kind, index, bytes): &(u8, u64, Vec<u8>)) -> Record<'_> {
        match kind {
            0 => Record::Entry(*index, bytes),
            1 => Record::TruncateFrom(*index),
            2 => Record::PurgeUpTo(*index, bytes),
            _ => Record::Meta("vote", bytes),
        }
    }

    /// Random operations with random crashes: after each crash the reopened
    /// journal holds exactly the batches whose write returned.
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
        runner
            .run(&case, |batches| {
                let dir = tempfile::tempdir().unwrap();
                let mut synced: Vec<(u8, u64, Vec<u8>)> = Vec::new();
                let (mut j, _) = open(dir.path());
                for (batch, crash) in &batches {
                    let records: Vec<Record<'_>> = batch.iter().map(as_record).collect();
                    let before = j.tail();
                    j.write(&records).unwrap();
                    let Some(point) = crash else {
                        synced.extend(batch.iter().cloned());
                        continue;
                    };
                    // Crash during this batch: only a prefix of it landed.
                    drop(j);
                    let mut img = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
                    let end = unpadded_end(&img, before);
                    let keep = before + u64::from(*point) % (end - before);
                    let cut = &mut img[keep as usize..end as usize];
                    if cut.iter().all(|b| *b == 0) {
                        // Only bytes that were zero anyway: the batch landed
                        // whole, as a crash after its last block would leave it.
                        synced.extend(batch.iter().cloned());
                    }
                    cut.fill(0);
                    std::fs::write(dir.path().join(FILE_NAME), &img).unwrap();
                    let (reopened, c) = open(dir.path());
                    let expect: Vec<Record<'_>> = synced.iter().map(as_record).collect();
                    prop_assert_eq!(c, model(&expect));
                    j = reopened;
                }
                drop(j);
                let (_j, c) = open(dir.path());
                let expect: Vec<Record<'_>> = synced.iter().map(as_record).collect();
                prop_assert_eq!(c, model(&expect));
                Ok(())
            })
            .unwrap();
    }
}
