//! Crescent's data plane.
//!
//! Owns memory segments ([`segment`]), the transfer wire format
//! ([`protocol`]), the TCP server that serves a segment ([`server`]), the
//! pooled, pipelined TCP client ([`transport`]) and the RDMA transport
//! ([`rdma`]: one-sided reads/writes, behind the `rdma` feature).
//!
//! It must not talk to masters or hold metadata: which bytes belong to which
//! object is the master's business; this crate only moves bytes to and from
//! `(segment, offset, length)` ranges it is handed. Registration of a segment
//! with the masters lives in `crescent-client`.

pub mod protocol;
pub mod rdma;
pub mod segment;
pub mod server;
pub mod transport;

pub use segment::{Segment, ShmMapping};
pub use server::TransferStats;
pub use transport::{TcpTransport, TransferError};
