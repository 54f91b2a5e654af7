//! Objects: their replicas, their phase (unfinished or complete), and what
//! each writer holds.

use super::*;

/// Which object a key named when the leader looked: a later put of the
/// same key makes another object, with another stamp.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectStamp {
    pub created_ms: u64,
    pub put_id: PutId,
    pub checksum: u32,
    pub size: u64,
}

impl ObjectStamp {
    /// Most bytes one stamp and its key's length prefix encode to (bincode
    /// varints: 9 bytes a u64 at most, 5 a u32), for sizing entries.
    pub const MAX_ENCODED_BYTES: usize = 9 + 9 + 5 + 9 + 9;

    pub fn of(obj: &Object) -> Self {
        Self {
            created_ms: obj.created_ms,
            put_id: obj.put_id,
            checksum: obj.checksum,
            size: obj.size,
        }
    }

    /// Whether `obj` is the object this stamp was taken of.
    pub fn names(&self, obj: &Object) -> bool {
        *self == Self::of(obj)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub segment_id: SegmentId,
    pub offset: u64,
    pub len: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum PutPhase {
    /// PutStart done, bytes being written. After `discard_at_ms` another writer may take
    /// the key over; at `release_at_ms` the space is reclaimed.
    Processing {
        started_ms: u64,
        discard_at_ms: u64,
        release_at_ms: u64,
    },
    Complete {
        completed_ms: u64,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub size: u64,
    pub replicas: Vec<Replica>,
    pub phase: PutPhase,
    pub checksum: u32,
    /// 0 when not soft-pinned.
    pub soft_pin_until_ms: u64,
    pub hard_pin: bool,
    pub created_ms: u64,
    /// Client that started the put.
    pub writer: String,
    /// The writer's name for the put that made this object (0: unnamed).
    pub put_id: PutId,
}

impl Object {
    pub fn is_complete(&self) -> bool {
        matches!(self.phase, PutPhase::Complete { .. })
    }

    /// Whether a PutEnd or PutRevoke from `writer` naming `put_id` is about
    /// this object's put. Unnamed requests (0) match any put of the writer;
    /// a named one must match the put that made the object.
    pub fn is_put_of(&self, writer: Option<&str>, put_id: PutId) -> bool {
        writer.is_none_or(|w| self.writer == w) && (put_id == 0 || self.put_id == put_id)
    }

    pub fn soft_pinned_at(&self, now_ms: u64) -> bool {
        self.soft_pin_until_ms > now_ms
    }
}

/// A read of one object for GetReplicaList.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectView {
    pub size: u64,
    pub checksum: u32,
    pub replicas: Vec<Replica>,
}

/// Space that must not be reused before `release_at_ms` (a writer may still be
/// writing into it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PendingRelease {
    pub replica: Replica,
    pub release_at_ms: u64,
}

/// What one writer (client id) holds in `objects`: the leader refuses its
/// PutStarts beyond the per-client quotas, so one client cannot fill the
/// leader's memory with objects, keys or puts it never finishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterUsage {
    pub objects: u64,
    pub unfinished: u64,
    pub key_bytes: u64,
}

pub(super) fn count_in(usage: &mut BTreeMap<String, WriterUsage>, key: &str, obj: &Object) {
    let u = usage.entry(obj.writer.clone()).or_default();
    u.objects += 1;
    u.unfinished += u64::from(!obj.is_complete());
    u.key_bytes += key.len() as u64;
}

pub(super) fn count_out(usage: &mut BTreeMap<String, WriterUsage>, key: &str, obj: &Object) {
    if let Some(u) = usage.get_mut(&obj.writer) {
        u.objects = u.objects.saturating_sub(1);
        u.unfinished = u.unfinished.saturating_sub(u64::from(!obj.is_complete()));
        u.key_bytes = u.key_bytes.saturating_sub(key.len() as u64);
        if u.objects == 0 {
            usage.remove(&obj.writer);
        }
    }
}
