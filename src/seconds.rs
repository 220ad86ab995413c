//! Seconds as a person writes them (a timeout, a grace, a settle time) turned into a `Duration`,
//! bounded, for every room that takes them: one rule and one message everywhere.

use std::time::Duration;

/// The most seconds a timeout, grace or settle time may be (about 31 years): anything
/// longer, or infinite, is a typo, and `Duration` would panic on some of it.
pub(crate) const MAX_SECS: f64 = 1e9;

/// `v` seconds as a `Duration`, or why it is not one, e.g. "inf is not a number of seconds:
/// it must be finite, from 0 to 1e9 (about 31 years)".
pub(crate) fn seconds(v: f64) -> Result<Duration, String> {
    if (0.0..=MAX_SECS).contains(&v) {
        return Ok(Duration::from_secs_f64(v));
    }
    let shown = if v.is_finite() && v.abs() >= 1e15 {
        format!("{v:e}")
    } else {
        format!("{v}")
    };
    Err(format!(
        "{shown} is not a number of seconds: it must be finite, from 0 to {MAX_SECS:e} (about 31 years)"
    ))
}
