//! Leadership transfer ([`MasterNode::transfer_leader`]): a method of the
//! node because it sets the node's own write and lease-read switches.

use std::time::{Duration, Instant};

use crescent_proto::pb;
use crescent_raft::NodeId;

use super::MasterNode;

impl MasterNode {
    /// Hands leadership to `to`, a voter, and returns the new leader. openraft
    /// 0.9 has no built-in transfer, so: stop accepting writes (so the log
    /// stops growing), wait until `to` has the whole log, stop heartbeating
    /// so the followers' leader lease runs out, then have `to` campaign just
    /// after the lease expires, before anyone else's election timer fires.
    /// Writes are refused, naming `to`, for the whole handover and taken
    /// again if it fails; every step is bounded in time, so a target that
    /// freezes mid-way cannot keep this leader from taking writes.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<NodeId, String> {
        let addr = self.node_addr(to).ok_or("target has no address")?;
        // Before the catch-up wait: under a steady write load the target would
        // otherwise chase a growing log and never be caught up.
        *self.transferring_to.lock().expect("lock poisoned") = Some((to, Instant::now()));
        self.forgo_lease_this_term();
        let caught_up = self.wait_caught_up(to, Duration::from_secs(3)).await;
        if let Err(e) = caught_up {
            *self.transferring_to.lock().expect("lock poisoned") = None;
            tracing::warn!(error = %e, "leadership transfer failed");
            return Err(e);
        }
        let lease = self.config.election_timeout_max;
        self.raft.runtime_config().heartbeat(false);
        self.raft.runtime_config().elect(false);
        let term = self.metrics().current_term;
        let result = async {
            // A frozen target accepts the TCP connection and then answers
            // nothing; without deadlines writes stayed refused until it woke.
            let tls = self.tls.load().as_ref().map(|t| t.client_config());
            let endpoint = crescent_auth::tls::endpoint(&addr, tls.as_ref())
                .map_err(|e| e.to_string())?
                .connect_timeout(Duration::from_millis(500))
                .timeout(Duration::from_secs(1));
            let channel = tokio::time::timeout(Duration::from_secs(1), endpoint.connect())
                .await
                .map_err(|_| format!("cannot reach node {to}: connect timed out"))?
                .map_err(|e| format!("cannot reach node {to}: {e}"))?;
            let mut client = pb::cluster_service_client::ClusterServiceClient::new(
                self.peer_token.wrap(channel),
            );
            client
                .timeout_now(pb::TimeoutNowRequest {
                    from: self.id,
                    term,
                    campaign_after_ms: (lease + Duration::from_millis(30)).as_millis() as u64,
                })
                .await
                .map_err(|e| format!("node {to} refused: {e}"))?;
            let deadline = Instant::now() + lease * 4 + Duration::from_secs(2);
            let mut rx = self.raft.metrics();
            loop {
                let leader = {
                    let m = rx.borrow();
                    (m.current_leader, m.current_term)
                };
                if let (Some(l), t) = leader {
                    if l != self.id && t > term {
                        return Ok(l);
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                    return Err("no new leader emerged in time; leadership stays here".to_string());
                }
            }
        }
        .await;
        self.raft.runtime_config().heartbeat(true);
        self.raft.runtime_config().elect(true);
        *self.transferring_to.lock().expect("lock poisoned") = None;
        match &result {
            Ok(l) => tracing::info!(from = self.id, to = l, "leadership transferred"),
            Err(e) => tracing::warn!(error = %e, "leadership transfer failed"),
        }
        result
    }

    /// Waits until the leader knows `to` holds its whole log.
    async fn wait_caught_up(&self, to: NodeId, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let m = self.metrics();
            let last = m.last_log_index.unwrap_or(0);
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&to).copied().flatten())
                .map(|l| l.index)
                .unwrap_or(0);
            if matched >= last {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "node {to} did not catch up (matched {matched} of {last})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
