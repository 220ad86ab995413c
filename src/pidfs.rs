//! pidfds on pidfs (Linux 6.9+), where each process has an inode of its own for the boot: what
//! tells a process apart from a later one that has its pid, even within one clock tick. The
//! process facts (`process::identity`) and the simulated driver both tell processes apart so.

use rustix::process::{pidfd_open, Pid, PidfdFlags};
use std::os::fd::AsFd;
use std::sync::OnceLock;

/// `PIDFS_MAGIC` from linux/magic.h: the file system of pidfds on kernels with pidfs.
const PIDFS_MAGIC: i64 = 0x5049_4446;

/// True if this kernel's pidfds live on pidfs, where each process has its own inode.
pub(crate) fn available() -> bool {
    static PIDFS: OnceLock<bool> = OnceLock::new();
    *PIDFS.get_or_init(|| {
        let Some(me) = Pid::from_raw(std::process::id() as i32) else {
            return false;
        };
        pidfd_open(me, PidfdFlags::empty())
            .ok()
            .and_then(|fd| rustix::fs::fstatfs(&fd).ok())
            // f_type is i64 on x86_64 but narrower elsewhere.
            .is_some_and(|s| {
                #[allow(clippy::unnecessary_cast)]
                let t = s.f_type as i64;
                t == PIDFS_MAGIC
            })
    })
}

/// The pidfs inode of a pidfd (unique per process for the boot), or `None` without pidfs.
pub(crate) fn ino(fd: impl AsFd) -> Option<u64> {
    if !available() {
        return None;
    }
    rustix::fs::fstat(fd).ok().map(|s| s.st_ino)
}
