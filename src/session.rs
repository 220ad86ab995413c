//! One invocation's world: the GPU backend (chosen once, loaded lazily), the host set and
//! its connections (opened on first use), the user's config, and the interrupt flag.

use crate::config::UserConfig;
use crate::gpu::deadline::{self, Deadline};
use crate::gpu::kmsg::Kmsg;
use crate::gpu::nvml::NvmlBackend;
use crate::gpu::sim::SimBackend;
use crate::gpu::{Backend, DeviceNodes, GpuError, NoDriver};
use crate::hosts::{HostsConfig, Pool};
use crate::inspect::diagnose::Reach;
use crate::process::restart::{Restarter, Seen};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Which backend this session uses.
#[derive(Debug, Clone)]
pub enum BackendChoice {
    /// NVML if the driver library loads, else "no driver".
    Auto,
    Sim {
        dir: PathBuf,
        spec: Option<String>,
    },
}

pub struct Session {
    choice: BackendChoice,
    backend: OnceLock<Result<Box<dyn Backend>, GpuError>>,
    /// `--host`/`--hosts-file`: `None` is this machine alone.
    hosts: Option<HostsConfig>,
    pool: OnceLock<Pool>,
    /// The host names as a set, made on first use: whether a name is in the set is a lookup,
    /// not a search of 65,536 names per call.
    host_set: OnceLock<std::collections::HashSet<String>>,
    /// Hosts already reported as skipped (each is warned about once).
    skipped: Mutex<BTreeSet<String>>,
    pub config: UserConfig,
    pub verbose: u8,
    warned_no_driver: AtomicBool,
    /// Parents that outlived holders this session stopped, and may start them again.
    restarters: Mutex<Vec<Restarter>>,
    /// Parents this session saw start a holder again after one was stopped.
    restarted: Mutex<Vec<Seen>>,
    /// How the person reading this session's advice reaches this machine: set once by the
    /// client of `gpuloop agent`; unset, they read it here.
    reach: OnceLock<Reach>,
    /// The kernel log the Xid events are read from, open once read.
    kernel_log: OnceLock<Kmsg>,
}

impl Session {
    pub fn new(choice: BackendChoice, config: UserConfig, verbose: u8) -> Session {
        Session {
            choice,
            backend: OnceLock::new(),
            hosts: None,
            pool: OnceLock::new(),
            host_set: OnceLock::new(),
            skipped: Mutex::default(),
            config,
            verbose,
            warned_no_driver: AtomicBool::new(false),
            restarters: Mutex::new(Vec::new()),
            restarted: Mutex::new(Vec::new()),
            reach: OnceLock::new(),
            kernel_log: OnceLock::new(),
        }
    }

    /// The same session acting on a host set.
    pub(crate) fn with_hosts(mut self, hosts: HostsConfig) -> Session {
        self.hosts = Some(hosts);
        self
    }

    /// The backend, loaded on first use (so `eval '1+1'` never touches the driver).
    pub fn backend(&self) -> Result<&dyn Backend, GpuError> {
        let b = match self.backend.get() {
            Some(b) => b,
            None => match self.open_backend() {
                // Not kept: a later call (the REPL's next line) loads it again.
                Err(GpuError::Interrupted) => return Err(GpuError::Interrupted),
                made => self.backend.get_or_init(|| made),
            },
        };
        match b {
            Ok(b) => Ok(b.as_ref()),
            Err(e) => Err(e.clone()),
        }
    }

    /// The backend this session chose, loaded now.
    fn open_backend(&self) -> Result<Box<dyn Backend>, GpuError> {
        match &self.choice {
            BackendChoice::Sim { dir, spec } => {
                SimBackend::open(dir, spec.as_deref()).map(|b| Box::new(b) as Box<dyn Backend>)
            }
            BackendChoice::Auto => Ok({
                if std::env::var_os("GPULOOP_SIM_DIR").is_some_and(|d| !d.is_empty()) {
                    crate::errln!(
                        "note: GPULOOP_SIM_DIR is set but the simulator is not selected: using the NVIDIA driver (add --sim SPEC or set GPULOOP_SIM for the simulated GPUs)"
                    );
                }
                // Loading and every later read get a deadline: a hung driver must not
                // block a command or a script forever.
                let limit = deadline::limit_from_env();
                match NvmlBackend::load(limit) {
                    Ok(b) => Box::new(Deadline::new(Arc::new(b), limit)),
                    Err(GpuError::Interrupted) => return Err(GpuError::Interrupted),
                    Err(GpuError::NoDriver(why)) => Box::new(NoDriver::new(why)),
                    Err(e) => Box::new(NoDriver::new(e.to_string())),
                }
            }),
        }
    }

    /// The device nodes of this session's backend, known without loading it (so the /proc
    /// scan can run while the driver initialises).
    pub(crate) fn device_nodes(&self) -> DeviceNodes {
        match &self.choice {
            BackendChoice::Sim { dir, .. } => crate::gpu::sim::nodes_in(dir),
            BackendChoice::Auto => NvmlBackend::nodes(),
        }
    }

    /// `Err(NoDriver)` when the driver did not load: for the one-shots, which exit 1 on it.
    pub(crate) fn require_driver(&self) -> Result<&dyn Backend, GpuError> {
        let b = self.backend()?;
        match b.missing_driver() {
            Some(why) => Err(GpuError::NoDriver(why.to_string())),
            None => Ok(b),
        }
    }

    /// Scripts go on without a driver (gpu() is []), told so once per session.
    pub(crate) fn warn_no_driver(&self) {
        let Ok(b) = self.backend() else { return };
        if let Some(why) = b.missing_driver() {
            if !self.warned_no_driver.swap(true, Ordering::Relaxed) {
                crate::errln!(
                    "warning: no NVIDIA driver: {why}; gpu() returns [], holders() still scans /dev/nvidia* fds, nothing reads as clean"
                );
            }
        }
    }

    /// Remembers restarters a kill found, so later waits and diagnoses can name them.
    pub(crate) fn note_restarters(&self, found: &[Restarter]) {
        if let Ok(mut rs) = self.restarters.lock() {
            for r in found {
                if !rs.iter().any(|k| k.identity == r.identity) {
                    rs.push(r.clone());
                }
            }
        }
    }

    /// Notes a parent seen starting a holder again (as it is also remembered on the
    /// machine): in this run it has shown it restarts, whether or not the machine remembers.
    pub(crate) fn note_restarted(&self, seen: Seen) {
        if let Ok(mut rs) = self.restarted.lock() {
            rs.retain(|s| (s.pid, s.start) != (seen.pid, seen.start));
            rs.push(seen);
        }
    }

    /// The parents seen restarting a holder: in this run, and as remembered on this machine
    /// (those that still run).
    pub(crate) fn restarted(&self) -> Vec<Seen> {
        let mut all = crate::process::restart::seen_before();
        if let Ok(rs) = self.restarted.lock() {
            all.extend(rs.iter().cloned());
        }
        all
    }

    /// The restarters noted so far that are still alive.
    pub fn restarters(&self) -> Vec<Restarter> {
        let Ok(mut rs) = self.restarters.lock() else {
            return Vec::new();
        };
        rs.retain(|r| {
            crate::process::read_stat(r.identity.pid)
                .is_ok_and(|p| p.start == r.identity.start && !p.is_zombie())
        });
        rs.clone()
    }

    /// The host set's connections, opened (in parallel) on first use; `None` without hosts.
    pub(crate) fn pool(&self) -> Option<&Pool> {
        let cfg = self.hosts.as_ref()?;
        Some(
            self.pool
                .get_or_init(|| Pool::connect(cfg.clone(), self.interrupted())),
        )
    }

    /// This machine alone: no host set, or one that names only `local`.
    pub(crate) fn is_local(&self) -> bool {
        self.hosts
            .as_ref()
            .is_none_or(|h| matches!(h.hosts.as_slice(), [one] if crate::local::is_local(one)))
    }

    /// The host names, in order: `["local"]` without a host set.
    pub(crate) fn host_names(&self) -> Vec<String> {
        match &self.hosts {
            Some(h) => h.hosts.clone(),
            None => vec![crate::hosts::LOCAL.to_string()],
        }
    }

    /// Whether `host` is one of `host_names()`.
    pub(crate) fn has_host(&self, host: &str) -> bool {
        self.host_set
            .get_or_init(|| self.host_names().into_iter().collect())
            .contains(host)
    }

    /// `--skip-unreachable`.
    pub(crate) fn skip_unreachable(&self) -> bool {
        self.hosts.as_ref().is_some_and(|h| h.skip_unreachable)
    }

    /// Records a skipped host; true the first time (when it should be reported).
    pub(crate) fn note_skipped(&self, host: &str) -> bool {
        self.skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(host.to_string())
    }

    /// The simulator, for `gpuloop sim …`.
    pub fn sim(&self) -> Result<SimBackend, GpuError> {
        match &self.choice {
            BackendChoice::Sim { dir, spec } => SimBackend::open(dir, spec.as_deref()),
            BackendChoice::Auto => SimBackend::open(&crate::gpu::sim::state_dir(), None),
        }
    }

    pub fn protected(&self) -> &[String] {
        &self.config.protected
    }

    /// Where the container runtimes and the kubelet keep their state (`[containers]`).
    pub(crate) fn container_roots(&self) -> &crate::process::container::Roots {
        &self.config.containers
    }

    /// The kernel log Xid events are read from: the simulator's own, or config.toml's
    /// `kernel_log` (`/dev/kmsg` by default).
    pub(crate) fn kernel_log(&self) -> &Kmsg {
        self.kernel_log.get_or_init(|| match &self.choice {
            BackendChoice::Sim { dir, .. } => Kmsg::new(dir.join("kmsg")),
            BackendChoice::Auto => Kmsg::new(&self.config.kernel_log),
        })
    }

    /// Where advice is read (see `Reach`): here, unless the client of an agent said how it
    /// reaches this machine.
    pub fn reach(&self) -> &Reach {
        static HERE: OnceLock<Reach> = OnceLock::new();
        self.reach
            .get()
            .unwrap_or_else(|| HERE.get_or_init(Reach::default))
    }

    /// The agent's client says how it names this machine; the first word stands.
    pub fn reached_as(&self, reach: Reach) {
        let _ = self.reach.set(reach);
    }

    pub fn interrupted(&self) -> &'static AtomicBool {
        crate::interrupt::flag()
    }
}
