//! The transfer wire format: fixed-size headers, payload bytes straight after.
//!
//! ```text
//! request (80 bytes):
//!   magic u32 | op u8 | 0 u8 x3 | request_id u64 | offset u64 | len u64
//!   | grant: segment_id u64 | offset u64 | len u64 | expiry_ms u64 | mac [u8; 16]
//!   [+ len bytes for WRITE]
//!   [+ 56 bytes for COPY: target offset u64 | target grant (48 bytes, as above)]
//! response (32 bytes):
//!   magic u32 | status u8 | 0 u8 x3 | request_id u64 | len u64 | value u64
//!   [+ len bytes for READ]
//! ```
//! COPY asks a store to copy `[offset, offset+len)` of the
//! segment it is sent to into another segment *the same process* serves
//! (a demotion from memory to disk, a promotion back), under a read grant
//! for the source and a write grant for the target: the bytes never leave
//! the store's host. Its answer's `value` is the crc32c of the bytes
//! copied, which the master checks against the object's. A PING's answer
//! carries in `value` the features the store serves ([`FEATURE_COPY`]); a
//! store from before COPY answers 0, and a master copies through itself.
//! Every READ and WRITE carries the [`Grant`] it is made under: a capability
//! the master signed with the segment's key (see `crescent_auth::capability`)
//! for a range, an operation and a time. The store serves only what a grant it
//! can verify covers; PING needs none. The grant's segment id also makes a
//! store restarted on the same address refuse requests meant for its previous
//! incarnation (whose writes would otherwise overwrite other objects — found
//! by the chaos suite).
//! All integers little-endian. Requests on one connection are answered in
//! order, so a client may pipeline many before reading any answer. Pure: no I/O.

use crescent_auth::capability::{Access, Capability, CapabilityMac, MAC_LEN};

/// "CRES" in little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"CRES");
pub const REQUEST_LEN: usize = 80;
pub const RESPONSE_LEN: usize = 32;
/// Largest single transfer; bigger objects are split by the client.
pub const MAX_TRANSFER: u64 = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read = 1,
    Write = 2,
    Ping = 3,
    Copy = 4,
}

/// A PING answer's `value` bit: the store serves COPY.
pub const FEATURE_COPY: u64 = 1;

/// Bytes after a COPY request's header: where the bytes go.
pub const COPY_TARGET_LEN: usize = 56;

impl Op {
    /// The capability access this operation needs (None for PING).
    pub fn access(self) -> Option<Access> {
        match self {
            // A COPY's header carries the grant to read its source.
            Op::Read | Op::Copy => Some(Access::Read),
            Op::Write => Some(Access::Write),
            Op::Ping => None,
        }
    }
}

/// The signed permission a request is made under: the capability's fields
/// as the master signed them (its access is the request's op) and its MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Grant {
    pub segment_id: u64,
    pub offset: u64,
    pub len: u64,
    pub expiry_ms: u64,
    pub mac: CapabilityMac,
}

impl Grant {
    /// The capability this grant claims for `access`.
    pub fn capability(&self, access: Access) -> Capability {
        Capability {
            segment_id: self.segment_id,
            offset: self.offset,
            len: self.len,
            access,
            expiry_ms: self.expiry_ms,
        }
    }

    /// A grant as a replica descriptor carries it; a MAC of the wrong length
    /// becomes all zeros (and is refused by the store, not here).
    pub fn from_parts(segment_id: u64, offset: u64, len: u64, expiry_ms: u64, mac: &[u8]) -> Self {
        Self {
            segment_id,
            offset,
            len,
            expiry_ms,
            mac: mac.try_into().unwrap_or([0u8; MAC_LEN]),
        }
    }
}

impl From<&crescent_proto::pb::ReplicaDescriptor> for Grant {
    /// The grant a replica descriptor carries for its whole range.
    fn from(r: &crescent_proto::pb::ReplicaDescriptor) -> Self {
        Grant::from_parts(
            r.segment_id,
            r.offset,
            r.length,
            r.grant_expiry_ms,
            &r.grant_mac,
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub request_id: u64,
    pub offset: u64,
    pub len: u64,
    /// The permission it is made under (ignored for PING).
    pub grant: Grant,
}

/// Where a COPY writes: `[offset, offset+len)` of the segment its grant
/// names (the request's `len`), under that write grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyTarget {
    pub offset: u64,
    pub grant: Grant,
}

impl CopyTarget {
    pub fn encode(&self) -> [u8; COPY_TARGET_LEN] {
        let mut b = [0u8; COPY_TARGET_LEN];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..56].copy_from_slice(&encode_grant(&self.grant));
        b
    }

    pub fn decode(b: &[u8; COPY_TARGET_LEN]) -> Self {
        Self {
            offset: u64_at(b, 0),
            grant: decode_grant(&b[8..56]),
        }
    }
}

fn encode_grant(g: &Grant) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[0..8].copy_from_slice(&g.segment_id.to_le_bytes());
    b[8..16].copy_from_slice(&g.offset.to_le_bytes());
    b[16..24].copy_from_slice(&g.len.to_le_bytes());
    b[24..32].copy_from_slice(&g.expiry_ms.to_le_bytes());
    b[32..48].copy_from_slice(&g.mac);
    b
}

/// The grant in the 48 bytes of `b` (the caller passes exactly those).
fn decode_grant(b: &[u8]) -> Grant {
    let mut mac = [0u8; MAC_LEN];
    mac.copy_from_slice(&b[32..48]);
    Grant {
        segment_id: u64_at(b, 0),
        offset: u64_at(b, 8),
        len: u64_at(b, 16),
        expiry_ms: u64_at(b, 24),
        mac,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    OutOfRange = 1,
    BadRequest = 2,
    /// The request names a segment this store does not (or no longer) serve.
    WrongSegment = 3,
    /// The request's grant does not verify, has expired, is for the other
    /// operation or does not cover the range.
    Forbidden = 4,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub request_id: u64,
    pub len: u64,
    /// A PING's features ([`FEATURE_COPY`]), a COPY's crc32c; else 0.
    pub value: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad magic {0:#x}: not a Crescent transfer peer")]
    BadMagic(u32),
    #[error("unknown op {0}")]
    UnknownOp(u8),
    #[error("unknown status {0}")]
    UnknownStatus(u8),
    #[error("transfer of {0} bytes exceeds the {MAX_TRANSFER}-byte limit")]
    TooLarge(u64),
}

fn check_magic(b: &[u8]) -> Result<(), ProtocolError> {
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if magic == MAGIC {
        Ok(())
    } else {
        Err(ProtocolError::BadMagic(magic))
    }
}

/// The transfer length at `at`, refused above [`MAX_TRANSFER`].
fn len_at(b: &[u8], at: usize) -> Result<u64, ProtocolError> {
    let len = u64_at(b, at);
    if len > MAX_TRANSFER {
        return Err(ProtocolError::TooLarge(len));
    }
    Ok(len)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

impl Request {
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.op as u8;
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..80].copy_from_slice(&encode_grant(&self.grant));
        b
    }

    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Self, ProtocolError> {
        check_magic(b)?;
        let op = match b[4] {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Ping,
            4 => Op::Copy,
            other => return Err(ProtocolError::UnknownOp(other)),
        };
        let len = len_at(b, 24)?;
        Ok(Self {
            op,
            request_id: u64_at(b, 8),
            offset: u64_at(b, 16),
            len,
            grant: decode_grant(&b[32..80]),
        })
    }

    /// True when `[offset, offset+len)` lies inside a segment of `size` bytes.
    pub fn fits(&self, size: u64) -> bool {
        self.offset
            .checked_add(self.len)
            .is_some_and(|end| end <= size)
    }
}

impl Response {
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.status as u8;
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Self, ProtocolError> {
        check_magic(b)?;
        let status = match b[4] {
            0 => Status::Ok,
            1 => Status::OutOfRange,
            2 => Status::BadRequest,
            3 => Status::WrongSegment,
            4 => Status::Forbidden,
            other => return Err(ProtocolError::UnknownStatus(other)),
        };
        let len = len_at(b, 16)?;
        Ok(Self {
            status,
            request_id: u64_at(b, 8),
            len,
            value: u64_at(b, 24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(offset: u64, len: u64) -> Request {
        Request {
            op: Op::Read,
            request_id: 1,
            offset,
            len,
            grant: Grant::default(),
        }
    }

    proptest! {
        #[test]
        fn request_roundtrip(id in any::<u64>(), off in any::<u64>(), len in 0..=MAX_TRANSFER, op in 1u8..=4,
                             seg in any::<u64>(), goff in any::<u64>(), glen in any::<u64>(), exp in any::<u64>(),
                             mac in prop::array::uniform16(any::<u8>())) {
            let op = match op { 1 => Op::Read, 2 => Op::Write, 3 => Op::Ping, _ => Op::Copy };
            let grant = Grant { segment_id: seg, offset: goff, len: glen, expiry_ms: exp, mac };
            let r = Request { op, request_id: id, offset: off, len, grant };
            prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
            let target = CopyTarget { offset: off ^ goff, grant };
            prop_assert_eq!(CopyTarget::decode(&target.encode()), target);
        }

        #[test]
        fn response_roundtrip(id in any::<u64>(), len in 0..=MAX_TRANSFER, value in any::<u64>(), status in 0u8..=4) {
            let status = match status { 0 => Status::Ok, 1 => Status::OutOfRange, 2 => Status::BadRequest, 3 => Status::WrongSegment, _ => Status::Forbidden };
            let r = Response { status, request_id: id, len, value };
            prop_assert_eq!(Response::decode(&r.encode()), Ok(r));
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), REQUEST_LEN)) {
            let req: [u8; REQUEST_LEN] = bytes.clone().try_into().unwrap();
            let _ = Request::decode(&req);
            let resp: [u8; RESPONSE_LEN] = bytes[..RESPONSE_LEN].try_into().unwrap();
            let _ = Response::decode(&resp);
        }
    }

    #[test]
    fn rejects_bad_headers() {
        let mut b = read(0, 8).encode();
        b[0] = b'X';
        assert!(matches!(
            Request::decode(&b),
            Err(ProtocolError::BadMagic(_))
        ));
        let mut b = read(0, 8).encode();
        b[4] = 9;
        assert_eq!(Request::decode(&b), Err(ProtocolError::UnknownOp(9)));
        let b = read(0, MAX_TRANSFER + 1).encode();
        assert_eq!(
            Request::decode(&b),
            Err(ProtocolError::TooLarge(MAX_TRANSFER + 1))
        );
    }

    #[test]
    fn range_checks_do_not_overflow() {
        assert!(!read(u64::MAX, 2).fits(u64::MAX));
        let r = read(10, 10);
        assert!(r.fits(20));
        assert!(!r.fits(19));
    }

    #[test]
    fn a_grant_with_a_mac_of_the_wrong_length_has_a_zero_mac() {
        assert_eq!(
            Grant::from_parts(1, 2, 3, 4, &[7u8; 15]).mac,
            [0u8; MAC_LEN]
        );
        assert_eq!(
            Grant::from_parts(1, 2, 3, 4, &[7u8; 16]).mac,
            [7u8; MAC_LEN]
        );
    }
}
