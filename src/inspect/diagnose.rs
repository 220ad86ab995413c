//! diagnose(): per GPU, why memory is still used, as a verdict and one line of advice.

use super::holders::{Holder, Inventory};
use super::Selection;
use crate::process::tree::Tree;
use crate::process::ProcInfo;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    pub gpu: i64,
    /// Bytes used on the GPU, and the same in MiB.
    pub mem_used: i64,
    pub mem_used_mib: i64,
    pub holders: Vec<Holder>,
    pub ghost_pids: Vec<i64>,
    /// "clean", "held", "orphaned", "inherited", "service", "other-namespace", "permission",
    /// "driver".
    pub verdict: String,
    pub advice: String,
    pub host: String,
}

/// Diagnoses every selected GPU from one inventory.
pub fn diagnose(inv: &Inventory, sel: &Selection, foreign_ns: bool) -> Vec<Diagnosis> {
    // Orphan checks need the group and session leaders of the holders only.
    let leaders: Vec<ProcInfo> = inv
        .holders
        .iter()
        .flat_map(|h| [h.pid, h.pgid, h.sid])
        .filter_map(|p| crate::process::read_stat(p as i32).ok())
        .collect();
    let tree = Tree::new(leaders);
    inv.gpus
        .iter()
        .filter(|g| super::selected(sel, g.index))
        .map(|g| {
            let mut holders = inv.holders(&Some(vec![g.index]), false);
            // Memory on a GPU nobody is listed on can be the footprint of a CUDA process that
            // uses another GPU but maps this one too: name it rather than blame the driver.
            let footprint = holders.is_empty() && g.mem_used_mib > 0;
            if footprint {
                holders = inv
                    .holders
                    .iter()
                    .filter(|h| h.is_compute() && h.maps.contains(&g.index))
                    .cloned()
                    .collect();
            }
            let ghosts = inv.ghosts.get(&g.index).cloned().unwrap_or_default();
            let (verdict, mut advice) = verdict(
                g.index,
                g.mem_used_mib,
                &holders,
                &ghosts,
                !g.driver_procs.is_empty(),
                foreign_ns,
                inv.unreadable,
                |h: &Holder| {
                    tree.orphaned(h.pid as i32) || (h.origin.reparented && !h.origin.service_main)
                },
            );
            if footprint && !holders.is_empty() && ghosts.is_empty() {
                advice = format!(
                    "{} MiB is the CUDA footprint of {} (it uses other GPUs and maps this one too; CUDA_VISIBLE_DEVICES keeps it off)",
                    g.mem_used_mib,
                    pids(&holders.iter().collect::<Vec<_>>())
                );
            }
            Diagnosis {
                gpu: g.index,
                mem_used: g.mem_used,
                mem_used_mib: g.mem_used_mib,
                holders,
                ghost_pids: ghosts,
                verdict: verdict.to_string(),
                advice,
                host: g.host.clone(),
            }
        })
        .collect()
}

/// "4711 (python3)", with the Slurm job and user, or the container, when known.
fn pids(hs: &[&Holder]) -> String {
    hs.iter()
        .map(|h| match (&h.origin.job, &h.origin.container) {
            (Some(job), _) => format!("{} ({}, Slurm job {job} of {})", h.pid, h.name, h.user),
            (None, Some(c)) => format!(
                "{} ({}, container {})",
                h.pid,
                h.name,
                c.get(..12).unwrap_or(c)
            ),
            (None, None) => format!("{} ({})", h.pid, h.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Advice for holders that are a systemd unit's main process: stop the unit, not the pid.
fn service_advice(gpu: i64, units: &[&Holder]) -> String {
    let mut names: Vec<String> = units
        .iter()
        .filter_map(|h| {
            let unit = h.origin.service.as_deref()?;
            let user_unit = h
                .origin
                .cgroup
                .as_deref()
                .is_some_and(|c| c.contains("/user@"));
            Some(if user_unit {
                format!("systemctl --user stop {unit} (as {})", h.user)
            } else {
                format!("systemctl stop {unit}")
            })
        })
        .collect();
    names.dedup();
    format!(
        "{} hold(s) GPU {gpu} as a systemd unit's main process; killing it only makes systemd restart it: {}",
        pids(units),
        names.join("; ")
    )
}

fn list(ps: &[i64]) -> String {
    ps.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
}

/// The verdict rules, in order; kept apart from the inventory so each rule is testable.
#[allow(clippy::too_many_arguments)]
fn verdict(
    gpu: i64,
    used_mib: i64,
    holders: &[Holder],
    ghosts: &[i64],
    driver_lists_any: bool,
    foreign_ns: bool,
    unreadable: usize,
    orphaned: impl Fn(&Holder) -> bool,
) -> (&'static str, String) {
    if holders.is_empty() && used_mib == 0 {
        return ("clean", format!("GPU {gpu} is free"));
    }
    if !holders.is_empty() {
        let unlisted: Vec<&Holder> = holders
            .iter()
            .filter(|h| !h.evidence.iter().any(|e| e == "driver"))
            .collect();
        if !ghosts.is_empty() && !unlisted.is_empty() {
            return (
                "inherited",
                format!(
                    "creator pid {} has exited; {} still hold(s) its CUDA handles (a forked child): gpuloop kill --gpu {gpu}",
                    list(ghosts),
                    pids(&unlisted)
                ),
            );
        }
        // A job's process is the job's, even when its node runs jobs from a service's cgroup.
        let units: Vec<&Holder> = holders
            .iter()
            .filter(|h| h.origin.service_main && h.origin.job.is_none())
            .collect();
        if !units.is_empty() {
            return ("service", service_advice(gpu, &units));
        }
        let orphans: Vec<&Holder> = holders.iter().filter(|h| orphaned(h)).collect();
        if !orphans.is_empty() {
            return (
                "orphaned",
                format!(
                    "the job that started {} is gone; they are leftovers: gpuloop clean --gpu {gpu}",
                    pids(&orphans)
                ),
            );
        }
        let all: Vec<&Holder> = holders.iter().collect();
        return (
            "held",
            format!(
                "{} hold(s) GPU {gpu} ({used_mib} MiB): stop it if it is not meant to run (gpuloop kill --gpu {gpu})",
                pids(&all)
            ),
        );
    }
    if foreign_ns && !driver_lists_any {
        return (
            "other-namespace",
            format!(
                "{used_mib} MiB used and the driver names nobody: gpuloop runs in a container without --pid=host; run it on the host"
            ),
        );
    }
    // Processes we may not look into can hide the holder (and explain a dead-looking
    // creator too): say so before guessing at namespaces.
    if unreadable > 0 {
        return (
            "permission",
            format!(
                "{used_mib} MiB used; {unreadable} process(es) could not be inspected (other users'): run as root (sudo gpuloop diagnose)"
            ),
        );
    }
    if !ghosts.is_empty() {
        return (
            "other-namespace",
            format!(
                "{used_mib} MiB used by pid(s) {} that do not exist here: they run in another PID namespace (a container); run gpuloop there or on the host",
                list(ghosts)
            ),
        );
    }
    (
        "driver",
        format!(
            "{used_mib} MiB used and no process holds it: only a GPU reset frees it (nvidia-smi -r -i {gpu}, or cleanup::ensure_clean with allow_reset)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pid: i64, evidence: &[&str]) -> Holder {
        Holder {
            pid,
            ppid: 1,
            pgid: pid,
            sid: pid,
            start: 1,
            pidfs_ino: None,
            uid: 0,
            user: "root".into(),
            name: "python3".into(),
            cmdline: "python3".into(),
            state: "sleeping".into(),
            role: "compute".into(),
            gpus: vec![0],
            mem: 0,
            mem_mib: 0,
            evidence: evidence.iter().map(|s| s.to_string()).collect(),
            protected: false,
            host: "local".into(),
            origin: Default::default(),
            maps: vec![0],
        }
    }

    #[test]
    fn each_verdict() {
        let no = |_: &Holder| false;
        let v = |hs: &[Holder], ghosts: &[i64], used, listed, foreign, unread| {
            verdict(0, used, hs, ghosts, listed, foreign, unread, no).0
        };
        assert_eq!(v(&[], &[], 0, false, false, 0), "clean");
        assert_eq!(
            v(&[h(5, &["driver", "fd", "map"])], &[], 100, true, false, 0),
            "held"
        );
        assert_eq!(
            v(&[h(6, &["fd", "map"])], &[5], 100, true, false, 0),
            "inherited"
        );
        assert_eq!(v(&[], &[5], 100, true, false, 0), "other-namespace");
        assert_eq!(v(&[], &[], 100, false, true, 0), "other-namespace");
        assert_eq!(v(&[], &[], 100, false, false, 3), "permission");
        assert_eq!(v(&[], &[5], 100, true, false, 3), "permission");
        assert_eq!(v(&[], &[], 100, false, false, 0), "driver");
        let orphan = verdict(0, 100, &[h(7, &["driver"])], &[], true, false, 0, |h| {
            h.pid == 7
        });
        assert_eq!(orphan.0, "orphaned");
        assert!(orphan.1.contains("7 (python3)"));
        let mut unit = h(8, &["driver"]);
        unit.origin.service = Some("vllm.service".into());
        unit.origin.service_main = true;
        unit.origin.reparented = true;
        let (v, advice) = verdict(0, 100, &[unit.clone()], &[], true, false, 0, |_| true);
        assert_eq!(v, "service");
        assert!(advice.contains("systemctl stop vllm.service"), "{advice}");
        // A Slurm job's process is never a unit's, whatever cgroup slurmd left it in.
        unit.origin.job = Some(812);
        let (v, advice) = verdict(0, 100, &[unit], &[], true, false, 0, |_| true);
        assert_eq!(v, "orphaned");
        assert!(advice.contains("Slurm job 812 of root"), "{advice}");
    }
}
