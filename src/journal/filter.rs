//! What `gpuloop journal` shows: the filter, and `--since` read into it.

use super::{Event, FrontEnd, Record};
use jiff::civil::Time;
use jiff::fmt::temporal::Pieces;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};

/// What `gpuloop journal` shows.
#[derive(Debug, Default, Clone)]
pub(crate) struct Filter {
    /// Records at or after this time (RFC 3339 UTC, compared as text: the journal's times all
    /// have one format).
    pub since: Option<String>,
    /// Signals to this pid, and calls that signalled it.
    pub pid: Option<i64>,
    /// Records of this invoking user (name or uid).
    pub user: Option<String>,
    pub front_end: Option<FrontEnd>,
}

impl Filter {
    pub(crate) fn matches(&self, r: &Record) -> bool {
        let pid_ok = self.pid.is_none_or(|p| match &r.event {
            Event::Signal(s) => s.target.pid == p,
            Event::Call(c) => c.signalled.contains(&p),
        });
        let user_ok = self
            .user
            .as_ref()
            .is_none_or(|u| *u == r.user.name || *u == r.user.uid.to_string());
        self.since
            .as_ref()
            .is_none_or(|t| r.time.as_str() >= t.as_str())
            && pid_ok
            && user_ok
            && self.front_end.is_none_or(|f| f == r.front_end)
    }
}

/// `--since`: a time in UTC (`2026-12-01`, `2026-12-01T14:05`, `…:30Z`, `…:30.250`) or an
/// age (`90s`, `10m`, `2h`, `3d`, `1w`, `1h30m`), as the journal's RFC 3339 text to compare
/// with. Both are read by jiff: a time in ISO 8601 as Temporal reads it, an age in its
/// "friendly" duration format.
pub(crate) fn parse_since(s: &str) -> Result<String, String> {
    let s = s.trim();
    let bad = || {
        format!(
            "--since {s:?}: expected a UTC time (2026-12-01, 2026-12-01T14:05) or an age (90s, 10m, 2h, 3d)"
        )
    };
    let at = match s.parse::<Span>() {
        Ok(age) if !age.is_negative() => ago(age),
        Ok(_) => None,
        Err(_) => utc_time(s),
    };
    at.map(crate::utc::rfc3339).ok_or_else(bad)
}

/// The instant `age` ago, on the UTC calendar (a day is 24 hours, a month a calendar month).
fn ago(age: Span) -> Option<Timestamp> {
    let now = TimeZone::UTC.to_datetime(Timestamp::now());
    TimeZone::UTC.to_timestamp(now.checked_sub(age).ok()?).ok()
}

/// A date, or a date and time, in UTC: without an offset, or with `Z`. Any other offset or a
/// time zone is refused rather than read as UTC.
fn utc_time(s: &str) -> Option<Timestamp> {
    let p = Pieces::parse(s.strip_suffix('Z').unwrap_or(s)).ok()?;
    if p.offset().is_some() || p.time_zone_annotation().is_some() {
        return None;
    }
    let t = p.date().to_datetime(p.time().unwrap_or(Time::midnight()));
    TimeZone::UTC.to_timestamp(t).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn since(s: &str) -> String {
        parse_since(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn since_takes_a_utc_time_or_an_age() {
        // The forms the help names, as the journal's own times.
        assert_eq!(since("2026-12-01"), "2026-12-01T00:00:00.000Z");
        assert_eq!(since("2026-12-01T14:05"), "2026-12-01T14:05:00.000Z");
        assert_eq!(since("2026-12-01T14:05Z"), "2026-12-01T14:05:00.000Z");
        assert_eq!(since("2026-12-01T14:05:30Z"), "2026-12-01T14:05:30.000Z");
        assert_eq!(since("2026-12-01T14:05:30.25"), "2026-12-01T14:05:30.250Z");
        assert_eq!(
            since("2026-12-01T14:05:30.123Z"),
            "2026-12-01T14:05:30.123Z"
        );
        assert_eq!(since("2026-12-01Z"), "2026-12-01T00:00:00.000Z");
        assert_eq!(since(" 2026-12-01 "), "2026-12-01T00:00:00.000Z");
        // Ages: each further back than a shorter one, all before now.
        let ages = ["0s", "90s", "10m", "1h30m", "2h", "3d", "1w"];
        let times: Vec<String> = ages.iter().map(|a| since(a)).collect();
        assert!(times[0] <= crate::utc::now(), "{times:?}");
        assert!(times.windows(2).all(|w| w[0] > w[1]), "{ages:?}: {times:?}");
        for bad in [
            "yesterday",
            "2026-1-1",
            "10x",
            "m",
            "2026-12-01T",
            "2026-13-01",
            "2026-02-30",
            "-10m",
            "10m ago",
            "2026-12-01T14:05+02:00",
            "2026-12-01T14:05[Europe/Paris]",
            "",
        ] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    /// The filter compares the journal's times as text: a record at the `--since` time is
    /// shown, one a millisecond before is not.
    #[test]
    fn since_keeps_a_record_at_its_time_and_drops_one_before() {
        let at = |time: &str| Record {
            time: time.into(),
            ..crate::journal::tests::record(1, FrontEnd::Cli)
        };
        let f = Filter {
            since: Some(since("2026-12-01T14:05")),
            ..Filter::default()
        };
        assert!(f.matches(&at("2026-12-01T14:05:00.000Z")));
        assert!(f.matches(&at("2026-12-02T00:00:00.000Z")));
        assert!(!f.matches(&at("2026-12-01T14:04:59.999Z")));
    }
}
