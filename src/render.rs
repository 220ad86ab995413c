//! Tables for people: GPUs, holders, diagnoses and kill reports, as the one-shot commands print them.

use crate::gpu::Gpu;
use crate::inspect::diagnose::Diagnosis;
use crate::inspect::holders::Holder;
use crate::process::kill::KillReport;
use comfy_table::{presets, CellAlignment, ContentArrangement, Table};

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    t
}

fn right(t: &mut Table, cols: &[usize]) {
    for &c in cols {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
}

fn opt(v: Option<i64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn join(v: &[i64]) -> String {
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn trimmed(t: Table) -> String {
    t.lines().map(|l| l.trim_end().to_string()).collect::<Vec<_>>().join("\n")
}

pub fn gpus(gpus: &[Gpu]) -> String {
    if gpus.is_empty() {
        return "no GPUs".into();
    }
    let mut t = table(&["GPU", "NAME", "USED MiB", "TOTAL MiB", "UTIL%", "TEMP", "PROCS", "BUS"]);
    for g in gpus {
        t.add_row(vec![
            g.index.to_string(),
            g.name.clone(),
            g.mem_used_mib.to_string(),
            g.mem_total_mib.to_string(),
            opt(g.util),
            opt(g.temp_c),
            g.procs.to_string(),
            g.bus_id.clone(),
        ]);
    }
    right(&mut t, &[0, 2, 3, 4, 5, 6]);
    trimmed(t)
}

pub fn holders(hs: &[Holder]) -> String {
    if hs.is_empty() {
        return "no holders".into();
    }
    let mut t = table(&["PID", "USER", "NAME", "GPUS", "MiB", "STATE", "ROLE", "EVIDENCE", "COMMAND"]);
    for h in hs {
        let mut cmd = h.cmdline.clone();
        if cmd.chars().count() > 60 {
            cmd = cmd.chars().take(57).collect::<String>() + "...";
        }
        t.add_row(vec![
            h.pid.to_string(),
            h.user.clone(),
            h.name.clone(),
            join(&h.gpus),
            (h.mem / crate::gpu::MIB).to_string(),
            h.state.clone(),
            h.role.clone(),
            h.evidence.join("+"),
            cmd,
        ]);
    }
    right(&mut t, &[0, 4]);
    trimmed(t)
}

pub fn diagnoses(ds: &[Diagnosis]) -> String {
    if ds.is_empty() {
        return "no GPUs".into();
    }
    let mut out = Vec::new();
    for d in ds {
        let holders = d
            .holders
            .iter()
            .map(|h| format!("{}({})", h.name, h.pid))
            .collect::<Vec<_>>()
            .join(", ");
        let mut line = format!("GPU {}  {:>7} MiB  {:<15}  {}", d.gpu, d.mem_used_mib, d.verdict, d.advice);
        if !holders.is_empty() && d.verdict != "clean" {
            line.push_str(&format!("\n        holders: {holders}"));
        }
        if !d.ghost_pids.is_empty() {
            line.push_str(&format!("\n        driver lists dead/invisible pids: {}", join(&d.ghost_pids)));
        }
        out.push(line);
    }
    out.join("\n")
}

pub fn kill_report(r: &KillReport) -> String {
    let mut out = Vec::new();
    let verb = if r.dry_run { "would signal" } else { "signalled" };
    out.push(format!("{verb}: {}", list_or_none(&r.signalled)));
    if !r.dry_run {
        out.push(format!("exited: {}", list_or_none(&r.exited)));
        if !r.survivors.is_empty() {
            out.push(format!("survivors: {}", join(&r.survivors)));
        }
    }
    for s in &r.skipped {
        out.push(format!("skipped {}: {}", s.pid, s.reason));
    }
    for e in &r.errors {
        out.push(format!("error {}: {}", e.pid, e.error));
    }
    out.push(format!("({} ms)", r.elapsed_ms));
    out.join("\n")
}

fn list_or_none(v: &[i64]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        join(v)
    }
}
