//! The journal of MCP calls: one JSON line per call in the XDG state directory
//! (`~/.local/state/gpuloop/journal.jsonl`): time, tool, arguments, what was signalled, result.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// One call, as appended after it ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    /// UTC, RFC 3339 with milliseconds.
    pub time: String,
    pub tool: String,
    pub arguments: serde_json::Value,
    /// Pids signalled by the call (empty for reads and dry runs).
    pub signalled: Vec<i64>,
    /// "ok", "error", "refused" or "cancelled".
    pub result: String,
    /// The one-line summary the model got (or the error).
    pub summary: String,
    pub elapsed_ms: i64,
    /// The server's pid: tells one session's calls from another's.
    pub server_pid: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("no state directory (set XDG_STATE_HOME or HOME)")]
    NoStateDir,
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `$XDG_STATE_HOME/gpuloop/journal.jsonl`, by default `~/.local/state/gpuloop/journal.jsonl`.
pub fn path() -> Result<PathBuf, JournalError> {
    dirs::state_dir()
        .map(|d| d.join("gpuloop").join("journal.jsonl"))
        .ok_or(JournalError::NoStateDir)
}

/// Appends one entry as one line (one write on an O_APPEND file, so concurrent servers
/// never interleave within a line). The journal is private to its user (0600).
pub fn append(path: &Path, entry: &Entry) -> Result<(), JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    let mut line = serde_json::to_vec(entry).map_err(|e| io(e.into()))?;
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(&line))
        .map_err(io)
}

/// Every entry, oldest first, and how many lines could not be read as one.
pub fn read(path: &Path) -> Result<(Vec<Entry>, usize), JournalError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(source) => {
            return Err(JournalError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut entries = Vec::new();
    let mut bad = 0;
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(e) => entries.push(e),
            Err(_) => bad += 1,
        }
    }
    Ok((entries, bad))
}

/// One entry for people: time, tool, result, what was signalled, arguments, summary.
pub fn line(e: &Entry) -> String {
    let signalled = if e.signalled.is_empty() {
        String::new()
    } else {
        let pids: Vec<String> = e.signalled.iter().map(|p| p.to_string()).collect();
        format!(" signalled [{}]", pids.join(","))
    };
    format!(
        "{} {} {}{signalled} {} ({} ms, server {}): {}",
        e.time, e.tool, e.result, e.arguments, e.elapsed_ms, e.server_pid, e.summary
    )
}

/// Now as "2026-11-30T09:41:07.123Z".
pub fn now_utc() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

fn rfc3339(secs: i64, millis: u32) -> String {
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
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_030_467, 123), "2026-11-30T09:21:07.123Z");
    }

    #[test]
    fn appends_lines_and_reads_them_back_skipping_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gpuloop").join("journal.jsonl");
        let e = Entry {
            time: now_utc(),
            tool: "clean".into(),
            arguments: serde_json::json!({"gpus": [2]}),
            signalled: vec![41, 42],
            result: "ok".into(),
            summary: "clean".into(),
            elapsed_ms: 7,
            server_pid: 1,
        };
        append(&p, &e).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"not json\n")
            .unwrap();
        append(&p, &e).unwrap();
        let (entries, bad) = read(&p).unwrap();
        assert_eq!(entries, vec![e.clone(), e]);
        assert_eq!(bad, 1);
        assert_eq!(read(&dir.path().join("none")).unwrap().0, vec![]);
    }
}
