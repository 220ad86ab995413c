//! The commands that read and wait, killing nothing: gpus, holders, diagnose, wait.

use super::report::{
    diagnoses_folded, diagnosis_row, emit_hosts, fold_rows, per_host, row, summary, with_note,
};
use super::{check_owner, emit, require_local_driver};
use crate::cli::hiargs::Selection;
use crate::cli::Config;
use crate::error::Error;
use crate::exit::Exit;
use crate::gpu::GpuError;
use crate::hosts::HostSel;
use crate::inspect::diagnose::Demand;
use crate::inspect::wait::{WaitOpts, WaitOutcome};
use crate::inspect::Filter;
use crate::machine::{self, Fleet};
use crate::render::{self, HostState, Style};
use serde::Serialize;

/// `gpuloop gpus`: every selected GPU, and over several hosts a row per host.
pub(super) fn gpus(cfg: &Config, sel: &Selection) -> Result<Exit, Error> {
    let s = &cfg.session;
    require_local_driver(s)?;
    let sel = sel.on(s)?;
    if let Some(pool) = s.pool() {
        let sel = sel.clone();
        pool.say_each(move |h, g: &Vec<crate::gpu::Gpu>| {
            let g = selected_gpus(&sel, h, g.clone()).ok()??;
            Some(gpus_row(h, &g).line())
        });
    }
    // Only the selected hosts are asked: one outside `--gpu host:…` that is down fails nothing.
    let (parts, mut rows) = per_host(cfg, Fleet::of(s).each(&sel, |_| machine::ops::Gpus)?)?;
    let mut gpus = Vec::new();
    let mut idle = Vec::new();
    for (h, g) in parts {
        let Some(g) = selected_gpus(&sel, &h, g)? else {
            continue;
        };
        let r = gpus_row(&h, &g);
        if r.detail.ends_with(", idle") {
            idle.push(h.clone());
        }
        rows.push(r);
        gpus.extend(g);
    }
    emit_hosts(cfg, &gpus, &rows, || {
        let (shown, note) = fold_rows(cfg, &gpus, &idle, "idle", |g| &g.host);
        with_note(
            render::gpus(&shown, Style::stdout()),
            shown.is_empty(),
            note,
        )
    })?;
    let code = summary(cfg, rows, true)?;
    // A GPU the driver could not read is reported beside the others, and fails the command.
    Ok(if gpus.iter().any(|g| g.error.is_some()) {
        Exit::Failure
    } else {
        code
    })
}

/// `gpuloop holders`: on this machine alone, or a list gathered from every host.
pub(super) fn holders(
    cfg: &Config,
    sel: &Selection,
    owner: &Filter,
    all: bool,
) -> Result<Exit, Error> {
    if cfg.session.is_local() {
        holders_here(cfg, sel, owner, all)
    } else {
        holders_per_host(cfg, sel, owner, all)
    }
}

/// `gpuloop holders` on this machine alone: its scan starts first, so that it runs beside
/// the driver's load, and a missing driver still lists who has the device nodes open.
fn holders_here(cfg: &Config, sel: &Selection, owner: &Filter, all: bool) -> Result<Exit, Error> {
    let s = &cfg.session;
    let inv = machine::ops::look(s)?;
    if let Some(why) = s.backend()?.missing_driver() {
        // The fd scan still finds who has the nodes open; the exit code says the rest.
        // Nothing found is no result: an empty list ("no holders", `[]`) read alone
        // would look like a clean machine.
        let hs = inv.holders(&None, all);
        if !hs.is_empty() {
            emit(cfg, &hs, || render::holders(&hs, Style::stdout()))?;
        }
        return Err(GpuError::NoDriver(why.to_string()).into());
    }
    let here = sel.on(s)?;
    let sel = here.on(crate::hosts::LOCAL).unwrap_or(Some(Vec::new()));
    check_owner(s, owner)?;
    let holders = machine::ops::Holders {
        sel,
        all,
        filter: here.narrow(owner),
    };
    let r = holders.of(inv)?;
    let code = emit(cfg, &r.holders, || {
        render::holders(&r.holders, Style::stdout())
    })?;
    if r.unreadable > 0 {
        crate::errln!(
            "note: {} could not be inspected (other users'): holders among them are not listed; run as root to see every holder",
            crate::words::count(r.unreadable, "process", "processes")
        );
    }
    if let Some(e) = r.unread {
        // The other GPUs' holders are listed; this GPU's list is incomplete.
        crate::errln!(
            "error: {e}: the driver's process list of that GPU is missing (holders shown for it are those the /proc scan found)"
        );
        return Ok(Exit::Failure);
    }
    Ok(code)
}

/// `gpuloop holders` over several hosts: their lists in one, and a row per host.
fn holders_per_host(
    cfg: &Config,
    sel: &Selection,
    owner: &Filter,
    all: bool,
) -> Result<Exit, Error> {
    let s = &cfg.session;
    // What the arguments alone decide is decided before any host is contacted: a usage
    // error over 256 hosts used to wait for all of them to connect first.
    let sel = sel.on(s)?;
    check_owner(s, owner)?;
    if let Some(pool) = s.pool() {
        pool.say_each(|h, part: &machine::HoldersReport| Some(holders_row(h, part).line()));
    }
    let parts = Fleet::of(s).holders_per_host(&sel, all, owner)?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    let mut hs = Vec::new();
    let mut blind = Vec::new();
    for (h, part) in parts {
        if part.unreadable > 0 {
            blind.push(format!("{h} ({})", part.unreadable));
        }
        rows.push(holders_row(&h, &part));
        hs.extend(part.holders);
    }
    emit_hosts(cfg, &hs, &rows, || render::holders(&hs, Style::stdout()))?;
    let code = summary(cfg, rows, true)?;
    if !blind.is_empty() {
        crate::errln!(
            "note: processes that could not be inspected (other users') on {}: holders among them are not listed; run gpuloop there as root to see every holder",
            blind.join(", ")
        );
    }
    Ok(code)
}

/// `gpuloop diagnose`: why each selected GPU's memory is used; exit 1 if one is not clean.
pub(super) fn diagnose(
    cfg: &Config,
    sel: &Selection,
    owner: &Filter,
    check: bool,
) -> Result<Exit, Error> {
    let s = &cfg.session;
    require_local_driver(s)?;
    check_owner(s, owner)?;
    let sel = sel.on(s)?;
    // --check prints nothing: the exit code says it.
    if let Some(pool) = s.pool().filter(|_| !check) {
        pool.say_each(|h, ds: &Vec<crate::inspect::diagnose::Diagnosis>| {
            Some(diagnosis_row(h, ds, &Demand::default()).line())
        });
    }
    let parts = Fleet::of(s).diagnoses_per_host(&sel, owner)?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    let mut ds = Vec::new();
    for (h, part) in parts {
        rows.push(diagnosis_row(&h, &part, &Demand::default()));
        ds.extend(part);
    }
    if !check {
        emit_hosts(cfg, &ds, &rows, || diagnoses_folded(cfg, &ds, &rows))?;
    }
    // --check prints nothing: the exit code says it (a host that failed is still
    // named on stderr).
    let code = summary(cfg, rows, !check)?;
    // The one judgement of clean (wait, clean, the hooks and MCP make the same).
    Ok(if ds.iter().all(|d| d.is_clean()) {
        code
    } else {
        Exit::Failure
    })
}

/// `gpuloop wait`: wait_clean, then the report (which says what is left: the wait is quiet);
/// kills nothing. With a filter it waits for the GPUs the filtered processes hold now; with a
/// pod or a container, for that scope's processes to leave them and its memory to come back.
pub(super) fn wait(
    cfg: &Config,
    sel: &Selection,
    filter: &Filter,
    opts: &WaitOpts,
) -> Result<Exit, Error> {
    let sel = &sel.on(&cfg.session)?;
    check_owner(&cfg.session, filter)?;
    require_local_driver(&cfg.session)?;
    let held = if filter.is_empty() {
        None
    } else {
        let Some(held) = Fleet::of(&cfg.session).held_by(sel, filter)? else {
            // Nothing was verified: never "clean" (their memory may still be on its way back,
            // after a kill); `gpuloop wait` without the filter checks the GPUs.
            crate::errln!("gpuloop: wait: nothing to wait for: no process of that --user/--mine/--job/--pod/--container holds a selected GPU (their memory is not checked; gpuloop wait without it checks the GPUs)");
            return emit(
                cfg,
                &serde_json::json!({"clean": null, "nothing_to_wait_for": true, "gpus": []}),
                || "nothing to wait for".into(),
            );
        };
        Some(held)
    };
    let sel = held.as_ref().unwrap_or(sel);
    let outcome = Fleet::of(&cfg.session).wait(sel, filter, opts, true)?;
    let memory_back = match outcome {
        WaitOutcome::Interrupted => {
            say_still_held(cfg, sel, opts);
            return Ok(Exit::Interrupted);
        }
        o => o.is_clean(),
    };
    let parts = Fleet::of(&cfg.session).diagnoses_per_host(sel, &Filter::default())?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    let mut after = Vec::new();
    for (h, part) in parts {
        rows.push(diagnosis_row(&h, &part, &opts.demand()));
        after.extend(part);
    }
    // Memory back is not enough where a GPU's own faults ask for a reset or a reboot.
    let clean = memory_back && after.iter().all(|d| !d.verdict.needs_action());
    #[derive(Serialize)]
    struct Out<'a> {
        clean: bool,
        gpus: &'a [crate::inspect::diagnose::Diagnosis],
    }
    emit_hosts(
        cfg,
        &Out {
            clean,
            gpus: &after,
        },
        &rows,
        || {
            format!(
                "{}\n{}",
                diagnoses_folded(cfg, &after, &rows),
                if clean { "clean" } else { "NOT clean" }
            )
        },
    )?;
    let code = summary(cfg, rows, true)?;
    Ok(if clean { code } else { Exit::Failure })
}

/// Ctrl-C during `gpuloop wait`: what it was still waiting for, which GPUs held by whom (one
/// more look, on stderr), so that an interrupted wait does not end without a word.
fn say_still_held(cfg: &Config, sel: &HostSel, opts: &WaitOpts) {
    let ds = match Fleet::of(&cfg.session).diagnoses(sel, &Filter::default()) {
        Ok(ds) => ds,
        Err(e) => {
            crate::errln!("gpuloop: wait: interrupted; what is still held could not be read: {e}");
            return;
        }
    };
    let dirty: Vec<_> = ds
        .into_iter()
        .filter(|d| !d.is_clean_under(&opts.demand()))
        .collect();
    if dirty.is_empty() {
        crate::errln!("gpuloop: wait: interrupted; the GPUs read clean now");
        return;
    }
    let style = Style::stderr();
    crate::errln!(
        "gpuloop: wait: interrupted; still not clean:\n{}",
        render::diagnoses(&dirty, style)
    );
}

/// `gpuloop top`: each selected GPU's utilisation, memory and temperature, with its compute
/// holders under it, from one read of the driver and one look at the holders per frame. On a
/// terminal it redraws every `interval` until Ctrl-C; with --once, --json or into a pipe it
/// prints one frame.
pub(super) fn top(
    cfg: &Config,
    sel: &Selection,
    interval: std::time::Duration,
    once: bool,
) -> Result<Exit, Error> {
    let s = &cfg.session;
    require_local_driver(s)?;
    let sel = sel.on(s)?;
    let frame =
        || -> Result<(Vec<crate::gpu::Gpu>, Vec<crate::inspect::holders::Holder>), Error> {
            let fleet = Fleet::of(s);
            let mut gpus = Vec::new();
            for (h, g) in fleet.answered(fleet.each(&sel, |_| machine::ops::Gpus)?)? {
                gpus.extend(selected_gpus(&sel, &h, g)?.unwrap_or_default());
            }
            let holders = fleet.holders(&sel, false, &Filter::default())?;
            Ok((gpus, holders))
        };
    let redraw = !once && !cfg.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
    if !redraw {
        let (gpus, holders) = frame()?;
        #[derive(Serialize)]
        struct Out<'a> {
            gpus: &'a [crate::gpu::Gpu],
            holders: &'a [crate::inspect::holders::Holder],
        }
        emit(
            cfg,
            &Out {
                gpus: &gpus,
                holders: &holders,
            },
            || render::top(&gpus, &holders, Style::stdout()),
        )?;
        return Ok(if gpus.iter().any(|g| g.error.is_some()) {
            Exit::Failure
        } else {
            Exit::Success
        });
    }
    let stop = s.interrupted();
    loop {
        let (gpus, holders) = frame()?;
        // Home and a clear screen, then the frame.
        crate::output::control(
            crate::output::Control::HomeAndClear,
            &format!(
                "{}\n\n{} (every {:.1} s; Ctrl-C ends)",
                render::top(&gpus, &holders, Style::stdout()),
                crate::utc::now(),
                interval.as_secs_f64()
            ),
        );
        let until = std::time::Instant::now() + interval;
        while std::time::Instant::now() < until {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(Exit::Interrupted);
            }
            std::thread::sleep(std::time::Duration::from_millis(50).min(interval));
        }
    }
}

/// The GPUs of `host` that `sel` selects (`None`: the host is not selected).
fn selected_gpus(
    sel: &HostSel,
    host: &str,
    mut gs: Vec<crate::gpu::Gpu>,
) -> Result<Option<Vec<crate::gpu::Gpu>>, GpuError> {
    let Some(x) = sel.on(host) else {
        return Ok(None);
    };
    crate::inspect::check_selection(&x, &gs)?;
    gs.retain(|g| crate::inspect::selected(&x, g.index));
    Ok(Some(gs))
}

/// A host's line in `holders`: how many, and what could not be read there.
fn holders_row(host: &str, part: &machine::HoldersReport) -> render::HostRow {
    let mut detail = crate::words::count(part.holders.len(), "holder", "holders");
    if part.unreadable > 0 {
        detail.push_str(&format!(
            ", {} not inspected",
            crate::words::count(part.unreadable, "process", "processes")
        ));
    }
    let state = match &part.unread {
        // That GPU's holders are only those the /proc scan found there.
        Some(e) => {
            detail.push_str(&format!("; {e}: the driver's process list is missing"));
            HostState::Failed
        }
        None => HostState::Ok,
    };
    row(host, state, detail)
}

/// A host's line in `gpus`: how many GPUs of what kind, and what they hold. Hosts alike
/// (`8 GPUs (NVIDIA H200), idle`) fold into one row of the summary.
fn gpus_row(host: &str, gs: &[crate::gpu::Gpu]) -> render::HostRow {
    let mut detail = crate::words::count(gs.len(), "GPU", "GPUs");
    if let Some(first) = gs.first().filter(|f| gs.iter().all(|g| g.name == f.name)) {
        detail.push_str(&format!(" ({})", first.name));
    }
    let busy: Vec<_> = gs
        .iter()
        .filter(|g| g.error.is_none() && (g.mem_used_mib > 0 || g.procs > 0))
        .collect();
    let unread = gs.iter().filter(|g| g.error.is_some()).count();
    if busy.is_empty() && unread == 0 {
        detail.push_str(", idle");
    } else if !busy.is_empty() {
        detail.push_str(&format!(
            ", {} in use: {} MiB used, {}",
            busy.len(),
            busy.iter().map(|g| g.mem_used_mib).sum::<i64>(),
            crate::words::count(
                busy.iter().map(|g| g.procs.max(0) as usize).sum(),
                "process",
                "processes"
            )
        ));
    }
    if unread > 0 {
        detail.push_str(&format!(", {unread} unreadable"));
    }
    let state = match unread {
        0 => HostState::Ok,
        _ => HostState::Failed,
    };
    row(host, state, detail)
}
