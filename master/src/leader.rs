//! Leader-only background work: eviction, client liveness, reclaim of
//! abandoned puts and lease expiry. Started when this node becomes leader,
//! stopped when it stops being leader.
//!
//! A new leader does not know the heartbeats and read leases its predecessor
//! granted, so it waits one lease TTL before evicting and treats every known
//! client as alive for one client TTL before expiring any.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crescent_raft::state::{ObjectStamp, Op, Tier};
use crescent_raft::{NodeId, Response};
use crescent_store::TcpTransport;
use openraft::ServerState;
use tokio::task::JoinSet;

use crate::etcd::{EtcdMembership, LeaderRecord};
use crate::node::{now_ms, MasterNode};
use crate::tier_move;

/// Watches Raft metrics and runs the leader tasks for as long as this node leads.
pub async fn run_leadership_watch(node: Arc<MasterNode>) {
    let mut rx = node.metrics_watch();
    let mut running: Option<(u64, JoinSet<()>)> = None;
    let mut last_leader: Option<u64> = None;
    loop {
        let (state, term, leader) = {
            let m = rx.borrow();
            (m.state, m.current_term, m.current_leader)
        };
        if leader != last_leader {
            node.counters()
                .leader_changes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(node_id = node.id(), term, leader = ?leader, "leader changed");
            last_leader = leader;
        }
        let leading = state == ServerState::Leader && leader == Some(node.id());
        match (&running, leading) {
            (Some((t, _)), true) if *t == term => {}
            (_, true) => {
                if let Some((_, mut set)) = running.take() {
                    set.abort_all();
                }
                tracing::info!(
                    node_id = node.id(),
                    term,
                    "became leader; starting leader tasks"
                );
                node.on_leadership(term);
                let mut set = JoinSet::new();
                set.spawn(eviction_loop(node.clone()));
                set.spawn(promotion_loop(node.clone()));
                set.spawn(liveness_loop(node.clone()));
                set.spawn(reclaim_loop(node.clone()));
                set.spawn(lease_sweep_loop(node.clone()));
                set.spawn(reservation_loop(node.clone()));
                if let Some(etcd) = node.etcd() {
                    set.spawn(etcd_membership_loop(node.clone(), etcd.clone(), term));
                }
                running = Some((term, set));
            }
            (Some(_), false) => {
                tracing::info!(
                    node_id = node.id(),
                    term,
                    "no longer leader; stopping leader tasks"
                );
                if let Some((_, mut set)) = running.take() {
                    set.abort_all();
                }
            }
            (None, false) => {}
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    if let Some((_, mut set)) = running.take() {
        set.abort_all();
    }
}

/// What the leader copies objects between tiers with: its connection pool
/// to the data ports, TLS when asked.
fn copier(node: &MasterNode) -> Arc<tier_move::Copier> {
    let tls = if node.config().data_tls {
        node.config().tls().ok().flatten()
    } else {
        None
    };
    let transport = match TcpTransport::with_tls(tls.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up TLS to the data ports; copies between tiers will fail");
            TcpTransport::new()
        }
    };
    Arc::new(tier_move::Copier::new(Arc::new(transport)))
}

async fn eviction_loop(node: Arc<MasterNode>) {
    let copier = copier(&node);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        evict_from_disk(&node).await;
        let Some((victims, failures)) = node.claim_eviction_victims() else {
            continue;
        };
        let usage_before = usage(&node);
        node.counters()
            .eviction_rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Below the disk watermark, what a disk segment has room for moves
        // there instead of being dropped, and a promoted object (on disk
        // already) only loses its memory copy; neither is evicted, so their
        // doom marks are taken back at once (reads go on). What cannot be
        // moved after all is evicted, as without a disk tier, except an
        // object whose copy its target segment failed (a disk answering
        // I/O errors): it stays whole in memory, and that segment is
        // passed over for a while, so the next round moves it elsewhere or,
        // with no other room, evicts it.
        // The stamps of the objects chosen: a failed demotion evicts the
        // object chosen, never a later put of its key.
        let stamps: HashMap<String, ObjectStamp> = victims.iter().cloned().collect();
        let plan = node.split_for_demotion(victims);
        node.undoom(&plan.busy);
        node.undoom(&plan.gone);
        let mut victims = plan.evict;
        let mut to_disk = plan.demote;
        let mut freed = 0;
        if !plan.drop_memory_copy.is_empty() {
            freed = drop_copies_in(&node, Tier::Memory, plan.drop_memory_copy).await;
        }
        if to_disk.len() > tier_move::MAX_MOVES_PER_ROUND {
            let later = to_disk.split_off(tier_move::MAX_MOVES_PER_ROUND);
            node.undoom(&later);
        }
        let mut demoted = 0;
        if !to_disk.is_empty() {
            node.undoom(&to_disk);
            let chosen = to_disk.len();
            let round = tier_move::demote(&node, &copier, to_disk).await;
            demoted = round.moved;
            tracing::info!(
                demoted,
                chosen,
                failed = round.failed.len(),
                target_failed = round.target_failed.len(),
                usage_before = format!("{usage_before:.3}"),
                usage_after = format!("{:.3}", usage(&node)),
                "demotion round"
            );
            if !round.failed.is_empty() {
                if let Some(again) = node.doom_unleased(&round.failed) {
                    victims.extend(
                        again
                            .into_iter()
                            .filter_map(|k| stamps.get(&k).map(|s| (k, *s))),
                    );
                }
            }
        }
        // Memory freed this round without evicting: moved to disk, or a
        // promoted object's memory copy released.
        let spared = demoted + freed;
        let result = if victims.is_empty() {
            Ok(Response::Count(0))
        } else {
            let chosen: Vec<String> = victims.iter().map(|(k, _)| k.clone()).collect();
            node.propose_settled(
                None,
                Op::EvictObjects {
                    items: victims.clone(),
                },
                move |node, _| node.settle_eviction(&chosen),
            )
            .await
        };
        node.saw_alloc_failures(failures);
        match result {
            Ok(Response::Count(n)) => {
                if n > 0 || !victims.is_empty() {
                    tracing::info!(
                        evicted = n,
                        chosen = victims.len(),
                        usage_before = format!("{usage_before:.3}"),
                        usage_after = format!("{:.3}", usage(&node)),
                        "eviction round"
                    );
                }
                if victims.is_empty() && spared == 0 {
                    // Nothing evictable: do not spin at 10 ms on a full pool.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Ok(other) => tracing::warn!(?other, "unexpected eviction result"),
            Err(e) => {
                tracing::warn!(error = %e, "eviction proposal failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Releases the `tier` copies of promoted objects (they stay in the other
/// tier), held a lease TTL for readers; returns how many were released.
/// `keys` are doomed (claimed by the eviction round) and stay so until
/// the entry's fate is known: a lease granted after the entry's time
/// stamp would outlast the hold.
async fn drop_copies_in(node: &Arc<MasterNode>, tier: Tier, keys: Vec<String>) -> u64 {
    let hold_ms = node.config().lease_ttl.as_millis() as u64;
    let chosen = keys.clone();
    let (op, counter) = match tier {
        Tier::Memory => (
            Op::DropMemoryCopies { keys, hold_ms },
            &node.counters().memory_copies_dropped,
        ),
        Tier::Disk => (
            Op::DropDiskCopies { keys, hold_ms },
            &node.counters().disk_copies_dropped,
        ),
    };
    match node
        .propose_settled(None, op, move |node, _| node.undoom(&chosen))
        .await
    {
        Ok(Response::Count(n)) => {
            counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(released = n, ?tier, "copies of promoted objects released");
            n
        }
        Ok(other) => {
            tracing::warn!(?other, ?tier, "unexpected result of releasing copies");
            0
        }
        Err(e) => {
            tracing::warn!(error = %e, ?tier, "releasing copies: proposal failed");
            0
        }
    }
}

/// Copies objects read often enough from disk back to memory, while the
/// memory tier has room for them (see
/// [`MasterNode::take_promotion_candidates`]).
async fn promotion_loop(node: Arc<MasterNode>) {
    if node.config().promotion_reads == 0 {
        return;
    }
    let copier = copier(&node);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let keys = node.take_promotion_candidates(tier_move::MAX_MOVES_PER_ROUND);
        if keys.is_empty() {
            continue;
        }
        let chosen = keys.len();
        let round = tier_move::promote(&node, &copier, keys).await;
        tracing::info!(
            promoted = round.moved,
            chosen,
            failed = round.failed.len(),
            usage_after = format!("{:.3}", usage(&node)),
            "promotion round"
        );
    }
}

/// At the disk watermark, first releases the disk copies of promoted
/// objects (they stay readable from memory), and only when there are none
/// drops the coldest disk-only objects for good.
async fn evict_from_disk(node: &Arc<MasterNode>) {
    match node.claim_disk_copies() {
        None => return,
        Some(copies) if !copies.is_empty() => {
            drop_copies_in(node, Tier::Disk, copies).await;
            return;
        }
        Some(_) => {}
    }
    let Some(victims) = node.claim_disk_eviction_victims() else {
        return;
    };
    if victims.is_empty() {
        // Nothing evictable on a full disk: do not rescan every 10 ms.
        tokio::time::sleep(Duration::from_millis(500)).await;
        return;
    }
    let chosen: Vec<String> = victims.iter().map(|(k, _)| k.clone()).collect();
    match node
        .propose_settled(None, Op::EvictObjects { items: victims }, move |node, _| {
            node.settle_eviction(&chosen)
        })
        .await
    {
        Ok(Response::Count(n)) => {
            node.counters()
                .disk_evictions
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(evicted = n, "disk eviction round");
        }
        Ok(other) => tracing::warn!(?other, "unexpected disk eviction result"),
        Err(e) => tracing::warn!(error = %e, "disk eviction proposal failed"),
    }
}

fn usage(node: &MasterNode) -> f64 {
    node.state().usage_ratio()
}

async fn liveness_loop(node: Arc<MasterNode>) {
    let ttl = node.config().client_ttl;
    let period = (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        if node.leading_for() < ttl {
            continue;
        }
        let dead = node.silent_owners(ttl);
        let gone = node.state().expired_segments(
            crate::node::now_ms(),
            node.config().expired_segment_grace.as_millis() as u64,
            node.config().disk_segment_grace.as_millis() as u64,
        );
        for segment_id in gone {
            match node.propose(None, Op::UnmountSegment { segment_id }).await {
                Ok(_) => tracing::info!(
                    segment_id,
                    grace = ?node.config().expired_segment_grace,
                    "expired segment not re-mounted within its grace; removed"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, segment_id, "could not remove expired segment")
                }
            }
        }
        for client_id in dead {
            match node
                .propose(
                    None,
                    Op::UnmountClient {
                        client_id: client_id.clone(),
                    },
                )
                .await
            {
                Ok(Response::Count(0)) => {}
                Ok(Response::Count(n)) => tracing::info!(
                    client_id,
                    segments = n,
                    ttl = ?ttl,
                    "client missed its heartbeats; segments expired until it re-mounts"
                ),
                Ok(other) => tracing::warn!(?other, "unexpected unmount result"),
                Err(e) => tracing::warn!(error = %e, client_id, "could not unmount silent client"),
            }
        }
    }
}

async fn reclaim_loop(node: Arc<MasterNode>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let due = node.state().has_reclaimable(now_ms());
        if due {
            match node.propose(None, Op::ReclaimStalePuts {}).await {
                Ok(Response::Count(n)) => tracing::info!(reclaimed = n, "reclaimed abandoned puts"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reclaim proposal failed"),
            }
        }
    }
}

async fn lease_sweep_loop(node: Arc<MasterNode>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        node.expire_leases();
    }
}

/// Frees one-commit placements past their release time and retires
/// reservations that are due (see `node/placer.rs`).
async fn reservation_loop(node: Arc<MasterNode>) {
    // First the term's start, which lets earlier terms' reservations be
    // retired a release timeout after it (retried: the loop dies with the
    // leadership, so this ends).
    let term = node.current_term();
    loop {
        match node.propose(None, Op::LeaderStart { term }).await {
            Ok(_) => break,
            Err(e) => {
                tracing::debug!(error = %e, "LeaderStart not committed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        node.upkeep_reservations().await;
    }
}

/// Leader-only: publish the leader key and add registered masters that are not
/// members yet (learner first, then voter). Runs until aborted.
async fn etcd_membership_loop(node: Arc<MasterNode>, etcd: Arc<EtcdMembership>, term: u64) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        if !node.is_leader() {
            continue;
        }
        let record = LeaderRecord {
            id: node.id(),
            addr: node.addr().to_string(),
            term,
        };
        if let Err(e) = etcd.publish_leader(&record).await {
            tracing::warn!(error = %e, "cannot publish the leader key");
        }
        let registered = match etcd.registered().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list registered masters");
                continue;
            }
        };
        let (members, voters): (BTreeSet<NodeId>, BTreeSet<NodeId>) = node.members_and_voters();
        for (id, addr, tag) in registered {
            if voters.contains(&id) {
                continue;
            }
            if !node
                .verifier()
                .member_tag_ok(&etcd.cluster, id, &addr, &tag)
            {
                tracing::warn!(
                    id,
                    addr,
                    "a master registered in etcd without a valid tag (not signed with this \
                     cluster's token); not adding it"
                );
                continue;
            }
            if !members.contains(&id) {
                tracing::info!(
                    id,
                    addr,
                    "new master registered in etcd; adding it as a learner"
                );
                if let Err(e) = node.add_learner(id, addr.clone()).await {
                    tracing::warn!(id, error = %e, "add learner failed; will retry");
                    continue;
                }
            }
            tracing::info!(id, "promoting learner to voter");
            match node.promote_to_voter(id).await {
                Ok(_) => tracing::info!(id, "membership changed: master is now a voter"),
                Err(e) => tracing::warn!(id, error = %e, "promotion failed; will retry"),
            }
        }
    }
}
