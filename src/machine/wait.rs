//! Waiting for GPUs to be clean, and clean: holders → kill → wait_clean → diagnose.

use super::kill::merge_kills;
use super::ops::{inventory, narrowed, Diagnose};
use super::{ActionError, Ask, Local, Op, Received};
use crate::hosts::protocol::{Call, WaitWire};
use crate::inspect::diagnose::Diagnosis;
use crate::inspect::holders::Inventory;
use crate::inspect::wait::{self, Dirty, WaitOpts, WaitOutcome};
use crate::inspect::{Filter, Resolved, Selection};
use crate::process::kill::{KillOpts, KillReport};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Waits until the selected GPUs are clean, or the options say to stop. With a pod or a
/// container in `filter`, until that scope's processes are gone from them and the memory they
/// held is back (`wait::Scoped`, found here when the wait begins).
#[derive(Debug, Clone)]
pub(crate) struct WaitClean {
    pub sel: Selection,
    pub opts: WaitOpts,
    /// No warning at the timeout: for commands that report what is left themselves.
    pub quiet: bool,
    pub filter: Filter,
}

impl Ask for WaitClean {
    type Reply = WaitOutcome;
    fn call(&self) -> Call {
        Call::WaitClean {
            sel: self.sel.clone(),
            filter: self.filter.clone(),
            wait: WaitWire::from(&self.opts),
        }
    }
    fn takes(&self) -> Option<Duration> {
        Some(self.opts.longest())
    }
}

impl Op for WaitClean {
    fn here(&self, m: &mut Local) -> Result<WaitOutcome, ActionError> {
        // A scoped wait starts from the look that found its scope.
        let (sel, opts, mut known) = match self.filter.is_scoped() || self.filter.mig.is_some() {
            false => (self.sel.clone(), self.opts.clone(), None),
            true => {
                let inv = inventory(m.s, &self.sel)?;
                let resolved = self.filter.resolve_on(&inv)?;
                let (sel, opts) = scoped(&inv, &self.sel, &resolved, &self.opts);
                (sel, opts, Some(inv))
            }
        };
        let outcome = m.wait_from(&sel, &opts, &mut known)?;
        if self.quiet {
            return Ok(outcome);
        }
        let Some(why) = why_not_clean(&outcome, &self.opts) else {
            return Ok(outcome);
        };
        crate::errln!("warning: GPUs {why}:");
        let all = Diagnose {
            sel,
            filter: self.filter.only_mig(),
        };
        if let Ok(ds) = all.here(m) {
            for d in ds.iter().filter(|d| !d.is_clean_under(&self.opts.demand())) {
                crate::errln!("  {}", describe_diagnosis(d));
            }
        }
        Ok(outcome)
    }
}

/// A pod's or a container's wait: the GPUs of the selection its processes use, and the wait
/// for them (`wait::Scoped`), from one look taken now, before anything of it is gone.
fn scoped(
    inv: &Inventory,
    sel: &Selection,
    resolved: &Resolved,
    opts: &WaitOpts,
) -> (Selection, WaitOpts) {
    let sel = narrowed(inv, sel, resolved);
    let opts = WaitOpts {
        instances: resolved.instances.clone(),
        scoped: resolved
            .within
            .clone()
            .map(|w| wait::Scoped::of(inv, &sel, w)),
        ..opts.clone()
    };
    (sel, opts)
}

impl Received for WaitOutcome {
    fn received_from(&mut self, _: &str) {}
}

/// Stops the compute holders of a selection, waits until clean, and diagnoses what is left:
/// `gpuloop clean` in one operation. With a filter, its holders are stopped; with a job,
/// only the GPUs its holders used are verified.
#[derive(Debug, Clone)]
pub(crate) struct Clean {
    pub sel: Selection,
    pub filter: Filter,
    pub kill: KillOpts,
    pub wait: WaitOpts,
}

impl Ask for Clean {
    type Reply = CleanReport;
    fn call(&self) -> Call {
        Call::Clean {
            sel: self.sel.clone(),
            filter: self.filter.clone(),
            kill: (&self.kill).into(),
            wait: WaitWire::from(&self.wait),
        }
    }
    fn takes(&self) -> Option<Duration> {
        // Each round of --parents is a kill of its own.
        let kills = if self.kill.parents {
            self.kill.grace.checked_mul(1 + RESTART_ROUNDS)?
        } else {
            self.kill.grace
        };
        self.wait
            .longest()
            .checked_add(kills)?
            .checked_add(RESTART_WATCH)?
            .checked_add(Duration::from_secs(10))
    }
}

impl Op for Clean {
    fn here(&self, m: &mut Local) -> Result<CleanReport, ActionError> {
        let s = m.s;
        if let Some(why) = s.backend()?.missing_driver() {
            return Err(crate::gpu::GpuError::NoDriver(why.to_string()).into());
        }
        // Like diagnose and wait: with --user, --mine or --job, the GPUs verified are those
        // the filtered holders use (what else holds them is reported, and keeps them not
        // clean). With --pod or --container, what is waited for is that scope's memory:
        // another pod on the same GPU is reported and left alone.
        // One look at the machine before anything is signalled: what narrows the selection
        // is what the kill stops, and the wait after it re-reads only what is in question.
        // The filter is resolved once, here: every round stops what is left of the pod or the
        // container this look found.
        let inv = inventory(s, &self.sel)?;
        let resolved = self.filter.resolve_on(&inv)?;
        let (sel, scoped) = scoped(&inv, &self.sel, &resolved, &self.wait);
        // With no KILL ever, the wait below is the one that waits for them, until its timeout.
        let kill_opts = KillOpts {
            wait_forever: false,
            ..self.kill.clone()
        };
        let mut kill = m.kill_holders_in(inv.clone(), &sel, &self.filter, &resolved, &kill_opts)?;
        let mut known = Some(inv);
        let waited = std::time::Instant::now();
        // One timeout for the whole wait, however many rounds it takes.
        let deadline = waited.checked_add(self.wait.timeout);
        let mut rounds = 0;
        let (outcome, wait_opts) = loop {
            let mut wait_opts = scoped.clone();
            if let Some(deadline) = deadline {
                wait_opts.timeout = deadline.saturating_duration_since(std::time::Instant::now());
            }
            // What survived the kill may still be on its way out: no early stop while it lives.
            wait_opts
                .exiting
                .extend(kill.survivors.iter().map(|&p| p as i32));
            // --parents stops the parents that have shown they restart; the others it left
            // running are watched a while, so that one that does restart shows it now.
            if self.kill.parents && kill.restarters.iter().any(|r| r.shown.is_none()) {
                wait_opts.settle = wait_opts.settle.max(RESTART_WATCH);
            }
            // Interrupted during the grace: stop here, the caller reports what was signalled.
            // Otherwise what is left is in the report: no warning that says it a second time.
            if kill.interrupted {
                break (WaitOutcome::Interrupted, wait_opts);
            }
            let outcome = m.wait_from(&sel, &wait_opts, &mut known)?;
            // A parent seen starting its holder again has shown it restarts: with --parents,
            // stopped now with the holder it started, and the wait goes on.
            if !(self.kill.parents
                && rounds < RESTART_ROUNDS
                && matches!(outcome, WaitOutcome::Respawned(_)))
            {
                break (outcome, wait_opts);
            }
            rounds += 1;
            let inv = inventory(s, &sel)?;
            kill.then(m.kill_holders_in(inv.clone(), &sel, &self.filter, &resolved, &kill_opts)?);
            known = Some(inv);
        };
        let wait_ms = waited.elapsed().as_millis() as i64;
        // What is left: once clean, the wait's last look read again (the driver's lists and
        // the processes it knew), or a whole look where it found something new; when not
        // clean, always a whole look, to name whatever holds the GPU now.
        let backend = s.backend()?;
        let last = match known {
            Some(k) if outcome.is_clean() => {
                k.refreshed(backend, s.protected(), s.container_roots())?
            }
            _ => None,
        };
        let last = match last {
            Some(inv) => inv,
            None => inventory(s, &sel)?,
        };
        let after = super::ops::diagnose_in(s, last, &sel, &self.filter.only_mig())?;
        let settle_ms = wait_opts.settle.as_millis() as i64;
        // Memory back is not enough where the GPU's own faults ask for a reset or a reboot.
        let fit = after.iter().all(|d| !d.verdict.needs_action());
        Ok(CleanReport {
            clean: outcome.is_clean() && fit,
            released_ms: outcome.is_clean().then(|| (wait_ms - settle_ms).max(0)),
            settle_ms,
            kill,
            outcome,
            wait_ms,
            after,
        })
    }
}

/// How long `clean --parents` watches the live parents it left running (none has shown it
/// restarts) for a holder started again: a shell loop, a supervisor or systemd
/// (`RestartSec=100ms`) restarts within it, and one that does is then stopped.
pub(crate) const RESTART_WATCH: Duration = Duration::from_secs(1);

/// How many times `clean --parents` stops a parent seen restarting and waits again.
const RESTART_ROUNDS: u32 = 3;

/// `gpuloop clean` and `cleanup`'s first rung: holders → kill → wait_clean → diagnose.
/// Its JSON (`clean --json`, the MCP tool `clean`, the agent's reply) is
/// `{clean, kill, wait_ms, gpus}`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct CleanReport {
    pub clean: bool,
    pub kill: KillReport,
    /// Not in the JSON: read back as clean or not from `clean`.
    #[serde(skip, default = "not_clean")]
    pub outcome: WaitOutcome,
    /// The whole wait after the kill, the settle time included.
    pub wait_ms: i64,
    /// When clean: how long the memory took to come back after the kill. The wait then
    /// watched for `settle_ms` more (it ends at the first look past that, within one poll),
    /// so this is `wait_ms - settle_ms`, to one poll interval.
    #[serde(default)]
    pub released_ms: Option<i64>,
    /// How long it was watched after it read clean (`--settle`).
    #[serde(default)]
    pub settle_ms: i64,
    /// What diagnose() says of each selected GPU afterwards.
    #[serde(rename = "gpus")]
    pub after: Vec<Diagnosis>,
}

fn not_clean() -> WaitOutcome {
    WaitOutcome::TimedOut
}

impl Received for CleanReport {
    fn received_from(&mut self, host: &str) {
        if self.clean {
            self.outcome = WaitOutcome::Clean;
        }
        self.after.received_from(host);
    }
}

impl Local<'_> {
    /// wait_clean here, with this call's progress and stop flag.
    pub(crate) fn wait(
        &mut self,
        sel: &Selection,
        opts: &WaitOpts,
    ) -> Result<WaitOutcome, ActionError> {
        self.wait_from(sel, opts, &mut None)
    }

    /// wait_clean here from the last look at this machine (`known`: see `wait_clean`), which
    /// holds the wait's last look afterwards.
    pub(crate) fn wait_from(
        &mut self,
        sel: &Selection,
        opts: &WaitOpts,
        known: &mut Option<Inventory>,
    ) -> Result<WaitOutcome, ActionError> {
        let s = self.s;
        let of = opts.timeout.as_secs_f64();
        // The restarters this session's kills found: a holder they start again ends the wait.
        let mut opts = opts.clone();
        opts.restarters.extend(s.restarters());
        let show = &mut self.watch.show;
        let outcome = wait::wait_clean(
            s.backend()?,
            sel,
            &opts,
            s.protected(),
            s.container_roots(),
            self.watch.stop,
            known,
            |dirty: &Dirty, elapsed: Duration| {
                show(&format!(
                    "waiting: {}, {:.1} s of {of:.0} s",
                    describe_dirty(dirty),
                    elapsed.as_secs_f64()
                ))
            },
        );
        match &outcome {
            Ok(WaitOutcome::NoDriver(_)) => s.warn_no_driver(),
            // Remembered on this machine, so a later gpuloop's diagnose still names it.
            Ok(WaitOutcome::Respawned(r)) => s.note_restarted(crate::process::restart::remember(r)),
            _ => {}
        }
        Ok(outcome?)
    }
}

/// Why an outcome is not clean, for a warning; `None` when there is nothing to say (clean,
/// interrupted, or a zero-timeout question).
pub(crate) fn why_not_clean(outcome: &WaitOutcome, opts: &WaitOpts) -> Option<String> {
    Some(match outcome {
        WaitOutcome::TimedOut if !opts.timeout.is_zero() => {
            format!("not clean after {:.1}s", opts.timeout.as_secs_f64())
        }
        WaitOutcome::Stalled => format!(
            "not clean: nothing holds the memory left and it has not moved for {:.1}s, so waiting longer cannot help",
            opts.stall.as_secs_f64()
        ),
        WaitOutcome::Respawned(r) => format!("not clean: {}", r.restarted()),
        WaitOutcome::Unsettled => format!(
            "not clean: it read clean, then something came back within the {:.1}s settle time",
            opts.settle.as_secs_f64()
        ),
        _ => return None,
    })
}

/// "GPU 2 [daemon] …", one line of a warning.
pub(crate) fn describe_diagnosis(d: &Diagnosis) -> String {
    // Advice quotes holders' names: shown as `crate::shown` says wherever this line goes.
    let advice = crate::shown::shown(&d.advice);
    match d.gpu {
        Some(_) => format!("GPU {} [{}] {advice}", d.target(), d.verdict),
        None => format!("[{}] {advice}", d.verdict),
    }
}

fn describe_dirty(dirty: &Dirty) -> String {
    dirty
        .iter()
        .map(|(g, mib, n)| match n {
            0 => format!("GPU {g} {mib} MiB"),
            n => format!(
                "GPU {g} {mib} MiB, {}",
                crate::words::count(*n, "holder", "holders")
            ),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// All hosts' outcomes as one: clean when every host is; an interrupt wins; else the first
/// host's reason for not being clean.
pub(crate) fn combine(outcomes: impl Iterator<Item = WaitOutcome>) -> WaitOutcome {
    let mut all = WaitOutcome::Clean;
    for o in outcomes {
        match o {
            WaitOutcome::Interrupted => return WaitOutcome::Interrupted,
            WaitOutcome::Clean => {}
            other if all.is_clean() => all = other,
            _ => {}
        }
    }
    all
}

/// One clean report from each host's (all clean only if every one is).
pub(crate) fn merge_clean(parts: Vec<(String, CleanReport)>, dry_run: bool) -> CleanReport {
    let kill = merge_kills(
        parts
            .iter()
            .map(|(h, c)| (h.clone(), c.kill.clone()))
            .collect(),
        dry_run,
    );
    let outcome = combine(parts.iter().map(|(_, c)| c.outcome.clone()));
    // A host whose memory came back may still have a GPU whose faults ask for a reset.
    let fit = parts.iter().all(|(_, c)| c.clean || !c.outcome.is_clean());
    let wait_ms = parts.iter().map(|(_, c)| c.wait_ms).max().unwrap_or(0);
    let released_ms = parts
        .iter()
        .map(|(_, c)| c.released_ms)
        .try_fold(0, |most, r| r.map(|r| most.max(r)));
    let settle_ms = parts.iter().map(|(_, c)| c.settle_ms).max().unwrap_or(0);
    CleanReport {
        kill,
        clean: outcome.is_clean() && fit,
        released_ms: released_ms.filter(|_| outcome.is_clean()),
        settle_ms,
        outcome,
        wait_ms,
        after: parts.into_iter().flat_map(|(_, c)| c.after).collect(),
    }
}
