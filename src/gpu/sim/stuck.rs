//! `sim hold --stuck`: holders that SIGKILL cannot end, as a process asleep in the driver.
//!
//! Made real, not mocked, with the cgroup-v1 freezer: a frozen process sleeps uninterruptibly
//! (state `D`, wchan `__refrigerator`), and a SIGKILL stays pending until it is thawed, exactly
//! what gpuloop sees of a process stuck in the NVIDIA driver. `sim release` thaws them; any
//! pending SIGKILL then ends them. Needs root and the v1 freezer controller, which is mounted
//! at /run/gpuloop-freezer when no hierarchy has it yet (the cgroup-v2 freezer is no use:
//! a fatal signal ends a v2-frozen process).

use super::SimBackend;
use crate::gpu::GpuError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where gpuloop mounts a freezer hierarchy of its own when there is none.
const OWN_MOUNT: &str = "/run/gpuloop-freezer";

/// The file in the simulator's state directory naming its freezer cgroup.
const RECORD: &str = "stuck.cgroup";

fn err(sim: &SimBackend, why: impl std::fmt::Display) -> GpuError {
    GpuError::SimState {
        dir: sim.dir.clone(),
        why: format!("sim hold --stuck: {why}"),
    }
}

/// The mount point of a cgroup-v1 hierarchy with the freezer controller, from mountinfo.
fn freezer_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, opts) = (r.next()?, r.next()?, r.next()?);
        let point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup" && opts.split(',').any(|o| o == "freezer")).then(|| point.into())
    })
}

fn ensure_mount(sim: &SimBackend) -> Result<PathBuf, GpuError> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| err(sim, e))?;
    if let Some(p) = freezer_mount(&info) {
        return Ok(p);
    }
    std::fs::create_dir_all(OWN_MOUNT).map_err(|e| err(sim, format!("{OWN_MOUNT}: {e}")))?;
    rustix::mount::mount(
        "gpuloop-freezer",
        OWN_MOUNT,
        "cgroup",
        rustix::mount::MountFlags::empty(),
        c"freezer",
    )
    .map_err(|e| {
        err(
            sim,
            format!(
                "no cgroup-v1 freezer is mounted and mounting one at {OWN_MOUNT} failed ({e}): it needs root and a kernel with the v1 freezer controller"
            ),
        )
    })?;
    Ok(OWN_MOUNT.into())
}

/// The simulator's freezer cgroup: one per state directory.
fn cgroup_for(sim: &SimBackend, mount: &Path) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sim.dir.hash(&mut h);
    mount.join(format!("gpuloop-sim-{:016x}", h.finish()))
}

fn write(path: &Path, what: &str) -> std::io::Result<()> {
    std::fs::write(path, what)
}

/// Waits (bounded) until the freezer state reads `want`.
fn settle(cg: &Path, want: &str) -> bool {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if std::fs::read_to_string(cg.join("freezer.state")).is_ok_and(|s| s.trim() == want) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Freezes `pids` (holders that already hold): from now on they are stuck.
pub fn freeze(sim: &SimBackend, pids: &[i32]) -> Result<(), GpuError> {
    let mount = ensure_mount(sim)?;
    let cg = cgroup_for(sim, &mount);
    match std::fs::create_dir(&cg) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(sim, format!("{}: {e}", cg.display()))),
    }
    std::fs::write(sim.dir.join(RECORD), cg.as_os_str().as_encoded_bytes())
        .map_err(|e| err(sim, e))?;
    for p in pids {
        write(&cg.join("cgroup.procs"), &p.to_string())
            .map_err(|e| err(sim, format!("moving pid {p} into {}: {e}", cg.display())))?;
    }
    write(&cg.join("freezer.state"), "FROZEN").map_err(|e| err(sim, e))?;
    if !settle(&cg, "FROZEN") {
        return Err(err(sim, "the holders did not freeze within 10 s"));
    }
    Ok(())
}

/// Thaws every stuck holder of this simulator (a pending SIGKILL then ends it) and removes
/// the cgroup once it is empty. Returns how many processes were thawed.
pub fn release(sim: &SimBackend) -> Result<usize, GpuError> {
    let Ok(raw) = std::fs::read(sim.dir.join(RECORD)) else {
        return Ok(0);
    };
    let cg = PathBuf::from(String::from_utf8_lossy(&raw).trim().to_string());
    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
    let count = procs.lines().count();
    if cg.exists() {
        write(&cg.join("freezer.state"), "THAWED").map_err(|e| err(sim, e))?;
        settle(&cg, "THAWED");
        // Processes killed while frozen exit now; the cgroup can go once they have.
        let end = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&cg).is_err() && Instant::now() < end {
            let left = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
            if !left.trim().is_empty() && !left.lines().any(|p| dying(p.trim())) {
                // Still alive and not killed: they stay, thawed, in an empty-named cgroup
                // that a later release removes.
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    if !cg.exists() {
        let _ = std::fs::remove_file(sim.dir.join(RECORD));
    }
    Ok(count)
}

/// True if the process has a fatal signal pending or is exiting.
fn dying(pid: &str) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let pending = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|m| m & (1 << (nix::sys::signal::Signal::SIGKILL as i32 - 1)) != 0)
    };
    pending("ShdPnd:") || pending("SigPnd:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_freezer_hierarchy_in_mountinfo() {
        let info = "30 24 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n\
36 24 0:32 / /sys/fs/cgroup/freezer rw,relatime shared:15 - cgroup cgroup rw,freezer\n";
        assert_eq!(
            freezer_mount(info),
            Some(PathBuf::from("/sys/fs/cgroup/freezer"))
        );
        let v2 = "29 24 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(freezer_mount(v2), None);
    }
}
