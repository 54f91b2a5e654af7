//! Why a segment (memory or disk) could not be made, opened or used. Its own
//! module so that the disk file's code and the segment's share it without
//! importing each other.

use std::path::PathBuf;

use crescent_proto::units::size_value;

#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment size must be a positive multiple of the page size ({page}), got {size}")]
    BadSize { size: u64, page: u64 },
    #[error("cannot map {size} bytes: {source}")]
    Map { size: u64, source: std::io::Error },
    #[error("cannot create shared-memory file {path}: {source}")]
    ShmFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("range [{offset}, +{len}) is outside the {size}-byte segment")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("the write grant expired before this piece arrived; nothing more is written")]
    GrantExpired,
    #[error("the segment is on disk ({path}): its bytes have no address in memory")]
    NotInMemory { path: PathBuf },
    #[error("cannot {op} disk segment {path}: {source}")]
    DiskIo {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "disk segment {path} is in use by another live store (it holds the file's lock); \
         give each store its own directory"
    )]
    DiskInUse { path: PathBuf },
    #[error("no room for disk segment {path} ({needed} bytes): {source}")]
    DiskFull {
        path: PathBuf,
        needed: u64,
        source: std::io::Error,
    },
    #[error(
        "disk segment {path} was formatted for {found} bytes ({}), but {asked} ({}) were \
         asked for: it is left as it is, with its objects, and not opened. Opened with its own \
         size ({0}) within the masters' --disk-segment-grace (default 1h) of its last store \
         stopping, it serves them again; formatted anew at {1}, it discards them",
        size_value(*.found),
        size_value(*.asked)
    )]
    DiskCapacityDiffers {
        path: PathBuf,
        found: u64,
        asked: u64,
    },
    #[error("a disk segment's name is at most {max} bytes, got {len}")]
    DiskName { len: usize, max: usize },
    #[error(
        "cannot allocate the {size}-byte segment's pages up front: {source} \
         (too little memory, or too little room in the shared-memory directory? \
         --prefault=false defers allocation to first use)"
    )]
    Prefault { size: u64, source: std::io::Error },
}
