//! The kernel log as the driver writes Xids into it: `/dev/kmsg` (or a file of its records),
//! read without blocking and within bounds, only when gpu(), `gpus` or diagnose ask.
//!
//! A `/dev/kmsg` record is `PRIORITY,SEQ,USEC,FLAGS[,…];MESSAGE`, one per read, with
//! continuation lines (` KEY=VALUE`) after it; `USEC` is the time since boot. The kernel
//! writes every byte of MESSAGE below a space, from DEL up, and a backslash as `\xNN`, so a
//! record is one line whatever a process's name held; the message is read back to its bytes.
//! A regular file of such lines (the simulator's kernel log, a test's) reads the same way.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The most records one read keeps (the kernel's ring buffer holds far fewer of the lines
/// that matter here: only the driver's are kept).
pub(crate) const MAX_RECORDS: usize = 100_000;
/// The most bytes one read takes from the log (a whole default ring buffer, many times).
pub(crate) const MAX_BYTES: usize = 16 << 20;
/// A read buffer that holds any one record (`/dev/kmsg` refuses a smaller one with EINVAL).
const RECORD_BUF: usize = 16 << 10;

/// One kernel log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// Microseconds since boot, when the kernel logged it.
    pub boot_us: u64,
    pub message: String,
}

/// Why the kernel log could not be read, as the person reading a GPU's faults is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the kernel log could not be read: {0}")]
pub(crate) struct LogError(pub String);

/// Where Xid records come from: the kernel's log, or in tests and the simulator a file of
/// the same records.
pub(crate) trait KernelLog: Send + Sync {
    /// The driver's records (messages starting `NVRM:`), oldest first, as far back as the
    /// log still has them, at most `MAX_RECORDS`.
    fn records(&self) -> Result<Vec<Record>, LogError>;
}

/// The default kernel log.
pub(crate) const DEV_KMSG: &str = "/dev/kmsg";

/// `/dev/kmsg`, or a file of its records. It stays open once read: the next read takes only
/// what was logged since (a fresh `/dev/kmsg` fd starts at the oldest record), so a script
/// that calls gpu() in a loop pays for the whole log once.
#[derive(Debug)]
pub(crate) struct Kmsg {
    pub path: PathBuf,
    open: Mutex<State>,
}

/// A log not opened yet, open, or one that could not be opened: a session's permissions do
/// not change, so it is not tried again (and the error not made again) on every read.
#[derive(Debug)]
enum State {
    Closed,
    Open(Reader),
    Failed(LogError),
}

#[derive(Debug)]
struct Reader {
    fd: OwnedFd,
    lines: Lines,
}

impl Kmsg {
    pub(crate) fn new(path: impl Into<PathBuf>) -> Kmsg {
        Kmsg {
            path: path.into(),
            open: Mutex::new(State::Closed),
        }
    }
}

impl KernelLog for Kmsg {
    fn records(&self) -> Result<Vec<Record>, LogError> {
        let mut state = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*state, State::Closed) {
            *state = match open_log(&self.path) {
                Ok(fd) => State::Open(Reader {
                    fd,
                    lines: Lines::default(),
                }),
                Err(e) => State::Failed(e),
            };
        }
        match &mut *state {
            State::Open(reader) => {
                read_new(&self.path, reader)?;
                Ok(reader.lines.records.iter().cloned().collect())
            }
            State::Failed(e) => Err(e.clone()),
            State::Closed => Err(LogError("not opened".into())),
        }
    }
}

fn open_log(path: &Path) -> Result<OwnedFd, LogError> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| denied(path, io::Error::from(e)))
}

/// Reads what was logged since the last read, without blocking: `/dev/kmsg` answers EAGAIN
/// once its records are read (a blocking read would wait for the next one), a file answers
/// 0 at its end. At most `MAX_BYTES` a call.
fn read_new(path: &Path, r: &mut Reader) -> Result<(), LogError> {
    let mut buf = vec![0u8; RECORD_BUF];
    let mut taken = 0usize;
    loop {
        match rustix::io::read(&r.fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                taken += n;
                r.lines.feed(&buf[..n]);
                if taken >= MAX_BYTES {
                    break;
                }
            }
            Err(rustix::io::Errno::AGAIN) => break,
            Err(rustix::io::Errno::INTR) => continue,
            // The record asked for was overwritten meanwhile: the next read goes on from
            // the oldest one the kernel still has.
            Err(rustix::io::Errno::PIPE) => continue,
            Err(e) => return Err(denied(path, io::Error::from(e))),
        }
    }
    // A file's last line without its newline is kept for the next read: every writer ends
    // its records with one, so it is not finished yet.
    Ok(())
}

/// The error for a log that cannot be opened or read, with what to do about it.
fn denied(path: &Path, e: io::Error) -> LogError {
    let restricted =
        std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").is_ok_and(|v| v.trim() == "1");
    let why = match e.kind() {
        io::ErrorKind::PermissionDenied if restricted => format!(
            "{}: {e} (kernel.dmesg_restrict = 1 lets only root read it: run as root, as dmesg would need)",
            path.display()
        ),
        io::ErrorKind::PermissionDenied => {
            format!("{}: {e} (run as root, as dmesg would need)", path.display())
        }
        _ => format!("{}: {e}", path.display()),
    };
    LogError(why)
}

/// Record lines from what was read, kept across reads that end inside a line (a file's);
/// the latest `MAX_RECORDS`.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
    records: VecDeque<Record>,
}

impl Lines {
    fn feed(&mut self, mut bytes: &[u8]) {
        while let Some(end) = memchr::memchr(b'\n', bytes) {
            if self.partial.is_empty() {
                self.line(&bytes[..end]);
            } else {
                self.partial.extend_from_slice(&bytes[..end]);
                let whole = std::mem::take(&mut self.partial);
                self.line(&whole);
            }
            bytes = &bytes[end + 1..];
        }
        // A record never needs more than a read buffer; a longer line is no record.
        if self.partial.len() + bytes.len() <= RECORD_BUF {
            self.partial.extend_from_slice(bytes);
        } else {
            self.partial.clear();
        }
    }

    fn line(&mut self, line: &[u8]) {
        if let Some(r) = parse(line) {
            if self.records.len() == MAX_RECORDS {
                self.records.pop_front();
            }
            self.records.push_back(r);
        }
    }
}

/// One record line, if it is one of the driver's Xid or SXid lines: `6,1234,33688042,-;NVRM:
/// Xid …`. Continuation lines (` KEY=VALUE`) and every other message are skipped. Only the
/// start of a message says what it is: the driver writes `NVRM: Xid (` there, and text a
/// process chose (its name) comes later in the line, if at all. Only the kernel's own records
/// are read (facility 0: PRIORITY below 8): a line a program wrote into `/dev/kmsg` has the
/// user facility, whatever it says.
pub(crate) fn parse(line: &[u8]) -> Option<Record> {
    let semi = memchr::memchr(b';', line)?;
    let (head, message) = (&line[..semi], &line[semi + 1..]);
    let mut fields = head.split(|&b| b == b',');
    let priority: u32 = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    if priority >> 3 != 0 {
        return None;
    }
    let _seq = fields.next()?;
    let boot_us = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let message = unescape(message);
    let message = String::from_utf8_lossy(&message);
    let message = message.trim_end();
    let driver = message.strip_prefix("NVRM:").map(str::trim_start);
    driver
        .is_some_and(|m| m.starts_with("Xid (") || m.starts_with("SXid ("))
        .then(|| Record {
            boot_us,
            message: message.to_string(),
        })
}

/// A message's bytes as the kernel logged them: `/dev/kmsg` writes each byte below a space,
/// from DEL up, and a backslash as `\xNN` (`msg_add_ext_text` in kernel/printk/printk.c).
fn unescape(text: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if memchr::memchr(b'\\', text).is_none() {
        return std::borrow::Cow::Borrowed(text);
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let byte = match text.get(i..i + 4) {
            Some([b'\\', b'x', h, l]) => hex(*h).zip(hex(*l)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match byte {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `message` as `/dev/kmsg` writes it: see `unescape`.
fn escape(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if !(b' '..0x7f).contains(&b) || b == b'\\' {
            out.push_str(&format!("\\x{b:02x}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

/// Turns times since boot into wall-clock time: now, on both clocks, read once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// Seconds since the epoch, now.
    pub wall: f64,
    /// Seconds since boot, now (CLOCK_BOOTTIME, which the kernel's log times count).
    pub boot: f64,
}

impl Clock {
    pub(crate) fn now() -> Clock {
        let boot = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Clock {
            wall,
            boot: boot.tv_sec as f64 + boot.tv_nsec as f64 / 1e9,
        }
    }

    /// The wall-clock time (seconds since the epoch) of a moment `boot_us` after boot.
    pub(crate) fn wall_of(&self, boot_us: u64) -> f64 {
        self.wall - (self.boot - boot_us as f64 / 1e6)
    }

    /// Microseconds since boot now, as a new record would carry (the simulator's).
    pub(crate) fn boot_us(&self) -> u64 {
        (self.boot * 1e6) as u64
    }
}

/// Appends one record to a file of kernel log records (the simulator's kernel log), as the
/// kernel would log it now (its bytes escaped as `/dev/kmsg` escapes them), in one write so
/// that concurrent writers' records stay whole.
pub(crate) fn append(path: &Path, message: &str) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // Priority 4 (warning) and facility 0 (kernel), as the driver logs an Xid.
    let line = format!("4,0,{},-;{}\n", Clock::now().boot_us(), escape(message));
    f.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_the_drivers_lines_with_their_time_since_boot() {
        let r = parse(b"4,361,33688042,c;NVRM: Xid (PCI:0000:00:06): 31, pid=477").unwrap();
        assert_eq!(r.boot_us, 33_688_042);
        assert_eq!(r.message, "NVRM: Xid (PCI:0000:00:06): 31, pid=477");
        // Another subsystem's line, another of the driver's, a continuation line, and no
        // header at all.
        assert_eq!(parse(b"6,362,33688050,-;usb 1-1: new device"), None);
        assert_eq!(
            parse(b"6,363,33688051,-;NVRM: GPU at PCI:0000:00:06: GPU-abc"),
            None
        );
        assert_eq!(parse(b" SUBSYSTEM=pci"), None);
        assert_eq!(parse(b"NVRM: Xid (PCI:0000:00:06): 31"), None);
        // A header with more fields (a newer kernel's) still reads.
        let r = parse(
            b"4,5,7,-,caller=T12;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        )
        .unwrap();
        assert_eq!(r.boot_us, 7);
    }

    /// `/dev/kmsg` escapes a message's control bytes, bytes from DEL up and backslashes as
    /// `\xNN`: read back to the bytes the driver logged (a name with ESC or a newline in
    /// it), and written so by the simulator; only a message that starts as the driver's Xid
    /// lines do is one.
    #[test]
    fn escaped_bytes_read_back_and_only_the_drivers_xid_lines_are_kept() {
        let r = parse(b"4,1,5,-;NVRM: Xid (PCI:0000:18:00): 31, pid=9, name=\\x1b[2Ja\\x0ab\\x5cx41\\xc3\\xa9, x").unwrap();
        assert_eq!(
            r.message,
            "NVRM: Xid (PCI:0000:18:00): 31, pid=9, name=\x1b[2Ja\nb\\x41é, x"
        );
        let name = "\x1b]52;c;aGk=\x07 a\\b\n\u{202e}é";
        let line = format!("4,1,5,-;{}", escape(name));
        assert!(line.bytes().all(|b| (b' '..0x7f).contains(&b)), "{line}");
        assert_eq!(
            String::from_utf8(unescape(escape(name).as_bytes()).into_owned()).unwrap(),
            name
        );
        // Not an Xid line: "Xid (" later in a driver's line, or another subsystem's.
        assert_eq!(
            parse(b"6,2,5,-;NVRM: GPU at PCI:0000:18:00: name=Xid (PCI:0000:18:00): 48,"),
            None
        );
        assert_eq!(parse(b"6,2,5,-;comm Xid (PCI:0000:18:00): 48, NVRM:"), None);
        assert!(parse(b"6,2,5,-;NVRM: SXid (PCI:0000:b3:00.0): 12028, Non-fatal").is_some());
        // A program's line in /dev/kmsg (the user facility, 1 << 3), however it reads.
        assert_eq!(
            parse(b"12,3,5,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."),
            None
        );
        assert_eq!(
            parse(b"x,3,5,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."),
            None
        );
    }

    /// Reads of a file end inside lines; the records come out whole all the same.
    #[test]
    fn a_file_read_in_pieces_gives_whole_records() {
        let text = "4,1,10,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a\n SUBSYSTEM=pci\n6,2,20,-;other\n4,3,30,-;NVRM: Xid (PCI:0000:19:00): 48, pid=2, name=b\n";
        for cut in 1..text.len() {
            let mut l = Lines::default();
            l.feed(&text.as_bytes()[..cut]);
            l.feed(&text.as_bytes()[cut..]);
            let times: Vec<u64> = l.records.iter().map(|r| r.boot_us).collect();
            assert_eq!(times, [10, 30], "cut at {cut}");
        }
    }

    /// Where dmesg would be refused, the reason is said plainly, with what to do.
    #[test]
    fn a_log_that_may_not_be_read_says_why() {
        let e = denied(
            Path::new("/dev/kmsg"),
            io::Error::from(io::ErrorKind::PermissionDenied),
        );
        let text = e.to_string();
        assert!(
            text.starts_with("the kernel log could not be read: /dev/kmsg: ")
                && text.contains("run as root"),
            "{text}"
        );
    }

    /// However long the log, what is kept is bounded: the latest records.
    #[test]
    fn the_records_kept_are_bounded_to_the_latest() {
        let mut l = Lines::default();
        for i in 0..MAX_RECORDS as u64 + 10 {
            l.feed(format!("4,{i},{i},-;NVRM: Xid (PCI:0000:18:00): 31, pid=1\n").as_bytes());
        }
        assert_eq!(l.records.len(), MAX_RECORDS);
        assert_eq!(l.records.front().map(|r| r.boot_us), Some(10));
        // A line longer than any record is dropped, not kept growing.
        l.feed(&vec![b'x'; RECORD_BUF + 1]);
        assert!(l.partial.is_empty());
    }

    #[test]
    fn reading_a_file_stops_at_its_end_and_a_missing_one_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kmsg");
        append(
            &p,
            "NVRM: Xid (PCI:0000:18:00): 31, pid=42, name=python3, channel 0x1",
        )
        .unwrap();
        append(&p, "NVRM: Xid (PCI:0000:18:00): 43, pid=42, name=python3").unwrap();
        let log = Kmsg::new(&p);
        let rs = log.records().unwrap();
        assert_eq!(rs.len(), 2);
        assert!(rs[0].boot_us <= rs[1].boot_us);
        let now = Clock::now();
        assert!((now.wall_of(rs[1].boot_us) - now.wall).abs() < 60.0);
        // Kept open: the next read adds what was logged since, once.
        append(&p, "NVRM: Xid (PCI:0000:18:00): 45, pid=42, name=python3").unwrap();
        let codes: Vec<String> = log
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.message)
            .collect();
        assert_eq!(codes.len(), 3);
        assert!(codes[2].contains("): 45,"), "{codes:?}");
        let e = Kmsg::new(dir.path().join("none")).records().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the kernel log could not be read: "),
            "{e}"
        );
    }
}
