//! Script functions, grouped by domain; each converts values and calls into `machine`.

pub(crate) mod gpu;
pub(crate) mod helpers;
pub(crate) mod process;
pub(crate) mod runner;

use super::convert::{script_err, RhaiResult};
use super::errors::INTERRUPT_TOKEN;
use rhai::{Dynamic, EvalAltResult, Position};
use std::time::{Duration, Instant};

/// The error that unwinds a script when Ctrl-C was pressed.
pub(crate) fn interrupted() -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorTerminated(
        Dynamic::from(INTERRUPT_TOKEN),
        Position::NONE,
    ))
}

/// Sleeps, waking early (with an error) on Ctrl-C.
pub(crate) fn sleep(d: Duration) -> RhaiResult<()> {
    let end = Instant::now() + d;
    loop {
        if crate::interrupt::is_set() {
            return Err(interrupted());
        }
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

pub(crate) fn not_negative(v: i64, what: &str) -> RhaiResult<i64> {
    if v < 0 {
        return Err(script_err(format!("{what} must not be negative, got {v}")));
    }
    Ok(v)
}
