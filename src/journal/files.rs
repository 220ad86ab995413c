//! Opening gpuloop's state directory and the files in it with care: no link followed, no
//! FIFO waited on, and only what is this user's own and writable by nobody else.

use super::JournalError;
use rustix::fs::{fstat, openat, FileType, Mode, OFlags};
use std::os::fd::OwnedFd;
use std::path::Path;

/// Opens gpuloop's state directory `dir` (created 0700 if missing) without following a link,
/// and checks it is ours: owned by this user, writable by nobody else.
pub(super) fn open_dir(dir: &Path) -> Result<OwnedFd, JournalError> {
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
pub(super) enum Open {
    /// For appending, created 0600 if missing.
    Append,
    /// For reading; `None` if missing.
    Read,
    /// For reading and rewriting, created 0600 if missing.
    Update,
}

/// Opens `name` in the directory `dirfd` without following a link (and never waiting on a
/// FIFO), as `how` says.
pub(super) fn open_file(
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
pub(super) fn open_existing_dir(dir: &Path) -> Result<Option<OwnedFd>, JournalError> {
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
