//! Milliseconds since gpuloop's `main` began: `-v`'s account of where a one-shot's time goes.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Instant> = OnceLock::new();

/// Marks the start; called first thing in `main` (later calls change nothing).
pub(crate) fn start() {
    START.get_or_init(Instant::now);
}

/// Milliseconds since `start` (since the first call, if `start` was never called).
pub(crate) fn ms() -> f64 {
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}
