//! wait_clean(): poll until the selected GPUs are free, returning within one poll of the release,
//! early when waiting cannot help, and (with `settle`) only once a restart would have shown.

use super::diagnose::Demand;
use super::holders::Inventory;
use super::Selection;
use crate::gpu::{Backend, GpuError, MIB};
use crate::process::container::Within;
use crate::process::restart::{self, Restarter};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub(crate) use crate::seconds::{seconds, MAX_SECS};

#[derive(Debug, Clone)]
pub(crate) struct WaitOpts {
    pub timeout: Duration,
    pub max_used_mib: i64,
    pub poll: Duration,
    /// Demand `max_used_mib` even where the rest is what protected daemons keep or the CUDA
    /// footprint of other GPUs' jobs.
    pub strict: bool,
    /// Keep watching this long after it reads clean: a new compute holder makes it not clean.
    pub settle: Duration,
    /// Stop early when nothing holds the memory left and it has not moved for this long
    /// (zero: never stop early).
    pub stall: Duration,
    /// Pids signalled and still alive: while one lives, memory may still be on its way out.
    pub exiting: Vec<i32>,
    /// Parents known to restart holders (from the last kill): a holder they start ends the wait.
    pub restarters: Vec<Restarter>,
    /// A pod's or a container's wait (`--pod`, `--container`): for its processes to leave the
    /// GPUs and the memory they held to come back, whatever else uses those GPUs.
    pub scoped: Option<Scoped>,
    /// The MIG devices the selection is narrowed to (`--gpu 0:7:0`): only these of a GPU in
    /// MIG mode are waited for, each judged on its own memory and holders; a sibling device
    /// held by another job leaves the wait clean.
    pub instances: Option<Vec<crate::gpu::mig::MigKey>>,
}

/// What the wait of a pod or a container waits for: none of its processes left on the GPUs,
/// and each GPU's memory down by what the driver attributed to them when the wait began.
/// What else uses those GPUs (another pod) is left to be, and does not make them dirty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Scoped {
    pub within: Within,
    /// Per GPU: the MiB used once the scope's memory is back (what was used less what the
    /// driver attributed to the scope's processes).
    pub floor_mib: BTreeMap<i64, i64>,
}

impl Scoped {
    /// The scope's share of the selected GPUs, from the inventory taken before anything was
    /// stopped.
    pub(crate) fn of(inv: &Inventory, sel: &Selection, within: Within) -> Scoped {
        let floor_mib = inv
            .gpus
            .iter()
            .filter(|g| super::selected(sel, g.index))
            .map(|g| {
                let held: i64 = inv
                    .holders(&Some(vec![g.index]), false)
                    .iter()
                    .filter(|h| within.holds_place(&h.origin.place))
                    .map(|h| h.mem_mib)
                    .sum();
                (g.index, (g.mem_used_mib - held).max(0))
            })
            .collect();
        Scoped { within, floor_mib }
    }

    /// The most a GPU may use and count as clean for the scope.
    fn allows(&self, gpu: i64, max_used_mib: i64) -> i64 {
        self.floor_mib.get(&gpu).copied().unwrap_or(0) + max_used_mib
    }
}
impl WaitOpts {
    /// The longest a wait with these options runs: its timeout, then a settle watch begun just
    /// before it, and one poll.
    pub(crate) fn longest(&self) -> Duration {
        self.timeout
            .saturating_add(self.settle)
            .saturating_add(self.poll)
    }

    /// What these options demand of a clean GPU.
    pub(crate) fn demand(&self) -> Demand {
        Demand {
            strict: self.strict,
            max_used_mib: self.max_used_mib,
        }
    }
}

impl Default for WaitOpts {
    fn default() -> Self {
        WaitOpts {
            timeout: Duration::from_secs(30),
            max_used_mib: 0,
            poll: Duration::from_millis(20),
            strict: false,
            settle: Duration::ZERO,
            stall: Duration::from_secs(1),
            exiting: Vec::new(),
            restarters: Vec::new(),
            scoped: None,
            instances: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WaitOutcome {
    Clean,
    TimedOut,
    Interrupted,
    /// Nothing holds the memory left, nothing is exiting, and it stopped moving.
    Stalled,
    /// A holder came back, started by a parent of one that was stopped.
    Respawned(Restarter),
    /// It read clean, then a compute holder or memory came back within `settle`.
    Unsettled,
    /// No driver: nothing can be verified.
    NoDriver(String),
}

impl WaitOutcome {
    pub(crate) fn is_clean(&self) -> bool {
        *self == WaitOutcome::Clean
    }
}

/// What is still dirty at one poll: (GPU index, MiB used, compute holders).
pub(crate) type Dirty = Vec<(i64, i64, usize)>;

/// How often the /proc scan is repeated while memory sits still (it is also taken whenever
/// memory moves or reads clean).
const RESCAN: Duration = Duration::from_millis(250);

/// One judgement of the selection from an inventory.
struct Judgement {
    dirty: Dirty,
    respawned: Option<Restarter>,
}

fn judge(inv: &Inventory, indices: &[i64], opts: &WaitOpts) -> Judgement {
    let demand = opts.demand();
    let mut dirty = Dirty::new();
    let mut respawned = None;
    for g in inv.gpus.iter().filter(|g| indices.contains(&g.index)) {
        let on = inv.on_gpu(g);
        if respawned.is_none() {
            respawned = on
                .holders
                .iter()
                .find_map(|h| restart::started_by(h.pid as i32, &opts.restarters))
                .cloned();
        }
        if let Some(sc) = &opts.scoped {
            // A scope's wait: its own processes and memory only.
            let inside = on
                .holders
                .iter()
                .filter(|h| sc.within.holds_place(&h.origin.place))
                .count();
            let used = g.mem_used_mib > sc.allows(g.index, opts.max_used_mib);
            if !on.memory_known || inside > 0 || used {
                dirty.push((g.index, g.mem_used_mib, inside));
            }
            continue;
        }
        // A GPU in MIG mode: each of its MIG devices (those the selection names) on its own.
        let devices = g.mig_devices();
        if !devices.is_empty() {
            let whole = opts.instances.is_none();
            for d in devices {
                if opts
                    .instances
                    .as_ref()
                    .is_some_and(|i| !i.contains(&d.key()))
                {
                    continue;
                }
                let on = inv.on_instance(g, d, whole);
                if !on.usage().is_clean(&demand) {
                    dirty.push((g.index, d.mem_used_mib, on.holders.len()));
                }
            }
            continue;
        }
        // The same judgement as diagnose()'s (a GPU the driver could not read is never clean).
        if !on.usage().is_clean(&demand) {
            dirty.push((g.index, g.mem_used_mib, on.holders.len()));
        }
    }
    Judgement { dirty, respawned }
}

/// Polls memory (cheap) every `poll`; a look at the holders runs only when memory reads clean
/// or moves, and every `RESCAN` while it sits still, so the hot loop costs one driver query.
///
/// `known` is the last look, in and out: given one (what a kill just stopped), a look is the
/// driver's lists and those processes read again (`Inventory::refreshed`), and a look at every
/// process is taken only when the driver lists a pid not seen before, before the wait says
/// that nothing holds memory that stays used (a process the first look could not know, such
/// as a child forked since, may hold it), and before it says a GPU went dirty again while
/// settling (a holder started again, whose context is not in the driver's lists yet). Without
/// one, the first look is a whole one. On return it holds the last look, for the caller's
/// report.
#[allow(clippy::too_many_arguments)]
pub(crate) fn wait_clean(
    backend: &dyn Backend,
    sel: &Selection,
    opts: &WaitOpts,
    protected: &[String],
    roots: &crate::process::container::Roots,
    interrupted: &AtomicBool,
    known: &mut Option<Inventory>,
    mut progress: impl FnMut(&Dirty, Duration),
) -> Result<WaitOutcome, GpuError> {
    if let Some(why) = backend.missing_driver() {
        return Ok(WaitOutcome::NoDriver(why.to_string()));
    }
    let started = Instant::now();
    let deadline = started + opts.timeout;
    // The GPUs to check the selection against: the last look's, or the driver's list (its
    // indices and memory only: utilisation and temperature are not needed here).
    let listed = match known.as_ref() {
        Some(k) => k.gpus.clone(),
        None => backend.inventory_gpus()?,
    };
    let indices: Vec<i64> = match sel {
        Some(s) => {
            super::check_selection(sel, &listed)?;
            s.clone()
        }
        None => listed.iter().map(|g| g.index).collect(),
    };
    let mut polls = 0u64;
    let mut last_used: Option<Vec<(i64, i64)>> = None;
    let mut moved_at = started;
    // The last judgement, when its look was taken, and whether that look was a whole one.
    let mut scanned: Option<(Instant, Judgement, bool)> = None;
    let look = |known: &mut Option<Inventory>, whole: bool| -> Result<bool, GpuError> {
        let again = match (whole, known.as_ref()) {
            (false, Some(k)) => k.refreshed(backend, protected, roots)?,
            _ => None,
        };
        let (inv, whole) = match again {
            Some(inv) => (inv, false),
            None => (Inventory::take(backend, protected, roots)?, true),
        };
        *known = Some(inv);
        Ok(whole)
    };
    let mut clean_since: Option<Instant> = None;
    loop {
        polls += 1;
        let used = backend.mem_used(&indices)?;
        let now = Instant::now();
        let moved = last_used.as_ref() != Some(&used);
        if moved {
            moved_at = now;
            last_used = Some(used.clone());
        }
        // A wait for MIG devices reads their parent's memory here, which sibling devices
        // share: it rescans when that moves, and judges each device's own from the look.
        let mem_dirty = opts.instances.is_some()
            || used.iter().any(|&(g, b)| {
                let allowed = match &opts.scoped {
                    Some(sc) => sc.allows(g, opts.max_used_mib),
                    None => opts.max_used_mib,
                };
                b / MIB > allowed
            });
        // Memory reading clean is confirmed at once; while settling it is re-checked as when
        // dirty: at once when memory moves, else every RESCAN.
        let rescan = (!mem_dirty && clean_since.is_none())
            || moved
            || scanned
                .as_ref()
                .is_none_or(|(at, _, _)| now.duration_since(*at) >= RESCAN);
        if rescan {
            let whole = look(known, false)?;
            let inv = known.as_ref().expect("a look was just taken");
            scanned = Some((now, judge(inv, &indices, opts), whole));
        }
        let Some((_, j, whole)) = scanned.as_ref() else {
            continue;
        };
        if let Some(r) = &j.respawned {
            return Ok(WaitOutcome::Respawned(r.clone()));
        }
        if j.dirty.is_empty() {
            let since = *clean_since.get_or_insert(now);
            if now.duration_since(since) >= opts.settle {
                tracing::debug!(
                    "wait_clean: clean after {}, {:.1} ms, done at {:.1} ms",
                    crate::words::count(polls as usize, "poll", "polls"),
                    started.elapsed().as_secs_f64() * 1e3,
                    crate::timeline::ms()
                );
                return Ok(WaitOutcome::Clean);
            }
        } else if clean_since.is_some() {
            if !*whole {
                // Dirty again while settling: before saying so, look at every process, so
                // that a holder started again (not yet in the driver's lists: a context being
                // made) is found, and who started it (a respawn).
                let whole = look(known, true)?;
                let inv = known.as_ref().expect("a look was just taken");
                scanned = Some((now, judge(inv, &indices, opts), whole));
                continue;
            }
            tracing::debug!("wait_clean: dirty again while settling: {:?}", j.dirty);
            return Ok(WaitOutcome::Unsettled);
        } else {
            // Nobody left to wait for: no compute holder on a dirty GPU, nothing exiting.
            let unheld = j.dirty.iter().all(|d| d.2 == 0)
                && !opts.exiting.iter().any(|&p| crate::process::alive(p));
            if unheld && !opts.stall.is_zero() && now.duration_since(moved_at) >= opts.stall {
                if !*whole {
                    // Only the known processes were read: look at every one before saying
                    // that nothing holds it.
                    let whole = look(known, true)?;
                    let inv = known.as_ref().expect("a look was just taken");
                    scanned = Some((now, judge(inv, &indices, opts), whole));
                    continue;
                }
                tracing::debug!(
                    "wait_clean: nothing holds {:?} and it has not moved for {:?}",
                    j.dirty,
                    opts.stall
                );
                return Ok(WaitOutcome::Stalled);
            }
        }
        if clean_since.is_none() {
            tracing::trace!("wait_clean: poll {polls}: still dirty {:?}", j.dirty);
            progress(&j.dirty, now - started);
            if now >= deadline {
                return Ok(WaitOutcome::TimedOut);
            }
        }
        if interrupted.load(Ordering::Relaxed) {
            return Ok(WaitOutcome::Interrupted);
        }
        let next = if clean_since.is_some() {
            opts.poll
        } else {
            opts.poll.min(deadline.saturating_duration_since(now))
        };
        std::thread::sleep(next);
    }
}
