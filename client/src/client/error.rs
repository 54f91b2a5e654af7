//! The client library's errors.

use crescent_proto::pb;
use crescent_proto::ErrorCode;

use crate::master::MasterRpcError;

/// Errors of the client library. `NotFound` is distinct from every failure.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("object {0:?} not found")]
    NotFound(String),
    #[error("{}: {message}", code.as_str_name())]
    Master { code: ErrorCode, message: String },
    #[error("TRANSFER_FAIL: {0}")]
    Transfer(String),
    #[error("CHECKSUM_MISMATCH: every replica of {0:?} failed its checksum")]
    ChecksumMismatch(String),
    #[error("INVALID_PARAMS: {0}")]
    InvalidArgument(String),
    #[error("buffer of {buffer} bytes is too small for the {size}-byte object")]
    BufferTooSmall { size: u64, buffer: usize },
    #[error("RPC_FAIL: no master reachable: {0}")]
    Unavailable(String),
    #[error("configuration: {0}")]
    Config(String),
}

impl Error {
    /// Mooncake's error code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound(_) => ErrorCode::ObjectNotFound,
            Error::Master { code, .. } => *code,
            Error::Transfer(_) => ErrorCode::TransferFail,
            Error::ChecksumMismatch(_) => ErrorCode::ChecksumMismatch,
            Error::InvalidArgument(_) | Error::BufferTooSmall { .. } | Error::Config(_) => {
                ErrorCode::InvalidParams
            }
            Error::Unavailable(_) => ErrorCode::RpcFail,
        }
    }

    pub(super) fn from_master(e: MasterRpcError, key: &str) -> Self {
        match e {
            MasterRpcError::Status {
                code: ErrorCode::ObjectNotFound,
                ..
            } => Error::NotFound(key.to_string()),
            MasterRpcError::Status { code, message } => Error::Master { code, message },
            MasterRpcError::Unavailable(m) => Error::Unavailable(m),
            MasterRpcError::BadAddress(a) => Error::Config(format!("bad master address {a:?}")),
        }
    }

    pub(super) fn from_status(s: &pb::Status, key: &str) -> Option<Self> {
        if s.is_ok() {
            return None;
        }
        Some(Error::from_master(MasterRpcError::from_status(s), key))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
