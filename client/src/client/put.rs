//! Puts: one PutStart, the bytes to every replica, one PutEnd; batches.
//! Every put carries a put id of this client's choosing, so its PutEnd or
//! PutRevoke can only ever finish that put, not a later put of the same key
//! (the master tells puts apart by it; two puts of one key in flight get
//! REPLICA_IS_NOT_READY for the second from the master).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_store::protocol::Grant;

use super::ahead::{Ahead, Next};
use crate::master::Placement;

use super::routing::chunks;
use super::*;

impl ClientCore {
    /// Stores `value` under `key`. A key that already exists counts as success
    /// (objects are immutable, as in Mooncake). In degraded mode the value goes
    /// to the bounded local cache only (not replicated: see docs/guarantees.md); use
    /// [`put_placed`](Self::put_placed) to learn which happened.
    pub async fn put(&self, key: &str, value: &[u8], cfg: &ReplicateConfig) -> Result<()> {
        self.put_placed(key, value, cfg).await.map(|_| ())
    }

    /// [`put`](Self::put) that says where the bytes went: committed by the
    /// masters, or only into this process's local cache because no master
    /// was reachable.
    pub async fn put_placed(
        &self,
        key: &str,
        value: &[u8],
        cfg: &ReplicateConfig,
    ) -> Result<Stored> {
        traced("put", key, async move {
            if value.is_empty() {
                return Err(Error::InvalidArgument("value is empty".into()));
            }
            if self.is_degraded() {
                return self.put_local(key, value).map(|_| Stored::LocalOnly);
            }
            let put = self.put_cluster(key, value, cfg).await;
            // Whatever this client had cached for the key (an object removed by
            // force meanwhile, say) is not read instead of what it just put.
            self.forget_descriptor(key);
            match put {
                Ok(()) => {
                    // The cluster's object is the key's now: a value kept while
                    // degraded and not published is not read instead of it.
                    self.local_only.lock().expect("lock poisoned").remove(key);
                    Ok(Stored::InCluster)
                }
                Err(e @ Error::Unavailable(_)) => {
                    self.note_unavailable(&e);
                    if self.is_degraded() {
                        self.put_local(key, value).map(|_| Stored::LocalOnly)
                    } else {
                        Err(e)
                    }
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// A put through the masters. A write that fails on some segment (a dead
    /// store, one that stopped answering) revokes the put and tries again
    /// under a new put id, asking the leader to avoid the segments that
    /// failed, at most [`PUT_TRIES`] tries in all: a segment whose store
    /// died stays listed until its owner's TTL runs out, and other segments
    /// can take the put meanwhile.
    pub(super) async fn put_cluster(
        &self,
        key: &str,
        value: &[u8],
        cfg: &ReplicateConfig,
    ) -> Result<()> {
        let mut config = self.replicate(cfg);
        let checksum = crc32c::crc32c(value);
        let mut next = None;
        let mut tries = 0;
        if self.config.place_ahead {
            let (ahead, ask) =
                self.ahead
                    .take(&self.master, &self.stats.ahead, value.len() as u64, &config);
            next = ask;
            if let Some(a) = ahead {
                match self
                    .put_in_ahead(key, value, checksum, &config, a, &mut next)
                    .await
                {
                    AheadPut::Done(done) => return done,
                    // A try of its own: the usual way avoids what failed.
                    AheadPut::WriteFailed(failed) => {
                        tries = 1;
                        avoid(&mut config, &failed);
                    }
                    AheadPut::NotCommitted => {}
                }
                self.stats.ahead.retried.fetch_add(1, Relaxed);
            }
        }
        loop {
            tries += 1;
            let put_id = self.master.new_put_id();
            let placement = match self
                .master
                .put_start_placed(key, value.len() as u64, config.clone(), put_id)
                .await
            {
                Ok(r) => r,
                Err(MasterRpcError::Status {
                    code: ErrorCode::ObjectAlreadyExists,
                    ..
                }) => return Ok(()),
                Err(e) => return Err(Error::from_master(e, key)),
            };
            if let Err(failed) = self.write_replicas(&placement, value).await {
                // Nothing half-written may become readable. A put that could
                // not be revoked is not tried again: its key stays in flight
                // until the master reclaims it, and the write's failure is
                // what the caller should see.
                let revoked = self.master.put_revoke_named(key, put_id).await;
                if let Err(re) = &revoked {
                    tracing::warn!(key, error = %re, "revoke after a failed put also failed; the master will reclaim it");
                }
                if revoked.is_ok() && tries < PUT_TRIES && avoid(&mut config, &failed) {
                    tracing::debug!(key, error = %failed.error, segments = ?failed.segments, "a write failed; putting again elsewhere");
                    self.stats.puts_retried_elsewhere.fetch_add(1, Relaxed);
                    continue;
                }
                return Err(failed.error);
            }
            let end = self
                .end_put(
                    key,
                    checksum,
                    (put_id, &placement),
                    value.len() as u64,
                    &config,
                    next,
                )
                .await;
            match end {
                Ok(()) => {}
                // Another put of the key committed first (a one-commit put
                // placed by an earlier leader): the key exists, as at PutStart.
                Err(MasterRpcError::Status {
                    code: ErrorCode::ObjectAlreadyExists,
                    ..
                }) if placement.pending => {}
                Err(e) => return Err(Error::from_master(e, key)),
            }
            self.mark_master_ok();
            return Ok(());
        }
    }

    /// Writes `value` to every replica of `placement` at once: the first
    /// error, if any, and the segments whose writes failed.
    async fn write_replicas(
        &self,
        placement: &Placement,
        value: &[u8],
    ) -> std::result::Result<(), FailedWrites> {
        let writes = futures::future::join_all(
            placement
                .replicas
                .iter()
                .map(|r| self.write_replica(r, value)),
        )
        .await;
        let mut failed: Option<FailedWrites> = None;
        for (r, w) in placement.replicas.iter().zip(writes) {
            if let Err(error) = w {
                failed
                    .get_or_insert(FailedWrites {
                        error,
                        segments: Vec::new(),
                    })
                    .segments
                    .push(r.segment_name.clone());
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The PutEnd of `placement`, asking the leader for the next put's
    /// placement when `next` says so, and keeping what it placed.
    async fn end_put(
        &self,
        key: &str,
        checksum: u32,
        (put_id, placement): (u64, &Placement),
        size: u64,
        config: &pb::ReplicateConfig,
        next: Option<Next>,
    ) -> std::result::Result<(), MasterRpcError> {
        let next_put_id = next.as_ref().map_or(0, |n| n.put_id);
        let (end, placed) = self
            .master
            .put_end_placing_next(key, checksum, put_id, placement, size, config, next_put_id)
            .await;
        if let (Some(next), Some(p)) = (next, placed) {
            self.ahead.keep(&self.master, &self.stats.ahead, next, p);
        }
        end
    }

    /// A put into a placement made ahead: the bytes at once, then one
    /// PutEnd naming the key. When that placement did not take the object
    /// (its write failed, or the commit was refused: too old, say) the put
    /// should go the usual way; nothing of it became readable.
    async fn put_in_ahead(
        &self,
        key: &str,
        value: &[u8],
        checksum: u32,
        config: &pb::ReplicateConfig,
        ahead: Ahead,
        next: &mut Option<Next>,
    ) -> AheadPut {
        let placement = &ahead.placement;
        if let Err(failed) = self.write_replicas(placement, value).await {
            tracing::debug!(key, error = %failed.error, "a write into a placement ahead failed; putting the usual way");
            super::ahead::revoke(&self.master, ahead.put_id).await;
            return AheadPut::WriteFailed(failed);
        }
        let end = self
            .end_put(
                key,
                checksum,
                (ahead.put_id, placement),
                value.len() as u64,
                config,
                next.take(),
            )
            .await;
        match end {
            Ok(()) => {}
            // The key exists (put before, or by a writer that committed
            // first): success, as at PutStart; the leader frees the range.
            Err(MasterRpcError::Status {
                code: ErrorCode::ObjectAlreadyExists,
                ..
            }) => {}
            // No master answered: the usual way would not fare better.
            Err(e @ MasterRpcError::Unavailable(_)) => {
                return AheadPut::Done(Err(Error::from_master(e, key)))
            }
            Err(e) => {
                tracing::debug!(key, error = %e, "a placement ahead was not committed; putting the usual way");
                return AheadPut::NotCommitted;
            }
        }
        self.stats.ahead.used.fetch_add(1, Relaxed);
        self.mark_master_ok();
        AheadPut::Done(Ok(()))
    }

    /// Same as [`put`](Self::put): the bytes are sent from the caller's buffer without a copy.
    pub async fn put_from(&self, key: &str, buffer: &[u8], cfg: &ReplicateConfig) -> Result<()> {
        self.put(key, buffer, cfg).await
    }

    /// Puts many objects with one PutStart and one PutEnd; per-item results.
    pub async fn put_batch(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        let placed = self.put_batch_placed(items, cfg).await?;
        Ok(placed.into_iter().map(|r| r.map(|_| ())).collect())
    }

    /// [`put_batch`](Self::put_batch) that says, per item, where the bytes went.
    pub async fn put_batch_placed(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<Stored>>> {
        traced(
            "put_batch",
            items.first().map_or("", |(k, _)| *k),
            async move {
                let (results, stored) = if self.is_degraded() {
                    let local = items.iter().map(|(k, v)| self.put_local(k, v)).collect();
                    (local, Stored::LocalOnly)
                } else {
                    let put = self.put_batch_cluster(items, cfg).await;
                    // As in `put_placed`.
                    for (k, _) in items {
                        self.forget_descriptor(k);
                    }
                    let put = put?;
                    let mut local = self.local_only.lock().expect("lock poisoned");
                    for ((k, _), r) in items.iter().zip(&put) {
                        if r.is_ok() {
                            local.remove(k);
                        }
                    }
                    drop(local);
                    (put, Stored::InCluster)
                };
                Ok(results.into_iter().map(|r| r.map(|_| stored)).collect())
            },
        )
        .await
    }

    /// A batch through the masters. Items whose placement made ahead did
    /// not take them go again the usual way; items whose write failed on
    /// some segment are revoked and go again avoiding the segments that
    /// failed, as a single put does, at most [`PUT_TRIES`] passes in all.
    pub(super) async fn put_batch_cluster(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        let mut config = self.replicate(cfg);
        let mut pass = self
            .put_batch_once(items, &config, self.config.place_ahead)
            .await?;
        let mut results = std::mem::take(&mut pass.results);
        let mut passes = 1;
        loop {
            let mut retry = std::mem::take(&mut pass.again);
            self.stats
                .ahead
                .retried
                .fetch_add(retry.len() as u64, Relaxed);
            if passes < PUT_TRIES {
                self.stats
                    .puts_retried_elsewhere
                    .fetch_add(pass.write_failed.len() as u64, Relaxed);
                retry.append(&mut pass.write_failed);
            }
            if retry.is_empty() {
                return Ok(results);
            }
            retry.sort_unstable();
            retry.dedup();
            add_avoided(&mut config, std::mem::take(&mut pass.failed_segments));
            passes += 1;
            let subset: Vec<(&str, &[u8])> = retry.iter().map(|&i| items[i]).collect();
            match self.put_batch_once(&subset, &config, false).await {
                Ok(done) => {
                    for (&i, r) in retry.iter().zip(done.results) {
                        results[i] = r;
                    }
                    pass = BatchPass {
                        results: Vec::new(),
                        again: done.again.iter().map(|&j| retry[j]).collect(),
                        write_failed: done.write_failed.iter().map(|&j| retry[j]).collect(),
                        failed_segments: done.failed_segments,
                    };
                }
                // The rest of the batch is settled: only these failed.
                Err(e) => {
                    for i in retry {
                        results[i] = Err(e.clone());
                    }
                    return Ok(results);
                }
            }
        }
    }

    /// One pass of a batch put: placements made ahead for the items that
    /// have one (with `use_ahead`), one PutStart for the others, the bytes,
    /// one PutEnd (asking for the next batch's placements). The per-item
    /// results, and the items to put again (see [`BatchPass`]).
    async fn put_batch_once(
        &self,
        items: &[(&str, &[u8])],
        config: &pb::ReplicateConfig,
        use_ahead: bool,
    ) -> Result<BatchPass> {
        if items.is_empty() {
            return Ok(BatchPass::default());
        }
        let mut results: Vec<Option<Result<()>>> = vec![None; items.len()];
        for (i, (_, v)) in items.iter().enumerate() {
            if v.is_empty() {
                results[i] = Some(Err(Error::InvalidArgument("value is empty".into())));
            }
        }
        let mut put_ids: Vec<u64> = items.iter().map(|_| self.master.new_put_id()).collect();
        let idx: Vec<usize> = (0..items.len()).filter(|i| results[*i].is_none()).collect();
        if idx.is_empty() {
            let results = results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect();
            return Ok(BatchPass {
                results,
                ..Default::default()
            });
        }
        let (aheads, next) = if use_ahead {
            let sizes: Vec<u64> = idx.iter().map(|&i| items[i].1.len() as u64).collect();
            self.ahead
                .take_batch(&self.master, &self.stats.ahead, &sizes, config)
        } else {
            ((0..idx.len()).map(|_| None).collect(), Vec::new())
        };
        // Which items write into a placement made ahead (their put id is
        // that placement's), and which start now.
        let mut placed_ahead = vec![false; items.len()];
        let mut starts: Vec<Option<pb::PutStartResult>> = vec![None; idx.len()];
        for (pos, ahead) in aheads.into_iter().enumerate() {
            if let Some(a) = ahead {
                let i = idx[pos];
                placed_ahead[i] = true;
                put_ids[i] = a.put_id;
                starts[pos] = Some(pb::PutStartResult {
                    status: None,
                    replicas: a.placement.replicas,
                    pending: true,
                });
            }
        }
        let to_start: Vec<usize> = (0..idx.len()).filter(|&p| starts[p].is_none()).collect();
        if !to_start.is_empty() {
            match self
                .master
                .batch_put_start_one_commit(
                    to_start
                        .iter()
                        .map(|&p| pb::PutStartItem {
                            key: items[idx[p]].0.to_string(),
                            size: items[idx[p]].1.len() as u64,
                            put_id: put_ids[idx[p]],
                        })
                        .collect(),
                    config.clone(),
                )
                .await
            {
                Ok(started) if started.len() == to_start.len() => {
                    for (&p, s) in to_start.iter().zip(started) {
                        starts[p] = Some(s);
                    }
                }
                Ok(_) => {
                    self.give_back_batch(&idx, &placed_ahead, &put_ids);
                    return Err(Error::Master {
                        code: ErrorCode::InternalError,
                        message: "master answered a different number of items".into(),
                    });
                }
                Err(e) => {
                    // A batch over 1 MiB of keys goes in parts; a part refused
                    // after earlier ones started (a quota, a failover) would
                    // leave those puts unfinished, holding the keys and this
                    // client's unfinished-put quota until the master reclaims
                    // them. The master revokes only the puts named here.
                    let named = to_start
                        .iter()
                        .map(|&p| (items[idx[p]].0.to_string(), put_ids[idx[p]]))
                        .collect();
                    if let Err(re) = self.master.batch_put_revoke(named).await {
                        tracing::debug!(error = %re, "revoke after a failed batch PutStart failed; the master will reclaim");
                    }
                    self.give_back_batch(&idx, &placed_ahead, &put_ids);
                    return Err(Error::from_master(e, ""));
                }
            }
        }
        let starts: Vec<pb::PutStartResult> = starts.into_iter().flatten().collect();
        // Group writes per route so each store gets one pipelined exchange.
        // Grouped by store address and segment: a restarted store serves a new
        // segment at the same address, and each exchange carries one segment tag.
        let mut tcp_groups: HashMap<(String, u64), Vec<PendingWrite<'_>>> = HashMap::new();
        let mut direct: Vec<(usize, &pb::ReplicaDescriptor)> = Vec::new();
        let mut segment_names: HashMap<u64, &str> = HashMap::new();
        let mut failed_segments: Vec<String> = Vec::new();
        let mut started: Vec<usize> = Vec::new();
        for (pos, (&i, s)) in idx.iter().zip(&starts).enumerate() {
            let key = items[i].0;
            match s.status.as_ref().and_then(|st| Error::from_status(st, key)) {
                Some(Error::Master {
                    code: ErrorCode::ObjectAlreadyExists,
                    ..
                }) => results[i] = Some(Ok(())),
                Some(e) => results[i] = Some(Err(e)),
                None => {
                    started.push(pos);
                    for r in &s.replicas {
                        if r.length != items[i].1.len() as u64 {
                            results[i] =
                                Some(Err(Error::Transfer("replica length mismatch".into())));
                            continue;
                        }
                        match self.write_route(r) {
                            Route::Tcp(ep) => {
                                segment_names.insert(r.segment_id, &r.segment_name);
                                let data = items[i].1;
                                let grant = Grant::from(r);
                                for (off, a, b) in chunks(r.offset, data.len()) {
                                    tcp_groups
                                        .entry((ep.to_string(), r.segment_id))
                                        .or_default()
                                        .push((i, grant, off, &data[a..b]));
                                }
                            }
                            _ => direct.push((i, r)),
                        }
                    }
                }
            }
        }
        for (i, r) in direct {
            if let Err(e) = self.write_replica(r, items[i].1).await {
                results[i] = Some(Err(e));
                failed_segments.push(r.segment_name.clone());
            }
        }
        let exchanges = tcp_groups.iter().map(|(group, writes)| async move {
            let ep = &group.0;
            let w: Vec<(Grant, u64, &[u8])> =
                writes.iter().map(|(_, g, off, d)| (*g, *off, *d)).collect();
            let bytes: usize = w.iter().map(|(_, _, d)| d.len()).sum();
            self.stats
                .tcp_bytes
                .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
            (group, self.tcp.write(ep, &w).await)
        });
        for (group, outcome) in futures::future::join_all(exchanges).await {
            if let Err(e) = outcome {
                self.tcp.forget(&group.0);
                let e = Error::from_transfer(e);
                if let Some(name) = segment_names.get(&group.1) {
                    failed_segments.push(name.to_string());
                }
                for (i, _, _, _) in &tcp_groups[group] {
                    results[*i] = Some(Err(e.clone()));
                }
            }
        }
        let mut to_end = Vec::new();
        let mut to_revoke = Vec::new();
        let mut again = Vec::new();
        let mut write_failed = Vec::new();
        for pos in started {
            let i = idx[pos];
            match &results[i] {
                // A failed write into a placement made ahead: given back,
                // and the item put again the usual way.
                Some(Err(e)) if placed_ahead[i] => {
                    tracing::debug!(key = items[i].0, error = %e, "a write into a placement ahead failed; putting the usual way");
                    super::ahead::give_back(&self.master, &self.stats.ahead, put_ids[i]);
                    again.push(i);
                }
                Some(Err(e)) => {
                    if matches!(e, Error::Transfer(_)) {
                        write_failed.push(i);
                    }
                    to_revoke.push((items[i].0.to_string(), put_ids[i]));
                }
                _ => to_end.push((i, &starts[pos])),
            }
        }
        if !to_revoke.is_empty() {
            if let Err(e) = self.master.batch_put_revoke(to_revoke).await {
                tracing::warn!(error = %e, "revoke after failed writes also failed; the master will reclaim them");
                // As for a single put: not tried again, the write's failure stands.
                write_failed.clear();
            }
        }
        let ends: Vec<pb::PutEndItem> = to_end
            .iter()
            .map(|&(i, start)| pb::PutEndItem {
                key: items[i].0.to_string(),
                checksum: crc32c::crc32c(items[i].1),
                put_id: put_ids[i],
                placement: if start.pending {
                    start.replicas.clone()
                } else {
                    Vec::new()
                },
                size: items[i].1.len() as u64,
                ahead: placed_ahead[i],
            })
            .collect();
        let ended = if ends.is_empty() {
            // Nothing to end: what was asked for ahead is not asked for.
            Ok(Vec::new())
        } else {
            self.end_batch(ends, config.clone(), next).await
        };
        match ended {
            Ok(statuses) => {
                let mut used = 0u64;
                for (&(i, start), st) in to_end.iter().zip(&statuses) {
                    // Committed (or the key exists): an item placed ahead
                    // used its placement.
                    used += u64::from(placed_ahead[i]);
                    match Error::from_status(st, items[i].0) {
                        None => results[i] = Some(Ok(())),
                        // The key exists (put before, or by a writer that
                        // committed first; as for a single put: a one-commit
                        // put of the key placed by an earlier leader): success.
                        Some(Error::Master {
                            code: ErrorCode::ObjectAlreadyExists,
                            ..
                        }) if start.pending => results[i] = Some(Ok(())),
                        // A placement made ahead that the commit refused (too
                        // old, say): nothing of it became readable.
                        Some(e) if placed_ahead[i] => {
                            tracing::debug!(key = items[i].0, error = %e, "a placement ahead was not committed; putting the usual way");
                            used -= 1;
                            again.push(i);
                        }
                        Some(e) => results[i] = Some(Err(e)),
                    }
                }
                self.stats.ahead.used.fetch_add(used, Relaxed);
                self.stats.ahead.used_in_batches.fetch_add(used, Relaxed);
            }
            // No master answered: the usual way would not fare better.
            Err(e @ MasterRpcError::Unavailable(_)) => {
                let e = Error::from_master(e, "");
                for &(i, _) in &to_end {
                    results[i] = Some(Err(e.clone()));
                }
            }
            // As a single put into a placement ahead: its items go again
            // the usual way (a commit that did land answers "exists").
            Err(e) => {
                let e = Error::from_master(e, "");
                for &(i, _) in &to_end {
                    if placed_ahead[i] {
                        again.push(i);
                    } else {
                        results[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        let results = results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect();
        Ok(BatchPass {
            results,
            again,
            write_failed,
            failed_segments,
        })
    }

    /// The batch's PutEnd, asking the leader for the placements of `next`
    /// and keeping those it made. A batch whose PutEnd goes in several
    /// requests (over 1 MiB of keys) asks for none.
    async fn end_batch(
        &self,
        ends: Vec<pb::PutEndItem>,
        config: pb::ReplicateConfig,
        next: Vec<Next>,
    ) -> std::result::Result<Vec<pb::Status>, MasterRpcError> {
        let one_request =
            crescent_proto::split_batch(ends.iter().collect(), |i| i.key.len()).len() == 1;
        if next.is_empty() || !one_request {
            return self.master.batch_put_end_placed(ends, config).await;
        }
        let asked: Vec<pb::NextPut> = next
            .iter()
            .map(|n| pb::NextPut {
                put_id: n.put_id,
                size: n.size(),
            })
            .collect();
        let (ended, placed) = self
            .master
            .batch_put_end_placing_next(ends, Some(config), asked)
            .await;
        let mut placed: HashMap<u64, Placement> = placed.into_iter().collect();
        let kept: Vec<(Next, Placement)> = next
            .into_iter()
            .filter_map(|n| placed.remove(&n.put_id).map(|p| (n, p)))
            .collect();
        if !kept.is_empty() {
            self.ahead.keep_batch(&self.master, &self.stats.ahead, kept);
        }
        ended
    }

    /// Gives back the placements made ahead that a failed batch took.
    fn give_back_batch(&self, idx: &[usize], placed_ahead: &[bool], put_ids: &[u64]) {
        for &i in idx.iter().filter(|&&i| placed_ahead[i]) {
            super::ahead::give_back(&self.master, &self.stats.ahead, put_ids[i]);
        }
    }

    /// Same as [`put_batch`](Self::put_batch), from caller buffers.
    pub async fn batch_put_from(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        self.put_batch(items, cfg).await
    }
}

/// Tries of a put or a batch item, the first included: each try after a
/// failed write avoids the segments that failed before.
pub(super) const PUT_TRIES: usize = 3;

/// A try's failed writes: the first error, and every segment that failed.
struct FailedWrites {
    error: Error,
    segments: Vec<String>,
}

/// Adds the segments of `failed` to those `config` asks the leader to
/// avoid, when trying elsewhere could help (a transfer failure, not a
/// refusal another segment would repeat): whether it does.
fn avoid(config: &mut pb::ReplicateConfig, failed: &FailedWrites) -> bool {
    let helps = matches!(failed.error, Error::Transfer(_));
    if helps {
        add_avoided(config, failed.segments.iter().cloned());
    }
    helps
}

/// Adds `segments` to `config`'s avoided ones, each once, at most
/// [`crescent_proto::MAX_AVOID_SEGMENTS`] in all (the first failures kept).
fn add_avoided(config: &mut pb::ReplicateConfig, segments: impl IntoIterator<Item = String>) {
    for name in segments {
        if config.avoid_segments.len() >= crescent_proto::MAX_AVOID_SEGMENTS {
            return;
        }
        if !config.avoid_segments.contains(&name) {
            config.avoid_segments.push(name);
        }
    }
}

/// How a put into a placement made ahead ended.
enum AheadPut {
    /// Put (or failed so that the usual way would not fare better).
    Done(Result<()>),
    /// Its write failed: put the usual way, avoiding the segments that
    /// failed if that could help.
    WriteFailed(FailedWrites),
    /// Its commit was refused: put the usual way.
    NotCommitted,
}

/// What one pass of a batch put did.
#[derive(Default)]
struct BatchPass {
    /// Per item; placeholders for the items to put again.
    results: Vec<Result<()>>,
    /// Items whose placement made ahead did not take them.
    again: Vec<usize>,
    /// Items revoked after a write failed (their results are that failure,
    /// kept if no pass is left).
    write_failed: Vec<usize>,
    /// Segments whose writes failed.
    failed_segments: Vec<String>,
}

/// One write of a batch put: (item index, its grant, remote offset, bytes).
type PendingWrite<'a> = (usize, Grant, u64, &'a [u8]);
