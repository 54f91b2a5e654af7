//! The remembered lookups (`descriptors`) and, with `descriptor_cache`,
//! their renewal in the background: a key this client reads through its
//! cache is looked up again before its read lease ends, so a key read
//! steadily is never a cache miss; a key not read since its last lookup is
//! left to expire, so cold keys cost the masters nothing.
//!
//! A renewal is an ordinary batched lookup: it leases the key again (as any
//! read does, delaying an unforced remove, eviction or demotion of it), it
//! counts as a read for eviction and promotion, and what it finds replaces
//! the remembered answer, so a key removed by force and put again is read
//! with its new value from then on.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

use crescent_proto::pb;

use super::ClientCore;

/// One lookup's answer, kept while its read lease lasts.
pub(super) struct Remembered {
    pub found: pb::GetReplicaListResponse,
    /// When the lease ends by this client's clock, counted from when the
    /// lookup was sent (the master started it later, so ours ends first).
    pub until: Instant,
    /// Read through the cache since this lookup: worth renewing.
    pub read: bool,
}

/// How often the renewal looks for keys due.
pub(super) const RENEW_EVERY: Duration = Duration::from_millis(200);
/// Most keys renewed in one round (the rest in the next), in lookups of
/// at most [`RENEW_BATCH`] keys each.
const MAX_RENEWALS_PER_ROUND: usize = 4096;
const RENEW_BATCH: usize = 512;

/// Keys due for renewal at `now`, at most `max`: read through the cache
/// since their lookup, with their lease not over but less than half of it
/// left. Half: a round every [`RENEW_EVERY`] then renews a key long before
/// its lease is too short to read with (a lease of 1 s or more).
pub(super) fn due_for_renewal(
    remembered: &HashMap<String, Remembered>,
    now: Instant,
    max: usize,
) -> Vec<String> {
    remembered
        .iter()
        .filter(|(_, r)| {
            let half = Duration::from_millis(r.found.lease_ttl_ms) / 2;
            r.read && r.until > now && r.until - now < half
        })
        .map(|(k, _)| k.clone())
        .take(max)
        .collect()
}

/// Renews due keys every [`RENEW_EVERY`] until the client is dropped;
/// spawned by `Client::connect` when `descriptor_cache` is on.
pub(super) async fn renew_loop(core: Weak<ClientCore>) {
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        let Some(core) = core.upgrade() else { return };
        if !core.is_degraded() {
            core.renew_due().await;
        }
    }
}

impl ClientCore {
    /// One renewal round: drops remembered answers whose lease is over and
    /// looks up the keys due again. A key the masters no longer find (or
    /// answer with an error) is forgotten; a failed call leaves the rest
    /// to expire. Returns how many keys were renewed.
    pub(super) async fn renew_due(&self) -> usize {
        let due = {
            let mut d = self.descriptors.lock().expect("lock poisoned");
            let now = Instant::now();
            d.retain(|_, r| r.until > now);
            due_for_renewal(&d, now, MAX_RENEWALS_PER_ROUND)
        };
        let mut renewed = 0;
        for chunk in due.chunks(RENEW_BATCH) {
            let keys: Vec<&str> = chunk.iter().map(String::as_str).collect();
            match self.lookup_batch(&keys).await {
                Ok(found) => {
                    for (key, f) in keys.iter().zip(found) {
                        match f {
                            Ok(_) => renewed += 1,
                            Err(_) => self.forget_descriptor(key),
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "renewing cached descriptors failed; they expire");
                    break;
                }
            }
        }
        self.stats
            .descriptor_renewals
            .fetch_add(renewed as u64, Ordering::Relaxed);
        renewed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remembered(lease_ms: u64, left: Duration, read: bool, now: Instant) -> Remembered {
        Remembered {
            found: pb::GetReplicaListResponse {
                lease_ttl_ms: lease_ms,
                ..Default::default()
            },
            until: now + left,
            read,
        }
    }

    #[test]
    fn only_keys_read_since_their_lookup_with_under_half_their_lease_left_are_due() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let d: HashMap<String, Remembered> = [
            ("hot-due", remembered(10_000, s(4), true, now)),
            ("hot-fresh", remembered(10_000, s(6), true, now)),
            ("cold-due", remembered(10_000, s(4), false, now)),
            ("over", remembered(10_000, Duration::ZERO, true, now)),
            ("no-lease", remembered(0, Duration::ZERO, true, now)),
        ]
        .into_iter()
        .map(|(k, r)| (k.to_string(), r))
        .collect();
        assert_eq!(due_for_renewal(&d, now, 10), vec!["hot-due".to_string()]);
        assert!(due_for_renewal(&d, now, 0).is_empty(), "bounded by max");
    }
}
