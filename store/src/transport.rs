//! Client side of the TCP transfer protocol: pooled connections per store,
//! requests pipelined (all sent before, and while, answers are read), payloads
//! read straight into the caller's buffers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::protocol::{Grant, Op, Request, Response, Status, REQUEST_LEN, RESPONSE_LEN};

const IO_BUFFER: usize = 64 * 1024;
/// Checksum granularity on receive: small enough to still be in L2 when hashed.
const CRC_PIECE: usize = 128 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("cannot connect to store {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("transfer with store {endpoint} failed: {reason}")]
    Io { endpoint: String, reason: String },
    #[error("store {endpoint} refused the request: {status:?}")]
    Refused { endpoint: String, status: Status },
    #[error("transfer with store {endpoint} timed out")]
    Timeout { endpoint: String },
}

struct Conn {
    r: BufReader<OwnedReadHalf>,
    w: BufWriter<OwnedWriteHalf>,
    next_id: u64,
}

/// Connection pools to stores.
pub struct TcpTransport {
    pools: Mutex<HashMap<String, Vec<Conn>>>,
    max_idle: usize,
    pub connect_timeout: Duration,
    /// Base timeout of one pipelined exchange; grows with the bytes moved.
    pub io_timeout: Duration,
}

impl Default for TcpTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl TcpTransport {
    pub fn new() -> Self {
        Self {
            pools: Mutex::new(HashMap::new()),
            max_idle: 16,
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(5),
        }
    }

    async fn checkout(&self, endpoint: &str) -> Result<Conn, TransferError> {
        if let Some(c) = self
            .pools
            .lock()
            .expect("pool lock poisoned")
            .get_mut(endpoint)
            .and_then(|v| v.pop())
        {
            return Ok(c);
        }
        let connect = TcpStream::connect(endpoint);
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => {
                return Err(TransferError::Connect {
                    endpoint: endpoint.to_string(),
                    source,
                })
            }
            Err(_) => {
                return Err(TransferError::Connect {
                    endpoint: endpoint.to_string(),
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                })
            }
        };
        let _ = stream.set_nodelay(true);
        let (r, w) = stream.into_split();
        Ok(Conn {
            r: BufReader::with_capacity(IO_BUFFER, r),
            w: BufWriter::with_capacity(IO_BUFFER, w),
            next_id: 1,
        })
    }

    fn checkin(&self, endpoint: &str, conn: Conn) {
        let mut pools = self.pools.lock().expect("pool lock poisoned");
        let v = pools.entry(endpoint.to_string()).or_default();
        if v.len() < self.max_idle {
            v.push(conn);
        }
    }

    /// Drops idle connections to a store (e.g. after it failed).
    pub fn forget(&self, endpoint: &str) {
        self.pools
            .lock()
            .expect("pool lock poisoned")
            .remove(endpoint);
    }

    fn deadline_for(&self, bytes: u64) -> Duration {
        // At least 100 MB/s, plus the base timeout.
        self.io_timeout + Duration::from_millis(bytes / 100_000)
    }

    /// Reads `[offset, offset+buf.len())` into each buffer, pipelined on one
    /// connection, each under its grant (the signed capability that came with
    /// the replica descriptor; its segment id also makes a store that serves
    /// another segment refuse instead of answering with someone else's bytes).
    pub async fn read(
        &self,
        endpoint: &str,
        reads: &mut [(Grant, u64, &mut [u8])],
    ) -> Result<(), TransferError> {
        self.read_checksummed(endpoint, reads).await.map(|_| ())
    }

    /// Like [`read`](Self::read), also returning each buffer's crc32c, computed
    /// piece by piece as the bytes arrive (while they are still in cache).
    pub async fn read_checksummed(
        &self,
        endpoint: &str,
        reads: &mut [(Grant, u64, &mut [u8])],
    ) -> Result<Vec<u32>, TransferError> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.checkout(endpoint).await?;
        let total: u64 = reads.iter().map(|(_, _, b)| b.len() as u64).sum();
        let mut crcs = vec![0u32; reads.len()];
        let first_id = conn.next_id;
        conn.next_id += reads.len() as u64;
        let headers: Vec<[u8; REQUEST_LEN]> = reads
            .iter()
            .enumerate()
            .map(|(i, (grant, off, buf))| {
                Request {
                    op: Op::Read,
                    request_id: first_id + i as u64,
                    offset: *off,
                    len: buf.len() as u64,
                    grant: *grant,
                }
                .encode()
            })
            .collect();
        let Conn { r, w, .. } = &mut conn;
        let send = async {
            for h in &headers {
                w.write_all(h).await?;
            }
            w.flush().await
        };
        let crcs_ref = &mut crcs;
        let recv = async move {
            for (i, (_, _, buf)) in reads.iter_mut().enumerate() {
                let resp = read_response(r).await?;
                check_response(&resp, first_id + i as u64, buf.len() as u64)?;
                let mut crc = 0u32;
                for piece in buf.chunks_mut(CRC_PIECE) {
                    r.read_exact(piece).await?;
                    crc = crc32c::crc32c_append(crc, piece);
                }
                crcs_ref[i] = crc;
            }
            Ok::<(), IoOrRefused>(())
        };
        self.exchange(endpoint, total, send, recv).await?;
        self.checkin(endpoint, conn);
        Ok(crcs)
    }

    /// Writes each buffer at its offset under its grant, pipelined on one
    /// connection.
    pub async fn write(
        &self,
        endpoint: &str,
        writes: &[(Grant, u64, &[u8])],
    ) -> Result<(), TransferError> {
        if writes.is_empty() {
            return Ok(());
        }
        let mut conn = self.checkout(endpoint).await?;
        let total: u64 = writes.iter().map(|(_, _, b)| b.len() as u64).sum();
        let first_id = conn.next_id;
        conn.next_id += writes.len() as u64;
        let Conn { r, w, .. } = &mut conn;
        let send = async {
            for (i, (grant, off, buf)) in writes.iter().enumerate() {
                let h = Request {
                    op: Op::Write,
                    request_id: first_id + i as u64,
                    offset: *off,
                    len: buf.len() as u64,
                    grant: *grant,
                }
                .encode();
                w.write_all(&h).await?;
                w.write_all(buf).await?;
            }
            w.flush().await
        };
        let recv = async {
            for i in 0..writes.len() {
                let resp = read_response(r).await?;
                check_response(&resp, first_id + i as u64, 0)?;
            }
            Ok::<(), IoOrRefused>(())
        };
        self.exchange(endpoint, total, send, recv).await?;
        self.checkin(endpoint, conn);
        Ok(())
    }

    /// Runs the sending and receiving halves of one pipelined exchange
    /// concurrently, under a deadline that grows with the bytes moved. On any
    /// error the connection is not returned to the pool (the caller drops it).
    async fn exchange(
        &self,
        endpoint: &str,
        total: u64,
        send: impl std::future::Future<Output = std::io::Result<()>>,
        recv: impl std::future::Future<Output = Result<(), IoOrRefused>>,
    ) -> Result<(), TransferError> {
        let both = async {
            let (s, rcv) = tokio::join!(send, recv);
            s.map_err(IoOrRefused::Io)?;
            rcv
        };
        match tokio::time::timeout(self.deadline_for(total), both).await {
            Err(_) => Err(TransferError::Timeout {
                endpoint: endpoint.to_string(),
            }),
            Ok(Err(e)) => Err(e.into_error(endpoint)),
            Ok(Ok(())) => Ok(()),
        }
    }
}

enum IoOrRefused {
    Io(std::io::Error),
    Refused(Status),
    Protocol(String),
}

impl From<std::io::Error> for IoOrRefused {
    fn from(e: std::io::Error) -> Self {
        IoOrRefused::Io(e)
    }
}

impl IoOrRefused {
    fn into_error(self, endpoint: &str) -> TransferError {
        match self {
            IoOrRefused::Io(e) => TransferError::Io {
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            },
            IoOrRefused::Refused(status) => TransferError::Refused {
                endpoint: endpoint.to_string(),
                status,
            },
            IoOrRefused::Protocol(reason) => TransferError::Io {
                endpoint: endpoint.to_string(),
                reason,
            },
        }
    }
}

async fn read_response(r: &mut BufReader<OwnedReadHalf>) -> Result<Response, IoOrRefused> {
    let mut hdr = [0u8; RESPONSE_LEN];
    r.read_exact(&mut hdr).await?;
    Response::decode(&hdr).map_err(|e| IoOrRefused::Protocol(e.to_string()))
}

fn check_response(resp: &Response, id: u64, len: u64) -> Result<(), IoOrRefused> {
    if resp.status != Status::Ok {
        return Err(IoOrRefused::Refused(resp.status));
    }
    if resp.request_id != id || resp.len != len {
        return Err(IoOrRefused::Protocol(format!(
            "answer out of order: expected request {id} with {len} bytes, got {} with {}",
            resp.request_id, resp.len
        )));
    }
    Ok(())
}
