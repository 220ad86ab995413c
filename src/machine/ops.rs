//! The read-only operations (the GPUs, their holders, diagnose()), and the one place that
//! answers a call naming any operation.

use super::kill::{bounded_to, Kill, KillHolders};
use super::wait::{Clean, WaitClean};
use super::{ActionError, Ask, Local, Machine, Op, Received};
use crate::gpu::{Backend, Gpu, GpuError};
use crate::hosts::protocol::{self, Body, Call, ErrorKind};
use crate::inspect::diagnose::{self, diagnose, Diagnosis};
use crate::inspect::holders::{Holder, Inventory};
use crate::inspect::reset::Readiness;
use crate::inspect::{check_selection, Filter, Resolved, Selection};
use crate::journal::{self, Record};
use crate::process::kill::{KillOpts, Target};
use crate::session::Session;
use serde::{Deserialize, Serialize};

/// Answers on this machine a call that names an operation, as the agent's reply (a usage
/// mistake stays one: the client exits 2, as it would for the same mistake here); `None` for
/// any other call (a job's, the connection's), which the agent's job table answers.
pub(crate) fn answer(call: &Call, m: &mut Local) -> Option<Body> {
    fn failed(e: ActionError) -> Body {
        match e {
            // The client names the host: "host gpu02: no user \"alice\" there".
            ActionError::Gpu(GpuError::NoUser { user }) => {
                Body::error(ErrorKind::Usage, format!("no user {user:?} there"))
            }
            e if e.is_usage() => Body::error(ErrorKind::Usage, e.to_string()),
            e => Body::error(ErrorKind::Failed, e.to_string()),
        }
    }
    fn reply<O: Op>(m: &mut Local, op: &O) -> Body {
        m.ask(op).map_or_else(failed, |v| Body::ok(&v))
    }
    // The wire's kill options as this machine's, bounded to the user they name (looked up
    // here: uids differ between machines) whatever the call; an unknown signal refuses it.
    let kill_opts = |o: &protocol::KillOpts| {
        let opts = KillOpts::try_from(o)
            .map_err(|why| Body::error(ErrorKind::BadParams, why.to_string()))?;
        bounded_to(&opts, o.user.as_ref(), None).map_err(failed)
    };
    let holders = |sel: &Selection, all: &bool, filter: &Filter| Holders {
        sel: sel.clone(),
        all: *all,
        filter: filter.clone(),
    };
    Some(match call {
        Call::Gpus => reply(m, &Gpus),
        Call::Holders { sel, all, filter } => reply(m, &HolderList(holders(sel, all, filter))),
        Call::HoldersReport { sel, all, filter } => reply(m, &holders(sel, all, filter)),
        Call::Diagnose { sel, filter } => {
            let op = Diagnose {
                sel: sel.clone(),
                filter: filter.clone(),
            };
            reply(m, &op)
        }
        Call::Kill { targets, opts } => match kill_opts(opts) {
            Ok(o) => {
                let op = Kill {
                    targets: targets.iter().map(Target::from).collect(),
                    opts: o,
                    // The user is bounded by `kill_opts` already; the pod and container are
                    // found among this machine's processes.
                    bound: crate::inspect::Bound {
                        user: None,
                        pod: opts.pod.clone(),
                        container: opts.container.clone(),
                    },
                };
                reply(m, &op)
            }
            Err(b) => b,
        },
        Call::KillHolders { sel, filter, opts } => match kill_opts(opts) {
            Ok(opts) => {
                let op = KillHolders {
                    sel: sel.clone(),
                    filter: filter.clone(),
                    opts,
                };
                reply(m, &op)
            }
            Err(b) => b,
        },
        Call::WaitClean { sel, filter, wait } => {
            // The client says what it waited for: a warning here would reach it as well.
            let op = WaitClean {
                sel: sel.clone(),
                opts: (*wait).into(),
                quiet: true,
                filter: filter.clone(),
            };
            reply(m, &op)
        }
        Call::Clean {
            sel,
            filter,
            kill,
            wait,
        } => match kill_opts(kill) {
            Ok(kill) => {
                let op = Clean {
                    sel: sel.clone(),
                    filter: filter.clone(),
                    kill,
                    wait: (*wait).into(),
                };
                reply(m, &op)
            }
            Err(b) => b,
        },
        Call::Reset {
            gpus,
            dry_run,
            force,
            grace_ms,
            timeout_ms,
            mig,
        } => {
            let op = super::reset::Reset {
                gpus: gpus.clone(),
                dry_run: *dry_run,
                force: *force,
                grace: crate::process::kill::grace_of_ms(*grace_ms),
                timeout: std::time::Duration::from_millis(*timeout_ms),
                mig: mig.clone(),
            };
            reply(m, &op)
        }
        Call::Journal {
            last,
            since,
            pid,
            user,
            front_end,
        } => {
            let filter = journal::Filter {
                since: since.clone(),
                pid: *pid,
                user: user.clone(),
                front_end: *front_end,
            };
            reply(
                m,
                &Journal {
                    last: *last,
                    filter,
                },
            )
        }
        // A job's call, or the connection's: the agent's job table answers it.
        Call::Run(_)
        | Call::Cancel { .. }
        | Call::Spawn(_)
        | Call::JobWait { .. }
        | Call::JobKill { .. }
        | Call::JobStatus { .. }
        | Call::Ping
        | Call::ReachedAs { .. } => return None,
    })
}

/// Every GPU of a machine.
pub(crate) struct Gpus;

impl Ask for Gpus {
    type Reply = Vec<Gpu>;
    fn call(&self) -> Call {
        Call::Gpus
    }
}

impl Op for Gpus {
    fn here(&self, m: &mut Local) -> Result<Vec<Gpu>, ActionError> {
        m.s.warn_no_driver();
        let backend = m.s.backend()?;
        let mut gpus = backend.gpus()?;
        read_faults(m.s, backend, &mut gpus, &None);
        Ok(gpus)
    }
}

/// Gives the selected GPUs their faults: what each reports (ECC, remapped rows, retired
/// pages, the recovery action) and the kernel log's Xid events for it. Never on a polling
/// path: gpu(), `gpus` and diagnose only. A failed read leaves the facts unknown (`()`),
/// and says why under `-v`.
pub(crate) fn read_faults(s: &Session, backend: &dyn Backend, gpus: &mut [Gpu], sel: &Selection) {
    let chosen: Vec<&mut Gpu> = gpus
        .iter_mut()
        .filter(|g| crate::inspect::selected(sel, g.index))
        .collect();
    if chosen.is_empty() {
        return;
    }
    let indices: Vec<i64> = chosen.iter().map(|g| g.index).collect();
    let read = backend.faults(&indices).unwrap_or_else(|e| {
        tracing::warn!("the GPUs' fault counts could not be read: {e}");
        Vec::new()
    });
    crate::gpu::faults::attach(chosen, read, s.kernel_log());
}

/// The holders of a selection (narrowed by a filter: one owner, one Slurm job), and what
/// could not be looked at.
#[derive(Debug, Clone)]
pub(crate) struct Holders {
    pub sel: Selection,
    /// Observers too (processes that have a node open and hold nothing).
    pub all: bool,
    pub filter: Filter,
}

/// What `gpuloop holders` shows: the holders, how many processes could not be inspected
/// (other users', without root: holders among them are missing from the list, which the
/// one-shot says), and the first selected GPU the driver could not read (its holders are
/// then only those the /proc scan found: the driver's list of it is missing).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HoldersReport {
    pub holders: Vec<Holder>,
    pub unreadable: usize,
    #[serde(default)]
    pub unread: Option<String>,
}

impl Ask for Holders {
    type Reply = HoldersReport;
    fn call(&self) -> Call {
        Call::HoldersReport {
            sel: self.sel.clone(),
            all: self.all,
            filter: self.filter.clone(),
        }
    }
}

impl Op for Holders {
    fn here(&self, m: &mut Local) -> Result<HoldersReport, ActionError> {
        self.of(inventory(m.s, &self.sel)?)
    }
}

impl Holders {
    /// The report of an inventory taken already (`look`).
    pub(crate) fn of(&self, inv: Inventory) -> Result<HoldersReport, ActionError> {
        let filter = self.filter.resolve_on(&inv)?;
        self.picked(inv, &filter)
    }

    /// The report of an inventory taken already, by a filter resolved already (a clean's
    /// rounds keep the pod and the container its first look found).
    pub(crate) fn picked(
        &self,
        inv: Inventory,
        filter: &Resolved,
    ) -> Result<HoldersReport, ActionError> {
        check_selection(&self.sel, &inv.gpus)?;
        let mut holders = inv.holders(&self.sel, self.all);
        holders.retain(|h| filter.matches(h));
        // Narrowed to MIG devices: what the driver lists for each on those alone.
        if let Some(keys) = &filter.instances {
            holders = holders
                .iter()
                .map(|h| {
                    match h
                        .evidence
                        .contains(&crate::inspect::kinds::Evidence::Driver)
                    {
                        true => inv.with_mem_on_instances(h, keys),
                        false => h.clone(),
                    }
                })
                .collect();
        }
        Ok(HoldersReport {
            holders,
            unreadable: inv.unreadable,
            unread: crate::gpu::unread(&inv.gpus, |g| crate::inspect::selected(&self.sel, g))
                .map(|e| e.to_string()),
        })
    }
}

/// The older form of `holders_report` on the wire: the holders alone.
pub(crate) struct HolderList(pub Holders);

impl Ask for HolderList {
    type Reply = Vec<Holder>;
    fn call(&self) -> Call {
        Call::Holders {
            sel: self.0.sel.clone(),
            all: self.0.all,
            filter: self.0.filter.clone(),
        }
    }
}

impl Op for HolderList {
    fn here(&self, m: &mut Local) -> Result<Vec<Holder>, ActionError> {
        Ok(self.0.here(m)?.holders)
    }
}

/// diagnose() of a selection; with a filter, only of the GPUs its holders use.
#[derive(Debug, Clone)]
pub(crate) struct Diagnose {
    pub sel: Selection,
    pub filter: Filter,
}

impl Ask for Diagnose {
    type Reply = Vec<Diagnosis>;
    fn call(&self) -> Call {
        Call::Diagnose {
            sel: self.sel.clone(),
            filter: self.filter.clone(),
        }
    }
}

impl Op for Diagnose {
    fn here(&self, m: &mut Local) -> Result<Vec<Diagnosis>, ActionError> {
        let s = m.s;
        let inv = look(s)?;
        if let Some(why) = s.backend()?.missing_driver() {
            return Ok(diagnose::no_driver(&self.sel, why));
        }
        check_selection(&self.sel, &inv.gpus)?;
        diagnose_in(s, inv, &self.sel, &self.filter)
    }
}

/// The diagnosis of the selection from a look just taken (`inv`, checked against `sel`),
/// with the GPUs' faults read for it.
pub(crate) fn diagnose_in(
    s: &Session,
    mut inv: Inventory,
    sel: &Selection,
    filter: &Filter,
) -> Result<Vec<Diagnosis>, ActionError> {
    let backend = s.backend()?;
    let resolved = filter.resolve_on(&inv)?;
    let sel = narrowed(&inv, sel, &resolved);
    read_faults(s, backend, &mut inv.gpus, &sel);
    let restarters = s.restarters();
    let seen = crate::process::restart::seen_before();
    let readiness = || Readiness::look(backend, s.protected(), s.container_roots());
    let ctx = diagnose::Context {
        foreign_ns: backend.foreign_pid_namespace(),
        restarters: &restarters,
        seen: &seen,
        reach: s.reach(),
        sim: backend.kind() == crate::gpu::BackendKind::Sim,
        readiness: &readiness,
        instances: resolved.instances.as_deref(),
        unreadable: inv.unreadable,
    };
    Ok(diagnose(&inv, &sel, &ctx))
}

/// The audit journal's latest records that match (`gpuloop journal`); each machine keeps its
/// own.
#[derive(Debug, Clone)]
pub(crate) struct Journal {
    /// How many of the latest (0: all).
    pub last: usize,
    pub filter: journal::Filter,
}

/// One machine's answer to `Journal`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JournalPart {
    pub records: Vec<Record>,
    /// Lines that are not records.
    pub bad: usize,
    /// The journal file read there.
    pub path: String,
}

impl Ask for Journal {
    type Reply = JournalPart;
    fn call(&self) -> Call {
        Call::Journal {
            last: self.last,
            since: self.filter.since.clone(),
            pid: self.filter.pid,
            user: self.filter.user.clone(),
            front_end: self.filter.front_end,
        }
    }
}

impl Op for Journal {
    fn here(&self, _: &mut Local) -> Result<JournalPart, ActionError> {
        let failed = |e: journal::JournalError| ActionError::Failed(e.to_string());
        let dir = journal::dir().map_err(failed)?;
        let mut records = Vec::new();
        let found = journal::last(&dir, &self.filter, self.last, &mut |r| records.push(r))
            .map_err(failed)?;
        Ok(JournalPart {
            records,
            bad: found.bad,
            path: dir.join(journal::FILE).display().to_string(),
        })
    }
}

/// Each record names the machine that wrote it already.
impl Received for JournalPart {
    fn received_from(&mut self, _: &str) {}
}

/// One look at the driver and /proc, checked against a selection.
pub(crate) fn inventory(s: &Session, sel: &Selection) -> Result<Inventory, GpuError> {
    let inv = look(s)?;
    s.warn_no_driver();
    check_selection(sel, &inv.gpus)?;
    Ok(inv)
}

/// One look at the driver and /proc, not yet checked against a selection. The /proc scan runs
/// while the driver loads: a one-shot pays for the slower, not both. So a caller asks the
/// backend anything (even whether there is a driver) only after this.
pub(crate) fn look(s: &Session) -> Result<Inventory, GpuError> {
    Inventory::take_while_loading(
        &s.device_nodes(),
        || s.backend(),
        s.protected(),
        s.container_roots(),
    )
}

/// The selection cut down to the GPUs that the filtered holders use (diagnose --user/--job).
pub(crate) fn narrowed(inv: &Inventory, sel: &Selection, filter: &Resolved) -> Selection {
    if filter.is_empty() {
        return sel.clone();
    }
    let hs = inv.holders(sel, false);
    Some(gpus_used(hs.iter().filter(|h| filter.matches(h)), sel))
}

/// The selected GPUs that `holders` use, sorted, once each: what --user, --mine and --job
/// narrow a diagnose, a wait and a clean to.
pub(crate) fn gpus_used<'a>(
    holders: impl Iterator<Item = &'a Holder>,
    sel: &Selection,
) -> Vec<i64> {
    let mut gpus: Vec<i64> = holders
        .flat_map(|h| h.gpus.iter().copied())
        .filter(|g| crate::inspect::selected(sel, *g))
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

impl Received for Vec<Gpu> {
    fn received_from(&mut self, host: &str) {
        self.iter_mut().for_each(|g| g.host = host.to_string());
    }
}

impl Received for Vec<Holder> {
    fn received_from(&mut self, host: &str) {
        self.iter_mut().for_each(|h| h.received_from(host));
    }
}

/// A holder names its host, its launcher's with it.
impl Received for Holder {
    fn received_from(&mut self, host: &str) {
        self.host = host.to_string();
        if let Some(l) = &mut self.origin.launcher {
            l.host = host.to_string();
        }
    }
}

impl Received for HoldersReport {
    fn received_from(&mut self, host: &str) {
        self.holders.received_from(host);
    }
}

/// A diagnosis names its host, and so does every record in it that carries a pid (holders,
/// daemons, footprint, launchers): each is a kill() target.
impl Received for Diagnosis {
    fn received_from(&mut self, host: &str) {
        self.host = host.to_string();
        self.holders.received_from(host);
        self.daemons.received_from(host);
        self.footprint
            .iter_mut()
            .for_each(|f| f.host = host.to_string());
    }
}

impl Received for Vec<Diagnosis> {
    fn received_from(&mut self, host: &str) {
        self.iter_mut().for_each(|d| d.received_from(host));
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
        d.received_from("gpu02");
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
