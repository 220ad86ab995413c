//! The commands that signal: kill (the GPUs' holders, or PIDs) and clean (kill, then wait).

use super::report::{diagnoses_folded, diagnosis_row, emit_hosts, per_host, row, summary};
use super::{check_owner, emit, require_local_driver};
use crate::cli::hiargs::Selection;
use crate::cli::Config;
use crate::error::Error;
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
) -> Result<i32, Error> {
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
) -> Result<i32, Error> {
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
    Ok(summary(cfg, rows, true)?.max(kill_code(&report)))
}

/// `gpuloop kill PID…`: bare pids, resolved now, under the same rules as holders.
pub(super) fn pids(cfg: &Config, pids: &[i32], opts: &KillOpts) -> Result<i32, Error> {
    let targets: Vec<_> = pids.iter().map(|&pid| (None, Target::Pid(pid))).collect();
    let report = Fleet::of(&cfg.session).kill(&targets, opts, None)?;
    let code = kill_done(cfg, &report)?;
    // As kill(1): a pid named that is no process is a failure, not a quiet success.
    let missing: Vec<String> = report
        .skipped
        .iter()
        .filter(|s| s.is_gone() && pids.iter().any(|&p| i64::from(p) == s.pid))
        .map(|s| s.pid.to_string())
        .collect();
    if missing.is_empty() {
        return Ok(code);
    }
    crate::errln!("gpuloop: kill: no such process: {}", missing.join(", "));
    Ok(code.max(1))
}

pub(super) fn kill_done(cfg: &Config, report: &KillReport) -> Result<i32, Error> {
    emit(cfg, &report, || {
        render::kill_report(report, Style::stdout())
    })?;
    Ok(kill_code(report))
}

/// 130 when interrupted during the grace, 0 when every target is gone, else 1.
fn kill_code(report: &KillReport) -> i32 {
    if report.interrupted {
        130
    } else if report.all_gone() {
        0
    } else {
        1
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
) -> Result<i32, Error> {
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
        rows.push(r);
    }
    let r = machine::wait::merge_clean(parts, kill_opts.dry_run);
    if r.kill.interrupted {
        // What was signalled and what still runs (TERMed, not KILLed), then 130.
        return kill_done(cfg, &r.kill);
    }
    if crate::interrupt::is_set() {
        return Ok(130);
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
                match r.settle_ms {
                    0 => format!("clean: memory back {back:.1} s after the kill"),
                    settle => format!(
                        "clean: memory back {back:.1} s after the kill, still clean {:.1} s later",
                        settle as f64 / 1000.0
                    ),
                }
            } else {
                format!("NOT clean after {secs:.1} s")
            }
        )
    })?;
    let code = summary(cfg, rows, true)?;
    Ok(if r.clean { code } else { 1 })
}
