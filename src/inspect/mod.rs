//! Who holds the GPUs and why memory is still used: the join of the driver's view with /proc.

pub mod diagnose;
pub mod holders;
pub mod select;
pub mod wait;

use crate::gpu::GpuError;

/// A GPU selection: `None` is every GPU.
pub type Selection = Option<Vec<i64>>;

/// Checks a selection against the GPUs there are; an unknown index is an error, not a gap.
pub fn check_selection(sel: &Selection, gpus: &[crate::gpu::Gpu]) -> Result<(), GpuError> {
    for &i in sel.iter().flatten() {
        if !gpus.iter().any(|g| g.index == i) {
            return Err(GpuError::NoSuchGpu {
                index: i,
                count: gpus.len(),
            });
        }
    }
    Ok(())
}

pub fn selected(sel: &Selection, index: i64) -> bool {
    sel.as_ref().is_none_or(|s| s.contains(&index))
}

/// Which holders a caller wants besides the GPU selection: `#{user: "alice"}`, `#{job: 812}`,
/// `--user U`, `--job N`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Filter {
    pub uid: Option<u32>,
    pub job: Option<i64>,
}

impl Filter {
    /// No filter at all: every holder.
    pub fn is_empty(&self) -> bool {
        self.uid.is_none() && self.job.is_none()
    }

    pub fn matches(&self, h: &holders::Holder) -> bool {
        self.uid.is_none_or(|u| h.uid == i64::from(u))
            && self.job.is_none_or(|j| h.origin.job == Some(j))
    }
}
