//! `:help` and `:help NAME`: the functions the engine has, grouped by domain, from its metadata.

use crate::render::Style;
use crate::script::bindings;
use crate::script::doc::{self, FnMeta};
use crate::script::recipes::needs::Powers;
use crate::session::Session;
use rhai::{Engine, AST};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The engine's function metadata: global functions and, per static module, its own.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Meta {
    #[serde(default)]
    pub functions: Vec<FnMeta>,
    #[serde(default)]
    pub modules: BTreeMap<String, Meta>,
}

impl Meta {
    /// Everything callable now: registered functions, rhai's standard library when `std`,
    /// the functions defined in `ast`, and the modules the REPL keeps imported.
    pub(super) fn of(engine: &Engine, ast: &AST, std: bool) -> Meta {
        let mut meta: Meta = engine
            .gen_fn_metadata_with_ast_to_json(ast, std)
            .ok()
            .and_then(|json| serde_json::from_str(&json).ok())
            .unwrap_or_default();
        meta.hide_closures();
        meta
    }

    /// Closures compile to `anon$…` functions: nobody calls them by that name.
    fn hide_closures(&mut self) {
        self.functions.retain(|f| !f.name.starts_with("anon$"));
        for m in self.modules.values_mut() {
            m.hide_closures();
        }
    }

    /// The overloads of `name`; `alias::name` looks in that module.
    fn lookup(&self, name: &str) -> Vec<&FnMeta> {
        match name.rsplit_once("::") {
            Some((module, f)) => self
                .modules
                .get(module)
                .map_or_else(Vec::new, |m| m.lookup(f)),
            None => self.functions.iter().filter(|f| f.name == name).collect(),
        }
    }
}

/// The domains `:help` lists, each with the functions its bindings module registers; a
/// function no domain registers is listed under "More".
pub(super) struct Domains {
    groups: Vec<(&'static str, Vec<FnMeta>)>,
}

impl Domains {
    pub(super) fn new(session: &Arc<Session>) -> Domains {
        let fns = |register: &dyn Fn(&mut Engine)| {
            let mut e = Engine::new_raw();
            register(&mut e);
            doc::functions(&e)
        };
        Domains {
            groups: vec![
                (
                    "GPUs: inventory, holders, diagnosis, waiting",
                    fns(&|e| bindings::gpu::register(e, session, Powers::ALL)),
                ),
                (
                    "Processes",
                    fns(&|e| bindings::process::register(e, session, Powers::ALL)),
                ),
                (
                    "Jobs and patches",
                    fns(&|e| bindings::runner::register(e, session, Powers::ALL)),
                ),
                (
                    "Helpers",
                    fns(&|e| bindings::helpers::register(e, &session.config.limits, Powers::ALL)),
                ),
            ],
        }
    }
}

const COMMANDS: &str = "\
:help          this list            :help NAME   signature and doc of NAME (also module::NAME)
:vars          variables in scope   :quit        leave (or Ctrl-D)
:history       the inputs that ran without error, in order
:save NAME     those inputs as recipe NAME in your recipe directory (:save! NAME replaces it)
Tab completes names, Ctrl-C clears the line or cancels a running call; history is kept.";

/// `:help`: the commands, then every gpuloop function by domain, the stdlib modules, and
/// what this session defined and imported.
pub(super) fn overview(engine: &Engine, ast: &AST, domains: &Domains, style: Style) -> String {
    let mut out = vec![COMMANDS.to_string()];
    let ours = doc::functions(engine);
    let mut seen = BTreeSet::new();
    let section = |title: &str, fns: Vec<&FnMeta>, out: &mut Vec<String>| {
        if fns.is_empty() {
            return;
        }
        out.push(format!("\n{}", style.bold(title)));
        out.extend(summaries(&fns));
    };
    for (title, fns) in &domains.groups {
        seen.extend(fns.iter().map(FnMeta::signature));
        section(title, fns.iter().collect(), &mut out);
    }
    let more: Vec<&FnMeta> = ours
        .iter()
        .filter(|f| !seen.contains(&f.signature()))
        .collect();
    section("More", more, &mut out);

    let defined: Vec<FnMeta> = Meta::of(&Engine::new_raw(), ast, false).functions;
    section(
        "Defined in this session",
        defined.iter().collect(),
        &mut out,
    );

    let stdlib = doc::stdlib_functions(engine);
    if !stdlib.is_empty() {
        out.push(format!(
            "\n{}",
            style.bold("Standard library modules (import \"NAME\" as m;)")
        ));
        for (name, header, _) in &stdlib {
            // Module headers open with "name: …"; the name is already in the first column.
            let header = header
                .strip_prefix(&format!("{name}:"))
                .unwrap_or(header)
                .trim();
            out.push(summary_line(
                name,
                &first_sentence(header),
                crate::output::width().unwrap_or(100).clamp(60, 120),
            ));
        }
    }
    let imported = Meta::of(engine, &AST::empty(), false).modules;
    for (alias, m) in &imported {
        let fns: Vec<&FnMeta> = m.functions.iter().collect();
        section(&format!("Imported as {alias}::"), fns, &mut out);
    }
    out.join("\n")
}

/// One entry per function name and doc: overloads that open with the same sentence are folded
/// into optional parameters; overloads that say different things get a line each, so no
/// line claims one overload's doc for all. The sentence is whole, wrapped under its column.
fn summaries(fns: &[&FnMeta]) -> Vec<String> {
    let mut by_name: BTreeMap<&str, Vec<(String, Vec<&FnMeta>)>> = BTreeMap::new();
    // Property getters (`get$pid`) read as fields (`job.pid`), not calls.
    let mut fns: Vec<&&FnMeta> = fns.iter().filter(|f| !f.name.contains('$')).collect();
    // Fewest parameters first: the base overload's doc leads its line.
    fns.sort_by_key(|f| f.params.len());
    for f in fns {
        let sentence = first_sentence(&f.doc());
        let docs = by_name.entry(f.name.as_str()).or_default();
        // Overloads fold into one line when they say the same, take the same parameters (an
        // int and a float `secs`), or one documents itself as a form of the other
        // ("kill() with options: …").
        let params = param_names(f);
        let same = |(s, overloads): &(String, Vec<&FnMeta>)| {
            *s == sentence
                || sentence.contains(&format!("{}()", f.name))
                || overloads.iter().any(|o| param_names(o) == params)
        };
        match docs.iter_mut().find(|d| same(d)) {
            Some((_, overloads)) => overloads.push(f),
            None => docs.push((sentence, vec![f])),
        }
    }
    let width = crate::output::width().unwrap_or(100).clamp(60, 120);
    by_name
        .into_iter()
        .flat_map(|(name, docs)| {
            docs.into_iter().map(move |(sentence, overloads)| {
                let call = format!("{name}({})", folded_params(&overloads));
                summary_line(&call, &sentence, width)
            })
        })
        .collect()
}

/// The column the one-line docs start in.
const DOC_COLUMN: usize = 29;

/// `  call   sentence`, the sentence wrapped between words under its column (on the next line
/// when the call is wider than its column).
fn summary_line(call: &str, sentence: &str, width: usize) -> String {
    let head = format!("  {call:<w$} ", w = DOC_COLUMN - 3);
    let room = width.saturating_sub(DOC_COLUMN).max(30);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in sentence.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > room {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    let pad = " ".repeat(DOC_COLUMN);
    let mut out = if head.chars().count() > DOC_COLUMN {
        format!("{}\n{pad}", head.trim_end())
    } else {
        head
    };
    out.push_str(&lines.join(&format!("\n{pad}")));
    out.trim_end().to_string()
}

fn param_names(f: &FnMeta) -> Vec<String> {
    f.params
        .iter()
        .map(|p| p.name.clone().unwrap_or_else(|| "_".into()))
        .collect()
}

/// Overloads whose parameters extend one another read as `a[, b[, c]]`; unrelated ones are
/// joined with `|`: `job[, opts] | target[, opts]`. Two parameters each optional on its own
/// (`f()`, `f(sel)`, `f(opts)`, `f(sel, opts)`) read as `[sel][, opts]`.
fn folded_params(overloads: &[&FnMeta]) -> String {
    let mut lists: Vec<Vec<String>> = overloads.iter().map(|f| param_names(f)).collect();
    lists.sort_by_key(Vec::len);
    lists.dedup();
    let mut folded = Vec::new();
    let pair = lists.iter().find(|l| {
        l.len() == 2
            && [vec![], vec![l[0].clone()], vec![l[1].clone()]]
                .iter()
                .all(|x| lists.contains(x))
    });
    if let Some(pair) = pair.cloned() {
        let (a, b) = (pair[0].clone(), pair[1].clone());
        let each = [vec![], vec![a.clone()], vec![b.clone()], pair];
        lists.retain(|l| !each.contains(l));
        folded.push(format!("[{a}][, {b}]"));
    }
    let mut chains: Vec<Vec<Vec<String>>> = Vec::new();
    for l in lists {
        match chains
            .iter_mut()
            .find(|c| c.last().is_some_and(|last| l.starts_with(last)))
        {
            Some(chain) => chain.push(l),
            None => chains.push(vec![l]),
        }
    }
    folded.extend(chains.iter().map(|c| fold(c)));
    folded.join(" | ")
}

/// A chain of parameter lists, each extending the one before, as optional parameters.
fn fold(chain: &[Vec<String>]) -> String {
    let Some(first) = chain.first() else {
        return String::new();
    };
    let mut out = first.join(", ");
    for w in chain.windows(2) {
        out.push('[');
        if !w[0].is_empty() {
            out.push_str(", ");
        }
        out.push_str(&w[1][w[0].len()..].join(", "));
    }
    out.push_str(&"]".repeat(chain.len() - 1));
    out
}

/// The doc's first sentence, whole.
fn first_sentence(doc: &str) -> String {
    let text = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    // A period ends the sentence unless it ends an abbreviation such as "e.g.".
    let end = text
        .match_indices(". ")
        .map(|(i, _)| i)
        .find(|&i| !text[..i].ends_with("e.g") && !text[..i].ends_with("i.e"))
        .map_or(text.len(), |i| i + 1);
    text[..end].to_string()
}

/// `:help NAME`: every overload's signature and doc; otherwise the names that come close.
pub(super) fn topic(engine: &Engine, ast: &AST, name: &str, style: Style) -> String {
    let meta = Meta::of(engine, ast, true);
    let mut found: Vec<FnMeta> = meta.lookup(name).into_iter().cloned().collect();
    if found.is_empty() {
        // A stdlib module's function, by module name, before it is imported.
        found = doc::stdlib_functions(engine)
            .into_iter()
            .flat_map(|(_, _, fns)| fns)
            .filter(|f| f.name == name)
            .collect();
    }
    if found.is_empty() {
        let mut close: BTreeSet<String> = meta
            .functions
            .iter()
            .map(|f| f.name.clone())
            .filter(|n| n.contains(name) || name.contains(n.as_str()))
            .filter(|n| {
                !n.starts_with("get$") && !n.starts_with("set$") && !n.starts_with("index$")
            })
            .collect();
        close.retain(|n| n.len() > 1);
        let hint = if close.is_empty() {
            ":help lists every function".to_string()
        } else {
            format!(
                "did you mean: {}",
                close.into_iter().take(8).collect::<Vec<_>>().join(", ")
            )
        };
        return format!("no function named {name:?} ({hint})");
    }
    let mut out = Vec::new();
    for f in found {
        out.push(style.bold(&f.signature()));
        let doc = f.doc();
        let doc = if doc.is_empty() {
            "(no documentation)".to_string()
        } else {
            doc
        };
        out.extend(
            doc.lines()
                .map(|l| format!("    {l}").trim_end().to_string()),
        );
        out.push(String::new());
    }
    out.pop();
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(params: &[&str]) -> FnMeta {
        FnMeta::untyped("f".into(), params.iter().map(|p| p.to_string()), vec![])
    }

    #[test]
    fn overloads_fold_into_optional_parameters() {
        let (a, b, c) = (f(&[]), f(&["sel"]), f(&["sel", "opts"]));
        assert_eq!(folded_params(&[&a, &b, &c]), "[sel[, opts]]");
        let o = f(&["opts"]);
        assert_eq!(folded_params(&[&a, &b, &o, &c]), "[sel][, opts]");
        let (t, to) = (f(&["target"]), f(&["target", "opts"]));
        assert_eq!(folded_params(&[&to, &t]), "target[, opts]");
        assert_eq!(folded_params(&[&a]), "");
        let (x, y) = (f(&["x"]), f(&["y", "z"]));
        assert_eq!(folded_params(&[&x, &y]), "x | y, z");
        let (j, jo) = (f(&["job"]), f(&["job", "opts"]));
        assert_eq!(
            folded_params(&[&j, &t, &jo, &to]),
            "job[, opts] | target[, opts]"
        );
    }

    #[test]
    fn help_diagnose_names_every_verdict() {
        use crate::session::{BackendChoice, Session};
        let session = Session::new(BackendChoice::Auto, crate::config::UserConfig::default(), 0);
        let engine = crate::script::engine::build_engine(
            std::sync::Arc::new(session),
            &crate::script::engine::EngineOpts::default(),
        );
        let text = topic(&engine, &AST::empty(), "diagnose", Style::PLAIN);
        for v in crate::inspect::diagnose::VERDICTS {
            assert!(text.contains(&format!("\"{v}\"")), "{v} missing:\n{text}");
        }
    }

    #[test]
    fn a_long_sentence_wraps_between_words_under_its_column() {
        let line = summary_line(
            "wait_clean([sel][, opts])",
            "Waits until every GPU has no memory used and no compute holder; true as soon as it is.",
            60,
        );
        let lines: Vec<&str> = line.lines().collect();
        assert!(lines.len() > 1, "{line}");
        assert!(
            lines[0].starts_with("  wait_clean([sel][, opts])  Waits"),
            "{line}"
        );
        for l in &lines[1..] {
            assert!(l.starts_with(&" ".repeat(DOC_COLUMN)), "{line}");
        }
        assert!(lines.iter().all(|l| l.chars().count() <= 60), "{line}");
        assert!(line.ends_with("as soon as it is."), "{line}");
        // A call wider than its column puts the sentence under it.
        let line = summary_line("replace_in_file(path, old, new)", "Replaces.", 100);
        assert_eq!(
            line,
            format!(
                "  replace_in_file(path, old, new)\n{}Replaces.",
                " ".repeat(DOC_COLUMN)
            )
        );
    }

    #[test]
    fn first_sentence_stops_at_the_period() {
        assert_eq!(
            first_sentence("One GPU by index.\nAn unknown index is an error."),
            "One GPU by index."
        );
        assert_eq!(first_sentence("no period"), "no period");
        assert_eq!(
            first_sentence("Sleeps (e.g. 0.5). Wakes on Ctrl-C."),
            "Sleeps (e.g. 0.5)."
        );
    }
}
