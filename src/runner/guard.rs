//! The guard: a small process that outlives a gpuloop killed by SIGKILL (or an abort) and
//! then kills the jobs it left, which no signal handler of gpuloop's own could do.
//!
//! gpuloop starts it (`gpuloop __guard`, in a process group of its own) with the first job
//! and tells it, over its stdin, each job's process group (`g PID START`, before the job
//! runs its command), each process seen below a job (`p PID START`), each leader that has
//! exited, before gpuloop reaps it (`x PID START`: every process then in its group has been
//! told by identity), and each finished job's group once it is empty (`f PID START`). When
//! gpuloop ends normally it has stopped its jobs and says `bye`; when the pipe closes without
//! that, gpuloop died, and the guard SIGKILLs those processes (by identity, through the kill
//! engine) and their descendants, and every process that carries gpuloop's job mark in its
//! environment (`m MARK`, told first; `supervise::JOB_MARK`): what a job forked after
//! gpuloop's last look.

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
pub(crate) const SUBCOMMAND: &str = "__guard";

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
pub(crate) fn enable(exe: PathBuf) {
    let _ = EXE.set(exe);
}

/// True when jobs are guarded (the gpuloop binary, not a library user).
pub(crate) fn enabled() -> bool {
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
                let mut guard = Command::new(exe);
                if let Some(f) = crate::journal::front_end_name() {
                    guard.env(crate::journal::FRONT_END_ENV, f);
                }
                guard
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
                if let Some(mut stdin) = child.stdin.take() {
                    let mark = super::supervise::job_mark();
                    let _ = writeln!(stdin, "m {mark}");
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
pub(crate) fn tell_group(leader: Identity) {
    send(&format!("g {} {}", leader.pid, leader.start));
}

/// A job's leader has exited and is about to be reaped, which may free its group's id: the
/// processes the group has now were told by identity, and from now on its members are known
/// only that way.
pub(crate) fn leader_exited(leader: Identity) {
    send(&format!("x {} {}", leader.pid, leader.start));
}

/// A finished job's group that has no member left: from now on its id may be taken by
/// another process's group, which is none of the guard's business.
pub(crate) fn forget_group(leader: Identity) {
    send(&format!("f {} {}", leader.pid, leader.start));
}

/// Processes seen below jobs.
pub(crate) fn tell_members(ids: &[Identity]) {
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
pub(crate) struct Goodbye;

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
pub(crate) struct Watch {
    pub groups: Vec<Identity>,
    /// The guarded groups whose leader gpuloop saw exit, before it reaped it.
    pub exited: HashSet<Identity>,
    pub members: HashSet<Identity>,
    /// The value of `supervise::JOB_MARK` in the environment of gpuloop's jobs.
    pub mark: Option<String>,
    /// gpuloop said goodbye: nothing to do.
    pub bye: bool,
}

impl Watch {
    /// Reads the protocol until `bye` or the end of input; unknown lines are ignored.
    pub(crate) fn read(input: impl BufRead) -> Watch {
        let mut w = Watch::default();
        for line in input.lines() {
            let Ok(line) = line else { break };
            let mut f = line.split_ascii_whitespace();
            let kind = f.next();
            if kind == Some("m") {
                w.mark = f.next().map(str::to_string);
                continue;
            }
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
                (Some("x"), Some(id)) => {
                    w.exited.insert(id);
                }
                (Some("f"), Some(id)) => {
                    w.groups.retain(|g| *g != id);
                    w.exited.remove(&id);
                }
                (Some("p"), Some(id)) => {
                    w.members.insert(id);
                }
                _ => {}
            }
        }
        w
    }

    /// The live processes it guards: leaders and members by identity, and the members of a
    /// guarded group whose leader gpuloop never saw exit. `session` is the guard's own, which
    /// is gpuloop's and every job group's (a leader gets a group of its own, not a session).
    pub(crate) fn targets(
        &self,
        table: &[crate::process::ProcInfo],
        session: Option<i32>,
    ) -> Vec<Target> {
        // A group id is a pid: free for anyone once the leader is reaped and the group is empty. A
        // later start than the leader's cannot tell a reuse apart (a reuser always starts later),
        // and gpuloop sees a group empty only on its next tick: killed in between, it left the
        // guard a group id that may be someone else's by now. So a member is taken by its group
        // only if the leader still held the id when gpuloop died: gpuloop says `x` before it reaps
        // a leader, having told every member the group then had by identity, and what those fork
        // later is taken with them, as their descendants. A leader that outlived gpuloop dies by
        // PDEATHSIG and is reaped by init (or a subreaper above gpuloop), so its group's id can be
        // reused only in the moments between gpuloop's death and the guard's look, and then only by
        // a process of the jobs' own session: a member must be in it, and a group made by `setsid`
        // is not. (A leader whose exec failed is reaped inside `Command::spawn`, before gpuloop can
        // say `x`, and forgotten with `f` right after: the same narrow window, for a group that
        // never ran anything.)
        let by_group = |p: &crate::process::ProcInfo| {
            Some(p.sid) == session
                && self
                    .groups
                    .iter()
                    .any(|g| g.pid == p.pgid && p.start >= g.start && !self.exited.contains(g))
        };
        table
            .iter()
            .filter(|p| !p.is_zombie() && p.pid > 1)
            .filter(|p| {
                let id = p.identity();
                self.members.contains(&id) || self.groups.contains(&id) || by_group(p)
            })
            .map(|p| Target::Exact(p.identity()))
            .collect()
    }
}

/// The guard process: waits for gpuloop to go; if it went without a goodbye, SIGKILLs what
/// its jobs left. Returns the exit code.
pub(crate) fn main() -> crate::exit::Exit {
    // A terminal's hangup or Ctrl-C is for gpuloop, which will tell the guard.
    for sig in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGQUIT] {
        // SAFETY: setting a signal to be ignored installs no handler code.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
    let watch = Watch::read(std::io::stdin().lock());
    if watch.bye {
        return crate::exit::Exit::Success;
    }
    // Everything a job started is the job's, whatever it calls itself: no name protects it.
    let opts = KillOpts {
        signal: Signal::SIGKILL,
        grace: Duration::ZERO,
        tree: true,
        force: true,
        on_interrupt: OnInterrupt::KillNow,
        ..KillOpts::default()
    };
    let never = AtomicBool::new(false);
    let session = crate::process::read_stat(std::process::id() as i32)
        .ok()
        .map(|p| p.sid);
    // More rounds catch what forked while the first was being killed.
    for _ in 0..3 {
        let mut targets = watch.targets(&crate::process::process_table(), session);
        if let Some(mark) = &watch.mark {
            targets.extend(marked(mark));
        }
        if targets.is_empty() {
            break;
        }
        let why = "left by a job of a gpuloop that ended without stopping it";
        let opts = KillOpts {
            why: targets.iter().map(|t| (t.pid(), why.into())).collect(),
            ..opts.clone()
        };
        let r = kill::kill(&targets, &opts, &[], &never);
        if !r.signalled.is_empty() {
            crate::errln!(
                "gpuloop guard: gpuloop ended without stopping its jobs; killed {} {:?}",
                crate::words::pick(r.signalled.len(), "pid", "pids"),
                r.signalled
            );
        }
    }
    crate::exit::Exit::Success
}

/// The live processes whose environment carries `JOB_MARK=mark`: each read through its own
/// /proc directory, so the mark and the identity are of one process.
fn marked(mark: &str) -> Vec<Target> {
    let entry = format!("{}={mark}", super::supervise::JOB_MARK);
    crate::process::all_pids()
        .into_iter()
        .filter(|&pid| pid > 1)
        .filter_map(|pid| {
            let dir = crate::process::identity::ProcDir::open(pid).ok()?;
            let env = dir.read("environ").ok()?;
            env.split(|&b| b == 0)
                .any(|e| e == entry.as_bytes())
                .then_some(())?;
            let p = dir.stat().ok().filter(|p| !p.is_zombie())?;
            Some(Target::Exact(p.identity()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcInfo;

    /// A process of the jobs' session, 5.
    fn p(pid: i32, pgid: i32, start: u64) -> ProcInfo {
        ProcInfo::sleeping(pid, 1, pgid, 5, start)
    }

    fn pids(w: &Watch, table: &[ProcInfo]) -> Vec<i32> {
        w.targets(table, Some(5)).iter().map(Target::pid).collect()
    }

    #[test]
    fn reads_groups_and_members_and_stops_at_bye() {
        let w = Watch::read("g 10 100\np 12 105\njunk\np x 1\n".as_bytes());
        assert_eq!(w.groups, vec![Identity::new(10, 100)]);
        assert!(w.members.contains(&Identity::new(12, 105)));
        assert!(!w.bye);
        let w = Watch::read("g 10 100\ng 20 200\nx 20 200\nf 10 100\nf 20 7\n".as_bytes());
        assert_eq!(
            w.groups,
            vec![Identity::new(20, 200)],
            "only the very group is forgotten"
        );
        assert!(w.exited.contains(&Identity::new(20, 200)));
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
        assert_eq!(pids(&w, &table), vec![11, 30]);
    }

    /// A finished job's group emptied, another process took the leader's pid
    /// and made a group of it, and gpuloop was SIGKILLed before its next tick forgot the
    /// group: the guard killed the new group (its members started after the leader).
    #[test]
    fn the_guard_kills_whoever_reused_a_finished_jobs_group_id_never() {
        // gpuloop saw leader 10 exit after telling its member 11; 11 forked 12, which the
        // kill engine takes as 11's descendant. 13 and 14 are in a group that reused the
        // id, in the jobs' session and in one of its own (setsid).
        let w = Watch::read("g 10 100\np 11 101\nx 10 100\n".as_bytes());
        let mut other_session = p(14, 10, 301);
        other_session.sid = 14;
        let table = vec![
            p(11, 10, 101),
            p(12, 10, 150),
            p(13, 10, 300),
            other_session.clone(),
        ];
        assert_eq!(pids(&w, &table), vec![11]);
        // A leader that died with gpuloop: its group's members are the job's (the leader
        // held the id), the leader too, but not a group of that id in another session.
        let w = Watch::read("g 10 100\n".as_bytes());
        let table = vec![p(10, 10, 100), p(12, 10, 150), other_session];
        assert_eq!(pids(&w, &table), vec![10, 12]);
    }
}
