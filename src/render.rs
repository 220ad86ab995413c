//! Output for people: GPU and holder tables, diagnosis, kill and run summaries, the hosts'
//! summary, in colour only on a terminal. It knows the records, never how a script holds them
//! (`src/script/display.rs` turns script values into these). Every text a record carries
//! (names, command lines, users, pods, advice that quotes them, errors) is written through
//! `crate::shown`: in a table through `cell`, in a line through `shown`.

use crate::gpu::Gpu;
use crate::inspect::diagnose::{Diagnosis, Verdict};
use crate::inspect::holders::Holder;
use crate::inspect::kinds::{Evidence, RunState, State};
use crate::inspect::reset::{ResetReport, Stop};
use crate::process::kill::KillReport;
use crate::runner::Outcome;
use crate::shown::shown;
use comfy_table::{presets, Attribute, Cell, CellAlignment, Color, ContentArrangement, Table};

/// Whether output gets ANSI colour, and how wide its lines may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    pub color: bool,
    /// The line width to fit (a terminal's); `None`: no limit.
    pub width: Option<usize>,
    /// Whole ids where a table has them (`--wide`): containers' and pods'.
    pub ids: bool,
}

impl Style {
    pub const PLAIN: Style = Style {
        color: false,
        width: None,
        ids: false,
    };

    /// Colour as `--color` says (by default only on a terminal, unless `NO_COLOR` is set);
    /// the terminal's width and no ids unless `--wide`.
    pub fn stdout() -> Style {
        Style {
            color: crate::output::color_stdout(),
            width: crate::output::width(),
            ids: crate::output::wide(),
        }
    }

    /// The same for stderr: colour as `--color` says for stderr.
    pub fn stderr() -> Style {
        Style {
            color: crate::output::color_stderr(),
            ..Style::stdout()
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
    pub(crate) fn bold(self, s: &str) -> String {
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

/// A table cell: every cell of every table is made here, its text shown as `crate::shown`
/// says (a name or a command line another user chose cannot move the cursor, hide a row or
/// break the table).
fn cell(text: impl ToString) -> Cell {
    Cell::new(shown(&text.to_string()))
}

fn colored(text: String, color: Option<Color>, style: Style) -> Cell {
    match color {
        Some(c) if style.color => cell(text).fg(c),
        _ => cell(text),
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
    hosts.into_iter().any(|h| !crate::local::is_local(h))
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
            cell(g.index),
            cell(name),
            colored(used_mib, Some(used), style),
            cell(g.mem_total_mib),
            cell(opt(g.util)),
            cell(opt(g.temp_c)),
            cell(g.procs),
            cell(&g.bus_id),
        ];
        if hosts {
            row.insert(0, cell(&g.host));
        }
        t.add_row(row);
    }
    let shift = usize::from(hosts);
    right(&mut t, &[0, 2, 3, 4, 5, 6].map(|c| c + shift));
    let mut out = trimmed(t);
    if let Some(mig) = mig_devices(gpus, hosts, style) {
        out.push_str(&format!("\n{mig}"));
    }
    for g in gpus {
        if let Some(e) = &g.error {
            let on = if hosts {
                format!("{}: ", shown(&g.host))
            } else {
                String::new()
            };
            out.push_str(&format!(
                "\n{on}{}",
                style.red(&format!("error: {}", shown(e)))
            ));
        }
    }
    out
}

/// The GPUs' MIG modes and devices, where one is in MIG mode or will be at its next reset:
/// a line per such GPU, then a row per MIG device (each a GPU of its own, selected by its
/// `N:GI:CI` or its UUID). `None` on a machine without MIG.
fn mig_devices(gpus: &[Gpu], hosts: bool, style: Style) -> Option<String> {
    let shown: Vec<(&Gpu, &crate::gpu::mig::Mig)> = gpus
        .iter()
        .filter_map(|g| Some((g, g.mig.as_ref()?)))
        .filter(|(_, m)| m.enabled() || m.pending != m.current)
        .collect();
    if shown.is_empty() {
        return None;
    }
    let mut lines = Vec::new();
    for (g, m) in &shown {
        let on = if hosts {
            format!("{}:{}", g.host, g.index)
        } else {
            g.index.to_string()
        };
        let pending = if m.pending != m.current {
            format!(" (pending {} at its next reset)", m.pending.as_str())
        } else {
            String::new()
        };
        lines.push(format!(
            "GPU {on}: MIG {}{pending}, {}",
            m.current.as_str(),
            crate::words::count(m.instances.len(), "MIG device", "MIG devices")
        ));
    }
    let mut header = vec!["MIG", "PROFILE", "USED MiB", "TOTAL MiB", "CAPS", "UUID"];
    if hosts {
        header.insert(0, "HOST");
    }
    let mut t = table(&header, style);
    let mut any = false;
    for (g, m) in &shown {
        for d in &m.instances {
            any = true;
            let caps = [d.caps.gi, d.caps.ci]
                .iter()
                .map(|c| c.map_or("-".to_string(), |c| c.to_string()))
                .collect::<Vec<_>>()
                .join(",");
            let used = if d.mem_used_mib > 0 {
                Color::Yellow
            } else {
                Color::Green
            };
            let mut row = vec![
                Cell::new(d.key()),
                Cell::new(&d.profile),
                colored(d.mem_used_mib.to_string(), Some(used), style),
                Cell::new(d.mem_total_mib),
                Cell::new(caps),
                Cell::new(&d.uuid),
            ];
            if hosts {
                row.insert(0, Cell::new(&g.host));
            }
            t.add_row(row);
        }
    }
    let shift = usize::from(hosts);
    right(&mut t, &[2, 3].map(|c| c + shift));
    if any {
        lines.push(trimmed(t));
    }
    Some(lines.join("\n"))
}

/// Each GPU's reset: what blocks it (or blocked it), then the steps taken and the outcome.
pub fn reset_reports(rs: &[ResetReport], style: Style) -> String {
    let hosts = multi_host(rs.iter().map(|r| r.host.as_str()));
    let mut out = Vec::new();
    for r in rs {
        let what = r.mig.map_or(r.gpu.to_string(), |k| k.to_string());
        let gpu = if hosts {
            format!("GPU {}:{what}", shown(&r.host))
        } else {
            format!("GPU {what}")
        };
        // A MIG device is never reset: its report says what blocks destroying it.
        let act = match r.mig {
            Some(_) => "destroying or reconfiguring it (mig-parted, nvidia-smi mig)",
            None => "a reset",
        };
        let mut lines = Vec::new();
        if let Some(why) = &r.cannot {
            lines.push(format!(
                "{gpu} ({}): no reset can work: {}",
                shown(&r.uuid),
                shown(why)
            ));
        }
        if r.blockers.is_empty() {
            if r.cannot.is_none() {
                lines.push(format!("{gpu} ({}): nothing blocks {act}", shown(&r.uuid)));
            }
        } else {
            let verb = if r.dry_run { "block" } else { "blocked" };
            lines.push(format!(
                "{gpu} ({}): {} client(s) {verb} {act}",
                shown(&r.uuid),
                r.blockers.len()
            ));
            let mut t = table(&["KIND", "PID", "NAME", "USER", "STOPPED BY"], style);
            for b in &r.blockers {
                let how = if b.needs_force() && b.stop != Stop::Unload && !b.how.contains("--force")
                {
                    format!("{} (--force)", b.how)
                } else {
                    b.how.clone()
                };
                t.add_row(vec![
                    cell(b.kind),
                    cell(b.pid.map_or("-".into(), |p| p.to_string())),
                    cell(&b.name),
                    cell(&b.user),
                    cell(how),
                ]);
            }
            right(&mut t, &[1]);
            lines.extend(trimmed(t).lines().map(|l| format!("  {l}")));
        }
        for st in &r.steps {
            let ok = if st.ok {
                style.green("ok")
            } else {
                style.red("failed")
            };
            lines.push(format!(
                "  {} {}: {ok}: {}",
                st.action,
                shown(&st.target),
                shown(&st.detail)
            ));
        }
        if !r.dry_run {
            lines.push(if r.ok {
                style.green(&format!("{gpu} reset and verified"))
            } else if r.reset && r.verified {
                style.red(&format!(
                    "{gpu} reset and verified; not every daemon it stopped runs again"
                ))
            } else {
                style.red(&format!("{gpu} NOT reset"))
            });
        }
        out.push(lines.join("\n"));
    }
    out.join("\n")
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
    let cols = Columns {
        hosts: multi_host(hs.iter().map(|h| h.host.as_str())),
        jobs: hs.iter().any(|h| h.origin.job.is_some()),
        places: hs.iter().any(|h| !h.origin.place.is_empty()),
        ids: style.ids,
    };
    let mut header = vec!["PID", "PARENT", "USER"];
    if cols.jobs {
        header.push("JOB");
    }
    if cols.places {
        header.push("CONTAINER/POD");
        if cols.ids {
            header.extend(["CONTAINER ID", "POD UID"]);
        }
    }
    header.extend([
        "NAME", "GPUS", "MiB", "STATE", "ROLE", "EVIDENCE", "COMMAND",
    ]);
    if cols.hosts {
        header.insert(0, "HOST");
    }
    let pid_at = usize::from(cols.hosts);
    let mib_at = header.iter().position(|h| *h == "MiB").unwrap_or(0);
    let rows = |cmd: &dyn Fn(&str) -> String| {
        let mut t = table(&header, style);
        for h in hs {
            // Cut after escaping, so that the escapes count against the room.
            t.add_row(holder_row(
                h,
                cmd(&shown(&h.cmdline).to_string()),
                cols,
                style,
            ));
        }
        right(&mut t, &[pid_at, mib_at]);
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

/// Which optional columns a holder table has.
#[derive(Clone, Copy)]
struct Columns {
    hosts: bool,
    jobs: bool,
    /// CONTAINER/POD: some holder runs in a container.
    places: bool,
    /// CONTAINER ID and POD UID too (`--wide`).
    ids: bool,
}

/// The CONTAINER/POD cell: "ml/trainer-0 (trainer)", "ml/trainer-0 (trainer, deleted)",
/// "vllm", "3839ae72c1f0"; empty outside any container.
fn place_cell(p: &crate::process::container::Place) -> String {
    match &p.pod {
        Some(pod) => {
            let mut notes: Vec<&str> = pod.container.iter().map(String::as_str).collect();
            if pod.deleted {
                notes.push("deleted");
            }
            match notes.is_empty() {
                true => pod.label(),
                false => format!("{} ({})", pod.label(), notes.join(", ")),
            }
        }
        None => {
            let name = p.short_name().unwrap_or_default();
            match p.container_deleted {
                true => format!("{name} (deleted)"),
                false => name,
            }
        }
    }
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

fn holder_row(h: &Holder, cmd: String, cols: Columns, style: Style) -> Vec<Cell> {
    let mut row = Vec::new();
    if cols.hosts {
        row.push(cell(&h.host));
    }
    row.extend([cell(h.pid), cell(parent(h)), cell(&h.user)]);
    if cols.jobs {
        row.push(cell(
            h.origin.job.map(|j| j.to_string()).unwrap_or_default(),
        ));
    }
    if cols.places {
        let p = &h.origin.place;
        row.push(cell(place_cell(p)));
        if cols.ids {
            row.push(cell(p.container.as_deref().unwrap_or_default()));
            row.push(cell(
                p.pod
                    .as_ref()
                    .and_then(|p| p.uid.as_deref())
                    .unwrap_or_default(),
            ));
        }
    }
    row.extend([
        cell(crate::process::display_name(&h.name, &h.cmdline)),
        cell(gpus_cell(h)),
        cell(mib(h)),
        colored(h.state.to_string(), state_color(h.state), style),
        cell(h.role),
        cell(Evidence::joined(&h.evidence)),
        cell(cmd),
    ]);
    row
}

/// The GPUS cell: its GPUs, and a MIG holder's devices as `N:GI:CI` instead of the parent
/// whose node every MIG process has.
fn gpus_cell(h: &Holder) -> String {
    if h.mig.is_empty() {
        return join(&h.gpus);
    }
    let mut cells: Vec<String> = h.mig.iter().map(ToString::to_string).collect();
    cells.extend(
        h.gpus
            .iter()
            .filter(|g| !h.mig.iter().any(|k| k.gpu == **g))
            .map(i64::to_string),
    );
    cells.join(",")
}

/// The memory a holder keeps: the driver's figure, or what it keeps alive of a dead
/// creator's, said as such (`70000 (inherited)`): the driver counts that against the dead
/// pid, and a bare 0 would point away from the one process whose exit frees it.
fn mib(h: &Holder) -> String {
    match &h.inherited {
        Some(i) if h.mem == 0 => format!("{} (inherited)", i.mem_mib),
        _ => h.mem_mib.to_string(),
    }
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
            .map(|h| format!("{}({})", shown(&h.name), h.pid))
            .collect::<Vec<_>>()
            .join(", ");
        // Pad before painting, so escape codes do not upset the alignment.
        let verdict = format!("{:<15}", d.verdict);
        let verdict = if d.verdict == Verdict::Clean {
            style.green(&verdict)
        } else {
            style.red(&verdict)
        };
        let index = d.gpu.map_or("all".to_string(), |_| d.target());
        let gpu = if hosts {
            format!("{}:{index}", shown(&d.host))
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
        let advice = shown(&d.advice).to_string();
        let advice = match style.width {
            Some(w) => wrap(&advice, w.saturating_sub(indent).max(30), indent),
            None => advice,
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
        if !d.blockers.is_empty() {
            let who: Vec<String> = d
                .blockers
                .iter()
                .map(|b| shown(&b.label()).to_string())
                .collect();
            line.push_str(&format!(
                "\n        a reset is blocked by: {}",
                who.join(", ")
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

/// A kill's report: a line per target, what was skipped or failed, and how long it took
/// when something was signalled (with nothing signalled, there is no time to tell).
pub fn kill_report(r: &KillReport, style: Style) -> String {
    let mut out = kill_lines(r, style);
    if !r.dry_run && !r.signalled.is_empty() {
        out.push(format!("done in {} ms", r.elapsed_ms));
    }
    out.join("\n")
}

/// The report of the kill that `clean` made, without its time: clean's own last line says
/// when the memory came back.
pub(crate) fn clean_kill_report(r: &KillReport, style: Style) -> String {
    kill_lines(r, style).join("\n")
}

fn kill_lines(r: &KillReport, style: Style) -> Vec<String> {
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
        for l in one_kill_report(&part, style)
            .into_iter()
            .filter(|l| l != "signalled: none")
        {
            out.push(format!("{}: {l}", shown(host)));
        }
    }
    if out.is_empty() {
        out.push("signalled: none".to_string());
    }
    if r.interrupted {
        out.push(interrupted_line(r, style));
    }
    out
}

/// What an interrupt left: the pids that got the signal and no KILL, each with its host.
fn interrupted_line(r: &KillReport, style: Style) -> String {
    let left = if r.by_host.is_empty() {
        join(&r.survivors)
    } else {
        r.by_host
            .iter()
            .filter(|(_, h)| !h.survivors.is_empty())
            .map(|(host, h)| format!("{}: {}", shown(host), join(&h.survivors)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    style.red(&format!(
        "interrupted during the grace; still running, not KILLed: {left}"
    ))
}

fn one_kill_report(r: &KillReport, style: Style) -> Vec<String> {
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
            // The words without the pid the line names already (from another host only
            // the words come).
            .map(|k| {
                let words = k.reason.to_string();
                let words = words.strip_prefix(&format!("pid {pid} ")).unwrap_or(&words);
                shown(words).to_string()
            })
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
            out.push(format!(
                "  {} ({}){}{why}",
                t.pid,
                shown(&t.name),
                on(&t.gpus)
            ));
        }
    } else if r.targets.is_empty() {
        out.push("signalled: none".to_string());
    }
    for t in r.targets.iter().filter(|_| !r.dry_run) {
        let who = format!("{} ({}){}", t.pid, shown(&t.name), on(&t.gpus));
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
            // It outlived the grace: it may handle the signal and be on its way out, or
            // block it; what it did with it is not known here, so it is not said.
            Some(sig) => format!(
                "{who} still running when the grace after {} ran out, got {sig}, gone after {}",
                t.signal,
                secs(t.exit_ms)
            ),
            None => style.red(&format!("{who} still running after {}", t.signal)),
        });
    }
    if r.interrupted {
        out.push(interrupted_line(r, style));
    }
    let listed: std::collections::HashSet<i64> = r.targets.iter().map(|t| t.pid).collect();
    for k in r
        .killed_at_once
        .iter()
        .filter(|k| !r.dry_run && !listed.contains(&k.pid))
    {
        out.push(format!(
            "KILL at once {}: {}",
            k.pid,
            shown(&k.reason.to_string())
        ));
    }
    for s in r.stuck.iter().filter(|_| !r.dry_run) {
        out.push(style.red(&format!(
            "stuck {} ({}): in the kernel or the driver (D state, wchan {}); it goes when that call returns; if it never does, reboot the node (a GPU reset fails while it has the device open)",
            s.pid,
            shown(&s.name),
            shown(&s.wchan)
        )));
    }
    for s in &r.skipped {
        out.push(format!(
            "skipped {}: {}",
            s.pid,
            shown(&s.reason.to_string())
        ));
    }
    for p in &r.restarters {
        out.push(style.red(&shown(&p.describe()).to_string()));
    }
    for e in &r.errors {
        out.push(style.red(&format!("error {}: {}", e.pid, shown(&e.error))));
    }
    out
}

/// `gpuloop top`: a line per GPU (utilisation, memory, temperature), its compute holders
/// indented under it, biggest first.
pub fn top(gpus: &[Gpu], holders: &[Holder], style: Style) -> String {
    if gpus.is_empty() {
        return "no GPUs".into();
    }
    let hosts = multi_host(gpus.iter().map(|g| g.host.as_str()));
    let mut t = table(
        &[
            "GPU",
            "UTIL%",
            "MEMORY MiB",
            "TEMP",
            "HOLDER",
            "USER",
            "MiB",
            "STATE",
        ],
        style,
    );
    for g in gpus {
        let gpu = if hosts {
            format!("{}:{}", g.host, g.index)
        } else {
            g.index.to_string()
        };
        let memory = match &g.error {
            Some(e) => format!("? ({})", cut(&shown(e).to_string(), 40)),
            None => format!("{} / {}", g.mem_used_mib, g.mem_total_mib),
        };
        let used = if g.mem_used_mib > 0 || g.error.is_some() {
            Color::Yellow
        } else {
            Color::Green
        };
        let mut on: Vec<&Holder> = holders
            .iter()
            .filter(|h| h.host == g.host && h.gpus.contains(&g.index))
            .collect();
        on.sort_by_key(|h| std::cmp::Reverse(h.mem));
        let first = on.first();
        let holder_cells = |h: Option<&&Holder>| match h {
            Some(h) => vec![
                cell(format!(
                    "{} {}",
                    h.pid,
                    crate::process::display_name(&h.name, &h.cmdline)
                )),
                cell(&h.user),
                cell(mib(h)),
                colored(h.state.to_string(), state_color(h.state), style),
            ],
            None => vec![cell("-"), cell(""), cell(""), cell("")],
        };
        let mut row = vec![
            cell(gpu),
            cell(opt(g.util)),
            colored(memory, Some(used), style),
            cell(opt(g.temp_c)),
        ];
        row.extend(holder_cells(first));
        t.add_row(row);
        for h in on.iter().skip(1) {
            let mut row = vec![cell(""), cell(""), cell(""), cell("")];
            row.extend(holder_cells(Some(h)));
            t.add_row(row);
        }
    }
    t.to_string()
}

/// `gpuloop recipes`: each recipe's name, where it comes from and what it is for, and under
/// it how to run it (or why it does not run by name); the columns are as wide as their
/// longest entry.
pub fn recipes(rs: &[crate::script::recipes::Recipe]) -> String {
    let width = rs.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let origin = rs.iter().map(|r| r.origin.name().len()).max().unwrap_or(0);
    rs.iter()
        .map(|r| {
            let under = match (&r.refused, r.shadowed_by, &r.path) {
                (Some(why), _, _) => format!("REFUSED: {why}"),
                (None, Some(by), _) => format!(
                    "(the {} recipe of this name runs instead){}",
                    by.name(),
                    r.path.as_ref().map(|p| format!(" {p}")).unwrap_or_default()
                ),
                (None, None, Some(p)) => format!("{}   ({p}){}", r.usage, needs(r)),
                (None, None, None) => format!("{}{}", r.usage, needs(r)),
            };
            format!(
                "{:<width$}  {:<origin$}  {}\n{:<width$}  {:<origin$}  {}",
                r.name,
                r.origin.name(),
                r.purpose,
                "",
                "",
                under
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a recipe declares it does beyond reading, after its usage: "   [needs: clean, run]".
fn needs(r: &crate::script::recipes::Recipe) -> String {
    match r.needs.as_deref() {
        Some(n) if !n.is_empty() => {
            format!("   [needs: {}]", crate::script::recipes::needs::words(n))
        }
        _ => String::new(),
    }
}

/// `gpuloop recipes show NAME`: what `--help` says, where it comes from, then its source.
pub fn recipe(r: &crate::script::recipes::Recipe, help: &str, source: &str) -> String {
    let whence = match &r.path {
        Some(p) => format!("{} recipe {p}", r.origin.name()),
        None => format!("{} recipe", r.origin.name()),
    };
    let refused = r
        .refused
        .as_ref()
        .map(|why| format!("REFUSED (it does not run by name): {why}\n\n"))
        .unwrap_or_default();
    format!(
        "{refused}{help}\n\n---- {whence} ----\n{}",
        source.trim_end()
    )
}

/// A run() result in one line (its output was already streamed; `r.stdout` shows it again).
pub(crate) fn run_summary(o: &Outcome, style: Style) -> String {
    let how = match (o.code, o.signal.as_deref()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) if sig.starts_with("SIG") => format!("killed by {sig}"),
        (None, Some(sig)) => format!("killed by SIG{sig}"),
        (None, None) => "no exit status".into(),
    };
    let how = if o.timed_out {
        format!("timed out, {how}")
    } else {
        how
    };
    let how = if o.ok {
        style.green(&how)
    } else {
        style.red(&how)
    };
    format!(
        "run: {how} after {:.1} s (pid {}); stdout {}, stderr {}",
        o.elapsed_ms as f64 / 1000.0,
        o.pid,
        crate::words::count(o.stdout.lines().count(), "line", "lines"),
        crate::words::count(o.stderr.lines().count(), "line", "lines")
    )
}

/// Rows of text under a header, the columns `numbers` aligned right (for rows that are no
/// record of ours, such as a script's list of jobs).
pub(crate) fn grid(
    header: &[String],
    rows: Vec<Vec<String>>,
    numbers: &[usize],
    style: Style,
) -> String {
    let mut t = table(
        &header.iter().map(String::as_str).collect::<Vec<_>>(),
        style,
    );
    for row in rows {
        t.add_row(row);
    }
    right(&mut t, numbers);
    trimmed(t)
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

/// How one host of a one-shot over several hosts came out, as its summary row says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub(crate) enum HostState {
    #[serde(rename = "ok")]
    Ok,
    #[serde(rename = "clean")]
    Clean,
    #[serde(rename = "NOT clean")]
    NotClean,
    #[serde(rename = "unreachable")]
    Unreachable,
    /// Unreachable, and left out on purpose (`--skip-unreachable`).
    #[serde(rename = "skipped")]
    Skipped,
    #[serde(rename = "failed")]
    Failed,
}

impl HostState {
    /// As it should be: the exit code is 0 only when every host is.
    pub(crate) fn good(self) -> bool {
        matches!(self, HostState::Ok | HostState::Clean)
    }

    /// Good, or left out on purpose: what the exit code counts as no failure.
    pub(crate) fn passes(self) -> bool {
        self.good() || self == HostState::Skipped
    }
}

impl std::fmt::Display for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HostState::Ok => "ok",
            HostState::Clean => "clean",
            HostState::NotClean => "NOT clean",
            HostState::Unreachable => "unreachable",
            HostState::Skipped => "skipped",
            HostState::Failed => "failed",
        })
    }
}

/// One host's line in a one-shot's summary over several hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostRow {
    pub host: String,
    pub state: HostState,
    pub detail: String,
    /// Why the host failed, in full (said once on stderr, or in the JSON document).
    pub error: Option<String>,
    /// The failure was a mistake in what was asked (exit 2), not of the host.
    pub usage: bool,
}

impl HostRow {
    /// The row alone, as it is said when its host answers (`gpu03  clean  8 GPUs clean`).
    pub(crate) fn line(&self) -> String {
        format!(
            "{}  {}  {}",
            shown(&self.host),
            self.state,
            shown(&self.detail)
        )
    }

    /// Whether this host is as it should be (the exit code is 0 only when all are).
    pub(crate) fn good(&self) -> bool {
        self.state.good()
    }
}

/// The per-host summary: hosts with the same state and detail folded into one row under a
/// hostlist (as `dshbak -c` does), then the counts, naming the hosts that are not good.
pub(crate) fn host_summary(rows: &[HostRow], style: Style) -> String {
    let mut groups: Vec<(HostState, &str, Vec<&str>)> = Vec::new();
    // Each group's place, looked up: hosts whose details all differ made a search per row
    // quadratic.
    let mut place: std::collections::HashMap<(HostState, &str), usize> = Default::default();
    for r in rows {
        match place.entry((r.state, &r.detail)) {
            std::collections::hash_map::Entry::Occupied(g) => groups[*g.get()].2.push(&r.host),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(groups.len());
                groups.push((r.state, &r.detail, vec![&r.host]));
            }
        }
    }
    let mut t = table(&["HOST", "STATE", "DETAIL"], style);
    for (state, detail, hosts) in &groups {
        let color = if state.good() {
            Color::Green
        } else {
            Color::Red
        };
        t.add_row(vec![
            cell(crate::hosts::fold::compress(hosts)),
            colored(state.to_string(), Some(color), style),
            cell(detail),
        ]);
    }
    format!("{}\n{}", trimmed(t), host_counts(rows))
}

/// `64 hosts: 61 clean, 3 NOT clean: gpu[05,33,40]`: each state's count, and the hosts
/// of each state that is not good as a hostlist.
pub(crate) fn host_counts(rows: &[HostRow]) -> String {
    let mut states: Vec<(HostState, Vec<&str>, bool)> = Vec::new();
    for r in rows {
        match states.iter_mut().find(|(s, _, _)| *s == r.state) {
            Some(s) => s.1.push(&r.host),
            None => states.push((r.state, vec![&r.host], r.good())),
        }
    }
    let mut out = format!("{}: ", crate::words::count(rows.len(), "host", "hosts"));
    let mut listed = false;
    for (i, (state, hosts, good)) in states.iter().enumerate() {
        if i > 0 {
            // After a hostlist, whose own commas would run into the next count.
            out.push_str(if listed { "; " } else { ", " });
        }
        out.push_str(&format!("{} {state}", hosts.len()));
        listed = !good;
        if listed {
            out.push_str(&format!(
                ": {}",
                shown(&crate::hosts::fold::compress(hosts))
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_ansi_removes_colour() {
        assert_eq!(strip_ansi("\x1b[1;32mok\x1b[0m done"), "ok done");
    }
}
