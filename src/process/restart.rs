//! Restarters: live parents of stopped holders that may start them again (a shell loop,
//! torchrun's elastic agent, a Ray raylet), found in the snapshot taken before signalling, and
//! which of them have shown that they do.

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
    /// How it has shown that it restarts its holders, if it has: only such a parent is
    /// stopped with `parents` (outliving a child is no evidence: an interactive shell
    /// outlives every command it runs).
    #[serde(default)]
    pub shown: Option<Shown>,
    /// Known to the kill that found it; a report read back from a script has none.
    #[serde(skip, default = "unknown")]
    pub identity: Identity,
    /// The holder's identity: while that very process is still exiting, nothing was
    /// started again.
    #[serde(skip, default = "unknown")]
    pub holder_identity: Identity,
}

/// The evidence that a parent restarts its holders.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Shown {
    /// A launcher known to restart its workers (torchrun's elastic agent).
    Launcher,
    /// gpuloop saw it start a holder again after one was stopped: in this run, or remembered
    /// on this machine by its pid and start time.
    Restarted,
}

impl Shown {
    /// What it shows, in words: "it is a launcher that restarts its workers".
    pub(crate) fn says(self) -> &'static str {
        match self {
            Shown::Launcher => "it is a launcher that restarts its workers",
            Shown::Restarted => "gpuloop saw it restart a holder before",
        }
    }
}

fn unknown() -> Identity {
    Identity::new(0, 0)
}

impl Restarter {
    /// "pid 1237 (bash) started holder 1240 and is still running: it may restart it; stop it
    /// yourself if it does": a parent left running, and what to make of it.
    pub(crate) fn describe(&self) -> String {
        let then = match self.shown {
            None => ": it may restart it; stop it yourself if it does".to_string(),
            Some(shown) => format!("; {}: --parents stops it with its holders", shown.says()),
        };
        format!(
            "pid {} ({}) started holder {} and is still running{then}",
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

/// What real torchrun's elastic agent is called where it is shown: it names itself
/// `pt_elastic` (and runs as `torchrun`), starts its workers in sessions of their own and
/// starts them again (`--max-restarts`).
pub(crate) const TORCHRUN_AGENT: &str = "torchrun agent (restarts its workers)";

/// Comms of the launchers known to restart their workers.
const KNOWN: &[&str] = &["pt_elastic", "torchrun"];

/// What a process is, if it is a launcher known to restart its workers: torchrun's elastic
/// agent, by its comm (`pt_elastic`, `torchrun`) or by what its Python runs
/// (`python3 -m torch.distributed.run`, `python3 /usr/bin/torchrun`, a module of
/// `torch.distributed.elastic`).
pub fn launcher(comm: &str, cmdline: &str) -> Option<&'static str> {
    if KNOWN.contains(&comm) || runs_torchrun(cmdline) {
        return Some(TORCHRUN_AGENT);
    }
    None
}

/// A Python whose script is `torchrun` or whose module (`-m`) is torch's elastic launcher.
fn runs_torchrun(cmdline: &str) -> bool {
    let mut argv = cmdline.split(' ').filter(|a| !a.is_empty());
    let argv0 = argv.next().unwrap_or("");
    if !argv0
        .rsplit('/')
        .next()
        .unwrap_or(argv0)
        .starts_with("python")
    {
        return false;
    }
    let elastic = |module: &str| {
        module == "torch.distributed.run"
            || module == "torch.distributed.elastic"
            || module.starts_with("torch.distributed.elastic.")
    };
    while let Some(a) = argv.next() {
        match a {
            "-m" => return argv.next().is_some_and(elastic),
            "-c" | "-" => return false,
            // Options that take a value.
            "-W" | "-X" | "--check-hash-based-pycs" => {
                argv.next();
            }
            _ if a.starts_with("-m") => return elastic(&a[2..]),
            _ if a.starts_with('-') => {}
            script => return script.rsplit('/').next() == Some("torchrun"),
        }
    }
    false
}

/// Whether a name shown for a process (`display_name`) says it is a known launcher.
fn is_launcher_name(name: &str) -> bool {
    name == TORCHRUN_AGENT
}

/// Advice for holders whose parent is a known restarter, from what a holder map says of its
/// parent (`pid`, `ppid`, the parent's name as shown): stopping such a worker alone only gets
/// it started again, so the restarter goes with it (`parents` is the command that does that).
pub fn advice<'a>(
    holders: impl IntoIterator<Item = (i64, i64, &'a str)>,
    parents: &str,
) -> Option<String> {
    let (pid, ppid, what) = holders
        .into_iter()
        .find(|(_, _, name)| is_launcher_name(name))?;
    Some(format!(
        "the parent of {pid}, pid {ppid}, is a {what}: stopping the worker alone only gets it started again; stop the {} with it ({parents})",
        what.split(" (").next().unwrap_or(what)
    ))
}

/// Shells, whose login or interactive instances start things by hand and restart nothing.
const SHELLS: &[&str] = &["bash", "sh", "dash", "zsh", "fish", "ksh", "tcsh", "csh"];

/// A login shell (`-bash`) or an interactive one: a shell given no command (`-c`) and no
/// script. The values of its options are no script: `bash --init-file FILE -i` (how VS Code's
/// terminal starts bash), `--rcfile FILE`, `-O extglob`, `+o vi`.
fn is_interactive_shell(p: &ProcInfo, cmdline: &str) -> bool {
    let mut argv = cmdline.split(' ').filter(|a| !a.is_empty());
    let argv0 = argv.next().unwrap_or("");
    if argv0.starts_with('-') {
        return true;
    }
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    if !(SHELLS.contains(&p.comm.as_str()) || SHELLS.contains(&base)) {
        return false;
    }
    while let Some(a) = argv.next() {
        match a {
            // Whatever follows is the script (or, with -c, the command's arguments).
            "--" | "-" => return argv.next().is_none(),
            "--init-file" | "--rcfile" => {
                argv.next();
            }
            _ if a.starts_with("--") => {}
            _ if a.starts_with('-') || a.starts_with('+') => {
                let flags = &a[1..];
                // `bash -c '…'`, `bash -lc '…'`: a command runs there, and may loop.
                if a.starts_with('-') && flags.contains('c') {
                    return false;
                }
                // -O/+O (shopt) and -o/+o (set) take a value, also at the end of a cluster.
                if flags.ends_with(['o', 'O']) {
                    argv.next();
                }
            }
            // `bash job.sh`: a script runs there, and may loop.
            _ => return false,
        }
    }
    true
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
/// gpuloop or its ancestors (`never`), nor a login or interactive shell; each with what it has
/// shown: a known launcher, or one of `restarted` (parents gpuloop saw restart a holder).
pub fn find(
    tree: &Tree,
    stopped: &[Identity],
    never: &HashSet<i32>,
    restarted: &[Seen],
) -> Vec<Restarter> {
    find_with(tree, stopped, never, restarted, &super::cmdline)
}

fn find_with(
    tree: &Tree,
    stopped: &[Identity],
    never: &HashSet<i32>,
    restarted: &[Seen],
    cmdline: &dyn Fn(i32) -> String,
) -> Vec<Restarter> {
    let taken: HashSet<i32> = stopped.iter().map(|id| id.pid).collect();
    let mut out: Vec<Restarter> = Vec::new();
    // Parents already found: each is looked at once, however many of its children stopped.
    let mut found: HashSet<i32> = HashSet::new();
    for id in stopped {
        let Some(child) = tree.get(id.pid) else {
            continue;
        };
        let Some(parent) = tree.get(child.ppid) else {
            continue;
        };
        if taken.contains(&parent.pid)
            || found.contains(&parent.pid)
            || not_a_restarter(parent, child, never, cmdline)
        {
            continue;
        }
        found.insert(parent.pid);
        let line = cmdline(parent.pid);
        let name = super::display_name(&parent.comm, &line);
        out.push(Restarter {
            pid: parent.pid.into(),
            shown: shown(parent, &line, &name, restarted),
            name,
            holder: child.pid.into(),
            identity: parent.identity(),
            holder_identity: child.identity(),
        });
    }
    out
}

/// What `parent` has shown of restarting its holders, if anything: it is a launcher known to
/// restart its workers, or gpuloop saw that very process (pid and start time) restart a holder,
/// and it still runs the program it ran then (a shell that has since exec'd another program is
/// not the loop that was seen).
fn shown(parent: &ProcInfo, cmdline: &str, name: &str, restarted: &[Seen]) -> Option<Shown> {
    if launcher(&parent.comm, cmdline).is_some() {
        return Some(Shown::Launcher);
    }
    restarted
        .iter()
        .any(|s| (s.pid, s.start) == (parent.pid, parent.start) && s.name == name)
        .then_some(Shown::Restarted)
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

/// Remembers that `r` started its holder again, and returns what was remembered. Entries
/// whose process is gone are dropped on the way. A file that cannot be written costs the
/// memory on this machine, not the kill: warned in the log.
pub(crate) fn remember(r: &Restarter) -> Seen {
    let entry = Seen {
        pid: r.identity.pid,
        start: r.identity.start,
        name: r.name.clone(),
        seen: crate::utc::now(),
    };
    let written = crate::journal::dir().and_then(|dir| {
        crate::journal::update_state(&dir, SEEN_FILE, SEEN_BYTES, |old| {
            serde_json::to_vec(&merged(old, entry.clone(), Seen::live)).unwrap_or_default()
        })
    });
    if let Err(e) = written {
        tracing::warn!("restarter not remembered: {e}");
    }
    entry
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

    /// The identities of `pids` in `t`: the holders a kill took.
    fn taken(t: &Tree, pids: &[i32]) -> Vec<Identity> {
        pids.iter()
            .map(|&pid| t.get(pid).unwrap().identity())
            .collect()
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
        assert!(!is_interactive_shell(&bash, "bash -lc python3 holder.py"));
        // The bug: the values of options (`--init-file FILE`, `-O extglob`) were taken for scripts.
        for line in [
            "/bin/bash --init-file /tmp/vscode-shell-integration.sh -i",
            "bash --rcfile /home/a/.bashrc -i",
            "bash -O extglob -i",
            "bash +O extglob",
            "bash -eo pipefail -i",
            "bash --norc --noprofile",
            "bash -i --",
        ] {
            assert!(is_interactive_shell(&bash, line), "{line}");
        }
        assert!(!is_interactive_shell(&bash, "bash -O extglob loop.sh"));
        assert!(!is_interactive_shell(&bash, "bash --rcfile rc -- loop.sh"));
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
        let ids = taken(&t, &[11, 20, 21, 31, 41, 51]);
        let rs = find_with(&t, &ids, &HashSet::new(), &[], &cmdline);
        assert_eq!(rs.len(), 1, "{rs:?}");
        assert_eq!((rs[0].pid, rs[0].holder), (10, 11));
        assert_eq!(
            rs[0].describe(),
            "pid 10 (agent) started holder 11 and is still running: it may restart it; stop it yourself if it does"
        );
        // gpuloop's own ancestors are never restarters.
        assert!(find_with(&t, &ids, &HashSet::from([10]), &[], &cmdline).is_empty());
    }

    /// Only a parent that has shown it restarts is taken for one: a known
    /// launcher, or the very process gpuloop saw restart a holder, still running the same
    /// program.
    #[test]
    fn a_parent_has_shown_it_restarts_only_by_what_it_is_or_what_gpuloop_saw() {
        let t = Tree::new(vec![
            p(1, 0, "init", 0),
            p(10, 1, "python3", 5),
            p(11, 10, "python3", 6),
            p(20, 1, "bash", 5),
            p(21, 20, "python3", 6),
            p(30, 1, "sleep", 5),
            p(31, 30, "python3", 6),
            p(40, 1, "pt_elastic", 5),
            p(41, 40, "python3", 6),
        ]);
        let cmdline = |pid: i32| {
            match pid {
                10 => "/usr/bin/python3 -m torch.distributed.run --nproc-per-node 8 train.py",
                20 => "bash -c while true; do python3 holder.py; done",
                30 => "sleep 1000",
                _ => "python3 x.py",
            }
            .to_string()
        };
        let ids = taken(&t, &[11, 21, 31, 41]);
        let shown = |restarted: &[Seen]| -> Vec<(i64, Option<Shown>)> {
            find_with(&t, &ids, &HashSet::new(), restarted, &cmdline)
                .iter()
                .map(|r| (r.pid, r.shown))
                .collect()
        };
        let launcher = Some(Shown::Launcher);
        assert_eq!(
            shown(&[]),
            [(10, launcher), (20, None), (30, None), (40, launcher)]
        );
        // Seen restarting: that very process, under the name it had. One that has exec'd
        // another program since (its pid and start time are the same) is not the loop seen.
        let seen_as = |pid: i32, start: u64, name: &str| Seen {
            name: name.into(),
            ..seen(pid, start)
        };
        let again = Some(Shown::Restarted);
        assert_eq!(
            shown(&[seen_as(20, 5, "bash"), seen_as(30, 5, "bash")]),
            [(10, launcher), (20, again), (30, None), (40, launcher)]
        );
        assert_eq!(shown(&[seen_as(20, 4, "bash")])[1], (20, None));
    }

    #[test]
    fn knows_torchrun_by_its_comm_or_what_its_python_runs() {
        for (comm, line) in [
            (
                "pt_elastic",
                "/usr/bin/python3 /usr/local/bin/torchrun train.py",
            ),
            (
                "torchrun",
                "/usr/bin/python3 /usr/local/bin/torchrun train.py",
            ),
            (
                "python3",
                "/usr/bin/python3 /usr/local/bin/torchrun --nnodes 2 train.py",
            ),
            ("python3", "python3 -m torch.distributed.run train.py"),
            (
                "python",
                "python -u -W ignore -m torch.distributed.run train.py",
            ),
            ("python3.11", "python3.11 -mtorch.distributed.run train.py"),
            (
                "python3",
                "python3 -m torch.distributed.elastic.agent.server.local_elastic_agent",
            ),
        ] {
            assert_eq!(launcher(comm, line), Some(TORCHRUN_AGENT), "{line}");
        }
        for (comm, line) in [
            ("python3", "python3 train.py --launcher torchrun"),
            ("python3", "python3 -c import torch.distributed.run"),
            ("python3", "python3 -m torch.distributed.launch train.py"),
            ("bash", "bash -c torchrun train.py"),
            ("python3", "python3 -m torch.distributed.run.x"),
        ] {
            assert_eq!(launcher(comm, line), None, "{line}");
        }
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
        let ids = taken(&t, &[11, 21, 31, 41, 51]);
        let rs = find_with(&t, &ids, &HashSet::new(), &[], &cmdline);
        let pids: Vec<i64> = rs.iter().map(|r| r.pid).collect();
        assert_eq!(pids, [50], "{rs:?}");
    }
}
