//! UTC times as gpuloop's records write them (RFC 3339, `2026-11-30T09:41:07.123Z`): the
//! journal's records, the restarters' state, a kernel log event's time in advice. The
//! calendar is jiff's.

use jiff::Timestamp;

/// Now as "2026-11-30T09:41:07.123Z".
pub(crate) fn now() -> String {
    rfc3339(Timestamp::now())
}

/// Seconds since the epoch as "2026-11-30T09:41:07Z" (a kernel log event's time, in advice).
pub(crate) fn at(secs: f64) -> String {
    instant(secs.floor() as i64)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// `t` as "2026-11-30T09:41:07.123Z" (milliseconds, truncated): one format, so the journal's
/// times compare as text.
pub(crate) fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// The instant `secs` after the epoch, held within the years jiff knows (-9999 to 9999).
fn instant(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap_or(match secs < 0 {
        true => Timestamp::MIN,
        false => Timestamp::MAX,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(secs: i64, ms: i32) -> String {
        rfc3339(Timestamp::new(secs, ms * 1_000_000).unwrap())
    }

    #[test]
    fn formats_utc_times() {
        assert_eq!(millis(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(1_796_030_467.9), "2026-11-30T09:21:07Z");
        assert_eq!(millis(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(millis(1_796_030_467, 123), "2026-11-30T09:21:07.123Z");
        // Truncated, as the hand-written calendar did: 999.9 ms is still 999.
        let late = Timestamp::new(1_796_030_467, 999_900_000).unwrap();
        assert_eq!(rfc3339(late), "2026-11-30T09:21:07.999Z");
        assert_eq!(now().len(), "2026-11-30T09:21:07.123Z".len());
        // Out of the calendar's range: held at its ends, never a panic.
        assert!(at(1e18).starts_with("9999-12-"), "{}", at(1e18));
        assert!(at(-1e18).starts_with("-9999-01-"), "{}", at(-1e18));
    }
}
