//! leader / members / status / transfer-leader.

use std::collections::BTreeMap;

use crescent_client::{MasterClient, MasterRpcError};
use crescent_proto::pb;
use serde_json::json;

fn role_name(r: i32) -> &'static str {
    match pb::Role::try_from(r).unwrap_or(pb::Role::Unknown) {
        pb::Role::Leader => "leader",
        pb::Role::Follower => "follower",
        pb::Role::Candidate => "candidate",
        pb::Role::Learner => "learner",
        pb::Role::Shutdown => "shutdown",
        pb::Role::Unknown => "unknown",
    }
}

pub async fn leader(client: &MasterClient, json: bool) -> anyhow::Result<()> {
    let l = client.get_leader().await?;
    if json {
        println!(
            "{}",
            json!({"leader_id": l.leader_id, "leader_addr": l.leader_addr, "term": l.term})
        );
    } else {
        println!(
            "leader {} at {} (term {})",
            l.leader_id, l.leader_addr, l.term
        );
    }
    Ok(())
}

pub async fn members(client: &MasterClient, json: bool) -> anyhow::Result<()> {
    let l = client.get_leader().await?;
    let r = client
        .call_node(&l.leader_addr, |ch| async move {
            MasterClient::cluster(ch)
                .list_members(pb::ListMembersRequest {})
                .await
        })
        .await?;
    if json {
        let v: Vec<_> = r
            .members
            .iter()
            .map(|m| {
                json!({"id": m.id, "addr": m.addr, "voter": m.voter, "leader": m.id == r.leader_id,
                       "matched_index": m.matched_index, "lag": m.lag, "last_contact_ms": m.last_contact_ms})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:>4}  {:<22} {:<8} {:<7} {:>10} {:>6} {:>13}",
        "ID", "ADDRESS", "KIND", "LEADER", "MATCHED", "LAG", "LAST CONTACT"
    );
    for m in &r.members {
        let contact = if m.last_contact_ms < 0 {
            "-".to_string()
        } else {
            format!("{}ms", m.last_contact_ms)
        };
        println!(
            "{:>4}  {:<22} {:<8} {:<7} {:>10} {:>6} {:>13}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" },
            if m.id == r.leader_id { "*" } else { "" },
            m.matched_index,
            m.lag,
            contact
        );
    }
    Ok(())
}

pub async fn status(client: &MasterClient, json: bool) -> anyhow::Result<()> {
    // Every address we know: the seeds, plus the members any of them reports.
    let mut addrs: BTreeMap<String, Option<u64>> =
        client.seeds().iter().map(|s| (s.clone(), None)).collect();
    for seed in client.seeds() {
        if let Ok(r) = client
            .call_node(&seed, |ch| async move {
                MasterClient::cluster(ch)
                    .list_members(pb::ListMembersRequest {})
                    .await
            })
            .await
        {
            for m in r.members {
                addrs.insert(m.addr, Some(m.id));
            }
            break;
        }
    }
    let mut rows = Vec::new();
    for (addr, id) in &addrs {
        let r = client.node_status(addr).await;
        rows.push((addr.clone(), *id, r));
    }
    // Quorum: a majority of the voters (as the leader sees them) report the same leader.
    let voters: Vec<u64> = rows
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .find(|s| s.role == pb::Role::Leader as i32)
        .map(|s| s.members.iter().filter(|m| m.voter).map(|m| m.id).collect())
        .unwrap_or_default();
    let leader = rows
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .find(|s| s.role == pb::Role::Leader as i32)
        .map(|s| (s.id, s.term));
    let agreeing = rows
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .filter(|s| voters.contains(&s.id) && Some((s.leader_id, s.term)) == leader)
        .count();
    let quorum = leader.is_some() && !voters.is_empty() && agreeing > voters.len() / 2;
    if json {
        let nodes: Vec<_> = rows
            .iter()
            .map(|(addr, id, r)| match r {
                Ok(s) => json!({"id": s.id, "addr": addr, "reachable": true, "role": role_name(s.role),
                    "term": s.term, "leader_id": s.leader_id, "last_log_index": s.last_log_index,
                    "committed": s.committed, "applied": s.applied, "snapshot_index": s.snapshot_index,
                    "lag": s.last_log_index.saturating_sub(s.applied), "keys": s.key_count,
                    "segments": s.segment_count,
                    "memory": {"capacity": s.memory_capacity, "allocated": s.memory_allocated},
                    "disk": {"capacity": s.disk_capacity, "allocated": s.disk_allocated,
                        "keys": s.disk_key_count}}),
                Err(e) => json!({"id": id, "addr": addr, "reachable": false, "error": e.to_string()}),
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"quorum": quorum, "leader_id": leader.map(|l| l.0),
                "term": leader.map(|l| l.1), "voters": voters, "nodes": nodes})
            )?
        );
        return Ok(());
    }
    println!(
        "{:>4}  {:<22} {:<10} {:>6} {:>7} {:>10} {:>10} {:>10} {:>6} {:>9}",
        "ID",
        "ADDRESS",
        "ROLE",
        "TERM",
        "LEADER",
        "LAST LOG",
        "COMMITTED",
        "APPLIED",
        "LAG",
        "KEYS"
    );
    for (addr, id, r) in &rows {
        match r {
            Ok(s) => println!(
                "{:>4}  {:<22} {:<10} {:>6} {:>7} {:>10} {:>10} {:>10} {:>6} {:>9}",
                s.id,
                addr,
                role_name(s.role),
                s.term,
                s.leader_id,
                s.last_log_index,
                s.committed,
                s.applied,
                s.last_log_index.saturating_sub(s.applied),
                s.key_count
            ),
            Err(e) => println!(
                "{:>4}  {:<22} {:<10} {}",
                id.map(|i| i.to_string()).unwrap_or_else(|| "?".into()),
                addr,
                "DOWN",
                e
            ),
        }
    }
    match leader {
        Some((id, term)) => println!(
            "leader: {id} (term {term}); quorum: {} ({agreeing} of {} voters agree)",
            if quorum { "yes" } else { "NO" },
            voters.len()
        ),
        None => println!("leader: none reachable; quorum: NO"),
    }
    // The tiers as the leader sees them.
    if let Some(s) = rows
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().ok())
        .find(|s| s.role == pb::Role::Leader as i32)
    {
        println!(
            "memory: {} of {} used ({}); disk: {} of {} used ({}), {} objects on disk",
            crescent_proto::units::format_size(s.memory_allocated),
            crescent_proto::units::format_size(s.memory_capacity),
            percent(s.memory_allocated, s.memory_capacity),
            crescent_proto::units::format_size(s.disk_allocated),
            crescent_proto::units::format_size(s.disk_capacity),
            percent(s.disk_allocated, s.disk_capacity),
            s.disk_key_count
        );
    }
    Ok(())
}

fn percent(used: u64, capacity: u64) -> String {
    if capacity == 0 {
        "-".into()
    } else {
        format!("{:.1}%", used as f64 * 100.0 / capacity as f64)
    }
}

fn check(s: Option<pb::Status>) -> anyhow::Result<()> {
    match s {
        Some(s) if !s.is_ok() => Err(MasterRpcError::from_status(&s).into()),
        _ => Ok(()),
    }
}

pub async fn add_member(
    client: &MasterClient,
    id: u64,
    addr: &str,
    learner: bool,
) -> anyhow::Result<()> {
    let r = client
        .call_leader(|ch| {
            let req = pb::AddMemberRequest {
                id,
                addr: addr.to_string(),
                learner_only: learner,
            };
            async move { MasterClient::cluster(ch).add_member(req).await }
        })
        .await?;
    check(r.status)?;
    println!(
        "node {id} at {addr} added as {}",
        if learner { "learner" } else { "voter" }
    );
    Ok(())
}

pub async fn remove_member(client: &MasterClient, id: u64) -> anyhow::Result<()> {
    let r = client
        .call_leader(|ch| async move {
            MasterClient::cluster(ch)
                .remove_member(pb::RemoveMemberRequest { id })
                .await
        })
        .await?;
    check(r.status)?;
    println!("node {id} removed");
    Ok(())
}

pub async fn transfer_leader(client: &MasterClient, id: u64) -> anyhow::Result<()> {
    // One request to the leader, not call_leader's retries: a failed
    // handover is a definitive answer (the leader stays), and a timed-out
    // attempt must not start a second handover behind the user's back.
    let leader = client.get_leader().await?;
    let ch = client.channel(&leader.leader_addr)?;
    let mut cluster = MasterClient::cluster(ch);
    let call = cluster.transfer_leader(pb::TransferLeaderRequest { to: id });
    // The master bounds a handover to a few seconds (catch-up, the target's
    // answer, its election); this only guards against a leader that froze.
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), call)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "leader {} did not answer within 20 s; check `crescentctl leader`",
                leader.leader_addr
            )
        })?
        .map_err(|s| anyhow::anyhow!("leader {}: {}", leader.leader_addr, s.message()))?
        .into_inner();
    check(r.status)?;
    // The target campaigns first, but another voter may still win the
    // election; that is a failed request, not a success to print.
    anyhow::ensure!(
        r.new_leader_id == id,
        "leadership moved to node {} instead of node {id} (another voter won the election); ask again",
        r.new_leader_id
    );
    println!("leader is now node {}", r.new_leader_id);
    Ok(())
}
