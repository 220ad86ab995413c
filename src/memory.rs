//! How many bytes gpuloop has allocated: the global allocator counts them, so a script's
//! memory limit (`--limit memory=N`) is one load of a number between the script's steps.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting the bytes in use. The binary installs it
/// (`#[global_allocator]`); where it is not installed (unit tests), `in_use()` reads 0.
pub struct Counting;

/// The threads' counts added up (signed: one thread's frees can be passed on before the
/// allocations another thread still holds back).
static IN_USE: AtomicIsize = AtomicIsize::new(0);

/// Keeps freed memory for reuse instead of handing it back to the kernel at once. glibc
/// trims a thread's heap as soon as 128 KiB at its top are free: a script calling gpu()
/// over 64 hosts in a loop then faulted the same pages in and gave them back on every call
/// (measured: about a fifth of the script thread's time). Freed memory beyond `KEEP` still
/// goes back, and blocks over `OWN_MAP` still get mappings of their own (setting one
/// threshold stops glibc from raising the other as it goes).
pub fn keep_freed_memory() {
    const KEEP: libc::c_int = 64 << 20;
    const OWN_MAP: libc::c_int = 4 << 20;
    // mallopt is glibc's own, wrapped by neither nix nor rustix: raw libc.
    // SAFETY: mallopt only sets tuning parameters of the allocator; it is called before
    // any other thread starts.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP);
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAP);
    }
}

/// Bytes allocated and not yet freed, in the whole process: exact to within `BATCH` per
/// running thread (each thread adds up its own and passes the sum on in batches, and all of
/// it when it ends).
pub(crate) fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed).max(0) as usize
}

/// How far a thread's own count may run before it is added to the process's. One counter
/// that every allocation of every thread updated was one cache line fought over by all
/// cores: a gpu() over 64 hosts (maps built on four threads while the script thread frees
/// the last call's) took 1.37 ms with it and 1.16 ms without, on 16 cores.
const BATCH: isize = 256 << 10;

/// A thread's allocations not yet added to `IN_USE` (negative: frees); the rest is added
/// when the thread ends.
struct Pending(Cell<isize>);

impl Drop for Pending {
    fn drop(&mut self) {
        IN_USE.fetch_add(self.0.get(), Ordering::Relaxed);
    }
}

thread_local! {
    // Const-initialised: reading it never allocates. Its destructor is registered with
    // glibc's own calloc, not through this allocator.
    static PENDING: Pending = const { Pending(Cell::new(0)) };
}

/// Counts `delta` bytes (negative: freed) for this thread.
pub fn count(delta: isize) {
    let batched = PENDING.try_with(|p| {
        let d = p.0.get() + delta;
        if d.abs() < BATCH {
            p.0.set(d);
        } else {
            p.0.set(0);
            IN_USE.fetch_add(d, Ordering::Relaxed);
        }
    });
    // Once the thread's count has been passed on (the thread is ending), directly.
    if batched.is_err() {
        IN_USE.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every call is System's, with the same arguments; the counter only watches.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    /// What a thread counted and held back is added when it ends: nothing is lost to the
    /// batching. (Unit tests do not install the allocator, so only this test counts.)
    #[test]
    fn a_thread_passes_on_what_it_held_back_when_it_ends() {
        let before = super::in_use();
        std::thread::spawn(|| {
            super::count(100_000);
            super::count(-1_000);
        })
        .join()
        .expect("thread");
        assert_eq!(super::in_use(), before + 99_000);
        std::thread::spawn(|| super::count(-99_000))
            .join()
            .expect("thread");
        assert_eq!(super::in_use(), before);
    }
}
