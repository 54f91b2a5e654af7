//! Degraded mode: with no master reachable, puts go to the bounded local
//! cache and gets read it or a replica whose descriptor is still under its
//! read lease; on recovery local objects are published (or dropped).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crescent_proto::pb;

use super::*;

impl ClientCore {
    pub(super) fn mark_master_ok(&self) {
        *self.last_master_ok.lock().expect("lock poisoned") = Instant::now();
    }

    /// A master call failed for lack of masters: go degraded if it has been long enough.
    pub(super) fn note_unavailable(&self, e: &Error) {
        if matches!(e, Error::Unavailable(_)) && !self.config.degrade_after.is_zero() {
            let silent = self.last_master_ok.lock().expect("lock poisoned").elapsed();
            if silent >= self.config.degrade_after && !self.degraded.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    ?silent,
                    "no master reachable: entering degraded (local-only) mode"
                );
            }
        }
    }

    /// Holds `r` for degraded reads while its read lease lasts. The lease is
    /// counted from `asked` (when the request was sent), not from the answer:
    /// the master started it later than that, so ours ends first.
    pub(super) fn remember_descriptor(
        &self,
        key: &str,
        r: &pb::GetReplicaListResponse,
        asked: Instant,
    ) {
        let mut d = self.descriptors.lock().expect("lock poisoned");
        if d.len() >= MAX_DESCRIPTORS {
            d.clear();
        }
        let until = asked + Duration::from_millis(r.lease_ttl_ms);
        d.insert(
            key.to_string(),
            Remembered {
                found: r.clone(),
                until,
                read: false,
            },
        );
    }

    pub(super) fn leased_descriptor(&self, key: &str) -> Option<pb::GetReplicaListResponse> {
        let d = self.descriptors.lock().expect("lock poisoned");
        d.get(key)
            .filter(|r| r.until > Instant::now())
            .map(|r| r.found.clone())
    }

    pub(super) fn put_local(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut cache = self.local_only.lock().expect("lock poisoned");
        match cache.insert(key, Arc::new(value.to_vec())) {
            Ok(evicted) => {
                if !evicted.is_empty() {
                    tracing::debug!(
                        count = evicted.len(),
                        "local-only cache full; dropped oldest entries"
                    );
                }
                self.stats.degraded_puts.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(size) => Err(Error::InvalidArgument(format!(
                "degraded mode: a {size}-byte value exceeds the {}-byte local buffer",
                self.config.local_buffer_size
            ))),
        }
    }

    /// Degraded get: the local-only cache, then a replica whose descriptor we
    /// still hold under its read lease (bytes verified by checksum).
    pub(super) async fn get_degraded(
        &self,
        key: &str,
        buf: Option<&mut [u8]>,
    ) -> Result<(usize, Option<Vec<u8>>)> {
        self.stats.degraded_gets.fetch_add(1, Ordering::Relaxed);
        let local = self.local_only.lock().expect("lock poisoned").get(key);
        if let Some(v) = local {
            return match buf {
                Some(b) if b.len() < v.len() => Err(Error::BufferTooSmall {
                    size: v.len() as u64,
                    buffer: b.len(),
                }),
                Some(b) => {
                    b[..v.len()].copy_from_slice(&v);
                    Ok((v.len(), None))
                }
                None => Ok((v.len(), Some(v.to_vec()))),
            };
        }
        if let Some(found) = self.leased_descriptor(key) {
            return match buf {
                Some(b) => Ok((self.read_verified(key, &found, b).await?, None)),
                None => {
                    let mut v = vec![0u8; found.size as usize];
                    self.read_verified(key, &found, &mut v).await?;
                    Ok((v.len(), Some(v)))
                }
            };
        }
        Err(Error::Unavailable(format!(
            "degraded mode: {key:?} is neither in the local cache nor under a held read lease"
        )))
    }

    /// After an outage: publish (or drop) what was put locally.
    pub(super) async fn recover(&self) {
        let keys = self.local_only.lock().expect("lock poisoned").keys();
        if keys.is_empty() {
            return;
        }
        if !self.config.publish_on_recover {
            let mut cache = self.local_only.lock().expect("lock poisoned");
            for k in &keys {
                cache.remove(k);
            }
            tracing::info!(
                dropped = keys.len(),
                "dropped objects stored while degraded (publish_on_recover is off)"
            );
            return;
        }
        let mut published = 0;
        for k in keys {
            let value = self.local_only.lock().expect("lock poisoned").get(&k);
            let Some(value) = value else { continue };
            match self
                .put_cluster(&k, &value, &ReplicateConfig::default())
                .await
            {
                Ok(()) => {
                    self.local_only.lock().expect("lock poisoned").remove(&k);
                    published += 1;
                }
                Err(e) => {
                    tracing::warn!(key = k, error = %e, "could not publish a locally stored object; keeping it local");
                    if matches!(e, Error::Unavailable(_)) {
                        break;
                    }
                }
            }
        }
        self.stats.published.fetch_add(published, Ordering::Relaxed);
        tracing::info!(published, "published objects stored while degraded");
    }

    /// [`get_batch`](Self::get_batch) in degraded mode: each key as
    /// [`get`](Self::get) would serve it (local cache or a held read lease).
    pub(super) async fn get_batch_degraded(&self, keys: &[&str]) -> Vec<Result<Vec<u8>>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(
                self.get_degraded(k, None)
                    .await
                    .map(|(_, v)| v.unwrap_or_default()),
            );
        }
        out
    }

    /// [`batch_get_into`](Self::batch_get_into) in degraded mode, key by key.
    pub(super) async fn batch_get_into_degraded(
        &self,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<usize>> {
        let mut out = Vec::with_capacity(keys.len());
        for (k, buf) in keys.iter().zip(bufs.iter_mut()) {
            out.push(self.get_degraded(k, Some(buf)).await.map(|(n, _)| n));
        }
        out
    }
}
