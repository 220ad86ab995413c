//! The host set as one fleet: an operation runs on every selected machine at once (this one
//! in a thread, the others through their agents, all replies read in parallel), and each
//! host's part comes back kept apart, its records named after the host. Without `--host`
//! the set is this machine alone and nothing crosses a wire.

use super::kill::{merge_kills, unreachable_report, Kill, KillHolders};
use super::ops::{gpus_used, Diagnose, Gpus, Holders, HoldersReport};
use super::reset::Reset;
use super::wait::{combine, why_not_clean, Clean, CleanReport, WaitClean};
use super::{ActionError, Local, Machine, Op, Received, Remote};
use crate::gpu::{Gpu, GpuError};
use crate::hosts::fold::set_of;
use crate::hosts::{is_local, HostError, HostSel, LOCAL};
use crate::inspect::diagnose::Diagnosis;
use crate::inspect::holders::Holder;
use crate::inspect::reset::ResetReport;
use crate::inspect::select::{self, Selector};
use crate::inspect::wait::{WaitOpts, WaitOutcome};
use crate::inspect::{Bound, Filter, Selection};
use crate::process::kill::{KillOpts, KillReport, Target};
use crate::session::Session;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Each selected host's part of a call, in host-set order.
pub(crate) type PerHost<T> = Vec<(String, Result<T, ActionError>)>;

/// What an unreachable host does to a call over the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnError {
    /// The call fails with that host's error.
    Fail,
    /// The call goes on without it (said once per session).
    Skip,
}

/// The session's host set, and what an unreachable host does to its calls.
#[derive(Clone, Copy)]
pub(crate) struct Fleet<'a> {
    pub s: &'a Session,
    pub on_error: OnError,
}

impl<'a> Fleet<'a> {
    /// The session's fleet: unreachable hosts fail a call unless `--skip-unreachable`.
    pub(crate) fn of(s: &'a Session) -> Fleet<'a> {
        Fleet {
            s,
            on_error: match s.skip_unreachable() {
                true => OnError::Skip,
                false => OnError::Fail,
            },
        }
    }

    /// This fleet, with unreachable hosts skipped too when `skip` (a script call's
    /// `#{on_error: "skip"}`).
    pub(crate) fn skipping(self, skip: bool) -> Fleet<'a> {
        match skip {
            true => Fleet {
                on_error: OnError::Skip,
                ..self
            },
            false => self,
        }
    }

    /// Runs `op(selection)` on every host `sel` selects, each host's part kept apart.
    pub(crate) fn each<O, F>(&self, sel: &HostSel, op: F) -> Result<PerHost<O::Reply>, ActionError>
    where
        O: Op + Sync,
        F: Fn(Selection) -> O,
    {
        self.each_then(sel, op, |_, r| r)
    }

    /// `each`, with each host's answer turned into `U` by `then` (given the host's name)
    /// where it is read: on that host's own task for a remote host, so that per-record work
    /// runs in parallel across the hosts.
    pub(crate) fn each_then<O, U, F, T>(
        &self,
        sel: &HostSel,
        op: F,
        then: T,
    ) -> Result<PerHost<U>, ActionError>
    where
        O: Op + Sync,
        U: Send + 'static,
        F: Fn(Selection) -> O,
        T: Fn(&str, O::Reply) -> U + Clone + Send + Sync + 'static,
    {
        let names = self.s.host_names();
        check_named_hosts(self.s, &names, &sel.at)?;
        let plan = names
            .iter()
            .filter_map(|h| sel.on(h).map(|x| (h.clone(), op(x))))
            .collect();
        Ok(self.run(plan, then))
    }

    /// Runs each host's own operation on it, all at once; parts in the plan's order.
    fn run<O, U, T>(&self, plan: Vec<(String, O)>, then: T) -> PerHost<U>
    where
        O: Op + Sync,
        U: Send + 'static,
        T: Fn(&str, O::Reply) -> U + Clone + Send + Sync + 'static,
    {
        let s = self.s;
        let here = |op: &O| Local::on_terminal(s, |m| m.ask(op));
        let Some(pool) = s.pool() else {
            return plan
                .into_iter()
                .map(|(h, op)| {
                    let r = here(&op).map(|r| then(&h, r));
                    (h, r)
                })
                .collect();
        };
        let (mut mine, mut theirs) = (None, Vec::new());
        let mut takes = Some(Duration::ZERO);
        for (h, op) in &plan {
            if is_local(h) {
                mine = Some(op);
            } else {
                takes = takes.zip(op.takes()).map(|(a, b)| a.max(b));
                theirs.push((h.clone(), op.call()));
            }
        }
        let deadline = super::deadline(pool, takes);
        let named = {
            let then = then.clone();
            move |h: &str, mut r: O::Reply| {
                r.received_from(h);
                then(h, r)
            }
        };
        let (mine, theirs) = std::thread::scope(|sc| {
            let mine = mine.map(|op| sc.spawn(move || here(op).map(|r| then(LOCAL, r))));
            let theirs = pool.call_many_then(theirs, deadline, s.interrupted(), named);
            let mine = mine.map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (mine, theirs)
        });
        let (mut mine, mut theirs) = (mine, theirs.into_iter());
        plan.into_iter()
            .map(|(h, _)| {
                let r = match is_local(&h) {
                    true => mine.take().unwrap_or(Err(ActionError::Interrupted)),
                    false => theirs
                        .next()
                        .unwrap_or(Err(HostError::Interrupted))
                        .map_err(ActionError::from),
                };
                (h, r)
            })
            .collect()
    }

    /// Keeps the hosts that answered; an unreachable host is skipped (and reported once)
    /// when skipping, any other failure is the call's error.
    pub(crate) fn answered<T>(&self, parts: PerHost<T>) -> Result<Vec<(String, T)>, ActionError> {
        let mut out = Vec::new();
        for (h, r) in parts {
            match r {
                Ok(v) => out.push((h, v)),
                Err(e) if self.on_error == OnError::Skip && e.unreachable() => {
                    if self.s.note_skipped(&h) {
                        crate::errln!("warning: skipping {e}");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The parts of the hosts that answered, in host order.
    pub(crate) fn answered_parts<T>(&self, parts: PerHost<T>) -> Result<Vec<T>, ActionError> {
        Ok(self.answered(parts)?.into_iter().map(|(_, t)| t).collect())
    }

    /// The records of every host that answered, in host order.
    fn gather<T>(&self, parts: PerHost<Vec<T>>) -> Result<Vec<T>, ActionError> {
        Ok(self.answered_parts(parts)?.into_iter().flatten().collect())
    }

    /// Every host's GPUs, each host's records turned into `U` by `shape` as they arrive, on
    /// that host's own task: for a caller whose own work per record is not small, such as
    /// building a script's maps.
    pub(crate) fn gpus_per_host_as<U, F>(&self, shape: F) -> Result<PerHost<U>, ActionError>
    where
        U: Send + 'static,
        F: Fn(Vec<Gpu>) -> U + Clone + Send + Sync + 'static,
    {
        self.each_then(&HostSel::all(), |_| Gpus, move |_, gs| shape(gs))
    }

    pub(crate) fn gpus(&self) -> Result<Vec<Gpu>, ActionError> {
        self.gather(self.each(&HostSel::all(), |_| Gpus)?)
    }

    pub(crate) fn gpu(&self, index: i64) -> Result<Gpu, ActionError> {
        let gpus = self.gpus()?;
        let count = gpus.len();
        let mut found: Vec<Gpu> = gpus.into_iter().filter(|g| g.index == index).collect();
        match found.len() {
            0 => Err(GpuError::NoSuchGpu { index, count }.into()),
            1 => Ok(found.remove(0)),
            _ => Err(ActionError::Usage(format!(
                "gpu({index}): {} hosts have a GPU {index}; name one as gpu(\"{}:{index}\")",
                found.len(),
                found[0].host
            ))),
        }
    }

    /// One GPU named as `--gpu` names one: an index, a UUID (or a unique prefix of one) or
    /// a bus id. A UUID is unique across hosts; a bus id or an index on several hosts is
    /// ambiguous.
    pub(crate) fn gpu_named(&self, text: &str) -> Result<Gpu, ActionError> {
        let sels = select::parse(text)?;
        let [sel] = sels.as_slice() else {
            return Err(GpuError::BadSelector(format!(
                "{text:?} names {} GPUs; gpu() takes one (gpu() with no argument lists them all)",
                sels.len()
            ))
            .into());
        };
        let id = match sel {
            Selector::Index(i) => return self.gpu(*i),
            Selector::Id(id) => id.clone(),
            // A MIG device's GPU is its parent.
            Selector::Mig(m) => m.to_string(),
        };
        let gpus = self.gpus()?;
        let mut found = Vec::new();
        let mut last_err = None;
        // The GPUs come host after host: each host's run of them, in one pass (a filter of
        // every GPU per host was quadratic in the host count).
        for here in gpus.chunk_by(|a, b| a.host == b.host) {
            match select::resolve(std::slice::from_ref(sel), here) {
                Ok(idx) => found.extend(here.iter().filter(|g| idx.contains(&g.index)).cloned()),
                Err(e) => last_err = Some(e),
            }
        }
        match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(last_err
                .unwrap_or(GpuError::NoSuchGpuId {
                    id,
                    count: gpus.len(),
                })
                .into()),
            n => Err(ActionError::Usage(format!(
                "gpu({text:?}): {n} hosts have that GPU; name one as gpu(\"{}:{}\")",
                found[0].host, found[0].index
            ))),
        }
    }

    /// One GPU named as `"dest:index"`.
    pub(crate) fn gpu_at(&self, host: &str, index: i64) -> Result<Gpu, ActionError> {
        let sel = HostSel {
            at: [(host.to_string(), vec![index])].into(),
            ..HostSel::default()
        };
        let gpus = self.gather(self.each(&sel, |_| Gpus)?)?;
        let count = gpus.len();
        gpus.into_iter()
            .find(|g| g.index == index)
            .ok_or(GpuError::NoSuchGpu { index, count }.into())
    }

    /// `reset` of the GPUs `sel` names, each host's on that host. With a host set every GPU
    /// must be named with its host (`HOST:N`): an index does not say whose GPU it is (a
    /// diagnosis of another host's GPU 2 is not this machine's GPU 2), and a reset is never
    /// guessed.
    pub(crate) fn reset(
        &self,
        sel: &HostSel,
        op: impl Fn(Vec<i64>) -> Reset,
    ) -> Result<Vec<ResetReport>, ActionError> {
        let names = self.s.host_names();
        if let (false, Some(every)) = (self.s.is_local(), &sel.every) {
            let gpus: Vec<String> = every.iter().map(i64::to_string).collect();
            return Err(GpuError::Reset {
                index: every.first().copied().unwrap_or_default(),
                why: format!(
                    "reset_gpu() resets this machine's GPUs only, and with a host set ({}) an index does not say which host's GPU {} is meant: name it as HOST:N (gpuloop --host HOST reset --gpu HOST:N)",
                    set_of(&names),
                    gpus.join(",")
                ),
            }
            .into());
        }
        self.gather(self.each(sel, |x| op(x.unwrap_or_default()))?)
    }

    /// The GPU indices that selectors (`0`, `0-3`, `GPU-0fb0…`, a bus id, a MIG device) name,
    /// and the MIG devices that narrow them (`select::narrowing`). The GPU list is read only
    /// when a UUID, a bus id or a MIG UUID needs it.
    fn select(
        &self,
        sels: &[Selector],
    ) -> Result<(Vec<i64>, Option<Vec<crate::gpu::mig::MigSel>>), ActionError> {
        let named = |x: &Selector| {
            matches!(
                x,
                Selector::Index(_) | Selector::Mig(crate::gpu::mig::MigSel::Ids { .. })
            )
        };
        let gpus = if sels.iter().all(named) {
            Vec::new()
        } else {
            self.gpus()?
        };
        Ok((
            select::resolve(sels, &gpus)?,
            select::narrowing(sels, &gpus)?,
        ))
    }

    /// Selectors and `"dest:index"` entries as a selection over the host set. A UUID or
    /// bus id is looked up on this machine; with several hosts only indices name the same
    /// GPU everywhere.
    pub(crate) fn select_hosts(
        &self,
        sels: Option<&[Selector]>,
        at: BTreeMap<String, Vec<i64>>,
    ) -> Result<HostSel, ActionError> {
        let names = self.s.host_names();
        check_named_hosts(self.s, &names, &at)?;
        let several = names != [LOCAL];
        let (every, mig) = match sels {
            None => (None, None),
            Some(x)
                if several
                    && x.iter().any(|x| {
                        !matches!(
                            x,
                            Selector::Index(_)
                                | Selector::Mig(crate::gpu::mig::MigSel::Ids { .. })
                        )
                    }) =>
            {
                return Err(GpuError::BadSelector(
                    "with several hosts select GPUs by index (that GPU on every host), as \"dest:index\", or a MIG device as N:GI:CI (on every host); UUIDs, bus ids and MIG UUIDs name one machine's GPU (give that host alone with --host)".into(),
                ).into())
            }
            Some(x) => {
                let (every, mig) = self.select(x)?;
                (Some(every), mig)
            }
        };
        Ok(HostSel { every, at, mig })
    }

    /// On this machine alone, a filter naming no user here fails at once, before anything
    /// is looked at; with a host set each host answers for its own user database.
    pub(crate) fn check_filter(&self, filter: &Filter) -> Result<(), ActionError> {
        if self.s.is_local() {
            filter.resolve()?;
        }
        Ok(())
    }

    /// Every selected host's holders report, each host's part kept apart.
    pub(crate) fn holders_per_host(
        &self,
        sel: &HostSel,
        all: bool,
        filter: &Filter,
    ) -> Result<PerHost<HoldersReport>, ActionError> {
        let filter = &sel.narrow(filter);
        self.each(sel, |sel| Holders {
            sel,
            all,
            filter: filter.clone(),
        })
    }

    /// The holders of the selected GPUs, narrowed by a filter: one owner (`--user`,
    /// `--mine`), one Slurm job (`--job`).
    pub(crate) fn holders(
        &self,
        sel: &HostSel,
        all: bool,
        filter: &Filter,
    ) -> Result<Vec<Holder>, ActionError> {
        let parts = self.answered_parts(self.holders_per_host(sel, all, filter)?)?;
        Ok(parts.into_iter().flat_map(|r| r.holders).collect())
    }

    /// diagnose() of every selected host (with a filter, of the GPUs its holders use), each
    /// host's part kept apart.
    pub(crate) fn diagnoses_per_host(
        &self,
        sel: &HostSel,
        filter: &Filter,
    ) -> Result<PerHost<Vec<Diagnosis>>, ActionError> {
        let filter = &sel.narrow(filter);
        self.each(sel, |sel| Diagnose {
            sel,
            filter: filter.clone(),
        })
    }

    pub(crate) fn diagnoses(
        &self,
        sel: &HostSel,
        filter: &Filter,
    ) -> Result<Vec<Diagnosis>, ActionError> {
        self.gather(self.diagnoses_per_host(sel, filter)?)
    }

    /// The GPUs of the selection that the holders `filter` picks hold now, on each host
    /// (`wait --user/--mine/--job`); `None` when they hold none.
    pub(crate) fn held_by(
        &self,
        sel: &HostSel,
        filter: &Filter,
    ) -> Result<Option<HostSel>, ActionError> {
        let mut at = BTreeMap::new();
        for (host, r) in self.answered(self.holders_per_host(sel, false, filter)?)? {
            let gpus = gpus_used(r.holders.iter(), &sel.on(&host).flatten());
            if !gpus.is_empty() {
                at.insert(host, gpus);
            }
        }
        Ok((!at.is_empty()).then_some(HostSel {
            every: None,
            at,
            mig: sel.mig.clone(),
        }))
    }

    /// Kills each target on its own host (`None`: the only host there is); identities are
    /// checked on that host. With a bound, only that user's, pod's or container's processes
    /// (read on each host) are signalled. A host skipped for being unreachable still answers for its
    /// targets: each is `skipped` in the report, with why.
    pub(crate) fn kill(
        &self,
        targets: &[(Option<String>, Target)],
        opts: &KillOpts,
        bound: &Bound,
    ) -> Result<KillReport, ActionError> {
        let names = self.s.host_names();
        let mut by_host: BTreeMap<String, Vec<Target>> = BTreeMap::new();
        for (h, t) in targets {
            let host = match h {
                Some(h) => h.clone(),
                None if names.len() == 1 => names[0].clone(),
                None => {
                    return Err(ActionError::Usage(format!(
                        "kill({}): a bare pid with {} hosts is ambiguous; kill the holder map (it carries its host)",
                        t.pid(),
                        names.len()
                    )))
                }
            };
            if !self.s.has_host(&host) {
                return Err(HostError::Unknown {
                    host,
                    known: set_of(&names),
                }
                .into());
            }
            by_host.entry(host).or_default().push(*t);
        }
        let plan: Vec<(String, Kill)> = by_host
            .iter()
            .map(|(h, ts)| {
                let op = Kill {
                    targets: ts.clone(),
                    opts: opts.clone(),
                    bound: bound.clone(),
                };
                (h.clone(), op)
            })
            .collect();
        let parts = self
            .run(plan, |_, r| r)
            .into_iter()
            .map(|(h, r)| match r {
                Err(ActionError::Host(e)) if self.on_error == OnError::Skip && e.unreachable() => {
                    if self.s.note_skipped(&h) {
                        crate::errln!("warning: skipping {e}");
                    }
                    let ts = by_host.get(&h).map_or(&[][..], Vec::as_slice);
                    let r = unreachable_report(&h, &e, ts, opts.dry_run);
                    (h, Ok(r))
                }
                other => (h, other),
            })
            .collect();
        Ok(merge_kills(self.answered(parts)?, opts.dry_run))
    }

    /// With several hosts, a `--pod` that each host reads on its own must pick one pod in the
    /// whole set: a pod runs on one node, so a name (or a uid prefix) that picks a pod on two
    /// hosts names two pods, such as a deleted pod's orphan on one node and its successor,
    /// re-created with the same name, on another. Refused before anything is signalled or
    /// waited for, naming each by its host and uid. A host where it picks nothing is left
    /// to say so in its own answer; a container's name is each host's own, as docker's is.
    pub(crate) fn one_pod(&self, sel: &HostSel, filter: &Filter) -> Result<(), ActionError> {
        let several = self.s.host_names().len() > 1;
        let Some(text) = filter.pod.as_deref().filter(|_| several) else {
            return Ok(());
        };
        let mut picked: BTreeMap<(String, String), String> = BTreeMap::new();
        for (host, part) in self.holders_per_host(sel, true, filter)? {
            for h in part.map(|r| r.holders).unwrap_or_default() {
                let Some(pod) = &h.origin.place.pod else {
                    continue;
                };
                let Some(uid) = &pod.uid else { continue };
                let deleted = if pod.deleted { ", deleted" } else { "" };
                picked
                    .entry((host.clone(), uid.clone()))
                    .or_insert_with(|| format!("{host}: --pod {uid} ({}{deleted})", pod.label()));
            }
        }
        let hosts: std::collections::BTreeSet<&String> = picked.keys().map(|(h, _)| h).collect();
        if hosts.len() < 2 {
            return Ok(());
        }
        Err(ActionError::Usage(format!(
            "--pod {text} fits pods on {} hosts; a pod runs on one node: name one by its uid, with its host alone (--host HOST): {}",
            hosts.len(),
            picked.into_values().collect::<Vec<_>>().join(", ")
        )))
    }

    /// Stops the compute holders of the selection on every selected host at once, each
    /// host's report kept apart.
    pub(crate) fn kill_holders_per_host(
        &self,
        sel: &HostSel,
        filter: &Filter,
        opts: &KillOpts,
    ) -> Result<PerHost<KillReport>, ActionError> {
        self.one_pod(sel, filter)?;
        let filter = &sel.narrow(filter);
        self.each(sel, |sel| KillHolders {
            sel,
            filter: filter.clone(),
            opts: opts.clone(),
        })
    }

    pub(crate) fn kill_holders(
        &self,
        sel: &HostSel,
        filter: &Filter,
        opts: &KillOpts,
    ) -> Result<KillReport, ActionError> {
        let parts = self.kill_holders_per_host(sel, filter, opts)?;
        Ok(merge_kills(self.answered(parts)?, opts.dry_run))
    }

    /// wait_clean on every selected host at once: clean when all are. `quiet`: no warning
    /// at the timeout, for commands that report what is left themselves. A pod or a
    /// container in `filter` makes it that scope's wait on each host (`WaitClean`).
    pub(crate) fn wait(
        &self,
        sel: &HostSel,
        filter: &Filter,
        opts: &WaitOpts,
        quiet: bool,
    ) -> Result<WaitOutcome, ActionError> {
        self.one_pod(sel, filter)?;
        let filter = &sel.narrow(filter);
        let parts = self.each(sel, |sel| WaitClean {
            sel,
            opts: opts.clone(),
            quiet,
            filter: filter.clone(),
        })?;
        let outcomes = self.answered(parts)?;
        for (h, o) in outcomes.iter().filter(|(h, _)| !is_local(h) && !quiet) {
            if let Some(why) = why_not_clean(o, opts) {
                crate::errln!("warning: {h}: GPUs {why}");
            }
        }
        Ok(combine(outcomes.into_iter().map(|(_, o)| o)))
    }

    /// clean on every selected host at once, each host's report kept apart.
    pub(crate) fn clean_per_host(
        &self,
        sel: &HostSel,
        filter: &Filter,
        kill: &KillOpts,
        wait: &WaitOpts,
    ) -> Result<PerHost<CleanReport>, ActionError> {
        self.one_pod(sel, filter)?;
        let filter = &sel.narrow(filter);
        self.each(sel, |sel| Clean {
            sel,
            filter: filter.clone(),
            kill: kill.clone(),
            wait: wait.clone(),
        })
    }

    /// The host set, connecting to it if not done yet.
    pub(crate) fn hosts(&self) -> Vec<HostInfo> {
        let pool = self.s.pool();
        self.s
            .host_names()
            .into_iter()
            .map(|name| {
                let hello = match (&pool, name.as_str()) {
                    (_, LOCAL) | (None, _) => Ok(None),
                    (Some(p), h) => p.hello(h),
                };
                let local = is_local(&name);
                match hello {
                    Ok(h) => HostInfo {
                        local,
                        reachable: true,
                        hostname: h
                            .map(|h| h.hostname.clone())
                            .or_else(|| local.then(crate::hosts::hostname)),
                        version: Some(
                            h.map_or(env!("CARGO_PKG_VERSION").to_string(), |h| h.version.clone()),
                        ),
                        gpus: h.map(|h| h.gpus),
                        error: None,
                        name,
                    },
                    Err(e) => HostInfo {
                        local,
                        reachable: false,
                        hostname: None,
                        version: None,
                        gpus: None,
                        error: Some(e.to_string()),
                        name,
                    },
                }
            })
            .collect()
    }

    /// One remote host of the set, for a job's calls; `None` for this machine.
    pub(crate) fn remote(&self, host: Option<&'a str>) -> Result<Option<Remote<'a>>, String> {
        let host = match host {
            None | Some(LOCAL) => return Ok(None),
            Some(h) => h,
        };
        if !self.s.has_host(host) {
            return Err(format!(
                "not in the host set ({})",
                set_of(&self.s.host_names())
            ));
        }
        let pool = self.s.pool().ok_or("no host set")?;
        Ok(Some(Remote {
            pool,
            host,
            interrupted: self.s.interrupted(),
        }))
    }
}

/// One host of the set, as `hosts()` lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HostInfo {
    pub name: String,
    pub local: bool,
    pub reachable: bool,
    /// The agent's host name, gpuloop version and GPU count (from its hello).
    pub hostname: Option<String>,
    pub version: Option<String>,
    pub gpus: Option<i64>,
    pub error: Option<String>,
}

/// A `"dest:index"` naming a host outside the set is a usage error that names the host and
/// the set, never an empty selection. Names match exactly, as the host set itself is built
/// and matched (`kill` routing, `run(…, #{host})`): they are ssh destinations as given.
fn check_named_hosts(
    s: &Session,
    names: &[String],
    at: &BTreeMap<String, Vec<i64>>,
) -> Result<(), GpuError> {
    for (h, ix) in at {
        // A lookup: `at` may name every host (a wait on what `held_by` found).
        if s.has_host(h) {
            continue;
        }
        let like = names
            .iter()
            .find(|n| n.eq_ignore_ascii_case(h))
            .map(|n| format!("; host names match exactly: {n:?}?"))
            .unwrap_or_default();
        return Err(GpuError::BadSelector(format!(
            "\"{h}:{}\": no host {h:?} in the host set ({}){like}",
            ix.first().copied().unwrap_or_default(),
            set_of(names)
        )));
    }
    Ok(())
}
