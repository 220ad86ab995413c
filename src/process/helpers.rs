//! gpuloop's own helper processes (the guard, each host's ssh or srun): children in process
//! groups (a host's: sessions) of their own that belong to no job, known by identity from the
//! moment they exist.
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

/// What a host's transport (ssh, srun, `ssh -G`, scontrol) does between fork and exec:
/// `pre_exec` it. It leaves gpuloop's session, and it dies with gpuloop.
///
/// A session of its own: with autogroup scheduling (the default of most distributions) the
/// kernel shares the CPU between sessions first, so 16 ssh clients in gpuloop's session
/// shared one session's share on a busy machine, where pdsh's, each in a session of its own,
/// got one each (a first `--host` run over 16 hosts on 2 cores at load 20–36 took 3.2–4.7×
/// pdsh's time in gpuloop's session, 1.02–1.06× apart: benches/fleet.py). No
/// signal of the terminal reached a helper before either (each was in a process group of its
/// own): gpuloop stops them itself, on Ctrl-C, a hangup or SIGTERM, by closing or killing
/// them; and ssh asks nothing of a terminal (`BatchMode`).
///
/// Death with gpuloop: a SIGKILLed gpuloop runs no handler, and a helper that is still
/// connecting, or whose host never ends its command, would outlive it. `PR_SET_PDEATHSIG`
/// sends `death` when the thread that forked the helper ends: the hosts' runtime threads, which
/// live as long as their connections. The check of the parent after it covers a gpuloop that
/// died before the signal was set.
pub(crate) fn apart_hook(
    death: rustix::process::Signal,
) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    let parent = rustix::process::getpid();
    move || {
        // setsid, prctl and getppid are async-signal-safe and allocate nothing.
        rustix::process::setsid()?;
        rustix::process::set_parent_process_death_signal(Some(death))?;
        if rustix::process::getppid() != Some(parent) {
            // gpuloop ended while starting it.
            return Err(io::Error::from(rustix::io::Errno::SRCH));
        }
        Ok(())
    }
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

    /// A helper started apart leads a session of its own, and gets its death signal when the
    /// thread that forked it ends (as when gpuloop dies).
    #[test]
    fn a_helper_apart_leads_its_own_session_and_dies_with_its_starter() {
        use std::os::unix::process::CommandExt;
        let (tx, rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let starter = std::thread::spawn(move || {
            let mut c = std::process::Command::new("sleep");
            c.arg("30");
            // SAFETY: the hook makes async-signal-safe calls only.
            unsafe { c.pre_exec(apart_hook(rustix::process::Signal::KILL)) };
            let child = c.spawn().unwrap();
            tx.send(child).unwrap();
            // The starting thread ends when told.
            let _ = end_rx.recv();
        });
        let mut child = rx.recv().unwrap();
        let pid = child.id() as i32;
        let p = read_stat(pid).unwrap();
        assert_eq!(
            (p.sid, p.pgid),
            (pid, pid),
            "a session and a group of its own"
        );
        let ours = read_stat(std::process::id() as i32).unwrap();
        assert_ne!(p.sid, ours.sid);
        assert!(matches!(child.try_wait(), Ok(None)), "it runs");
        drop(end_tx);
        starter.join().unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }
}
