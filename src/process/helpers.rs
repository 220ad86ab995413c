//! gpuloop's own helper processes (the guard, each host's ssh or srun): children in process
//! groups of their own that belong to no job, known by identity from the moment they exist.
//!
//! The runner takes any other child of gpuloop outside gpuloop's process group for an orphan
//! of a job (gpuloop is the jobs' child subreaper) and stops it with the job. A helper is
//! spawned with the registry locked and registered before the lock is released, and
//! `is_helper` takes the same lock: whoever read a process table in which a helper appears
//! checks it only once it is registered, so there is no moment in which a helper can be
//! taken for an orphan. An entry is dropped once its process is known to be reaped; one left
//! behind (a helper killed and left to tokio to reap) names, by pid and start time, a process
//! that no longer exists, and matches nothing.

use super::{read_stat, Identity, ProcInfo};
use std::collections::HashSet;
use std::io;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// A set, not a list: a run keeps one helper per host (65,536 of them), and each is looked
/// up and forgotten on its own.
static HELPERS: LazyLock<Mutex<HashSet<Identity>>> = LazyLock::new(Mutex::default);

fn helpers() -> MutexGuard<'static, HashSet<Identity>> {
    // A panic elsewhere while holding the lock leaves consistent data: keep going.
    HELPERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a helper with `spawn` (`pid_of` says the child's pid) and registers it before
/// anyone can look at it; returns it with the identity it was registered under.
pub(crate) fn start<C>(
    spawn: impl FnOnce() -> io::Result<C>,
    pid_of: impl FnOnce(&C) -> Option<u32>,
) -> io::Result<(C, Option<Identity>)> {
    let mut helpers = helpers();
    let child = spawn()?;
    // Our unreaped child: its pid cannot be reused, so its stat is its own.
    let id = pid_of(&child)
        .and_then(|pid| read_stat(pid as i32).ok())
        .map(|p| p.identity());
    helpers.extend(id);
    Ok((child, id))
}

/// Runs `cmd` as a helper to its end (registered as gpuloop's own while it runs, so the job
/// runner never takes it for a job's orphan) and returns what it printed.
pub(crate) fn output(cmd: &mut std::process::Command) -> io::Result<std::process::Output> {
    let (child, id) = start(|| cmd.spawn(), |c| Some(c.id()))?;
    let out = child.wait_with_output();
    forget(id);
    out
}

/// Forgets a helper that has been reaped.
pub(crate) fn forget(id: Option<Identity>) {
    if let Some(id) = id {
        helpers().remove(&id);
    }
}

/// True if `p` is one of gpuloop's own helpers.
pub(crate) fn is_helper(p: &ProcInfo) -> bool {
    helpers().contains(&p.identity())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_is_known_by_identity_until_forgotten() {
        let (mut child, id) = start(
            || std::process::Command::new("sleep").arg("30").spawn(),
            |c| Some(c.id()),
        )
        .unwrap();
        let p = read_stat(child.id() as i32).unwrap();
        assert_eq!(id, Some(p.identity()));
        assert!(is_helper(&p));
        // Another process that has the pid later is not the helper.
        let reused = ProcInfo {
            start: p.start + 1,
            ..p.clone()
        };
        assert!(!is_helper(&reused));
        let _ = child.kill();
        let _ = child.wait();
        forget(id);
        assert!(!is_helper(&p));
    }
}
