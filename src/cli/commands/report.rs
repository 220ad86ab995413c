//! What the one-shots share over several hosts: each host's row of the summary, the
//! failures said once, clean or idle hosts folded into a line, and the exit code over them.

use super::emit;
use crate::cli::Config;
use crate::error::Error;
use crate::exit::Exit;
use crate::inspect::diagnose::Demand;
use crate::machine::{self, ActionError};
use crate::render::{self, HostState, Style};
use serde::Serialize;

/// A host's row of the summary, with what it says of the host.
pub(super) fn row(host: &str, state: HostState, detail: String) -> render::HostRow {
    render::HostRow {
        host: host.to_string(),
        state,
        detail,
        error: None,
        usage: false,
    }
}

/// Over several hosts and without `--wide`/`--all-rows`: the records of the hosts in
/// `quiet` left out, and a line that names those hosts as a hostlist.
pub(super) fn fold_rows<T: Clone>(
    cfg: &Config,
    items: &[T],
    quiet: &[String],
    what: &str,
    host: impl Fn(&T) -> &String,
) -> (Vec<T>, Option<String>) {
    let several = !cfg.session.is_local();
    if !several || quiet.is_empty() || crate::output::wide() {
        return (items.to_vec(), None);
    }
    let quiet_set: std::collections::HashSet<&String> = quiet.iter().collect();
    let shown = items
        .iter()
        .filter(|i| !quiet_set.contains(host(i)))
        .cloned()
        .collect();
    let note = format!(
        "(the GPUs of {} {what} {} are not listed one by one: {}; --all-rows lists them)",
        quiet.len(),
        crate::words::pick(quiet.len(), "host", "hosts"),
        crate::hosts::fold::compress(quiet)
    );
    (shown, Some(note))
}

/// A table and the note of what was folded out of it (the note alone if nothing is left).
pub(super) fn with_note(table: String, empty: bool, note: Option<String>) -> String {
    match note {
        Some(n) if empty => n,
        Some(n) => format!("{table}\n{n}"),
        None => table,
    }
}

/// The diagnoses, those of clean hosts folded into one line.
pub(super) fn diagnoses_folded(
    cfg: &Config,
    ds: &[crate::inspect::diagnose::Diagnosis],
    rows: &[render::HostRow],
) -> String {
    let clean: Vec<String> = rows
        .iter()
        .filter(|r| r.state == HostState::Clean)
        .map(|r| r.host.clone())
        .collect();
    let (shown, note) = fold_rows(cfg, ds, &clean, "clean", |d| &d.host);
    with_note(
        render::diagnoses(&shown, Style::stdout()),
        shown.is_empty(),
        note,
    )
}

pub(super) fn diagnosis_row(
    host: &str,
    ds: &[crate::inspect::diagnose::Diagnosis],
    demand: &Demand,
) -> render::HostRow {
    let dirty: Vec<String> = ds
        .iter()
        .filter(|d| !d.is_clean_under(demand))
        .map(machine::describe_diagnosis)
        .collect();
    if dirty.is_empty() {
        let n = crate::words::count(ds.len(), "GPU", "GPUs");
        row(host, HostState::Clean, format!("{n} clean"))
    } else {
        row(host, HostState::NotClean, dirty.join("; "))
    }
}

/// Splits a one-shot's per-host results into the hosts that answered and a summary row for
/// each that did not; each failure is said once, here, on stderr (in the JSON document with
/// --json). On this machine alone a failure is the command's error, as always.
#[allow(clippy::type_complexity)]
pub(super) fn per_host<T>(
    cfg: &Config,
    parts: machine::PerHost<T>,
) -> Result<(Vec<(String, T)>, Vec<render::HostRow>), Error> {
    let several = !cfg.session.is_local();
    let skip = cfg.session.skip_unreachable();
    let mut ok = Vec::new();
    let mut rows = Vec::new();
    for (h, r) in parts {
        match r {
            Ok(v) => ok.push((h, v)),
            // Ctrl-C or TERM while the hosts were opened or answering: the run ends
            // interrupted, with nothing said for each host it did not reach.
            Err(ActionError::Interrupted) => return Err(Error::Interrupted),
            Err(f) if !several => return Err(f.into()),
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
                    (true, _) => HostState::Skipped,
                    (false, true) => HostState::Unreachable,
                    (false, false) => HostState::Failed,
                };
                // A few words, alike for every host that failed the same way, so that they
                // fold; the whole error was said above.
                let mut r = row(&h, state, f.kind().to_string());
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
pub(super) fn summary(
    cfg: &Config,
    mut rows: Vec<render::HostRow>,
    show: bool,
) -> Result<Exit, Error> {
    if cfg.session.is_local() {
        return Ok(Exit::Success);
    }
    in_set_order(cfg, &mut rows);
    let answered = rows.iter().any(|r| r.error.is_none());
    let failed: Vec<&str> = rows.iter().filter_map(|r| r.error.as_deref()).collect();
    if cfg.json {
        if !failed.is_empty() {
            // Hosts skipped as --skip-unreachable asked are a warning, not the command's error.
            let skipped = rows
                .iter()
                .all(|r| r.error.is_none() || r.state == HostState::Skipped);
            let (key, what) = match skipped {
                true => ("warning", "skipped"),
                false => ("error", "failed"),
            };
            let text = format!(
                "{} of {} {what}: {}",
                failed.len(),
                crate::words::count(rows.len(), "host", "hosts"),
                failed.join("; ")
            );
            let said = serde_json::json!({ key: text });
            crate::errln!("{}", crate::shown::json(&said, false).unwrap_or_default());
        }
    } else if show && answered {
        // Nothing answered: the errors above are all there is; nothing here reads as a result.
        crate::outln!("\n{}", render::host_summary(&rows, Style::stdout()));
    }
    let good = rows.iter().all(|r| r.state.passes());
    // A mistake in what was asked is exit 2 through a host as it is here.
    Ok(if rows.iter().any(|r| r.usage) {
        Exit::Usage
    } else {
        Exit::success_if(answered && good)
    })
}

/// Puts the rows in host-set order (each host's place looked up, not searched for: a search
/// per row made the summary of 65,536 hosts quadratic).
fn in_set_order(cfg: &Config, rows: &mut [render::HostRow]) {
    let names = cfg.session.host_names();
    let place: std::collections::HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    rows.sort_by_key(|r| place.get(r.host.as_str()).copied());
}

/// `emit` over several hosts: with --json each host that failed is in the document (an
/// entry `{"host", "state", "error"}` of a list; a report gets `"hosts"`, every host's row);
/// as text nothing at all when no host answered.
pub(super) fn emit_hosts<T: Serialize>(
    cfg: &Config,
    v: &T,
    rows: &[render::HostRow],
    table: impl FnOnce() -> String,
) -> Result<Exit, Error> {
    if cfg.session.is_local() {
        return emit(cfg, v, table);
    }
    if !cfg.json {
        if rows.iter().any(|r| r.error.is_none()) {
            crate::outln!("{}", table());
        }
        return Ok(Exit::Success);
    }
    let mut rows = rows.to_vec();
    in_set_order(cfg, &mut rows);
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
