//! Standard output for everything gpuloop prints: a closed pipe (`gpuloop gpus | head -1`)
//! ends the output quietly instead of panicking, as coreutils and ripgrep do; any other
//! failed write (a full disk, a descriptor not open for writing) ends it too, said once, and
//! makes the exit status 1 (`failure`), so that `gpuloop --json holders > f && …` never
//! "succeeds" with an empty file; and no control character that text from another user
//! carried reaches the terminal (`crate::shown`).

use std::io::IsTerminal;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// stdout was found closed: a fact of this process's stdout, which only ever becomes true.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// Why a write to stdout failed, other than a closed pipe: set once, at the first.
static FAILED: OnceLock<String> = OnceLock::new();
/// stdout was closed when the process started (`gpuloop … >&-`): a fact of this process.
static STARTED_CLOSED: AtomicBool = AtomicBool::new(false);

/// Looks at stdout before the Rust runtime starts: it opens /dev/null in place of a closed
/// stdout, and every write would then vanish without a word. The C library runs the
/// functions of `.init_array` before `main`, and so before that.
#[used]
#[link_section = ".init_array"]
static SEE_STDOUT: extern "C" fn() = {
    extern "C" fn see_stdout() {
        // SAFETY: F_GETFD only asks whether descriptor 1 is open; it changes nothing.
        if unsafe { libc::fcntl(1, libc::F_GETFD) } == -1 {
            STARTED_CLOSED.store(true, Ordering::SeqCst);
        }
    }
    see_stdout
};
/// `--color`, as the command line set it once (unset: auto).
static COLOR: OnceLock<ColorChoice> = OnceLock::new();
/// `--wide`, as the command line set it once (unset: off): tables show whole command lines.
static WIDE: OnceLock<bool> = OnceLock::new();

/// When output gets ANSI colour (`--color`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ColorChoice {
    /// On a terminal, unless `NO_COLOR` is set (no-color.org).
    #[default]
    Auto,
    Always,
    Never,
}

/// Set once by the command line, before anything prints; a later call changes nothing.
pub(crate) fn set_color(choice: ColorChoice) {
    let _ = COLOR.set(choice);
}

fn color_on(is_terminal: bool) -> bool {
    match COLOR.get().copied().unwrap_or_default() {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    }
}

/// Whether stdout gets colour.
pub(crate) fn color_stdout() -> bool {
    color_on(std::io::stdout().is_terminal())
}

/// Whether stderr gets colour.
pub(crate) fn color_stderr() -> bool {
    color_on(std::io::stderr().is_terminal())
}

/// `--wide`: never cut a table's command column. Set once by the command line, before
/// anything prints; a later call changes nothing.
pub(crate) fn set_wide(wide: bool) {
    let _ = WIDE.set(wide);
}

/// `--wide` (`--all-rows`) was given: tables over several hosts list every row too.
pub(crate) fn wide() -> bool {
    WIDE.get().copied().unwrap_or(false)
}

/// How wide stdout's lines may be: the terminal's width, or `None` (no limit) with `--wide`
/// or when stdout is not a terminal, as `ps` does.
pub(crate) fn width() -> Option<usize> {
    if wide() || !std::io::stdout().is_terminal() {
        return None;
    }
    if let Ok(ws) = rustix::termios::tcgetwinsize(std::io::stdout()) {
        if ws.ws_col > 0 {
            return Some(usize::from(ws.ws_col));
        }
    }
    std::env::var("COLUMNS").ok()?.parse().ok()
}

/// Writes `text` and a newline to stdout, through a pager when it would not fit on the
/// terminal (as git does): `$GPULOOP_PAGER`, else `$PAGER`, else `less -FRX`; an empty one, or
/// `cat`, or stdout that is not a terminal, writes it directly, as does a pager that fails to
/// start.
pub(crate) fn paged(text: &str) {
    let text = &*crate::shown::terminal(text, color_stdout());
    let rows = rustix::termios::tcgetwinsize(std::io::stdout())
        .ok()
        .map(|ws| usize::from(ws.ws_row))
        .filter(|&r| r > 0);
    let fits = rows.is_none_or(|r| text.lines().count() < r.saturating_sub(1));
    let pager = std::env::var("GPULOOP_PAGER")
        .or_else(|_| std::env::var("PAGER"))
        .unwrap_or_else(|_| "less -FRX".to_string());
    let words: Vec<&str> = pager.split_whitespace().collect();
    if fits || !std::io::stdout().is_terminal() || words.is_empty() || words == ["cat"] {
        return line(text);
    }
    let child = std::process::Command::new(words[0])
        .args(&words[1..])
        .stdin(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        return line(text);
    };
    if let Some(mut stdin) = child.stdin.take() {
        // The reader may quit (q) before reading it all: a broken pipe is not an error.
        let _ = writeln!(stdin, "{text}");
    }
    let _ = child.wait();
}

/// Writes `text` and a newline to stdout.
pub(crate) fn line(text: &str) {
    let text = crate::shown::terminal(text, color_stdout());
    write(format_args!("{text}\n"));
}

/// Writes `text` as it is, but for the controls `crate::shown::terminal` escapes.
pub(crate) fn text(text: &str) {
    write(format_args!(
        "{}",
        crate::shown::terminal(text, color_stdout())
    ));
}

/// Writes one of gpuloop's own terminal controls to stdout (`top`'s home and clear), then
/// `text` and a newline as `line` writes them, in one write: the only way a control sequence
/// other than a colour reaches stdout.
pub(crate) fn control(seq: Control, text: &str) {
    let text = crate::shown::terminal(text, color_stdout());
    write(format_args!("{}{text}\n", seq.as_str()));
}

/// Writes one of gpuloop's own terminal controls to stderr (the progress line's wipe), then
/// `text` as `err` writes it, in one write.
pub(crate) fn err_control(seq: Control, text: &str) {
    let text = crate::shown::terminal(text, color_stderr());
    err_bytes(format!("{}{text}", seq.as_str()).as_bytes());
}

/// The terminal controls gpuloop itself writes, each for its own reason; nothing another
/// user chose can be one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Back to the line's start and erase it (`\r ESC [K`): the progress line.
    WipeLine,
    /// The cursor home and the screen cleared: `top`'s next frame.
    HomeAndClear,
}

impl Control {
    fn as_str(self) -> &'static str {
        match self {
            Control::WipeLine => "\r\x1b[K",
            Control::HomeAndClear => "\x1b[H\x1b[2J",
        }
    }
}

/// Writes raw bytes: what gpuloop generated itself (completions, man pages) and a job's own
/// output, which the person who started the job reads as the job wrote it.
pub(crate) fn bytes(data: &[u8]) {
    if closed() {
        return;
    }
    if let Some(e) = started_closed() {
        return failed(&e);
    }
    // std's lock keeps whatever else writes through std (the line editor, clap) in order.
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.flush().and_then(|()| write_fd(&out, data)) {
        failed(&e);
    }
}

/// The error of a stdout that was closed when gpuloop started, which std's stdout (and
/// tokio's) writes to /dev/null without a word.
fn started_closed() -> Option<std::io::Error> {
    STARTED_CLOSED
        .load(Ordering::Relaxed)
        .then(|| std::io::Error::other("it was closed when gpuloop started"))
}

/// Why stdout cannot be written at all, for a writer that goes through std's (or tokio's)
/// stdout, which take a closed descriptor, or one open for reading only, for a sink.
pub(crate) fn unwritable() -> Option<std::io::Error> {
    use rustix::fs::OFlags;
    started_closed().or_else(|| {
        let mode = rustix::fs::fcntl_getfl(std::io::stdout()).ok()? & OFlags::RWMODE;
        (mode == OFlags::RDONLY).then(|| rustix::io::Errno::BADF.into())
    })
}

/// Writes `data` to stdout's descriptor itself: std's stdout takes a descriptor not open for
/// writing (EBADF) for a sink and says nothing.
fn write_fd(out: &impl std::os::fd::AsFd, mut data: &[u8]) -> std::io::Result<()> {
    use rustix::io::Errno;
    while !data.is_empty() {
        match rustix::io::write(out, data) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(Errno::INTR) => {}
            // A descriptor left non-blocking by whoever shares it: wait until it takes more.
            Err(Errno::AGAIN) => {
                let mut fds = [rustix::event::PollFd::new(
                    out,
                    rustix::event::PollFlags::OUT,
                )];
                let _ = rustix::event::poll(&mut fds, None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write(args: std::fmt::Arguments) {
    bytes(args.to_string().as_bytes());
}

/// A write to stdout failed: nothing more is written there; unless it is a closed pipe (the
/// reader stopped: `| head`), it is said once and the exit status becomes 1.
pub(crate) fn failed(e: &std::io::Error) {
    // Whoever read our output has stopped, or it cannot be written: nothing later can
    // reach them either.
    CLOSED.store(true, Ordering::SeqCst);
    if e.kind() != ErrorKind::BrokenPipe && FAILED.set(e.to_string()).is_ok() {
        crate::errln!("gpuloop: cannot write to stdout: {e}");
    }
}

/// Flushes what was written to stdout through std (the line editor, clap) and says whether
/// any write to stdout failed (other than on a closed pipe): the command then exits 1.
pub(crate) fn finish() -> bool {
    if let Err(e) = std::io::stdout().lock().flush() {
        failed(&e);
    }
    FAILED.get().is_some()
}

/// True once stdout is gone: scripts stop at their next statement, commands print no more.
pub(crate) fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Writes `text` to stderr, but for the controls `crate::shown::terminal` escapes. A failed
/// write is dropped: when stderr is gone (`gpuloop … 2>&1 | head -1`) there is no one left to
/// tell, and `eprint!` would panic.
pub(crate) fn err(text: &str) {
    err_bytes(crate::shown::terminal(text, color_stderr()).as_bytes());
}

fn err_bytes(data: &[u8]) {
    let _ = std::io::stderr().lock().write_all(data);
}

/// One line of live progress on stderr, rewritten in place: the one progress line (a
/// machine's wait, the hosts still to answer). Whether stderr is a terminal is asked at the
/// first line shown, so a quick operation (a script's `gpu()`) asks nothing; nothing is
/// shown where it is not.
#[derive(Default)]
pub(crate) struct ProgressLine {
    tty: Option<bool>,
    shown: bool,
}

impl ProgressLine {
    /// A line for a caller that knows stderr is a terminal.
    pub(crate) fn on_terminal() -> ProgressLine {
        ProgressLine {
            tty: Some(true),
            shown: false,
        }
    }

    fn tty(&mut self) -> bool {
        *self
            .tty
            .get_or_insert_with(|| std::io::stderr().is_terminal())
    }

    /// Shows `text` in place of what the line showed.
    pub(crate) fn show(&mut self, text: &str) {
        if self.tty() {
            err_control(Control::WipeLine, text);
            self.shown = true;
        }
    }

    /// Says `text` on a line of its own where the progress line was (show it again after).
    pub(crate) fn above(&mut self, text: &str) {
        if self.tty() {
            err_control(Control::WipeLine, &format!("{text}\n"));
            self.shown = false;
        }
    }

    /// Wipes the line, if it shows anything.
    pub(crate) fn clear(&mut self) {
        if self.shown {
            err_control(Control::WipeLine, "");
            self.shown = false;
        }
    }
}

/// stderr for the log (`-v`): what cannot be written is dropped, as by `err`. tracing reports
/// a failed write of its own with `eprintln!`, which panics on a closed pipe. A log line that
/// quotes a name or a path gets the same escapes as `err` (tracing writes a line at once).
pub(crate) struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        err(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `eprintln!` that ends quietly on a closed pipe (`output::err`).
#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => {
        $crate::output::err(&format!("{}\n", format_args!($($t)*)))
    };
}

/// `eprint!` that ends quietly on a closed pipe (`output::err`).
#[macro_export]
macro_rules! err {
    ($($t:tt)*) => {
        $crate::output::err(&format!($($t)*))
    };
}

/// `println!` that ends quietly on a closed pipe.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::output::line(&format!($($t)*))
    };
}
