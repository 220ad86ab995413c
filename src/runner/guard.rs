//! The guard: a small process that outlives a gpuloop killed by SIGKILL (or an abort) and
//! then kills the jobs it left, which no signal handler of gpuloop's own could do.
//!
//! gpuloop starts it (`gpuloop __guard`, in a process group of its own) with the first job
//! and tells it, over its stdin, each job's process group (`g PID START`, before the job
//! runs its command), each process seen below a job (`p PID START`), and each finished
//! job's group once it is empty (`f PID START`: its id may be reused from then on). When gpuloop ends normally it has stopped its jobs and
//! says `bye`; when the pipe closes without that, gpuloop died, and the guard SIGKILLs
//! those processes (by identity, through the kill engine) and their descendants.

use crate::process::helpers;
use crate::process::kill::{self, KillOpts, OnInterrupt, Target};
use crate::process::Identity;
use nix::sys::signal::Signal;
use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The hidden subcommand the guard runs as.
pub const SUBCOMMAND: &str = "__guard";

static EXE: OnceLock<PathBuf> = OnceLock::new();
static CONN: Mutex<Option<Conn>> = Mutex::new(None);

struct Conn {
    stdin: ChildStdin,
    child: Child,
    /// It is one of gpuloop's own helpers (no job's orphan) under this identity.
    helper: Option<crate::process::Identity>,
}

/// Lets jobs be guarded by starting `exe __guard` (the gpuloop binary calls this; library
/// users and unit tests have no such binary and go unguarded).
pub fn enable(exe: PathBuf) {
    let _ = EXE.set(exe);
}

/// True when jobs are guarded (the gpuloop binary, not a library user).
pub fn enabled() -> bool {
    EXE.get().is_some()
}

fn send(line: &str) {
    let Some(exe) = EXE.get() else {
        return;
    };
    let mut conn = CONN.lock().unwrap_or_else(|e| e.into_inner());
    if conn.is_none() {
        let started = helpers::start(
            || {
                Command::new(exe)
                    .arg(SUBCOMMAND)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .process_group(0)
                    .spawn()
            },
            |child| Some(child.id()),
        );
        match started {
            Ok((mut child, helper)) => {
                if let Some(stdin) = child.stdin.take() {
                    *conn = Some(Conn {
                        stdin,
                        child,
                        helper,
                    });
                }
            }
            Err(e) => {
                tracing::warn!("cannot start the guard process ({e}): a SIGKILLed gpuloop would leave its jobs running");
                return;
            }
        }
    }
    if let Some(c) = conn.as_mut() {
        // A guard that died is no reason to fail a job.
        let _ = writeln!(c.stdin, "{line}").and_then(|()| c.stdin.flush());
    }
}

/// A job's process group, led by `leader`.
pub fn tell_group(leader: Identity) {
    send(&format!("g {} {}", leader.pid, leader.start));
}

/// A finished job's group that has no member left: from now on its id may be taken by
/// another process's group, which is none of the guard's business.
pub fn forget_group(leader: Identity) {
    send(&format!("f {} {}", leader.pid, leader.start));
}

/// Processes seen below jobs.
pub fn tell_members(ids: &[Identity]) {
    if ids.is_empty() {
        return;
    }
    let text: Vec<String> = ids
        .iter()
        .map(|id| format!("p {} {}", id.pid, id.start))
        .collect();
    send(&text.join("\n"));
}

/// How long a goodbye waits for the guard to leave.
const GUARD_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Dropped once gpuloop has stopped its jobs itself: the guard leaves without acting, and
/// gpuloop waits (bounded) for it to go, so a gpuloop run as a job of another gpuloop leaves
/// no guard behind to be counted among that job's leftovers.
pub struct Goodbye;

impl Drop for Goodbye {
    fn drop(&mut self) {
        let mut conn = CONN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Conn {
            mut stdin,
            mut child,
            helper,
        }) = conn.take()
        {
            let _ = writeln!(stdin, "bye").and_then(|()| stdin.flush());
            drop(stdin);
            let deadline = std::time::Instant::now() + GUARD_EXIT_WAIT;
            loop {
                if !matches!(child.try_wait(), Ok(None)) {
                    helpers::forget(helper);
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    tracing::warn!(
                        "the guard process {} did not leave after goodbye",
                        child.id()
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// What the guard was told.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Watch {
    pub groups: Vec<Identity>,
    pub members: HashSet<Identity>,
    /// gpuloop said goodbye: nothing to do.
    pub bye: bool,
}

impl Watch {
    /// Reads the protocol until `bye` or the end of input; unknown lines are ignored.
    pub fn read(input: impl BufRead) -> Watch {
        let mut w = Watch::default();
        for line in input.lines() {
            let Ok(line) = line else { break };
            let mut f = line.split_ascii_whitespace();
            let kind = f.next();
            let id = match (f.next().map(str::parse), f.next().map(str::parse)) {
                (Some(Ok(pid)), Some(Ok(start))) => Some(Identity::new(pid, start)),
                _ => None,
            };
            match (kind, id) {
                (Some("bye"), _) => {
                    w.bye = true;
                    break;
                }
                (Some("g"), Some(id)) => w.groups.push(id),
                (Some("f"), Some(id)) => w.groups.retain(|g| *g != id),
                (Some("p"), Some(id)) => {
                    w.members.insert(id);
                }
                _ => {}
            }
        }
        w
    }

    /// The live processes it guards: members by identity, and members of a guarded group
    /// that started no earlier than its leader (a group id is a pid, and pids are reused).
    pub fn targets(&self, table: &[crate::process::ProcInfo]) -> Vec<Target> {
        table
            .iter()
            .filter(|p| !p.is_zombie() && p.pid > 1)
            .filter(|p| {
                self.members.contains(&p.identity())
                    || self
                        .groups
                        .iter()
                        .any(|g| g.pid == p.pgid && p.start >= g.start)
            })
            .map(|p| Target::Exact(p.identity()))
            .collect()
    }
}

/// The guard process: waits for gpuloop to go; if it went without a goodbye, SIGKILLs what
/// its jobs left. Returns the exit code.
pub fn main() -> i32 {
    // A terminal's hangup or Ctrl-C is for gpuloop, which will tell the guard.
    for sig in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGQUIT] {
        // SAFETY: setting a signal to be ignored installs no handler code.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
    let watch = Watch::read(std::io::stdin().lock());
    if watch.bye {
        return 0;
    }
    let protected = crate::config::UserConfig::load()
        .map(|c| c.protected)
        .unwrap_or_else(|_| crate::config::UserConfig::default().protected);
    let opts = KillOpts {
        signal: Signal::SIGKILL,
        grace: Duration::ZERO,
        tree: true,
        on_interrupt: OnInterrupt::KillNow,
        ..KillOpts::default()
    };
    let never = AtomicBool::new(false);
    // More rounds catch what forked while the first was being killed.
    for _ in 0..3 {
        let targets = watch.targets(&crate::process::process_table());
        if targets.is_empty() {
            break;
        }
        let r = kill::kill(&targets, &opts, &protected, &never);
        if !r.signalled.is_empty() {
            eprintln!(
                "gpuloop guard: gpuloop ended without stopping its jobs; killed pid(s) {:?}",
                r.signalled
            );
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcInfo;

    fn p(pid: i32, pgid: i32, start: u64) -> ProcInfo {
        ProcInfo {
            pid,
            flags: 0,
            comm: format!("p{pid}"),
            state: 'S',
            ppid: 1,
            pgid,
            sid: pgid,
            start,
        }
    }

    #[test]
    fn reads_groups_and_members_and_stops_at_bye() {
        let w = Watch::read("g 10 100\np 12 105\njunk\np x 1\n".as_bytes());
        assert_eq!(w.groups, vec![Identity::new(10, 100)]);
        assert!(w.members.contains(&Identity::new(12, 105)));
        assert!(!w.bye);
        let w = Watch::read("g 10 100\ng 20 200\nf 10 100\nf 20 7\n".as_bytes());
        assert_eq!(
            w.groups,
            vec![Identity::new(20, 200)],
            "only the very group is forgotten"
        );
        let w = Watch::read("g 10 100\nbye\ng 11 1\n".as_bytes());
        assert!(w.bye);
        assert_eq!(w.groups.len(), 1);
    }

    #[test]
    fn targets_group_members_and_known_identities_but_not_reused_ones() {
        let w = Watch::read("g 10 100\np 30 300\n".as_bytes());
        let table = vec![
            p(11, 10, 101),
            // In group 10 but older than its leader: a reused group id.
            p(12, 10, 50),
            // The remembered identity, and a process that reused its pid.
            p(30, 30, 300),
            p(31, 31, 300),
            p(40, 40, 999),
        ];
        let pids: Vec<i32> = w.targets(&table).iter().map(Target::pid).collect();
        assert_eq!(pids, vec![11, 30]);
    }
}
