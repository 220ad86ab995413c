//! A deadline on driver calls. An NVML call can hang in the kernel (a wedged GPU, a driver
//! waiting on a fallen-off-the-bus device); each call runs on a worker thread and is given
//! up after the deadline, so no command or script blocks forever on the driver. The worker
//! stays behind, stuck where the driver holds it; while it is, later calls fail at once
//! instead of piling up more stuck threads.

use super::{Backend, DeviceNodes, Gpu, GpuError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The default deadline of one driver call: NVML answers in milliseconds when it answers.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(10);

/// How much longer a whole read of several GPUs may take than one GPU's deadline, so that the
/// GPUs that answered are reported beside one that did not.
const PER_GPU_MARGIN: Duration = Duration::from_millis(500);

/// The deadline from `GPULOOP_DRIVER_TIMEOUT` (seconds), else `DEFAULT_LIMIT`.
pub fn limit_from_env() -> Duration {
    std::env::var("GPULOOP_DRIVER_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e6)
        .map_or(DEFAULT_LIMIT, Duration::from_secs_f64)
}

/// Runs `f` on a worker thread; `Err` with a message naming `call` if it has not returned
/// within `limit`.
pub fn bounded<T: Send + 'static>(
    call: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GpuError> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(format!("gpuloop-driver-{call}"))
        .spawn(move || {
            let _ = tx.send(f());
        });
    if let Err(e) = spawned {
        return Err(GpuError::Nvml(format!(
            "{call}: cannot start a worker: {e}"
        )));
    }
    rx.recv_timeout(limit).map_err(|_| hung(call, limit))
}

fn hung(call: &str, limit: Duration) -> GpuError {
    GpuError::Nvml(format!(
        "{call} did not return within {:.1} s: the driver is hung (a wedged GPU?); see dmesg for Xid errors (GPULOOP_DRIVER_TIMEOUT sets the deadline)",
        limit.as_secs_f64()
    ))
}

/// A backend whose reads of the driver each get a deadline.
pub struct Deadline {
    inner: Arc<dyn Backend>,
    limit: Duration,
    /// The "returned" flag of the last call that ran out of time.
    late: Mutex<Option<Arc<AtomicBool>>>,
}

impl Deadline {
    pub fn new(inner: Arc<dyn Backend>, limit: Duration) -> Deadline {
        Deadline {
            inner,
            limit,
            late: Mutex::new(None),
        }
    }

    fn call<T: Send + 'static>(
        &self,
        call: &'static str,
        f: impl FnOnce(&dyn Backend) -> Result<T, GpuError> + Send + 'static,
    ) -> Result<T, GpuError> {
        self.call_within(call, self.limit, f)
    }

    fn call_within<T: Send + 'static>(
        &self,
        call: &'static str,
        limit: Duration,
        f: impl FnOnce(&dyn Backend) -> Result<T, GpuError> + Send + 'static,
    ) -> Result<T, GpuError> {
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        if late
            .as_ref()
            .is_some_and(|done| !done.load(Ordering::SeqCst))
        {
            return Err(GpuError::Nvml(format!(
                "{call}: an earlier driver call has not returned (the driver is hung)"
            )));
        }
        *late = None;
        let inner = self.inner.clone();
        let done = Arc::new(AtomicBool::new(false));
        let returned = done.clone();
        let r = bounded(call, limit, move || {
            let r = f(inner.as_ref());
            returned.store(true, Ordering::SeqCst);
            r
        });
        r.unwrap_or_else(|e| {
            *late = Some(done);
            Err(e)
        })
    }
}

impl Backend for Deadline {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    // The NVML backend gives each GPU of several the same deadline and reports a hung one
    // beside the others: this outer bound is only for a call hung before that (the count).
    fn gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        self.call_within("gpus", self.limit + PER_GPU_MARGIN, |b| b.gpus())
    }

    fn inventory_gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        self.call_within("inventory_gpus", self.limit + PER_GPU_MARGIN, |b| {
            b.inventory_gpus()
        })
    }

    fn mem_used(&self, indices: &[i64]) -> Result<Vec<(i64, i64)>, GpuError> {
        let indices = indices.to_vec();
        self.call("mem_used", move |b| b.mem_used(&indices))
    }

    fn nodes(&self) -> &DeviceNodes {
        self.inner.nodes()
    }

    fn foreign_pid_namespace(&self) -> bool {
        self.inner.foreign_pid_namespace()
    }

    fn reset(&self, index: i64) -> Result<(), GpuError> {
        // A reset legitimately takes seconds; it runs nvidia-smi, which has its own limits.
        self.inner.reset(index)
    }

    fn missing_driver(&self) -> Option<&str> {
        self.inner.missing_driver()
    }
}
