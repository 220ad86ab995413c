//! The operations that scripts and the one-shot commands share, wired to a session:
//! the bindings and the CLI both call these, so `gpuloop clean` and a script behave alike.

use crate::gpu::{Gpu, GpuError};
use crate::inspect::diagnose::{self, diagnose, Diagnosis};
use crate::inspect::holders::{Holder, Inventory};
use crate::inspect::select::{self, Selector};
use crate::inspect::wait::{self, Dirty, WaitOpts, WaitOutcome};
use crate::inspect::{check_selection, Filter, Selection};
use crate::process::kill::{self, KillOpts, KillReport, Skipped, Target};
use crate::session::Session;
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub fn gpus(s: &Session) -> Result<Vec<Gpu>, GpuError> {
    s.warn_no_driver();
    s.backend()?.gpus()
}

pub fn gpu(s: &Session, index: i64) -> Result<Gpu, GpuError> {
    let gpus = gpus(s)?;
    let count = gpus.len();
    gpus.into_iter()
        .find(|g| g.index == index)
        .ok_or(GpuError::NoSuchGpu { index, count })
}

pub fn inventory(s: &Session, sel: &Selection) -> Result<Inventory, GpuError> {
    // The /proc scan runs while the driver loads: a one-shot pays for the slower, not both.
    let inv = Inventory::take_while_loading(&s.device_nodes(), || s.backend(), s.protected())?;
    s.warn_no_driver();
    check_selection(sel, &inv.gpus)?;
    Ok(inv)
}

/// The GPU indices that selectors (`0`, `0-3`, `GPU-0fb0…`, a bus id) name. The GPU list is
/// read only when a UUID or bus id needs it.
pub fn select(s: &Session, sels: &[Selector]) -> Result<Vec<i64>, GpuError> {
    let gpus = if sels.iter().all(|x| matches!(x, Selector::Index(_))) {
        Vec::new()
    } else {
        gpus(s)?
    };
    select::resolve(sels, &gpus)
}

pub fn holders(s: &Session, sel: &Selection, all: bool) -> Result<Vec<Holder>, GpuError> {
    Ok(inventory(s, sel)?.holders(sel, all))
}

/// Holders as `holders`, narrowed by a filter: one owner (`--user`, `--mine`), one Slurm job
/// (`--job`).
pub fn holders_of(
    s: &Session,
    sel: &Selection,
    all: bool,
    filter: &Filter,
) -> Result<Vec<Holder>, GpuError> {
    holders_and_unreadable(s, sel, all, filter).map(|(hs, _)| hs)
}

/// `holders_of`, and how many processes could not be inspected (other users', without
/// root): holders among them are missing from the list, which the caller should say.
pub fn holders_and_unreadable(
    s: &Session,
    sel: &Selection,
    all: bool,
    filter: &Filter,
) -> Result<(Vec<Holder>, usize), GpuError> {
    let inv = inventory(s, sel)?;
    let mut hs = inv.holders(sel, all);
    hs.retain(|h| filter.matches(h));
    Ok((hs, inv.unreadable))
}

pub fn diagnoses(s: &Session, sel: &Selection) -> Result<Vec<Diagnosis>, GpuError> {
    diagnoses_of(s, sel, &Filter::default())
}

/// diagnose() of the selected GPUs; with a filter, only of those its holders use.
pub fn diagnoses_of(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
) -> Result<Vec<Diagnosis>, GpuError> {
    let backend = s.backend()?;
    if let Some(why) = backend.missing_driver() {
        return Ok(diagnose::no_driver(sel, why));
    }
    let inv = inventory(s, sel)?;
    let sel = narrowed(&inv, sel, filter);
    let restarters = s.restarters();
    let ctx = diagnose::Context {
        foreign_ns: backend.foreign_pid_namespace(),
        restarters: &restarters,
    };
    let mut ds = diagnose(&inv, &sel, &ctx);
    // The simulator's GPUs are reset by gpuloop itself, not by nvidia-smi.
    if backend.kind() == "sim" {
        for d in &mut ds {
            if let Some(gpu) = d.gpu {
                d.advice = d.advice.replace(
                    &format!("(or, as root, nvidia-smi -r -i {gpu})"),
                    &format!("(or gpuloop sim reset --gpu {gpu})"),
                );
            }
        }
    }
    Ok(ds)
}

/// The selection cut down to the GPUs that the filtered holders use.
fn narrowed(inv: &Inventory, sel: &Selection, filter: &Filter) -> Selection {
    // An owner's processes share GPUs with others'; a job's GPUs are its own.
    if filter.job.is_none() {
        return sel.clone();
    }
    let mut gpus: Vec<i64> = inv
        .holders(sel, false)
        .iter()
        .filter(|h| filter.matches(h))
        .flat_map(|h| h.gpus.clone())
        .filter(|g| crate::inspect::selected(sel, *g))
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    Some(gpus)
}

/// How a long action (kill's grace, a wait, a clean) shows progress and learns it must stop:
/// a line on a terminal and Ctrl-C for the CLI and scripts; progress notifications and a
/// per-call flag for the MCP server.
pub struct Watch<'a> {
    pub stop: &'a AtomicBool,
    pub show: &'a mut dyn FnMut(&str),
}

/// Runs `f` with the terminal's watch: a progress line on stderr (when it is a terminal),
/// cleared afterwards, and Ctrl-C.
fn on_terminal<T>(s: &Session, f: impl FnOnce(&mut Watch) -> T) -> T {
    let mut line = Progress::new(std::io::stderr().is_terminal());
    let out = f(&mut Watch {
        stop: s.interrupted(),
        show: &mut |text| line.show(text),
    });
    line.clear();
    out
}

pub fn kill(s: &Session, targets: &[Target], opts: &KillOpts) -> KillReport {
    on_terminal(s, |w| kill_watched(s, targets, opts, w))
}

/// kill() with the caller's progress and stop flag (it ends the grace early).
pub fn kill_watched(s: &Session, targets: &[Target], opts: &KillOpts, w: &mut Watch) -> KillReport {
    let report = kill::kill_with_progress(
        targets,
        opts,
        s.protected(),
        w.stop,
        &mut |left, all, kill_in| {
            (w.show)(&match kill_in {
                Some(t) => format!(
                    "waiting for {left} of {all} to exit, KILL in {:.1} s",
                    t.as_secs_f64()
                ),
                None => format!("waiting for {left} of {all} to exit"),
            })
        },
    );
    // Later waits and diagnoses watch for the restarters it found.
    s.note_restarters(&report.restarters);
    report
}

/// Stops every compute holder of the selection (narrowed by `filter`), each pinned by its
/// identity; the report says which GPUs each held. A systemd unit's main process is left
/// alone unless `force`: systemd would only restart it. With `force`, the protected daemons
/// of the selection are stopped too (issue 11, item 2: as `kill(holders(sel, #{all: true}),
/// #{force: true})` does), never mere observers.
pub fn kill_holders(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    opts: &KillOpts,
) -> Result<KillReport, GpuError> {
    on_terminal(s, |w| kill_holders_watched(s, sel, filter, opts, w))
}

/// kill_holders() with the caller's progress and stop flag.
pub fn kill_holders_watched(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    opts: &KillOpts,
    w: &mut Watch,
) -> Result<KillReport, GpuError> {
    let mut hs = holders_of(s, sel, opts.force, filter)?;
    hs.retain(|h| h.is_compute() || h.protected);
    let (units, hs): (Vec<Holder>, Vec<Holder>) = hs
        .into_iter()
        .partition(|h| h.origin.service_main && h.origin.job.is_none() && !opts.force);
    let mut report = kill_watched(s, &holder_targets(&hs), opts, w);
    for t in &mut report.targets {
        if let Some(h) = hs.iter().find(|h| h.pid == t.pid) {
            t.gpus.clone_from(&h.gpus);
        }
    }
    for h in units {
        let unit = h.origin.service.as_deref().unwrap_or("its unit");
        report.skipped.push(Skipped {
            pid: h.pid,
            reason: format!(
                "main process of systemd unit {unit}, which would restart it: systemctl stop {unit} (or --force)"
            ),
        });
    }
    Ok(report)
}

/// Each holder as a kill target pinned by its identity.
pub fn holder_targets(holders: &[Holder]) -> Vec<Target> {
    holders
        .iter()
        .map(|h| {
            Target::Exact(crate::process::Identity {
                pid: h.pid as i32,
                start: h.start as u64,
                ino: h.pidfs_ino.map(|i| i as u64),
            })
        })
        .collect()
}

/// One line of live progress on a terminal's stderr, rewritten in place.
struct Progress {
    tty: bool,
    shown: bool,
}

impl Progress {
    fn new(tty: bool) -> Progress {
        Progress { tty, shown: false }
    }

    fn show(&mut self, text: &str) {
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{text}");
            let _ = err.flush();
            self.shown = true;
        }
    }

    fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[2K");
            self.shown = false;
        }
    }
}

/// wait_clean with a live one-line progress on a terminal and, at the timeout, what is left
/// logged as diagnose() says it.
pub fn wait_clean(s: &Session, sel: &Selection, opts: &WaitOpts) -> Result<WaitOutcome, GpuError> {
    let outcome = wait_quietly(s, sel, opts)?;
    let Some(why) = why_not_clean(&outcome, opts) else {
        return Ok(outcome);
    };
    eprintln!("warning: GPUs {why}:");
    if let Ok(ds) = diagnoses(s, sel) {
        for d in ds.iter().filter(|d| !d.is_clean()) {
            eprintln!("  {}", describe_diagnosis(d));
        }
    }
    Ok(outcome)
}

/// Why a wait that did not read clean ended, as "not clean …"; `None` when it is clean,
/// was interrupted, or asked with a zero timeout ("is it clean now?": the answer is the value).
pub fn why_not_clean(outcome: &WaitOutcome, opts: &WaitOpts) -> Option<String> {
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
pub fn describe_diagnosis(d: &Diagnosis) -> String {
    match d.gpu {
        Some(g) => format!("GPU {g} [{}] {}", d.verdict, d.advice),
        None => format!("[{}] {}", d.verdict, d.advice),
    }
}

/// wait_clean with its progress line but no log at the timeout, for commands that report
/// what is left themselves.
pub fn wait_quietly(
    s: &Session,
    sel: &Selection,
    opts: &WaitOpts,
) -> Result<WaitOutcome, GpuError> {
    on_terminal(s, |w| wait_watched(s, sel, opts, w))
}

/// wait_clean with the caller's progress and stop flag.
pub fn wait_watched(
    s: &Session,
    sel: &Selection,
    opts: &WaitOpts,
    w: &mut Watch,
) -> Result<WaitOutcome, GpuError> {
    let of = opts.timeout.as_secs_f64();
    // The restarters this session's kills found: a holder they start again ends the wait.
    let mut opts = opts.clone();
    opts.restarters.extend(s.restarters());
    let outcome = wait::wait_clean(
        s.backend()?,
        sel,
        &opts,
        s.protected(),
        w.stop,
        |dirty: &Dirty, elapsed: Duration| {
            (w.show)(&format!(
                "waiting: {}, {:.1} s of {of:.0} s",
                describe_dirty(dirty),
                elapsed.as_secs_f64()
            ))
        },
    );
    if matches!(outcome, Ok(WaitOutcome::NoDriver(_))) {
        s.warn_no_driver();
    }
    outcome
}

fn describe_dirty(dirty: &Dirty) -> String {
    dirty
        .iter()
        .map(|(g, mib, n)| match n {
            0 => format!("GPU {g} {mib} MiB"),
            n => format!("GPU {g} {mib} MiB, {n} holder(s)"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `gpuloop clean` and `cleanup`'s first rung: holders → kill → wait_clean → diagnose.
/// Its JSON (`clean --json`, the MCP tool `clean`) is `{clean, kill, wait_ms, gpus}`.
#[derive(Debug, Serialize)]
pub struct CleanReport {
    pub clean: bool,
    pub kill: KillReport,
    #[serde(skip)]
    pub outcome: WaitOutcome,
    /// How long the memory took to come back after the kill (the whole wait).
    pub wait_ms: i64,
    /// What diagnose() says of each selected GPU afterwards.
    #[serde(rename = "gpus")]
    pub after: Vec<Diagnosis>,
}

/// With a filter, its holders are stopped and the GPUs they used verified.
pub fn clean(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    kill_opts: &KillOpts,
    wait_opts: &WaitOpts,
) -> Result<CleanReport, GpuError> {
    on_terminal(s, |w| {
        clean_watched(s, sel, filter, kill_opts, wait_opts, w)
    })
}

/// clean() with the caller's progress and stop flag.
pub fn clean_watched(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    kill_opts: &KillOpts,
    wait_opts: &WaitOpts,
    w: &mut Watch,
) -> Result<CleanReport, GpuError> {
    if let Some(why) = s.backend()?.missing_driver() {
        return Err(GpuError::NoDriver(why.to_string()));
    }
    let sel = &narrowed(&inventory(s, sel)?, sel, filter);
    let kill = kill_holders_watched(s, sel, filter, kill_opts, w)?;
    let waited = std::time::Instant::now();
    let mut wait_opts = wait_opts.clone();
    // What survived the kill may still be on its way out: no early stop while it lives.
    wait_opts
        .exiting
        .extend(kill.survivors.iter().map(|&p| p as i32));
    // Interrupted during the grace: stop here, the caller reports what was signalled.
    // Otherwise what is left is in the report: no warning that says it a second time.
    // diagnose() knows the restarters this kill found: a holder they started again reads
    // "respawning".
    let outcome = if kill.interrupted {
        WaitOutcome::Interrupted
    } else {
        wait_watched(s, sel, &wait_opts, w)?
    };
    let wait_ms = waited.elapsed().as_millis() as i64;
    let after = diagnoses(s, sel)?;
    Ok(CleanReport {
        clean: outcome.is_clean(),
        kill,
        outcome,
        wait_ms,
        after,
    })
}
