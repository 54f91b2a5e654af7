//! Gets: a lookup, then the bytes from the best replica, checksum-verified,
//! falling back across replicas; batches.

use std::collections::HashMap;
use std::time::Instant;

use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_store::protocol::{Grant, MAX_TRANSFER};

use super::*;

impl ClientCore {
    /// GetReplicaList, remembering the answer for degraded reads.
    pub(super) async fn lookup(&self, key: &str) -> Result<pb::GetReplicaListResponse> {
        let asked = Instant::now();
        match self.master.get_replica_list(key).await {
            Ok(found) => {
                self.mark_master_ok();
                self.remember_descriptor(key, &found, asked);
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
        if self.is_degraded() {
            return self
                .get_degraded(key, None)
                .await
                .map(|(_, v)| v.unwrap_or_default());
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
    }

    /// Reads `key` into `buf` without an intermediate copy; returns the object's size.
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        if self.is_degraded() {
            return self.get_degraded(key, Some(buf)).await.map(|(n, _)| n);
        }
        match self.lookup(key).await {
            Ok(found) => self.read_verified(key, &found, buf).await,
            Err(e @ Error::Unavailable(_)) if self.is_degraded() => {
                let _ = e;
                self.get_degraded(key, Some(buf)).await.map(|(n, _)| n)
            }
            Err(e) => Err(e),
        }
    }

    /// Fetches many objects: one GetReplicaList, one pipelined exchange per store.
    pub async fn get_batch(&self, keys: &[&str]) -> Result<Vec<Result<Vec<u8>>>> {
        if self.is_degraded() {
            return Ok(self.get_batch_degraded(keys).await);
        }
        let found = match self.lookup_batch(keys).await {
            Ok(found) => found,
            Err(Error::Unavailable(_)) if self.is_degraded() => {
                return Ok(self.get_batch_degraded(keys).await)
            }
            Err(e) => return Err(e),
        };
        let mut bufs: Vec<Vec<u8>> = found
            .iter()
            .map(|f| match f {
                Ok(r) => vec![0u8; r.size as usize],
                Err(_) => Vec::new(),
            })
            .collect();
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let sizes = self.read_batch(keys, &found, &mut slices).await;
        Ok(sizes
            .into_iter()
            .zip(bufs)
            .map(|(r, b)| r.map(|_| b))
            .collect())
    }

    /// Reads many objects into caller buffers; per-item sizes.
    pub async fn batch_get_into(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Result<Vec<Result<usize>>> {
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
        let found = match self.lookup_batch(keys).await {
            Ok(found) => found,
            Err(Error::Unavailable(_)) if self.is_degraded() => {
                return Ok(self.batch_get_into_degraded(keys, bufs).await)
            }
            Err(e) => return Err(e),
        };
        Ok(self.read_batch(keys, &found, bufs).await)
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
                        self.remember_descriptor(k, &r, asked);
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
