//! Eviction policy: which objects to drop when the pool runs full. Pure.
//!
//! Follows Mooncake: evict about `ratio` of the objects, oldest access first;
//! the first pass skips soft-pinned objects, a second pass may take them if
//! the first did not find enough. Never evicted: objects under a read lease,
//! hard-pinned objects and unfinished puts. Access times and leases are the
//! leader's memory, passed in as a function so this stays deterministic.

use std::collections::BTreeSet;

use crate::state::{MetaState, Object, ObjectStamp, SegmentId, Tier};

/// What the leader knows about one key that the replicated state does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessInfo {
    pub leased: bool,
    /// Last read (ms since epoch), if this leader saw one.
    pub last_access_ms: Option<u64>,
}

/// True when usage has reached the high watermark or a put recently failed for space.
pub fn should_evict(state: &MetaState, high_watermark: f64, alloc_failure_seen: bool) -> bool {
    state.tier_usage(Tier::Memory).0 > 0
        && (alloc_failure_seen || state.eviction_usage_ratio() >= high_watermark)
}

/// True when the disk tier has reached its own high watermark (space held
/// for readers not counted): only then are disk copies released and
/// objects dropped from disk for good.
pub fn should_evict_disk(state: &MetaState, disk_high_watermark: f64) -> bool {
    state.disk_eviction_usage_ratio() >= disk_high_watermark
}

/// What one memory eviction round does with its victims.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EvictionPlan {
    /// On disk already (a promoted object): only the memory replicas are
    /// released; nothing is copied and nothing is lost.
    pub drop_memory_copy: Vec<String>,
    /// Copied to disk, then their memory released.
    pub demote: Vec<String>,
    /// Dropped for good, if still the object chosen: too large to move, or
    /// no disk room.
    pub evict: Vec<(String, ObjectStamp)>,
    /// Being copied between tiers already (by this leader's promotion, or
    /// an earlier leader's round that died before its end and waits for
    /// its release time): left alone this round. A demotion of them would
    /// be refused, and a refused demotion is evicted.
    pub busy: Vec<String>,
    /// Removed, or removed and put again, since they were chosen: nothing
    /// to do (the new object was not chosen).
    pub gone: Vec<String>,
}

/// Splits memory eviction `victims` by what frees their memory: those
/// with a disk replica already (promoted: their memory copies are simply
/// released; a disk replica on an expired segment too, which comes back
/// with its store, so the object must not be evicted), those being copied
/// between tiers already (left alone: see [`EvictionPlan::busy`]), those
/// up to `max_moved_size` a live disk segment has room for (demoted; not
/// counting the `avoided` segments, whose copies failed lately), those
/// whose key names another object now or none ([`EvictionPlan::gone`]), and
/// the rest (evicted).
pub fn plan_eviction(
    state: &MetaState,
    victims: Vec<(String, ObjectStamp)>,
    max_moved_size: u64,
    avoided: &BTreeSet<SegmentId>,
) -> EvictionPlan {
    let mut plan = EvictionPlan::default();
    for (key, stamp) in victims {
        let Some(o) = state.objects.get(&key).filter(|o| stamp.names(o)) else {
            plan.gone.push(key);
            continue;
        };
        if state.is_moving(&key) {
            plan.busy.push(key);
        } else if state.has_disk_replica(o) {
            plan.drop_memory_copy.push(key);
        } else if o.size <= max_moved_size && state.disk_room_for(o.size, avoided) {
            plan.demote.push(key);
        } else {
            plan.evict.push((key, stamp));
        }
    }
    plan
}

/// `keys` with the stamps of the complete objects they name now; keys
/// naming none are left out.
pub fn stamped(state: &MetaState, keys: Vec<String>) -> Vec<(String, ObjectStamp)> {
    keys.into_iter()
        .filter_map(|k| {
            let stamp = state
                .objects
                .get(&k)
                .filter(|o| o.is_complete())
                .map(ObjectStamp::of)?;
            Some((k, stamp))
        })
        .collect()
}

/// Keys to evict from memory, oldest access first. `ratio` of the objects
/// in memory, at least one when any is evictable.
pub fn select_victims<F>(state: &MetaState, now_ms: u64, ratio: f64, access: F) -> Vec<String>
where
    F: Fn(&str) -> AccessInfo,
{
    select_victims_in(state, Tier::Memory, now_ms, ratio, access)
}

/// Which objects a selection considers.
#[derive(Clone, Copy)]
enum Holding {
    /// Any replica in memory: demoting or evicting it frees memory.
    Memory,
    /// Only on disk: dropping it frees disk and loses the object.
    DiskOnly,
    /// On disk and on a live memory segment (promoted): dropping its disk
    /// copy frees disk and the object stays readable.
    DiskCopy,
}

fn holds(state: &MetaState, obj: &Object, holding: Holding) -> bool {
    let mut tiers = obj.replicas.iter().map(|r| state.tier_of(r.segment_id));
    match holding {
        Holding::Memory => tiers.any(|t| t == Tier::Memory),
        Holding::DiskOnly => tiers.all(|t| t == Tier::Disk),
        Holding::DiskCopy => {
            state.has_disk_replica(obj)
                && obj.replicas.iter().any(|r| state.live_in(r, Tier::Memory))
        }
    }
}

/// Keys to drop or move out of `tier`, oldest access first: `ratio` of the
/// objects holding space there, at least one when any is evictable. For
/// the disk tier, objects only on disk (an object still in memory is the
/// memory tier's business, or [`select_disk_copies`]').
pub fn select_victims_in<F>(
    state: &MetaState,
    tier: Tier,
    now_ms: u64,
    ratio: f64,
    access: F,
) -> Vec<String>
where
    F: Fn(&str) -> AccessInfo,
{
    let holding = match tier {
        Tier::Memory => Holding::Memory,
        Tier::Disk => Holding::DiskOnly,
    };
    select(state, holding, now_ms, ratio, access)
}

/// Objects whose disk copy the disk watermark should release before any
/// object is dropped from disk: those also in memory (promoted), leased
/// or not, oldest access first, `ratio` of them, at least one when any.
pub fn select_disk_copies<F>(state: &MetaState, now_ms: u64, ratio: f64, access: F) -> Vec<String>
where
    F: Fn(&str) -> AccessInfo,
{
    select(state, Holding::DiskCopy, now_ms, ratio, access)
}

fn select<F>(state: &MetaState, holding: Holding, now_ms: u64, ratio: f64, access: F) -> Vec<String>
where
    F: Fn(&str) -> AccessInfo,
{
    let in_tier = state
        .objects
        .values()
        .filter(|o| holds(state, o, holding))
        .count();
    let target = ((in_tier as f64) * ratio.clamp(0.0, 1.0)).ceil() as usize;
    let target = target.max(1);
    let mut unpinned: Vec<(u64, &str)> = Vec::new();
    let mut soft_pinned: Vec<(u64, &str)> = Vec::new();
    // Objects being copied between tiers are left to that copy (a round
    // could not move them anyway): choosing them would fill rounds with
    // objects that wait for a failed copy's release time.
    let moving = state.moving_keys();
    for (key, obj) in &state.objects {
        if !obj.is_complete()
            || obj.hard_pin
            || !holds(state, obj, holding)
            || moving.contains(key.as_str())
        {
            continue;
        }
        let info = access(key);
        // A leased object's disk copy may go: it stays readable from
        // memory, and the copy's space is held a lease TTL for a reader
        // that reads it anyway.
        if info.leased && !matches!(holding, Holding::DiskCopy) {
            continue;
        }
        let age_key = info
            .last_access_ms
            .unwrap_or(obj.created_ms)
            .max(obj.created_ms);
        if obj.soft_pinned_at(now_ms) {
            soft_pinned.push((age_key, key));
        } else {
            unpinned.push((age_key, key));
        }
    }
    let mut victims = oldest(unpinned, target);
    if victims.len() < target {
        let more = oldest(soft_pinned, target - victims.len());
        victims.extend(more);
    }
    victims
}

/// The `n` entries with the smallest age key, oldest first; ties broken by key for determinism.
fn oldest(mut items: Vec<(u64, &str)>, n: usize) -> Vec<String> {
    if items.len() > n && n > 0 {
        items.select_nth_unstable(n - 1);
        items.truncate(n);
    } else if n == 0 {
        items.clear();
    }
    items.sort_unstable();
    items.into_iter().map(|(_, k)| k.to_string()).collect()
}
