//! `gpuloop reset`: whether a reset can work and what blocks it (`--dry-run`), or stop what
//! may be stopped, reset, verify that the GPU came back, and start again through systemd the
//! daemons it stopped, each step reported.

use super::ops::{inventory, read_faults};
use super::{ActionError, Ask, Local, Op, Received};
use crate::gpu::GpuError;
use crate::hosts::protocol::Call;
use crate::inspect::reset::{
    cannot_reset, Blocker, BlockerKind, Readiness, ResetReport, Step, StepKind, Stop,
};
use crate::process::kill::{KillOpts, Target};
use crate::process::Identity;
use std::time::{Duration, Instant};

/// A reset of some GPUs of one machine, one after the other.
#[derive(Debug, Clone)]
pub(crate) struct Reset {
    pub gpus: Vec<i64>,
    /// Only say what blocks it.
    pub dry_run: bool,
    /// Also stop protected daemons and units' main processes.
    pub force: bool,
    /// Between TERM and KILL, for the processes it signals.
    pub grace: Duration,
    /// How long the GPU may take to come back.
    pub timeout: Duration,
    /// MIG devices (`--gpu N:GI:CI`, `MIG-…`): with `dry_run`, what blocks destroying or
    /// reconfiguring each; gpuloop never destroys or resets one.
    pub mig: Option<Vec<crate::gpu::mig::MigSel>>,
}

impl Ask for Reset {
    type Reply = Vec<ResetReport>;
    fn call(&self) -> Call {
        Call::Reset {
            gpus: self.gpus.clone(),
            dry_run: self.dry_run,
            force: self.force,
            grace_ms: self.grace.as_millis() as u64,
            timeout_ms: self.timeout.as_millis() as u64,
            mig: self.mig.clone(),
        }
    }
    fn takes(&self) -> Option<Duration> {
        // Per GPU: the grace, systemd's stops and starts, the reset, and the wait after it.
        let one = self
            .grace
            .checked_add(self.timeout)?
            .checked_add(Duration::from_secs(120))?;
        one.checked_mul(self.gpus.len().max(1) as u32)
    }
}

impl Op for Reset {
    fn here(&self, m: &mut Local) -> Result<Vec<ResetReport>, ActionError> {
        m.s.require_driver()?;
        if let Some(sels) = &self.mig {
            return self.mig_devices(m, sels);
        }
        // Every GPU named must exist before anything is stopped.
        inventory(m.s, &Some(self.gpus.clone()))?;
        self.gpus.iter().map(|&g| self.one(m, g)).collect()
    }
}

impl Received for Vec<ResetReport> {
    fn received_from(&mut self, host: &str) {
        for r in self {
            r.host = host.to_string();
            for b in &mut r.blockers {
                b.host = host.to_string();
            }
        }
    }
}

/// What becomes of a daemon gpuloop stopped, once the GPU is reset. Only a service manager
/// knows how a daemon is started: its command line, environment and executable are its own
/// to have written (any user can name a process `nvidia-persistenced`), so none of them is
/// ever run.
enum Again {
    /// A systemd system unit, the one systemd named as the stopped process's (`MainPID`):
    /// `systemctl start` it.
    Unit(String),
    /// Not started again: a daemon outside any system unit. `detail` says so, and what it
    /// ran, for a person to start it as it was started.
    Not { target: String, detail: String },
}

impl Reset {
    /// What blocks destroying or reconfiguring each MIG device `sels` name (`--dry-run`
    /// only: a MIG device is made and destroyed by mig-parted or `nvidia-smi mig`, never by
    /// gpuloop, and a reset is of a whole GPU).
    fn mig_devices(
        &self,
        m: &mut Local,
        sels: &[crate::gpu::mig::MigSel],
    ) -> Result<Vec<ResetReport>, ActionError> {
        let list = sels
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        if !self.dry_run {
            return Err(ActionError::Usage(format!(
                "reset --gpu {list}: gpuloop does not reset, destroy or re-create a MIG device; --dry-run names what would block destroying or reconfiguring it (mig-parted, nvidia-smi mig); a reset is of a whole GPU (--gpu N, with every MIG device on it idle)"
            )));
        }
        let s = m.s;
        let backend = s.backend()?;
        let inv = inventory(s, &None)?;
        let filter = crate::inspect::Filter {
            mig: Some(sels.to_vec()),
            ..crate::inspect::Filter::default()
        };
        let keys = filter.resolve_on(&inv)?.instances.unwrap_or_default();
        let readiness = Readiness::look(backend, s.protected(), s.container_roots());
        // GPUs named whole beside the MIG devices (`--gpu 1,0:7:0`) get a GPU's report.
        let whole: Vec<i64> = self
            .gpus
            .iter()
            .copied()
            .filter(|g| !keys.iter().any(|k| k.gpu == *g))
            .collect();
        let mut out: Vec<ResetReport> = keys
            .iter()
            .map(|k| {
                let blockers = readiness.blockers_of_instance(&inv, k);
                ResetReport {
                    gpu: k.gpu,
                    uuid: inv
                        .mig_devices()
                        .find(|d| d.key() == *k)
                        .map(|d| d.uuid.clone())
                        .unwrap_or_default(),
                    dry_run: true,
                    ok: blockers.is_empty(),
                    blockers,
                    steps: Vec::new(),
                    reset: false,
                    verified: false,
                    host: crate::local::local(),
                    mig: Some(*k),
                    cannot: None,
                }
            })
            .collect();
        for g in whole {
            out.push(self.one(m, g)?);
        }
        Ok(out)
    }

    fn one(&self, m: &mut Local, gpu: i64) -> Result<ResetReport, ActionError> {
        let s = m.s;
        let backend = s.backend()?;
        let one = Some(vec![gpu]);
        let mut inv = inventory(s, &one)?;
        // Whether a reset can work at all is known before anything is stopped.
        read_faults(s, backend, &mut inv.gpus, &one);
        let cannot = inv
            .gpus
            .iter()
            .find(|g| g.index == gpu)
            .and_then(cannot_reset);
        let uuid = backend
            .gpus()?
            .into_iter()
            .find(|g| g.index == gpu)
            .map(|g| g.uuid)
            .unwrap_or_default();
        let blockers =
            Readiness::look(backend, s.protected(), s.container_roots()).blockers(&inv, gpu);
        let mut r = ResetReport {
            gpu,
            uuid,
            dry_run: self.dry_run,
            cannot: cannot.clone(),
            blockers: blockers.clone(),
            steps: Vec::new(),
            reset: false,
            verified: false,
            ok: false,
            host: crate::local::local(),
            mig: None,
        };
        if self.dry_run {
            r.ok = blockers.is_empty() && cannot.is_none();
            return Ok(r);
        }
        if let Some(why) = cannot {
            r.steps.push(step(
                StepKind::Refuse,
                format!("GPU {gpu}"),
                false,
                format!("nothing stopped: {why}"),
            ));
            return Ok(r);
        }
        // Nothing is stopped when something that may not be stopped would still block it.
        let refused: Vec<&Blocker> = blockers
            .iter()
            .filter(|b| b.stop == Stop::Unload || (b.needs_force() && !self.force))
            .collect();
        if !refused.is_empty() {
            for b in refused {
                let why = match b.stop {
                    Stop::Unload => format!("a kernel module: unload it yourself ({})", b.how),
                    _ if b.protected => {
                        format!("a protected GPU daemon: --force stops it ({})", b.how)
                    }
                    _ => format!(
                        "a systemd unit's main process: --force stops the unit ({})",
                        b.how
                    ),
                };
                r.steps.push(step(StepKind::Refuse, b.label(), false, why));
            }
            return Ok(r);
        }
        let again = self.stop_all(m, &blockers, &mut r.steps);
        // Something may have opened the GPU meanwhile (a restarted exporter).
        let inv = inventory(s, &Some(vec![gpu]))?;
        let left = Readiness::look(backend, s.protected(), s.container_roots()).blockers(&inv, gpu);
        if !left.is_empty() {
            let who = left
                .iter()
                .map(Blocker::label)
                .collect::<Vec<_>>()
                .join(", ");
            r.steps.push(step(
                StepKind::Refuse,
                format!("GPU {gpu}"),
                false,
                format!("not reset: still in use by {who}"),
            ));
        } else {
            match backend.reset(gpu, &crate::process::helpers::output) {
                Ok(()) => {
                    r.reset = true;
                    r.steps.push(step(
                        StepKind::Reset,
                        format!("GPU {gpu}"),
                        true,
                        "done".into(),
                    ));
                }
                Err(e) => {
                    let why = match e {
                        GpuError::Reset { why, .. } => why,
                        e => e.to_string(),
                    };
                    r.steps
                        .push(step(StepKind::Reset, format!("GPU {gpu}"), false, why));
                }
            }
        }
        if r.reset {
            let (ok, detail) = self.verify(m, gpu, &r.uuid);
            r.verified = ok;
            r.steps
                .push(step(StepKind::Verify, format!("GPU {gpu}"), ok, detail));
        }
        let mut restarted = true;
        for a in again {
            let (target, ok, detail) = match a {
                Again::Unit(unit) => {
                    let (ok, detail) = systemctl("start", &unit);
                    (unit, ok, detail)
                }
                Again::Not { target, detail } => (target, false, detail),
            };
            restarted &= ok;
            r.steps.push(step(StepKind::Restart, target, ok, detail));
        }
        r.ok = r.reset && r.verified && restarted;
        Ok(r)
    }

    /// Stops every blocker: units through systemd, MPS through its control daemon, the rest
    /// by signal (all at once, one shared grace). Returns what becomes of the daemons it
    /// stopped.
    fn stop_all(&self, m: &mut Local, blockers: &[Blocker], steps: &mut Vec<Step>) -> Vec<Again> {
        let mut again = Vec::new();
        let mut signal = Vec::new();
        // The control daemon starts its servers on demand: a server is not started again
        // where its control daemon is.
        let mps_control = blockers
            .iter()
            .any(|b| b.kind == BlockerKind::Mps && b.cmdline.contains("nvidia-cuda-mps-control"));
        for b in blockers {
            if b.pid.is_none() {
                continue;
            }
            // A daemon's kind is proven (`process::daemon`): a name alone makes none.
            let restartable = b.kind.is_daemon()
                && !(mps_control
                    && b.kind == BlockerKind::Mps
                    && !b.cmdline.contains("nvidia-cuda-mps-control"));
            match (&b.stop, &b.service) {
                // A system unit's (`stop_of` gives a user's unit a signal).
                (Stop::Unit, Some(unit)) => {
                    let (ok, detail) = systemctl("stop", unit);
                    steps.push(step(StepKind::Stop, b.label(), ok, detail));
                    if ok {
                        again.push(Again::Unit(unit.clone()));
                    }
                    continue;
                }
                (Stop::MpsQuit, _) => {
                    if let Ok(detail) = mps_quit() {
                        steps.push(step(StepKind::Stop, b.label(), true, detail));
                        if restartable {
                            again.push(not_again(b));
                        }
                        continue;
                    }
                    // No control daemon to ask (or it did not answer): its signal, below.
                }
                _ => {}
            }
            let (Some(pid), Some(start)) = (b.pid, b.start) else {
                continue;
            };
            let Ok(pid32) = i32::try_from(pid) else {
                continue;
            };
            signal.push((
                b,
                Target::Exact(Identity {
                    pid: pid32,
                    start: start as u64,
                    ino: b.pidfs_ino.map(|i| i as u64),
                }),
                restartable,
            ));
        }
        if signal.is_empty() {
            return again;
        }
        let targets: Vec<Target> = signal.iter().map(|(_, t, _)| *t).collect();
        let opts = KillOpts {
            grace: self.grace,
            tree: false,
            // Protected ones are here only with --force.
            force: self.force,
            why: signal
                .iter()
                .filter_map(|(b, _, _)| {
                    Some((
                        i32::try_from(b.pid?).ok()?,
                        "blocks a GPU reset".to_string(),
                    ))
                })
                .collect(),
            ..KillOpts::default()
        };
        let report = m.kill(&targets, &opts);
        for (b, _, restartable) in signal {
            let pid = b.pid.unwrap_or_default();
            let gone = report.exited.contains(&pid)
                || report.skipped.iter().any(|k| k.pid == pid && k.is_gone());
            let detail = if gone {
                "exited".to_string()
            } else if let Some(k) = report.skipped.iter().find(|k| k.pid == pid) {
                format!("not signalled: {}", k.reason)
            } else if let Some(e) = report.errors.iter().find(|e| e.pid == pid) {
                e.error.clone()
            } else {
                "still running".to_string()
            };
            steps.push(step(StepKind::Stop, b.label(), gone, detail));
            if gone && restartable {
                again.push(not_again(b));
            }
        }
        again
    }

    /// Waits until the GPU answers with its UUID and 0 MiB used, or the timeout.
    fn verify(&self, m: &Local, gpu: i64, uuid: &str) -> (bool, String) {
        let backend = match m.s.backend() {
            Ok(b) => b,
            Err(e) => return (false, e.to_string()),
        };
        let until = Instant::now() + self.timeout;
        loop {
            let last;
            match backend.gpus() {
                Ok(gs) => match gs.into_iter().find(|g| g.index == gpu) {
                    Some(g) => match &g.error {
                        Some(e) => last = format!("it does not answer: {e}"),
                        None if !uuid.is_empty() && g.uuid != uuid => {
                            last = format!("another GPU answers at index {gpu}: {}", g.uuid)
                        }
                        None if g.mem_used_mib > 0 => {
                            last = format!("{} answers, {} MiB used", g.uuid, g.mem_used_mib)
                        }
                        None => return (true, format!("{} answers, 0 MiB used", g.uuid)),
                    },
                    None => last = format!("no GPU {gpu} any more"),
                },
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= until || m.watch.stop.load(std::sync::atomic::Ordering::SeqCst) {
                return (
                    false,
                    format!("after {:.1} s: {last}", self.timeout.as_secs_f64()),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn step(action: StepKind, target: String, ok: bool, detail: String) -> Step {
    Step {
        action,
        target,
        ok,
        detail,
    }
}

/// A daemon stopped outside any system unit: not started again; the step says what it ran,
/// for a person to start it as it was started.
fn not_again(b: &Blocker) -> Again {
    Again::Not {
        target: b.label(),
        detail: format!(
            "not started again: gpuloop starts a daemon again only through its systemd system unit, and it ran in none; start it as it was started (it ran as {}: {})",
            b.user, b.cmdline
        ),
    }
}

/// `systemctl VERB -- UNIT` of a system unit, to its end.
fn systemctl(verb: &str, unit: &str) -> (bool, String) {
    let mut cmd = std::process::Command::new("systemctl");
    // The unit's name comes from a cgroup path: `--` keeps it from being read as an option.
    cmd.args([verb, "--", unit])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    match crate::process::helpers::output(&mut cmd) {
        Ok(o) if o.status.success() => (true, format!("systemctl {verb} {unit}")),
        Ok(o) => (
            false,
            format!(
                "systemctl {verb} {unit}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        ),
        Err(e) => (false, format!("systemctl {verb} {unit}: {e}")),
    }
}

/// `echo quit | nvidia-cuda-mps-control`: MPS stops its servers and itself.
fn mps_quit() -> Result<String, String> {
    use std::io::Write;
    let mut cmd = std::process::Command::new("nvidia-cuda-mps-control");
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let (mut child, id) = crate::process::helpers::start(|| cmd.spawn(), |c| Some(c.id()))
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"quit\n");
    }
    let out = child.wait_with_output();
    crate::process::helpers::forget(id);
    match out {
        Ok(o) if o.status.success() => Ok("echo quit | nvidia-cuda-mps-control".into()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(e.to_string()),
    }
}
