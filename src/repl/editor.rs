//! The line editor's helper: Tab completion of names, hints as you type, and the history file.

use rustyline::completion::Completer;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::validate::Validator;
use rustyline::Context;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Rhai's keywords, completed like names.
const KEYWORDS: &[&str] = &[
    "as", "break", "catch", "const", "continue", "else", "false", "fn", "for", "if", "import",
    "in", "let", "loop", "private", "return", "switch", "this", "throw", "true", "try", "until",
    "while",
];

/// The REPL's own commands.
pub(super) const COMMANDS: &[&str] = &[":help", ":quit", ":vars"];

/// Everything the prompt can complete, refreshed after each input.
#[derive(Debug, Default)]
pub(super) struct Names {
    /// Callable by name: gpuloop's functions, rhai's standard library, this session's.
    pub functions: BTreeSet<String>,
    /// gpuloop's and this session's functions with the parameters of their longest
    /// overload, for hints.
    pub signatures: BTreeMap<String, String>,
    pub variables: BTreeSet<String>,
    /// Modules kept imported: alias → its functions.
    pub modules: BTreeMap<String, BTreeSet<String>>,
    /// The stdlib modules, for `import "…"`.
    pub stdlib: Vec<String>,
    /// The fields of the gpuloop records variables hold (GPU, holder, diagnosis, …), for
    /// `g.mem<Tab>`; a variable holding an array of records is keyed `name[]`, for `hs[0].`.
    pub fields: BTreeMap<String, BTreeSet<String>>,
}

pub(super) struct Helper {
    pub names: Names,
    pub color: bool,
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Where the name ending at the cursor starts: identifier characters, and `alias::` paths.
fn word_start(before: &str) -> usize {
    let mut start = before.len();
    loop {
        start = before[..start]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_ident(c))
            .last()
            .map_or(start, |(i, _)| i);
        if before[..start].ends_with("::") && before[..start - 2].ends_with(is_ident) {
            start -= 2;
        } else {
            return start;
        }
    }
}

/// The variable or call whose field is being named in `head` (the text before the word,
/// ending in a dot): `g.` gives `g`, `hs[0].` gives `hs[]`, `gpu(0).` gives `gpu()` and
/// `holders()[1].` gives `holders()[]`.
fn receiver(head: &str) -> Option<String> {
    let mut rest = head.strip_suffix('.')?;
    let mut indexed = false;
    if let Some(open) = rest.strip_suffix(']').and_then(|r| r.rfind('[')) {
        rest = &rest[..open];
        indexed = true;
    }
    let mut call = "";
    if let Some(args) = rest.strip_suffix(')') {
        // The `(` that opens this call's arguments.
        let mut depth = 0;
        let open = args.char_indices().rev().find(|&(_, c)| {
            match c {
                ')' => depth += 1,
                '(' if depth == 0 => return true,
                '(' => depth -= 1,
                _ => {}
            }
            false
        })?;
        rest = &args[..open.0];
        call = "()";
    }
    let name = &rest[word_start(rest)..];
    let name = &format!("{name}{call}");
    if name.is_empty() || name.contains("::") || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    Some(if indexed {
        format!("{name}[]")
    } else {
        name.to_string()
    })
}

/// The partial module name in an `import "…` at the cursor.
fn open_import(before: &str) -> Option<&str> {
    let (head, partial) = before.rsplit_once('"')?;
    (head.trim_end().ends_with("import") && !partial.contains(char::is_whitespace))
        .then_some(partial)
}

impl Names {
    /// Completions for the text before the cursor: (where the replaced word starts, candidates).
    pub(super) fn complete(&self, before: &str) -> (usize, Vec<String>) {
        if let Some(partial) = open_import(before) {
            let found = self
                .stdlib
                .iter()
                .filter(|m| m.starts_with(partial))
                .cloned()
                .collect();
            return (before.len() - partial.len(), found);
        }
        let start = word_start(before);
        let word = &before[start..];
        let head = &before[..start];
        if head.trim().is_empty() && head.ends_with(':') || head == ":" {
            let found = COMMANDS
                .iter()
                .filter(|c| c[1..].starts_with(word))
                .map(|c| c.to_string());
            return (start - 1, found.collect());
        }
        if let Some((alias, partial)) = word.rsplit_once("::") {
            let found = self
                .modules
                .get(alias)
                .into_iter()
                .flatten()
                .filter(|m| m.starts_with(partial))
                .map(|m| format!("{alias}::{m}"))
                .collect();
            return (start, found);
        }
        let mut found: BTreeSet<String> = BTreeSet::new();
        let matching = |s: &&String| s.starts_with(word);
        // A record's fields first: after `g.` a field is what is meant far more often than a
        // method.
        if let Some(fields) = receiver(head).and_then(|r| self.fields.get(&r)) {
            let fields: Vec<String> = fields.iter().filter(matching).cloned().collect();
            if !fields.is_empty() {
                return (start, fields);
            }
        }
        if word.is_empty() {
            return (start, Vec::new());
        }
        found.extend(self.functions.iter().filter(matching).cloned());
        // After a dot only methods make sense.
        if !head.ends_with('.') {
            found.extend(self.variables.iter().filter(matching).cloned());
            found.extend(
                KEYWORDS
                    .iter()
                    .filter(|k| k.starts_with(word))
                    .map(|k| k.to_string()),
            );
            found.extend(
                self.modules
                    .keys()
                    .filter(matching)
                    .map(|a| format!("{a}::")),
            );
        }
        (start, found.into_iter().collect())
    }

    /// A hint for the cursor at the end of `line`: a function's parameters right after
    /// `name(`, or the rest of the one name that the word starts.
    pub(super) fn hint(&self, line: &str) -> Option<Hint> {
        if let Some(call) = line.strip_suffix('(') {
            let name = &call[word_start(call)..];
            let params = self.signatures.get(name)?;
            return Some(Hint {
                display: format!("{params})"),
                completion: None,
            });
        }
        let word = &line[word_start(line)..];
        if word.chars().count() < 2 {
            return None;
        }
        let candidates = self
            .signatures
            .keys()
            .chain(&self.variables)
            .cloned()
            .chain(
                self.modules
                    .iter()
                    .flat_map(|(a, ms)| ms.iter().map(move |m| format!("{a}::{m}"))),
            );
        let best = candidates
            .filter(|c| c.len() > word.len() && c.starts_with(word))
            .min_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)))?;
        let rest = best[word.len()..].to_string();
        Some(Hint {
            display: rest.clone(),
            completion: Some(rest),
        })
    }
}

pub(super) struct Hint {
    display: String,
    completion: Option<String>,
}

impl rustyline::hint::Hint for Hint {
    fn display(&self) -> &str {
        &self.display
    }
    fn completion(&self) -> Option<&str> {
        self.completion.as_deref()
    }
}

impl Completer for Helper {
    type Candidate = String;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<String>)> {
        Ok(self.names.complete(&line[..pos]))
    }
}

impl Hinter for Helper {
    type Hint = Hint;

    fn hint(&self, line: &str, pos: usize, _: &Context<'_>) -> Option<Hint> {
        if pos < line.len() {
            return None;
        }
        self.names.hint(line)
    }
}

impl Highlighter for Helper {
    fn highlight_hint<'h>(&self, hint: &'h str) -> Cow<'h, str> {
        if self.color {
            Cow::Owned(format!("\x1b[2m{hint}\x1b[0m"))
        } else {
            Cow::Borrowed(hint)
        }
    }
}

impl Validator for Helper {}

impl rustyline::Helper for Helper {}

/// The history file, `$XDG_STATE_HOME/gpuloop/history` (by default
/// `~/.local/state/gpuloop/history`), kept as the journal beside it is: opened once, through
/// no link and never a FIFO, in a directory that is this user's alone, and a file that is
/// theirs alone. The line editor reads and writes it by path: the path it is given is the
/// opened file's own (`/proc/self/fd/N`), which no one can swap.
pub(super) struct History {
    _file: std::os::fd::OwnedFd,
    /// The opened file, as a path the line editor can open again.
    pub(super) at: PathBuf,
    /// Where it is, for messages.
    pub(super) shown: PathBuf,
    /// It had lines when it was opened.
    pub(super) kept: bool,
}

/// Opens the history file (created if missing); the error says why it cannot be used.
pub(super) fn history() -> Option<Result<History, String>> {
    use crate::journal::files;
    let state =
        dirs::state_dir().or_else(|| dirs::home_dir().map(|h| h.join(".local").join("state")))?;
    let dir = state.join("gpuloop");
    let shown = dir.join("history");
    let opened = files::open_dir(&dir)
        .and_then(|d| files::open_file(&d, &dir, "history", files::Open::Update))
        .map_err(|e| e.to_string())
        .and_then(|f| f.ok_or_else(|| format!("{}: not created", shown.display())));
    Some(opened.map(|file| {
        let kept = rustix::fs::fstat(&file).is_ok_and(|st| st.st_size > 0);
        History {
            at: PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&file)
            )),
            _file: file,
            shown,
            kept,
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        Names {
            functions: set(&["holders", "gpu", "len", "wait_clean", "helper_fn"]),
            signatures: [
                ("holders", "sel, opts"),
                ("wait_clean", "sel, opts"),
                ("gpu", "index"),
            ]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
            variables: set(&["held", "gpus_before"]),
            modules: [("r".to_string(), set(&["summary", "gpu_lines"]))]
                .into_iter()
                .collect(),
            stdlib: vec!["report".into()],
            fields: [
                (
                    "g",
                    set(&["index", "mem_used_mib", "mem_total_mib", "util"]),
                ),
                ("hs[]", set(&["pid", "mem_mib", "name"])),
            ]
            .into_iter()
            .map(|(v, f)| (v.to_string(), f))
            .collect(),
        }
    }

    #[test]
    fn completes_functions_variables_and_keywords() {
        let n = names();
        assert_eq!(
            n.complete("let x = hel"),
            (8, vec!["held".into(), "helper_fn".into()])
        );
        assert_eq!(
            n.complete("gp"),
            (0, vec!["gpu".into(), "gpus_before".into()])
        );
        assert_eq!(n.complete("wh"), (0, vec!["while".into()]));
    }

    #[test]
    fn completes_module_members() {
        let n = names();
        assert_eq!(n.complete("print(r::s"), (6, vec!["r::summary".into()]));
        assert_eq!(
            n.complete("r::"),
            (0, vec!["r::gpu_lines".into(), "r::summary".into()])
        );
        assert_eq!(n.complete("import \"re"), (8, vec!["report".into()]));
    }

    #[test]
    fn after_a_dot_only_functions() {
        assert_eq!(names().complete("gpu().le"), (6, vec!["len".into()]));
    }

    /// A new user's report: `g.mem<Tab>` on a GPU record offered nothing but methods.
    #[test]
    fn completes_a_records_fields_after_a_dot() {
        let n = names();
        assert_eq!(
            n.complete("print(g.mem"),
            (8, vec!["mem_total_mib".into(), "mem_used_mib".into()])
        );
        assert_eq!(n.complete("hs[0].m"), (6, vec!["mem_mib".into()]));
        assert_eq!(n.complete("hs[i + 1].na"), (10, vec!["name".into()]));
        // Not a field of it: the methods, as before.
        assert_eq!(n.complete("g.le"), (2, vec!["len".into()]));
        assert_eq!(n.complete("held.mem"), (5, vec![]));
    }

    #[test]
    fn completes_the_fields_of_a_record_a_call_returns() {
        let mut names = Names::default();
        let gpu: BTreeSet<String> = ["index", "mem_used"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.fields.insert("gpu()".into(), gpu.clone());
        names.fields.insert("gpu()[]".into(), gpu);
        assert_eq!(
            names.complete("gpu(0).me"),
            (7, vec!["mem_used".to_string()])
        );
        assert_eq!(
            names.complete("x = gpu(f(1), [2]).in"),
            (19, vec!["index".to_string()])
        );
        assert_eq!(names.complete("gpu()[0].i"), (9, vec!["index".to_string()]));
    }

    #[test]
    fn completes_commands() {
        assert_eq!(names().complete(":he"), (0, vec![":help".into()]));
        assert_eq!(
            names().complete(":help wai"),
            (6, vec!["wait_clean".into()])
        );
    }

    #[test]
    fn hints_rest_of_name_and_parameters() {
        let n = names();
        let h = n.hint("let x = wait_c").expect("hint");
        assert_eq!(
            (h.display.as_str(), h.completion.as_deref()),
            ("lean", Some("lean"))
        );
        let h = n.hint("holders(").expect("hint");
        assert_eq!((h.display.as_str(), h.completion), ("sel, opts)", None));
        assert!(n.hint("x").is_none());
        assert!(n.hint("zz").is_none());
    }
}
