//! The simulator's MIG: which GPUs are in MIG mode, their instances (placed and numbered as
//! the driver numbers them on A100/H100), the driver's `mig-minors` file and capability nodes.
//!
//! Spec options (`--sim 2x80G,mig=0:1g.10gb+1g.10gb+3g.40gb/3,mig_pending=1:enabled`):
//! - `mig=N:P+P+…`: GPU N is in MIG mode with these GPU instances; `P` is a profile
//!   `Sg.Mgb` (S compute slices of 7, M GiB), with one compute instance of the whole of it, or
//!   `Sg.Mgb/K` with K compute instances of S/K slices each. `mig=N:` is MIG mode with no
//!   instance. One `mig=` per GPU.
//! - `mig_pending=N:enabled|disabled`: GPU N's pending mode (what `nvidia-smi -mig` set, for
//!   its next reset); by default the current one.
//!
//! Every simulated GPU supports MIG (as an H100 or H200 does): a GPU without `mig=` reports
//! MIG disabled.

use super::super::mig::{self, CapMinors, Mig, MigDevice, MigKey, MigMinors, MigMode};
use super::super::MIB;

/// A GPU instance as the spec gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstance {
    /// Its id, as the driver places it.
    pub gi: u32,
    /// Compute slices (of 7).
    pub slices: u32,
    pub mem_gib: i64,
    /// How many compute instances it is cut into (each of `slices / cis` slices).
    pub cis: u32,
}

/// One GPU's MIG state in a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMig {
    pub current: MigMode,
    pub pending: MigMode,
    pub instances: Vec<GpuInstance>,
}

impl Default for SimMig {
    fn default() -> SimMig {
        SimMig {
            current: MigMode::Disabled,
            pending: MigMode::Disabled,
            instances: Vec::new(),
        }
    }
}

/// The GPU instance ids the driver gives each size, in the order it places them (A100 and
/// H100: 7g is 0; 4g 1; 3g 1, 2; 2g 3-6; 1g 7-14).
fn placements(slices: u32) -> &'static [u32] {
    match slices {
        7 => &[0],
        4 => &[1],
        3 => &[1, 2],
        2 => &[3, 4, 5, 6],
        1 => &[7, 8, 9, 10, 11, 12, 13, 14],
        _ => &[],
    }
}

/// `1g.10gb`, `3g.40gb/3`: (slices, GiB, compute instances).
fn profile(p: &str) -> Result<(u32, i64, u32), String> {
    let (p, cis) = match p.split_once('/') {
        Some((p, k)) => (
            p,
            k.parse::<u32>()
                .map_err(|_| format!("{k:?} is not a number of compute instances"))?,
        ),
        None => (p, 1),
    };
    let bad = || format!("{p:?} is not a MIG profile like 1g.10gb or 3g.40gb");
    let (g, mem) = p.split_once('.').ok_or_else(bad)?;
    let slices: u32 = g
        .strip_suffix('g')
        .ok_or_else(bad)?
        .parse()
        .map_err(|_| bad())?;
    let gib: i64 = mem
        .strip_suffix("gb")
        .ok_or_else(bad)?
        .parse()
        .map_err(|_| bad())?;
    if placements(slices).is_empty() {
        return Err(format!("{p:?}: a GPU instance has 1, 2, 3, 4 or 7 slices"));
    }
    if gib <= 0 {
        return Err(format!("{p:?}: no memory"));
    }
    if cis == 0 || cis > 8 || !slices.is_multiple_of(cis) {
        return Err(format!(
            "{p:?}/{cis}: its {slices} slices do not divide into {cis} compute instances"
        ));
    }
    Ok((slices, gib, cis))
}

/// Parses one `mig=N:P+P+…` value, for a GPU of `mem_bytes`: (N, its state).
pub(crate) fn parse_mig(v: &str, mem_bytes: i64) -> Result<(usize, SimMig), String> {
    let (n, list) = v
        .split_once(':')
        .ok_or_else(|| format!("mig={v:?}: expected GPU:PROFILE+PROFILE…"))?;
    let gpu: usize = n
        .trim()
        .parse()
        .map_err(|_| format!("mig={v:?}: {n:?} is not a GPU index"))?;
    let mut taken: Vec<u32> = Vec::new();
    let mut instances = Vec::new();
    let (mut slices, mut mem) = (0u32, 0i64);
    for p in list.split('+').map(str::trim).filter(|p| !p.is_empty()) {
        let (s, gib, cis) = profile(p).map_err(|e| format!("mig={v:?}: {e}"))?;
        let gi = placements(s)
            .iter()
            .copied()
            .find(|id| !taken.contains(id))
            .ok_or_else(|| format!("mig={v:?}: no room left for {p}"))?;
        taken.push(gi);
        slices += s;
        mem = mem.saturating_add(gib.saturating_mul(1024 * MIB));
        instances.push(GpuInstance {
            gi,
            slices: s,
            mem_gib: gib,
            cis,
        });
    }
    if slices > 7 {
        return Err(format!("mig={v:?}: {slices} compute slices, a GPU has 7"));
    }
    if mem > mem_bytes {
        return Err(format!(
            "mig={v:?}: the instances need more memory than the GPU has"
        ));
    }
    Ok((
        gpu,
        SimMig {
            current: MigMode::Enabled,
            pending: MigMode::Enabled,
            instances,
        },
    ))
}

/// Parses one `mig_pending=N:enabled|disabled` value.
pub(crate) fn parse_pending(v: &str) -> Result<(usize, MigMode), String> {
    let (n, mode) = v
        .split_once(':')
        .ok_or_else(|| format!("mig_pending={v:?}: expected GPU:enabled or GPU:disabled"))?;
    let gpu: usize = n
        .trim()
        .parse()
        .map_err(|_| format!("mig_pending={v:?}: {n:?} is not a GPU index"))?;
    let mode = match mode.trim() {
        "enabled" | "on" | "1" => MigMode::Enabled,
        "disabled" | "off" | "0" => MigMode::Disabled,
        m => {
            return Err(format!(
                "mig_pending={v:?}: {m:?} is not enabled or disabled"
            ))
        }
    };
    Ok((gpu, mode))
}

/// A MIG device's UUID in the simulator: `MIG-` and a UUID whose first digits differ from
/// one device to the next, as real ones do, so prefixes select one.
pub(crate) fn uuid(gpu: i64, gi: u32, ci: u32) -> String {
    let seed = (gpu as u32)
        .wrapping_mul(1000)
        .wrapping_add(gi * 10 + ci + 1)
        .wrapping_mul(0x85eb_ca6b);
    format!(
        "MIG-{seed:08x}-{gi:04x}-4{ci:03x}-9{gpu:03x}-{:012x}",
        seed ^ 0x5bd1_e995
    )
}

impl SimMig {
    /// The MIG devices of GPU `index` (device minor `minor`) as the driver lists them, each
    /// with the memory `used` says it uses and the capability minors `minors` gives it.
    pub(crate) fn devices(
        &self,
        index: i64,
        minor: u32,
        used: impl Fn(u32) -> i64,
        minors: &MigMinors,
    ) -> Vec<MigDevice> {
        let mut out = Vec::new();
        for g in &self.instances {
            let ci_slices = g.slices / g.cis;
            for ci in 0..g.cis {
                let total = g.mem_gib * 1024 * MIB;
                // Compute instances of one GPU instance share its memory.
                let used = used(g.gi).min(total);
                out.push(MigDevice {
                    gpu: index,
                    gi: i64::from(g.gi),
                    ci: i64::from(ci),
                    profile: mig::profile_name(g.slices, ci_slices, g.mem_gib),
                    uuid: uuid(index, g.gi, ci),
                    mem_total: total,
                    mem_used: used,
                    mem_used_mib: used / MIB,
                    mem_total_mib: total / MIB,
                    caps: minors.of_instance(minor, g.gi, ci),
                });
            }
        }
        out.sort_by_key(MigDevice::key);
        out
    }

    /// The GPU's `Mig` record.
    pub(crate) fn record(&self, devices: Vec<MigDevice>) -> Mig {
        Mig {
            current: self.current,
            pending: self.pending,
            instances: if self.current == MigMode::Enabled {
                devices
            } else {
                Vec::new()
            },
        }
    }

    /// GPU instance `gi`, when it has compute instance `ci`.
    pub(crate) fn instance(&self, gi: u32, ci: u32) -> Option<&GpuInstance> {
        self.instances.iter().find(|g| g.gi == gi && ci < g.cis)
    }

    pub(crate) fn enabled(&self) -> bool {
        self.current == MigMode::Enabled
    }
}

/// The capability minors of every instance of `devices`, and `config` and `monitor`: the
/// nodes the driver has under `/dev/nvidia-caps` once these instances exist.
pub(crate) fn cap_nodes(devices: &[MigDevice], minors: &MigMinors) -> Vec<u32> {
    let mut out: Vec<u32> = [mig::Cap::Config, mig::Cap::Monitor]
        .into_iter()
        .filter_map(|c| minors.minor_of(c))
        .collect();
    for d in devices {
        let CapMinors { gi, ci } = d.caps;
        out.extend(
            gi.into_iter()
                .chain(ci)
                .filter_map(|m| u32::try_from(m).ok()),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A key's instance ids as the driver gives them.
pub(crate) fn ids(k: &MigKey) -> Option<(u32, u32)> {
    Some((u32::try_from(k.gi).ok()?, u32::try_from(k.ci).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_placed_as_the_driver_places_them() {
        let (gpu, m) = parse_mig("0:1g.10gb+1g.10gb+3g.40gb/3", 80 * 1024 * MIB).unwrap();
        assert_eq!(gpu, 0);
        let ids: Vec<(u32, u32)> = m.instances.iter().map(|g| (g.gi, g.cis)).collect();
        assert_eq!(ids, [(7, 1), (8, 1), (1, 3)]);
        let d = m.devices(0, 0, |_| 0, &MigMinors::parse(&mig::driver_layout(&[0])));
        let keys: Vec<String> = d.iter().map(|d| d.key().to_string()).collect();
        assert_eq!(keys, ["0:1:0", "0:1:1", "0:1:2", "0:7:0", "0:8:0"]);
        assert_eq!(d[0].profile, "1c.3g.40gb");
        assert_eq!(d[3].profile, "1g.10gb");
        assert_eq!(d[3].caps.gi, Some(3 + 7 * 9));
        let uuids: std::collections::BTreeSet<String> =
            d.iter().map(|d| d.uuid[..12].to_string()).collect();
        assert_eq!(uuids.len(), d.len(), "{d:?}");
    }

    #[test]
    fn bad_mig_specs_say_why() {
        let g = 80 * 1024 * MIB;
        for bad in [
            "0",
            "x:1g.10gb",
            "0:1x.10gb",
            "0:5g.10gb",
            "0:1g.10",
            "0:7g.80gb+1g.10gb",
            "0:3g.40gb/2",
            "0:4g.90gb",
            "0:1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb",
        ] {
            assert!(parse_mig(bad, g).is_err(), "{bad}");
        }
        assert!(parse_pending("0:maybe").is_err());
        assert_eq!(parse_pending("1:enabled"), Ok((1, MigMode::Enabled)));
    }
}
