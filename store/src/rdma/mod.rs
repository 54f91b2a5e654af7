//! RDMA transport: one-sided RDMA READ/WRITE into a store's registered segment.
//!
//! The store registers its segment as a memory region and publishes, through
//! the TCP side channel, the region's address and rkey plus its queue pair's
//! identity ([`RdmaPeerInfo`]). A client connects a reliable-connected queue
//! pair to it and moves bytes with one-sided operations, so the store's CPU is
//! not involved. Transfers larger than a work request's limit are split
//! ([`plan_chunks`]).
//!
//! These machines have no RDMA devices: the planner and the peer-info codec
//! are unit-tested everywhere; the verbs code ([`verbs`], feature `rdma`) is
//! compiled in CI but has not run on hardware.

/// What one side tells the other to connect an RC queue pair and address its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaPeerInfo {
    pub lid: u16,
    pub qp_num: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    /// Remote virtual address of the segment's first byte.
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

pub const PEER_INFO_LEN: usize = 2 + 4 + 4 + 16 + 8 + 4 + 8;

impl RdmaPeerInfo {
    pub fn encode(&self) -> [u8; PEER_INFO_LEN] {
        let mut b = [0u8; PEER_INFO_LEN];
        b[0..2].copy_from_slice(&self.lid.to_le_bytes());
        b[2..6].copy_from_slice(&self.qp_num.to_le_bytes());
        b[6..10].copy_from_slice(&self.psn.to_le_bytes());
        b[10..26].copy_from_slice(&self.gid);
        b[26..34].copy_from_slice(&self.addr.to_le_bytes());
        b[34..38].copy_from_slice(&self.rkey.to_le_bytes());
        b[38..46].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != PEER_INFO_LEN {
            return None;
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        Some(Self {
            lid: u16::from_le_bytes([b[0], b[1]]),
            qp_num: u32::from_le_bytes(b[2..6].try_into().ok()?),
            psn: u32::from_le_bytes(b[6..10].try_into().ok()?) & 0x00ff_ffff,
            gid,
            addr: u64::from_le_bytes(b[26..34].try_into().ok()?),
            rkey: u32::from_le_bytes(b[34..38].try_into().ok()?),
            len: u64::from_le_bytes(b[38..46].try_into().ok()?),
        })
    }
}

/// One work request: `len` bytes between local offset `local` and remote offset `remote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub local: u64,
    pub remote: u64,
    pub len: u64,
}

/// Splits a transfer of `len` bytes at remote `offset` into work requests of at
/// most `max_chunk` bytes. Returns `None` when the range leaves the remote
/// segment of `remote_len` bytes (never issue an RDMA op out of bounds).
pub fn plan_chunks(offset: u64, len: u64, remote_len: u64, max_chunk: u64) -> Option<Vec<Chunk>> {
    if max_chunk == 0 || offset.checked_add(len)? > remote_len {
        return None;
    }
    let mut out = Vec::with_capacity(len.div_ceil(max_chunk) as usize);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(max_chunk);
        out.push(Chunk {
            local: done,
            remote: offset + done,
            len: n,
        });
        done += n;
    }
    Some(out)
}

#[cfg(feature = "rdma")]
pub mod verbs;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_info_roundtrip() {
        let p = RdmaPeerInfo {
            lid: 7,
            qp_num: 0x1234,
            psn: 0x00ab_cdef,
            gid: [9; 16],
            addr: 0xdead_beef_0000,
            rkey: 42,
            len: 1 << 30,
        };
        assert_eq!(RdmaPeerInfo::decode(&p.encode()), Some(p));
        assert_eq!(RdmaPeerInfo::decode(&[0u8; 3]), None);
    }

    #[test]
    fn chunks_cover_exactly_and_stay_in_bounds() {
        let c = plan_chunks(100, 10_000, 1 << 20, 4096).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c.iter().map(|c| c.len).sum::<u64>(), 10_000);
        assert_eq!(
            c[1],
            Chunk {
                local: 4096,
                remote: 4196,
                len: 4096
            }
        );
        assert!(plan_chunks(1 << 20, 1, 1 << 20, 4096).is_none());
        assert!(plan_chunks(u64::MAX, 2, u64::MAX, 4096).is_none());
        assert!(plan_chunks(0, 1, 10, 0).is_none());
        assert_eq!(plan_chunks(5, 0, 10, 4).unwrap(), vec![]);
    }
}
