//! PutEnd and PutRevoke: a one-commit placement verified and committed in
//! one entry (or a committed PutStart finished), the placements ahead a
//! PutEnd asks for alongside, and revokes in leader memory or by entry.

use crescent_auth::capability::{Access, Capability, SegmentKey};
use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_raft::state::{CommitItem, MetaError, MetaState, Op, PutId, Replica};
use crescent_raft::Response;

use super::{batch_status, invalid, item_prefix, meta_status, node_status, unexpected, MasterApi};
use crate::node::placer::AHEAD_KEY;
use crate::node::NodeError;

impl MasterApi {
    /// PutEnd of `items`: the core of PutEnd and BatchPutEnd, so counting,
    /// validation and the test-only flag cannot drift between them. Items
    /// placed for one commit carry their placement, and one entry records
    /// each with its object; the others finish a committed PutStart.
    pub(super) async fn put_end_items(
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
            let op = Op::PutEnd {
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
    pub(super) fn put_end_unsafely(
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

    /// The core of PutEnd and BatchPutEnd: commits `items` and, while that
    /// commit waits on the log's fsyncs, places the writer's next puts
    /// `asked` (size, put id) ahead, which saves the writer a PutStart. The
    /// placements made (put id, replicas) come whatever the commit's outcome.
    pub(super) async fn put_end_placing_ahead(
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

    /// PutRevoke of `items` (key, put id): the core of PutRevoke and
    /// BatchPutRevoke. A put this leader placed for one commit is only in
    /// its memory: revoking it frees the range there, with no entry.
    pub(super) async fn put_revoke_items(
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
            return self.item_op(header, n, Op::PutRevoke { items }).await;
        }
        let mut results: Vec<Result<(), MetaError>> = (0..n).map(|_| Ok(())).collect();
        if !in_state.is_empty() {
            let rest: Vec<(String, PutId)> = in_state.iter().map(|&i| items[i].clone()).collect();
            let v = self
                .item_op(header, rest.len(), Op::PutRevoke { items: rest })
                .await?;
            for (&i, r) in in_state.iter().zip(v) {
                results[i] = r;
            }
        }
        Ok(results)
    }

    /// A PutRevoke of a placement made ahead and not used (`ahead`): only
    /// this leader's memory holds it. Nothing to revoke (another leader's
    /// placement, or one already settled) is OK: an unused placement of an
    /// earlier leader stays out of use until its reservation is retired.
    pub(super) fn put_revoke_ahead(&self, r: pb::PutRevokeRequest) -> Result<(), pb::Status> {
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
}

/// One item of a PutEnd (see `PutEndRequest` in master.proto).
pub(super) struct EndItem {
    pub(super) key: String,
    pub(super) checksum: u32,
    pub(super) put_id: PutId,
    pub(super) placement: Vec<pb::ReplicaDescriptor>,
    pub(super) size: u64,
    /// Its placement was made ahead, filed under [`AHEAD_KEY`].
    pub(super) ahead: bool,
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
pub(super) fn bad_next(next: &[pb::NextPut], items: &[pb::PutEndItem]) -> Option<String> {
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
pub(super) fn batch_put_end_response(
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
