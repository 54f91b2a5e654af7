//! The transfer wire format: fixed 32-byte headers, payload bytes straight after.
//!
//! ```text
//! request:  magic u32 | op u8 | segment_tag u24 | request_id u64 | offset u64 | len u64   [+ len bytes for WRITE]
//! response: magic u32 | status u8 | 0 u8 x3 | request_id u64 | len u64 | 0 u64        [+ len bytes for READ]
//! ```
//! `segment_tag` is the low 24 bits of the master-assigned id of the segment
//! the client means (0 = unchecked). A store restarted on the same address
//! serves a new segment: without the tag it would accept reads and writes
//! meant for its previous incarnation's replicas, and writes would overwrite
//! other objects (found by the chaos suite).
//! All integers little-endian. Requests on one connection are answered in
//! order, so a client may pipeline many before reading any answer. Pure: no I/O.

/// "CRES" in little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"CRES");
pub const HEADER_LEN: usize = 32;
/// Largest single transfer; bigger objects are split by the client.
pub const MAX_TRANSFER: u64 = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read = 1,
    Write = 2,
    Ping = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    /// Which segment the client means (see the module comment); 0 = any.
    pub segment_tag: u32,
    pub request_id: u64,
    pub offset: u64,
    pub len: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    OutOfRange = 1,
    BadRequest = 2,
    /// The request names a segment this store does not (or no longer) serve.
    WrongSegment = 3,
}

/// The tag a client sends for segment `id`.
pub fn segment_tag(id: u64) -> u32 {
    (id & 0x00FF_FFFF) as u32
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub request_id: u64,
    pub len: u64,
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

fn check_magic(b: &[u8; HEADER_LEN]) -> Result<(), ProtocolError> {
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if magic == MAGIC {
        Ok(())
    } else {
        Err(ProtocolError::BadMagic(magic))
    }
}

/// The transfer length at `at`, refused above [`MAX_TRANSFER`].
fn len_at(b: &[u8; HEADER_LEN], at: usize) -> Result<u64, ProtocolError> {
    let len = u64_at(b, at);
    if len > MAX_TRANSFER {
        return Err(ProtocolError::TooLarge(len));
    }
    Ok(len)
}

fn u64_at(b: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

impl Request {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.op as u8;
        b[5..8].copy_from_slice(&(self.segment_tag & 0x00FF_FFFF).to_le_bytes()[..3]);
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, ProtocolError> {
        check_magic(b)?;
        let op = match b[4] {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Ping,
            other => return Err(ProtocolError::UnknownOp(other)),
        };
        let len = len_at(b, 24)?;
        Ok(Self {
            op,
            segment_tag: u32::from_le_bytes([b[5], b[6], b[7], 0]),
            request_id: u64_at(b, 8),
            offset: u64_at(b, 16),
            len,
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
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.status as u8;
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, ProtocolError> {
        check_magic(b)?;
        let status = match b[4] {
            0 => Status::Ok,
            1 => Status::OutOfRange,
            2 => Status::BadRequest,
            3 => Status::WrongSegment,
            other => return Err(ProtocolError::UnknownStatus(other)),
        };
        let len = len_at(b, 16)?;
        Ok(Self {
            status,
            request_id: u64_at(b, 8),
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_roundtrip(id in any::<u64>(), off in any::<u64>(), len in 0..=MAX_TRANSFER, op in 1u8..=3, tag in 0u32..(1 << 24)) {
            let op = match op { 1 => Op::Read, 2 => Op::Write, _ => Op::Ping };
            let r = Request { op, segment_tag: tag, request_id: id, offset: off, len };
            prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
        }

        #[test]
        fn garbage_never_panics(bytes in prop::array::uniform32(any::<u8>())) {
            let _ = Request::decode(&bytes);
            let _ = Response::decode(&bytes);
        }
    }

    #[test]
    fn rejects_bad_headers() {
        let mut b = Request {
            op: Op::Read,
            segment_tag: 0,
            request_id: 1,
            offset: 0,
            len: 8,
        }
        .encode();
        b[0] = b'X';
        assert!(matches!(
            Request::decode(&b),
            Err(ProtocolError::BadMagic(_))
        ));
        let mut b = Request {
            op: Op::Read,
            segment_tag: 0,
            request_id: 1,
            offset: 0,
            len: 8,
        }
        .encode();
        b[4] = 9;
        assert_eq!(Request::decode(&b), Err(ProtocolError::UnknownOp(9)));
        let b = Request {
            op: Op::Read,
            segment_tag: 0,
            request_id: 1,
            offset: 0,
            len: MAX_TRANSFER + 1,
        }
        .encode();
        assert_eq!(
            Request::decode(&b),
            Err(ProtocolError::TooLarge(MAX_TRANSFER + 1))
        );
    }

    #[test]
    fn range_checks_do_not_overflow() {
        let r = Request {
            op: Op::Read,
            segment_tag: 0,
            request_id: 0,
            offset: u64::MAX,
            len: 2,
        };
        assert!(!r.fits(u64::MAX));
        let r = Request {
            op: Op::Read,
            segment_tag: 0,
            request_id: 0,
            offset: 10,
            len: 10,
        };
        assert!(r.fits(20));
        assert!(!r.fits(19));
    }
}
