//! One invocation's world: the GPU backend (chosen once, loaded lazily), the user's config,
//! and the interrupt flag.

use crate::config::UserConfig;
use crate::gpu::nvml::NvmlBackend;
use crate::gpu::sim::SimBackend;
use crate::gpu::{Backend, GpuError, NoDriver};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

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
    pub config: UserConfig,
    pub verbose: u8,
}

impl Session {
    pub fn new(choice: BackendChoice, config: UserConfig, verbose: u8) -> Session {
        Session {
            choice,
            backend: OnceLock::new(),
            config,
            verbose,
        }
    }

    /// The backend, loaded on first use (so `eval '1+1'` never touches the driver).
    pub fn backend(&self) -> Result<&dyn Backend, GpuError> {
        let b = self.backend.get_or_init(|| match &self.choice {
            BackendChoice::Sim { dir, spec } => {
                SimBackend::open(dir, spec.as_deref()).map(|b| Box::new(b) as Box<dyn Backend>)
            }
            BackendChoice::Auto => Ok({
                if std::env::var_os("GPULOOP_SIM_DIR").is_some_and(|d| !d.is_empty()) {
                    eprintln!(
                        "note: GPULOOP_SIM_DIR is set but the simulator is not selected: using the NVIDIA driver (add --sim SPEC or set GPULOOP_SIM for the simulated GPUs)"
                    );
                }
                match NvmlBackend::load() {
                Ok(b) => Box::new(b),
                Err(e) => {
                    let why = e.to_string();
                    let why = why
                        .trim_start_matches("NVML: ")
                        .trim_start_matches("a libloading error occurred: ")
                        .to_string();
                    eprintln!(
                        "warning: no NVIDIA driver ({why}); gpu() returns [], holders() still scans /dev/nvidia* fds"
                    );
                    Box::new(NoDriver::new())
                }
                }
            }),
        });
        match b {
            Ok(b) => Ok(b.as_ref()),
            Err(e) => Err(e.clone()),
        }
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

    pub fn interrupted(&self) -> &'static AtomicBool {
        crate::interrupt::flag()
    }
}
