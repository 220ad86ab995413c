//! How many bytes gpuloop has allocated: the global allocator counts them, so a script's
//! memory limit (`--limit memory=N`) is one load of a number between the script's steps.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes in use. The binary installs it
/// (`#[global_allocator]`); where it is not installed (unit tests), `in_use()` reads 0.
pub struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// Keeps freed memory for reuse instead of handing it back to the kernel at once. glibc
/// trims a thread's heap as soon as 128 KiB at its top are free: a script calling gpu()
/// over 64 hosts in a loop then faulted the same pages in and gave them back on every call
/// (measured: about a fifth of the script thread's time). Freed memory beyond `KEEP` still
/// goes back, and blocks over `OWN_MAP` still get mappings of their own (setting one
/// threshold stops glibc from raising the other as it goes).
pub fn keep_freed_memory() {
    const KEEP: libc::c_int = 64 << 20;
    const OWN_MAP: libc::c_int = 4 << 20;
    // SAFETY: mallopt only sets tuning parameters of the allocator; it is called before
    // any other thread starts.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP);
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAP);
    }
}

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
