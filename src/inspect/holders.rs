//! holders(): the driver's process lists joined with one scan of /proc (fds, then mappings).

use super::diagnose::Usage;
pub(crate) use super::kinds::RunState;
pub use super::kinds::{Evidence, Role, State};
use super::Selection;
use crate::gpu::mig::{Cap, MigKey, MigMinors};
use crate::gpu::{Backend, DeviceNodes, Gpu, GpuError};
use crate::process::container::{Resolver, Roots};
use crate::process::identity::{self, ProcDir};
use crate::process::origin::{self, Origin};
use crate::process::scan::{self, NodeSet, NodeUser};
use crate::process::{self as proc, ProcInfo};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One process holding (or watching) GPUs, as scripts see it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Holder {
    pub pid: i64,
    pub ppid: i64,
    pub pgid: i64,
    pub sid: i64,
    pub start: i64,
    /// The inode of its pidfd where the kernel has pidfs (unique for the boot): with it,
    /// kill() tells apart two processes that had the same pid within one clock tick.
    pub pidfs_ino: Option<i64>,
    pub uid: i64,
    pub user: String,
    pub name: String,
    pub cmdline: String,
    pub state: State,
    pub role: Role,
    pub gpus: Vec<i64>,
    /// The MIG instances it holds, each `{gpu, gi, ci}` (written `N:GI:CI`): those the
    /// driver lists it on, and those whose capability node (`/dev/nvidia-caps/nvidia-capM`)
    /// it has open, as DCGM, an exporter or a leftover child has without being listed.
    /// Empty off MIG, and for a process of a MIG GPU that shows no instance.
    #[serde(default)]
    pub mig: Vec<MigKey>,
    /// Bytes the driver attributes to it on the selected GPUs.
    pub mem: i64,
    /// The same in MiB.
    pub mem_mib: i64,
    /// Memory it keeps alive that the driver counts against pids not alive here: a forked
    /// child holding its dead creator's handles (its own `mem` is then 0).
    #[serde(default)]
    pub inherited: Option<Inherited>,
    pub evidence: Vec<Evidence>,
    /// A protected GPU daemon: a protected name, proven by who runs it and what it runs
    /// (`process::daemon`); a name alone is not.
    pub protected: bool,
    pub host: String,
    /// Lineage (ppid_comm, reparented, launcher, service) and attribution (job, container,
    /// container_name, runtime, pod, cgroup).
    #[serde(flatten)]
    pub origin: Origin,
    /// GPUs whose device node it maps: a CUDA context maps every GPU it can see, and keeps
    /// a few MiB on each, even those the driver does not list it on.
    #[serde(skip)]
    pub maps: Vec<i64>,
    /// GPUs whose device node it has open (mapped or not): while it does, that GPU's reset
    /// fails.
    #[serde(skip)]
    pub opens: Vec<i64>,
    /// It has a MIG capability node (`/dev/nvidia-caps/…`) open: a reset and a MIG change
    /// fail while it does.
    #[serde(skip)]
    pub caps: bool,
    /// It has a node-wide MIG capability open (`config`, `monitor`, or one the driver's
    /// `mig-minors` does not name): a change to any instance waits for it.
    #[serde(skip)]
    pub caps_all: bool,
    /// `inherited` per GPU, so that a selection counts only its own GPUs.
    #[serde(skip)]
    pub inherited_on: BTreeMap<i64, Inherited>,
}

/// Memory the driver counts against pids that are not alive here (a dead creator), kept
/// alive by a holder that does not appear in the driver's list: the creator's forked child,
/// which holds its CUDA handles. Several children of one creator each keep all of it: it is
/// freed when the last of them exits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Inherited {
    /// The pids the driver counts it against.
    pub from: Vec<i64>,
    /// Bytes.
    pub mem: i64,
    /// The same in MiB.
    pub mem_mib: i64,
}

impl Inherited {
    /// The memory of several GPUs as one (the pids each named once).
    fn sum<'a>(parts: impl IntoIterator<Item = &'a Inherited>) -> Option<Inherited> {
        let mut all: Option<Inherited> = None;
        for p in parts {
            let a = all.get_or_insert(Inherited {
                from: Vec::new(),
                mem: 0,
                mem_mib: 0,
            });
            a.mem += p.mem;
            for pid in &p.from {
                if !a.from.contains(pid) {
                    a.from.push(*pid);
                }
            }
        }
        all.map(|mut a| {
            a.from.sort_unstable();
            a.mem_mib = a.mem / crate::gpu::MIB;
            a
        })
    }
}

impl Holder {
    pub(crate) fn is_compute(&self) -> bool {
        self.role.is_compute()
    }
}

/// The most a CUDA context keeps on a GPU it maps but does not use: 3-4 MiB measured on
/// H200s with driver 580; the bound leaves room for other GPUs, and stays far below any job
/// (an MPS server's 2000 MiB is never "a footprint").
pub(crate) const FOOTPRINT_MAX_MIB: i64 = 16;

/// Everything one look at the machine found; diagnose() and wait_clean() reuse it.
#[derive(Debug, Clone)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    /// Every holder, all roles: every process with a driver node open (while one is, a GPU
    /// reset fails).
    pub holders: Vec<Holder>,
    /// Per GPU index: pids the driver lists that are dead or not visible here, or whose
    /// process here does not use that GPU (`stale`).
    pub ghosts: BTreeMap<i64, Vec<i64>>,
    /// Per GPU index: the ghosts whose pid is another live process now, one that does not map
    /// the GPU: the driver's stale record of a process that exited (its pid reused since).
    pub stale: BTreeMap<i64, Vec<i64>>,
    /// Processes whose fds could not be read.
    pub unreadable: usize,
}

impl Inventory {
    /// Looks at the driver and /proc once; containers' state is looked for under `roots`.
    pub fn take(
        backend: &dyn Backend,
        protected: &[String],
        roots: &Roots,
    ) -> Result<Inventory, GpuError> {
        Inventory::take_while_loading(backend.nodes(), || Ok(backend), protected, roots)
    }

    /// Looks at the driver and /proc once, the /proc scan on its own thread while the
    /// driver loads (`backend` may initialise NVML: ~13 ms on H200s) and answers.
    pub(crate) fn take_while_loading<'b>(
        nodes: &DeviceNodes,
        backend: impl FnOnce() -> Result<&'b dyn Backend, GpuError>,
        protected: &[String],
        roots: &Roots,
    ) -> Result<Inventory, GpuError> {
        let started = std::time::Instant::now();
        let places = Resolver::remembering(roots);
        // The scan's threads look up the containers of the users they find.
        let found = |u: &NodeUser| {
            for ids in u.lineage.ids() {
                places.place(ids);
            }
        };
        let (gpus, scan, (driver_ms, driver_cpu), b) = std::thread::scope(|sc| {
            let scanner = sc.spawn(|| {
                let t = std::time::Instant::now();
                (scan::scan(nodes, &found), t.elapsed().as_secs_f64() * 1e3)
            });
            let cpu = crate::process::thread_cpu();
            let driver = backend().and_then(|b| Ok((b, b.inventory_gpus()?)));
            let driver_ms = started.elapsed().as_secs_f64() * 1e3;
            let driver_cpu = crate::process::thread_cpu().saturating_sub(cpu);
            // This thread would only wait for the scan now: the containers' memory is read
            // here rather than on a scan thread, when it finds the first one.
            places.prepare();
            // A scan thread that panicked is done again here, never skipped.
            let scan = scanner.join().unwrap_or_else(|_| {
                let t = std::time::Instant::now();
                (scan::scan(nodes, &found), t.elapsed().as_secs_f64() * 1e3)
            });
            driver.map(|(b, gpus)| (gpus, scan, (driver_ms, driver_cpu), b))
        })?;
        let kind = b.kind();
        let (scan, scan_ms) = scan;
        tracing::debug!(
            "inventory: {} from {kind} in {driver_ms:.1} ms ({:.1} ms of CPU), beside a scan of {} processes in {scan_ms:.1} ms ({:.1} ms of CPU): {} with GPU nodes open (their lineage read in {:.1} ms), {} unreadable; {:.1} ms in all, done at {:.1} ms",
            crate::words::count(gpus.len(), "GPU", "GPUs"),
            driver_cpu.as_secs_f64() * 1e3,
            scan.scanned,
            scan.cpu.as_secs_f64() * 1e3,
            scan.users.len(),
            scan.lineage.as_secs_f64() * 1e3,
            scan.unreadable.len(),
            started.elapsed().as_secs_f64() * 1e3,
            crate::timeline::ms()
        );
        let minors = mig_minors_for(&scan.users, b);
        let inventory = join(gpus, scan, protected, &places, &minors);
        places.keep();
        Ok(inventory)
    }

    /// Looks again after the signals, at only what is in question: the driver's lists and
    /// memory, and the processes this inventory knows (each read again, so one that exited
    /// or let go is gone, and a pid reused since is judged as the process it is now). `None`
    /// when the driver lists a pid this inventory does not know: something new is there, and
    /// only a look at every process finds what it is (and who started it).
    pub(crate) fn refreshed(
        &self,
        backend: &dyn Backend,
        protected: &[String],
        roots: &Roots,
    ) -> Result<Option<Inventory>, GpuError> {
        let gpus = backend.inventory_gpus()?;
        let known: BTreeSet<i64> = self
            .holders
            .iter()
            .map(|h| h.pid)
            .chain(self.ghosts.values().flatten().copied())
            .collect();
        let new = gpus
            .iter()
            .flat_map(|g| &g.driver_procs)
            .find(|d| !known.contains(&i64::from(d.pid)));
        if let Some(d) = new {
            tracing::debug!(
                "inventory: the driver lists pid {}, not seen before: a whole look",
                d.pid
            );
            return Ok(None);
        }
        let pids: Vec<i32> = self
            .holders
            .iter()
            .filter_map(|h| i32::try_from(h.pid).ok())
            .collect();
        let scan = scan::rescan(&pids, backend.nodes());
        let places = Resolver::remembering(roots);
        let minors = mig_minors_for(&scan.users, backend);
        let inventory = join(gpus, scan, protected, &places, &minors);
        places.keep();
        Ok(Some(inventory))
    }

    /// The holders on the selection (every role with `all`, else only compute holders).
    pub fn holders(&self, sel: &Selection, all: bool) -> Vec<Holder> {
        self.holders
            .iter()
            .filter(|h| all || h.is_compute())
            .filter(|h| match sel {
                None => true,
                Some(s) => h.gpus.iter().any(|g| s.contains(g)),
            })
            .map(|h| self.with_mem_on(h, sel))
            .collect()
    }

    /// Everything on GPU `g` that diagnose() and wait_clean() judge it by.
    pub(crate) fn on_gpu(&self, g: &Gpu) -> OnGpu<'_> {
        let one = Some(vec![g.index]);
        OnGpu {
            used_mib: g.mem_used_mib,
            memory_known: g.error.is_none(),
            holders: self.holders(&one, false),
            daemons: self
                .holders(&one, true)
                .into_iter()
                .filter(|h| h.role.is_daemon())
                .collect(),
            footprint: self.footprint_on(g.index, &None),
            ghosts: self.ghosts.get(&g.index).cloned().unwrap_or_default(),
            stale: self.stale.get(&g.index).cloned().unwrap_or_default(),
        }
    }

    /// Everything on MIG device `d` (an instance of `g`) that diagnose() and wait_clean()
    /// judge it by: its own memory, the holders the driver lists on it or that hold its
    /// capability nodes, and the pids the driver lists on it that hold nothing visible. With
    /// `whole` (the GPU was selected, not the instance), the compute holders of `g` that show
    /// no instance at all are counted too: one of them may hold it.
    pub(crate) fn on_instance(
        &self,
        g: &Gpu,
        d: &crate::gpu::mig::MigDevice,
        whole: bool,
    ) -> OnGpu<'_> {
        let key = d.key();
        let on = |h: &&Holder| {
            h.mig.contains(&key) || (whole && h.mig.is_empty() && h.gpus.contains(&g.index))
        };
        let one = Some(vec![g.index]);
        let listed: BTreeSet<i64> = g
            .driver_procs
            .iter()
            .filter(|p| {
                p.mig
                    .is_some_and(|(gi, ci)| i64::from(gi) == key.gi && i64::from(ci) == key.ci)
            })
            .map(|p| i64::from(p.pid))
            .collect();
        let of_gpu = |m: &BTreeMap<i64, Vec<i64>>| -> Vec<i64> {
            m.get(&g.index)
                .into_iter()
                .flatten()
                .copied()
                .filter(|p| listed.contains(p))
                .collect()
        };
        let holders: Vec<Holder> = self
            .holders(&one, false)
            .iter()
            .filter(on)
            .map(|h| self.with_mem_on_instances(h, &[key]))
            .collect();
        OnGpu {
            used_mib: d.mem_used_mib,
            memory_known: g.error.is_none(),
            holders,
            daemons: self
                .holders(&one, true)
                .iter()
                .filter(|h| h.role.is_daemon())
                .filter(on)
                .map(|h| self.with_mem_on_instances(h, &[key]))
                .collect(),
            footprint: Vec::new(),
            ghosts: of_gpu(&self.ghosts),
            stale: of_gpu(&self.stale),
        }
    }

    /// A copy of `h` whose `mem` counts only what the driver lists for it on `keys`.
    pub(crate) fn with_mem_on_instances(&self, h: &Holder, keys: &[MigKey]) -> Holder {
        let mut h = h.clone();
        h.mem = self
            .gpus
            .iter()
            .flat_map(|g| g.driver_procs.iter().map(move |p| (g.index, p)))
            .filter(|(_, p)| i64::from(p.pid) == h.pid)
            .filter(|(gpu, p)| {
                p.mig.is_some_and(|(gi, ci)| {
                    keys.contains(&MigKey {
                        gpu: *gpu,
                        gi: i64::from(gi),
                        ci: i64::from(ci),
                    })
                })
            })
            .map(|(_, p)| p.mem)
            .sum();
        h.mem_mib = h.mem / crate::gpu::MIB;
        h
    }

    /// Every MIG device of the inventory's GPUs.
    pub(crate) fn mig_devices(&self) -> impl Iterator<Item = &crate::gpu::mig::MigDevice> {
        self.gpus
            .iter()
            .filter_map(|g| g.mig.as_ref())
            .filter(|m| m.enabled())
            .flat_map(|m| &m.instances)
    }

    /// Compute holders that map GPU `g` without using it (a CUDA context's footprint there)
    /// and whose compute GPUs all lie outside `sel` (`None`: outside `g`).
    pub(crate) fn footprint_on(&self, g: i64, sel: &Selection) -> Vec<&Holder> {
        self.holders
            .iter()
            .filter(|h| h.is_compute() && h.maps.contains(&g) && !h.gpus.contains(&g))
            .filter(|h| match sel {
                Some(s) => !h.gpus.iter().any(|x| s.contains(x)),
                None => true,
            })
            .collect()
    }

    /// True when what is used on `gpu` beyond `max_used_mib` can only be the footprint of
    /// `footprint` processes: the driver lists nobody there and it is a few MiB each.
    pub(crate) fn footprint_explains(gpu: &Gpu, footprint: usize, max_used_mib: i64) -> bool {
        footprint > 0
            && gpu.driver_procs.is_empty()
            && gpu.mem_used_mib <= max_used_mib + footprint as i64 * FOOTPRINT_MAX_MIB
    }

    /// A copy of `h` whose `mem` counts only the selected GPUs.
    fn with_mem_on(&self, h: &Holder, sel: &Selection) -> Holder {
        let mut h = h.clone();
        if sel.is_some() {
            // Only GPUs that are its own: where it is listed, those are its `gpus`.
            let listed = h.evidence.contains(&Evidence::Driver);
            h.mem = self
                .gpus
                .iter()
                .filter(|g| listed && super::selected(sel, g.index) && h.gpus.contains(&g.index))
                .flat_map(|g| &g.driver_procs)
                .filter(|d| i64::from(d.pid) == h.pid)
                .map(|d| d.mem)
                .sum();
            h.mem_mib = h.mem / crate::gpu::MIB;
            h.inherited = Inherited::sum(
                h.inherited_on
                    .iter()
                    .filter(|(g, _)| super::selected(sel, **g))
                    .map(|(_, i)| i),
            );
        }
        h
    }
}

/// What is on one GPU, from one inventory.
pub(crate) struct OnGpu<'a> {
    pub used_mib: i64,
    pub memory_known: bool,
    /// Compute holders.
    pub holders: Vec<Holder>,
    /// Protected GPU daemons.
    pub daemons: Vec<Holder>,
    /// Compute holders of other GPUs whose context maps this one.
    pub footprint: Vec<&'a Holder>,
    pub ghosts: Vec<i64>,
    pub stale: Vec<i64>,
}

impl OnGpu<'_> {
    /// The facts that decide whether the GPU is clean, as a diagnosis of it gives them.
    pub(crate) fn usage(&self) -> Usage {
        Usage::new(
            self.used_mib,
            self.memory_known,
            &self.holders,
            &self.daemons,
            self.footprint.len(),
            self.ghosts.len(),
        )
    }
}

/// The driver's `mig-minors`, read only when a process found holds a capability node (most
/// looks find none).
fn mig_minors_for(users: &[NodeUser], backend: &dyn Backend) -> MigMinors {
    let caps = users
        .iter()
        .any(|u| !u.open.cap_minors.is_empty() || !u.mapped.cap_minors.is_empty());
    if caps {
        backend.mig_minors()
    } else {
        MigMinors::default()
    }
}

/// The MIG instances a process's capability nodes grant, by the driver's `mig-minors`
/// (`gpuN` there is the device minor), and whether one of them is node-wide. A GPU
/// instance's node grants each of its compute instances; a node the file does not name
/// counts as node-wide, never as no capability at all.
fn cap_instances(
    minors_held: &[u32],
    minors: &MigMinors,
    gpus: &[Gpu],
    index_of_minor: &dyn Fn(u32) -> i64,
) -> (BTreeSet<MigKey>, bool) {
    let mut keys = BTreeSet::new();
    let mut all = false;
    for &m in minors_held {
        match minors.cap(m) {
            Some(Cap::Ci { minor, gi, ci }) => {
                keys.insert(MigKey {
                    gpu: index_of_minor(minor),
                    gi: i64::from(gi),
                    ci: i64::from(ci),
                });
            }
            Some(Cap::Gi { minor, gi }) => {
                let gpu = index_of_minor(minor);
                keys.extend(
                    gpus.iter()
                        .filter(|g| g.index == gpu)
                        .filter_map(|g| g.mig.as_ref())
                        .flat_map(|m| &m.instances)
                        .filter(|d| d.gi == i64::from(gi))
                        .map(|d| d.key()),
                );
            }
            Some(Cap::Config | Cap::Monitor) | None => all = true,
        }
    }
    (keys, all)
}

/// Joins the driver lists with the scan (which read the users' lineage). Pure apart from
/// reading, for those in containers, the runtimes' state through `places` (once per
/// container), and systemd's word on their units.
fn join(
    gpus: Vec<Gpu>,
    scan: scan::Scan,
    protected: &[String],
    places: &Resolver,
    minors: &MigMinors,
) -> Inventory {
    let index_of_minor = |minor: u32| -> i64 {
        gpus.iter()
            .find(|g| g.minor == i64::from(minor))
            .map_or(i64::from(minor), |g| g.index)
    };
    // pid -> GPU index -> bytes, as the driver reports them; and the MIG instances it
    // lists each pid on
    let mut driver: BTreeMap<i32, BTreeMap<i64, i64>> = BTreeMap::new();
    let mut driver_mig: BTreeMap<i32, BTreeSet<MigKey>> = BTreeMap::new();
    for g in &gpus {
        for d in &g.driver_procs {
            *driver.entry(d.pid).or_default().entry(g.index).or_default() += d.mem;
            if let Some((gi, ci)) = d.mig {
                driver_mig.entry(d.pid).or_default().insert(MigKey {
                    gpu: g.index,
                    gi: i64::from(gi),
                    ci: i64::from(ci),
                });
            }
        }
    }
    let mut users: BTreeMap<i32, NodeUser> = scan.users.into_iter().map(|u| (u.pid, u)).collect();
    // The protected daemons among them: a protected name, and proof (`daemon`), read once.
    let daemons: BTreeSet<i32> = users
        .values()
        .filter(|u| {
            proc::daemon::is_protected_pid(u.pid, u.info.start, &u.info.comm, &u.cmdline, protected)
        })
        .map(|u| u.pid)
        .collect();
    let unreadable: BTreeSet<i32> = scan.unreadable.iter().copied().collect();
    let me = std::process::id() as i32;
    let mut ghosts: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    let mut stale: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    let mut ghost_gpus: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
    let mut found = Vec::new();
    // Live processes the driver lists on no GPU that map some GPU's node: where one was left
    // by its parent, it may hold a context its exited creator made (see `maybe_reused`).
    let unlisted: Vec<(ProcInfo, BTreeSet<i64>)> = users
        .values()
        .filter(|u| !driver.contains_key(&u.pid) && !u.info.is_zombie() && u.pid != me)
        .filter(|u| !daemons.contains(&u.pid))
        .map(|u| {
            let mapped = u.mapped.minors.iter().map(|&m| index_of_minor(m));
            (u.info.clone(), mapped.collect::<BTreeSet<i64>>())
        })
        .filter(|(_, mapped)| !mapped.is_empty())
        .collect();
    let pids: BTreeSet<i32> = driver.keys().chain(users.keys()).copied().collect();
    for pid in pids {
        let listed = driver.get(&pid);
        // The facts come from the scan, read through the process's own /proc directory,
        // never re-read by pid (which may be reused by now).
        let user = match users.remove(&pid) {
            Some(u) => Some(u),
            None if unreadable.contains(&pid) => hidden_user(pid),
            None => None,
        };
        let Some(user) = user.filter(|u| !u.info.is_zombie() && pid != me) else {
            // Listed by the driver but not alive here: a dead creator or another namespace.
            if let Some(listed) = listed.filter(|_| pid != me) {
                for &i in listed.keys() {
                    ghosts.entry(i).or_default().push(pid.into());
                }
                ghost_gpus.insert(pid.into(), listed.keys().copied().collect());
            }
            continue;
        };
        // A GPU the driver lists a pid on is that process's only if the process shows it:
        // it maps the GPU's node (a CUDA context does), or hides its fds from us, and no
        // older orphan holds it (`maybe_reused`). The driver keeps listing a creator that
        // exited while a forked child holds its memory, and a pid of another namespace can
        // name an unrelated process here: the process now at such a pid (a monitor with
        // nvidiactl open, another GPU's job) is not its holder, and the pid is the driver's
        // stale record on that GPU.
        let hidden = user.open.is_empty();
        let mapped: BTreeSet<i64> = user
            .mapped
            .minors
            .iter()
            .map(|&m| index_of_minor(m))
            .collect();
        // A protected daemon is never signalled for what it holds (without force, which
        // takes it whatever it holds): one with the node open keeps what the driver lists,
        // as a display server that does not map the node may.
        let daemon_open: BTreeSet<i64> = if daemons.contains(&pid) {
            user.open
                .minors
                .iter()
                .map(|&m| index_of_minor(m))
                .collect()
        } else {
            BTreeSet::new()
        };
        let mut own = BTreeMap::new();
        for (&g, &mem) in listed.into_iter().flatten() {
            let shown = mapped.contains(&g) && !maybe_reused(&user.info, g, &unlisted);
            if hidden || shown || daemon_open.contains(&g) {
                own.insert(g, mem);
            } else {
                ghosts.entry(g).or_default().push(pid.into());
                stale.entry(g).or_default().push(pid.into());
                ghost_gpus.entry(pid.into()).or_default().insert(g);
            }
        }
        found.push((user, own));
    }
    let lineage = std::time::Instant::now();
    let mut holders: Vec<Holder> = found
        .iter()
        .map(|(user, own)| {
            let stat = &user.info;
            // A CUDA context maps the nodes of every GPU it can see, so for a process the
            // driver does not list, the GPUs of the dead creator it descends from (a forked
            // child keeps its creator's process group and session) say more than its maps.
            let inherited = [stat.pgid, stat.sid, stat.ppid]
                .iter()
                .find_map(|p| ghost_gpus.get(&i64::from(*p)));
            let daemon = daemons.contains(&user.pid);
            let mut h = make_holder(user, own, inherited, &index_of_minor, daemon, places);
            // The driver's instance ids, on the GPUs it is taken to hold; then the
            // instances its capability nodes grant.
            let mut keys: BTreeSet<MigKey> = driver_mig
                .get(&user.info.pid)
                .into_iter()
                .flatten()
                .filter(|k| own.contains_key(&k.gpu))
                .copied()
                .collect();
            let held: Vec<u32> = user
                .open
                .cap_minors
                .iter()
                .chain(&user.mapped.cap_minors)
                .copied()
                .collect();
            let (by_caps, all) = cap_instances(&held, minors, &gpus, &index_of_minor);
            keys.extend(by_caps);
            h.caps_all = all;
            if !keys.is_empty() {
                // A holder of an instance's capability alone (DCGM, an exporter) is still
                // a client of that instance's GPU.
                let mut gpus: BTreeSet<i64> = h.gpus.iter().copied().collect();
                gpus.extend(keys.iter().map(|k| k.gpu));
                h.gpus = gpus.into_iter().collect();
            }
            h.mig = keys.into_iter().collect();
            h
        })
        .collect();
    let r = places.resolved();
    tracing::debug!(
        "lineage of {} holder(s) in {:.1} ms; {} in containers, {} container(s) and pod(s) looked up in {:.1} ms ({} named by the kubelet's log links, {} state file(s) read)",
        holders.len(),
        lineage.elapsed().as_secs_f64() * 1e3,
        holders.iter().filter(|h| !h.origin.place.is_empty()).count(),
        r.places,
        r.spent.as_secs_f64() * 1e3,
        r.linked,
        r.read
    );
    attribute_inherited(&mut holders, &ghosts, &driver);
    Inventory {
        gpus,
        holders,
        ghosts,
        stale,
        unreadable: unreadable.len(),
    }
}

/// Gives each compute holder the driver lists nowhere the memory it keeps alive on its GPUs
/// that the driver counts against ghosts (pids not alive here): without it, the forked
/// child of a dead creator, the one process whose exit frees that memory, reads "0 MiB".
/// The rule is diagnose()'s "inherited" verdict: a ghost and an unlisted holder on one GPU.
fn attribute_inherited(
    holders: &mut [Holder],
    ghosts: &BTreeMap<i64, Vec<i64>>,
    driver: &BTreeMap<i32, BTreeMap<i64, i64>>,
) {
    let on_gpu: BTreeMap<i64, Inherited> = ghosts
        .iter()
        .filter_map(|(&g, pids)| {
            let mem: i64 = pids
                .iter()
                .filter_map(|&p| driver.get(&i32::try_from(p).ok()?)?.get(&g))
                .sum();
            let mut from = pids.clone();
            from.sort_unstable();
            from.dedup();
            let mem_mib = mem / crate::gpu::MIB;
            (mem > 0).then_some((g, Inherited { from, mem, mem_mib }))
        })
        .collect();
    for h in holders
        .iter_mut()
        .filter(|h| h.is_compute() && !h.evidence.contains(&Evidence::Driver))
    {
        h.inherited_on = h
            .gpus
            .iter()
            .filter_map(|g| Some((*g, on_gpu.get(g)?.clone())))
            .collect();
        h.inherited = Inherited::sum(h.inherited_on.values());
    }
}

/// Whether the memory the driver lists under `user`'s pid on GPU `g` may be the stale record
/// of an exited creator whose pid `user` now has, though `user` maps `g`: a CUDA context
/// maps the node of every GPU it can see, so another GPU's job at the reused pid maps `g` too.
/// The tell is the process that really holds it, the creator's forked child: listed by the
/// driver on no GPU, mapping `g`, left by its parent (reparented), started no later than
/// `user` (it was forked before the pid was free), and not `user`'s ancestor (a launcher that
/// touched CUDA). Where one exists, `g` is not taken for `user`'s: at worst a real holder is
/// left for the report to name, and never is a process at a reused pid signalled for it.
/// The parent and ancestors are read only for such a candidate, off the common path.
fn maybe_reused(user: &ProcInfo, g: i64, unlisted: &[(ProcInfo, BTreeSet<i64>)]) -> bool {
    unlisted.iter().any(|(o, mapped)| {
        mapped.contains(&g) && o.start <= user.start && left_by_parent(o) && !above(o.pid, user)
    })
}

/// `p` was reparented: its parent is a reaper, or younger than it, or unreadable.
fn left_by_parent(p: &ProcInfo) -> bool {
    proc::read_stat(p.ppid).map_or(true, |q| origin::is_reaper(&q) || q.start > p.start)
}

/// `pid` is an ancestor of `p` (read now, from `p`'s parent up).
fn above(pid: i32, p: &ProcInfo) -> bool {
    let mut next = p.ppid;
    for _ in 0..4096 {
        if next == pid {
            return true;
        }
        match proc::read_stat(next) {
            Ok(q) if next > 1 => next = q.ppid,
            _ => return false,
        }
    }
    false
}

/// A process whose fds we may not read: what its /proc directory still tells (stat, owner).
fn hidden_user(pid: i32) -> Option<NodeUser> {
    let dir = ProcDir::open(pid).ok()?;
    let (info, ino) = match identity::bound_identity(&dir) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(_) => (dir.stat().ok()?, None),
    };
    Some(NodeUser {
        pid,
        open: NodeSet::default(),
        mapped: NodeSet::default(),
        lineage: origin::Lineage::read(&info, Some(&dir)),
        info,
        ino,
        cmdline: dir.cmdline(),
        uid: dir.uid().ok(),
        defunct_leader: false,
    })
}

fn make_holder(
    user: &NodeUser,
    own: &BTreeMap<i64, i64>,
    inherited: Option<&BTreeSet<i64>>,
    index_of_minor: &dyn Fn(u32) -> i64,
    is_daemon: bool,
    places: &Resolver,
) -> Holder {
    let stat = &user.info;
    let cmdline = user.cmdline.clone();
    let indices = |set: &NodeSet| -> BTreeSet<i64> {
        set.minors.iter().map(|&m| index_of_minor(m)).collect()
    };
    let mapped = indices(&user.mapped);
    let open = indices(&user.open);
    let listed = !own.is_empty();
    // nvidiactl or nvidia-uvm alone is no GPU: an NVML client maps them too.
    let role = if is_daemon {
        Role::Daemon
    } else if listed || !mapped.is_empty() {
        Role::Compute
    } else {
        Role::Observer
    };
    // The driver's word first: on a machine with several GPUs every CUDA context maps all
    // the GPU nodes it can see (seen on H200s), not only those it uses. A dead creator's
    // GPUs count only where this process maps them too: never a GPU it does not show.
    let gpus: BTreeSet<i64> = match inherited {
        _ if listed => own.keys().copied().collect(),
        Some(g) if g.iter().any(|i| mapped.contains(i)) => g & &mapped,
        _ if !mapped.is_empty() => mapped.clone(),
        _ => open.clone(),
    };
    let mut evidence = Vec::new();
    if listed {
        evidence.push(Evidence::Driver);
    }
    if !user.open.is_empty() {
        evidence.push(Evidence::Fd);
    }
    if !user.mapped.is_empty() {
        evidence.push(Evidence::Map);
    }
    let uid = user.uid.unwrap_or(u32::MAX);
    let mem: i64 = own.values().sum();
    // A defunct leader is named by its threads' state: the leader is a zombie, the process
    // is not.
    let state = State {
        run: RunState::from_letter(stat.state),
        main_thread_exited: user.defunct_leader,
    };
    Holder {
        pid: stat.pid.into(),
        ppid: stat.ppid.into(),
        pgid: stat.pgid.into(),
        sid: stat.sid.into(),
        start: stat.start as i64,
        pidfs_ino: user.ino.map(|i| i as i64),
        uid: uid.into(),
        user: proc::user_name(uid),
        name: stat.comm.clone(),
        cmdline,
        state,
        role,
        maps: mapped.iter().copied().collect(),
        opens: open.union(&mapped).copied().collect(),
        caps: user.open.caps || user.mapped.caps,
        caps_all: false,
        gpus: gpus.into_iter().collect(),
        mig: Vec::new(),
        mem,
        mem_mib: mem / crate::gpu::MIB,
        inherited: None,
        inherited_on: BTreeMap::new(),
        evidence,
        protected: is_daemon,
        host: crate::local::local(),
        origin: user.lineage.origin(places),
    }
}
