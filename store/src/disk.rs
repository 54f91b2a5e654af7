//! The on-disk format of a disk segment and the logic that opens it.
//!
//! A disk segment is one pre-allocated file, `DIR/crescent-disk.seg`:
//!
//! ```text
//! offset 0     header (HEADER_LEN = 4096 bytes, the rest zeros):
//!                magic b"CRESDISK" | version u32 | capacity u64
//!                | disk id [u8; 16] | name length u16 | name (UTF-8, <= 1024 bytes)
//!                | crc32c u32 of every header byte before it
//! offset 4096  `capacity` data bytes: segment offset `o` is file offset 4096 + o
//! ```
//! All integers little-endian.
//!
//! Why a header: the file outlives the store (its bytes are the point of a
//! disk tier), so a restarted store must tell its own file, of the size it was
//! asked for, from a stranger's, a half-written one or one resized while it
//! was down. The disk id names one formatting of the file: it changes
//! whenever the bytes cannot be trusted to be what they were (reformatted),
//! so whoever kept metadata about the old bytes can tell they are gone.
//!
//! The open file holds an exclusive `flock` for the segment's lifetime: two
//! live stores on one directory would overwrite each other's objects. The
//! kernel drops the lock when its holder dies (even by SIGKILL), so a
//! restarted store takes its file back.
//!
//! Writes are not fsynced: the bytes survive the store process dying (they
//! are in the page cache), not necessarily the machine crashing; objects are
//! checksummed, so a reader detects what a crash lost.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::segment_error::SegmentError;

/// The file's name in the segment directory.
pub const DISK_FILE: &str = "crescent-disk.seg";
/// Bytes before the data; segment offsets start after it.
pub const HEADER_LEN: u64 = 4096;
/// Capacities are multiples of this (the usual SSD and page-cache block).
pub const DISK_BLOCK: u64 = 4096;
/// Longest segment name the header holds, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

const MAGIC: [u8; 8] = *b"CRESDISK";
const VERSION: u32 = 1;
// Field positions in the header.
const AT_VERSION: usize = 8;
const AT_CAPACITY: usize = 12;
const AT_DISK_ID: usize = 20;
const AT_NAME_LEN: usize = 36;
const AT_NAME: usize = 38;

/// Who a disk segment is: what the masters are told about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskIdentity {
    /// The segment name (as first created; kept across restarts).
    pub name: String,
    /// 32 lowercase hex digits; new whenever the file is (re)formatted.
    pub disk_id: String,
    /// Data bytes (the header not included).
    pub capacity: u64,
}

/// What opening a disk segment does with a valid file formatted for a
/// capacity other than the one asked for. Refusing is the default: the
/// usual cause is a mistyped `--disk-size`, and formatting anew would
/// silently empty the tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OtherCapacity {
    /// [`SegmentError::DiskCapacityDiffers`]: the file, its bytes and its
    /// disk id are left as they are, and the segment is not opened.
    #[default]
    Refuse,
    /// Format the file anew at the asked capacity (`--disk-reformat`): the
    /// objects it held are gone.
    Reformat,
}

/// What opening a disk segment found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskOpened {
    /// There was no file (or an empty one): a new, zeroed segment.
    Created,
    /// A valid file of the requested capacity: its bytes, name and disk id
    /// are kept.
    Reused,
    /// A file that could not be reused (the reason in `why`: damaged, or
    /// another capacity with [`OtherCapacity::Reformat`]): formatted anew,
    /// with a new disk id; its previous bytes are gone.
    Reformatted { why: String },
}

/// An open, locked disk segment file.
pub(crate) struct DiskFile {
    /// Holds the lock; closed (and unlocked) with the segment.
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) identity: DiskIdentity,
    pub(crate) syncs: SyncLedger,
}

/// Which writes a failed sync may have cost. The kernel reports a failed
/// writeback to one `fsync` of the file (each open file sees a writeback
/// error once), and every write of the store goes through one open file:
/// after one writer's sync failed, the next writer's sync succeeds although
/// its pages may have been among those lost. So every failed sync is
/// counted, and a write is durable only when its own sync succeeded and no
/// sync failed between the start of its write and the end of its sync.
/// A sync that failed before the write began cannot have held its pages.
#[derive(Debug, Default)]
pub struct SyncLedger {
    failures: std::sync::atomic::AtomicU64,
    /// Held across a sync and the counting of its failure: a writer whose
    /// sync succeeded right after another's failed must see that failure
    /// counted.
    syncing: std::sync::Mutex<()>,
}

/// Taken before a write's first byte goes to the file; settled by
/// [`SyncLedger::sync`] with that write's sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteTicket(u64);

impl SyncLedger {
    pub fn begin(&self) -> WriteTicket {
        WriteTicket(self.failures.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Runs the sync of the write `ticket` was taken for. A failed sync is
    /// counted and stands; a successful one stands only if no sync failed
    /// since the ticket.
    pub fn sync(
        &self,
        ticket: WriteTicket,
        sync: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        use std::sync::atomic::Ordering;
        let failures = {
            // A panic elsewhere while holding it leaves nothing to repair.
            let _one_at_a_time = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = sync() {
                self.failures.fetch_add(1, Ordering::SeqCst);
                return Err(e);
            }
            self.failures.load(Ordering::SeqCst)
        };
        if failures != ticket.0 {
            return Err(io::Error::other(format!(
                "{} sync(s) of this disk segment failed while this write's bytes were unsynced; they may be lost",
                failures.wrapping_sub(ticket.0)
            )));
        }
        Ok(())
    }
}

/// A read-only view of a same-host store's disk segment file, for a client
/// on the store's host: it reads disk replicas with `pread` instead of
/// asking the store over a socket (the store advertises the file's path only
/// when run with `--shm`; the file's mode, 0600, keeps other users out).
///
/// It takes no lock and never writes. The file can change under it:
/// - the store reformats it in place (a new disk id in the header): every
///   read checks, after its bytes, that the header still holds the disk id
///   seen at open, so no read returns bytes of another formatting. A
///   formatting only ever gets a new random id, so the id seen after the
///   read proves no reformat had begun before it;
/// - a new file replaces it at the same path while this holds the old one:
///   the old file still holds the old formatting's objects (and its id);
/// - its store writes new objects into ranges the masters freed: readers
///   check every object's checksum, as for any replica, and reopen the path
///   after a mismatch.
pub struct DiskFileReader {
    file: File,
    capacity: u64,
    /// The header's disk id when opened.
    disk_id: [u8; 16],
}

impl DiskFileReader {
    /// Opens the segment file at `path`, which must be a valid disk segment
    /// named `segment_name` (the name the masters list the replica under)
    /// and, unless `disk_id` is empty (masters from before it name none),
    /// formatted as `disk_id`: a file at the same path on another machine,
    /// another store's, or the same store's file formatted anew since the
    /// masters described it, is refused rather than read.
    pub fn open(path: &Path, segment_name: &str, disk_id: &str) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new().read(true).open(path)?;
        let len = file.metadata()?.len();
        let invalid = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", path.display()),
            )
        };
        let identity = read_identity(&file, len)?.map_err(invalid)?;
        if identity.name != segment_name {
            return Err(invalid(format!(
                "holds segment {:?}, not {segment_name:?}",
                identity.name
            )));
        }
        if !disk_id.is_empty() && identity.disk_id != disk_id {
            return Err(invalid(format!(
                "formatted as disk {}, not {disk_id:?} (formatted anew since)",
                identity.disk_id
            )));
        }
        if let Some(why) = length_mismatch(&identity, len) {
            return Err(invalid(why));
        }
        Ok(Self {
            file,
            capacity: identity.capacity,
            disk_id: unhex(&identity.disk_id),
        })
    }

    /// The disk id of the formatting this reader reads.
    pub fn disk_id(&self) -> String {
        hex(&self.disk_id)
    }

    /// Reads `dst.len()` bytes at segment offset `offset` and returns their
    /// crc32c (computed piece by piece, while each is in cache); an error
    /// (`InvalidData`) if the file was formatted anew before the read ended.
    pub fn read_with_crc(&self, offset: u64, dst: &mut [u8]) -> io::Result<u32> {
        match offset.checked_add(dst.len() as u64) {
            Some(end) if end <= self.capacity => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "range [{offset}, +{}) outside the {}-byte disk segment",
                        dst.len(),
                        self.capacity
                    ),
                ))
            }
        }
        const PIECE: usize = 256 * 1024;
        let mut crc = 0u32;
        for (i, piece) in dst.chunks_mut(PIECE).enumerate() {
            let at = HEADER_LEN + offset + (i * PIECE) as u64;
            self.file.read_exact_at(piece, at)?;
            crc = crc32c::crc32c_append(crc, piece);
        }
        // After the bytes: a reformat sets the file's length to 0 first and
        // writes a new id last, so the old id still there now means none
        // had begun when the bytes were read.
        let mut id = [0u8; 16];
        self.file.read_exact_at(&mut id, AT_DISK_ID as u64)?;
        if id != self.disk_id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the disk segment was formatted anew (disk {} when opened)",
                    self.disk_id()
                ),
            ));
        }
        Ok(crc)
    }
}

/// Opens (creating, reusing or reformatting) the disk segment in `dir`.
pub(crate) fn open(
    dir: &Path,
    name_if_new: &str,
    capacity: u64,
    other_capacity: OtherCapacity,
) -> Result<(DiskFile, DiskOpened), SegmentError> {
    // The whole file's length must fit an off_t for posix_fallocate.
    if capacity == 0
        || !capacity.is_multiple_of(DISK_BLOCK)
        || capacity > i64::MAX as u64 - HEADER_LEN
    {
        return Err(SegmentError::BadSize {
            size: capacity,
            page: DISK_BLOCK,
        });
    }
    if name_if_new.len() > MAX_NAME_LEN {
        return Err(SegmentError::DiskName {
            len: name_if_new.len(),
            max: MAX_NAME_LEN,
        });
    }
    let path = dir.join(DISK_FILE);
    let io_err = |op: &'static str| {
        let path = path.clone();
        move |source: io::Error| SegmentError::DiskIo {
            op,
            path: path.clone(),
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(|source| SegmentError::DiskIo {
        op: "create the directory of",
        path: path.clone(),
        source,
    })?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .map_err(io_err("open"))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(SegmentError::DiskInUse { path });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io_err("lock")(e)),
    }
    let file_len = file.metadata().map_err(io_err("stat"))?.len();
    let opened = if file_len == 0 {
        DiskOpened::Created
    } else {
        match check_existing(&file, file_len, capacity).map_err(io_err("read the header of"))? {
            Existing::Reusable(identity) => {
                let disk = DiskFile {
                    file,
                    path,
                    identity,
                    syncs: SyncLedger::default(),
                };
                return Ok((disk, DiskOpened::Reused));
            }
            Existing::OtherCapacity(found) if other_capacity == OtherCapacity::Refuse => {
                return Err(SegmentError::DiskCapacityDiffers {
                    path,
                    found: found.capacity,
                    asked: capacity,
                });
            }
            Existing::OtherCapacity(found) => DiskOpened::Reformatted {
                why: format!(
                    "its capacity is {} bytes, {capacity} were asked for (--disk-reformat)",
                    found.capacity
                ),
            },
            Existing::Damaged(why) => DiskOpened::Reformatted { why },
        }
    };
    let identity = DiskIdentity {
        name: name_if_new.to_string(),
        disk_id: hex(&new_disk_id().map_err(io_err("draw a disk id for"))?),
        capacity,
    };
    format(&file, &path, &identity)?;
    let disk = DiskFile {
        file,
        path,
        identity,
        syncs: SyncLedger::default(),
    };
    Ok((disk, opened))
}

/// What a non-empty segment file holds, judged against the asked capacity.
enum Existing {
    /// A valid segment of the asked capacity.
    Reusable(DiskIdentity),
    /// A valid segment (header and length agree) of another capacity.
    OtherCapacity(DiskIdentity),
    /// Not a valid segment: why not.
    Damaged(String),
}

/// What a non-empty file holds, for a segment of `capacity` bytes. I/O
/// errors are errors.
fn check_existing(file: &File, file_len: u64, capacity: u64) -> io::Result<Existing> {
    let identity = match read_identity(file, file_len)? {
        Ok(identity) => identity,
        Err(why) => return Ok(Existing::Damaged(why)),
    };
    // The length first: a file resized while no store held it is not what
    // any store wrote, and is formatted anew whatever size was asked (a
    // truncated one has lost objects; an extended one still holds them, but
    // reusing it is not built).
    if let Some(why) = length_mismatch(&identity, file_len) {
        return Ok(Existing::Damaged(why));
    }
    if identity.capacity != capacity {
        return Ok(Existing::OtherCapacity(identity));
    }
    Ok(Existing::Reusable(identity))
}

/// The identity in the header of `file` (`file_len` bytes long), or why it
/// has no valid header. I/O errors are errors.
fn read_identity(file: &File, file_len: u64) -> io::Result<Result<DiskIdentity, String>> {
    if file_len < HEADER_LEN {
        return Ok(Err(format!(
            "the file is {file_len} bytes, shorter than its {HEADER_LEN}-byte header"
        )));
    }
    let mut header = vec![0u8; HEADER_LEN as usize];
    file.read_exact_at(&mut header, 0)?;
    Ok(decode_header(&header))
}

/// Why a file of `file_len` bytes is not as long as its header's capacity
/// says, or None.
fn length_mismatch(identity: &DiskIdentity, file_len: u64) -> Option<String> {
    let expected = HEADER_LEN.checked_add(identity.capacity);
    (Some(file_len) != expected).then(|| {
        format!(
            "the file is {file_len} bytes, {} expected for its capacity \
             (truncated or extended while no store held it)",
            expected.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string())
        )
    })
}

/// The identity in a file's header (its first [`HEADER_LEN`] bytes), or
/// why they are not a valid header.
pub fn decode_header(h: &[u8]) -> Result<DiskIdentity, String> {
    if h.len() < HEADER_LEN as usize {
        return Err(format!(
            "{} bytes, shorter than a {HEADER_LEN}-byte header",
            h.len()
        ));
    }
    if h[..MAGIC.len()] != MAGIC {
        return Err("bad magic: not a Crescent disk segment".into());
    }
    let version = u32::from_le_bytes(array(&h[AT_VERSION..]));
    if version != VERSION {
        return Err(format!(
            "unknown format version {version} (this store writes {VERSION})"
        ));
    }
    let name_len = u16::from_le_bytes(array(&h[AT_NAME_LEN..])) as usize;
    if name_len > MAX_NAME_LEN {
        return Err(format!("corrupt header: a name of {name_len} bytes"));
    }
    let crc_at = AT_NAME + name_len;
    let stored = u32::from_le_bytes(array(&h[crc_at..]));
    if crc32c::crc32c(&h[..crc_at]) != stored {
        return Err("header checksum mismatch".into());
    }
    let name = std::str::from_utf8(&h[AT_NAME..crc_at])
        .map_err(|_| "corrupt header: the name is not UTF-8".to_string())?;
    Ok(DiskIdentity {
        name: name.to_string(),
        disk_id: hex(&h[AT_DISK_ID..AT_DISK_ID + 16]),
        capacity: u64::from_le_bytes(array(&h[AT_CAPACITY..])),
    })
}

/// The header ([`HEADER_LEN`] bytes) for `identity`, whose disk id is 32
/// hex digits and whose name is at most [`MAX_NAME_LEN`] bytes, as `open`
/// makes them.
pub fn encode_header(identity: &DiskIdentity) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_LEN as usize];
    h[..MAGIC.len()].copy_from_slice(&MAGIC);
    h[AT_VERSION..AT_CAPACITY].copy_from_slice(&VERSION.to_le_bytes());
    h[AT_CAPACITY..AT_DISK_ID].copy_from_slice(&identity.capacity.to_le_bytes());
    h[AT_DISK_ID..AT_NAME_LEN].copy_from_slice(&unhex(&identity.disk_id));
    let name = identity.name.as_bytes();
    h[AT_NAME_LEN..AT_NAME].copy_from_slice(&(name.len() as u16).to_le_bytes());
    let crc_at = AT_NAME + name.len();
    h[AT_NAME..crc_at].copy_from_slice(name);
    let crc = crc32c::crc32c(&h[..crc_at]);
    h[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Makes `file` a zeroed segment for `identity`, durably.
fn format(file: &File, path: &Path, identity: &DiskIdentity) -> Result<(), SegmentError> {
    let io_err = |op: &'static str| {
        move |source: io::Error| SegmentError::DiskIo {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let total = HEADER_LEN + identity.capacity;
    // Emptied first: no byte of a previous format survives into this one
    // (and a crash from here on leaves no valid header behind).
    file.set_len(0).map_err(io_err("truncate"))?;
    // Space is reserved now, so a full disk is a clear error at start
    // rather than a failed write in the middle of serving. Checked first
    // because where the filesystem cannot fallocate, glibc emulates it by
    // writing every block: that must not fill the disk to find out.
    let available = available_bytes(file).map_err(io_err("statfs"))?;
    if available < total {
        return Err(SegmentError::DiskFull {
            path: path.to_path_buf(),
            needed: total,
            source: io::Error::other(format!("{available} bytes available on its filesystem")),
        });
    }
    if let Err(e) = fallocate(file, total) {
        // Give back what a partial allocation took.
        let _ = file.set_len(0);
        return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
            SegmentError::DiskFull {
                path: path.to_path_buf(),
                needed: total,
                source: e,
            }
        } else {
            io_err("allocate")(e)
        });
    }
    file.write_all_at(&encode_header(identity), 0)
        .map_err(io_err("write the header of"))?;
    file.sync_all().map_err(io_err("fsync"))?;
    // The directory too, so a new file's name survives a crash.
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync the directory of"))?;
    }
    Ok(())
}

/// Bytes an unprivileged writer may still allocate on `file`'s filesystem.
fn available_bytes(file: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statvfs is valid; fstatvfs only writes into it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the call; `st` is a valid pointer.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Allocates `[0, len)` of `file` (extending it to `len`).
fn fallocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
    loop {
        // SAFETY: plain syscall wrapper on an open descriptor.
        // posix_fallocate returns the error number instead of setting errno.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
            0 => return Ok(()),
            libc::EINTR => continue,
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// 16 random bytes from the kernel.
fn new_disk_id() -> io::Result<[u8; 16]> {
    let mut id = [0u8; 16];
    let mut filled = 0;
    while filled < id.len() {
        let rest = &mut id[filled..];
        // SAFETY: writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(id)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The 16 bytes of a disk id made by [`hex`] (zeros where it is not hex).
fn unhex(id: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(id.as_bytes().chunks(2)) {
        *o = std::str::from_utf8(pair)
            .ok()
            .and_then(|p| u8::from_str_radix(p, 16).ok())
            .unwrap_or(0);
    }
    out
}

/// The first N bytes of `b` (callers index within the fixed-size header).
fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[..N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_durable_only_if_no_sync_failed_while_it_was_unsynced() {
        let ledger = SyncLedger::default();
        let eio = || Err(io::Error::from_raw_os_error(libc::EIO));
        let ok = || Ok(());
        let a = ledger.begin();
        let b = ledger.begin();
        // B's sync is the one the kernel tells of the failed writeback ...
        assert!(ledger.sync(b, eio).is_err());
        // ... and A's sync then succeeds, though A's pages were as unsynced.
        let e = ledger.sync(a, ok).unwrap_err();
        assert!(e.to_string().contains("may be lost"), "{e}");
        // A write begun after the failure is judged by its own sync alone.
        let c = ledger.begin();
        assert!(ledger.sync(c, ok).is_ok());
        let d = ledger.begin();
        assert!(ledger.sync(d, eio).is_err());
        assert!(ledger.sync(ledger.begin(), ok).is_ok());
        // A ticket of another ledger (a misuse) is a failure, not a panic.
        let other = SyncLedger::default();
        assert!(other.sync(ledger.begin(), ok).is_err());
    }

    #[test]
    fn header_round_trips_and_detects_corruption() {
        let identity = DiskIdentity {
            name: "store-a/disk".into(),
            disk_id: hex(&[0xab; 16]),
            capacity: 1 << 30,
        };
        let mut h = encode_header(&identity);
        assert_eq!(h.len(), HEADER_LEN as usize);
        assert_eq!(decode_header(&h).unwrap(), identity);
        h[AT_CAPACITY] ^= 1;
        assert!(decode_header(&h).unwrap_err().contains("checksum"));
        h[AT_CAPACITY] ^= 1;
        h[0] = b'X';
        assert!(decode_header(&h).unwrap_err().contains("magic"));
        let longest = DiskIdentity {
            name: "n".repeat(MAX_NAME_LEN),
            ..identity
        };
        assert_eq!(decode_header(&encode_header(&longest)).unwrap(), longest);
    }

    // Through the segment, as a store uses it.
    use crate::segment::Segment;
    use std::sync::Arc;

    const CAP: u64 = 16 * DISK_BLOCK;

    fn open_disk(dir: &Path, name: &str, capacity: u64) -> (Arc<Segment>, DiskOpened) {
        Segment::disk(dir, name, capacity, OtherCapacity::Refuse).unwrap()
    }

    fn identity(s: &Segment) -> DiskIdentity {
        s.disk_identity().unwrap().clone()
    }

    #[test]
    fn a_disk_segment_keeps_its_bytes_name_and_id_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (s, opened) = open_disk(dir.path(), "store-a", CAP);
        assert_eq!(opened, DiskOpened::Created);
        let first = identity(&s);
        assert_eq!(first.name, "store-a");
        assert_eq!(first.capacity, CAP);
        assert_eq!(first.disk_id.len(), 32);
        assert!(s.is_disk());
        assert_eq!(s.len(), CAP);
        let file = dir.path().join(DISK_FILE);
        assert_eq!(std::fs::metadata(&file).unwrap().len(), HEADER_LEN + CAP);
        s.write_at(0, b"first bytes").unwrap();
        s.write_at(CAP - 4, b"last").unwrap();
        drop(s);

        let (s, opened) = open_disk(dir.path(), "ignored", CAP);
        assert_eq!(opened, DiskOpened::Reused);
        assert_eq!(identity(&s), first);
        let mut got = [0u8; 11];
        s.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"first bytes");
        let mut got = [0u8; 4];
        s.read_at(CAP - 4, &mut got).unwrap();
        assert_eq!(&got, b"last");
        // Data starts after the header in the file.
        let raw = std::fs::read(&file).unwrap();
        assert_eq!(&raw[HEADER_LEN as usize..][..11], b"first bytes");
    }

    #[test]
    fn a_disk_segment_gives_out_no_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = open_disk(dir.path(), "d", CAP);
        // SAFETY: never dereferenced: both must refuse.
        assert!(matches!(
            unsafe { s.slice(0, 8) },
            Err(SegmentError::NotInMemory { .. })
        ));
        assert!(matches!(
            unsafe { s.slice_mut(0, 8) },
            Err(SegmentError::NotInMemory { .. })
        ));
        assert!(s.shm_path().is_none());
        assert_eq!(s.mapping_len(), 0);
        let memory = Segment::anonymous(CAP).unwrap();
        assert!(!memory.is_disk());
        assert!(memory.disk_identity().is_none());
    }

    #[test]
    fn a_disk_segment_that_cannot_be_reused_is_reformatted_with_a_new_id() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(DISK_FILE);
        let (s, _) = open_disk(dir.path(), "a", CAP);
        let mut ids = vec![identity(&s).disk_id];
        drop(s);
        let reformatted_as =
            |other: OtherCapacity, capacity: u64, expect: &str, ids: &mut Vec<String>| {
                let (s, opened) = Segment::disk(dir.path(), "b", capacity, other).unwrap();
                match opened {
                    DiskOpened::Reformatted { why } => assert!(why.contains(expect), "{why}"),
                    other => panic!("expected a reformat ({expect}), got {other:?}"),
                }
                let id = identity(&s);
                assert_eq!((id.name.as_str(), id.capacity), ("b", capacity));
                assert!(!ids.contains(&id.disk_id), "disk id reused");
                ids.push(id.disk_id);
                assert_eq!(
                    std::fs::metadata(&file).unwrap().len(),
                    HEADER_LEN + capacity
                );
                s
            };
        // A damaged file is formatted anew even when other capacities are
        // refused: its objects are lost already.
        let reformatted = |capacity: u64, expect: &str, ids: &mut Vec<String>| {
            reformatted_as(OtherCapacity::Refuse, capacity, expect, ids)
        };

        // Another capacity, asked to reformat: the old bytes are gone.
        let (s, _) = open_disk(dir.path(), "a", CAP);
        s.write_at(0, b"old").unwrap();
        drop(s);
        let s = reformatted_as(OtherCapacity::Reformat, 2 * CAP, "capacity", &mut ids);
        let mut got = [9u8; 3];
        s.read_at(0, &mut got).unwrap();
        assert_eq!(got, [0; 3], "a previous format's bytes survived");
        drop(s);

        // Truncated, and extended, while no store held it.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        f.set_len(HEADER_LEN + CAP).unwrap();
        drop(reformatted(2 * CAP, "truncated", &mut ids));
        // Resized, and asked for another capacity than its header's: damaged
        // (formatted anew), not refused for its capacity.
        f.set_len(HEADER_LEN + CAP).unwrap();
        drop(reformatted(CAP, "truncated", &mut ids));
        f.set_len(HEADER_LEN + 2 * CAP).unwrap();
        drop(reformatted(2 * CAP, "extended", &mut ids));
        f.set_len(HEADER_LEN + 3 * CAP).unwrap();
        drop(reformatted(2 * CAP, "extended", &mut ids));
        f.set_len(100).unwrap();
        drop(reformatted(2 * CAP, "shorter than its", &mut ids));

        // One flipped header byte (in the name).
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, AT_NAME as u64).unwrap();
        f.write_all_at(&[byte[0] ^ 0x20], AT_NAME as u64).unwrap();
        drop(reformatted(2 * CAP, "checksum", &mut ids));
        // Not ours at all.
        f.write_all_at(b"NOTADISK", 0).unwrap();
        drop(reformatted(2 * CAP, "magic", &mut ids));
        // And the last format is reused as it is.
        let (s, opened) = open_disk(dir.path(), "c", 2 * CAP);
        assert_eq!(opened, DiskOpened::Reused);
        assert_eq!(&identity(&s).disk_id, ids.last().unwrap());
    }

    #[test]
    fn a_valid_segment_of_another_capacity_is_refused_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(DISK_FILE);
        let (s, _) = open_disk(dir.path(), "a", CAP);
        s.write_at(0, b"kept").unwrap();
        let before = identity(&s);
        drop(s);
        let raw = std::fs::read(&file).unwrap();
        for asked in [2 * CAP, CAP - DISK_BLOCK, 1 << 30] {
            let err = Segment::disk(dir.path(), "b", asked, OtherCapacity::Refuse)
                .err()
                .unwrap();
            match &err {
                SegmentError::DiskCapacityDiffers {
                    found, asked: a, ..
                } => assert_eq!((*found, *a), (CAP, asked)),
                other => panic!("{asked}: expected DiskCapacityDiffers, got {other}"),
            }
            let msg = err.to_string();
            let asked_value = format!("({})", crescent_proto::units::size_value(asked));
            for part in ["(64kb)", &asked_value, "--disk-segment-grace", DISK_FILE] {
                assert!(msg.contains(part), "{part:?} not in: {msg}");
            }
            assert!(
                std::fs::read(&file).unwrap() == raw,
                "{asked}: the file changed"
            );
        }
        // Asked again with its own capacity, it serves what it held.
        let (s, opened) = open_disk(dir.path(), "b", CAP);
        assert_eq!(opened, DiskOpened::Reused);
        assert_eq!(identity(&s), before);
        let mut got = [0u8; 4];
        s.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"kept");
    }

    #[test]
    fn a_second_open_of_a_live_disk_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = open_disk(dir.path(), "a", CAP);
        let err = Segment::disk(dir.path(), "a", CAP, OtherCapacity::Refuse)
            .err()
            .unwrap();
        assert!(matches!(err, SegmentError::DiskInUse { .. }), "{err}");
        assert!(err.to_string().contains(DISK_FILE), "{err}");
        // Even with another capacity: nothing is reformatted under it.
        let err = Segment::disk(dir.path(), "a", 2 * CAP, OtherCapacity::Reformat)
            .err()
            .unwrap();
        assert!(matches!(err, SegmentError::DiskInUse { .. }), "{err}");
        let id = identity(&s);
        drop(s);
        let (s, opened) = open_disk(dir.path(), "a", CAP);
        assert_eq!(opened, DiskOpened::Reused);
        assert_eq!(identity(&s), id);
    }

    #[test]
    fn bad_directories_sizes_and_names_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("a-file");
        std::fs::write(&plain, b"x").unwrap();
        let under_a_file = plain.join("disk");
        let err = Segment::disk(&under_a_file, "a", CAP, OtherCapacity::Refuse)
            .err()
            .unwrap();
        assert!(matches!(err, SegmentError::DiskIo { .. }), "{err}");
        assert!(err.to_string().contains("a-file"), "{err}");
        for bad in [0, DISK_BLOCK + 1, u64::MAX - DISK_BLOCK + 1] {
            let err = Segment::disk(dir.path(), "a", bad, OtherCapacity::Refuse)
                .err()
                .unwrap();
            assert!(matches!(err, SegmentError::BadSize { .. }), "{bad}: {err}");
        }
        let long = "n".repeat(MAX_NAME_LEN + 1);
        let err = Segment::disk(dir.path(), &long, CAP, OtherCapacity::Refuse)
            .err()
            .unwrap();
        assert!(matches!(err, SegmentError::DiskName { .. }), "{err}");
        // More than the filesystem holds: refused before anything is written.
        let err = Segment::disk(dir.path(), "a", 1 << 60, OtherCapacity::Refuse)
            .err()
            .unwrap();
        assert!(matches!(err, SegmentError::DiskFull { .. }), "{err}");
        let len = std::fs::metadata(dir.path().join(DISK_FILE)).unwrap().len();
        assert_eq!(len, 0, "a failed format keeps no space");
    }

    #[test]
    fn out_of_range_disk_reads_and_writes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = open_disk(dir.path(), "a", CAP);
        let mut buf = [0u8; 4];
        for offset in [CAP - 3, CAP, u64::MAX, u64::MAX - 2, u64::MAX - HEADER_LEN] {
            let read = s.read_at(offset, &mut buf);
            assert!(
                matches!(read, Err(SegmentError::OutOfRange { .. })),
                "{offset}"
            );
            let write = s.write_at(offset, &buf);
            assert!(
                matches!(write, Err(SegmentError::OutOfRange { .. })),
                "{offset}"
            );
        }
        // The file did not grow.
        let len = std::fs::metadata(dir.path().join(DISK_FILE)).unwrap().len();
        assert_eq!(len, HEADER_LEN + CAP);
        // The last bytes are in range.
        s.write_at(CAP - 4, b"edge").unwrap();
        s.read_at(CAP - 4, &mut buf).unwrap();
        assert_eq!(&buf, b"edge");
    }

    #[test]
    fn a_same_host_reader_reads_the_segments_bytes_and_refuses_another_file() {
        let dir = tempfile::tempdir().unwrap();
        // A value larger than one of the reader's pieces, at a non-zero offset.
        let cap = 128 * DISK_BLOCK;
        let (s, _) = open_disk(dir.path(), "store-a-disk", cap);
        let value: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let at = DISK_BLOCK;
        s.write_at(at, &value).unwrap();
        let path = dir.path().join(DISK_FILE);

        let disk_id = identity(&s).disk_id;
        let r = DiskFileReader::open(&path, "store-a-disk", &disk_id).unwrap();
        assert_eq!(r.disk_id(), disk_id);
        let mut got = vec![0u8; value.len()];
        let crc = r.read_with_crc(at, &mut got).unwrap();
        assert_eq!(got, value);
        assert_eq!(crc, crc32c::crc32c(&value));
        // No disk id named (masters from before it): the header's is read.
        let unnamed = DiskFileReader::open(&path, "store-a-disk", "").unwrap();
        assert_eq!(unnamed.disk_id(), disk_id);
        // Out of range, however it overflows: refused, nothing read.
        let mut buf = [0u8; 4];
        for offset in [cap - 3, cap, u64::MAX, u64::MAX - 2] {
            let e = r.read_with_crc(offset, &mut buf).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{offset}");
        }
        // Another segment's file, or not a segment at all, is refused.
        let e = DiskFileReader::open(&path, "store-b-disk", "")
            .err()
            .unwrap();
        assert!(e.to_string().contains("not \"store-b-disk\""), "{e}");
        let other_id = "0123456789abcdef0123456789abcdef";
        let e = DiskFileReader::open(&path, "store-a-disk", other_id)
            .err()
            .unwrap();
        assert!(e.to_string().contains("formatted anew"), "{e}");
        let other = dir.path().join("not-a-segment");
        std::fs::write(&other, vec![7u8; 2 * HEADER_LEN as usize]).unwrap();
        let e = DiskFileReader::open(&other, "store-a-disk", "")
            .err()
            .unwrap();
        assert!(e.to_string().contains("magic"), "{e}");
        assert!(DiskFileReader::open(&dir.path().join("missing"), "x", "").is_err());
        // A file cut short while the store was down is refused too.
        drop(s);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(HEADER_LEN + cap / 2).unwrap();
        let e = DiskFileReader::open(&path, "store-a-disk", "")
            .err()
            .unwrap();
        assert!(e.to_string().contains("expected for its capacity"), "{e}");
    }

    #[test]
    fn a_same_host_reader_reads_nothing_of_a_file_formatted_anew_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let cap = 16 * DISK_BLOCK;
        let (s, _) = open_disk(dir.path(), "store-a-disk", cap);
        s.write_at(0, b"old bytes").unwrap();
        let path = dir.path().join(DISK_FILE);
        let r = DiskFileReader::open(&path, "store-a-disk", &identity(&s).disk_id).unwrap();
        // The store restarts asking for another size and a reformat: the
        // file it holds open is formatted anew in place, and the new store
        // writes at the same offset. The range is still inside the file, so
        // only the header tells the reader its bytes are another formatting's.
        drop(s);
        let (s, opened) =
            Segment::disk(dir.path(), "store-a-disk", 2 * cap, OtherCapacity::Reformat).unwrap();
        assert!(
            matches!(opened, DiskOpened::Reformatted { .. }),
            "{opened:?}"
        );
        s.write_at(0, b"new bytes").unwrap();
        let mut buf = [0u8; 9];
        let e = r.read_with_crc(0, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("formatted anew"), "{e}");
        // Opened again for the new formatting, it reads the new bytes.
        let r = DiskFileReader::open(&path, "store-a-disk", &identity(&s).disk_id).unwrap();
        r.read_with_crc(0, &mut buf).unwrap();
        assert_eq!(&buf, b"new bytes");
    }
}
