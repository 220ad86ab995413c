//! How many bytes gpuloop has allocated: the global allocator counts them, so a script's
//! memory limit (`--limit memory=N`) is one load of a number between the script's steps.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes in use. The binary installs it
/// (`#[global_allocator]`); where it is not installed (unit tests), `in_use()` reads 0.
pub struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated and not yet freed, in the whole process.
pub fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

// SAFETY: every call is System's, with the same arguments; the counter only watches.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                IN_USE.fetch_add(new_size - layout.size(), Ordering::Relaxed);
            } else {
                IN_USE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}
