//! PutStart, and the placements a PutEnd asks for ahead: the checks of a
//! put (quota, replicate config), the leader's one-commit placement, and
//! the committed PutStart when it cannot place.

use crescent_auth::capability::Access;
use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_raft::state::{MetaError, Op, Origin, PutId, PutPolicy, ReplicateConfig, Tier};
use crescent_raft::Response;

use super::grants::{placement_terms, put_grant_terms, replica_pb, GrantTerms};
use super::{invalid, item_prefix, meta_status, node_status, unexpected, MasterApi};
use crate::config::PutMode;
use crate::node::placer::{Placed, AHEAD_KEY};

const MAX_PREFERRED_SEGMENTS: usize = 64;
/// Replicas a put may ask for: far above any deployment's segment count
/// divided by a sane replication factor, and it bounds a placement's size.
const MAX_REPLICA_NUM: u32 = 256;

impl MasterApi {
    /// Refuses a PutStart that would take its client past
    /// `--max-objects-per-client`, `--max-unfinished-puts-per-client` or
    /// `--max-key-bytes-per-client` (82 k unfinished puts with 1 KiB
    /// keys from one client id took the leader to 850 MB). Counted against
    /// what the state machine holds now, so concurrent batches of one client
    /// may overshoot by what is in flight. A retry of a request that was
    /// already applied passes: it adds nothing, and it must get the answer of
    /// its first attempt from the dedup table.
    pub(super) fn check_put_quota(
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

    pub(super) fn replicate_config(
        cfg: Option<pb::ReplicateConfig>,
    ) -> Result<ReplicateConfig, pb::Status> {
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

    pub(super) fn policy(&self) -> PutPolicy {
        let c = self.node.config();
        PutPolicy {
            discard_after_ms: c.put_start_discard_timeout.as_millis() as u64,
            release_after_ms: c.put_start_release_timeout.as_millis() as u64,
            soft_pin_ttl_ms: c.soft_pin_ttl.as_millis() as u64,
        }
    }

    pub(super) async fn put_start_items(
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
        let op = Op::PutStart {
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
    pub(super) fn already_applied(&self, origin: &Origin) -> bool {
        self.node
            .state()
            .dedup
            .get(&origin.client_id)
            .is_some_and(|c| c.results.contains_key(&origin.seq))
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
    pub(super) async fn place_ahead(
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
}

/// One item's PutStart answer: its replicas or refusal, and whether it was
/// placed for one commit (its PutEnd must then carry the placement).
#[derive(Clone)]
pub(super) struct Started {
    replicas: Result<Vec<pb::ReplicaDescriptor>, StartRefusal>,
    pending: bool,
}

#[derive(Clone)]
pub(super) enum StartRefusal {
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
    pub(super) fn failed(e: MetaError) -> Self {
        Self {
            replicas: Err(StartRefusal::Meta(e)),
            pending: false,
        }
    }

    pub(super) fn refused(s: pb::Status) -> Self {
        Self {
            replicas: Err(StartRefusal::Status(s)),
            pending: false,
        }
    }

    pub(super) fn into_parts(self) -> (pb::Status, Vec<pb::ReplicaDescriptor>, bool) {
        match self.replicas {
            Ok(reps) => (pb::Status::ok(), reps, self.pending),
            Err(StartRefusal::Meta(e)) => (meta_status(&e), Vec::new(), false),
            Err(StartRefusal::Status(s)) => (s, Vec::new(), false),
        }
    }
}
