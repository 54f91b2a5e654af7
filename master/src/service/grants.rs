//! The grants a replica descriptor carries (what its holder may do on the
//! data plane, until when, signed with its segment's key) and the
//! descriptor itself. Must not decide placements: it describes them.

use crescent_auth::capability::{Access, Capability, SegmentKey};
use crescent_proto::pb;
use crescent_raft::state::{MetaState, PutId, Replica};

/// What a replica descriptor lets its holder do on the data plane: write
/// the placement of a put, or read a complete replica, until `expiry_ms`
/// (Unix ms on this master's clock).
#[derive(Clone, Copy)]
pub(super) struct GrantTerms {
    access: Access,
    expiry_ms: u64,
}

impl GrantTerms {
    pub(super) fn new(access: Access, ttl: std::time::Duration) -> Self {
        Self {
            access,
            expiry_ms: crate::node::now_ms().saturating_add(ttl.as_millis() as u64),
        }
    }
}

/// The write grant of a committed PutStart expires no later than its
/// put's discard time, also when a retry gets the placement again from the
/// dedup table: a revoked range is reused only a fixed margin after that
/// time (`WRITE_FENCE_MARGIN_MS`), so no grant may outlive it. A put no
/// longer unfinished under the key (revoked, removed, taken over, or
/// finished) gets an expired grant: the store refuses its bytes.
pub(super) fn put_grant_terms(
    state: &MetaState,
    key: &str,
    writer: &str,
    put_id: PutId,
    fresh: GrantTerms,
) -> GrantTerms {
    let discard_at_ms = match state.objects.get(key) {
        Some(o) if o.is_put_of(Some(writer), put_id) => match o.phase {
            crescent_raft::state::PutPhase::Processing { discard_at_ms, .. } => discard_at_ms,
            crescent_raft::state::PutPhase::Complete { .. } => 0,
        },
        _ => 0,
    };
    GrantTerms {
        expiry_ms: fresh.expiry_ms.min(discard_at_ms),
        ..fresh
    }
}

/// The grant for `r` signed with its segment's key; none (the store will
/// refuse) for a segment gone meanwhile or mounted without a key.
fn sign_grant(seg: Option<&crescent_raft::state::Segment>, r: &Replica, t: GrantTerms) -> Vec<u8> {
    let Some(key) = seg.and_then(|s| SegmentKey::from_slice(&s.key.0)) else {
        return Vec::new();
    };
    key.sign(&Capability {
        segment_id: r.segment_id,
        offset: r.offset,
        len: r.len,
        access: t.access,
        expiry_ms: t.expiry_ms,
    })
    .to_vec()
}

/// A replica with its segment's transport details (empty if the segment was
/// unmounted meanwhile: the reader then fails over to another replica) and
/// the grant to move its bytes.
pub(super) fn replica_pb(
    state: &MetaState,
    r: &Replica,
    terms: GrantTerms,
) -> pb::ReplicaDescriptor {
    let seg = state.segments.get(&r.segment_id);
    let complete = terms.access == Access::Read;
    let disk_file = seg.map(|s| s.spec.disk_file()).unwrap_or_default();
    pb::ReplicaDescriptor {
        segment_id: r.segment_id,
        segment_name: seg.map(|s| s.spec.name.clone()).unwrap_or_default(),
        endpoint: seg.map(|s| s.spec.endpoint.clone()).unwrap_or_default(),
        offset: r.offset,
        length: r.len,
        status: if complete {
            pb::ReplicaStatus::Complete as i32
        } else {
            pb::ReplicaStatus::Processing as i32
        },
        hostname: seg.map(|s| s.spec.hostname.clone()).unwrap_or_default(),
        shm_path: seg
            .map(|s| s.spec.shm_file().to_string())
            .unwrap_or_default(),
        disk_file_path: disk_file.to_string(),
        // Only a same-host reader of the file needs it.
        disk_id: seg
            .filter(|_| !disk_file.is_empty())
            .map(|s| s.disk_id.clone())
            .unwrap_or_default(),
        grant_expiry_ms: terms.expiry_ms,
        grant_mac: sign_grant(seg, r, terms),
        kind: if seg.is_some_and(|s| s.is_disk()) {
            pb::ReplicaKind::Disk as i32
        } else {
            pb::ReplicaKind::Memory as i32
        },
    }
}

/// The write grants' terms of a one-commit placement: `fresh` for a new
/// one; a placement given again keeps its first grants' expiry, so its
/// commit deadline does not move.
pub(super) fn placement_terms(fresh: GrantTerms, again_expiry_ms: Option<u64>) -> GrantTerms {
    again_expiry_ms.map_or(fresh, |expiry_ms| GrantTerms {
        access: Access::Write,
        expiry_ms,
    })
}
