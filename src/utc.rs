//! UTC times as gpuloop's records write them (RFC 3339): the journal's records, the
//! restarters' state, a kernel log event's time in advice.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now as "2026-11-30T09:41:07.123Z".
pub(crate) fn now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

/// Seconds since the epoch as "2026-11-30T09:41:07Z" (a kernel log event's time, in advice).
pub(crate) fn at(secs: f64) -> String {
    let s = rfc3339(secs.floor() as i64, 0);
    format!("{}Z", s.get(..19).unwrap_or(&s))
}

pub(crate) fn rfc3339(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil: proleptic Gregorian calendar from 1970-01-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(1_796_030_467.9), "2026-11-30T09:21:07Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_030_467, 123), "2026-11-30T09:21:07.123Z");
    }
}
