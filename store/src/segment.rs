//! A segment: the bytes a store contributes to the pool.
//!
//! Memory: either anonymous memory (huge pages requested with
//! `MADV_HUGEPAGE`), or a file in `/dev/shm` that same-host clients map to
//! copy without a socket. Disk: one pre-allocated file on local storage
//! (see [`crate::disk`]), moved with pread/pwrite and kept across restarts.
//! A disk segment's bytes have no address: [`Segment::slice`] and
//! [`Segment::slice_mut`] refuse it, and its bytes move only through
//! [`Segment::read_at`] and [`Segment::write_at`] (blocking calls).
//!
//! A shared-memory file outlives a store killed with SIGKILL (or by the OOM
//! killer), and tmpfs keeps its touched pages in RAM until it is removed. So
//! the owning store holds an exclusive `flock` on its file for its lifetime,
//! and every store that creates one first removes the `crescent-*` files in
//! the directory that nobody holds a lock on: their owners are dead. A lock
//! is released by the kernel when its holder dies, whatever pid namespace it
//! ran in, so this never removes a live store's file.
//!
//! Concurrency: many connections read and write the segment at once. The
//! master's allocator hands out disjoint ranges, so well-behaved peers never
//! touch the same bytes concurrently; a misbehaving peer can only corrupt
//! object bytes, which readers detect with the object's checksum.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{MmapMut, MmapOptions};

use crate::disk::{DiskFile, DiskIdentity, DiskOpened, OtherCapacity, WriteTicket, HEADER_LEN};
pub use crate::segment_error::SegmentError;

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Rounds a requested size up to whole pages.
pub fn round_to_pages(size: u64) -> u64 {
    let page = page_size();
    size.div_ceil(page) * page
}

/// A shared-memory file and the open handle whose lock marks it as in use.
struct ShmFile {
    path: PathBuf,
    _locked: std::fs::File,
}

/// Prefix of every shared-memory file a segment creates (and of nothing else
/// the sweep may remove).
const SHM_PREFIX: &str = "crescent-";
/// Most directory entries one sweep looks at, so a huge directory cannot
/// stall a store's start.
const SWEEP_LIMIT: usize = 4096;

pub struct Segment {
    backing: Backing,
    /// Data bytes (for a disk segment, its capacity: the header not included).
    len: u64,
    /// The master-assigned id this segment is mounted under and the key its
    /// grants are signed with (None until mounted: nothing is served).
    mounted: std::sync::RwLock<Option<Mounted>>,
}

/// Where a segment's bytes are.
enum Backing {
    Memory {
        map: MmapMut,
        ptr: *mut u8,
        shm: Option<ShmFile>,
    },
    Disk(DiskFile),
}

/// What the transfer server checks requests against.
#[derive(Clone, Debug)]
pub struct Mounted {
    pub id: u64,
    pub signer: crescent_auth::capability::Signer,
}

// SAFETY: the mapping lives as long as the Segment; access goes through raw
// pointers into disjoint ranges (see the module comment). A disk segment's
// file is Send and Sync itself (pread/pwrite take no shared cursor).
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Records the master-assigned id this segment is mounted under and the
    /// key it mounted with, so the transfer server serves only requests for
    /// this segment under grants signed with that key.
    pub fn set_mounted(&self, id: u64, key: &crescent_auth::capability::SegmentKey) {
        *self.mounted.write().expect("lock poisoned") = Some(Mounted {
            id,
            signer: key.signer(),
        });
    }

    /// The id and key requests are checked against (None until mounted).
    pub fn mounted(&self) -> Option<Mounted> {
        self.mounted.read().expect("lock poisoned").clone()
    }

    fn from_map(mut map: MmapMut, size: u64, shm: Option<ShmFile>) -> Arc<Self> {
        advise_huge(&map);
        let ptr = map.as_mut_ptr();
        Arc::new(Self {
            backing: Backing::Memory { map, ptr, shm },
            len: size,
            mounted: Default::default(),
        })
    }

    /// Allocates every page of a memory segment now (`MADV_POPULATE_WRITE`),
    /// so that no write to it later waits for a page fault, and so that a
    /// shared-memory directory or a memory limit too small for the segment is
    /// this error at start instead of a SIGBUS or an OOM kill when the pool
    /// fills. Nothing to do on disk. Blocking: about a second per few GB.
    /// Returns whether it ran (`false`: the kernel predates Linux 5.14 and
    /// pages are allocated on first use, as without it).
    pub fn prefault(&self) -> Result<bool, SegmentError> {
        let Backing::Memory { map, .. } = &self.backing else {
            return Ok(false);
        };
        #[cfg(target_os = "linux")]
        match map.advise(memmap2::Advice::PopulateWrite) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(source) => Err(SegmentError::Prefault {
                size: self.len,
                source,
            }),
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = map;
            Ok(false)
        }
    }

    /// The disk segment in `dir` (file [`crate::disk::DISK_FILE`]) of
    /// `capacity` data bytes, a positive multiple of 4096: reused if a valid
    /// one of that capacity is there (keeping its bytes, name and disk id),
    /// else created or reformatted under `name_if_new` with a new disk id
    /// (what happened is the [`DiskOpened`]). A valid file of another
    /// capacity is refused or reformatted as `other_capacity` says. Locked for the segment's
    /// lifetime: a second open of `dir` meanwhile is
    /// [`SegmentError::DiskInUse`]. Blocking (may fsync and allocate).
    pub fn disk(
        dir: &Path,
        name_if_new: &str,
        capacity: u64,
        other_capacity: OtherCapacity,
    ) -> Result<(Arc<Self>, DiskOpened), SegmentError> {
        let (disk, opened) = crate::disk::open(dir, name_if_new, capacity, other_capacity)?;
        let segment = Arc::new(Self {
            backing: Backing::Disk(disk),
            len: capacity,
            mounted: Default::default(),
        });
        Ok((segment, opened))
    }

    /// The disk segment's name, disk id and capacity (None in memory).
    pub fn disk_identity(&self) -> Option<&DiskIdentity> {
        match &self.backing {
            Backing::Disk(d) => Some(&d.identity),
            Backing::Memory { .. } => None,
        }
    }

    /// Whether the bytes are on disk (no address; moved with
    /// [`Self::read_at`] / [`Self::write_at`] only).
    pub fn is_disk(&self) -> bool {
        matches!(self.backing, Backing::Disk(_))
    }

    /// Anonymous memory; pages are allocated on first touch.
    pub fn anonymous(size: u64) -> Result<Arc<Self>, SegmentError> {
        check_size(size)?;
        let map = MmapOptions::new()
            .len(size as usize)
            .map_anon()
            .map_err(|source| SegmentError::Map { size, source })?;
        Ok(Self::from_map(map, size, None))
    }

    /// A file in `dir` (normally `/dev/shm`) that same-host clients can map.
    /// The file is removed when the segment is dropped, and by the next
    /// store to start in `dir` if this process dies first (module comment).
    pub fn shared(dir: &Path, name: &str, size: u64) -> Result<Arc<Self>, SegmentError> {
        check_size(size)?;
        let swept = sweep_dead_shm_files(dir);
        if swept > 0 {
            tracing::info!(
                dir = %dir.display(),
                files = swept,
                "removed shared-memory files of stores that died without cleaning up"
            );
        }
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("{SHM_PREFIX}{safe}-{}", std::process::id()));
        // Created and locked under a name the sweep ignores, then renamed:
        // another store's sweep never sees it unlocked.
        let creating = dir.join(format!(".{SHM_PREFIX}{safe}-{}.new", std::process::id()));
        let shm_err = |source| SegmentError::ShmFile {
            path: path.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&creating)
            .map_err(shm_err)?;
        file.try_lock()
            .map_err(|e| shm_err(std::io::Error::other(e)))?;
        restrict_to_owner(&creating).map_err(shm_err)?;
        file.set_len(size).map_err(shm_err)?;
        std::fs::rename(&creating, &path).map_err(shm_err)?;
        // SAFETY: the file was just created by us with the right length; other
        // mappers are same-host clients sharing it by design.
        let map = unsafe { MmapOptions::new().len(size as usize).map_mut(&file) }
            .map_err(|source| SegmentError::Map { size, source })?;
        Ok(Self::from_map(
            map,
            size,
            Some(ShmFile {
                path,
                _locked: file,
            }),
        ))
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn shm_path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::Memory { shm, .. } => shm.as_ref().map(|f| f.path.as_path()),
            Backing::Disk(_) => None,
        }
    }

    /// The file of a disk segment (None in memory).
    pub fn disk_path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::Disk(d) => Some(d.path.as_path()),
            Backing::Memory { .. } => None,
        }
    }

    /// The start of a memory segment's bytes; an error for a disk segment.
    fn memory_ptr(&self) -> Result<*mut u8, SegmentError> {
        match &self.backing {
            Backing::Memory { ptr, .. } => Ok(*ptr),
            Backing::Disk(d) => Err(SegmentError::NotInMemory {
                path: d.path.clone(),
            }),
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), SegmentError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(SegmentError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Bytes at `[offset, offset+len)` of a memory segment
    /// ([`SegmentError::NotInMemory`] for a disk segment).
    ///
    /// # Safety
    /// No other thread may write these bytes while the slice is alive; the
    /// allocator's disjoint ranges guarantee it for well-behaved peers.
    pub unsafe fn slice(&self, offset: u64, len: u64) -> Result<&[u8], SegmentError> {
        let ptr = self.memory_ptr()?;
        self.check(offset, len)?;
        Ok(std::slice::from_raw_parts(
            ptr.add(offset as usize),
            len as usize,
        ))
    }

    /// Mutable bytes at `[offset, offset+len)` of a memory segment
    /// ([`SegmentError::NotInMemory`] for a disk segment).
    ///
    /// # Safety
    /// No other thread may access these bytes while the slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: u64) -> Result<&mut [u8], SegmentError> {
        let ptr = self.memory_ptr()?;
        self.check(offset, len)?;
        Ok(std::slice::from_raw_parts_mut(
            ptr.add(offset as usize),
            len as usize,
        ))
    }

    /// Copies out of the segment (range-checked). For a disk segment a
    /// blocking pread: call it off the async runtime's threads.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), SegmentError> {
        if let Backing::Disk(d) = &self.backing {
            use std::os::unix::fs::FileExt;
            self.check(offset, dst.len() as u64)?;
            // No overflow: offset + len <= capacity <= i64::MAX - HEADER_LEN.
            return d
                .file
                .read_exact_at(dst, HEADER_LEN + offset)
                .map_err(|source| SegmentError::DiskIo {
                    op: "read",
                    path: d.path.clone(),
                    source,
                });
        }
        // SAFETY: a copy of bytes; see the module comment on concurrency.
        let src = unsafe { self.slice(offset, dst.len() as u64)? };
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Copies into the segment (range-checked). For a disk segment a
    /// blocking pwrite (not fsynced: see [`crate::disk`]).
    pub fn write_at(&self, offset: u64, src: &[u8]) -> Result<(), SegmentError> {
        if let Backing::Disk(d) = &self.backing {
            use std::os::unix::fs::FileExt;
            self.check(offset, src.len() as u64)?;
            // No overflow: as in `read_at`.
            return d
                .file
                .write_all_at(src, HEADER_LEN + offset)
                .map_err(|source| SegmentError::DiskIo {
                    op: "write",
                    path: d.path.clone(),
                    source,
                });
        }
        // SAFETY: as above.
        let dst = unsafe { self.slice_mut(offset, src.len() as u64)? };
        dst.copy_from_slice(src);
        Ok(())
    }

    /// To be taken before a disk write's first byte, for
    /// [`Self::sync_disk`] (see [`crate::disk::SyncLedger`]).
    pub fn disk_write_ticket(&self) -> WriteTicket {
        match &self.backing {
            Backing::Disk(d) => d.syncs.begin(),
            Backing::Memory { .. } => WriteTicket::default(),
        }
    }

    /// Makes the bytes of the disk write `ticket` was taken for durable
    /// (`fdatasync`: the data and the extents a first write into
    /// pre-allocated space converts), or says they may be lost: its sync
    /// failed, or another writer's did meanwhile. Nothing to do for memory.
    pub fn sync_disk(&self, ticket: WriteTicket) -> Result<(), SegmentError> {
        if let Backing::Disk(d) = &self.backing {
            let synced = d.syncs.sync(ticket, || d.file.sync_data());
            synced.map_err(|source| SegmentError::DiskIo {
                op: "sync",
                path: d.path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Keeps the mapping referenced (it is only used through `ptr`); 0 for
    /// a disk segment, which has none.
    pub fn mapping_len(&self) -> usize {
        match &self.backing {
            Backing::Memory { map, .. } => map.len(),
            Backing::Disk(_) => 0,
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // A disk segment's file is kept: its bytes are meant to outlive us.
        if let Backing::Memory { shm: Some(f), .. } = &self.backing {
            let _ = std::fs::remove_file(&f.path);
        }
    }
}

/// Removes the segment files in `dir` whose owner is dead (nobody holds their
/// lock); returns how many. Best effort: errors leave a file in place.
fn sweep_dead_shm_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.take(SWEEP_LIMIT).flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // Also half-created files of a store that died before its rename
        // (locked, like the others, while their creator lives).
        // A disk segment's file shares the prefix but is meant to outlive
        // its store: never swept, should a disk directory be the shm one.
        let is_ours = (name.starts_with(SHM_PREFIX) && name != crate::disk::DISK_FILE)
            || (name.starts_with(&format!(".{SHM_PREFIX}")) && name.ends_with(".new"));
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        if !is_ours || !is_file {
            continue;
        }
        // Non-blocking and no symlinks: a FIFO or link swapped in after the
        // type check cannot stall or redirect a store's start.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(entry.path());
        let Ok(file) = opened else {
            continue;
        };
        // Held by a live store: WouldBlock. Free: its owner died. Unlink
        // only if the name still is the file we locked: a store could have
        // renamed a fresh, locked file onto the same name meanwhile.
        if file.try_lock().is_ok()
            && same_file(&file, &entry.path())
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Whether `path` names the regular file `file` has open (device and inode).
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.is_file() && a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn check_size(size: u64) -> Result<(), SegmentError> {
    let page = page_size();
    if size == 0 || !size.is_multiple_of(page) || size > isize::MAX as u64 {
        return Err(SegmentError::BadSize { size, page });
    }
    Ok(())
}

fn advise_huge(map: &MmapMut) {
    #[cfg(target_os = "linux")]
    {
        // Best effort: transparent huge pages cut TLB misses on large copies.
        let _ = map.advise(memmap2::Advice::HugePage);
    }
}

fn restrict_to_owner(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// A same-host client's mapping of a store's shared-memory segment.
pub struct ShmMapping {
    map: MmapMut,
    ptr: *mut u8,
    len: u64,
    /// Kept open to ask whether the store that made it still lives.
    file: std::fs::File,
}

// SAFETY: as for Segment.
unsafe impl Send for ShmMapping {}
unsafe impl Sync for ShmMapping {}

impl ShmMapping {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = file.metadata()?.len();
        // SAFETY: the store created the file with this length and keeps it
        // until it exits; a truncated file would fault, so we only map the
        // length seen at open time and the store never shrinks it.
        let mut map = unsafe { MmapOptions::new().len(len as usize).map_mut(&file)? };
        let ptr = map.as_mut_ptr();
        Ok(Self {
            map,
            ptr,
            len,
            file,
        })
    }

    /// Whether the store that made the file still lives. It holds an
    /// exclusive lock on the file for its lifetime, so a shared lock that
    /// can be taken means it is gone: bytes written into its memory then
    /// reach nobody, whatever the masters still believe.
    pub fn owner_alive(&self) -> bool {
        match self.file.try_lock_shared() {
            Ok(()) => {
                let _ = self.file.unlock();
                false
            }
            Err(std::fs::TryLockError::WouldBlock) => true,
            Err(std::fs::TryLockError::Error(_)) => false,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: u64, len: u64) -> std::io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len && end as usize <= self.map.len() => Ok(()),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "range [{offset}, +{len}) outside the {}-byte shared segment",
                    self.len
                ),
            )),
        }
    }

    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        self.check(offset, dst.len() as u64)?;
        // SAFETY: range checked; concurrency as for Segment.
        let src = unsafe { std::slice::from_raw_parts(self.ptr.add(offset as usize), dst.len()) };
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Copies out and returns the crc32c of the copied bytes.
    pub fn read_at_with_crc(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<u32> {
        self.check(offset, dst.len() as u64)?;
        // SAFETY: range checked; concurrency as for Segment.
        let src = unsafe { std::slice::from_raw_parts(self.ptr.add(offset as usize), dst.len()) };
        Ok(crate::copy_with_crc(dst, src))
    }

    pub fn write_at(&self, offset: u64, src: &[u8]) -> std::io::Result<()> {
        self.check(offset, src.len() as u64)?;
        // SAFETY: range checked; concurrency as for Segment.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset as usize), src.len()) };
        dst.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_segment_reads_back_and_checks_ranges() {
        let page = page_size();
        let s = Segment::anonymous(4 * page).unwrap();
        s.write_at(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        s.read_at(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(s.write_at(4 * page - 2, b"abc").is_err());
        assert!(s.read_at(u64::MAX, &mut out).is_err());
        assert!(Segment::anonymous(0).is_err());
        assert!(Segment::anonymous(page + 1).is_err());
    }

    /// Pages of the segment's mapping now in memory (mincore).
    fn resident_pages(s: &Segment) -> usize {
        let Backing::Memory { map, .. } = &s.backing else {
            panic!("not a memory segment")
        };
        let page = page_size() as usize;
        let mut vec = vec![0u8; map.len().div_ceil(page)];
        // SAFETY: the range is the whole live mapping; vec has a byte per page.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 == 1).count()
    }

    #[test]
    fn prefault_allocates_every_page_and_keeps_the_bytes_zero() {
        let page = page_size();
        let pages = 1024;
        let shm_dir = tempfile::tempdir_in("/dev/shm").unwrap();
        for s in [
            Segment::anonymous(pages * page).unwrap(),
            Segment::shared(shm_dir.path(), "prefault", pages * page).unwrap(),
        ] {
            assert!(
                resident_pages(&s) < pages as usize,
                "resident before prefault"
            );
            assert!(s.prefault().unwrap(), "this kernel populates mappings");
            assert_eq!(resident_pages(&s), pages as usize);
            let mut out = vec![1u8; page as usize];
            s.read_at((pages - 1) * page, &mut out).unwrap();
            assert!(out.iter().all(|b| *b == 0));
            s.write_at(page, b"after").unwrap();
        }
    }

    /// A shared-memory file that cannot back the whole segment (here cut
    /// short; a full /dev/shm alike) is an error from prefault, where a write
    /// to the missing pages would have been a SIGBUS.
    #[test]
    fn prefault_of_a_segment_the_file_cannot_back_is_an_error() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let page = page_size();
        let s = Segment::shared(dir.path(), "short", 16 * page).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(s.shm_path().unwrap())
            .unwrap()
            .set_len(4 * page)
            .unwrap();
        let err = s.prefault().unwrap_err().to_string();
        assert!(
            err.contains("up front") && err.contains("--prefault=false"),
            "{err}"
        );
        // The pages the file does back are still served.
        s.write_at(0, b"still").unwrap();
    }

    #[test]
    fn shared_segment_is_visible_to_a_second_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let page = page_size();
        let s = Segment::shared(dir.path(), "test/seg", 2 * page).unwrap();
        let path = s.shm_path().unwrap().to_path_buf();
        let m = ShmMapping::open(&path).unwrap();
        m.write_at(10, b"from client").unwrap();
        let mut out = [0u8; 11];
        s.read_at(10, &mut out).unwrap();
        assert_eq!(&out, b"from client");
        assert!(m.read_at(2 * page, &mut out).is_err());
        drop(m);
        drop(s);
        assert!(!path.exists(), "shm file removed with the segment");
    }

    #[test]
    fn files_of_dead_stores_are_swept_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let page = page_size();
        // A dead store's file: nobody holds its lock; and one it died
        // creating.
        let dead = dir.path().join("crescent-127_0_0_1_1-dead-1");
        std::fs::write(&dead, b"stale").unwrap();
        let half = dir.path().join(".crescent-127_0_0_1_1-dead-1.new");
        std::fs::write(&half, b"").unwrap();
        // A symlink named like a segment file is never followed or removed
        // through: its target survives.
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("crescent-link-1")).unwrap();
        // Not a segment file: never touched.
        let other = dir.path().join("someone-else");
        std::fs::write(&other, b"keep").unwrap();
        let live = Segment::shared(dir.path(), "live", page).unwrap();
        assert!(!dead.exists(), "a dead store's file is removed");
        assert!(
            !half.exists(),
            "a half-created file of a dead store is removed"
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(other.exists());
        // A second store in the same directory keeps the live one's file.
        let second = Segment::shared(dir.path(), "second", page).unwrap();
        assert!(
            live.shm_path().unwrap().exists(),
            "a live store's file is kept"
        );
        assert!(second.shm_path().unwrap().exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".new"))
            .collect();
        assert!(leftovers.is_empty(), "no half-created files");
    }
}
