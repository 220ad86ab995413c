//! Nothing left behind: gpuloop as child subreaper, the registry of live jobs, stopping a
//! job's whole tree through the kill engine, and reaping the orphans gpuloop inherits.
//!
//! A job's descendants escape its tree in two ways: a double fork (the middle process exits,
//! the grandchild is reparented) and setsid/setpgid (it leaves the process group). As a child
//! subreaper gpuloop becomes the parent of both, so they stay findable: every process that
//! gpuloop did not start itself but has as a child is such an orphan ("adopted").
//!
//! Two last lines of defence cover a gpuloop that dies without stopping its jobs (SIGKILL,
//! an abort): every leader gets `PR_SET_PDEATHSIG` (forked by one thread that lives as long
//! as gpuloop, since the signal follows the forking *thread*), and a guard process
//! (`guard`) that learns every job's group and lineage kills what is left when gpuloop's
//! pipe to it closes without a goodbye.

use super::guard;
use crate::process::helpers;
use crate::process::kill::{self, KillOpts, OnInterrupt, Target};
use crate::process::tree::Tree;
use crate::process::{Identity, ProcInfo};
use nix::sys::signal::Signal;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How often the supervisor thread records job lineage and reaps adopted zombies.
const TICK: Duration = Duration::from_millis(250);
/// Grace for what is left at script end when no job asked for a longer one.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// Rounds of the stop: processes forked during the grace are caught by the next round.
const ROUNDS: usize = 5;

/// The environment variable every job's leader gets, naming the gpuloop that started it. It
/// is inherited by everything the job starts, whatever process group or session that moves
/// to, so the guard finds a job's processes that gpuloop had no time to tell it about (a
/// double fork an instant before gpuloop was SIGKILLed).
pub(crate) const JOB_MARK: &str = "GPULOOP_JOB_OF";

/// This gpuloop's value of `JOB_MARK`: its pid and start time, and 128 random bits. The pid
/// and start time alone are not unique: a gpuloop in a container's PID namespace can have the
/// pid of one on the host, started in the same clock tick, and a host guard sees both.
pub(crate) fn job_mark() -> &'static str {
    use std::hash::{BuildHasher, Hasher};
    static MARK: OnceLock<String> = OnceLock::new();
    MARK.get_or_init(|| {
        let pid = std::process::id() as i32;
        let start = crate::process::read_stat(pid).map_or(0, |p| p.start);
        // std seeds each RandomState from the operating system's random source.
        let random = || {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        format!("{pid}.{start}.{:016x}{:016x}", random(), random())
    })
}

/// What gpuloop knows about the jobs it started.
#[derive(Default)]
struct State {
    /// Jobs whose leader has not been reaped yet.
    live: Vec<Live>,
    /// Every job's process group id (its leader's pid), to tell one job's processes from
    /// another's.
    pgids: HashSet<i32>,
    /// Every process ever seen below a finished job (in its tree or its group), and the job
    /// (its leader) it was seen under.
    seen: HashMap<Identity, Identity>,
    /// What the guard was told.
    told: HashSet<Identity>,
    /// The jobs' groups the guard watches: each is forgotten once its leader is done and
    /// no member is left, since its id may then be reused by anyone.
    groups: Vec<Identity>,
}

struct Live {
    id: Identity,
    /// The job's grace, used when the script ends with the job still running.
    grace: Duration,
    lineage: HashSet<Identity>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Mutex::default);
static CHANGED: Condvar = Condvar::new();
/// Set once this process is a child subreaper and its reaper thread runs: both last as long
/// as the process, as the kernel keeps the flag per process.
static SUBREAPER: OnceLock<()> = OnceLock::new();

fn state() -> MutexGuard<'static, State> {
    // A panic elsewhere while holding the lock leaves consistent data: keep going.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

type Fork = Box<dyn FnOnce() + Send>;

/// The thread every job is forked from. It never ends, so a leader's `PR_SET_PDEATHSIG`
/// fires when gpuloop dies, not when the script thread that asked for the job ends.
fn spawner() -> Option<&'static Mutex<Sender<Fork>>> {
    static SPAWNER: OnceLock<Option<Mutex<Sender<Fork>>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = channel::<Fork>();
            std::thread::Builder::new()
                .name("gpuloop-spawner".into())
                .spawn(move || {
                    for fork in rx {
                        fork();
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Runs `command.spawn()` on the spawner thread and returns at once; the receiver gets the
/// result. `keep` is held until the child has exec'd or failed.
fn spawn_on_spawner(
    mut command: Command,
    keep: Option<ChildEnds>,
) -> io::Result<Receiver<io::Result<Child>>> {
    let (done_tx, done_rx) = channel();
    let fork: Fork = Box::new(move || {
        let spawned = command.spawn();
        drop(keep);
        let _ = done_tx.send(spawned);
    });
    let Some(tx) = spawner() else {
        return Err(io::Error::other(
            "cannot start the thread jobs are forked from",
        ));
    };
    if let Err(unsent) = tx.lock().unwrap_or_else(|e| e.into_inner()).send(fork) {
        // The spawner is gone (it never ends on its own): a thread of the moment will do.
        std::thread::Builder::new()
            .name("gpuloop-spawner".into())
            .spawn(unsent.0)?;
    }
    Ok(done_rx)
}

/// Holds a new leader between fork and exec until gpuloop has told the guard its process
/// group. Without it, a job that forks at once (`sleep 100 & …`) could have a child before
/// the guard knew the group (the guard itself starts with the first job), and a gpuloop
/// SIGKILLed in that moment would leave that child running: the leader dies by
/// `PR_SET_PDEATHSIG`, but nothing would know its group.
///
/// The child writes its pid to `ready` (it is in its own group by then) and waits for a
/// byte on `go`; the parent registers the pid, tells the guard, and writes the byte.
struct StartGate {
    ready: File,
    go: File,
}

/// The child's ends of the gate, held by the parent only until the child has exec'd or
/// failed: then a child that failed before reporting reads as end of file on `ready`.
struct ChildEnds {
    _ready: OwnedFd,
    _go: OwnedFd,
}

impl StartGate {
    /// The gate, and its child's ends with the hook that waits on them.
    fn new() -> io::Result<(StartGate, ChildEnds, impl FnMut() -> io::Result<()>)> {
        use rustix::pipe::{pipe_with, PipeFlags};
        let (ready_r, ready_w) = pipe_with(PipeFlags::CLOEXEC)?;
        let (go_r, go_w) = pipe_with(PipeFlags::CLOEXEC)?;
        let fds = [
            ready_r.as_raw_fd(),
            ready_w.as_raw_fd(),
            go_r.as_raw_fd(),
            go_w.as_raw_fd(),
        ];
        let hook = move || {
            use rustix::fd::BorrowedFd;
            use rustix::io::Errno;
            let [ready_r, ready_w, go_r, go_w] = fds;
            // SAFETY: close, getpid, write and read are async-signal-safe, the buffers are
            // on this stack, nothing here allocates, and the four descriptors stay open in
            // the child until it closes the parent's two here or exec closes the rest.
            unsafe {
                // The parent's ends: holding them would hide the parent's going.
                rustix::io::close(ready_r);
                rustix::io::close(go_w);
                let (ready_w, go_r) = (
                    BorrowedFd::borrow_raw(ready_w),
                    BorrowedFd::borrow_raw(go_r),
                );
                let pid = rustix::process::getpid()
                    .as_raw_nonzero()
                    .get()
                    .to_ne_bytes();
                if rustix::io::write(ready_w, &pid)? != pid.len() {
                    return Err(io::Error::from(Errno::IO));
                }
                let mut byte = [0u8; 1];
                loop {
                    match rustix::io::read(go_r, &mut byte) {
                        Ok(1) => return Ok(()),
                        // gpuloop went before it let the job go.
                        Ok(_) => return Err(io::Error::from(Errno::CANCELED)),
                        Err(Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        };
        let gate = StartGate {
            ready: File::from(ready_r),
            go: File::from(go_w),
        };
        let ends = ChildEnds {
            _ready: ready_w,
            _go: go_r,
        };
        Ok((gate, ends, hook))
    }

    /// The pid the child reported (`None`: it failed before it could).
    fn child_pid(&mut self) -> Option<i32> {
        let mut pid = [0u8; 4];
        self.ready.read_exact(&mut pid).ok()?;
        Some(i32::from_ne_bytes(pid))
    }

    /// Lets the child go on to exec.
    fn open(mut self) {
        let _ = self.go.write_all(b"1");
    }
}

/// Makes the child die with gpuloop: `PR_SET_PDEATHSIG` (SIGKILL), then a check that the
/// parent did not die before it was set (the signal would never come).
fn die_with_parent(command: &mut Command) {
    use rustix::process::{getppid, set_parent_process_death_signal, Pid, Signal};
    let parent = Pid::from_raw(std::process::id() as i32);
    // SAFETY: between fork and exec the closure calls only prctl and getppid, which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            set_parent_process_death_signal(Some(Signal::KILL))?;
            if getppid() != parent {
                // gpuloop exited while starting the job.
                return Err(io::Error::from(rustix::io::Errno::SRCH));
            }
            Ok(())
        });
    }
}

/// Spawns a job's leader and registers it in one step, so the reaper never takes its exit
/// status from under `Child::wait`; returns it with its identity. The leader dies with
/// gpuloop (`PR_SET_PDEATHSIG`), and runs its command only once the guard knows its process
/// group (`StartGate`).
pub(crate) fn spawn_registered(
    grace: Duration,
    mut command: Command,
) -> io::Result<(Child, Identity)> {
    die_with_parent(&mut command);
    let (gate, ends) = if guard::enabled() {
        let (gate, ends, hook) = StartGate::new()?;
        // SAFETY: the hook is async-signal-safe and allocates nothing (`StartGate::new`).
        unsafe { command.pre_exec(hook) };
        (Some(gate), Some(ends))
    } else {
        (None, None)
    };
    let mut st = state();
    let pending = spawn_on_spawner(command, ends)?;
    // Through the gate the leader is registered before it runs its command.
    let early = gate.and_then(|mut g| {
        let id = g.child_pid().map(|pid| register(&mut st, pid, grace));
        g.open();
        id
    });
    let spawned = pending
        .recv()
        .unwrap_or_else(|_| Err(io::Error::other("the spawner thread ended")));
    match spawned {
        Ok(child) => {
            let id = early.unwrap_or_else(|| register(&mut st, child.id() as i32, grace));
            Ok((child, id))
        }
        Err(e) => {
            // std reaped the child whose exec failed: no job after all.
            if let Some(id) = early {
                unregister(&mut st, id);
            }
            Err(e)
        }
    }
}

/// A new leader: live, its group the job's, and the guard told. Our unreaped child: its pid
/// cannot be reused, so its stat is its own.
fn register(st: &mut State, pid: i32, grace: Duration) -> Identity {
    let id = Identity::new(pid, crate::process::read_stat(pid).map_or(0, |p| p.start));
    st.pgids.insert(pid);
    st.live.push(Live {
        id,
        grace,
        lineage: HashSet::new(),
    });
    st.groups.push(id);
    guard::tell_group(id);
    id
}

/// A leader whose exec failed.
fn unregister(st: &mut State, id: Identity) {
    st.pgids.remove(&id.pid);
    st.live.retain(|l| l.id != id);
    st.groups.retain(|g| *g != id);
    guard::forget_group(id);
}

/// The leader has exited and is about to be reaped: a last look at its tree and group while
/// its pid, a zombie's now, still holds the group's id, so that every member the job has is
/// known by identity (here and to the guard) before that id may go to anyone else.
pub(crate) fn exiting(leader: Identity) {
    let tree = Tree::snapshot();
    let mut st = state();
    observe(&tree, &mut st);
    if st.groups.contains(&leader) {
        guard::leader_exited(leader);
    }
}

/// The leader was reaped: its lineage stays known, it is no longer live.
pub(crate) fn finished(leader: Identity) {
    let mut st = state();
    if let Some(i) = st.live.iter().position(|l| l.id == leader) {
        let live = st.live.swap_remove(i);
        st.seen
            .extend(live.lineage.into_iter().map(|id| (id, leader)));
    }
    CHANGED.notify_all();
}

/// True if `id` was seen below the job led by `leader` (live or finished).
fn known(st: &State, leader: Identity, id: Identity) -> bool {
    st.seen.get(&id) == Some(&leader)
        || st
            .live
            .iter()
            .any(|l| l.id == leader && l.lineage.contains(&id))
}

/// Who gpuloop is, for telling its own children from adopted ones.
struct Me {
    pid: i32,
}

fn me() -> Me {
    Me {
        pid: std::process::id() as i32,
    }
}

/// A child of gpuloop that came from a job. gpuloop knows every child it forks itself: its
/// jobs' leaders are registered, and every other program it runs (the guard, the hosts'
/// transports, scontrol, nvidia-smi) is registered by identity as it starts
/// (`process::helpers`). Any other child was reparented to gpuloop, the subreaper, from a
/// job, whatever process group it put itself in: a job can join gpuloop's own group and
/// double-fork, and what it forked is still the job's. Without the subreaper (a library
/// user, a unit test) nothing is reparented to gpuloop, so every child is its own.
fn adopted(p: &ProcInfo, me: &Me, st: &State) -> bool {
    SUBREAPER.get().is_some()
        && p.ppid == me.pid
        && !helpers::is_helper(p)
        && !st.live.iter().any(|l| l.id.pid == p.pid)
}

/// Records the processes below each live job, so orphans can later be told apart by job;
/// the guard learns each new one, and each orphan a job left with gpuloop.
fn observe(tree: &Tree, st: &mut State) {
    let mut new = Vec::new();
    for live in &mut st.live {
        // A leader reaped a moment ago (not yet `finished`) has left its pid to anyone.
        if tree
            .get(live.id.pid)
            .is_none_or(|p| p.start != live.id.start)
        {
            continue;
        }
        let below = tree
            .descendants(live.id.pid)
            .into_iter()
            .chain(tree.job_group(live.id.pid));
        for pid in below {
            if let Some(p) = tree.get(pid) {
                if live.lineage.insert(p.identity()) {
                    new.push(p.identity());
                }
            }
        }
    }
    let done = |g: &Identity| !st.live.iter().any(|l| l.id == *g) && !tree.group_exists(g.pid);
    let (gone, kept): (Vec<Identity>, Vec<Identity>) = st.groups.iter().partition(|g| done(g));
    st.groups = kept;
    for g in gone {
        guard::forget_group(g);
    }
    if guard::enabled() {
        let me = me();
        let adopted: Vec<Identity> = tree
            .children(me.pid)
            .filter(|p| !p.is_zombie() && adopted(p, &me, st))
            .map(ProcInfo::identity)
            .collect();
        new.extend(adopted);
        new.retain(|id| st.told.insert(*id));
        guard::tell_members(&new);
    }
}

/// The live processes of a job's tree: the leader, its descendants, its process group (once
/// the leader is reaped, only the members known to be the job's), and the adopted orphans
/// that belong to no other job (`None`: every job and every orphan,
/// at script end). The kill engine adds the targets' descendants.
fn targets(table: &[ProcInfo], root: Option<Identity>, me: &Me, st: &State) -> Vec<Target> {
    let tree = Tree::new(table.to_vec());
    let belongs_elsewhere = |p: &ProcInfo| {
        root.is_some_and(|r| {
            let other_group = p.pgid != r.pid && st.pgids.contains(&p.pgid);
            let other_live = st
                .live
                .iter()
                .filter(|l| l.id != r)
                .any(|l| l.lineage.contains(&p.identity()));
            let other_done = st.seen.get(&p.identity()).is_some_and(|&j| j != r);
            other_group || other_live || other_done
        })
    };
    let mut pids: Vec<i32> = Vec::new();
    match root {
        // The leader is unreaped (a zombie too): its pid, and so its group's id, is its own.
        Some(r) if tree.get(r.pid).is_some_and(|p| p.start == r.start) => {
            pids.push(r.pid);
            pids.extend(tree.descendants(r.pid));
            pids.extend(table.iter().filter(|p| p.pgid == r.pid).map(|p| p.pid));
        }
        // Reaped: once its group is empty the id is free, and anyone may make a group of it
        // (take the pid, setsid, fork, exit), even before gpuloop sees the group empty. A
        // process in a group of that id is the job's only by identity: seen below the job
        // (up to the leader's exit, `exiting`), or forked by a process that was.
        Some(r) => pids.extend(
            table
                .iter()
                .filter(|p| p.pgid == r.pid)
                .filter(|p| tree.ancestry(p.pid).any(|a| known(st, r, a.identity())))
                .map(|p| p.pid),
        ),
        None => pids.extend(st.live.iter().map(|l| l.id.pid)),
    }
    pids.extend(
        table
            .iter()
            .filter(|p| adopted(p, me, st) && !belongs_elsewhere(p))
            .map(|p| p.pid),
    );
    let mut unique = HashSet::new();
    pids.into_iter()
        .filter(|&q| unique.insert(q))
        .filter_map(|q| tree.get(q))
        .filter(|p| !p.is_zombie() && p.pid != me.pid)
        .map(|p| Target::Exact(p.identity()))
        .collect()
}

/// Why the audit journal says a job's process was stopped.
fn job_member(root: Option<Identity>) -> String {
    match root {
        Some(r) => format!("process of the job gpuloop started as pid {}", r.pid),
        None => "process of a job gpuloop started".into(),
    }
}

/// Stops a job's whole tree (or, with `None`, everything gpuloop started): `signal`, one
/// shared `grace`, SIGKILL, through the kill engine; repeated for anything forked meanwhile;
/// then reaps the orphans that died. Returns the pids signalled; each signal is journaled
/// with the server call the job runs for, if any.
pub(crate) fn stop_tree(
    root: Option<Identity>,
    signal: Signal,
    grace: Duration,
    served: Option<&crate::journal::Served>,
) -> Vec<i64> {
    // The stop must finish even after Ctrl-C (which is often why it runs); one more
    // interrupt during it cuts the grace short: KILL at once.
    let more = crate::interrupt::After::now();
    let me = me();
    let mut signalled = Vec::new();
    for round in 0..ROUNDS {
        let targets = current_targets(root, &me);
        if targets.is_empty() {
            break;
        }
        // Later rounds are for what forked during the first one's grace: SIGKILL at once.
        let first = round == 0;
        // Everything a job started is the job's, whatever it calls itself: the protection
        // of GPU daemons by name is for processes gpuloop did not start (a job's
        // `exec -a nvidia-persistenced` is no daemon).
        let opts = KillOpts {
            signal: if first { signal } else { Signal::SIGKILL },
            grace: if first { grace } else { Duration::ZERO },
            tree: true,
            force: true,
            on_interrupt: OnInterrupt::KillNow,
            why: targets
                .iter()
                .map(|t| (t.pid(), job_member(root)))
                .collect(),
            served: served.cloned(),
            ..KillOpts::default()
        };
        let report = kill::kill(&targets, &opts, &[], &more);
        if report.signalled.is_empty() {
            // What is left may not be signalled (gpuloop's own ancestors): nothing to do.
            break;
        }
        signalled.extend(&report.signalled);
        for s in &report.stuck {
            crate::errln!(
                "warning: pid {} ({}) is stuck in the kernel or the driver (D state, wchan {}): it goes when that call returns",
                s.pid, s.name, s.wchan
            );
        }
        if !report.survivors.is_empty() {
            crate::errln!(
                "warning: {} {:?} survived SIGKILL",
                crate::words::pick(report.survivors.len(), "pid", "pids"),
                report.survivors
            );
        }
        if !report.survivors.is_empty() || !report.stuck.is_empty() {
            // More rounds would not move what SIGKILL did not.
            break;
        }
    }
    reap_adopted();
    signalled
}

/// What `stop_tree` would signal now (before the kill engine adds their descendants).
fn current_targets(root: Option<Identity>, me: &Me) -> Vec<Target> {
    let table = crate::process::process_table();
    let mut st = state();
    observe(&Tree::new(table.clone()), &mut st);
    targets(&table, root, me, &st)
}

/// The processes a job left running after its leader exited (`root` is the reaped leader):
/// the members of its process group known to be its own, the orphans that belong to no
/// other job, and everything below them. Nothing is signalled.
pub(crate) fn leftovers(root: Identity) -> Vec<i64> {
    let me = me();
    let targets = current_targets(Some(root), &me);
    let tree = Tree::snapshot();
    let mut pids: Vec<i64> = Vec::new();
    for t in targets {
        for pid in std::iter::once(t.pid()).chain(tree.descendants(t.pid())) {
            if pid != me.pid && !pids.contains(&i64::from(pid)) {
                pids.push(pid.into());
            }
        }
    }
    pids
}

/// Reaps every adopted zombie; gpuloop's own children (`Child` handles) are left alone.
pub(crate) fn reap_adopted() -> usize {
    let me = me();
    let st = state();
    let zombies: Vec<i32> = crate::process::process_table()
        .into_iter()
        .filter(|p| p.is_zombie() && adopted(p, &me, &st))
        .map(|p| p.pid)
        .collect();
    let mut reaped = 0;
    for pid in zombies {
        let Some(p) = rustix::process::Pid::from_raw(pid) else {
            continue;
        };
        if let Ok(Some(_)) = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG)
        {
            reaped += 1;
        }
    }
    reaped
}

/// True if some child of gpuloop has exited and is not reaped yet (no /proc scan needed).
fn zombie_child_exists() -> bool {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    matches!(
        waitid(
            WaitId::All,
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT
        ),
        Ok(Some(_))
    )
}

/// Waits (bounded) until no job leader is live: their monitors reaped them.
fn wait_all_finished(deadline: Instant) -> bool {
    let mut st = state();
    while !st.live.is_empty() {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        st = CHANGED
            .wait_timeout(st, deadline - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
    true
}

/// Script-wide supervision: makes gpuloop a child subreaper and runs the lineage/reaper
/// thread; dropping it (when the script ends, however it ends) stops everything the script
/// started and reaps it.
pub(crate) struct Supervisor;

impl Supervisor {
    pub(crate) fn start() -> Supervisor {
        // Any pid given turns the flag on; this process's own reads as what it means.
        let ok = rustix::process::set_child_subreaper(Some(rustix::process::getpid())).is_ok();
        if !ok {
            tracing::warn!(
                "cannot become a child subreaper: processes that double-fork out of a job may be left behind"
            );
        }
        // Set before the thread starts, which reads it.
        if ok && SUBREAPER.set(()).is_ok() {
            let _ = std::thread::Builder::new()
                .name("gpuloop-reaper".into())
                .spawn(supervise_loop);
        }
        Supervisor
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if state().pgids.is_empty() {
            // The script started no job: there is nothing of it to stop.
            return;
        }
        // However the stop below goes, gpuloop is alive to finish it: the guard may go.
        let _bye = guard::Goodbye;
        // The longest grace a running job asked for; with none running, the default.
        let grace = state()
            .live
            .iter()
            .map(|l| l.grace)
            .max()
            .unwrap_or(DEFAULT_GRACE);
        stop_tree(None, Signal::SIGTERM, grace, None);
        wait_all_finished(Instant::now() + Duration::from_secs(5));
        reap_adopted();
    }
}

fn supervise_loop() {
    loop {
        std::thread::sleep(TICK);
        // Watching: a live job, or a finished job's group with members left.
        let watching = !state().groups.is_empty();
        if watching {
            let tree = Tree::snapshot();
            observe(&tree, &mut state());
        }
        if zombie_child_exists() {
            reap_adopted();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, pgid: i32, start: u64) -> ProcInfo {
        ProcInfo::sleeping(pid, ppid, pgid, pgid, start)
    }

    fn pids(targets: &[Target]) -> Vec<i32> {
        let mut pids: Vec<i32> = targets.iter().map(Target::pid).collect();
        pids.sort_unstable();
        pids
    }

    /// A finished job's group members are its own only by
    /// identity, since the group's id is free once the group is empty.
    #[test]
    fn a_finished_jobs_kill_signals_whoever_reused_its_group_id_never() {
        let me = Me { pid: 1000 };
        let leader = Identity::new(10, 100);
        let mut st = State::default();
        st.pgids.insert(10);
        // Seen below the job: 12 stayed in its group (its parent, not gpuloop, outlived the
        // leader), 14 left it with setsid.
        st.seen.insert(Identity::new(12, 105), leader);
        st.seen.insert(Identity::new(14, 106), leader);
        let table = vec![
            p(1, 0, 1, 1),
            p(11, 1, 11, 90),
            p(12, 11, 10, 105),
            // Forked by 12 after the last look: the job's too.
            p(13, 12, 10, 400),
            p(14, 1, 14, 106),
            p(15, 14, 10, 401),
            // A group of the same id made by a process that took the leader's pid later:
            // its child is left in it, and another process has pid 12 by now.
            p(30, 1, 10, 300),
        ];
        let got = targets(&table, Some(leader), &me, &st);
        assert_eq!(pids(&got), vec![12, 13, 15]);
        let reused = vec![p(1, 0, 1, 1), p(12, 1, 10, 500), p(30, 12, 10, 501)];
        assert!(targets(&reused, Some(leader), &me, &st).is_empty());
        // The leader unreaped (a zombie too): its pid holds the group's id, so the whole
        // group and the leader's tree are the job's.
        let mut zombie = p(10, 1000, 10, 100);
        zombie.state = 'Z';
        let held = vec![zombie, p(20, 1, 10, 200), p(21, 20, 21, 201)];
        assert_eq!(pids(&targets(&held, Some(leader), &me, &st)), vec![20]);
    }
}
