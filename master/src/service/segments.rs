//! MountSegment, UnmountSegment and Heartbeat: checked segment specs,
//! segment quotas, ownership by key, and liveness.

use crescent_auth::capability::{SegmentKey, SEGMENT_KEY_LEN};
use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_raft::state::{MetaError, Op, SegmentKeyBytes, SegmentSpec, Tier};
use crescent_raft::Response;

use super::{
    invalid, item_status, meta_status, node_status, unexpected, MasterApi, MAX_CLIENT_ID_LEN,
};

const MAX_SEGMENT_NAME_LEN: usize = 256;

impl MasterApi {
    /// Refuses a mount that would add a segment beyond `--max-segments` in
    /// all or `--max-segments-per-client` for `owner` (1,000
    /// segments from 1,000 made-up clients mounted in 0.4 s). A re-mount of a
    /// name adds nothing and always passes. Checked before proposing, so
    /// concurrent mounts may overshoot by the few in flight.
    fn check_segment_quota(&self, name: &str, owner: &str) -> Result<(), pb::Status> {
        if !self.node.is_leader() {
            // A follower answers NOT_LEADER when it proposes; its view may lag.
            return Ok(());
        }
        let state = self.node.state();
        if state.segment_by_name(name).is_some() {
            return Ok(());
        }
        let cfg = self.node.config();
        let refused = || {
            self.node
                .counters()
                .quota_rejections_segments
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        };
        if state.segments.len() >= cfg.max_segments {
            refused();
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!(
                    "the cluster already holds {} segments (--max-segments {})",
                    state.segments.len(),
                    cfg.max_segments
                ),
            ));
        }
        let owned = state.segments.values().filter(|s| s.owner == owner).count();
        if owned >= cfg.max_segments_per_client {
            refused();
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!(
                    "client {owner} already owns {owned} segments (--max-segments-per-client {})",
                    cfg.max_segments_per_client
                ),
            ));
        }
        Ok(())
    }

    /// MountSegment: a checked segment spec, mounted by one entry; a fresh
    /// mount counts as a heartbeat.
    pub(super) async fn mount_request(
        &self,
        r: pb::MountSegmentRequest,
    ) -> pb::MountSegmentResponse {
        self.node
            .counters()
            .mount_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fail = |s| pb::MountSegmentResponse {
            status: Some(s),
            segment_id: 0,
        };
        let origin = match Self::origin(r.header) {
            Ok(o) => o,
            Err(s) => return fail(s),
        };
        let Some(seg) = r.segment else {
            return fail(invalid(ErrorCode::InvalidParams, "segment is required"));
        };
        if seg.name.is_empty() || seg.name.len() > MAX_SEGMENT_NAME_LEN {
            return fail(invalid(
                ErrorCode::InvalidParams,
                format!("segment name must be 1..={MAX_SEGMENT_NAME_LEN} bytes"),
            ));
        }
        if seg.capacity == 0 {
            return fail(invalid(
                ErrorCode::InvalidParams,
                "segment capacity must be greater than 0",
            ));
        }
        if seg.endpoint.len() > 1024
            || seg.hostname.len() > 1024
            || seg.shm_path.len() > crescent_proto::MAX_SEGMENT_PATH_BYTES
            || seg.disk_file_path.len() > crescent_proto::MAX_SEGMENT_PATH_BYTES
        {
            return fail(invalid(
                ErrorCode::InvalidParams,
                "segment endpoint, hostname, shm path or disk file path too long",
            ));
        }
        if SegmentKey::from_slice(&r.segment_key).is_none() {
            return fail(invalid(
                ErrorCode::InvalidParams,
                format!("segment key must be {SEGMENT_KEY_LEN} bytes"),
            ));
        }
        if let Err(s) = self.check_segment_quota(&seg.name, &origin.client_id) {
            return fail(s);
        }
        let tier = match pb::ReplicaKind::try_from(seg.kind) {
            Ok(pb::ReplicaKind::Memory) => Tier::Memory,
            Ok(pb::ReplicaKind::Disk) => Tier::Disk,
            Err(_) => {
                return fail(invalid(
                    ErrorCode::InvalidParams,
                    format!("unknown segment kind {}", seg.kind),
                ))
            }
        };
        if tier == Tier::Disk && !seg.shm_path.is_empty() {
            return fail(invalid(
                ErrorCode::InvalidParams,
                "a disk segment has no shared-memory path (its file goes in disk_file_path)",
            ));
        }
        if tier == Tier::Memory && !seg.disk_file_path.is_empty() {
            return fail(invalid(
                ErrorCode::InvalidParams,
                "a memory segment has no disk file",
            ));
        }
        // A shared-memory path that looked like a disk file would be
        // listed as one.
        if seg
            .shm_path
            .starts_with(crescent_raft::state::DISK_FILE_PREFIX)
        {
            return fail(invalid(
                ErrorCode::InvalidParams,
                format!(
                    "a shared-memory path may not start with {:?}",
                    crescent_raft::state::DISK_FILE_PREFIX
                ),
            ));
        }
        let owner = origin.client_id.clone();
        let mut spec = SegmentSpec {
            name: seg.name.clone(),
            endpoint: seg.endpoint,
            capacity: seg.capacity,
            hostname: seg.hostname,
            shm_path: seg.shm_path,
        };
        if !seg.disk_file_path.is_empty() {
            spec.set_disk_file(&seg.disk_file_path);
        }
        let key = SegmentKeyBytes(r.segment_key);
        let op = Op::MountSegment {
            spec,
            owner: owner.clone(),
            key,
            tier,
            disk_id: seg.disk_id,
        };
        match self.node.propose(Some(origin), op).await {
            Ok(Response::Mounted(Ok(id))) => {
                // A fresh mount counts as a heartbeat.
                self.node.record_heartbeat(&owner);
                tracing::info!(
                    segment_id = id,
                    name = seg.name,
                    owner,
                    capacity = seg.capacity,
                    ?tier,
                    "segment mounted"
                );
                pb::MountSegmentResponse {
                    status: Some(pb::Status::ok()),
                    segment_id: id,
                }
            }
            Ok(Response::Mounted(Err(e))) | Ok(Response::Rejected(e)) => fail(meta_status(&e)),
            Ok(other) => fail(unexpected(&other)),
            Err(e) => fail(node_status(&e)),
        }
    }

    /// UnmountSegment: only by the segment's owner, with the key it mounted
    /// with.
    pub(super) async fn unmount_request(&self, r: pb::UnmountSegmentRequest) -> pb::StatusResponse {
        let fail = |s| pb::StatusResponse { status: Some(s) };
        let origin = match Self::origin(r.header) {
            Ok(o) => o,
            Err(s) => return fail(s),
        };
        // Only the leader judges, from everything committed: a follower's
        // state may not hold a segment mounted a moment ago.
        if let Err(e) = self.node.linearizable_read().await {
            return fail(node_status(&e));
        }
        let allowed = {
            let state = self.node.state();
            state.segments.get(&r.segment_id).map(|s| {
                // Its owner, proving it with the key it mounted with.
                s.owner == origin.client_id
                    && crescent_auth::constant_time_eq(&s.key.0, &r.segment_key)
            })
        };
        match allowed {
            None => return fail(meta_status(&MetaError::SegmentNotFound(r.segment_id))),
            Some(false) => {
                return fail(invalid(
                    ErrorCode::PermissionDenied,
                    format!(
                        "segment {} is mounted by another client or with another key",
                        r.segment_id
                    ),
                ))
            }
            Some(true) => {}
        }
        match self
            .node
            .propose(
                Some(origin),
                Op::UnmountSegment {
                    segment_id: r.segment_id,
                },
            )
            .await
        {
            Ok(Response::Done(res)) => {
                if res.is_ok() {
                    tracing::info!(segment_id = r.segment_id, "segment unmounted");
                }
                fail(item_status(&res))
            }
            Ok(Response::Rejected(e)) => fail(meta_status(&e)),
            Ok(other) => fail(unexpected(&other)),
            Err(e) => fail(node_status(&e)),
        }
    }

    /// Heartbeat: records the client (only if it owns a segment) and tells
    /// it whether to mount again.
    pub(super) fn heartbeat_request(&self, r: pb::HeartbeatRequest) -> pb::HeartbeatResponse {
        self.node
            .counters()
            .heartbeat_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if r.client_id.is_empty() || r.client_id.len() > MAX_CLIENT_ID_LEN {
            return pb::HeartbeatResponse {
                status: Some(invalid(
                    ErrorCode::InvalidParams,
                    format!("client_id must be 1..={MAX_CLIENT_ID_LEN} bytes"),
                )),
                ..Default::default()
            };
        }
        let need_remount = match self.node.client_heartbeat(&r.client_id, &r.segment_ids) {
            Ok(need) => need,
            Err(e) => {
                return pb::HeartbeatResponse {
                    status: Some(node_status(&e)),
                    ..Default::default()
                }
            }
        };
        pb::HeartbeatResponse {
            status: Some(pb::Status::ok()),
            leader_time_ms: crate::node::now_ms(),
            result: if need_remount {
                pb::HeartbeatResult::NeedRemount as i32
            } else {
                pb::HeartbeatResult::HeartbeatOk as i32
            },
        }
    }
}
