//! [`FaultKind::AddAndRemoveMaster`]: a new master joins the membership
//! (learner, then voter) while the workers run, stays for the fault's hold
//! and is removed again: two joint-consensus changes under load. The
//! membership must end as it began, three voters, or a later single master
//! loss would leave no quorum; so the removal is retried, and a master
//! whose removal never succeeded is left running.
//!
//! [`FaultKind::AddAndRemoveMaster`]: crate::schedule::FaultKind::AddAndRemoveMaster

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crescent_client::{MasterClient, MasterRpcError};
use crescent_proto::{pb, ErrorCode};

use crate::deploy::Deployment;

/// Node ids are never reused, so each added master takes the next one
/// (the deployment's masters are 1 to 3).
static NEXT_MASTER_ID: AtomicU64 = AtomicU64::new(4);

/// How long one membership change may take (a learner catches up first).
const CHANGE_LIMIT: Duration = Duration::from_secs(30);
/// How long the removal is retried before the fault gives up.
const REMOVE_LIMIT: Duration = Duration::from_secs(60);

/// Adds a master, holds `hold`, removes it. Returns the fault's target.
pub async fn add_and_remove_master(
    dep: &mut dyn Deployment,
    hold: Duration,
) -> anyhow::Result<String> {
    let id = NEXT_MASTER_ID.fetch_add(1, Ordering::Relaxed);
    let masters: Vec<String> = dep
        .master_ids()
        .into_iter()
        .map(|m| dep.master_addr(m))
        .collect();
    let token = crescent_auth::BearerToken::from_optional_file(dep.admin_token_file().as_deref())?;
    let admin = MasterClient::new(&masters.join(","))?.with_token(token);
    let Some(addr) = dep.start_joining_master(id)? else {
        println!("chaos:      no master added (masters cannot be added in this mode)");
        return Ok("nothing".into());
    };
    let started = Instant::now();
    let added = change(&admin, CHANGE_LIMIT, |ch| {
        let req = pb::AddMemberRequest {
            id,
            addr: addr.clone(),
            learner_only: false,
        };
        async move { MasterClient::cluster(ch).add_member(req).await }
    })
    .await;
    let added_after = started.elapsed();
    if added.is_ok() {
        tokio::time::sleep(hold).await;
    }
    let removing = Instant::now();
    let removed = remove(&admin, id).await;
    let removed_after = removing.elapsed();
    match &removed {
        Ok(()) => dep.drop_master(id)?,
        // Still a member, perhaps a voter: stopping it would cost the
        // cluster its tolerance of one more master loss.
        Err(e) => println!("chaos:      master {id} left running: its removal failed: {e}"),
    }
    println!(
        "chaos:      master {id} added in {:.1} s ({}), removed in {:.1} s ({})",
        added_after.as_secs_f64(),
        outcome(&added),
        removed_after.as_secs_f64(),
        outcome(&removed)
    );
    added?;
    removed?;
    Ok(format!("master {id}"))
}

fn outcome(r: &anyhow::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("failed: {e}"),
    }
}

/// Removes `id`, retrying until [`REMOVE_LIMIT`]; "not a member" (its
/// addition never reached the log) counts as removed.
async fn remove(admin: &MasterClient, id: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + REMOVE_LIMIT;
    loop {
        let r = change(admin, CHANGE_LIMIT, |ch| async move {
            MasterClient::cluster(ch)
                .remove_member(pb::RemoveMemberRequest { id })
                .await
        })
        .await;
        let not_a_member = matches!(
            r.as_ref().err().and_then(|e| e.downcast_ref::<MasterRpcError>()),
            Some(MasterRpcError::Status { code: ErrorCode::InvalidParams, message })
                if message.contains("not a member")
        );
        if r.is_ok() || not_a_member || Instant::now() >= deadline {
            return if not_a_member { Ok(()) } else { r };
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One membership RPC on the leader, its status checked.
async fn change<F, Fut>(admin: &MasterClient, within: Duration, f: F) -> anyhow::Result<()>
where
    F: Fn(crescent_auth::AuthedChannel) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<pb::StatusResponse>, tonic::Status>>,
{
    let r = admin.call_leader_within(within, f).await?;
    match r.status {
        Some(s) if !s.is_ok() => Err(MasterRpcError::from_status(&s).into()),
        _ => Ok(()),
    }
}
