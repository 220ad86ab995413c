//! Crossing the script boundary: serde structs to maps, and options/selectors from Rhai values.

use crate::inspect::select::{self, Selector};
use rhai::{Array, Dynamic, EvalAltResult, Map, Position};
use serde::Serialize;
use std::time::Duration;

pub(crate) type RhaiResult<T> = Result<T, Box<EvalAltResult>>;

/// True if arrays and maps are nested in `v` more than `max` deep (a scalar is 0 deep).
/// It recurses at most `max + 1` levels: the script thread's stack is sized for `max`.
pub(crate) fn nested_deeper_than(v: &Dynamic, max: usize) -> bool {
    if let Ok(a) = v.as_array_ref() {
        return max == 0 && !a.is_empty() || a.iter().any(|x| nested_deeper_than(x, max - 1));
    }
    if let Ok(m) = v.as_map_ref() {
        return max == 0 && !m.is_empty() || m.values().any(|x| nested_deeper_than(x, max - 1));
    }
    false
}

/// An error when `v` is nested deeper than `max`, the engine's `depth` limit (walking it
/// recursively, as JSON and printing do, could overflow the stack).
pub(crate) fn check_depth(v: &Dynamic, what: &str, max: usize) -> RhaiResult<()> {
    if nested_deeper_than(v, max) {
        return Err(script_err(format!(
            "{what}: the value is nested more than {max} deep, the depth limit (raise it with --limit depth=N or [limits] in config.toml)"
        )));
    }
    Ok(())
}

/// What a read of a variable found over a limit.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OverLimit {
    Depth(usize),
    Array(usize),
    Map(usize),
    String(usize),
}

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, name, n) = match self {
            OverLimit::Depth(n) => ("is nested deeper than", "depth", n),
            OverLimit::Array(n) => ("holds more array elements than", "array", n),
            OverLimit::Map(n) => ("holds more map entries than", "map", n),
            OverLimit::String(n) => ("holds a string longer than", "string", n),
        };
        write!(
            f,
            "{what} {n}, the {name} limit (raise it with --limit {name}=N or [limits] in config.toml)"
        )
    }
}

/// Checks a value as a script reads it (rhai's `on_var`), in at most `depth + BUDGET` steps
/// however large the value is: its nesting against `depth`, and its arrays' elements, maps'
/// entries and strings' bytes against their limits, as far as those steps reach (the top
/// level always). Every step that builds a value reads the one it builds on, so a value can
/// grow past a limit by one step only: nesting is bounded as it is built, and no step pays
/// for the whole of a large value (rhai's own size checks did, after every change: nesting
/// N deep cost N² and pushing N elements N²).
pub(crate) fn check_read(v: &Dynamic, limits: &crate::config::Limits) -> Result<(), OverLimit> {
    /// Steps past the depth limit's: enough to see through a few thousand elements.
    const BUDGET: usize = 1024;
    struct Walk<'a> {
        steps: usize,
        arrays: usize,
        maps: usize,
        limits: &'a crate::config::Limits,
    }
    fn visit(w: &mut Walk, v: &Dynamic, left: usize) -> Result<(), OverLimit> {
        if w.steps == 0 {
            return Ok(());
        }
        w.steps -= 1;
        if let Ok(a) = v.as_array_ref() {
            w.arrays = w.arrays.saturating_add(a.len());
            if w.arrays > w.limits.array {
                return Err(OverLimit::Array(w.limits.array));
            }
            items(w, a.iter(), left)
        } else if let Ok(m) = v.as_map_ref() {
            w.maps = w.maps.saturating_add(m.len());
            if w.maps > w.limits.map {
                return Err(OverLimit::Map(w.limits.map));
            }
            items(w, m.values(), left)
        } else if let Ok(s) = v.as_immutable_string_ref() {
            if s.len() > w.limits.string {
                return Err(OverLimit::String(w.limits.string));
            }
            Ok(())
        } else {
            Ok(())
        }
    }
    /// The items of an array or a map `left` levels above the depth limit.
    fn items<'v>(
        w: &mut Walk,
        mut items: impl Iterator<Item = &'v Dynamic>,
        left: usize,
    ) -> Result<(), OverLimit> {
        let Some(first) = items.next() else {
            return Ok(());
        };
        if left == 0 {
            return Err(OverLimit::Depth(w.limits.depth));
        }
        for x in std::iter::once(first).chain(items) {
            if w.steps == 0 {
                break;
            }
            if x.is_array() || x.is_map() || x.is_string() {
                visit(w, x, left - 1)?;
            } else {
                // A scalar: a step, and nothing to look into.
                w.steps -= 1;
            }
        }
        Ok(())
    }
    let mut w = Walk {
        steps: limits.depth.saturating_add(BUDGET),
        arrays: 0,
        maps: 0,
        limits,
    };
    visit(&mut w, v, limits.depth)
}

/// A script-facing error at no particular position (rhai fills in the call site).
pub(crate) fn script_err(msg: impl Into<String>) -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(msg.into()),
        Position::NONE,
    ))
}

/// Any domain error becomes a runtime error with its message; one that an interrupt caused
/// (hosts left unopened, a call cut short) ends the script as the interrupt does.
pub(crate) fn to_script<E: std::fmt::Display>(e: E) -> Box<EvalAltResult> {
    if crate::interrupt::is_set() {
        return super::bindings::interrupted();
    }
    script_err(e.to_string())
}

/// A record as a script's map (see `record`).
pub(crate) fn to_map<T: Serialize>(v: &T) -> RhaiResult<Dynamic> {
    super::record::to_dynamic(v)
}

pub fn to_array<T: Serialize>(items: &[T]) -> RhaiResult<Array> {
    items.iter().map(to_map).collect()
}

/// A GPU selector: `()` is all; an index, a string as `--gpu` takes it (`"0,1"`, `"0-3"`, a
/// UUID or a unique prefix of one, a bus id), or an array of those.
pub fn selectors(v: &Dynamic) -> RhaiResult<Option<Vec<Selector>>> {
    if v.is_unit() {
        return Ok(None);
    }
    let one = |x: &Dynamic| -> RhaiResult<Vec<Selector>> {
        if let Ok(i) = x.as_int() {
            return Ok(vec![Selector::Index(i)]);
        }
        if let Ok(text) = x.clone().into_immutable_string() {
            return select::parse(&text).map_err(to_script);
        }
        Err(script_err(format!(
            "GPU selector: expected an index, a string such as \"0-3\" or a UUID, an array of those, or (); found a {}",
            x.type_name()
        )))
    };
    match v.clone().try_cast::<Array>() {
        Some(a) => {
            let mut out = Vec::new();
            for x in &a {
                out.extend(one(x)?);
            }
            Ok(Some(out))
        }
        None => one(v).map(Some),
    }
}

/// An options map, checked against the names a function knows.
pub(crate) struct Opts<'a> {
    map: &'a Map,
    func: &'a str,
}

impl<'a> Opts<'a> {
    pub(crate) fn new(map: &'a Map, func: &'a str, known: &[&str]) -> RhaiResult<Opts<'a>> {
        for k in map.keys() {
            if !known.contains(&k.as_str()) {
                let hint = super::fields::closest(k, known.iter().copied())
                    .map(|c| format!("did you mean `{c}`? "))
                    .unwrap_or_default();
                return Err(script_err(format!(
                    "{func}: unknown option {k:?}: {hint}(known: {})",
                    known.join(", ")
                )));
            }
        }
        Ok(Opts { map, func })
    }

    fn get(&self, key: &str) -> Option<&Dynamic> {
        self.map.get(key).filter(|v| !v.is_unit())
    }

    fn wrong(&self, key: &str, want: &str, v: &Dynamic) -> Box<EvalAltResult> {
        script_err(format!(
            "{}: option {key} must be {want}, not a {}",
            self.func,
            v.type_name()
        ))
    }

    pub(crate) fn bool(&self, key: &str, default: bool) -> RhaiResult<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().map_err(|_| self.wrong(key, "true or false", v)),
        }
    }

    pub(crate) fn int(&self, key: &str, default: i64) -> RhaiResult<i64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_int().map_err(|_| self.wrong(key, "an integer", v)),
        }
    }

    /// A Slurm job id: an integer, or a string of digits as `env("SLURM_JOB_ID")` gives it.
    pub(crate) fn job_id(&self, key: &str) -> RhaiResult<Option<i64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let id = match v.as_int() {
            Ok(i) => Some(i).filter(|&i| i > 0),
            Err(_) => v
                .clone()
                .into_string()
                .ok()
                .and_then(|s| crate::process::origin::job_id(&s)),
        };
        id.map(Some).ok_or_else(|| {
            script_err(format!(
                "{}: option {key} must be a Slurm job id, 812 or \"812\" (as env(\"SLURM_JOB_ID\") gives it), not {}",
                self.func,
                match v.clone().into_string() {
                    Ok(s) => format!("{s:?}"),
                    Err(_) => format!("a {}", v.type_name()),
                }
            ))
        })
    }

    /// Seconds given as int or float.
    pub(crate) fn secs(
        &self,
        key: &str,
        default: Option<Duration>,
    ) -> RhaiResult<Option<Duration>> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => {
                let s = v
                    .as_int()
                    .map(|i| i as f64)
                    .or_else(|_| v.as_float())
                    .map_err(|_| self.wrong(key, "seconds (a number)", v))?;
                crate::inspect::wait::seconds(s)
                    .map(Some)
                    .map_err(|why| script_err(format!("{}: option {key}: {why}", self.func)))
            }
        }
    }

    /// A grace: seconds, or "inf" for never sending KILL (`kill::NEVER`).
    pub(crate) fn grace(&self, key: &str, default: Duration) -> RhaiResult<Duration> {
        match self.get(key) {
            Some(v) if v.is_string() => match v.clone().into_immutable_string() {
                Ok(s) if s.as_str() == "inf" => Ok(crate::process::kill::NEVER),
                _ => Err(self.wrong(key, "seconds (a number) or \"inf\"", v)),
            },
            _ => Ok(self.secs(key, Some(default))?.unwrap_or(default)),
        }
    }

    pub(crate) fn string(&self, key: &str) -> RhaiResult<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .clone()
                .into_immutable_string()
                .map(|s| Some(s.to_string()))
                .map_err(|_| self.wrong(key, "a string", v)),
        }
    }

    /// A pod or a container as a person names it (`pod`, `container`): a string, not empty.
    pub(crate) fn scope(&self, key: &str) -> RhaiResult<Option<String>> {
        match self.string(key)? {
            Some(t) if t.trim().is_empty() => Err(script_err(format!(
                "{}: option {key} is empty: give a name, or an id or a prefix of one",
                self.func
            ))),
            t => Ok(t.map(|t| t.trim().to_string())),
        }
    }

    /// `on_error`: "fail" (the default: a host that cannot be reached is an error naming
    /// it) or "skip" (go on with the others; the skipped host is reported once).
    pub(crate) fn on_error(&self) -> RhaiResult<bool> {
        match self.string("on_error")?.as_deref() {
            None | Some("fail") => Ok(false),
            Some("skip") => Ok(true),
            Some(other) => Err(script_err(format!(
                "{}: option on_error must be \"fail\" or \"skip\", not {other:?}",
                self.func
            ))),
        }
    }

    pub(crate) fn raw(&self, key: &str) -> Option<&Dynamic> {
        self.get(key)
    }

    /// Checks that option `key`, if given, is one of `kinds` ("int|string", see `KINDS`).
    pub(crate) fn kind(&self, key: &str, kinds: &str) -> RhaiResult<()> {
        let Some(v) = self.get(key) else {
            return Ok(());
        };
        let mut wants = Vec::new();
        for kind in kinds.split('|').map(str::trim) {
            let (want, fits) = match kind {
                "int" => ("an integer", v.is_int()),
                "secs" => ("seconds (a number)", v.is_int() || v.is_float()),
                "number" => ("a number", v.is_int() || v.is_float()),
                "bool" => ("true or false", v.is_bool()),
                "string" => ("a string", v.is_string()),
                "Fn" => ("a closure (Fn)", v.is_fnptr()),
                "map" => ("a map", v.is_map()),
                "array" => ("an array", v.is_array()),
                "selector" => (
                    "a GPU selector (an index, an array of them or a string)",
                    v.is_int() || v.is_array() || v.is_string(),
                ),
                "any" => ("anything", true),
                other => {
                    return Err(script_err(format!(
                        "check_opts: unknown kind {other:?} for option {key} (kinds: {})",
                        KINDS.join(", ")
                    )))
                }
            };
            if fits {
                // Seconds also have a range.
                return if kind == "secs" {
                    self.secs(key, None).map(|_| ())
                } else {
                    Ok(())
                };
            }
            wants.push(want);
        }
        Err(self.wrong(key, &wants.join(" or "), v))
    }
}

/// The kinds `Opts::kind` (and the scripts' `check_opts`) know.
pub(crate) const KINDS: &[&str] = &[
    "int", "secs", "number", "bool", "string", "Fn", "map", "array", "selector", "any",
];

/// Checks a script's options map against a spec (`#{name: "kind", …}`) the way the
/// built-in functions check theirs: an unknown name or a wrong type is an error naming the
/// function and the option. `()` counts as no options. Returns the options map.
pub(crate) fn check_spec(func: &str, opts: &Dynamic, spec: &Map) -> RhaiResult<Map> {
    let map = if opts.is_unit() {
        Map::new()
    } else {
        opts.clone().try_cast::<Map>().ok_or_else(|| {
            script_err(format!(
                "{func}: options must be a map, not a {}",
                opts.type_name()
            ))
        })?
    };
    let known: Vec<&str> = spec.keys().map(|k| k.as_str()).collect();
    let o = Opts::new(&map, func, &known)?;
    for (key, kinds) in spec {
        let kinds = kinds.clone().into_immutable_string().map_err(|_| {
            script_err(format!(
                "check_opts: the kind of option {key} must be a string like \"int|string\""
            ))
        })?;
        o.kind(key, &kinds)?;
    }
    Ok(map)
}

/// Seconds from a script number (int or float).
pub(crate) fn secs_arg(v: &Dynamic, what: &str) -> RhaiResult<Duration> {
    let s = v
        .as_int()
        .map(|i| i as f64)
        .or_else(|_| v.as_float())
        .map_err(|_| {
            script_err(format!(
                "{what}: expected seconds (a number), found a {}",
                v.type_name()
            ))
        })?;
    crate::inspect::wait::seconds(s).map_err(|why| script_err(format!("{what}: {why}")))
}
