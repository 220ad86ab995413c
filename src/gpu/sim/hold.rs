//! `gpuloop sim hold`: real processes that hold simulated GPU memory the way CUDA programs do.
//!
//! `sim hold` re-executes gpuloop as the job's launcher (so it starts single-threaded and may
//! fork), reads what it reports on a pipe, and returns once everything holds. The launcher
//! forks the holders and stays alive as their parent until they are gone, as
//! `python3 launcher.py` does: a plain holder reads as a running job (`held`), and killing the
//! launcher leaves real orphans.

use super::SimBackend;
use crate::gpu::GpuError;
use nix::sys::signal::{signal, SigHandler, Signal};
use nix::unistd::{fork, ForkResult};
use rustix::event::pause;
use rustix::mm::{mmap, MapFlags, ProtFlags};
use rustix::pipe::pipe;
use rustix::process::{setsid, WaitOptions};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What `sim hold` is asked to build.
#[derive(Debug, Clone, Default)]
pub struct HoldOpts {
    /// `--gpu` as given: `N`, `N:GI:CI`, `N:GI` or a MIG UUID (`resolved` reads it).
    pub target: String,
    /// The GPU, once resolved.
    pub gpu: i64,
    /// The MIG instance (GPU instance, compute instance), once resolved: a CUDA job there
    /// maps its parent's node and opens the instance's two capability nodes.
    pub mig: Option<(u32, u32)>,
    pub mib: i64,
    /// Process name (comm), e.g. "nvidia-persistenced" to play a GPU daemon.
    pub name: Option<String>,
    /// Open the node without mapping it and allocate nothing (an NVML-only client).
    pub observer: bool,
    pub ignore_term: bool,
    /// After allocating, fork a child that inherits the handles.
    pub fork_child: bool,
    /// Fork this many workers, each holding `mib` on the GPU; the first process holds nothing.
    pub workers: u32,
    /// The holders call setsid(), leaving the launcher's process group and session.
    pub setsid: bool,
    /// With `fork_child`: the creator exits once the child holds.
    pub exit_creator: bool,
    /// Map every GPU's node and keep a small footprint on the others, as a CUDA context
    /// does on a machine with several GPUs and no CUDA_VISIBLE_DEVICES.
    pub map_all: bool,
    /// The launcher stays in the caller's process group, as `launcher &` in a non-interactive
    /// script does; by default it leads a group of its own, as a job an interactive shell or
    /// `setsid` starts.
    pub shared_group: bool,
    /// The process started is the holder itself: no launcher, no detaching.
    pub foreground: bool,
    /// The launcher restarts its holder whenever it dies, and is printed first.
    pub supervise: bool,
    /// Catch SIGTERM and carry on (a handler, not SIG_IGN): only SIGKILL after the grace ends it.
    pub catch_term: bool,
    /// On SIGTERM, fork a child that keeps the handles, and exit.
    pub fork_on_term: bool,
    /// For this many ms after its allocation, the driver counts its memory but does not
    /// list it (a context being made).
    pub unlisted_ms: u64,
    /// Once holding, sleep uninterruptibly like a process stuck in the driver: SIGKILL does
    /// not end it until `sim release` (see `stuck`).
    pub stuck: bool,
    /// Once holding, the main thread exits while another thread keeps the handles (the
    /// process is a zombie leader with a live thread, as after `pthread_exit` in main).
    pub defunct_leader: bool,
    /// Also open the MIG capability node (`dev/nvidia-caps/nvidia-cap1`), as a MIG-aware
    /// client (DCGM, `nvidia-smi mig`) does.
    pub caps: bool,
}

impl HoldOpts {
    /// These options with `--gpu` read against the simulator: its GPU and MIG instance.
    pub fn resolved(&self, sim: &SimBackend) -> Result<HoldOpts, GpuError> {
        let mut o = self.clone();
        if !o.target.is_empty() {
            (o.gpu, o.mig) = sim.target(&o.target)?;
        }
        sim.check_instance(o.gpu, o.mig)?;
        Ok(o)
    }

    /// `--gpu` as the holder is given it: `N` or `N:GI:CI`.
    fn gpu_arg(&self) -> String {
        match self.mig {
            Some((gi, ci)) => format!("{}:{gi}:{ci}", self.gpu),
            None => self.gpu.to_string(),
        }
    }
}

/// MiB a context keeps on each GPU it sees but does not use (3 MiB measured on H200s).
pub(crate) const FOOTPRINT_MIB: i64 = 3;

impl HoldOpts {
    /// The arguments that make the re-executed gpuloop the holder.
    fn holder_args(&self) -> Vec<String> {
        let mut a = vec![
            "sim".into(),
            "hold".into(),
            "--as-holder".into(),
            "--gpu".into(),
            self.gpu_arg(),
            "--mib".into(),
            self.mib.to_string(),
        ];
        if let Some(n) = &self.name {
            a.extend(["--name".into(), n.clone()]);
        }
        for (on, flag) in [
            (self.shared_group, "--shared-group"),
            (self.observer, "--observer"),
            (self.ignore_term, "--ignore-term"),
            (self.fork_child, "--fork-child"),
            (self.setsid, "--setsid"),
            (self.exit_creator, "--exit-creator"),
            (self.map_all, "--map-all"),
            (self.supervise, "--supervise"),
            (self.catch_term, "--catch-term"),
            (self.fork_on_term, "--fork-on-term"),
            (self.defunct_leader, "--defunct-leader"),
            (self.caps, "--caps"),
        ] {
            if on {
                a.push(flag.into());
            }
        }
        if self.workers > 0 {
            a.extend(["--workers".into(), self.workers.to_string()]);
        }
        if self.unlisted_ms > 0 {
            a.extend(["--unlisted-ms".into(), self.unlisted_ms.to_string()]);
        }
        a
    }
}

const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Starts the holder processes and returns their pids (the first process, then its children)
/// once every one of them holds.
pub fn launch(sim: &SimBackend, opts: &HoldOpts) -> Result<Vec<i32>, GpuError> {
    let opts = &opts.resolved(sim)?;
    sim.minor(opts.gpu)?;
    if !opts.observer {
        // Each worker allocates its own `mib`, as a tensor-parallel rank does.
        let mib = opts.mib.saturating_mul(i64::from(opts.workers.max(1)));
        sim.check_capacity(opts.gpu, opts.mig, mib)?;
    }
    let err = |why: String| GpuError::SimState {
        dir: sim.dir.clone(),
        why,
    };
    let exe = std::env::current_exe().map_err(|e| err(format!("cannot find own binary: {e}")))?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(sim.dir.join("holders.log"))
        .map_err(|e| err(e.to_string()))?;
    let mut cmd = Command::new(exe);
    cmd.args(opts.holder_args())
        .env("GPULOOP_SIM_DIR", &sim.dir)
        .env("GPULOOP_SIM", &sim.spec.canonical)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Never the caller's stderr: holders outlive us and would keep its pipe open.
        .stderr(Stdio::from(log));
    if !opts.shared_group {
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| err(format!("cannot start holder: {e}")))?;
    let stdout = child.stdout.take().ok_or_else(|| err("no pipe".into()))?;
    let report = read_report(stdout, READY_TIMEOUT);
    let report = match report {
        Ok(r) => r,
        Err(why) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err(format!(
                "holder did not get ready: {why} (see {}/holders.log)",
                sim.dir.display()
            )));
        }
    };
    if opts.exit_creator {
        // The launcher ends once it has reaped the creator, its only child.
        let _ = child.wait();
    }
    if opts.stuck {
        let live: Vec<i32> = report
            .pids
            .iter()
            .copied()
            .filter(|&p| super::running(p))
            .collect();
        super::stuck::freeze(sim, &live)?;
    }
    if sim.spec.release_ms > 0 {
        for alloc in &report.allocs {
            spawn_watcher(sim, alloc)?;
        }
    }
    Ok(report.pids)
}

struct Report {
    pids: Vec<i32>,
    allocs: Vec<PathBuf>,
}

/// Reads "pid N" / "alloc PATH" lines until "ready", with a deadline.
fn read_report(stdout: impl Read + Send + 'static, timeout: Duration) -> Result<Report, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut report = Report {
            pids: Vec::new(),
            allocs: Vec::new(),
        };
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match line.split_once(' ') {
                Some(("pid", p)) => report.pids.extend(p.trim().parse::<i32>().ok()),
                Some(("alloc", p)) => report.allocs.push(PathBuf::from(p)),
                Some(("error", e)) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
                _ if line == "ready" => {
                    let _ = tx.send(Ok(report));
                    return;
                }
                _ => {}
            }
        }
        let _ = tx.send(Err("it exited before holding".into()));
    });
    rx.recv_timeout(timeout)
        .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
}

/// The release watcher lives outside the holders' tree and session, like the driver does.
fn spawn_watcher(sim: &SimBackend, alloc: &Path) -> Result<(), GpuError> {
    let exe = std::env::current_exe().map_err(|e| GpuError::SimState {
        dir: sim.dir.clone(),
        why: e.to_string(),
    })?;
    let mut cmd = Command::new(exe);
    cmd.args(["sim", "watch"])
        .arg(alloc)
        .env("GPULOOP_SIM_DIR", &sim.dir)
        .env("GPULOOP_SIM", &sim.spec.canonical)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            setsid()?;
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| GpuError::SimState {
        dir: sim.dir.clone(),
        why: format!("cannot start release watcher: {e}"),
    })?;
    // Not waited for: it is reparented to init when we exit and ends after the release.
    while !alloc.with_extension("watcher").exists() && alloc.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The process name (comm) of a simulated holder when no --name is given.
pub(crate) const DEFAULT_NAME: &str = "python3";

/// The holder side; runs in the re-executed, single-threaded gpuloop and never returns.
pub(crate) fn run_holder(sim: &SimBackend, opts: &HoldOpts) -> ! {
    let result = opts
        .resolved(sim)
        .map_err(|e| e.to_string())
        .and_then(|opts| holder_main(sim, &opts));
    if let Err(e) = result {
        crate::output::line(&format!("error {e}"));
        std::process::exit(1);
    }
    loop {
        pause();
    }
}

/// What one holding process keeps alive: node fds, mappings, the allocation handle.
struct Held {
    _files: Vec<File>,
    _alloc: Option<File>,
    _footprints: Vec<File>,
    /// The allocation files, for the launcher's release watchers.
    allocs: Vec<PathBuf>,
}

impl Held {
    /// Tells the launcher about the allocations (it starts their release watchers).
    fn report_allocs(&self) {
        for a in &self.allocs {
            report(&format!("alloc {}", a.display()));
        }
    }
}

/// The launcher: it holds nothing, forks the holders and, once they all hold, waits for them.
fn holder_main(sim: &SimBackend, opts: &HoldOpts) -> Result<(), String> {
    // MPS's server is a child of its control daemon, which is how it is told apart from the
    // control daemon when both names are cut to `nvidia-cuda-mps`.
    set_comm(match opts.name.as_deref() {
        Some("nvidia-cuda-mps-server") => "nvidia-cuda-mps-control",
        _ => "launcher",
    });
    if opts.workers > 0 || opts.supervise {
        report(&format!("pid {}", std::process::id()));
    }
    for _ in 0..opts.workers.max(1) {
        fork_synced(|| holder(sim, opts))?;
    }
    finish_ready();
    if opts.supervise {
        restart_forever(sim, opts);
    }
    // Reap the holders as they end; with none left, the launcher's job is done.
    while rustix::process::wait(WaitOptions::empty()).is_ok() {}
    std::process::exit(0);
}

/// `--supervise`: a new holder each time one dies, like torchrun's elastic agent or a
/// `while true` shell loop. Holders started after "ready" get no release watcher: their
/// memory goes at once.
fn restart_forever(sim: &SimBackend, opts: &HoldOpts) -> ! {
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((_, st))) if st.exited() || st.signaled() => {
                // A short pause, as a restart policy has, so a failing holder cannot spin.
                std::thread::sleep(Duration::from_millis(50));
                while fork_synced(|| holder(sim, opts)).is_err() {
                    // Its simulator is gone (`sim stop`, a test's directory removed): no GPU
                    // is left to restart a holder on.
                    if !sim.dir.join("spec").exists() {
                        std::process::exit(0);
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) if !sim.dir.join("spec").exists() => std::process::exit(0),
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

/// What a forked process does once it has reported.
enum Then {
    /// Stay, pausing, until killed.
    Stay,
    /// Exit (the creator of `exit_creator`, whose forked child keeps the handles).
    Exit,
    /// Another thread stays; the main thread exits (`defunct_leader`).
    LeaveToThread,
}

/// One holding process (a worker, or the plain holder), and what it does once reported.
fn holder(sim: &SimBackend, opts: &HoldOpts) -> Result<Then, String> {
    // A name a GPU job would have, rather than gpuloop's own.
    set_comm(opts.name.as_deref().unwrap_or(DEFAULT_NAME));
    if opts.ignore_term {
        // SAFETY: setting a signal disposition to SIG_IGN installs no handler code.
        unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }.map_err(|e| e.to_string())?;
    }
    if opts.catch_term {
        // SAFETY: the handler does nothing at all, which is async-signal-safe.
        unsafe { signal(Signal::SIGTERM, SigHandler::Handler(ignore_signal)) }
            .map_err(|e| e.to_string())?;
    }
    if opts.fork_on_term {
        // SAFETY: the handler calls only fork, pause and _exit, all async-signal-safe.
        unsafe { signal(Signal::SIGTERM, SigHandler::Handler(fork_and_exit)) }
            .map_err(|e| e.to_string())?;
    }
    if opts.setsid {
        setsid().map_err(|e| format!("setsid: {e}"))?;
    }
    let held = hold_gpu(sim, opts)?;
    held.report_allocs();
    report(&format!("pid {}", std::process::id()));
    if opts.fork_child {
        // The child inherits the node fds, the mappings and the allocation's handle.
        fork_synced(|| {
            report(&format!("pid {}", std::process::id()));
            Ok(Then::Stay)
        })?;
    }
    std::mem::forget(held);
    Ok(if opts.fork_child && opts.exit_creator {
        Then::Exit
    } else if opts.defunct_leader {
        Then::LeaveToThread
    } else {
        Then::Stay
    })
}

/// `--foreground`: this very process holds, prints its pid, and stays until killed.
pub(crate) fn run_foreground(sim: &SimBackend, opts: &HoldOpts) -> ! {
    let held = (|| {
        let opts = &opts.resolved(sim).map_err(|e| e.to_string())?;
        if let Some(name) = &opts.name {
            set_comm(name);
        }
        if opts.ignore_term {
            // SAFETY: setting a signal disposition to SIG_IGN installs no handler code.
            unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }.map_err(|e| e.to_string())?;
        }
        if opts.catch_term {
            // SAFETY: the handler does nothing at all, which is async-signal-safe.
            unsafe { signal(Signal::SIGTERM, SigHandler::Handler(ignore_signal)) }
                .map_err(|e| e.to_string())?;
        }
        let held = hold_gpu(sim, opts)?;
        if sim.spec.release_ms > 0 {
            for a in &held.allocs {
                spawn_watcher(sim, a).map_err(|e| e.to_string())?;
            }
        }
        Ok::<Held, String>(held)
    })();
    match held {
        Ok(held) => {
            report(&std::process::id().to_string());
            std::mem::forget(held);
            loop {
                pause();
            }
        }
        Err(e) => {
            crate::errln!("gpuloop: sim hold: {e}");
            std::process::exit(1);
        }
    }
}

fn hold_gpu(sim: &SimBackend, opts: &HoldOpts) -> Result<Held, String> {
    let node = sim.node_path(opts.gpu).map_err(|e| e.to_string())?;
    let ctl = sim.dir.join("dev/nvidiactl");
    let mut paths = vec![ctl, node];
    // A MIG job opens its instance's capability nodes beside its parent's node (what Slurm's
    // gres and the container toolkit hand it); it keeps them open, and so does a child that
    // inherits its fds.
    let inst_caps = match opts.mig {
        Some((gi, ci)) => sim.cap_paths(opts.gpu, gi, ci),
        None => Vec::new(),
    };
    for c in &inst_caps {
        if !c.exists() {
            return Err(format!(
                "{}: no such capability node (the state directory predates MIG: use a new one)",
                c.display()
            ));
        }
    }
    paths.extend(inst_caps.iter().cloned());
    let others: Vec<i64> = if opts.map_all && !opts.observer && opts.mig.is_none() {
        (0..sim.spec.count as i64)
            .filter(|&g| g != opts.gpu)
            .collect()
    } else {
        Vec::new()
    };
    for &g in &others {
        paths.push(sim.node_path(g).map_err(|e| e.to_string())?);
    }
    let cap = sim.dir.join("dev").join(super::CAP_NODE);
    if opts.caps {
        // A state directory set up before the simulator had one.
        if let Some(dir) = cap.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        if !cap.exists() {
            File::create(&cap).map_err(|e| format!("{}: {e}", cap.display()))?;
        }
        paths.push(cap.clone());
    }
    let mut files = Vec::new();
    let mut footprints = Vec::new();
    for path in &paths {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        // Open, as the driver sees it: a reset finds the node in use while this lock is
        // held, that is while this process (or a child that inherited the fd) has it open.
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)
            .map_err(|e| format!("flock {}: {e}", path.display()))?;
        if !opts.observer && *path != cap && !inst_caps.contains(path) {
            map_node(&f).map_err(|e| format!("mmap {}: {e}", path.display()))?;
        }
        files.push(f);
    }
    let mut allocs = Vec::new();
    let alloc = if opts.mib > 0 && !opts.observer {
        let (path, lock) = sim
            .allocate(
                opts.gpu,
                opts.mig,
                opts.mib,
                false,
                (opts.unlisted_ms > 0).then(|| Duration::from_millis(opts.unlisted_ms)),
            )
            .map_err(|e| e.to_string())?;
        allocs.push(path);
        Some(lock)
    } else {
        None
    };
    for &g in &others {
        let (path, lock) = sim
            .allocate(g, None, FOOTPRINT_MIB, true, None)
            .map_err(|e| e.to_string())?;
        allocs.push(path);
        footprints.push(lock);
    }
    Ok(Held {
        _files: files,
        _alloc: alloc,
        _footprints: footprints,
        allocs,
    })
}

/// Maps one page of the node, as a CUDA context maps /dev/nvidiaN; the mapping lives on.
fn map_node(f: &File) -> rustix::io::Result<()> {
    // SAFETY: a fresh shared mapping of a file we own; it is never unmapped or dereferenced.
    unsafe {
        mmap(
            std::ptr::null_mut(),
            4096,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            f,
            0,
        )
    }?;
    Ok(())
}

fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Says "ready" and lets go of the launcher's pipe.
fn finish_ready() {
    report("ready");
    detach_stdout();
}

fn detach_stdout() {
    if let Ok(null) = File::open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
    }
}

/// Forks; the child runs `setup`, then the parent continues once the child has reported. The
/// child then does what `setup` says.
fn fork_synced(setup: impl FnOnce() -> Result<Then, String>) -> Result<(), String> {
    let (rd, wr): (OwnedFd, OwnedFd) = pipe().map_err(|e| e.to_string())?;
    // SAFETY: the holder is single-threaded (a fresh exec that started no threads).
    match unsafe { fork() }.map_err(|e| e.to_string())? {
        ForkResult::Child => {
            drop(rd);
            let then = match setup() {
                Ok(then) => then,
                Err(e) => {
                    report(&format!("error {e}"));
                    std::process::exit(1);
                }
            };
            let _ = rustix::io::write(&wr, b"1");
            drop(wr);
            detach_stdout();
            match then {
                Then::Stay => {}
                Then::Exit => std::process::exit(0),
                Then::LeaveToThread => {
                    std::thread::spawn(|| loop {
                        pause();
                    });
                    // SAFETY: SYS_exit ends only this thread; the process lives on in the
                    // other one, with every fd, mapping and lock it had. Raw libc: nix has
                    // no thread exit, and rustix's (`runtime::exit_thread`) is for programs
                    // that are their own libc.
                    unsafe { libc::syscall(libc::SYS_exit, 0) };
                }
            }
            loop {
                pause();
            }
        }
        ForkResult::Parent { .. } => {
            drop(wr);
            let mut byte = [0u8; 1];
            let mut rd = File::from(rd);
            let start = Instant::now();
            match rd.read(&mut byte) {
                Ok(1) => Ok(()),
                _ => Err(format!("forked child failed after {:?}", start.elapsed())),
            }
        }
    }
}

extern "C" fn ignore_signal(_: std::ffi::c_int) {}

/// `--fork-on-term`: a child that inherits the node fds, the mappings and the allocation's
/// lock stays (until it is signalled), and the process that was signalled exits.
extern "C" fn fork_and_exit(_: std::ffi::c_int) {
    // SAFETY: fork, pause and _exit are async-signal-safe; the child touches nothing else.
    unsafe {
        if libc::fork() == 0 {
            loop {
                libc::pause();
            }
        }
        libc::_exit(0);
    }
}

fn set_comm(name: &str) {
    // The main thread's name is the process's comm (the kernel cuts it to 15 bytes).
    if let Ok(c) = std::ffi::CString::new(name) {
        let _ = rustix::thread::set_name(&c);
    }
}
