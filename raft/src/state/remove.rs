//! Removes and evictions: which objects go, and when their space is free
//! again.

use super::*;

impl MetaState {
    /// [`remove`](Self::remove) of each key, its space held `hold_ms`.
    pub(super) fn remove_keys(
        &mut self,
        now: u64,
        keys: &[String],
        force: bool,
        leased: &BTreeSet<String>,
        hold_ms: u64,
    ) -> Response {
        let hold_until = now.saturating_add(hold_ms);
        Response::Items(
            keys.iter()
                .map(|k| self.remove(now, k, force, leased.contains(k), hold_until))
                .collect(),
        )
    }

    /// `leased`: the leader could not rule out a read lease on `key`; kept
    /// unless forced. A removed finished object's space stays unallocated
    /// until `hold_until`. An unfinished put is refused even when forced:
    /// its writer may still commit it or retry it elsewhere, and a remove that answered OK before that put's value
    /// appeared would not be linearizable. Stale puts go by reclaim.
    pub(super) fn remove(
        &mut self,
        now: u64,
        key: &str,
        force: bool,
        leased: bool,
        hold_until: u64,
    ) -> Result<(), MetaError> {
        let obj = self
            .objects
            .get(key)
            .ok_or_else(|| MetaError::ObjectNotFound(key.to_string()))?;
        if !obj.is_complete() {
            return Err(MetaError::ReplicaNotReady(key.to_string()));
        }
        if !force {
            if leased {
                return Err(MetaError::ObjectHasLease(key.to_string()));
            }
            if obj.hard_pin {
                return Err(MetaError::ObjectPinned(key.to_string()));
            }
        }
        let obj = self.objects.remove(key).expect("checked above");
        count_out(&mut self.usage, key, &obj);
        match obj.phase {
            PutPhase::Complete { .. } if hold_until > now => {
                for replica in obj.replicas {
                    self.pending_release.push(PendingRelease {
                        replica,
                        release_at_ms: hold_until,
                    });
                }
            }
            _ => self.retire(now, obj),
        }
        Ok(())
    }

    /// Frees a removed object's space, or parks it while its writer may still write.
    pub(super) fn retire(&mut self, now: u64, obj: Object) {
        match obj.phase {
            PutPhase::Complete { .. } => self.free_replicas(&obj.replicas),
            PutPhase::Processing { release_at_ms, .. } => {
                for replica in obj.replicas {
                    self.pending_release.push(PendingRelease {
                        replica,
                        release_at_ms: release_at_ms.max(now),
                    });
                }
            }
        }
    }

    /// Drops each key's object if it is complete, not hard-pinned and the
    /// object the stamp names.
    pub(super) fn evict<'a>(
        &mut self,
        items: impl Iterator<Item = (&'a String, &'a ObjectStamp)>,
    ) -> u64 {
        let mut evicted = 0;
        for (key, stamp) in items {
            let evictable = self
                .objects
                .get(key)
                .is_some_and(|o| o.is_complete() && !o.hard_pin && stamp.names(o));
            if evictable {
                let obj = self.objects.remove(key).expect("checked above");
                count_out(&mut self.usage, key, &obj);
                self.free_replicas(&obj.replicas);
                evicted += 1;
            }
        }
        self.evicted_total += evicted;
        evicted
    }
}
