//! gpuloop's records in scripts (GPU, holder, diagnosis, kill and run maps): reading a field
//! they do not have is an error that names the fields they do have, instead of a silent `()`
//! (`d.verdikt != "clean"` would always be true). Scripts' own maps keep rhai's behaviour.

use rhai::{Dynamic, EvalAltResult, Map, Position};

/// The records gpuloop hands scripts. What fields each has is its serde struct's business
/// (`Kind::marks` names only the few that tell it apart); this says which one a map is, for
/// the missing-field error, the REPL's completion and `src/script/display.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `crate::gpu::Gpu`
    Gpu,
    /// `crate::inspect::holders::Holder`
    Holder,
    /// `crate::inspect::diagnose::Diagnosis`
    Diagnosis,
    /// `crate::process::kill::KillReport`
    KillReport,
    /// `crate::process::kill::Stopped`
    KillTarget,
    /// `crate::runner::Outcome`
    RunResult,
}

impl Kind {
    /// In the order a map is tested against them.
    pub(crate) const ALL: [Kind; 6] = [
        Kind::Gpu,
        Kind::Holder,
        Kind::Diagnosis,
        Kind::KillReport,
        Kind::KillTarget,
        Kind::RunResult,
    ];

    /// The record's name in messages ("a GPU map has no field …").
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Gpu => "GPU",
            Kind::Holder => "holder",
            Kind::Diagnosis => "diagnosis",
            Kind::KillReport => "kill report",
            Kind::KillTarget => "kill target",
            Kind::RunResult => "run result",
        }
    }

    /// The functions that return this record, or an array of them, for the REPL's completion
    /// after `gpu(0).` or `holders()[0].`.
    pub(crate) fn returned_by(self) -> &'static [&'static str] {
        match self {
            Kind::Gpu => &["gpu"],
            Kind::Holder => &["holders"],
            Kind::Diagnosis => &["diagnose"],
            Kind::KillReport => &["kill"],
            Kind::KillTarget => &[],
            Kind::RunResult => &["run", "wait"],
        }
    }

    /// Every field of the record, from its serde struct (through the schema MCP publishes
    /// for it, which follows `flatten` and `skip`).
    pub(crate) fn fields(self) -> Vec<String> {
        let schema = match self {
            Kind::Gpu => schemars::schema_for!(crate::gpu::Gpu),
            Kind::Holder => schemars::schema_for!(crate::inspect::holders::Holder),
            Kind::Diagnosis => schemars::schema_for!(crate::inspect::diagnose::Diagnosis),
            Kind::KillReport => schemars::schema_for!(crate::process::kill::KillReport),
            Kind::KillTarget => schemars::schema_for!(crate::process::kill::Stopped),
            Kind::RunResult => schemars::schema_for!(crate::runner::Outcome),
        };
        schema
            .get("properties")
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Fields only this record has, all of them always there.
    fn marks(self) -> &'static [&'static str] {
        match self {
            Kind::Gpu => &["index", "uuid", "bus_id"],
            Kind::Holder => &["pid", "start", "evidence"],
            Kind::Diagnosis => &["verdict", "advice", "ghost_pids"],
            Kind::KillReport => &["signalled", "survivors", "skipped"],
            Kind::KillTarget => &["pid", "signal", "ended_by"],
            Kind::RunResult => &["ok", "timed_out", "stdout"],
        }
    }
}

/// Which gpuloop record `map` is, if it is one.
pub(crate) fn record_kind(map: &Map) -> Option<Kind> {
    Kind::ALL
        .into_iter()
        .find(|kind| kind.marks().iter().all(|k| map.contains_key(*k)))
}

/// For rhai's missing-property hook: an error for a record, `None` for any other map.
pub(crate) fn missing(map: &Map, prop: &str) -> Option<Box<EvalAltResult>> {
    let kind = record_kind(map)?.name();
    let mut known: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
    known.sort_unstable();
    let hint = closest(prop, known.iter().copied())
        .map(|c| format!("did you mean `{c}`? "))
        .unwrap_or_default();
    Some(Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(format!(
            "a {kind} map has no field `{prop}`: {hint}(fields: {})",
            known.join(", ")
        )),
        Position::NONE,
    )))
}

/// The candidate nearest to `word` by edit distance, if it is near enough to be a typo.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, c)| *d <= limit && *c != word)
        .min_by_key(|(d, c)| (*d, *c))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record's fields come from its struct, `flatten`ed ones included, and the marks
    /// that tell it apart are among them.
    #[test]
    fn each_records_fields_include_its_marks() {
        for kind in Kind::ALL {
            let fields = kind.fields();
            for mark in kind.marks() {
                assert!(
                    fields.iter().any(|f| f == mark),
                    "{kind:?}: {mark} in {fields:?}"
                );
            }
        }
        assert!(Kind::Holder.fields().iter().any(|f| f == "launcher"));
    }

    #[test]
    fn typos_find_their_field() {
        assert_eq!(
            closest("verdikt", ["advice", "verdict", "gpu"]),
            Some("verdict")
        );
        assert_eq!(closest("holder", ["holders", "gpu"]), Some("holders"));
        assert_eq!(closest("zzz", ["holders", "gpu"]), None);
    }
}
