//! Crescent's shared wire vocabulary.
//!
//! Owns the protobuf messages and gRPC service stubs (`MasterService`,
//! `ClusterService`, `RaftService`), the mapping of Mooncake-style error codes,
//! the parsing of human sizes (`16gb`) and durations (`10s`) that every
//! binary accepts, Prometheus text rendering helpers, and the request id
//! that follows one call through the logs (a task-local, no shared state).
//! It must not contain behaviour: no I/O, no state, no policy.

pub mod metrics;
pub mod request_id;
pub mod units;

/// Generated protobuf types and tonic stubs (package `crescent`).
pub mod pb {
    tonic::include_proto!("crescent");
}

pub use pb::ErrorCode;

/// Largest key accepted anywhere unless a master is configured otherwise.
pub const DEFAULT_MAX_KEY_LEN: usize = 4096;
/// Largest gRPC message a master or client decodes (also bounds batch sizes).
pub const MAX_GRPC_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Longest file path a segment's description may carry (its shared-memory
/// file or its disk file).
pub const MAX_SEGMENT_PATH_BYTES: usize = 4096;
/// Largest number of items in one batch request.
pub const MAX_BATCH_ITEMS: usize = 16 * 1024;
/// Largest sum of key lengths in one batch request: with its sizes and
/// replica settings it stays within one Raft log entry (4 MiB), which a
/// follower receives well within a replication deadline.
pub const MAX_BATCH_KEY_BYTES: usize = 1024 * 1024;

/// Largest `--grant-clock-skew` a store accepts (ms): how far past its
/// expiry a store may honour a data-plane grant. The masters keep a range
/// whose write outcome is unknown out of use this long, twice over, past
/// its grants' expiry (`crescent_raft::state::WRITE_FENCE_MARGIN_MS`).
pub const MAX_GRANT_CLOCK_SKEW_MS: u64 = 5_000;

/// Most segments a put may ask the leader to avoid
/// (`ReplicateConfig.avoid_segments`, the segments an earlier try of it
/// failed to write to).
pub const MAX_AVOID_SEGMENTS: usize = 64;

/// Most next puts one BatchPutEnd may ask to be placed ahead
/// (`BatchPutEndRequest.next`): what one client may hold ready at once.
pub const MAX_AHEAD_PER_REQUEST: usize = 256;

/// Cuts a batch into requests a master accepts: at most [`MAX_BATCH_ITEMS`]
/// items and [`MAX_BATCH_KEY_BYTES`] of keys each, in order. A single key
/// over the byte limit goes alone (the master then refuses that key).
pub fn split_batch<T>(items: Vec<T>, key_len: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut parts = Vec::new();
    let mut part = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let len = key_len(&item);
        if !part.is_empty() && (part.len() == MAX_BATCH_ITEMS || bytes + len > MAX_BATCH_KEY_BYTES)
        {
            parts.push(std::mem::take(&mut part));
            bytes = 0;
        }
        bytes += len;
        part.push(item);
    }
    if !part.is_empty() || parts.is_empty() {
        parts.push(part);
    }
    parts
}

impl pb::Status {
    pub fn ok() -> Self {
        Self::default()
    }

    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code: code as i32,
            message: message.into(),
            ..Default::default()
        }
    }

    pub fn not_leader(leader_id: Option<u64>, leader_addr: Option<String>) -> Self {
        let message = match (&leader_id, &leader_addr) {
            (Some(id), Some(addr)) => format!("not the leader; leader is node {id} at {addr}"),
            _ => "not the leader; leader unknown".to_string(),
        };
        Self {
            code: ErrorCode::NotLeader as i32,
            message,
            leader_id: leader_id.unwrap_or(0),
            leader_addr: leader_addr.unwrap_or_default(),
        }
    }

    /// The code, with unknown values (from a newer peer) read as an internal
    /// error rather than prost's default of OK.
    pub fn error_code(&self) -> ErrorCode {
        ErrorCode::try_from(self.code).unwrap_or(ErrorCode::InternalError)
    }

    pub fn is_ok(&self) -> bool {
        self.code == ErrorCode::Ok as i32
    }
}

/// Mooncake's spelling of an error code (`OBJECT_NOT_FOUND`).
pub fn error_code_name(code: ErrorCode) -> &'static str {
    code.as_str_name()
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    #[test]
    fn batches_are_cut_by_count_and_by_key_bytes_in_order() {
        let keys: Vec<String> = (0..MAX_BATCH_ITEMS * 2 + 5)
            .map(|i| i.to_string())
            .collect();
        let parts = split_batch(keys.clone(), String::len);
        assert_eq!(
            parts.iter().map(Vec::len).collect::<Vec<_>>(),
            [MAX_BATCH_ITEMS, MAX_BATCH_ITEMS, 5]
        );
        assert_eq!(parts.concat(), keys);

        let big: Vec<String> = (0..5)
            .map(|_| "k".repeat(MAX_BATCH_KEY_BYTES / 2))
            .collect();
        let parts = split_batch(big, String::len);
        assert_eq!(parts.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);

        // An empty batch stays one (empty) request, so callers keep their
        // empty-batch answer.
        assert_eq!(split_batch(Vec::<String>::new(), String::len).len(), 1);
    }
}
