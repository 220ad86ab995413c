//! A recipe's header: the comment block it opens with says what it is for (its first line),
//! declares its arguments (`// arg NAME: TYPE …` lines), which are checked against the
//! command line before the recipe runs and printed by `gpuloop run NAME --help`, and what it
//! does beyond reading (a `// needs:` line, `needs.rs`).
//!
//! ```text
//! // clean-node: after a crashed job, bring the GPUs back to 0 MiB and say what it took.
//! //
//! // arg gpu|gpus: gpus...       the GPUs to clean (0,2  0-3  a UUID prefix); default every GPU
//! // arg timeout: secs = 30      seconds to wait for the memory after each step
//! // arg allow-reset: flag       reset a GPU whose memory nobody holds
//! // arg patch: file!            the unified diff to apply
//! // arg command: rest           the job to run, after --
//! // needs: clean, run
//! ```
//!
//! Nothing here knows Rhai: the values are `ArgValue`s, which the script layer turns into the
//! `ARG` map.

use serde::Serialize;
use std::fmt;

/// What an argument takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ArgKind {
    /// `--name` alone: true when given.
    Flag,
    /// A whole number.
    Int,
    /// A finite number.
    Number,
    /// Seconds, 0 to 1e9 (a timeout, a grace).
    Secs,
    /// Any text.
    String,
    /// The path of an existing regular file.
    File,
    /// GPUs as `--gpu` takes them: 0,2  0-3  a UUID (prefix)  a bus id  host:index.
    Gpus,
    /// Every word after `--` (or from the first word that is no option): a command to run.
    Rest,
}

impl ArgKind {
    const ALL: [(ArgKind, &'static str); 8] = [
        (ArgKind::Flag, "flag"),
        (ArgKind::Int, "int"),
        (ArgKind::Number, "number"),
        (ArgKind::Secs, "secs"),
        (ArgKind::String, "string"),
        (ArgKind::File, "file"),
        (ArgKind::Gpus, "gpus"),
        (ArgKind::Rest, "rest"),
    ];

    pub(crate) fn name(self) -> &'static str {
        ArgKind::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("?", |(_, n)| n)
    }

    fn parse(word: &str) -> Option<ArgKind> {
        ArgKind::ALL
            .iter()
            .find(|(_, n)| *n == word)
            .map(|(k, _)| *k)
    }

    /// The word shown for its value in usage lines (`--timeout SECS`).
    fn metavar(self) -> &'static str {
        match self {
            ArgKind::Flag => "",
            ArgKind::Int => "N",
            ArgKind::Number => "X",
            ArgKind::Secs => "SECS",
            ArgKind::String => "TEXT",
            ArgKind::File => "FILE",
            ArgKind::Gpus => "GPUS",
            ArgKind::Rest => "COMMAND",
        }
    }

    /// What a value must be, for messages.
    fn wants(self) -> &'static str {
        match self {
            ArgKind::Flag => "no value",
            ArgKind::Int => "a whole number",
            ArgKind::Number => "a number",
            ArgKind::Secs => "seconds (0 to 1e9)",
            ArgKind::String => "text",
            ArgKind::File => "the path of a file",
            ArgKind::Gpus => "GPUs as --gpu takes them (0,2  0-3  a UUID prefix  a bus id)",
            ArgKind::Rest => "a command",
        }
    }
}

/// One declared argument.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ArgSpec {
    /// Its name: `--name` on the command line, `ARG.name` in the script (dashes as
    /// underscores).
    pub name: String,
    /// Other spellings on the command line (`gpu|gpus`).
    pub aliases: Vec<String>,
    pub kind: ArgKind,
    /// May be given more than once: the value is an array.
    pub repeat: bool,
    pub required: bool,
    /// The default as written in the header; none means `()` (an empty array when
    /// repeatable, false for a flag).
    pub default: Option<String>,
    pub help: String,
}

impl ArgSpec {
    /// The value its default stands for (`None`: no default).
    pub fn default_value(&self) -> Option<ArgValue> {
        let v = value(self, self.default.as_deref()?).ok()?;
        Some(if self.repeat {
            ArgValue::List(vec![v])
        } else {
            v
        })
    }

    /// The key in the script's `ARG` map.
    pub fn key(&self) -> String {
        self.name.replace('-', "_")
    }

    /// `--timeout SECS`, `--allow-reset`, `COMMAND...`.
    fn synopsis(&self) -> String {
        match self.kind {
            ArgKind::Rest => format!("-- {}...", self.kind.metavar()),
            ArgKind::Flag => format!("--{}", self.name),
            k => format!("--{} {}", self.name, k.metavar()),
        }
    }
}

/// A value of a declared argument, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// Not given, no default.
    Unit,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<ArgValue>),
}

impl ArgValue {
    /// As JSON, for MCP's schema defaults and `--json`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            ArgValue::Unit => serde_json::Value::Null,
            ArgValue::Bool(b) => (*b).into(),
            ArgValue::Int(i) => (*i).into(),
            ArgValue::Float(f) => serde_json::Number::from_f64(*f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            ArgValue::Str(s) => s.clone().into(),
            ArgValue::List(v) => v.iter().map(ArgValue::to_json).collect(),
        }
    }
}

/// What the header says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Header {
    /// The first comment line, without a leading `NAME: `.
    pub purpose: String,
    /// The other comment lines, declarations left out, for `--help`.
    pub prose: Vec<String>,
    pub args: Vec<ArgSpec>,
    /// What its `// needs:` line declares it does beyond reading; `None` without one.
    pub needs: Option<Vec<super::needs::Need>>,
}

/// A declaration that cannot be read: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct HeaderError {
    /// 1-based line of the source.
    pub line: usize,
    pub why: String,
}

/// The header's lines: `(line number, text after the comment marker)`: the comment block the
/// source opens with (after a `#!` line and blank lines), to its first blank or code line.
fn comment_lines(src: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in crate::input::without_bom(src).lines().enumerate() {
        let t = line.trim();
        if i == 0 && t.starts_with("#!") {
            continue;
        }
        if t.is_empty() {
            if out.is_empty() {
                continue;
            }
            break;
        }
        let Some(text) = t.strip_prefix("//") else {
            break;
        };
        // `//!` and `///` doc comments read the same.
        let text = text.strip_prefix(['!', '/']).unwrap_or(text);
        out.push((i + 1, text.strip_prefix(' ').unwrap_or(text).to_string()));
    }
    out
}

/// Reads a recipe's header; `name` is the recipe's, stripped from the purpose line.
pub fn parse(name: &str, src: &str) -> Result<Header, HeaderError> {
    let lines = comment_lines(src);
    let mut header = Header::default();
    let mut rest_line = None;
    for (n, text) in &lines {
        if let Some(decl) = text.trim_start().strip_prefix("arg ") {
            let spec = declaration(decl).map_err(|why| HeaderError { line: *n, why })?;
            let taken: Vec<&str> = header.args.iter().flat_map(spellings).collect();
            if let Some(dup) = spellings(&spec).find(|s| taken.contains(s)) {
                return Err(HeaderError {
                    line: *n,
                    why: format!("argument --{dup} is declared twice"),
                });
            }
            if spec.kind == ArgKind::Rest && header.args.iter().any(|a| a.kind == ArgKind::Rest) {
                return Err(HeaderError {
                    line: *n,
                    why: "only one argument may be of type rest (the words after --)".into(),
                });
            }
            if spec.kind == ArgKind::Rest {
                rest_line = Some(*n);
            }
            header.args.push(spec);
        } else if let Some(list) = text
            .trim_start()
            .strip_prefix("needs:")
            .filter(|_| !(header.purpose.is_empty() && name == "needs"))
        {
            if header.needs.is_some() {
                return Err(HeaderError {
                    line: *n,
                    why: "`// needs:` is declared twice".into(),
                });
            }
            let needs = super::needs::parse(list).map_err(|why| HeaderError { line: *n, why })?;
            header.needs = Some(needs);
        } else if header.purpose.is_empty() && !text.trim().is_empty() {
            let p = text.trim();
            header.purpose = p
                .strip_prefix(name)
                .and_then(|r| r.strip_prefix(':'))
                .map_or(p, str::trim)
                .to_string();
        } else {
            header.prose.push(text.trim_end().to_string());
        }
    }
    // The words of a rest argument are a command the caller gives: a recipe that takes one
    // runs commands, and says so when it declares its needs.
    if let (Some(line), Some(needs)) = (rest_line, &header.needs) {
        if !needs.contains(&super::needs::Need::Run) {
            return Err(HeaderError {
                line,
                why: format!(
                    "an argument of type rest is a command to run: the `// needs:` line ({}) must name run",
                    super::needs::words(needs)
                ),
            });
        }
    }
    // Blank lines at either end of the prose say nothing.
    while header.prose.first().is_some_and(|l| l.trim().is_empty()) {
        header.prose.remove(0);
    }
    while header.prose.last().is_some_and(|l| l.trim().is_empty()) {
        header.prose.pop();
    }
    Ok(header)
}

fn spellings(a: &ArgSpec) -> impl Iterator<Item = &str> + Clone {
    std::iter::once(a.name.as_str()).chain(a.aliases.iter().map(String::as_str))
}

/// `NAME[|ALIAS…]: TYPE[...][!] [= DEFAULT] HELP`.
fn declaration(decl: &str) -> Result<ArgSpec, String> {
    const FORM: &str = "an argument is declared as `// arg NAME: TYPE [= DEFAULT] HELP`, TYPE one of flag, int, number, secs, string, file, gpus, rest, with `...` after it when it may be given more than once and `!` when it must be given";
    let (names, rest) = decl
        .split_once(':')
        .ok_or_else(|| format!("no `:` after the argument's name: {FORM}"))?;
    let mut names = names.trim().split('|').map(str::trim);
    let name = names.next().unwrap_or_default().to_string();
    let aliases: Vec<String> = names.map(String::from).collect();
    for n in std::iter::once(&name).chain(&aliases) {
        let ok = n.starts_with(|c: char| c.is_ascii_lowercase())
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok || n == "help" {
            return Err(format!(
                "{n:?} is no argument name: lowercase letters, digits and dashes, starting with a letter (and not help, which every recipe has)"
            ));
        }
    }
    let rest = rest.trim_start();
    let (word, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let required = word.ends_with('!');
    let word = word.trim_end_matches('!');
    let repeat = word.ends_with("...");
    let word = word.trim_end_matches("...");
    let kind = ArgKind::parse(word).ok_or_else(|| format!("unknown type {word:?}: {FORM}"))?;
    let mut rest = rest.trim_start();
    let mut default = None;
    if let Some(after) = rest.strip_prefix('=') {
        let (value, tail) = default_value(after.trim_start())?;
        default = Some(value);
        rest = tail;
    }
    let spec = ArgSpec {
        name,
        aliases,
        kind,
        repeat,
        required,
        default,
        help: rest.trim().to_string(),
    };
    match (&spec.default, spec.kind) {
        (_, ArgKind::Rest | ArgKind::Flag) if spec.repeat => Err(format!(
            "a {} argument cannot be repeated",
            spec.kind.name()
        )),
        (Some(_), ArgKind::Rest | ArgKind::Flag) => {
            Err(format!("a {} argument has no default", spec.kind.name()))
        }
        (_, ArgKind::Flag) if spec.required => Err("a flag cannot be required".into()),
        (Some(_), _) if spec.required => {
            Err("a required argument has no default: give one or the other".into())
        }
        (Some(d), _) => {
            value(&spec, d).map_err(|why| format!("its default {d:?}: {why}"))?;
            Ok(spec)
        }
        (None, _) => Ok(spec),
    }
}

/// A default: one word, or a double-quoted text; and what follows it.
fn default_value(s: &str) -> Result<(String, &str), String> {
    if let Some(q) = s.strip_prefix('"') {
        let end = q
            .find('"')
            .ok_or("the default's quote is not closed".to_string())?;
        return Ok((q[..end].to_string(), &q[end + 1..]));
    }
    let (word, tail) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
    if word.is_empty() {
        return Err("nothing after `=`: give a default or leave `=` out".into());
    }
    Ok((word.to_string(), tail))
}

/// One value of `spec` from the command line, checked.
fn value(spec: &ArgSpec, text: &str) -> Result<ArgValue, String> {
    let bad = || format!("{text:?} is not {}", spec.kind.wants());
    match spec.kind {
        ArgKind::Flag => Ok(ArgValue::Bool(true)),
        ArgKind::Int => text.trim().parse().map(ArgValue::Int).map_err(|_| bad()),
        ArgKind::Number => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(ArgValue::Float)
            .ok_or_else(bad),
        ArgKind::Secs => {
            let v: f64 = text.trim().parse().map_err(|_| bad())?;
            crate::seconds::seconds(v).map_err(|e| e.to_string())?;
            Ok(ArgValue::Float(v))
        }
        ArgKind::String | ArgKind::Rest => Ok(ArgValue::Str(text.to_string())),
        ArgKind::File => match std::fs::metadata(text) {
            Ok(m) if m.is_file() => Ok(ArgValue::Str(text.to_string())),
            Ok(m) => Err(format!(
                "{text} is {}, not a file",
                crate::input::kind_of(m.file_type())
            )),
            Err(e) => Err(format!("{text}: {e}")),
        },
        ArgKind::Gpus => {
            for part in text.split(',') {
                // `host:index` names one host's GPU; the rest is a selector's syntax.
                if crate::hosts::HostSel::parse_host_index(part.trim()).is_none() {
                    crate::inspect::select::parse(part).map_err(|e| e.to_string())?;
                }
            }
            Ok(ArgValue::Str(text.to_string()))
        }
    }
}

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// Every declared argument's value, by `ArgSpec::key`, in declaration order.
    Values(Vec<(String, ArgValue)>),
    /// `--help` or `-h`.
    Help,
}

/// A mistake on the command line: the message, which names the argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArgError(pub String);

/// Checks `argv` against the declared arguments: `--name VALUE`, `--name=VALUE`, `--flag`,
/// `--` (the rest is the `rest` argument's), and `--help`.
pub fn parse_args(specs: &[ArgSpec], argv: &[String]) -> Result<Parsed, ArgError> {
    let err = |m: String| Err(ArgError(m));
    let rest_spec = specs.iter().find(|s| s.kind == ArgKind::Rest);
    let mut given: Vec<Vec<ArgValue>> = vec![Vec::new(); specs.len()];
    let mut i = 0;
    while i < argv.len() {
        let a = &argv[i];
        i += 1;
        if a == "--help" || a == "-h" {
            return Ok(Parsed::Help);
        }
        let words = |from: usize| {
            argv[from..]
                .iter()
                .map(|w| ArgValue::Str(w.clone()))
                .collect()
        };
        if a == "--" {
            let Some(r) = rest_spec else {
                return err("takes no command after --".into());
            };
            let at = specs.iter().position(|s| s == r).unwrap_or_default();
            given[at] = words(i);
            break;
        }
        let Some(flag) = a.strip_prefix("--") else {
            // The first word that is no option begins the command, as after --.
            if let Some(r) = rest_spec {
                let at = specs.iter().position(|s| s == r).unwrap_or_default();
                given[at] = words(i - 1);
                break;
            }
            return err(format!("unexpected argument {a:?} (options start with --)"));
        };
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (flag, None),
        };
        let Some(at) = specs
            .iter()
            .position(|s| s.kind != ArgKind::Rest && spellings(s).any(|n| n == flag))
        else {
            let names: Vec<&str> = specs
                .iter()
                .filter(|s| s.kind != ArgKind::Rest)
                .flat_map(spellings)
                .collect();
            let hint = crate::script::fields::closest(flag, names.iter().copied())
                .map(|c| format!(": did you mean --{c}?"))
                .unwrap_or_default();
            return err(format!("unknown argument --{flag}{hint}"));
        };
        let spec = &specs[at];
        let text = match (spec.kind, inline) {
            (ArgKind::Flag, Some(_)) => return err(format!("--{flag} takes no value")),
            (ArgKind::Flag, None) => String::new(),
            (_, Some(v)) => v,
            (_, None) => match argv.get(i) {
                Some(v) => {
                    i += 1;
                    v.clone()
                }
                None => return err(format!("--{flag} needs a value: {}", spec.kind.wants())),
            },
        };
        if !spec.repeat && !given[at].is_empty() {
            return err(format!("--{flag} is given twice"));
        }
        given[at].push(value(spec, &text).map_err(|why| ArgError(format!("--{flag} {why}")))?);
    }
    let mut values = Vec::new();
    for (spec, got) in specs.iter().zip(given) {
        if spec.required && got.is_empty() {
            return err(match spec.kind {
                ArgKind::Rest => format!("needs a command to run ({})", spec.synopsis()),
                _ => format!("--{} is required: {}", spec.name, spec.help),
            });
        }
        let v = match (spec.kind, spec.repeat) {
            (ArgKind::Rest, _) | (_, true) if !got.is_empty() || spec.default.is_none() => {
                ArgValue::List(got)
            }
            (ArgKind::Flag, _) => ArgValue::Bool(!got.is_empty()),
            (_, repeat) => match got.into_iter().next() {
                Some(v) => v,
                None => match &spec.default {
                    Some(d) => {
                        let v = value(spec, d).map_err(ArgError)?;
                        if repeat {
                            ArgValue::List(vec![v])
                        } else {
                            v
                        }
                    }
                    None => ArgValue::Unit,
                },
            },
        };
        values.push((spec.key(), v));
    }
    Ok(Parsed::Values(values))
}

/// The command line for arguments given by name (MCP's `run_recipe`): `{"gpu": ["0"],
/// "dry_run": true, "command": ["python", "x.py"]}` is `--gpu 0 --dry-run -- python x.py`.
/// Names may be written with dashes or underscores; the values are checked afterwards by
/// `parse_args`, as the command line's are.
pub fn argv_of(
    specs: &[ArgSpec],
    named: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<String>, ArgError> {
    use serde_json::Value;
    let mut argv = Vec::new();
    let mut rest = Vec::new();
    for (k, v) in named {
        let key = k.replace('-', "_");
        let Some(spec) = specs.iter().find(|s| s.key() == key) else {
            let keys: Vec<String> = specs.iter().map(ArgSpec::key).collect();
            return Err(ArgError(format!(
                "unknown argument {k:?} (it takes: {})",
                if keys.is_empty() {
                    "none".to_string()
                } else {
                    keys.join(", ")
                }
            )));
        };
        let word = |v: &Value| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            other => Err(ArgError(format!(
                "{k}: {other} is not {}",
                spec.kind.wants()
            ))),
        };
        let items: Vec<&Value> = match v {
            Value::Array(a) if spec.repeat || spec.kind == ArgKind::Rest => a.iter().collect(),
            Value::Null => Vec::new(),
            v => vec![v],
        };
        match spec.kind {
            ArgKind::Flag => match v {
                Value::Bool(true) => argv.push(format!("--{}", spec.name)),
                Value::Bool(false) | Value::Null => {}
                other => return Err(ArgError(format!("{k}: {other} is not true or false"))),
            },
            ArgKind::Rest => {
                for i in items {
                    rest.push(word(i)?);
                }
            }
            _ => {
                for i in items {
                    argv.push(format!("--{}={}", spec.name, word(i)?));
                }
            }
        }
    }
    if !rest.is_empty() {
        argv.push("--".into());
        argv.extend(rest);
    }
    Ok(argv)
}

/// `gpuloop run NAME [--gpu GPUS]... [--timeout SECS] [-- COMMAND...]`.
pub fn usage(name: &str, specs: &[ArgSpec]) -> String {
    let mut out = format!("gpuloop run {name}");
    for s in specs {
        let syn = s.synopsis();
        let syn = if s.repeat { format!("{syn}...") } else { syn };
        if s.required {
            out.push_str(&format!(" {syn}"));
        } else {
            out.push_str(&format!(" [{syn}]"));
        }
    }
    out
}

/// What `gpuloop run NAME --help` prints.
pub fn help(name: &str, header: &Header) -> String {
    let mut out = Vec::new();
    if !header.purpose.is_empty() {
        out.push(format!("{name}: {}", header.purpose));
        out.push(String::new());
    }
    out.push(format!("usage: {}", usage(name, &header.args)));
    if !header.args.is_empty() {
        out.push(String::new());
        out.push("arguments:".into());
        let left: Vec<String> = header
            .args
            .iter()
            .map(|s| {
                let names: Vec<String> = match s.kind {
                    ArgKind::Rest => vec![format!("-- {}...", s.kind.metavar())],
                    _ => spellings(s).map(|n| format!("--{n}")).collect(),
                };
                let meta = match s.kind {
                    ArgKind::Flag | ArgKind::Rest => String::new(),
                    k => format!(" {}", k.metavar()),
                };
                format!("{}{meta}", names.join(", "))
            })
            .collect();
        let width = left.iter().map(String::len).max().unwrap_or(0);
        for (l, s) in left.iter().zip(&header.args) {
            let mut notes = Vec::new();
            if s.repeat {
                notes.push("repeatable".to_string());
            }
            if s.required {
                notes.push("required".to_string());
            }
            if let Some(d) = &s.default {
                notes.push(format!("default: {d}"));
            }
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            };
            out.push(format!("  {l:<width$}  {}{notes}", s.help));
        }
    }
    if let Some(needs) = &header.needs {
        out.push(String::new());
        out.push(format!(
            "needs: {} (what it does beyond reading; over MCP it runs only where the server allows that)",
            super::needs::words(needs)
        ));
    }
    if !header.prose.is_empty() {
        out.push(String::new());
        out.extend(header.prose.iter().cloned());
    }
    out.join("\n")
}

impl fmt::Display for ArgKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "#!/usr/bin/env gpuloop\n\
        // demo: shows the header.\n\
        //\n\
        // arg gpu|gpus: gpus...     the GPUs\n\
        // arg timeout: secs = 30    seconds to wait\n\
        // arg attempts: int = 3     how many times\n\
        // arg label: string = \"a b\" a label\n\
        // arg dry-run: flag         say, do nothing\n\
        // arg patch: string!        the diff\n\
        // arg command: rest         the job\n\
        //\n\
        // More words.\n\
        \n\
        // not the header\n\
        // arg late: int             not a declaration\n\
        let x = 1;\n";

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    fn values(h: &Header, line: &str) -> Vec<(String, ArgValue)> {
        match parse_args(&h.args, &args(line)) {
            Ok(Parsed::Values(v)) => v,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn reads_the_purpose_the_declarations_and_the_prose() {
        let h = parse("demo", SRC).unwrap();
        assert_eq!(h.purpose, "shows the header.");
        assert_eq!(h.prose, ["More words."]);
        let names: Vec<&str> = h.args.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(
            names,
            ["gpu", "timeout", "attempts", "label", "dry-run", "patch", "command"]
        );
        assert_eq!(h.args[0].aliases, ["gpus"]);
        assert!(h.args[0].repeat && h.args[5].required);
        assert_eq!(h.args[3].default.as_deref(), Some("a b"));
        assert_eq!(h.args[3].help, "a label");
        assert_eq!(h.args[4].key(), "dry_run");
    }

    #[test]
    fn parses_the_command_line_with_defaults() {
        let h = parse("demo", SRC).unwrap();
        let v = values(
            &h,
            "--gpus 0 --gpu=1-2 --dry-run --patch p.diff -- python x.py --gpu 3",
        );
        let get = |k: &str| v.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(
            get("gpu"),
            Some(ArgValue::List(vec![
                ArgValue::Str("0".into()),
                ArgValue::Str("1-2".into())
            ]))
        );
        assert_eq!(get("timeout"), Some(ArgValue::Float(30.0)));
        assert_eq!(get("attempts"), Some(ArgValue::Int(3)));
        assert_eq!(get("dry_run"), Some(ArgValue::Bool(true)));
        assert_eq!(
            get("command"),
            Some(ArgValue::List(
                ["python", "x.py", "--gpu", "3"]
                    .map(|w| ArgValue::Str(w.into()))
                    .to_vec()
            ))
        );
        // The first word that is no option begins the command.
        let v = values(&h, "--patch p python x.py");
        assert_eq!(
            v.last().map(|(_, v)| v.clone()),
            Some(ArgValue::List(
                ["python", "x.py"].map(|w| ArgValue::Str(w.into())).to_vec()
            ))
        );
        assert_eq!(parse_args(&h.args, &args("--patch p -h")), Ok(Parsed::Help));
    }

    #[test]
    fn a_bad_command_line_says_which_argument_and_why() {
        let h = parse("demo", SRC).unwrap();
        let e = |line: &str| match parse_args(&h.args, &args(line)) {
            Err(ArgError(m)) => m,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(
            e("--patch p --timeout abc"),
            "--timeout \"abc\" is not seconds (0 to 1e9)"
        );
        assert!(e("--patch p --timeout -1").starts_with("--timeout -1 is not a number of seconds"));
        assert_eq!(
            e("--patch p --attempts 1.5"),
            "--attempts \"1.5\" is not a whole number"
        );
        assert_eq!(e("--timeout 1"), "--patch is required: the diff");
        assert_eq!(
            e("--patch p --timout 3"),
            "unknown argument --timout: did you mean --timeout?"
        );
        assert_eq!(e("--patch p --dry-run=yes"), "--dry-run takes no value");
        assert_eq!(
            e("--patch p --attempts 1 --attempts 2"),
            "--attempts is given twice"
        );
        assert!(
            e("--patch p --gpu 3-1").contains("runs backwards"),
            "{}",
            e("--patch p --gpu 3-1")
        );
        assert_eq!(e("--patch"), "--patch needs a value: text");
    }

    #[test]
    fn a_bad_declaration_names_its_line() {
        for (decl, why) in [
            ("// arg Timeout: secs", "no argument name"),
            ("// arg timeout secs", "no `:`"),
            ("// arg timeout: seconds", "unknown type \"seconds\""),
            ("// arg timeout: secs = soon", "its default \"soon\""),
            ("// arg x: flag = true", "a flag argument has no default"),
            ("// arg x: int! = 3", "a required argument has no default"),
            ("// arg help: flag", "not help"),
        ] {
            let src = format!("// t: test\n{decl}\nlet x = 1;\n");
            let e = parse("t", &src).expect_err(decl);
            assert_eq!(e.line, 2, "{decl}");
            assert!(e.why.contains(why), "{decl}: {}", e.why);
        }
        let e = parse("t", "// arg a|b: int\n// arg b: int\n").unwrap_err();
        assert_eq!(
            (e.line, e.why.as_str()),
            (2, "argument --b is declared twice")
        );
    }

    #[test]
    fn the_needs_line_is_read_once_and_a_command_argument_needs_run() {
        use super::super::needs::Need;
        let h = parse(
            "t",
            "// t: test\n// needs: run, clean\n// arg c: rest  the job\n",
        )
        .unwrap();
        assert_eq!(h.needs, Some(vec![Need::Clean, Need::Run]));
        assert_eq!(h.purpose, "test");
        assert!(
            help("t", &h).contains("\nneeds: clean, run ("),
            "{}",
            help("t", &h)
        );
        assert_eq!(parse("t", "// t: test\n").unwrap().needs, None);
        assert_eq!(
            parse("t", "// t: x\n// needs: none\n").unwrap().needs,
            Some(vec![])
        );
        let e = parse("t", "// t: x\n// needs: clean\n// arg c: rest  the job\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.why.contains("must name run"), "{}", e.why);
        let e = parse("t", "// t: x\n// needs: run\n// needs: kill\n").unwrap_err();
        assert_eq!(
            (e.line, e.why.as_str()),
            (3, "`// needs:` is declared twice")
        );
        let e = parse("t", "// t: x\n// needs: sudo\n").unwrap_err();
        assert!(e.why.contains("unknown need \"sudo\""), "{}", e.why);
        // A recipe named needs has its purpose line still.
        assert_eq!(
            parse("needs", "// needs: reads\n").unwrap().purpose,
            "reads"
        );
    }

    #[test]
    fn help_lists_every_argument_with_its_default() {
        let h = parse("demo", SRC).unwrap();
        let text = help("demo", &h);
        assert!(text.starts_with("demo: shows the header.\n\nusage: gpuloop run demo [--gpu GPUS...] [--timeout SECS]"), "{text}");
        assert!(text.contains("--patch TEXT"), "{text}");
        assert!(text.contains("  --gpu, --gpus GPUS"), "{text}");
        assert!(text.contains("seconds to wait (default: 30)"), "{text}");
        assert!(text.ends_with("\n\nMore words."), "{text}");
    }
}
