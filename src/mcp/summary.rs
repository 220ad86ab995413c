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
    let head = format!("{} GPU(s) ({})", gpus.len(), gpus[0].name);
    if used.is_empty() {
        format!("{head}: no memory used on any")
    } else {
        format!("{head}: memory used on {}", used.join("; "))
    }
}

pub(super) fn holders(hs: &[Holder], all: bool) -> String {
    let what = if all {
        "holder(s)"
    } else {
        "compute holder(s)"
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
            format!(
                "pid {} {} ({}, GPU {}, {} MiB{place})",
                h.pid,
                h.name,
                h.role,
                gpu_list(&h.gpus),
                h.mem / crate::gpu::MIB
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
        return format!("all {} selected GPU(s) clean", ds.len());
    }
    let clean = ds.len() - dirty.len();
    format!("{}; {clean} other GPU(s) clean", dirty.join(" | "))
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
            "clean after {:.2}s: {} GPU(s) verified free",
            elapsed.as_secs_f64(),
            after.len()
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
            "dry run: would signal {} process(es): pids {}{skipped}",
            r.would_signal.len(),
            pids(&r.would_signal)
        );
    }
    if r.signalled.is_empty() {
        return format!("nothing signalled{skipped}");
    }
    let mut line = format!(
        "signalled {} process(es) (pids {}), {} exited",
        r.signalled.len(),
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
            "clean, verified: {} GPU(s), {used} MiB used, no compute holder",
            r.after.len()
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
            "; stopped {} process(es) it left running (pids {})",
            leftovers.len(),
            pids(leftovers)
        ));
    }
    line
}
