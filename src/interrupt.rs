//! Ctrl-C, SIGTERM and every other catchable signal that would end gpuloop: a flag every
//! wait checks, so nothing blocks past an interrupt and the jobs are stopped on the way out.

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Every interrupt ever received; `clear()` does not reset it.
static COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: std::ffi::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    SIGNAL.store(sig, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// "Interrupted since this was made": a stop that an interrupt started (a job stopped on
/// Ctrl-C) is cut short only by the next one.
pub(crate) struct After(u32);

impl After {
    pub(crate) fn now() -> After {
        After(COUNT.load(Ordering::SeqCst))
    }

    /// An interrupt came since this was made.
    pub(crate) fn came(&self) -> bool {
        COUNT.load(Ordering::SeqCst) > self.0
    }
}

impl crate::process::kill::Interrupt for After {
    fn is_set(&self) -> bool {
        self.came()
    }
}

/// The signals whose default action ends the process and that arrive from outside (a hangup,
/// a `kill`, a timer): each must first stop the jobs, so each is caught. SIGPIPE is not
/// here: the Rust runtime ignores it, so a closed pipe is an error where it is written.
/// Faults (SEGV, BUS, ILL, FPE, ABRT) cannot be handled safely; SIGKILL and SIGSTOP cannot
/// be caught: `runner::supervise`'s guard process covers those deaths.
pub(crate) const TERMINATING: &[Signal] = &[
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGTERM,
    Signal::SIGSTKFLT,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGIO,
    Signal::SIGPWR,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
];

/// Installs the handlers for every signal of `TERMINATING` and the real-time signals
/// (idempotent).
pub(crate) fn install() {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for &sig in TERMINATING {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, &action) };
    }
    // Real-time signals end a process by default too; nix's `Signal` has no value for them
    // and rustix has no sigaction, so these few calls are raw libc.
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in libc::SIGRTMIN()..=libc::SIGRTMAX() {
        // SAFETY: a zeroed sigaction with a handler that only stores to atomics; the C
        // library may reserve some of these numbers, which then fail harmlessly.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The flag set by the handlers.
pub(crate) fn flag() -> &'static AtomicBool {
    &INTERRUPTED
}

pub(crate) fn is_set() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// True if the interrupt was a signal other than Ctrl-C (SIGTERM, a hangup, …): someone
/// asked gpuloop to stop, not to cancel one call.
pub(crate) fn terminated() -> bool {
    let sig = SIGNAL.load(Ordering::Relaxed);
    sig != 0 && sig != Signal::SIGINT as i32
}

/// Clears the flag (the REPL does after cancelling one call).
pub(crate) fn clear() {
    INTERRUPTED.store(false, Ordering::SeqCst);
    SIGNAL.store(0, Ordering::SeqCst);
}
