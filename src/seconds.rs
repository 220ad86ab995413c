//! Seconds as a person writes them (a timeout, a grace, a settle time) turned into a `Duration`,
//! bounded, for every room that takes them: one rule and one message everywhere.

use std::time::Duration;

/// The most seconds a timeout, grace or settle time may be (about 31 years): anything
/// longer, or infinite, is a typo, and `Duration` would panic on some of it.
pub(crate) const MAX_SECS: f64 = 1e9;

/// `v` seconds as a `Duration`, or why it is not one, e.g. "inf is not a number of seconds:
/// it must be finite, from 0 to 1e9 (about 31 years)".
pub(crate) fn seconds(v: f64) -> Result<Duration, BadSeconds> {
    if (0.0..=MAX_SECS).contains(&v) {
        return Ok(Duration::from_secs_f64(v));
    }
    Err(BadSeconds {
        given: v,
        or_inf: false,
    })
}

/// A number that is no number of seconds here: negative, not finite, or past `MAX_SECS`.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("{}", self.said())]
pub(crate) struct BadSeconds {
    pub given: f64,
    /// Where infinity means "never" (a grace), which the message then offers.
    pub or_inf: bool,
}

impl BadSeconds {
    fn said(&self) -> String {
        let v = self.given;
        let shown = if v.is_finite() && v.abs() >= 1e15 {
            format!("{v:e}")
        } else {
            format!("{v}")
        };
        let inf = match self.or_inf {
            true => ", or inf to never send KILL",
            false => "",
        };
        format!(
            "{shown} is not a number of seconds: it must be finite, from 0 to {MAX_SECS:e} (about 31 years){inf}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is wrong is the number itself; a grace's message offers `inf` as well.
    #[test]
    fn bad_seconds_keep_the_number_and_say_it_as_always() {
        let e = seconds(-1.0).unwrap_err();
        assert_eq!(e.given, -1.0);
        assert_eq!(
            e.to_string(),
            "-1 is not a number of seconds: it must be finite, from 0 to 1e9 (about 31 years)"
        );
        assert!(seconds(f64::NAN).is_err() && seconds(2e9).is_err());
        assert_eq!(seconds(1.5), Ok(Duration::from_millis(1500)));
        let grace = crate::process::kill::grace_seconds(1e20).unwrap_err();
        assert!(grace.or_inf, "{grace}");
        assert!(
            grace
                .to_string()
                .starts_with("1e20 is not a number of seconds")
                && grace.to_string().ends_with(", or inf to never send KILL"),
            "{grace}"
        );
    }
}
