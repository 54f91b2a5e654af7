//! Page-aligned, zeroed host memory handed to Python as raw addresses: the
//! `MooncakeHostMemAllocator`'s blocks and a dummy client's memory pool.
//!
//! Owns the allocations and their layouts; it must not register them with a
//! store (the caller does, as with Mooncake).

use std::alloc::Layout;
use std::collections::HashMap;

const PAGE: usize = 4096;

#[derive(Default)]
pub struct HostBlocks {
    blocks: HashMap<usize, Layout>,
    used: usize,
}

impl HostBlocks {
    /// The address of `size` zeroed bytes, page-aligned.
    pub fn alloc(&mut self, size: usize) -> Result<usize, String> {
        let layout = Layout::from_size_align(size.max(1), PAGE)
            .map_err(|e| format!("cannot allocate {size} bytes: {e}"))?;
        // SAFETY: layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(format!("cannot allocate {size} bytes"));
        }
        self.blocks.insert(p as usize, layout);
        self.used += layout.size();
        Ok(p as usize)
    }

    /// Frees an address from `alloc`; false for any other.
    pub fn free(&mut self, ptr: usize) -> bool {
        match self.blocks.remove(&ptr) {
            Some(layout) => {
                // SAFETY: ptr was returned by alloc_zeroed with this layout.
                unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
                self.used -= layout.size();
                true
            }
            None => false,
        }
    }

    /// Bytes allocated and not freed.
    pub fn used(&self) -> usize {
        self.used
    }

    pub fn free_all(&mut self) {
        for (ptr, layout) in self.blocks.drain() {
            // SAFETY: ptr was returned by alloc_zeroed with this layout.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
        self.used = 0;
    }
}

/// A dummy client's memory pool (`setup_dummy`'s `mem_pool_size`), which
/// `alloc_from_mem_pool` hands out. Blocks live as long as the store object:
/// a call on another thread may still be moving bytes through one while
/// `close` runs, so only `Drop` frees them.
#[derive(Default)]
pub struct MemPool {
    /// 0 until `setup_dummy` succeeds: a client with a segment of its own
    /// has no pool, and answers 0 as Mooncake's does.
    capacity: usize,
    blocks: HostBlocks,
}

impl MemPool {
    /// Blocks handed out before (by an earlier setup) count against it.
    pub fn open(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// An address of `size` bytes, or 0 when there is no pool or no room.
    pub fn alloc(&mut self, size: usize) -> usize {
        let fits = self
            .blocks
            .used()
            .checked_add(size.max(1).next_multiple_of(PAGE))
            .is_some_and(|total| total <= self.capacity);
        if !fits {
            if self.capacity > 0 {
                tracing::warn!(
                    size,
                    used = self.blocks.used(),
                    capacity = self.capacity,
                    "alloc_from_mem_pool: the pool has no room"
                );
            }
            return 0;
        }
        self.blocks.alloc(size).unwrap_or_else(|e| {
            tracing::warn!("alloc_from_mem_pool: {e}");
            0
        })
    }

    /// No more allocations; the blocks stay until the pool is dropped.
    pub fn retire(&mut self) {
        self.capacity = 0;
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        self.blocks.free_all();
    }
}
