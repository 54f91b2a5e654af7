//! Crescent's data plane.
//!
//! Owns the clock grants are written and checked on ([`clock`]), segments ([`segment`]: memory, or a file on local disk whose format
//! and opening are in [`disk`]; their errors in [`segment_error`]), the transfer wire format ([`protocol`]), the
//! TCP server that serves a segment ([`server`]), the pooled, pipelined TCP
//! client ([`transport`]) and the RDMA transport ([`rdma`]: one-sided
//! reads/writes of memory segments, behind the `rdma` feature).
//!
//! It must not talk to masters or hold metadata: which bytes belong to which
//! object is the master's business; this crate only moves bytes to and from
//! `(segment, offset, length)` ranges it is handed. Registration of a segment
//! with the masters lives in `crescent-client`.

pub mod clock;
pub mod disk;
pub mod protocol;
pub mod rdma;
pub mod segment;
pub mod segment_error;
pub mod server;
pub mod transport;

pub use disk::{DiskFileReader, DiskIdentity, DiskOpened, OtherCapacity};
pub use segment::{Segment, ShmMapping};
pub use server::TransferStats;
pub use transport::{TcpTransport, TransferError};

/// crc32c of `src` while copying it into `dst` (equal lengths), piece by piece
/// so each piece is hashed while still in cache.
pub fn copy_with_crc(dst: &mut [u8], src: &[u8]) -> u32 {
    const PIECE: usize = 128 * 1024;
    let mut crc = 0u32;
    for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
        d.copy_from_slice(s);
        crc = crc32c::crc32c_append(crc, d);
    }
    crc
}
