//! One function per command; each returns the exit code or an `Error`.

use super::args::{Args, Cmd, GpuSel, HookFlags, KillFlags, Owner, SimCmd, WaitFlags};
use super::Config;
use crate::actions;
use crate::error::Error;
use crate::gpu::sim::hold::{self, HoldOpts};
use crate::gpu::sim::SimBackend;
use crate::gpu::GpuError;
use crate::hosts::HostSel;
use crate::inspect::diagnose::Demand;
use crate::inspect::select;
use crate::inspect::wait::{WaitOpts, WaitOutcome};
use crate::inspect::{Filter, User};
use crate::process::kill::{self, parse_signal, KillOpts, KillReport, Target};
use crate::render::{self, Style};
use crate::script::engine::{build_engine, new_scope, run_source, EngineOpts};
use crate::session::Session;
use crate::slurm::{Hook, HookOpts, JobEnv};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

pub fn dispatch(args: &Args, cfg: &Config) -> Result<i32, Error> {
    let s = &cfg.session;
    match &args.cmd {
        Cmd::Run { argv } => match argv.split_first() {
            Some((script, args)) => run_script(cfg, script, args),
            None => Err(Error::Usage("run: give a SCRIPT".into())),
        },
        Cmd::Eval { code } => eval(cfg, code),
        Cmd::Check { scripts } => check(cfg, scripts),
        Cmd::Man { dir } => man(dir.as_deref()),
        Cmd::Recipes => {
            let rs = crate::script::recipes::list();
            emit(cfg, &rs, || render::recipes(&rs))
        }
        Cmd::Repl => crate::repl::run(cfg.session.clone(), cfg.json),
        Cmd::Doc { definitions } => doc(cfg, definitions.as_deref()),
        Cmd::Completions { shell } => {
            let mut cmd = <Args as clap::CommandFactory>::command();
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "gpuloop", &mut out);
            crate::output::bytes(&out);
            Ok(0)
        }
        Cmd::Gpus { sel } => {
            require_local_driver(s)?;
            let sel = selection(s, sel)?;
            if let Some(pool) = s.pool() {
                let sel = sel.clone();
                pool.say_each(move |h, g: &Vec<crate::gpu::Gpu>| {
                    let g = selected_gpus(&sel, h, g.clone()).ok()??;
                    Some(gpus_row(h, &g).line())
                });
            }
            let (parts, mut rows) = per_host(cfg, actions::gpus_per_host(s)?)?;
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
                1
            } else {
                code
            })
        }
        Cmd::Holders { sel, owner, all } => {
            if s.host_names() == [crate::hosts::LOCAL] {
                // First thing: the /proc scan then runs beside the driver's load.
                let inv = actions::look(s)?;
                if let Some(why) = s.backend()?.missing_driver() {
                    // The fd scan still finds who has the nodes open; the exit code says the rest.
                    // Nothing found is no result: an empty list ("no holders", `[]`) read alone
                    // would look like a clean machine.
                    let hs = inv.holders(&None, *all);
                    if !hs.is_empty() {
                        emit(cfg, &hs, || render::holders(&hs, Style::stdout()))?;
                    }
                    return Err(GpuError::NoDriver(why.to_string()).into());
                }
                let sel = selection(s, sel)?
                    .on(crate::hosts::LOCAL)
                    .unwrap_or(Some(Vec::new()));
                let r = actions::holders_report_in(inv, &sel, *all, &owner_filter(s, owner)?)?;
                let code = emit(cfg, &r.holders, || {
                    render::holders(&r.holders, Style::stdout())
                })?;
                if r.unreadable > 0 {
                    crate::errln!(
                        "note: {} process(es) could not be inspected (other users'): holders among them are not listed; run as root to see every holder",
                        r.unreadable
                    );
                }
                if let Some(e) = r.unread {
                    // The other GPUs' holders are listed; this GPU's list is incomplete.
                    crate::errln!(
                        "error: {e}: the driver's process list of that GPU is missing (holders shown for it are those the /proc scan found)"
                    );
                    return Ok(1);
                }
                return Ok(code);
            }
            if let Some(pool) = s.pool() {
                pool.say_each(|h, part: &actions::HoldersReport| Some(holders_row(h, part).line()));
            }
            let parts = actions::holders_report_per_host(
                s,
                selection(s, sel)?,
                *all,
                &owner_filter(s, owner)?,
            )?;
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
        Cmd::Diagnose { sel, check, owner } => {
            require_local_driver(s)?;
            let filter = owner_filter(s, owner)?;
            let sel = selection(s, sel)?;
            // --check prints nothing: the exit code says it.
            if let Some(pool) = s.pool().filter(|_| !check) {
                pool.say_each(|h, ds: &Vec<crate::inspect::diagnose::Diagnosis>| {
                    Some(diagnosis_row(h, ds, &Demand::default()).line())
                });
            }
            let parts = actions::diagnoses_per_host(s, sel, &filter)?;
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
                1
            })
        }
        Cmd::Kill {
            pids,
            sel,
            owner,
            kill,
        } => {
            let opts = kill_opts(kill)?;
            if pids.is_empty() {
                return kill_holders(cfg, &selection(s, sel)?, &owner_filter(s, owner)?, &opts);
            }
            if !sel.gpus.is_empty() || owner.user.is_some() || owner.mine || owner.job.is_some() {
                return Err(Error::Usage(
                    "kill: give PIDs or --gpu/--user/--mine/--job, not both".into(),
                ));
            }
            kill_pids(cfg, pids, &opts)
        }
        Cmd::Clean {
            sel,
            owner,
            timeout,
            wait,
            kill,
        } => {
            let wait = wait_opts(*timeout, wait)?;
            clean(
                cfg,
                &selection(s, sel)?,
                &owner_filter(s, owner)?,
                &wait,
                kill,
            )
        }
        Cmd::Wait {
            sel,
            owner,
            timeout,
            wait,
        } => wait_only(
            cfg,
            &selection(s, sel)?,
            &owner_filter(s, owner)?,
            &wait_opts(*timeout, wait)?,
        ),
        Cmd::Epilog { hook: h } => hook(cfg, Hook::Epilog, h),
        Cmd::Prolog { hook: h } => hook(cfg, Hook::Prolog, h),
        Cmd::Sim(cmd) => sim(cfg, cmd),
        Cmd::Mcp { allow } => mcp(cfg, allow),
        Cmd::Journal {
            last,
            since,
            pid,
            user,
            front_end,
        } => {
            let filter = crate::journal::Filter {
                since: since
                    .as_deref()
                    .map(crate::journal::parse_since)
                    .transpose()
                    .map_err(Error::Usage)?,
                pid: *pid,
                user: user.clone(),
                front_end: front_end
                    .as_deref()
                    .map(str::parse)
                    .transpose()
                    .map_err(Error::Usage)?,
            };
            journal(cfg, *last, &filter)
        }
        Cmd::Agent => Ok(crate::agent::serve(cfg.session.clone())),
        // Handled in `cli::main` before anything starts; kept for a complete match.
        Cmd::Guard => Ok(crate::runner::guard::main()),
    }
}

/// `--gpu` values (each a comma list of indices, ranges, UUIDs, bus ids, or `dest:index`
/// for one host's GPU) as a selection over the host set.
fn selection(s: &Session, sel: &GpuSel) -> Result<HostSel, Error> {
    let mut sels = Vec::new();
    let mut at: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for text in &sel.gpus {
        match HostSel::parse_host_index(text) {
            Some((host, i)) => at.entry(host).or_default().push(i),
            None => sels.extend(select::parse(text)?),
        }
    }
    if sels.is_empty() && at.is_empty() {
        return Ok(HostSel::all());
    }
    let sels = (!sels.is_empty()).then_some(sels);
    Ok(actions::select_hosts(s, sels.as_deref(), at)?)
}

fn row(host: &str, state: &str, detail: String) -> render::HostRow {
    render::HostRow {
        host: host.to_string(),
        state: state.to_string(),
        detail,
        error: None,
        usage: false,
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
fn holders_row(host: &str, part: &actions::HoldersReport) -> render::HostRow {
    let mut detail = format!("{} holder(s)", part.holders.len());
    if part.unreadable > 0 {
        detail.push_str(&format!(", {} process(es) not inspected", part.unreadable));
    }
    let state = match &part.unread {
        // That GPU's holders are only those the /proc scan found there.
        Some(e) => {
            detail.push_str(&format!("; {e}: the driver's process list is missing"));
            "failed"
        }
        None => "ok",
    };
    row(host, state, detail)
}

/// A host's line in `gpus`: how many GPUs of what kind, and what they hold. Hosts alike
/// (`8 GPU(s) (NVIDIA H200), idle`) fold into one row of the summary.
fn gpus_row(host: &str, gs: &[crate::gpu::Gpu]) -> render::HostRow {
    let mut detail = format!("{} GPU(s)", gs.len());
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
            ", {} in use: {} MiB used, {} process(es)",
            busy.len(),
            busy.iter().map(|g| g.mem_used_mib).sum::<i64>(),
            busy.iter().map(|g| g.procs).sum::<i64>()
        ));
    }
    if unread > 0 {
        detail.push_str(&format!(", {unread} unreadable"));
    }
    row(host, if unread > 0 { "failed" } else { "ok" }, detail)
}

/// Over several hosts and without `--wide`/`--all-rows`: the records of the hosts in
/// `quiet` left out, and a line that names those hosts as a hostlist.
fn fold_rows<T: Clone>(
    cfg: &Config,
    items: &[T],
    quiet: &[String],
    what: &str,
    host: impl Fn(&T) -> &String,
) -> (Vec<T>, Option<String>) {
    let several = cfg.session.host_names() != [crate::hosts::LOCAL];
    if !several || quiet.is_empty() || crate::output::wide() {
        return (items.to_vec(), None);
    }
    let shown = items
        .iter()
        .filter(|i| !quiet.contains(host(i)))
        .cloned()
        .collect();
    let note = format!(
        "(the GPUs of {} {what} host(s) are not listed one by one: {}; --all-rows lists them)",
        quiet.len(),
        crate::hosts::fold::compress(quiet)
    );
    (shown, Some(note))
}

/// A table and the note of what was folded out of it (the note alone if nothing is left).
fn with_note(table: String, empty: bool, note: Option<String>) -> String {
    match note {
        Some(n) if empty => n,
        Some(n) => format!("{table}\n{n}"),
        None => table,
    }
}

/// The diagnoses, those of clean hosts folded into one line.
fn diagnoses_folded(
    cfg: &Config,
    ds: &[crate::inspect::diagnose::Diagnosis],
    rows: &[render::HostRow],
) -> String {
    let clean: Vec<String> = rows
        .iter()
        .filter(|r| r.state == "clean")
        .map(|r| r.host.clone())
        .collect();
    let (shown, note) = fold_rows(cfg, ds, &clean, "clean", |d| &d.host);
    with_note(
        render::diagnoses(&shown, Style::stdout()),
        shown.is_empty(),
        note,
    )
}

fn diagnosis_row(
    host: &str,
    ds: &[crate::inspect::diagnose::Diagnosis],
    demand: &Demand,
) -> render::HostRow {
    let dirty: Vec<String> = ds
        .iter()
        .filter(|d| !d.is_clean_under(demand))
        .map(actions::describe_diagnosis)
        .collect();
    if dirty.is_empty() {
        row(host, "clean", format!("{} GPU(s) clean", ds.len()))
    } else {
        row(host, "NOT clean", dirty.join("; "))
    }
}

/// Splits a one-shot's per-host results into the hosts that answered and a summary row for
/// each that did not; each failure is said once, here, on stderr (in the JSON document with
/// --json). On this machine alone a failure is the command's error, as always.
#[allow(clippy::type_complexity)]
fn per_host<T>(
    cfg: &Config,
    parts: actions::PerHost<T>,
) -> Result<(Vec<(String, T)>, Vec<render::HostRow>), Error> {
    let several = cfg.session.host_names() != [crate::hosts::LOCAL];
    let skip = cfg.session.skip_unreachable();
    let mut ok = Vec::new();
    let mut rows = Vec::new();
    for (h, r) in parts {
        match r {
            Ok(v) => ok.push((h, v)),
            // Ctrl-C or TERM while the hosts were opened or answering: the run ends (130),
            // with nothing said for each host it did not reach.
            Err(actions::Failure::Host(crate::hosts::HostError::Interrupted)) => {
                return Err(Error::Script(crate::script::ScriptError::Interrupted))
            }
            Err(f) if !several => return Err(f.into_gpu().into()),
            Err(f) => {
                let skipped = skip && f.unreachable();
                // On a terminal a failure was said as it happened.
                let said = cfg.session.pool().is_some_and(|p| p.said(&h));
                if !cfg.json && !said {
                    if skipped {
                        crate::errln!("warning: skipping {f}");
                    } else {
                        crate::errln!("gpuloop: {f}");
                    }
                }
                let state = match (skipped, f.unreachable()) {
                    (true, _) => "skipped",
                    (false, true) => "unreachable",
                    (false, false) => "failed",
                };
                // A few words, alike for every host that failed the same way, so that they
                // fold; the whole error was said above.
                let detail = match &f {
                    actions::Failure::Host(e) => e.kind().to_string(),
                    actions::Failure::Gpu(e) => {
                        let e = e.to_string();
                        e.split(": ").next().unwrap_or(&e).to_string()
                    }
                };
                let mut r = row(&h, state, detail);
                r.error = Some(f.to_string());
                r.usage = f.is_usage();
                rows.push(r);
            }
        }
    }
    Ok((ok, rows))
}

/// With several hosts: the per-host summary (after the records; `show` false prints none),
/// folded, in host-set order. The exit code is 0 only if every host is as it should be;
/// with --skip-unreachable the unreachable hosts do not count, but some host must answer.
/// With --json the summary is the document's (its failures, `emit_hosts`), and stderr gets
/// one line naming the hosts that failed.
fn summary(cfg: &Config, mut rows: Vec<render::HostRow>, show: bool) -> Result<i32, Error> {
    let names = cfg.session.host_names();
    if names == [crate::hosts::LOCAL] {
        return Ok(0);
    }
    rows.sort_by_key(|r| names.iter().position(|n| *n == r.host));
    let answered = rows.iter().any(|r| r.error.is_none());
    let failed: Vec<&str> = rows.iter().filter_map(|r| r.error.as_deref()).collect();
    if cfg.json {
        if !failed.is_empty() {
            // Hosts skipped as --skip-unreachable asked are a warning, not the command's error.
            let skipped = rows
                .iter()
                .all(|r| r.error.is_none() || r.state == "skipped");
            let (key, what) = match skipped {
                true => ("warning", "skipped"),
                false => ("error", "failed"),
            };
            let text = format!(
                "{} of {} host(s) {what}: {}",
                failed.len(),
                rows.len(),
                failed.join("; ")
            );
            crate::errln!("{}", serde_json::json!({ key: text }));
        }
    } else if show && answered {
        // Nothing answered: the errors above are all there is; nothing here reads as a result.
        crate::outln!("\n{}", render::host_summary(&rows, Style::stdout()));
    }
    let good = rows.iter().all(|r| r.good() || r.state == "skipped");
    // A mistake in what was asked is exit 2 through a host as it is here.
    Ok(if rows.iter().any(|r| r.usage) {
        2
    } else if answered && good {
        0
    } else {
        1
    })
}

/// `emit` over several hosts: with --json each host that failed is in the document (an
/// entry `{"host", "state", "error"}` of a list; a report gets `"hosts"`, every host's row);
/// as text nothing at all when no host answered.
fn emit_hosts<T: Serialize>(
    cfg: &Config,
    v: &T,
    rows: &[render::HostRow],
    table: impl FnOnce() -> String,
) -> Result<i32, Error> {
    let names = cfg.session.host_names();
    if names == [crate::hosts::LOCAL] {
        return emit(cfg, v, table);
    }
    if !cfg.json {
        if rows.iter().any(|r| r.error.is_none()) {
            crate::outln!("{}", table());
        }
        return Ok(0);
    }
    let mut rows = rows.to_vec();
    rows.sort_by_key(|r| names.iter().position(|n| *n == r.host));
    let entry = |r: &render::HostRow| {
        let mut e = serde_json::json!({"host": r.host, "state": r.state});
        match &r.error {
            Some(err) => e["error"] = err.clone().into(),
            None => e["detail"] = r.detail.clone().into(),
        }
        e
    };
    let mut doc = serde_json::to_value(v).map_err(|e| Error::Other(e.to_string()))?;
    match &mut doc {
        serde_json::Value::Array(items) => {
            items.extend(rows.iter().filter(|r| r.error.is_some()).map(entry));
        }
        serde_json::Value::Object(map) => {
            map.insert("hosts".into(), rows.iter().map(entry).collect());
        }
        _ => {}
    }
    emit(cfg, &doc, String::new)
}

/// The one-shots refuse to read GPUs without a driver, on this machine alone; with a host
/// set each host answers for its own driver.
fn require_local_driver(s: &Session) -> Result<(), Error> {
    if s.host_names() == [crate::hosts::LOCAL] {
        s.require_driver()?;
    }
    Ok(())
}

/// `--user U` or `--mine`, and `--job N`, as a holder filter. The user goes to each host as
/// given (a name stays a name) and is looked up there; on this machine alone an unknown name
/// is a usage error at once.
fn owner_filter(s: &Session, owner: &Owner) -> Result<Filter, Error> {
    let user = match (&owner.user, owner.mine) {
        (_, true) => Some(User::Me),
        (Some(u), false) => Some(User::parse(u)),
        (None, false) => None,
    };
    let filter = Filter {
        user,
        job: owner.job,
    };
    actions::check_filter(s, &filter).map_err(|e| Error::Usage(format!("--user: {e}")))?;
    Ok(filter)
}

/// `gpuloop epilog` / `gpuloop prolog`.
fn hook(cfg: &Config, which: Hook, h: &HookFlags) -> Result<i32, Error> {
    let opts = HookOpts {
        timeout: seconds(h.timeout, "--timeout")?,
        grace: grace(h.grace)?,
        dry_run: h.dry_run,
    };
    let env = JobEnv::from(|k| std::env::var(k).ok())?;
    Ok(crate::slurm::run(&cfg.session, which, &env, &opts)?)
}

fn mcp(cfg: &Config, allow: &[String]) -> Result<i32, Error> {
    use crate::mcp::policy::Policy;
    let s = &cfg.session;
    let policy = Policy::from_lists(allow.iter().chain(&s.config.mcp_allow))
        .map_err(|e| Error::Usage(e.to_string()))?;
    crate::mcp::serve(s.clone(), policy).map_err(|e| Error::Other(e.to_string()))
}

/// `gpuloop journal`: the records are streamed (with `--json`, as a JSON array written as it
/// is read), so a journal of any size is shown in bounded memory.
fn journal(cfg: &Config, last: usize, filter: &crate::journal::Filter) -> Result<i32, Error> {
    use crate::journal;
    let err = |e: journal::JournalError| Error::Other(e.to_string());
    let dir = journal::dir().map_err(err)?;
    let mut first = true;
    let found = journal::last(&dir, filter, last, &mut |r| {
        if cfg.json {
            let sep = if first { "[\n  " } else { ",\n  " };
            crate::output::text(&format!(
                "{sep}{}",
                serde_json::to_string(&r).unwrap_or_default()
            ));
        } else {
            crate::outln!("{}", journal::line(&r));
        }
        first = false;
    })
    .map_err(err)?;
    if cfg.json {
        crate::outln!("{}", if first { "[]" } else { "\n]" });
    }
    let path = dir.join(journal::FILE);
    if found.bad > 0 {
        crate::errln!(
            "gpuloop: warning: {} line(s) of {} are not journal records",
            found.bad,
            path.display()
        );
    }
    if found.matched == 0 && !cfg.json {
        crate::errln!("nothing journaled that matches ({})", path.display());
    }
    Ok(0)
}

fn seconds(v: f64, what: &str) -> Result<Duration, Error> {
    crate::inspect::wait::seconds(v).map_err(|why| Error::Usage(format!("{what} {why}")))
}

/// `--grace SECS`, or `--grace inf` for never sending KILL.
fn grace(v: f64) -> Result<Duration, Error> {
    kill::grace_seconds(v).map_err(|why| Error::Usage(format!("--grace {why}")))
}

fn kill_opts(k: &KillFlags) -> Result<KillOpts, Error> {
    Ok(KillOpts {
        signal: parse_signal(&k.signal).ok_or_else(|| {
            Error::Usage(format!(
                "unknown signal {:?} (use TERM, INT, KILL, HUP, …)",
                k.signal
            ))
        })?,
        grace: grace(k.grace)?,
        tree: true,
        dry_run: k.dry_run,
        force: k.force,
        parents: k.parents,
        ..KillOpts::default()
    })
}

/// Prints JSON with --json, else the table. Keys come in one order everywhere, sorted by
/// name, as scripts' maps print under `eval --json`.
fn emit<T: Serialize>(cfg: &Config, v: &T, table: impl FnOnce() -> String) -> Result<i32, Error> {
    if cfg.json {
        let sorted = serde_json::to_value(v).map_err(|e| Error::Other(e.to_string()))?;
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&sorted).map_err(|e| Error::Other(e.to_string()))?
        );
    } else {
        crate::outln!("{}", table());
    }
    Ok(0)
}

/// `gpuloop kill`: exit 0 when every target is gone, 1 with survivors, stuck processes or
/// errors, 130 when interrupted during the grace.
fn kill_holders(
    cfg: &Config,
    sel: &HostSel,
    filter: &Filter,
    opts: &KillOpts,
) -> Result<i32, Error> {
    let parts = actions::kill_holders_per_host(&cfg.session, sel, filter, opts)?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    for (h, r) in &parts {
        let good = r.survivors.is_empty() && r.errors.is_empty();
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
        if !r.errors.is_empty() {
            detail.push_str(&format!(", {} error(s)", r.errors.len()));
        }
        rows.push(row(h, if good { "ok" } else { "failed" }, detail));
    }
    let report = actions::merge_kills(parts, opts.dry_run);
    emit_hosts(cfg, &report, &rows, || {
        render::kill_report(&report, Style::stdout())
    })?;
    Ok(summary(cfg, rows, true)?.max(kill_code(&report)))
}

/// `gpuloop kill PID…`: bare pids, resolved now, under the same rules as holders.
fn kill_pids(cfg: &Config, pids: &[i64], opts: &KillOpts) -> Result<i32, Error> {
    let mut targets = Vec::new();
    for &p in pids {
        let pid = i32::try_from(p)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| Error::Usage(format!("kill: {p} is not a process id")))?;
        targets.push((None, Target::Pid(pid)));
    }
    let report = actions::kill_routed(&cfg.session, &targets, opts, None)?;
    let code = kill_done(cfg, &report)?;
    // As kill(1): a pid named that is no process is a failure, not a quiet success.
    let missing: Vec<String> = report
        .skipped
        .iter()
        .filter(|s| s.reason == kill::GONE && pids.contains(&s.pid))
        .map(|s| s.pid.to_string())
        .collect();
    if missing.is_empty() {
        return Ok(code);
    }
    crate::errln!("gpuloop: kill: no such process: {}", missing.join(", "));
    Ok(code.max(1))
}

fn kill_done(cfg: &Config, report: &KillReport) -> Result<i32, Error> {
    emit(cfg, &report, || {
        render::kill_report(report, Style::stdout())
    })?;
    Ok(kill_code(report))
}

/// 130 when interrupted during the grace, 0 when every target is gone, else 1.
fn kill_code(report: &KillReport) -> i32 {
    if report.interrupted {
        130
    } else if report.survivors.is_empty() && report.errors.is_empty() && report.stuck.is_empty() {
        0
    } else {
        1
    }
}

fn wait_opts(timeout: f64, w: &WaitFlags) -> Result<WaitOpts, Error> {
    Ok(WaitOpts {
        timeout: seconds(timeout, "--timeout")?,
        settle: seconds(w.settle, "--settle")?,
        stall: seconds(w.stall, "--stall")?,
        strict: w.strict,
        ..WaitOpts::default()
    })
}

fn clean(
    cfg: &Config,
    sel: &HostSel,
    filter: &Filter,
    wait: &WaitOpts,
    kill: &KillFlags,
) -> Result<i32, Error> {
    require_local_driver(&cfg.session)?;
    let kill_opts = kill_opts(kill)?;
    if kill_opts.dry_run {
        // Nothing is signalled, so there is nothing to wait for: say what clean would stop.
        return kill_holders(cfg, sel, filter, &kill_opts);
    }
    let parts = actions::clean_per_host(&cfg.session, sel, filter, &kill_opts, wait)?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    for (h, c) in &parts {
        let mut r = diagnosis_row(h, &c.after, &wait.demand());
        r.detail = format!("stopped {}; {}", c.kill.signalled.len(), r.detail);
        if !c.clean && r.good() {
            r.state = "NOT clean".into();
        }
        rows.push(r);
    }
    let r = actions::merge_clean(parts, kill_opts.dry_run);
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
            render::kill_report(&r.kill, Style::stdout()),
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

/// `gpuloop man`: the page of gpuloop itself on stdout, or with `dir` every command's page
/// (gpuloop.1, gpuloop-clean.1, gpuloop-sim-hold.1, …) written there, each with all its options.
fn man(dir: Option<&Path>) -> Result<i32, Error> {
    let cmd = <Args as clap::CommandFactory>::command();
    let Some(dir) = dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut out)
            .map_err(|e| Error::Other(format!("man page: {e}")))?;
        crate::output::bytes(&out);
        return Ok(0);
    };
    std::fs::create_dir_all(dir)
        .and_then(|()| clap_mangen::generate_to(cmd, dir))
        .map_err(|e| Error::Other(format!("writing man pages into {}: {e}", dir.display())))?;
    crate::outln!("wrote the man pages into {}", dir.display());
    Ok(0)
}

/// `gpuloop doc`: the reference in Markdown, or definition files for editors.
fn doc(cfg: &Config, definitions: Option<&Path>) -> Result<i32, Error> {
    let engine = build_engine(cfg.session.clone(), &EngineOpts::default());
    match definitions {
        Some(dir) => {
            crate::script::doc::write_definitions(&engine, dir).map_err(Error::Other)?;
            crate::outln!("wrote Rhai definitions to {}", dir.display());
        }
        None => crate::output::text(&crate::script::doc::markdown(&engine)),
    }
    Ok(0)
}

/// `gpuloop wait`: wait_clean, then the report (which says what is left: the wait is quiet);
/// kills nothing. With a filter it waits for the GPUs the filtered processes hold now.
fn wait_only(cfg: &Config, sel: &HostSel, filter: &Filter, opts: &WaitOpts) -> Result<i32, Error> {
    require_local_driver(&cfg.session)?;
    let held = if filter.is_empty() {
        None
    } else {
        let Some(held) = actions::held_by(&cfg.session, sel, filter)? else {
            // Nothing was verified: never "clean" (their memory may still be on its way back,
            // after a kill); `gpuloop wait` without the filter checks the GPUs.
            crate::errln!("gpuloop: wait: nothing to wait for: no process of that --user/--mine/--job holds a selected GPU (their memory is not checked; gpuloop wait without it checks the GPUs)");
            return emit(
                cfg,
                &serde_json::json!({"clean": null, "nothing_to_wait_for": true, "gpus": []}),
                || "nothing to wait for".into(),
            );
        };
        Some(held)
    };
    let sel = held.as_ref().unwrap_or(sel);
    let outcome = actions::wait_quietly(&cfg.session, sel, opts)?;
    let clean = match outcome {
        WaitOutcome::Interrupted => return Ok(130),
        o => o.is_clean(),
    };
    let parts = actions::diagnoses_per_host(&cfg.session, sel, &Filter::default())?;
    let (parts, mut rows) = per_host(cfg, parts)?;
    let mut after = Vec::new();
    for (h, part) in parts {
        rows.push(diagnosis_row(&h, &part, &opts.demand()));
        after.extend(part);
    }
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
    Ok(if clean { code } else { 1 })
}

/// The script SCRIPT names: stdin, a file (a path), or a built-in recipe (a bare name, never
/// a file of the current directory). A recipe has no directory of its own: its imports come
/// from GPULOOP_PATH, the user's modules and the standard library, never from the current
/// directory either.
fn read_script(script: &str) -> Result<(String, String, Option<std::path::PathBuf>), Error> {
    use crate::input::{self, ReadError};
    use crate::script::recipes::{self, Named};
    let path = match Named::of(script) {
        Named::Stdin => {
            let src = input::stdin(input::SCRIPT)
                .and_then(|b| String::from_utf8(b).map_err(|_| ReadError::NotUtf8))
                .map_err(|e| match e {
                    ReadError::Interrupted => {
                        Error::Script(crate::script::ScriptError::Interrupted)
                    }
                    e => Error::Usage(format!("cannot read the script from stdin: {e}")),
                })?;
            let src = input::without_bom(&src).to_string();
            return Ok(("<stdin>".into(), src, std::env::current_dir().ok()));
        }
        Named::Recipe(name) => {
            let src = recipes::find(name).ok_or_else(|| {
                Error::Usage(format!(
                    "no recipe named {name:?} (built-in recipes: {}; gpuloop recipes lists \
                     them); to run a file, name it by its path: ./{name}",
                    recipes::names()
                ))
            })?;
            return Ok((name.to_string(), src.to_string(), None));
        }
        Named::File(path) => Path::new(path),
    };
    let src = input::text(path, input::SCRIPT).map_err(|e| {
        let hint = match e {
            // Only a missing file may have meant a recipe.
            ReadError::Io(ref io) if io.kind() == std::io::ErrorKind::NotFound => format!(
                " (built-in recipes: {}; gpuloop recipes lists them)",
                recipes::names()
            ),
            _ => String::new(),
        };
        Error::Usage(format!("cannot read script {script}: {e}{hint}"))
    })?;
    let dir = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .and_then(|p| p.canonicalize().ok());
    Ok((
        script.to_string(),
        input::without_bom(&src).to_string(),
        dir,
    ))
}

fn run_script(cfg: &Config, script: &str, args: &[String]) -> Result<i32, Error> {
    // `run SCRIPT -- ARGS…`, the older spelling, still works: that `--` is no argument.
    let args = match args.split_first() {
        Some((first, rest)) if first == "--" => rest,
        _ => args,
    };
    let (file, src, dir) = read_script(script)?;
    // Whatever the script started (run/spawn) is stopped when this goes out of scope.
    let _jobs = crate::runner::Supervisor::start();
    let session = cfg.session.clone();
    let engine = build_engine(
        session,
        &EngineOpts {
            script_dir: dir,
            json: cfg.json,
        },
    );
    let mut scope = new_scope(args);
    let _ = run_source(&engine, &mut scope, &file, &src)?;
    Ok(0)
}

fn eval(cfg: &Config, code: &str) -> Result<i32, Error> {
    let _jobs = crate::runner::Supervisor::start();
    let session = cfg.session.clone();
    let dir = std::env::current_dir().ok();
    let engine = build_engine(
        session,
        &EngineOpts {
            script_dir: dir,
            json: cfg.json,
        },
    );
    let mut scope = new_scope(&[]);
    let v = run_source(&engine, &mut scope, "<eval>", code)?;
    let depth = cfg.session.config.limits.depth;
    if let Err(e) = crate::script::convert::check_depth(&v, "eval", depth) {
        return Err(Error::Other(
            e.to_string()
                .trim_start_matches("Runtime error: ")
                .to_string(),
        ));
    }
    if cfg.json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&render::json(&v)).unwrap_or_default()
        );
    } else if !v.is_unit() {
        crate::outln!("{}", render::value(&v, Style::stdout()));
    }
    Ok(0)
}

/// `gpuloop check`: compiles each script and finds the modules it imports, as `run` would.
fn check(cfg: &Config, scripts: &[std::path::PathBuf]) -> Result<i32, Error> {
    let mut failed = 0;
    for p in scripts {
        let (file, src, dir) = match read_script(&p.display().to_string()) {
            Ok(s) => s,
            Err(e) => {
                crate::errln!("gpuloop: {e}");
                failed += 1;
                continue;
            }
        };
        let engine = build_engine(
            cfg.session.clone(),
            &EngineOpts {
                script_dir: dir,
                json: cfg.json,
            },
        );
        let checked = crate::script::engine::compile(&engine, &file, &src)
            .and_then(|ast| crate::script::engine::check_imports(&engine, &ast, &file, &src));
        match checked {
            Ok(()) => crate::outln!("ok: {file}"),
            Err(e) => {
                crate::errln!("{}", e.message());
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 { 2 } else { 0 })
}

fn sim(cfg: &Config, cmd: &SimCmd) -> Result<i32, Error> {
    let sim = cfg.session.sim()?;
    match cmd {
        SimCmd::Hold { mib, workers, .. } => {
            if *mib < 0 {
                return Err(Error::Usage(format!(
                    "--mib must be non-negative, got {mib}"
                )));
            }
            if !(0..=4096).contains(workers) {
                return Err(Error::Usage(format!(
                    "--workers must be between 0 and 4096, got {workers}"
                )));
            }
            let opts = hold_opts(cmd);
            let pids = hold::launch(&sim, &opts)?;
            if cfg.json {
                crate::outln!("{}", serde_json::to_string(&pids).unwrap_or_default());
            } else {
                for p in pids {
                    crate::outln!("{p}");
                }
            }
            Ok(0)
        }
        SimCmd::Leak { gpu, mib } => {
            if *mib <= 0 {
                return Err(Error::Usage("--mib must be positive".into()));
            }
            sim.leak(*gpu, *mib)?;
            Ok(0)
        }
        SimCmd::Reset { gpu } => {
            crate::gpu::Backend::reset(&sim, *gpu, &crate::process::helpers::output)?;
            Ok(0)
        }
        SimCmd::Ls => {
            let hs = sim_holders(cfg)?;
            emit(cfg, &hs, || render::holders(&hs, Style::stdout()))
        }
        SimCmd::Stop => {
            let mut targets: Vec<Target> = Vec::new();
            for h in sim_holders(cfg)? {
                // A `--workers` launcher holds nothing itself: it is the holders' parent.
                let mut pid = h.pid as i32;
                while let Ok(p) = crate::process::read_stat(pid) {
                    if !is_sim_holder(&crate::process::cmdline(pid)) {
                        break;
                    }
                    let t = Target::Exact(p.identity());
                    if !targets.contains(&t) {
                        targets.push(t);
                    }
                    pid = p.ppid;
                }
            }
            let opts = KillOpts {
                signal: nix::sys::signal::Signal::SIGKILL,
                tree: false,
                // A simulated nvidia-persistenced is still the simulator's own.
                force: true,
                ..KillOpts::default()
            };
            // Stuck holders go only once released: thaw them after the KILL is pending.
            let mut report = actions::kill(&cfg.session, &targets, &opts);
            if !report.stuck.is_empty() {
                crate::gpu::sim::stuck::release(&sim)?;
                let end = std::time::Instant::now() + Duration::from_secs(5);
                while report
                    .stuck
                    .iter()
                    .any(|s| crate::process::alive(s.pid as i32))
                    && std::time::Instant::now() < end
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let (gone, stuck) = report
                    .stuck
                    .drain(..)
                    .partition(|s| !crate::process::alive(s.pid as i32));
                report.stuck = stuck;
                report
                    .exited
                    .extend(gone.into_iter().map(|s: crate::process::kill::Stuck| s.pid));
            }
            kill_done(cfg, &report)
        }
        SimCmd::Release => {
            let n = crate::gpu::sim::stuck::release(&sim)?;
            crate::outln!("released {n} stuck holder(s)");
            Ok(0)
        }
        SimCmd::Watch { .. } => Err(Error::Usage("sim watch is internal".into())),
    }
}

/// Every process holding the simulator's device nodes that `gpuloop sim hold` started:
/// others that opened them (a test, a script) are not the simulator's to stop.
fn sim_holders(cfg: &Config) -> Result<Vec<crate::inspect::holders::Holder>, Error> {
    let mut hs = actions::holders(&cfg.session, &None, true)?;
    hs.retain(|h| is_sim_holder(&h.cmdline));
    Ok(hs)
}

fn is_sim_holder(cmdline: &str) -> bool {
    cmdline.contains(" sim hold ") && cmdline.contains("--as-holder")
}

fn hold_opts(cmd: &SimCmd) -> HoldOpts {
    match cmd {
        SimCmd::Hold {
            gpu,
            mib,
            name,
            observer,
            ignore_term,
            fork_child,
            workers,
            setsid,
            exit_creator,
            map_all,
            shared_group,
            foreground,
            supervise,
            catch_term,
            stuck,
            defunct_leader,
            ..
        } => HoldOpts {
            gpu: *gpu,
            mib: *mib,
            name: name.clone(),
            observer: *observer,
            ignore_term: *ignore_term,
            fork_child: *fork_child,
            workers: u32::try_from(*workers).unwrap_or(0),
            setsid: *setsid,
            exit_creator: *exit_creator,
            map_all: *map_all,
            shared_group: *shared_group,
            foreground: *foreground,
            supervise: *supervise,
            catch_term: *catch_term,
            stuck: *stuck,
            defunct_leader: *defunct_leader,
        },
        _ => HoldOpts::default(),
    }
}

/// The holder and watcher processes: single-threaded, no signal handlers, no config.
pub fn sim_internal(args: &Args) -> Result<i32, Error> {
    let spec = args.sim.as_deref().filter(|s| !s.trim().is_empty());
    let sim = SimBackend::open(&crate::gpu::sim::state_dir(), spec)?;
    match &args.cmd {
        Cmd::Sim(SimCmd::Watch { alloc }) => {
            crate::gpu::sim::watch(&sim, alloc, sim.spec.release_ms)?;
            Ok(0)
        }
        Cmd::Sim(cmd) => {
            let opts = hold_opts(cmd);
            if opts.mib < 0 {
                return Err(Error::Usage("--mib must not be negative".into()));
            }
            if opts.foreground {
                hold::run_foreground(&sim, &opts)
            } else {
                hold::run_holder(&sim, &opts)
            }
        }
        _ => Ok(2),
    }
}
