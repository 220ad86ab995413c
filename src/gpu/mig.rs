//! MIG (Multi-Instance GPU): a GPU's MIG mode, its instances, and the capability nodes that
//! grant access to them, read from the driver's own `mig-minors` file.
//!
//! An instance is a GPU instance (`gi`) with one or more compute instances (`ci`) in it; a
//! job's "GPU" is one compute instance, named `MIG-<uuid>` (`CUDA_VISIBLE_DEVICES`) or, here,
//! `N:GI:CI` by its parent's index. Access to an instance is granted by two capability nodes,
//! `/dev/nvidia-caps/nvidia-capM`: the GPU instance's (`gpuN/giG/access`) and the compute
//! instance's (`gpuN/giG/ciC/access`), where N is the parent's device minor (the N of
//! /dev/nvidiaN, not NVML's index). Two more are node-wide: `config` (creating and destroying
//! instances) and `monitor` (reading every instance, as DCGM and nvidia-smi do).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The driver's list of capability minors, as NVIDIA documents it and every tool that grants
/// MIG devices reads it (nvidia-container-toolkit's `nvcaps`, Slurm's gpu/nvml).
pub(crate) const MINORS_FILE: &str = "/proc/driver/nvidia-caps/mig-minors";

/// A GPU's MIG mode now, and the one it takes at its next reset (`nvidia-smi -mig` sets the
/// pending mode; a reset, or a reboot, makes it current).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum MigMode {
    Enabled,
    Disabled,
}

impl MigMode {
    /// NVML's `NVML_DEVICE_MIG_ENABLE` (1) or anything else.
    pub(crate) fn from_nvml(v: u32) -> MigMode {
        if v == 1 {
            MigMode::Enabled
        } else {
            MigMode::Disabled
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MigMode::Enabled => "enabled",
            MigMode::Disabled => "disabled",
        }
    }
}

/// What a GPU that supports MIG says of it: its mode, and its instances while enabled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Mig {
    pub current: MigMode,
    pub pending: MigMode,
    /// Every compute instance, by GPU instance then compute instance id.
    pub instances: Vec<MigDevice>,
}

impl Mig {
    /// MIG is on now: the GPU itself runs no job, its instances do.
    pub fn enabled(&self) -> bool {
        self.current == MigMode::Enabled
    }
}

/// One MIG device (a compute instance in its GPU instance), as `gpu()` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MigDevice {
    /// The parent GPU's index.
    pub gpu: i64,
    /// The GPU instance id.
    pub gi: i64,
    /// The compute instance id within it.
    pub ci: i64,
    /// The profile, as nvidia-smi names it: `1g.10gb`, or `1c.3g.40gb` for a compute
    /// instance that is a part of its GPU instance.
    pub profile: String,
    /// `MIG-<uuid>`, as `CUDA_VISIBLE_DEVICES` and `nvidia-smi -L` name it.
    pub uuid: String,
    /// Its GPU instance's memory (compute instances of one GPU instance share it), bytes.
    pub mem_total: i64,
    pub mem_used: i64,
    pub mem_used_mib: i64,
    pub mem_total_mib: i64,
    /// The capability minors that grant it (`/dev/nvidia-caps/nvidia-capM`), from the
    /// driver's `mig-minors`; `()` where that file does not say.
    pub caps: CapMinors,
}

impl MigDevice {
    /// Its key: parent index, GPU instance, compute instance.
    pub fn key(&self) -> MigKey {
        MigKey {
            gpu: self.gpu,
            gi: self.gi,
            ci: self.ci,
        }
    }
}

/// The capability minors of one MIG device.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct CapMinors {
    /// `gpuN/giG/access`.
    pub gi: Option<i64>,
    /// `gpuN/giG/ciC/access`.
    pub ci: Option<i64>,
}

/// A MIG device by its place: the parent's index, the GPU instance, the compute instance.
/// Written `N:GI:CI`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub struct MigKey {
    pub gpu: i64,
    pub gi: i64,
    pub ci: i64,
}

impl std::fmt::Display for MigKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.gpu, self.gi, self.ci)
    }
}

/// What one capability minor grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cap {
    /// `config`: creating and destroying instances, on every GPU.
    Config,
    /// `monitor`: reading every instance of every GPU.
    Monitor,
    /// `gpuN/giG/access`: GPU instance G of the GPU whose device minor is N.
    Gi { minor: u32, gi: u32 },
    /// `gpuN/giG/ciC/access`: compute instance C in it.
    Ci { minor: u32, gi: u32, ci: u32 },
}

/// The driver's `mig-minors`: which capability each minor of `/dev/nvidia-caps/nvidia-capM`
/// grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors {
    by_minor: BTreeMap<u32, Cap>,
}

impl MigMinors {
    /// Parses the file's text: one `NAME MINOR` a line, NAME being `config`, `monitor`,
    /// `gpuN/giG/access` or `gpuN/giG/ciC/access`. A line of another shape is skipped, as
    /// the container toolkit skips it: a newer driver may add capabilities.
    pub fn parse(text: &str) -> MigMinors {
        let by_minor = text
            .lines()
            .filter_map(|line| {
                let mut it = line.split_whitespace();
                let (name, minor) = (it.next()?, it.next()?);
                if it.next().is_some() {
                    return None;
                }
                Some((minor.parse::<u32>().ok()?, cap_of(name)?))
            })
            .collect();
        MigMinors { by_minor }
    }

    /// The file at `path`, parsed; empty where it is missing or unreadable (no MIG there).
    pub fn read(path: &std::path::Path) -> MigMinors {
        std::fs::read_to_string(path)
            .map(|t| MigMinors::parse(&t))
            .unwrap_or_default()
    }

    /// What minor `m` grants.
    pub fn cap(&self, m: u32) -> Option<Cap> {
        self.by_minor.get(&m).copied()
    }

    /// The minor of a capability.
    pub fn minor_of(&self, cap: Cap) -> Option<u32> {
        self.by_minor
            .iter()
            .find_map(|(&m, &c)| (c == cap).then_some(m))
    }

    /// The minors that grant compute instance `ci` of GPU instance `gi` on the GPU whose
    /// device minor is `minor`.
    pub fn of_instance(&self, minor: u32, gi: u32, ci: u32) -> CapMinors {
        CapMinors {
            gi: self.minor_of(Cap::Gi { minor, gi }).map(i64::from),
            ci: self.minor_of(Cap::Ci { minor, gi, ci }).map(i64::from),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_minor.is_empty()
    }
}

/// `gpu3/gi7/ci0/access` and the others, as a capability.
fn cap_of(name: &str) -> Option<Cap> {
    match name {
        "config" => return Some(Cap::Config),
        "monitor" => return Some(Cap::Monitor),
        _ => {}
    }
    let mut parts = name.split('/');
    let num = |p: Option<&str>, prefix: &str| -> Option<u32> {
        let digits = p?.strip_prefix(prefix)?;
        // Digits only: "gpu+1" or "gi 1" is no capability.
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| digits.parse().ok())
            .flatten()
    };
    let minor = num(parts.next(), "gpu")?;
    let gi = num(parts.next(), "gi")?;
    match (parts.next(), parts.next(), parts.next()) {
        (Some("access"), None, None) => Some(Cap::Gi { minor, gi }),
        (ci, Some("access"), None) => Some(Cap::Ci {
            minor,
            gi,
            ci: num(ci, "ci")?,
        }),
        _ => None,
    }
}

/// The minors the driver gives GPU instance `gi` of the GPU whose device minor is `minor`,
/// and its compute instances: the layout the driver's `mig-minors` lists (`config 1`,
/// `monitor 2`, then for each GPU 15 GPU instances of 9 minors each: the GPU instance's
/// access, then its 8 compute instances'). The simulator writes its file with it.
pub(crate) fn driver_layout(minors: &[u32]) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    for &m in minors {
        for gi in 0..15u32 {
            let base = 3 + m * 135 + gi * 9;
            out.push_str(&format!("gpu{m}/gi{gi}/access {base}\n"));
            for ci in 0..8u32 {
                out.push_str(&format!("gpu{m}/gi{gi}/ci{ci}/access {}\n", base + 1 + ci));
            }
        }
    }
    out
}

/// The name of a MIG profile: `1g.10gb`, or `2c.3g.40gb` for a compute instance that is
/// only a part of its GPU instance.
pub(crate) fn profile_name(gi_slices: u32, ci_slices: u32, mem_gib: i64) -> String {
    if ci_slices == gi_slices {
        format!("{gi_slices}g.{mem_gib}gb")
    } else {
        format!("{ci_slices}c.{gi_slices}g.{mem_gib}gb")
    }
}

/// A MIG device as a selector names it, before it meets a machine's GPUs: `N:GI:CI`, `N:GI`
/// (every compute instance of that GPU instance), or a MIG UUID (or a unique prefix of one;
/// also the older `MIG-GPU-<uuid>/GI/CI` that Slurm and CUDA before driver 470 write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigSel {
    Ids { gpu: i64, gi: i64, ci: Option<i64> },
    Uuid(String),
}

impl std::fmt::Display for MigSel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigSel::Ids { gpu, gi, ci: None } => write!(f, "{gpu}:{gi}"),
            MigSel::Ids {
                gpu,
                gi,
                ci: Some(ci),
            } => write!(f, "{gpu}:{gi}:{ci}"),
            MigSel::Uuid(u) => f.write_str(u),
        }
    }
}

impl MigSel {
    /// `N:GI` or `N:GI:CI` (decimal numbers only), `MIG-…`; `None` for any other text.
    pub fn parse(text: &str) -> Option<MigSel> {
        let t = text.trim();
        if t.len() >= 4 && t[..4].eq_ignore_ascii_case("mig-") {
            return Some(MigSel::Uuid(t.to_string()));
        }
        let parts: Vec<&str> = t.split(':').collect();
        if !(2..=3).contains(&parts.len())
            || !parts
                .iter()
                .all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return None;
        }
        let n: Vec<i64> = parts.iter().filter_map(|p| p.parse().ok()).collect();
        Some(MigSel::Ids {
            gpu: n[0],
            gi: n[1],
            ci: n.get(2).copied(),
        })
    }

    /// The MIG devices among `devices` (every MIG device of a machine) this names; an unknown
    /// device, or a UUID prefix that fits several, is an error that lists them all.
    pub fn resolve(
        &self,
        devices: &[MigDevice],
        gpus: &[super::Gpu],
    ) -> Result<Vec<MigKey>, super::GpuError> {
        let listing = || {
            if devices.is_empty() {
                "there is no MIG device here".to_string()
            } else {
                format!(
                    "the MIG devices here are {}",
                    devices
                        .iter()
                        .map(|d| format!("{} ({}, {})", d.key(), d.uuid, d.profile))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        };
        let bad =
            |why: String| super::GpuError::BadSelector(format!("{self}: {why}; {}", listing()));
        let hits: Vec<&MigDevice> = match self {
            MigSel::Ids { gpu, gi, ci } => {
                if let Some(g) = gpus.iter().find(|g| g.index == *gpu) {
                    if !g.mig.as_ref().is_some_and(Mig::enabled) {
                        let mode = g.mig.as_ref().map_or("not supported".to_string(), |m| {
                            format!("{}, pending {}", m.current.as_str(), m.pending.as_str())
                        });
                        return Err(bad(format!("GPU {gpu} is not in MIG mode (MIG {mode})")));
                    }
                }
                devices
                    .iter()
                    .filter(|d| d.gpu == *gpu && d.gi == *gi && ci.is_none_or(|c| d.ci == c))
                    .collect()
            }
            MigSel::Uuid(u) => match legacy(u) {
                Some((gpu_uuid, gi, ci)) => {
                    let parents: Vec<i64> = gpus
                        .iter()
                        .filter(|g| !g.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(gpu_uuid))
                        .map(|g| g.index)
                        .collect();
                    devices
                        .iter()
                        .filter(|d| parents.contains(&d.gpu) && d.gi == gi && d.ci == ci)
                        .collect()
                }
                None => {
                    let want = u.to_ascii_lowercase();
                    let hits: Vec<&MigDevice> = devices
                        .iter()
                        .filter(|d| d.uuid.to_ascii_lowercase().starts_with(&want))
                        .collect();
                    if hits.len() > 1 {
                        return Err(bad(format!(
                            "matches {} MIG devices: give more of the UUID",
                            hits.len()
                        )));
                    }
                    hits
                }
            },
        };
        if hits.is_empty() {
            return Err(bad("no such MIG device".into()));
        }
        Ok(hits.iter().map(|d| d.key()).collect())
    }
}

/// `MIG-GPU-<uuid>/GI/CI`: the GPU's UUID and the instance's ids.
fn legacy(text: &str) -> Option<(&str, i64, i64)> {
    let rest = text.get(4..)?;
    if !rest.get(..4)?.eq_ignore_ascii_case("gpu-") {
        return None;
    }
    let mut it = rest.split('/');
    let (uuid, gi, ci) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    Some((uuid, gi.parse().ok()?, ci.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines the container toolkit's tests pin, and the driver's layout.
    #[test]
    fn reads_the_drivers_mig_minors() {
        let m = MigMinors::parse(
            "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\
             gpu1/gi7/access 201\ngpu1/gi7/ci2/access 204\nnotconfig 99\nconfig notanint\n\n",
        );
        assert_eq!(m.cap(1), Some(Cap::Config));
        assert_eq!(m.cap(2), Some(Cap::Monitor));
        assert_eq!(m.cap(3), Some(Cap::Gi { minor: 0, gi: 0 }));
        assert_eq!(
            m.cap(204),
            Some(Cap::Ci {
                minor: 1,
                gi: 7,
                ci: 2
            })
        );
        assert_eq!(m.cap(99), None);
        assert_eq!(
            m.of_instance(1, 7, 2),
            CapMinors {
                gi: Some(201),
                ci: Some(204)
            }
        );
        assert_eq!(m.of_instance(1, 7, 3).ci, None);
        for bad in [
            "gpu/gi0/access 5",
            "gpu0/gi/access 5",
            "gpu0/gi0 5",
            "gpu0/gi0/ci0 5",
            "gpu0/gi0/ci0/access/x 5",
            "gpu+1/gi0/access 5",
            "gpu0/gi0/access 5 6",
            "gpu0/gi0/access -5",
        ] {
            assert!(MigMinors::parse(bad).is_empty(), "{bad}");
        }
    }

    #[test]
    fn the_driver_layout_reads_back_through_the_parser() {
        let m = MigMinors::parse(&driver_layout(&[0, 3]));
        assert_eq!(
            m.of_instance(0, 0, 0),
            CapMinors {
                gi: Some(3),
                ci: Some(4)
            }
        );
        assert_eq!(m.cap(12), Some(Cap::Gi { minor: 0, gi: 1 }));
        let base = 3 + 3 * 135 + 7 * 9;
        assert_eq!(m.cap(base), Some(Cap::Gi { minor: 3, gi: 7 }));
        assert_eq!(
            m.cap(base + 2),
            Some(Cap::Ci {
                minor: 3,
                gi: 7,
                ci: 1
            })
        );
    }

    #[test]
    fn mig_selectors_are_told_from_hosts_and_bus_ids() {
        assert_eq!(
            MigSel::parse("0:7:0"),
            Some(MigSel::Ids {
                gpu: 0,
                gi: 7,
                ci: Some(0)
            })
        );
        assert_eq!(
            MigSel::parse("1:2"),
            Some(MigSel::Ids {
                gpu: 1,
                gi: 2,
                ci: None
            })
        );
        assert_eq!(
            MigSel::parse("mig-1a2b"),
            Some(MigSel::Uuid("mig-1a2b".into()))
        );
        for not in [
            "0",
            "gpu01:3",
            "18:00.0",
            "0000:18:00.0",
            "0:1:2:3",
            "0:",
            ":1",
            "0:-1",
            "0:9999999999",
            "MI",
        ] {
            assert_eq!(MigSel::parse(not), None, "{not}");
        }
        assert_eq!(
            legacy("MIG-GPU-5c3f-1234/7/0"),
            Some(("GPU-5c3f-1234", 7, 0))
        );
        assert_eq!(legacy("MIG-5c3f"), None);
    }

    #[test]
    fn profiles_are_named_as_nvidia_smi_names_them() {
        assert_eq!(profile_name(1, 1, 10), "1g.10gb");
        assert_eq!(profile_name(3, 1, 40), "1c.3g.40gb");
    }
}
