//! `GPULOOP_SIGNAL_LOG`: a line for every signal delivered, appended by a thread of its own,
//! so that a file system that hangs never holds a signal back, nor a kill past a deadline.
//!
//! The file is opened as the journal's files are (`journal::files::open_log`): no link
//! another account planted is followed, never a FIFO or a device, only a file of this user's
//! or root's that nobody else may write. A process's name is another user's choice: what
//! could forge or hide a line in it is escaped.

use super::kill::signal_name;
use super::Identity;
use crate::journal::files::{self, Appender, Flushed, Wrote};
use nix::sys::signal::Signal;
use std::borrow::Cow;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// How long a kill waits for the log to take the lines of the signals it sent.
const DEADLINE: Duration = Duration::from_secs(2);

static LOG: OnceLock<Option<Appender>> = OnceLock::new();

/// The log named by `GPULOOP_SIGNAL_LOG` (the environment at start, read once), and its
/// writer, started at the first signal.
fn log() -> Option<&'static Appender> {
    LOG.get_or_init(|| {
        let path = std::env::var_os("GPULOOP_SIGNAL_LOG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)?;
        let mut file: Option<OwnedFd> = None;
        let started = Appender::start("gpuloop-signal-log", move |line| {
            let fd = match &file {
                Some(fd) => fd,
                None => match files::open_log(&path) {
                    Ok(fd) => file.insert(fd),
                    Err(e) => {
                        warn(&e.to_string());
                        return Wrote::GiveUp;
                    }
                },
            };
            if let Err(e) = files::append_whole(fd, line) {
                warn(&format!("{}: {e}", path.display()));
            }
            Wrote::On
        });
        started
            .map_err(|e| warn(&format!("cannot start its writer: {e}")))
            .ok()
    })
    .as_ref()
}

/// Logs a signal delivered: "pid start ino SIGNAL comm" (ino `-` without pidfs; comm last, as
/// it may hold spaces).
pub(super) fn record(id: &Identity, comm: &str, sig: Signal) {
    let Some(log) = log() else { return };
    let ino = id.ino.map_or_else(|| "-".to_string(), |i| i.to_string());
    let line = format!(
        "{} {} {ino} {} {}\n",
        id.pid,
        id.start,
        signal_name(sig),
        escaped(comm)
    );
    log.send(line.into_bytes());
}

/// Waits until the log has taken every line sent so far: at most [`DEADLINE`], and no longer
/// than the next interrupt (one that came before, which may be what this kill stops a job
/// for, does not cut it short). A log that misses the deadline is given up on, said once.
pub(super) fn flush() {
    // No line was logged by this process yet: nothing to wait for.
    let Some(Some(log)) = LOG.get() else { return };
    let since = crate::interrupt::After::now();
    if log.flush(DEADLINE, &|| since.came()) == Flushed::Late {
        warn(&format!(
            "its file took no line within {} s (a file system that hangs?); no more lines are written to it",
            DEADLINE.as_secs()
        ));
    }
}

/// Says once that the log is not written, and why.
fn warn(why: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    tracing::warn!("the signal log: {why}");
    if !WARNED.swap(true, Ordering::Relaxed) {
        crate::errln!(
            "gpuloop: warning: the signal log (GPULOOP_SIGNAL_LOG) is not written: {why}"
        );
    }
}

/// `comm` with what could forge or hide a line made visible: control characters (a newline,
/// a carriage return, an escape), the Unicode line and paragraph separators, and the
/// backslash that escapes them, as `\xNN` or `\u{NNNN}`.
fn escaped(comm: &str) -> Cow<'_, str> {
    let odd = |c: char| c.is_control() || matches!(c, '\\' | '\u{2028}' | '\u{2029}');
    if !comm.chars().any(odd) {
        return Cow::Borrowed(comm);
    }
    let mut out = String::with_capacity(comm.len() + 8);
    for c in comm.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if odd(c) && u32::from(c) < 0x80 => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c if odd(c) => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_cannot_forge_or_hide_a_line() {
        assert_eq!(escaped("python3"), "python3");
        assert_eq!(escaped("a b"), "a b");
        assert_eq!(escaped("x\n1 2 - KILL y"), "x\\x0a1 2 - KILL y");
        assert_eq!(escaped("\r\x1b[2K\t\x7f"), "\\x0d\\x1b[2K\\x09\\x7f");
        assert_eq!(escaped("a\\x0a"), "a\\\\x0a");
        assert_eq!(escaped("\u{85}\u{2028}"), "\\u{0085}\\u{2028}");
    }
}
