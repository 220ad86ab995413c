//! The operations that scripts and the one-shot commands share, wired to a session:
//! the bindings and the CLI both call these, so `gpuloop clean` and a script behave alike.
//!
//! This is also where a call fans out over the host set: each host's part runs at once
//! (this machine in a thread, the others through their agents), and the records come back
//! with `host` set. Without `--host` the set is this machine alone and nothing changes.

use crate::gpu::{Gpu, GpuError};
use crate::hosts::protocol::{self, Call};
use crate::hosts::Pool;
use crate::hosts::{HostError, HostSel, LOCAL};
use crate::inspect::diagnose::{self, diagnose, Diagnosis};
use crate::inspect::holders::{Holder, Inventory};
use crate::inspect::select::{self, Selector};
use crate::inspect::wait::{self, Dirty, WaitOpts, WaitOutcome};
use crate::inspect::{check_selection, Filter, Resolved, Selection};
use crate::process::kill::{self, signal_name, KillOpts, KillReport, Skipped, Target};
use crate::runner::{self, Cmd, Job, JobOpts, Outcome, RunError, Waited};
use crate::session::Session;
use nix::sys::signal::Signal;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

thread_local! {
    /// `#{on_error: "skip"}` of the script call being run.
    static SKIP: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with unreachable hosts skipped (and reported) instead of failing the call.
pub fn skipping<T>(skip: bool, f: impl FnOnce() -> T) -> T {
    let before = SKIP.with(|c| c.replace(skip));
    let out = f();
    SKIP.with(|c| c.set(before));
    out
}

/// Why one host's part of a call failed.
#[derive(Debug, Clone)]
pub enum Failure {
    Gpu(GpuError),
    Host(HostError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Gpu(e) => e.fmt(f),
            Failure::Host(e) => e.fmt(f),
        }
    }
}

impl Failure {
    /// The host could not be reached or used (as opposed to a call that failed there).
    pub fn unreachable(&self) -> bool {
        matches!(self, Failure::Host(e) if e.unreachable())
    }

    /// A mistake in what was asked, found here or on the host (exit 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Failure::Gpu(e) => e.is_usage(),
            Failure::Host(e) => e.is_usage(),
        }
    }

    pub fn into_gpu(self) -> GpuError {
        match self {
            Failure::Gpu(e) => e,
            Failure::Host(e) => host_err(e),
        }
    }
}

/// Each selected host's part of a call, in host-set order.
pub type PerHost<T> = Vec<(String, Result<T, Failure>)>;

fn host_err(e: HostError) -> GpuError {
    if e.is_usage() {
        GpuError::HostUsage(e.to_string())
    } else {
        GpuError::Host(e.to_string())
    }
}

/// Runs one call on every selected host at once: `local` here, `remote` through the agents.
fn fan<T, L, R>(
    s: &Session,
    sel: &HostSel,
    deadline: Option<Duration>,
    local: L,
    remote: R,
) -> Result<PerHost<T>, GpuError>
where
    T: DeserializeOwned + Send + 'static,
    L: Fn(&Selection) -> Result<T, GpuError> + Sync,
    R: Fn(&Selection) -> Call,
{
    fan_then(s, sel, deadline, local, remote, |_, t| t)
}

/// `fan`, with each host's answer turned into `U` by `then` (given the host's name) where
/// it is read: on that host's own task for a remote host, so that per-record work runs in
/// parallel across the hosts.
fn fan_then<T, U, L, R, F>(
    s: &Session,
    sel: &HostSel,
    deadline: Option<Duration>,
    local: L,
    remote: R,
    then: F,
) -> Result<PerHost<U>, GpuError>
where
    T: DeserializeOwned + Send + 'static,
    U: Send + 'static,
    L: Fn(&Selection) -> Result<T, GpuError> + Sync,
    R: Fn(&Selection) -> Call,
    F: Fn(&str, T) -> U + Clone + Send + Sync + 'static,
{
    let names = s.host_names();
    check_named_hosts(&names, &sel.at)?;
    let plan: Vec<(String, Selection)> = names
        .iter()
        .filter_map(|h| sel.on(h).map(|x| (h.clone(), x)))
        .collect();
    let Some(pool) = s.pool() else {
        return Ok(plan
            .into_iter()
            .map(|(h, x)| {
                let r = local(&x).map(|t| then(&h, t)).map_err(Failure::Gpu);
                (h, r)
            })
            .collect());
    };
    let calls: Vec<(String, Call)> = plan
        .iter()
        .filter(|(h, _)| h != LOCAL)
        .map(|(h, x)| (h.clone(), remote(x)))
        .collect();
    let here = plan
        .iter()
        .find(|(h, _)| h == LOCAL)
        .map(|(_, x)| x.clone());
    let (mine, theirs) = std::thread::scope(|sc| {
        let (local, mine_then) = (&local, then.clone());
        let mine = here.map(|x| sc.spawn(move || local(&x).map(|t| mine_then(LOCAL, t))));
        let theirs = pool.call_many_then(calls, deadline, s.interrupted(), then);
        (mine.map(|h| h.join()), theirs)
    });
    let mut theirs = theirs.into_iter();
    let mut mine = mine;
    let mut out = Vec::new();
    for (h, _) in plan {
        let r = if h == LOCAL {
            match mine.take() {
                Some(Ok(r)) => r.map_err(Failure::Gpu),
                _ => Err(Failure::Gpu(GpuError::Host(
                    "the local part of the call panicked".into(),
                ))),
            }
        } else {
            match theirs.next() {
                Some(r) => r.map_err(Failure::Host),
                None => Err(Failure::Host(HostError::Interrupted)),
            }
        };
        out.push((h, r));
    }
    Ok(out)
}

/// Whether unreachable hosts are skipped for the call being run.
fn skip_unreachable(s: &Session) -> bool {
    s.skip_unreachable() || SKIP.with(Cell::get)
}

/// Keeps the hosts that answered; an unreachable host is skipped (and reported once) when
/// skipping, any other failure is the call's error.
fn answered<T>(s: &Session, parts: PerHost<T>) -> Result<Vec<(String, T)>, GpuError> {
    let skip = skip_unreachable(s);
    let mut out = Vec::new();
    for (h, r) in parts {
        match r {
            Ok(v) => out.push((h, v)),
            Err(f) if skip && f.unreachable() => {
                if s.note_skipped(&h) {
                    crate::errln!("warning: skipping {f}");
                }
            }
            Err(f) => return Err(f.into_gpu()),
        }
    }
    Ok(out)
}

/// The records of every host that answered, in host order.
fn gather<T>(s: &Session, parts: PerHost<Vec<T>>) -> Result<Vec<T>, GpuError> {
    Ok(answered(s, parts)?
        .into_iter()
        .flat_map(|(_, items)| items)
        .collect())
}

fn call_timeout(s: &Session) -> Option<Duration> {
    s.pool().map(|p| p.config.call_timeout)
}

/// Every host's GPUs, each host's part kept apart.
pub fn gpus_per_host(s: &Session) -> Result<PerHost<Vec<Gpu>>, GpuError> {
    gpus_per_host_as(s, |gs| gs)
}

/// Every host's GPUs, each host's records turned into `U` by `shape` as they arrive, on that
/// host's own task (in parallel with the other hosts' replies): for a caller whose own work
/// per record is not small, such as building a script's maps.
pub fn gpus_per_host_as<U, F>(s: &Session, shape: F) -> Result<PerHost<U>, GpuError>
where
    U: Send + 'static,
    F: Fn(Vec<Gpu>) -> U + Clone + Send + Sync + 'static,
{
    gpus_of_hosts_as(s, &HostSel::all(), shape)
}

/// The GPUs of the hosts `sel` names, each remote record named after its host, then shaped.
fn gpus_of_hosts_as<U, F>(s: &Session, sel: &HostSel, shape: F) -> Result<PerHost<U>, GpuError>
where
    U: Send + 'static,
    F: Fn(Vec<Gpu>) -> U + Clone + Send + Sync + 'static,
{
    fan_then(
        s,
        sel,
        call_timeout(s),
        |_| local_gpus(s),
        |_| Call::Gpus,
        move |h, mut gs: Vec<Gpu>| {
            name_items(h, &mut gs, |g, h| g.host = h.to_string());
            shape(gs)
        },
    )
}

/// The parts of the hosts that answered, in host order (an unreachable host skipped when
/// the session or the call says so, and reported once).
pub fn answered_parts<T>(s: &Session, parts: PerHost<T>) -> Result<Vec<T>, GpuError> {
    Ok(answered(s, parts)?.into_iter().map(|(_, t)| t).collect())
}

/// Sets `host` on the records of the remote hosts.
fn name_parts<T>(parts: &mut PerHost<Vec<T>>, name: impl Fn(&mut T, &str)) {
    for (h, r) in parts.iter_mut() {
        if let Ok(items) = r {
            name_items(h, items, &name);
        }
    }
}

/// Sets `host` on one host's records, if that host is remote.
fn name_items<T>(host: &str, items: &mut [T], name: impl Fn(&mut T, &str)) {
    if host != LOCAL {
        items.iter_mut().for_each(|it| name(it, host));
    }
}

pub fn gpus(s: &Session) -> Result<Vec<Gpu>, GpuError> {
    gather(s, gpus_per_host(s)?)
}

pub fn gpu(s: &Session, index: i64) -> Result<Gpu, GpuError> {
    let gpus = gpus(s)?;
    let count = gpus.len();
    let mut found: Vec<Gpu> = gpus.into_iter().filter(|g| g.index == index).collect();
    match found.len() {
        0 => Err(GpuError::NoSuchGpu { index, count }),
        1 => Ok(found.remove(0)),
        _ => Err(GpuError::Host(format!(
            "gpu({index}): {} hosts have a GPU {index}; name one as gpu(\"{}:{index}\")",
            found.len(),
            found[0].host
        ))),
    }
}

/// One GPU named as `--gpu` names one: an index, a UUID (or a unique prefix of one) or a bus
/// id. A UUID is unique across hosts; a bus id or an index on several hosts is ambiguous.
pub fn gpu_named(s: &Session, text: &str) -> Result<Gpu, GpuError> {
    let sels = select::parse(text)?;
    let [sel] = sels.as_slice() else {
        return Err(GpuError::BadSelector(format!(
            "{text:?} names {} GPUs; gpu() takes one (gpu() with no argument lists them all)",
            sels.len()
        )));
    };
    let id = match sel {
        Selector::Index(i) => return gpu(s, *i),
        Selector::Id(id) => id,
    };
    let gpus = gpus(s)?;
    let mut hosts: Vec<&str> = gpus.iter().map(|g| g.host.as_str()).collect();
    hosts.dedup();
    let mut found = Vec::new();
    let mut last_err = None;
    for h in hosts {
        let here: Vec<Gpu> = gpus.iter().filter(|g| g.host == h).cloned().collect();
        match select::resolve(std::slice::from_ref(sel), &here) {
            Ok(idx) => found.extend(here.into_iter().filter(|g| idx.contains(&g.index))),
            Err(e) => last_err = Some(e),
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(last_err.unwrap_or(GpuError::NoSuchGpuId {
            id: id.clone(),
            count: gpus.len(),
        })),
        n => Err(GpuError::Host(format!(
            "gpu({text:?}): {n} hosts have that GPU; name one as gpu(\"{}:{}\")",
            found[0].host, found[0].index
        ))),
    }
}

/// One GPU named as `"dest:index"`.
pub fn gpu_at(s: &Session, host: &str, index: i64) -> Result<Gpu, GpuError> {
    let sel = HostSel {
        every: None,
        at: [(host.to_string(), vec![index])].into(),
    };
    let gpus = gather(s, gpus_of_hosts_as(s, &sel, |gs| gs)?)?;
    let count = gpus.len();
    gpus.into_iter()
        .find(|g| g.index == index)
        .ok_or(GpuError::NoSuchGpu { index, count })
}

fn local_gpus(s: &Session) -> Result<Vec<Gpu>, GpuError> {
    s.warn_no_driver();
    s.backend()?.gpus()
}

/// Resets one of this machine's GPUs. With a host set an index does not say whose GPU it is
/// (a diagnosis of another host's GPU 2 is not this machine's GPU 2): refused, never guessed.
pub fn reset_gpu(s: &Session, index: i64) -> Result<(), GpuError> {
    let names = s.host_names();
    if names != [LOCAL] {
        return Err(GpuError::Reset {
            index,
            why: format!(
                "reset_gpu() resets this machine's GPUs only, and with a host set ({}) an index does not say which host's GPU {index} is meant: reset it on that host itself (ssh HOST gpuloop run clean-node --gpu {index} --allow-reset)",
                names.join(", ")
            ),
        });
    }
    s.backend()?.reset(index, &crate::process::helpers::output)
}

pub fn inventory(s: &Session, sel: &Selection) -> Result<Inventory, GpuError> {
    let inv = look(s)?;
    s.warn_no_driver();
    check_selection(sel, &inv.gpus)?;
    Ok(inv)
}

/// One look at the driver and /proc, not yet checked against a selection. The /proc scan runs
/// while the driver loads: a one-shot pays for the slower, not both. So a caller asks the
/// backend anything (even whether there is a driver) only after this.
pub fn look(s: &Session) -> Result<Inventory, GpuError> {
    Inventory::take_while_loading(&s.device_nodes(), || s.backend(), s.protected())
}

/// The GPU indices that selectors (`0`, `0-3`, `GPU-0fb0…`, a bus id) name. The GPU list is
/// read only when a UUID or bus id needs it.
pub fn select(s: &Session, sels: &[Selector]) -> Result<Vec<i64>, GpuError> {
    let gpus = if sels.iter().all(|x| matches!(x, Selector::Index(_))) {
        Vec::new()
    } else {
        gpus(s)?
    };
    select::resolve(sels, &gpus)
}

/// A `"dest:index"` naming a host outside the set is a usage error that names the host and
/// the set, never an empty selection. Names match exactly, as the host set itself is built
/// and matched (`kill` routing, `run(…, #{host})`): they are ssh destinations as given.
fn check_named_hosts(
    names: &[String],
    at: &std::collections::BTreeMap<String, Vec<i64>>,
) -> Result<(), GpuError> {
    for (h, ix) in at {
        if names.iter().any(|n| n == h) {
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
            names.join(", ")
        )));
    }
    Ok(())
}

/// Selectors and `"dest:index"` entries as a selection over the host set. A UUID or bus id
/// is looked up on this machine; with several hosts only indices name the same GPU everywhere.
pub fn select_hosts(
    s: &Session,
    sels: Option<&[Selector]>,
    at: std::collections::BTreeMap<String, Vec<i64>>,
) -> Result<HostSel, GpuError> {
    let names = s.host_names();
    check_named_hosts(&names, &at)?;
    let several = names != [LOCAL];
    let every = match sels {
        None => None,
        Some(x) if several && x.iter().any(|x| !matches!(x, Selector::Index(_))) => {
            return Err(GpuError::BadSelector(
                "with several hosts select GPUs by index (that GPU on every host) or as \"dest:index\"; UUIDs and bus ids name one machine's GPU".into(),
            ))
        }
        Some(x) => Some(select(s, x)?),
    };
    Ok(HostSel { every, at })
}

/// On this machine alone, a filter naming no user here fails at once, before anything is
/// looked at; with a host set each host answers for its own user database.
pub fn check_filter(s: &Session, filter: &Filter) -> Result<(), GpuError> {
    if s.host_names() == [LOCAL] {
        filter.resolve()?;
    }
    Ok(())
}

/// Every selected host's holders (narrowed by `filter`), each host's part kept apart.
pub fn holders_per_host(
    s: &Session,
    sel: impl Into<HostSel>,
    all: bool,
    filter: &Filter,
) -> Result<PerHost<Vec<Holder>>, GpuError> {
    Ok(holders_report_per_host(s, sel, all, filter)?
        .into_iter()
        .map(|(h, r)| (h, r.map(|r| r.holders)))
        .collect())
}

fn local_holders(
    s: &Session,
    sel: &Selection,
    all: bool,
    filter: &Filter,
) -> Result<Vec<Holder>, GpuError> {
    let filter = filter.resolve()?;
    let mut hs = inventory(s, sel)?.holders(sel, all);
    hs.retain(|h| filter.matches(h));
    Ok(hs)
}

pub fn holders(s: &Session, sel: impl Into<HostSel>, all: bool) -> Result<Vec<Holder>, GpuError> {
    holders_of(s, sel, all, &Filter::default())
}

/// Holders as `holders`, narrowed by a filter: one owner (`--user`, `--mine`), one Slurm job
/// (`--job`).
pub fn holders_of(
    s: &Session,
    sel: impl Into<HostSel>,
    all: bool,
    filter: &Filter,
) -> Result<Vec<Holder>, GpuError> {
    gather(s, holders_per_host(s, sel, all, filter)?)
}

/// What `gpuloop holders` shows: the holders, how many processes could not be inspected
/// (other users', without root: holders among them are missing from the list, which the
/// one-shot says), and the first selected GPU the driver could not read (its holders are
/// then only those the /proc scan found: the driver's list of it is missing).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HoldersReport {
    pub holders: Vec<Holder>,
    pub unreadable: usize,
    #[serde(default)]
    pub unread: Option<String>,
}

/// Holders here, with the count of processes that could not be inspected.
pub fn holders_report(
    s: &Session,
    sel: &Selection,
    all: bool,
    filter: &Filter,
) -> Result<HoldersReport, GpuError> {
    holders_report_in(inventory(s, sel)?, sel, all, filter)
}

/// `holders_report` of an inventory taken already (`look`).
pub fn holders_report_in(
    inv: Inventory,
    sel: &Selection,
    all: bool,
    filter: &Filter,
) -> Result<HoldersReport, GpuError> {
    let filter = filter.resolve()?;
    check_selection(sel, &inv.gpus)?;
    let mut holders = inv.holders(sel, all);
    holders.retain(|h| filter.matches(h));
    Ok(HoldersReport {
        holders,
        unreadable: inv.unreadable,
        unread: crate::gpu::unread(&inv.gpus, |g| crate::inspect::selected(sel, g))
            .map(|e| e.to_string()),
    })
}

/// Every selected host's holders report, each host's part kept apart.
pub fn holders_report_per_host(
    s: &Session,
    sel: impl Into<HostSel>,
    all: bool,
    filter: &Filter,
) -> Result<PerHost<HoldersReport>, GpuError> {
    let mut parts = fan(
        s,
        &sel.into(),
        call_timeout(s),
        |x| holders_report(s, x, all, filter),
        |x| Call::HoldersReport {
            sel: x.clone(),
            all,
            filter: filter.clone(),
        },
    )?;
    for (h, r) in &mut parts {
        if let Ok(r) = r {
            name_items(h, &mut r.holders, name_holder);
        }
    }
    Ok(parts)
}

/// diagnose() here; with a filter, only of the GPUs its holders use.
fn local_diagnoses(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
) -> Result<Vec<Diagnosis>, GpuError> {
    let inv = look(s)?;
    let backend = s.backend()?;
    if let Some(why) = backend.missing_driver() {
        return Ok(diagnose::no_driver(sel, why));
    }
    check_selection(sel, &inv.gpus)?;
    let sel = narrowed(&inv, sel, &filter.resolve()?);
    let restarters = s.restarters();
    let seen = crate::process::restart::seen_before();
    let ctx = diagnose::Context {
        foreign_ns: backend.foreign_pid_namespace(),
        restarters: &restarters,
        seen: &seen,
        reach: s.reach(),
        sim: backend.kind() == "sim",
    };
    Ok(diagnose(&inv, &sel, &ctx))
}

/// The selection cut down to the GPUs that the filtered holders use (diagnose --user/--job).
fn narrowed(inv: &Inventory, sel: &Selection, filter: &Resolved) -> Selection {
    if filter.is_empty() {
        return sel.clone();
    }
    let hs = inv.holders(sel, false);
    Some(gpus_used(hs.iter().filter(|h| filter.matches(h)), sel))
}

/// The selected GPUs that `holders` use, sorted, once each: what --user, --mine and --job
/// narrow a diagnose, a wait and a clean to.
fn gpus_used<'a>(holders: impl Iterator<Item = &'a Holder>, sel: &Selection) -> Vec<i64> {
    let mut gpus: Vec<i64> = holders
        .flat_map(|h| h.gpus.iter().copied())
        .filter(|g| crate::inspect::selected(sel, *g))
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

/// Names a remote diagnosis and every record in it that carries a pid (holders, daemons,
/// footprint, launchers): each is a kill() target that must go to its own host, never here.
fn name_diagnosis(d: &mut Diagnosis, host: &str) {
    if host == LOCAL {
        return;
    }
    d.host = host.to_string();
    name_items(host, &mut d.holders, name_holder);
    name_items(host, &mut d.daemons, name_holder);
    name_items(host, &mut d.footprint, |f, h| f.host = h.to_string());
}

/// Names a holder's host, its launcher's with it.
fn name_holder(x: &mut Holder, host: &str) {
    x.host = host.to_string();
    if let Some(l) = &mut x.origin.launcher {
        l.host = host.to_string();
    }
}

/// diagnose() of every selected host (with a filter, of the GPUs its holders use), each
/// host's part kept apart.
pub fn diagnoses_per_host(
    s: &Session,
    sel: impl Into<HostSel>,
    filter: &Filter,
) -> Result<PerHost<Vec<Diagnosis>>, GpuError> {
    let mut parts = fan(
        s,
        &sel.into(),
        call_timeout(s),
        |x| local_diagnoses(s, x, filter),
        |x| Call::Diagnose {
            sel: x.clone(),
            filter: filter.clone(),
        },
    )?;
    name_parts(&mut parts, name_diagnosis);
    Ok(parts)
}

/// The GPUs of the selection that the holders `filter` picks hold now, on each host (`wait
/// --user/--mine/--job`); `None` when they hold none.
pub fn held_by(s: &Session, sel: &HostSel, filter: &Filter) -> Result<Option<HostSel>, GpuError> {
    let mut at = std::collections::BTreeMap::new();
    for (host, hs) in answered(s, holders_per_host(s, sel.clone(), false, filter)?)? {
        let gpus = gpus_used(hs.iter(), &sel.on(&host).flatten());
        if !gpus.is_empty() {
            at.insert(host, gpus);
        }
    }
    Ok((!at.is_empty()).then_some(HostSel { every: None, at }))
}

pub fn diagnoses(s: &Session, sel: impl Into<HostSel>) -> Result<Vec<Diagnosis>, GpuError> {
    diagnoses_of(s, sel, &Filter::default())
}

/// diagnose() of the selected GPUs; with a filter, only of those its holders use.
pub fn diagnoses_of(
    s: &Session,
    sel: impl Into<HostSel>,
    filter: &Filter,
) -> Result<Vec<Diagnosis>, GpuError> {
    gather(s, diagnoses_per_host(s, sel, filter)?)
}

/// How a long action (kill's grace, a wait, a clean) shows progress and learns it must stop:
/// a line on a terminal and Ctrl-C for the CLI and scripts; progress notifications and a
/// per-call flag for the MCP server.
pub struct Watch<'a> {
    pub stop: &'a AtomicBool,
    pub show: &'a mut dyn FnMut(&str),
}

/// Runs `f` with the terminal's watch: a progress line on stderr (when it is a terminal),
/// cleared afterwards, and Ctrl-C.
fn on_terminal<T>(s: &Session, f: impl FnOnce(&mut Watch) -> T) -> T {
    let mut line = Progress::new(std::io::stderr().is_terminal());
    let out = f(&mut Watch {
        stop: s.interrupted(),
        show: &mut |text| line.show(text),
    });
    line.clear();
    out
}

pub fn kill(s: &Session, targets: &[Target], opts: &KillOpts) -> KillReport {
    on_terminal(s, |w| kill_watched(s, targets, opts, w))
}

/// kill() with the caller's progress and stop flag.
pub fn kill_watched(s: &Session, targets: &[Target], opts: &KillOpts, w: &mut Watch) -> KillReport {
    let report = kill::kill_with_progress(
        targets,
        opts,
        s.protected(),
        w.stop,
        &mut |left, all, kill_in| {
            (w.show)(&match kill_in {
                Some(t) => format!(
                    "waiting for {left} of {all} to exit, KILL in {:.1} s",
                    t.as_secs_f64()
                ),
                None => format!("waiting for {left} of {all} to exit"),
            })
        },
    );
    // Later waits and diagnoses watch for the restarters it found.
    s.note_restarters(&report.restarters);
    report
}
fn wire_kill_opts(o: &KillOpts) -> protocol::KillOpts {
    protocol::KillOpts {
        signal: signal_name(o.signal).to_string(),
        grace_ms: kill::grace_ms(o.grace),
        tree: o.tree,
        dry_run: o.dry_run,
        force: o.force,
        parents: o.parents,
        user: None,
    }
}

/// `opts` bounded to `user`'s processes as this machine knows that user: every process the
/// kill signals (targets, trees, groups, parents) is theirs, or left alone and said.
pub fn bounded_to(
    opts: &KillOpts,
    user: Option<&crate::inspect::User>,
) -> Result<KillOpts, GpuError> {
    let Some(user) = user else {
        return Ok(opts.clone());
    };
    Ok(KillOpts {
        owner: Some(kill::Owner {
            uid: user.uid()?,
            said: user.flag(),
        }),
        ..opts.clone()
    })
}

/// wait_clean's options for the wire (one place for `wait_clean` and `clean`).
fn wait_wire(o: &WaitOpts) -> protocol::WaitWire {
    protocol::WaitWire {
        timeout_ms: o.timeout.as_millis() as u64,
        max_used_mib: o.max_used_mib,
        poll_ms: o.poll.as_millis() as u64,
        more: protocol::WaitMore {
            strict: o.strict,
            settle_ms: o.settle.as_millis() as u64,
            stall_ms: Some(o.stall.as_millis() as u64),
        },
    }
}

/// The deadline of a remote kill: its grace, the wait for SIGKILLed processes, and slack.
fn kill_deadline(s: &Session, o: &KillOpts) -> Option<Duration> {
    // A grace that never ends (`NEVER`) leaves the call unbounded: the agent waits for its exits.
    call_timeout(s).and_then(|t| t.checked_add(o.grace)?.checked_add(Duration::from_secs(10)))
}

/// kill() with each target on its own host (`None`: the only host there is). Identities
/// are checked on that host.
/// Kills each target on its own host; with `user`, only that user's processes (looked up on
/// each host) are signalled.
pub fn kill_routed(
    s: &Session,
    targets: &[(Option<String>, Target)],
    opts: &KillOpts,
    user: Option<&crate::inspect::User>,
) -> Result<KillReport, GpuError> {
    let names = s.host_names();
    let mut by_host: std::collections::BTreeMap<String, Vec<Target>> = Default::default();
    for (h, t) in targets {
        let host = match h {
            Some(h) => h.clone(),
            None if names.len() == 1 => names[0].clone(),
            None => {
                return Err(GpuError::Host(format!(
                    "kill({}): a bare pid with {} hosts is ambiguous; kill the holder map (it carries its host)",
                    t.pid(),
                    names.len()
                )))
            }
        };
        if !names.contains(&host) {
            return Err(host_err(HostError::Unknown {
                host,
                known: names.join(", "),
            }));
        }
        by_host.entry(host).or_default().push(*t);
    }
    kill_fanned(s, &by_host, opts, user)
}

fn kill_fanned(
    s: &Session,
    by_host: &std::collections::BTreeMap<String, Vec<Target>>,
    opts: &KillOpts,
    user: Option<&crate::inspect::User>,
) -> Result<KillReport, GpuError> {
    let Some(pool) = s.pool() else {
        let opts = bounded_to(opts, user)?;
        return Ok(kill(s, by_host.get(LOCAL).map_or(&[][..], |v| v), &opts));
    };
    let wire = protocol::KillOpts {
        user: user.cloned(),
        ..wire_kill_opts(opts)
    };
    let local_opts = match by_host.contains_key(LOCAL) {
        true => bounded_to(opts, user)?,
        false => opts.clone(),
    };
    let opts = &local_opts;
    let calls: Vec<(String, Call)> = by_host
        .iter()
        .filter(|(h, _)| h.as_str() != LOCAL)
        .map(|(h, ts)| {
            let targets = ts
                .iter()
                .map(|t| match t {
                    Target::Pid(p) => protocol::KillTarget {
                        pid: *p,
                        start: None,
                        ino: None,
                    },
                    Target::Exact(id) => protocol::KillTarget {
                        pid: id.pid,
                        start: Some(id.start),
                        ino: id.ino,
                    },
                })
                .collect();
            (
                h.clone(),
                Call::Kill {
                    targets,
                    opts: wire.clone(),
                },
            )
        })
        .collect();
    let local = by_host.get(LOCAL);
    let (mine, theirs) = std::thread::scope(|sc| {
        let mine = local.map(|ts| sc.spawn(move || kill(s, ts, opts)));
        let theirs = pool.call_many(calls.clone(), kill_deadline(s, opts), s.interrupted());
        (mine.map(|h| h.join()), theirs)
    });
    let mut parts: PerHost<KillReport> = Vec::new();
    if let Some(r) = mine {
        parts.push((
            LOCAL.to_string(),
            r.map_err(|_| Failure::Gpu(GpuError::Host("the local kill panicked".into()))),
        ));
    }
    let skip = skip_unreachable(s);
    for ((h, _), r) in calls.into_iter().zip(theirs) {
        // A host skipped for being unreachable still answers for its targets: each is
        // `skipped` in the report, with why, not left out of it.
        let r = match r {
            Err(e) if skip && e.unreachable() => {
                if s.note_skipped(&h) {
                    crate::errln!("warning: skipping {e}");
                }
                let targets = by_host.get(&h).map_or(&[][..], Vec::as_slice);
                Ok(unreachable_report(&h, &e, targets, opts.dry_run))
            }
            r => r,
        };
        parts.push((h, r.map_err(Failure::Host)));
    }
    Ok(merge_kills(answered(s, parts)?, opts.dry_run))
}

/// The report of a host that could not be reached: every target skipped, with what ssh (or
/// the agent) said.
fn unreachable_report(host: &str, e: &HostError, targets: &[Target], dry_run: bool) -> KillReport {
    let reason = format!("host {host} unreachable: {}", e.detail());
    KillReport {
        dry_run,
        skipped: targets
            .iter()
            .map(|t| Skipped {
                pid: t.pid().into(),
                reason: reason.clone(),
            })
            .collect(),
        ..KillReport::default()
    }
}

/// One report from each host's: the union of the lists, each host's own under `by_host`.
pub fn merge_kills(parts: Vec<(String, KillReport)>, dry_run: bool) -> KillReport {
    if let [(h, _)] = parts.as_slice() {
        if h == LOCAL {
            return parts.into_iter().next().map(|(_, r)| r).unwrap_or_default();
        }
    }
    let mut all = KillReport {
        dry_run,
        ..KillReport::default()
    };
    for (h, r) in parts {
        all.signalled.extend(&r.signalled);
        all.would_signal.extend(&r.would_signal);
        all.targets.extend(r.targets.iter().cloned());
        all.killed_at_once.extend(r.killed_at_once.iter().cloned());
        all.stuck.extend(r.stuck.iter().cloned());
        all.restarters.extend(r.restarters.iter().cloned());
        all.interrupted |= r.interrupted;
        all.exited.extend(&r.exited);
        all.survivors.extend(&r.survivors);
        all.skipped.extend(r.skipped.iter().cloned());
        all.errors.extend(r.errors.iter().cloned());
        all.elapsed_ms = all.elapsed_ms.max(r.elapsed_ms);
        all.by_host.insert(h, r);
    }
    all
}

fn local_kill_holders(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    opts: &KillOpts,
) -> Result<KillReport, GpuError> {
    on_terminal(s, |w| kill_holders_watched(s, sel, filter, opts, w))
}

/// How a skipped protected daemon's reason says what would stop it: the command line's flag
/// (the one-shots, here or through an agent); MCP, which never stops one, replaces it.
pub const FORCE_HINT: &str = "--force stops it";

/// Stops every compute holder of the selection (narrowed by `filter`) here, each pinned by
/// its identity; the report says which GPUs each held. A systemd unit's main process is left
/// alone unless `force`: systemd would only restart it. With `force`, the protected daemons
/// of the selection are stopped too, never mere observers. Without it,
/// those that hold a GPU (driver-listed or mapping a node: what keeps memory used) are listed
/// as skipped with the flag that stops them, so that `kill --gpu N` on a GPU only a daemon
/// holds does not read as a success that signalled nobody; a daemon that only has the nodes
/// open (nvidia-persistenced on every GPU node) holds nothing and is not news. With the
/// caller's progress and stop flag.
pub fn kill_holders_watched(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    opts: &KillOpts,
    w: &mut Watch,
) -> Result<KillReport, GpuError> {
    let mut hs = local_holders(s, sel, true, filter)?;
    hs.retain(|h| h.is_compute() || h.protected);
    // The user filter bounds every process signalled, not only the holders it picked: their
    // trees, groups and parents are that user's or left alone (read on this host, as the
    // holders were).
    let bounded;
    let opts = match (&filter.user, filter.resolve()?.uid) {
        (Some(user), Some(uid)) => {
            bounded = KillOpts {
                owner: Some(kill::Owner {
                    uid,
                    said: user.flag(),
                }),
                ..opts.clone()
            };
            &bounded
        }
        _ => opts,
    };
    let (daemons, hs): (Vec<Holder>, Vec<Holder>) =
        hs.into_iter().partition(|h| h.protected && !opts.force);
    let (units, hs): (Vec<Holder>, Vec<Holder>) = hs
        .into_iter()
        .partition(|h| h.origin.service_main && h.origin.job.is_none() && !opts.force);
    let opts = KillOpts {
        why: hs.iter().map(|h| (h.pid as i32, holder_why(h))).collect(),
        ..opts.clone()
    };
    let mut report = kill_watched(s, &holder_targets(&hs), &opts, w);
    let holding = |h: &Holder| h.mem > 0 || h.evidence.iter().any(|e| e.holds_memory());
    for h in daemons.into_iter().filter(holding) {
        report.skipped.push(Skipped {
            pid: h.pid,
            reason: format!(
                "{} is a protected GPU daemon ({} MiB on GPU {}): left alone; stop its service, or {FORCE_HINT}",
                h.name,
                h.mem_mib,
                h.gpus
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        });
    }
    for t in &mut report.targets {
        if let Some(h) = hs.iter().find(|h| h.pid == t.pid) {
            t.gpus.clone_from(&h.gpus);
        }
    }
    for h in units {
        let unit = h.origin.service.as_deref().unwrap_or("its unit");
        report.skipped.push(Skipped {
            pid: h.pid,
            reason: format!(
                "main process of systemd unit {unit}, which would restart it: {} (or --force)",
                s.reach().there(&format!("systemctl stop {unit}"))
            ),
        });
    }
    Ok(report)
}

/// Why the audit journal says a holder was stopped: "holder of GPU 0,1 (compute, 4096 MiB)".
pub fn holder_why(h: &Holder) -> String {
    let gpus: Vec<String> = h.gpus.iter().map(i64::to_string).collect();
    format!(
        "holder of GPU {} ({}, {} MiB, seen by {})",
        gpus.join(","),
        h.role,
        h.mem_mib,
        crate::inspect::kinds::Evidence::joined(&h.evidence)
    )
}

/// `local_kill_holders` on every selected host at once, each host's report kept apart.
pub fn kill_holders_per_host(
    s: &Session,
    sel: impl Into<HostSel>,
    filter: &Filter,
    opts: &KillOpts,
) -> Result<PerHost<KillReport>, GpuError> {
    let wire = wire_kill_opts(opts);
    fan(
        s,
        &sel.into(),
        kill_deadline(s, opts),
        |x| local_kill_holders(s, x, filter, opts),
        |x| Call::KillHolders {
            sel: x.clone(),
            filter: filter.clone(),
            opts: wire.clone(),
        },
    )
}

pub fn kill_holders(
    s: &Session,
    sel: impl Into<HostSel>,
    filter: &Filter,
    opts: &KillOpts,
) -> Result<KillReport, GpuError> {
    let parts = kill_holders_per_host(s, sel, filter, opts)?;
    Ok(merge_kills(answered(s, parts)?, opts.dry_run))
}

/// Holders as kill targets, each pinned by its identity.
pub fn holder_targets(holders: &[Holder]) -> Vec<Target> {
    holders
        .iter()
        .map(|h| {
            Target::Exact(crate::process::Identity {
                pid: h.pid as i32,
                start: h.start as u64,
                ino: h.pidfs_ino.map(|i| i as u64),
            })
        })
        .collect()
}

fn wait_deadline(s: &Session, o: &WaitOpts) -> Option<Duration> {
    call_timeout(s).map(|t| t + o.timeout)
}

/// wait_clean on every selected host at once: clean when all are.
pub fn wait_clean(
    s: &Session,
    sel: impl Into<HostSel>,
    opts: &WaitOpts,
) -> Result<WaitOutcome, GpuError> {
    wait_hosts(s, &sel.into(), opts, false)
}

/// wait_clean with its progress line but no log at the timeout, for commands that report
/// what is left themselves.
pub fn wait_quietly(
    s: &Session,
    sel: impl Into<HostSel>,
    opts: &WaitOpts,
) -> Result<WaitOutcome, GpuError> {
    wait_hosts(s, &sel.into(), opts, true)
}

fn wait_hosts(
    s: &Session,
    sel: &HostSel,
    opts: &WaitOpts,
    quiet: bool,
) -> Result<WaitOutcome, GpuError> {
    let parts = fan(
        s,
        sel,
        wait_deadline(s, opts),
        |x| match quiet {
            true => local_wait_quietly(s, x, opts),
            false => local_wait_clean(s, x, opts),
        },
        |x| Call::WaitClean {
            sel: x.clone(),
            wait: wait_wire(opts),
        },
    )?;
    let outcomes = answered(s, parts)?;
    let remote_dirty: Vec<&str> = outcomes
        .iter()
        .filter(|(h, o)| h != LOCAL && !o.is_clean())
        .map(|(h, _)| h.as_str())
        .collect();
    if !remote_dirty.is_empty() && !opts.timeout.is_zero() && !quiet {
        crate::errln!(
            "warning: not clean after {:.1}s on {}",
            opts.timeout.as_secs_f64(),
            remote_dirty.join(", ")
        );
    }
    Ok(combine(outcomes.into_iter().map(|(_, o)| o)))
}

/// All hosts' outcomes as one: clean when every host is; an interrupt wins; else the first
/// host's reason for not being clean.
fn combine(outcomes: impl Iterator<Item = WaitOutcome>) -> WaitOutcome {
    let mut all = WaitOutcome::Clean;
    for o in outcomes {
        match o {
            WaitOutcome::Interrupted => return WaitOutcome::Interrupted,
            WaitOutcome::Clean => {}
            other if all.is_clean() => all = other,
            _ => {}
        }
    }
    all
}

fn local_wait_clean(
    s: &Session,
    sel: &Selection,
    opts: &WaitOpts,
) -> Result<WaitOutcome, GpuError> {
    let outcome = local_wait_quietly(s, sel, opts)?;
    let Some(why) = why_not_clean(&outcome, opts) else {
        return Ok(outcome);
    };
    crate::errln!("warning: GPUs {why}:");
    if let Ok(ds) = local_diagnoses(s, sel, &Filter::default()) {
        for d in ds.iter().filter(|d| !d.is_clean_under(&opts.demand())) {
            crate::errln!("  {}", describe_diagnosis(d));
        }
    }
    Ok(outcome)
}

/// Why an outcome is not clean, for a warning; `None` when there is nothing to say (clean,
/// interrupted, or a zero-timeout question).
pub fn why_not_clean(outcome: &WaitOutcome, opts: &WaitOpts) -> Option<String> {
    Some(match outcome {
        WaitOutcome::TimedOut if !opts.timeout.is_zero() => {
            format!("not clean after {:.1}s", opts.timeout.as_secs_f64())
        }
        WaitOutcome::Stalled => format!(
            "not clean: nothing holds the memory left and it has not moved for {:.1}s, so waiting longer cannot help",
            opts.stall.as_secs_f64()
        ),
        WaitOutcome::Respawned(r) => format!("not clean: {}", r.restarted()),
        WaitOutcome::Unsettled => format!(
            "not clean: it read clean, then something came back within the {:.1}s settle time",
            opts.settle.as_secs_f64()
        ),
        _ => return None,
    })
}
/// "GPU 2 [daemon] …", one line of a warning.
pub fn describe_diagnosis(d: &Diagnosis) -> String {
    match d.gpu {
        Some(g) => format!("GPU {g} [{}] {}", d.verdict, d.advice),
        None => format!("[{}] {}", d.verdict, d.advice),
    }
}

/// One line of live progress on a terminal's stderr, rewritten in place.
struct Progress {
    tty: bool,
    shown: bool,
}

impl Progress {
    fn new(tty: bool) -> Progress {
        Progress { tty, shown: false }
    }

    fn show(&mut self, text: &str) {
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{text}");
            let _ = err.flush();
            self.shown = true;
        }
    }

    fn clear(&mut self) {
        if self.shown {
            crate::err!("\r\x1b[2K");
            self.shown = false;
        }
    }
}

fn local_wait_quietly(
    s: &Session,
    sel: &Selection,
    opts: &WaitOpts,
) -> Result<WaitOutcome, GpuError> {
    on_terminal(s, |w| wait_watched(s, sel, opts, w))
}

/// wait_clean here with the caller's progress and stop flag.
pub fn wait_watched(
    s: &Session,
    sel: &Selection,
    opts: &WaitOpts,
    w: &mut Watch,
) -> Result<WaitOutcome, GpuError> {
    let of = opts.timeout.as_secs_f64();
    // The restarters this session's kills found: a holder they start again ends the wait.
    let mut opts = opts.clone();
    opts.restarters.extend(s.restarters());
    let outcome = wait::wait_clean(
        s.backend()?,
        sel,
        &opts,
        s.protected(),
        w.stop,
        |dirty: &Dirty, elapsed: Duration| {
            (w.show)(&format!(
                "waiting: {}, {:.1} s of {of:.0} s",
                describe_dirty(dirty),
                elapsed.as_secs_f64()
            ))
        },
    );
    match &outcome {
        Ok(WaitOutcome::NoDriver(_)) => s.warn_no_driver(),
        // Remembered on this machine, so a later gpuloop's diagnose still names it.
        Ok(WaitOutcome::Respawned(r)) => crate::process::restart::remember(r),
        _ => {}
    }
    outcome
}

fn describe_dirty(dirty: &Dirty) -> String {
    dirty
        .iter()
        .map(|(g, mib, n)| match n {
            0 => format!("GPU {g} {mib} MiB"),
            n => format!("GPU {g} {mib} MiB, {n} holder(s)"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `gpuloop clean` and `cleanup`'s first rung: holders → kill → wait_clean → diagnose.
/// Its JSON (`clean --json`, the MCP tool `clean`, the agent's reply) is
/// `{clean, kill, wait_ms, gpus}`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CleanReport {
    pub clean: bool,
    pub kill: KillReport,
    /// Not in the JSON: read back as clean or not from `clean`.
    #[serde(skip, default = "not_clean")]
    pub outcome: WaitOutcome,
    /// The whole wait after the kill, the settle time included.
    pub wait_ms: i64,
    /// When clean: how long the memory took to come back after the kill. The wait then
    /// watched for `settle_ms` more (it ends at the first look past that, within one poll),
    /// so this is `wait_ms - settle_ms`, to one poll interval.
    #[serde(default)]
    pub released_ms: Option<i64>,
    /// How long it was watched after it read clean (`--settle`).
    #[serde(default)]
    pub settle_ms: i64,
    /// What diagnose() says of each selected GPU afterwards.
    #[serde(rename = "gpus")]
    pub after: Vec<Diagnosis>,
}

fn not_clean() -> WaitOutcome {
    WaitOutcome::TimedOut
}

fn local_clean(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    kill_opts: &KillOpts,
    wait_opts: &WaitOpts,
) -> Result<CleanReport, GpuError> {
    on_terminal(s, |w| {
        clean_watched(s, sel, filter, kill_opts, wait_opts, w)
    })
}

/// clean here with the caller's progress and stop flag. With a filter, its holders are
/// stopped; with a job, only the GPUs its holders used are verified.
pub fn clean_watched(
    s: &Session,
    sel: &Selection,
    filter: &Filter,
    kill_opts: &KillOpts,
    wait_opts: &WaitOpts,
    w: &mut Watch,
) -> Result<CleanReport, GpuError> {
    if let Some(why) = s.backend()?.missing_driver() {
        return Err(GpuError::NoDriver(why.to_string()));
    }
    // Like diagnose and wait: with --user, --mine or --job, the GPUs verified are those the
    // filtered holders use (what else holds them is reported, and keeps them not clean).
    let sel = &narrowed(&inventory(s, sel)?, sel, &filter.resolve()?);
    // With no KILL ever, the wait below is the one that waits for them, until its timeout.
    let kill_opts = &KillOpts {
        wait_forever: false,
        ..kill_opts.clone()
    };
    let kill = kill_holders_watched(s, sel, filter, kill_opts, w)?;
    let waited = std::time::Instant::now();
    let mut wait_opts = wait_opts.clone();
    // What survived the kill may still be on its way out: no early stop while it lives.
    wait_opts
        .exiting
        .extend(kill.survivors.iter().map(|&p| p as i32));
    // Interrupted during the grace: stop here, the caller reports what was signalled.
    // Otherwise what is left is in the report: no warning that says it a second time.
    let outcome = if kill.interrupted {
        WaitOutcome::Interrupted
    } else {
        wait_watched(s, sel, &wait_opts, w)?
    };
    let wait_ms = waited.elapsed().as_millis() as i64;
    let after = local_diagnoses(s, sel, &Filter::default())?;
    let settle_ms = wait_opts.settle.as_millis() as i64;
    Ok(CleanReport {
        clean: outcome.is_clean(),
        released_ms: outcome.is_clean().then(|| (wait_ms - settle_ms).max(0)),
        settle_ms,
        kill,
        outcome,
        wait_ms,
        after,
    })
}
/// clean on every selected host at once, each host's report kept apart.
pub fn clean_per_host(
    s: &Session,
    sel: impl Into<HostSel>,
    filter: &Filter,
    kill_opts: &KillOpts,
    wait_opts: &WaitOpts,
) -> Result<PerHost<CleanReport>, GpuError> {
    let wire = wire_kill_opts(kill_opts);
    let deadline = wait_deadline(s, wait_opts).and_then(|d| {
        d.checked_add(kill_opts.grace)?
            .checked_add(Duration::from_secs(10))
    });
    let mut parts = fan(
        s,
        &sel.into(),
        deadline,
        |x| local_clean(s, x, filter, kill_opts, wait_opts),
        |x| Call::Clean {
            sel: x.clone(),
            filter: filter.clone(),
            kill: wire.clone(),
            wait: wait_wire(wait_opts),
        },
    )?;
    for (h, r) in &mut parts {
        if let (Ok(c), false) = (r, h == LOCAL) {
            if c.clean {
                c.outcome = WaitOutcome::Clean;
            }
            c.after.iter_mut().for_each(|d| name_diagnosis(d, h));
        }
    }
    Ok(parts)
}

pub fn clean(
    s: &Session,
    sel: impl Into<HostSel>,
    filter: &Filter,
    kill_opts: &KillOpts,
    wait_opts: &WaitOpts,
) -> Result<CleanReport, GpuError> {
    let parts = answered(s, clean_per_host(s, sel, filter, kill_opts, wait_opts)?)?;
    Ok(merge_clean(parts, kill_opts.dry_run))
}

/// One clean report from each host's (all clean only if every one is).
pub fn merge_clean(parts: Vec<(String, CleanReport)>, dry_run: bool) -> CleanReport {
    let kill = merge_kills(
        parts
            .iter()
            .map(|(h, c)| (h.clone(), c.kill.clone()))
            .collect(),
        dry_run,
    );
    let outcome = combine(parts.iter().map(|(_, c)| c.outcome.clone()));
    let wait_ms = parts.iter().map(|(_, c)| c.wait_ms).max().unwrap_or(0);
    let released_ms = parts
        .iter()
        .map(|(_, c)| c.released_ms)
        .try_fold(0, |most, r| r.map(|r| most.max(r)));
    let settle_ms = parts.iter().map(|(_, c)| c.settle_ms).max().unwrap_or(0);
    CleanReport {
        kill,
        clean: outcome.is_clean(),
        released_ms: released_ms.filter(|_| outcome.is_clean()),
        settle_ms,
        outcome,
        wait_ms,
        after: parts.into_iter().flat_map(|(_, c)| c.after).collect(),
    }
}

/// One host of the set, as `hosts()` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct HostInfo {
    pub name: String,
    pub local: bool,
    pub reachable: bool,
    /// The agent's host name, gpuloop version and GPU count (from its hello).
    pub hostname: Option<String>,
    pub version: Option<String>,
    pub gpus: Option<i64>,
    pub error: Option<String>,
}

/// The host set, connecting to it if not done yet.
pub fn hosts(s: &Session) -> Vec<HostInfo> {
    let names = s.host_names();
    let pool = s.pool();
    names
        .into_iter()
        .map(|name| {
            let hello = match (&pool, name.as_str()) {
                (_, LOCAL) | (None, _) => Ok(None),
                (Some(p), h) => p.hello(h),
            };
            let local = name == LOCAL;
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

/// The remote host a job should run on: `None` for this machine, else a host of the set
/// and its pool.
fn job_host<'a>(
    s: &'a Session,
    host: Option<&'a str>,
) -> Result<Option<(&'a str, &'a Pool)>, RunError> {
    let host = match host {
        None | Some(LOCAL) => return Ok(None),
        Some(h) => h,
    };
    let remote_err = |why: String| RunError::Remote {
        host: host.to_string(),
        why,
    };
    let names = s.host_names();
    if !names.iter().any(|n| n == host) {
        return Err(remote_err(format!(
            "not in the host set ({})",
            names.join(", ")
        )));
    }
    let pool = s.pool().ok_or_else(|| remote_err("no host set".into()))?;
    Ok(Some((host, pool)))
}

/// A job as it crosses the wire to an agent.
fn run_call(cmd: &Cmd, opts: &JobOpts) -> protocol::RunCall {
    let (shell, argv) = match cmd {
        Cmd::Shell(l) => (Some(l.clone()), None),
        Cmd::Argv(a) => (None, Some(a.clone())),
    };
    protocol::RunCall {
        shell,
        argv,
        timeout_ms: opts.timeout.map(|t| t.as_millis() as u64),
        cwd: opts.cwd.as_ref().map(|p| p.display().to_string()),
        env: opts.env.clone(),
        grace_ms: kill::grace_ms(opts.grace),
        echo: opts.echo,
        keep_children: opts.keep_children,
    }
}

/// A failed call to a job's host, as a job error.
fn remote_run_err(host: &str, e: HostError) -> RunError {
    match e {
        HostError::Interrupted => RunError::Interrupted,
        e => RunError::Remote {
            host: host.to_string(),
            why: e.to_string(),
        },
    }
}

/// Runs a job on a host of the set (`None` or `"local"`: here, streamed as it runs; a
/// remote job's output comes back prefixed with its host's name).
pub fn run(s: &Session, host: Option<&str>, cmd: &Cmd, opts: JobOpts) -> Result<Outcome, RunError> {
    let Some((host, pool)) = job_host(s, host)? else {
        return runner::run(cmd, opts, s.interrupted());
    };
    let call = Call::Run(run_call(cmd, &opts));
    // No deadline unless the job has one: a lost link still ends the call at once.
    let deadline = opts.timeout.and_then(|t| {
        t.checked_add(opts.grace)?
            .checked_add(pool.config.call_timeout)
    });
    pool.call(host, call, deadline, s.interrupted())
        .map_err(|e| remote_run_err(host, e))
}

/// A job started by spawn(): here, or on a host of the set under its agent (which stops
/// it, whole tree, when the connection ends). Both answer the same questions.
pub enum Spawned {
    Local(Job),
    Remote(RemoteJob),
}

/// A background job on another host, known to its agent by the spawn request's id.
pub struct RemoteJob {
    session: Arc<Session>,
    host: String,
    job: u64,
    pid: i32,
    cmd: String,
    timeout: Option<Duration>,
    grace: Duration,
    /// Its outcome, once seen (the agent's answer does not change after).
    outcome: Mutex<Option<Outcome>>,
}

/// What spawn() gives a script: the job, and whether waiting throws on failure (`check`).
#[derive(Clone)]
pub struct JobHandle {
    pub job: Arc<Spawned>,
    pub check: bool,
}

impl std::fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.job.fmt(f)
    }
}

impl std::fmt::Debug for Spawned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spawned::Local(j) => j.fmt(f),
            Spawned::Remote(r) => write!(f, "Job(pid {} on {}: {})", r.pid, r.host, r.cmd),
        }
    }
}

/// How long one remote wait asks the agent to wait: a wait without end is a series of
/// these, so a host that stops answering is noticed within the call deadline.
const WAIT_SLICE: Duration = Duration::from_secs(10);
/// Never set: a stop must reach the agent even after Ctrl-C.
static NEVER: AtomicBool = AtomicBool::new(false);

/// Starts a job in the background, here or on a host of the set.
pub fn spawn(
    s: &Arc<Session>,
    host: Option<&str>,
    cmd: &Cmd,
    opts: JobOpts,
) -> Result<Spawned, RunError> {
    let Some((host, pool)) = job_host(s, host)? else {
        return Job::spawn(cmd, opts).map(Spawned::Local);
    };
    let st: protocol::JobState = pool
        .call(
            host,
            Call::Spawn(run_call(cmd, &opts)),
            Some(pool.config.call_timeout),
            s.interrupted(),
        )
        .map_err(|e| remote_run_err(host, e))?;
    Ok(Spawned::Remote(RemoteJob {
        session: s.clone(),
        host: host.to_string(),
        job: st.job,
        pid: st.pid as i32,
        cmd: cmd.display(),
        timeout: opts.timeout,
        grace: opts.grace,
        outcome: Mutex::new(None),
    }))
}

impl Spawned {
    pub fn pid(&self) -> i32 {
        match self {
            Spawned::Local(j) => j.pid(),
            Spawned::Remote(r) => r.pid,
        }
    }

    /// Where it runs: `local`, or the host's name.
    pub fn host(&self) -> &str {
        match self {
            Spawned::Local(_) => LOCAL,
            Spawned::Remote(r) => &r.host,
        }
    }

    pub fn command(&self) -> &str {
        match self {
            Spawned::Local(j) => j.command(),
            Spawned::Remote(r) => &r.cmd,
        }
    }

    pub fn timeout(&self) -> Option<Duration> {
        match self {
            Spawned::Local(j) => j.timeout(),
            Spawned::Remote(r) => r.timeout,
        }
    }

    /// True until the job's main process has exited.
    pub fn running(&self) -> Result<bool, RunError> {
        let r = match self {
            Spawned::Local(j) => return Ok(j.running()),
            Spawned::Remote(r) => r,
        };
        if r.done().is_some() {
            return Ok(false);
        }
        let st = r.call(Call::JobStatus { job: r.job }, Duration::ZERO, &NEVER)?;
        Ok(st.running)
    }

    /// Waits for the outcome, up to `timeout` (forever with `None`), waking on Ctrl-C.
    pub fn wait(
        &self,
        timeout: Option<Duration>,
        interrupted: &'static AtomicBool,
    ) -> Result<Waited, RunError> {
        let r = match self {
            Spawned::Local(j) => return Ok(j.wait(timeout, interrupted)),
            Spawned::Remote(r) => r,
        };
        let end = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(o) = r.done() {
                return Ok(Waited::Done(o));
            }
            let slice = match end {
                Some(e) => e.saturating_duration_since(std::time::Instant::now()),
                None => WAIT_SLICE,
            }
            .min(WAIT_SLICE);
            let st = match r.call(
                Call::JobWait {
                    job: r.job,
                    timeout_ms: slice.as_millis() as u64,
                },
                slice,
                interrupted,
            ) {
                Err(RunError::Interrupted) => return Ok(Waited::Interrupted),
                other => other?,
            };
            if let Some(o) = r.record(st) {
                return Ok(Waited::Done(o));
            }
            if end.is_some_and(|e| std::time::Instant::now() >= e) {
                return Ok(Waited::Running);
            }
        }
    }

    /// Stops the whole tree (`signal`, the grace, SIGKILL) and returns the outcome; `None`
    /// if the main process outlived SIGKILL. On a finished job it stops what it left behind.
    pub fn stop(
        &self,
        signal: Signal,
        grace: Option<Duration>,
    ) -> Result<Option<Outcome>, RunError> {
        let r = match self {
            Spawned::Local(j) => return Ok(j.stop(signal, grace)),
            Spawned::Remote(r) => r,
        };
        let grace = grace.unwrap_or(r.grace);
        let st = r.call(
            Call::JobKill {
                job: r.job,
                signal: signal_name(signal).to_string(),
                grace_ms: Some(kill::grace_ms(grace)),
            },
            // The stop's grace, the wait after SIGKILL and the output's drain.
            grace.saturating_add(Duration::from_secs(10)),
            &NEVER,
        )?;
        Ok(r.record(st))
    }
}

impl RemoteJob {
    fn done(&self) -> Option<Outcome> {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Keeps the outcome the agent sent, if any, and prints the rest of the job's output.
    fn record(&self, st: protocol::JobState) -> Option<Outcome> {
        let o = st.outcome?;
        if let Some(pool) = self.session.pool() {
            pool.flush_output(&self.host, self.job);
        }
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(o.clone());
        Some(o)
    }

    /// A call about this job: `takes` is how long the agent may take by design; the host's
    /// call timeout comes on top.
    fn call(
        &self,
        call: Call,
        takes: Duration,
        interrupted: &'static AtomicBool,
    ) -> Result<protocol::JobState, RunError> {
        let pool = self.session.pool().ok_or_else(|| RunError::Remote {
            host: self.host.clone(),
            why: "no host set".into(),
        })?;
        pool.call(
            &self.host,
            call,
            // A stop that never KILLs (`grace: "inf"`) waits for the tree: no deadline.
            takes.checked_add(pool.config.call_timeout),
            interrupted,
        )
        .map_err(|e| remote_run_err(&self.host, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// Every JSON object under `v` that carries a pid, with the path to it.
    fn pid_records<'a>(v: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
        match v {
            Value::Object(m) => {
                if m.contains_key("pid") {
                    out.push((path.clone(), v));
                }
                for (k, x) in m {
                    pid_records(x, format!("{path}.{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    pid_records(x, format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }

    /// The bug: a remote diagnosis named its holders' host but left its daemons (and its
    /// footprint, and the holders' launchers) as "local", so `kill(d.daemons, #{force:
    /// true})` went to this machine. Every record in it that carries a pid names the host.
    #[test]
    fn every_record_with_a_pid_in_a_remote_diagnosis_names_its_host() {
        let holder = |pid: i64, role: &str| {
            json!({
                "pid": pid, "ppid": 1, "pgid": pid, "sid": pid, "start": 7, "pidfs_ino": null,
                "uid": 0, "user": "root", "name": "python3", "cmdline": "python3",
                "state": "sleeping", "role": role, "gpus": [0], "mem": 0, "mem_mib": 0,
                "evidence": ["driver"], "protected": role == "daemon", "host": "local",
                "launcher": {"pid": pid - 1, "start": 6, "name": "torchrun", "host": "local"}
            })
        };
        let mut d: Diagnosis = serde_json::from_value(json!({
            "gpu": 0, "mem_used": 0, "mem_used_mib": 0,
            "holders": [holder(100, "compute")],
            "daemons": [holder(200, "daemon")],
            "footprint": [{"pid": 300, "name": "python3", "gpus": [1], "host": "local"}],
            "ghost_pids": [], "verdict": "held", "advice": "", "host": "local"
        }))
        .unwrap();
        name_diagnosis(&mut d, "gpu02");
        let v = serde_json::to_value(&d).unwrap();
        let mut found = Vec::new();
        pid_records(&v, "d".into(), &mut found);
        assert_eq!(found.len(), 5, "{v}");
        for (path, r) in found {
            assert_eq!(r["host"], "gpu02", "{path} is not named: {r}");
        }
        assert_eq!(v["host"], "gpu02");
    }
}
