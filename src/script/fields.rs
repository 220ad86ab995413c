//! gpuloop's records in scripts (GPU, holder, diagnosis, kill and run maps): reading a field
//! they do not have is an error that names the fields they do have, instead of a silent `()`
//! (`d.verdikt != "clean"` would always be true). Scripts' own maps keep rhai's behaviour.

use rhai::{Dynamic, EvalAltResult, Map, Position};

/// Each record kind, by fields that only it has.
const RECORDS: &[(&str, &[&str])] = &[
    ("GPU", &["index", "uuid", "bus_id"]),
    ("holder", &["pid", "start", "evidence"]),
    ("diagnosis", &["verdict", "advice", "ghost_pids"]),
    ("kill report", &["signalled", "survivors", "skipped"]),
    ("kill target", &["pid", "signal", "ended_by"]),
    ("run result", &["ok", "timed_out", "stdout"]),
];

/// Which gpuloop record `map` is, if it is one.
pub fn record_kind(map: &Map) -> Option<&'static str> {
    RECORDS
        .iter()
        .find(|(_, keys)| keys.iter().all(|k| map.contains_key(*k)))
        .map(|(name, _)| *name)
}

/// For rhai's missing-property hook: an error for a record, `None` for any other map.
pub fn missing(map: &Map, prop: &str) -> Option<Box<EvalAltResult>> {
    let kind = record_kind(map)?;
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
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, c)| *d <= limit && *c != word)
        .min_by_key(|(d, c)| (*d, *c))
        .map(|(_, c)| c)
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_field() {
        assert_eq!(
            closest("verdikt", ["advice", "verdict", "gpu"]),
            Some("verdict")
        );
        assert_eq!(closest("holder", ["holders", "gpu"]), Some("holders"));
        assert_eq!(closest("zzz", ["holders", "gpu"]), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
