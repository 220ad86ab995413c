//! Identity-safe signalling: pidfds, one shared grace, escalation to SIGKILL, exits awaited.

use super::identity::{self, Pinned};
use super::restart::{self, Restarter, Seen};
pub use super::skip::{Forcing, SkipReason};
use super::tree::Tree;
use super::Identity;
use nix::sys::signal::Signal;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::pidfd_send_signal;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What to stop: a bare pid (resolved now) or an identity seen earlier (checked before signalling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Pid(i32),
    Exact(Identity),
}

impl Target {
    pub fn pid(&self) -> i32 {
        match self {
            Target::Pid(p) => *p,
            Target::Exact(id) => id.pid,
        }
    }
}

/// How a kill goes. One type for every front end: each builds it with a `From`/`TryFrom` impl
/// beside its own form of the options, in its own room (clap's flags in `src/cli/`, the wire's
/// in `src/hosts/protocol.rs`, the MCP kill tool's arguments in `src/mcp/tools.rs`, a
/// script's option map in `src/script/bindings/process.rs`).
#[derive(Debug, Clone)]
pub struct KillOpts {
    pub signal: Signal,
    /// Survivors get SIGKILL after this: zero is TERM then KILL at once (as `docker stop
    /// -t 0`), `NEVER` ("inf") is no KILL at all.
    pub grace: Duration,
    /// Also the targets' descendants (and their job's process group).
    pub tree: bool,
    pub dry_run: bool,
    /// Allow protected processes (GPU daemons).
    pub force: bool,
    /// Also the targets' restarters that have shown they restart them (`restart::Shown`):
    /// a known launcher, or one in `restarted`. Any other live parent is named in the
    /// report's `restarters` and left alone.
    pub parents: bool,
    /// Parents gpuloop saw start a holder again after one was stopped: in this run, and as
    /// remembered on this machine (filled in where the kill runs, `machine::Local::kill`).
    pub(crate) restarted: Vec<Seen>,
    /// What an interrupt during the grace does.
    pub on_interrupt: OnInterrupt,
    /// Why each target (by pid) was chosen, for the audit journal: "holder of GPU 0". A
    /// target not named here is journaled as a bare pid or an identity the caller gave.
    pub why: HashMap<i32, String>,
    /// With a grace that never ends (`NEVER`): wait for the exits here, until they happen or
    /// an interrupt (kill()); false leaves the waiting to the caller (clean waits until its
    /// timeout).
    pub wait_forever: bool,
    /// The one user whose processes may be signalled (`--user`, `--mine`): targets, their
    /// trees, their groups and their parents alike. Anyone else's is left alone, and said.
    pub owner: Option<Owner>,
    /// The one pod or container whose processes may be signalled (`--pod`, `--container`):
    /// targets, their trees, their groups and their parents alike, each read through its
    /// pin. Anything outside it is left alone, and said.
    pub within: Option<super::container::Within>,
    /// The server call this kill is carried out for (an MCP tool call, a remote client's
    /// request), journaled with each signal.
    pub(crate) served: Option<crate::journal::Served>,
}

/// The user a kill is bounded to, and how the caller named it ("--user nobody", "--mine"),
/// for the reason a process outside it is left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub said: String,
}

impl Owner {
    /// Why `p` is outside the bound, if it is: "owned by root, outside --user nobody". Inside
    /// it is a process wholly that user's: its real, effective and saved uids all are (one
    /// that changed its effective uid, or a setuid program, is someone else's too). A process
    /// whose owner cannot be read is outside it.
    fn excludes(&self, p: &Pinned) -> Option<String> {
        match p.dir.uids() {
            Ok(ids) => {
                let other = ids.into_iter().find(|&u| u != self.uid)?;
                Some(format!(
                    "owned by {}, outside {}",
                    super::user_name(other),
                    self.said
                ))
            }
            Err(e) => Some(format!("owner unreadable ({e}), outside {}", self.said)),
        }
    }
}

impl Default for KillOpts {
    fn default() -> Self {
        KillOpts {
            signal: Signal::SIGTERM,
            grace: Duration::from_secs(5),
            tree: true,
            dry_run: false,
            force: false,
            parents: false,
            restarted: Vec::new(),
            on_interrupt: OnInterrupt::StopWaiting,
            why: HashMap::new(),
            wait_forever: true,
            owner: None,
            within: None,
            served: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Skipped {
    pub pid: i64,
    pub reason: SkipReason,
}

impl Skipped {
    /// The process had exited before it could be signalled.
    pub(crate) fn is_gone(&self) -> bool {
        self.reason.is_gone()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct KillError {
    pub pid: i64,
    pub error: String,
}

/// One process kill() signalled (or, in a dry run, would signal), and what ended it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Stopped {
    pub pid: i64,
    pub name: String,
    /// GPUs it held (filled in by the caller that knows them; empty for a bare pid).
    pub gpus: Vec<i64>,
    /// The first signal: "TERM", "INT", "KILL", …
    pub signal: String,
    /// The signal it exited after (the first, or "KILL" when it outlived the grace); `None`
    /// while it lives or in a dry run.
    pub ended_by: Option<String>,
    /// Milliseconds from the first signal to its exit.
    pub exit_ms: Option<i64>,
}

/// The report `kill()` returns to scripts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct KillReport {
    pub dry_run: bool,
    pub signalled: Vec<i64>,
    /// In a dry run: what would be signalled (`signalled` is then empty).
    pub would_signal: Vec<i64>,
    pub exited: Vec<i64>,
    pub survivors: Vec<i64>,
    pub skipped: Vec<Skipped>,
    pub errors: Vec<KillError>,
    /// Every process signalled (or that would be), with its name and what ended it.
    pub targets: Vec<Stopped>,
    /// Sent SIGKILL instead of the signal asked for, which they could not act on.
    pub killed_at_once: Vec<Skipped>,
    /// KILLed but still there, asleep in the kernel or the driver (D state).
    pub stuck: Vec<Stuck>,
    /// An interrupt ended the kill: during the grace, `survivors` got the signal but no
    /// SIGKILL; before the signals were all sent, the targets not reached yet are in no list.
    pub interrupted: bool,
    pub elapsed_ms: i64,
    /// Live parents of the targets that may start them again (not signalled without `parents`).
    #[serde(default)]
    pub restarters: Vec<Restarter>,
    /// With several hosts: each host's own report (the lists above are their union).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub by_host: std::collections::BTreeMap<String, KillReport>,
}

impl KillReport {
    /// Every target is gone: none survived, none is stuck, no signal failed.
    pub(crate) fn all_gone(&self) -> bool {
        self.survivors.is_empty() && self.stuck.is_empty() && self.errors.is_empty()
    }

    /// This report followed by a `later` kill of the same call (clean's next round): every
    /// list is both's, and the restarters are those still left running after it.
    pub(crate) fn then(&mut self, later: KillReport) {
        let signalled: HashSet<i64> = later.signalled.iter().copied().collect();
        let again: HashSet<Identity> = later.restarters.iter().map(|l| l.identity).collect();
        self.restarters
            .retain(|r| !signalled.contains(&r.pid) && !again.contains(&r.identity));
        self.restarters.extend(later.restarters);
        self.signalled.extend(later.signalled);
        self.would_signal.extend(later.would_signal);
        self.exited.extend(later.exited);
        self.survivors.extend(later.survivors);
        self.skipped.extend(later.skipped);
        self.errors.extend(later.errors);
        self.targets.extend(later.targets);
        self.killed_at_once.extend(later.killed_at_once);
        self.stuck.extend(later.stuck);
        self.interrupted |= later.interrupted;
        self.elapsed_ms += later.elapsed_ms;
    }
}

/// A process that SIGKILL has not ended yet because it sleeps uninterruptibly.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Stuck {
    pub pid: i64,
    pub name: String,
    /// The kernel function it sleeps in (/proc/PID/wchan), "?" if hidden.
    pub wchan: String,
}

/// What ends a grace early. Ctrl-C never turns into SIGKILL by itself for kill() and clean:
/// the first interrupt stops the waiting and the report says who got the signal and who is
/// still running. Stopping a job gpuloop started is different, because a job must never be
/// left behind: the stop finishes, and an interrupt during it cuts the grace short (KILL now).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnInterrupt {
    #[default]
    StopWaiting,
    KillNow,
}

/// Something that says "interrupted": the session's Ctrl-C flag, or `interrupt::After`.
pub trait Interrupt {
    fn is_set(&self) -> bool;
}

impl Interrupt for AtomicBool {
    fn is_set(&self) -> bool {
        self.load(Ordering::Relaxed)
    }
}

/// Live progress during the grace: (still running, signalled, time left before KILL).
pub(crate) type Progress<'a> = &'a mut dyn FnMut(usize, usize, Option<Duration>);

/// How long SIGKILLed processes get to disappear before they are reported as survivors
/// (a process stuck in the driver, in uninterruptible sleep, can outlive SIGKILL).
const KILL_WAIT: Duration = Duration::from_secs(5);

/// How long a job stop with no KILL (`NEVER`) waits for its processes: until they exit.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A grace that never ends: the signal, and never SIGKILL (`grace: "inf"`, `--grace inf`).
pub(crate) const NEVER: Duration = Duration::MAX;

/// A grace in seconds; infinity (what "inf" parses to) is `NEVER`.
pub(crate) fn grace_seconds(v: f64) -> Result<Duration, crate::seconds::BadSeconds> {
    if v == f64::INFINITY {
        return Ok(NEVER);
    }
    crate::seconds::seconds(v).map_err(|bad| crate::seconds::BadSeconds {
        or_inf: true,
        ..bad
    })
}

/// A grace on the agent's wire, in milliseconds: `NEVER` is `u64::MAX`.
pub fn grace_ms(grace: Duration) -> u64 {
    if grace == NEVER {
        return u64::MAX;
    }
    u64::try_from(grace.as_millis()).unwrap_or(u64::MAX - 1)
}

/// The grace a wire's milliseconds stand for (`grace_ms` turned back).
pub(crate) fn grace_of_ms(ms: u64) -> Duration {
    if ms == u64::MAX {
        NEVER
    } else {
        Duration::from_millis(ms)
    }
}

/// A signal name or number that names no signal, as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown signal {0:?} (use TERM, INT, KILL, HUP, … or a number)")]
pub struct UnknownSignal(pub String);

/// Parses "TERM", "SIGTERM", "term" or a number; the error is the one message every front
/// end gives, after its own context.
pub(crate) fn parse_signal(given: &str) -> Result<Signal, UnknownSignal> {
    let s = given.trim();
    let sig = if let Ok(n) = s.parse::<i32>() {
        Signal::try_from(n).ok()
    } else {
        let up = s.to_ascii_uppercase();
        let name = if up.starts_with("SIG") {
            up
        } else {
            format!("SIG{up}")
        };
        Signal::from_str(&name).ok()
    };
    sig.ok_or_else(|| UnknownSignal(given.to_string()))
}

/// Short signal name without "SIG": "TERM", "KILL".
pub(crate) fn signal_name(sig: Signal) -> &'static str {
    sig.as_str().trim_start_matches("SIG")
}

/// The policy of what may never be signalled, fixed for one call.
pub(crate) struct Guard<'a> {
    never: HashSet<i32>,
    me: i32,
    protected: &'a [String],
}

impl<'a> Guard<'a> {
    pub(crate) fn new(protected: &'a [String]) -> Guard<'a> {
        Guard {
            never: super::self_and_ancestors().into_iter().collect(),
            me: std::process::id() as i32,
            protected,
        }
    }

    /// Why `p` must not be signalled, if it must not.
    fn refuse(&self, pinned: &Pinned, force: bool) -> Option<SkipReason> {
        let p = &pinned.info;
        if p.pid <= 1 {
            return Some(SkipReason::NeverSignalled { pid: p.pid });
        }
        // kill(2) of a kernel thread's pid once reached kthreadd and every kernel thread.
        if p.is_kernel_thread() {
            return Some(SkipReason::KernelThread {
                pid: p.pid,
                comm: p.comm.clone(),
            });
        }
        if p.pid == self.me {
            return Some(SkipReason::Itself);
        }
        if self.never.contains(&p.pid) {
            return Some(SkipReason::Ancestor {
                pid: p.pid,
                comm: p.comm.clone(),
            });
        }
        // A zombie leader whose other threads live on still holds what they hold.
        if p.is_zombie() && crate::process::scan::live_thread(&pinned.dir).is_none() {
            return Some(SkipReason::Zombie { ppid: p.ppid });
        }
        // A protected name is proven through the pinned process's own /proc directory.
        if !force
            && super::daemon::is_protected(
                &pinned.dir,
                &p.comm,
                &pinned.dir.cmdline(),
                self.protected,
            )
        {
            return Some(SkipReason::Protected {
                comm: p.comm.clone(),
                forcing: Forcing::Allowed,
            });
        }
        None
    }
}

/// True if a process goes by one of `names`: its comm (the kernel keeps 15 bytes, so a longer
/// name matches its first 15) or the base name of its argv[0]. A claim, never proof: any user
/// names a process as they like (`daemon::is_protected` asks for proof).
pub(crate) fn is_named<S: AsRef<str>>(comm: &str, cmdline: &str, names: &[S]) -> bool {
    let argv0 = cmdline.split(' ').next().unwrap_or("");
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    names.iter().map(AsRef::as_ref).any(|name| {
        comm == name
            || base == name
            || (comm.len() == 15 && name.len() > 15 && name.starts_with(comm))
    })
}

struct Victim {
    pinned: Pinned,
    exited: bool,
    /// When it was seen gone.
    exit_at: Option<Instant>,
    /// SIGKILL was sent after the grace.
    escalated: bool,
    /// SIGKILL was sent to it (at once or after the grace).
    killed: bool,
    /// The signal it got first: the one asked for, or KILL when it could not act on that.
    first: Signal,
    /// Its name as a person is shown it, read before it was signalled.
    name: String,
}

/// Signals every target at once, waits for exits on pidfds, escalates after one shared grace.
pub fn kill(
    targets: &[Target],
    opts: &KillOpts,
    protected: &[String],
    interrupted: &dyn Interrupt,
) -> KillReport {
    kill_with_progress(targets, opts, protected, interrupted, &mut |_, _, _| {})
}

/// `kill`, telling `progress` how many are left while it waits.
pub(crate) fn kill_with_progress(
    targets: &[Target],
    opts: &KillOpts,
    protected: &[String],
    interrupted: &dyn Interrupt,
    progress: Progress,
) -> KillReport {
    let read = Instant::now();
    let tree = Tree::snapshot();
    tracing::debug!(
        "kill: the process tree read in {:.1} ms",
        read.elapsed().as_secs_f64() * 1e3
    );
    kill_in(&tree, targets, opts, protected, interrupted, progress)
}

/// How a tree member is tied to the pinned process it was found through.
#[derive(Clone, Copy)]
enum Tie {
    /// Its child.
    Child,
    /// A member of the process group it leads.
    Group,
}

/// Step 1 of a kill: the processes to signal, each pinned by a pidfd before anything is decided
/// about it, so that a recycled pid is never hit. The snapshot only says where to look: the refusals read the
/// pinned stat, a bare pid is whatever has the pid when it is pinned, and a descendant or group
/// member is taken only if, read through its own pin, it is still the child (or group member) of
/// a pinned process that still runs. A pid reused between the snapshot and the pin, even within
/// one clock tick, is then another process with another parent: not taken.
struct Resolve<'a> {
    tree: &'a Tree,
    guard: &'a Guard<'a>,
    opts: &'a KillOpts,
    own_pgid: i32,
    /// Every process pinned, taken or not.
    pins: Vec<Pinned>,
    /// Indices into `pins` of the processes to signal.
    chosen: Vec<usize>,
    /// Pids already considered.
    seen: HashSet<i32>,
    /// Pids already in the report's `skipped`.
    skipped: HashSet<i32>,
    /// Where each chosen process is in `chosen`, by pid.
    chosen_at: HashMap<i32, usize>,
    /// The targets themselves, as taken (their parents are the restarters).
    taken: Vec<Identity>,
    /// Why each process taken was chosen, by pid, for the audit journal.
    why: HashMap<i32, String>,
}

impl Resolve<'_> {
    /// Records that `pid` was not signalled, once.
    fn skip(&mut self, report: &mut KillReport, pid: i32, reason: SkipReason) {
        if self.skipped.insert(pid) {
            report.skipped.push(Skipped {
                pid: pid.into(),
                reason,
            })
        }
    }

    /// Keeps `p` and takes it unless it was considered before or is refused.
    fn consider(&mut self, report: &mut KillReport, p: Pinned, why: String) -> (usize, bool) {
        let pid = p.info.pid;
        let i = self.pins.len();
        self.pins.push(p);
        if !self.seen.insert(pid) {
            return (i, false);
        }
        let p = &self.pins[i];
        let refused = self
            .guard
            .refuse(p, self.opts.force)
            .or_else(|| {
                self.opts
                    .owner
                    .as_ref()?
                    .excludes(p)
                    .map(SkipReason::Outside)
            })
            // The cgroup read through the pin: a process at a reused pid is read as itself.
            .or_else(|| {
                let within = self.opts.within.as_ref()?;
                within
                    .excludes(p.dir.read("cgroup"))
                    .map(SkipReason::Outside)
            });
        match refused {
            Some(reason) => {
                self.skip(report, pid, reason);
                (i, false)
            }
            None => {
                self.chosen_at.insert(pid, self.chosen.len());
                self.chosen.push(i);
                self.why.insert(pid, why);
                (i, true)
            }
        }
    }

    fn target(&mut self, report: &mut KillReport, t: &Target) {
        let pid = t.pid();
        if pid <= 1 {
            return self.skip(report, pid, SkipReason::NeverSignalled { pid });
        }
        if self.seen.contains(&pid) {
            return;
        }
        let pinned = match t {
            Target::Exact(id) => identity::pin(id),
            Target::Pid(pid) => identity::pin_now(*pid),
        };
        let p = match pinned {
            Ok(Some(p)) => p,
            Ok(None) => return self.skip(report, pid, SkipReason::Gone),
            Err(reason) => return self.skip(report, pid, SkipReason::Unpinned(reason)),
        };
        // A refused target's tree is never walked (its children may be gpuloop's siblings, or
        // a daemon's helpers).
        let why = self.opts.why.get(&pid).cloned().unwrap_or_else(|| match t {
            Target::Pid(_) => "bare pid".into(),
            Target::Exact(_) => "pid and start time given".into(),
        });
        let (i, taken) = self.consider(report, p, why);
        if !taken {
            return;
        }
        self.taken.push(self.pins[i].identity());
        if self.opts.tree {
            self.walk(report, i);
        }
    }

    /// Takes the descendants of `pins[root]` and, if it leads a process group that is not
    /// gpuloop's own, that group's members (what it double-forked or setsid'd away).
    fn walk(&mut self, report: &mut KillReport, root: usize) {
        let root_pid = self.pins[root].info.pid;
        let mut visited = HashSet::from([root_pid]);
        let mut queue = VecDeque::from([root]);
        while let Some(n) = queue.pop_front() {
            // Zombies too: `member` tells through the pin a true one (skipped) from a defunct
            // leader whose threads live on (taken).
            let kids: Vec<i32> = self
                .tree
                .children(self.pins[n].info.pid)
                .map(|c| c.pid)
                .collect();
            for c in kids {
                if visited.insert(c) {
                    if let Some(k) = self.member(report, c, n, Tie::Child) {
                        queue.push_back(k);
                    }
                }
            }
        }
        // A target in gpuloop's own process group shares gpuloop's job (a script's `&` job,
        // a test harness): its group is never swept, or gpuloop's siblings would be.
        if self.pins[root].info.pgid == self.own_pgid {
            return;
        }
        for m in self.tree.job_group(root_pid) {
            if visited.insert(m) {
                self.member(report, m, root, Tie::Group);
            }
        }
    }

    /// Pins `pid`, found in the snapshot as tied to `pins[anchor]`, checks the tie through the
    /// pins, and considers it. Returns its index in `pins` when the walk may go below it: only
    /// when it was taken. Below a refused member (a protected daemon, an ancestor of gpuloop)
    /// live that daemon's helpers or gpuloop's siblings, never the target's job (a daemon's
    /// children were once signalled without force).
    fn member(
        &mut self,
        report: &mut KillReport,
        pid: i32,
        anchor: usize,
        tie: Tie,
    ) -> Option<usize> {
        let p = match identity::pin_now(pid) {
            Ok(Some(p)) => p,
            Ok(None) => {
                self.skip(report, pid, SkipReason::Gone);
                return None;
            }
            Err(reason) => {
                self.skip(report, pid, SkipReason::Unpinned(reason));
                return None;
            }
        };
        // Zombies hold nothing and their parent reaps them; a defunct leader whose other
        // threads live on is a live process.
        if p.info.is_zombie() && crate::process::scan::live_thread(&p.dir).is_none() {
            return None;
        }
        let a = &self.pins[anchor];
        let tied = match tie {
            Tie::Child => a.is_parent_of(&p),
            Tie::Group => a.leads_group_of(&p),
        };
        if !tied {
            let what = match tie {
                Tie::Child => "a child of",
                Tie::Group => "in the process group of",
            };
            self.skip(
                report,
                pid,
                SkipReason::Untied {
                    pid,
                    comm: p.info.comm.clone(),
                    what,
                    anchor: a.info.pid,
                    anchor_comm: a.info.comm.clone(),
                },
            );
            return None;
        }
        let why = match tie {
            Tie::Child => format!("child of pid {} ({})", a.info.pid, a.info.comm),
            Tie::Group => format!(
                "in the process group of pid {} ({})",
                a.info.pid, a.info.comm
            ),
        };
        let (i, taken) = self.consider(report, p, why);
        taken.then_some(i)
    }

    /// Parents that would start the targets again: with `parents`, those that have shown they
    /// restart them are stopped (same rules as any target, and only if, through the pins, it
    /// is still the holder's parent); every other one is reported and left alone. Outliving a
    /// child is no evidence of a restart: an interactive shell, or a parent that has exec'd
    /// another program, outlives the holder it started and restarts nothing.
    fn restarters(&mut self, report: &mut KillReport) {
        let found = restart::find(
            self.tree,
            &self.taken,
            &self.guard.never,
            &self.opts.restarted,
        );
        for r in found {
            let chosen = self
                .chosen_at
                .get(&r.identity.pid)
                .map(|&k| &self.pins[self.chosen[k]]);
            if chosen.is_some_and(|p| p.info.start == r.identity.start) {
                continue; // already stopped as part of a target's tree
            }
            let stop = self.opts.parents && r.shown.is_some();
            if !(stop && self.take_parent(report, &r)) {
                report.restarters.push(r);
            }
        }
    }

    fn take_parent(&mut self, report: &mut KillReport, r: &Restarter) -> bool {
        let holder = i32::try_from(r.holder)
            .ok()
            .and_then(|pid| self.chosen_at.get(&pid))
            .map(|&k| self.chosen[k]);
        let Some(holder) = holder else {
            return false;
        };
        let parent = match identity::pin(&r.identity) {
            Ok(Some(p)) => p,
            _ => return false,
        };
        if !parent.is_parent_of(&self.pins[holder]) {
            return false;
        }
        let why = format!(
            "parent of pid {}, which would start it again: {}",
            self.pins[holder].info.pid,
            r.shown.map_or("", restart::Shown::says)
        );
        self.consider(report, parent, why).1
    }
}

/// `kill` against a snapshot taken by the caller (tests give one that has gone stale).
fn kill_in(
    tree: &Tree,
    targets: &[Target],
    opts: &KillOpts,
    protected: &[String],
    interrupted: &dyn Interrupt,
    progress: Progress,
) -> KillReport {
    let started = Instant::now();
    let mut report = KillReport {
        dry_run: opts.dry_run,
        ..KillReport::default()
    };
    let mut chosen = pin_targets(tree, targets, opts, protected, interrupted, &mut report);
    if opts.dry_run || report.interrupted {
        say_what_would_be_sent(chosen, opts, &mut report);
        report.elapsed_ms = started.elapsed().as_millis() as i64;
        return report;
    }
    let signalled_at = Instant::now();
    let why = std::mem::take(&mut chosen.why);
    let mut victims = signal_each(chosen, opts, &why, interrupted, &mut report);
    wait_then_kill(
        &mut victims,
        signalled_at,
        opts,
        &why,
        interrupted,
        progress,
        &mut report,
    );
    tracing::debug!(
        "kill: {} signalled, {} exited, {:.1} ms, done at {:.1} ms",
        victims.len(),
        victims.iter().filter(|v| v.exited).count(),
        signalled_at.elapsed().as_secs_f64() * 1e3,
        crate::timeline::ms()
    );
    report_each(&victims, signalled_at, &mut report);
    keep_restarters_still_running(&mut report);
    report.elapsed_ms = started.elapsed().as_millis() as i64;
    report
}

/// What step 1 chose: the processes to signal, pinned, parents before their children, with
/// what must be read of each before any signal.
struct Chosen {
    pinned: Vec<Pinned>,
    /// Why each pid was chosen, for the journal.
    why: HashMap<i32, String>,
    /// Each process's first signal cannot end it, and why: it gets KILL at once.
    futile: Vec<Option<String>>,
    /// Each process's name as a person is shown it.
    names: Vec<String>,
}

/// Why `pid` was chosen ("" when it was not).
fn why_of(why: &HashMap<i32, String>, pid: i32) -> &str {
    why.get(&pid).map_or("", String::as_str)
}

/// Whether a grace is followed by KILL for the survivors.
fn escalates(opts: &KillOpts) -> bool {
    opts.signal != Signal::SIGKILL && opts.grace != NEVER
}

/// The signal sent first: the one asked for, or KILL where that one is futile.
fn first_of(why: &Option<String>, opts: &KillOpts) -> Signal {
    match why {
        Some(_) => Signal::SIGKILL,
        None => opts.signal,
    }
}

/// A process's line in the report.
fn stopped(
    p: &Pinned,
    name: String,
    sent: Signal,
    ended_by: Option<&str>,
    exit_ms: Option<i64>,
) -> Stopped {
    Stopped {
        pid: p.info.pid.into(),
        name,
        gpus: Vec::new(),
        signal: signal_name(sent).to_string(),
        ended_by: ended_by.map(str::to_string),
        exit_ms,
    }
}

/// Whether an interrupt stops the kill before its signals are all sent: kill() and clean stop
/// (the report says so); stopping a job goes on, since a job is never left behind.
fn stops(opts: &KillOpts, interrupted: &dyn Interrupt) -> bool {
    opts.on_interrupt == OnInterrupt::StopWaiting && interrupted.is_set()
}

/// Step 1: pin the targets, their trees and (with `parents`) their restarters; refusals go
/// to `report`. An interrupt ends it (`report.interrupted`) with nothing chosen: targets not
/// reached yet are in no list.
fn pin_targets(
    tree: &Tree,
    targets: &[Target],
    opts: &KillOpts,
    protected: &[String],
    interrupted: &dyn Interrupt,
    report: &mut KillReport,
) -> Chosen {
    let guard = Guard::new(protected);
    let mut resolve = Resolve {
        tree,
        guard: &guard,
        opts,
        // nix, not rustix: the kernel answers 0 when the group's leader is outside this PID
        // namespace, and rustix's getpgrp panics on that answer.
        own_pgid: nix::unistd::getpgrp().as_raw(),
        pins: Vec::new(),
        chosen: Vec::new(),
        seen: HashSet::new(),
        skipped: HashSet::new(),
        chosen_at: HashMap::new(),
        taken: Vec::new(),
        why: HashMap::new(),
    };
    for t in targets {
        if stops(opts, interrupted) {
            report.interrupted = true;
            return Chosen {
                pinned: Vec::new(),
                why: HashMap::new(),
                futile: Vec::new(),
                names: Vec::new(),
            };
        }
        resolve.target(report, t);
    }
    resolve.restarters(report);
    // Parents before their children: a restarter signalled after the holder it restarts can
    // start a new one in between (a shell loop's `wait` returns as soon as the holder exits).
    let mut order = resolve.chosen;
    order.sort_by_cached_key(|&i| tree.ancestry(resolve.pins[i].info.pid).count());
    let mut pins: Vec<Option<Pinned>> = resolve.pins.into_iter().map(Some).collect();
    let pinned: Vec<Pinned> = order.iter().filter_map(|&i| pins[i].take()).collect();

    let escalates = escalates(opts);
    // A signal the process cannot act on only costs the whole grace, so it
    // gets KILL at once; decided here, so that a dry run says what would really be sent.
    let futile: Vec<Option<String>> = pinned
        .iter()
        .map(|p| escalates.then(|| futile_signal(p, opts.signal)).flatten())
        .collect();
    // Names are read before any signal: a process that has exited has no command line, and
    // reading one between two signals would hold the second back.
    let names: Vec<String> = pinned
        .iter()
        .map(|p| super::display_name(&p.info.comm, &p.dir.cmdline()))
        .collect();
    Chosen {
        pinned,
        why: resolve.why,
        futile,
        names,
    }
}

/// A dry run's report: what each chosen process would be sent.
fn say_what_would_be_sent(chosen: Chosen, opts: &KillOpts, report: &mut KillReport) {
    let Chosen {
        pinned,
        futile,
        names,
        ..
    } = chosen;
    report.would_signal = pinned.iter().map(|p| p.info.pid.into()).collect();
    for ((p, why), shown) in pinned.iter().zip(&futile).zip(&names) {
        report
            .targets
            .push(stopped(p, shown.clone(), first_of(why, opts), None, None));
        if let Some(why) = why {
            report.killed_at_once.push(Skipped {
                pid: p.info.pid.into(),
                reason: SkipReason::KilledAtOnce {
                    pid: p.info.pid,
                    why: why.clone(),
                    sent: false,
                },
            });
        }
    }
}

/// Step 2: signal every pinned process through its pidfd (the start time and, where the
/// kernel has pidfs, the pidfd's inode were checked when it was pinned): whatever reuses a pid
/// from now on is out of reach. The ones signalled are the victims waited for. An interrupt
/// stops the signalling (`report.interrupted`): those not signalled yet are in no list.
fn signal_each(
    chosen: Chosen,
    opts: &KillOpts,
    why: &HashMap<i32, String>,
    interrupted: &dyn Interrupt,
    report: &mut KillReport,
) -> Vec<Victim> {
    let why = |pid: i32| why_of(why, pid);
    let mut victims = Vec::new();
    for ((p, futile), shown) in chosen
        .pinned
        .into_iter()
        .zip(chosen.futile)
        .zip(chosen.names)
    {
        if stops(opts, interrupted) {
            report.interrupted = true;
            break;
        }
        let pid = p.info.pid;
        let sig = first_of(&futile, opts);
        match send(&p, sig, why(pid), opts.served.as_ref()) {
            Ok(()) => {
                tracing::debug!("kill: {} -> pid {pid}", signal_name(sig));
                // A stopped process would not act on TERM until continued.
                if p.info.state == 'T' && sig != Signal::SIGKILL {
                    let _ = send(&p, Signal::SIGCONT, why(pid), opts.served.as_ref());
                }
                if let Some(why) = futile {
                    report.killed_at_once.push(Skipped {
                        pid: pid.into(),
                        reason: SkipReason::KilledAtOnce {
                            pid,
                            why,
                            sent: true,
                        },
                    });
                }
                report.signalled.push(pid.into());
                victims.push(Victim {
                    pinned: p,
                    exited: false,
                    exit_at: None,
                    escalated: false,
                    killed: sig == Signal::SIGKILL,
                    first: sig,
                    name: shown,
                });
            }
            // Chosen once each, and never skipped before.
            Err(rustix::io::Errno::SRCH) => report.skipped.push(Skipped {
                pid: pid.into(),
                reason: SkipReason::Gone,
            }),
            Err(e) => report.errors.push(KillError {
                pid: pid.into(),
                error: describe_errno(e, sig),
            }),
        }
    }
    records_written();
    victims
}

/// How long the victims get before KILL (or, without one, before they are reported).
fn first_wait(victims: &[Victim], opts: &KillOpts) -> Duration {
    if victims.iter().all(|v| v.killed) {
        KILL_WAIT
    } else if opts.grace != NEVER {
        opts.grace
    } else if opts.on_interrupt == OnInterrupt::KillNow || opts.wait_forever {
        // No KILL: the processes are waited for until they exit, or an interrupt (which, for
        // a job, sends the KILL: a job is never left behind).
        FOREVER
    } else {
        // clean with no KILL: the survivors are reported, and clean waits for them until
        // its timeout.
        Duration::ZERO
    }
}

/// Step 3: one shared grace, then SIGKILL for the survivors, and wait for those too. An
/// interrupt during the grace either stops the waiting, KILLing nobody (`StopWaiting`:
/// kill() and clean), or cuts the grace short (`KillNow`: stopping a job).
fn wait_then_kill(
    victims: &mut [Victim],
    signalled_at: Instant,
    opts: &KillOpts,
    why: &HashMap<i32, String>,
    interrupted: &dyn Interrupt,
    progress: Progress,
    report: &mut KillReport,
) {
    let first_deadline = signalled_at
        .checked_add(first_wait(victims, opts))
        .unwrap_or(signalled_at + KILL_WAIT);
    let escalates = escalates(opts);
    let escalation = escalates.then_some(first_deadline);
    // SIGKILLs already sent while stopping a job are waited for whatever happens.
    let never = AtomicBool::new(false);
    let first_interrupt: &dyn Interrupt =
        if opts.on_interrupt == OnInterrupt::KillNow && victims.iter().all(|v| v.killed) {
            &never
        } else {
            interrupted
        };
    let cut = wait_exits(
        victims,
        first_deadline,
        first_interrupt,
        &mut |left, all| progress(left, all, escalation.map(|t| t - Instant::now().min(t))),
    );
    report.interrupted |= cut && opts.on_interrupt == OnInterrupt::StopWaiting;
    // A job stop's interrupt means KILL now, even with a grace that never ends.
    let kill_now = cut && opts.on_interrupt == OnInterrupt::KillNow;
    if (escalates || kill_now) && !report.interrupted {
        for v in victims.iter_mut().filter(|v| !v.exited && !v.killed) {
            tracing::debug!("kill: grace over, KILL -> pid {}", v.pinned.info.pid);
            let pid = v.pinned.info.pid;
            v.escalated = send(
                &v.pinned,
                Signal::SIGKILL,
                why_of(why, pid),
                opts.served.as_ref(),
            )
            .is_ok();
            v.killed = v.escalated;
        }
        records_written();
        if victims.iter().any(|v| v.killed && !v.exited) {
            // The KILLs are sent; a job stop waits for them whatever happens (short, bounded).
            let stop: &dyn Interrupt = match opts.on_interrupt {
                OnInterrupt::StopWaiting => interrupted,
                OnInterrupt::KillNow => &never,
            };
            report.interrupted |= wait_exits(
                victims,
                Instant::now() + KILL_WAIT,
                stop,
                &mut |left, all| progress(left, all, None),
            );
        }
    }
}

/// Waits until the journal and the signal log have the records of the signals sent so far:
/// each has a thread of its own, waited for at most a few seconds and no longer than the next
/// interrupt, so a file system that hangs holds back no signal.
fn records_written() {
    crate::journal::flush();
    super::signal_log::flush();
}

/// Each victim in the report: exited, stuck (KILLed and still there) or surviving, and what
/// ended it when.
fn report_each(victims: &[Victim], signalled_at: Instant, report: &mut KillReport) {
    for v in victims {
        let pid = i64::from(v.pinned.info.pid);
        if v.exited {
            report.exited.push(pid);
        } else if let Some(s) = v.killed.then(|| stuck(&v.pinned)).flatten() {
            report.stuck.push(s);
        } else {
            report.survivors.push(pid);
        }
        let ended_by = match (v.exited, v.escalated) {
            (false, _) => None,
            (true, true) => Some("KILL"),
            (true, false) => Some(signal_name(v.first)),
        };
        let exit_ms = v
            .exit_at
            .map(|t| t.saturating_duration_since(signalled_at).as_millis() as i64);
        report.targets.push(stopped(
            &v.pinned,
            v.name.clone(),
            v.first,
            ended_by,
            exit_ms,
        ));
    }
}

/// A parent that only waited for its holder exits with it; the ones still running after
/// their holder ended are those that may start it again.
fn keep_restarters_still_running(report: &mut KillReport) {
    let exited: HashSet<i64> = report.exited.iter().copied().collect();
    let (waited, rest): (Vec<Restarter>, Vec<Restarter>) = std::mem::take(&mut report.restarters)
        .into_iter()
        .partition(|r| exited.contains(&r.holder));
    report.restarters = restart::still_running(waited, restart::EXIT_WINDOW);
    report.restarters.extend(rest);
}

/// Why `sig` cannot end this process, if it cannot: it ignores the signal (`SigIgn`), or it is
/// the init of its own PID namespace with no handler for it (`SigCgt`), which the kernel
/// then drops. SIGKILL and SIGSTOP always work.
fn futile_signal(p: &Pinned, sig: Signal) -> Option<String> {
    if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
        return None;
    }
    let status = p.dir.status().ok()?;
    futile_in_status(&status, sig)
}

/// `futile_signal` on the text of /proc/PID/status.
fn futile_in_status(status: &str, sig: Signal) -> Option<String> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let mask = |name: &str| field(name).and_then(|v| u64::from_str_radix(v, 16).ok());
    let bit = 1u64 << (sig as i32 - 1);
    let name = signal_name(sig);
    if mask("SigIgn:").is_some_and(|m| m & bit != 0) {
        return Some(format!("ignores {name} (SigIgn)"));
    }
    let ns_init = field("NSpid:").is_some_and(|v| {
        let ids: Vec<&str> = v.split_whitespace().collect();
        ids.len() > 1 && ids.last() == Some(&"1")
    });
    if ns_init && mask("SigCgt:").is_some_and(|m| m & bit == 0) {
        return Some(format!(
            "is the init of its own PID namespace and has no {name} handler (SigCgt), so the kernel drops {name}"
        ));
    }
    None
}

/// A KILLed process that is still there because it sleeps uninterruptibly (`D`), in the
/// driver or the kernel: it goes when that call returns.
fn stuck(p: &Pinned) -> Option<Stuck> {
    let info = p.dir.stat().ok()?;
    (info.state == 'D').then(|| Stuck {
        pid: info.pid.into(),
        name: info.comm.clone(),
        wchan: wchan(&p.dir),
    })
}

/// Where a process sleeps in the kernel (/proc/PID/wchan), or "?" where that is hidden.
pub fn wchan(dir: &super::identity::ProcDir) -> String {
    match dir.read("wchan") {
        Ok(w) if !w.is_empty() && w != b"0" => String::from_utf8_lossy(&w).trim().to_string(),
        _ => "?".into(),
    }
}

/// Sends `sig` through the pidfd of a pinned process (never by pid); journals it, with `why`
/// the process was chosen and what came of it, and logs it when `GPULOOP_SIGNAL_LOG` names
/// a file.
fn send(
    p: &Pinned,
    sig: Signal,
    why: &str,
    served: Option<&crate::journal::Served>,
) -> rustix::io::Result<()> {
    // gpuloop names signals with nix's `Signal`; only rustix sends through a pidfd, so this
    // is the one place one becomes the other.
    let raw =
        rustix::process::Signal::from_named_raw(sig as i32).ok_or(rustix::io::Errno::INVAL)?;
    let r = pidfd_send_signal(&p.fd, raw);
    if r.is_ok() {
        super::signal_log::record(&p.identity(), &p.info.comm, sig);
    }
    let outcome = match r {
        Ok(()) => crate::journal::Delivery::Delivered,
        Err(rustix::io::Errno::SRCH) => crate::journal::Delivery::Gone,
        Err(e) => crate::journal::Delivery::Failed(describe_errno(e, sig)),
    };
    crate::journal::signal(
        crate::journal::Target {
            pid: p.info.pid.into(),
            start: p.info.start,
            comm: p.info.comm.clone(),
            uid: p.dir.uid().ok(),
        },
        signal_name(sig),
        why,
        outcome,
        served,
    );
    r
}

fn describe_errno(e: rustix::io::Errno, sig: Signal) -> String {
    match e {
        rustix::io::Errno::PERM => format!(
            "permission denied sending {} (another user's process: run as that user or root)",
            signal_name(sig)
        ),
        e => format!("sending {}: {e}", signal_name(sig)),
    }
}

/// Waits on the pidfds until every victim exited, the deadline passed, or an interrupt;
/// true if an interrupt ended it with victims left. The live victims' pidfds are one epoll
/// set, so a wake costs the exits it reports: a poll of every victim at each exit was
/// quadratic in the victims.
fn wait_exits(
    victims: &mut [Victim],
    deadline: Instant,
    interrupted: &dyn Interrupt,
    progress: &mut dyn FnMut(usize, usize),
) -> bool {
    use rustix::event::epoll;
    let set = epoll::create(epoll::CreateFlags::CLOEXEC);
    let Ok(set) = set else {
        return poll_exits(victims, deadline, interrupted, progress);
    };
    let mut live = 0;
    for (i, v) in victims.iter().enumerate().filter(|(_, v)| !v.exited) {
        let added = epoll::add(
            &set,
            &v.pinned.fd,
            epoll::EventData::new_u64(i as u64),
            epoll::EventFlags::IN,
        );
        if added.is_err() {
            return poll_exits(victims, deadline, interrupted, progress);
        }
        live += 1;
    }
    let mut events = Vec::with_capacity(live.clamp(1, 4096));
    loop {
        if live == 0 {
            return false;
        }
        if interrupted.is_set() {
            return true;
        }
        progress(live, victims.len());
        let Some(ts) = next_wake(deadline) else {
            return false;
        };
        events.clear();
        if epoll::wait(&set, rustix::buffer::spare_capacity(&mut events), Some(&ts)).is_err() {
            continue;
        }
        let at = Instant::now();
        for e in &events {
            let Some(v) = victims.get_mut(e.data.u64() as usize) else {
                continue;
            };
            if !v.exited {
                v.exited = true;
                v.exit_at = Some(at);
                live -= 1;
                let _ = epoll::delete(&set, &v.pinned.fd);
            }
        }
    }
}

/// How long to wait before looking again: until `deadline`, and at most 100 ms, to notice
/// Ctrl-C; `None` once it has passed.
fn next_wake(deadline: Instant) -> Option<rustix::time::Timespec> {
    let now = Instant::now();
    let wait = deadline
        .checked_duration_since(now)
        .filter(|w| !w.is_zero())?;
    let wait = wait.min(Duration::from_millis(100));
    Some(rustix::time::Timespec {
        tv_sec: wait.as_secs() as i64,
        tv_nsec: i64::from(wait.subsec_nanos()),
    })
}

/// `wait_exits` where no epoll set can be made (out of descriptors): every live victim's
/// pidfd polled at each wake.
fn poll_exits(
    victims: &mut [Victim],
    deadline: Instant,
    interrupted: &dyn Interrupt,
    progress: &mut dyn FnMut(usize, usize),
) -> bool {
    loop {
        let live: Vec<usize> = (0..victims.len()).filter(|&i| !victims[i].exited).collect();
        if live.is_empty() {
            return false;
        }
        if interrupted.is_set() {
            return true;
        }
        progress(live.len(), victims.len());
        let Some(ts) = next_wake(deadline) else {
            return false;
        };
        let mut fds: Vec<PollFd> = live
            .iter()
            .map(|&i| PollFd::new(&victims[i].pinned.fd, PollFlags::IN))
            .collect();
        if poll(&mut fds, Some(&ts)).is_err() {
            continue;
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        for (k, &i) in live.iter().enumerate() {
            if ready[k] {
                victims[i].exited = true;
                victims[i].exit_at = Some(Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_signals() {
        assert_eq!(parse_signal("TERM"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("sigkill"), Ok(Signal::SIGKILL));
        assert_eq!(parse_signal("int"), Ok(Signal::SIGINT));
        assert_eq!(parse_signal("9"), Ok(Signal::SIGKILL));
        assert_eq!(parse_signal("NOPE"), Err(UnknownSignal("NOPE".into())));
        assert!(parse_signal("NOPE")
            .unwrap_err()
            .to_string()
            .contains("unknown signal \"NOPE\""));
        assert_eq!(signal_name(Signal::SIGTERM), "TERM");
    }

    #[test]
    fn protected_names_match_truncated_comm() {
        let list = vec!["nvidia-persistenced".to_string(), "Xorg".to_string()];
        assert!(is_named("nvidia-persiste", "", &list));
        assert!(is_named("Xorg", "/usr/lib/xorg/Xorg :0", &list));
        assert!(is_named(
            "x",
            "/usr/bin/nvidia-persistenced --verbose",
            &list
        ));
        assert!(!is_named("python3", "python3 train.py", &list));
    }

    #[test]
    fn refuses_self_and_pid_one_and_never_walks_their_trees() {
        let never = AtomicBool::new(false);
        let me = std::process::id() as i32;
        let r = kill(
            &[Target::Pid(me), Target::Pid(1)],
            &KillOpts::default(),
            &[],
            &never,
        );
        assert!(r.signalled.is_empty());
        assert_eq!(r.skipped.len(), 2, "{r:?}");
        assert!(r.skipped.iter().any(|s| s.reason == SkipReason::Itself));
        assert!(r
            .skipped
            .iter()
            .any(|s| s.reason == SkipReason::NeverSignalled { pid: 1 }));
        // Our own children (other tests' processes) were not touched through our tree.
        assert_eq!(r.skipped.len() + r.signalled.len(), 2);
    }

    /// The process table with one entry changed: what a snapshot says once `pid` has been
    /// reused, within the same clock tick, by the process really there now.
    fn stale_snapshot(pid: i32, change: impl Fn(&mut super::super::ProcInfo)) -> Tree {
        let mut table = super::super::process_table();
        for p in table.iter_mut().filter(|p| p.pid == pid) {
            change(p);
        }
        Tree::new(table)
    }

    fn sleeper(own_group: bool) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("sleep");
        c.arg("30");
        if own_group {
            c.process_group(0);
        }
        c.spawn().unwrap()
    }

    fn alive(child: &mut std::process::Child) -> bool {
        child.try_wait().unwrap().is_none()
    }

    fn reap(mut child: std::process::Child) {
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A recycled pid, for tree members: the snapshot saw a child of the target at pid Q;
    /// Q now names an unrelated process that started in the same clock tick (same pid, same
    /// start: what (pid, start) cannot tell apart). Checked through its pin, Q is no child of
    /// the target, so it is not signalled. Before, the (pid, start) check let it through.
    #[test]
    fn a_recycled_pid_can_be_killed_never_as_a_tree_member() {
        let never = AtomicBool::new(false);
        let mut other = sleeper(true);
        let q = other.id() as i32;
        // As the target's child, then (a job-group member) in the group the target leads.
        type Stale = fn(&mut super::super::ProcInfo, i32);
        let variants: [(Stale, &str); 2] = [
            (|p, t| p.ppid = t, "no longer a child of"),
            (|p, t| p.pgid = t, "no longer in the process group of"),
        ];
        for (change, reason) in variants {
            let target = sleeper(true);
            let t = target.id() as i32;
            let stale = stale_snapshot(q, |p| change(p, t));
            let r = kill_in(
                &stale,
                &[Target::Pid(t)],
                &KillOpts::default(),
                &[],
                &never,
                &mut |_, _, _| {},
            );
            assert_eq!(r.signalled, vec![i64::from(t)], "{r:?}");
            assert!(
                alive(&mut other),
                "the process that reused the pid was signalled"
            );
            let why = &r.skipped.iter().find(|s| s.pid == i64::from(q));
            assert!(
                why.is_some_and(|s| s.reason.to_string().contains(reason)),
                "{r:?}"
            );
            reap(target);
        }
        reap(other);
    }

    /// A bare pid is whatever has the pid when it is pinned, and the refusals read that
    /// process, not the snapshot: here the snapshot saw an ordinary process at Q, and a
    /// protected daemon has Q now. Before, the snapshot's view decided, and it was signalled.
    #[test]
    fn a_recycled_pid_can_be_killed_never_as_a_bare_pid_decided_on_a_stale_snapshot() {
        let never = AtomicBool::new(false);
        let mut daemon = std::process::Command::new("python3")
            .args([
                "-c",
                "import ctypes,sys,time; ctypes.CDLL(None).prctl(15, b'guarded-daemon'); print(flush=True); time.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The empty line comes after the rename.
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(daemon.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let q = daemon.id() as i32;
        let stale = stale_snapshot(q, |p| p.comm = "python3".into());
        // The name is proven: the process is root's running root's python3, or, for a test
        // not run as root, the invoker's own.
        let protected = vec!["guarded-daemon".to_string()];
        let r = kill_in(
            &stale,
            &[Target::Pid(q)],
            &KillOpts::default(),
            &protected,
            &never,
            &mut |_, _, _| {},
        );
        assert!(r.signalled.is_empty(), "{r:?}");
        assert!(alive(&mut daemon));
        assert!(
            matches!(r.skipped[0].reason, SkipReason::Protected { .. }),
            "{r:?}"
        );
        reap(daemon);
    }

    /// Says "interrupted" from its `after`-th question on: an interrupt that comes while a
    /// kill works through its targets.
    struct InterruptAfter {
        after: usize,
        asked: std::sync::atomic::AtomicUsize,
    }

    impl Interrupt for InterruptAfter {
        fn is_set(&self) -> bool {
            self.asked.fetch_add(1, Ordering::Relaxed) >= self.after
        }
    }

    /// A kill of a long target list (an MCP kill of 300k pids) ignored Ctrl-C and the
    /// client's cancellation until every target was pinned and signalled: the interrupt was
    /// read only while waiting for exits. It now stops the pinning (and the signalling), and
    /// the report says it was interrupted.
    #[test]
    fn an_interrupt_stops_a_kill_while_it_works_through_its_targets() {
        // Above pid_max's ceiling: never a process's.
        let targets: Vec<Target> = (5_000_000..5_001_000).map(Target::Pid).collect();
        let stop = InterruptAfter {
            after: 10,
            asked: Default::default(),
        };
        let r = kill(&targets, &KillOpts::default(), &[], &stop);
        assert!(r.interrupted, "{r:?}");
        assert!(r.skipped.len() < 100, "{} targets pinned", r.skipped.len());
        assert!(r.signalled.is_empty());
        // A job stop is never cut short: every target is looked at.
        let job = KillOpts {
            on_interrupt: OnInterrupt::KillNow,
            ..KillOpts::default()
        };
        let r = kill(&targets, &job, &[], &stop);
        assert_eq!(r.skipped.len(), 1000);
    }

    #[test]
    fn kills_a_child_by_identity_and_skips_a_replaced_one() {
        let never = AtomicBool::new(false);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = super::super::read_stat(pid).unwrap().start;
        let wrong = Target::Exact(Identity::new(pid, start + 1));
        let r = kill(&[wrong], &KillOpts::default(), &[], &never);
        assert!(
            r.signalled.is_empty() && r.skipped[0].reason.to_string().contains("another process")
        );
        let right = Target::Exact(Identity::new(pid, start));
        let r = kill(&[right], &KillOpts::default(), &[], &never);
        assert_eq!(r.signalled, vec![i64::from(pid)]);
        assert_eq!(r.exited, vec![i64::from(pid)], "{r:?}");
        child.wait().unwrap();
    }
}
