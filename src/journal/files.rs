//! Opening the files gpuloop writes (the state directory and the journal beside it, the signal
//! log, a script's `write_file`, the man pages) and the driver library it loads, with care: no
//! link another account planted is followed, no FIFO waited on, and only what is this user's
//! own (or root's, where an administrator set it up) and writable by nobody else.

use super::JournalError;
use rustix::fs::{fstat, openat, statat, AtFlags, FileType, FlockOperation, Mode, OFlags, Stat};
use rustix::io::Errno;
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// Who may own a file besides this user.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Owners {
    /// This user alone: the state directory and its files.
    Me,
    /// This user or root: a file an administrator set up (the signal log, the driver library).
    MeOrRoot,
}

/// A file gpuloop would not open, or could not.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {why}; refused", path.display())]
    Refused { path: PathBuf, why: String },
}

impl FileError {
    fn io(path: &Path, e: Errno) -> FileError {
        FileError::Io {
            path: path.to_path_buf(),
            source: e.into(),
        }
    }

    fn refused(path: &Path, why: impl Into<String>) -> FileError {
        FileError::Refused {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
}

impl From<FileError> for JournalError {
    fn from(e: FileError) -> JournalError {
        match e {
            FileError::Io { path, source } => JournalError::Io { path, source },
            FileError::Refused { path, why } => JournalError::NotOurs { path, why },
        }
    }
}

/// Why `st` (of a `kind` gpuloop opened) is not to be trusted, if it is not: of another type,
/// owned by another account, writable by group or others, or (a file) with other hard links,
/// through which another account could reach it.
fn distrust(st: &Stat, kind: FileType, owners: Owners) -> Option<String> {
    let euid = rustix::process::geteuid().as_raw();
    let found = FileType::from_raw_mode(st.st_mode);
    if found != kind {
        return Some(format!("{}, not {}", what(found), what(kind)));
    }
    let owner_ok = st.st_uid == euid || (owners == Owners::MeOrRoot && st.st_uid == 0);
    if !owner_ok {
        return Some(match owners {
            Owners::Me => format!("owned by uid {}, not by uid {euid}", st.st_uid),
            Owners::MeOrRoot => format!("owned by uid {}, not by uid {euid} or root", st.st_uid),
        });
    }
    if st.st_mode & 0o022 != 0 {
        return Some(format!(
            "writable by others (mode {:o})",
            st.st_mode & 0o7777
        ));
    }
    if kind == FileType::RegularFile && st.st_nlink > 1 {
        return Some(format!("it has {} hard links", st.st_nlink));
    }
    None
}

/// `fd`'s status, refused (as [`distrust`] says) when it is not to be trusted.
fn trusted(fd: &OwnedFd, path: &Path, kind: FileType, owners: Owners) -> Result<Stat, FileError> {
    let st = fstat(fd).map_err(|e| FileError::io(path, e))?;
    match distrust(&st, kind, owners) {
        Some(why) => Err(FileError::refused(path, why)),
        None => Ok(st),
    }
}

fn what(kind: FileType) -> &'static str {
    match kind {
        FileType::Directory => "a directory",
        FileType::RegularFile => "a regular file",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown type",
    }
}

/// Opens gpuloop's state directory `dir` (created 0700 if missing) without following a link,
/// and checks it is ours: owned by this user, writable by nobody else.
pub(crate) fn open_dir(dir: &Path) -> Result<OwnedFd, JournalError> {
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
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(io(e.into())),
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => JournalError::NotOurs {
            path: dir.to_path_buf(),
            why: "a symbolic link or not a directory".into(),
        },
        e => io(e.into()),
    })?;
    trusted(&fd, dir, FileType::Directory, Owners::Me)?;
    Ok(fd)
}

/// How [`open_file`] opens a file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// For appending, created 0600 if missing.
    Append,
    /// For reading; `None` if missing.
    Read,
    /// For reading and rewriting, created 0600 if missing.
    Update,
}

/// Opens `name` in the directory `dirfd` without following a link (and never waiting on a
/// FIFO), as `how` says, and checks it is `owners`' and writable by nobody else.
fn open_in(
    dirfd: &OwnedFd,
    path: &Path,
    name: &OsStr,
    how: Open,
    owners: Owners,
) -> Result<Option<OwnedFd>, FileError> {
    let flags = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let flags = match how {
        // Read too: an append looks at the last byte (`append_whole`).
        Open::Append => flags | OFlags::RDWR | OFlags::APPEND | OFlags::CREATE,
        Open::Read => flags | OFlags::RDONLY,
        Open::Update => flags | OFlags::RDWR | OFlags::CREATE,
    };
    let fd = match openat(dirfd, name, flags, Mode::from_raw_mode(0o600)) {
        Ok(fd) => fd,
        Err(Errno::NOENT) if how == Open::Read => return Ok(None),
        Err(Errno::LOOP) => return Err(FileError::refused(path, "a symbolic link")),
        // A FIFO opened for writing without blocking, with no reader.
        Err(Errno::NXIO) => return Err(FileError::refused(path, "not a regular file")),
        Err(e) => return Err(FileError::io(path, e)),
    };
    trusted(&fd, path, FileType::RegularFile, owners)?;
    Ok(Some(fd))
}

/// Opens `name` in gpuloop's state directory `dirfd` (at `dir`), as `how` says: not through a
/// link, never waiting on a FIFO, and only if it is this user's alone.
pub(crate) fn open_file(
    dirfd: &OwnedFd,
    dir: &Path,
    name: &str,
    how: Open,
) -> Result<Option<OwnedFd>, JournalError> {
    Ok(open_in(
        dirfd,
        &dir.join(name),
        name.as_ref(),
        how,
        Owners::Me,
    )?)
}

/// Opens the state directory `dir` for reading, if it exists, as [`open_dir`] does (no link
/// followed, ours alone) but creating nothing.
pub(crate) fn open_existing_dir(dir: &Path) -> Result<Option<OwnedFd>, JournalError> {
    let dirfd = match rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP | Errno::NOTDIR) => {
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
    trusted(&dirfd, dir, FileType::Directory, Owners::Me)?;
    Ok(Some(dirfd))
}

/// What the last name of a path may be, for [`walk`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Last {
    /// A link of root's or this user's is followed, as every other name of the path.
    Followed,
    /// Never a link (a file named to be written as root: the signal log).
    NotALink,
}

/// How many symbolic links one path may go through (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// The directory `path` names a file in, and that file's name there: `path` walked one name
/// at a time, each directory opened (`O_PATH`) from the one before without following a link.
/// A symbolic link on the way, the last name included, is followed only when it is root's or
/// this user's, as the kernel's `protected_symlinks` does in sticky directories, everywhere:
/// another account's link could point anywhere. The name returned is not a link (or not
/// there yet): open it with `O_NOFOLLOW`, relative to the directory, and what was walked is
/// what is opened, whatever is renamed meanwhile. `that` says whether the last name may be a
/// link at all.
pub(crate) fn walk(path: &Path, that: Last) -> Result<(OwnedFd, OsString), FileError> {
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = || openat(rustix::fs::CWD, "/", dir_flags, Mode::empty());
    let euid = rustix::process::geteuid().as_raw();
    let mut todo: VecDeque<OsString> = VecDeque::new();
    let start = names(path, &mut todo);
    let mut dir = match start {
        true => root(),
        false => openat(rustix::fs::CWD, ".", dir_flags, Mode::empty()),
    }
    .map_err(|e| FileError::io(path, e))?;
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        let last = todo.is_empty();
        let st = match statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            Err(Errno::NOENT) if last => None,
            Err(e) => return Err(FileError::io(path, e)),
        };
        let kind = st.as_ref().map(|s| FileType::from_raw_mode(s.st_mode));
        if let (Some(st), Some(FileType::Symlink)) = (&st, kind) {
            if last && that == Last::NotALink {
                return Err(FileError::refused(path, "a symbolic link"));
            }
            if st.st_uid != euid && st.st_uid != 0 {
                return Err(FileError::refused(
                    path,
                    format!(
                        "it goes through the symbolic link {:?}, owned by uid {} (another account's), which is not followed",
                        name, st.st_uid
                    ),
                ));
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(FileError::io(path, Errno::LOOP));
            }
            let target = rustix::fs::readlinkat(&dir, &name, Vec::new())
                .map_err(|e| FileError::io(path, e))?;
            let target = PathBuf::from(OsString::from_vec(target.into_bytes()));
            let mut more = VecDeque::new();
            if names(&target, &mut more) {
                dir = root().map_err(|e| FileError::io(path, e))?;
            }
            more.extend(todo);
            todo = more;
            continue;
        }
        if last {
            return Ok((dir, name));
        }
        dir = openat(&dir, &name, dir_flags, Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => FileError::refused(
                path,
                format!("{name:?} is not a directory (or was replaced)"),
            ),
            e => FileError::io(path, e),
        })?;
    }
    Err(FileError::refused(path, "it names a directory, not a file"))
}

/// Puts `path`'s names in `todo`; true when it starts at `/`.
fn names(path: &Path, todo: &mut VecDeque<OsString>) -> bool {
    let mut absolute = false;
    for c in path.components() {
        match c {
            Component::RootDir => absolute = true,
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => todo.push_back("..".into()),
            Component::Normal(n) => todo.push_back(n.to_os_string()),
        }
    }
    absolute
}

/// Opens `path` to append lines to (the signal log): walked as [`walk`] says, never itself a
/// link, created 0600 if missing, never a FIFO or a device, and only this user's or root's, writable by nobody else,
/// with no other hard link.
pub(crate) fn open_log(path: &Path) -> Result<OwnedFd, FileError> {
    let (dir, name) = walk(path, Last::NotALink)?;
    open_in(&dir, path, &name, Open::Append, Owners::MeOrRoot)?
        .ok_or_else(|| FileError::io(path, Errno::NOENT))
}

/// Opens `path` for reading (the driver library gpuloop loads): walked as [`walk`] says, a
/// regular file (a FIFO is refused at once, never waited on), this user's or root's and
/// writable by nobody else, with no other hard link: what is loaded as root is run as root.
pub(crate) fn open_trusted(path: &Path) -> Result<OwnedFd, FileError> {
    let (dir, name) = walk(path, Last::Followed)?;
    open_in(&dir, path, &name, Open::Read, Owners::MeOrRoot)?
        .ok_or_else(|| FileError::io(path, Errno::NOENT))
}

/// Replaces the file `path` with `bytes`, or creates it: written to a new file beside it,
/// then renamed over it, both through the directory [`walk`] opened. What is there must be a
/// regular file of this user's or root's (a FIFO, a device, another account's file are
/// refused and left untouched); the new file keeps the old one's permissions (without set-id
/// bits).
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let (dir, name) = walk(path, Last::Followed)?;
    let old = match statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Some(st),
        Err(Errno::NOENT) => None,
        Err(e) => return Err(FileError::io(path, e)),
    };
    if let Some(st) = &old {
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind != FileType::RegularFile {
            return Err(FileError::refused(
                path,
                format!("{}, not a regular file", what(kind)),
            ));
        }
        let euid = rustix::process::geteuid().as_raw();
        if st.st_uid != euid && st.st_uid != 0 {
            return Err(FileError::refused(
                path,
                format!("owned by uid {}, another account's", st.st_uid),
            ));
        }
    }
    let (tmp, fd) = temp_beside(&dir, &name, old.is_some()).map_err(|e| FileError::io(path, e))?;
    let written = old
        .as_ref()
        .map_or(Ok(()), |st| {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(st.st_mode & 0o777))
        })
        .map_err(std::io::Error::from)
        .and_then(|()| std::io::Write::write_all(&mut std::fs::File::from(fd), bytes))
        .and_then(|()| Ok(rustix::fs::renameat(&dir, &tmp, &dir, &name)?));
    written.map_err(|source| {
        let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
        FileError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// A new file beside `name` in `dir`, made for this call alone (`O_EXCL`, never through a
/// link): 0600 when it will replace a file (whose permissions it then takes), else as the
/// umask says.
fn temp_beside(dir: &OwnedFd, name: &OsStr, replacing: bool) -> Result<(OsString, OwnedFd), Errno> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(if replacing { 0o600 } else { 0o666 });
    let mut tries = 0;
    loop {
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".gpuloop-{}-{tries}", std::process::id()));
        match openat(dir, &tmp, flags, mode) {
            Ok(fd) => return Ok((tmp, fd)),
            // Left by an earlier run, or planted: never reused, never followed.
            Err(Errno::EXIST) if tries < 100 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// How long an append waits for another gpuloop's append to the same file.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Appends `line` (which ends in a newline) to the file `fd` (opened `O_APPEND`, for reading
/// too) whole or not at all: under an exclusive lock on the file (waited for at most
/// [`LOCK_WAIT`]), after a newline when the file does not end in one (a line cut short before
/// this was so), in one write; a short write (a full disk) is cut back off, so that the next
/// line never lands glued to part of this one.
pub(crate) fn append_whole(fd: &OwnedFd, line: &[u8]) -> std::io::Result<()> {
    lock(fd)?;
    let appended = append_locked(fd, line);
    let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
    appended
}

fn append_locked(fd: &OwnedFd, line: &[u8]) -> std::io::Result<()> {
    let len = fstat(fd)?.st_size as u64;
    let mut last = [0u8; 1];
    // A file opened for writing only cannot be read back: its end is then taken as whole.
    let cut =
        len > 0 && matches!(rustix::io::pread(fd, &mut last, len - 1), Ok(1) if last[0] != b'\n');
    let whole: std::borrow::Cow<[u8]> = match cut {
        true => [b"\n", line].concat().into(),
        false => line.into(),
    };
    let written = loop {
        match rustix::io::write(fd, &whole) {
            Err(Errno::INTR) => continue,
            w => break w,
        }
    };
    match written {
        Ok(n) if n == whole.len() => Ok(()),
        Ok(n) => {
            let _ = rustix::fs::ftruncate(fd, len);
            Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "wrote {n} of {} bytes (disk full?); the part written was taken back",
                    whole.len()
                ),
            ))
        }
        Err(e) => {
            // Nothing was written, unless the file system says otherwise: take back any part.
            if fstat(fd).is_ok_and(|st| st.st_size as u64 > len) {
                let _ = rustix::fs::ftruncate(fd, len);
            }
            Err(e.into())
        }
    }
}

/// Takes the exclusive lock on `fd`, waiting at most [`LOCK_WAIT`] for the gpuloop that holds
/// it.
fn lock(fd: &OwnedFd) -> std::io::Result<()> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(Errno::WOULDBLOCK) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "another gpuloop held its lock for {} s",
                        LOCK_WAIT.as_secs()
                    ),
                ))
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Lines appended to a file by a thread of its own (the journal's records, the signal log's
/// lines), so that a file system that hangs holds back no signal: the sender queues a line and
/// goes on, and waits for the file (`flush`) only at a deadline and no longer than an
/// interrupt.
pub(crate) struct Appender {
    tx: std::sync::Mutex<std::sync::mpsc::Sender<Queued>>,
    /// Given up on: the writer refused the file, or a flush ran past its deadline.
    off: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

enum Queued {
    Line(Vec<u8>),
    /// Answered once every line queued before it is written (or given up).
    Flush(std::sync::mpsc::Sender<()>),
}

/// How a flush ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// Every line queued is written (or the appender was given up before).
    Done,
    /// An interrupt came first.
    Stopped,
    /// The deadline passed first: the appender is given up, its writer stuck.
    Late,
}

/// What the writer makes of one line: go on, or give the file up (refused, say).
pub(crate) enum Wrote {
    On,
    GiveUp,
}

impl Appender {
    /// Starts the thread `name`, which gives each line queued to `write`, in order.
    pub(crate) fn start(
        name: &str,
        mut write: impl FnMut(&[u8]) -> Wrote + Send + 'static,
    ) -> std::io::Result<Appender> {
        use std::sync::atomic::Ordering;
        let (tx, rx) = std::sync::mpsc::channel::<Queued>();
        let off = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let given_up = off.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for q in rx {
                    match q {
                        Queued::Flush(ack) => {
                            let _ = ack.send(());
                        }
                        Queued::Line(_) if given_up.load(Ordering::Relaxed) => {}
                        Queued::Line(line) => {
                            if let Wrote::GiveUp = write(&line) {
                                given_up.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
            })?;
        Ok(Appender {
            tx: std::sync::Mutex::new(tx),
            off,
        })
    }

    fn queue(&self, q: Queued) -> bool {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(q)
            .is_ok()
    }

    fn is_off(&self) -> bool {
        self.off.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues `line` for the file, unless it was given up.
    pub(crate) fn send(&self, line: Vec<u8>) {
        if !self.is_off() {
            self.queue(Queued::Line(line));
        }
    }

    /// Waits until every line queued so far is written: at most `within`, and no longer than
    /// `stopped` says. Past the deadline the appender is given up (its writer is stuck in the
    /// file system), and later lines are dropped.
    pub(crate) fn flush(&self, within: Duration, stopped: &dyn Fn() -> bool) -> Flushed {
        use std::sync::mpsc::RecvTimeoutError;
        let (ack, acked) = std::sync::mpsc::channel();
        if self.is_off() || !self.queue(Queued::Flush(ack)) {
            return Flushed::Done;
        }
        let deadline = Instant::now() + within;
        loop {
            match acked.recv_timeout(Duration::from_millis(20)) {
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return Flushed::Done,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if stopped() {
                return Flushed::Stopped;
            }
            if Instant::now() >= deadline {
                self.off.store(true, std::sync::atomic::Ordering::Relaxed);
                return Flushed::Late;
            }
        }
    }
}
