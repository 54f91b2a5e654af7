//! Leader-only background work: eviction, client liveness, reclaim of
//! abandoned puts and lease expiry. Started when this node becomes leader,
//! stopped when it stops being leader.
//!
//! A new leader does not know the heartbeats and read leases its predecessor
//! granted, so it waits one lease TTL before evicting and treats every known
//! client as alive for one client TTL before expiring any.

use std::sync::Arc;
use std::time::Duration;

use crescent_raft::state::Op;
use crescent_raft::Response;
use openraft::ServerState;
use tokio::task::JoinSet;

use crate::node::{now_ms, MasterNode};

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
                set.spawn(liveness_loop(node.clone()));
                set.spawn(reclaim_loop(node.clone()));
                set.spawn(lease_sweep_loop(node.clone()));
                set.spawn(reservation_loop(node.clone()));
                if let Some(etcd) = node.etcd() {
                    set.spawn(crate::etcd::leader_loop(node.clone(), etcd.clone(), term));
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

async fn eviction_loop(node: Arc<MasterNode>) {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some((victims, failures)) = node.claim_eviction_victims() else {
            continue;
        };
        let usage_before = usage(&node);
        node.counters()
            .eviction_rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = if victims.is_empty() {
            Ok(Response::Count(0))
        } else {
            let chosen = victims.clone();
            node.propose_settled(
                None,
                Op::Evict {
                    keys: victims.clone(),
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
                if victims.is_empty() {
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
            match node.propose(None, Op::ReclaimStalePuts).await {
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
