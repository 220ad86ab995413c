//! A stack overflow on the script thread ends gpuloop with a clear error and exit 1, not an abort.
//!
//! The script thread's stack is sized for values nested as deep as `--limit depth`, but some
//! nesting is not bounded by any limit: a closure that captures a closure, a million times
//! over, is built in linear time and dropped recursively (300,000 levels overflowed 80 MiB in
//! a debug build). An overflow hits the guard page below the thread's stack; Rust's own
//! handler then aborts (134). This handler, chained before Rust's, turns a fault in the script
//! thread's guard area into an error message and exit 1. Jobs are still stopped: they die
//! with gpuloop (`PR_SET_PDEATHSIG`, the guard process). Any other fault goes on to the handler
//! that was there before (Rust's, which reports other threads' overflows), or the default.
//!
//! Raw libc throughout: neither nix nor rustix has `pthread_getattr_np`, and the handler must
//! hand a fault to the previous action exactly as the C library stored it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The lowest usable address of the script thread's stack (0: not known).
static LOW: AtomicUsize = AtomicUsize::new(0);
/// The SIGSEGV and SIGBUS actions that were installed before ours.
static PREV: OnceLock<[libc::sigaction; 2]> = OnceLock::new();
/// How far below the stack's lowest address a fault still counts as its overflow: the guard
/// page, and what a large frame may skip past it.
const BELOW: usize = 1 << 20;
const SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

/// Called first thing on the script thread: records its stack's bounds, installs the handler.
pub(crate) fn watch_this_thread() {
    // SAFETY: pthread_getattr_np fills `attr` for the calling thread, which is destroyed
    // after its stack bounds are read.
    let low = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if !ok {
            return;
        }
        addr as usize
    };
    LOW.store(low, Ordering::SeqCst);
    PREV.get_or_init(|| {
        // SAFETY: a plain sigaction call with a zeroed, then filled, action; the handler only
        // makes async-signal-safe calls (write, _exit, sigaction).
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_fault as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut ours.sa_mask);
            let mut prev: [libc::sigaction; 2] = std::mem::zeroed();
            for (sig, old) in SIGNALS.iter().zip(prev.iter_mut()) {
                libc::sigaction(*sig, &ours, old);
            }
            prev
        }
    });
}

/// True if a fault at `addr` is the script thread running off its stack.
fn overflowed(addr: usize, low: usize) -> bool {
    low != 0 && addr < low.saturating_add(4096) && addr >= low.saturating_sub(BELOW)
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    if overflowed(addr, LOW.load(Ordering::SeqCst)) {
        let msg = b"gpuloop: error: the script ran out of stack: a value is nested too deep to walk or drop (arrays or maps in arrays, closures capturing closures, ...); keep nesting shallow, or raise --limit depth for a larger stack\n";
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(1);
        }
    }
    let Some(prev) = PREV.get() else { return };
    let prev = if sig == libc::SIGBUS {
        &prev[1]
    } else {
        &prev[0]
    };
    // SAFETY: the previous action is called as it was installed (with or without SA_SIGINFO);
    // for the default action, restoring it and returning re-raises the fault.
    unsafe {
        match prev.sa_sigaction {
            libc::SIG_DFL | libc::SIG_IGN => {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
            f if prev.sa_flags & libc::SA_SIGINFO != 0 => {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(f);
                f(sig, info, ctx);
            }
            f => {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(f);
                f(sig);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_faults_at_the_stack_end_are_overflows() {
        let low = 0x7000_0000;
        assert!(overflowed(low - 8, low));
        assert!(overflowed(low - 4096, low));
        assert!(!overflowed(low + (1 << 16), low));
        assert!(!overflowed(0, low));
        assert!(!overflowed(low - 8, 0));
    }
}
