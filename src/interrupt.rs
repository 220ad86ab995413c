//! Ctrl-C and SIGTERM: a flag every wait checks, so nothing blocks past an interrupt.

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Installs the handlers for SIGINT and SIGTERM (idempotent).
pub fn install() {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// The flag set by the handlers.
pub fn flag() -> &'static AtomicBool {
    &INTERRUPTED
}

pub fn is_set() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// True if the interrupt was SIGTERM (someone asked gpuloop to stop, not to cancel a call).
pub fn terminated() -> bool {
    SIGNAL.load(Ordering::Relaxed) == libc::SIGTERM
}

/// Clears the flag (the REPL does after cancelling one call).
pub fn clear() {
    INTERRUPTED.store(false, Ordering::SeqCst);
    SIGNAL.store(0, Ordering::SeqCst);
}
