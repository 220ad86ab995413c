//! wait_clean(): poll until the selected GPUs are free, returning within one poll of the release.

use super::holders::Inventory;
use super::Selection;
use crate::gpu::{Backend, GpuError, MIB};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct WaitOpts {
    pub timeout: Duration,
    pub max_used_mib: i64,
    pub poll: Duration,
}

impl Default for WaitOpts {
    fn default() -> Self {
        WaitOpts {
            timeout: Duration::from_secs(30),
            max_used_mib: 0,
            poll: Duration::from_millis(20),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    Clean,
    TimedOut,
    Interrupted,
}

/// What is still dirty at one poll: (GPU index, MiB used, compute holders).
pub type Dirty = Vec<(i64, i64, usize)>;

/// Polls memory (cheap) every `poll`; only when memory reads clean does it scan /proc to
/// confirm no compute holder is left, so the hot loop costs one driver query.
pub fn wait_clean(
    backend: &dyn Backend,
    sel: &Selection,
    opts: &WaitOpts,
    protected: &[String],
    interrupted: &AtomicBool,
    mut progress: impl FnMut(&Dirty, Duration),
) -> Result<WaitOutcome, GpuError> {
    let started = Instant::now();
    let deadline = started + opts.timeout;
    let indices: Vec<i64> = match sel {
        Some(s) => {
            super::check_selection(sel, &backend.gpus()?)?;
            s.clone()
        }
        None => backend.gpus()?.iter().map(|g| g.index).collect(),
    };
    let mut polls = 0u64;
    loop {
        polls += 1;
        let used = backend.mem_used(&indices)?;
        let mut dirty: Dirty = used
            .iter()
            .filter(|(_, b)| b / MIB > opts.max_used_mib)
            .map(|&(i, b)| (i, b / MIB, 0))
            .collect();
        if dirty.is_empty() {
            let inv = Inventory::take(backend, protected)?;
            for h in inv.holders(&Some(indices.clone()), false) {
                for &g in h.gpus.iter().filter(|g| indices.contains(g)) {
                    match dirty.iter_mut().find(|d| d.0 == g) {
                        Some(d) => d.2 += 1,
                        None => dirty.push((g, 0, 1)),
                    }
                }
            }
            if dirty.is_empty() {
                tracing::debug!(
                    "wait_clean: clean after {polls} poll(s), {:.1} ms",
                    started.elapsed().as_secs_f64() * 1e3
                );
                return Ok(WaitOutcome::Clean);
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(WaitOutcome::TimedOut);
        }
        if interrupted.load(Ordering::Relaxed) {
            return Ok(WaitOutcome::Interrupted);
        }
        tracing::trace!("wait_clean: poll {polls}: still dirty {dirty:?}");
        progress(&dirty, now - started);
        std::thread::sleep(opts.poll.min(deadline - now));
    }
}
