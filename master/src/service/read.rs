//! GetReplicaList and Exist: lookups after a read barrier, leasing what
//! they find, with read grants.

use crescent_auth::capability::Access;
use crescent_proto::pb;
use crescent_proto::ErrorCode;

use super::grants::{replica_pb, GrantTerms};
use super::{meta_status, node_status, MasterApi};

impl MasterApi {
    /// GetReplicaList of `keys`: the core of GetReplicaList and
    /// BatchGetReplicaList.
    pub(super) async fn replica_lists(
        &self,
        keys: &[String],
    ) -> Result<Vec<pb::GetReplicaListResponse>, pb::Status> {
        self.node
            .counters()
            .get_replica_list_requests
            .fetch_add(keys.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.lookup(keys).await
    }

    /// Looks `keys` up after a read barrier, leasing those found.
    pub(super) async fn lookup(
        &self,
        keys: &[String],
    ) -> Result<Vec<pb::GetReplicaListResponse>, pb::Status> {
        self.check_keys(keys.iter().map(String::as_str))?;
        self.node
            .linearizable_read()
            .await
            .map_err(|e| node_status(&e))?;
        let lease_ms = self.node.config().lease_ttl.as_millis() as u64;
        let deadline = tokio::time::Instant::now() + self.node.config().write_timeout;
        loop {
            // A doomed key's removal or eviction is in flight: wait for its
            // fate rather than guess it (answering "not found" for a removal
            // that turns out a no-op broke linearizability in a soak).
            let settled = self.node.doom_settled();
            tokio::pin!(settled);
            if let Some(out) = self.lookup_now(keys, lease_ms, settled.as_mut()) {
                return Ok(out);
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return Err(pb::Status::error(
                    ErrorCode::RpcTimeout,
                    "a removal of a looked-up key is still in flight",
                ));
            }
        }
    }

    /// The lookup's answers and leases, or None (with `settled` enabled
    /// under the same lock) when a key is doomed.
    pub(super) fn lookup_now(
        &self,
        keys: &[String],
        lease_ms: u64,
        settled: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    ) -> Option<Vec<pb::GetReplicaListResponse>> {
        // A read grant lasts as long as the read lease that keeps the bytes.
        let terms = GrantTerms::new(Access::Read, std::time::Duration::from_millis(lease_ms));
        self.node
            .lookup_leasing(keys, settled, |state, looked| match looked {
                Ok(view) => pb::GetReplicaListResponse {
                    status: Some(pb::Status::ok()),
                    replicas: view
                        .replicas
                        .iter()
                        .map(|r| replica_pb(state, r, terms))
                        .collect(),
                    size: view.size,
                    checksum: view.checksum,
                    lease_ttl_ms: lease_ms,
                },
                Err(e) => pb::GetReplicaListResponse {
                    status: Some(meta_status(&e)),
                    ..Default::default()
                },
            })
    }

    /// Exist of `keys`: the core of Exist and BatchExist.
    pub(super) async fn exists(
        &self,
        keys: &[String],
    ) -> Result<Vec<pb::ExistResponse>, pb::Status> {
        self.node
            .counters()
            .exist_requests
            .fetch_add(keys.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let looked = self.lookup(keys).await?;
        Ok(looked
            .into_iter()
            .map(|r| {
                let st = r.status.unwrap_or_default();
                match st.error_code() {
                    ErrorCode::Ok => pb::ExistResponse {
                        status: Some(pb::Status::ok()),
                        exists: true,
                    },
                    // Missing or still being written: not (yet) an object.
                    ErrorCode::ObjectNotFound | ErrorCode::ReplicaIsNotReady => pb::ExistResponse {
                        status: Some(pb::Status::ok()),
                        exists: false,
                    },
                    _ => pb::ExistResponse {
                        status: Some(st),
                        exists: false,
                    },
                }
            })
            .collect())
    }

    /// Keys of all objects matching `pred`, read after a read barrier.
    pub(super) async fn matching_keys(
        &self,
        pred: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, pb::Status> {
        self.node
            .linearizable_read()
            .await
            .map_err(|e| node_status(&e))?;
        let state = self.node.state();
        Ok(state.objects.keys().filter(|k| pred(k)).cloned().collect())
    }
}
