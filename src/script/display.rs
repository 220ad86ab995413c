//! Script values for people and as JSON: what the REPL, `gpuloop eval` and `run` print. A
//! gpuloop record (a GPU, holder, diagnosis, kill or run map; `fields::record_kind` says which)
//! is read back into its struct through serde and shown as `src/render.rs` shows it to the
//! one-shot commands; any other value in Rhai's literal syntax.

use super::fields::{record_kind, Kind};
use crate::gpu::Gpu;
use crate::inspect::diagnose::Diagnosis;
use crate::inspect::holders::Holder;
use crate::process::kill::KillReport;
use crate::render::{self, Style};
use crate::runner::Outcome;
use rhai::{Array, Blob, Dynamic, ImmutableString, Map};
use serde::de::DeserializeOwned;

/// What `eval` and the REPL print for a script's value: nothing for `()`, else a table or
/// text for people, or JSON; an error when the value is nested deeper than `depth`, the
/// engine's limit (walking it to print could overflow the stack).
pub(crate) fn show(
    v: &Dynamic,
    as_json: bool,
    style: Style,
    depth: usize,
) -> Result<Option<String>, String> {
    if let Err(e) = super::convert::check_depth(v, "print", depth) {
        return Err(e
            .to_string()
            .trim_start_matches("Runtime error: ")
            .to_string());
    }
    Ok(if as_json {
        Some(crate::shown::json(&json(v), true).unwrap_or_default())
    } else if v.is_unit() {
        None
    } else {
        Some(value(v, style))
    })
}

/// A script value for people: arrays of GPU or holder maps as tables, diagnoses, kill and run
/// reports as short summaries, arrays of maps that carry such records (`workers::jobs()`) as
/// tables, a string as its text, anything else in Rhai's literal form.
pub fn value(v: &Dynamic, style: Style) -> String {
    // A string as its text: its lines kept, its controls (a name another user chose) shown
    // escaped.
    if let Some(s) = v.read_lock::<ImmutableString>() {
        return crate::shown::text(s.as_str()).into_owned();
    }
    if let Some(a) = v.read_lock::<Array>() {
        let table = match a.first().and_then(kind_of) {
            Some(Kind::Gpu) => all::<Gpu>(&a, Kind::Gpu).map(|gs| render::gpus(&gs, style)),
            Some(Kind::Holder) => {
                all::<Holder>(&a, Kind::Holder).map(|hs| render::holders(&hs, style))
            }
            Some(Kind::Diagnosis) => {
                all::<Diagnosis>(&a, Kind::Diagnosis).map(|ds| render::diagnoses(&ds, style))
            }
            _ => None,
        };
        if let Some(t) = table.or_else(|| nested_records(&a, style)) {
            return t;
        }
    }
    let summary = match kind_of(v) {
        Some(Kind::KillReport) => record::<KillReport>(v).map(|r| render::kill_report(&r, style)),
        Some(Kind::RunResult) => record::<Outcome>(v).map(|o| render::run_summary(&o, style)),
        _ => None,
    };
    summary.unwrap_or_else(|| literal(v))
}

/// Which gpuloop record `v` is, if it is a map that is one.
fn kind_of(v: &Dynamic) -> Option<Kind> {
    record_kind(&*v.read_lock::<Map>()?)
}

/// The record a map holds, read back through its serde struct: `None` when a field it needs
/// is missing or of another type (a script changed it), and the value prints as a literal.
fn record<T: DeserializeOwned>(v: &Dynamic) -> Option<T> {
    rhai::serde::from_dynamic(v).ok()
}

/// Every element a record of `kind`, or `None` (also for an empty array, which prints as `[]`).
fn all<T: DeserializeOwned>(a: &Array, kind: Kind) -> Option<Vec<T>> {
    if a.is_empty() {
        return None;
    }
    a.iter()
        .map(|v| (kind_of(v) == Some(kind)).then(|| record(v)).flatten())
        .collect()
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
    let is_record = |v: &Dynamic| kind_of(v).is_some();
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
        v.read_lock::<ImmutableString>()
            .is_some_and(|s| crate::local::is_local(s.as_str()))
    };
    let mut keys: Vec<&str> = first
        .keys()
        .map(|k| k.as_str())
        .filter(|k| *k != "host" || !rows.iter().all(|m| m.get(*k).is_some_and(local)))
        .collect();
    keys.sort_by_key(|k| first.get(*k).is_some_and(holds_records));
    let header: Vec<String> = keys.iter().map(|k| k.to_uppercase()).collect();
    let cells = rows
        .iter()
        .map(|m| {
            keys.iter()
                .map(|k| m.get(*k).map_or_else(String::new, cell))
                .collect()
        })
        .collect();
    let numbers: Vec<usize> = (0..keys.len())
        .filter(|&i| {
            rows.iter()
                .all(|m| m.get(keys[i]).is_some_and(|v| v.is_int()))
        })
        .collect();
    Some(render::grid(&header, cells, &numbers, style))
}

/// A value in a table cell: text bare, `()` as `-`, lists joined with commas, a process record
/// as `name(pid)`.
fn cell(v: &Dynamic) -> String {
    if v.is_unit() {
        return "-".into();
    }
    if let Some(s) = v.read_lock::<ImmutableString>() {
        return s.to_string();
    }
    if let Some(m) = v.read_lock::<Map>() {
        let name = m.get("name").and_then(|n| n.read_lock::<ImmutableString>());
        let pid = m.get("pid").and_then(|p| p.as_int().ok());
        if let (Some(name), Some(pid)) = (name, pid) {
            return format!("{}({pid})", name.as_str());
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

/// Wider literals are broken over several lines.
const LITERAL_WIDTH: usize = 100;

/// A value in Rhai's literal syntax: what you could type to get it back (where Rhai has a
/// literal for it); long arrays and maps are spread over lines, four spaces per level.
pub(crate) fn literal(v: &Dynamic) -> String {
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
    if let Some(s) = v.read_lock::<ImmutableString>() {
        return Value::String(s.to_string());
    }
    if let Some(a) = v.read_lock::<Array>() {
        return Value::Array(a.iter().map(json).collect());
    }
    if let Some(b) = v.read_lock::<Blob>() {
        return Value::Array(b.iter().map(|&x| Value::from(x)).collect());
    }
    if let Some(m) = v.read_lock::<Map>() {
        return Value::Object(m.iter().map(|(k, x)| (k.to_string(), json(x))).collect());
    }
    Value::String(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(code: &str) -> Dynamic {
        rhai::Engine::new().eval::<Dynamic>(code).expect(code)
    }

    /// `v` as the bindings hand it to a script, then known by its kind and read back whole.
    fn round_trip<T: serde::Serialize + DeserializeOwned>(v: &T, kind: Kind) {
        let map = crate::script::convert::to_map(v).expect("to_map");
        assert_eq!(kind_of(&map), Some(kind), "{}", literal(&map));
        let back: T = record(&map).expect("reads back");
        assert_eq!(
            serde_json::to_value(&back).expect("json"),
            serde_json::to_value(v).expect("json")
        );
    }

    /// The few fields `fields::Kind` tells the records apart by, and the serde structs that
    /// are each record's one list of fields, cannot drift apart.
    #[test]
    fn every_record_map_is_known_by_its_kind_and_reads_back_whole() {
        use crate::gpu::MIB;
        use crate::inspect::diagnose::Verdict;
        use crate::inspect::kinds::{Evidence, Role, State};
        use crate::process::kill::Stopped;
        let gpu = Gpu::new(
            0,
            0,
            "GPU-0".into(),
            "NVIDIA H200".into(),
            "00000000:18:00.0".into(),
            80 * MIB,
            MIB,
            vec![],
        );
        round_trip(&gpu, Kind::Gpu);
        let holder = Holder {
            pid: 42,
            ppid: 1,
            pgid: 42,
            sid: 42,
            start: 7,
            pidfs_ino: Some(9),
            uid: 1000,
            user: "alice".into(),
            name: "python3".into(),
            cmdline: "python3 train.py".into(),
            state: State::parse("running"),
            role: Role::Compute,
            gpus: vec![0],
            mig: Vec::new(),
            mem: MIB,
            mem_mib: 1,
            inherited: None,
            inherited_on: Default::default(),
            evidence: vec![Evidence::parse("map").expect("evidence")],
            protected: false,
            host: "local".into(),
            origin: Default::default(),
            maps: vec![],
            opens: Vec::new(),
            caps: false,
            caps_all: false,
        };
        round_trip(&holder, Kind::Holder);
        let diagnosis = Diagnosis {
            gpu: Some(0),
            mem_used: MIB,
            mem_used_mib: 1,
            holders: vec![holder],
            daemons: vec![],
            footprint: vec![],
            ghost_pids: vec![],
            verdict: Verdict::Orphaned,
            advice: "kill them".into(),
            host: "local".into(),
            faults: None,
            blockers: Vec::new(),
            mig: None,
        };
        round_trip(&diagnosis, Kind::Diagnosis);
        let target = Stopped {
            pid: 42,
            name: "python3".into(),
            gpus: vec![0],
            signal: "TERM".into(),
            ended_by: Some("TERM".into()),
            exit_ms: Some(12),
        };
        round_trip(&target, Kind::KillTarget);
        let report = KillReport {
            signalled: vec![42],
            exited: vec![42],
            targets: vec![target],
            elapsed_ms: 12,
            ..KillReport::default()
        };
        round_trip(&report, Kind::KillReport);
        let outcome = Outcome {
            code: Some(0),
            signal: None,
            ok: true,
            timed_out: false,
            stdout: "done\n".into(),
            stderr: String::new(),
            elapsed_ms: 30,
            pid: 43,
            leftovers: vec![],
        };
        round_trip(&outcome, Kind::RunResult);
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
}
