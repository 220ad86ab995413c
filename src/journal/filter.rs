//! What `gpuloop journal` shows: the filter, and `--since` read into it.

use super::{Event, FrontEnd, Record};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// `--since`: a time in UTC (`2026-12-01`, `2026-12-01T14:05`, `…:30Z`) or an age (`90s`,
/// `10m`, `2h`, `3d`), as the journal's RFC 3339 text to compare with.
pub(crate) fn parse_since(s: &str) -> Result<String, String> {
    let s = s.trim();
    let bad = || {
        format!(
            "--since {s:?}: expected a UTC time (2026-12-01, 2026-12-01T14:05) or an age (90s, 10m, 2h, 3d)"
        )
    };
    if let Some(unit) = s.chars().last().filter(|c| "smhd".contains(*c)) {
        let n: u64 = s[..s.len() - 1].parse().map_err(|_| bad())?;
        let scale = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => 86_400,
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let at = now.saturating_sub(n.saturating_mul(scale));
        return Ok(crate::utc::rfc3339(at as i64, 0));
    }
    let t = s.trim_end_matches('Z');
    let shape = "dddd-dd-ddTdd:dd:dd.ddd";
    let fits = t.len() >= 10
        && t.len() <= shape.len()
        && t.chars().zip(shape.chars()).all(|(c, want)| match want {
            'd' => c.is_ascii_digit(),
            _ => c == want,
        })
        && !t.ends_with([':', 'T', '.']);
    if fits {
        Ok(t.to_string())
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_utc_time_or_an_age() {
        assert_eq!(parse_since("2026-12-01").unwrap(), "2026-12-01");
        assert_eq!(
            parse_since("2026-12-01T14:05Z").unwrap(),
            "2026-12-01T14:05"
        );
        assert!(parse_since("10m").unwrap() < crate::utc::now());
        for bad in ["yesterday", "2026-1-1", "10x", "m", "2026-12-01T"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }
}
