//! The simulated GPU backend: device nodes are files in a state directory, memory is held by
//! real processes through locked allocation files, with the driver's semantics.
//!
//! Layout of `$GPULOOP_SIM_DIR`:
//! - `spec`: the spec the directory was set up with (`8x80G,release_ms=150`);
//! - `host_ns`: the PID namespace the simulated driver reports pids in;
//! - `dev/nvidiaN`, `dev/nvidiactl`, `dev/nvidia-uvm`, `dev/nvidia-caps/nvidia-cap1`: the
//!   device nodes (N is the minor); every process that opens one holds a shared `flock` on
//!   it for as long as it has it open, which is how a reset finds the GPU in use;
//! - `mig-minors`: the driver's list of MIG capability minors (as
//!   `/proc/driver/nvidia-caps/mig-minors`), read through the same parser; the capability
//!   nodes of the instances are `dev/nvidia-caps/nvidia-capM`;
//! - `kmsg`, `faults.json`, `sys/module/nvidia_drm/parameters/modeset`: the kernel log and
//!   the GPUs' faults (`faults`);
//! - `alloc/*.json`: one file per allocation (GPU, MiB, creator pid). An allocation's memory is
//!   used while any live process holds an open handle to it, exactly like a CUDA allocation:
//!   the creator holds a shared `flock` on the file, inherited by forked children, and the lock
//!   only goes away when the last process holding that open file description is gone. The
//!   driver lists each creator by its pid in the host's namespace: one that ran in a container
//!   is found by its lock (/proc/locks names the locker in the reader's namespace), once:
//!   an empty file `NAME.locker.PID.INO` beside the allocation then names the lock's taker
//!   here by its pid and pidfd inode, and the next look only checks that this process lives
//!   on (a real driver knows the host pid from the start).
//!   With `release_ms`, a watcher takes the lock after the last holder and keeps the memory
//!   "used" for that long, as the driver's asynchronous teardown does.

pub mod faults;
pub mod hold;
pub mod mig;
pub mod stuck;

use super::{Backend, DeviceNodes, DriverProc, Gpu, GpuError, MIB};
use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

/// The `key=value` options a `--sim` spec takes after COUNTxSIZE (`--help` lists them all).
pub const OPTIONS: &[&str] = &[
    "release_ms",
    "minors",
    "name",
    "foreign_pids",
    "mig",
    "mig_pending",
];

/// A parsed `--sim` spec: `NxSIZE[,release_ms=MS][,minors=A:B:…][,name=NAME][,foreign_pids=hidden|raw][,mig=N:PROFILES][,mig_pending=N:MODE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimSpec {
    pub count: usize,
    pub mem_bytes: i64,
    pub release_ms: u64,
    /// Minor number of each GPU, by index.
    pub minors: Vec<u32>,
    pub name: String,
    /// How the simulated driver reports processes of another PID namespace: not at all
    /// (`hidden`, what driver 580 does on H200s), or by their pid there (`raw`, which then
    /// names a pid that does not exist here).
    pub foreign_pids_raw: bool,
    /// Each GPU's MIG state, by index (`mig=`, `mig_pending=`: see `mig`); a GPU not here
    /// has MIG disabled.
    pub mig: BTreeMap<usize, mig::SimMig>,
    /// The spec as given, normalised, to compare with a state directory's.
    pub canonical: String,
}

impl SimSpec {
    pub fn parse(spec: &str) -> Result<SimSpec, GpuError> {
        let bad = |why: String| GpuError::BadSimSpec {
            spec: spec.to_string(),
            why,
        };
        let mut parts = spec.trim().split(',');
        let head = parts.next().unwrap_or_default();
        let (n, size) = head
            .split_once(['x', 'X'])
            .ok_or_else(|| bad("expected COUNTxSIZE, e.g. 8x80G".into()))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| bad(format!("GPU count {n:?} is not a number")))?;
        if count == 0 || count > 64 {
            return Err(bad(format!("GPU count must be 1..=64, got {count}")));
        }
        let mem_bytes = parse_size(size.trim()).ok_or_else(|| {
            bad(format!(
                "memory size {size:?} is not a size like 80G, 141G or 512M (at most 1024T)"
            ))
        })?;
        let mut s = SimSpec {
            count,
            mem_bytes,
            release_ms: 0,
            minors: (0..count as u32).collect(),
            name: format!("Simulated GPU {}GB", mem_bytes / (1024 * MIB)),
            foreign_pids_raw: false,
            mig: BTreeMap::new(),
            canonical: String::new(),
        };
        let mut pending = Vec::new();
        for opt in parts {
            let (k, v) = opt
                .split_once('=')
                .ok_or_else(|| bad(format!("option {opt:?} is not key=value")))?;
            match k.trim() {
                "release_ms" => {
                    s.release_ms = v
                        .trim()
                        .parse()
                        .map_err(|_| bad(format!("release_ms={v:?} is not a number")))?
                }
                "minors" => {
                    let minors: Result<Vec<u32>, _> =
                        v.split(':').map(|m| m.trim().parse::<u32>()).collect();
                    let minors = minors.map_err(|_| bad(format!("minors={v:?}: not numbers")))?;
                    let mut uniq = minors.clone();
                    uniq.sort_unstable();
                    uniq.dedup();
                    if minors.len() != count || uniq.len() != count {
                        return Err(bad(format!(
                            "minors={v:?} must list {count} distinct numbers"
                        )));
                    }
                    s.minors = minors;
                }
                "name" => s.name = v.trim().to_string(),
                "mig" => {
                    let (gpu, m) = mig::parse_mig(v.trim(), mem_bytes).map_err(bad)?;
                    if gpu >= count {
                        return Err(bad(format!("mig={v:?}: no GPU {gpu} (there are {count})")));
                    }
                    if s.mig.insert(gpu, m).is_some() {
                        return Err(bad(format!("mig= names GPU {gpu} twice")));
                    }
                }
                "mig_pending" => pending.push(mig::parse_pending(v.trim()).map_err(bad)?),
                "foreign_pids" => {
                    s.foreign_pids_raw = match v.trim() {
                        "hidden" => false,
                        "raw" => true,
                        _ => return Err(bad(format!("foreign_pids={v:?}: use hidden or raw"))),
                    }
                }
                other => {
                    return Err(bad(format!(
                        "unknown option {other:?} (known: {})",
                        OPTIONS.join(", ")
                    )))
                }
            }
        }
        for (gpu, mode) in pending {
            if gpu >= count {
                return Err(bad(format!(
                    "mig_pending: no GPU {gpu} (there are {count})"
                )));
            }
            s.mig.entry(gpu).or_default().pending = mode;
        }
        s.canonical = spec.trim().to_string();
        Ok(s)
    }
}

/// The MIG capability node the simulator has (`sim hold --caps` opens it).
pub(crate) const CAP_NODE: &str = "nvidia-caps/nvidia-cap1";

/// The largest simulated GPU: 1 PiB (so every sum of its memory fits an i64 many times).
pub(crate) const MAX_GPU_BYTES: i64 = 1 << 50;

fn parse_size(s: &str) -> Option<i64> {
    let s = s.trim_end_matches(['B', 'b', 'i']);
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: i64 = num.parse().ok()?;
    let mul = match unit {
        "G" | "g" => 1024 * MIB,
        "M" | "m" => MIB,
        "T" | "t" => 1024 * 1024 * MIB,
        _ => return None,
    };
    n.checked_mul(mul).filter(|&b| b > 0 && b <= MAX_GPU_BYTES)
}

/// The device nodes of the simulator whose state is in `dir`.
pub(crate) fn nodes_in(dir: &Path) -> DeviceNodes {
    DeviceNodes::new(dir.join("dev"))
}

/// The simulator's state directory: `GPULOOP_SIM_DIR`, else a per-user default.
pub fn state_dir() -> PathBuf {
    std::env::var_os("GPULOOP_SIM_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(default_dir)
}

/// Where the simulator keeps its state when `GPULOOP_SIM_DIR` is not set.
fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("gpuloop-sim"),
        _ => std::env::temp_dir().join(format!(
            "gpuloop-sim-{}",
            rustix::process::getuid().as_raw()
        )),
    }
}

/// A process as the simulated driver lists it: its pid, and its MIG instance where it has one.
type Listed = (i32, Option<(u32, u32)>);

/// The simulated driver's answer, per GPU index.
#[derive(Default)]
struct Usage {
    /// Memory in use (bytes).
    used: Vec<i64>,
    /// The driver's process list.
    procs: Vec<Vec<DriverProc>>,
    /// Whether a process computes there (its own memory, not a footprint or a leak).
    busy: Vec<bool>,
    /// On a GPU in MIG mode, the memory in use per GPU instance (bytes).
    gi_used: Vec<BTreeMap<u32, i64>>,
}

/// One allocation record, as stored in `alloc/*.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Allocation {
    pub gpu: i64,
    pub mib: i64,
    /// The pid that made it, as the driver would report it.
    pub creator: i32,
    /// The PID namespace (inode) the creator lived in.
    pub ns: u64,
    /// Memory with no holder at all (a stuck driver): only a reset frees it.
    #[serde(default)]
    pub leaked: bool,
    /// A context's footprint on a GPU it can see but does not use: memory the driver
    /// attributes to nobody (no process is listed on that GPU for it).
    #[serde(default)]
    pub footprint: bool,
    /// Until then (ms since the epoch) the driver counts the memory but lists no process
    /// for it, as a real driver does while a context is being made.
    #[serde(default)]
    pub unlisted_until_ms: Option<u64>,
    /// On a GPU in MIG mode, the instance it was made on: (GPU instance, compute instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<(u32, u32)>,
}

fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The simulator's state directory, set up for one spec.
pub struct SimBackend {
    pub dir: PathBuf,
    pub spec: SimSpec,
    nodes: DeviceNodes,
    host_ns: u64,
    own_ns: u64,
}

fn state_err(dir: &Path, why: impl std::fmt::Display) -> GpuError {
    GpuError::SimState {
        dir: dir.to_path_buf(),
        why: why.to_string(),
    }
}

/// `file` with `op`'s `flock` taken on its open file description. The lock is never undone
/// by hand: it goes when the last process holding that description (a holder's forked
/// children share it) closes it, as a CUDA allocation's handle does.
fn locked(file: File, op: FlockOperation) -> rustix::io::Result<File> {
    rustix::fs::flock(&file, op)?;
    Ok(file)
}

impl SimBackend {
    /// Opens the state directory; sets it up for `spec`, or uses the spec stored there.
    pub fn open(dir: &Path, spec: Option<&str>) -> Result<SimBackend, GpuError> {
        let stored = fs::read_to_string(dir.join("spec")).ok();
        let spec = match (spec, stored.as_deref()) {
            (Some(s), _) => SimSpec::parse(s)?,
            // Nobody passed this spec: say it is the state directory's file that is wrong.
            (None, Some(s)) => SimSpec::parse(s).map_err(|e| {
                state_err(
                    dir,
                    format!("its spec file is corrupt ({e}); pass --sim SPEC to set it up again"),
                )
            })?,
            (None, None) => {
                return Err(state_err(
                    dir,
                    "no simulator set up here; pass --sim SPEC (e.g. --sim 8x80G)",
                ))
            }
        };
        let own_ns = super::own_pid_namespace().unwrap_or(0);
        let mut backend = SimBackend {
            dir: dir.to_path_buf(),
            nodes: nodes_in(dir),
            host_ns: own_ns,
            own_ns,
            spec,
        };
        if stored.as_deref().map(str::trim) != Some(backend.spec.canonical.as_str()) {
            backend.set_up_once()?;
        }
        // The kernel log is there from the start, empty, as the kernel's is (a directory
        // set up before the simulator had one gets it now); one that cannot be opened is
        // said where it is read.
        let _ = OpenOptions::new()
            .create(true)
            .append(true)
            .open(backend.kernel_log());
        backend.host_ns = fs::read_to_string(dir.join("host_ns"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(own_ns);
        Ok(backend)
    }

    /// Sets the directory up for this spec unless another process just did: holders started
    /// at once on a new directory (a job's ranks) each find no spec, and one at a time, under
    /// an exclusive lock on the directory, looks again and sets it up.
    fn set_up_once(&self) -> Result<(), GpuError> {
        let dir = &self.dir;
        fs::create_dir_all(dir).map_err(|e| state_err(dir, e))?;
        let lock = File::open(dir).map_err(|e| state_err(dir, e))?;
        rustix::fs::flock(&lock, FlockOperation::LockExclusive).map_err(|e| state_err(dir, e))?;
        let stored = fs::read_to_string(dir.join("spec")).ok();
        if stored.as_deref().map(str::trim) == Some(self.spec.canonical.as_str()) {
            return Ok(());
        }
        self.set_up(stored.is_some())
    }

    /// Creates (or re-creates for another spec) the node files and the spec record; under
    /// `set_up_once`'s lock.
    fn set_up(&self, replacing: bool) -> Result<(), GpuError> {
        let dir = &self.dir;
        if replacing && !self.live_allocations()?.is_empty() {
            let old = fs::read_to_string(dir.join("spec")).unwrap_or_default();
            return Err(state_err(
                dir,
                format!(
                    "it runs spec {:?} with live allocations; stop its holders or use another GPULOOP_SIM_DIR",
                    old.trim()
                ),
            ));
        }
        let dev = dir.join("dev");
        if replacing {
            let _ = fs::remove_dir_all(&dev);
        }
        for sub in [dev.as_path(), &dir.join("alloc"), &dev.join("nvidia-caps")] {
            fs::create_dir_all(sub).map_err(|e| state_err(dir, e))?;
        }
        let node_names = self
            .spec
            .minors
            .iter()
            .map(|m| format!("nvidia{m}"))
            .chain([
                "nvidiactl".to_string(),
                "nvidia-uvm".to_string(),
                CAP_NODE.to_string(),
            ]);
        // The driver's MIG capability minors, and a node for each one its instances (and
        // `config`, `monitor`) have.
        let layout = super::mig::driver_layout(&self.spec.minors);
        fs::write(dir.join("mig-minors"), &layout).map_err(|e| state_err(dir, e))?;
        let minors = super::mig::MigMinors::parse(&layout);
        let caps: Vec<String> = self
            .mig_devices(&minors, &Usage::default())
            .iter()
            .flat_map(|(_, d)| mig::cap_nodes(d, &minors))
            .map(|m| format!("nvidia-caps/nvidia-cap{m}"))
            .collect();
        for name in node_names.chain(caps) {
            // One page, so holders can map it like a CUDA context maps the real node.
            let f = File::create(dev.join(name)).map_err(|e| state_err(dir, e))?;
            f.set_len(4096).map_err(|e| state_err(dir, e))?;
        }
        if !dir.join("host_ns").exists() {
            fs::write(dir.join("host_ns"), self.own_ns.to_string())
                .map_err(|e| state_err(dir, e))?;
        }
        let tmp = dir.join(".spec.tmp");
        fs::write(&tmp, &self.spec.canonical).map_err(|e| state_err(dir, e))?;
        fs::rename(&tmp, dir.join("spec")).map_err(|e| state_err(dir, e))?;
        Ok(())
    }

    pub(crate) fn node_path(&self, index: i64) -> Result<PathBuf, GpuError> {
        let minor = self.minor(index)?;
        Ok(self.dir.join("dev").join(format!("nvidia{minor}")))
    }

    pub fn minor(&self, index: i64) -> Result<u32, GpuError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.spec.minors.get(i).copied())
            .ok_or(GpuError::NoSuchGpu {
                index,
                count: self.spec.count,
            })
    }

    /// GPU `i`'s MIG state, where the spec gives it one.
    pub(crate) fn mig_of(&self, i: usize) -> Option<&mig::SimMig> {
        self.spec.mig.get(&i)
    }

    /// Every GPU in MIG mode, with its MIG devices as the driver lists them, from `usage`.
    fn mig_devices(
        &self,
        minors: &super::mig::MigMinors,
        usage: &Usage,
    ) -> Vec<(usize, Vec<super::mig::MigDevice>)> {
        self.spec
            .mig
            .iter()
            .filter(|(_, m)| m.enabled())
            .filter_map(|(&i, m)| {
                let minor = *self.spec.minors.get(i)?;
                let used = |gi: u32| {
                    usage
                        .gi_used
                        .get(i)
                        .and_then(|u| u.get(&gi).copied())
                        .unwrap_or(0)
                };
                Some((i, m.devices(i as i64, minor, used, minors)))
            })
            .collect()
    }

    /// The MIG devices of every GPU in MIG mode, memory not read.
    pub fn mig_instances(&self) -> Vec<super::mig::MigDevice> {
        if !self.spec.mig.values().any(mig::SimMig::enabled) {
            return Vec::new();
        }
        self.mig_devices(&self.minors_file(), &Usage::default())
            .into_iter()
            .flat_map(|(_, d)| d)
            .collect()
    }

    /// The simulated driver's `mig-minors`, read through the parser the real one is read with.
    fn minors_file(&self) -> super::mig::MigMinors {
        super::mig::MigMinors::read(&self.dir.join("mig-minors"))
    }

    /// What a real allocation needs: on a GPU in MIG mode an instance (CUDA sees only MIG
    /// devices there), and on any other GPU none.
    pub(crate) fn check_instance(&self, gpu: i64, ids: Option<(u32, u32)>) -> Result<(), GpuError> {
        let i = usize::try_from(gpu).unwrap_or(usize::MAX);
        let mig = self.mig_of(i).filter(|m| m.enabled());
        let bad = |why: String| Err(GpuError::BadSelector(why));
        match (mig, ids) {
            (None, None) => Ok(()),
            (None, Some((gi, ci))) => bad(format!(
                "GPU {gpu} is not in MIG mode: it has no instance {gpu}:{gi}:{ci}"
            )),
            (Some(_), None) => bad(format!(
                "GPU {gpu} is in MIG mode: name one of its instances ({})",
                self.instance_list(gpu)
            )),
            (Some(m), Some((gi, ci))) if m.instance(gi, ci).is_none() => bad(format!(
                "GPU {gpu} has no MIG instance {gpu}:{gi}:{ci} (it has {})",
                self.instance_list(gpu)
            )),
            _ => Ok(()),
        }
    }

    /// "0:7:0 MIG-1a2b…, 0:8:0 MIG-…", or "none".
    fn instance_list(&self, gpu: i64) -> String {
        let all: Vec<String> = self
            .mig_instances()
            .iter()
            .filter(|d| d.gpu == gpu)
            .map(|d| format!("{} {}", d.key(), d.uuid))
            .collect();
        if all.is_empty() {
            "none".into()
        } else {
            all.join(", ")
        }
    }

    /// A `sim hold --gpu` / `sim leak --gpu` target: `N`, `N:GI:CI`, `N:GI` (its only compute
    /// instance, or its first) or a MIG UUID (or a unique prefix of one), as (GPU, instance).
    pub fn target(&self, text: &str) -> Result<(i64, Option<(u32, u32)>), GpuError> {
        let text = text.trim();
        let bad = |why: String| GpuError::BadSelector(format!("{text:?}: {why}"));
        if text.to_ascii_lowercase().starts_with("mig-") {
            let want = text.to_ascii_lowercase();
            let hits: Vec<super::mig::MigDevice> = self
                .mig_instances()
                .into_iter()
                .filter(|d| d.uuid.to_ascii_lowercase().starts_with(&want))
                .collect();
            return match hits.as_slice() {
                [d] => Ok((d.gpu, mig::ids(&d.key()))),
                [] => Err(bad("no such MIG device".into())),
                _ => Err(bad("matches several MIG devices".into())),
            };
        }
        let nums: Result<Vec<i64>, _> = text.split(':').map(str::parse::<i64>).collect();
        let nums = nums.map_err(|_| bad("expected N, N:GI:CI or a MIG UUID".into()))?;
        let id = |v: i64| u32::try_from(v).map_err(|_| bad(format!("{v} is no instance id")));
        match nums.as_slice() {
            [g] => Ok((*g, None)),
            [g, gi] => Ok((*g, Some((id(*gi)?, 0)))),
            [g, gi, ci] => Ok((*g, Some((id(*gi)?, id(*ci)?)))),
            _ => Err(bad("expected N, N:GI:CI or a MIG UUID".into())),
        }
    }

    /// The capability nodes that grant instance `(gi, ci)` of GPU `gpu`: the GPU instance's,
    /// then the compute instance's.
    pub(crate) fn cap_paths(&self, gpu: i64, gi: u32, ci: u32) -> Vec<PathBuf> {
        let Ok(minor) = self.minor(gpu) else {
            return Vec::new();
        };
        let caps = self.minors_file().of_instance(minor, gi, ci);
        caps.gi
            .into_iter()
            .chain(caps.ci)
            .map(|m| {
                self.dir
                    .join("dev")
                    .join(format!("nvidia-caps/nvidia-cap{m}"))
            })
            .collect()
    }

    pub(crate) fn alloc_dir(&self) -> PathBuf {
        self.dir.join("alloc")
    }

    /// Every allocation whose memory is in use now, with its file name.
    pub(crate) fn live_allocations(&self) -> Result<Vec<(PathBuf, Allocation)>, GpuError> {
        Ok(self
            .live()?
            .into_iter()
            .map(|l| (l.path, l.alloc))
            .collect())
    }

    /// Every allocation whose memory is in use now, with what the driver needs to name its
    /// holder.
    fn live(&self) -> Result<Vec<Live>, GpuError> {
        let rd = match fs::read_dir(self.alloc_dir()) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(state_err(&self.dir, e)),
        };
        let mut out = Vec::new();
        let mut seen: BTreeMap<PathBuf, Vec<Seen>> = BTreeMap::new();
        for entry in rd.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some((alloc, at)) = Seen::parse(&name) {
                seen.entry(self.alloc_dir().join(alloc))
                    .or_default()
                    .push(at);
                continue;
            }
            // In-progress allocations are dot-files until their creator holds them.
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            if let Some((alloc, key)) = self.check_allocation(&path)? {
                out.push(Live {
                    path,
                    alloc,
                    key,
                    seen: Vec::new(),
                });
            }
        }
        for l in &mut out {
            l.seen = seen.remove(&l.path).unwrap_or_default();
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// `Some` while the allocation's memory is in use; frees (removes) released ones. A
    /// file that cannot be read as an allocation is an error: its memory cannot be known,
    /// and reading it as free would call a GPU clean that is not.
    fn check_allocation(&self, path: &Path) -> Result<Option<(Allocation, LockKey)>, GpuError> {
        let corrupt = |why: String| {
            state_err(
                &self.dir,
                format!(
                    "allocation file {} is corrupt ({why}); the memory it records cannot be known (remove the file, or the state directory, to go on)",
                    path.display()
                ),
            )
        };
        let file = match File::open(path) {
            Ok(f) => f,
            // Freed between the listing and now.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(corrupt(e.to_string())),
        };
        // Read whole: `from_reader` on a bare file reads it a byte per system call.
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut text).map_err(|e| corrupt(e.to_string()))?;
        let alloc: Allocation =
            serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
        if alloc.mib < 0 || alloc.mib.checked_mul(MIB).is_none_or(|b| b > MAX_GPU_BYTES) {
            return Err(corrupt(format!("{} MiB", alloc.mib)));
        }
        let key = lock_key(&file.metadata().map_err(|e| corrupt(e.to_string()))?);
        if alloc.leaked {
            return Ok(Some((alloc, key)));
        }
        Ok(
            match locked(file, FlockOperation::NonBlockingLockExclusive) {
                // A holder's shared lock, or the release watcher's exclusive one.
                Err(rustix::io::Errno::WOULDBLOCK) => Some((alloc, key)),
                Err(e) => return Err(corrupt(e.to_string())),
                Ok(_lock) => {
                    if self.spec.release_ms > 0 && watcher_alive(path) {
                        // The last holder just went; the watcher is about to take over the release.
                        return Ok(Some((alloc, key)));
                    }
                    remove_allocation(path);
                    None
                }
            },
        )
    }

    /// Checks an allocation's size against the GPU's memory (a real driver refuses more).
    fn check_size(&self, mib: i64) -> Result<(), GpuError> {
        let total = self.spec.mem_bytes / MIB;
        if mib < 0 || mib > total {
            return Err(state_err(
                &self.dir,
                format!("{mib} MiB does not fit a GPU of {total} MiB"),
            ));
        }
        Ok(())
    }

    /// What the simulated driver reports, per GPU index.
    fn usage(&self) -> Result<Usage, GpuError> {
        let mut used = vec![0i64; self.spec.count];
        // A GPU computes only for a process whose own memory is there: a context's footprint
        // and memory nobody holds keep it idle, as on a real GPU.
        let mut busy = vec![false; self.spec.count];
        let mut procs: Vec<BTreeMap<Listed, i64>> = vec![BTreeMap::new(); self.spec.count];
        let mut gi_used: Vec<BTreeMap<u32, i64>> = vec![BTreeMap::new(); self.spec.count];
        let mut lockers = None;
        for live in self.live()? {
            let a = &live.alloc;
            let Some(i) = usize::try_from(a.gpu).ok().filter(|&i| i < self.spec.count) else {
                continue;
            };
            // Sizes were checked (at most 1 PiB each): saturating sums cannot wrap to "free".
            let bytes = a.mib.saturating_mul(MIB);
            used[i] = used[i].saturating_add(bytes);
            if let Some((gi, _)) = a.mig {
                let u = gi_used[i].entry(gi).or_default();
                *u = u.saturating_add(bytes);
            }
            busy[i] |= !a.leaked && !a.footprint;
            if a.leaked || a.footprint || a.unlisted_until_ms.is_some_and(|t| epoch_ms() < t) {
                continue;
            }
            // The driver names every process by its pid in the host's namespace: a
            // container's, made in a namespace of its own, by its host pid, where this reader
            // sees the host's. A reader in another namespace gets the pids of its own, and
            // another namespace's only in `raw` mode.
            let pid = if a.ns == self.own_ns {
                Some(a.creator)
            } else if self.own_ns == self.host_ns {
                live.locker(&mut lockers)
            } else {
                self.spec.foreign_pids_raw.then_some(a.creator)
            };
            if let Some(pid) = pid {
                // In MIG mode the driver lists a process on each instance it uses, with the
                // instance's ids.
                let mem = procs[i].entry((pid, a.mig)).or_default();
                *mem = mem.saturating_add(bytes);
            }
        }
        let procs = procs
            .into_iter()
            .map(|m| {
                m.into_iter()
                    .map(|((pid, mig), mem)| DriverProc { pid, mem, mig })
                    .collect()
            })
            .collect();
        Ok(Usage {
            used,
            procs,
            busy,
            gi_used,
        })
    }

    /// Records an allocation with no holder (`gpuloop sim leak`), on an instance of a GPU in
    /// MIG mode.
    pub fn leak(&self, gpu: i64, mig: Option<(u32, u32)>, mib: i64) -> Result<PathBuf, GpuError> {
        self.minor(gpu)?;
        self.check_instance(gpu, mig)?;
        self.check_size(mib)?;
        let alloc = Allocation {
            gpu,
            mib,
            creator: 0,
            ns: self.host_ns,
            leaked: true,
            footprint: false,
            unlisted_until_ms: None,
            mig,
        };
        let path = self.alloc_dir().join(format!(
            "leak-g{gpu}-{}.json",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        fs::write(&path, serde_json::to_vec(&alloc).unwrap_or_default())
            .map_err(|e| state_err(&self.dir, e))?;
        Ok(path)
    }

    /// Fails as a real allocation does when `mib` more would not fit on the GPU, or on its
    /// MIG instance.
    pub(crate) fn check_capacity(
        &self,
        gpu: i64,
        mig: Option<(u32, u32)>,
        mib: i64,
    ) -> Result<(), GpuError> {
        let i = self.minor(gpu).map(|_| gpu as usize)?;
        let usage = self.usage()?;
        let (total, used) = match mig.and_then(|(gi, ci)| self.mig_of(i)?.instance(gi, ci)) {
            Some(g) => (
                g.mem_gib * 1024 * MIB,
                usage.gi_used[i].get(&g.gi).copied().unwrap_or(0),
            ),
            None => (self.spec.mem_bytes, usage.used.get(i).copied().unwrap_or(0)),
        };
        let total_mib = total / MIB;
        let free_mib = (total_mib - used / MIB).max(0);
        if mib > free_mib {
            return Err(GpuError::OutOfMemory {
                index: gpu,
                mib,
                free_mib,
                total_mib,
            });
        }
        Ok(())
    }

    /// Creates an allocation held by this process; the returned locked file is the handle.
    /// A `footprint` allocation is not listed by the simulated driver; one `unlisted_for` a
    /// while is listed only after it.
    pub fn allocate(
        &self,
        gpu: i64,
        mig: Option<(u32, u32)>,
        mib: i64,
        footprint: bool,
        unlisted_for: Option<std::time::Duration>,
    ) -> Result<(PathBuf, File), GpuError> {
        self.minor(gpu)?;
        self.check_instance(gpu, mig)?;
        self.check_size(mib)?;
        let pid = std::process::id() as i32;
        let alloc = Allocation {
            gpu,
            mib,
            creator: pid,
            ns: self.own_ns,
            leaked: false,
            footprint,
            unlisted_until_ms: unlisted_for.map(|d| epoch_ms() + d.as_millis() as u64),
            mig,
        };
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!("g{gpu}-{pid}-{stamp}.json");
        let tmp = self.alloc_dir().join(format!(".{name}"));
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&tmp)
            .map_err(|e| state_err(&self.dir, e))?;
        serde_json::to_writer(&file, &alloc).map_err(|e| state_err(&self.dir, e))?;
        let lock = locked(file, FlockOperation::NonBlockingLockShared)
            .map_err(|e| state_err(&self.dir, e))?;
        // Visible only once held, so no reader ever sees it unheld and frees it.
        let path = self.alloc_dir().join(name);
        fs::rename(&tmp, &path).map_err(|e| state_err(&self.dir, e))?;
        Ok((path, lock))
    }
}

/// A locked file as the kernel names it in its lock lines: (major, minor, inode).
type LockKey = (u32, u32, u64);

/// A file's name in the kernel's lock lines, from its metadata.
fn lock_key(m: &fs::Metadata) -> LockKey {
    use std::os::unix::fs::MetadataExt;
    (
        rustix::fs::major(m.dev()),
        rustix::fs::minor(m.dev()),
        m.ino(),
    )
}

/// One `flock` of /proc/locks or of an fd's fdinfo (after `lock:`): the file, and the pid
/// of the process that took the lock in this reader's PID namespace (0 when that process is
/// gone or not visible here). "1: FLOCK  ADVISORY  READ 4711 00:2c:1234 0 EOF"; a waiter's
/// line ("1: -> FLOCK …") is none.
fn lock_line(line: &str) -> Option<(LockKey, i32)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.get(1) != Some(&"FLOCK") {
        return None;
    }
    let pid: i32 = f.get(4)?.parse().ok()?;
    let mut id = f.get(5)?.split(':');
    let major = u32::from_str_radix(id.next()?, 16).ok()?;
    let minor = u32::from_str_radix(id.next()?, 16).ok()?;
    let ino = id.next()?.parse().ok()?;
    Some(((major, minor, ino), pid))
}

/// Who holds each allocation's lock, by the file's (major, minor, inode), as the kernel tells
/// it in /proc/locks: the pid of the process that took it, in this reader's PID namespace.
/// That is how a containerized creator is listed by its host pid, as a real driver lists it;
/// one read, taken only for an allocation made in another namespace whose lock's taker is not
/// recorded alive (`Live::locker`).
struct Lockers(BTreeMap<LockKey, i32>);

impl Lockers {
    fn read() -> Lockers {
        let text = fs::read_to_string("/proc/locks").unwrap_or_default();
        Lockers(
            text.lines()
                .filter_map(lock_line)
                .filter(|&(_, pid)| pid > 0)
                .collect(),
        )
    }
}

/// An allocation whose memory is in use.
struct Live {
    path: PathBuf,
    alloc: Allocation,
    /// Its file, as the kernel's lock lines name it.
    key: LockKey,
    /// Its lock's taker, as recorded beside it.
    seen: Vec<Seen>,
}

/// A record of which process took an allocation's lock: the empty file
/// `NAME.locker.PID.INO` beside `NAME.json`, the process by its pid here and the inode of its
/// pidfd (pidfs: unique for the boot). A name is made whole or not at all, and read with the
/// directory's listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    pid: i32,
    ino: u64,
}

impl Seen {
    const MARK: &'static str = ".locker.";

    /// The allocation's file name and the record, from a record's file name.
    fn parse(name: &str) -> Option<(String, Seen)> {
        let (stem, at) = name.split_once(Self::MARK)?;
        let (pid, ino) = at.split_once('.')?;
        let seen = Seen {
            pid: pid.parse().ok().filter(|&p: &i32| p > 0)?,
            ino: ino.parse().ok()?,
        };
        Some((format!("{stem}.json"), seen))
    }

    /// Its file beside `alloc`.
    fn path(&self, alloc: &Path) -> PathBuf {
        let stem = alloc.file_stem().unwrap_or_default().to_string_lossy();
        alloc.with_file_name(format!("{stem}{}{}.{}", Self::MARK, self.pid, self.ino))
    }

    /// Whether the process it names is alive and the same (its pidfd's inode unchanged): no
    /// /proc file is read. While it is, /proc/locks names it by this pid: a lock's pid is its
    /// taker's, fixed for as long as the lock is there, and the lock is there as long as the
    /// taker lives (a holder keeps its allocation open until it exits; a release watcher that
    /// takes the lock over removes the records).
    fn holds(&self) -> bool {
        pidfs_ino(self.pid) == Some(self.ino)
    }
}

/// The pidfs inode of the process at `pid` here: what tells it apart from any later process
/// with its pid. `None` when it is gone, or where pidfds cannot tell processes apart here (no
/// pidfs, or a /proc of another PID namespace than the one `pidfd_open` counts in).
fn pidfs_ino(pid: i32) -> Option<u64> {
    // pidfd_open counts pids in this process's namespace; /proc (which the records' pids
    // came from) must count them there too.
    static NUMBERED_HERE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let numbered_here = NUMBERED_HERE.get_or_init(|| {
        let me = std::process::id();
        fs::read_link("/proc/self")
            .ok()
            .is_some_and(|l| l.to_str() == Some(me.to_string().as_str()))
    });
    if !numbered_here || !crate::pidfs::available() {
        return None;
    }
    let fd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid)?,
        rustix::process::PidfdFlags::empty(),
    )
    .ok()?;
    crate::pidfs::ino(&fd)
}

/// The lock line an fd of the process at `pid` has on the file `key` (/proc/PID/fdinfo/FD),
/// as /proc/locks gives it. `None` when the process is gone or unreadable, or the fd is
/// closed, is another file, or holds no lock on this one.
fn fd_lock(pid: i32, fd: i32, key: LockKey) -> Option<i32> {
    // One read: the whole of an fdinfo (its lock lines included) is a few hundred bytes.
    let file = File::open(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    let mut buf = [0u8; 4096];
    let n = std::io::Read::read(&mut &file, &mut buf).ok()?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .lines()
        .filter_map(|l| lock_line(l.strip_prefix("lock:")?))
        .find(|&(k, _)| k == key)
        .map(|(_, pid)| pid)
}

impl Live {
    /// The pid here of the process that took the lock, as /proc/locks names it: through the
    /// record of its taker while that process lives on (`Seen::holds`), else read (once for
    /// all the allocations that need it) into `lockers`. A record whose process is gone, or
    /// whose pid is another process's now, is removed and never names anyone.
    fn locker(&self, lockers: &mut Option<Lockers>) -> Option<i32> {
        for seen in &self.seen {
            if seen.holds() {
                return Some(seen.pid);
            }
            let _ = fs::remove_file(seen.path(&self.path));
        }
        let pid = *lockers.get_or_insert_with(Lockers::read).0.get(&self.key)?;
        self.record(pid);
        Some(pid)
    }

    /// Records the process at `pid` as the lock's taker, once it is seen holding the lock it
    /// is named by (an fd of its on the allocation whose lock line names it); left unrecorded
    /// where that cannot be seen or the state directory is not writable.
    fn record(&self, pid: i32) {
        // Its pidfd's inode before and after: the process seen holding the lock in between,
        // by pid, is the one the record names.
        let Some(ino) = pidfs_ino(pid) else {
            return;
        };
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            return;
        };
        let holds = fds.flatten().any(|e| {
            let fd = e.file_name().to_str().and_then(|n| n.parse().ok());
            fd.is_some_and(|fd| {
                fs::metadata(e.path()).is_ok_and(|m| lock_key(&m) == self.key)
                    && fd_lock(pid, fd, self.key) == Some(pid)
            })
        });
        if !holds || pidfs_ino(pid) != Some(ino) {
            return;
        }
        let record = Seen { pid, ino }.path(&self.path);
        if File::create(&record).is_ok() && !self.path.exists() {
            // Freed meanwhile: its record goes with it.
            let _ = fs::remove_file(&record);
        }
    }
}

/// Removes a freed allocation and what was kept beside it.
fn remove_allocation(alloc: &Path) {
    let _ = fs::remove_file(alloc);
    let _ = fs::remove_file(alloc.with_extension("watcher"));
    remove_records(alloc);
}

/// Removes the records of `alloc`'s lock's taker.
fn remove_records(alloc: &Path) {
    let (Some(dir), Some(name)) = (alloc.parent(), alloc.file_name()) else {
        return;
    };
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    let name = name.to_string_lossy();
    for entry in rd.flatten() {
        let n = entry.file_name();
        if Seen::parse(&n.to_string_lossy()).is_some_and(|(of, _)| of == name) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// A process the simulator started is still running: not gone, not a zombie left to reap.
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X', 'x']))
        })
        .is_some_and(|gone| !gone)
}

fn watcher_alive(alloc: &Path) -> bool {
    fs::read_to_string(alloc.with_extension("watcher"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

/// The release watcher (`gpuloop sim watch FILE`): waits for the last holder of an allocation
/// to go, then keeps the memory used for `release_ms` before freeing it.
pub fn watch(sim: &SimBackend, alloc: &Path, release_ms: u64) -> Result<(), GpuError> {
    let dir = sim.alloc_dir();
    // Internal, but reachable from the command line: it only ever acts on an allocation
    // file of this simulator (it deletes the file it watches).
    let name = alloc.file_name().map(|n| n.to_string_lossy().into_owned());
    let inside = match (alloc.parent().map(Path::canonicalize), dir.canonicalize()) {
        (Some(Ok(parent)), Ok(own)) => parent == own,
        _ => false,
    };
    let is_alloc = name
        .as_deref()
        .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"));
    if !inside || !is_alloc || !fs::symlink_metadata(alloc).is_ok_and(|m| m.is_file()) {
        return Err(state_err(
            &dir,
            format!(
                "sim watch acts only on an allocation file of {}, not {}",
                dir.display(),
                alloc.display()
            ),
        ));
    }
    let file = File::open(alloc).map_err(|e| state_err(&dir, e))?;
    fs::write(
        alloc.with_extension("watcher"),
        std::process::id().to_string(),
    )
    .map_err(|e| state_err(&dir, e))?;
    let dir = dir.as_path();
    // Blocks until every process holding the allocation's handle is gone.
    let lock = locked(file, FlockOperation::LockExclusive).map_err(|e| {
        let _ = fs::remove_file(alloc.with_extension("watcher"));
        state_err(dir, e)
    })?;
    // The lock is the watcher's now: no record of the holder's taker stands for it.
    remove_records(alloc);
    std::thread::sleep(std::time::Duration::from_millis(release_ms));
    // When each release happens, for tests and benchmarks that measure how soon it is seen;
    // logged before the memory reads free, so a reader that saw it free finds the line.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let name = alloc
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let log = dir.parent().unwrap_or(dir).join("released.log");
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
        use std::io::Write;
        // One write of the whole line: O_APPEND keeps concurrent watchers' lines whole.
        let _ = f.write_all(format!("{name} {stamp:.6}\n").as_bytes());
    }
    remove_allocation(alloc);
    drop(lock);
    Ok(())
}

impl Backend for SimBackend {
    fn kind(&self) -> crate::gpu::BackendKind {
        crate::gpu::BackendKind::Sim
    }

    /// The simulated driver answers every field from one look at the allocations.
    fn inventory_gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        self.gpus()
    }

    fn gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        let usage = self.usage()?;
        // The minors file is read only where a GPU is in MIG mode (most specs have none).
        let any = self.spec.mig.values().any(mig::SimMig::enabled);
        let mut devices: BTreeMap<usize, Vec<super::mig::MigDevice>> = match any {
            true => self
                .mig_devices(&self.minors_file(), &usage)
                .into_iter()
                .collect(),
            false => BTreeMap::new(),
        };
        let Usage {
            used, procs, busy, ..
        } = usage;
        let faults = self.fault_state()?;
        Ok(procs
            .into_iter()
            .enumerate()
            .map(|(i, driver_procs)| {
                // A GPU off the bus answers nothing, as NVML's "GPU is lost".
                if faults.get(&(i as i64)).is_some_and(|f| f.off_bus) {
                    let mut g = Gpu::failed(
                        i as i64,
                        i64::from(self.spec.minors[i]),
                        format!("GPU {i}: GPU is lost"),
                    );
                    g.lost = true;
                    g.bus_id = Self::bus_id(i);
                    return g;
                }
                let mut g = Gpu::new(
                    i as i64,
                    i64::from(self.spec.minors[i]),
                    // Distinct from the first digits on, as real UUIDs are, so that prefixes
                    // (`--gpu GPU-3c6e`) select one GPU.
                    format!(
                        "GPU-{:08x}-5151-4000-8000-{i:012}",
                        (i as u32 + 1).wrapping_mul(0x9e37_79b9)
                    ),
                    self.spec.name.clone(),
                    Self::bus_id(i),
                    self.spec.mem_bytes,
                    used[i].min(self.spec.mem_bytes),
                    driver_procs,
                );
                g.util = Some(if busy[i] { 100 } else { 0 });
                g.temp_c = Some(if busy[i] { 61 } else { 34 });
                // Every simulated GPU supports MIG, as an H100 or H200 does.
                let m = self.mig_of(i).cloned().unwrap_or_default();
                g.mig = Some(m.record(devices.remove(&i).unwrap_or_default()));
                g
            })
            .collect())
    }

    fn nodes(&self) -> &DeviceNodes {
        &self.nodes
    }

    fn foreign_pid_namespace(&self) -> bool {
        self.own_ns != self.host_ns
    }

    /// A reset with the driver's semantics: refused while anything uses the GPU (a process
    /// holding its memory, a process with its node or a MIG capability open, `nvidia_drm`
    /// with modeset), failed on a GPU off the bus; once done, the memory nobody held is free,
    /// the volatile ECC counts are 0, a pending remap is applied.
    fn reset(&self, index: i64, _run: &crate::gpu::RunHelper) -> Result<(), GpuError> {
        self.minor(index)?;
        let refused = |why: String| Err(GpuError::Reset { index, why });
        if self.fault_state()?.get(&index).is_some_and(|f| f.off_bus) {
            return refused(format!(
                "GPU {index} is lost (it fell off the bus): a reset cannot reach it; reboot the node"
            ));
        }
        let live = self.live_allocations()?;
        let on_gpu: Vec<_> = live.iter().filter(|(_, a)| a.gpu == index).collect();
        if let Some((_, a)) = on_gpu.iter().find(|(_, a)| !a.leaked) {
            return refused(format!(
                "GPU {index} is in use (pid {} holds {} MiB); stop its processes first",
                a.creator, a.mib
            ));
        }
        let node = self.node_path(index)?;
        if self.in_use(&node)? {
            return refused(format!(
                "GPU {index} is in use by another client: a process has {} open (an NVML client such as nvidia-smi, a daemon, a CUDA context); stop it first",
                node.display()
            ));
        }
        // `config`, and the capabilities of this GPU's instances.
        let mut caps = vec![self.dir.join("dev").join(CAP_NODE)];
        for d in self.mig_instances().iter().filter(|d| d.gpu == index) {
            if let Some((gi, ci)) = mig::ids(&d.key()) {
                caps.extend(self.cap_paths(index, gi, ci));
            }
        }
        for cap in caps {
            if self.in_use(&cap)? {
                return refused(format!(
                    "a process has the MIG capability {} open; stop it first",
                    cap.display()
                ));
            }
        }
        if self.modeset() == Some(true) {
            return refused(
                "nvidia_drm is loaded with modeset=1 and holds the GPU; unload it first (modprobe -r nvidia_drm)".into(),
            );
        }
        for (path, _) in on_gpu {
            fs::remove_file(path).map_err(|e| state_err(&self.dir, e))?;
            remove_records(path);
        }
        self.after_reset(index)
    }

    fn faults(&self, indices: &[i64]) -> Result<Vec<crate::gpu::DeviceFaults>, GpuError> {
        let state = self.fault_state()?;
        Ok(indices
            .iter()
            .filter(|&&i| self.minor(i).is_ok())
            .map(|&i| {
                let f = state.get(&i).cloned().unwrap_or_default();
                crate::gpu::DeviceFaults {
                    index: i,
                    bus_id: Self::bus_id(i as usize),
                    // A GPU off the bus answers no query.
                    faults: if f.off_bus {
                        crate::gpu::Faults::default()
                    } else {
                        Self::reported(&f)
                    },
                }
            })
            .collect())
    }

    fn drm_modeset(&self) -> Option<bool> {
        self.modeset()
    }

    fn mig_minors(&self) -> super::mig::MigMinors {
        self.minors_file()
    }
}

impl SimBackend {
    /// Whether a process has the node file `path` open: every holder keeps a shared `flock`
    /// on each node it opens, which goes when its last fd on it closes.
    fn in_use(&self, path: &Path) -> Result<bool, GpuError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(state_err(&self.dir, e)),
        };
        match locked(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(_probe) => Ok(false),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
            Err(e) => Err(state_err(&self.dir, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let s = SimSpec::parse("8x80G").unwrap();
        assert_eq!(
            (s.count, s.mem_bytes, s.release_ms),
            (8, 80 * 1024 * MIB, 0)
        );
        assert_eq!(s.minors, (0..8).collect::<Vec<_>>());
        let s = SimSpec::parse("2x8G,release_ms=300,minors=1:0").unwrap();
        assert_eq!(
            (s.count, s.release_ms, s.minors.clone()),
            (2, 300, vec![1, 0])
        );
        assert_eq!(SimSpec::parse("4x512M").unwrap().mem_bytes, 512 * MIB);
        assert_eq!(
            SimSpec::parse("1x141GiB").unwrap().mem_bytes,
            141 * 1024 * MIB
        );
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "",
            "8",
            "x80G",
            "0x80G",
            "8x",
            "8x80Q",
            "8x-1G",
            "2x8G,foo=1",
            "2x8G,release_ms=x",
            "2x8G,minors=0:0",
            "2x8G,minors=0",
            "100x1G",
        ] {
            let err = SimSpec::parse(bad).unwrap_err().to_string();
            assert!(err.contains("bad --sim spec"), "{bad}: {err}");
        }
    }
}
