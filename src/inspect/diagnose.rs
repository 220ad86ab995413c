//! diagnose(): per GPU, why memory is still used, as a verdict and one line of advice.

use super::holders::{Holder, Inventory, OnGpu, FOOTPRINT_MAX_MIB};
use super::kinds::Evidence;
use super::reset::{self as readiness, Blocker, Readiness};
use super::Selection;
use crate::gpu::faults::{self, Faults, Needs, Xid};
use crate::gpu::mig::MigKey;
use crate::process::restart::{self, Restarter, Seen};
use crate::process::tree::Tree;
use crate::process::ProcInfo;
use serde::{Deserialize, Serialize};

/// Why a GPU's memory is used (or that it is not), as diagnose() says it. Its names (serde's
/// for JSON and the wire, strum's for tables, scripts and docs) come from this one list.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    strum::IntoStaticStr,
    strum::VariantArray,
    strum::VariantNames,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Verdict {
    Clean,
    Held,
    Stuck,
    Respawning,
    Orphaned,
    Inherited,
    Service,
    Daemon,
    Footprint,
    OtherNamespace,
    Permission,
    Driver,
    /// Nobody holds it, and the GPU's own faults say a reset is needed (the driver's
    /// recovery action, or an Xid whose catalog action is a reset).
    ResetNeeded,
    /// The GPU's faults say the node must be rebooted.
    RebootNeeded,
    /// A row remap waits for the next reset.
    RemapPending,
    /// The GPU fell off the bus (Xid 79, or the driver's "GPU is lost").
    FellOffBus,
    DriverError,
    NoDriver,
    /// A verdict this gpuloop does not know, from a newer one on another host: never read as
    /// clean (so a new verdict needs no protocol version of its own).
    #[serde(other)]
    Unknown,
}

impl Verdict {
    /// The name scripts, JSON and tables use.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The verdict a name stands for.
    pub fn parse(name: &str) -> Option<Verdict> {
        <Verdict as strum::VariantArray>::VARIANTS
            .iter()
            .copied()
            .find(|v| v.as_str() == name)
    }

    /// False when the driver could not tell the GPU's memory: nothing is verified there.
    pub(crate) fn memory_known(self) -> bool {
        !matches!(
            self,
            Verdict::DriverError | Verdict::NoDriver | Verdict::FellOffBus
        )
    }

    /// The GPU's own faults ask for a reset or a reboot before it is fit for work (or the
    /// verdict is one this gpuloop does not know): never clean, whatever its memory reads.
    pub(crate) fn needs_action(self) -> bool {
        matches!(
            self,
            Verdict::ResetNeeded
                | Verdict::RebootNeeded
                | Verdict::RemapPending
                | Verdict::FellOffBus
                | Verdict::Unknown
        )
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Every verdict's name (for docs and help).
pub const VERDICTS: &[&str] = <Verdict as strum::VariantNames>::VARIANTS;

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Diagnosis {
    /// The GPU index; `None` only for the one "no-driver" entry that stands for all GPUs.
    pub gpu: Option<i64>,
    /// Bytes used on the GPU, and the same in MiB.
    pub mem_used: i64,
    pub mem_used_mib: i64,
    /// Compute holders of this GPU: the same processes as holders() for it.
    pub holders: Vec<Holder>,
    /// Protected GPU daemons on this GPU (never stopped without force).
    pub daemons: Vec<Holder>,
    /// Processes of other GPUs whose CUDA context keeps a few MiB here.
    pub footprint: Vec<FootprintOf>,
    pub ghost_pids: Vec<i64>,
    pub verdict: Verdict,
    pub advice: String,
    pub host: String,
    /// The GPU's faults, as gpu() has them (`()` where not read).
    #[serde(default)]
    pub faults: Option<Faults>,
    /// Where the advice is a reset: every client that would block it (`gpuloop reset
    /// --dry-run`'s list), with what stops each.
    #[serde(default)]
    pub blockers: Vec<Blocker>,
    /// The MIG device this diagnosis is of (`gpu` is then its parent's index, and the
    /// memory, the holders and the verdict are the device's alone); `()` for a whole GPU.
    #[serde(default)]
    pub mig: Option<crate::gpu::mig::MigDevice>,
}

impl Diagnosis {
    /// What it is of, as a selector names it: `2`, or `0:7:0` for a MIG device.
    pub fn target(&self) -> String {
        match (&self.mig, self.gpu) {
            (Some(d), _) => d.key().to_string(),
            (None, Some(g)) => g.to_string(),
            (None, None) => "*".into(),
        }
    }
}

impl Diagnosis {
    /// Clean as every front end means it by default: see `Usage::is_clean`.
    pub(crate) fn is_clean(&self) -> bool {
        self.is_clean_under(&Demand::default())
    }

    /// Clean under `demand`: see `Usage::is_clean`.
    pub(crate) fn is_clean_under(&self, demand: &Demand) -> bool {
        self.usage().is_clean(demand)
    }

    /// The facts of this diagnosis that decide whether the GPU is clean.
    pub fn usage(&self) -> Usage {
        Usage {
            fault: self.verdict.needs_action(),
            ..Usage::new(
                self.mem_used_mib,
                self.verdict.memory_known(),
                &self.holders,
                &self.daemons,
                self.footprint.len(),
                self.ghost_pids.len(),
            )
        }
    }
}

/// What "clean" demands of a GPU; every front end (diagnose, clean, wait, wait_clean, the
/// Slurm hooks, MCP) passes its options through this one type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    /// Count what protected daemons keep and other GPUs' CUDA footprint as used too.
    pub strict: bool,
    /// MiB that may stay used.
    pub max_used_mib: i64,
}

/// The facts about one GPU that decide whether it is clean, from a diagnosis or straight
/// from an inventory (wait_clean's polls), so both judge alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub used_mib: i64,
    /// The driver told the memory (no `driver-error`, no `no-driver`).
    pub memory_known: bool,
    /// Compute holders of the GPU.
    pub holders: usize,
    /// Processes of other GPUs whose CUDA context keeps a few MiB here.
    pub footprint: usize,
    /// Pids the driver lists here that hold nothing visible (dead, elsewhere, stale).
    pub ghosts: usize,
    /// MiB protected daemons keep here: what the driver lists for them, and a context's
    /// footprint for each that maps the GPU (the MPS control daemon maps it, unlisted).
    pub daemon_mib: i64,
    /// The GPU's own faults ask for a reset or a reboot (a diagnosis's verdict says so;
    /// wait_clean's polls read memory and holders only, never faults).
    pub fault: bool,
}

impl Usage {
    pub fn new(
        used_mib: i64,
        memory_known: bool,
        holders: &[Holder],
        daemons: &[Holder],
        footprint: usize,
        ghosts: usize,
    ) -> Usage {
        let daemon_mib = daemons
            .iter()
            .map(|d| {
                let maps = d.evidence.contains(&Evidence::Map);
                d.mem_mib + if maps { FOOTPRINT_MAX_MIB } else { 0 }
            })
            .sum();
        Usage {
            used_mib,
            memory_known,
            holders: holders.len(),
            footprint,
            ghosts,
            daemon_mib,
            fault: false,
        }
    }

    /// The one meaning of clean: the memory is known, no compute process holds the GPU, and
    /// what is used is at most `max_used_mib`, or, unless `strict`, no more than what
    /// protected daemons keep there (an MPS server's context is meant to be there) plus the
    /// CUDA footprint of jobs on other GPUs. Memory the driver lists for someone else (a
    /// ghost) is never explained away, and a GPU whose faults ask for a reset or a reboot
    /// is not fit for work whatever its memory reads.
    pub(crate) fn is_clean(&self, demand: &Demand) -> bool {
        if !self.memory_known || self.holders > 0 || self.fault {
            return false;
        }
        if self.used_mib <= demand.max_used_mib {
            return true;
        }
        if demand.strict || self.ghosts > 0 {
            return false;
        }
        let kept = self.daemon_mib + self.footprint as i64 * FOOTPRINT_MAX_MIB;
        kept > 0 && self.used_mib <= demand.max_used_mib + kept
    }
}

/// A process whose CUDA context maps a GPU it does not use.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FootprintOf {
    pub pid: i64,
    pub name: String,
    /// The GPUs it computes on.
    pub gpus: Vec<i64>,
    /// The host it runs on, as the diagnosis's.
    #[serde(default = "crate::local::local")]
    pub host: String,
    /// The container and pod it runs in.
    #[serde(flatten)]
    pub place: crate::process::container::Place,
}

impl FootprintOf {
    fn of(h: &Holder) -> FootprintOf {
        FootprintOf {
            pid: h.pid,
            name: h.name.clone(),
            gpus: h.gpus.clone(),
            host: h.host.clone(),
            place: h.origin.place.clone(),
        }
    }
}

/// What diagnose() needs besides the inventory.
pub struct Context<'a> {
    /// gpuloop runs in a child PID namespace the driver does not report in.
    pub foreign_ns: bool,
    /// Parents known to restart holders (from this session's kills).
    pub restarters: &'a [Restarter],
    /// Parents gpuloop saw restart a holder before, on this machine (`restart::seen_before`).
    pub seen: &'a [Seen],
    /// Where the advice is read, so the commands it gives act on this machine's GPUs.
    pub reach: &'a Reach,
    /// The simulator: its GPUs are reset by `gpuloop sim reset`, not by nvidia-smi.
    pub sim: bool,
    /// What blocks a reset here besides the holders (looked at only for a GPU whose advice
    /// is a reset).
    pub readiness: &'a dyn Fn() -> Readiness,
    /// The MIG devices the selection is narrowed to: only these of a GPU in MIG mode are
    /// diagnosed (`None`: all of them, and the GPU's holders that show no instance count on
    /// each).
    pub instances: Option<&'a [MigKey]>,
    /// Processes whose fds could not be read (they may hide a holder).
    pub unreadable: usize,
}

/// How the person reading advice reaches this machine. Advice is built where the GPUs are,
/// and read where gpuloop was started: for a host of `--host`, a bare `gpuloop kill --gpu 3`
/// pasted there would act on that machine's GPU 3, not this one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    /// The host's name in the reader's host set; `None` when they read it here.
    pub host: Option<String>,
    /// The command line that runs gpuloop on this machine from there (`gpuloop --host gpu02`).
    pub gpuloop: String,
}

impl Default for Reach {
    fn default() -> Reach {
        Reach {
            host: None,
            gpuloop: "gpuloop".into(),
        }
    }
}

impl Reach {
    /// A gpuloop command acting on this machine: `gpuloop --host gpu02 kill --gpu 3`.
    pub fn gpuloop(&self, args: &str) -> String {
        format!("{} {args}", self.gpuloop)
    }

    /// A command that only runs on this machine itself: as it is here; from elsewhere,
    /// `on gpu02: CMD` (which no shell runs as is).
    pub fn there(&self, cmd: &str) -> String {
        match &self.host {
            None => cmd.to_string(),
            Some(h) => format!("on {h}: {cmd}"),
        }
    }
}

/// The diagnosis of a machine whose driver did not load: one entry per selected GPU, or one
/// for all when none was selected. Never clean.
pub fn no_driver(sel: &Selection, why: &str) -> Vec<Diagnosis> {
    let entry = |gpu: Option<i64>| Diagnosis {
        gpu,
        mem_used: 0,
        mem_used_mib: 0,
        holders: Vec::new(),
        daemons: Vec::new(),
        footprint: Vec::new(),
        ghost_pids: Vec::new(),
        verdict: Verdict::NoDriver,
        advice: format!(
            "no NVIDIA driver: {why}; GPU memory cannot be read, so nothing can be verified clean"
        ),
        host: crate::local::local(),
        faults: None,
        blockers: Vec::new(),
        mig: None,
    };
    match sel {
        Some(s) => s.iter().map(|&g| entry(Some(g))).collect(),
        None => vec![entry(None)],
    }
}

/// What one diagnosis is of: a GPU, or one MIG device of it (a GPU of its own). It prints
/// as its selector (`2`, `0:7:0`), so advice reads "GPU 0:7:0" and `--gpu 0:7:0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// The GPU's index (a MIG device's parent).
    pub index: i64,
    pub mig: Option<MigKey>,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.mig {
            Some(k) => write!(f, "{k}"),
            None => write!(f, "{}", self.index),
        }
    }
}

/// Diagnoses every selected GPU from one inventory (its GPUs' `faults` read, where known).
/// A GPU in MIG mode is diagnosed per MIG device: each is a GPU of its own, with its own
/// memory, holders and verdict (`ctx.instances`, where given, says which).
pub fn diagnose(inv: &Inventory, sel: &Selection, ctx: &Context) -> Vec<Diagnosis> {
    // Orphan checks need the group and session leaders of the holders only.
    let leaders: Vec<ProcInfo> = inv
        .holders
        .iter()
        .flat_map(|h| [h.pid, h.pgid, h.sid])
        .filter_map(|p| crate::process::read_stat(p as i32).ok())
        .collect();
    let tree = Tree::new(leaders);
    let readiness = std::cell::OnceCell::new();
    let blockers_of = |t: Target| {
        let r = readiness.get_or_init(|| (ctx.readiness)());
        match t.mig {
            Some(k) => r.blockers_of_instance(inv, &k),
            None => r.blockers(inv, t.index),
        }
    };
    let mut out = Vec::new();
    for g in inv.gpus.iter().filter(|g| super::selected(sel, g.index)) {
        let devices = g.mig_devices();
        if devices.is_empty() {
            let on = inv.on_gpu(g);
            let mem = (g.mem_used, g.mem_used_mib);
            let target = Target {
                index: g.index,
                mig: None,
            };
            let listed = !g.driver_procs.is_empty();
            let fp_only = Inventory::footprint_explains(g, on.footprint.len(), 0);
            out.push(one(
                g,
                on,
                target,
                mem,
                listed,
                fp_only,
                ctx,
                &tree,
                &blockers_of,
            ));
            continue;
        }
        let whole = ctx.instances.is_none();
        for d in devices {
            let key = d.key();
            if ctx.instances.is_some_and(|i| !i.contains(&key)) {
                continue;
            }
            let on = inv.on_instance(g, d, whole);
            let listed = g.driver_procs.iter().any(|p| {
                p.mig
                    .is_some_and(|(gi, ci)| i64::from(gi) == key.gi && i64::from(ci) == key.ci)
            });
            let target = Target {
                index: g.index,
                mig: Some(key),
            };
            let mut diag = one(
                g,
                on,
                target,
                (d.mem_used, d.mem_used_mib),
                listed,
                false,
                ctx,
                &tree,
                &blockers_of,
            );
            diag.mig = Some(d.clone());
            out.push(diag);
        }
    }
    out
}

/// The diagnosis of one GPU or MIG device (`target`) from what is on it.
#[allow(clippy::too_many_arguments)]
fn one(
    g: &crate::gpu::Gpu,
    on: OnGpu<'_>,
    target: Target,
    (mem_used, used_mib): (i64, i64),
    driver_lists_any: bool,
    footprint_only: bool,
    ctx: &Context,
    tree: &Tree,
    blockers_of: &dyn Fn(Target) -> Vec<Blocker>,
) -> Diagnosis {
    let faults = g.faults.as_ref();
    if let Some(e) = &g.error {
        let mut d = driver_error(g, e, on.holders, ctx.reach);
        d.faults = g.faults.clone();
        return d;
    }
    let OnGpu {
        holders,
        daemons,
        footprint,
        ghosts,
        stale,
        ..
    } = on;
    // Where nobody holds it and memory is used, or a fault asks for something, the
    // advice may be a reset: name what would block it.
    let asks = faults.is_some_and(|f| {
        f.remap_pending()
            || f.recovery_action
                .is_some_and(|a| a.needs() > Needs::Nothing)
    });
    let blockers = if holders.is_empty() && (used_mib > 0 || asks) {
        blockers_of(target)
    } else {
        Vec::new()
    };
    let facts = Facts {
        gpu: target,
        used_mib,
        holders: &holders,
        daemons: &daemons,
        footprint: &footprint,
        footprint_only,
        ghosts: &ghosts,
        stale: &stale,
        driver_lists_any,
        foreign_ns: ctx.foreign_ns,
        unreadable: ctx.unreadable,
        blockers: &blockers,
        faults,
        reach: ctx.reach,
        sim: ctx.sim,
        seen: holders.iter().find_map(|h| {
            restart::restarted_before(h.pid as i32, ctx.seen).map(|s| (h.pid, s.clone()))
        }),
    };
    let (verdict, mut advice) = stuck_verdict(&holders).unwrap_or_else(|| {
        verdict(
            &facts,
            |h: &Holder| {
                tree.orphaned(h.pid as i32) || (h.origin.reparented && !h.origin.service_main)
            },
            |pid| restart::started_by(pid as i32, ctx.restarters).cloned(),
        )
    });
    if !stale.is_empty() {
        advice.push_str(&format!("; {}", stale_note(target, &stale)));
    }
    // The last Xid, where it says more: it names one of the holders, or nothing
    // else explains the memory.
    // The kernel log's pids are the host's: in a child PID namespace they name no process
    // here.
    let ours: &[Holder] = if ctx.foreign_ns { &[] } else { &holders };
    if let Some(note) = faults.and_then(|f| xid_note(f, ours, verdict)) {
        advice.push_str(&format!("; {note}"));
    }
    // What the GPU asks for still stands once its holders are stopped.
    if let Some(note) = faults
        .filter(|_| !holders.is_empty())
        .and_then(|f| still_needs(f, &reset_cmd(g.index, ctx.reach, false), ctx.reach))
    {
        advice.push_str(&format!("; {note}"));
    }
    let shown = matches!(
        verdict,
        Verdict::Driver | Verdict::ResetNeeded | Verdict::RemapPending
    );
    Diagnosis {
        gpu: Some(g.index),
        mem_used,
        mem_used_mib: used_mib,
        footprint: footprint.iter().map(|h| FootprintOf::of(h)).collect(),
        holders,
        daemons,
        ghost_pids: ghosts,
        verdict,
        advice,
        host: g.host.clone(),
        faults: g.faults.clone(),
        blockers: if shown { blockers } else { Vec::new() },
        mig: None,
    }
}

/// What the GPU's own faults ask for beyond stopping its holders: "then reset it".
fn still_needs(f: &Faults, reset: &str, reach: &Reach) -> Option<String> {
    let action = f.recovery_action.filter(|a| a.needs() > Needs::Nothing);
    Some(match action.map(|a| (a, a.needs())) {
        Some((a, Needs::Reboot)) => format!(
            "the driver also asks for a node reboot (recovery action {}): once they are stopped, reboot ({})",
            a.as_str(),
            reach.there("reboot")
        ),
        Some((a, _)) => format!(
            "the driver also asks for a GPU reset (recovery action {}): once they are stopped, {reset}",
            a.as_str()
        ),
        None if f.remap_pending() => {
            format!("a row remap is pending: once they are stopped, {reset} applies it")
        }
        None => return None,
    })
}

/// "2026-12-03T14:05:12Z".
fn at(x: &Xid) -> String {
    crate::utc::at(x.time)
}

/// "Xid 31 (GPU memory page fault …) at 2026-12-03T14:05:12Z from pid 477 (python3)".
fn xid_said(x: &Xid) -> String {
    let from = match (x.pid, &x.name) {
        (Some(pid), Some(name)) => format!(" from pid {pid} ({name})"),
        (Some(pid), None) => format!(" from pid {pid}"),
        (None, _) => String::new(),
    };
    format!("{} at {}{from}", x.title(), at(x))
}

/// The microseconds of a clock tick of /proc's start times (USER_HZ: 100 on every Linux ABI).
const TICK_US: u64 = 10_000;

/// Whether `h` is the process Xid `x` names, proved: the pid the kernel wrote, the name the
/// driver wrote is `h`'s comm, and `h` started before the event (its start tick ended
/// before it: a process started later has the pid only by reuse). Both the pid and the
/// name are the faulting process's to choose (a pid by waiting for it, a name by prctl), so
/// neither alone ever points at another user's process.
fn xid_names(x: &Xid, h: &Holder) -> bool {
    x.pid == Some(h.pid)
        && x.names(&h.name)
        && (h.start as u64).saturating_add(1).saturating_mul(TICK_US) <= x.boot_us
}

/// The GPU's last Xid, with the catalog's advice and, where it names one of the GPU's
/// holders (`xid_names`: the same process, proved), that holder beside it. Said for a holder
/// it names, or where nothing explains the memory (the driver's verdicts); the verdicts that
/// come from faults say their own. `holders` is empty where the kernel's pids are not this
/// PID namespace's.
fn xid_note(f: &Faults, holders: &[Holder], verdict: Verdict) -> Option<String> {
    let x = f.latest()?;
    let named = holders.iter().find(|h| xid_names(x, h));
    let plain = matches!(
        verdict,
        Verdict::Driver | Verdict::DriverError | Verdict::Stuck
    );
    if named.is_none() && !plain {
        return None;
    }
    let advice = faults::catalog(x.code).map_or(String::new(), |e| format!(": {}", e.advice));
    Some(match named {
        Some(h) => format!(
            "the last Xid on this GPU, {}, names holder {} ({}), which still holds it{advice}",
            xid_said(x),
            h.pid,
            h.name
        ),
        None => format!("the last Xid on this GPU: {}{advice}", xid_said(x)),
    })
}

/// A GPU the driver failed to read: its memory is unknown, so it is never clean. The holders
/// the /proc scan found on its device node are still listed. One the driver calls lost, or
/// whose Xid 79 the kernel log has, fell off the bus: a reboot brings it back.
fn driver_error(
    g: &crate::gpu::Gpu,
    error: &str,
    holders: Vec<Holder>,
    reach: &Reach,
) -> Diagnosis {
    let xid79 = g.faults.as_ref().and_then(Faults::off_bus);
    let (verdict, advice) = if g.lost || xid79.is_some() {
        let when = xid79.map_or(String::new(), |x| format!(" ({})", xid_said(x)));
        (
            Verdict::FellOffBus,
            format!(
                "GPU {} fell off the bus{when}: the host cannot reach it, its memory is unknown ({error}); reboot the node ({}); if it recurs, check the GPU's seating, power and cooling",
                g.index,
                reach.there("reboot")
            ),
        )
    } else {
        let last = g
            .faults
            .as_ref()
            .and_then(Faults::latest)
            .map_or(String::new(), |x| {
                format!("; the last Xid on it: {}", xid_said(x))
            });
        (
            Verdict::DriverError,
            format!(
                "the driver could not read this GPU ({error}): its memory is unknown, so it cannot be verified clean; check {}; a GPU that fell off the bus needs a reset or a reboot{last}",
                reach.there(&format!(
                    "dmesg for Xid errors and nvidia-smi -q -i {}",
                    g.index
                ))
            ),
        )
    };
    Diagnosis {
        gpu: Some(g.index),
        mem_used: 0,
        mem_used_mib: 0,
        holders,
        daemons: Vec::new(),
        footprint: Vec::new(),
        ghost_pids: Vec::new(),
        verdict,
        advice,
        host: g.host.clone(),
        faults: None,
        blockers: Vec::new(),
        mig: None,
    }
}

/// A holder asleep uninterruptibly (D) in the driver does not go on
/// SIGKILL; killing more is no use. A D state is often a moment of I/O, so it counts only if
/// it is still there a little later, and the process is still the one listed.
fn stuck_verdict(holders: &[Holder]) -> Option<(Verdict, String)> {
    holders
        .iter()
        .filter(|h| h.state.is_disk_sleep())
        .find_map(|h| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let dir = crate::process::identity::ProcDir::open(h.pid as i32).ok()?;
            let now = dir.stat().ok()?;
            // A defunct leader is in the state of the thread that holds for it.
            let state = crate::process::scan::live_thread(&dir).map_or(now.state, |(_, s)| s);
            (now.start as i64 == h.start && state == 'D').then(|| {
                (
                    Verdict::Stuck,
                    format!(
                        "pid {} ({}) is in the driver (D state, wchan {}): it frees when the driver returns; if it never does, reboot the node (a GPU reset fails while it has the device open)",
                        h.pid,
                        h.name,
                        crate::process::kill::wchan(&dir)
                    ),
                )
            })
        })
}

/// "MPS server" or "MPS control daemon" for NVIDIA MPS's processes: by argv[0], or, where
/// only the comm cut to `nvidia-cuda-mps` tells, by parent (the server is the control
/// daemon's child).
pub(crate) fn mps_part(h: &Holder) -> Option<&'static str> {
    let argv0 = h.cmdline.split(' ').next().unwrap_or_default();
    match argv0.rsplit('/').next().unwrap_or_default() {
        "nvidia-cuda-mps-server" => return Some("MPS server"),
        "nvidia-cuda-mps-control" => return Some("MPS control daemon"),
        _ => {}
    }
    (h.name == "nvidia-cuda-mps").then(|| {
        if h.origin.ppid_comm == "nvidia-cuda-mps" {
            "MPS server"
        } else {
            "MPS control daemon"
        }
    })
}

/// "4711 (python3)", with the Slurm job and user, or the pod or container, when known:
/// "4711 (python3, pod ml/trainer-0 (deleted))".
fn pids(hs: &[&Holder]) -> String {
    hs.iter()
        .map(|h| (h, crate::process::display_name(&h.name, &h.cmdline)))
        .map(
            |(h, name)| match (&h.origin.job, h.origin.place.describe()) {
                (Some(job), _) => format!("{} ({name}, Slurm job {job} of {})", h.pid, h.user),
                (None, Some(place)) => format!("{} ({name}, {place})", h.pid),
                (None, None) => format!("{} ({name})", h.pid),
            },
        )
        .collect::<Vec<_>>()
        .join(", ")
}

/// Advice for holders whose pod or container is gone while they live on: the kubelet (or the
/// runtime) will not stop them any more, so they are leftovers to clean, by their pod.
fn gone_advice(gpu: Target, gone: &[&Holder], reach: &Reach) -> String {
    let mut places: Vec<String> = gone
        .iter()
        .filter_map(|h| h.origin.place.describe())
        .collect();
    places.dedup();
    // Each by its pod's uid (or its container's id), never a name: a deleted pod's name is
    // its live successor's too (a StatefulSet's `trainer-0` re-created), and the advice must
    // take only what is gone. A forgotten container of a live pod is named alone.
    let mut by: Vec<String> = Vec::new();
    for h in gone {
        let p = &h.origin.place;
        let deleted_pod = p
            .pod
            .as_ref()
            .filter(|q| q.deleted)
            .and_then(|q| q.uid.as_deref());
        let one = match (deleted_pod, p.container.as_deref()) {
            (Some(uid), _) => format!("--pod {uid}"),
            (None, Some(id)) => format!("--container {id}"),
            (None, None) => continue,
        };
        if !by.contains(&one) {
            by.push(one);
        }
    }
    let cmds: Vec<String> = match by.is_empty() {
        true => vec![reach.gpuloop(&format!("clean --gpu {gpu}"))],
        false => by
            .iter()
            .map(|b| reach.gpuloop(&format!("clean --gpu {gpu} {b}")))
            .collect(),
    };
    let who = gone
        .iter()
        .map(|h| {
            format!(
                "{} ({})",
                h.pid,
                crate::process::display_name(&h.name, &h.cmdline)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{}: its processes {who} live on and hold GPU {gpu}; nothing will stop them now: {}",
        places.join(", "),
        cmds.join("; ")
    )
}

/// How to look at the GPUs from the node when gpuloop runs in a container without its PID
/// namespace (the driver then lists nothing here).
fn from_the_node(reach: &Reach) -> String {
    let node = std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "NODE".into());
    format!(
        "look from the node: {}, a pod with hostPID: true (docs/kubernetes.md), or docker run --pid=host",
        reach.there(&format!(
            "kubectl debug node/{node} --profile=sysadmin -it --image=IMAGE -- gpuloop diagnose"
        ))
    )
}

fn list(ps: &[i64]) -> String {
    ps.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
}

/// The command that stops the systemd unit `h` runs in.
fn stop_unit(h: &Holder) -> Option<String> {
    let unit = h.origin.service.as_deref()?;
    let user_unit = h
        .origin
        .cgroup
        .as_deref()
        .is_some_and(|c| c.contains("/user@"));
    Some(if user_unit {
        format!("systemctl --user stop {unit} (as {})", h.user)
    } else {
        format!("systemctl stop {unit}")
    })
}

/// Advice for a holder that runs in a systemd unit with `Restart=` (other than `no`), not as
/// its main process: the unit starts its work again when it dies, so the unit is what to stop.
/// A Slurm job's process is the job's, whatever cgroup it was left in.
fn unit_restart_advice(holders: &[Holder], reach: &Reach) -> Option<String> {
    let (h, restart) = holders.iter().find_map(|h| {
        let restart = h.origin.service_restart.as_deref()?;
        (!h.origin.service_main && h.origin.job.is_none() && restart != "no")
            .then_some((h, restart))
    })?;
    Some(format!(
        "{} runs in systemd unit {}, which restarts it (Restart={restart}): stopping the worker alone only gets it started again; stop the unit ({})",
        pids(&[h]),
        h.origin.service.as_deref()?,
        reach.there(&stop_unit(h)?)
    ))
}

/// Advice for holders that are a systemd unit's main process: stop the unit, not the pid.
fn service_advice(gpu: Target, units: &[&Holder], reach: &Reach) -> String {
    let mut names: Vec<String> = units.iter().filter_map(|h| stop_unit(h)).collect();
    names.dedup();
    // A unit with Restart= is a restarter gpuloop can name exactly.
    let restart = units
        .iter()
        .find_map(|h| h.origin.service_restart.as_deref());
    let why = match restart {
        Some("no") => "systemd owns it (Restart=no): stop the unit, not the pid".to_string(),
        Some(r) => format!("killing it only makes systemd restart it (Restart={r})"),
        None => "killing it only makes systemd restart it".to_string(),
    };
    format!(
        "{} {} GPU {gpu} as a systemd unit's main process; {why}: {}",
        pids(units),
        crate::words::pick(units.len(), "holds", "hold"),
        names
            .iter()
            .map(|n| reach.there(n))
            .collect::<Vec<_>>()
            .join("; ")
    )
}

/// "3 MiB: CUDA footprint of pid 3616 (python3), a GPU-0 job".
fn footprint_note(used_mib: i64, fp: &[&Holder]) -> String {
    let who = fp
        .iter()
        .map(|h| {
            let gpus = h
                .gpus
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",");
            format!("pid {} ({}), a GPU-{gpus} job", h.pid, h.name)
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!("{used_mib} MiB: CUDA footprint of {who}")
}

/// "pid 812 is the driver's stale record: the process now at that pid does not use GPU 0".
fn stale_note(gpu: Target, stale: &[i64]) -> String {
    match stale {
        [one] => format!(
            "pid {one} is the driver's stale record: the process now at that pid does not use GPU {gpu}"
        ),
        many => format!(
            "pids {} are the driver's stale records: the processes now at those pids do not use GPU {gpu}",
            list(many)
        ),
    }
}

/// How to reset `gpu`: `gpuloop reset` (which stops what blocks it, resets, verifies and
/// starts the daemons again), or the driver's tool directly, which runs only on the GPU's own
/// machine.
fn reset_advice(gpu: i64, reach: &Reach, sim: bool) -> String {
    format!(
        "{} ({})",
        reset_cmd(gpu, reach, false),
        reset_direct(gpu, reach, sim, "")
    )
}

/// `gpuloop reset --gpu N` as the reader runs it (`--force` where a protected daemon is in
/// its way); with a host set, `reset` takes only GPUs named with their host.
fn reset_cmd(gpu: i64, reach: &Reach, force: bool) -> String {
    let named = match &reach.host {
        Some(h) => format!("{h}:{gpu}"),
        None => gpu.to_string(),
    };
    let force = if force { " --force" } else { "" };
    reach.gpuloop(&format!("reset --gpu {named}{force}"))
}

/// "or, as root, nvidia-smi -r -i N" (`then` says when: " once they are stopped").
fn reset_direct(gpu: i64, reach: &Reach, sim: bool, then: &str) -> String {
    match (&reach.host, sim) {
        (None, true) if then.is_empty() => format!("or gpuloop sim reset --gpu {gpu}"),
        (None, true) => format!("or{then}: gpuloop sim reset --gpu {gpu}"),
        (Some(h), true) => format!("or{then}, on {h}: gpuloop sim reset --gpu {gpu}"),
        (None, false) => format!("or{then}, as root, nvidia-smi -r -i {gpu}"),
        (Some(h), false) => format!("or{then}, as root on {h}, nvidia-smi -r -i {gpu}"),
    }
}

/// Everything the verdict rules look at for one GPU.
struct Facts<'a> {
    gpu: Target,
    used_mib: i64,
    /// Compute holders of this GPU.
    holders: &'a [Holder],
    daemons: &'a [Holder],
    /// Compute holders of other GPUs that map this one.
    footprint: &'a [&'a Holder],
    /// What is used is no more than their footprint, and the driver lists nobody here.
    footprint_only: bool,
    ghosts: &'a [i64],
    /// The ghosts whose pid is a live process here that does not use this GPU.
    stale: &'a [i64],
    driver_lists_any: bool,
    foreign_ns: bool,
    unreadable: usize,
    /// What would block a reset of this GPU (the same list as `gpuloop reset --dry-run`).
    blockers: &'a [Blocker],
    /// The GPU's own faults, where read.
    faults: Option<&'a Faults>,
    reach: &'a Reach,
    sim: bool,
    /// A holder (its pid) whose ancestor gpuloop saw restart a holder before.
    seen: Option<(i64, Seen)>,
}

/// The verdict rules, in order; kept apart from the inventory so each rule is testable.
fn verdict(
    f: &Facts,
    orphaned: impl Fn(&Holder) -> bool,
    respawned: impl Fn(i64) -> Option<Restarter>,
) -> (Verdict, String) {
    let (gpu, used_mib, holders, ghosts) = (f.gpu, f.used_mib, f.holders, f.ghosts);
    let gpuloop = |args: String| f.reach.gpuloop(&args);
    if holders.is_empty() {
        // The GPU's own word (the driver's recovery action, a pending remap) before what
        // holds its memory: a daemon's context does not make it fit for work.
        if let Some(v) = fault_verdict(f, false) {
            return v;
        }
    }
    if holders.is_empty() && used_mib == 0 {
        let failed = f
            .faults
            .is_some_and(|x| x.remapped_rows.is_some_and(|r| r.failure));
        let note = if failed {
            ", but a row remap failed on it: NVIDIA says to have it serviced"
        } else {
            ""
        };
        return (Verdict::Clean, format!("GPU {gpu} is free{note}"));
    }
    if !holders.is_empty() {
        if let Some((h, r)) = holders
            .iter()
            .find_map(|h| respawned(h.pid).map(|r| (h, r)))
        {
            return (
                Verdict::Respawning,
                format!(
                    "pid {} ({}) started {} ({}) again after its holder {} was stopped: stop the restarter ({})",
                    r.pid,
                    r.name,
                    h.pid,
                    h.name,
                    r.holder,
                    gpuloop(format!("clean --gpu {gpu} --parents"))
                ),
            );
        }
        let unlisted: Vec<&Holder> = holders
            .iter()
            .filter(|h| !h.evidence.contains(&Evidence::Driver))
            .collect();
        if !ghosts.is_empty() && !unlisted.is_empty() {
            return (
                Verdict::Inherited,
                format!(
                    "creator {} {} {} exited; {} still {} its CUDA handles (a forked child): {}",
                    crate::words::pick(ghosts.len(), "pid", "pids"),
                    list(ghosts),
                    crate::words::pick(ghosts.len(), "has", "have"),
                    pids(&unlisted),
                    crate::words::pick(unlisted.len(), "holds", "hold"),
                    gpuloop(format!("kill --gpu {gpu}"))
                ),
            );
        }
        // A job's process is the job's, even when its node runs jobs from a service's cgroup.
        let units: Vec<&Holder> = holders
            .iter()
            .filter(|h| h.origin.service_main && h.origin.job.is_none())
            .collect();
        if !units.is_empty() {
            return (Verdict::Service, service_advice(gpu, &units, f.reach));
        }
        // A deleted pod's (or a forgotten container's) processes: orphans, named by it.
        let gone: Vec<&Holder> = holders.iter().filter(|h| h.origin.place.gone()).collect();
        if !gone.is_empty() {
            return (Verdict::Orphaned, gone_advice(gpu, &gone, f.reach));
        }
        let orphans: Vec<&Holder> = holders.iter().filter(|h| orphaned(h)).collect();
        if !orphans.is_empty() {
            return (
                Verdict::Orphaned,
                format!(
                    "the job that started {} is gone; they are leftovers: {}",
                    pids(&orphans),
                    gpuloop(format!("clean --gpu {gpu}"))
                ),
            );
        }
        let all: Vec<&Holder> = holders.iter().collect();
        let parents = holders
            .iter()
            .map(|h| (h.pid, h.ppid, h.origin.ppid_name.as_str()));
        let parents_cmd = gpuloop(format!("clean --gpu {gpu} --parents"));
        if let Some(advice) = unit_restart_advice(holders, f.reach) {
            return (Verdict::Held, advice);
        }
        if let Some(advice) = crate::process::restart::advice(parents, &parents_cmd) {
            return (Verdict::Held, advice);
        }
        if let Some((pid, s)) = &f.seen {
            return (
                Verdict::Held,
                format!(
                    "pid {} ({}), which started {pid}, restarted its holder before (seen by gpuloop at {}): stopping the worker alone only gets it started again; stop it with the worker ({parents_cmd})",
                    s.pid, s.name, s.seen
                ),
            );
        }
        return (
            Verdict::Held,
            format!(
                "{} {} GPU {gpu} ({used_mib} MiB): stop {} if {} not meant to run ({})",
                pids(&all),
                crate::words::pick(all.len(), "holds", "hold"),
                crate::words::pick(all.len(), "it", "them"),
                crate::words::pick(all.len(), "it is", "they are"),
                gpuloop(format!("kill --gpu {gpu}"))
            ),
        );
    }
    let fp_mib: i64 = if f.footprint_only { used_mib } else { 0 };
    let also_footprint = if f.footprint.is_empty() || f.footprint_only {
        String::new()
    } else {
        format!(
            "; {} {} of other GPUs also {} a few MiB here (CUDA footprint)",
            crate::words::pick(f.footprint.len(), "pid", "pids"),
            pids(f.footprint),
            crate::words::pick(f.footprint.len(), "keeps", "keep")
        )
    };
    // A daemon that only has the node open (nvidia-persistenced, an exporter) keeps no
    // memory: it does not explain what is used, it only blocks the reset that frees it.
    let keeping: Vec<&Holder> = f
        .daemons
        .iter()
        .filter(|d| d.mem > 0 || d.evidence.contains(&Evidence::Map))
        .collect();
    if !keeping.is_empty() {
        let who = keeping
            .iter()
            .map(|d| {
                let mib = d.mem / crate::gpu::MIB;
                match (mps_part(d), mib) {
                    (Some(part), 0) => format!("{part} pid {} has it open", d.pid),
                    (Some(part), mib) => format!("{mib} MiB: {part} pid {}", d.pid),
                    (None, 0) => format!("{} (pid {}) has it open", d.name, d.pid),
                    (None, mib) => format!("{} (pid {}) holds {mib} MiB", d.name, d.pid),
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        // MPS stops through its control daemon; a unit or a forced kill would leave its
        // clients' state behind.
        let stop = if keeping.iter().any(|d| mps_part(d).is_some()) {
            f.reach.there("echo quit | nvidia-cuda-mps-control")
        } else {
            format!(
                "stop its service ({}) or {}",
                f.reach.there("systemctl stop …"),
                gpuloop(format!("kill --gpu {gpu} --force"))
            )
        };
        let usage = Usage::new(
            used_mib,
            true,
            holders,
            f.daemons,
            f.footprint.len(),
            ghosts.len(),
        );
        let advice = if usage.is_clean(&Demand::default()) {
            format!(
                "{used_mib} MiB used, kept by protected GPU daemons: {who}; that is meant to be there and leaves the GPU clean (--strict counts it); to free it anyway: {stop}{also_footprint}"
            )
        } else {
            format!(
                "{used_mib} MiB used: {who}; it is a protected GPU daemon: to free it, {stop}{also_footprint}"
            )
        };
        return (Verdict::Daemon, advice);
    }
    if fp_mib > 0 {
        return (
            Verdict::Footprint,
            format!(
                "{}; it goes when that job ends (CUDA_VISIBLE_DEVICES keeps it off GPU {gpu})",
                footprint_note(fp_mib, f.footprint)
            ),
        );
    }
    if f.foreign_ns && !f.driver_lists_any {
        return (
            Verdict::OtherNamespace,
            format!(
                "{used_mib} MiB used and the driver names nobody: gpuloop runs in a container without the host's PID namespace; {}",
                from_the_node(f.reach)
            ),
        );
    }
    // Processes we may not look into can hide the holder (and explain a dead-looking
    // creator too): say so before guessing at namespaces.
    if f.unreadable > 0 {
        return (
            Verdict::Permission,
            format!(
                "{used_mib} MiB used; {} could not be inspected (other users'): run as root ({})",
                crate::words::count(f.unreadable, "process", "processes"),
                f.reach.there("sudo gpuloop diagnose")
            ),
        );
    }
    // Only pids that really are absent here: a stale record's pid exists, as another process.
    let absent: Vec<i64> = ghosts
        .iter()
        .copied()
        .filter(|p| !f.stale.contains(p))
        .collect();
    if !absent.is_empty() {
        return (
            Verdict::OtherNamespace,
            format!(
                "{used_mib} MiB used by {} {} that {}: {} in another PID namespace (a container); {}",
                crate::words::pick(absent.len(), "pid", "pids"),
                list(&absent),
                crate::words::pick(absent.len(), "does not exist here", "do not exist here"),
                crate::words::pick(absent.len(), "it runs", "they run"),
                from_the_node(f.reach)
            ),
        );
    }
    // The last Xid that asks for a reset or a reboot says why nobody holds it.
    if let Some(v) = fault_verdict(f, true) {
        return (v.0, format!("{}{also_footprint}", v.1));
    }
    // A reset is all that frees it, and it fails while any client has the GPU open.
    (
        Verdict::Driver,
        format!(
            "{used_mib} MiB used and no process holds it: {}{also_footprint}",
            reset_clause(f)
        ),
    )
}

/// "only a GPU reset frees it: gpuloop reset --gpu 2 (…)", naming first what would block it.
fn reset_clause(f: &Facts) -> String {
    if let Some(k) = f.gpu.mig {
        return instance_reset_clause(f, k);
    }
    let gpu = f.gpu.index;
    if f.blockers.is_empty() {
        return format!(
            "only a GPU reset frees it: {}",
            reset_advice(gpu, f.reach, f.sim)
        );
    }
    let force = f
        .blockers
        .iter()
        .any(|b| b.needs_force() && b.stop != readiness::Stop::Unload);
    let module = f.blockers.iter().any(|b| b.stop == readiness::Stop::Unload);
    let first = if module {
        "unload the module first; then "
    } else {
        ""
    };
    format!(
        "only a GPU reset frees it, and a reset fails while these have the GPU: {}; {first}{} stops the others, resets, verifies and starts the daemons again ({})",
        readiness::describe(f.blockers, |c| f.reach.there(c)),
        reset_cmd(gpu, f.reach, force),
        reset_direct(gpu, f.reach, f.sim, " once they are stopped")
    )
}

/// The way out for a MIG device whose memory nobody holds: a MIG device is not reset on its
/// own; destroying it and making it again (mig-parted, or `nvidia-smi mig -dci`/`-dgi`
/// then `-cgi`/`-cci`) frees it, or a reset of the whole GPU once its other devices are
/// idle. gpuloop does neither; it names what blocks them (`reset --dry-run --gpu N:GI:CI`).
fn instance_reset_clause(f: &Facts, k: MigKey) -> String {
    // With a host set the reader reaches this machine alone (`gpuloop --host H`), where
    // `N:GI:CI` names its device.
    let check = f.reach.gpuloop(&format!("reset --dry-run --gpu {k}"));
    let blocked = if f.blockers.is_empty() {
        String::new()
    } else {
        format!(
            "; these would block destroying it: {}",
            readiness::describe(f.blockers, |c| f.reach.there(c))
        )
    };
    format!(
        "only destroying and re-creating MIG device {k} frees it ({}: mig-parted, or nvidia-smi mig -dci and -dgi, then -cgi and -cci), or a reset of GPU {} once its other MIG devices are idle{blocked} ({check})",
        f.reach.there(&format!("nvidia-smi mig -i {}", k.gpu)),
        k.gpu
    )
}

/// The verdicts the GPU's own faults give where no process holds it: the driver's recovery
/// action, a pending row remap, and, where `memory_left` (memory used that nothing
/// explains), the last Xid whose catalog action is a reset or a reboot.
fn fault_verdict(f: &Facts, memory_left: bool) -> Option<(Verdict, String)> {
    let faults = f.faults?;
    let memory = if f.used_mib > 0 {
        format!("{} MiB used and no process holds it; ", f.used_mib)
    } else {
        String::new()
    };
    let reboot = |why: String| {
        (
            Verdict::RebootNeeded,
            format!(
                "{memory}{why}: reboot the node ({})",
                f.reach.there("reboot")
            ),
        )
    };
    let action = faults
        .recovery_action
        .filter(|a| a.needs() > Needs::Nothing);
    match action.map(|a| (a, a.needs())) {
        Some((a, Needs::Reboot)) => {
            return Some(reboot(format!(
                "the driver asks for a node reboot (recovery action {})",
                a.as_str()
            )))
        }
        Some((a, _)) => {
            return Some((
                Verdict::ResetNeeded,
                format!(
                    "{memory}the driver asks for a GPU reset (recovery action {}): {}",
                    a.as_str(),
                    reset_clause(f)
                ),
            ))
        }
        None => {}
    }
    if faults.remap_pending() {
        return Some((
            Verdict::RemapPending,
            format!(
                "{memory}a row remap is pending: the faulty row stays in use until the GPU is reset; {}",
                reset_clause(f)
            ),
        ));
    }
    let (x, needs) = faults.latest_need().filter(|_| memory_left)?;
    let advice = faults::catalog(x.code).map_or(String::new(), |e| format!(" ({})", e.advice));
    Some(match needs {
        Needs::Reboot => reboot(format!("after {}{advice}", xid_said(x))),
        _ => (
            Verdict::ResetNeeded,
            format!(
                "{memory}after {}, NVIDIA's Xid catalog says to reset the GPU: {}",
                xid_said(x),
                reset_clause(f)
            ),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::kinds::{Role, RunState, State};

    fn h(pid: i64, evidence: &[&str]) -> Holder {
        Holder {
            pid,
            ppid: 1,
            pgid: pid,
            sid: pid,
            start: 1,
            pidfs_ino: None,
            uid: 0,
            user: "root".into(),
            name: "python3".into(),
            cmdline: "python3".into(),
            state: State::new(RunState::Sleeping),
            role: Role::Compute,
            gpus: vec![0],
            mig: Vec::new(),
            mem: 0,
            mem_mib: 0,
            inherited: None,
            inherited_on: Default::default(),
            evidence: evidence.iter().filter_map(|e| Evidence::parse(e)).collect(),
            protected: false,
            host: "local".into(),
            origin: Default::default(),
            maps: vec![0],
            opens: Vec::new(),
            caps: false,
            caps_all: false,
        }
    }

    fn facts<'a>(
        holders: &'a [Holder],
        ghosts: &'a [i64],
        used_mib: i64,
        listed: bool,
        foreign_ns: bool,
        unreadable: usize,
    ) -> Facts<'a> {
        Facts {
            gpu: Target {
                index: 0,
                mig: None,
            },
            used_mib,
            holders,
            daemons: &[],
            footprint: &[],
            footprint_only: false,
            ghosts,
            stale: &[],
            driver_lists_any: listed,
            foreign_ns,
            unreadable,
            blockers: &[],
            faults: None,
            reach: &HERE,
            sim: false,
            seen: None,
        }
    }

    static HERE: std::sync::LazyLock<Reach> = std::sync::LazyLock::new(Reach::default);

    /// The one judgement of clean, on its own.
    #[test]
    fn usage_is_clean_under_each_demand() {
        let lax = Demand::default();
        let strict = Demand {
            strict: true,
            ..lax
        };
        let u = |used_mib, holders, footprint, ghosts, daemon_mib| Usage {
            used_mib,
            memory_known: true,
            holders,
            footprint,
            ghosts,
            daemon_mib,
            fault: false,
        };
        assert!(u(0, 0, 0, 0, 0).is_clean(&lax));
        assert!(!u(0, 1, 0, 0, 0).is_clean(&lax), "a compute holder");
        assert!(!u(5, 0, 0, 0, 0).is_clean(&lax), "memory nobody holds");
        let five = Demand {
            max_used_mib: 5,
            ..lax
        };
        assert!(u(5, 0, 0, 0, 0).is_clean(&five));
        // A footprint, and what a daemon keeps, are not dirt unless strict.
        assert!(u(3, 0, 1, 0, 0).is_clean(&lax));
        assert!(!u(3, 0, 1, 0, 0).is_clean(&strict));
        assert!(u(74, 0, 0, 0, 82).is_clean(&lax));
        assert!(!u(74, 0, 0, 0, 82).is_clean(&strict));
        assert!(
            !u(900, 0, 0, 0, 82).is_clean(&lax),
            "more than the daemon keeps"
        );
        // Memory the driver lists for someone else is never explained away.
        assert!(!u(3, 0, 1, 1, 0).is_clean(&lax));
        assert!(!u(74, 0, 0, 1, 82).is_clean(&lax));
        let unknown = Usage {
            memory_known: false,
            ..u(0, 0, 0, 0, 0)
        };
        assert!(!unknown.is_clean(&lax));
        // A GPU whose faults ask for a reset or a reboot, whatever its memory reads.
        let faulty = Usage {
            fault: true,
            ..u(0, 0, 0, 0, 0)
        };
        assert!(!faulty.is_clean(&lax));
        assert!(!faulty.is_clean(&five));
    }

    #[test]
    fn verdict_names_are_the_serde_names() {
        let all = <Verdict as strum::VariantArray>::VARIANTS;
        let names: Vec<&str> = all.iter().map(|v| v.as_str()).collect();
        assert_eq!(names, VERDICTS);
        for &v in all {
            assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
            assert_eq!(Verdict::parse(v.as_str()), Some(v));
        }
        // A verdict from a newer gpuloop reads as one this one does not know, never clean.
        let newer: Verdict = serde_json::from_value(serde_json::json!("gpu-on-fire")).unwrap();
        assert_eq!(newer, Verdict::Unknown);
        assert!(newer.needs_action());
    }

    #[test]
    fn each_verdict() {
        let v = |f: Facts| verdict(&f, |_: &Holder| false, |_| None).0.as_str();
        assert_eq!(v(facts(&[], &[], 0, false, false, 0)), "clean");
        let held = [h(5, &["driver", "fd", "map"])];
        assert_eq!(v(facts(&held, &[], 100, true, false, 0)), "held");
        let child = [h(6, &["fd", "map"])];
        assert_eq!(v(facts(&child, &[5], 100, true, false, 0)), "inherited");
        assert_eq!(v(facts(&[], &[5], 100, true, false, 0)), "other-namespace");
        assert_eq!(v(facts(&[], &[], 100, false, true, 0)), "other-namespace");
        assert_eq!(v(facts(&[], &[], 100, false, false, 3)), "permission");
        assert_eq!(v(facts(&[], &[5], 100, true, false, 3)), "permission");
        assert_eq!(v(facts(&[], &[], 100, false, false, 0)), "driver");
        let orphan = verdict(
            &facts(&[h(7, &["driver"])], &[], 100, true, false, 0),
            |h| h.pid == 7,
            |_| None,
        );
        assert_eq!(orphan.0, Verdict::Orphaned);
        assert!(orphan.1.contains("7 (python3)"));
        let mut unit = h(8, &["driver"]);
        unit.origin.service = Some("vllm.service".into());
        unit.origin.service_main = true;
        unit.origin.service_restart = Some("always".into());
        unit.origin.reparented = true;
        let units = [unit.clone()];
        let (v, advice) = verdict(&facts(&units, &[], 100, true, false, 0), |_| true, |_| None);
        assert_eq!(v, Verdict::Service);
        assert!(advice.contains("systemctl stop vllm.service"), "{advice}");
        assert!(advice.contains("(Restart=always)"), "{advice}");
        // A Slurm job's process is never a unit's, whatever cgroup slurmd left it in.
        unit.origin.job = Some(812);
        let units = [unit];
        let (v, advice) = verdict(&facts(&units, &[], 100, true, false, 0), |_| true, |_| None);
        assert_eq!(v, Verdict::Orphaned);
        assert!(advice.contains("Slurm job 812 of root"), "{advice}");
    }

    #[test]
    fn daemon_footprint_respawning_and_reset_advice() {
        let mut d = h(9, &["driver", "fd", "map"]);
        d.name = "nv-hostengine".into();
        d.role = Role::Daemon;
        d.mem = 500 * crate::gpu::MIB;
        let daemons = [d.clone()];
        let other = h(3616, &["driver", "fd", "map"]);
        let fp = [&other];
        // A daemon's memory is the daemon's, with a footprint beside it: never "footprint".
        let f = Facts {
            daemons: &daemons,
            footprint: &fp,
            ..facts(&[], &[], 503, true, false, 0)
        };
        let (v, advice) = verdict(&f, |_: &Holder| false, |_| None);
        assert_eq!(v, Verdict::Daemon);
        assert!(
            advice.contains("nv-hostengine (pid 9) holds 500 MiB"),
            "{advice}"
        );
        assert!(
            advice.contains("--force") && !advice.contains("reset"),
            "{advice}"
        );
        // Only the footprint of a GPU-0 job.
        let f = Facts {
            footprint: &fp,
            footprint_only: true,
            ..facts(&[], &[], 3, false, false, 0)
        };
        let (v, advice) = verdict(&f, |_: &Holder| false, |_| None);
        assert_eq!(v, Verdict::Footprint);
        assert!(
            advice.starts_with("3 MiB: CUDA footprint of pid 3616 (python3), a GPU-0 job"),
            "{advice}"
        );
        // Memory nobody holds while a client has the driver open: no plain reset advice.
        let clients = [Blocker::of_holder(&other)];
        let f = Facts {
            blockers: &clients,
            ..facts(&[], &[], 900, false, false, 0)
        };
        let (v, advice) = verdict(&f, |_: &Holder| false, |_| None);
        assert_eq!(v, Verdict::Driver);
        assert!(
            advice.contains("a reset fails while these have the GPU: 3616 (python3, compute): kill 3616; gpuloop reset --gpu 0 stops the others, resets, verifies and starts the daemons again (or once they are stopped, as root, nvidia-smi -r -i 0)"),
            "{advice}"
        );
        // A holder started again by the parent of one that was stopped.
        let r = Restarter {
            pid: 1237,
            name: "bash".into(),
            holder: 1240,
            shown: None,
            identity: crate::process::Identity::new(1237, 1),
            holder_identity: crate::process::Identity::new(1240, 2),
        };
        let held = [h(1300, &["driver", "fd", "map"])];
        let (v, advice) = verdict(
            &facts(&held, &[], 100, true, false, 0),
            |_| false,
            |_| Some(r.clone()),
        );
        assert_eq!(v, Verdict::Respawning);
        assert!(
            advice.starts_with("pid 1237 (bash) started 1300"),
            "{advice}"
        );
    }

    fn xid(code: i64, pid: Option<i64>, boot_us: u64) -> Xid {
        let r = crate::gpu::kmsg::Record {
            boot_us,
            message: format!(
                "NVRM: Xid (PCI:0000:18:00): {code}, pid={}, name=python3, x",
                pid.map_or("'<unknown>'".into(), |p| p.to_string())
            ),
        };
        let clock = crate::gpu::kmsg::Clock {
            wall: 1_800_000_000.0,
            boot: 100.0,
        };
        crate::gpu::faults::parse_xid(&r, &clock).unwrap().1
    }

    /// Issue 36: `driver` is split where the GPU's own faults say more, and those verdicts
    /// are never clean.
    #[test]
    fn the_gpus_faults_split_the_driver_verdict() {
        use crate::gpu::faults::{RecoveryAction, RemappedRows};
        let v = |f: &Facts| verdict(f, |_: &Holder| false, |_| None);
        let with = |faults: &Faults, used: i64| -> (Verdict, String) {
            v(&Facts {
                faults: Some(faults),
                ..facts(&[], &[], used, false, false, 0)
            })
        };
        let xids = |x: Vec<Xid>| Faults {
            xid: x,
            ..Faults::default()
        };
        // Memory nobody holds after an Xid whose catalog action is a reset.
        let (verdict, advice) = with(&xids(vec![xid(31, Some(5), 1), xid(48, None, 2)]), 900);
        assert_eq!(verdict, Verdict::ResetNeeded, "{advice}");
        assert!(
            advice.contains("after Xid 48 (double-bit ECC error"),
            "{advice}"
        );
        assert!(advice.contains("gpuloop reset --gpu 0"), "{advice}");
        // Off the bus, or a GSP that stopped answering.
        let (verdict, advice) = with(&xids(vec![xid(79, None, 3)]), 900);
        assert_eq!(verdict, Verdict::RebootNeeded, "{advice}");
        assert!(advice.contains("reboot the node"), "{advice}");
        assert_eq!(
            with(&xids(vec![xid(119, None, 3)]), 900).0,
            Verdict::ResetNeeded
        );
        // An application's own fault explains nothing: the driver's verdict stays.
        assert_eq!(
            with(&xids(vec![xid(31, Some(5), 1)]), 900).0,
            Verdict::Driver
        );
        // An old Xid on a free GPU is history, not a verdict.
        assert_eq!(with(&xids(vec![xid(48, None, 1)]), 0).0, Verdict::Clean);
        // The driver's own word and a pending remap count on a free GPU too.
        let action = |a| Faults {
            recovery_action: Some(a),
            ..Faults::default()
        };
        assert_eq!(
            with(&action(RecoveryAction::GpuReset), 0).0,
            Verdict::ResetNeeded
        );
        assert_eq!(
            with(&action(RecoveryAction::DrainAndReset), 0).0,
            Verdict::ResetNeeded
        );
        assert_eq!(
            with(&action(RecoveryAction::NodeReboot), 0).0,
            Verdict::RebootNeeded
        );
        assert_eq!(with(&action(RecoveryAction::None), 0).0, Verdict::Clean);
        assert_eq!(with(&action(RecoveryAction::DrainP2p), 0).0, Verdict::Clean);
        let rows = |pending, failure| Faults {
            remapped_rows: Some(RemappedRows {
                correctable: 0,
                uncorrectable: 1,
                pending,
                failure,
            }),
            ..Faults::default()
        };
        let (verdict, advice) = with(&rows(true, false), 0);
        assert_eq!(verdict, Verdict::RemapPending, "{advice}");
        assert!(advice.contains("row remap is pending"), "{advice}");
        let (verdict, advice) = with(&rows(false, true), 0);
        assert_eq!(verdict, Verdict::Clean);
        assert!(advice.contains("have it serviced"), "{advice}");
        // A daemon's context does not make a GPU the driver wants reset fit for work.
        let mut d = h(9, &["driver", "fd", "map"]);
        d.role = Role::Daemon;
        let daemons = [d];
        let f = action(RecoveryAction::GpuReset);
        let (verdict, _) = v(&Facts {
            daemons: &daemons,
            faults: Some(&f),
            ..facts(&[], &[], 80, true, false, 0)
        });
        assert_eq!(verdict, Verdict::ResetNeeded);
        // Holders come first: they must be stopped before anything else; the reset the
        // driver asks for is said after them.
        let held = [h(5, &["driver", "fd", "map"])];
        let (verdict, _) = v(&Facts {
            faults: Some(&f),
            ..facts(&held, &[], 100, true, false, 0)
        });
        assert_eq!(verdict, Verdict::Held);
        let note = still_needs(&f, "gpuloop reset --gpu 0", &Reach::default()).unwrap();
        assert!(
            note.contains("also asks for a GPU reset (recovery action gpu-reset): once they are stopped, gpuloop reset --gpu 0"),
            "{note}"
        );
        assert!(still_needs(&rows(true, false), "R", &Reach::default())
            .unwrap()
            .contains("row remap is pending"));
        assert_eq!(
            still_needs(&Faults::default(), "R", &Reach::default()),
            None
        );
        for v in [
            Verdict::ResetNeeded,
            Verdict::RebootNeeded,
            Verdict::RemapPending,
            Verdict::FellOffBus,
        ] {
            assert!(v.needs_action() && !Verdict::Driver.needs_action());
            let d = Diagnosis {
                gpu: Some(0),
                mem_used: 0,
                mem_used_mib: 0,
                holders: vec![],
                daemons: vec![],
                footprint: vec![],
                ghost_pids: vec![],
                verdict: v,
                advice: String::new(),
                host: "local".into(),
                faults: None,
                blockers: vec![],
                mig: None,
            };
            assert!(!d.is_clean(), "{v} reads clean");
        }
    }

    /// The last Xid names a holder (the same process: it started before the event) and is
    /// said beside it; one naming a process that is gone is said only where nothing else
    /// explains the memory.
    #[test]
    fn a_holder_named_by_the_last_xid_is_shown_beside_it() {
        let mut holder = h(477, &["driver", "fd", "map"]);
        holder.start = 100; // 1 s after boot
        let holders = [holder.clone()];
        let f = Faults {
            xid: vec![xid(31, Some(477), 5_000_000)],
            ..Faults::default()
        };
        let note = xid_note(&f, &holders, Verdict::Held).unwrap();
        assert!(
            note.contains("Xid 31 (GPU memory page fault")
                && note.contains("from pid 477 (python3)")
                && note.contains("names holder 477 (python3), which still holds it"),
            "{note}"
        );
        // A process that started after the event only has the pid, as has one that started
        // in the same tick as the event (it may have started after it).
        holder.start = 1_000;
        assert_eq!(xid_note(&f, &[holder.clone()], Verdict::Held), None);
        holder.start = 500;
        assert_eq!(xid_note(&f, &[holder.clone()], Verdict::Held), None);
        holder.start = 499;
        assert!(xid_note(&f, &[holder.clone()], Verdict::Held).is_some());
        // Another program at the pid, started before the event: not the one the driver
        // named (its name is not the one the driver wrote), so not blamed.
        holder.name = "trainer".into();
        assert_eq!(xid_note(&f, &[holder], Verdict::Held), None);
        assert!(xid_note(&f, &[], Verdict::Driver)
            .unwrap()
            .starts_with("the last Xid on this GPU: Xid 31"));
        // A lost GPU, or one whose Xid 79 is in the log, fell off the bus.
        let mut lost = crate::gpu::Gpu::failed(1, 1, "GPU 1: GPU is lost".into());
        lost.lost = true;
        let d = driver_error(&lost, "GPU 1: GPU is lost", vec![], &Reach::default());
        assert_eq!(d.verdict, Verdict::FellOffBus, "{}", d.advice);
        assert!(!d.verdict.memory_known());
        let mut logged = crate::gpu::Gpu::failed(1, 1, "GPU 1: Unknown Error".into());
        logged.faults = Some(Faults {
            xid: vec![xid(79, None, 7)],
            ..Faults::default()
        });
        let d = driver_error(&logged, "GPU 1: Unknown Error", vec![], &Reach::default());
        assert_eq!(d.verdict, Verdict::FellOffBus, "{}", d.advice);
        assert!(
            d.advice.contains("Xid 79 (the GPU fell off the bus"),
            "{}",
            d.advice
        );
        let hung = crate::gpu::Gpu::failed(1, 1, "GPU 1: hung".into());
        assert_eq!(
            driver_error(&hung, "GPU 1: hung", vec![], &Reach::default()).verdict,
            Verdict::DriverError
        );
    }

    /// Facts as a host of the set reports them.
    fn at<'a>(f: Facts<'a>, reach: &'a Reach, sim: bool) -> Facts<'a> {
        Facts { reach, sim, ..f }
    }

    /// The bug: advice is built on the host that has the GPU, which did not know it was
    /// remote: "(gpuloop kill --gpu 3)" pasted where gpuloop runs acts on that machine's GPU 3.
    /// For a host of the set, every command names the host, or says to run it there.
    #[test]
    fn advice_for_a_remote_host_names_it_in_every_command() {
        let reach = Reach {
            host: Some("gpu02".into()),
            gpuloop: "gpuloop --host gpu02".into(),
        };
        let mut unit = h(8, &["driver"]);
        unit.origin.service = Some("vllm.service".into());
        unit.origin.service_main = true;
        let mut daemon = h(9, &["driver", "fd", "map"]);
        daemon.role = Role::Daemon;
        let r = Restarter {
            pid: 1237,
            name: "bash".into(),
            holder: 1240,
            shown: None,
            identity: crate::process::Identity::new(1237, 1),
            holder_identity: crate::process::Identity::new(1240, 2),
        };
        let held = [h(5, &["driver", "fd", "map"])];
        let child = [h(6, &["fd", "map"])];
        let units = [unit];
        let daemons = [daemon];
        let clients = [Blocker::of_holder(&h(7, &["fd"]))];
        let lost = crate::gpu::Gpu::failed(3, 3, "GPU is lost".into());
        for sim in [false, true] {
            let f = |hs, ghosts, unreadable| {
                at(facts(hs, ghosts, 100, true, false, unreadable), &reach, sim)
            };
            let advice = [
                verdict(&f(&held, &[], 0), |_| false, |_| None),
                verdict(&f(&held, &[], 0), |_| true, |_| None),
                verdict(&f(&held, &[], 0), |_| false, |_| Some(r.clone())),
                verdict(&f(&child, &[5], 0), |_| false, |_| None),
                verdict(&f(&units, &[], 0), |_| false, |_| None),
                verdict(&f(&[], &[], 2), |_| false, |_| None),
                verdict(&f(&[], &[], 0), |_| false, |_| None),
                verdict(
                    &Facts {
                        daemons: &daemons,
                        ..f(&[], &[], 0)
                    },
                    |_| false,
                    |_| None,
                ),
                verdict(
                    &Facts {
                        blockers: &clients,
                        ..f(&[], &[], 0)
                    },
                    |_| false,
                    |_| None,
                ),
                (
                    Verdict::DriverError,
                    driver_error(&lost, "GPU is lost", Vec::new(), &reach).advice,
                ),
            ];
            let verdicts: Vec<&str> = advice.iter().map(|(v, _)| v.as_str()).collect();
            assert_eq!(
                verdicts,
                [
                    "held",
                    "orphaned",
                    "respawning",
                    "inherited",
                    "service",
                    "permission",
                    "driver",
                    "daemon",
                    "driver",
                    "driver-error"
                ]
            );
            for (v, a) in &advice {
                // Every command: `gpuloop --host gpu02 …`, `on gpu02: …`, or as root there.
                for cmd in ["gpuloop ", "systemctl ", "nvidia-smi ", "dmesg"] {
                    for (i, _) in a.match_indices(cmd) {
                        // The clause the command is in (since the last `;` or `(`).
                        let clause = a[..i].rsplit([';', '(']).next().unwrap_or_default();
                        assert!(
                            a[i..].starts_with("gpuloop --host gpu02 ")
                                || clause.contains("on gpu02"),
                            "{v} (sim {sim}): a bare {cmd:?} in {a:?}"
                        );
                    }
                }
            }
            assert!(
                advice[0].1.ends_with("(gpuloop --host gpu02 kill --gpu 0)"),
                "{}",
                advice[0].1
            );
        }
        // Read here, the advice is as it always was.
        let (_, a) = verdict(&facts(&held, &[], 100, true, false, 0), |_| false, |_| None);
        assert!(a.ends_with("(gpuloop kill --gpu 0)"), "{a}");
        assert_eq!(
            reset_advice(2, &Reach::default(), false),
            "gpuloop reset --gpu 2 (or, as root, nvidia-smi -r -i 2)"
        );
        assert_eq!(
            reset_advice(2, &Reach::default(), true),
            "gpuloop reset --gpu 2 (or gpuloop sim reset --gpu 2)"
        );
    }
}
