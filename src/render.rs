//! Output for people: GPU and holder tables, diagnosis and kill summaries, and any Rhai value
//! (the REPL and `eval`), in colour only on a terminal; plus the JSON form of a Rhai value.

use crate::gpu::{Gpu, MIB};
use crate::inspect::diagnose::{Diagnosis, FootprintOf, Verdict};
use crate::inspect::holders::Holder;
use crate::inspect::kinds::{Evidence, Role, RunState, State};
use crate::process::kill::KillReport;
use comfy_table::{presets, Attribute, Cell, CellAlignment, Color, ContentArrangement, Table};
use rhai::{Array, Dynamic, Map};

/// Whether output gets ANSI colour, and how wide its lines may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    pub color: bool,
    /// The line width to fit (a terminal's); `None`: no limit.
    pub width: Option<usize>,
}

impl Style {
    pub const PLAIN: Style = Style {
        color: false,
        width: None,
    };

    /// Colour as `--color` says (by default only on a terminal, unless `NO_COLOR` is set);
    /// the terminal's width unless `--wide`.
    pub fn stdout() -> Style {
        Style {
            color: crate::output::color_stdout(),
            width: crate::output::width(),
        }
    }

    fn paint(self, s: &str, code: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn green(self, s: &str) -> String {
        self.paint(s, "32")
    }
    fn red(self, s: &str) -> String {
        self.paint(s, "31")
    }
    pub fn bold(self, s: &str) -> String {
        self.paint(s, "1")
    }
}

fn table(header: &[&str], style: Style) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| {
            let c = Cell::new(h);
            if style.color {
                c.add_attribute(Attribute::Bold)
            } else {
                c
            }
        }));
    // comfy-table would otherwise decide on its own whether stdout is a terminal.
    if style.color {
        t.enforce_styling();
    } else {
        t.force_no_tty();
    }
    t
}

fn right(t: &mut Table, cols: &[usize]) {
    for &c in cols {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
}

fn colored(text: String, color: Option<Color>, style: Style) -> Cell {
    match color {
        Some(c) if style.color => Cell::new(text).fg(c),
        _ => Cell::new(text),
    }
}

fn opt(v: Option<i64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn join(v: &[i64]) -> String {
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn trimmed(t: Table) -> String {
    t.lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rows from several hosts get a HOST column; a single local machine does not need one.
fn multi_host<'a>(hosts: impl IntoIterator<Item = &'a str>) -> bool {
    hosts.into_iter().any(|h| h != "local")
}

pub fn gpus(gpus: &[Gpu], style: Style) -> String {
    if gpus.is_empty() {
        return "no GPUs".into();
    }
    let hosts = multi_host(gpus.iter().map(|g| g.host.as_str()));
    let mut header = vec![
        "GPU",
        "NAME",
        "USED MiB",
        "TOTAL MiB",
        "UTIL%",
        "TEMP",
        "PROCS",
        "BUS",
    ];
    if hosts {
        header.insert(0, "HOST");
    }
    let mut t = table(&header, style);
    for g in gpus {
        let used = if g.mem_used_mib > 0 || g.error.is_some() {
            Color::Yellow
        } else {
            Color::Green
        };
        // A GPU that could not be read: its figures are unknown, never 0; the error follows.
        let (name, used_mib) = match &g.error {
            Some(_) => ("(driver error)".to_string(), "?".to_string()),
            None => (g.name.clone(), g.mem_used_mib.to_string()),
        };
        let mut row = vec![
            Cell::new(g.index),
            Cell::new(name),
            colored(used_mib, Some(used), style),
            Cell::new(g.mem_total_mib),
            Cell::new(opt(g.util)),
            Cell::new(opt(g.temp_c)),
            Cell::new(g.procs),
            Cell::new(&g.bus_id),
        ];
        if hosts {
            row.insert(0, Cell::new(&g.host));
        }
        t.add_row(row);
    }
    let shift = usize::from(hosts);
    right(&mut t, &[0, 2, 3, 4, 5, 6].map(|c| c + shift));
    let mut out = trimmed(t);
    for g in gpus {
        if let Some(e) = &g.error {
            let on = if hosts {
                format!("{}: ", g.host)
            } else {
                String::new()
            };
            out.push_str(&format!("\n{on}{}", style.red(&format!("error: {e}"))));
        }
    }
    out
}

fn state_color(state: State) -> Option<Color> {
    match state.run {
        _ if state.main_thread_exited => None,
        RunState::Running => Some(Color::Green),
        r if r.is_trouble() => Some(Color::Red),
        _ => None,
    }
}

pub fn holders(hs: &[Holder], style: Style) -> String {
    if hs.is_empty() {
        return "no holders".into();
    }
    let hosts = multi_host(hs.iter().map(|h| h.host.as_str()));
    let jobs = hs.iter().any(|h| h.origin.job.is_some());
    let mut header = vec![
        "PID", "PARENT", "USER", "NAME", "GPUS", "MiB", "STATE", "ROLE", "EVIDENCE", "COMMAND",
    ];
    if jobs {
        header.insert(3, "JOB");
    }
    if hosts {
        header.insert(0, "HOST");
    }
    let rows = |cmd: &dyn Fn(&str) -> String| {
        let mut t = table(&header, style);
        for h in hs {
            t.add_row(holder_row(h, cmd(&h.cmdline), hosts, jobs, style));
        }
        let shift = usize::from(hosts);
        right(&mut t, &[0, 5 + usize::from(jobs)].map(|c| c + shift));
        trimmed(t)
    };
    let Some(width) = style.width else {
        return rows(&|c| c.to_string());
    };
    // The COMMAND column gets what the terminal has left (`--wide` for all of it).
    let rest = rows(&|_| String::new())
        .lines()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    // Without commands, the longest line is the header, ending in "COMMAND".
    let room = width.saturating_sub(rest - "COMMAND".len()).max(10);
    rows(&|c| cut(c, room))
}

/// `text` in at most `room` characters, with "…" where it was cut.
fn cut(text: &str, room: usize) -> String {
    if text.chars().count() <= room {
        return text.to_string();
    }
    text.chars()
        .take(room.saturating_sub(1))
        .collect::<String>()
        + "…"
}

fn holder_row(h: &Holder, cmd: String, hosts: bool, jobs: bool, style: Style) -> Vec<Cell> {
    let mut row = vec![
        Cell::new(h.pid),
        Cell::new(parent(h)),
        Cell::new(&h.user),
        Cell::new(crate::process::display_name(&h.name, &h.cmdline)),
        Cell::new(join(&h.gpus)),
        Cell::new(h.mem_mib),
        colored(h.state.to_string(), state_color(h.state), style),
        Cell::new(h.role),
        Cell::new(Evidence::joined(&h.evidence)),
        Cell::new(cmd),
    ];
    if jobs {
        row.insert(
            3,
            Cell::new(h.origin.job.map(|j| j.to_string()).unwrap_or_default()),
        );
    }
    if hosts {
        row.insert(0, Cell::new(&h.host));
    }
    row
}

/// "4242 torchrun", a systemd unit's main process "1 systemd [vllm.service]", and an orphan
/// "1 init (reparented)".
fn parent(h: &Holder) -> String {
    // Read back from an older agent, a holder map has the parent's comm only.
    let name = match h.origin.ppid_name.as_str() {
        "" => &h.origin.ppid_comm,
        name => name,
    };
    let mut s = format!("{} {name}", h.ppid);
    if h.origin.service_main {
        if let Some(unit) = &h.origin.service {
            s.push_str(&format!(" [{unit}]"));
        }
    } else if h.origin.reparented {
        s.push_str(" (reparented)");
    }
    s.trim_end().to_string()
}

pub fn diagnoses(ds: &[Diagnosis], style: Style) -> String {
    if ds.is_empty() {
        return "no GPUs".into();
    }
    let hosts = multi_host(ds.iter().map(|d| d.host.as_str()));
    let mut out = Vec::new();
    for d in ds {
        let holders = d
            .holders
            .iter()
            .map(|h| format!("{}({})", h.name, h.pid))
            .collect::<Vec<_>>()
            .join(", ");
        // Pad before painting, so escape codes do not upset the alignment.
        let verdict = format!("{:<15}", d.verdict);
        let verdict = if d.verdict == Verdict::Clean {
            style.green(&verdict)
        } else {
            style.red(&verdict)
        };
        let index = d.gpu.map_or("all".to_string(), |g| g.to_string());
        let gpu = if hosts {
            format!("{}:{index}", d.host)
        } else {
            index
        };
        // Memory the driver could not read is unknown, not 0 MiB (which reads as clean).
        let mib = match d.verdict.memory_known() {
            false => "?".to_string(),
            true => d.mem_used_mib.to_string(),
        };
        let head = format!("GPU {gpu}  {mib:>7} MiB  ");
        // The advice column starts after the padded verdict; long advice wraps under it.
        let indent = head.chars().count() + 17;
        let advice = match style.width {
            Some(w) => wrap(&d.advice, w.saturating_sub(indent).max(30), indent),
            None => d.advice.clone(),
        };
        let mut line = format!("{head}{verdict}  {advice}");
        if !holders.is_empty() && d.verdict != Verdict::Clean {
            line.push_str(&format!("\n        holders: {holders}"));
        }
        if !d.ghost_pids.is_empty() {
            line.push_str(&format!(
                "\n        driver lists dead/invisible pids: {}",
                join(&d.ghost_pids)
            ));
        }
        out.push(line.trim_end().to_string());
    }
    out.join("\n")
}

/// `text` in lines of at most `width` characters, broken only between words, and never
/// inside a command in parentheses or backticks or between a flag and its value (a unit
/// longer than a line stays whole); lines after the first are indented.
fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut units: Vec<String> = Vec::new();
    let mut depth = 0i32;
    let mut ticks = false;
    let mut glue = false;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        match units.last_mut() {
            Some(u) if depth > 0 || ticks || glue => {
                u.push(' ');
                u.push_str(word);
            }
            _ => units.push(word.to_string()),
        }
        depth += word.matches('(').count() as i32 - word.matches(')').count() as i32;
        depth = depth.max(0);
        ticks ^= word.matches('`').count() % 2 == 1;
        glue = word.starts_with('-') && !word.ends_with(',') && !word.ends_with('.');
    }
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in &units {
        let len = line.chars().count();
        if len > 0 && len + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines.join(&format!("\n{}", " ".repeat(indent)))
}

pub fn kill_report(r: &KillReport, style: Style) -> String {
    if r.by_host.is_empty() {
        return one_kill_report(r, style);
    }
    // Over hosts, every line that names a pid names its host: a pid alone names nothing on
    // the machine gpuloop ran on.
    let mut out = Vec::new();
    for (host, part) in &r.by_host {
        let part = KillReport {
            interrupted: false,
            ..part.clone()
        };
        let text = one_kill_report(&part, style);
        let mut lines: Vec<&str> = text.lines().collect();
        // Its own time: the whole report's comes once, at the end.
        lines.pop();
        for l in lines.into_iter().filter(|l| *l != "signalled: none") {
            out.push(format!("{host}: {l}"));
        }
    }
    if out.is_empty() {
        out.push("signalled: none".to_string());
    }
    if r.interrupted {
        out.push(interrupted_line(r, style));
    }
    out.push(format!("({} ms)", r.elapsed_ms));
    out.join("\n")
}

/// What an interrupt left: the pids that got the signal and no KILL, each with its host.
fn interrupted_line(r: &KillReport, style: Style) -> String {
    let left = if r.by_host.is_empty() {
        join(&r.survivors)
    } else {
        r.by_host
            .iter()
            .filter(|(_, h)| !h.survivors.is_empty())
            .map(|(host, h)| format!("{host}: {}", join(&h.survivors)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    style.red(&format!(
        "interrupted during the grace; still running, not KILLed: {left}"
    ))
}

fn one_kill_report(r: &KillReport, style: Style) -> String {
    let mut out = Vec::new();
    let on = |gpus: &[i64]| match gpus {
        [] => String::new(),
        g => format!(" on GPU {}", join(g)),
    };
    let secs = |ms: Option<i64>| format!("{:.1} s", ms.unwrap_or(0) as f64 / 1000.0);
    // A target that could not act on the signal asked for got KILL at once: said once, on
    // its own line, with why ("ignores TERM (SigIgn): sent KILL at once").
    let at_once = |pid: i64| {
        r.killed_at_once
            .iter()
            .find(|k| k.pid == pid)
            .map(|k| k.reason.trim_start_matches(&format!("pid {pid} ")))
    };
    if r.dry_run {
        if r.targets.is_empty() {
            out.push("would signal: none".to_string());
        }
        let mut header = None;
        for t in &r.targets {
            if header != Some(&t.signal) {
                out.push(format!("would send {} to:", t.signal));
                header = Some(&t.signal);
            }
            let why = at_once(t.pid).map_or(String::new(), |w| format!(": {w}"));
            out.push(format!("  {} ({}){}{why}", t.pid, t.name, on(&t.gpus)));
        }
    } else if r.targets.is_empty() {
        out.push("signalled: none".to_string());
    }
    for t in r.targets.iter().filter(|_| !r.dry_run) {
        let who = format!("{} ({}){}", t.pid, t.name, on(&t.gpus));
        if let Some(why) = at_once(t.pid) {
            out.push(match t.exit_ms {
                Some(_) => format!("{who} {why}, gone after {}", secs(t.exit_ms)),
                None => style.red(&format!("{who} {why}, still running")),
            });
            continue;
        }
        out.push(match t.ended_by.as_deref() {
            Some(sig) if sig == t.signal => {
                style.green(&format!("{who} exited on {sig} after {}", secs(t.exit_ms)))
            }
            Some(sig) => format!(
                "{who} ignored {}, got {sig} after {}",
                t.signal,
                secs(t.exit_ms)
            ),
            None => style.red(&format!("{who} still running after {}", t.signal)),
        });
    }
    if r.interrupted {
        out.push(interrupted_line(r, style));
    }
    for k in r
        .killed_at_once
        .iter()
        .filter(|k| !r.dry_run && !r.targets.iter().any(|t| t.pid == k.pid))
    {
        out.push(format!("KILL at once {}: {}", k.pid, k.reason));
    }
    for s in r.stuck.iter().filter(|_| !r.dry_run) {
        out.push(style.red(&format!(
            "stuck {} ({}): in the kernel or the driver (D state, wchan {}); it goes when that call returns; if it never does, reboot the node (a GPU reset fails while it has the device open)",
            s.pid, s.name, s.wchan
        )));
    }
    for s in &r.skipped {
        out.push(format!("skipped {}: {}", s.pid, s.reason));
    }
    for p in &r.restarters {
        out.push(style.red(&p.describe()));
    }
    for e in &r.errors {
        out.push(style.red(&format!("error {}: {}", e.pid, e.error)));
    }
    out.push(format!("({} ms)", r.elapsed_ms));
    out.join("\n")
}

/// `gpuloop recipes`: each recipe's name, what it is for, and how to run it, under it; the name
/// column is as wide as the longest name.
pub fn recipes(rs: &[crate::script::recipes::Recipe]) -> String {
    let width = rs.iter().map(|r| r.name.len()).max().unwrap_or(0);
    rs.iter()
        .map(|r| {
            format!(
                "{:<width$}  {}\n{:<width$}  {}",
                r.name, r.purpose, "", r.usage
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A script value for people: arrays of GPU or holder maps as tables, diagnoses, kill and run
/// reports as short summaries, arrays of maps that carry such records (`workers::jobs()`) as
/// tables, a string as its text, anything else in Rhai's literal form.
pub fn value(v: &Dynamic, style: Style) -> String {
    if let Some(s) = v.read_lock::<rhai::ImmutableString>() {
        return s.to_string();
    }
    if let Some(a) = v.read_lock::<Array>() {
        if let Some(gs) = all_of(&a, gpu_of) {
            return gpus(&gs, style);
        }
        if let Some(hs) = all_of(&a, holder_of) {
            return holders(&hs, style);
        }
        if let Some(ds) = all_of(&a, diagnosis_of) {
            return diagnoses(&ds, style);
        }
        if let Some(t) = nested_records(&a, style) {
            return t;
        }
    }
    if let Some(m) = v.read_lock::<Map>() {
        if let Some(r) = kill_report_of(&m) {
            return kill_report(&r, style);
        }
        if let Some(r) = run_summary(&m, style) {
            return r;
        }
    }
    literal(v)
}

/// An array of maps with the same fields that carry gpuloop records (as `workers::jobs()`
/// gives: each job with its holders) as a table: a column per field, the records in a cell as
/// `name(pid)`. `None` for anything else, which prints as a literal.
fn nested_records(a: &Array, style: Style) -> Option<String> {
    let rows: Vec<Map> = a
        .iter()
        .map(|v| v.read_lock::<Map>().map(|m| m.clone()))
        .collect::<Option<_>>()?;
    let first = rows.first()?;
    let same = |m: &Map| m.len() == first.len() && first.keys().all(|k| m.contains_key(k));
    let is_record = |v: &Dynamic| {
        v.read_lock::<Map>()
            .is_some_and(|m| crate::script::fields::record_kind(&m).is_some())
    };
    let holds_records = |v: &Dynamic| {
        is_record(v)
            || v.read_lock::<Array>()
                .is_some_and(|a| !a.is_empty() && a.iter().all(is_record))
    };
    let carries = |m: &Map| m.values().any(holds_records);
    if !rows.iter().all(|m| same(m) && carries(m)) {
        return None;
    }
    // The records last (they are the widest), and no HOST column on one machine alone.
    let local = |v: &Dynamic| {
        v.read_lock::<rhai::ImmutableString>()
            .is_some_and(|s| s.as_str() == crate::hosts::LOCAL)
    };
    let mut keys: Vec<&str> = first
        .keys()
        .map(|k| k.as_str())
        .filter(|k| *k != "host" || !rows.iter().all(|m| m.get(*k).is_some_and(local)))
        .collect();
    keys.sort_by_key(|k| first.get(*k).is_some_and(holds_records));
    let header: Vec<String> = keys.iter().map(|k| k.to_uppercase()).collect();
    let mut t = table(
        &header.iter().map(String::as_str).collect::<Vec<_>>(),
        style,
    );
    for m in &rows {
        t.add_row(
            keys.iter()
                .map(|k| m.get(*k).map_or_else(String::new, cell)),
        );
    }
    let numbers: Vec<usize> = (0..keys.len())
        .filter(|&i| {
            rows.iter()
                .all(|m| m.get(keys[i]).is_some_and(|v| v.is_int()))
        })
        .collect();
    right(&mut t, &numbers);
    Some(trimmed(t))
}

/// A value in a table cell: text bare, `()` as `-`, lists joined with commas, a process record
/// as `name(pid)`.
fn cell(v: &Dynamic) -> String {
    if v.is_unit() {
        return "-".into();
    }
    if let Some(s) = v.read_lock::<rhai::ImmutableString>() {
        return s.to_string();
    }
    if let Some(m) = v.read_lock::<Map>() {
        if let (Some(name), Some(pid)) = (string(&m, "name"), int(&m, "pid")) {
            return format!("{name}({pid})");
        }
    }
    if let Some(a) = v.read_lock::<Array>() {
        let sep = if a.iter().all(|x| x.is_int()) {
            ","
        } else {
            " "
        };
        return a.iter().map(cell).collect::<Vec<_>>().join(sep);
    }
    flat(v)
}

/// Every element converted, or `None` (also for an empty array, which prints as `[]`).
fn all_of<T>(a: &Array, f: fn(&Map) -> Option<T>) -> Option<Vec<T>> {
    if a.is_empty() {
        return None;
    }
    a.iter()
        .map(|v| v.read_lock::<Map>().and_then(|m| f(&m)))
        .collect()
}

fn int(m: &Map, k: &str) -> Option<i64> {
    m.get(k)?.as_int().ok()
}

/// `()` is `None`; a present non-integer makes the map not one of ours.
fn opt_int(m: &Map, k: &str) -> Option<Option<i64>> {
    match m.get(k) {
        None => Some(None),
        Some(v) if v.is_unit() => Some(None),
        Some(v) => v.as_int().ok().map(Some),
    }
}

fn string(m: &Map, k: &str) -> Option<String> {
    m.get(k)?
        .read_lock::<rhai::ImmutableString>()
        .map(|s| s.to_string())
}

fn ints(m: &Map, k: &str) -> Option<Vec<i64>> {
    m.get(k)?
        .read_lock::<Array>()?
        .iter()
        .map(|v| v.as_int().ok())
        .collect()
}

fn strings(m: &Map, k: &str) -> Option<Vec<String>> {
    m.get(k)?
        .read_lock::<Array>()?
        .iter()
        .map(|v| {
            v.read_lock::<rhai::ImmutableString>()
                .map(|s| s.to_string())
        })
        .collect()
}

fn maps<T>(m: &Map, k: &str, f: impl Fn(&Map) -> Option<T>) -> Option<Vec<T>> {
    m.get(k)?
        .read_lock::<Array>()?
        .iter()
        .map(|v| v.read_lock::<Map>().and_then(|m| f(&m)))
        .collect()
}

/// A map as gpu() returns it (the fields the table needs must be there, with their types).
fn gpu_of(m: &Map) -> Option<Gpu> {
    let mem_used_mib = int(m, "mem_used_mib")?;
    let mem_total_mib = int(m, "mem_total_mib")?;
    Some(Gpu {
        index: int(m, "index")?,
        uuid: string(m, "uuid")?,
        name: string(m, "name")?,
        minor: int(m, "minor").unwrap_or(-1),
        bus_id: string(m, "bus_id").unwrap_or_default(),
        mem_total: int(m, "mem_total").unwrap_or(mem_total_mib * MIB),
        mem_used: int(m, "mem_used").unwrap_or(mem_used_mib * MIB),
        mem_free: int(m, "mem_free").unwrap_or(0),
        mem_used_mib,
        mem_total_mib,
        util: opt_int(m, "util")?,
        temp_c: opt_int(m, "temp_c")?,
        procs: int(m, "procs").unwrap_or(0),
        host: string(m, "host").unwrap_or_else(|| "local".into()),
        error: string(m, "error"),
        driver_procs: Vec::new(),
    })
}

/// A map as holders() returns it.
fn holder_of(m: &Map) -> Option<Holder> {
    Some(Holder {
        pid: int(m, "pid")?,
        ppid: int(m, "ppid").unwrap_or(0),
        pgid: int(m, "pgid").unwrap_or(0),
        sid: int(m, "sid").unwrap_or(0),
        start: int(m, "start")?,
        pidfs_ino: int(m, "pidfs_ino"),
        uid: int(m, "uid").unwrap_or(-1),
        user: string(m, "user").unwrap_or_default(),
        name: string(m, "name")?,
        cmdline: string(m, "cmdline").unwrap_or_default(),
        state: State::parse(&string(m, "state")?),
        role: match string(m, "role") {
            Some(r) => Role::parse(&r)?,
            None => Role::default(),
        },
        gpus: ints(m, "gpus")?,
        mem: int(m, "mem").unwrap_or(0),
        mem_mib: int(m, "mem").unwrap_or(0) / MIB,
        evidence: strings(m, "evidence")?
            .iter()
            .map(|e| Evidence::parse(e))
            .collect::<Option<_>>()?,
        protected: m
            .get("protected")
            .and_then(|v| v.as_bool().ok())
            .unwrap_or(false),
        host: string(m, "host").unwrap_or_else(|| "local".into()),
        origin: rhai::serde::from_dynamic(&Dynamic::from_map(m.clone())).unwrap_or_default(),
        maps: Vec::new(),
    })
}

/// A map as diagnose() returns it.
fn diagnosis_of(m: &Map) -> Option<Diagnosis> {
    Some(Diagnosis {
        gpu: opt_int(m, "gpu")?,
        mem_used: int(m, "mem_used").unwrap_or(0),
        mem_used_mib: int(m, "mem_used_mib")?,
        holders: maps(m, "holders", holder_of)?,
        daemons: maps(m, "daemons", holder_of).unwrap_or_default(),
        footprint: maps(m, "footprint", |f| {
            Some(FootprintOf {
                pid: int(f, "pid")?,
                name: string(f, "name")?,
                gpus: ints(f, "gpus")?,
                host: string(f, "host").unwrap_or_else(|| "local".into()),
            })
        })
        .unwrap_or_default(),
        ghost_pids: ints(m, "ghost_pids")?,
        verdict: Verdict::parse(&string(m, "verdict")?)?,
        advice: string(m, "advice")?,
        host: string(m, "host").unwrap_or_else(|| "local".into()),
    })
}

/// A map as kill() returns it.
fn kill_report_of(m: &Map) -> Option<KillReport> {
    // Only a map with the report's own fields is one: a user's look-alike prints as a map.
    [
        "signalled",
        "exited",
        "survivors",
        "skipped",
        "errors",
        "elapsed_ms",
    ]
    .iter()
    .all(|k| m.contains_key(*k))
    .then(|| rhai::serde::from_dynamic(&Dynamic::from_map(m.clone())).ok())
    .flatten()
}

/// A run() result in one line (its output was already streamed; `r.stdout` shows it again).
fn run_summary(m: &Map, style: Style) -> Option<String> {
    let ok = m.get("ok")?.as_bool().ok()?;
    let timed_out = m.get("timed_out")?.as_bool().ok()?;
    let elapsed = int(m, "elapsed_ms")?;
    let pid = int(m, "pid")?;
    let lines = |k: &str| string(m, k).map(|s| s.lines().count());
    let (out, err) = (lines("stdout")?, lines("stderr")?);
    let how = match (
        opt_int(m, "code")?,
        m.get("signal").and_then(|s| {
            s.read_lock::<rhai::ImmutableString>()
                .map(|s| s.to_string())
        }),
    ) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) if sig.starts_with("SIG") => format!("killed by {sig}"),
        (None, Some(sig)) => format!("killed by SIG{sig}"),
        (None, None) => "no exit status".into(),
    };
    let how = if timed_out {
        format!("timed out, {how}")
    } else {
        how
    };
    let how = if ok {
        style.green(&how)
    } else {
        style.red(&how)
    };
    Some(format!(
        "run: {how} after {:.1} s (pid {pid}); stdout {out} line(s), stderr {err} line(s)",
        elapsed as f64 / 1000.0
    ))
}

/// Wider literals are broken over several lines.
const LITERAL_WIDTH: usize = 100;

/// A value in Rhai's literal syntax: what you could type to get it back (where Rhai has a
/// literal for it); long arrays and maps are spread over lines, four spaces per level.
pub fn literal(v: &Dynamic) -> String {
    pretty(v, 0)
}

fn pretty(v: &Dynamic, indent: usize) -> String {
    let flat = flat(v);
    if indent + flat.len() <= LITERAL_WIDTH {
        return flat;
    }
    let pad = " ".repeat(indent + 4);
    let end = " ".repeat(indent);
    if let Some(a) = v.read_lock::<Array>() {
        let items: Vec<String> = a
            .iter()
            .map(|x| format!("{pad}{},", pretty(x, indent + 4)))
            .collect();
        return format!("[\n{}\n{end}]", items.join("\n"));
    }
    if let Some(m) = v.read_lock::<Map>() {
        let items: Vec<String> = m
            .iter()
            .map(|(k, x)| format!("{pad}{}: {},", key(k), pretty(x, indent + 4)))
            .collect();
        return format!("#{{\n{}\n{end}}}", items.join("\n"));
    }
    flat
}

fn flat(v: &Dynamic) -> String {
    if let Some(a) = v.read_lock::<Array>() {
        return format!("[{}]", a.iter().map(flat).collect::<Vec<_>>().join(", "));
    }
    if let Some(m) = v.read_lock::<Map>() {
        let items: Vec<String> = m
            .iter()
            .map(|(k, x)| format!("{}: {}", key(k), flat(x)))
            .collect();
        return format!("#{{{}}}", items.join(", "));
    }
    // A job handle as its to_string() says, not as a Rust type path.
    if let Some(h) = v.read_lock::<crate::machine::jobs::JobHandle>() {
        return format!("{:?}", &*h);
    }
    // rhai's Debug form is its literal syntax: quoted strings, 'c', (), Fn("f"), 1.0.
    format!("{v:?}")
}

/// Map keys bare where Rhai accepts them so, quoted otherwise.
fn key(k: &str) -> String {
    let ident = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident {
        k.to_string()
    } else {
        format!("{k:?}")
    }
}

/// A script value as JSON: `()` is null, blobs are arrays of bytes, function pointers and
/// other opaque values their text.
pub fn json(v: &Dynamic) -> serde_json::Value {
    use serde_json::Value;
    if v.is_unit() {
        return Value::Null;
    }
    if let Ok(b) = v.as_bool() {
        return Value::Bool(b);
    }
    if let Ok(i) = v.as_int() {
        return Value::from(i);
    }
    if let Ok(f) = v.as_float() {
        return serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number);
    }
    if let Ok(c) = v.as_char() {
        return Value::String(c.to_string());
    }
    if let Some(s) = v.read_lock::<rhai::ImmutableString>() {
        return Value::String(s.to_string());
    }
    if let Some(a) = v.read_lock::<Array>() {
        return Value::Array(a.iter().map(json).collect());
    }
    if let Some(b) = v.read_lock::<rhai::Blob>() {
        return Value::Array(b.iter().map(|&x| Value::from(x)).collect());
    }
    if let Some(m) = v.read_lock::<Map>() {
        return Value::Object(m.iter().map(|(k, x)| (k.to_string(), json(x))).collect());
    }
    Value::String(v.to_string())
}

/// Strips ANSI escape sequences (for checking that colour does not change the layout).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(code: &str) -> Dynamic {
        rhai::Engine::new().eval::<Dynamic>(code).expect(code)
    }

    #[test]
    fn literal_is_rhai_syntax() {
        let v = eval(r#"#{a: 1, "b c": "x\ny", d: [1, 2.5, 'c', ()], _e: true}"#);
        assert_eq!(
            literal(&v),
            r#"#{_e: true, a: 1, "b c": "x\ny", d: [1, 2.5, 'c', ()]}"#
        );
    }

    #[test]
    fn long_literal_spreads_over_lines() {
        let v = eval(
            r#"#{list: [1, 2, 3], text: "a long string that does not fit on one line with the rest of this map, surely not"}"#,
        );
        assert_eq!(
            literal(&v),
            "#{\n    list: [1, 2, 3],\n    text: \"a long string that does not fit on one line with the rest of this map, surely not\",\n}"
        );
    }

    #[test]
    fn strings_print_as_text_at_the_top_only() {
        assert_eq!(value(&eval(r#""a\nb""#), Style::PLAIN), "a\nb");
        assert_eq!(value(&eval(r#"["a"]"#), Style::PLAIN), r#"["a"]"#);
    }

    #[test]
    fn maps_that_are_not_ours_print_as_literals() {
        let v = eval(r#"[#{index: 0, name: "x"}]"#);
        assert_eq!(value(&v, Style::PLAIN), r#"[#{index: 0, name: "x"}]"#);
        assert_eq!(value(&eval("[]"), Style::PLAIN), "[]");
    }

    /// A new user's report: `w::jobs()` printed as one raw map literal. Maps that carry
    /// gpuloop records print as a table; the records in a cell as name(pid).
    #[test]
    fn maps_that_carry_records_print_as_a_table() {
        let holder =
            |pid: i64| format!(r#"#{{pid: {pid}, start: 1, evidence: ["map"], name: "vllm"}}"#);
        let v = eval(&format!(
            r#"[#{{kind: "vllm", gpus: [0, 1], mem_mib: 2048, host: "local", launcher: (), holders: [{}, {}]}},
                #{{kind: "other", gpus: [3], mem_mib: 300, host: "local", launcher: #{{pid: 5, name: "torchrun"}}, holders: [{}]}}]"#,
            holder(7),
            holder(8),
            holder(9)
        ));
        assert_eq!(
            value(&v, Style::PLAIN),
            " GPUS  KIND   LAUNCHER     MEM_MIB  HOLDERS\n \
             0,1   vllm   -               2048  vllm(7) vllm(8)\n \
             3     other  torchrun(5)      300  vllm(9)"
        );
        // Without a record inside, a user's maps stay literals.
        let v = eval(r#"[#{kind: "x", holders: [#{pid: 1}]}]"#);
        assert_eq!(
            value(&v, Style::PLAIN),
            r#"[#{holders: [#{pid: 1}], kind: "x"}]"#
        );
    }

    #[test]
    fn json_of_values() {
        let v = eval(r#"#{a: (), b: [1, 2.5, "s", 'c', true], c: blob(2, 7)}"#);
        assert_eq!(
            json(&v).to_string(),
            r#"{"a":null,"b":[1,2.5,"s","c",true],"c":[7,7]}"#
        );
    }

    #[test]
    fn strip_ansi_removes_colour() {
        assert_eq!(strip_ansi("\x1b[1;32mok\x1b[0m done"), "ok done");
    }
}

/// One host's line in a one-shot's summary over several hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRow {
    pub host: String,
    /// "ok", "clean", "NOT clean", "unreachable", "skipped" or "failed".
    pub state: String,
    pub detail: String,
    /// Why the host failed, in full (said once on stderr, or in the JSON document).
    pub error: Option<String>,
    /// The failure was a mistake in what was asked (exit 2), not of the host.
    pub usage: bool,
}

impl HostRow {
    /// The row alone, as it is said when its host answers (`gpu03  clean  8 GPU(s) clean`).
    pub fn line(&self) -> String {
        format!("{}  {}  {}", self.host, self.state, self.detail)
    }

    /// Whether this host is as it should be (the exit code is 0 only when all are).
    pub fn good(&self) -> bool {
        self.state == "ok" || self.state == "clean"
    }
}

/// The per-host summary: hosts with the same state and detail folded into one row under a
/// hostlist (as `dshbak -c` does), then the counts, naming the hosts that are not good.
pub fn host_summary(rows: &[HostRow], style: Style) -> String {
    let mut groups: Vec<(&str, &str, Vec<&str>)> = Vec::new();
    for r in rows {
        match groups
            .iter_mut()
            .find(|(s, d, _)| *s == r.state && *d == r.detail)
        {
            Some(g) => g.2.push(&r.host),
            None => groups.push((&r.state, &r.detail, vec![&r.host])),
        }
    }
    let mut t = table(&["HOST", "STATE", "DETAIL"], style);
    for (state, detail, hosts) in &groups {
        let good = state == &"ok" || state == &"clean";
        let color = if good { Color::Green } else { Color::Red };
        t.add_row(vec![
            Cell::new(crate::hosts::fold::compress(hosts)),
            colored(state.to_string(), Some(color), style),
            Cell::new(detail),
        ]);
    }
    format!("{}\n{}", trimmed(t), host_counts(rows))
}

/// `64 host(s): 61 clean, 3 NOT clean: gpu[05,33,40]`: each state's count, and the hosts
/// of each state that is not good as a hostlist.
pub fn host_counts(rows: &[HostRow]) -> String {
    let mut states: Vec<(&str, Vec<&str>, bool)> = Vec::new();
    for r in rows {
        match states.iter_mut().find(|(s, _, _)| *s == r.state) {
            Some(s) => s.1.push(&r.host),
            None => states.push((&r.state, vec![&r.host], r.good())),
        }
    }
    let mut out = format!("{} host(s): ", rows.len());
    let mut listed = false;
    for (i, (state, hosts, good)) in states.iter().enumerate() {
        if i > 0 {
            // After a hostlist, whose own commas would run into the next count.
            out.push_str(if listed { "; " } else { ", " });
        }
        out.push_str(&format!("{} {state}", hosts.len()));
        listed = !good;
        if listed {
            out.push_str(&format!(": {}", crate::hosts::fold::compress(hosts)));
        }
    }
    out
}
