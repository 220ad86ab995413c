//! Reading what gpuloop is handed (scripts, modules, hosts files, the config, stdin) and the
//! container runtimes' state it reads on a node: regular files only, each kind with a size
//! limit, and stdin read so that Ctrl-C ends the wait.
//!
//! A path may name `/dev/zero` (endless), a FIFO (blocks until a writer comes, where no
//! signal reaches a plain `read`) or a huge file; each is an error that names the file and
//! the limit, never an out-of-memory kill or a hang.

use std::io::{BufRead, Read};
use std::path::Path;

/// What is being read, with its size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kind {
    /// "script", "module", "hosts file", … for messages.
    pub what: &'static str,
    /// The most bytes accepted.
    pub limit: u64,
}

/// A script file, or one piped to `run -`. Real scripts are a few KiB; the largest recipe
/// is under 20 KiB.
pub(crate) const SCRIPT: Kind = Kind {
    what: "script",
    limit: 16 << 20,
};
/// An imported module, as a script.
pub(crate) const MODULE: Kind = Kind {
    what: "module",
    limit: SCRIPT.limit,
};
/// `--hosts-file`: one destination a line; 65,536 hosts of 64 bytes are 4 MiB.
pub(crate) const HOSTS_FILE: Kind = Kind {
    what: "hosts file",
    limit: 4 << 20,
};
/// config.toml.
pub(crate) const CONFIG: Kind = Kind {
    what: "config file",
    limit: 1 << 20,
};
/// A container runtime's state file (an OCI bundle's config.json, docker's config.v2.json,
/// containers/storage's containers.json): a bundle is tens of KiB, a list of thousands of
/// containers a few MiB.
pub(crate) const RUNTIME_STATE: Kind = Kind {
    what: "container runtime state file",
    limit: 16 << 20,
};
/// One line typed or piped into the REPL.
pub(crate) const REPL_LINE: Kind = Kind {
    what: "REPL line",
    limit: 1 << 20,
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{kind}, not a regular file: only regular files are read")]
    NotRegular { kind: &'static str },
    #[error("larger than {} (the limit of a {what})", size(*.limit))]
    TooLarge { what: &'static str, limit: u64 },
    #[error("not UTF-8 text")]
    NotUtf8,
    /// Ctrl-C (or another terminating signal) while waiting for input.
    #[error("interrupted")]
    Interrupted,
}

/// "16 MiB", "1 KiB", "100 bytes".
pub(crate) fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// What a file that is not a regular file is, for messages.
pub(crate) fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// The bytes of a regular file of at most `kind.limit` bytes. Opened without blocking and
/// checked with fstat before any read, so a FIFO is refused at once instead of waiting for a
/// writer, and a link to a device is judged by what it points to.
pub(crate) fn file(path: &Path, kind: Kind) -> Result<Vec<u8>, ReadError> {
    file_as_of(path, kind).map(|(bytes, _)| bytes)
}

/// The bytes of a regular file, read as `file` reads one, and what fstat said of the file
/// just before they were read: what was read is that version of it or a later one.
pub(crate) fn file_as_of(
    path: &Path,
    kind: Kind,
) -> Result<(Vec<u8>, std::fs::Metadata), ReadError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    read_opened(f, kind)
}

/// The bytes of a file already opened (without blocking), read as `file` reads one.
pub(crate) fn opened(f: std::fs::File, kind: Kind) -> Result<Vec<u8>, ReadError> {
    read_opened(f, kind).map(|(bytes, _)| bytes)
}

fn read_opened(f: std::fs::File, kind: Kind) -> Result<(Vec<u8>, std::fs::Metadata), ReadError> {
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular {
            kind: kind_of(meta.file_type()),
        });
    }
    let too_large = ReadError::TooLarge {
        what: kind.what,
        limit: kind.limit,
    };
    let len = meta.len();
    if len > kind.limit {
        return Err(too_large);
    }
    // The size can grow after fstat (a log being written, a /proc file that says 0): the
    // read itself stops one byte past the limit.
    let bytes = read_sized(f.take(kind.limit + 1), len)?;
    if bytes.len() as u64 > kind.limit {
        return Err(too_large);
    }
    Ok((bytes, meta))
}

/// All of `r`, a file that fstat said has `len` bytes: in one call where it has just those
/// (into room for one byte more, which a read that stops there leaves empty, so no second
/// call is made only to be told the end), read on to the end where it has more or less.
pub(crate) fn read_sized(mut r: impl Read, len: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0; len as usize + 1];
    let n = loop {
        match r.read(&mut bytes) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    bytes.truncate(n);
    if n as u64 != len {
        r.read_to_end(&mut bytes)?;
    }
    Ok(bytes)
}

/// How often a read of stdin looks at the interrupt flag when no signal woke it (a signal
/// that arrives between the look and the wait is seen this much later).
const STDIN_TICK_MS: u16 = 200;

/// Bytes asked of one read of stdin.
const CHUNK: usize = 64 << 10;

/// Waits until stdin has something to read (or its end); `Err(Interrupted)` on Ctrl-C or
/// another terminating signal. gpuloop's handlers restart a plain `read`, which would wait
/// for a writer forever.
fn stdin_ready() -> Result<(), ReadError> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::io::Errno;
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    loop {
        if crate::interrupt::is_set() {
            return Err(ReadError::Interrupted);
        }
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: i64::from(STDIN_TICK_MS) * 1_000_000,
        };
        match poll(&mut fds, Some(&tick)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(ReadError::Io(e.into())),
        }
    }
}

/// One `read(2)` of stdin once it is ready; 0 at its end.
fn stdin_chunk(buf: &mut [u8]) -> Result<usize, ReadError> {
    loop {
        stdin_ready()?;
        let e = match rustix::io::read(std::io::stdin(), &mut *buf) {
            Ok(n) => return Ok(n),
            Err(e) => std::io::Error::from(e),
        };
        match e.kind() {
            std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
            _ => return Err(ReadError::Io(e)),
        }
    }
}

/// All of stdin, at most `kind.limit` bytes; Ctrl-C ends the wait for it.
pub(crate) fn stdin(kind: Kind) -> Result<Vec<u8>, ReadError> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = stdin_chunk(&mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        if out.len() as u64 > kind.limit {
            return Err(ReadError::TooLarge {
                what: kind.what,
                limit: kind.limit,
            });
        }
    }
}

/// Stdin line by line, each line at most `kind.limit` bytes; Ctrl-C ends the wait for one.
pub(crate) struct StdinLines {
    kind: Kind,
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts.
    at: usize,
    eof: bool,
    /// The line read so far (kept across an interrupted wait).
    line: LineBuf,
}

impl StdinLines {
    pub(crate) fn new(kind: Kind) -> StdinLines {
        StdinLines {
            kind,
            buf: Vec::new(),
            at: 0,
            eof: false,
            line: LineBuf::new(usize::try_from(kind.limit).unwrap_or(usize::MAX)),
        }
    }

    /// The next line without its newline; `None` at the end of stdin. A line over the limit
    /// is an error at once (its end may never come: `/dev/zero`); reading ends there.
    pub(crate) fn next_line(&mut self) -> Result<Option<String>, ReadError> {
        loop {
            // Lines already buffered must not outrun a Ctrl-C either.
            if crate::interrupt::is_set() {
                return Err(ReadError::Interrupted);
            }
            if self.at == self.buf.len() {
                if self.eof {
                    return self.line.end().map(|l| self.finish(l)).transpose();
                }
                self.buf.resize(CHUNK, 0);
                self.at = 0;
                let n = stdin_chunk(&mut self.buf);
                self.buf.truncate(*n.as_ref().unwrap_or(&0));
                self.eof = n? == 0;
                continue;
            }
            let (used, ended) = self.line.feed(&self.buf[self.at..]);
            self.at += used;
            match ended {
                Some(line) => return self.finish(line).map(Some),
                None if self.line.is_over() => return Err(self.too_large()),
                None => {}
            }
        }
    }

    fn too_large(&self) -> ReadError {
        ReadError::TooLarge {
            what: self.kind.what,
            limit: self.kind.limit,
        }
    }

    fn finish(&self, line: Result<Vec<u8>, TooLarge>) -> Result<String, ReadError> {
        let Ok(line) = line else {
            return Err(self.too_large());
        };
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        Ok(String::from_utf8_lossy(line).into_owned())
    }
}

/// A line that was longer than its reader's limit (read through, and dropped).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TooLarge;

/// One line being read a buffer at a time, at most `max` bytes of it kept: the one bounded
/// line reader. The agent's requests and the journal go through it with `BufRead`
/// (`next_line`), stdin with `StdinLines`, a host's replies with tokio's `AsyncBufRead`
/// (`hosts::client`): each hands it what it has buffered, and consumes what it used.
pub(crate) struct LineBuf {
    max: usize,
    line: Vec<u8>,
    over: bool,
}

impl LineBuf {
    pub(crate) fn new(max: usize) -> LineBuf {
        LineBuf {
            max,
            line: Vec::new(),
            over: false,
        }
    }

    /// Takes what it needs of `buf` (up to its first newline): the bytes it used, and the
    /// line, without its newline, if it ended there.
    pub(crate) fn feed(&mut self, buf: &[u8]) -> (usize, Option<Result<Vec<u8>, TooLarge>>) {
        let (take, used) = match memchr::memchr(b'\n', buf) {
            Some(i) => (i, i + 1),
            None => (buf.len(), buf.len()),
        };
        if !self.over {
            self.line.extend_from_slice(&buf[..take]);
            if self.line.len() > self.max {
                self.over = true;
                self.line = Vec::new();
            }
        }
        let ended = used > take;
        (used, ended.then(|| self.take()))
    }

    /// At the end of the input: the last line, if one had begun.
    pub(crate) fn end(&mut self) -> Option<Result<Vec<u8>, TooLarge>> {
        (self.over || !self.line.is_empty()).then(|| self.take())
    }

    /// Whether the line has grown past `max` (the rest of it is dropped as it comes).
    pub(crate) fn is_over(&self) -> bool {
        self.over
    }

    fn take(&mut self) -> Result<Vec<u8>, TooLarge> {
        let line = std::mem::take(&mut self.line);
        match std::mem::take(&mut self.over) {
            true => Err(TooLarge),
            false => Ok(line),
        }
    }
}

/// The next line of `r` without its newline; `Err(TooLarge)` for one over `max` bytes (read
/// through in bounded memory, and dropped), `None` at the end.
pub(crate) fn next_line(
    r: &mut impl BufRead,
    max: usize,
) -> std::io::Result<Option<Result<Vec<u8>, TooLarge>>> {
    let mut line = LineBuf::new(max);
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(line.end());
        }
        let (used, ended) = line.feed(buf);
        r.consume(used);
        if ended.is_some() {
            return Ok(ended);
        }
    }
}

/// A script's text without the UTF-8 byte-order mark some editors put first (rhai would read
/// it as an unknown character).
pub(crate) fn without_bom(src: &str) -> &str {
    src.strip_prefix('\u{feff}').unwrap_or(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: Kind = Kind {
        what: "test file",
        limit: 10,
    };

    #[test]
    fn regular_files_up_to_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(file(&p, TINY).unwrap(), b"0123456789");
        std::fs::write(&p, b"0123456789a").unwrap();
        let e = file(&p, TINY).unwrap_err().to_string();
        assert_eq!(e, "larger than 10 bytes (the limit of a test file)");
    }

    #[test]
    fn endless_devices_and_fifos_are_refused_without_reading() {
        let e = file(Path::new("/dev/zero"), SCRIPT)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("a character device, not a regular file"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RWXU).unwrap();
        // No writer: a blocking open would wait forever.
        let e = file(&fifo, SCRIPT).unwrap_err().to_string();
        assert!(e.starts_with("a FIFO, not a regular file"), "{e}");
        let e = file(dir.path(), SCRIPT).unwrap_err().to_string();
        assert!(e.starts_with("a directory"), "{e}");
    }

    #[test]
    fn a_file_growing_past_the_limit_is_cut_at_the_limit() {
        // /proc files say 0 bytes and have more.
        let e = file(Path::new("/proc/self/maps"), TINY).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { limit: 10, .. }), "{e}");
    }

    #[test]
    fn a_file_is_read_whole_whatever_size_fstat_gave() {
        // fstat says 0 bytes of a /proc file: all of it is read, to its last line.
        let status = file(Path::new("/proc/self/status"), SCRIPT).unwrap();
        let text = String::from_utf8(status).unwrap();
        assert!(text.starts_with("Name:"), "{text}");
        assert!(
            text.trim_end()
                .lines()
                .last()
                .unwrap()
                .starts_with("nonvoluntary_ctxt_switches"),
            "{text}"
        );
        // A regular file, empty or not: the bytes, and the version fstat saw.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        for text in [&b""[..], b"x", b"0123456789"] {
            std::fs::write(&p, text).unwrap();
            let (bytes, meta) = file_as_of(&p, TINY).unwrap();
            assert_eq!(bytes, text);
            assert_eq!(meta.len(), text.len() as u64);
            let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
            assert_eq!(std::os::unix::fs::MetadataExt::ino(&meta), ino);
        }
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(16 << 20), "16 MiB");
        assert_eq!(size(4 << 10), "4 KiB");
        assert_eq!(size(1000), "1000 bytes");
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        assert_eq!(without_bom("\u{feff}let x = 1;"), "let x = 1;");
        assert_eq!(without_bom("let x = 1;"), "let x = 1;");
    }

    #[test]
    fn lines_over_the_limit_are_dropped_whole_and_reading_goes_on() {
        let data =
            b"short\nthis-line-is-too-long\nok\n0123456789\n0123456789a\nlast-without-newline"
                .to_vec();
        let mut r = std::io::BufReader::with_capacity(4, &data[..]);
        let mut got = Vec::new();
        while let Some(l) = next_line(&mut r, 10).unwrap() {
            got.push(
                l.map(|v| String::from_utf8(v).unwrap())
                    .unwrap_or_else(|TooLarge| "<too large>".into()),
            );
        }
        assert_eq!(
            got,
            [
                "short",
                "<too large>",
                "ok",
                "0123456789",
                "<too large>",
                "<too large>"
            ]
        );
        // An empty input has no line; a last line without its newline is one.
        assert_eq!(next_line(&mut &b""[..], 10).unwrap(), None);
        assert_eq!(
            next_line(&mut &b"\n"[..], 10).unwrap(),
            Some(Ok(Vec::new()))
        );
        assert_eq!(
            next_line(&mut &b"end"[..], 10).unwrap(),
            Some(Ok(b"end".to_vec()))
        );
    }

    #[test]
    fn a_line_says_it_is_over_as_soon_as_it_is() {
        let mut line = LineBuf::new(4);
        assert_eq!(line.feed(b"abc"), (3, None));
        assert!(!line.is_over());
        assert_eq!(line.feed(b"de"), (2, None));
        assert!(line.is_over(), "5 bytes of 4, with no newline yet");
        assert_eq!(line.feed(b"f\nnext"), (2, Some(Err(TooLarge))));
        assert_eq!(line.feed(b"ok\n"), (3, Some(Ok(b"ok".to_vec()))));
        assert_eq!(line.end(), None);
    }
}
