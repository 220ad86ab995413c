//! Slurm policy: `gpuloop epilog` and `gpuloop prolog`, built from `machine`. Each stops what a
//! job left on its GPUs (never another running job's processes), verifies the memory is back,
//! and otherwise drains the node with a reason that says why, one syslog-style line per action.

pub(crate) mod scontrol;

use crate::exit::Exit;
use crate::gpu::mig::{MigKey, MigSel};
use crate::gpu::{GpuError, MIB};
use crate::inspect::diagnose::{Demand, Diagnosis};
use crate::inspect::holders::{Holder, Inventory};
use crate::inspect::wait::{WaitOpts, WaitOutcome};
use crate::machine::ops::{self, Diagnose};
use crate::machine::{self, ActionError, Local, Machine};
use crate::process::kill::KillOpts;
use crate::process::origin::job_id;
use crate::session::Session;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("{0}: run it as Slurm's Epilog=/Prolog=, which sets it (or set it by hand to try)")]
    NoJob(String),
    #[error("{0}")]
    BadEnv(String),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Action(#[from] ActionError),
}

/// diagnose() of this machine's GPUs `sel`, its MIG GPUs narrowed to the job's devices.
fn diagnose(s: &Session, sel: &JobSel) -> Result<Vec<Diagnosis>, ActionError> {
    let op = Diagnose {
        sel: Some(sel.gpus.clone()),
        filter: crate::inspect::Filter {
            mig: sel.mig_sels(),
            ..Default::default()
        },
    };
    Local::on_terminal(s, |m| m.ask(&op))
}

/// The job's GPUs on this machine: the driver's indices, and on a GPU in MIG mode the job's
/// MIG devices (`mig`), each a GPU of its own: the hook stops and verifies those alone, and
/// a sibling device's job is left to run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JobSel {
    pub gpus: Vec<i64>,
    pub mig: Vec<MigKey>,
}

impl JobSel {
    fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// The GPUs of a MIG device's parent are the job's only through its devices.
    fn mig_gpu(&self, g: i64) -> bool {
        self.mig.iter().any(|k| k.gpu == g)
    }

    /// Whether holder `h` is on the job's GPUs: a whole GPU of the job, or one of its MIG
    /// devices (a process of a MIG GPU that shows no device is on none of them).
    fn holds(&self, h: &Holder) -> bool {
        h.mig.iter().any(|k| self.mig.contains(k))
            || h.gpus
                .iter()
                .any(|g| self.gpus.contains(g) && !self.mig_gpu(*g))
    }

    fn mig_sels(&self) -> Option<Vec<MigSel>> {
        (!self.mig.is_empty()).then(|| {
            self.mig
                .iter()
                .map(|k| MigSel::Ids {
                    gpu: k.gpu,
                    gi: k.gi,
                    ci: Some(k.ci),
                })
                .collect()
        })
    }

    /// "0,2" or "0:7:0,1".
    fn describe(&self) -> String {
        let mut out: Vec<String> = self.mig.iter().map(ToString::to_string).collect();
        out.extend(
            self.gpus
                .iter()
                .filter(|g| !self.mig_gpu(**g))
                .map(i64::to_string),
        );
        out.join(",")
    }
}

/// Which hook is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    /// After a job: clean what it left.
    Epilog,
    /// Before a job: verify its GPUs, clean what belongs to no running job.
    Prolog,
}

impl Hook {
    fn name(self) -> &'static str {
        match self {
            Hook::Epilog => "epilog",
            Hook::Prolog => "prolog",
        }
    }
}

/// The job as Slurm describes it to a prolog or epilog through the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobEnv {
    pub job: i64,
    pub user: String,
    /// The job's GPUs as Slurm names them (`SLURM_JOB_GPUS`, else `CUDA_VISIBLE_DEVICES`).
    pub gpus: Vec<JobGpu>,
    pub node: String,
}

impl JobEnv {
    /// Reads the job from `var` (the process environment in real use).
    pub(crate) fn from(var: impl Fn(&str) -> Option<String>) -> Result<JobEnv, SlurmError> {
        let id = var("SLURM_JOB_ID")
            .filter(|v| !v.is_empty())
            .ok_or_else(|| SlurmError::NoJob("SLURM_JOB_ID is not set".into()))?;
        let job = job_id(&id).ok_or_else(|| {
            SlurmError::BadEnv(format!(
                "SLURM_JOB_ID={id:?} is not a job id (a positive decimal number)"
            ))
        })?;
        let list = var("SLURM_JOB_GPUS")
            .filter(|v| !v.trim().is_empty())
            .or_else(|| var("CUDA_VISIBLE_DEVICES"))
            .unwrap_or_default();
        let gpus = parse_gpus(&list)?;
        let node = var("SLURMD_NODENAME")
            .filter(|v| !v.is_empty())
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
            .map(|h| h.trim().to_string())
            .map(|h| h.split('.').next().unwrap_or_default().to_string())
            .unwrap_or_default();
        // The node is drained by this name: a hostlist (`n[1-100]`, `a,b`) would drain many.
        if !node.is_empty() && !is_node_name(&node) {
            return Err(SlurmError::BadEnv(format!(
                "node name {node:?} (SLURMD_NODENAME, else the hostname) is not one node's name: letters, digits, - and _ only; a hook drains only the node it runs on"
            )));
        }
        Ok(JobEnv {
            job,
            user: var("SLURM_JOB_USER").unwrap_or_default(),
            gpus,
            node,
        })
    }
}

/// One node's name, as slurm.conf's NodeName gives it: letters, digits, `-` and `_`,
/// starting with a letter or digit; never a hostlist expression.
pub(crate) fn is_node_name(s: &str) -> bool {
    s.len() <= 255
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One GPU of a job as Slurm's environment gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JobGpu {
    /// A number: the N of /dev/nvidiaN with the usual `File=/dev/nvidia[0-7]` (for a MIG
    /// device without a unique id, its parent's: the first file of its `MultipleFiles`).
    Minor(i64),
    /// A MIG device: `MIG-<uuid>` (gres/nvml with driver 470 and newer) or
    /// `MIG-GPU-<uuid>/GI/CI` (older drivers), as gres/nvml's unique id gives it.
    Mig(MigSel),
    /// A GPU's UUID (`GPU-…`).
    Uuid(String),
}

/// "0,1", "2", "MIG-5c3f…,MIG-GPU-…/7/0", "GPU-…" (empty: no GPUs); anything else is an
/// error.
fn parse_gpus(list: &str) -> Result<Vec<JobGpu>, SlurmError> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || {
            SlurmError::BadEnv(format!(
                "the job's GPU list {list:?} is not GPU numbers, MIG devices (MIG-…) or GPU UUIDs (SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES)"
            ))
        };
        // Only what Slurm writes: printable, no spaces, bounded.
        if part.len() > 128 || !part.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad());
        }
        let gpu = if part.bytes().all(|b| b.is_ascii_digit()) {
            JobGpu::Minor(part.parse().map_err(|_| bad())?)
        } else if part.len() > 4 && part[..4].eq_ignore_ascii_case("mig-") {
            JobGpu::Mig(MigSel::Uuid(part.to_string()))
        } else if part.len() > 4 && part[..4].eq_ignore_ascii_case("gpu-") {
            JobGpu::Uuid(part.to_string())
        } else {
            return Err(bad());
        };
        out.push(gpu);
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub(crate) struct HookOpts {
    pub timeout: Duration,
    pub grace: Duration,
    pub dry_run: bool,
}

/// Writes one syslog-style line per action to stderr (which slurmd keeps in its log).
pub(crate) struct Log {
    tag: String,
}

impl Log {
    fn new(hook: Hook, env: &JobEnv) -> Log {
        Log {
            tag: format!(
                "gpuloop-{}[{}]: job={} user={}",
                hook.name(),
                std::process::id(),
                env.job,
                if env.user.is_empty() { "?" } else { &env.user }
            ),
        }
    }

    /// One line of the hook's log: what it quotes (a holder's name, its user) shown as
    /// `crate::shown` says, so a line stays one line in slurmd's log.
    fn line(&self, msg: &str) {
        crate::errln!(
            "{}: {}",
            crate::shown::shown(&self.tag),
            crate::shown::shown(msg)
        );
    }
}

/// Runs the hook; returns the exit code: 0 clean, 1 not clean (the node was drained).
pub(crate) fn run(
    s: &Session,
    hook: Hook,
    env: &JobEnv,
    opts: &HookOpts,
) -> Result<Exit, SlurmError> {
    let started = Instant::now();
    let log = Log::new(hook, env);
    // Nothing can be verified without the driver: the node is not fit for GPU jobs.
    if let Some(why) = s.backend()?.missing_driver() {
        let reason = truncate(
            format!("gpuloop: no NVIDIA driver job={}: {why}", env.job),
            255,
        );
        return drain(&log, env, opts, &reason);
    }
    let inv = ops::inventory(s, &None)?;
    let running = scontrol::running_jobs(&env.node);
    if running.is_none() {
        log.line("squeue failed: every other job is taken as running");
    }
    let sel = match job_gpus(&inv, env, &running, &log) {
        Ok(sel) => sel,
        Err(reason) => return drain(&log, env, opts, &reason),
    };
    // A CPU-only job, or a Slurm without GPU gres: its own processes are still stopped, but
    // no GPU is checked, and the log must not read as if one had been.
    if sel.is_empty() && env.gpus.is_empty() {
        log.line("no GPUs known for the job (SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES unset or empty): stopping its own processes, checking no GPU");
    } else if sel.is_empty() {
        log.line("the job's GPUs name no device gpuloop can tell (MIG gres by number, and none of its processes on a MIG device): stopping its own processes, checking no GPU");
    }
    let targets = choose_targets(&inv, hook, env, &sel, &running, &log);
    let stubborn = stop_targets(s, &targets, opts, &log);
    let wopts = WaitOpts {
        timeout: opts.timeout,
        exiting: stubborn.iter().map(|&p| p as i32).collect(),
        // On a MIG GPU, the job's devices alone: a sibling device's job keeps it in use.
        instances: (!sel.mig.is_empty()).then(|| sel.mig.clone()),
        ..WaitOpts::default()
    };
    // The dry run, the wait and the drain reason judge the GPUs alike.
    let demand = wopts.demand();
    if opts.dry_run {
        say_what_would_be_done(s, &sel, &targets, &demand, env, &log)?;
        return Ok(Exit::Success);
    }
    let outcome = if sel.is_empty() {
        WaitOutcome::Clean
    } else {
        // Through the machine's wait, as any front end's: a holder that a restarter its kill
        // found starts again ends the wait (respawning) instead of running it to the timeout.
        Local::on_terminal(s, |m| m.wait(&Some(sel.gpus.clone()), &wopts))?
    };
    if outcome == WaitOutcome::Clean && stubborn.is_empty() {
        say_clean(&sel, started, &log);
        return Ok(Exit::Success);
    }
    let why = drain_reason(s, &sel, &demand, &stubborn, env)?;
    drain(&log, env, opts, &why)
}

/// The driver's indices of the job's GPUs and its MIG devices, or the drain reason where
/// one is missing. A MIG gres without a unique id (a gres.conf with `MultipleFiles=`) is
/// numbered by its index among the node's gres, which names no device: on a node with a GPU
/// in MIG mode, a number that is not a GPU outside MIG mode stands for the MIG devices the
/// job's own processes hold.
fn job_gpus(
    inv: &Inventory,
    env: &JobEnv,
    running: &Option<BTreeSet<i64>>,
    log: &Log,
) -> Result<JobSel, String> {
    let missing = |what: String| {
        truncate(
            format!(
                "gpuloop: {what} of job {} missing ({} GPUs seen)",
                env.job,
                inv.gpus.len()
            ),
            255,
        )
    };
    let devices: Vec<crate::gpu::mig::MigDevice> = inv.mig_devices().cloned().collect();
    let mig_node = inv
        .gpus
        .iter()
        .any(|g| g.mig.as_ref().is_some_and(|m| m.enabled()));
    let mut sel = JobSel::default();
    let add = |sel: &mut JobSel, g: i64| {
        if !sel.gpus.contains(&g) {
            sel.gpus.push(g);
        }
    };
    for j in &env.gpus {
        match j {
            // Slurm's numbers are device minors (the gres's index, which is the minor with
            // the usual `File=/dev/nvidia[0-7]`); the driver's indices can differ.
            JobGpu::Minor(n) => {
                let g = inv.gpus.iter().find(|g| g.minor == *n);
                match g {
                    Some(g) if !g.mig.as_ref().is_some_and(|m| m.enabled()) => {
                        add(&mut sel, g.index)
                    }
                    // A GPU in MIG mode, or no GPU of that minor on a node with one: a MIG
                    // gres without a unique id, numbered by its index among the node's gres,
                    // which names no device.
                    _ if mig_node => {
                        // A process's job is what its environment says, which its owner can
                        // write: a device that a process of another running job holds is that
                        // job's (a MIG device is one job's at a time), never this one's.
                        let others_running = |j: i64| {
                            j != env.job && running.as_ref().is_none_or(|r| r.contains(&j))
                        };
                        let theirs: BTreeSet<MigKey> = inv
                            .holders
                            .iter()
                            .filter(|h| h.origin.job.is_some_and(others_running))
                            .flat_map(|h| h.mig.iter().copied())
                            .collect();
                        let mine: BTreeSet<MigKey> = inv
                            .holders
                            .iter()
                            .filter(|h| h.origin.job == Some(env.job))
                            .flat_map(|h| h.mig.iter().copied())
                            .filter(|k| !theirs.contains(k))
                            .collect();
                        log.line(&format!(
                            "GPU {n} of the job is a MIG gres that Slurm names by its number, which names no MIG device: the job's are those its own processes hold ({})",
                            match mine.is_empty() {
                                true => "none".to_string(),
                                false => mine.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                            }
                        ));
                        for k in mine {
                            if !sel.mig.contains(&k) {
                                sel.mig.push(k);
                            }
                            add(&mut sel, k.gpu);
                        }
                    }
                    _ => return Err(missing(format!("GPU {n}"))),
                }
            }
            JobGpu::Uuid(u) => {
                let Some(g) = inv
                    .gpus
                    .iter()
                    .find(|g| !g.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(u))
                else {
                    return Err(missing(format!("GPU {u}")));
                };
                add(&mut sel, g.index);
            }
            JobGpu::Mig(m) => {
                let Ok(keys) = m.resolve(&devices, &inv.gpus) else {
                    return Err(missing(format!("MIG device {m}")));
                };
                // A UUID names one device: a prefix that fits several is not the job's.
                if keys.len() != 1 {
                    return Err(missing(format!("MIG device {m}")));
                }
                for k in keys {
                    if !sel.mig.contains(&k) {
                        sel.mig.push(k);
                    }
                    add(&mut sel, k.gpu);
                }
            }
        }
    }
    Ok(sel)
}

/// The holders the hook stops (never another running job's, never a unit's main process);
/// each one left alone on the job's GPUs is logged with why.
fn choose_targets(
    inv: &Inventory,
    hook: Hook,
    env: &JobEnv,
    sel: &JobSel,
    running: &Option<BTreeSet<i64>>,
    log: &Log,
) -> Vec<Holder> {
    let others_running =
        |job: i64| job != env.job && running.as_ref().is_none_or(|r| r.contains(&job));
    let on_sel = |h: &Holder| sel.holds(h);
    // A process of a MIG GPU of the job that is on none of the job's devices: another
    // job's device beside it (named, and left alone), or one that shows no device.
    let beside = |h: &Holder| h.gpus.iter().any(|g| sel.mig_gpu(*g)) && !on_sel(h);
    let mut targets = Vec::new();
    for h in inv.holders(&None, false) {
        let mine = h.origin.job == Some(env.job);
        let take = match hook {
            // The finished job's processes anywhere, and strays on its GPUs.
            Hook::Epilog => mine || (on_sel(&h) && !h.origin.job.is_some_and(others_running)),
            // Strays on the starting job's GPUs; the job's own processes may be starting.
            Hook::Prolog => !mine && on_sel(&h) && !h.origin.job.is_some_and(others_running),
        };
        let take = take && (mine || !beside(&h));
        if !take {
            if on_sel(&h) {
                log.line(&format!("leaving {} alone: {}", who(&h), whose(&h)));
            } else if beside(&h) {
                let on = match h.mig.is_empty() {
                    true => "it shows no MIG device of its own".to_string(),
                    false => format!(
                        "its MIG device {} is not the job's",
                        h.mig
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                };
                log.line(&format!("leaving {} alone: {}; {on}", who(&h), whose(&h)));
            }
            continue;
        }
        if h.origin.service_main && h.origin.job.is_none() {
            let unit = h.origin.service.as_deref().unwrap_or("?");
            log.line(&format!(
                "leaving {} alone: main process of systemd unit {unit} (systemctl stop {unit})",
                who(&h)
            ));
            continue;
        }
        targets.push(h);
    }
    targets
}

/// Logs each target, then (unless a dry run) stops them all; returns the pids that survived.
fn stop_targets(s: &Session, targets: &[Holder], opts: &HookOpts, log: &Log) -> Vec<i64> {
    let kill_opts = KillOpts {
        grace: opts.grace,
        dry_run: opts.dry_run,
        why: targets
            .iter()
            .map(|h| {
                let why = format!("{}; {}", machine::holder_why(h), whose(h));
                (h.pid as i32, why)
            })
            .collect(),
        // With --grace inf, what is still exiting is waited for below, until --timeout.
        wait_forever: false,
        ..KillOpts::default()
    };
    for h in targets {
        log.line(&format!(
            "{} {} ({}, {})",
            if opts.dry_run {
                "would stop"
            } else {
                "stopping"
            },
            who(h),
            whose(h),
            lineage(h)
        ));
    }
    let mut stubborn = Vec::new();
    if !targets.is_empty() && !opts.dry_run {
        let targets = machine::holder_targets(targets);
        let r = Local::on_terminal(s, |m| m.kill(&targets, &kill_opts));
        log.line(&format!(
            "signalled {}, {} exited, {} survived, in {} ms",
            crate::words::count(r.signalled.len(), "process", "processes"),
            r.exited.len(),
            r.survivors.len(),
            r.elapsed_ms
        ));
        for sk in r.skipped.iter().filter(|sk| !sk.is_gone()) {
            log.line(&format!("skipped pid {}: {}", sk.pid, sk.reason));
        }
        for e in &r.errors {
            log.line(&format!("could not stop pid {}: {}", e.pid, e.error));
        }
        stubborn = r.survivors;
    }
    stubborn
}

/// A dry run's last line: nothing to do, the drain it would make, or the wait it would make.
fn say_what_would_be_done(
    s: &Session,
    sel: &JobSel,
    targets: &[Holder],
    demand: &Demand,
    env: &JobEnv,
    log: &Log,
) -> Result<(), SlurmError> {
    let ds = diagnose(s, sel)?;
    let dirty: Vec<&Diagnosis> = ds.iter().filter(|d| !d.is_clean_under(demand)).collect();
    match dirty.first() {
        None if sel.is_empty() => log.line("no GPU checked: nothing to do"),
        None => log.line("GPUs clean: nothing to do"),
        Some(d) if targets.is_empty() => log.line(&format!(
            "would drain node {}: {}",
            env.node,
            reason(d, env.job)
        )),
        Some(_) => log.line("would wait for the memory, and drain the node if it stays used"),
    }
    Ok(())
}

/// The line of a hook that left the job's GPUs clean.
fn say_clean(sel: &JobSel, started: Instant, log: &Log) {
    if sel.is_empty() {
        log.line(&format!(
            "done in {:.2} s; no GPU checked",
            started.elapsed().as_secs_f64()
        ));
    } else {
        log.line(&format!(
            "GPUs {} clean in {:.2} s",
            sel.describe(),
            started.elapsed().as_secs_f64()
        ));
    }
}

/// Why the node is drained: the first GPU still not clean, or the processes that survived KILL.
fn drain_reason(
    s: &Session,
    sel: &JobSel,
    demand: &Demand,
    stubborn: &[i64],
    env: &JobEnv,
) -> Result<String, SlurmError> {
    let ds = diagnose(s, sel)?;
    Ok(match ds.iter().find(|d| !d.is_clean_under(demand)) {
        Some(d) => reason(d, env.job),
        None => format!(
            "gpuloop: job={} pid={} survived SIGKILL",
            env.job,
            join(stubborn)
        ),
    })
}

fn drain(log: &Log, env: &JobEnv, opts: &HookOpts, reason: &str) -> Result<Exit, SlurmError> {
    if opts.dry_run {
        log.line(&format!("would drain node {}: {reason}", env.node));
        return Ok(Exit::Success);
    }
    match scontrol::drain(&env.node, reason) {
        Ok(()) => log.line(&format!("drained node {}: {reason}", env.node)),
        Err(e) => log.line(&format!(
            "could not drain node {} ({e}); exiting 1 so Slurm drains it: {reason}",
            env.node
        )),
    }
    Ok(Exit::Failure)
}

/// The drain reason: under 256 characters, starting with `gpuloop:`, naming the GPU, the
/// memory, the verdict and the pid/job, e.g. `gpuloop: GPU 2 75GiB orphaned job=812 pid=4711`.
pub(crate) fn reason(d: &Diagnosis, job: i64) -> String {
    let mem = if d.mem_used_mib >= 1024 {
        format!("{}GiB", d.mem_used_mib / 1024)
    } else {
        format!("{}MiB", d.mem_used_mib)
    };
    // A MIG device by its place and the start of its UUID: "GPU 0:7:0 (MIG-246523ad)".
    let gpu = match &d.mig {
        Some(m) => format!(
            "{} ({})",
            d.target(),
            m.uuid.get(..12).unwrap_or(m.uuid.as_str())
        ),
        None => d.target(),
    };
    let mut s = format!("gpuloop: GPU {gpu} {mem} {}", d.verdict);
    let jobs: BTreeSet<i64> = d.holders.iter().filter_map(|h| h.origin.job).collect();
    let jobs: Vec<i64> = if jobs.is_empty() {
        vec![job]
    } else {
        jobs.into_iter().collect()
    };
    s.push_str(&format!(" job={}", join(&jobs)));
    if !d.holders.is_empty() {
        let pids: Vec<i64> = d.holders.iter().map(|h| h.pid).collect();
        s.push_str(&format!(" pid={}", join(&pids)));
    } else if !d.ghost_pids.is_empty() {
        s.push_str(&format!(" ghost={}", join(&d.ghost_pids)));
    }
    truncate(s, 255)
}

/// `s` in at most `max` bytes, its controls escaped first (`crate::shown`), so that the cut
/// counts them.
fn truncate(s: String, max: usize) -> String {
    let mut s = crate::shown::shown(&s).to_string();
    if s.len() > max {
        let mut cut = max - 3;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn join(xs: &[i64]) -> String {
    xs.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn who(h: &Holder) -> String {
    let on = match h.mig.is_empty() {
        true => join(&h.gpus),
        false => h
            .mig
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    };
    format!("pid {} ({}) on GPU {on} {}MiB", h.pid, h.name, h.mem / MIB)
}

fn whose(h: &Holder) -> String {
    match h.origin.job {
        Some(j) => format!("job {j} of {}", h.user),
        None => format!("no job, user {}", h.user),
    }
}

fn lineage(h: &Holder) -> String {
    match (&h.origin.launcher, h.origin.reparented) {
        (_, true) => format!("reparented to {} {}: orphaned", h.ppid, h.origin.ppid_comm),
        (Some(l), false) => format!("launched by {} ({})", l.pid, l.name),
        (None, false) => format!("parent {} {}", h.ppid, h.origin.ppid_comm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<JobEnv, SlurmError> {
        JobEnv::from(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn job_env_from_slurm_variables() {
        let e = env(&[
            ("SLURM_JOB_ID", "812"),
            ("SLURM_JOB_USER", "alice"),
            ("SLURM_JOB_GPUS", "2,3"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("SLURMD_NODENAME", "gpu07.cluster"),
        ])
        .unwrap();
        assert_eq!(
            e,
            JobEnv {
                job: 812,
                user: "alice".into(),
                gpus: vec![JobGpu::Minor(2), JobGpu::Minor(3)],
                node: "gpu07".into()
            }
        );
        let e = env(&[("SLURM_JOB_ID", "9"), ("CUDA_VISIBLE_DEVICES", "1")]).unwrap();
        assert_eq!(e.gpus, vec![JobGpu::Minor(1)]);
        assert!(env(&[("SLURM_JOB_ID", "9")]).unwrap().gpus.is_empty());
        assert!(matches!(env(&[]), Err(SlurmError::NoJob(_))));
        assert!(matches!(
            env(&[("SLURM_JOB_ID", "x")]),
            Err(SlurmError::BadEnv(_))
        ));
        for bad in ["0,x", "-1", "GPU 0", "MIG", "0:7:0"] {
            assert!(
                matches!(
                    env(&[("SLURM_JOB_ID", "9"), ("SLURM_JOB_GPUS", bad)]),
                    Err(SlurmError::BadEnv(_))
                ),
                "{bad}"
            );
        }
    }

    /// The bug: a MIG device in the job's GPU list failed the epilog ("is not GPU
    /// numbers"), which drained every MIG node after every job.
    #[test]
    fn mig_devices_in_the_jobs_gpu_list_are_read_in_every_form_slurm_writes() {
        let e = env(&[
            ("SLURM_JOB_ID", "9"),
            (
                "SLURM_JOB_GPUS",
                "MIG-246523ad-0007-4000-9000-00007fb4ca38,MIG-GPU-5c3f0b6e-1111-2222-3333-444455556666/7/0",
            ),
        ])
        .unwrap();
        assert_eq!(
            e.gpus,
            vec![
                JobGpu::Mig(MigSel::Uuid(
                    "MIG-246523ad-0007-4000-9000-00007fb4ca38".into()
                )),
                JobGpu::Mig(MigSel::Uuid(
                    "MIG-GPU-5c3f0b6e-1111-2222-3333-444455556666/7/0".into()
                ))
            ]
        );
        let e = env(&[
            ("SLURM_JOB_ID", "9"),
            ("CUDA_VISIBLE_DEVICES", "GPU-5c3f0b6e-1111"),
        ])
        .unwrap();
        assert_eq!(e.gpus, vec![JobGpu::Uuid("GPU-5c3f0b6e-1111".into())]);
    }

    /// `SLURMD_NODENAME='n[1-100]'` reached `scontrol update nodename=n[1-100] state=drain`,
    /// which drains a hundred nodes.
    #[test]
    fn a_hostlist_as_the_node_name_is_refused() {
        for bad in ["n[1-100]", "a,b", "n 1", "-n1", "n1=x", "n\t1"] {
            let e = env(&[("SLURM_JOB_ID", "9"), ("SLURMD_NODENAME", bad)]);
            assert!(matches!(e, Err(SlurmError::BadEnv(_))), "{bad:?}: {e:?}");
        }
        for good in ["gpu07", "node-1_a", "n1.cluster.org"] {
            assert!(env(&[("SLURM_JOB_ID", "9"), ("SLURMD_NODENAME", good)]).is_ok());
        }
    }

    /// `SLURM_JOB_ID` of -1, 0 or +812 was taken as a job.
    #[test]
    fn only_a_positive_decimal_job_id_is_a_job() {
        for bad in [
            "-1",
            "0",
            "+812",
            "0x32c",
            "8 12",
            "",
            "99999999999999999999",
        ] {
            assert_eq!(job_id(bad), None, "{bad:?}");
            let e = env(&[("SLURM_JOB_ID", bad)]);
            assert!(e.is_err(), "{bad:?}");
        }
        assert_eq!(job_id("812"), Some(812));
        assert_eq!(job_id(" 812\n"), Some(812));
    }

    #[test]
    fn drain_reasons_are_short_and_name_the_culprit() {
        let d = Diagnosis {
            gpu: Some(2),
            mem_used: 76_800 * MIB,
            mem_used_mib: 76_800,
            holders: vec![],
            daemons: vec![],
            footprint: vec![],
            ghost_pids: vec![],
            verdict: crate::inspect::diagnose::Verdict::Driver,
            advice: String::new(),
            host: "local".into(),
            faults: None,
            blockers: Vec::new(),
            mig: None,
        };
        assert_eq!(reason(&d, 812), "gpuloop: GPU 2 75GiB driver job=812");
        let long = truncate("x".repeat(400), 255);
        assert_eq!(long.len(), 255);
    }
}
