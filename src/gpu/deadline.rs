//! A deadline on driver calls. An NVML call can hang in the kernel (a wedged GPU, a driver
//! waiting on a fallen-off-the-bus device); each call runs on a worker thread and is given
//! up after the deadline, so no command or script blocks forever on the driver. The worker
//! stays behind, stuck where the driver holds it; while it is, later calls fail at once
//! instead of piling up more stuck threads.

use super::{Backend, DeviceNodes, Gpu, GpuError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The default deadline of one driver call: NVML answers in milliseconds when it answers.
pub(crate) const DEFAULT_LIMIT: Duration = Duration::from_secs(10);

/// How much longer a whole read of several GPUs may take than one GPU's deadline, so that the
/// GPUs that answered are reported beside one that did not: the deadline again, between half
/// a second and two (a hung device count, which this bounds, then ends in at most 12 s by
/// default). The per-GPU deadlines start a little after the whole read's (a thread, the
/// device count), and a loaded machine can stall the thread that reports them: with a margin
/// of a fixed 0.5 s, a 2-core machine under a load of 50 once failed a whole read of 1 s
/// deadlines with one GPU hung, instead of reporting that GPU beside the others.
fn per_gpu_margin(limit: Duration) -> Duration {
    limit.clamp(Duration::from_millis(500), Duration::from_secs(2))
}

/// The deadline from `GPULOOP_DRIVER_TIMEOUT` (seconds), else `DEFAULT_LIMIT`.
pub(crate) fn limit_from_env() -> Duration {
    std::env::var("GPULOOP_DRIVER_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e6)
        .map_or(DEFAULT_LIMIT, Duration::from_secs_f64)
}

/// A driver call running on a worker thread of its own.
pub struct Pending<T> {
    rx: mpsc::Receiver<T>,
    returned: Arc<AtomicBool>,
}

/// Why a driver call has no result.
pub enum Late {
    /// Still running at the deadline (stuck in the driver).
    Timeout,
    /// It panicked.
    Panicked,
}

/// Sets its flag when dropped: when the call returns, or unwinds.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Starts `f` on a worker thread named after `call`.
pub fn start<T: Send + 'static>(
    call: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Pending<T>, GpuError> {
    let (tx, rx) = mpsc::channel();
    let returned = Arc::new(AtomicBool::new(false));
    let flag = SetOnDrop(returned.clone());
    std::thread::Builder::new()
        .name(format!("gpuloop-driver-{call}"))
        .spawn(move || {
            let _flag = flag;
            let _ = tx.send(f());
        })
        .map_err(|e| GpuError::Nvml(format!("{call}: cannot start a worker: {e}")))?;
    Ok(Pending { rx, returned })
}

impl<T> Pending<T> {
    /// Its result, if it comes by `deadline`.
    pub fn wait_until(&self, deadline: Instant) -> Result<T, Late> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.rx.recv_timeout(left).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => Late::Timeout,
            mpsc::RecvTimeoutError::Disconnected => Late::Panicked,
        })
    }

    /// A flag that turns true once the call has returned (or unwound).
    pub fn returned(&self) -> Arc<AtomicBool> {
        self.returned.clone()
    }
}

/// The error of a call that gave no result within `limit`.
pub(crate) fn gave_up(call: &str, late: Late, limit: Duration) -> GpuError {
    match late {
        Late::Timeout => hung(call, limit),
        Late::Panicked => GpuError::Nvml(format!("{call}: the driver call panicked")),
    }
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
        let pending = start(call, move || f(inner.as_ref()))?;
        pending
            .wait_until(Instant::now() + limit)
            .unwrap_or_else(|why| {
                *late = Some(pending.returned());
                Err(gave_up(call, why, limit))
            })
    }
}

impl Backend for Deadline {
    fn kind(&self) -> super::BackendKind {
        self.inner.kind()
    }

    // The NVML backend gives each GPU of several the same deadline and reports a hung one
    // beside the others: this outer bound is only for a call hung before that (the count).
    fn gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        self.call_within("gpus", self.limit + per_gpu_margin(self.limit), |b| {
            b.gpus()
        })
    }

    fn inventory_gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        self.call_within(
            "inventory_gpus",
            self.limit + per_gpu_margin(self.limit),
            |b| b.inventory_gpus(),
        )
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

    fn reset(&self, index: i64, run: &super::RunHelper) -> Result<(), GpuError> {
        // A reset legitimately takes seconds; it runs nvidia-smi, which has its own limits.
        self.inner.reset(index, run)
    }

    fn missing_driver(&self) -> Option<&str> {
        self.inner.missing_driver()
    }

    fn faults(&self, indices: &[i64]) -> Result<Vec<super::DeviceFaults>, GpuError> {
        let indices = indices.to_vec();
        self.call("faults", move |b| b.faults(&indices))
    }

    fn drm_modeset(&self) -> Option<bool> {
        self.inner.drm_modeset()
    }
}
