//! A disk that fails on demand, for [`FaultKind::FailingDisk`]: a FUSE
//! filesystem that passes one directory through (a store's disk-tier
//! directory) and, while switched to failing, answers every read, write,
//! sync and allocation with EIO, as a dying drive does. Files are opened
//! with direct I/O, so no read is served from the page cache around it.
//!
//! It serves from a thread of the chaos process (`fuser`, pure Rust, no
//! libfuse) and is unmounted when dropped. Mounting needs /dev/fuse and
//! root (or fusermount3); where it cannot mount, the store gets the plain
//! directory and the fault is not run.
//!
//! [`FaultKind::FailingDisk`]: crate::schedule::FaultKind::FailingDisk

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    consts::FOPEN_DIRECT_IO, FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, FUSE_ROOT_ID,
};

/// Attributes are never cached by the kernel: a file's size changes under
/// it (the store allocates and truncates).
const NO_CACHE: Duration = Duration::ZERO;
/// Bounds the tables of a directory the chaos suite controls (one store's
/// disk directory holds one file).
const MAX_INODES: usize = 4096;
const MAX_OPEN_FILES: usize = 4096;

/// A mounted failing-on-demand directory.
pub struct FaultyDisk {
    failing: Arc<AtomicBool>,
    mountpoint: PathBuf,
    _session: fuser::BackgroundSession,
}

impl FaultyDisk {
    /// Mounts `backing` at `mountpoint` (created if missing), not failing.
    pub fn mount(backing: &Path, mountpoint: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(backing)?;
        std::fs::create_dir_all(mountpoint)?;
        let failing = Arc::new(AtomicBool::new(false));
        let fs = Passthrough::new(backing.to_path_buf(), failing.clone());
        let options = [
            MountOption::FSName("crescent-chaos-disk".into()),
            MountOption::DefaultPermissions,
        ];
        let session = fuser::spawn_mount2(fs, mountpoint, &options)?;
        Ok(Self {
            failing,
            mountpoint: mountpoint.to_path_buf(),
            _session: session,
        })
    }

    /// Where the store is pointed.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// From now on every data operation fails with EIO (`true`), or
    /// passes through again (`false`).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

/// The filesystem: inode numbers for the paths looked up, and open files.
struct Passthrough {
    failing: Arc<AtomicBool>,
    /// Inode → path under the backing directory (root: the directory).
    paths: HashMap<u64, PathBuf>,
    inodes: HashMap<PathBuf, u64>,
    next_inode: u64,
    files: HashMap<u64, File>,
    next_handle: u64,
}

impl Passthrough {
    fn new(backing: PathBuf, failing: Arc<AtomicBool>) -> Self {
        let mut fs = Self {
            failing,
            paths: HashMap::new(),
            inodes: HashMap::new(),
            next_inode: FUSE_ROOT_ID + 1,
            files: HashMap::new(),
            next_handle: 1,
        };
        fs.paths.insert(FUSE_ROOT_ID, backing.clone());
        fs.inodes.insert(backing, FUSE_ROOT_ID);
        fs
    }

    fn failing(&self) -> bool {
        self.failing.load(Ordering::SeqCst)
    }

    fn inode_of(&mut self, path: PathBuf) -> Result<u64, i32> {
        if let Some(ino) = self.inodes.get(&path) {
            return Ok(*ino);
        }
        if self.paths.len() >= MAX_INODES {
            return Err(libc::ENFILE);
        }
        let ino = self.next_inode;
        self.next_inode += 1;
        self.paths.insert(ino, path.clone());
        self.inodes.insert(path, ino);
        Ok(ino)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, i32> {
        let dir = self.paths.get(&parent).ok_or(libc::ENOENT)?;
        let name = Path::new(name);
        // One component, never `..`: nothing outside the backing directory.
        if name.components().count() != 1 || name.file_name().is_none() {
            return Err(libc::EINVAL);
        }
        Ok(dir.join(name))
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, i32> {
        let path = self.paths.get(&ino).ok_or(libc::ENOENT)?;
        let m = std::fs::symlink_metadata(path).map_err(errno)?;
        let time = |secs: i64, nanos: i64| {
            UNIX_EPOCH + Duration::new(secs.max(0) as u64, nanos.clamp(0, 999_999_999) as u32)
        };
        Ok(FileAttr {
            ino,
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: SystemTime::UNIX_EPOCH,
            kind: if m.is_dir() {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: 0,
            blksize: m.blksize() as u32,
            flags: 0,
        })
    }

    fn keep_open(&mut self, file: File) -> Result<u64, i32> {
        if self.files.len() >= MAX_OPEN_FILES {
            return Err(libc::ENFILE);
        }
        let fh = self.next_handle;
        self.next_handle += 1;
        self.files.insert(fh, file);
        Ok(fh)
    }

    fn file(&self, fh: u64) -> Result<&File, i32> {
        if self.failing() {
            return Err(libc::EIO);
        }
        self.files.get(&fh).ok_or(libc::EBADF)
    }
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Open options for the access mode in `flags` (creation is separate).
fn open_options(flags: i32) -> OpenOptions {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    o.custom_flags(libc::O_CLOEXEC);
    o
}

impl Filesystem for Passthrough {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let found = self.child(parent, name).and_then(|path| {
            std::fs::symlink_metadata(&path).map_err(errno)?;
            let ino = self.inode_of(path)?;
            self.attr(ino)
        });
        match found {
            Ok(attr) => reply.entry(&NO_CACHE, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.attr(ino) {
            Ok(attr) => reply.attr(&NO_CACHE, &attr),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let changed = (|| {
            let path = self.paths.get(&ino).ok_or(libc::ENOENT)?.clone();
            if let Some(size) = size {
                if self.failing() {
                    return Err(libc::EIO);
                }
                match fh.and_then(|fh| self.files.get(&fh)) {
                    Some(f) => f.set_len(size).map_err(errno)?,
                    None => OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .and_then(|f| f.set_len(size))
                        .map_err(errno)?,
                }
            }
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(errno)?;
            }
            self.attr(ino)
        })();
        match changed {
            Ok(attr) => reply.attr(&NO_CACHE, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.child(parent, name).and_then(|path| {
            std::fs::create_dir(&path).map_err(errno)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
                .map_err(errno)?;
            let ino = self.inode_of(path)?;
            self.attr(ino)
        });
        match made {
            Ok(attr) => reply.entry(&NO_CACHE, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.child(parent, name).and_then(|path| {
            std::fs::remove_file(&path).map_err(errno)?;
            if let Some(ino) = self.inodes.remove(&path) {
                self.paths.remove(&ino);
            }
            Ok(())
        });
        match removed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let opened = self
            .paths
            .get(&ino)
            .ok_or(libc::ENOENT)
            .and_then(|path| open_options(flags).open(path).map_err(errno))
            .and_then(|file| self.keep_open(file));
        match opened {
            Ok(fh) => reply.opened(fh, FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let created = self.child(parent, name).and_then(|path| {
            let file = open_options(flags)
                .create(true)
                .mode(mode & 0o7777)
                .open(&path)
                .map_err(errno)?;
            let ino = self.inode_of(path)?;
            let attr = self.attr(ino)?;
            Ok((attr, self.keep_open(file)?))
        });
        match created {
            Ok((attr, fh)) => reply.created(&NO_CACHE, &attr, 0, fh, FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let read = self.file(fh).and_then(|f| {
            let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
            let mut buf = vec![0u8; size as usize];
            let mut filled = 0;
            while filled < buf.len() {
                match f.read_at(&mut buf[filled..], offset + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(errno(e)),
                }
            }
            buf.truncate(filled);
            Ok(buf)
        });
        match read {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let written = self.file(fh).and_then(|f| {
            let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
            f.write_all_at(data, offset).map_err(errno)?;
            u32::try_from(data.len()).map_err(|_| libc::EINVAL)
        });
        match written {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.remove(&fh);
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, datasync: bool, reply: ReplyEmpty) {
        let synced = self.file(fh).and_then(|f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
            .map_err(errno)
        });
        match synced {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let allocated = self.file(fh).and_then(|f| {
            // SAFETY: a plain syscall on a descriptor this table keeps open.
            let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset, length) };
            if rc == 0 {
                Ok(())
            } else {
                Err(errno(std::io::Error::last_os_error()))
            }
        });
        match allocated {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let Some(dir) = self.paths.get(&ino).cloned() else {
            return reply.error(libc::ENOENT);
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(e)),
        };
        let listed = [
            (ino, FileType::Directory, ".".into()),
            (ino, FileType::Directory, "..".into()),
        ]
        .into_iter()
        .chain(entries.filter_map(Result::ok).filter_map(|e| {
            let kind = if e.file_type().ok()?.is_dir() {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            let ino = self.inode_of(e.path()).ok()?;
            Some((ino, kind, e.file_name()))
        }))
        .collect::<Vec<(u64, FileType, std::ffi::OsString)>>();
        for (i, (ino, kind, name)) in listed.into_iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(ino, i as i64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.failing() {
            return reply.error(libc::EIO);
        }
        let synced = self
            .paths
            .get(&ino)
            .ok_or(libc::ENOENT)
            .and_then(|dir| File::open(dir).and_then(|d| d.sync_all()).map_err(errno));
        match synced {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let Some(root) = self.paths.get(&FUSE_ROOT_ID) else {
            return reply.error(libc::ENOENT);
        };
        let Ok(c) = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()) else {
            return reply.error(libc::EINVAL);
        };
        // SAFETY: an all-zero statvfs is valid; statvfs only writes into it.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid C string, `st` a valid pointer.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return reply.error(errno(std::io::Error::last_os_error()));
        }
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            st.f_namemax as u32,
            st.f_frsize as u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mounting needs /dev/fuse and the right to mount; without them there
    /// is nothing to test here (the chaos fault says so in a run).
    fn mounted() -> Option<(tempfile::TempDir, FaultyDisk)> {
        let dir = tempfile::tempdir().unwrap();
        match FaultyDisk::mount(&dir.path().join("backing"), &dir.path().join("mnt")) {
            Ok(disk) => Some((dir, disk)),
            Err(e) => {
                eprintln!("SKIPPED: cannot mount a FUSE filesystem here: {e}");
                None
            }
        }
    }

    #[test]
    fn it_passes_through_then_fails_every_data_operation_on_demand() {
        let Some((dir, disk)) = mounted() else { return };
        let path = disk.path().join("seg");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        f.write_all_at(b"hello", 4096).unwrap();
        f.sync_data().unwrap();
        let mut got = [0u8; 5];
        f.read_exact_at(&mut got, 4096).unwrap();
        assert_eq!(&got, b"hello");
        assert_eq!(
            std::fs::read(dir.path().join("backing/seg")).unwrap()[4096..],
            *b"hello",
            "the bytes are in the backing directory"
        );

        disk.set_failing(true);
        let eio = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
        assert_eq!(eio(f.write_all_at(b"x", 0)), Some(libc::EIO));
        assert_eq!(eio(f.read_exact_at(&mut got, 4096)), Some(libc::EIO));
        assert_eq!(eio(f.sync_data()), Some(libc::EIO));

        disk.set_failing(false);
        f.read_exact_at(&mut got, 4096).unwrap();
        assert_eq!(&got, b"hello", "readable again once healed");
    }
}
