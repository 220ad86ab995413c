//! Script errors for people: `file:line:col`, the source line and a caret under the spot.

use crate::exit::Exit;
use rhai::{Dynamic, Engine, EvalAltResult, ParseError, Position};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A script error ready to print, with how the run then ends.
#[derive(Debug)]
pub enum ScriptError {
    /// Did not compile: a usage error.
    Compile(String),
    /// Failed while running: a failure.
    Runtime(String),
    /// `exit(code)` was called.
    Exit(Exit),
    /// `exit(reason)` or `usage(msg)`: ends so, saying why (on stderr, as `{"error": …}`
    /// under --json).
    Said(Exit, String),
    /// Ctrl-C or SIGTERM.
    Interrupted,
}

impl ScriptError {
    /// The error with "help: HINT" under it, where there is one (a run's error only).
    pub(crate) fn with_help(self, hint: Option<String>) -> ScriptError {
        match (self, hint) {
            (ScriptError::Runtime(m), Some(h)) => ScriptError::Runtime(format!("{m}\n  help: {h}")),
            (e, _) => e,
        }
    }

    pub fn exit(&self) -> Exit {
        match self {
            ScriptError::Compile(_) => Exit::Usage,
            ScriptError::Runtime(_) => Exit::Failure,
            ScriptError::Exit(e) | ScriptError::Said(e, _) => *e,
            ScriptError::Interrupted => Exit::Interrupted,
        }
    }

    /// The rendered text (empty for exit and interrupt, which print nothing more).
    pub fn message(&self) -> &str {
        match self {
            ScriptError::Compile(m) | ScriptError::Runtime(m) | ScriptError::Said(_, m) => m,
            _ => "",
        }
    }
}

/// The text of every source an engine compiled, by the name errors give it, so that an error
/// caught inside a call (retry, until) can still be shown with its line and caret. Each
/// engine has its own, kept as its default tag: rhai's slot for an engine's own state, which
/// scripts cannot reach.
#[derive(Clone, Default)]
pub(crate) struct Sources(Arc<Mutex<HashMap<String, String>>>);

impl Sources {
    /// Gives `engine` an empty store of its own.
    pub(crate) fn attach(engine: &mut Engine) {
        engine.set_default_tag(Dynamic::from(Sources::default()));
    }

    fn of(engine: &Engine) -> Option<Sources> {
        engine.default_tag().clone().try_cast::<Sources>()
    }
}

/// Remembers `source` under `file` (the name errors use) in `engine`'s store.
pub(crate) fn remember(engine: &Engine, file: &str, source: &str) {
    if let Some(Ok(mut s)) = Sources::of(engine).as_ref().map(|s| s.0.lock()) {
        s.insert(file.to_string(), source.to_string());
    }
}

/// An error caught at run time, rendered like every other one (message, `file:line:col`,
/// the line and a caret) when `engine` compiled its source; `file` is where the call happened.
pub(crate) fn describe(engine: &Engine, err: &EvalAltResult, file: Option<&str>) -> String {
    // The innermost error says what went wrong, and where.
    let mut e = err;
    let mut file = file;
    while let EvalAltResult::ErrorInFunctionCall(_, src, inner, _) = e {
        if !src.is_empty() {
            file = Some(src.as_str());
        }
        e = inner;
    }
    let msg = text_of(e);
    let sources = Sources::of(engine);
    let source = file.and_then(|f| sources.as_ref()?.0.lock().ok()?.get(f).cloned());
    match (file, source) {
        (Some(f), Some(src)) if e.position().line().is_some() => {
            render(&msg, e.position(), f, &src)
        }
        _ => format!("error: {}", strip_position(&msg)),
    }
}

/// The token a native function throws (through `ErrorTerminated`) when Ctrl-C was pressed.
pub(crate) const INTERRUPT_TOKEN: &str = "gpuloop:interrupted";

/// What the engine stops a script with when it passes its `memory` limit (bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoryLimit(pub usize);

/// What `exit(reason)` and `usage(msg)` end a script with: the code and what to print.
#[derive(Debug, Clone)]
pub(crate) struct ExitSaying {
    pub code: i64,
    pub message: String,
}

/// How a script stopped by the engine ends: `exit(N)`, `exit(reason)`, Ctrl-C, or past its
/// memory limit.
fn terminated(token: &rhai::Dynamic, pos: rhai::Position, file: &str, source: &str) -> ScriptError {
    if let Ok(code) = token.as_int() {
        return ScriptError::Exit(Exit::of_script(code));
    }
    if let Some(ExitSaying { code, message }) = token.clone().try_cast::<ExitSaying>() {
        return ScriptError::Said(Exit::of_script(code), message);
    }
    if let Some(MemoryLimit(limit)) = token.clone().try_cast::<MemoryLimit>() {
        let limit = limit as f64;
        let limit = if limit >= (1u64 << 30) as f64 {
            format!("{:.1} GiB", limit / (1u64 << 30) as f64)
        } else {
            format!("{:.0} MiB", limit / (1u64 << 20) as f64)
        };
        return ScriptError::Runtime(render(
            &format!(
                "the script has more than {limit} of memory allocated (a resource limit: raise it with --limit memory=N, or in [limits] of config.toml)"
            ),
            pos,
            file,
            source,
        ));
    }
    ScriptError::Interrupted
}

pub(crate) fn from_parse(err: &ParseError, file: &str, source: &str) -> ScriptError {
    ScriptError::Compile(render(
        &err.err_type().to_string(),
        err.position(),
        file,
        source,
    ))
}

pub(crate) fn from_eval(err: EvalAltResult, file: &str, source: &str) -> ScriptError {
    if let EvalAltResult::ErrorTerminated(token, pos) = &err {
        return terminated(token, *pos, file, source);
    }
    // Errors inside a script function: point at where it went wrong, say which call.
    let mut err = err;
    let mut context = Vec::new();
    loop {
        match err {
            EvalAltResult::ErrorInFunctionCall(name, src, inner, pos) => {
                if src.is_empty() || src == file {
                    // Closures compile to `anon$…` functions: not a name anyone wrote.
                    let call = if name.starts_with("anon$") {
                        "in a closure called".to_string()
                    } else {
                        format!("in call to {name}()")
                    };
                    context.push(format!("{call} at {}", loc(file, pos)));
                    err = *inner;
                } else {
                    context.push(format!("in {name}() of module {src:?}"));
                    err = EvalAltResult::ErrorRuntime(text_of(&inner).into(), pos);
                    break;
                }
            }
            EvalAltResult::ErrorInModule(name, inner, pos) => {
                context.push(format!("in module {name:?}"));
                err = EvalAltResult::ErrorRuntime(text_of(&inner).into(), pos);
                break;
            }
            EvalAltResult::ErrorTerminated(token, pos) => {
                return terminated(&token, pos, file, source);
            }
            e => {
                err = e;
                break;
            }
        }
    }
    let pos = err.position();
    let msg = match &err {
        EvalAltResult::ErrorRuntime(v, _) => v.to_string(),
        EvalAltResult::ErrorDataTooLarge(what, _) => format!(
            "{what} exceeds its limit (a resource limit: raise it with --limit array=N, string=N or map=N, or in [limits] of config.toml)"
        ),
        EvalAltResult::ErrorStackOverflow(_) => "script functions nested deeper than the calls limit (raise it with --limit calls=N, or in [limits] of config.toml)".to_string(),
        e => strip_position(&e.to_string()),
    };
    let mut out = render(&msg, pos, file, source);
    for c in context.iter().rev() {
        out.push_str(&format!("\n  note: {c}"));
    }
    if msg.starts_with(super::modules::NOT_FOUND) {
        return ScriptError::Compile(out);
    }
    ScriptError::Runtime(out)
}

/// An error's message without rhai's "Runtime error: " wrapper of thrown values.
fn text_of(e: &EvalAltResult) -> String {
    match e {
        EvalAltResult::ErrorRuntime(v, _) => v.to_string(),
        e => e.to_string(),
    }
}

fn loc(file: &str, pos: Position) -> String {
    match (pos.line(), pos.position()) {
        (Some(l), Some(c)) => format!("{file}:{l}:{c}"),
        (Some(l), None) => format!("{file}:{l}"),
        _ => file.to_string(),
    }
}

/// rhai appends " (line N, position M)" to messages; we show the position our own way.
fn strip_position(s: &str) -> String {
    match s.rfind(" (line ") {
        Some(at) if s.ends_with(')') => s[..at].to_string(),
        _ => s.to_string(),
    }
}

/// A compile error at the start of a line of `source` (a recipe's header declaration).
pub(crate) fn at_line(msg: &str, line: usize, file: &str, source: &str) -> ScriptError {
    let line = u16::try_from(line).unwrap_or(u16::MAX) as usize;
    ScriptError::Compile(render(msg, Position::new(line as u16, 1), file, source))
}

/// error: MESSAGE
///  --> file:line:col
///   |
/// 3 | let x = foo + 1;
///   |         ^
pub(crate) fn render(msg: &str, pos: Position, file: &str, source: &str) -> String {
    let msg = strip_position(msg);
    let (Some(line), col) = (pos.line(), pos.position()) else {
        return format!("error: {msg}\n --> {file}");
    };
    let col = col.unwrap_or(1);
    let text = source
        .split('\n')
        .nth(line - 1)
        .unwrap_or("")
        .trim_end_matches('\r');
    let num = line.to_string();
    let pad = " ".repeat(num.len());
    // Tabs keep their width in the caret line so it lines up.
    let lead: String = text
        .chars()
        .take(col.saturating_sub(1))
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    format!("error: {msg}\n{pad}--> {file}:{line}:{col}\n{pad} |\n{num} | {text}\n{pad} | {lead}^")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_caret_under_column() {
        let src = "let a = 1;\nlet b = a +* 2;\n";
        let out = render("Unexpected '*'", Position::new(2, 12), "t.rhai", src);
        assert_eq!(
            out,
            "error: Unexpected '*'\n --> t.rhai:2:12\n  |\n2 | let b = a +* 2;\n  |            ^"
        );
    }
}
