//! The NVML backend: the NVIDIA driver's own view, loaded from `libnvidia-ml.so.1` at run time.

use super::deadline::{self, Late, Pending};
use super::faults::{Ecc, Faults, RecoveryAction, RemappedRows, RetiredPages};
use super::{Backend, DeviceFaults, DeviceNodes, DriverProc, Gpu, GpuError};
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::MemoryInfo;
use nvml_wrapper::Nvml;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) struct NvmlBackend {
    nvml: &'static Nvml,
    nodes: DeviceNodes,
    foreign_ns: bool,
    /// How long one GPU's read may take before it is reported as hung.
    limit: Duration,
    /// GPUs whose given-up read has not returned yet, with its "returned" flag.
    late: Mutex<BTreeMap<u32, Arc<AtomicBool>>>,
}

/// One GPU read, with the time its queries took.
type GpuRead = Result<(Gpu, Timings), GpuError>;
/// Reads GPU `i`.
type ReadOne = dyn Fn(u32) -> GpuRead + Send + Sync;

/// The error of a GPU whose earlier read is still stuck in the driver.
fn still_stuck(i: u32) -> GpuError {
    GpuError::Nvml(format!(
        "GPU {i}: an earlier driver call on it has not returned (the driver is hung on this GPU)"
    ))
}

fn nvml_err(e: NvmlError) -> GpuError {
    GpuError::Nvml(e.to_string())
}

/// The groups of driver queries whose time `-v` reports (where a one-shot's time goes).
#[derive(Clone, Copy)]
enum Query {
    Devices,
    Memory,
    Ids,
    Processes,
    Util,
    Temperature,
}

/// Time spent per group of queries, on one GPU or summed over several.
#[derive(Default)]
struct Timings {
    spent: [Duration; 6],
}

impl Timings {
    fn time<T>(&mut self, q: Query, f: impl FnOnce() -> T) -> T {
        let (v, spent) = timed(f);
        self.add(q, spent);
        v
    }

    /// Adds time spent on `q` elsewhere (on another thread).
    fn add(&mut self, q: Query, spent: Duration) {
        self.spent[q as usize] += spent;
    }

    fn add_all(&mut self, other: &Timings) {
        for (a, b) in self.spent.iter_mut().zip(other.spent) {
            *a += b;
        }
    }

    fn log(&self, what: &str, count: u32, wall: std::time::Duration) {
        let ms = |q: Query| self.spent[q as usize].as_secs_f64() * 1e3;
        tracing::debug!(
            "nvml {what}: {} in {:.2} ms, done at {:.1} ms (in parallel; summed over GPUs: handles {:.2} ms, memory {:.2} ms, ids {:.2} ms, processes {:.2} ms, util {:.2} ms, temperature {:.2} ms)",
            crate::words::count(count as usize, "GPU", "GPUs"),
            wall.as_secs_f64() * 1e3,
            crate::timeline::ms(),
            ms(Query::Devices),
            ms(Query::Memory),
            ms(Query::Ids),
            ms(Query::Processes),
            ms(Query::Util),
            ms(Query::Temperature)
        );
    }
}

/// `f`'s value and the time it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = std::time::Instant::now();
    (f(), started.elapsed())
}

/// The driver's user-space library, as every NVIDIA tool loads it.
const LIB_NAME: &str = "libnvidia-ml.so.1";

/// Often a laptop or a CI runner: the simulator is how to try gpuloop there.
const NO_LIBRARY_HINT: &str =
    "(is the NVIDIA driver installed? Without GPUs, try the simulator: gpuloop --sim 8x80G gpus)";

/// What failed, for "no NVIDIA driver: …": the library not loading, or the driver refusing init.
fn no_driver_reason(lib: &OsStr, e: NvmlError) -> String {
    let lib = lib.to_string_lossy();
    match e {
        NvmlError::LibloadingError(e) => {
            let why = e.to_string();
            let why = why
                .trim_start_matches("DlOpen { desc: \"")
                .trim_end_matches("\" }");
            // dlopen's message names the file already ("libnvidia-ml.so.1: cannot open …").
            let why = if why.contains(lib.as_ref()) {
                why.to_string()
            } else {
                format!("{lib}: {why}")
            };
            format!("{why} {NO_LIBRARY_HINT}")
        }
        NvmlError::FailedToLoadSymbol(s) => {
            format!("{lib} is not a usable NVML library (missing {s})")
        }
        e => format!("{lib} loaded but the driver did not initialise ({e})"),
    }
}

/// The driver library of this process: loaded at most once and never shut down (nvmlShutdown
/// costs 3.5 ms on an H200 and frees nothing the kernel does not free at exit, when it closes
/// the driver's fds), so nothing accumulates in the REPL, the agent or the MCP server.
enum Lib {
    Unloaded,
    /// Loading on a worker of its own: started early by `preload`, or by the first `load`.
    Loading(Pending<Result<Opened, GpuError>>),
    Loaded(&'static Nvml),
}

/// A library just loaded, with when (ms on `timeline`) its load and init began and ended: a
/// preload may end before `-v`'s logging is set up, so the reader logs it.
struct Opened {
    nvml: &'static Nvml,
    lib: OsString,
    from_ms: f64,
    to_ms: f64,
}

static LIB: Mutex<Lib> = Mutex::new(Lib::Unloaded);

/// `GPULOOP_NVML_LIB`, else the driver's own library.
fn lib_path() -> OsString {
    std::env::var_os("GPULOOP_NVML_LIB")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| LIB_NAME.into())
}

/// The largest library `GPULOOP_NVML_LIB` may name (the driver's is a few MiB).
const MAX_LIB: u64 = 256 << 20;

/// The library a path names (`GPULOOP_NVML_LIB=/opt/…/libnvidia-ml.so.1`), as gpuloop loads
/// it: opened as every file gpuloop trusts is (`journal::files::open_trusted`: no link
/// another account planted, a regular file of root's or this user's that nobody else may
/// write, since a library loaded as root is code run as root), then copied into memory, from
/// which the loader maps it. The open and the reads run on the load's worker, under its
/// deadline; the loader itself (which holds a lock the C library's `exit` waits for) then
/// touches no file system that could hang.
fn in_memory(path: &Path) -> Result<OwnedFd, String> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = crate::journal::files::open_trusted(path).map_err(|e| match e {
        crate::journal::files::FileError::Io { path, source } => format!(
            "{}: cannot open shared object file: {source} {NO_LIBRARY_HINT}",
            path.display()
        ),
        refused => {
            format!("GPULOOP_NVML_LIB {refused} (a library loaded as root is code run as root)")
        }
    })?;
    let memfd = |flags| rustix::fs::memfd_create("gpuloop-nvml", flags);
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // Kernels that can refuse to run a memfd (vm.memfd_noexec) are asked for one that runs;
    // older ones do not know the flag, and every memfd of theirs runs.
    let mem = memfd(flags | MemfdFlags::EXEC)
        .or_else(|_| memfd(flags))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let copied = std::io::copy(
        &mut std::io::Read::take(std::fs::File::from(fd), MAX_LIB + 1),
        &mut std::fs::File::from(mem.try_clone().map_err(|e| e.to_string())?),
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    if copied > MAX_LIB {
        return Err(format!(
            "{}: larger than {} MiB: not a driver library",
            path.display(),
            MAX_LIB >> 20
        ));
    }
    let _ = rustix::fs::fcntl_add_seals(
        &mem,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    );
    Ok(mem)
}

/// Starts loading and initialising the driver library now, on a worker of its own, unless
/// that has begun already. A one-shot calls it first thing, so that NVML's ~10 ms of
/// initialisation overlap everything gpuloop does before it needs the driver (arguments,
/// config, the /proc scan); `NvmlBackend::load` then takes its result.
pub(crate) fn preload() {
    let mut lib = LIB.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(*lib, Lib::Unloaded) {
        if let Ok(p) = deadline::start("nvmlInit", open) {
            *lib = Lib::Loading(p);
        }
    }
}

/// Loads and initialises the library, then starts attaching every GPU: each GPU's first
/// handle makes the driver attach it (6-9 ms on an H200, the largest per-GPU cost), and every
/// read that follows a load needs every GPU's handle, so the attaches begin right after init,
/// one worker each, instead of after the handover to the reader. A reader asking for a
/// handle meanwhile waits inside the driver for the same attach; one that is stuck in the
/// driver is the reader's deadline's business.
fn open() -> Result<Opened, GpuError> {
    let lib = lib_path();
    let from_ms = crate::timeline::ms();
    // A path is loaded from memory (`in_memory`); a bare name, as the driver's own, is found
    // by the loader where the system keeps its libraries.
    let copy = match lib.as_encoded_bytes().contains(&b'/') {
        true => Some(in_memory(Path::new(&lib)).map_err(GpuError::NoDriver)?),
        false => None,
    };
    let load: OsString = match &copy {
        Some(fd) => format!("/proc/self/fd/{}", fd.as_raw_fd()).into(),
        None => lib.clone(),
    };
    let nvml = Nvml::builder()
        .lib_path(&load)
        .init()
        .map_err(|e| GpuError::NoDriver(no_driver_reason(&lib, e)))?;
    drop(copy);
    let nvml: &'static Nvml = Box::leak(Box::new(nvml));
    let to_ms = crate::timeline::ms();
    for i in 0..nvml.device_count().unwrap_or(0) {
        let _ = std::thread::Builder::new()
            .name(format!("gpuloop-driver-attach-{i}"))
            .spawn(move || {
                let _ = nvml.device_by_index(i);
            });
    }
    Ok(Opened {
        nvml,
        lib,
        from_ms,
        to_ms,
    })
}

/// Why a load gave no result.
enum Waited {
    Late(Late),
    /// Ctrl-C or SIGTERM came first.
    Interrupted,
}

/// The load's result, if it comes within `limit` and before an interrupt.
fn wait_for_load(
    pending: &Pending<Result<Opened, GpuError>>,
    limit: Duration,
) -> Result<Result<Opened, GpuError>, Waited> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let slice = (std::time::Instant::now() + Duration::from_millis(50)).min(deadline);
        match pending.wait_until(slice) {
            Err(Late::Timeout) if std::time::Instant::now() < deadline => {}
            done => return done.map_err(Waited::Late),
        }
        if crate::interrupt::is_set() {
            return Err(Waited::Interrupted);
        }
    }
}

/// Whether a load of the driver library has not returned: it may hold the loader's lock,
/// which the C library's `exit` waits for (`_dl_fini`), so gpuloop must end without it.
pub(crate) fn load_pending() -> bool {
    match LIB.try_lock() {
        Ok(lib) => matches!(&*lib, Lib::Loading(p) if !p.returned().load(Ordering::SeqCst)),
        // Someone is waiting for a load at the very end: it has not returned either.
        Err(_) => true,
    }
}

impl NvmlBackend {
    /// The driver library, loaded and initialised (`GPULOOP_NVML_LIB` names another file), or
    /// the load `preload` started, waited for until `limit`. `Err(GpuError::NoDriver)` says
    /// what failed, as nvidia-smi would; a load still running at `limit` is hung in the
    /// driver (the next `load` waits for the same one again).
    pub(crate) fn load(limit: Duration) -> Result<NvmlBackend, GpuError> {
        let mut lib = LIB.lock().unwrap_or_else(|p| p.into_inner());
        let pending = match std::mem::replace(&mut *lib, Lib::Unloaded) {
            Lib::Loaded(nvml) => {
                *lib = Lib::Loaded(nvml);
                return Ok(Self::on(nvml, limit));
            }
            Lib::Loading(p) => p,
            Lib::Unloaded => deadline::start("nvmlInit", open)?,
        };
        match wait_for_load(&pending, limit) {
            Ok(Ok(o)) => {
                tracing::debug!(
                    "nvml: {} loaded and initialised in {:.1} ms (from {:.1} to {:.1} ms)",
                    o.lib.to_string_lossy(),
                    o.to_ms - o.from_ms,
                    o.from_ms,
                    o.to_ms
                );
                *lib = Lib::Loaded(o.nvml);
                Ok(Self::on(o.nvml, limit))
            }
            // Left unloaded: a later load tries again.
            Ok(Err(e)) => Err(e),
            Err(Waited::Late(Late::Timeout)) => {
                *lib = Lib::Loading(pending);
                Err(deadline::gave_up("nvmlInit", Late::Timeout, limit))
            }
            Err(Waited::Interrupted) => {
                *lib = Lib::Loading(pending);
                Err(GpuError::Interrupted)
            }
            Err(Waited::Late(late)) => Err(deadline::gave_up("nvmlInit", late, limit)),
        }
    }

    fn on(nvml: &'static Nvml, limit: Duration) -> NvmlBackend {
        NvmlBackend {
            nvml,
            nodes: Self::nodes(),
            foreign_ns: super::in_child_pid_namespace(),
            limit,
            late: Mutex::new(BTreeMap::new()),
        }
    }

    /// The driver's device nodes.
    pub(crate) fn nodes() -> DeviceNodes {
        DeviceNodes::new("/dev")
    }

    /// One GPU per device, in index order, built by `each` from its handle and memory; the
    /// time of each group of queries is logged under `what` (`-v`).
    ///
    /// A GPU's first handle attaches it in the driver (6.7 ms on an H200, more than all its
    /// queries), so GPUs are read in parallel, one thread each. Measured on 2x H200, the
    /// driver overlaps the two attaches only in part (inventory: 9.1 ms for 15.0 ms of handle
    /// time summed), and the per-GPU queries (utilisation, 2-4 ms each) overlap fully.
    ///
    /// A GPU whose read fails, or (with several GPUs) does not return within the driver
    /// deadline, is reported as such (`Gpu::error`, naming it) beside the others; while its
    /// given-up read is still stuck in the driver, later reads of it fail at once.
    fn each_device(
        &self,
        what: &str,
        each: impl Fn(&mut Timings, u32, &nvml_wrapper::Device, MemoryInfo) -> Gpu
            + Send
            + Sync
            + 'static,
    ) -> Result<Vec<Gpu>, GpuError> {
        let started = std::time::Instant::now();
        let count = self.nvml.device_count().map_err(nvml_err)?;
        let nvml = self.nvml;
        let one = move |i: u32| -> Result<(Gpu, Timings), GpuError> {
            // A fault names its GPU: "GPU 1: device fell off the bus …".
            let on = |e: NvmlError| match e {
                NvmlError::GpuLost => GpuError::Lost(format!("GPU {i}: {e}")),
                e => GpuError::Nvml(format!("GPU {i}: {e}")),
            };
            let mut t = Timings::default();
            let d = t
                .time(Query::Devices, || nvml.device_by_index(i))
                .map_err(on)?;
            let mem = t.time(Query::Memory, || d.memory_info()).map_err(on)?;
            Ok((each(&mut t, i, &d, mem), t))
        };
        let read: Vec<GpuRead> = if count <= 1 {
            // One GPU: the call's own deadline (`Deadline`) bounds it.
            (0..count).map(one).collect()
        } else {
            self.in_parallel(count, Arc::new(one))
        };
        let mut all = Timings::default();
        let mut out = Vec::with_capacity(count as usize);
        for (i, r) in read.into_iter().enumerate() {
            match r {
                Ok((g, t)) => {
                    all.add_all(&t);
                    out.push(g);
                }
                Err(e) => {
                    tracing::warn!("{e}");
                    let lost = matches!(e, GpuError::Lost(_));
                    let why = match e {
                        GpuError::Nvml(why) | GpuError::Lost(why) => why,
                        e => e.to_string(),
                    };
                    let mut g = Gpu::failed(i as i64, self.minor_of(i as u32), why);
                    g.lost = lost;
                    g.bus_id = self.bus_of(i as u32).unwrap_or_default();
                    out.push(g);
                }
            }
        }
        all.log(what, count, started.elapsed());
        Ok(out)
    }

    /// Runs `one` for every GPU on a worker thread of its own (`deadline::start`) and waits
    /// for all of them until one driver deadline; a GPU whose earlier read is still stuck is
    /// not asked again.
    fn in_parallel(&self, count: u32, one: Arc<ReadOne>) -> Vec<GpuRead> {
        // The lock is not held while waiting: a read of other GPUs (mem_used) goes on meanwhile.
        let stuck: Vec<u32> = {
            let mut late = self.late.lock().unwrap_or_else(|p| p.into_inner());
            late.retain(|_, done| !done.load(Ordering::SeqCst));
            late.keys().copied().collect()
        };
        let pending: Vec<_> = (0..count)
            .map(|i| {
                let one = one.clone();
                let started = (!stuck.contains(&i))
                    .then(|| deadline::start(&format!("GPU {i}"), move || one(i)));
                (i, started)
            })
            .collect();
        let until = std::time::Instant::now() + self.limit;
        let mut late = Vec::new();
        let read = pending
            .into_iter()
            .map(|(i, started)| match started {
                None => Err(still_stuck(i)),
                Some(Err(e)) => Err(e),
                Some(Ok(p)) => p.wait_until(until).unwrap_or_else(|why| match why {
                    Late::Timeout => {
                        late.push((i, p.returned()));
                        Err(GpuError::Nvml(format!(
                            "GPU {i}: the driver did not return within {:.1} s: it is hung on this GPU (a wedged GPU?); see dmesg for Xid errors (GPULOOP_DRIVER_TIMEOUT sets the deadline)",
                            self.limit.as_secs_f64()
                        )))
                    }
                    Late::Panicked => {
                        Err(GpuError::Nvml(format!("GPU {i}: the driver query panicked")))
                    }
                }),
            })
            .collect();
        self.late
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(late);
        read
    }

    /// The minor number of a GPU that failed to read (its index if the driver cannot say, or
    /// if its read is stuck): holders found by the /proc scan on its node are still its own.
    fn minor_of(&self, i: u32) -> i64 {
        let stuck = self
            .late
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&i);
        if stuck {
            return i64::from(i);
        }
        self.nvml
            .device_by_index(i)
            .and_then(|d| d.minor_number())
            .map_or(i64::from(i), i64::from)
    }

    /// The bus id of a GPU that failed to read, where the driver still says it (not for one
    /// whose read is stuck): the kernel log's events about it are matched by it.
    fn bus_of(&self, i: u32) -> Option<String> {
        if self.is_stuck(i) {
            return None;
        }
        self.nvml
            .device_by_index(i)
            .and_then(|d| d.pci_info())
            .ok()
            .map(|p| p.bus_id)
    }

    /// A read of GPU `i` given up earlier is still stuck in the driver.
    fn is_stuck(&self, i: u32) -> bool {
        self.late
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&i)
            .is_some_and(|done| !done.load(Ordering::SeqCst))
    }

    /// How many processes the driver lists on a device: the count queries only, unless a
    /// process may be in both lists (graphics ones exist), where only the lists can tell.
    fn process_count(device: &nvml_wrapper::Device) -> i64 {
        match device.running_graphics_processes_count() {
            Ok(0) | Err(_) => device
                .running_compute_processes_count()
                .map_or(0, i64::from),
            Ok(_) => Self::device_procs(device).len() as i64,
        }
    }

    fn device_procs(device: &nvml_wrapper::Device) -> Vec<DriverProc> {
        Self::procs_of(device, None)
    }

    /// The driver's processes on `device` (a GPU, or one MIG device, whose instance ids
    /// `mig` names), one entry per pid.
    fn procs_of(device: &nvml_wrapper::Device, mig: Option<(u32, u32)>) -> Vec<DriverProc> {
        // Compute and graphics lists overlap for processes that do both; one entry per pid.
        let mut by_pid: BTreeMap<i32, i64> = BTreeMap::new();
        let lists = [
            device.running_compute_processes(),
            device.running_graphics_processes(),
        ];
        for info in lists.into_iter().flatten().flatten() {
            let mem = match info.used_gpu_memory {
                UsedGpuMemory::Used(b) => b as i64,
                UsedGpuMemory::Unavailable => 0,
            };
            // Some drivers return garbage entries (pid 0, absurd pids); they are checked
            // against /proc by the holders join, here we only drop the impossible ones.
            let Ok(pid) = i32::try_from(info.pid) else {
                continue;
            };
            if pid <= 0 {
                continue;
            }
            let e = by_pid.entry(pid).or_insert(0);
            *e = (*e).max(mem);
        }
        by_pid
            .into_iter()
            .map(|(pid, mem)| DriverProc { pid, mem, mig })
            .collect()
    }
}

impl Backend for NvmlBackend {
    fn kind(&self) -> crate::gpu::BackendKind {
        crate::gpu::BackendKind::Nvml
    }

    fn gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        let nvml = self.nvml;
        self.each_device("gpus", move |t, i, d, mem| {
            // A GPU's first utilisation read costs 2-4 ms on an H200 and its process counts
            // ~1.7 ms, against well under 1 ms for everything else gpus asks: each runs on a
            // thread of its own beside the others, so a GPU's read takes about its slowest
            // query, not their sum.
            std::thread::scope(|sc| {
                let util = sc.spawn(|| timed(|| d.utilization_rates()));
                let procs = sc.spawn(|| timed(|| Self::process_count(d)));
                let (minor, uuid, name, bus_id) = t.time(Query::Ids, || {
                    (
                        d.minor_number().map(i64::from).unwrap_or(i64::from(i)),
                        d.uuid().unwrap_or_default(),
                        d.name().unwrap_or_default(),
                        d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                    )
                });
                let mut g = Gpu::new(
                    i64::from(i),
                    minor,
                    uuid,
                    name,
                    bus_id,
                    mem.total as i64,
                    mem.used as i64,
                    Vec::new(),
                );
                g.temp_c = t
                    .time(Query::Temperature, || d.temperature(TemperatureSensor::Gpu))
                    .ok()
                    .map(i64::from);
                let (mig, _) = t.time(Query::Processes, || mig_of(nvml, d, i64::from(i), minor));
                g.mig = mig;
                // A query whose thread panicked is unknown, like one the driver refused.
                if let Ok((u, spent)) = util.join() {
                    t.add(Query::Util, spent);
                    g.util = u.ok().map(|u| i64::from(u.gpu));
                }
                if let Ok((n, spent)) = procs.join() {
                    t.add(Query::Processes, spent);
                    g.procs = n;
                }
                g
            })
        })
    }

    fn inventory_gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        let nvml = self.nvml;
        self.each_device("inventory", move |t, i, d, mem| {
            let minor = t.time(Query::Ids, || {
                d.minor_number().map(i64::from).unwrap_or(i64::from(i))
            });
            // In MIG mode the driver lists each process on its instance's handle, with the
            // instance's ids: those lists are the GPU's.
            let (mig, procs) = t.time(Query::Processes, || {
                match mig_of(nvml, d, i64::from(i), minor) {
                    (Some(m), procs) if m.enabled() => (Some(m), procs),
                    (mig, _) => (mig, Self::device_procs(d)),
                }
            });
            let mut g = Gpu::new(
                i64::from(i),
                minor,
                String::new(),
                String::new(),
                String::new(),
                mem.total as i64,
                mem.used as i64,
                procs,
            );
            g.mig = mig;
            g
        })
    }

    fn mem_used(&self, indices: &[i64]) -> Result<Vec<(i64, i64)>, GpuError> {
        indices
            .iter()
            .map(|&i| {
                let d = u32::try_from(i)
                    .ok()
                    .and_then(|i| self.nvml.device_by_index(i).ok())
                    .ok_or(GpuError::NoSuchGpu {
                        index: i,
                        count: self.nvml.device_count().unwrap_or(0) as usize,
                    })?;
                if self.is_stuck(i as u32) {
                    return Err(still_stuck(i as u32));
                }
                let mem = d
                    .memory_info()
                    .map_err(|e| GpuError::Nvml(format!("GPU {i}: {e}")))?;
                Ok((i, mem.used as i64))
            })
            .collect()
    }

    fn nodes(&self) -> &DeviceNodes {
        &self.nodes
    }

    fn foreign_pid_namespace(&self) -> bool {
        self.foreign_ns
    }

    /// Each GPU's fault facts (about ten NVML calls), the GPUs side by side, one thread
    /// each; a GPU whose read is stuck in the driver is left out.
    fn faults(&self, indices: &[i64]) -> Result<Vec<DeviceFaults>, GpuError> {
        let nvml = self.nvml;
        let one = move |i: u32| -> Option<DeviceFaults> {
            let d = nvml.device_by_index(i).ok()?;
            Some(DeviceFaults {
                index: i64::from(i),
                bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                faults: device_faults(nvml, &d),
            })
        };
        let wanted: Vec<u32> = indices
            .iter()
            .filter_map(|&i| u32::try_from(i).ok())
            .filter(|&i| !self.is_stuck(i))
            .collect();
        Ok(std::thread::scope(|sc| {
            let reads: Vec<_> = wanted.iter().map(|&i| sc.spawn(move || one(i))).collect();
            // A read whose thread panicked is unknown, like one the driver refused.
            reads
                .into_iter()
                .filter_map(|r| r.join().ok().flatten())
                .collect()
        }))
    }

    fn reset(&self, index: i64, run: &super::RunHelper) -> Result<(), GpuError> {
        // NVML's reset needs the GPU idle and root; nvidia-smi gives the clearest message.
        let out = run(std::process::Command::new("nvidia-smi")
            .args(["-r", "-i", &index.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()))
        .map_err(|e| GpuError::Reset {
            index,
            why: format!("cannot run nvidia-smi: {e}"),
        })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(GpuError::Reset {
                index,
                why: String::from_utf8_lossy(&out.stdout).trim().to_string()
                    + String::from_utf8_lossy(&out.stderr).trim(),
            })
        }
    }
}

/// A GPU's MIG mode and, while it is enabled, its MIG devices and their processes (each
/// listed on its instance's handle, as NVML asks: the parent's list is an aggregate that
/// needs privileges). `None` for a GPU that does not support MIG, or a driver without it.
fn mig_of(
    nvml: &Nvml,
    d: &nvml_wrapper::Device,
    index: i64,
    minor: i64,
) -> (Option<super::mig::Mig>, Vec<DriverProc>) {
    use super::mig::{Mig, MigDevice, MigMinors, MigMode};
    let Ok(mode) = d.mig_mode() else {
        return (None, Vec::new());
    };
    let mut mig = Mig {
        current: MigMode::from_nvml(mode.current),
        pending: MigMode::from_nvml(mode.pending),
        instances: Vec::new(),
    };
    let mut procs = Vec::new();
    if !mig.enabled() {
        return (Some(mig), procs);
    }
    let minors = MigMinors::read(std::path::Path::new(super::mig::MINORS_FILE));
    let id = |f: Option<&unsafe extern "C" fn(_, *mut u32) -> _>, h: &nvml_wrapper::Device| {
        let f = f?;
        let mut v = 0u32;
        // SAFETY: NVML's own symbol, called with a live MIG device handle of this library
        // and an out-parameter that lives across the call.
        let rc = unsafe { f(h.handle(), &mut v) };
        nvml_wrapper::error::nvml_try(rc).ok().map(|_| v)
    };
    for i in 0..d.mig_device_count().unwrap_or(0) {
        // An index with no MIG device behind it is NotFound: the instances need not be dense.
        let Ok(h) = d.mig_device_by_index(i) else {
            continue;
        };
        let lib = nvml.lib();
        let (Some(gi), Some(ci)) = (
            id(lib.nvmlDeviceGetGpuInstanceId.as_ref().ok(), &h),
            id(lib.nvmlDeviceGetComputeInstanceId.as_ref().ok(), &h),
        ) else {
            continue;
        };
        let mem = h.memory_info().ok();
        let (total, used) = mem.map_or((0, 0), |m| (m.total as i64, m.used as i64));
        // "NVIDIA A100-SXM4-40GB MIG 1g.5gb": the profile is what follows "MIG ".
        let name = h.name().unwrap_or_default();
        let profile = name
            .rsplit_once("MIG ")
            .map_or(name.as_str(), |(_, p)| p)
            .trim()
            .to_string();
        mig.instances.push(MigDevice {
            gpu: index,
            gi: i64::from(gi),
            ci: i64::from(ci),
            profile,
            uuid: h.uuid().unwrap_or_default(),
            mem_total: total,
            mem_used: used,
            mem_used_mib: used / super::MIB,
            mem_total_mib: total / super::MIB,
            caps: u32::try_from(minor)
                .map(|m| minors.of_instance(m, gi, ci))
                .unwrap_or_default(),
        });
        procs.extend(NvmlBackend::procs_of(&h, Some((gi, ci))));
    }
    mig.instances.sort_by_key(MigDevice::key);
    (Some(mig), procs)
}

/// NVML's field of the recovery action the driver asks for
/// (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, driver 550 and newer).
const FI_DEV_GET_GPU_RECOVERY_ACTION: u32 = 230;

/// What one GPU reports about its faults. A query the GPU or the driver does not support
/// (NotSupported: retired pages on a GPU that remaps rows, a field an older driver lacks)
/// leaves that fact `None`: not applicable, never an error.
fn device_faults(nvml: &Nvml, d: &nvml_wrapper::Device) -> Faults {
    use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let ecc = d
        .is_ecc_enabled()
        .ok()
        .filter(|m| m.currently_enabled)
        .and_then(|_| {
            let count = |t| {
                d.total_ecc_errors(t, EccCounter::Volatile)
                    .ok()
                    .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
            };
            Some(Ecc {
                corrected: count(MemoryError::Corrected)?,
                uncorrected: count(MemoryError::Uncorrected)?,
            })
        });
    let pages = |c| d.retired_pages(c).ok().map(|p| p.len() as i64);
    let retired_pages = (|| {
        Some(RetiredPages {
            single_bit: pages(RetirementCause::MultipleSingleBitEccErrors)?,
            double_bit: pages(RetirementCause::DoubleBitEccError)?,
            pending: d.are_pages_pending_retired().ok()?,
        })
    })();
    let recovery_action = d
        .field_values_for(&[FieldId(FI_DEV_GET_GPU_RECOVERY_ACTION)])
        .ok()
        .and_then(|v| v.into_iter().next())
        .and_then(Result::ok)
        .and_then(|s| s.value.ok())
        .and_then(|v| match v {
            SampleValue::U32(n) => Some(u64::from(n)),
            SampleValue::U64(n) => Some(n),
            SampleValue::I64(n) => u64::try_from(n).ok(),
            SampleValue::F64(_) => None,
        })
        .map(RecoveryAction::from_code);
    Faults {
        ecc,
        remapped_rows: remapped_rows(nvml, d),
        retired_pages,
        recovery_action,
        persistence_mode: d.is_in_persistent_mode().ok(),
        ..Faults::default()
    }
}

/// `nvmlDeviceGetRemappedRows`, which nvml-wrapper does not wrap.
fn remapped_rows(nvml: &Nvml, d: &nvml_wrapper::Device) -> Option<RemappedRows> {
    let f = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: NVML's own symbol, called with a live device handle of this library and four
    // out-parameters that live across the call.
    let rc = unsafe { f(d.handle(), &mut corr, &mut unc, &mut pending, &mut failure) };
    nvml_wrapper::error::nvml_try(rc).ok()?;
    Some(RemappedRows {
        correctable: i64::from(corr),
        uncorrectable: i64::from(unc),
        pending: pending != 0,
        failure: failure != 0,
    })
}
