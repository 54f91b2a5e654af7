//! Membership and discovery through etcd.
//!
//! Each master keeps a leased key `/crescent/<cluster>/masters/<node-id>` ->
//! its address (etcd-client's `keep_alive()` sends one keepalive, so we loop
//! it). Bootstrap: exactly one master initializes Raft, the one whose
//! create-if-absent transaction on `/crescent/<cluster>/bootstrap` succeeds;
//! the leader adds every other registered master, as a learner first, then as
//! a voter. In token mode a registration is "address tag", the tag an HMAC
//! keyed with the cluster token (`crescent_auth::Verifier::member_tag`): the
//! leader adds only masters whose tag it can verify, so writing to etcd is not
//! enough to join (and receive the cluster token with the leader's messages). A lapsed key never removes a voter (a flapping network must not
//! shrink the quorum): removal is `crescentctl members remove`.
//!
//! The leader publishes `/crescent/<cluster>/leader` = {id, addr, term} under
//! its lease for discovery only. Raft stays the source of truth: nobody acts
//! as leader because of this key, and clients still follow NOT_LEADER.

use std::sync::Arc;
use std::time::Duration;

use crescent_raft::NodeId;
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// Lease TTL of a master's keys; a dead master's key vanishes after this.
pub const LEASE_TTL_SECS: i64 = 5;

pub fn prefix(cluster: &str) -> String {
    format!("/crescent/{cluster}/")
}
pub fn masters_prefix(cluster: &str) -> String {
    format!("/crescent/{cluster}/masters/")
}
pub fn leader_key(cluster: &str) -> String {
    format!("/crescent/{cluster}/leader")
}
fn bootstrap_key(cluster: &str) -> String {
    format!("/crescent/{cluster}/bootstrap")
}

/// Value of the leader key.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct LeaderRecord {
    pub id: NodeId,
    pub addr: String,
    pub term: u64,
}

pub struct EtcdMembership {
    client: Mutex<Client>,
    pub cluster: String,
    node_id: NodeId,
    addr: String,
    /// Written after the address in token mode (see the module doc).
    tag: Option<String>,
    lease: std::sync::Mutex<i64>,
}

impl EtcdMembership {
    pub async fn connect(
        endpoints: &[String],
        tls: Option<&crescent_auth::tls::TlsFiles>,
        cluster: &str,
        node_id: NodeId,
        addr: &str,
        tag: Option<String>,
    ) -> anyhow::Result<Arc<Self>> {
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(3));
        if let Some(tls) = tls {
            opts = opts.with_tls(tls.client_config());
        }
        let client = Client::connect(endpoints, Some(opts)).await.map_err(|e| {
            anyhow::anyhow!("cannot connect to etcd at {}: {e}", endpoints.join(","))
        })?;
        let me = Arc::new(Self {
            client: Mutex::new(client),
            cluster: cluster.to_string(),
            node_id,
            addr: addr.to_string(),
            tag,
            lease: std::sync::Mutex::new(0),
        });
        me.register().await?;
        Ok(me)
    }

    fn lease_id(&self) -> i64 {
        *self.lease.lock().expect("lock poisoned")
    }

    /// Grants a fresh lease and (re)writes this master's key under it.
    async fn register(&self) -> anyhow::Result<()> {
        let mut c = self.client.lock().await;
        let lease = c.lease_grant(LEASE_TTL_SECS, None).await?.id();
        let key = format!("{}{}", masters_prefix(&self.cluster), self.node_id);
        let value = match &self.tag {
            Some(tag) => format!("{} {tag}", self.addr),
            None => self.addr.clone(),
        };
        c.put(key, value, Some(PutOptions::new().with_lease(lease)))
            .await?;
        *self.lease.lock().expect("lock poisoned") = lease;
        tracing::info!(
            node_id = self.node_id,
            cluster = self.cluster,
            lease,
            "registered in etcd"
        );
        Ok(())
    }

    /// True when this master won (now or earlier) the right to initialize the cluster.
    pub async fn claim_bootstrap(&self) -> anyhow::Result<bool> {
        let key = bootstrap_key(&self.cluster);
        let me = self.node_id.to_string();
        let mut c = self.client.lock().await;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(key.clone(), me.clone(), None)])
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let resp = c.txn(txn).await?;
        if resp.succeeded() {
            return Ok(true);
        }
        // Someone holds it: is it us (a restart before Raft was initialized)?
        let got = c.get(key, None).await?;
        Ok(got.kvs().first().and_then(|kv| kv.value_str().ok()) == Some(me.as_str()))
    }

    /// Registered masters: id, address and tag (empty without one).
    pub async fn registered(&self) -> anyhow::Result<Vec<(NodeId, String, String)>> {
        let prefix = masters_prefix(&self.cluster);
        let mut c = self.client.lock().await;
        let resp = c
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut out = Vec::new();
        for kv in resp.kvs() {
            let (Ok(k), Ok(v)) = (kv.key_str(), kv.value_str()) else {
                continue;
            };
            if let Some(id) = k
                .strip_prefix(&prefix)
                .and_then(|s| s.parse::<NodeId>().ok())
            {
                let mut words = v.split_whitespace();
                let addr = words.next().unwrap_or_default().to_string();
                let tag = words.next().unwrap_or_default().to_string();
                out.push((id, addr, tag));
            }
        }
        Ok(out)
    }

    pub async fn publish_leader(&self, record: &LeaderRecord) -> anyhow::Result<()> {
        let value = serde_json::to_string(record)?;
        let lease = self.lease_id();
        let mut c = self.client.lock().await;
        c.put(
            leader_key(&self.cluster),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )
        .await?;
        Ok(())
    }

    /// Keeps the lease alive; re-registers with a new lease if it was lost.
    pub async fn keep_alive_loop(self: Arc<Self>) {
        let period = Duration::from_millis((LEASE_TTL_SECS as u64 * 1000) / 3);
        loop {
            let lease = self.lease_id();
            let ok = {
                let mut c = self.client.lock().await;
                match c.lease_keep_alive(lease).await {
                    Ok((mut keeper, mut stream)) => match keeper.keep_alive().await {
                        Ok(()) => matches!(stream.message().await, Ok(Some(r)) if r.ttl() > 0),
                        Err(_) => false,
                    },
                    Err(_) => false,
                }
            };
            if !ok {
                tracing::warn!(
                    node_id = self.node_id,
                    "etcd lease lost or unreachable; re-registering"
                );
                if let Err(e) = self.register().await {
                    tracing::warn!(error = %e, "etcd re-registration failed; will retry");
                }
            }
            tokio::time::sleep(period).await;
        }
    }
}
