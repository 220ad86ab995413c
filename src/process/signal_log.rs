//! `GPULOOP_SIGNAL_LOG`: a line for every signal delivered, appended by a thread of its own,
//! so that a file system that hangs never holds a signal back, nor a kill past a deadline.
//!
//! The file is opened as the journal's files are (`journal::files::open_log`): no link
//! another account planted is followed, never a FIFO or a device, only a file of this user's
//! or root's that nobody else may write. A process's name is another user's choice: what
//! could forge or hide a line in it is escaped.

use super::kill::{signal_name, Interrupt};
use super::Identity;
use crate::journal::files;
use nix::sys::signal::Signal;
use std::borrow::Cow;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a kill waits for the log to take the lines of the signals it sent.
const DEADLINE: Duration = Duration::from_secs(2);

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line sent before it is written (or dropped).
    Flush(mpsc::Sender<()>),
}

struct Log {
    tx: Mutex<mpsc::Sender<Msg>>,
    /// Given up on: the file was refused, or its writer ran past a deadline.
    off: Arc<AtomicBool>,
}

/// The log named by `GPULOOP_SIGNAL_LOG` (the environment at start, read once), and its
/// writer, started at the first signal.
fn log() -> Option<&'static Log> {
    static LOG: OnceLock<Option<Log>> = OnceLock::new();
    LOG.get_or_init(|| {
        let path = std::env::var_os("GPULOOP_SIGNAL_LOG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)?;
        let (tx, rx) = mpsc::channel();
        let off = Arc::new(AtomicBool::new(false));
        let writer = Writer {
            path,
            off: off.clone(),
        };
        let started = std::thread::Builder::new()
            .name("gpuloop-signal-log".into())
            .spawn(move || writer.run(rx));
        if let Err(e) = started {
            warn(&format!("cannot start its writer: {e}"));
            return None;
        }
        Some(Log {
            tx: Mutex::new(tx),
            off,
        })
    })
    .as_ref()
}

/// Logs a signal delivered: "pid start ino SIGNAL comm" (ino `-` without pidfs; comm last, as
/// it may hold spaces).
pub(super) fn record(id: &Identity, comm: &str, sig: Signal) {
    let Some(log) = log() else { return };
    if log.off.load(Ordering::Relaxed) {
        return;
    }
    let ino = id.ino.map_or_else(|| "-".to_string(), |i| i.to_string());
    let line = format!(
        "{} {} {ino} {} {}\n",
        id.pid,
        id.start,
        signal_name(sig),
        escaped(comm)
    );
    let _ = lock(&log.tx).send(Msg::Line(line.into_bytes()));
}

/// Waits until the log has taken every line sent so far: at most [`DEADLINE`], and no longer
/// than an interrupt. A log that misses the deadline is given up on, said once.
pub(super) fn flush(interrupted: &dyn Interrupt) {
    let Some(log) = log() else { return };
    if log.off.load(Ordering::Relaxed) {
        return;
    }
    let (ack, acked) = mpsc::channel();
    if lock(&log.tx).send(Msg::Flush(ack)).is_err() {
        return;
    }
    let deadline = Instant::now() + DEADLINE;
    loop {
        match acked.recv_timeout(Duration::from_millis(20)) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if interrupted.is_set() || crate::interrupt::is_set() {
            return;
        }
        if Instant::now() >= deadline {
            log.off.store(true, Ordering::Relaxed);
            warn(&format!(
                "its file took no line within {} s (a file system that hangs?); no more lines are written to it",
                DEADLINE.as_secs()
            ));
            return;
        }
    }
}

struct Writer {
    path: PathBuf,
    off: Arc<AtomicBool>,
}

impl Writer {
    fn run(self, rx: mpsc::Receiver<Msg>) {
        let mut file: Option<OwnedFd> = None;
        for msg in rx {
            let line = match msg {
                Msg::Flush(ack) => {
                    let _ = ack.send(());
                    continue;
                }
                Msg::Line(line) => line,
            };
            if self.off.load(Ordering::Relaxed) {
                continue;
            }
            let fd = match &file {
                Some(fd) => fd,
                None => match files::open_log(&self.path) {
                    Ok(fd) => file.insert(fd),
                    Err(e) => {
                        self.off.store(true, Ordering::Relaxed);
                        warn(&e.to_string());
                        continue;
                    }
                },
            };
            if let Err(e) = files::append_whole(fd, &line) {
                warn(&format!("{}: {e}", self.path.display()));
            }
        }
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
