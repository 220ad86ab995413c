//! The audit journal: one JSON line for every signal gpuloop sends, from any front end, and
//! for every MCP call, in `$XDG_STATE_HOME/gpuloop/journal.jsonl` (by default
//! `~/.local/state/gpuloop/journal.jsonl`), read back by `gpuloop journal`.
//!
//! Sites run gpuloop as root in Slurm epilogs and behind MCP, so the journal is written with
//! care: its directory is opened without following links and must be the user's own and
//! writable by nobody else; the file likewise (opened `O_NOFOLLOW`, created 0600); each record
//! is one `write` on an `O_APPEND` descriptor under a lock on the file, so concurrent gpuloops
//! never interleave within a line, and is written whole or not at all (a short write on a full
//! disk is cut back off); past [`MAX_BYTES`] the file is rotated to `journal.jsonl.1`. A
//! journal that cannot be written never holds a signal back: the signal goes out and gpuloop
//! warns once. A signal's record is written by a thread of the journal's own, which a kill
//! waits for at most a few seconds ([`flush`]): a file system that hangs holds back no signal.

pub(crate) mod files;
mod filter;
mod read;
mod show;
mod state;

pub(crate) use filter::{parse_since, Filter};
pub(crate) use read::last;
pub(crate) use show::line;
pub(crate) use state::{read_state, update_state};

use files::{open_dir, open_file, Open};
use rustix::fs::{fstat, renameat, statat, AtFlags, FlockOperation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod outcome;
pub(crate) use outcome::{CallResult, Delivery};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The journal's file name in its directory; the rotated one adds `.1`.
pub(crate) const FILE: &str = "journal.jsonl";
const ROTATED: &str = "journal.jsonl.1";

/// Past this size the journal is rotated to `journal.jsonl.1` (the one before is dropped), so
/// the two files together stay under twice this.
pub(crate) const MAX_BYTES: u64 = 16 << 20;

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
/// sent for: queued for the journal's writer ([`flush`] waits for it). A journal that cannot
/// be written is warned about once, and never holds a signal back.
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
    let Some(writer) = signals() else { return };
    match serde_json::to_vec(&record(ctx, event, served)) {
        Ok(mut line) => {
            line.push(b'\n');
            writer.send(line);
        }
        Err(e) => warn_once(&JournalError::Io {
            path: PathBuf::from(FILE),
            source: e.into(),
        }),
    }
}

/// How long a kill waits for the journal to take the records of the signals it sent.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

static WRITER: OnceLock<Option<files::Appender>> = OnceLock::new();

/// The writer of the signals' records, started at the first: a thread of its own, so that a
/// state directory on a file system that hangs holds back no signal.
fn signals() -> Option<&'static files::Appender> {
    WRITER
        .get_or_init(|| {
            let dir = dir().map_err(|e| warn_once(&e)).ok()?;
            files::Appender::start("gpuloop-journal", move |line| {
                if let Err(e) = append_line(&dir, line, MAX_BYTES) {
                    warn_once(&e);
                }
                files::Wrote::On
            })
            .map_err(|e| {
                warn_once(&JournalError::Io {
                    path: PathBuf::from(FILE),
                    source: e,
                })
            })
            .ok()
        })
        .as_ref()
}

/// Waits until the signals journaled so far are written: at most [`DEADLINE`], and no longer
/// than the next interrupt (one that came before, which may be what a kill stops a job for,
/// does not cut it short). A journal that misses the deadline is given up, said once.
pub(crate) fn flush() {
    // Nothing was journaled by this process yet: nothing to wait for.
    let Some(Some(writer)) = WRITER.get() else {
        return;
    };
    let since = crate::interrupt::After::now();
    if writer.flush(DEADLINE, &|| since.came()) == files::Flushed::Late {
        warn_once(&JournalError::Io {
            path: PathBuf::from(FILE),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no record was written within {} s (a file system that hangs?); this gpuloop journals no more",
                    DEADLINE.as_secs()
                ),
            ),
        });
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
        time: crate::utc::now(),
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
    files::append_whole(&fd, line).map_err(io)
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

#[cfg(test)]
pub(super) mod tests {
    use super::read::{read, Found, MAX_LINE};
    use super::*;
    use std::io::Write;

    pub(crate) fn record(pid: i64, front_end: FrontEnd) -> Record {
        Record {
            time: crate::utc::now(),
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

    /// A record cut short (a full disk, a crash) with the next one glued to it: the reader
    /// skipped the whole line, and so lost the whole record after the partial one.
    #[test]
    fn a_record_glued_to_a_partial_one_is_read_and_the_next_append_starts_a_line() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("gpuloop");
        let (a, b, c) = (
            record(41, FrontEnd::Cli),
            record(42, FrontEnd::Mcp),
            record(43, FrontEnd::Cli),
        );
        append(&dir, &a).unwrap();
        let whole = serde_json::to_vec(&b).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(FILE))
            .unwrap();
        // Half of a record (its call carries a map whose first key is "time" too), then B.
        let mut cut = record(40, FrontEnd::Mcp);
        cut.call = Some(serde_json::json!({"time": "x", "tool": "kill"}));
        let cut = serde_json::to_vec(&cut).unwrap();
        f.write_all(&cut[..cut.len() * 2 / 3]).unwrap();
        f.write_all(&whole).unwrap();
        f.write_all(b"\n").unwrap();
        // Then a partial line with no newline at the end of the file: the next append must
        // not be glued to it.
        f.write_all(&whole[..whole.len() / 2]).unwrap();
        drop(f);
        append(&dir, &c).unwrap();
        let (got, found) = all(&dir, &Filter::default());
        assert_eq!(got, vec![a, b, c]);
        assert_eq!(found.bad, 2);
    }

    #[test]
    fn front_end_names_are_the_journals() {
        for (f, n) in FrontEnd::ALL.into_iter().zip(FrontEnd::NAMES) {
            assert_eq!((f.name(), n.parse::<FrontEnd>()), (*n, Ok(f)));
            assert_eq!(serde_json::to_value(f).unwrap(), *n);
        }
        assert!("web".parse::<FrontEnd>().is_err());
    }
}
