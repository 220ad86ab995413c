//! Binding what is read about a process to that one process: /proc directory fds, pidfds and
//! their pidfs inodes, so evidence and signals never drift to a process that reused the pid.
//!
//! A `/proc/PID` directory fd refers to the process that had the pid when it was opened: reads
//! through it fail once that process is gone, even if the pid now names another one. A pidfd
//! opened while such a directory fd still reads is therefore the same process, and on kernels
//! with pidfs (6.9+) its inode number is unique for the boot, a finer identity than the start
//! time in clock ticks (a pid can be reused within one 10 ms tick).

use super::{parse_stat, Identity, ProcInfo};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use std::io::{self, Read};
use std::os::fd::OwnedFd;

/// An open /proc/PID directory: every read through it is about the process it was opened for.
pub struct ProcDir {
    pub pid: i32,
    fd: OwnedFd,
}

/// Maps "the process is gone" errors (ESRCH from a dead task's /proc files) to `NotFound`.
fn gone_as_not_found(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) {
        io::Error::new(io::ErrorKind::NotFound, "process is gone")
    } else {
        e
    }
}

impl ProcDir {
    /// Opens /proc/PID; `NotFound` when there is no such process.
    pub fn open(pid: i32) -> io::Result<ProcDir> {
        let fd = rustix::fs::open(
            format!("/proc/{pid}").as_str(),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(ProcDir { pid, fd })
    }

    /// The open /proc/PID directory, for the `*at` calls that read below it.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Opens a file or directory below this process's /proc directory.
    pub(crate) fn open_at(&self, name: &str, dir: bool) -> io::Result<OwnedFd> {
        let mut flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
        if dir {
            flags |= rustix::fs::OFlags::DIRECTORY;
        }
        rustix::fs::openat(&self.fd, name, flags, rustix::fs::Mode::empty())
            .map_err(|e| gone_as_not_found(e.into()))
    }

    /// The whole content of one of its files (stat, maps, cmdline, status, …): read until the
    /// end, without asking the file's size (a /proc file has none to give: `read_to_end` on a
    /// `File` would spend a statx and an lseek on it).
    pub fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let mut f = std::fs::File::from(self.open_at(name, false)?);
        let mut buf = vec![0u8; 4096];
        let mut len = 0;
        loop {
            if len == buf.len() {
                buf.resize(len * 2, 0);
            }
            match f.read(&mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(gone_as_not_found(e)),
            }
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// Its stat; `NotFound` once the process this directory was opened for is gone.
    pub fn stat(&self) -> io::Result<ProcInfo> {
        let text = self.read("stat")?;
        parse_stat(self.pid, &String::from_utf8_lossy(&text))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat"))
    }

    /// The owner of the process as `ps` shows it: its effective uid, which owns /proc/PID.
    pub fn uid(&self) -> io::Result<u32> {
        Ok(rustix::fs::fstat(&self.fd)?.st_uid)
    }

    /// Its real, effective and saved uids (the `Uid:` line of its status).
    pub(crate) fn uids(&self) -> io::Result<[u32; 3]> {
        let status = self.status()?;
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "no Uid: line in status");
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .ok_or_else(bad)?;
        let mut ids = line.split_whitespace().map(|v| v.parse::<u32>());
        let mut next = || ids.next().and_then(Result::ok).ok_or_else(bad);
        Ok([next()?, next()?, next()?])
    }

    /// The command line with NULs as spaces; empty for kernel threads and the unreadable.
    pub fn cmdline(&self) -> String {
        self.read("cmdline")
            .map(|raw| super::cmdline_text(&raw))
            .unwrap_or_default()
    }

    /// How many threads the process counts (a zombie leader among them until it is reaped):
    /// the links of its `task` directory, less two; one system call, no file read.
    pub fn threads(&self) -> io::Result<u64> {
        let st = rustix::fs::statat(&self.fd, "task", rustix::fs::AtFlags::empty())
            .map_err(|e| gone_as_not_found(e.into()))?;
        #[allow(clippy::unnecessary_cast)]
        Ok((st.st_nlink as u64).saturating_sub(2))
    }

    /// /proc/PID/status as text (signal masks, NSpid, …).
    pub fn status(&self) -> io::Result<String> {
        Ok(String::from_utf8_lossy(&self.read("status")?).into_owned())
    }
}

/// A process held by a pidfd whose identity was checked: signals sent through `fd` reach it
/// or nobody (ESRCH once it has exited), whatever now has its pid.
pub(crate) struct Pinned {
    pub fd: OwnedFd,
    /// Its /proc directory: later reads through it (status, wchan) are about it or fail.
    pub dir: ProcDir,
    /// Its stat, read while the pidfd was known to refer to it.
    pub info: ProcInfo,
    /// The pidfs inode of `fd`, where the kernel has pidfs.
    pub ino: Option<u64>,
}

impl Pinned {
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            pid: self.info.pid,
            start: self.info.start,
            ino: self.ino,
        }
    }

    /// True while the process has not exited. Its pid is its own until then, so anything read
    /// about that pid before this call, since it was pinned, was about this process.
    pub(crate) fn running(&self) -> bool {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let now = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // A pidfd reads as ready once its process has exited.
        matches!(poll(&mut fds, Some(&now)), Ok(0))
    }

    /// True if `child` is this process's child now: its stat, read through its own pin, names
    /// this pid as its parent, and this process still runs after that read, so the pid was
    /// still this process's when it was read. A process whose pid was reused by another one,
    /// even within one clock tick, fails this (another parent, or a parent that exited).
    pub(crate) fn is_parent_of(&self, child: &Pinned) -> bool {
        child
            .dir
            .stat()
            .is_ok_and(|c| c.ppid == self.info.pid && c.pid != self.info.pid)
            && self.running()
    }

    /// True if `member` is in the process group this process leads: its pinned stat names
    /// this pid as its group, and this process still runs after that read. A group id is the
    /// pid of the process that made the group, so while the leader runs the id is its group.
    pub(crate) fn leads_group_of(&self, member: &Pinned) -> bool {
        self.info.pgid == self.info.pid && member.info.pgid == self.info.pid && self.running()
    }
}

/// Opens a pidfd for the process `dir` was opened for. `Ok(None)` when it is gone.
///
/// The pidfd is opened by number, then the stat is read through `dir`: that read succeeds
/// only while `dir`'s process still has the pid, so the pidfd, opened in between, is that
/// process, and the stat is its own.
pub(crate) fn pin_dir(dir: ProcDir) -> io::Result<Option<Pinned>> {
    Ok(bound_pidfd(&dir)?.map(|(fd, info, ino)| Pinned { fd, dir, info, ino }))
}

/// The stat and pidfs inode of the process `dir` was opened for, read as `pin_dir` does.
pub(crate) fn bound_identity(dir: &ProcDir) -> io::Result<Option<(ProcInfo, Option<u64>)>> {
    Ok(bound_pidfd(dir)?.map(|(_, info, ino)| (info, ino)))
}

fn bound_pidfd(dir: &ProcDir) -> io::Result<Option<(OwnedFd, ProcInfo, Option<u64>)>> {
    let Some(pid) = Pid::from_raw(dir.pid) else {
        return Ok(None);
    };
    let fd = match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let info = match dir.stat() {
        Ok(info) => info,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let ino = crate::pidfs::ino(&fd);
    Ok(Some((fd, info, ino)))
}

/// Why a pinned process is not the one `want` names, if it is not.
pub(crate) fn mismatch(want: &Identity, got: &Pinned) -> Option<String> {
    let p = &got.info;
    if p.start != want.start {
        return Some(format!(
            "pid {} is now another process ({}, started at tick {} not {}): not signalled",
            p.pid, p.comm, p.start, want.start
        ));
    }
    match (want.ino, got.ino) {
        (Some(w), Some(g)) if w != g => Some(format!(
            "pid {} is now another process ({}, started in the same clock tick; pidfs inode {g} not {w}): not signalled",
            p.pid, p.comm
        )),
        _ => None,
    }
}

/// Pins whatever process has `pid` now (a bare pid is resolved at call time): `Ok(None)` if
/// there is none. Everything kill() decides about it (refusals, tree membership) is then read
/// through this pin, never from an earlier snapshot.
pub(crate) fn pin_now(pid: i32) -> Result<Option<Pinned>, String> {
    let dir = match ProcDir::open(pid) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open /proc/{pid}: {e}")),
    };
    pin_dir(dir).map_err(|e| format!("pidfd_open: {e}"))
}

/// Pins the process `want` names: `Ok(None)` if it is gone, `Err(reason)` if the pid now
/// belongs to another process.
pub(crate) fn pin(want: &Identity) -> Result<Option<Pinned>, String> {
    match pin_now(want.pid)? {
        Some(p) => match mismatch(want, &p) {
            Some(why) => Err(why),
            None => Ok(Some(p)),
        },
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn reap(mut child: std::process::Child) {
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The bug: a recycled pid could be killed. Evidence read through the /proc directory of
    /// a process is never another process's, even once its pid is free for reuse.
    #[test]
    fn a_recycled_pid_can_be_killed_evidence_is_bound_to_the_process() {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let dir = ProcDir::open(pid).unwrap();
        let before = dir.stat().unwrap();
        assert_eq!(before.pid, pid);
        assert!(dir.read("maps").is_ok());
        reap(child);
        // Reaped: the pid is free and may name another process now; through `dir` nothing
        // can be read any more, so nothing can be mistaken for this process's.
        for name in ["stat", "maps", "cmdline", "status"] {
            let e = dir.read(name).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{name}: {e}");
        }
        assert!(dir.open_at("fd", true).is_err());
        assert!(pin_dir(dir).unwrap().is_none());
    }

    #[test]
    fn a_recycled_pid_can_be_killed_the_same_tick_is_told_apart_by_pidfs_inode() {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let p = pin_dir(ProcDir::open(pid).unwrap()).unwrap().unwrap();
        let id = p.identity();
        assert_eq!(pin(&id).unwrap().unwrap().identity(), id);
        if crate::pidfs::available() {
            // Another process with the same pid and start tick: only the inode differs.
            let other = Identity {
                ino: id.ino.map(|i| i + 1),
                ..id
            };
            let why = pin(&other).err().unwrap();
            assert!(why.contains("same clock tick"), "{why}");
        }
        let later = Identity {
            start: id.start + 1,
            ..id
        };
        assert!(pin(&later).err().unwrap().contains("another process"));
        reap(child);
        assert!(pin(&id).unwrap().is_none());
    }
}
