//! Reset readiness: every client that would make a reset of one GPU (or a MIG change) fail,
//! each with the identity a holder has and what stops it. `gpuloop reset --dry-run`,
//! diagnose's advice and the `clean-node` recipe's reset step all show this one list.

use super::holders::{Holder, Inventory};
use crate::gpu::faults::{Faults, Needs};
use crate::gpu::{Backend, BackendKind, Gpu};
use crate::process::container::{Resolver, Roots};
use crate::process::{self as proc, ProcInfo};
use serde::{Deserialize, Serialize};

/// What a blocker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BlockerKind {
    /// A process with a CUDA context on the GPU (or on others, mapping it).
    Compute,
    /// An NVML client with the GPU's node open: an `nvidia-smi` loop, an exporter.
    Observer,
    Persistenced,
    /// nv-hostengine (DCGM), dcgm-exporter.
    Dcgm,
    FabricManager,
    /// An MPS control daemon or server.
    Mps,
    /// Xorg, Xwayland, gnome-shell.
    Display,
    /// Another protected daemon (config.toml's `protected`).
    Daemon,
    /// A process holding a MIG capability (`/dev/nvidia-caps/…`) and no GPU node.
    Caps,
    /// A kernel module: `nvidia_drm` loaded with `modeset=1`.
    Module,
}

impl BlockerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockerKind::Compute => "compute",
            BlockerKind::Observer => "observer",
            BlockerKind::Persistenced => "persistenced",
            BlockerKind::Dcgm => "dcgm",
            BlockerKind::FabricManager => "fabric-manager",
            BlockerKind::Mps => "mps",
            BlockerKind::Display => "display",
            BlockerKind::Daemon => "daemon",
            BlockerKind::Caps => "caps",
            BlockerKind::Module => "module",
        }
    }

    /// A GPU daemon gpuloop starts again after the reset, where it stopped it.
    pub(crate) fn is_daemon(self) -> bool {
        matches!(
            self,
            BlockerKind::Persistenced
                | BlockerKind::Dcgm
                | BlockerKind::FabricManager
                | BlockerKind::Mps
                | BlockerKind::Daemon
        )
    }
}

impl std::fmt::Display for BlockerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// How a blocker is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Stop {
    /// TERM, the grace, KILL, through its pidfd (`kill`).
    Signal,
    /// `systemctl stop` of the unit whose main process it is.
    Unit,
    /// `echo quit | nvidia-cuda-mps-control`.
    MpsQuit,
    /// `modprobe -r` of the module.
    Unload,
}

/// One client that would block a reset of the GPU.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Blocker {
    pub kind: BlockerKind,
    /// The process (with `start` and `pidfs_ino`, its identity as a holder's); `()` for a
    /// kernel module.
    pub pid: Option<i64>,
    pub start: Option<i64>,
    pub pidfs_ino: Option<i64>,
    /// The process's name, or the module's.
    pub name: String,
    pub cmdline: String,
    pub user: String,
    /// A protected daemon (config.toml's `protected`, the name proven by who runs it and
    /// what it runs: `process::daemon`): stopped only with --force.
    pub protected: bool,
    /// The systemd unit it is the main process of: stopped through it.
    pub service: Option<String>,
    /// That unit is a user manager's (`systemctl --user`): its user's to name and to start,
    /// so it is stopped as their other clients are (by signal, no --force) and never started
    /// again by gpuloop.
    #[serde(default)]
    pub user_unit: bool,
    /// It has a MIG capability node open: a MIG change fails while it does, too.
    pub caps: bool,
    /// The MIG devices it holds (`N:GI:CI`), as its holder record names them.
    #[serde(default)]
    pub mig: Vec<crate::gpu::mig::MigKey>,
    pub stop: Stop,
    /// What stops it, as a person would run it.
    pub how: String,
    pub host: String,
}

impl Blocker {
    /// "4711 (nvidia-smi, observer)", "nvidia_drm (module)".
    pub fn label(&self) -> String {
        match self.pid {
            Some(pid) => format!("{pid} ({}, {})", self.name, self.kind),
            None => format!("{} ({})", self.name, self.kind),
        }
    }

    /// Needs --force: a protected daemon, a system unit's main process (systemd owns it), a
    /// module. A user's unit is that user's client like the rest of theirs: a name they chose
    /// in a cgroup of their own must not block a reset.
    pub(crate) fn needs_force(&self) -> bool {
        self.protected || (self.service.is_some() && !self.user_unit) || self.stop == Stop::Unload
    }
}

/// What a process is, as a blocker: a protected daemon by its (proven) name, any other
/// process by its role. A name without proof says nothing of what a process is.
fn kind_of(comm: &str, cmdline: &str, protected: bool, compute: bool) -> BlockerKind {
    let named = |names: &[&str]| protected && proc::kill::is_named(comm, cmdline, names);
    if named(&["nvidia-persistenced"]) {
        BlockerKind::Persistenced
    } else if named(&["nv-hostengine", "dcgm-exporter", "dcgmproftester"]) {
        BlockerKind::Dcgm
    } else if named(&["nvidia-fabricmanager", "nv-fabricmanager"]) {
        BlockerKind::FabricManager
    } else if named(&[
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
        "nvidia-cuda-mps",
    ]) {
        BlockerKind::Mps
    } else if named(&["Xorg", "Xwayland", "gnome-shell", "X"]) {
        BlockerKind::Display
    } else if protected {
        BlockerKind::Daemon
    } else if compute {
        BlockerKind::Compute
    } else {
        BlockerKind::Observer
    }
}

/// The GPU daemons that block a reset even holding no GPU node (an idle MPS control
/// daemon starts a server on the next client; the fabric manager holds the NVSwitches).
const NAMED: &[&str] = &[
    "nvidia-persistenced",
    "nv-hostengine",
    "nvidia-fabricmanager",
    "nv-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-cuda-mps",
];

/// How a person stops it, and how gpuloop does.
/// A user's unit is stopped as the rest of that user's clients, by signal: asking their
/// manager to stop it would wait on whatever stop they wrote for it.
fn stop_of(kind: BlockerKind, pid: i64, unit: Option<&str>, user_unit: bool) -> (Stop, String) {
    match (unit, kind) {
        (Some(u), _) if user_unit => (
            Stop::Signal,
            format!("kill {pid} (its user's unit: systemctl --user stop {u})"),
        ),
        (Some(u), _) => (Stop::Unit, format!("systemctl stop {u}")),
        (None, BlockerKind::Mps) => (
            Stop::MpsQuit,
            "echo quit | nvidia-cuda-mps-control".to_string(),
        ),
        (None, k) if k.is_daemon() || k == BlockerKind::Display => (
            Stop::Signal,
            format!("kill {pid} (a protected daemon: --force)"),
        ),
        (None, _) => (Stop::Signal, format!("kill {pid}")),
    }
}

impl Blocker {
    pub(crate) fn of_holder(h: &Holder) -> Blocker {
        Blocker {
            mig: h.mig.clone(),
            ..Blocker::of_holder_alone(h)
        }
    }

    fn of_holder_alone(h: &Holder) -> Blocker {
        let kind = match kind_of(&h.name, &h.cmdline, h.protected, h.is_compute()) {
            // A holder whose only link to the GPU is a MIG capability.
            BlockerKind::Observer | BlockerKind::Compute if h.caps && h.opens.is_empty() => {
                BlockerKind::Caps
            }
            k => k,
        };
        Blocker::new(
            kind,
            (h.pid, h.start, h.pidfs_ino),
            &h.name,
            &h.cmdline,
            &h.user,
            h.protected,
            &h.origin,
            h.caps,
            &h.host,
        )
    }

    fn of_proc(p: &ProcInfo, cmdline: String, protected: &[String], places: &Resolver) -> Blocker {
        let user = proc::uid(p.pid).map(proc::user_name).unwrap_or_default();
        let prot = proc::daemon::is_protected_pid(p.pid, p.start, &p.comm, &cmdline, protected);
        // Found as one of `NAMED`, proven: its kind is its name's.
        let kind = kind_of(&p.comm, &cmdline, true, false);
        Blocker::new(
            kind,
            (i64::from(p.pid), p.start as i64, None),
            &p.comm,
            &cmdline,
            &user,
            prot,
            &proc::origin::origin(p, places),
            false,
            crate::local::LOCAL,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: BlockerKind,
        (pid, start, ino): (i64, i64, Option<i64>),
        name: &str,
        cmdline: &str,
        user: &str,
        protected: bool,
        origin: &proc::origin::Origin,
        caps: bool,
        host: &str,
    ) -> Blocker {
        // Only a unit's main process is stopped through its unit: a worker in a unit's
        // cgroup is a process of its own.
        let unit = origin.service.as_deref().filter(|_| origin.service_main);
        let user_unit = origin
            .cgroup
            .as_deref()
            .is_some_and(|c| c.contains("/user@"));
        let (stop, how) = stop_of(kind, pid, unit, user_unit);
        Blocker {
            kind,
            pid: Some(pid),
            start: Some(start),
            pidfs_ino: ino,
            name: proc::display_name(name, cmdline),
            cmdline: cmdline.to_string(),
            user: user.to_string(),
            protected,
            service: unit.map(str::to_string),
            user_unit: unit.is_some() && user_unit,
            caps,
            mig: Vec::new(),
            stop,
            how,
            host: host.to_string(),
        }
    }

    fn module(host: &str) -> Blocker {
        Blocker {
            kind: BlockerKind::Module,
            pid: None,
            start: None,
            pidfs_ino: None,
            name: "nvidia_drm".into(),
            cmdline: String::new(),
            user: String::new(),
            protected: true,
            service: None,
            user_unit: false,
            caps: false,
            mig: Vec::new(),
            stop: Stop::Unload,
            how:
                "modprobe -r nvidia_drm (it drives the display; or boot with nvidia-drm.modeset=0)"
                    .into(),
            host: host.to_string(),
        }
    }
}

/// What blocks a reset on this machine besides the inventory's holders, looked at once:
/// the GPU daemons that block one whatever they hold (found by name and proven, on the
/// driver's machine only: a simulator's GPUs are its own nodes'), and `nvidia_drm` with
/// modeset.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    named: Vec<Blocker>,
    modeset: bool,
}

impl Readiness {
    /// The named daemons and the modeset module that block a reset on this machine (the
    /// compute holders are added per GPU by `blockers`). `roots`: where the container
    /// runtimes keep their state, for the cgroup's unit.
    pub fn look(backend: &dyn Backend, protected: &[String], roots: &Roots) -> Readiness {
        let places = Resolver::remembering(roots);
        let named = match backend.kind() {
            // A process that only takes a daemon's name holds nothing of the GPU: no client.
            BackendKind::Nvml => proc::process_table()
                .into_iter()
                .filter(|p| !p.is_zombie())
                .map(|p| {
                    let cmdline = proc::cmdline(p.pid);
                    (p, cmdline)
                })
                .filter(|(p, cmdline)| {
                    proc::daemon::is_protected_pid(p.pid, p.start, &p.comm, cmdline, NAMED)
                })
                .map(|(p, cmdline)| Blocker::of_proc(&p, cmdline, protected, &places))
                .collect(),
            // The daemons named are the driver's clients on this machine: no simulated GPU
            // waits for them, and without a driver nothing is reset.
            BackendKind::Sim | BackendKind::NoDriver => Vec::new(),
        };
        places.keep();
        Readiness {
            named,
            modeset: backend.drm_modeset() == Some(true),
        }
    }

    /// Every client that would block a reset of GPU `gpu`: each process with its node open
    /// or mapped (compute holders, observers, daemons), each holding a MIG capability, the
    /// GPU daemons found by name, and `nvidia_drm` with modeset. Processes by pid, then the
    /// module.
    pub fn blockers(&self, inv: &Inventory, gpu: i64) -> Vec<Blocker> {
        let mut out = self.gather(inv, |h| {
            h.opens.contains(&gpu) || h.maps.contains(&gpu) || h.gpus.contains(&gpu) || h.caps
        });
        if self.modeset {
            out.push(Blocker::module(crate::local::LOCAL));
        }
        out
    }
}

impl Readiness {
    /// Every client that would block destroying or reconfiguring MIG device `k` (gpuloop
    /// does neither; mig-parted and `nvidia-smi mig` do, and fail with "in use by another
    /// client" while one of these is there): the processes the driver lists on it or that
    /// hold its capability nodes, those holding a node-wide MIG capability (`config`,
    /// `monitor`: DCGM, `nvidia-smi mig`), the processes of its GPU that show no device (one
    /// may be on it), and the GPU daemons found by name (DCGM's nv-hostengine keeps every
    /// device open). Processes by pid.
    pub fn blockers_of_instance(
        &self,
        inv: &Inventory,
        k: &crate::gpu::mig::MigKey,
    ) -> Vec<Blocker> {
        self.gather(inv, |h| {
            h.mig.contains(k)
                || h.caps_all
                || (h.mig.is_empty() && h.is_compute() && h.gpus.contains(&k.gpu))
        })
    }

    /// The holders `keep` picks and those named as GPU daemons (gpuloop itself never), then
    /// the daemons found by name: as blockers, by pid.
    fn gather(&self, inv: &Inventory, keep: impl Fn(&Holder) -> bool) -> Vec<Blocker> {
        let me = std::process::id() as i64;
        let mut out: Vec<Blocker> = inv
            .holders
            .iter()
            .filter(|h| h.pid != me)
            .filter(|h| {
                keep(h) || (h.protected && proc::kill::is_named(&h.name, &h.cmdline, NAMED))
            })
            .map(Blocker::of_holder)
            .collect();
        for b in &self.named {
            if b.pid != Some(me) && !out.iter().any(|o| o.pid == b.pid) {
                out.push(b.clone());
            }
        }
        out.sort_by_key(|b| b.pid);
        out
    }
}

/// Why no reset of GPU `g` can work, whatever is stopped, if none can: the driver says the
/// GPU is lost, or it does not answer and the kernel log has its Xid 79 (it fell off the
/// bus: the host cannot reach it), or the driver's recovery action asks for a node reboot.
/// `g` carries its faults (`machine::ops::read_faults`).
pub(crate) fn cannot_reset(g: &Gpu) -> Option<String> {
    let faults = g.faults.as_ref();
    let xid79 = faults
        .and_then(Faults::off_bus)
        .filter(|_| g.error.is_some());
    if g.lost || xid79.is_some() {
        let said = match xid79 {
            Some(x) => format!("Xid {} in the kernel log", x.code),
            None => "the driver says it is lost".to_string(),
        };
        return Some(format!(
            "GPU {} fell off the bus ({said}): a reset cannot reach it; reboot the node",
            g.index
        ));
    }
    let action = faults.and_then(|f| f.recovery_action)?;
    (action.needs() == Needs::Reboot).then(|| {
        format!(
            "the driver asks for a node reboot for GPU {} (recovery action {}): a reset does not recover it",
            g.index,
            action.as_str()
        )
    })
}

/// What `gpuloop reset` did for one GPU, or with `--dry-run` found in its way.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ResetReport {
    pub gpu: i64,
    /// The GPU's UUID before the reset: the same GPU must answer with it after.
    pub uuid: String,
    pub dry_run: bool,
    /// Why no reset can work on this GPU whatever is stopped (it fell off the bus, the
    /// driver asks for a reboot), or `()`: where it says so, nothing was stopped.
    #[serde(default)]
    pub cannot: Option<String>,
    /// Every client that blocked the reset (or would block it), as first found.
    pub blockers: Vec<Blocker>,
    /// What was done, in order.
    pub steps: Vec<Step>,
    /// The reset ran and the driver said it was done.
    pub reset: bool,
    /// The GPU answered after it, with its UUID and 0 MiB used.
    pub verified: bool,
    /// With `--dry-run`: a reset can work and nothing blocks it. Otherwise: reset,
    /// verified, and every daemon it stopped started again.
    pub ok: bool,
    pub host: String,
    /// A MIG device's report (`reset --dry-run --gpu N:GI:CI`): what blocks destroying or
    /// reconfiguring it; `uuid` is then the device's.
    #[serde(default)]
    pub mig: Option<crate::gpu::mig::MigKey>,
}

/// One step of a reset.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Step {
    pub action: StepKind,
    /// Whom or what it acted on: "4711 (nvidia-smi, observer)", "GPU 0".
    pub target: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// A blocker gpuloop may not stop (a protected daemon without --force, a module).
    Refuse,
    Stop,
    Reset,
    Verify,
    /// A daemon it stopped, started again.
    Restart,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Refuse => "refuse",
            StepKind::Stop => "stop",
            StepKind::Reset => "reset",
            StepKind::Verify => "verify",
            StepKind::Restart => "restart",
        }
    }
}

impl std::fmt::Display for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// "4711 (nvidia-smi, observer: kill 4711), …", as advice lists them.
pub fn describe(bs: &[Blocker], there: impl Fn(&str) -> String) -> String {
    bs.iter()
        .map(|b| format!("{}: {}", b.label(), there(&b.how)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemons_are_told_by_name_and_the_rest_by_role() {
        let k = |comm: &str, cmd: &str, protected, compute| kind_of(comm, cmd, protected, compute);
        assert_eq!(
            k(
                "nvidia-persiste",
                "/usr/bin/nvidia-persistenced --user nvidia-persistenced",
                true,
                false
            ),
            BlockerKind::Persistenced
        );
        assert_eq!(
            k("nv-hostengine", "nv-hostengine -n", true, false),
            BlockerKind::Dcgm
        );
        assert_eq!(
            k(
                "nv-fabricmanage",
                "/usr/bin/nv-fabricmanager -c /x",
                true,
                false
            ),
            BlockerKind::FabricManager
        );
        assert_eq!(
            k("nvidia-cuda-mps", "nvidia-cuda-mps-control -d", true, false),
            BlockerKind::Mps
        );
        assert_eq!(
            k("Xorg", "/usr/lib/xorg/Xorg :0", true, false),
            BlockerKind::Display
        );
        assert_eq!(
            k("my-exporter", "my-exporter", true, false),
            BlockerKind::Daemon
        );
        assert_eq!(
            k("python3", "python3 train.py", false, true),
            BlockerKind::Compute
        );
        assert_eq!(
            k("nvidia-smi", "nvidia-smi -lms 200", false, false),
            BlockerKind::Observer
        );
        // A daemon's name without proof is what the process does.
        assert_eq!(
            k(
                "nvidia-persiste",
                "/tmp/x/nvidia-persistenced",
                false,
                false
            ),
            BlockerKind::Observer
        );
        assert_eq!(
            k("x", "/home/u/nvidia-cuda-mps-server", false, true),
            BlockerKind::Compute
        );
        assert_eq!(
            stop_of(
                BlockerKind::Persistenced,
                9,
                Some("nvidia-persistenced.service"),
                false
            ),
            (
                Stop::Unit,
                "systemctl stop nvidia-persistenced.service".to_string()
            )
        );
        assert_eq!(stop_of(BlockerKind::Mps, 9, None, false).0, Stop::MpsQuit);
        assert_eq!(
            stop_of(BlockerKind::Compute, 9, Some("train.service"), true),
            (
                Stop::Signal,
                "kill 9 (its user's unit: systemctl --user stop train.service)".to_string()
            )
        );
        assert_eq!(
            stop_of(BlockerKind::Observer, 9, None, false),
            (Stop::Signal, "kill 9".into())
        );
    }
}
