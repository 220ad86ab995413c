//! The operations that signal: kill() of given targets, and the kill of a selection's
//! holders (what `gpuloop kill` does). Every signal goes through `process::kill`, which pins
//! each target by its identity and journals it.

use super::{ActionError, Ask, Local, Op, Received};
use crate::hosts::protocol::{self, Call};
use crate::hosts::{is_local, HostError};
use crate::inspect::holders::Holder;
use crate::inspect::holders::Inventory;
use crate::inspect::{Bound, Filter, Resolved, Selection};
use crate::process::kill::{
    self, Forcing, KillOpts, KillReport, Owner, SkipReason, Skipped, Target,
};
use std::time::Duration;

/// Signals given targets; with a bound, only that user's, pod's or container's processes
/// (read on the machine that signals: uids and containers differ between machines).
#[derive(Debug, Clone)]
pub(crate) struct Kill {
    pub targets: Vec<Target>,
    pub opts: KillOpts,
    pub bound: Bound,
}

/// A kill's grace, the wait for SIGKILLed processes, and slack: how long it takes by design.
fn kill_takes(o: &KillOpts) -> Option<Duration> {
    o.grace.checked_add(Duration::from_secs(10))
}

impl Ask for Kill {
    type Reply = KillReport;
    fn call(&self) -> Call {
        Call::Kill {
            targets: self
                .targets
                .iter()
                .map(protocol::KillTarget::from)
                .collect(),
            opts: protocol::KillOpts {
                user: self.bound.user.clone(),
                pod: self.bound.pod.clone(),
                container: self.bound.container.clone(),
                ..protocol::KillOpts::from(&self.opts)
            },
        }
    }
    fn takes(&self) -> Option<Duration> {
        kill_takes(&self.opts)
    }
}

impl Op for Kill {
    fn here(&self, m: &mut Local) -> Result<KillReport, ActionError> {
        // A pod or a container is found among this machine's GPU processes (one look).
        let within = match self.bound.pod.is_some() || self.bound.container.is_some() {
            true => crate::inspect::scope(
                self.bound.pod.as_deref(),
                self.bound.container.as_deref(),
                &super::ops::look(m.s)?.holders,
            )?,
            false => None,
        };
        let opts = bounded_to(&self.opts, self.bound.user.as_ref(), within)?;
        Ok(m.kill(&self.targets, &opts))
    }
}

/// Stops every compute holder of a selection (narrowed by a filter), each pinned by its
/// identity.
#[derive(Debug, Clone)]
pub(crate) struct KillHolders {
    pub sel: Selection,
    pub filter: Filter,
    pub opts: KillOpts,
}

impl Ask for KillHolders {
    type Reply = KillReport;
    fn call(&self) -> Call {
        Call::KillHolders {
            sel: self.sel.clone(),
            filter: self.filter.clone(),
            opts: protocol::KillOpts::from(&self.opts),
        }
    }
    fn takes(&self) -> Option<Duration> {
        kill_takes(&self.opts)
    }
}

impl Op for KillHolders {
    fn here(&self, m: &mut Local) -> Result<KillReport, ActionError> {
        m.kill_holders(&self.sel, &self.filter, &self.opts)
    }
}

/// The kill of targets on other hosts names nothing that needs renaming: each host's own
/// report is kept under `by_host` when the reports are merged.
impl Received for KillReport {
    fn received_from(&mut self, _: &str) {}
}

/// `opts` bounded to `user`'s processes as this machine knows that user, and to a pod or a
/// container found here: every process the kill signals (targets, trees, groups, parents) is
/// inside both, or left alone and said.
pub(crate) fn bounded_to(
    opts: &KillOpts,
    user: Option<&crate::inspect::User>,
    within: Option<crate::process::container::Within>,
) -> Result<KillOpts, ActionError> {
    let owner = match user {
        Some(user) => Some(Owner {
            uid: user.uid()?,
            said: user.flag(),
        }),
        None => opts.owner.clone(),
    };
    Ok(KillOpts {
        owner,
        within: within.or_else(|| opts.within.clone()),
        ..opts.clone()
    })
}

impl Local<'_> {
    /// kill() here, with this call's progress and stop flag.
    pub(crate) fn kill(&mut self, targets: &[Target], opts: &KillOpts) -> KillReport {
        let show = &mut self.watch.show;
        let opts = &KillOpts {
            served: opts.served.clone().or_else(|| self.served.clone()),
            // What this run and this machine saw of restarts: the parents `parents` may stop.
            restarted: self.s.restarted(),
            ..opts.clone()
        };
        let report = kill::kill_with_progress(
            targets,
            opts,
            self.s.protected(),
            self.watch.stop,
            &mut |left, all, kill_in| {
                show(&match kill_in {
                    Some(t) => format!(
                        "waiting for {left} of {all} to exit, KILL in {:.1} s",
                        t.as_secs_f64()
                    ),
                    None => format!("waiting for {left} of {all} to exit"),
                })
            },
        );
        // Later waits and diagnoses watch for the restarters it found.
        self.s.note_restarters(&report.restarters);
        report
    }

    /// Stops every compute holder of the selection (narrowed by `filter`) here, each pinned
    /// by its identity; the report says which GPUs each held. A systemd unit's main process
    /// is left alone unless `force`: systemd would only restart it. With `force`, the
    /// protected daemons of the selection are stopped too, never mere observers. Without it,
    /// those that hold a GPU (driver-listed or mapping a node: what keeps memory used) are
    /// listed as skipped with the flag that stops them, so that `kill --gpu N` on a GPU only
    /// a daemon holds does not read as a success that signalled nobody; a daemon that only
    /// has the nodes open (nvidia-persistenced on every GPU node) holds nothing and is not
    /// news.
    pub(crate) fn kill_holders(
        &mut self,
        sel: &Selection,
        filter: &Filter,
        opts: &KillOpts,
    ) -> Result<KillReport, ActionError> {
        let inv = super::ops::inventory(self.s, sel)?;
        let resolved = filter.resolve_on(&inv)?;
        self.kill_holders_in(inv, sel, filter, &resolved, opts)
    }

    /// `kill_holders` from a look just taken (`inv`, checked against `sel`), with the filter
    /// as that look or an earlier one resolved it (`resolved`: a clean's later rounds stop
    /// what is left of the pod and the container its first look found, never another that a
    /// name fits by then).
    pub(crate) fn kill_holders_in(
        &mut self,
        inv: Inventory,
        sel: &Selection,
        filter: &Filter,
        resolved: &Resolved,
        opts: &KillOpts,
    ) -> Result<KillReport, ActionError> {
        let s = self.s;
        let within = resolved.within.clone();
        let mut hs = super::ops::Holders {
            sel: sel.clone(),
            all: true,
            filter: filter.clone(),
        }
        .picked(inv, resolved)?
        .holders;
        hs.retain(|h| h.is_compute() || h.protected);
        // The filter's user, pod and container bound every process signalled, not only the
        // holders they picked: their trees, groups and parents are inside or left alone (read
        // on this host, as the holders were).
        let opts = bounded_to(opts, filter.user.as_ref(), within)?;
        let (daemons, hs): (Vec<Holder>, Vec<Holder>) =
            hs.into_iter().partition(|h| h.protected && !opts.force);
        let (units, hs): (Vec<Holder>, Vec<Holder>) = hs
            .into_iter()
            .partition(|h| h.origin.service_main && h.origin.job.is_none() && !opts.force);
        let opts = KillOpts {
            why: hs.iter().map(|h| (h.pid as i32, holder_why(h))).collect(),
            ..opts
        };
        let mut report = self.kill(&holder_targets(&hs), &opts);
        let holding = |h: &Holder| h.mem > 0 || h.evidence.iter().any(|e| e.holds_memory());
        for h in daemons.into_iter().filter(holding) {
            report.skipped.push(Skipped {
                pid: h.pid,
                reason: SkipReason::DaemonHolds {
                    name: h.name,
                    mib: h.mem_mib,
                    gpus: h.gpus,
                    forcing: Forcing::Allowed,
                },
            });
        }
        let gpus: std::collections::HashMap<i64, &Vec<i64>> =
            hs.iter().map(|h| (h.pid, &h.gpus)).collect();
        for t in &mut report.targets {
            if let Some(g) = gpus.get(&t.pid) {
                t.gpus.clone_from(g);
            }
        }
        for h in units {
            let unit = h.origin.service.as_deref().unwrap_or("its unit");
            report.skipped.push(Skipped {
                pid: h.pid,
                reason: SkipReason::UnitMain {
                    unit: unit.to_string(),
                    stop: s.reach().there(&format!("systemctl stop {unit}")),
                },
            });
        }
        Ok(report)
    }
}

/// Why the audit journal says a holder was stopped: "holder of GPU 0,1 (compute, 4096 MiB)",
/// a MIG holder's devices by their place ("holder of GPU 0:7:0 (…)").
pub(crate) fn holder_why(h: &Holder) -> String {
    let gpus: Vec<String> = match h.mig.is_empty() {
        true => h.gpus.iter().map(i64::to_string).collect(),
        false => h.mig.iter().map(ToString::to_string).collect(),
    };
    format!(
        "holder of GPU {} ({}, {} MiB, seen by {})",
        gpus.join(","),
        h.role,
        h.mem_mib,
        crate::inspect::kinds::Evidence::joined(&h.evidence)
    )
}

/// Holders as kill targets, each pinned by its identity.
pub(crate) fn holder_targets(holders: &[Holder]) -> Vec<Target> {
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

/// The report of a host that could not be reached: every target skipped, with what ssh (or
/// the agent) said.
pub(crate) fn unreachable_report(
    host: &str,
    e: &HostError,
    targets: &[Target],
    dry_run: bool,
) -> KillReport {
    let reason = SkipReason::Unreachable {
        host: host.to_string(),
        detail: e.detail(),
    };
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
pub(crate) fn merge_kills(parts: Vec<(String, KillReport)>, dry_run: bool) -> KillReport {
    if let [(h, _)] = parts.as_slice() {
        if is_local(h) {
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
