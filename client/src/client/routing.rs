//! Where a replica is reached from here (the own segment, a same-host
//! store's shared memory or disk file, TCP) and the reads and writes of its
//! bytes.

use std::sync::Arc;

use crescent_proto::pb;
use crescent_store::protocol::{Grant, MAX_TRANSFER};
use crescent_store::ShmMapping;

use super::*;

/// How long a disk segment file that could not be opened is not tried again.
const DISK_FILE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// Most disk segment files remembered (open or unreadable); more are
/// forgotten at once and opened again as needed.
const MAX_DISK_FILES: usize = 1024;
/// Most same-host shared segments kept mapped; more are unmapped at once
/// and mapped again as needed.
const MAX_SHM_MAPPINGS: usize = 64;

/// Drops the cached shared-memory mappings whose store is gone, before
/// another is added. A store writes a new file each time it starts, and a
/// mapping of a dead store's file keeps that segment's whole memory alive
/// for as long as it is cached: a long-running client beside a store that
/// restarts would grow by a segment per restart. Past [`MAX_SHM_MAPPINGS`]
/// all are dropped.
fn prune_shm_mappings<T>(maps: &mut HashMap<String, T>, alive: impl Fn(&T) -> bool) {
    maps.retain(|_, m| alive(m));
    if maps.len() >= MAX_SHM_MAPPINGS {
        maps.clear();
    }
}

/// A same-host disk segment file (by path), as this client last found it,
/// for the segment (id, name and disk id) it was opened for: a descriptor
/// of another segment at the path (the store formatted a new file, which
/// the masters mount as a new segment) opens it again, closing the old one.
pub(super) struct DiskFileState {
    segment_id: u64,
    segment_name: String,
    disk_id: String,
    file: Result<Arc<DiskFileReader>, Instant>,
}

/// Where a replica can be reached from here.
pub(super) enum Route<'a> {
    Local(&'a StoreAgent),
    Shm(Arc<ShmMapping>),
    /// A same-host store's disk segment file, read with pread (reads only:
    /// the store writes its file).
    DiskFile(Arc<DiskFileReader>),
    Tcp(&'a str),
}

impl ClientCore {
    pub(super) fn route<'a>(&'a self, r: &'a pb::ReplicaDescriptor) -> Route<'a> {
        if let Some(agent) = self.own_memory(r) {
            return Route::Local(agent);
        }
        if r.hostname == self.config.local_hostname {
            let disk = r.kind == pb::ReplicaKind::Disk as i32;
            if disk && !r.disk_file_path.is_empty() {
                if let Some(f) = self.disk_file(r) {
                    return Route::DiskFile(f);
                }
            } else if !disk && !r.shm_path.is_empty() {
                if let Some(m) = self.shm_mapping(&r.shm_path) {
                    return Route::Shm(m);
                }
            }
        }
        Route::Tcp(&r.endpoint)
    }

    /// This process's own segment, when `r` is in it and it is memory (a
    /// disk segment has no memory to copy from: TCP reads the file).
    pub(super) fn own_memory(&self, r: &pb::ReplicaDescriptor) -> Option<&Arc<StoreAgent>> {
        self.local
            .as_ref()
            .filter(|agent| agent.segment_id() == Some(r.segment_id) && !agent.segment.is_disk())
    }

    /// The route a write to `r` takes: a disk file is written by its store,
    /// so over TCP (without opening the file, which only reads need).
    pub(super) fn write_route<'a>(&'a self, r: &'a pb::ReplicaDescriptor) -> Route<'a> {
        if r.kind == pb::ReplicaKind::Disk as i32 {
            return Route::Tcp(&r.endpoint);
        }
        self.route(r)
    }

    fn disk_file(&self, r: &pb::ReplicaDescriptor) -> Option<Arc<DiskFileReader>> {
        let path = &r.disk_file_path;
        {
            let files = self.disk_files.lock().expect("lock poisoned");
            match files.get(path) {
                Some(s)
                    if s.segment_id == r.segment_id
                        && s.segment_name == r.segment_name
                        && s.disk_id == r.disk_id =>
                {
                    match &s.file {
                        Ok(f) => return Some(f.clone()),
                        Err(retry_at) if Instant::now() < *retry_at => return None,
                        Err(_) => {}
                    }
                }
                _ => {}
            }
        }
        // Opened outside the lock: a slow file system holds up this read
        // only, not every other reader's lookup of its file.
        let file = DiskFileReader::open(std::path::Path::new(path), &r.segment_name, &r.disk_id)
            .map(Arc::new)
            .map_err(|e| {
                // Another user's file, or another machine's path: TCP, and
                // the path is tried again a while later (the store may
                // still have been formatting it).
                tracing::debug!(path, error = %e, "cannot read the disk segment's file; using TCP");
                Instant::now() + DISK_FILE_RETRY
            });
        let mut files = self.disk_files.lock().expect("lock poisoned");
        if files.len() >= MAX_DISK_FILES && !files.contains_key(path) {
            files.clear();
        }
        files.insert(
            path.clone(),
            DiskFileState {
                segment_id: r.segment_id,
                segment_name: r.segment_name.clone(),
                disk_id: r.disk_id.clone(),
                file: file.clone(),
            },
        );
        file.ok()
    }

    /// Closes `r`'s disk file, so the next read opens the path again: the
    /// file held may be one the store has since replaced.
    fn forget_disk_file(&self, r: &pb::ReplicaDescriptor) {
        self.disk_files
            .lock()
            .expect("lock poisoned")
            .remove(&r.disk_file_path);
    }

    pub(super) fn shm_mapping(&self, path: &str) -> Option<Arc<ShmMapping>> {
        let mut maps = self.shm.lock().expect("lock poisoned");
        // Only a live store's memory: a put written into a dead one's would
        // be acknowledged with bytes nobody serves (over TCP it fails, and
        // goes elsewhere).
        if let Some(m) = maps.get(path) {
            if m.owner_alive() {
                return Some(m.clone());
            }
            maps.remove(path);
            return None;
        }
        prune_shm_mappings(&mut maps, |m| m.owner_alive());
        match ShmMapping::open(std::path::Path::new(path)) {
            Ok(m) if !m.owner_alive() => None,
            Ok(m) => {
                let m = Arc::new(m);
                maps.insert(path.to_string(), m.clone());
                Some(m)
            }
            Err(e) => {
                tracing::debug!(path, error = %e, "cannot map shared segment; using TCP");
                None
            }
        }
    }

    pub(super) fn forget_shm(&self, path: &str) {
        self.shm.lock().expect("lock poisoned").remove(path);
    }

    /// Reads order: local segment, same-host shared memory, then remote;
    /// memory before disk within each (the masters list memory first, and
    /// the sort is stable), but a same-host disk file before a remote store.
    pub(super) fn read_order<'a>(
        &self,
        replicas: &'a [pb::ReplicaDescriptor],
    ) -> Vec<&'a pb::ReplicaDescriptor> {
        let rank = |r: &pb::ReplicaDescriptor| match self.route(r) {
            Route::Local(_) => 0,
            Route::Shm(_) => 1,
            Route::DiskFile(_) => 2,
            Route::Tcp(_) => 3,
        };
        let mut v: Vec<&pb::ReplicaDescriptor> = replicas.iter().collect();
        v.sort_by_key(|r| rank(r));
        v
    }

    pub(super) fn count(&self, route: &Route<'_>, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = match route {
            Route::Local(_) => &self.stats.local_bytes,
            Route::Shm(_) => &self.stats.shm_bytes,
            Route::DiskFile(_) => &self.stats.disk_file_bytes,
            Route::Tcp(_) => &self.stats.tcp_bytes,
        };
        c.fetch_add(bytes as u64, Relaxed);
    }

    pub(super) async fn write_replica(&self, r: &pb::ReplicaDescriptor, data: &[u8]) -> Result<()> {
        if r.length != data.len() as u64 {
            return Err(Error::Transfer(format!(
                "replica length {} does not match the value's {} bytes",
                r.length,
                data.len()
            )));
        }
        let route = self.write_route(r);
        self.count(&route, data.len());
        match route {
            Route::Local(agent) => agent
                .segment
                .write_at(r.offset, data)
                .map_err(|e| Error::Transfer(e.to_string())),
            Route::DiskFile(_) => Err(Error::Transfer(
                "a disk file is written by its store (internal: write_route)".into(),
            )),
            Route::Shm(m) => m.write_at(r.offset, data).map_err(|e| {
                self.forget_shm(&r.shm_path);
                Error::Transfer(e.to_string())
            }),
            Route::Tcp(ep) => {
                let grant = Grant::from(r);
                let writes: Vec<(Grant, u64, &[u8])> = chunks(r.offset, data.len())
                    .map(|(off, start, end)| (grant, off, &data[start..end]))
                    .collect();
                self.tcp.write(ep, &writes).await.map_err(|e| {
                    self.tcp.forget(ep);
                    Error::from_transfer(e)
                })
            }
        }
    }

    /// Reads one replica by `route` into `buf`, returning the crc32c of what was read
    /// (computed while the bytes are still in cache).
    async fn read_replica_by(
        &self,
        route: Route<'_>,
        r: &pb::ReplicaDescriptor,
        buf: &mut [u8],
    ) -> Result<u32> {
        // A same-host disk file read counts once it succeeded: a failed
        // one is read again over TCP and counted there.
        if !matches!(route, Route::DiskFile(_)) {
            self.count(&route, buf.len());
        }
        match route {
            Route::Local(agent) => {
                // SAFETY: range checked by `slice`; the object is immutable once complete.
                let src = unsafe { agent.segment.slice(r.offset, buf.len() as u64) }
                    .map_err(|e| Error::Transfer(e.to_string()))?;
                Ok(crescent_store::copy_with_crc(buf, src))
            }
            Route::Shm(m) => m.read_at_with_crc(r.offset, buf).map_err(|e| {
                self.forget_shm(&r.shm_path);
                Error::Transfer(e.to_string())
            }),
            Route::DiskFile(f) => {
                let crc = read_disk_file(f.clone(), r.offset, buf).await?;
                self.count(&Route::DiskFile(f), buf.len());
                Ok(crc)
            }
            Route::Tcp(ep) => {
                let step = MAX_TRANSFER as usize;
                let grant = Grant::from(r);
                let mut reads: Vec<(Grant, u64, &mut [u8])> = buf
                    .chunks_mut(step)
                    .enumerate()
                    .map(|(i, piece)| (grant, r.offset + (i * step) as u64, piece))
                    .collect();
                let crcs = self
                    .tcp
                    .read_checksummed(ep, &mut reads)
                    .await
                    .map_err(|e| {
                        self.tcp.forget(ep);
                        Error::from_transfer(e)
                    })?;
                Ok(combine_crcs(&crcs, &reads))
            }
        }
    }

    /// Reads a verified copy into `buf[..size]`, trying replicas in order.
    pub(super) async fn read_verified(
        &self,
        key: &str,
        found: &pb::GetReplicaListResponse,
        buf: &mut [u8],
    ) -> Result<usize> {
        let size = found.size;
        if (buf.len() as u64) < size {
            return Err(Error::BufferTooSmall {
                size,
                buffer: buf.len(),
            });
        }
        let dst = &mut buf[..size as usize];
        let mut mismatch = false;
        let mut last = String::from("object has no replica");
        // A TLS refusal is reported as such (PERMISSION_DENIED) when no
        // replica could be read: it is why, not a transfer failure.
        let mut denied = None;
        for r in self.read_order(&found.replicas) {
            if r.length != size {
                last = format!(
                    "replica on segment {} has length {} for a {size}-byte object",
                    r.segment_id, r.length
                );
                continue;
            }
            let route = self.route(r);
            let direct = matches!(route, Route::DiskFile(_));
            let mut read = self.read_replica_by(route, r, dst).await;
            if direct {
                // The file held may be an old one the store has replaced
                // (or cut short): open the path anew next time, and ask the
                // store itself now.
                if read.as_ref().map_or(true, |crc| *crc != found.checksum) {
                    self.stats
                        .disk_file_fallbacks
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.forget_disk_file(r);
                    read = self.read_replica_by(Route::Tcp(&r.endpoint), r, dst).await;
                }
            }
            match read {
                Ok(crc) => {
                    if crc == found.checksum {
                        return Ok(size as usize);
                    }
                    tracing::warn!(
                        key,
                        segment_id = r.segment_id,
                        "replica failed its checksum; trying another"
                    );
                    self.stats
                        .checksum_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    mismatch = true;
                }
                Err(e) => {
                    tracing::debug!(key, segment_id = r.segment_id, error = %e, "replica unreadable; trying another");
                    last = e.to_string();
                    if e.is_denied() {
                        denied = Some(e);
                    }
                }
            }
        }
        if mismatch {
            Err(Error::ChecksumMismatch(key.to_string()))
        } else if let Some(denied) = denied {
            Err(denied)
        } else {
            Err(Error::Transfer(last))
        }
    }
}

/// Reads `buf.len()` bytes at `offset` of a same-host disk segment file,
/// returning their crc32c. A blocking read: on a multi-threaded runtime in
/// place (`block_in_place`: the worker hands its other tasks on, and the
/// bytes go straight into the caller's buffer); on a current-thread runtime
/// on a blocking thread, into a buffer of its own (the caller's cannot be
/// lent to a thread that may outlive this future, a cancelled get), then
/// copied; outside any runtime inline. Known limit: a multi-threaded
/// runtime entered (`Handle::enter`) inside a current-thread runtime's
/// `block_on` is taken for the first case, and `block_in_place` panics.
async fn read_disk_file(f: Arc<DiskFileReader>, offset: u64, buf: &mut [u8]) -> Result<u32> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let flavor = Handle::try_current().map(|h| h.runtime_flavor());
    if matches!(flavor, Ok(RuntimeFlavor::MultiThread) | Err(_)) {
        let mut read = || f.read_with_crc(offset, buf);
        let read = if flavor.is_ok() {
            tokio::task::block_in_place(read)
        } else {
            read()
        };
        return read.map_err(|e| Error::Transfer(e.to_string()));
    }
    let len = buf.len();
    let read = tokio::task::spawn_blocking(move || {
        let mut bytes = vec![0u8; len];
        f.read_with_crc(offset, &mut bytes).map(|crc| (bytes, crc))
    })
    .await
    .map_err(|e| Error::Transfer(format!("disk file read: {e}")))?;
    let (bytes, crc) = read.map_err(|e| Error::Transfer(e.to_string()))?;
    buf.copy_from_slice(&bytes);
    Ok(crc)
}

/// The crc32c of consecutive pieces. Objects over MAX_TRANSFER (1 GiB) arrive
/// in several pieces; rather than combining crcs algebraically we re-hash the
/// (rare) multi-piece case.
pub(super) fn combine_crcs(crcs: &[u32], pieces: &[(Grant, u64, &mut [u8])]) -> u32 {
    if crcs.len() == 1 {
        return crcs[0];
    }
    pieces
        .iter()
        .fold(0u32, |crc, (_, _, b)| crc32c::crc32c_append(crc, b))
}

/// Splits `len` bytes at `offset` into transfers of at most MAX_TRANSFER:
/// (remote offset, start, end) of the local buffer.
pub(super) fn chunks(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
    let step = MAX_TRANSFER as usize;
    (0..len.div_ceil(step).max(1)).map(move |i| {
        let start = i * step;
        let end = (start + step).min(len);
        (offset + start as u64, start, end)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_of_dead_stores_are_dropped_and_the_rest_kept_up_to_a_bound() {
        let mut maps: HashMap<String, u32> = HashMap::new();
        maps.insert("/dev/shm/crescent-a-1".into(), 1);
        maps.insert("/dev/shm/crescent-a-2".into(), 2);
        maps.insert("/dev/shm/crescent-b-3".into(), 3);
        prune_shm_mappings(&mut maps, |m| *m != 1);
        let mut kept: Vec<&String> = maps.keys().collect();
        kept.sort();
        assert_eq!(kept, ["/dev/shm/crescent-a-2", "/dev/shm/crescent-b-3"]);

        for i in 0..MAX_SHM_MAPPINGS as u32 {
            maps.insert(format!("/dev/shm/crescent-c-{i}"), i);
        }
        prune_shm_mappings(&mut maps, |_| true);
        assert!(maps.is_empty(), "past the bound every mapping goes");
    }
}
