//! The one line of text each MCP tool result carries, for a model to quote.

use crate::gpu::Gpu;
use crate::inspect::diagnose::Diagnosis;
use crate::inspect::holders::Holder;
use crate::machine::{self, CleanReport};
use crate::process::kill::KillReport;
use crate::runner::Outcome;
use std::time::Duration;

fn pids(v: &[i64]) -> String {
    const SHOWN: usize = 12;
    let mut s: Vec<String> = v.iter().take(SHOWN).map(|p| p.to_string()).collect();
    if v.len() > SHOWN {
        s.push(format!("… ({} in all)", v.len()));
    }
    s.join(", ")
}

fn gpu_list(v: &[i64]) -> String {
    let s: Vec<String> = v.iter().map(|g| g.to_string()).collect();
    s.join(",")
}

pub(super) fn gpus(gpus: &[Gpu]) -> String {
    if gpus.is_empty() {
        return "no GPUs".into();
    }
    let used: Vec<String> = gpus
        .iter()
        .filter(|g| g.mem_used_mib > 0)
        .map(|g| format!("GPU {} {}/{} MiB", g.index, g.mem_used_mib, g.mem_total_mib))
        .collect();
    let head = format!(
        "{} ({})",
        crate::words::count(gpus.len(), "GPU", "GPUs"),
        gpus[0].name
    );
    if used.is_empty() {
        format!("{head}: no memory used on any")
    } else {
        format!("{head}: memory used on {}", used.join("; "))
    }
}

pub(super) fn holders(hs: &[Holder], all: bool) -> String {
    let what = match (all, hs.len()) {
        (true, 1) => "holder",
        (true, _) => "holders",
        (false, 1) => "compute holder",
        (false, _) => "compute holders",
    };
    if hs.is_empty() {
        return format!("no {what}");
    }
    let shown: Vec<String> = hs
        .iter()
        .take(8)
        .map(|h| {
            let place = h
                .origin
                .place
                .describe()
                .map(|p| format!(", {p}"))
                .unwrap_or_default();
            // A forked child of a dead creator: what it keeps alive, said as inherited.
            let mib = match &h.inherited {
                Some(i) if h.mem == 0 => format!("{} MiB inherited", i.mem_mib),
                _ => format!("{} MiB", h.mem / crate::gpu::MIB),
            };
            format!(
                "pid {} {} ({}, GPU {}, {mib}{place})",
                h.pid,
                h.name,
                h.role,
                gpu_list(&h.gpus)
            )
        })
        .collect();
    let more = if hs.len() > 8 {
        format!("; … {} more", hs.len() - 8)
    } else {
        String::new()
    };
    format!("{} {what}: {}{more}", hs.len(), shown.join("; "))
}

pub(super) fn diagnoses(ds: &[Diagnosis]) -> String {
    let dirty: Vec<String> = ds
        .iter()
        .filter(|d| !d.is_clean())
        .map(|d| {
            format!(
                "{} ({} MiB)",
                machine::describe_diagnosis(d),
                d.mem_used_mib
            )
        })
        .collect();
    if dirty.is_empty() {
        return match ds.len() {
            1 => "the selected GPU is clean".to_string(),
            n => format!("all {n} selected GPUs clean"),
        };
    }
    match ds.len() - dirty.len() {
        0 => dirty.join(" | "),
        n => format!(
            "{}; {} clean",
            dirty.join(" | "),
            crate::words::count(n, "other GPU", "other GPUs")
        ),
    }
}

/// `why`: how the wait ended when not clean (`machine::why_not_clean`).
pub(super) fn wait(
    clean: bool,
    elapsed: Duration,
    why: Option<String>,
    after: &[Diagnosis],
) -> String {
    if clean {
        return format!(
            "clean after {:.2}s: {} verified free",
            elapsed.as_secs_f64(),
            crate::words::count(after.len(), "GPU", "GPUs")
        );
    }
    let why = why.unwrap_or_else(|| "NOT clean".into());
    format!(
        "{}: {}",
        why.replacen("not clean", "NOT clean", 1),
        diagnoses(after)
    )
}

pub(super) fn kill(r: &KillReport) -> String {
    let skipped = if r.skipped.is_empty() {
        String::new()
    } else {
        let s: Vec<String> = r
            .skipped
            .iter()
            .take(6)
            .map(|s| format!("pid {}: {}", s.pid, s.reason))
            .collect();
        format!("; skipped {}", s.join("; "))
    };
    if r.dry_run {
        if r.would_signal.is_empty() {
            return format!("dry run: nothing would be signalled{skipped}");
        }
        return format!(
            "dry run: would signal {}: {} {}{skipped}",
            crate::words::count(r.would_signal.len(), "process", "processes"),
            crate::words::pick(r.would_signal.len(), "pid", "pids"),
            pids(&r.would_signal)
        );
    }
    if r.signalled.is_empty() {
        return format!("nothing signalled{skipped}");
    }
    let mut line = format!(
        "signalled {} ({} {}), {} exited",
        crate::words::count(r.signalled.len(), "process", "processes"),
        crate::words::pick(r.signalled.len(), "pid", "pids"),
        pids(&r.signalled),
        r.exited.len()
    );
    if !r.survivors.is_empty() {
        line.push_str(&format!(", SURVIVORS: {}", pids(&r.survivors)));
    }
    if !r.errors.is_empty() {
        let e: Vec<String> = r
            .errors
            .iter()
            .map(|e| format!("pid {}: {}", e.pid, e.error))
            .collect();
        line.push_str(&format!(", errors: {}", e.join("; ")));
    }
    line.push_str(&skipped);
    line
}

pub(super) fn clean(r: &CleanReport) -> String {
    let verdict = if r.clean {
        let used: i64 = r.after.iter().map(|d| d.mem_used_mib).sum();
        format!(
            "clean, verified: {}, {used} MiB used, no compute holder",
            crate::words::count(r.after.len(), "GPU", "GPUs")
        )
    } else {
        format!("NOT clean: {}", diagnoses(&r.after))
    };
    format!("{verdict}; kill: {}", kill(&r.kill))
}

pub(super) fn run(cmd: &str, o: &Outcome, timeout: Option<Duration>, leftovers: &[i64]) -> String {
    let mut line = format!(
        "`{cmd}` {} in {:.1}s",
        o.how(timeout),
        o.elapsed_ms as f64 / 1e3
    );
    if !leftovers.is_empty() {
        line.push_str(&format!(
            "; stopped {} it left running ({} {})",
            crate::words::count(leftovers.len(), "process", "processes"),
            crate::words::pick(leftovers.len(), "pid", "pids"),
            pids(leftovers)
        ));
    }
    line
}
