//! `MasterService`: the gRPC handlers. Each converts its request, calls the
//! core of its concern (one module each below; a single-object RPC is its
//! batch core with one item) and converts the answer. The cores validate
//! requests, turn writes into Raft commands and serve linearizable reads
//! from the leader; what a read leases, a removal refuses and a heartbeat
//! records is the node's to decide ([`MasterNode`]).

mod grants;
mod put;
mod put_end;
mod read;
mod remove;
mod segments;

use std::sync::Arc;

use crescent_proto::pb::{self, master_service_server::MasterService};
use crescent_proto::ErrorCode;
use crescent_raft::state::{MetaError, Op, Origin, PutId};
use crescent_raft::Response;
use tonic::{Request, Response as TonicResponse, Status as TonicStatus};

use crate::node::{MasterNode, NodeError};
use put::Started;
use put_end::{bad_next, batch_put_end_response, EndItem};

type Rpc<T> = Result<TonicResponse<T>, TonicStatus>;

const MAX_CLIENT_ID_LEN: usize = 256;

pub struct MasterApi {
    node: Arc<MasterNode>,
}

impl MasterApi {
    pub fn new(node: Arc<MasterNode>) -> Self {
        Self { node }
    }
}

fn ok<T>(v: T) -> Rpc<T> {
    Ok(TonicResponse::new(v))
}

pub fn node_status(e: &NodeError) -> pb::Status {
    match e {
        NodeError::NotLeader {
            leader_id,
            leader_addr,
        } => pb::Status::not_leader(*leader_id, leader_addr.clone()),
        NodeError::Timeout => pb::Status::error(ErrorCode::RpcTimeout, e.to_string()),
        NodeError::Unavailable(m) => pb::Status::error(ErrorCode::Unavailable, m.clone()),
        NodeError::TooLarge { .. } => pb::Status::error(ErrorCode::InvalidParams, e.to_string()),
    }
}

fn meta_status(e: &MetaError) -> pb::Status {
    pb::Status::error(e.code(), e.to_string())
}

fn item_status(r: &Result<(), MetaError>) -> pb::Status {
    match r {
        Ok(()) => pb::Status::ok(),
        Err(e) => meta_status(e),
    }
}

/// How an error names item `i` of a request of `n` items: not at all in a
/// single-object request (the batch core with one item).
fn item_prefix(i: usize, n: usize) -> String {
    if n > 1 {
        format!("item {i}: ")
    } else {
        String::new()
    }
}

fn invalid(code: ErrorCode, msg: impl Into<String>) -> pb::Status {
    pb::Status::error(code, msg)
}

fn unexpected(resp: &Response) -> pb::Status {
    pb::Status::error(
        ErrorCode::InternalError,
        format!("unexpected state machine response {resp:?}"),
    )
}

impl MasterApi {
    fn check_key(&self, key: &str) -> Result<(), pb::Status> {
        if key.is_empty() {
            return Err(invalid(ErrorCode::InvalidKey, "key is empty"));
        }
        if key.len() > self.node.config().max_key_len {
            return Err(invalid(
                ErrorCode::InvalidKey,
                format!(
                    "key of {} bytes exceeds the limit of {} bytes",
                    key.len(),
                    self.node.config().max_key_len
                ),
            ));
        }
        Ok(())
    }

    /// Validates a request's keys; an error names the item when the request
    /// has several (a single-object RPC is this core with one item).
    fn check_keys<'a>(
        &self,
        keys: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<(), pb::Status> {
        let n = keys.len();
        let mut key_bytes = 0usize;
        for (i, k) in keys.enumerate() {
            if i >= crescent_proto::MAX_BATCH_ITEMS {
                return Err(invalid(
                    ErrorCode::InvalidParams,
                    format!("batch exceeds {} items", crescent_proto::MAX_BATCH_ITEMS),
                ));
            }
            self.check_key(k).map_err(|mut s| {
                s.message = format!("{}{}", item_prefix(i, n), s.message);
                s
            })?;
            key_bytes += k.len();
            if key_bytes > crescent_proto::MAX_BATCH_KEY_BYTES {
                return Err(invalid(
                    ErrorCode::InvalidParams,
                    format!(
                        "batch keys exceed {} bytes in all at item {i}; split the batch",
                        crescent_proto::MAX_BATCH_KEY_BYTES
                    ),
                ));
            }
        }
        Ok(())
    }

    fn origin(header: Option<pb::RequestHeader>) -> Result<Origin, pb::Status> {
        let h = header.ok_or_else(|| {
            invalid(
                ErrorCode::InvalidParams,
                "request header (client_id, request_seq) is required for writes",
            )
        })?;
        if h.client_id.is_empty() || h.client_id.len() > MAX_CLIENT_ID_LEN {
            return Err(invalid(
                ErrorCode::InvalidParams,
                format!("client_id must be 1..={MAX_CLIENT_ID_LEN} bytes"),
            ));
        }
        Ok(Origin {
            client_id: h.client_id,
            seq: h.request_seq,
        })
    }

    /// The origin of a request of `n` items, which must be at least one.
    fn batch_origin(header: Option<pb::RequestHeader>, n: usize) -> Result<Origin, pb::Status> {
        let origin = Self::origin(header)?;
        if n == 0 {
            return Err(invalid(ErrorCode::InvalidParams, "empty batch"));
        }
        Ok(origin)
    }

    async fn item_op(
        &self,
        header: Option<pb::RequestHeader>,
        n: usize,
        op: Op,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        let origin = Self::batch_origin(header, n)?;
        match self.node.propose(Some(origin), op).await {
            Ok(Response::Items(v)) if v.len() == n => Ok(v),
            Ok(Response::Rejected(e)) => Err(meta_status(&e)),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(node_status(&e)),
        }
    }
}

/// A core's answers to a request: one per item, or the refusal of the
/// whole request.
type Answers<T> = Result<Vec<T>, pb::Status>;

/// A single-object RPC's answer: its one item's, or the refusal made that
/// item's answer.
fn one<T>(r: Answers<T>, refused: impl FnOnce(pb::Status) -> T) -> T {
    match r.map(<[T; 1]>::try_from) {
        Ok(Ok([answer])) => answer,
        Ok(Err(v)) => refused(invalid(
            ErrorCode::InternalError,
            format!("{} answers to one item", v.len()),
        )),
        Err(s) => refused(s),
    }
}

/// A batch RPC's status and per-item answers.
fn many<T>(r: Answers<T>) -> (Option<pb::Status>, Vec<T>) {
    match r {
        Ok(v) => (Some(pb::Status::ok()), v),
        Err(s) => (Some(s), Vec::new()),
    }
}

fn batch_status(r: Answers<Result<(), MetaError>>) -> pb::BatchStatusResponse {
    let (status, v) = many(r);
    pb::BatchStatusResponse {
        status,
        results: v.iter().map(item_status).collect(),
    }
}

fn single_status(r: Answers<Result<(), MetaError>>) -> pb::StatusResponse {
    pb::StatusResponse {
        status: Some(one(r.map(|v| v.iter().map(item_status).collect()), |s| s)),
    }
}

#[tonic::async_trait]
impl MasterService for MasterApi {
    async fn put_start(&self, request: Request<pb::PutStartRequest>) -> Rpc<pb::PutStartResponse> {
        let r = request.into_inner();
        let item = vec![(r.key, r.size, r.put_id)];
        let started = self
            .put_start_items(r.header, item, r.config, r.one_commit)
            .await;
        let (status, replicas, pending) = one(started, Started::refused).into_parts();
        ok(pb::PutStartResponse {
            status: Some(status),
            replicas,
            pending,
        })
    }

    async fn batch_put_start(
        &self,
        request: Request<pb::BatchPutStartRequest>,
    ) -> Rpc<pb::BatchPutStartResponse> {
        let r = request.into_inner();
        let items = r
            .items
            .into_iter()
            .map(|i| (i.key, i.size, i.put_id))
            .collect();
        let (status, started) = many(
            self.put_start_items(r.header, items, r.config, r.one_commit)
                .await,
        );
        ok(pb::BatchPutStartResponse {
            status,
            results: started
                .into_iter()
                .map(|x| {
                    let (status, replicas, pending) = x.into_parts();
                    pb::PutStartResult {
                        status: Some(status),
                        replicas,
                        pending,
                    }
                })
                .collect(),
        })
    }

    async fn put_end(&self, request: Request<pb::PutEndRequest>) -> Rpc<pb::PutEndResponse> {
        let r = request.into_inner();
        let asked: &[(u64, PutId)] = if r.next_put_id != 0 {
            &[(r.size, r.next_put_id)]
        } else {
            &[]
        };
        let items = vec![EndItem {
            key: r.key,
            checksum: r.checksum,
            put_id: r.put_id,
            placement: r.placement,
            size: r.size,
            ahead: r.ahead,
        }];
        let (ended, mut next) = self
            .put_end_placing_ahead(r.header, items, r.config, asked)
            .await;
        ok(pb::PutEndResponse {
            status: single_status(ended).status,
            next: next.pop().map(|(_, replicas)| replicas).unwrap_or_default(),
        })
    }

    async fn batch_put_end(
        &self,
        request: Request<pb::BatchPutEndRequest>,
    ) -> Rpc<pb::BatchPutEndResponse> {
        let r = request.into_inner();
        if let Some(why) = bad_next(&r.next, &r.items) {
            let refused = Err(invalid(ErrorCode::InvalidParams, why));
            return ok(batch_put_end_response(refused, Vec::new()));
        }
        let items = r
            .items
            .into_iter()
            .map(|i| EndItem {
                key: i.key,
                checksum: i.checksum,
                put_id: i.put_id,
                placement: i.placement,
                size: i.size,
                ahead: i.ahead,
            })
            .collect();
        let asked: Vec<(u64, PutId)> = r.next.iter().map(|n| (n.size, n.put_id)).collect();
        let (ended, next) = self
            .put_end_placing_ahead(r.header, items, r.config, &asked)
            .await;
        ok(batch_put_end_response(ended, next))
    }

    async fn put_revoke(&self, request: Request<pb::PutRevokeRequest>) -> Rpc<pb::StatusResponse> {
        let r = request.into_inner();
        if r.ahead {
            return ok(single_status(
                self.put_revoke_ahead(r).map(|()| vec![Ok(())]),
            ));
        }
        let items = vec![(r.key, r.put_id)];
        ok(single_status(self.put_revoke_items(r.header, items).await))
    }

    async fn batch_put_revoke(
        &self,
        request: Request<pb::BatchPutRevokeRequest>,
    ) -> Rpc<pb::BatchStatusResponse> {
        let r = request.into_inner();
        let n = r.keys.len();
        let put_ids = if r.put_ids.is_empty() {
            vec![0; n]
        } else if r.put_ids.len() == n {
            r.put_ids
        } else {
            return ok(batch_status(Err(invalid(
                ErrorCode::InvalidParams,
                format!("{n} keys but {} put ids", r.put_ids.len()),
            ))));
        };
        let items = r.keys.into_iter().zip(put_ids).collect();
        ok(batch_status(self.put_revoke_items(r.header, items).await))
    }

    async fn get_replica_list(
        &self,
        request: Request<pb::GetReplicaListRequest>,
    ) -> Rpc<pb::GetReplicaListResponse> {
        let r = request.into_inner();
        let found = self.replica_lists(std::slice::from_ref(&r.key)).await;
        ok(one(found, |s| pb::GetReplicaListResponse {
            status: Some(s),
            ..Default::default()
        }))
    }

    async fn batch_get_replica_list(
        &self,
        request: Request<pb::BatchGetReplicaListRequest>,
    ) -> Rpc<pb::BatchGetReplicaListResponse> {
        let r = request.into_inner();
        let (status, results) = many(self.replica_lists(&r.keys).await);
        ok(pb::BatchGetReplicaListResponse { status, results })
    }

    async fn exist(&self, request: Request<pb::ExistRequest>) -> Rpc<pb::ExistResponse> {
        let r = request.into_inner();
        let found = self.exists(std::slice::from_ref(&r.key)).await;
        ok(one(found, |s| pb::ExistResponse {
            status: Some(s),
            exists: false,
        }))
    }

    async fn batch_exist(
        &self,
        request: Request<pb::BatchExistRequest>,
    ) -> Rpc<pb::BatchExistResponse> {
        let r = request.into_inner();
        let (status, results) = many(self.exists(&r.keys).await);
        ok(pb::BatchExistResponse { status, results })
    }

    async fn remove(&self, request: Request<pb::RemoveRequest>) -> Rpc<pb::StatusResponse> {
        let r = request.into_inner();
        ok(single_status(
            self.remove_items(r.header, vec![r.key], r.force).await,
        ))
    }

    async fn batch_remove(
        &self,
        request: Request<pb::BatchRemoveRequest>,
    ) -> Rpc<pb::BatchStatusResponse> {
        let r = request.into_inner();
        ok(batch_status(
            self.remove_items(r.header, r.keys, r.force).await,
        ))
    }

    async fn remove_by_regex(
        &self,
        request: Request<pb::RemoveByRegexRequest>,
    ) -> Rpc<pb::CountResponse> {
        ok(self.remove_by_regex_request(request.into_inner()).await)
    }

    async fn remove_all(&self, request: Request<pb::RemoveAllRequest>) -> Rpc<pb::CountResponse> {
        ok(self.remove_all_request(request.into_inner()).await)
    }

    async fn mount_segment(
        &self,
        request: Request<pb::MountSegmentRequest>,
    ) -> Rpc<pb::MountSegmentResponse> {
        ok(self.mount_request(request.into_inner()).await)
    }

    async fn unmount_segment(
        &self,
        request: Request<pb::UnmountSegmentRequest>,
    ) -> Rpc<pb::StatusResponse> {
        ok(self.unmount_request(request.into_inner()).await)
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Rpc<pb::HeartbeatResponse> {
        ok(self.heartbeat_request(request.into_inner()))
    }
}
