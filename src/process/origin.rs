//! Where a process comes from: its lineage (parent, launcher, reparenting), and, from one
//! cgroup reader plus its environment, the systemd unit, Slurm job and container it runs in.

use super::container::{self, Ids, Place, Resolver};
use super::identity::ProcDir;
use super::{read_stat, ProcInfo};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The nearest live ancestor that started a holder: neither a shell, init, nor a subreaper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Launcher {
    pub pid: i64,
    /// With the pid, the identity: `kill(h.launcher)` checks it like a holder map.
    pub start: i64,
    pub name: String,
    /// The host it runs on, as its holder's (`kill(h.launcher)` goes there).
    #[serde(default = "crate::local::local")]
    pub host: String,
    /// The container and pod it runs in.
    #[serde(flatten)]
    pub place: Place,
    /// Its own parent is gone (it was reparented to init or a subreaper): a vLLM engine
    /// core whose API server was killed, a torchrun agent whose shell was closed.
    #[serde(default)]
    pub reparented: bool,
}

/// Lineage and attribution of one process, as holder maps carry them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Origin {
    /// The parent's name (comm).
    pub ppid_comm: String,
    /// The parent's name as a person is shown it (`process::display_name`): whole where the
    /// comm was cut, a known restarter by what it is.
    pub ppid_name: String,
    /// The parent is init or a subreaper, or started after the process: its own parent is gone.
    pub reparented: bool,
    pub launcher: Option<Launcher>,
    /// The systemd unit whose cgroup the process is in.
    pub service: Option<String>,
    /// The Slurm job id, from the job's cgroup or the process's environment.
    pub job: Option<i64>,
    /// The container (its id, name and runtime) and the Kubernetes pod it runs in.
    #[serde(flatten)]
    pub place: Place,
    pub cgroup: Option<String>,
    /// True if the process is its unit's main process (killing it makes systemd act).
    #[serde(skip)]
    pub service_main: bool,
    /// The unit's `Restart=` setting, when systemd says it (system units).
    #[serde(skip)]
    pub service_restart: Option<String>,
}

/// Shells and session plumbing: they run a job but are not the job's launcher.
const SHELLS: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "fish",
    "ksh",
    "mksh",
    "tcsh",
    "csh",
    "busybox",
    "sudo",
    "su",
    "sshd",
    "sshd-session",
    "login",
    "screen",
    "timeout",
    "xargs",
];

/// Processes that adopt orphans: init systems, container inits and shims.
const SUBREAPERS: &[&str] = &[
    "systemd",
    "init",
    "tini",
    "tini-static",
    "dumb-init",
    "docker-init",
    "catatonit",
    "conmon",
    "s6-svscan",
    "s6-supervise",
    "runsv",
];

fn is_shell(comm: &str) -> bool {
    SHELLS.contains(&comm) || comm.starts_with("tmux")
}

/// True for init (pid 1 as gpuloop sees it) and the known subreapers.
pub(crate) fn is_reaper(p: &ProcInfo) -> bool {
    p.pid == 1 || SUBREAPERS.contains(&p.comm.as_str()) || p.comm.starts_with("containerd-shim")
}

/// The last pid of a /proc/PID/status NSpid line: 1 for the init of a PID namespace.
fn ns_pid(status: &[u8]) -> Option<i32> {
    let status = std::str::from_utf8(status).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Reads the origin of `p` from /proc (its ancestors, cgroup and environment); its container
/// and pod through `places`, the scan's resolver.
pub(crate) fn origin(p: &ProcInfo, places: &Resolver) -> Origin {
    Lineage::read(p, None).origin(places)
}

/// What /proc tells of a process's origin: all that `origin` reads but systemd's word on a
/// unit and the runtimes' state on disk (which `Lineage::origin` adds, each read once per
/// unit or container). Read apart so that the scan reads it, on its threads, for each
/// process it finds holding a GPU node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Lineage {
    pid: i32,
    ppid_comm: String,
    ppid_name: String,
    /// The parent is systemd (a user unit's main process is the manager's direct child).
    parent_is_systemd: bool,
    reparented: bool,
    cgroup: Cgroup,
    launcher: Option<Ancestor>,
    job: Option<i64>,
}

/// A holder's launcher as /proc tells it (its place is looked up from `ids`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ancestor {
    info: ProcInfo,
    reparented: bool,
    /// What its cgroup says, read only for a holder in a container.
    ids: Ids,
}

impl Lineage {
    /// Reads `p`'s parent and ancestors, cgroup and environment; its own files through `dir`,
    /// its /proc directory, where the caller holds it open (else by pid).
    pub(crate) fn read(p: &ProcInfo, dir: Option<&ProcDir>) -> Lineage {
        let own = |name: &str| match dir {
            Some(d) => d.read(name).ok(),
            None => std::fs::read(format!("/proc/{}/{name}", p.pid)).ok(),
        };
        let parent = (p.ppid > 0).then(|| read_stat(p.ppid).ok()).flatten();
        let reparented = match &parent {
            // A container's init is started by its shim, which adopts it: not an orphan. Its
            // pid in its own namespace is read only where it would decide.
            Some(q) => {
                (is_reaper(q) || q.start > p.start)
                    && !(p.pid > 1 && own("status").and_then(|s| ns_pid(&s)) == Some(1))
            }
            None => false,
        };
        let cgroup = own("cgroup")
            .and_then(|t| String::from_utf8(t).ok())
            .map(|t| parse_cgroup(&t))
            .unwrap_or_default();
        // A launcher outside the holder's container would be an ancestor outside it, which
        // the container's shim (a reaper) stops the walk at: only a contained holder's place
        // is looked at.
        let contained = !cgroup.ids.is_empty();
        let launcher = parent.as_ref().and_then(|q| launcher(q, contained));
        let job = cgroup.job.or_else(|| {
            let environ = own("environ")?;
            job_id(&env_value(&environ, "SLURM_JOB_ID")?)
        });
        Lineage {
            pid: p.pid,
            ppid_comm: parent.as_ref().map(|q| q.comm.clone()).unwrap_or_default(),
            ppid_name: parent.as_ref().map(name_of).unwrap_or_default(),
            parent_is_systemd: parent.as_ref().is_some_and(|q| q.comm == "systemd"),
            reparented,
            cgroup,
            launcher,
            job,
        }
    }

    /// What its cgroup, and its launcher's where that was read, say of their containers:
    /// what `origin` looks up in `places`.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &Ids> {
        std::iter::once(&self.cgroup.ids).chain(self.launcher.as_ref().map(|a| &a.ids))
    }

    /// The origin: the lineage, with the unit's main process and restart policy as systemd
    /// says them, and the places of the holder and its launcher through `places`.
    pub(crate) fn origin(&self, places: &Resolver) -> Origin {
        let cg = &self.cgroup;
        let service = cg.service.clone();
        let unit = match (&service, cg.user_unit) {
            (Some(u), false) => unit_info(u),
            _ => UnitInfo::default(),
        };
        // A user unit's manager cannot be asked as another user: its main process is taken to
        // be the manager's direct child.
        let service_main = match (&service, cg.user_unit) {
            (None, _) => false,
            (Some(_), true) => self.parent_is_systemd,
            (Some(_), false) => unit.main_pid == Some(self.pid),
        };
        let place = places.place(&cg.ids);
        let launcher = self.launcher.as_ref().map(|a| Launcher {
            pid: a.info.pid.into(),
            start: a.info.start as i64,
            name: a.info.comm.clone(),
            host: crate::local::local(),
            place: places.place(&a.ids),
            reparented: a.reparented,
        });
        Origin {
            ppid_comm: self.ppid_comm.clone(),
            ppid_name: self.ppid_name.clone(),
            reparented: self.reparented,
            launcher,
            service,
            job: self.job,
            place,
            cgroup: cg.path.clone(),
            service_main,
            service_restart: unit.restart,
        }
    }
}

/// A parent's name as a person is shown it (`display_name`). A known subreaper's (conmon,
/// tini, systemd) is its comm where the kernel did not cut it: a reaper is no job's launcher,
/// and its command line (conmon's is kilobytes) is not read.
fn name_of(q: &ProcInfo) -> String {
    if SUBREAPERS.contains(&q.comm.as_str()) && q.comm.len() < 15 {
        return q.comm.clone();
    }
    super::display_name(&q.comm, &super::cmdline(q.pid))
}

/// The nearest live ancestor that is not a shell, init or subreaper, from the holder's
/// `parent` up; its cgroup is read where its place is to be found (`contained`).
fn launcher(parent: &ProcInfo, contained: bool) -> Option<Ancestor> {
    let mut next = Some(parent.clone());
    for _ in 0..64 {
        let a = next.take()?;
        if is_reaper(&a) || a.pid <= 1 {
            return None;
        }
        if !is_shell(&a.comm) {
            let ids = if contained {
                read_cgroup(a.pid).ids
            } else {
                Ids::default()
            };
            let reparented = read_stat(a.ppid).is_ok_and(|q| is_reaper(&q) || q.start > a.start);
            return Some(Ancestor {
                info: a,
                reparented,
                ids,
            });
        }
        next = read_stat(a.ppid).ok();
    }
    None
}

/// What systemd says of a system unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UnitInfo {
    pub main_pid: Option<i32>,
    /// `Restart=`: "no", "always", "on-failure", …
    pub restart: Option<String>,
}

/// True when systemd is the init, as `sd_booted()` tells it: its runtime directory exists.
/// In a container, or on a node with another init, a cgroup named `….service` and a
/// `systemctl` on PATH say nothing of what restarts a process.
fn systemd_runs() -> bool {
    std::path::Path::new("/run/systemd/system").is_dir()
}

/// `systemctl show` of a unit, asked once a second at most; empty without systemd.
pub(crate) fn unit_info(unit: &str) -> UnitInfo {
    if !systemd_runs() {
        return UnitInfo::default();
    }
    type Asked = HashMap<String, (Instant, UnitInfo)>;
    static CACHE: OnceLock<Mutex<Asked>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some((at, info)) = cache.lock().ok().and_then(|c| c.get(unit).cloned()) {
        if at.elapsed() < Duration::from_secs(1) {
            return info;
        }
    }
    let info = crate::process::command_output(
        "systemctl",
        // A unit's name is read from a cgroup path: `--` keeps it from being read as an option.
        &[
            "show",
            "--property=MainPID",
            "--property=Restart",
            "--",
            unit,
        ],
        Duration::from_secs(2),
    )
    .map(|out| parse_unit_show(&out))
    .unwrap_or_default();
    if let Ok(mut c) = cache.lock() {
        c.insert(unit.to_string(), (Instant::now(), info.clone()));
    }
    info
}

/// Parses `MainPID=123\nRestart=always` as `systemctl show` prints it.
fn parse_unit_show(out: &str) -> UnitInfo {
    let mut info = UnitInfo::default();
    for line in out.lines() {
        match line.split_once('=') {
            Some(("MainPID", v)) => info.main_pid = v.trim().parse().ok().filter(|&p| p > 0),
            Some(("Restart", v)) if !v.trim().is_empty() => info.restart = Some(v.trim().into()),
            _ => {}
        }
    }
    info
}

/// One variable of a /proc/PID/environ (readable for one's own processes, or as root).
fn env_value(raw: &[u8], name: &str) -> Option<String> {
    raw.split(|&b| b == 0).find_map(|kv| {
        let kv = kv.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(kv).into_owned())
    })
}

/// What a process's cgroup membership says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Cgroup {
    /// The unified (v2) path, else the systemd (v1 name=systemd) one, else the first set path.
    pub path: Option<String>,
    pub service: Option<String>,
    /// The service runs under a user manager (user@UID.service).
    pub user_unit: bool,
    pub job: Option<i64>,
    /// The container and pod the path names.
    pub ids: Ids,
}

/// Reads /proc/PID/cgroup; the one cgroup reader for units, jobs and containers.
pub(crate) fn read_cgroup(pid: i32) -> Cgroup {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| parse_cgroup(&t))
        .unwrap_or_default()
}

/// Parses /proc/PID/cgroup text, v1 (`4:memory:/slurm/uid_0/job_812/step_0`) and v2
/// (`0::/system.slice/slurmstepd.scope/job_812/step_0/user/task_0`) alike.
pub(crate) fn parse_cgroup(text: &str) -> Cgroup {
    let mut unified = None;
    let mut systemd = None;
    let mut any = None;
    let mut job = None;
    let mut ids = Ids::default();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if path.is_empty() || path == "/" {
            continue;
        }
        match ctrl {
            "" => unified = Some(path),
            "name=systemd" => systemd = Some(path),
            _ => any = any.or(Some(path)),
        }
        for comp in path.split('/') {
            if let Some(n) = comp.strip_prefix("job_").and_then(job_id) {
                job = job.or(Some(n));
            }
        }
        if ids.is_empty() {
            ids = container::ids_of(path);
        }
    }
    let unit_path = unified.or(systemd);
    let (service, user_unit) = unit_path.map(service_of).unwrap_or((None, false));
    Cgroup {
        path: unified.or(systemd).or(any).map(str::to_string),
        service,
        user_unit,
        job,
        ids,
    }
}

/// The deepest `.service` component of a path, unless a scope follows it (a session or a
/// container is a scope: it restarts nothing); and whether it sits under a user manager.
fn service_of(path: &str) -> (Option<String>, bool) {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let Some(at) = comps.iter().rposition(|c| c.ends_with(".service")) else {
        return (None, false);
    };
    if comps[at + 1..].iter().any(|c| c.ends_with(".scope")) {
        return (None, false);
    }
    let unit = comps[at];
    let under_user = comps[..at].iter().any(|c| c.starts_with("user@"));
    if unit.starts_with("user@") {
        // The user manager itself (or its init.scope): not a unit of its own to stop here.
        return (None, false);
    }
    (Some(unit.to_string()), under_user)
}

/// A Slurm job id: a positive decimal number, as Slurm prints it (`812`; not `+812`, `0`,
/// `-1`, nor `0x32c`).
pub(crate) fn job_id(s: &str) -> Option<i64> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&n: &i64| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_jobs_in_v1_and_v2() {
        let v1 = "12:memory:/slurm/uid_1000/job_812/step_0/task_0\n1:name=systemd:/system.slice/slurmd.service\n";
        let c = parse_cgroup(v1);
        assert_eq!(c.job, Some(812));
        assert_eq!(c.path.as_deref(), Some("/system.slice/slurmd.service"));
        assert_eq!(c.service.as_deref(), Some("slurmd.service"));
        let v2 = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n";
        let c = parse_cgroup(v2);
        assert_eq!((c.job, c.service), (Some(77), None));
    }

    #[test]
    fn services_user_units_and_scopes() {
        let c = parse_cgroup("0::/system.slice/vllm.service\n");
        assert_eq!(
            (c.service.as_deref(), c.user_unit),
            (Some("vllm.service"), false)
        );
        let c = parse_cgroup(
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/train.service\n",
        );
        assert_eq!(
            (c.service.as_deref(), c.user_unit),
            (Some("train.service"), true)
        );
        let c = parse_cgroup("0::/user.slice/user-1000.slice/user@1000.service/init.scope\n");
        assert_eq!(c.service, None);
        let c = parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n");
        assert_eq!(c.service, None);
        assert_eq!(parse_cgroup("0::/\n"), Cgroup::default());
    }

    #[test]
    fn containers_and_pods_from_any_line() {
        let id = "4f3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
        let c = parse_cgroup(&format!("0::/system.slice/docker-{id}.scope\n"));
        assert_eq!((c.ids.id.as_deref(), c.service), (Some(id), None));
        // cgroup v1: the first line that names a container.
        let c = parse_cgroup(&format!("5:devices:/\n4:pids:/docker/{id}\n"));
        assert_eq!(c.ids.id.as_deref(), Some(id));
        let c = parse_cgroup(&format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/cri-containerd-{id}.scope\n"
        ));
        assert_eq!(
            (c.ids.id.as_deref(), c.ids.pod_uid.as_deref()),
            (Some(id), Some("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"))
        );
    }

    #[test]
    fn unit_properties_from_systemctl_show() {
        assert_eq!(
            parse_unit_show("MainPID=4711\nRestart=always\n"),
            UnitInfo {
                main_pid: Some(4711),
                restart: Some("always".into())
            }
        );
        // A stopped unit: MainPID=0 is no process.
        assert_eq!(parse_unit_show("MainPID=0\nRestart=no\n").main_pid, None);
    }

    #[test]
    fn own_origin_is_read() {
        let me = read_stat(std::process::id() as i32).unwrap();
        let roots = container::Roots::default();
        let o = origin(&me, &Resolver::new(&roots));
        assert!(!o.ppid_comm.is_empty());
        // The test's own environment is readable: a job id set there is found.
        assert_eq!(
            o.job,
            std::env::var("SLURM_JOB_ID")
                .ok()
                .and_then(|j| j.parse().ok())
        );
    }
}
