//! Restarters: live parents of stopped holders that may start them again (a shell loop,
//! torchrun's elastic agent, a Ray raylet), found in the snapshot taken before signalling.

use super::tree::Tree;
use super::{Identity, ProcInfo};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// A parent that outlived the holder it started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Restarter {
    pub pid: i64,
    pub name: String,
    /// The holder it started (stopped by this kill).
    pub holder: i64,
    /// Known to the kill that found it; a report read back from a script has none.
    #[serde(skip, default = "unknown")]
    pub identity: Identity,
    /// The holder's identity: while that very process is still exiting, nothing was
    /// started again.
    #[serde(skip, default = "unknown")]
    pub holder_identity: Identity,
}

fn unknown() -> Identity {
    Identity::new(0, 0)
}

impl Restarter {
    /// "pid 1237 (bash) started holder 1240 and is still running: it may restart it".
    pub(crate) fn describe(&self) -> String {
        format!(
            "pid {} ({}) started holder {} and is still running: it may restart it",
            self.pid, self.name, self.holder
        )
    }

    /// "pid 1237 (bash) started holder 1240 again": what a wait saw it do.
    pub fn restarted(&self) -> String {
        format!(
            "pid {} ({}) started holder {} again after it was stopped",
            self.pid, self.name, self.holder
        )
    }
}

/// Parents known by name to restart the workers they start, and what to call them: real
/// torchrun's elastic agent names itself `pt_elastic` (and runs as `torchrun`), starts its
/// workers in sessions of their own and starts them again (`--max-restarts`).
const KNOWN: &[(&str, &str)] = &[("pt_elastic", TORCHRUN_AGENT), ("torchrun", TORCHRUN_AGENT)];

const TORCHRUN_AGENT: &str = "torchrun agent (restarts its workers)";

/// What a process with this comm is, if it is a known restarter.
pub fn known(comm: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(c, _)| *c == comm)
        .map(|(_, what)| *what)
}

/// Advice for holders whose parent is a known restarter, from what a holder map says of its
/// parent (`pid`, `ppid`, the parent's comm): stopping such a worker alone only gets it
/// started again, so the restarter goes with it (`parents` is the command that does that).
pub fn advice<'a>(
    holders: impl IntoIterator<Item = (i64, i64, &'a str)>,
    parents: &str,
) -> Option<String> {
    let (pid, ppid, what) = holders
        .into_iter()
        .find_map(|(pid, ppid, comm)| Some((pid, ppid, known(comm)?)))?;
    Some(format!(
        "the parent of {pid}, pid {ppid}, is a {what}: stopping the worker alone only gets it started again; stop the {} with it ({parents})",
        what.split(" (").next().unwrap_or(what)
    ))
}

/// Shells, whose login or interactive instances start things by hand and restart nothing.
const SHELLS: &[&str] = &["bash", "sh", "dash", "zsh", "fish", "ksh", "tcsh", "csh"];

/// A login shell (`-bash`) or an interactive one (a shell given no command and no script).
fn is_interactive_shell(p: &ProcInfo, cmdline: &str) -> bool {
    let mut argv = cmdline.split(' ').filter(|a| !a.is_empty());
    let argv0 = argv.next().unwrap_or("");
    if argv0.starts_with('-') {
        return true;
    }
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    let shell = SHELLS.contains(&p.comm.as_str()) || SHELLS.contains(&base);
    // `bash -c '…'`, `bash job.sh`: a script runs there, and may loop.
    shell && argv.all(|a| a.starts_with('-') && a != "-c")
}

/// Parents that start a process once on someone else's behalf and restart nothing: Slurm's
/// step daemon and launcher, container shims, runtimes and inits, the ssh daemon, privilege
/// wrappers, terminal multiplexers. Stopping one tears down a job step, a container or users'
/// sessions (`clean --parents` once stopped a job's `slurmstepd`), so they
/// are neither reported nor stopped as restarters. Matched by comm or argv[0]'s base name
/// (`is_named`: the comm `containerd-shim` is what the kernel keeps of `containerd-shim-runc-v2`).
const INFRASTRUCTURE: &[&str] = &[
    "slurmstepd",
    "srun",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "conmon",
    "runc",
    "crun",
    "tini",
    "dumb-init",
    "docker-init",
    "catatonit",
    "sshd",
    "sshd-session",
    "sudo",
    "su",
    "tmux: server",
    "tmux",
    "screen",
    "SCREEN",
];

fn is_infrastructure(p: &ProcInfo, cmdline: &str) -> bool {
    super::kill::is_named(&p.comm, cmdline, INFRASTRUCTURE)
}

/// Why a live parent cannot restart anything, if so: init, service managers (their units are
/// a service's business), infrastructure (`INFRASTRUCTURE`), processes started after the child
/// (it was reparented to them).
fn not_a_restarter(
    parent: &ProcInfo,
    child: &ProcInfo,
    never: &HashSet<i32>,
    cmdline: &dyn Fn(i32) -> String,
) -> bool {
    if parent.pid <= 1
        || parent.is_zombie()
        || never.contains(&parent.pid)
        || parent.start > child.start
        || matches!(parent.comm.as_str(), "systemd" | "init")
    {
        return true;
    }
    let line = cmdline(parent.pid);
    is_interactive_shell(parent, &line) || is_infrastructure(parent, &line)
}

/// The live parents of `stopped` (the holders taken) that are not themselves stopped, nor
/// gpuloop or its ancestors (`never`), nor a login or interactive shell.
pub fn find(tree: &Tree, stopped: &[Identity], never: &HashSet<i32>) -> Vec<Restarter> {
    find_with(tree, stopped, never, &super::cmdline)
}

fn find_with(
    tree: &Tree,
    stopped: &[Identity],
    never: &HashSet<i32>,
    cmdline: &dyn Fn(i32) -> String,
) -> Vec<Restarter> {
    let taken: HashSet<i32> = stopped.iter().map(|id| id.pid).collect();
    let mut out: Vec<Restarter> = Vec::new();
    for id in stopped {
        let Some(child) = tree.get(id.pid) else {
            continue;
        };
        let Some(parent) = tree.get(child.ppid) else {
            continue;
        };
        if taken.contains(&parent.pid)
            || not_a_restarter(parent, child, never, cmdline)
            || out.iter().any(|r| r.pid == i64::from(parent.pid))
        {
            continue;
        }
        out.push(Restarter {
            pid: parent.pid.into(),
            name: super::display_name(&parent.comm, &cmdline(parent.pid)),
            holder: child.pid.into(),
            identity: parent.identity(),
            holder_identity: child.identity(),
        });
    }
    out
}

/// How long a parent gets to exit after its holder did: a launcher that only waited for its
/// child (`bash -c cmd`, a plain `python3 launcher.py`) exits then; a restarter keeps running.
pub(crate) const EXIT_WINDOW: Duration = Duration::from_millis(250);

/// The restarters still running `within` after their holders ended (checked every few ms, so
/// the usual case, a parent exiting at once, costs about nothing).
pub(crate) fn still_running(mut rs: Vec<Restarter>, within: Duration) -> Vec<Restarter> {
    let deadline = Instant::now() + within;
    let running = |r: &Restarter| {
        super::read_stat(r.identity.pid)
            .is_ok_and(|p| p.start == r.identity.start && !p.is_zombie())
    };
    loop {
        rs.retain(running);
        if rs.is_empty() || Instant::now() >= deadline {
            return rs;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The restarter among `pid`'s ancestors (a few levels: `bash -c` may run `sh` that runs
/// python), if one of `restarters` started it again: a holder with a new identity. The holder
/// it stopped, still there (a TERM handler shutting down), is no restart.
pub(crate) fn started_by(pid: i32, restarters: &[Restarter]) -> Option<&Restarter> {
    if restarters.is_empty() {
        return None;
    }
    let holder = super::read_stat(pid).ok()?;
    let r = ancestor(pid, |a| {
        restarters.iter().find(|r| r.identity == a.identity())
    })?;
    (r.holder_identity != holder.identity()).then_some(r)
}

/// A restarter gpuloop saw start a holder again, as remembered on this machine, so that a
/// later diagnose, in another gpuloop, still knows it for one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Seen {
    pub pid: i32,
    /// With the pid, its identity: a process that got the pid later is not it.
    pub start: u64,
    pub name: String,
    /// When gpuloop saw it restart its holder (UTC).
    pub seen: String,
}

impl Seen {
    fn live(&self) -> bool {
        super::read_stat(self.pid).is_ok_and(|p| p.start == self.start && !p.is_zombie())
    }
}

/// The file, beside the audit journal, that remembers the restarters seen.
const SEEN_FILE: &str = "restarters.json";

/// At most this many are remembered (the latest); far more than one node runs loops.
const SEEN_MAX: usize = 64;

/// Bytes of the file read: 64 entries take a fraction of this.
const SEEN_BYTES: u64 = 64 << 10;

/// Remembers that `r` started its holder again. Entries whose process is gone are dropped on
/// the way. A file that cannot be written costs the memory, not the kill: warned in the log.
pub(crate) fn remember(r: &Restarter) {
    let entry = Seen {
        pid: r.identity.pid,
        start: r.identity.start,
        name: r.name.clone(),
        seen: crate::journal::now_utc(),
    };
    let written = crate::journal::dir().and_then(|dir| {
        crate::journal::update_state(&dir, SEEN_FILE, SEEN_BYTES, |old| {
            serde_json::to_vec(&merged(old, entry, Seen::live)).unwrap_or_default()
        })
    });
    if let Err(e) = written {
        tracing::warn!("restarter not remembered: {e}");
    }
}

/// The file's entries that `live` keeps, with `entry` added (once) as the latest, the
/// [`SEEN_MAX`] latest kept.
fn merged(old: &[u8], entry: Seen, live: impl Fn(&Seen) -> bool) -> Vec<Seen> {
    let mut all = remembered_in(old, live);
    all.retain(|s| (s.pid, s.start) != (entry.pid, entry.start));
    all.push(entry);
    let over = all.len().saturating_sub(SEEN_MAX);
    all.drain(..over);
    all
}

/// The restarters remembered on this machine that still run, as they were seen.
pub(crate) fn seen_before() -> Vec<Seen> {
    crate::journal::dir()
        .and_then(|dir| crate::journal::read_state(&dir, SEEN_FILE, SEEN_BYTES))
        .ok()
        .flatten()
        .map(|text| remembered_in(&text, Seen::live))
        .unwrap_or_default()
}

/// The entries of the file's text that `keep` keeps; a damaged file remembers nothing.
fn remembered_in(text: &[u8], keep: impl Fn(&Seen) -> bool) -> Vec<Seen> {
    serde_json::from_slice::<Vec<Seen>>(text)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| keep(s))
        .collect()
}

/// The ancestor of `pid` (a few levels: `bash -c` may run `sh` that runs python) for which
/// `is` says something, with what it says.
fn ancestor<T>(pid: i32, is: impl Fn(&ProcInfo) -> Option<T>) -> Option<T> {
    let mut p = super::read_stat(pid).ok()?;
    for _ in 0..8 {
        let parent = super::read_stat(p.ppid).ok()?;
        if let Some(found) = is(&parent) {
            return Some(found);
        }
        if parent.pid <= 1 {
            return None;
        }
        p = parent;
    }
    None
}

/// The remembered restarter among `pid`'s ancestors, if any: the very process (pid and start
/// time) seen restarting a holder before.
pub(crate) fn restarted_before(pid: i32, seen: &[Seen]) -> Option<&Seen> {
    if seen.is_empty() {
        return None;
    }
    ancestor(pid, |a| {
        seen.iter().find(|s| (s.pid, s.start) == (a.pid, a.start))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, comm: &str, start: u64) -> ProcInfo {
        ProcInfo {
            pid,
            flags: 0,
            comm: comm.into(),
            state: 'S',
            ppid,
            pgid: pid,
            sid: pid,
            start,
        }
    }

    #[test]
    fn tells_interactive_shells_from_script_shells() {
        let bash = p(5, 1, "bash", 1);
        assert!(is_interactive_shell(&bash, "-bash"));
        assert!(is_interactive_shell(&bash, "bash"));
        assert!(is_interactive_shell(&bash, "/bin/bash -l"));
        assert!(!is_interactive_shell(
            &bash,
            "bash -c while true; do python3 holder.py; done"
        ));
        assert!(!is_interactive_shell(&bash, "bash run.sh"));
        assert!(!is_interactive_shell(
            &p(6, 1, "torchrun", 1),
            "/usr/bin/python3 /usr/bin/torchrun train.py"
        ));
    }

    #[test]
    fn finds_live_parents_that_are_not_taken_nor_protected() {
        // 10 (an agent) started 11; 20 started 21 but was taken too; 31 was reparented to
        // 30 (younger than it); 50, a login shell, started 51.
        let t = Tree::new(vec![
            p(1, 0, "init", 0),
            p(10, 1, "agent", 5),
            p(11, 10, "python3", 6),
            p(20, 1, "agent", 5),
            p(21, 20, "python3", 6),
            p(30, 1, "subreaper", 9),
            p(31, 30, "python3", 6),
            p(41, 1, "python3", 6),
            p(50, 1, "bash", 5),
            p(51, 50, "python3", 6),
        ]);
        let cmdline = |pid: i32| if pid == 50 { "-bash" } else { "agent" }.to_string();
        let ids: Vec<Identity> = [11, 20, 21, 31, 41, 51]
            .iter()
            .map(|&pid| t.get(pid).unwrap().identity())
            .collect();
        let rs = find_with(&t, &ids, &HashSet::new(), &cmdline);
        assert_eq!(rs.len(), 1, "{rs:?}");
        assert_eq!((rs[0].pid, rs[0].holder), (10, 11));
        assert_eq!(
            rs[0].describe(),
            "pid 10 (agent) started holder 11 and is still running: it may restart it"
        );
        // gpuloop's own ancestors are never restarters.
        assert!(find_with(&t, &ids, &HashSet::from([10]), &cmdline).is_empty());
    }

    fn seen(pid: i32, start: u64) -> Seen {
        Seen {
            pid,
            start,
            name: "bash".into(),
            seen: "2026-12-01T16:00:00.000Z".into(),
        }
    }

    /// A remembered restarter is that very process: a process that got its pid later (another
    /// start time) is never named.
    #[test]
    fn a_remembered_restarter_is_known_by_pid_and_start_time() {
        let me = super::super::read_stat(std::process::id() as i32).unwrap();
        let parent = super::super::read_stat(me.ppid).unwrap();
        let found = [seen(parent.pid, parent.start)];
        assert_eq!(restarted_before(me.pid, &found), Some(&found[0]));
        let reused = [seen(parent.pid, parent.start + 1)];
        assert_eq!(restarted_before(me.pid, &reused), None);
        assert_eq!(restarted_before(me.pid, &[]), None);
    }

    /// The file keeps the live entries, each process once, the latest [`SEEN_MAX`]; a damaged
    /// one remembers nothing.
    #[test]
    fn the_remembered_restarters_stay_few_and_alive() {
        let old: Vec<Seen> = (1..=SEEN_MAX as i32).map(|pid| seen(pid, 7)).collect();
        let text = serde_json::to_vec(&old).unwrap();
        let all = merged(&text, seen(1000, 7), |_| true);
        assert_eq!(all.len(), SEEN_MAX);
        assert_eq!((all[0].pid, all[SEEN_MAX - 1].pid), (2, 1000));
        // Only the live ones are kept, and one seen again is one entry, the latest.
        let all = merged(&text, seen(4, 7), |s| s.pid <= 5);
        let pids: Vec<i32> = all.iter().map(|s| s.pid).collect();
        assert_eq!(pids, [1, 2, 3, 5, 4]);
        assert_eq!(merged(b"{not json", seen(9, 7), |_| true).len(), 1);
        assert!(remembered_in(b"[{\"pid\": 1}]", |_| true).is_empty());
    }

    /// `clean --parents` once stopped a job step's `slurmstepd`.
    #[test]
    fn job_step_and_container_managers_are_not_restarters() {
        let t = Tree::new(vec![
            p(1, 0, "init", 0),
            p(10, 1, "slurmstepd", 5),
            p(11, 10, "python3", 6),
            p(20, 1, "containerd-shim", 5),
            p(21, 20, "python3", 6),
            p(30, 1, "sshd", 5),
            p(31, 30, "python3", 6),
            // argv[0] counts too: a tini whose comm was renamed.
            p(40, 1, "x", 5),
            p(41, 40, "python3", 6),
            p(50, 1, "bash", 5),
            p(51, 50, "python3", 6),
        ]);
        let cmdline = |pid: i32| {
            match pid {
                40 => "/usr/bin/tini -- python3 serve.py",
                50 => "bash -c while true; do python3 holder.py; done",
                _ => "x",
            }
            .to_string()
        };
        let ids: Vec<Identity> = [11, 21, 31, 41, 51]
            .iter()
            .map(|&pid| t.get(pid).unwrap().identity())
            .collect();
        let rs = find_with(&t, &ids, &HashSet::new(), &cmdline);
        let pids: Vec<i64> = rs.iter().map(|r| r.pid).collect();
        assert_eq!(pids, [50], "{rs:?}");
    }
}
