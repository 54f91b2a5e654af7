//! Mooncake's numeric error codes (`mooncake-store/include/types.h`), which
//! its Python API returns as negative integers. Crescent's own codes keep
//! Mooncake's names; this maps them to Mooncake's numbers so code written
//! against `MooncakeDistributedStore` reads the same values.

use crescent_proto::ErrorCode;

use crate::client::Error;

pub const OK: i32 = 0;
pub const INTERNAL_ERROR: i32 = -1;
pub const SEGMENT_NOT_FOUND: i32 = -101;
pub const SEGMENT_ALREADY_EXISTS: i32 = -102;
pub const CLIENT_NOT_FOUND: i32 = -103;
pub const NO_AVAILABLE_HANDLE: i32 = -200;
pub const INVALID_KEY: i32 = -400;
pub const INVALID_PARAMS: i32 = -600;
pub const INVALID_WRITE: i32 = -700;
pub const INVALID_READ: i32 = -701;
pub const REPLICA_IS_NOT_READY: i32 = -703;
pub const OBJECT_NOT_FOUND: i32 = -704;
pub const OBJECT_ALREADY_EXISTS: i32 = -705;
pub const OBJECT_HAS_LEASE: i32 = -706;
pub const TRANSFER_FAIL: i32 = -800;
pub const CHECKSUM_MISMATCH: i32 = -801;
pub const RPC_FAIL: i32 = -900;
pub const RPC_TIMEOUT: i32 = -901;
pub const UNAVAILABLE_IN_CURRENT_STATUS: i32 = -1010;

/// Mooncake's number for a Crescent error code (`OK` is 0).
pub fn code_number(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::Ok => OK,
        ErrorCode::ObjectNotFound => OBJECT_NOT_FOUND,
        ErrorCode::ObjectAlreadyExists => OBJECT_ALREADY_EXISTS,
        ErrorCode::ObjectHasLease => OBJECT_HAS_LEASE,
        ErrorCode::NoAvailableHandle => NO_AVAILABLE_HANDLE,
        ErrorCode::ReplicaIsNotReady => REPLICA_IS_NOT_READY,
        ErrorCode::InvalidKey => INVALID_KEY,
        ErrorCode::InvalidParams => INVALID_PARAMS,
        ErrorCode::TransferFail => TRANSFER_FAIL,
        ErrorCode::ChecksumMismatch => CHECKSUM_MISMATCH,
        ErrorCode::RpcFail => RPC_FAIL,
        ErrorCode::RpcTimeout => RPC_TIMEOUT,
        // A leader change the client could not follow in time: retryable,
        // as an RPC failure is in Mooncake.
        ErrorCode::NotLeader => RPC_FAIL,
        ErrorCode::SegmentNotFound => SEGMENT_NOT_FOUND,
        ErrorCode::SegmentAlreadyExists => SEGMENT_ALREADY_EXISTS,
        ErrorCode::ClientNotFound => CLIENT_NOT_FOUND,
        // Pinned objects refuse removal the way leased ones do in Mooncake.
        ErrorCode::ObjectPinned => OBJECT_HAS_LEASE,
        ErrorCode::InvalidWrite => INVALID_WRITE,
        ErrorCode::InternalError => INTERNAL_ERROR,
        ErrorCode::Unavailable => UNAVAILABLE_IN_CURRENT_STATUS,
        // Every replica sits on a store that stopped heartbeating: the bytes
        // cannot be fetched now, which Mooncake reports as a transfer failure.
        ErrorCode::ReplicasUnavailable => TRANSFER_FAIL,
        // Mooncake has no authentication; a refused call is a failed RPC.
        ErrorCode::PermissionDenied => RPC_FAIL,
    }
}

/// Mooncake's number for a client error (always negative).
pub fn error_number(e: &Error) -> i32 {
    match code_number(e.code()) {
        OK => INTERNAL_ERROR,
        n => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_engines_test_for_have_mooncakes_numbers() {
        assert_eq!(error_number(&Error::NotFound("k".into())), -704);
        assert_eq!(
            error_number(&Error::Master {
                code: ErrorCode::NoAvailableHandle,
                message: String::new()
            }),
            -200
        );
        assert_eq!(error_number(&Error::InvalidArgument("x".into())), -600);
        assert_eq!(error_number(&Error::Unavailable("down".into())), -900);
        assert_eq!(error_number(&Error::Transfer("reset".into())), -800);
    }

    #[test]
    fn every_error_is_negative() {
        for code in 1..=20 {
            let code = ErrorCode::try_from(code).expect("a defined code");
            let e = Error::Master {
                code,
                message: String::new(),
            };
            assert!(error_number(&e) < 0, "{code:?}");
        }
        let ok_as_error = Error::Master {
            code: ErrorCode::Ok,
            message: String::new(),
        };
        assert_eq!(error_number(&ok_as_error), INTERNAL_ERROR);
    }
}
