//! `MasterService`: validates requests, turns writes into Raft commands, and
//! serves linearizable reads from the leader. What a read leases, a removal
//! refuses and a heartbeat records is the node's to decide
//! ([`MasterNode`]): a handler converts and makes one call.

use std::sync::Arc;

use crescent_auth::capability::{Access, Capability, SegmentKey, SEGMENT_KEY_LEN};
use crescent_proto::pb::{self, master_service_server::MasterService};
use crescent_proto::ErrorCode;
use crescent_raft::state::{
    CommitItem, MetaError, MetaState, Op, Origin, PutId, PutPolicy, Replica, ReplicateConfig,
    SegmentKeyBytes, SegmentSpec, Tier,
};
use crescent_raft::{sizing, Response};
use tonic::{Request, Response as TonicResponse, Status as TonicStatus};

use crate::config::PutMode;
use crate::node::placer::{Placed, AHEAD_KEY};
use crate::node::{MasterNode, NodeError};

type Rpc<T> = Result<TonicResponse<T>, TonicStatus>;

const MAX_CLIENT_ID_LEN: usize = 256;
const MAX_SEGMENT_NAME_LEN: usize = 256;
const MAX_PREFERRED_SEGMENTS: usize = 64;
/// Replicas a put may ask for: far above any deployment's segment count
/// divided by a sane replication factor, and it bounds a placement's size.
const MAX_REPLICA_NUM: u32 = 256;
const MAX_REGEX_BYTES: usize = 4096;

pub struct MasterApi {
    node: Arc<MasterNode>,
}

impl MasterApi {
    pub fn new(node: Arc<MasterNode>) -> Self {
        Self { node }
    }
}

fn ok<T>(v: T) -> Rpc<T> {
    Ok(TonicResponse::new(v))
}

pub fn node_status(e: &NodeError) -> pb::Status {
    match e {
        NodeError::NotLeader {
            leader_id,
            leader_addr,
        } => pb::Status::not_leader(*leader_id, leader_addr.clone()),
        NodeError::Timeout => pb::Status::error(ErrorCode::RpcTimeout, e.to_string()),
        NodeError::Unavailable(m) => pb::Status::error(ErrorCode::Unavailable, m.clone()),
        NodeError::TooLarge { .. } => pb::Status::error(ErrorCode::InvalidParams, e.to_string()),
    }
}

fn meta_status(e: &MetaError) -> pb::Status {
    pb::Status::error(e.code(), e.to_string())
}

fn item_status(r: &Result<(), MetaError>) -> pb::Status {
    match r {
        Ok(()) => pb::Status::ok(),
        Err(e) => meta_status(e),
    }
}

/// How an error names item `i` of a request of `n` items: not at all in a
/// single-object request (the batch core with one item).
fn item_prefix(i: usize, n: usize) -> String {
    if n > 1 {
        format!("item {i}: ")
    } else {
        String::new()
    }
}

fn invalid(code: ErrorCode, msg: impl Into<String>) -> pb::Status {
    pb::Status::error(code, msg)
}

/// What a replica descriptor lets its holder do on the data plane: write
/// the placement of a put, or read a complete replica, until `expiry_ms`
/// (Unix ms on this master's clock).
#[derive(Clone, Copy)]
struct GrantTerms {
    access: Access,
    expiry_ms: u64,
}

impl GrantTerms {
    fn new(access: Access, ttl: std::time::Duration) -> Self {
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
fn put_grant_terms(
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
fn replica_pb(state: &MetaState, r: &Replica, terms: GrantTerms) -> pb::ReplicaDescriptor {
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

fn unexpected(resp: &Response) -> pb::Status {
    pb::Status::error(
        ErrorCode::InternalError,
        format!("unexpected state machine response {resp:?}"),
    )
}

impl MasterApi {
    /// RemoveAll for the admin HTTP endpoint; returns the number removed.
    pub async fn remove_all_admin(&self, force: bool) -> Result<u64, pb::Status> {
        let header = pb::RequestHeader {
            client_id: format!("admin-http-{}", self.node.id()),
            request_seq: crate::node::now_ms() * 1000 + (rand::random::<u16>() % 1000) as u64,
        };
        let keys = self.matching_keys(|_| true).await?;
        self.remove_matching(Some(header), keys, force).await
    }

    fn check_key(&self, key: &str) -> Result<(), pb::Status> {
        if key.is_empty() {
            return Err(invalid(ErrorCode::InvalidKey, "key is empty"));
        }
        if key.len() > self.node.config().max_key_len {
            return Err(invalid(
                ErrorCode::InvalidKey,
                format!(
                    "key of {} bytes exceeds the limit of {} bytes",
                    key.len(),
                    self.node.config().max_key_len
                ),
            ));
        }
        Ok(())
    }

    /// Validates a request's keys; an error names the item when the request
    /// has several (a single-object RPC is this core with one item).
    fn check_keys<'a>(
        &self,
        keys: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<(), pb::Status> {
        let n = keys.len();
        let mut key_bytes = 0usize;
        for (i, k) in keys.enumerate() {
            if i >= crescent_proto::MAX_BATCH_ITEMS {
                return Err(invalid(
                    ErrorCode::InvalidParams,
                    format!("batch exceeds {} items", crescent_proto::MAX_BATCH_ITEMS),
                ));
            }
            self.check_key(k).map_err(|mut s| {
                s.message = format!("{}{}", item_prefix(i, n), s.message);
                s
            })?;
            key_bytes += k.len();
            if key_bytes > crescent_proto::MAX_BATCH_KEY_BYTES {
                return Err(invalid(
                    ErrorCode::InvalidParams,
                    format!(
                        "batch keys exceed {} bytes in all at item {i}; split the batch",
                        crescent_proto::MAX_BATCH_KEY_BYTES
                    ),
                ));
            }
        }
        Ok(())
    }

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

    /// Refuses a PutStart that would take its client past
    /// `--max-objects-per-client`, `--max-unfinished-puts-per-client` or
    /// `--max-key-bytes-per-client` (82 k unfinished puts with 1 KiB
    /// keys from one client id took the leader to 850 MB). Counted against
    /// what the state machine holds now, so concurrent batches of one client
    /// may overshoot by what is in flight. A retry of a request that was
    /// already applied passes: it adds nothing, and it must get the answer of
    /// its first attempt from the dedup table.
    fn check_put_quota(
        &self,
        origin: &Origin,
        items: &[(String, u64, PutId)],
    ) -> Result<(), pb::Status> {
        if !self.node.is_leader() {
            // A follower answers NOT_LEADER when it proposes; its view may lag.
            return Ok(());
        }
        let state = self.node.state();
        let applied = state
            .dedup
            .get(&origin.client_id)
            .is_some_and(|c| c.results.contains_key(&origin.seq));
        if applied {
            return Ok(());
        }
        let held = state.writer_usage(&origin.client_id);
        let cfg = self.node.config();
        // Only keys the state does not hold yet: a put of an existing key
        // adds nothing (and answers "already exists", which a client counts
        // as success), so it must not be refused at the limit.
        let (mut n, mut key_bytes) = (0u64, 0u64);
        for (key, _, _) in items
            .iter()
            .filter(|(k, _, _)| !state.objects.contains_key(k))
        {
            n += 1;
            key_bytes += key.len() as u64;
        }
        let m = self.node.counters();
        let quotas = [
            (
                held.objects,
                n,
                cfg.max_objects_per_client,
                "objects",
                "--max-objects-per-client",
                &m.quota_rejections_objects,
            ),
            (
                held.unfinished
                    .saturating_add(self.node.one_commit_inflight(&origin.client_id)),
                n,
                cfg.max_unfinished_puts_per_client,
                "unfinished puts",
                "--max-unfinished-puts-per-client",
                &m.quota_rejections_unfinished_puts,
            ),
            (
                held.key_bytes,
                key_bytes,
                cfg.max_key_bytes_per_client,
                "key bytes",
                "--max-key-bytes-per-client",
                &m.quota_rejections_key_bytes,
            ),
        ];
        for (held, asked, limit, what, flag, refusals) in quotas {
            if held.saturating_add(asked) > limit {
                refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(pb::Status::error(
                    ErrorCode::NoAvailableHandle,
                    format!(
                        "quota: client {} holds {held} {what} and asks for {asked} more ({flag} {limit}); finish or remove objects, or raise the limit",
                        origin.client_id
                    ),
                ));
            }
        }
        Ok(())
    }

    fn origin(header: Option<pb::RequestHeader>) -> Result<Origin, pb::Status> {
        let h = header.ok_or_else(|| {
            invalid(
                ErrorCode::InvalidParams,
                "request header (client_id, request_seq) is required for writes",
            )
        })?;
        if h.client_id.is_empty() || h.client_id.len() > MAX_CLIENT_ID_LEN {
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!("client_id must be 1..={MAX_CLIENT_ID_LEN} bytes"),
            ));
        }
        Ok(Origin {
            client_id: h.client_id,
            seq: h.request_seq,
        })
    }

    fn replicate_config(cfg: Option<pb::ReplicateConfig>) -> Result<ReplicateConfig, pb::Status> {
        let c = cfg.unwrap_or(pb::ReplicateConfig {
            replica_num: 1,
            ..Default::default()
        });
        if c.replica_num == 0 {
            return Err(invalid(
                ErrorCode::InvalidParams,
                "replica_num must be at least 1",
            ));
        }
        if c.replica_num > MAX_REPLICA_NUM {
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!("replica_num must be at most {MAX_REPLICA_NUM}"),
            ));
        }
        if c.preferred_segments.len() > MAX_PREFERRED_SEGMENTS {
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!("at most {MAX_PREFERRED_SEGMENTS} preferred segments"),
            ));
        }
        if c.avoid_segments.len() > crescent_proto::MAX_AVOID_SEGMENTS {
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!(
                    "at most {} segments to avoid",
                    crescent_proto::MAX_AVOID_SEGMENTS
                ),
            ));
        }
        Ok(ReplicateConfig {
            replica_num: c.replica_num,
            soft_pin: c.soft_pin,
            hard_pin: c.hard_pin,
            preferred_segments: c.preferred_segments,
        })
    }

    fn policy(&self) -> PutPolicy {
        let c = self.node.config();
        PutPolicy {
            discard_after_ms: c.put_start_discard_timeout.as_millis() as u64,
            release_after_ms: c.put_start_release_timeout.as_millis() as u64,
            soft_pin_ttl_ms: c.soft_pin_ttl.as_millis() as u64,
        }
    }

    async fn put_start_items(
        &self,
        header: Option<pb::RequestHeader>,
        items: Vec<(String, u64, PutId)>,
        config: Option<pb::ReplicateConfig>,
        one_commit: bool,
    ) -> Result<Vec<Started>, pb::Status> {
        let origin = Self::origin(header)?;
        if items.is_empty() {
            return Err(invalid(ErrorCode::InvalidParams, "empty batch"));
        }
        self.node
            .counters()
            .put_start_requests
            .fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.check_keys(items.iter().map(|(k, _, _)| k.as_str()))?;
        if let Some(i) = items.iter().position(|(_, size, _)| *size == 0) {
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!("{}size must be greater than 0", item_prefix(i, items.len())),
            ));
        }
        self.check_put_quota(&origin, &items)?;
        let avoid = config
            .as_ref()
            .map(|c| c.avoid_segments.clone())
            .unwrap_or_default();
        let mut config = Self::replicate_config(config)?;
        if !avoid.is_empty() {
            config.preferred_segments = self
                .node
                .preferred_avoiding(&config.preferred_segments, &avoid);
        }
        let n = items.len();
        // A write grant lasts as long as the put may: past the discard
        // timeout another put may take the key over (and a one-commit
        // placement may no longer be committed).
        let terms = GrantTerms::new(Access::Write, self.node.config().put_start_discard_timeout);
        let mut out: Vec<Option<Started>> = (0..n).map(|_| None).collect();
        let mut two_commit: Vec<usize> = (0..n).collect();
        let wants_one = one_commit && self.node.config().put_mode == PutMode::OneCommit;
        if wants_one && !self.already_applied(&origin) {
            if let Some(placed) = self
                .node
                .place_one_commit(&origin.client_id, &items, &config)
                .await
            {
                two_commit.clear();
                let state = self.node.state();
                for (i, (p, again_expiry)) in placed.into_iter().enumerate() {
                    match p {
                        Placed::Replicas(reps) | Placed::Again(reps) => {
                            let terms = placement_terms(terms, again_expiry);
                            out[i] = Some(Started {
                                replicas: Ok(reps
                                    .iter()
                                    .map(|x| replica_pb(&state, x, terms))
                                    .collect()),
                                pending: true,
                            })
                        }
                        Placed::Refused(e) => out[i] = Some(Started::failed(e)),
                        Placed::TwoCommit | Placed::NeedReservations(_) => two_commit.push(i),
                    }
                }
            }
        }
        if two_commit.is_empty() {
            return Ok(out.into_iter().map(Option::unwrap_or_default).collect());
        }
        let whole = two_commit.len() == n;
        let op = Op::PutStartNamed {
            items: two_commit.iter().map(|&i| items[i].clone()).collect(),
            config,
            policy: self.policy(),
        };
        let failed = |e: pb::Status, out: &mut Vec<Option<Started>>| {
            // Items placed for one commit keep their answer; the others
            // carry the refusal.
            for &i in &two_commit {
                out[i] = Some(Started::refused(e.clone()));
            }
        };
        let writer = origin.client_id.clone();
        match self.node.propose(Some(origin), op).await {
            Ok(Response::PutStart(v)) if v.len() == two_commit.len() => {
                let state = self.node.state();
                for (&i, r) in two_commit.iter().zip(v) {
                    if let Ok(reps) = &r {
                        if reps
                            .iter()
                            .any(|x| state.tier_of(x.segment_id) == Tier::Disk)
                        {
                            self.node
                                .counters()
                                .puts_to_disk
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    let (key, _, put_id) = &items[i];
                    let terms = put_grant_terms(&state, key, &writer, *put_id, terms);
                    out[i] = Some(Started {
                        replicas: r
                            .map(|reps| reps.iter().map(|x| replica_pb(&state, x, terms)).collect())
                            .map_err(StartRefusal::from),
                        pending: false,
                    });
                }
            }
            Ok(Response::Rejected(e)) if whole => return Err(meta_status(&e)),
            Ok(Response::Rejected(e)) => failed(meta_status(&e), &mut out),
            Ok(other) if whole => return Err(unexpected(&other)),
            Ok(other) => failed(unexpected(&other), &mut out),
            Err(e) if whole => return Err(node_status(&e)),
            Err(e) => failed(node_status(&e), &mut out),
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Whether the state already holds the answer to this request (a retry):
    /// then it must get that answer, not a new placement.
    fn already_applied(&self, origin: &Origin) -> bool {
        self.node
            .state()
            .dedup
            .get(&origin.client_id)
            .is_some_and(|c| c.results.contains_key(&origin.seq))
    }

    /// The origin of a request of `n` items, which must be at least one.
    fn batch_origin(header: Option<pb::RequestHeader>, n: usize) -> Result<Origin, pb::Status> {
        let origin = Self::origin(header)?;
        if n == 0 {
            return Err(invalid(ErrorCode::InvalidParams, "empty batch"));
        }
        Ok(origin)
    }

    async fn item_op(
        &self,
        header: Option<pb::RequestHeader>,
        n: usize,
        op: Op,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        let origin = Self::batch_origin(header, n)?;
        match self.node.propose(Some(origin), op).await {
            Ok(Response::Items(v)) if v.len() == n => Ok(v),
            Ok(Response::Rejected(e)) => Err(meta_status(&e)),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(node_status(&e)),
        }
    }

    /// PutEnd of `items`: the core of PutEnd and BatchPutEnd, so counting,
    /// validation and the test-only flag cannot drift between them. Items
    /// placed for one commit carry their placement, and one entry records
    /// each with its object; the others finish a committed PutStart.
    async fn put_end_items(
        &self,
        header: Option<pb::RequestHeader>,
        items: Vec<EndItem>,
        config: Option<pb::ReplicateConfig>,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        self.node
            .counters()
            .put_end_requests
            .fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.check_keys(items.iter().map(|i| i.key.as_str()))?;
        let n = items.len();
        if let Some(i) = items
            .iter()
            .position(|i| i.ahead && (i.placement.is_empty() || i.put_id == 0))
        {
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!(
                    "{}a put placed ahead carries its placement and its put id",
                    item_prefix(i, n)
                ),
            ));
        }
        // A put into a placement made ahead had no PutStart: counted here,
        // so the PutStart count stays one per put started, as Mooncake's.
        let ahead = items.iter().filter(|i| i.ahead).count() as u64;
        if ahead > 0 {
            self.node
                .counters()
                .put_start_requests
                .fetch_add(ahead, std::sync::atomic::Ordering::Relaxed);
        }
        // Where the placer filed each item's placement: under its key, or
        // (placed ahead, before the key was known) under its put id alone.
        let placer_keys: Vec<String> = items
            .iter()
            .map(|i| {
                if i.ahead {
                    AHEAD_KEY.to_string()
                } else {
                    i.key.clone()
                }
            })
            .collect();
        if items.iter().all(|i| i.placement.is_empty()) {
            let op = Op::PutEndNamed {
                items: items
                    .into_iter()
                    .map(|i| (i.key, i.checksum, i.put_id))
                    .collect(),
            };
            if self.node.config().unsafe_ack_before_commit {
                return self.put_end_unsafely(header, n, op);
            }
            return self.item_op(header, n, op).await;
        }
        let origin = Self::batch_origin(header.clone(), n)?;
        let config = Self::replicate_config(config)?;
        // Each placement must be what a leader granted: its write grants
        // are signed with the segments' keys, so a writer cannot commit a
        // range nobody placed it in.
        let mut refused: Vec<Option<MetaError>> = (0..n).map(|_| None).collect();
        let mut commits = Vec::with_capacity(n);
        {
            let state = self.node.state();
            for (i, item) in items.into_iter().enumerate() {
                let (replicas, deadline_ms) = if item.placement.is_empty() {
                    (Vec::new(), u64::MAX)
                } else {
                    match verified_placement(&state, &item.placement, item.size, config.replica_num)
                    {
                        Ok(v) => v,
                        Err(why) => {
                            refused[i] =
                                Some(MetaError::InvalidWrite(format!("{}: {why}", item.key)));
                            (Vec::new(), 0)
                        }
                    }
                };
                commits.push(CommitItem {
                    key: item.key,
                    size: item.size,
                    checksum: item.checksum,
                    put_id: item.put_id,
                    replicas,
                    deadline_ms,
                });
            }
        }
        // In this leader's own reservations only its own placement of this
        // very put may be committed, one commit at a time: its memory frees
        // what a refused commit leaves, and must never free what another
        // commit took. A retry of a request already applied skips this and
        // gets the first attempt's answer from the dedup table.
        if !self.already_applied(&origin) {
            let asked: Vec<(&str, PutId, &[Replica])> = commits
                .iter()
                .zip(&refused)
                .zip(&placer_keys)
                .filter(|((c, r), _)| r.is_none() && !c.replicas.is_empty())
                .map(|((c, _), k)| (k.as_str(), c.put_id, c.replicas.as_slice()))
                .collect();
            let allowed = self
                .node
                .begin_commits(&origin.client_id, &asked)
                // A commit of one of these placements is in flight: retry
                // later with the same request id and find its outcome.
                .map_err(|_| node_status(&NodeError::Timeout))?;
            let mut allowed = allowed.into_iter();
            for (c, r) in commits.iter().zip(refused.iter_mut()) {
                if r.is_none() && !c.replicas.is_empty() && allowed.next() == Some(false) {
                    *r = Some(MetaError::InvalidWrite(format!(
                        "{}: not a placement this leader made for this put",
                        c.key
                    )));
                }
            }
        }
        // Refused items are left out of the entry; their answer is the refusal.
        let keep: Vec<usize> = (0..n).filter(|i| refused[*i].is_none()).collect();
        let kept_placer_keys: Vec<String> = keep.iter().map(|&i| placer_keys[i].clone()).collect();
        let commits: Vec<CommitItem> = commits
            .into_iter()
            .enumerate()
            .filter(|(i, _)| refused[*i].is_none())
            .map(|(_, c)| c)
            .collect();
        let mut results: Vec<Result<(), MetaError>> =
            refused.into_iter().map(|r| r.map_or(Ok(()), Err)).collect();
        if commits.is_empty() {
            return Ok(results);
        }
        let m = commits.len();
        let op = Op::PutCommit {
            items: commits.clone(),
            config,
            policy: self.policy(),
        };
        if self.node.config().unsafe_ack_before_commit {
            self.put_end_unsafely(header, m, op)?;
            return Ok(results);
        }
        let client = origin.client_id.clone();
        let outcome = self
            .node
            .propose_settled(Some(origin), op, move |node, outcome| {
                // The placer learns each placed put's fate once it is known,
                // even if this request is gone by then. Only a refusal in
                // the applied entry, or an entry never proposed, frees a
                // range (and only what the state still has free); any other
                // outcome may yet commit, so the range stays held.
                let taken: Vec<bool> = match outcome {
                    Ok(Response::Items(v)) if v.len() == commits.len() => {
                        v.iter().map(Result::is_ok).collect()
                    }
                    Err(NodeError::TooLarge { .. }) => vec![false; commits.len()],
                    _ => vec![true; commits.len()],
                };
                for ((c, taken), placer_key) in commits.iter().zip(taken).zip(&kept_placer_keys) {
                    if !c.replicas.is_empty() {
                        node.end_commit(&client, placer_key, c.put_id, &c.replicas, taken);
                    }
                }
            })
            .await;
        match outcome {
            Ok(Response::Items(v)) if v.len() == m => {
                for (&i, r) in keep.iter().zip(v) {
                    results[i] = r;
                }
                Ok(results)
            }
            Ok(Response::Rejected(e)) => Err(meta_status(&e)),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(node_status(&e)),
        }
    }

    /// The deliberately broken PutEnd of `--unsafe-ack-before-commit`: answers
    /// OK at once and proposes the commit later, so a leader that dies in
    /// between loses a write it acknowledged.
    fn put_end_unsafely(
        &self,
        header: Option<pb::RequestHeader>,
        n: usize,
        op: Op,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        let origin = Self::batch_origin(header, n)?;
        let node = self.node.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            if let Err(e) = node.propose(Some(origin), op).await {
                tracing::warn!(error = %e, "unsafe early-acknowledged PutEnd did not commit");
            }
        });
        Ok((0..n).map(|_| Ok(())).collect())
    }

    /// PutRevoke of `items` (key, put id): the core of PutRevoke and
    /// BatchPutRevoke. A put this leader placed for one commit is only in
    /// its memory: revoking it frees the range there, with no entry.
    async fn put_revoke_items(
        &self,
        header: Option<pb::RequestHeader>,
        items: Vec<(String, PutId)>,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        self.check_keys(items.iter().map(|(k, _)| k.as_str()))?;
        let n = items.len();
        let origin = Self::batch_origin(header.clone(), n)?;
        let (in_memory, in_state): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| {
            let (key, put_id) = &items[i];
            *put_id != 0 && self.node.revoke_placement(&origin.client_id, key, *put_id)
        });
        if in_memory.is_empty() {
            return self.item_op(header, n, Op::PutRevokeNamed { items }).await;
        }
        let mut results: Vec<Result<(), MetaError>> = (0..n).map(|_| Ok(())).collect();
        if !in_state.is_empty() {
            let rest: Vec<(String, PutId)> = in_state.iter().map(|&i| items[i].clone()).collect();
            let v = self
                .item_op(header, rest.len(), Op::PutRevokeNamed { items: rest })
                .await?;
            for (&i, r) in in_state.iter().zip(v) {
                results[i] = r;
            }
        }
        Ok(results)
    }

    /// The placements ahead a PutEnd asks for (`next_put_id`, or a batch's
    /// `next`): one-commit placements, each of its size, filed under the
    /// writer's put id alone, their keys named by the PutEnds that use them.
    /// Only the one-commit path (which may commit a Reserve entry, never one
    /// for the puts); when this leader cannot place them all for one commit
    /// now, there are none, and the writer's next puts start the usual way.
    /// A retried PutEnd gets the placements its first attempt got, with the
    /// same grants' expiry. Each answer is (put id, replicas), for those
    /// placed.
    async fn place_ahead(
        &self,
        header: Option<pb::RequestHeader>,
        next: &[(u64, PutId)],
        config: Option<pb::ReplicateConfig>,
    ) -> Result<Vec<(PutId, Vec<pb::ReplicaDescriptor>)>, String> {
        if next.iter().any(|&(size, put_id)| put_id == 0 || size == 0) {
            return Err("a placement ahead needs a put id and a size".into());
        }
        if self.node.config().put_mode != PutMode::OneCommit || !self.node.is_leader() {
            return Err("not placing for one commit".into());
        }
        let origin = Self::origin(header).map_err(|s| s.message)?;
        let items: Vec<(String, u64, PutId)> = next
            .iter()
            .map(|&(size, put_id)| (AHEAD_KEY.to_string(), size, put_id))
            .collect();
        self.check_put_quota(&origin, &items)
            .map_err(|s| s.message)?;
        let config = Self::replicate_config(config).map_err(|s| s.message)?;
        // Before placing, as at PutStart: the grants must expire no later
        // than the placer's discard time, which it takes from before its
        // lease check and any Reserve commit (docs/one-commit-puts.md, rule 5).
        let terms = GrantTerms::new(Access::Write, self.node.config().put_start_discard_timeout);
        let placed = self
            .node
            .place_one_commit(&origin.client_id, &items, &config)
            .await
            .ok_or("this leader holds no lease or is handing over")?;
        let state = self.node.state();
        let mut made = 0u64;
        let mut out = Vec::with_capacity(next.len());
        for ((_, put_id), (placed, again_expiry)) in next.iter().zip(placed) {
            let reps = match placed {
                Placed::Replicas(reps) | Placed::Again(reps) => reps,
                other => {
                    tracing::debug!(put_id, ?other, "a placement ahead was not made");
                    continue;
                }
            };
            made += u64::from(again_expiry.is_none());
            let terms = placement_terms(terms, again_expiry);
            out.push((
                *put_id,
                reps.iter().map(|x| replica_pb(&state, x, terms)).collect(),
            ));
        }
        self.node
            .counters()
            .placements_ahead
            .fetch_add(made, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// The core of PutEnd and BatchPutEnd: commits `items` and, while that
    /// commit waits on the log's fsyncs, places the writer's next puts
    /// `asked` (size, put id) ahead, which saves the writer a PutStart. The
    /// placements made (put id, replicas) come whatever the commit's outcome.
    async fn put_end_placing_ahead(
        &self,
        header: Option<pb::RequestHeader>,
        items: Vec<EndItem>,
        config: Option<pb::ReplicateConfig>,
        asked: &[(u64, PutId)],
    ) -> (
        Result<Vec<Result<(), MetaError>>, pb::Status>,
        Vec<(PutId, Vec<pb::ReplicaDescriptor>)>,
    ) {
        let end = self.put_end_items(header.clone(), items, config.clone());
        let (ended, next) = if asked.is_empty() {
            (end.await, Ok(Vec::new()))
        } else {
            tokio::join!(end, self.place_ahead(header, asked, config))
        };
        let next = next.unwrap_or_else(|why| {
            tracing::debug!(%why, "no placement ahead");
            Vec::new()
        });
        (ended, next)
    }

    /// A PutRevoke of a placement made ahead and not used (`ahead`): only
    /// this leader's memory holds it. Nothing to revoke (another leader's
    /// placement, or one already settled) is OK: an unused placement of an
    /// earlier leader stays out of use until its reservation is retired.
    fn put_revoke_ahead(&self, r: pb::PutRevokeRequest) -> Result<(), pb::Status> {
        if !r.key.is_empty() || r.put_id == 0 {
            return Err(invalid(
                ErrorCode::InvalidParams,
                "a revoke of a placement ahead has no key and names its put id",
            ));
        }
        let origin = Self::origin(r.header)?;
        if self
            .node
            .revoke_placement(&origin.client_id, AHEAD_KEY, r.put_id)
        {
            self.node
                .counters()
                .placements_ahead_given_back
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Remove of `keys`: the core of Remove and BatchRemove.
    async fn remove_items(
        &self,
        header: Option<pb::RequestHeader>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        self.node
            .counters()
            .remove_requests
            .fetch_add(keys.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.check_keys(keys.iter().map(String::as_str))?;
        if keys.is_empty() {
            return Err(invalid(ErrorCode::InvalidParams, "empty batch"));
        }
        self.remove_keys(header, keys, force).await
    }

    /// Removes keys; which ones a removal refuses, and why, is
    /// [`MasterNode::propose_remove`]'s.
    async fn remove_keys(
        &self,
        header: Option<pb::RequestHeader>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        let origin = Self::origin(header)?;
        self.remove_keys_as(Some(origin), keys, force).await
    }

    /// Removes the keys that remove-all or remove-by-regex matched and
    /// returns how many went. Keys beyond one log entry
    /// ([`sizing::ENTRY_KEY_BUDGET`]) are removed in several entries, each
    /// without the request's dedup origin (one origin answers one entry): a
    /// retry of such a request removes whatever still matches instead of
    /// repeating the first answer.
    async fn remove_matching(
        &self,
        header: Option<pb::RequestHeader>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<u64, pb::Status> {
        let origin = Self::origin(header)?;
        let key_bytes: usize = keys.iter().map(String::len).sum();
        if key_bytes <= sizing::ENTRY_KEY_BUDGET {
            return Ok(count_ok(
                &self.remove_keys_as(Some(origin), keys, force).await?,
            ));
        }
        let mut removed = 0;
        for chunk in sizing::chunk_keys(keys, sizing::ENTRY_KEY_BUDGET) {
            removed += count_ok(&self.remove_keys_as(None, chunk, force).await?);
        }
        Ok(removed)
    }

    async fn remove_keys_as(
        &self,
        origin: Option<Origin>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let n = keys.len();
        match self.node.propose_remove(origin, keys, force).await {
            Ok(Response::Items(v)) if v.len() == n => Ok(v),
            Ok(Response::Rejected(e)) => Err(meta_status(&e)),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(node_status(&e)),
        }
    }

    /// GetReplicaList of `keys`: the core of GetReplicaList and
    /// BatchGetReplicaList.
    async fn replica_lists(
        &self,
        keys: &[String],
    ) -> Result<Vec<pb::GetReplicaListResponse>, pb::Status> {
        self.node
            .counters()
            .get_replica_list_requests
            .fetch_add(keys.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.lookup(keys).await
    }

    /// Looks `keys` up after a read barrier, leasing those found.
    async fn lookup(&self, keys: &[String]) -> Result<Vec<pb::GetReplicaListResponse>, pb::Status> {
        self.check_keys(keys.iter().map(String::as_str))?;
        self.node
            .linearizable_read()
            .await
            .map_err(|e| node_status(&e))?;
        let lease_ms = self.node.config().lease_ttl.as_millis() as u64;
        let deadline = tokio::time::Instant::now() + self.node.config().write_timeout;
        loop {
            // A doomed key's removal or eviction is in flight: wait for its
            // fate rather than guess it (answering "not found" for a removal
            // that turns out a no-op broke linearizability in a soak).
            let settled = self.node.doom_settled();
            tokio::pin!(settled);
            if let Some(out) = self.lookup_now(keys, lease_ms, settled.as_mut()) {
                return Ok(out);
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return Err(pb::Status::error(
                    ErrorCode::RpcTimeout,
                    "a removal of a looked-up key is still in flight",
                ));
            }
        }
    }

    /// The lookup's answers and leases, or None (with `settled` enabled
    /// under the same lock) when a key is doomed.
    fn lookup_now(
        &self,
        keys: &[String],
        lease_ms: u64,
        settled: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    ) -> Option<Vec<pb::GetReplicaListResponse>> {
        // A read grant lasts as long as the read lease that keeps the bytes.
        let terms = GrantTerms::new(Access::Read, std::time::Duration::from_millis(lease_ms));
        self.node
            .lookup_leasing(keys, settled, |state, looked| match looked {
                Ok(view) => pb::GetReplicaListResponse {
                    status: Some(pb::Status::ok()),
                    replicas: view
                        .replicas
                        .iter()
                        .map(|r| replica_pb(state, r, terms))
                        .collect(),
                    size: view.size,
                    checksum: view.checksum,
                    lease_ttl_ms: lease_ms,
                },
                Err(e) => pb::GetReplicaListResponse {
                    status: Some(meta_status(&e)),
                    ..Default::default()
                },
            })
    }

    /// Exist of `keys`: the core of Exist and BatchExist.
    async fn exists(&self, keys: &[String]) -> Result<Vec<pb::ExistResponse>, pb::Status> {
        self.node
            .counters()
            .exist_requests
            .fetch_add(keys.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let looked = self.lookup(keys).await?;
        Ok(looked
            .into_iter()
            .map(|r| {
                let st = r.status.unwrap_or_default();
                match st.error_code() {
                    ErrorCode::Ok => pb::ExistResponse {
                        status: Some(pb::Status::ok()),
                        exists: true,
                    },
                    // Missing or still being written: not (yet) an object.
                    ErrorCode::ObjectNotFound | ErrorCode::ReplicaIsNotReady => pb::ExistResponse {
                        status: Some(pb::Status::ok()),
                        exists: false,
                    },
                    _ => pb::ExistResponse {
                        status: Some(st),
                        exists: false,
                    },
                }
            })
            .collect())
    }

    /// Keys of all objects matching `pred`, read after a read barrier.
    async fn matching_keys(&self, pred: impl Fn(&str) -> bool) -> Result<Vec<String>, pb::Status> {
        self.node
            .linearizable_read()
            .await
            .map_err(|e| node_status(&e))?;
        let state = self.node.state();
        Ok(state.objects.keys().filter(|k| pred(k)).cloned().collect())
    }
}

/// One item's PutStart answer: its replicas or refusal, and whether it was
/// placed for one commit (its PutEnd must then carry the placement).
#[derive(Clone)]
struct Started {
    replicas: Result<Vec<pb::ReplicaDescriptor>, StartRefusal>,
    pending: bool,
}

#[derive(Clone)]
enum StartRefusal {
    Meta(MetaError),
    Status(pb::Status),
}

impl From<MetaError> for StartRefusal {
    fn from(e: MetaError) -> Self {
        StartRefusal::Meta(e)
    }
}

impl Default for Started {
    fn default() -> Self {
        Started::refused(invalid(ErrorCode::InternalError, "item not answered"))
    }
}

impl Started {
    fn failed(e: MetaError) -> Self {
        Self {
            replicas: Err(StartRefusal::Meta(e)),
            pending: false,
        }
    }

    fn refused(s: pb::Status) -> Self {
        Self {
            replicas: Err(StartRefusal::Status(s)),
            pending: false,
        }
    }

    fn into_parts(self) -> (pb::Status, Vec<pb::ReplicaDescriptor>, bool) {
        match self.replicas {
            Ok(reps) => (pb::Status::ok(), reps, self.pending),
            Err(StartRefusal::Meta(e)) => (meta_status(&e), Vec::new(), false),
            Err(StartRefusal::Status(s)) => (s, Vec::new(), false),
        }
    }
}

/// One item of a PutEnd (see `PutEndRequest` in master.proto).
/// The write grants' terms of a one-commit placement: `fresh` for a new
/// one; a placement given again keeps its first grants' expiry, so its
/// commit deadline does not move.
fn placement_terms(fresh: GrantTerms, again_expiry_ms: Option<u64>) -> GrantTerms {
    again_expiry_ms.map_or(fresh, |expiry_ms| GrantTerms {
        access: Access::Write,
        expiry_ms,
    })
}

struct EndItem {
    key: String,
    checksum: u32,
    put_id: PutId,
    placement: Vec<pb::ReplicaDescriptor>,
    size: u64,
    /// Its placement was made ahead, filed under [`AHEAD_KEY`].
    ahead: bool,
}

/// The replicas of a one-commit placement and its commit deadline (the
/// earliest grant expiry), if every descriptor carries a write grant that
/// its segment's key signed for exactly that range, of `size` bytes.
fn verified_placement(
    state: &MetaState,
    placement: &[pb::ReplicaDescriptor],
    size: u64,
    replica_num: u32,
) -> Result<(Vec<Replica>, u64), String> {
    if size == 0 {
        return Err("a placed put needs its size".into());
    }
    if placement.len() > replica_num.max(1) as usize {
        return Err(format!(
            "{} replicas placed for replica_num {replica_num}",
            placement.len()
        ));
    }
    let mut deadline = u64::MAX;
    let mut replicas: Vec<Replica> = Vec::with_capacity(placement.len());
    for d in placement {
        if replicas.iter().any(|r| r.segment_id == d.segment_id) {
            return Err(format!("two replicas on segment {}", d.segment_id));
        }
        if d.length != size {
            return Err(format!(
                "a replica of {} bytes for an object of {size}",
                d.length
            ));
        }
        let key = state
            .segments
            .get(&d.segment_id)
            .and_then(|s| SegmentKey::from_slice(&s.key.0))
            .ok_or_else(|| format!("segment {} is gone or signs no grants", d.segment_id))?;
        let mac = key.sign(&Capability {
            segment_id: d.segment_id,
            offset: d.offset,
            len: d.length,
            access: Access::Write,
            expiry_ms: d.grant_expiry_ms,
        });
        if !crescent_auth::constant_time_eq(mac.as_ref(), &d.grant_mac) {
            return Err("its placement does not carry a grant a master signed".into());
        }
        deadline = deadline.min(d.grant_expiry_ms);
        replicas.push(Replica {
            segment_id: d.segment_id,
            offset: d.offset,
            len: d.length,
        });
    }
    Ok((replicas, deadline))
}

/// Why a BatchPutEnd's `next` is refused: too many, or a put id twice (or
/// one of the batch's own), which would leave one placement unnamed.
fn bad_next(next: &[pb::NextPut], items: &[pb::PutEndItem]) -> Option<String> {
    if next.len() > crescent_proto::MAX_AHEAD_PER_REQUEST {
        return Some(format!(
            "asks for {} placements ahead; at most {} per BatchPutEnd",
            next.len(),
            crescent_proto::MAX_AHEAD_PER_REQUEST
        ));
    }
    let mut ids: std::collections::HashSet<u64> = items.iter().map(|i| i.put_id).collect();
    next.iter().find(|n| !ids.insert(n.put_id)).map(|n| {
        format!(
            "put id {} is asked for twice, or is a put of this batch",
            n.put_id
        )
    })
}

/// A BatchPutEnd's answer: its items' (as [`batch_status`]) and the
/// placements made ahead.
fn batch_put_end_response(
    ended: Result<Vec<Result<(), MetaError>>, pb::Status>,
    next: Vec<(PutId, Vec<pb::ReplicaDescriptor>)>,
) -> pb::BatchPutEndResponse {
    let status = batch_status(ended);
    pb::BatchPutEndResponse {
        status: status.status,
        results: status.results,
        next: next
            .into_iter()
            .map(|(put_id, replicas)| pb::PlacedAhead { put_id, replicas })
            .collect(),
    }
}

fn batch_status(r: Result<Vec<Result<(), MetaError>>, pb::Status>) -> pb::BatchStatusResponse {
    match r {
        Ok(v) => pb::BatchStatusResponse {
            status: Some(pb::Status::ok()),
            results: v.iter().map(item_status).collect(),
        },
        Err(s) => pb::BatchStatusResponse {
            status: Some(s),
            results: Vec::new(),
        },
    }
}

fn single_status(r: Result<Vec<Result<(), MetaError>>, pb::Status>) -> pb::StatusResponse {
    let status = match r {
        Ok(v) => v.first().map(item_status).unwrap_or_else(pb::Status::ok),
        Err(s) => s,
    };
    pb::StatusResponse {
        status: Some(status),
    }
}

fn count_ok(v: &[Result<(), MetaError>]) -> u64 {
    v.iter().filter(|r| r.is_ok()).count() as u64
}

#[tonic::async_trait]
impl MasterService for MasterApi {
    async fn put_start(&self, request: Request<pb::PutStartRequest>) -> Rpc<pb::PutStartResponse> {
        let r = request.into_inner();
        let out = self
            .put_start_items(
                r.header,
                vec![(r.key, r.size, r.put_id)],
                r.config,
                r.one_commit,
            )
            .await;
        let started = match out {
            Ok(mut v) => v.pop().unwrap_or_else(|| {
                Started::refused(invalid(ErrorCode::InternalError, "empty result"))
            }),
            Err(s) => Started::refused(s),
        };
        let (status, replicas, pending) = started.into_parts();
        ok(pb::PutStartResponse {
            status: Some(status),
            replicas,
            pending,
        })
    }

    async fn batch_put_start(
        &self,
        request: Request<pb::BatchPutStartRequest>,
    ) -> Rpc<pb::BatchPutStartResponse> {
        let r = request.into_inner();
        let items = r
            .items
            .into_iter()
            .map(|i| (i.key, i.size, i.put_id))
            .collect();
        ok(
            match self
                .put_start_items(r.header, items, r.config, r.one_commit)
                .await
            {
                Ok(v) => pb::BatchPutStartResponse {
                    status: Some(pb::Status::ok()),
                    results: v
                        .into_iter()
                        .map(|x| {
                            let (status, replicas, pending) = x.into_parts();
                            pb::PutStartResult {
                                status: Some(status),
                                replicas,
                                pending,
                            }
                        })
                        .collect(),
                },
                Err(s) => pb::BatchPutStartResponse {
                    status: Some(s),
                    results: vec![],
                },
            },
        )
    }

    async fn put_end(&self, request: Request<pb::PutEndRequest>) -> Rpc<pb::PutEndResponse> {
        let r = request.into_inner();
        let asked: &[(u64, PutId)] = if r.next_put_id != 0 {
            &[(r.size, r.next_put_id)]
        } else {
            &[]
        };
        let items = vec![EndItem {
            key: r.key,
            checksum: r.checksum,
            put_id: r.put_id,
            placement: r.placement,
            size: r.size,
            ahead: r.ahead,
        }];
        let (ended, mut next) = self
            .put_end_placing_ahead(r.header, items, r.config, asked)
            .await;
        ok(pb::PutEndResponse {
            status: single_status(ended).status,
            next: next.pop().map(|(_, replicas)| replicas).unwrap_or_default(),
        })
    }

    async fn batch_put_end(
        &self,
        request: Request<pb::BatchPutEndRequest>,
    ) -> Rpc<pb::BatchPutEndResponse> {
        let r = request.into_inner();
        if let Some(why) = bad_next(&r.next, &r.items) {
            let refused = Err(invalid(ErrorCode::InvalidParams, why));
            return ok(batch_put_end_response(refused, Vec::new()));
        }
        let items = r
            .items
            .into_iter()
            .map(|i| EndItem {
                key: i.key,
                checksum: i.checksum,
                put_id: i.put_id,
                placement: i.placement,
                size: i.size,
                ahead: i.ahead,
            })
            .collect();
        let asked: Vec<(u64, PutId)> = r.next.iter().map(|n| (n.size, n.put_id)).collect();
        let (ended, next) = self
            .put_end_placing_ahead(r.header, items, r.config, &asked)
            .await;
        ok(batch_put_end_response(ended, next))
    }

    async fn put_revoke(&self, request: Request<pb::PutRevokeRequest>) -> Rpc<pb::StatusResponse> {
        let r = request.into_inner();
        if r.ahead {
            return ok(single_status(
                self.put_revoke_ahead(r).map(|()| vec![Ok(())]),
            ));
        }
        let items = vec![(r.key, r.put_id)];
        ok(single_status(self.put_revoke_items(r.header, items).await))
    }

    async fn batch_put_revoke(
        &self,
        request: Request<pb::BatchPutRevokeRequest>,
    ) -> Rpc<pb::BatchStatusResponse> {
        let r = request.into_inner();
        let n = r.keys.len();
        let put_ids = if r.put_ids.is_empty() {
            vec![0; n]
        } else if r.put_ids.len() == n {
            r.put_ids
        } else {
            return ok(batch_status(Err(invalid(
                ErrorCode::InvalidParams,
                format!("{n} keys but {} put ids", r.put_ids.len()),
            ))));
        };
        let items = r.keys.into_iter().zip(put_ids).collect();
        ok(batch_status(self.put_revoke_items(r.header, items).await))
    }

    async fn get_replica_list(
        &self,
        request: Request<pb::GetReplicaListRequest>,
    ) -> Rpc<pb::GetReplicaListResponse> {
        let r = request.into_inner();
        ok(
            match self.replica_lists(std::slice::from_ref(&r.key)).await {
                Ok(mut v) => v.pop().unwrap_or_default(),
                Err(s) => pb::GetReplicaListResponse {
                    status: Some(s),
                    ..Default::default()
                },
            },
        )
    }

    async fn batch_get_replica_list(
        &self,
        request: Request<pb::BatchGetReplicaListRequest>,
    ) -> Rpc<pb::BatchGetReplicaListResponse> {
        let r = request.into_inner();
        ok(match self.replica_lists(&r.keys).await {
            Ok(results) => pb::BatchGetReplicaListResponse {
                status: Some(pb::Status::ok()),
                results,
            },
            Err(s) => pb::BatchGetReplicaListResponse {
                status: Some(s),
                results: vec![],
            },
        })
    }

    async fn exist(&self, request: Request<pb::ExistRequest>) -> Rpc<pb::ExistResponse> {
        let r = request.into_inner();
        ok(match self.exists(std::slice::from_ref(&r.key)).await {
            Ok(mut v) => v.pop().unwrap_or_default(),
            Err(s) => pb::ExistResponse {
                status: Some(s),
                exists: false,
            },
        })
    }

    async fn batch_exist(
        &self,
        request: Request<pb::BatchExistRequest>,
    ) -> Rpc<pb::BatchExistResponse> {
        let r = request.into_inner();
        ok(match self.exists(&r.keys).await {
            Ok(results) => pb::BatchExistResponse {
                status: Some(pb::Status::ok()),
                results,
            },
            Err(s) => pb::BatchExistResponse {
                status: Some(s),
                results: vec![],
            },
        })
    }

    async fn remove(&self, request: Request<pb::RemoveRequest>) -> Rpc<pb::StatusResponse> {
        let r = request.into_inner();
        ok(single_status(
            self.remove_items(r.header, vec![r.key], r.force).await,
        ))
    }

    async fn batch_remove(
        &self,
        request: Request<pb::BatchRemoveRequest>,
    ) -> Rpc<pb::BatchStatusResponse> {
        let r = request.into_inner();
        ok(batch_status(
            self.remove_items(r.header, r.keys, r.force).await,
        ))
    }

    async fn remove_by_regex(
        &self,
        request: Request<pb::RemoveByRegexRequest>,
    ) -> Rpc<pb::CountResponse> {
        let r = request.into_inner();
        if r.regex.len() > MAX_REGEX_BYTES {
            return ok(pb::CountResponse {
                status: Some(invalid(
                    ErrorCode::InvalidParams,
                    format!("regex longer than {MAX_REGEX_BYTES} bytes"),
                )),
                count: 0,
            });
        }
        let re = match regex::RegexBuilder::new(&r.regex)
            .size_limit(1 << 20)
            .build()
        {
            Ok(re) => re,
            Err(e) => {
                return ok(pb::CountResponse {
                    status: Some(invalid(
                        ErrorCode::InvalidParams,
                        format!("invalid regex: {e}"),
                    )),
                    count: 0,
                })
            }
        };
        if let Err(s) = Self::origin(r.header.clone()) {
            return ok(pb::CountResponse {
                status: Some(s),
                count: 0,
            });
        }
        let keys = match self.matching_keys(|k| re.is_match(k)).await {
            Ok(k) => k,
            Err(s) => {
                return ok(pb::CountResponse {
                    status: Some(s),
                    count: 0,
                })
            }
        };
        ok(match self.remove_matching(r.header, keys, r.force).await {
            Ok(count) => pb::CountResponse {
                status: Some(pb::Status::ok()),
                count,
            },
            Err(s) => pb::CountResponse {
                status: Some(s),
                count: 0,
            },
        })
    }

    async fn remove_all(&self, request: Request<pb::RemoveAllRequest>) -> Rpc<pb::CountResponse> {
        let r = request.into_inner();
        if let Err(s) = Self::origin(r.header.clone()) {
            return ok(pb::CountResponse {
                status: Some(s),
                count: 0,
            });
        }
        let keys = match self.matching_keys(|_| true).await {
            Ok(k) => k,
            Err(s) => {
                return ok(pb::CountResponse {
                    status: Some(s),
                    count: 0,
                })
            }
        };
        ok(match self.remove_matching(r.header, keys, r.force).await {
            Ok(count) => pb::CountResponse {
                status: Some(pb::Status::ok()),
                count,
            },
            Err(s) => pb::CountResponse {
                status: Some(s),
                count: 0,
            },
        })
    }

    async fn mount_segment(
        &self,
        request: Request<pb::MountSegmentRequest>,
    ) -> Rpc<pb::MountSegmentResponse> {
        let r = request.into_inner();
        self.node
            .counters()
            .mount_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fail = |s| {
            ok(pb::MountSegmentResponse {
                status: Some(s),
                segment_id: 0,
            })
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
        // A memory mount keeps its older entry, so logs stay readable by
        // the build before the disk tier.
        let op = match tier {
            Tier::Memory if seg.disk_id.is_empty() => Op::MountSegmentKeyed {
                spec,
                owner: owner.clone(),
                key,
            },
            _ => Op::MountTieredSegment {
                spec,
                owner: owner.clone(),
                key,
                tier,
                disk_id: seg.disk_id,
            },
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
                ok(pb::MountSegmentResponse {
                    status: Some(pb::Status::ok()),
                    segment_id: id,
                })
            }
            Ok(Response::Mounted(Err(e))) | Ok(Response::Rejected(e)) => fail(meta_status(&e)),
            Ok(other) => fail(unexpected(&other)),
            Err(e) => fail(node_status(&e)),
        }
    }

    async fn unmount_segment(
        &self,
        request: Request<pb::UnmountSegmentRequest>,
    ) -> Rpc<pb::StatusResponse> {
        let r = request.into_inner();
        let fail = |s| ok(pb::StatusResponse { status: Some(s) });
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
                // Its owner, proving it with the key it mounted with (a
                // segment from an older log entry has none to prove).
                s.owner == origin.client_id
                    && (s.key.0.is_empty()
                        || crescent_auth::constant_time_eq(&s.key.0, &r.segment_key))
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

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Rpc<pb::HeartbeatResponse> {
        let r = request.into_inner();
        self.node
            .counters()
            .heartbeat_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if r.client_id.is_empty() || r.client_id.len() > MAX_CLIENT_ID_LEN {
            return ok(pb::HeartbeatResponse {
                status: Some(invalid(
                    ErrorCode::InvalidParams,
                    format!("client_id must be 1..={MAX_CLIENT_ID_LEN} bytes"),
                )),
                ..Default::default()
            });
        }
        let need_remount = match self.node.client_heartbeat(&r.client_id, &r.segment_ids) {
            Ok(need) => need,
            Err(e) => {
                return ok(pb::HeartbeatResponse {
                    status: Some(node_status(&e)),
                    ..Default::default()
                })
            }
        };
        ok(pb::HeartbeatResponse {
            status: Some(pb::Status::ok()),
            leader_time_ms: crate::node::now_ms(),
            result: if need_remount {
                pb::HeartbeatResult::NeedRemount as i32
            } else {
                pb::HeartbeatResult::HeartbeatOk as i32
            },
        })
    }
}
