//! GPU selectors as `nvidia-smi -i` takes them: indices, comma lists, ranges (`0-3`), UUIDs
//! (or a unique prefix of one) and PCI bus ids, resolved against the GPUs there are; and MIG
//! devices, each a GPU of its own: `N:GI:CI`, `N:GI` or `MIG-<uuid>` (or a unique prefix).
//!
//! The grammar keeps them apart: a selector whose `:`-separated parts are all decimal numbers
//! is a MIG device (`0:7:0`); `DEST:N` (with several hosts) has a host part that is not a
//! number; a bus id has a `.`; a UUID starts with a letter.

use crate::gpu::mig::MigSel;
use crate::gpu::{Gpu, GpuError};

/// One selector before it meets the GPU list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Index(i64),
    /// A UUID, a prefix of one, or a bus id.
    Id(String),
    /// A MIG device: it selects its parent GPU, narrowed to that instance.
    Mig(MigSel),
}

/// Parses `0`, `0,1`, `0-3`, `GPU-0fb0…`, `00000000:18:00.0` and comma lists of them.
pub(crate) fn parse(text: &str) -> Result<Vec<Selector>, GpuError> {
    let bad = |why: &str| GpuError::BadSelector(format!("{text:?}: {why}"));
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(bad("an empty item"));
        }
        if let Some(m) = MigSel::parse(part) {
            out.push(Selector::Mig(m));
            continue;
        }
        // A number, whatever its size or sign, is an index: `-0` is as negative as `-1`, and
        // an index too large for any machine is no UUID.
        let digits = part.strip_prefix(['-', '+']).unwrap_or(part);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            if part.starts_with('-') {
                return Err(bad("GPU indices are not negative"));
            }
            match digits.parse::<i64>() {
                Ok(i) => out.push(Selector::Index(i)),
                Err(_) => return Err(bad(&format!("no GPU with index {digits}"))),
            }
        } else if let Some((a, b)) = part
            .split_once('-')
            .and_then(|(a, b)| Some((a.parse::<i64>().ok()?, b.parse::<i64>().ok()?)))
        {
            if a > b {
                return Err(bad(&format!("the range {a}-{b} runs backwards")));
            }
            if b - a > 4096 {
                return Err(bad(&format!(
                    "the range {a}-{b} is larger than any machine"
                )));
            }
            out.extend((a..=b).map(Selector::Index));
        } else if part.starts_with(|c: char| c.is_ascii_digit() || c.is_ascii_alphabetic()) {
            out.push(Selector::Id(part.to_string()));
        } else {
            return Err(bad(
                "expected an index, a range (0-3), a UUID, a bus id, or a MIG device (N:GI:CI, MIG-…)",
            ));
        }
    }
    Ok(out)
}

/// The GPU indices the selectors name, in the order given, without repeats. An index is kept
/// as it is (an unknown one is reported where the selection is checked); an id must match
/// exactly one GPU.
pub(crate) fn resolve(sels: &[Selector], gpus: &[Gpu]) -> Result<Vec<i64>, GpuError> {
    let mut out: Vec<i64> = Vec::new();
    for s in sels {
        let found = match s {
            Selector::Index(i) => vec![*i],
            Selector::Id(id) => vec![find(id, gpus)?],
            Selector::Mig(m) => parents(m, gpus)?,
        };
        for i in found {
            if !out.contains(&i) {
                out.push(i);
            }
        }
    }
    Ok(out)
}

/// The parent GPUs of a MIG selector (`N:…` names its parent; a UUID is looked up).
fn parents(m: &MigSel, gpus: &[Gpu]) -> Result<Vec<i64>, GpuError> {
    if let MigSel::Ids { gpu, .. } = m {
        return Ok(vec![*gpu]);
    }
    let devices: Vec<crate::gpu::mig::MigDevice> = gpus
        .iter()
        .filter_map(|g| g.mig.as_ref())
        .flat_map(|m| m.instances.iter().cloned())
        .collect();
    let mut out: Vec<i64> = m.resolve(&devices, gpus)?.iter().map(|k| k.gpu).collect();
    out.dedup();
    Ok(out)
}

/// The MIG selectors that narrow the selection: those whose parent GPU no other selector
/// names whole (a GPU selects all its instances). `None` when there are none.
pub(crate) fn narrowing(sels: &[Selector], gpus: &[Gpu]) -> Result<Option<Vec<MigSel>>, GpuError> {
    let whole: Vec<&Selector> = sels
        .iter()
        .filter(|s| !matches!(s, Selector::Mig(_)))
        .collect();
    let whole = resolve(&whole.into_iter().cloned().collect::<Vec<_>>(), gpus)?;
    let mut out = Vec::new();
    for s in sels {
        if let Selector::Mig(m) = s {
            if !parents(m, gpus)?.iter().all(|p| whole.contains(p)) && !out.contains(m) {
                out.push(m.clone());
            }
        }
    }
    Ok((!out.is_empty()).then_some(out))
}

fn find(id: &str, gpus: &[Gpu]) -> Result<i64, GpuError> {
    if let Some(bus) = bus_id(id) {
        if let Some(g) = gpus.iter().find(|g| bus_id(&g.bus_id) == Some(bus)) {
            return Ok(g.index);
        }
    }
    let want = id.to_ascii_lowercase();
    let hits: Vec<&Gpu> = gpus
        .iter()
        .filter(|g| {
            let uuid = g.uuid.to_ascii_lowercase();
            // "GPU-" may be left out, as nvidia-smi allows.
            uuid.starts_with(&want) || uuid.trim_start_matches("gpu-").starts_with(&want)
        })
        .collect();
    match hits.as_slice() {
        [g] => Ok(g.index),
        [] => Err(GpuError::NoSuchGpuId {
            id: id.to_string(),
            count: gpus.len(),
        }),
        many => Err(GpuError::BadSelector(format!(
            "{id:?} matches {} GPUs ({}): give more of the UUID",
            many.len(),
            many.iter()
                .map(|g| g.index.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// A PCI bus id as numbers (domain, bus, device, function): `00000000:18:00.0`, `0000:18:00.0`
/// and `18:00.0` are the same GPU.
fn bus_id(text: &str) -> Option<(u32, u32, u32, u32)> {
    let (rest, func) = text.rsplit_once('.')?;
    let mut parts: Vec<&str> = rest.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let [d, b, dev] = parts.as_slice() else {
        return None;
    };
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(d)?, hex(b)?, hex(dev)?, hex(func)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<Gpu> {
        (0..4)
            .map(|i| {
                Gpu::new(
                    i,
                    i,
                    format!("GPU-{:x}0fb0-1111-2222-3333-44445555666{i}", 10 + i),
                    "H200".into(),
                    format!("00000000:{:02X}:00.0", 0x18 + i),
                    1,
                    0,
                    vec![],
                )
            })
            .collect()
    }

    fn sel(text: &str) -> Result<Vec<i64>, String> {
        parse(text)
            .and_then(|s| resolve(&s, &gpus()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn lists_ranges_uuids_and_bus_ids() {
        assert_eq!(sel("0,1"), Ok(vec![0, 1]));
        assert_eq!(sel("1-3"), Ok(vec![1, 2, 3]));
        assert_eq!(sel("3, 0-1,1"), Ok(vec![3, 0, 1]));
        assert_eq!(sel("GPU-b0fb0"), Ok(vec![1]));
        assert_eq!(sel("c0fb0-1111"), Ok(vec![2]));
        assert_eq!(sel("gpu-D0FB0-1111-2222-3333-444455556663"), Ok(vec![3]));
        assert_eq!(sel("00000000:19:00.0"), Ok(vec![1]));
        assert_eq!(sel("0000:1a:00.0"), Ok(vec![2]));
        assert_eq!(sel("1B:00.0"), Ok(vec![3]));
        // Indices are checked later, against the GPUs there are.
        assert_eq!(sel("9"), Ok(vec![9]));
    }

    #[test]
    fn bad_selectors_say_why() {
        assert!(sel("").unwrap_err().contains("empty"));
        assert!(sel("0,,1").unwrap_err().contains("empty"));
        assert!(sel("3-1").unwrap_err().contains("backwards"));
        assert!(sel("-1").unwrap_err().contains("not negative"));
        // The bug: `-0` was index 0, and a 20-digit index was looked up as a UUID.
        assert!(sel("-0").unwrap_err().contains("not negative"));
        assert!(sel("0,-0").unwrap_err().contains("not negative"));
        assert!(sel("99999999999999999999")
            .unwrap_err()
            .contains("no GPU with index 99999999999999999999"));
        assert_eq!(parse("+1").unwrap(), vec![Selector::Index(1)]);
        assert!(sel("GPU-").unwrap_err().contains("matches 4 GPUs"));
        assert!(sel("GPU-ffff")
            .unwrap_err()
            .contains("no GPU with UUID or bus id"));
        assert!(sel("0-99999").unwrap_err().contains("larger"));
    }

    #[test]
    fn mig_devices_select_their_parent_and_narrow_it() {
        assert_eq!(
            parse("0:7:0,1").unwrap(),
            vec![
                Selector::Mig(MigSel::Ids {
                    gpu: 0,
                    gi: 7,
                    ci: Some(0)
                }),
                Selector::Index(1)
            ]
        );
        assert_eq!(sel("2:7:0,1"), Ok(vec![2, 1]));
        let n = |t: &str| narrowing(&parse(t).unwrap(), &gpus()).unwrap();
        assert_eq!(n("0:7:0").map(|v| v.len()), Some(1));
        // A physical GPU selects all its instances.
        assert_eq!(n("0,0:7:0"), None);
        assert_eq!(n("1,0:7:0").map(|v| v.len()), Some(1));
        assert_eq!(n("0,1"), None);
    }
}
