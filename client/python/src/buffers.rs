//! Caller and package memory the raw-pointer calls use: bytes the package
//! hands to Python (`BufferHandle`), the registry of caller buffers every
//! pointer must fall inside (`Registered`), and copying between ranges.

use super::*;

/// Bytes the package owns, handed to Python through the buffer protocol
/// (`memoryview(handle)`, `torch.frombuffer(handle)`): writable like
/// Mooncake's, so the allocation is raw rather than a Rust `Vec` behind `&`.
pub(crate) struct OwnedBytes {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: the allocation is owned uniquely and never reallocated; Python
// code writing through exported views is the caller's own synchronisation.
unsafe impl Send for OwnedBytes {}
unsafe impl Sync for OwnedBytes {}

impl OwnedBytes {
    pub(crate) fn new(v: Vec<u8>) -> Self {
        let b = v.into_boxed_slice();
        let len = b.len();
        OwnedBytes {
            ptr: Box::into_raw(b) as *mut u8,
            len,
        }
    }
}

impl Drop for OwnedBytes {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from Box::into_raw of a boxed slice of len.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.len,
            )))
        };
    }
}

/// An object's bytes fetched by `get_buffer`/`batch_get_buffer`.
#[pyclass(module = "crescent._native")]
pub(crate) struct BufferHandle {
    pub(crate) bytes: OwnedBytes,
}

impl BufferHandle {
    /// A handle on a fetched object; None for no bytes (Mooncake's "None").
    pub(crate) fn of(v: Vec<u8>) -> Option<Self> {
        (!v.is_empty()).then(|| BufferHandle {
            bytes: OwnedBytes::new(v),
        })
    }
}

#[pymethods]
impl BufferHandle {
    fn ptr(&self) -> usize {
        self.bytes.ptr as usize
    }
    fn size(&self) -> usize {
        self.bytes.len
    }
    fn __len__(&self) -> usize {
        self.bytes.len
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = {
            let h = slf.borrow();
            (h.bytes.ptr, h.bytes.len)
        };
        // SAFETY: view comes from the interpreter; the bytes live as long as
        // the handle, which the view keeps alive through its `obj` reference.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr as *mut c_void,
                len as isize,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}

/// A registered caller buffer.
#[derive(Clone, Copy)]
pub(crate) struct Region {
    pub(crate) len: usize,
    /// Reads from the store land here only if the whole range is writable.
    pub(crate) writable: bool,
}

/// What a raw-pointer call does with caller memory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// A put reads the range.
    Read,
    /// A get writes into it.
    Write,
}

/// Caller memory that raw-pointer calls may use: address → region.
#[derive(Default)]
pub(crate) struct Registered(pub(crate) BTreeMap<usize, Region>);

/// SAFETY (of the unsafe blocks that turn a covered range into a slice):
/// the caller registered the range with `register_buffer`, which checked in
/// the kernel's map that all of it is readable (and, for gets, writable);
/// like Mooncake, the package trusts the caller not to unmap it while in use.
impl Registered {
    /// Whether `[ptr, ptr + size)` is non-empty and lies inside one
    /// registered buffer that allows `access`.
    pub(crate) fn covers(&self, ptr: usize, size: usize, access: Access) -> bool {
        let Some(end) = ptr.checked_add(size).filter(|_| size > 0) else {
            return false;
        };
        match self.0.range(..=ptr).next_back() {
            Some((&start, r)) => {
                start.checked_add(r.len).is_some_and(|e| end <= e)
                    && (access == Access::Read || r.writable)
            }
            None => false,
        }
    }

    /// Whether there is at least one range and every one is covered.
    pub(crate) fn covers_all(&self, ranges: &[(usize, usize)], access: Access) -> bool {
        !ranges.is_empty() && ranges.iter().all(|&(p, s)| self.covers(p, s, access))
    }
}

/// How this process may use `[ptr, ptr + size)`, from `/proc/self/maps`:
/// None when part of it is unmapped or unreadable (a hole, a device pointer),
/// else whether all of it is writable. Reading the kernel's map rather than
/// touching the memory means a bad range is refused, never faulted on.
pub(crate) fn mapped_access(maps: &str, ptr: usize, size: usize) -> Option<bool> {
    let end = ptr.checked_add(size)?;
    let mut regions: Vec<(usize, usize, bool, bool)> = maps
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (lo, hi) = parts.next()?.split_once('-')?;
            let perms = parts.next()?.as_bytes();
            Some((
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
                perms.first() == Some(&b'r'),
                perms.get(1) == Some(&b'w'),
            ))
        })
        .collect();
    regions.sort_unstable();
    let mut at = ptr;
    let mut writable = true;
    for (lo, hi, r, w) in regions {
        if hi <= at {
            continue;
        }
        if lo > at || !r {
            return None;
        }
        writable &= w;
        at = hi;
        if at >= end {
            return Some(writable);
        }
    }
    None
}

/// Whether any two ranges overlap (reads into them must not alias).
pub(crate) fn any_overlap(ranges: &[(usize, usize)]) -> bool {
    let mut sorted: Vec<(usize, usize)> = ranges.to_vec();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .any(|w| w[0].0.saturating_add(w[0].1) > w[1].0)
}

/// The bytes behind a buffer object, valid while `b` lives.
pub(crate) fn buffer_slice(b: &PyUntypedBuffer) -> &[u8] {
    if b.len_bytes() == 0 {
        return &[];
    }
    // SAFETY: a C-contiguous buffer of len_bytes at buf_ptr, kept alive and
    // unmoved by the held Py_buffer.
    unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u8, b.len_bytes()) }
}

/// One range per key; None when there are not as many sizes as pointers.
pub(crate) fn one_range_each(ptrs: &[usize], sizes: &[usize]) -> Option<Vec<Vec<(usize, usize)>>> {
    (ptrs.len() == sizes.len()).then(|| {
        ptrs.iter()
            .zip(sizes)
            .map(|(&p, &s)| vec![(p, s)])
            .collect()
    })
}

/// Pairs each key's pointers with its sizes; None when the shapes differ.
pub(crate) fn zip_ranges(
    ptrs: &[Vec<usize>],
    sizes: &[Vec<usize>],
) -> Option<Vec<Vec<(usize, usize)>>> {
    if ptrs.len() != sizes.len() {
        return None;
    }
    ptrs.iter()
        .zip(sizes)
        .map(|(p, s)| {
            (p.len() == s.len()).then(|| p.iter().copied().zip(s.iter().copied()).collect())
        })
        .collect()
}

/// Copies `v` into the ranges in order; the byte count, or INVALID_PARAMS
/// when they are too small (nothing is written then).
pub(crate) fn scatter(v: &[u8], ranges: &[(usize, usize)]) -> i64 {
    let room: usize = ranges.iter().map(|r| r.1).sum();
    if room < v.len() {
        return mooncake::INVALID_PARAMS.into();
    }
    let mut rest = v;
    for &(p, s) in ranges {
        let n = s.min(rest.len());
        // SAFETY: covered (see `Registered`).
        unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), p as *mut u8, n) };
        rest = &rest[n..];
    }
    v.len() as i64
}
