//! The simulator's GPU faults (`gpuloop sim fault`), with the driver's semantics: Xids go
//! into the simulator's kernel log (`$GPULOOP_SIM_DIR/kmsg`, read as `/dev/kmsg` is), the
//! counts and remap state live in `faults.json`, a GPU that fell off the bus fails every read,
//! and a reset clears the volatile counts, applies a pending remap and clears the recovery
//! action, as a real reset does. `nvidia_drm`'s `modeset` is the file
//! `sys/module/nvidia_drm/parameters/modeset` of the state directory.

use super::SimBackend;
use crate::gpu::faults::{Ecc, Faults, Pci, RecoveryAction, RemappedRows};
use crate::gpu::{kmsg, GpuError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One simulated GPU's fault state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct GpuFaults {
    pub ecc_corrected: i64,
    pub ecc_uncorrected: i64,
    pub rows_correctable: i64,
    pub rows_uncorrectable: i64,
    pub remap_pending: bool,
    pub remap_failure: bool,
    /// NVML's recovery action value; `None`: none asked for.
    pub recovery: Option<u64>,
    /// Fell off the bus: every read fails, a reset cannot reach it.
    pub off_bus: bool,
    /// Persistence mode is off (on by default, as on a node that runs nvidia-persistenced).
    pub persistence_off: bool,
}

/// What `gpuloop sim fault` injects on one GPU.
#[derive(Debug, Clone, Default)]
pub struct Inject {
    /// An Xid to log, with the pid and name the driver would name.
    pub xid: Option<i64>,
    pub pid: Option<i64>,
    pub name: Option<String>,
    /// The Xid's message after its code (a default one when not given).
    pub text: Option<String>,
    pub ecc_corrected: i64,
    pub ecc_uncorrected: i64,
    pub remap_pending: bool,
    pub remap_failure: bool,
    pub recovery: Option<RecoveryAction>,
    pub off_bus: bool,
    /// Back to a healthy GPU (the state a reboot would leave).
    pub clear: bool,
    /// Turn persistence mode on (`Some(true)`) or off, as `nvidia-smi -pm` does.
    pub persistence: Option<bool>,
}

impl SimBackend {
    /// The simulated kernel log, read as `/dev/kmsg` is.
    pub fn kernel_log(&self) -> PathBuf {
        self.dir.join("kmsg")
    }

    fn faults_file(&self) -> PathBuf {
        self.dir.join("faults.json")
    }

    fn modeset_file(&self) -> PathBuf {
        self.dir.join("sys/module/nvidia_drm/parameters/modeset")
    }

    /// Every GPU's fault state; none recorded is a healthy GPU.
    pub(crate) fn fault_state(&self) -> Result<BTreeMap<i64, GpuFaults>, GpuError> {
        match std::fs::read(self.faults_file()) {
            Ok(text) => serde_json::from_slice(&text).map_err(|e| {
                self.err(format!(
                    "faults.json is corrupt ({e}); remove it to go on with healthy GPUs"
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(self.err(e)),
        }
    }

    fn save_faults(&self, state: &BTreeMap<i64, GpuFaults>) -> Result<(), GpuError> {
        let tmp = self.dir.join(".faults.json.tmp");
        let text = serde_json::to_vec_pretty(state).map_err(|e| self.err(e))?;
        std::fs::write(&tmp, text).map_err(|e| self.err(e))?;
        std::fs::rename(&tmp, self.faults_file()).map_err(|e| self.err(e))
    }

    fn err(&self, why: impl std::fmt::Display) -> GpuError {
        GpuError::SimState {
            dir: self.dir.clone(),
            why: why.to_string(),
        }
    }

    /// The PCI bus id the simulated driver gives GPU `index` (`00000000:18:00.0`, …).
    pub(crate) fn bus_id(index: usize) -> String {
        format!("00000000:{:02X}:00.0", 0x18 + index)
    }

    /// `gpuloop sim fault`: records the facts and logs the Xid, as the driver would.
    pub fn inject(&self, gpu: i64, what: &Inject) -> Result<(), GpuError> {
        self.minor(gpu)?;
        let mut state = self.fault_state()?;
        let f = state.entry(gpu).or_default();
        if what.clear {
            *f = GpuFaults::default();
        }
        f.ecc_corrected = f.ecc_corrected.saturating_add(what.ecc_corrected);
        f.ecc_uncorrected = f.ecc_uncorrected.saturating_add(what.ecc_uncorrected);
        if what.remap_pending && !f.remap_pending {
            // The row waits for a reset; it counts as remapped for an uncorrectable error.
            f.remap_pending = true;
            f.rows_uncorrectable += 1;
        }
        f.remap_failure |= what.remap_failure;
        if let Some(a) = what.recovery {
            f.recovery = a.code().filter(|&c| c != 0);
        }
        if let Some(on) = what.persistence {
            f.persistence_off = !on;
        }
        let newly_off = what.off_bus && !f.off_bus;
        f.off_bus |= what.off_bus;
        self.save_faults(&state)?;
        let pci = Pci::parse(&Self::bus_id(gpu as usize)).map(|p| p.kernel_name());
        let pci = pci.unwrap_or_default();
        let log = |line: String| kmsg::append(&self.kernel_log(), &line).map_err(|e| self.err(e));
        if let Some(code) = what.xid {
            let text = what.text.clone().unwrap_or_else(|| default_text(code));
            log(xid_line(&pci, code, what.pid, what.name.as_deref(), &text))?;
        }
        if newly_off {
            // The driver says so itself, whatever else was injected.
            log(format!(
                "NVRM: Xid ({pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
            ))?;
        }
        Ok(())
    }

    /// `gpuloop sim fault --drm-modeset on|off`: loads `nvidia_drm` with that `modeset`.
    pub fn set_drm_modeset(&self, on: bool) -> Result<(), GpuError> {
        let p = self.modeset_file();
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.err(e))?;
        }
        std::fs::write(&p, if on { "Y\n" } else { "N\n" }).map_err(|e| self.err(e))
    }

    /// Whether the simulated `nvidia_drm` holds the GPUs (loaded with modeset=1).
    pub(crate) fn modeset(&self) -> Option<bool> {
        crate::gpu::drm_modeset_in(&self.modeset_file())
    }

    /// The facts a GPU reports, as NVML would for an H200: ECC on, rows remapped rather
    /// than pages retired (`None`), a recovery action, persistence mode.
    pub(crate) fn reported(f: &GpuFaults) -> Faults {
        Faults {
            ecc: Some(Ecc {
                corrected: f.ecc_corrected,
                uncorrected: f.ecc_uncorrected,
            }),
            remapped_rows: Some(RemappedRows {
                correctable: f.rows_correctable,
                uncorrectable: f.rows_uncorrectable,
                pending: f.remap_pending,
                failure: f.remap_failure,
            }),
            retired_pages: None,
            recovery_action: Some(RecoveryAction::from_code(f.recovery.unwrap_or(0))),
            persistence_mode: Some(!f.persistence_off),
            ..Faults::default()
        }
    }

    /// What a successful reset does to a GPU's faults: the volatile counts go, a pending
    /// remap is applied, the driver asks for nothing more.
    pub(crate) fn after_reset(&self, gpu: i64) -> Result<(), GpuError> {
        let mut state = self.fault_state()?;
        if let Some(f) = state.get_mut(&gpu) {
            f.ecc_corrected = 0;
            f.ecc_uncorrected = 0;
            f.remap_pending = false;
            f.recovery = None;
            self.save_faults(&state)?;
        }
        Ok(())
    }
}

/// An Xid line as the driver writes it (`krcReportXid`): the pid, then the name the driver
/// keeps for that process, which is its comm (at most 15 bytes) when it opened the GPU: the
/// one given, else the process's comm now, else `<unknown>` as older drivers write it.
fn xid_line(pci: &str, code: i64, pid: Option<i64>, name: Option<&str>, text: &str) -> String {
    let Some(pid) = pid else {
        return format!("NVRM: Xid ({pci}): {code}, pid='<unknown>', name=<unknown>, {text}");
    };
    let comm = || {
        std::fs::read(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| String::from_utf8_lossy(c.strip_suffix(b"\n").unwrap_or(&c)).into_owned())
    };
    let name = name.map(str::to_string).or_else(comm);
    let name = name.map_or("<unknown>".to_string(), |n| comm_of(&n));
    format!("NVRM: Xid ({pci}): {code}, pid={pid}, name={name}, {text}")
}

/// `name` as the kernel keeps a comm: its first 15 bytes (cut at a character's boundary, as
/// a name given as text is).
fn comm_of(name: &str) -> String {
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// The message the driver writes after an Xid's code, for the common ones.
fn default_text(code: i64) -> String {
    match code {
        13 => "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address".into(),
        31 => "channel 0x0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x7f0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE".into(),
        43 => "Ch 00000008".into(),
        48 => "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.".into(),
        63 => "Row Remapper: New row marked for remapping, reset gpu to activate.".into(),
        79 => "GPU has fallen off the bus.".into(),
        94 => "Contained: CE User Channel (0x9). RST: No, D-RST: No".into(),
        95 => "Uncontained: FBHUB. RST: Yes, D-RST: No".into(),
        119 => "Timeout after 6s of waiting for RPC response from GPU0 GSP!".into(),
        _ => "simulated".into(),
    }
}
