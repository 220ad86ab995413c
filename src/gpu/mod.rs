//! GPU backends: one small trait, with the NVML driver, the simulator, and "no driver" behind it.

pub mod deadline;
pub mod faults;
pub(crate) mod kmsg;
pub mod mig;
pub(crate) mod nvml;
pub mod sim;

pub use faults::{DeviceFaults, Faults};

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One GPU as scripts see it (`gpu()`); bytes and MiB are `i64` at the script boundary.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Gpu {
    pub index: i64,
    pub uuid: String,
    pub name: String,
    /// The N of /dev/nvidiaN, from the driver; it can differ from `index`.
    pub minor: i64,
    pub bus_id: String,
    pub mem_total: i64,
    pub mem_used: i64,
    pub mem_free: i64,
    pub mem_used_mib: i64,
    pub mem_total_mib: i64,
    pub util: Option<i64>,
    pub temp_c: Option<i64>,
    /// Number of processes the driver reports on this GPU.
    pub procs: i64,
    pub host: String,
    /// Why this GPU could not be read (the driver's error, or a read that did not return in
    /// time); the other GPUs are read and reported beside it. Its memory figures are then
    /// unknown (0), and nothing may count it as clean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the GPU reports about its faults, and its Xid events from the kernel log; read
    /// for gpu(), `gpus` and diagnose, never while polling (`()` where not read).
    #[serde(default)]
    pub faults: Option<Faults>,
    /// Its MIG mode and instances; `()` on a GPU without MIG (or where not read).
    #[serde(default)]
    pub mig: Option<mig::Mig>,
    /// The driver's process list for this GPU (pids as the driver names them).
    #[serde(skip)]
    pub driver_procs: Vec<DriverProc>,
    /// The driver said the GPU is lost (fallen off the bus), rather than failing a read.
    #[serde(skip)]
    pub lost: bool,
}

/// A process the driver attributes memory to on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverProc {
    pub pid: i32,
    /// Bytes, 0 when the driver does not say.
    pub mem: i64,
    /// On a GPU in MIG mode, the instance the driver says it runs on (the process info's
    /// `gpuInstanceId` and `computeInstanceId`); `None` elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<(u32, u32)>,
}

impl DriverProc {
    /// A process of a GPU without MIG.
    pub fn new(pid: i32, mem: i64) -> DriverProc {
        DriverProc {
            pid,
            mem,
            mig: None,
        }
    }
}

pub const MIB: i64 = 1024 * 1024;

impl Gpu {
    /// Fills the derived fields from the byte counts; every backend builds GPUs through here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: i64,
        minor: i64,
        uuid: String,
        name: String,
        bus_id: String,
        mem_total: i64,
        mem_used: i64,
        driver_procs: Vec<DriverProc>,
    ) -> Gpu {
        Gpu {
            index,
            uuid,
            name,
            minor,
            bus_id,
            mem_total,
            mem_used,
            mem_free: (mem_total - mem_used).max(0),
            mem_used_mib: mem_used / MIB,
            mem_total_mib: mem_total / MIB,
            util: None,
            temp_c: None,
            procs: driver_procs.len() as i64,
            host: crate::local::local(),
            error: None,
            faults: None,
            mig: None,
            driver_procs,
            lost: false,
        }
    }

    /// Its MIG devices while it is in MIG mode (each a GPU of its own, diagnosed and waited
    /// for on its own); none for a GPU out of MIG mode, or one the driver failed to read.
    pub fn mig_devices(&self) -> Vec<&mig::MigDevice> {
        self.mig
            .as_ref()
            .filter(|m| m.enabled() && self.error.is_none())
            .map(|m| m.instances.iter().collect())
            .unwrap_or_default()
    }

    /// A GPU the driver failed to read: its index, its minor number where known, and why.
    pub fn failed(index: i64, minor: i64, error: String) -> Gpu {
        Gpu {
            error: Some(error),
            ..Gpu::new(
                index,
                minor,
                String::new(),
                String::new(),
                String::new(),
                0,
                0,
                Vec::new(),
            )
        }
    }
}

/// The first GPU among `gpus` (those `sel` selects) that could not be read, as an error that
/// names it: nothing read about such a GPU may count as clean.
pub(crate) fn unread(gpus: &[Gpu], sel: impl Fn(i64) -> bool) -> Option<GpuError> {
    gpus.iter()
        .filter(|g| sel(g.index))
        .find_map(|g| g.error.clone())
        .map(GpuError::Nvml)
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU with index {index} (this machine has {count})")]
    NoSuchGpu { index: i64, count: usize },
    #[error("no GPU with UUID or bus id {id:?} (this machine has {count})")]
    NoSuchGpuId { id: String, count: usize },
    #[error(
        "out of memory: tried to allocate {mib} MiB on GPU {index} ({total_mib} MiB total, {free_mib} MiB free)"
    )]
    OutOfMemory {
        index: i64,
        mib: i64,
        free_mib: i64,
        total_mib: i64,
    },
    #[error("GPU selector {0}")]
    BadSelector(String),
    #[error("NVML: {0}")]
    Nvml(String),
    /// The driver says the GPU is lost: it fell off the bus.
    #[error("NVML: {0}")]
    Lost(String),
    #[error("bad --sim spec {spec:?}: {why}")]
    BadSimSpec { spec: String, why: String },
    #[error("simulator state in {dir}: {why}")]
    SimState { dir: PathBuf, why: String },
    #[error("GPU reset of GPU {index} failed: {why}")]
    Reset { index: i64, why: String },
    /// The driver library did not load or initialise; nothing can be verified.
    #[error("no NVIDIA driver: {0}")]
    NoDriver(String),
    /// `--user`/`#{user}` names no user in this machine's user database.
    #[error("no user {user:?} on this machine")]
    NoUser { user: String },
    /// `--pod`/`--container` (or a script's or a tool's `pod`, `container`) that is empty, or
    /// that fits no pod or container here, or several (`process::scope::ScopeError`).
    #[error("{0}")]
    BadScope(String),
    /// Ctrl-C or SIGTERM while the driver library was loading.
    #[error("interrupted while the NVIDIA driver library was loading")]
    Interrupted,
}

impl GpuError {
    /// What went wrong in a few words, alike for every host it happened to (a summary's
    /// row, where hosts that failed the same way fold into one).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            GpuError::NoSuchGpu { .. } | GpuError::NoSuchGpuId { .. } => "no such GPU",
            GpuError::OutOfMemory { .. } => "out of memory",
            GpuError::BadSelector(_) => "GPU selector",
            GpuError::Nvml(_) | GpuError::Lost(_) => "NVML",
            GpuError::BadSimSpec { .. } => "bad --sim spec",
            GpuError::SimState { .. } => "simulator state",
            GpuError::Reset { .. } => "GPU reset failed",
            GpuError::NoDriver(_) => "no NVIDIA driver",
            GpuError::NoUser { .. } => "no such user",
            GpuError::BadScope(_) => "bad pod or container",
            GpuError::Interrupted => "interrupted",
        }
    }

    /// A mistake in what was asked, not a failure of the machine: exit 2.
    pub(crate) fn is_usage(&self) -> bool {
        matches!(
            self,
            GpuError::NoSuchGpu { .. }
                | GpuError::NoSuchGpuId { .. }
                | GpuError::BadSelector(_)
                | GpuError::NoUser { .. }
                | GpuError::BadScope(_)
                | GpuError::BadSimSpec { .. }
        )
    }
}

/// Where a backend's device nodes live: `/dev` for the driver, `$GPULOOP_SIM_DIR/dev` in the
/// simulator. GPU nodes are `<dir>/nvidiaN` (N = minor); every other `<dir>/nvidia*` is shared.
#[derive(Debug, Clone)]
pub struct DeviceNodes {
    /// `<dir>/nvidia` as bytes, the prefix every node path starts with.
    prefix: Vec<u8>,
}

/// What an open or mapped path is, as far as GPUs go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Node {
    /// `/dev/nvidiaN`: one GPU, by minor number.
    Gpu(u32),
    /// `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-nvswitchN`: every GPU and none.
    Shared,
    /// `/dev/nvidia-caps/nvidia-capM`: a MIG capability (M is its minor, which the driver's
    /// `mig-minors` names: an instance's access, `config` or `monitor`); a process holding
    /// one blocks a GPU reset and a MIG change.
    Caps(Option<u32>),
}

impl DeviceNodes {
    pub fn new(dir: impl Into<PathBuf>) -> DeviceNodes {
        let mut prefix = dir.into().into_os_string().into_encoded_bytes();
        prefix.extend_from_slice(b"/nvidia");
        DeviceNodes { prefix }
    }

    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Classifies a path (from readlink of an fd, or a maps line); `None` if it is not a node.
    pub(crate) fn classify(&self, path: &[u8]) -> Option<Node> {
        let rest = path.strip_prefix(self.prefix.as_slice())?;
        if !rest.is_empty() && rest.iter().all(u8::is_ascii_digit) {
            return std::str::from_utf8(rest).ok()?.parse().ok().map(Node::Gpu);
        }
        if let Some(cap) = rest.strip_prefix(b"-caps/") {
            let minor = cap
                .strip_prefix(b"nvidia-cap")
                .filter(|m| !m.is_empty() && m.iter().all(u8::is_ascii_digit))
                .and_then(|m| std::str::from_utf8(m).ok()?.parse().ok());
            return Some(Node::Caps(minor));
        }
        // "(deleted)" suffixes and the like still name a node file.
        Some(Node::Shared)
    }
}

/// Runs a helper program to its end and returns what it printed.
pub type RunHelper = dyn Fn(&mut std::process::Command) -> std::io::Result<std::process::Output>;

/// Which backend answers: the driver, the simulator, or none (the driver did not load).
/// Its name ("nvml", "sim", "none") is said at the edge: the agent's hello, `-v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::Display)]
pub enum BackendKind {
    #[strum(serialize = "nvml")]
    Nvml,
    #[strum(serialize = "sim")]
    Sim,
    #[strum(serialize = "none")]
    NoDriver,
}

/// The one interface the rest of gpuloop needs from a GPU driver.
pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// Every GPU with every field of `gpu()`, in index order (`driver_procs` may be left
    /// empty: `procs` counts them).
    fn gpus(&self) -> Result<Vec<Gpu>, GpuError>;
    /// The GPUs with what holders(), diagnose() and wait_clean() need, in index order: index,
    /// minor, memory and the driver's process lists (`driver_procs`); a backend may leave the
    /// other fields empty, to spare the driver queries. (No default: a wrapper that fell back
    /// to `gpus()` would lose the process lists.)
    fn inventory_gpus(&self) -> Result<Vec<Gpu>, GpuError>;
    /// Only the memory-used figure of the selected GPUs (the wait_clean hot path).
    fn mem_used(&self, indices: &[i64]) -> Result<Vec<(i64, i64)>, GpuError> {
        Ok(self
            .gpus()?
            .into_iter()
            .filter(|g| indices.contains(&g.index))
            .map(|g| (g.index, g.mem_used))
            .collect())
    }
    /// Device nodes whose fds and mappings mark a process as a GPU user.
    fn nodes(&self) -> &DeviceNodes;
    /// The PID namespace the driver reports pids in is not ours (a container without --pid=host).
    fn foreign_pid_namespace(&self) -> bool;
    /// Resets one GPU (a last resort for memory nobody holds). A backend that needs a program
    /// for it (nvidia-smi) has `run` start it: the caller knows how gpuloop's own helper
    /// processes are kept apart from jobs' orphans, which a backend must not need to.
    fn reset(&self, index: i64, run: &RunHelper) -> Result<(), GpuError>;
    /// Why there is no driver (what failed to load or initialise); `None` when there is one.
    fn missing_driver(&self) -> Option<&str> {
        None
    }
    /// What each of `indices` reports about its faults (volatile ECC counts, remapped rows,
    /// retired pages, the recovery action), with its bus id. Read only when asked (gpu(),
    /// diagnose), never on the polling path; a fact a GPU does not report is `None`.
    fn faults(&self, _indices: &[i64]) -> Result<Vec<DeviceFaults>, GpuError> {
        Ok(Vec::new())
    }
    /// The driver's `mig-minors` (which capability each `/dev/nvidia-caps` minor grants),
    /// parsed; empty where there is none.
    fn mig_minors(&self) -> mig::MigMinors {
        mig::MigMinors::read(std::path::Path::new(mig::MINORS_FILE))
    }
    /// Whether `nvidia_drm` is loaded with `modeset=1` (it then holds the GPUs, and a reset
    /// fails); `None` when the module is not loaded.
    fn drm_modeset(&self) -> Option<bool> {
        drm_modeset_in(std::path::Path::new(
            "/sys/module/nvidia_drm/parameters/modeset",
        ))
    }
}

/// `nvidia_drm`'s `modeset` parameter as the file `path` holds it (`Y` or `N`); `None` when
/// there is no such file (the module is not loaded).
pub(crate) fn drm_modeset_in(path: &std::path::Path) -> Option<bool> {
    std::fs::read_to_string(path)
        .ok()
        .map(|v| matches!(v.trim(), "Y" | "y" | "1"))
}

/// The backend used when the NVIDIA driver library cannot be loaded or initialised: it knows
/// no GPUs, so nothing read through it may ever count as clean.
pub(crate) struct NoDriver {
    nodes: DeviceNodes,
    why: String,
}

impl NoDriver {
    /// `why`: what failed, as the user should read it ("libnvidia-ml.so.1: cannot open …").
    pub(crate) fn new(why: impl Into<String>) -> NoDriver {
        NoDriver {
            nodes: DeviceNodes::new("/dev"),
            why: why.into(),
        }
    }
}

impl Backend for NoDriver {
    fn kind(&self) -> BackendKind {
        BackendKind::NoDriver
    }
    fn gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        Ok(Vec::new())
    }
    fn inventory_gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        Ok(Vec::new())
    }
    fn nodes(&self) -> &DeviceNodes {
        &self.nodes
    }
    fn foreign_pid_namespace(&self) -> bool {
        false
    }
    fn reset(&self, _index: i64, _run: &RunHelper) -> Result<(), GpuError> {
        Err(GpuError::NoDriver(self.why.clone()))
    }
    fn missing_driver(&self) -> Option<&str> {
        Some(&self.why)
    }
}

/// The inode of the initial PID namespace (PROC_PID_INIT_INO in the kernel).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// The inode of the PID namespace this process lives in.
pub(crate) fn own_pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// True inside a child PID namespace (a container without --pid=host, `unshare --pid`).
pub(crate) fn in_child_pid_namespace() -> bool {
    own_pid_namespace().is_some_and(|ino| ino != INIT_PID_NS_INO)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the agent's hello and `-v` have always said.
    #[test]
    fn a_backend_kind_says_its_name() {
        let names: Vec<&str> = [BackendKind::Nvml, BackendKind::Sim, BackendKind::NoDriver]
            .into_iter()
            .map(Into::into)
            .collect();
        assert_eq!(names, ["nvml", "sim", "none"]);
        assert_eq!(BackendKind::NoDriver.to_string(), "none");
    }

    #[test]
    fn classifies_nodes() {
        let n = DeviceNodes::new("/dev");
        assert_eq!(n.classify(b"/dev/nvidia3"), Some(Node::Gpu(3)));
        assert_eq!(n.classify(b"/dev/nvidia12"), Some(Node::Gpu(12)));
        assert_eq!(n.classify(b"/dev/nvidiactl"), Some(Node::Shared));
        assert_eq!(n.classify(b"/dev/nvidia-uvm"), Some(Node::Shared));
        assert_eq!(
            n.classify(b"/dev/nvidia-caps/nvidia-cap1"),
            Some(Node::Caps(Some(1)))
        );
        assert_eq!(
            n.classify(b"/dev/nvidia-caps/nvidia-cap138"),
            Some(Node::Caps(Some(138)))
        );
        assert_eq!(n.classify(b"/dev/nvidia-caps/x"), Some(Node::Caps(None)));
        assert_eq!(n.classify(b"/dev/nvidia-nvswitch0"), Some(Node::Shared));
        assert_eq!(n.classify(b"/dev/null"), None);
        assert_eq!(n.classify(b"/dev/nvidi"), None);
    }
}
