//! Remove, BatchRemove, RemoveByRegex and RemoveAll: which keys go is the
//! node's to decide ([`crate::node::MasterNode::propose_remove`]); this
//! module matches keys and splits what one entry cannot hold.

use crescent_proto::pb;
use crescent_proto::ErrorCode;
use crescent_raft::state::{MetaError, Origin};
use crescent_raft::{sizing, Response};

use super::{invalid, meta_status, node_status, unexpected, MasterApi};

const MAX_REGEX_BYTES: usize = 4096;

impl MasterApi {
    /// RemoveAll for the admin HTTP endpoint; returns the number removed.
    pub async fn remove_all_admin(&self, force: bool) -> Result<u64, pb::Status> {
        let header = pb::RequestHeader {
            client_id: format!("admin-http-{}", self.node.id()),
            request_seq: crate::node::now_ms() * 1000 + (rand::random::<u16>() % 1000) as u64,
        };
        self.remove_where(Some(header), force, |_| true).await
    }

    /// Remove of `keys`: the core of Remove and BatchRemove.
    pub(super) async fn remove_items(
        &self,
        header: Option<pb::RequestHeader>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        self.node
            .counters()
            .remove_requests
            .fetch_add(keys.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.check_keys(keys.iter().map(String::as_str))?;
        if keys.is_empty() {
            return Err(invalid(ErrorCode::InvalidParams, "empty batch"));
        }
        self.remove_keys(header, keys, force).await
    }

    /// Removes keys; which ones a removal refuses, and why, is
    /// [`MasterNode::propose_remove`]'s.
    async fn remove_keys(
        &self,
        header: Option<pb::RequestHeader>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        let origin = Self::origin(header)?;
        self.remove_keys_as(Some(origin), keys, force).await
    }

    /// Removes the keys that remove-all or remove-by-regex matched and
    /// returns how many went. Keys beyond one log entry
    /// ([`sizing::ENTRY_KEY_BUDGET`]) are removed in several entries, each
    /// without the request's dedup origin (one origin answers one entry): a
    /// retry of such a request removes whatever still matches instead of
    /// repeating the first answer.
    async fn remove_matching(
        &self,
        header: Option<pb::RequestHeader>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<u64, pb::Status> {
        let origin = Self::origin(header)?;
        let key_bytes: usize = keys.iter().map(String::len).sum();
        if key_bytes <= sizing::ENTRY_KEY_BUDGET {
            return Ok(count_ok(
                &self.remove_keys_as(Some(origin), keys, force).await?,
            ));
        }
        let mut removed = 0;
        for chunk in sizing::chunk_keys(keys, sizing::ENTRY_KEY_BUDGET) {
            removed += count_ok(&self.remove_keys_as(None, chunk, force).await?);
        }
        Ok(removed)
    }

    async fn remove_keys_as(
        &self,
        origin: Option<Origin>,
        keys: Vec<String>,
        force: bool,
    ) -> Result<Vec<Result<(), MetaError>>, pb::Status> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let n = keys.len();
        match self.node.propose_remove(origin, keys, force).await {
            Ok(Response::Items(v)) if v.len() == n => Ok(v),
            Ok(Response::Rejected(e)) => Err(meta_status(&e)),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(node_status(&e)),
        }
    }

    /// RemoveByRegex: the keys the regex matches, removed; how many went.
    pub(super) async fn remove_by_regex_request(
        &self,
        r: pb::RemoveByRegexRequest,
    ) -> pb::CountResponse {
        if r.regex.len() > MAX_REGEX_BYTES {
            return count_response(Err(invalid(
                ErrorCode::InvalidParams,
                format!("regex longer than {MAX_REGEX_BYTES} bytes"),
            )));
        }
        let re = match regex::RegexBuilder::new(&r.regex)
            .size_limit(1 << 20)
            .build()
        {
            Ok(re) => re,
            Err(e) => {
                return count_response(Err(invalid(
                    ErrorCode::InvalidParams,
                    format!("invalid regex: {e}"),
                )))
            }
        };
        count_response(
            self.remove_where(r.header, r.force, |k| re.is_match(k))
                .await,
        )
    }

    /// RemoveAll: every key, removed; how many went.
    pub(super) async fn remove_all_request(&self, r: pb::RemoveAllRequest) -> pb::CountResponse {
        count_response(self.remove_where(r.header, r.force, |_| true).await)
    }

    /// The keys `pred` matches after a read barrier, removed (see
    /// [`Self::remove_matching`]); how many went.
    async fn remove_where(
        &self,
        header: Option<pb::RequestHeader>,
        force: bool,
        pred: impl Fn(&str) -> bool,
    ) -> Result<u64, pb::Status> {
        Self::origin(header.clone())?;
        let keys = self.matching_keys(pred).await?;
        self.remove_matching(header, keys, force).await
    }
}

fn count_response(r: Result<u64, pb::Status>) -> pb::CountResponse {
    match r {
        Ok(count) => pb::CountResponse {
            status: Some(pb::Status::ok()),
            count,
        },
        Err(s) => pb::CountResponse {
            status: Some(s),
            count: 0,
        },
    }
}

fn count_ok(v: &[Result<(), MetaError>]) -> u64 {
    v.iter().filter(|r| r.is_ok()).count() as u64
}
