//! The commands that signal: kill (the GPUs' holders, or PIDs), clean (kill, then wait) and
//! reset (stop what blocks it, reset, verify, restart).

use super::report::{diagnoses_folded, diagnosis_row, emit_hosts, per_host, row, summary};
use super::{check_owner, emit, require_local_driver};
use crate::cli::hiargs::Selection;
use crate::cli::Config;
use crate::error::Error;
use crate::exit::Exit;
use crate::hosts::HostSel;
use crate::inspect::wait::WaitOpts;
use crate::inspect::Filter;
use crate::machine::{self, Fleet};
use crate::process::kill::{KillOpts, KillReport, Target};
use crate::render::{self, HostState, Style};

/// `gpuloop kill` of the selected GPUs' holders: exit 0 when every target is gone, 1 with
/// survivors, stuck processes or errors, 130 when interrupted during the grace.
pub(super) fn holders(
    cfg: &Config,
    sel: &Selection,
    filter: &Filter,
    opts: &KillOpts,
) -> Result<Exit, Error> {
    let sel = sel.on(&cfg.session)?;
    check_owner(&cfg.session, filter)?;
    kill_holders(cfg, &sel, filter, opts)
}

/// The holders of `sel` on every host signalled, a report and a row per host (`kill`, and
/// `clean --dry-run`, which signals nothing).
fn kill_holders(
    cfg: &Config,
    sel: &HostSel,
    filter: &Filter,
    opts: &KillOpts,
) -> Result<Exit, Error> {
    let parts = Fleet::of(&cfg.session).kill_holders_per_host(sel, filter, opts)?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    for (h, r) in &parts {
        let good = r.all_gone();
        let verb = if r.dry_run {
            "would signal"
        } else {
            "signalled"
        };
        let n = if r.dry_run {
            r.would_signal.len()
        } else {
            r.signalled.len()
        };
        let mut detail = format!("{verb} {n}");
        if !r.survivors.is_empty() {
            detail.push_str(&format!(", survivors {:?}", r.survivors));
        }
        if !r.stuck.is_empty() {
            detail.push_str(&format!(", {} stuck", r.stuck.len()));
        }
        if !r.errors.is_empty() {
            detail.push_str(&format!(
                ", {}",
                crate::words::count(r.errors.len(), "error", "errors")
            ));
        }
        rows.push(row(
            h,
            if good {
                HostState::Ok
            } else {
                HostState::Failed
            },
            detail,
        ));
    }
    let report = machine::kill::merge_kills(parts, opts.dry_run);
    emit_hosts(cfg, &report, &rows, || {
        render::kill_report(&report, Style::stdout())
    })?;
    Ok(summary(cfg, rows, true)?.worse(kill_exit(&report)))
}

/// `gpuloop kill PID…`: bare pids, resolved now, under the same rules as holders. As kill(1),
/// a pid named and not signalled (no such process, pid 1, another user's) fails the command
/// (exit 1); the report's "skipped" line says why, once.
pub(super) fn pids(cfg: &Config, pids: &[i32], opts: &KillOpts) -> Result<Exit, Error> {
    let targets: Vec<_> = pids.iter().map(|&pid| (None, Target::Pid(pid))).collect();
    let report = Fleet::of(&cfg.session).kill(&targets, opts, &Default::default())?;
    let code = kill_done(cfg, &report)?;
    let named: std::collections::HashSet<i64> = pids.iter().map(|&p| i64::from(p)).collect();
    let refused = report.skipped.iter().any(|s| named.contains(&s.pid));
    Ok(if refused {
        code.worse(Exit::Failure)
    } else {
        code
    })
}

pub(super) fn kill_done(cfg: &Config, report: &KillReport) -> Result<Exit, Error> {
    emit(cfg, &report, || {
        render::kill_report(report, Style::stdout())
    })?;
    Ok(kill_exit(report))
}

/// Interrupted during the grace, success when every target is gone, else a failure.
fn kill_exit(report: &KillReport) -> Exit {
    if report.interrupted {
        Exit::Interrupted
    } else {
        Exit::success_if(report.all_gone())
    }
}

/// `gpuloop clean`: kill the holders, wait until the GPUs are free, report; exit 1 if one is
/// not clean.
pub(super) fn clean(
    cfg: &Config,
    sel: &Selection,
    filter: &Filter,
    wait: &WaitOpts,
    kill_opts: &KillOpts,
) -> Result<Exit, Error> {
    let sel = &sel.on(&cfg.session)?;
    check_owner(&cfg.session, filter)?;
    require_local_driver(&cfg.session)?;
    if kill_opts.dry_run {
        // Nothing is signalled, so there is nothing to wait for: say what clean would stop.
        return kill_holders(cfg, sel, filter, kill_opts);
    }
    let parts = Fleet::of(&cfg.session).clean_per_host(sel, filter, kill_opts, wait)?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    for (h, c) in &parts {
        let mut r = diagnosis_row(h, &c.after, &wait.demand());
        r.detail = format!("stopped {}; {}", c.kill.signalled.len(), r.detail);
        if !c.clean && r.good() {
            r.state = HostState::NotClean;
        }
        // A pod's or a container's clean is its own memory back: what else holds those GPUs
        // (another pod) is said in the row and left alone.
        if c.clean && filter.is_scoped() {
            r.state = HostState::Clean;
        }
        rows.push(r);
    }
    let r = machine::wait::merge_clean(parts, kill_opts.dry_run);
    if r.kill.interrupted {
        // What was signalled and what still runs (TERMed, not KILLed), then 130.
        return kill_done(cfg, &r.kill);
    }
    if crate::interrupt::is_set() {
        return Ok(Exit::Interrupted);
    }
    emit_hosts(cfg, &r, &rows, || {
        let secs = r.wait_ms as f64 / 1000.0;
        format!(
            "{}\n{}\n{}",
            render::clean_kill_report(&r.kill, Style::stdout()),
            diagnoses_folded(cfg, &r.after, &rows),
            if r.clean && r.kill.signalled.is_empty() {
                // Nothing was stopped: there was no kill for the memory to come back after.
                "clean: nothing to stop".to_string()
            } else if r.clean {
                // The release and the settle watch are two times, said apart.
                let back = r.released_ms.unwrap_or(r.wait_ms) as f64 / 1000.0;
                let whose = match filter.is_scoped() {
                    true => "its memory",
                    false => "memory",
                };
                match r.settle_ms {
                    0 if filter.is_scoped() => format!(
                        "clean: {whose} back {back:.1} s after the kill; what else holds those GPUs is left alone"
                    ),
                    0 => format!("clean: {whose} back {back:.1} s after the kill"),
                    settle => format!(
                        "clean: {whose} back {back:.1} s after the kill, still clean {:.1} s later",
                        settle as f64 / 1000.0
                    ),
                }
            } else {
                format!("NOT clean after {secs:.1} s")
            }
        )
    })?;
    let code = summary(cfg, rows, true)?;
    Ok(if r.clean { code } else { Exit::Failure })
}

/// `gpuloop reset`: each GPU's blockers (`--dry-run`), or the reset and its steps; exit 0
/// when every GPU was reset and verified (or, with `--dry-run`, when nothing blocks one).
pub(super) fn reset(
    cfg: &Config,
    sel: &Selection,
    opts: &crate::cli::hiargs::ResetOpts,
) -> Result<Exit, Error> {
    let s = &cfg.session;
    require_local_driver(s)?;
    let sel = sel.on(s)?;
    if !s.is_local() && sel.every.is_some() {
        return Err(Error::Usage(
            "reset: with a host set, name each GPU with its host (--gpu HOST:N): an index alone would reset that GPU on every host".into(),
        ));
    }
    let op = |gpus: Vec<i64>| machine::reset::Reset {
        gpus,
        dry_run: opts.dry_run,
        force: opts.force,
        grace: opts.grace,
        timeout: opts.timeout,
        mig: sel.mig.clone(),
    };
    let reports = Fleet::of(s).reset(&sel, op)?;
    emit(cfg, &reports, || {
        render::reset_reports(&reports, Style::stdout())
    })?;
    if crate::interrupt::is_set() {
        return Ok(Exit::Interrupted);
    }
    Ok(Exit::success_if(reports.iter().all(|r| r.ok)))
}
