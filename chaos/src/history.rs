//! What a chaos run records: every client operation with its invoke and
//! complete times and its outcome, every master's (term, role) samples, and
//! the disk objects checked across store restarts.
//! One JSON object per line, so a worker killed mid-run loses at most a line.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpKind {
    /// Put of the value identified by `value` (its bytes derive from the id).
    Put {
        value: u64,
    },
    Get,
    Exists,
    Remove {
        /// Forced removes ignore read leases (absent in older histories).
        #[serde(default)]
        force: bool,
    },
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// A put or remove that succeeded.
    Ok,
    /// A get that returned the bytes of value `value`.
    Found { value: u64 },
    /// A get or remove that found no (readable) object.
    Missing,
    /// An exists answer.
    Present { exists: bool },
    /// A get whose bytes match no value ever generated (or failed their
    /// checksum on every replica).
    Corrupt { detail: String },
    /// Definitely had no effect (e.g. refused by the state machine).
    Fail { error: String },
    /// May or may not have taken effect (timeouts, lost connections).
    Unknown { error: String },
}

/// One client operation. Times are microseconds since the Unix epoch on the
/// host's clock, which every process and container of a run shares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub process: u32,
    pub key: String,
    #[serde(flatten)]
    pub kind: OpKind,
    pub invoke_us: u64,
    pub complete_us: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// What a `Found` answer promises (absent: linearizable).
    #[serde(default, skip_serializing_if = "ReadPromise::is_linearizable")]
    pub promise: ReadPromise,
}

/// What a get's `Found` answer promises, by how the client served it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadPromise {
    /// The key's value at some moment between invocation and completion.
    #[default]
    Linearizable,
    /// A client with the descriptor cache: the key's value at some moment
    /// up to `within_us` (a read lease) before invocation, or since; never
    /// older than its own client's last remove of the key.
    Stale { within_us: u64 },
    /// A client that was (or may have been) in degraded mode: bytes some
    /// put of the key wrote, invoked before the read completed (its own
    /// local-only puts included), nothing more.
    Degraded,
}

impl ReadPromise {
    pub fn is_linearizable(&self) -> bool {
        *self == ReadPromise::Linearizable
    }
}

/// One disk object checked across a store restart
/// ([`FaultKind::RestartStoreWithDisk`]): an acknowledged object the leader
/// listed with a disk replica on the killed store's disk segment, read
/// before the kill (it held value `value`) and read again once the store
/// was back. The reads themselves are in the history too, as gets.
///
/// [`FaultKind::RestartStoreWithDisk`]: crate::schedule::FaultKind::RestartStoreWithDisk
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskCheck {
    pub key: String,
    /// Which store was killed, and the disk segment the object was on.
    pub store: usize,
    pub segment: String,
    /// The value the read before the kill found.
    pub value: u64,
    /// When that read was invoked: a remove from then on excuses a
    /// missing or different object.
    pub before_us: u64,
    pub killed_us: u64,
    /// When the restarted store's disk segment was mounted again (None: it
    /// was not within the bound; the read after is made anyway).
    pub back_us: Option<u64>,
    /// The read after the restart (the last attempt, if it was retried).
    pub after_invoke_us: u64,
    pub after_complete_us: u64,
    pub after: Outcome,
}

/// One master's answer to a status poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleSample {
    pub node: u64,
    pub term: u64,
    pub leader: bool,
    pub at_us: u64,
    /// The master's last applied entry: its index and the leader id that
    /// wrote it (term, node). 0 when nothing was applied, and in runs
    /// recorded before these fields existed.
    #[serde(default)]
    pub applied_index: u64,
    #[serde(default)]
    pub applied_term: u64,
    #[serde(default)]
    pub applied_leader: u64,
}

pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Appends records to a JSON-lines file, flushing each one.
pub struct Recorder {
    out: std::io::BufWriter<std::fs::File>,
}

impl Recorder {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            out: std::io::BufWriter::new(std::fs::File::create(path)?),
        })
    }

    pub fn record<T: Serialize>(&mut self, item: &T) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, item)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }
}

/// Reads a JSON-lines file; a torn last line (writer killed) is skipped.
pub fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Vec<T>> {
    let f = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut items = Vec::new();
    let lines: Vec<String> = f.lines().collect::<Result<_, _>>()?;
    let n = lines.len();
    for (i, line) in lines.into_iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(v) => items.push(v),
            Err(_) if i + 1 == n => {}
            Err(e) => anyhow::bail!("{}:{}: {e}", path.display(), i + 1),
        }
    }
    Ok(items)
}

// ------------------------------------------------------------------ values

const VALUE_MAGIC: &[u8; 4] = b"CRSV";
const HEADER: usize = 16;

/// The bytes of value `id` (`len` >= 16): a header naming the id, then a
/// pattern derived from it, so any byte out of place is detected and a value
/// read under the wrong key is recognised as such by the checker.
pub fn value_bytes(id: u64, len: usize) -> Vec<u8> {
    let len = len.max(HEADER);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(VALUE_MAGIC);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    let mut x = id ^ 0x9E37_79B9_7F4A_7C15;
    while v.len() < len {
        // xorshift64: cheap and deterministic
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let word = x.to_le_bytes();
        let take = (len - v.len()).min(8);
        v.extend_from_slice(&word[..take]);
    }
    v
}

/// The value id these bytes encode, or why they are not a generated value.
pub fn decode_value(bytes: &[u8]) -> Result<u64, String> {
    if bytes.len() < HEADER || &bytes[..4] != VALUE_MAGIC {
        return Err(format!("{} bytes without the value header", bytes.len()));
    }
    let id = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    if len != bytes.len() {
        return Err(format!(
            "value {id}: header says {len} bytes, got {}",
            bytes.len()
        ));
    }
    if value_bytes(id, len) != bytes {
        return Err(format!("value {id}: bytes differ from what was put"));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_corruption_is_seen() {
        for len in [16, 17, 100, 4096] {
            let v = value_bytes(42, len);
            assert_eq!(v.len(), len);
            assert_eq!(decode_value(&v), Ok(42));
            let mut bad = v.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            assert!(decode_value(&bad).is_err());
        }
        assert!(decode_value(b"short").is_err());
        assert_ne!(value_bytes(1, 64), value_bytes(2, 64));
    }

    #[test]
    fn ops_serialize_as_flat_json_lines() {
        let op = Op {
            process: 3,
            key: "k".into(),
            kind: OpKind::Put { value: 7 },
            invoke_us: 1,
            complete_us: 2,
            outcome: Outcome::Unknown {
                error: "timeout".into(),
            },
            promise: ReadPromise::Linearizable,
        };
        let line = serde_json::to_string(&op).unwrap();
        assert!(line.contains("\"op\":\"put\"") && line.contains("\"result\":\"unknown\""));
        assert!(
            !line.contains("promise"),
            "the usual promise is left out: {line}"
        );
        assert_eq!(serde_json::from_str::<Op>(&line).unwrap(), op);
        let stale = Op {
            kind: OpKind::Get,
            outcome: Outcome::Found { value: 7 },
            promise: ReadPromise::Stale { within_us: 10 },
            ..op
        };
        let line = serde_json::to_string(&stale).unwrap();
        assert_eq!(serde_json::from_str::<Op>(&line).unwrap(), stale, "{line}");
    }
}
