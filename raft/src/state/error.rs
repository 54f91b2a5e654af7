//! What applying an entry answers: its response, or why it was refused.

use super::*;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("object {0:?} not found")]
    ObjectNotFound(String),
    #[error("object {0:?} already exists")]
    ObjectAlreadyExists(String),
    #[error("object {0:?} has a read lease; remove it with force")]
    ObjectHasLease(String),
    #[error("object {0:?} is hard-pinned; remove it with force")]
    ObjectPinned(String),
    #[error("no segment has {0} free bytes")]
    NoAvailableHandle(u64),
    #[error("object {0:?} is still being written")]
    ReplicaNotReady(String),
    #[error("every replica of {0:?} is on a store that missed its heartbeats")]
    ReplicasUnavailable(String),
    #[error(
        "object {0:?} is being written by another client, or by another put than the one named"
    )]
    InvalidWrite(String),
    #[error("segment {0} not found")]
    SegmentNotFound(SegmentId),
    #[error("segment {0:?} is mounted by another client")]
    SegmentAlreadyExists(String),
    #[error("{0}")]
    InvalidParams(String),
    /// A re-mount or unmount without the key the segment was mounted with.
    #[error("segment {0:?} was mounted with another key")]
    SegmentKeyMismatch(String),
}

impl MetaError {
    pub fn code(&self) -> ErrorCode {
        match self {
            MetaError::ObjectNotFound(_) => ErrorCode::ObjectNotFound,
            MetaError::ObjectAlreadyExists(_) => ErrorCode::ObjectAlreadyExists,
            MetaError::ObjectHasLease(_) => ErrorCode::ObjectHasLease,
            MetaError::ObjectPinned(_) => ErrorCode::ObjectPinned,
            MetaError::NoAvailableHandle(_) => ErrorCode::NoAvailableHandle,
            MetaError::ReplicaNotReady(_) => ErrorCode::ReplicaIsNotReady,
            MetaError::ReplicasUnavailable(_) => ErrorCode::ReplicasUnavailable,
            MetaError::InvalidWrite(_) => ErrorCode::InvalidWrite,
            MetaError::SegmentNotFound(_) => ErrorCode::SegmentNotFound,
            MetaError::SegmentAlreadyExists(_) => ErrorCode::SegmentAlreadyExists,
            MetaError::InvalidParams(_) => ErrorCode::InvalidParams,
            MetaError::SegmentKeyMismatch(_) => ErrorCode::PermissionDenied,
        }
    }
}

/// What applying a command produced; stored in the dedup table and returned to a retry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Response {
    PutStart(Vec<Result<Vec<Replica>, MetaError>>),
    Items(Vec<Result<(), MetaError>>),
    Mounted(Result<SegmentId, MetaError>),
    Done(Result<(), MetaError>),
    Count(u64),
    /// The whole command was refused (e.g. a retry older than the dedup window).
    Rejected(MetaError),
    /// Blank and membership entries.
    Empty,
    /// A reservation's id and offset.
    Reserved(Result<(ReservationId, u64), MetaError>),
    /// Per item of a `TierMoveStart`.
    TierMoves(Vec<Result<TierMove, MetaError>>),
}
