//! The audit journal: one JSON line for every signal gpuloop sends, from any front end, and
//! for every MCP call, in `$XDG_STATE_HOME/gpuloop/journal.jsonl` (by default
//! `~/.local/state/gpuloop/journal.jsonl`), read back by `gpuloop journal`.
//!
//! Sites run gpuloop as root in Slurm epilogs and behind MCP, so the journal is written with
//! care: its directory is opened without following links and must be the user's own and
//! writable by nobody else; the file likewise (opened `O_NOFOLLOW`, created 0600); each record
//! is one `write` on an `O_APPEND` descriptor, so concurrent gpuloops never interleave within
//! a line; past [`MAX_BYTES`] the file is rotated to `journal.jsonl.1`. A journal that cannot
//! be written never holds a signal back: the signal goes out and gpuloop warns once.

use rustix::fs::{
    fstat, openat, renameat, statat, AtFlags, FileType, FlockOperation, Mode, OFlags,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod outcome;
pub(crate) use outcome::{CallResult, Delivery};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// The journal's file name in its directory; the rotated one adds `.1`.
pub(crate) const FILE: &str = "journal.jsonl";
const ROTATED: &str = "journal.jsonl.1";

/// Past this size the journal is rotated to `journal.jsonl.1` (the one before is dropped), so
/// the two files together stay under twice this.
pub(crate) const MAX_BYTES: u64 = 16 << 20;

/// The longest line `gpuloop journal` reads as a record; a longer one is skipped whole, so
/// a damaged or hostile file never costs more memory than this per line.
pub(crate) const MAX_LINE: usize = 64 << 10;

/// Which gpuloop sent the signal or served the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontEnd {
    /// A one-shot command: kill, clean, …
    Cli,
    /// A script: run, eval, repl, check.
    Script,
    Mcp,
    /// `gpuloop agent`, for a remote gpuloop.
    Agent,
    Epilog,
    Prolog,
}

impl FrontEnd {
    pub const ALL: [FrontEnd; 6] = [
        FrontEnd::Cli,
        FrontEnd::Script,
        FrontEnd::Mcp,
        FrontEnd::Agent,
        FrontEnd::Epilog,
        FrontEnd::Prolog,
    ];
    pub const NAMES: &'static [&'static str] =
        &["cli", "script", "mcp", "agent", "epilog", "prolog"];

    /// Its name, as the journal writes it.
    pub fn name(self) -> &'static str {
        match self {
            FrontEnd::Cli => "cli",
            FrontEnd::Script => "script",
            FrontEnd::Mcp => "mcp",
            FrontEnd::Agent => "agent",
            FrontEnd::Epilog => "epilog",
            FrontEnd::Prolog => "prolog",
        }
    }
}

impl FromStr for FrontEnd {
    type Err = String;
    fn from_str(s: &str) -> Result<FrontEnd, String> {
        FrontEnd::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown front end {s:?} (one of {})",
                    FrontEnd::NAMES.join(", ")
                )
            })
    }
}

/// Who ran gpuloop: the effective user, the one whose rights the signals carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Invoker {
    pub uid: u32,
    pub name: String,
}

/// The process a signal went to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Target {
    pub pid: i64,
    /// Start time in clock ticks since boot: with the pid, the identity.
    pub start: u64,
    pub comm: String,
    /// Its owner; `None` when it could not be read (it had exited).
    pub uid: Option<u32>,
}

/// One signal sent, or not delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Signal {
    pub target: Target,
    pub signal: String,
    /// Why the target was chosen: "holder of GPU 0", "child of pid 41 (python3)", "bare pid".
    pub why: String,
    pub outcome: Delivery,
}

/// One MCP call, as appended after it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Call {
    pub tool: String,
    pub arguments: Value,
    /// Pids signalled by the call (empty for reads and dry runs).
    pub signalled: Vec<i64>,
    pub result: CallResult,
    /// The one-line summary the model got (or the error).
    pub summary: String,
    pub elapsed_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum Event {
    Signal(Signal),
    Call(Call),
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// UTC, RFC 3339 with milliseconds.
    pub time: String,
    pub host: String,
    pub user: Invoker,
    pub front_end: FrontEnd,
    /// gpuloop's command line (for MCP and the agent: the server's).
    pub argv: Vec<String>,
    /// What was asked of a server: the MCP tool call, or the remote client's request (with
    /// the client's `SSH_CONNECTION` where ssh set it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<Value>,
    /// The gpuloop process that wrote it: tells one session's records from another's.
    pub gpuloop_pid: i64,
    #[serde(flatten)]
    pub event: Event,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    #[error("no state directory for the journal (set XDG_STATE_HOME or HOME)")]
    NoStateDir,
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("journal {path}: {why}; refused (remove it, and let gpuloop create it again)")]
    NotOurs { path: PathBuf, why: String },
}

/// The process's front end and command line, set once by the command line.
struct Context {
    front_end: FrontEnd,
    argv: Vec<String>,
    /// For the agent: the client's `SSH_CONNECTION`.
    client: Option<String>,
}

static CONTEXT: OnceLock<Context> = OnceLock::new();

/// Turns the journal on for this process: every signal from now on is journaled as sent by
/// `front_end`, run as `argv`. Library use without this (unit tests) journals nothing.
pub(crate) fn start(front_end: FrontEnd, argv: Vec<String>) {
    let client = (front_end == FrontEnd::Agent)
        .then(|| std::env::var("SSH_CONNECTION").ok())
        .flatten();
    let _ = CONTEXT.set(Context {
        front_end,
        argv,
        client,
    });
}

/// The environment variable that tells a helper gpuloop (the guard) the front end of the
/// gpuloop it acts for.
pub(crate) const FRONT_END_ENV: &str = "GPULOOP_JOURNAL_FRONT_END";

/// This process's front end, for a helper it starts (set as [`FRONT_END_ENV`] on the helper).
pub(crate) fn front_end_name() -> Option<&'static str> {
    Some(CONTEXT.get()?.front_end.name())
}

/// The front end a helper was started for.
pub(crate) fn inherited() -> Option<FrontEnd> {
    std::env::var(FRONT_END_ENV).ok()?.parse().ok()
}

/// The server call (an MCP tool call, a remote client's request) that a kill or a job is
/// carried out for: every signal it leads to is journaled with it. It travels with the kill's
/// options and the job's, never in a global.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub front_end: FrontEnd,
    pub call: Arc<Value>,
}

impl Served {
    pub(crate) fn new(front_end: FrontEnd, call: Value) -> Served {
        Served {
            front_end,
            call: Arc::new(call),
        }
    }
}

/// `$XDG_STATE_HOME/gpuloop`, by default `~/.local/state/gpuloop`.
pub(crate) fn dir() -> Result<PathBuf, JournalError> {
    dirs::state_dir()
        .map(|d| d.join("gpuloop"))
        .ok_or(JournalError::NoStateDir)
}

/// Journals one signal (sent, or tried) when the journal is on, with the server call it was
/// sent for. A journal that cannot be written is warned about once, and never holds a
/// signal back.
pub(crate) fn signal(
    target: Target,
    signal: &str,
    why: &str,
    outcome: Delivery,
    served: Option<&Served>,
) {
    let Some(ctx) = CONTEXT.get() else { return };
    let event = Event::Signal(Signal {
        target,
        signal: signal.to_string(),
        why: why.to_string(),
        outcome,
    });
    let written = dir().and_then(|d| append(&d, &record(ctx, event, served)));
    if let Err(e) = written {
        warn_once(&e);
    }
}

/// Journals an MCP call that ended. The error is the caller's to report.
pub(crate) fn call(dir: &Path, call: Call) -> Result<(), JournalError> {
    let fallback = Context {
        front_end: FrontEnd::Mcp,
        argv: std::env::args().collect(),
        client: None,
    };
    let ctx = CONTEXT.get().unwrap_or(&fallback);
    append(dir, &record(ctx, Event::Call(call), None))
}

fn warn_once(e: &JournalError) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    tracing::warn!("{e}");
    if !WARNED.swap(true, Ordering::Relaxed) {
        crate::errln!("gpuloop: warning: signals are not journaled: {e}");
    }
}

fn record(ctx: &Context, event: Event, served: Option<&Served>) -> Record {
    // Looked up once: a user database lookup (NSS, LDAP) between two signals holds the second
    // back.
    static INVOKER: std::sync::OnceLock<Invoker> = std::sync::OnceLock::new();
    let user = INVOKER.get_or_init(|| {
        let uid = rustix::process::geteuid().as_raw();
        Invoker {
            uid,
            name: crate::process::user_name(uid),
        }
    });
    let (front_end, mut call) = match served {
        Some(s) => (s.front_end, Some(Value::clone(&s.call))),
        None => (ctx.front_end, None),
    };
    if let (Some(client), Some(Value::Object(m))) = (&ctx.client, call.as_mut()) {
        m.insert("ssh_connection".into(), Value::String(client.clone()));
    }
    Record {
        time: now_utc(),
        host: host().to_string(),
        user: user.clone(),
        front_end,
        argv: ctx.argv.clone(),
        call,
        gpuloop_pid: i64::from(std::process::id()),
        event,
    }
}

/// This machine's name, read once.
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "?".into())
    })
}

/// Opens gpuloop's state directory `dir` (created 0700 if missing) without following a link,
/// and checks it is ours: owned by this user, writable by nobody else.
fn open_dir(dir: &Path) -> Result<OwnedFd, JournalError> {
    let io = |source: std::io::Error| JournalError::Io {
        path: dir.to_path_buf(),
        source,
    };
    if let Some(parent) = dir.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io)?;
    }
    match rustix::fs::mkdir(dir, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(io(e.into())),
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => JournalError::NotOurs {
            path: dir.to_path_buf(),
            why: "a symbolic link or not a directory".into(),
        },
        e => io(e.into()),
    })?;
    ours(&fd, dir, FileType::Directory)?;
    Ok(fd)
}

/// Refuses what is not ours: of another type, owned by another user, writable by group or
/// others, or (a file) with other hard links.
fn ours(fd: &OwnedFd, path: &Path, kind: FileType) -> Result<rustix::fs::Stat, JournalError> {
    let st = fstat(fd).map_err(|e| JournalError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let refuse = |why: String| {
        Err(JournalError::NotOurs {
            path: path.to_path_buf(),
            why,
        })
    };
    let euid = rustix::process::geteuid().as_raw();
    if FileType::from_raw_mode(st.st_mode) != kind {
        return refuse(format!("not a {}", what(kind)));
    }
    if st.st_uid != euid {
        return refuse(format!("owned by uid {}, not by uid {euid}", st.st_uid));
    }
    if st.st_mode & 0o022 != 0 {
        return refuse(format!(
            "writable by others (mode {:o})",
            st.st_mode & 0o7777
        ));
    }
    if kind == FileType::RegularFile && st.st_nlink > 1 {
        return refuse(format!("it has {} hard links", st.st_nlink));
    }
    Ok(st)
}

fn what(kind: FileType) -> &'static str {
    match kind {
        FileType::Directory => "directory",
        _ => "regular file",
    }
}

/// How [`open_file`] opens a file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    /// For appending, created 0600 if missing.
    Append,
    /// For reading; `None` if missing.
    Read,
    /// For reading and rewriting, created 0600 if missing.
    Update,
}

/// Opens `name` in the directory `dirfd` without following a link (and never waiting on a
/// FIFO), as `how` says.
fn open_file(
    dirfd: &OwnedFd,
    dir: &Path,
    name: &str,
    how: Open,
) -> Result<Option<OwnedFd>, JournalError> {
    let path = dir.join(name);
    let flags = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let flags = match how {
        Open::Append => flags | OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE,
        Open::Read => flags | OFlags::RDONLY,
        Open::Update => flags | OFlags::RDWR | OFlags::CREATE,
    };
    let fd = match openat(dirfd, name, flags, Mode::from_raw_mode(0o600)) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) if how == Open::Read => return Ok(None),
        Err(rustix::io::Errno::LOOP) => {
            return Err(JournalError::NotOurs {
                path,
                why: "a symbolic link".into(),
            })
        }
        Err(e) => {
            return Err(JournalError::Io {
                path,
                source: e.into(),
            })
        }
    };
    ours(&fd, &path, FileType::RegularFile)?;
    Ok(Some(fd))
}

/// Opens the state directory `dir` for reading, if it exists, as [`open_dir`] does (no link
/// followed, ours alone) but creating nothing.
fn open_existing_dir(dir: &Path) -> Result<Option<OwnedFd>, JournalError> {
    let dirfd = match rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            return Err(JournalError::NotOurs {
                path: dir.to_path_buf(),
                why: "a symbolic link or not a directory".into(),
            })
        }
        Err(e) => {
            return Err(JournalError::Io {
                path: dir.to_path_buf(),
                source: e.into(),
            })
        }
    };
    ours(&dirfd, dir, FileType::Directory)?;
    Ok(Some(dirfd))
}

/// Reads at most `max` bytes of a small state file `name` kept beside the journal in `dir`,
/// with the journal's care (no link followed, ours alone); `None` when there is none.
pub(crate) fn read_state(
    dir: &Path,
    name: &str,
    max: u64,
) -> Result<Option<Vec<u8>>, JournalError> {
    let Some(dirfd) = open_existing_dir(dir)? else {
        return Ok(None);
    };
    let Some(fd) = open_file(&dirfd, dir, name, Open::Read)? else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .take(max)
        .read_to_end(&mut buf)
        .map_err(|source| JournalError::Io {
            path: dir.join(name),
            source,
        })?;
    Ok(Some(buf))
}

/// Rewrites the state file `name` in `dir` (created 0600, as the journal is) with what
/// `change` makes of its first `max` bytes, under a lock on the file, so concurrent gpuloops
/// each see the other's change.
pub(crate) fn update_state(
    dir: &Path,
    name: &str,
    max: u64,
    change: impl FnOnce(&[u8]) -> Vec<u8>,
) -> Result<(), JournalError> {
    let path = dir.join(name);
    let io = |source: std::io::Error| JournalError::Io {
        path: path.clone(),
        source,
    };
    let dirfd = open_dir(dir)?;
    let fd = open_file(&dirfd, dir, name, Open::Update)?.ok_or_else(|| io(not_found()))?;
    rustix::fs::flock(&fd, FlockOperation::LockExclusive).map_err(|e| io(e.into()))?;
    let mut file = std::fs::File::from(fd);
    let mut old = Vec::new();
    (&mut file).take(max).read_to_end(&mut old).map_err(io)?;
    let new = change(&old);
    file.set_len(0).map_err(io)?;
    std::os::unix::fs::FileExt::write_all_at(&file, &new, 0).map_err(io)?;
    Ok(())
}

/// Appends `record` to the journal in `dir` as one line, in one write; rotates it first when
/// it has grown past [`MAX_BYTES`].
pub(crate) fn append(dir: &Path, record: &Record) -> Result<(), JournalError> {
    let mut line = serde_json::to_vec(record).map_err(|e| JournalError::Io {
        path: dir.join(FILE),
        source: e.into(),
    })?;
    line.push(b'\n');
    append_line(dir, &line, MAX_BYTES)
}

fn append_line(dir: &Path, line: &[u8], max: u64) -> Result<(), JournalError> {
    let path = dir.join(FILE);
    let io = |source: std::io::Error| JournalError::Io {
        path: path.clone(),
        source,
    };
    let dirfd = open_dir(dir)?;
    let mut fd = open_file(&dirfd, dir, FILE, Open::Append)?.ok_or_else(|| io(not_found()))?;
    if fstat(&fd).map_err(|e| io(e.into()))?.st_size as u64 + line.len() as u64 > max {
        rotate(&dirfd, &fd).map_err(|e| io(e.into()))?;
        fd = open_file(&dirfd, dir, FILE, Open::Append)?.ok_or_else(|| io(not_found()))?;
    }
    let n = rustix::io::write(&fd, line).map_err(|e| io(e.into()))?;
    if n != line.len() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            format!("wrote {n} of {} bytes (disk full?)", line.len()),
        )));
    }
    Ok(())
}

fn not_found() -> std::io::Error {
    std::io::ErrorKind::NotFound.into()
}

/// Moves the full journal `fd` to `journal.jsonl.1`, under a lock on the directory so that of
/// several gpuloops rotating at once one does it, and only if `journal.jsonl` is still that
/// file (another may have rotated it already).
fn rotate(dirfd: &OwnedFd, fd: &OwnedFd) -> rustix::io::Result<()> {
    rustix::fs::flock(dirfd, FlockOperation::LockExclusive)?;
    let mine = fstat(fd)?;
    let now = statat(dirfd, FILE, AtFlags::SYMLINK_NOFOLLOW);
    let result = match now {
        Ok(st) if st.st_ino == mine.st_ino && st.st_dev == mine.st_dev => {
            renameat(dirfd, FILE, dirfd, ROTATED)
        }
        _ => Ok(()),
    };
    let _ = rustix::fs::flock(dirfd, FlockOperation::Unlock);
    result
}

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
        return Ok(rfc3339(at as i64, 0));
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

/// What reading the journal found, besides the records.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Found {
    /// Lines that are not records (damaged, of another version, or longer than MAX_LINE).
    pub bad: usize,
    /// Records that matched the filter, shown or not.
    pub matched: usize,
}

/// Streams the journal in `dir` (the rotated file, then the current one), oldest first,
/// giving each record that matches `filter` to `each`; reads one line at a time, each at most
/// [`MAX_LINE`], so a huge or damaged journal costs time, never memory.
pub(crate) fn read(
    dir: &Path,
    filter: &Filter,
    each: &mut dyn FnMut(Record),
) -> Result<Found, JournalError> {
    let mut found = Found::default();
    let Some(dirfd) = open_existing_dir(dir)? else {
        return Ok(found);
    };
    for name in [ROTATED, FILE] {
        let Some(fd) = open_file(&dirfd, dir, name, Open::Read)? else {
            continue;
        };
        let path = dir.join(name);
        let mut lines = BufReader::with_capacity(MAX_LINE, std::fs::File::from(fd));
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = (&mut lines)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|source| JournalError::Io {
                    path: path.clone(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE {
                skip_line(&mut lines).map_err(|source| JournalError::Io {
                    path: path.clone(),
                    source,
                })?;
                found.bad += 1;
                continue;
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Record>(&buf) {
                Ok(r) if filter.matches(&r) => {
                    found.matched += 1;
                    each(r)
                }
                Ok(_) => {}
                Err(_) => found.bad += 1,
            }
        }
    }
    Ok(found)
}

/// Reads past the rest of an over-long line, a buffer at a time.
fn skip_line(r: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match memchr::memchr(b'\n', buf) {
            Some(i) => {
                r.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
}

/// The last `n` records matching `filter` (all of them for 0, streamed to `each` as read).
pub(crate) fn last(
    dir: &Path,
    filter: &Filter,
    n: usize,
    each: &mut dyn FnMut(Record),
) -> Result<Found, JournalError> {
    if n == 0 {
        return read(dir, filter, each);
    }
    let mut kept = VecDeque::with_capacity(n.min(1024));
    let found = read(dir, filter, &mut |r| {
        if kept.len() == n {
            kept.pop_front();
        }
        kept.push_back(r);
    })?;
    kept.into_iter().for_each(each);
    Ok(found)
}

/// One record for people.
pub(crate) fn line(r: &Record) -> String {
    let head = format!(
        "{} {} {}({}) {}",
        r.time,
        r.host,
        r.user.name,
        r.user.uid,
        r.front_end.name()
    );
    match &r.event {
        Event::Signal(s) => {
            let t = &s.target;
            let owner = t.uid.map_or_else(|| "?".into(), crate::process::user_name);
            format!(
                "{head} {} -> pid {} ({}, {owner}, start {}): {} [{}] {}",
                s.signal,
                t.pid,
                t.comm,
                t.start,
                s.outcome,
                s.why,
                r.asked()
            )
        }
        Event::Call(c) => {
            let signalled = if c.signalled.is_empty() {
                String::new()
            } else {
                let pids: Vec<String> = c.signalled.iter().map(|p| p.to_string()).collect();
                format!(" signalled [{}]", pids.join(","))
            };
            format!(
                "{head} {} {}{signalled} {} ({} ms, server {}): {}",
                c.tool, c.result, c.arguments, c.elapsed_ms, r.gpuloop_pid, c.summary
            )
        }
    }
}

impl Record {
    /// What asked for the signal: the server call, or the command line.
    fn asked(&self) -> String {
        match &self.call {
            Some(c) => format!("call {c}"),
            None => format!("`{}`", self.argv.join(" ")),
        }
    }
}

/// Now as "2026-11-30T09:41:07.123Z".
pub(crate) fn now_utc() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

/// Seconds since the epoch as "2026-11-30T09:41:07Z" (a kernel log event's time, in advice).
pub(crate) fn utc(secs: f64) -> String {
    let s = rfc3339(secs.floor() as i64, 0);
    format!("{}Z", s.get(..19).unwrap_or(&s))
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
    use std::io::Write;

    #[test]
    fn formats_utc_times() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_796_030_467.9), "2026-11-30T09:21:07Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_796_030_467, 123), "2026-11-30T09:21:07.123Z");
    }

    fn record(pid: i64, front_end: FrontEnd) -> Record {
        Record {
            time: now_utc(),
            host: "n1".into(),
            user: Invoker {
                uid: 0,
                name: "root".into(),
            },
            front_end,
            argv: vec!["gpuloop".into(), "kill".into()],
            call: None,
            gpuloop_pid: 1,
            event: Event::Signal(Signal {
                target: Target {
                    pid,
                    start: 7,
                    comm: "python3".into(),
                    uid: Some(1000),
                },
                signal: "TERM".into(),
                why: "bare pid".into(),
                outcome: Delivery::Delivered,
            }),
        }
    }

    fn all(dir: &Path, filter: &Filter) -> (Vec<Record>, Found) {
        let mut got = Vec::new();
        let found = read(dir, filter, &mut |r| got.push(r)).unwrap();
        (got, found)
    }

    #[test]
    fn appends_lines_and_reads_them_back_skipping_bad_ones() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("state").join("gpuloop");
        let (a, b) = (record(41, FrontEnd::Cli), record(42, FrontEnd::Mcp));
        append(&dir, &a).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(FILE))
            .unwrap()
            .write_all(b"not json\n")
            .unwrap();
        append(&dir, &b).unwrap();
        let (got, found) = all(&dir, &Filter::default());
        assert_eq!(got, vec![a.clone(), b.clone()]);
        assert_eq!(found.bad, 1);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&dir.join(FILE))), (0o700, 0o600));
        // Filters: pid, front end, user.
        let by = |f: Filter| all(&dir, &f).0;
        assert_eq!(
            by(Filter {
                pid: Some(42),
                ..Filter::default()
            }),
            vec![b.clone()]
        );
        let mcp = Filter {
            front_end: Some(FrontEnd::Mcp),
            ..Filter::default()
        };
        assert_eq!(by(mcp), vec![b.clone()]);
        assert_eq!(
            by(Filter {
                user: Some("0".into()),
                ..Filter::default()
            })
            .len(),
            2
        );
        assert!(by(Filter {
            user: Some("nobody".into()),
            ..Filter::default()
        })
        .is_empty());
        assert!(by(Filter {
            since: Some("2999-01-01".into()),
            ..Filter::default()
        })
        .is_empty());
        assert_eq!(all(&top.path().join("none"), &Filter::default()).0, vec![]);
    }

    /// The journal followed symbolic links: a linked journal.jsonl was appended to, a dangling
    /// one created, a linked state directory written into.
    #[test]
    fn the_journal_follows_symlinks_no_more() {
        let top = tempfile::tempdir().unwrap();
        let victim = top.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let dir = top.path().join("state").join("gpuloop");
        std::fs::create_dir_all(&dir).unwrap();
        let journal = dir.join(FILE);
        let r = record(41, FrontEnd::Cli);
        std::os::unix::fs::symlink(&victim, &journal).unwrap();
        let e = append(&dir, &r).unwrap_err().to_string();
        assert!(e.contains("a symbolic link; refused"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        // Reading refuses it too.
        assert!(read(&dir, &Filter::default(), &mut |_| {}).is_err());
        std::fs::remove_file(&journal).unwrap();
        let dangling = top.path().join("dangling");
        std::os::unix::fs::symlink(&dangling, &journal).unwrap();
        assert!(append(&dir, &r).is_err(), "created through a link");
        assert!(!dangling.exists());
        let elsewhere = top.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let linked = top.path().join("linked");
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        let e = append(&linked, &r).unwrap_err().to_string();
        assert!(e.contains("a symbolic link or not a directory"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    /// A state file beside the journal is kept as the journal is: 0600, rewritten whole, never
    /// read or written through a link.
    #[test]
    fn a_state_file_is_the_users_alone_and_follows_no_link() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("state").join("gpuloop");
        assert_eq!(read_state(&dir, "s.json", 100).unwrap(), None);
        assert!(!dir.exists(), "reading creates nothing");
        update_state(&dir, "s.json", 100, |old| [old, b"long"].concat()).unwrap();
        update_state(&dir, "s.json", 100, |old| {
            assert_eq!(old, b"long");
            b"ab".to_vec()
        })
        .unwrap();
        assert_eq!(read_state(&dir, "s.json", 100).unwrap().unwrap(), b"ab");
        assert_eq!(read_state(&dir, "s.json", 1).unwrap().unwrap(), b"a");
        let mode = std::fs::metadata(dir.join("s.json")).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let victim = top.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("l.json")).unwrap();
        let e = update_state(&dir, "l.json", 100, |_| b"x".to_vec()).unwrap_err();
        assert!(e.to_string().contains("a symbolic link; refused"), "{e}");
        assert!(read_state(&dir, "l.json", 100).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    }

    /// A directory or journal that others may write (or another user owns) is not ours.
    #[test]
    fn a_journal_or_directory_that_is_not_ours_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("gpuloop");
        let r = record(41, FrontEnd::Cli);
        append(&dir, &r).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = append(&dir, &r).unwrap_err().to_string();
        assert!(e.contains("writable by others (mode 777)"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(dir.join(FILE), std::fs::Permissions::from_mode(0o622)).unwrap();
        assert!(append(&dir, &r)
            .unwrap_err()
            .to_string()
            .contains("writable by others"));
        std::fs::set_permissions(dir.join(FILE), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(dir.join(FILE), top.path().join("other")).unwrap();
        assert!(append(&dir, &r)
            .unwrap_err()
            .to_string()
            .contains("hard links"));
        std::fs::remove_file(top.path().join("other")).unwrap();
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(dir.join(FILE), Some(65534), None).unwrap();
            let e = append(&dir, &r).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534, not by uid 0"), "{e}");
        }
    }

    #[test]
    fn the_journal_rotates_past_its_size_and_reads_both_files() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("gpuloop");
        let line = |pid| {
            let mut l = serde_json::to_vec(&record(pid, FrontEnd::Cli)).unwrap();
            l.push(b'\n');
            l
        };
        let max = 3 * line(1).len() as u64;
        for pid in 1..=7 {
            append_line(&dir, &line(pid), max).unwrap();
        }
        let size = |n: &str| std::fs::metadata(dir.join(n)).unwrap().len();
        assert!(size(FILE) <= max && size(ROTATED) <= max);
        // The oldest were dropped with the second rotation; the rest read in order.
        let pids: Vec<i64> = all(&dir, &Filter::default())
            .0
            .iter()
            .map(|r| match &r.event {
                Event::Signal(s) => s.target.pid,
                Event::Call(_) => 0,
            })
            .collect();
        assert_eq!(pids, vec![4, 5, 6, 7]);
    }

    /// `gpuloop journal` on a huge journal aborted (134): it read it whole.
    #[test]
    fn a_huge_line_is_skipped_and_the_last_records_are_kept_in_bounded_memory() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("gpuloop");
        append(&dir, &record(1, FrontEnd::Cli)).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(FILE))
            .unwrap();
        f.write_all(&vec![b'x'; 3 * MAX_LINE]).unwrap();
        f.write_all(b"\n").unwrap();
        drop(f);
        for pid in 2..=5 {
            append(&dir, &record(pid, FrontEnd::Cli)).unwrap();
        }
        let mut got = Vec::new();
        let found = last(&dir, &Filter::default(), 2, &mut |r| got.push(r)).unwrap();
        assert_eq!((found.bad, found.matched, got.len()), (1, 5, 2));
    }

    #[test]
    fn front_end_names_are_the_journals() {
        for (f, n) in FrontEnd::ALL.into_iter().zip(FrontEnd::NAMES) {
            assert_eq!((f.name(), n.parse::<FrontEnd>()), (*n, Ok(f)));
            assert_eq!(serde_json::to_value(f).unwrap(), *n);
        }
        assert!("web".parse::<FrontEnd>().is_err());
    }

    #[test]
    fn since_takes_a_utc_time_or_an_age() {
        assert_eq!(parse_since("2026-12-01").unwrap(), "2026-12-01");
        assert_eq!(
            parse_since("2026-12-01T14:05Z").unwrap(),
            "2026-12-01T14:05"
        );
        assert!(parse_since("10m").unwrap() < now_utc());
        for bad in ["yesterday", "2026-1-1", "10x", "m", "2026-12-01T"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }
}
