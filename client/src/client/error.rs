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

    /// A failed transfer with a store. A refusal at the TLS layer (an
    /// untrusted certificate either way, TLS meeting clear text) is
    /// PERMISSION_DENIED, as the masters' TLS refusals are
    /// (`MasterRpcError`): a configuration error no retry fixes, not a
    /// transfer that may work next time.
    pub(super) fn from_transfer(e: crescent_store::TransferError) -> Self {
        match e {
            crescent_store::TransferError::Tls { .. } => Error::Master {
                code: ErrorCode::PermissionDenied,
                message: e.to_string(),
            },
            other => Error::Transfer(other.to_string()),
        }
    }

    /// Whether this is a refusal no retry against the same peer fixes.
    pub(super) fn is_denied(&self) -> bool {
        self.code() == ErrorCode::PermissionDenied
    }

    pub(super) fn from_status(s: &pb::Status, key: &str) -> Option<Self> {
        if s.is_ok() {
            return None;
        }
        Some(Error::from_master(MasterRpcError::from_status(s), key))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_refusal_at_a_store_is_permission_denied_and_other_failures_are_transfer_failures() {
        let refused = Error::from_transfer(crescent_store::TransferError::Tls {
            endpoint: "10.0.0.1:50061".into(),
            reason: "invalid peer certificate: UnknownIssuer".into(),
        });
        assert_eq!(refused.code(), ErrorCode::PermissionDenied);
        assert!(refused.is_denied());
        let text = refused.to_string();
        assert!(
            text.contains("TLS") && text.contains("10.0.0.1:50061"),
            "{text}"
        );
        let reset = Error::from_transfer(crescent_store::TransferError::Io {
            endpoint: "10.0.0.1:50061".into(),
            reason: "connection reset by peer".into(),
        });
        assert_eq!(reset.code(), ErrorCode::TransferFail);
        assert!(!reset.is_denied());
    }
}
