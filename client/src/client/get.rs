//! Gets: a lookup, then the bytes from the best replica, checksum-verified,
//! falling back across replicas; batches.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_store::protocol::{Grant, MAX_TRANSFER};

use super::*;

/// How much of a cached descriptor's lease must be left to read with it: a
/// read takes time, and a store refuses a grant past its expiry.
const CACHED_LEASE_MARGIN: Duration = Duration::from_millis(250);

/// A buffer of each found object's size (empty for one not found).
fn buffers_for(found: &[Result<pb::GetReplicaListResponse>]) -> Vec<Vec<u8>> {
    found
        .iter()
        .map(|f| match f {
            Ok(r) => vec![0u8; r.size as usize],
            Err(_) => Vec::new(),
        })
        .collect()
}

/// A read's buffer, cut to the bytes read.
fn fit((read, mut buf): (Result<usize>, Vec<u8>)) -> Result<Vec<u8>> {
    read.map(|n| {
        buf.truncate(n);
        buf
    })
}

impl ClientCore {
    /// With `descriptor_cache`, the answer of this client's last lookup of
    /// `key` (its own, or the background renewal's: see `renewal`), while
    /// enough of the read lease it granted is left. Under that
    /// lease the masters neither evict, demote nor (unforced) remove the
    /// object, and keep the space of one removed by force for a lease TTL;
    /// every byte read is still checked against the object's checksum.
    ///
    /// Only replicas a read can tell are still the ones described are kept:
    /// - those reached over TCP: the store checks the descriptor's grant (a
    ///   restarted store refuses it);
    /// - this client's own segment;
    /// - a same-host store's disk file, when the descriptor names the disk
    ///   id of the file's formatting: the file is opened only if its header
    ///   holds that id, and every read checks it still does after its bytes
    ///   (`DiskFileReader`). A store restarted on the same file within the
    ///   masters' `--disk-segment-grace` keeps its disk objects; one that
    ///   formats the file anew changes the id. (A segment past that grace is
    ///   forgotten, and the same file mounted again is a new segment; the
    ///   masters refuse a lease that long, so no cached descriptor outlives
    ///   the old one.)
    ///
    /// Not a same-host store's shared memory: this client's mapping would
    /// outlive that store's restart, and nothing in the memory tells a new
    /// store's segment from the old.
    fn cached_descriptor(&self, key: &str) -> Option<pb::GetReplicaListResponse> {
        if !self.config.descriptor_cache {
            return None;
        }
        let mut found = {
            let mut d = self.descriptors.lock().expect("lock poisoned");
            let r = d
                .get_mut(key)
                .filter(|r| r.until > Instant::now() + CACHED_LEASE_MARGIN)?;
            // Read again: the background renewal keeps its lease.
            r.read = true;
            r.found.clone()
        };
        found.replicas.retain(|r| self.cacheable(r));
        (!found.replicas.is_empty()).then_some(found)
    }

    /// Whether a cached descriptor may keep `r` (see `cached_descriptor`).
    /// Judged by the descriptor, not by how this client reaches it now: a
    /// same-host shared memory that fails to map now, or a disk file that
    /// fails to open now, may be read directly later, within the lease.
    fn cacheable(&self, r: &pb::ReplicaDescriptor) -> bool {
        let disk = r.kind == pb::ReplicaKind::Disk as i32;
        if self.own_memory(r).is_some() || r.hostname != self.config.local_hostname {
            return true;
        }
        if disk {
            r.disk_file_path.is_empty() || !r.disk_id.is_empty()
        } else {
            r.shm_path.is_empty()
        }
    }

    pub(super) fn forget_descriptor(&self, key: &str) {
        self.descriptors.lock().expect("lock poisoned").remove(key);
    }

    /// Reads `key` with its cached descriptor `found`: `None` when that no
    /// longer reads (it is forgotten: ask the masters); a buffer too small
    /// for the object is the caller's error, not the descriptor's.
    async fn read_cached(
        &self,
        key: &str,
        found: &pb::GetReplicaListResponse,
        buf: &mut [u8],
    ) -> Option<Result<usize>> {
        match self.read_verified(key, found, buf).await {
            Ok(n) => {
                self.stats
                    .cached_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some(Ok(n))
            }
            Err(e @ Error::BufferTooSmall { .. }) => Some(Err(e)),
            Err(e) => {
                tracing::debug!(key, error = %e, "cached descriptor no longer reads; asking the masters");
                self.cached_read_failed(key);
                None
            }
        }
    }

    fn cached_read_failed(&self, key: &str) {
        self.forget_descriptor(key);
        self.stats
            .cached_read_fallbacks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Remembers a lookup's answer unless a remove by this client started
    /// since the lookup was sent (`removals_at`): the answer may describe
    /// an object that remove took away.
    fn remember_unless_removed(
        &self,
        key: &str,
        found: &pb::GetReplicaListResponse,
        asked: Instant,
        removals_at: u64,
    ) {
        if self.removals.load(std::sync::atomic::Ordering::Acquire) == removals_at {
            self.remember_descriptor(key, found, asked);
        }
    }

    /// GetReplicaList, remembering the answer for degraded reads.
    pub(super) async fn lookup(&self, key: &str) -> Result<pb::GetReplicaListResponse> {
        let asked = Instant::now();
        let removals_at = self.removals.load(std::sync::atomic::Ordering::Acquire);
        match self.master.get_replica_list(key).await {
            Ok(found) => {
                self.mark_master_ok();
                self.remember_unless_removed(key, &found, asked, removals_at);
                Ok(found)
            }
            Err(e) => {
                let e = Error::from_master(e, key);
                self.note_unavailable(&e);
                Err(e)
            }
        }
    }

    /// Fetches `key`'s bytes, verified against their checksum.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        traced("get", key, async move {
            if self.is_degraded() {
                return self
                    .get_degraded(key, None)
                    .await
                    .map(|(_, v)| v.unwrap_or_default());
            }
            if let Some(found) = self.cached_descriptor(key) {
                let mut buf = vec![0u8; found.size as usize];
                if let Some(read) = self.read_cached(key, &found, &mut buf).await {
                    return read.map(|n| {
                        buf.truncate(n);
                        buf
                    });
                }
            }
            match self.lookup(key).await {
                Ok(found) => {
                    let mut buf = vec![0u8; found.size as usize];
                    self.read_verified(key, &found, &mut buf).await?;
                    Ok(buf)
                }
                Err(Error::NotFound(k)) => {
                    match self.local_only.lock().expect("lock poisoned").get(key) {
                        // Stored while degraded and not yet published.
                        Some(v) => Ok(v.to_vec()),
                        None => Err(Error::NotFound(k)),
                    }
                }
                Err(e) if self.is_degraded() => {
                    let _ = e;
                    self.get_degraded(key, None)
                        .await
                        .map(|(_, v)| v.unwrap_or_default())
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Reads `key` into `buf` without an intermediate copy; returns the object's size.
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        traced("get_into", key, async move {
            if self.is_degraded() {
                return self.get_degraded(key, Some(buf)).await.map(|(n, _)| n);
            }
            if let Some(found) = self.cached_descriptor(key) {
                if let Some(read) = self.read_cached(key, &found, buf).await {
                    return read;
                }
            }
            match self.lookup(key).await {
                Ok(found) => self.read_verified(key, &found, buf).await,
                Err(e @ Error::Unavailable(_)) if self.is_degraded() => {
                    let _ = e;
                    self.get_degraded(key, Some(buf)).await.map(|(n, _)| n)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Fetches many objects: one GetReplicaList, one pipelined exchange per store.
    pub async fn get_batch(&self, keys: &[&str]) -> Result<Vec<Result<Vec<u8>>>> {
        traced(
            "get_batch",
            keys.first().copied().unwrap_or_default(),
            async move {
                if self.is_degraded() {
                    return Ok(self.get_batch_degraded(keys).await);
                }
                let (found, cached) = match self.lookup_batch_cached(keys).await {
                    Ok(found) => found,
                    Err(Error::Unavailable(_)) if self.is_degraded() => {
                        return Ok(self.get_batch_degraded(keys).await)
                    }
                    Err(e) => return Err(e),
                };
                let mut bufs = buffers_for(&found);
                let mut slices: Vec<&mut [u8]> =
                    bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                let (sizes, retry) = self
                    .read_batch_cached(keys, &found, &cached, &mut slices)
                    .await;
                let mut out: Vec<Result<Vec<u8>>> = sizes.into_iter().zip(bufs).map(fit).collect();
                if retry.is_empty() {
                    return Ok(out);
                }
                // Looked up again: the object may have another size now.
                let again_keys: Vec<&str> = retry.iter().map(|&i| keys[i]).collect();
                match self.lookup_batch(&again_keys).await {
                    Ok(again) => {
                        let mut bufs = buffers_for(&again);
                        let mut slices: Vec<&mut [u8]> =
                            bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                        let sizes = self.read_batch(&again_keys, &again, &mut slices).await;
                        for ((&i, r), b) in retry.iter().zip(sizes).zip(bufs) {
                            out[i] = fit((r, b));
                        }
                    }
                    Err(e) => {
                        for &i in &retry {
                            out[i] = Err(e.clone());
                        }
                    }
                }
                Ok(out)
            },
        )
        .await
    }

    /// Reads many objects into caller buffers; per-item sizes.
    pub async fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Result<Vec<Result<usize>>> {
        traced(
            "batch_get_into",
            keys.first().copied().unwrap_or_default(),
            async move {
                if keys.len() != bufs.len() {
                    return Err(Error::InvalidArgument(format!(
                        "{} keys but {} buffers",
                        keys.len(),
                        bufs.len()
                    )));
                }
                if self.is_degraded() {
                    return Ok(self.batch_get_into_degraded(keys, bufs).await);
                }
                let (found, cached) = match self.lookup_batch_cached(keys).await {
                    Ok(found) => found,
                    Err(Error::Unavailable(_)) if self.is_degraded() => {
                        return Ok(self.batch_get_into_degraded(keys, bufs).await)
                    }
                    Err(e) => return Err(e),
                };
                let (mut results, retry) =
                    self.read_batch_cached(keys, &found, &cached, bufs).await;
                if retry.is_empty() {
                    return Ok(results);
                }
                let again_keys: Vec<&str> = retry.iter().map(|&i| keys[i]).collect();
                match self.lookup_batch(&again_keys).await {
                    Ok(again) => {
                        // `retry` is in ascending order, as `again_keys`.
                        let mut slices: Vec<&mut [u8]> = bufs
                            .iter_mut()
                            .enumerate()
                            .filter(|(i, _)| retry.binary_search(i).is_ok())
                            .map(|(_, b)| &mut **b)
                            .collect();
                        let sizes = self.read_batch(&again_keys, &again, &mut slices).await;
                        for (&i, r) in retry.iter().zip(sizes) {
                            results[i] = r;
                        }
                    }
                    Err(e) => {
                        for &i in &retry {
                            results[i] = Err(e.clone());
                        }
                    }
                }
                Ok(results)
            },
        )
        .await
    }

    /// [`lookup_batch`](Self::lookup_batch) of the keys with no usable
    /// cached descriptor (all of them without `descriptor_cache`); also
    /// which answers came from the cache.
    async fn lookup_batch_cached(
        &self,
        keys: &[&str],
    ) -> Result<(Vec<Result<pb::GetReplicaListResponse>>, Vec<bool>)> {
        let cached: Vec<Option<pb::GetReplicaListResponse>> =
            keys.iter().map(|k| self.cached_descriptor(k)).collect();
        let missing: Vec<&str> = keys
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_none())
            .map(|(k, _)| *k)
            .collect();
        let mut asked = self.lookup_batch(&missing).await?.into_iter();
        let from_cache = cached.iter().map(Option::is_some).collect();
        let found = cached
            .into_iter()
            .map(|c| match c {
                Some(r) => Ok(r),
                None => asked.next().unwrap_or_else(|| {
                    Err(Error::Master {
                        code: ErrorCode::InternalError,
                        message: "master answered a different number of items".into(),
                    })
                }),
            })
            .collect();
        Ok((found, from_cache))
    }

    /// [`read_batch`](Self::read_batch), and the items (ascending) read
    /// with a cached descriptor that no longer reads: forgotten, for the
    /// caller to look up again.
    async fn read_batch_cached(
        &self,
        keys: &[&str],
        found: &[Result<pb::GetReplicaListResponse>],
        cached: &[bool],
        bufs: &mut [&mut [u8]],
    ) -> (Vec<Result<usize>>, Vec<usize>) {
        let results = self.read_batch(keys, found, bufs).await;
        let mut retry = Vec::new();
        for (i, r) in results.iter().enumerate() {
            match r {
                _ if !cached[i] => {}
                Ok(_) => {
                    self.stats
                        .cached_reads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(Error::BufferTooSmall { .. }) => {}
                Err(_) => {
                    self.cached_read_failed(keys[i]);
                    retry.push(i);
                }
            }
        }
        (results, retry)
    }

    /// BatchGetReplicaList; like [`lookup`](Self::lookup) it remembers each
    /// answer for degraded reads and counts a failure toward degraded mode.
    pub(super) async fn lookup_batch(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<pb::GetReplicaListResponse>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let asked = Instant::now();
        let removals_at = self.removals.load(std::sync::atomic::Ordering::Acquire);
        let res = match self
            .master
            .batch_get_replica_list(keys.iter().map(|k| k.to_string()).collect())
            .await
        {
            Ok(res) => {
                self.mark_master_ok();
                res
            }
            Err(e) => {
                let e = Error::from_master(e, "");
                self.note_unavailable(&e);
                return Err(e);
            }
        };
        if res.len() != keys.len() {
            return Err(Error::Master {
                code: ErrorCode::InternalError,
                message: "master answered a different number of items".into(),
            });
        }
        Ok(res
            .into_iter()
            .zip(keys)
            .map(
                |(r, k)| match r.status.as_ref().and_then(|s| Error::from_status(s, k)) {
                    Some(e) => Err(e),
                    None => {
                        self.remember_unless_removed(k, &r, asked, removals_at);
                        Ok(r)
                    }
                },
            )
            .collect())
    }

    /// First tries each object's preferred replica, grouped per store and
    /// pipelined; anything that fails or mismatches falls back one by one.
    pub(super) async fn read_batch(
        &self,
        keys: &[&str],
        found: &[Result<pb::GetReplicaListResponse>],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize>> {
        let mut results: Vec<Option<Result<usize>>> = vec![None; keys.len()];
        let mut tcp_groups: HashMap<(String, u64), Vec<usize>> = HashMap::new();
        let mut singles: Vec<usize> = Vec::new();
        for (i, f) in found.iter().enumerate() {
            match f {
                Err(e) => results[i] = Some(Err(e.clone())),
                Ok(r) => {
                    if (bufs[i].len() as u64) < r.size {
                        results[i] = Some(Err(Error::BufferTooSmall {
                            size: r.size,
                            buffer: bufs[i].len(),
                        }));
                        continue;
                    }
                    let order = self.read_order(&r.replicas);
                    match order.first() {
                        Some(first) if first.length == r.size && r.size <= MAX_TRANSFER => {
                            match self.route(first) {
                                Route::Tcp(ep) => tcp_groups
                                    .entry((ep.to_string(), first.segment_id))
                                    .or_default()
                                    .push(i),
                                _ => singles.push(i),
                            }
                        }
                        _ => singles.push(i),
                    }
                }
            }
        }
        // Pipelined first attempts, one exchange per store, concurrently.
        let mut by_index: Vec<Option<&mut [u8]>> =
            bufs.iter_mut().map(|b| Some(&mut **b)).collect();
        let mut exchanges = Vec::new();
        for ((ep, _segment_id), idxs) in &tcp_groups {
            let mut reads: Vec<(Grant, u64, &mut [u8])> = Vec::new();
            for &i in idxs {
                let r = found[i].as_ref().expect("grouped only found objects");
                let first = self.read_order(&r.replicas)[0];
                let buf = by_index[i].take().expect("each index grouped once");
                reads.push((
                    Grant::from(first),
                    first.offset,
                    &mut buf[..r.size as usize],
                ));
            }
            exchanges.push(async move {
                let mut reads = reads;
                let outcome = self.tcp.read_checksummed(ep, &mut reads).await;
                (ep, idxs, outcome)
            });
        }
        let mut fallback = singles;
        for (ep, idxs, outcome) in futures::future::join_all(exchanges).await {
            match outcome {
                Ok(crcs) => {
                    for (&i, crc) in idxs.iter().zip(crcs) {
                        let r = found[i].as_ref().expect("found");
                        self.stats
                            .tcp_bytes
                            .fetch_add(r.size, std::sync::atomic::Ordering::Relaxed);
                        if crc == r.checksum {
                            results[i] = Some(Ok(r.size as usize));
                        } else {
                            fallback.push(i);
                        }
                    }
                }
                Err(e) => {
                    self.tcp.forget(ep);
                    let e = Error::from_transfer(e);
                    for &i in idxs {
                        let r = found[i].as_ref().expect("found");
                        // Refused at the TLS layer: falling back would
                        // repeat the refused handshake with this store
                        // once per object. Only objects with a replica
                        // elsewhere fall back.
                        let elsewhere = r.replicas.iter().any(|x| x.endpoint != *ep);
                        if e.is_denied() && !elsewhere {
                            results[i] = Some(Err(e.clone()));
                        } else {
                            fallback.push(i);
                        }
                    }
                }
            }
        }
        for i in fallback {
            let r = found[i].as_ref().expect("found");
            results[i] = Some(self.read_verified(keys[i], r, bufs[i]).await);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Transfer("not attempted".into()))))
            .collect()
    }
}
