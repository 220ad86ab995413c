//! `gpuloop repl`: an interactive prompt on the same engine scripts use, for debugging by hand.
//!
//! As in rhai's own REPL, one `Scope` lives across inputs and each input is compiled with it
//! and appended to a running AST whose statements are cleared after the run, so functions
//! defined earlier stay callable. Modules imported by name stay imported.

mod editor;
mod help;
mod input;

use crate::error::Error;
use crate::exit::Exit;
use crate::render::Style;
use crate::script::display;
use crate::script::engine::{build_engine, new_scope, EngineOpts};
use crate::script::errors::{self, ScriptError};
use crate::script::modules::Imports;
use crate::session::Session;
use editor::{Helper, Names};
use rhai::{Dynamic, Engine, Scope, AST};
use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{CompletionType, Editor};
use std::io::IsTerminal;
use std::sync::Arc;

const PROMPT: &str = "gpuloop> ";
const MORE: &str = "     ... ";
/// The name errors give for REPL input; line numbers count every line entered this session.
const SOURCE: &str = "<repl>";

/// Runs the prompt on `session`; `json` prints values as JSON.
pub(crate) fn run(session: Arc<Session>, json: bool) -> Result<Exit, Error> {
    // Jobs spawned at the prompt live across lines; whatever is left is stopped on the way out.
    let _jobs = crate::runner::Supervisor::start();
    Repl::new(session, json)?.run()
}

struct Repl {
    engine: Engine,
    scope: Scope<'static>,
    /// The functions defined so far (statements are cleared after every run).
    ast: AST,
    /// Every line entered, so an error inside a function defined earlier shows its own line.
    transcript: String,
    lines: usize,
    domains: help::Domains,
    /// gpuloop's and rhai's function names, which do not change during a session.
    builtin: Names,
    editor: Editor<Helper, FileHistory>,
    /// Lines piped in (stdin is no terminal), read with a bound on each and Ctrl-C heard
    /// while waiting; the editor reads a terminal.
    piped: Option<crate::input::StdinLines>,
    history: Option<editor::History>,
    json: bool,
    style: Style,
    /// The engine's depth limit: a value nested deeper is not printed.
    depth: usize,
    /// The exit code of the last input's error (0: none).
    failed: Exit,
    /// The inputs that ran without error, in order (functions defined, imports, statements):
    /// what `:history` shows and `:save` writes.
    kept: Vec<String>,
}

/// How many bytes the REPL compiles, at most, to find where one input ends (a few seconds).
const MAX_COMPILED: usize = 32 << 20;

/// What one read from the prompt gave.
enum Read {
    Input(String),
    /// Ctrl-C: the line (and any unfinished input) is dropped.
    Cleared,
    /// Ctrl-D.
    Eof,
    /// Input that cannot be taken (a line past its limit): the error, and the input is dropped.
    Refused(String),
    /// Ctrl-C or another terminating signal while waiting for piped input.
    Interrupted,
}

impl Repl {
    fn new(session: Arc<Session>, json: bool) -> Result<Repl, Error> {
        let dir = std::env::current_dir().ok();
        let domains = help::Domains::new(&session);
        let depth = session.config.limits.depth;
        let engine = build_engine(
            session,
            &EngineOpts {
                imports: Imports::Files { script_dir: dir },
                json,
                ..EngineOpts::default()
            },
        );
        let style = Style::stdout();
        let config = rustyline::Config::builder()
            .auto_add_history(false)
            .bracketed_paste(true)
            .completion_type(CompletionType::List)
            .max_history_size(10_000)
            .map_err(|e| Error::Other(format!("line editor: {e}")))?
            .build();
        let mut editor: Editor<Helper, FileHistory> =
            Editor::with_config(config).map_err(|e| Error::Other(format!("line editor: {e}")))?;
        // rustyline takes SIGINT over for the editor's lifetime; a running call must see
        // Ctrl-C through gpuloop's flag. At the prompt Ctrl-C is a key (raw mode), not a signal.
        crate::interrupt::install();
        let builtin = builtin_names(&engine);
        editor.set_helper(Some(Helper {
            names: Names::default(),
            color: style.color,
        }));
        // Lines piped in are a batch, not something to recall.
        let history = match std::io::stdin()
            .is_terminal()
            .then(editor::history)
            .flatten()
        {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => {
                crate::errln!("warning: the REPL history is not kept: {e}");
                None
            }
            None => None,
        };
        if let Some(h) = history.as_ref().filter(|h| h.kept) {
            if let Err(e) = editor.load_history(&h.at) {
                crate::errln!(
                    "warning: cannot read the REPL history {}: {e}",
                    h.shown.display()
                );
            }
        }
        let mut repl = Repl {
            domains,
            engine,
            scope: new_scope(&[], &[]),
            ast: AST::empty(),
            transcript: String::new(),
            lines: 0,
            builtin,
            editor,
            piped: (!std::io::stdin().is_terminal())
                .then(|| crate::input::StdinLines::new(crate::input::REPL_LINE)),
            history,
            json,
            style,
            depth,
            failed: Exit::Success,
            kept: Vec::new(),
        };
        repl.refresh_names();
        Ok(repl)
    }

    fn run(&mut self) -> Result<Exit, Error> {
        // Piped input is a script read line by line (`gpuloop repl < file`, like
        // `python3 < file`): no banner, and the first error ends it with that error's code.
        let batch = self.piped.is_some();
        if !batch {
            crate::outln!(
                "gpuloop {} REPL: :help lists the functions, :quit or Ctrl-D leaves.",
                env!("CARGO_PKG_VERSION")
            );
        }
        loop {
            let read = self.read()?;
            // SIGTERM cancels a running call like Ctrl-C, and then ends the REPL (its jobs are
            // stopped on the way out like at Ctrl-D).
            if crate::interrupt::terminated() {
                return Ok(Exit::Interrupted);
            }
            let input = match read {
                Read::Input(s) => s,
                Read::Cleared => continue,
                Read::Eof => return Ok(Exit::Success),
                Read::Interrupted => return Ok(Exit::Interrupted),
                Read::Refused(why) => {
                    crate::errln!("error: {why}");
                    if batch {
                        return Ok(Exit::Usage);
                    }
                    continue;
                }
            };
            let cmd = input.trim();
            if let Some(cmd) = cmd.strip_prefix(':') {
                let (name, arg) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
                match (name, arg.trim()) {
                    ("q" | "quit" | "exit", _) => return Ok(Exit::Success),
                    ("help" | "h", "") => crate::output::paged(&help::overview(
                        &self.engine,
                        &self.ast,
                        &self.domains,
                        self.style,
                    )),
                    ("help" | "h", topic) => crate::output::paged(&help::topic(
                        &self.engine,
                        &self.ast,
                        topic,
                        self.style,
                    )),
                    ("vars", _) => self.print_vars(),
                    ("history", _) => self.print_kept(),
                    ("save", name) => self.save(name, false),
                    ("save!", name) => self.save(name, true),
                    _ => crate::errln!("unknown command :{name} (:help lists the commands)"),
                }
                continue;
            }
            if let Some(code) = self.eval(&input) {
                return Ok(code);
            }
            if batch && !self.failed.is_success() {
                return Ok(self.failed);
            }
            self.refresh_names();
        }
    }

    /// Reads one complete input: lines are joined while what has been typed so far only
    /// lacks its end (an open brace, a trailing operator).
    fn read(&mut self) -> Result<Read, Error> {
        let mut input = String::new();
        // Bytes compiled so far to tell whether the input is complete: each line compiles
        // all of it again, so an input continued line after line costs the square of its
        // length; past this it is refused rather than read for hours.
        let mut compiled = 0usize;
        loop {
            if crate::interrupt::is_set() && self.piped.is_some() {
                return Ok(Read::Interrupted);
            }
            let prompt = if input.is_empty() { PROMPT } else { MORE };
            let line = match self.next_line(prompt)? {
                Ok(line) => line,
                Err(read) => return Ok(read),
            };
            // A terminal's line is as long as someone typed or pasted; the piped one is
            // bounded as it is read. Either way one input is at most a script's size.
            let limit = crate::input::REPL_LINE.limit;
            if line.len() as u64 > limit {
                return Ok(Read::Refused(format!(
                    "a line longer than {} (the limit of a REPL line): dropped",
                    crate::input::size(limit)
                )));
            }
            let limit = crate::input::SCRIPT.limit;
            if (input.len() + line.len()) as u64 > limit {
                return Ok(Read::Refused(format!(
                    "an input longer than {} (the limit of a script): dropped",
                    crate::input::size(limit)
                )));
            }
            if !input.is_empty() {
                input.push('\n');
            }
            input.push_str(&line);
            if input.trim().is_empty() {
                return Ok(Read::Cleared);
            }
            let command = input.trim_start().starts_with(':');
            compiled += input.len();
            if compiled > MAX_COMPILED {
                return Ok(Read::Refused(format!(
                    "an input continued over too many lines to check each one (more than {} compiled): run it as a script, gpuloop run FILE",
                    crate::input::size(MAX_COMPILED as u64)
                )));
            }
            if command || !self.incomplete(&input) {
                self.remember(&input);
                return Ok(Read::Input(input));
            }
        }
    }

    /// The next line, from the pipe or the editor; `Err(read)` when there is none to take.
    fn next_line(&mut self, prompt: &str) -> Result<Result<String, Read>, Error> {
        use crate::input::ReadError;
        if let Some(piped) = &mut self.piped {
            return Ok(match piped.next_line() {
                Ok(Some(line)) => Ok(line),
                Ok(None) => Err(Read::Eof),
                Err(ReadError::Interrupted) => Err(Read::Interrupted),
                Err(e @ ReadError::TooLarge { .. }) => Err(Read::Refused(format!("a line {e}"))),
                Err(e) => return Err(Error::Other(format!("reading stdin: {e}"))),
            });
        }
        match self.editor.readline(prompt) {
            Ok(line) => Ok(Ok(line)),
            Err(ReadlineError::Interrupted) => Ok(Err(Read::Cleared)),
            Err(ReadlineError::Eof) => Ok(Err(Read::Eof)),
            Err(e) => Err(Error::Other(format!("reading the prompt: {e}"))),
        }
    }

    fn incomplete(&self, input: &str) -> bool {
        match self.engine.compile_with_scope(&self.scope, input) {
            Ok(_) => false,
            Err(e) => input::incomplete(&e, input),
        }
    }

    fn remember(&mut self, input: &str) {
        if self.editor.add_history_entry(input).is_err() {
            return;
        }
        if let Some(h) = &self.history {
            if let Err(e) = self.editor.append_history(&h.at) {
                crate::errln!(
                    "warning: cannot save the REPL history to {}: {e}",
                    h.shown.display()
                );
                // Once is enough: the session goes on without a history file.
                self.history = None;
            }
        }
    }

    /// Compiles and runs one input; `Some(code)` when the script called exit().
    fn eval(&mut self, input: &str) -> Option<Exit> {
        // Line numbers continue across inputs: the source is padded to start at the next line
        // of the transcript, which error messages quote from.
        let source = format!("{}{input}", "\n".repeat(self.lines));
        if !self.transcript.is_empty() {
            self.transcript.push('\n');
        }
        self.transcript.push_str(input);
        self.lines += input.split('\n').count();

        crate::script::errors::remember(&self.engine, SOURCE, &self.transcript);
        // At a prompt, a Ctrl-C that arrived after the previous run ended must not cancel this
        // one; piped, it ends the script before its next line.
        if self.piped.is_none() {
            crate::interrupt::clear();
        } else if crate::interrupt::is_set() {
            return Some(Exit::Interrupted);
        }
        let mut ast = match self.engine.compile_with_scope(&self.scope, &source) {
            Ok(ast) => ast,
            Err(e) => {
                let err = errors::from_parse(&e, SOURCE, &self.transcript);
                crate::errln!("{}", err.message());
                self.failed = err.exit();
                return None;
            }
        };
        ast.set_source(SOURCE);
        let imports: Vec<(String, String)> = crate::script::engine::imports(&ast)
            .into_iter()
            .filter(|(_, alias, _)| !alias.is_empty())
            .map(|(path, alias, _)| (path, alias))
            .collect();
        self.ast += ast;
        let result = self
            .engine
            .eval_ast_with_scope::<Dynamic>(&mut self.scope, &self.ast);
        self.ast.clear_statements();
        match result {
            Ok(v) => {
                self.keep_imports(&imports);
                self.kept.push(input.to_string());
                self.print(&v);
                None
            }
            Err(e) => {
                let hint = self.did_you_mean(&e);
                match errors::from_eval(*e, SOURCE, &self.transcript) {
                    // Piped, the next lines (a kill among them) must not run after a Ctrl-C.
                    ScriptError::Interrupted
                        if crate::interrupt::terminated() || self.piped.is_some() =>
                    {
                        Some(Exit::Interrupted)
                    }
                    ScriptError::Interrupted => {
                        // The terminal may have echoed "^C" on the line: say it on a clean one.
                        if std::io::stderr().is_terminal() {
                            crate::output::err_control(crate::output::Control::WipeLine, "");
                        }
                        crate::errln!("interrupted");
                        crate::interrupt::clear();
                        None
                    }
                    ScriptError::Exit(code) => Some(code),
                    // An error quotes what the script met (a holder's name): its controls
                    // are shown escaped, its lines kept.
                    ScriptError::Said(code, msg) => {
                        crate::errln!("{}", crate::shown::text(&msg));
                        Some(code)
                    }
                    err => {
                        crate::errln!("{}{hint}", crate::shown::text(err.message()));
                        self.failed = err.exit();
                        None
                    }
                }
            }
        }
    }

    /// "  help: did you mean `holders`?" for a call of a function that does not exist, or the
    /// import a standard library module needs.
    fn did_you_mean(&self, e: &rhai::EvalAltResult) -> String {
        crate::script::calls::did_you_mean(&self.engine, &self.ast, e)
            .map(|h| format!("\n  help: {h}"))
            .unwrap_or_default()
    }

    fn print(&mut self, v: &Dynamic) {
        if v.is_unit() {
            return;
        }
        match display::show(v, self.json, self.style, self.depth) {
            Ok(Some(text)) => crate::outln!("{text}"),
            Ok(None) => {}
            Err(e) => {
                crate::errln!("{e}");
                self.failed = Exit::Failure;
            }
        }
    }

    /// `import "m" as a;` ran: the module stays available as `a::` on later lines.
    fn keep_imports(&mut self, imports: &[(String, String)]) {
        for (path, alias) in imports {
            let module = self.engine.module_resolver().resolve(
                &self.engine,
                None,
                path,
                rhai::Position::NONE,
            );
            match module {
                Ok(m) => {
                    self.engine.register_static_module(alias, m);
                }
                Err(e) => crate::errln!("warning: {alias}:: is gone after this line: {e}"),
            }
        }
    }

    fn print_vars(&self) {
        let mut vars: Vec<_> = self.scope.iter_raw().collect();
        vars.sort_by_key(|(name, ..)| *name);
        for (name, constant, value) in vars {
            let kind = if constant { "const" } else { "let" };
            let text = display::literal(value);
            let text = match text.split_once('\n') {
                Some((first, _)) => format!("{first} …"),
                None => text,
            };
            crate::outln!("{kind} {name} = {text}");
        }
    }

    /// `:history`: the inputs that ran without error, numbered.
    fn print_kept(&self) {
        if self.kept.is_empty() {
            crate::outln!("(no input has run without error yet)");
        }
        for (i, input) in self.kept.iter().enumerate() {
            let mut lines = input.lines();
            crate::outln!("{:>4}  {}", i + 1, lines.next().unwrap_or(""));
            for l in lines {
                crate::outln!("      {l}");
            }
        }
    }

    /// `:save NAME`: the inputs that ran without error, as recipe NAME in the user's recipe
    /// directory, under a header for the user to edit.
    fn save(&mut self, name: &str, replace: bool) {
        use crate::script::recipes;
        if name.is_empty() {
            crate::errln!("usage: :save NAME (then: gpuloop run NAME)");
            return;
        }
        if self.kept.is_empty() {
            crate::errln!("nothing to save: no input has run without error yet");
            return;
        }
        let text = recipe_text(name, &self.kept);
        match recipes::create(name, &text, replace) {
            Ok(path) => crate::outln!(
                "saved {} input(s) to {}: edit its header, then: gpuloop run {name}",
                self.kept.len(),
                path.display()
            ),
            Err(e @ recipes::CreateError::Exists(_)) => {
                crate::errln!("{e} (:save! {name} replaces it)")
            }
            Err(e) => crate::errln!("{e}"),
        }
    }

    /// Completion and hints see what the last input defined.
    fn refresh_names(&mut self) {
        let here = help::Meta::of(&self.engine, &self.ast, false);
        let mut names = Names {
            functions: self.builtin.functions.clone(),
            signatures: self.builtin.signatures.clone(),
            variables: self.scope.iter_raw().map(|(n, ..)| n.to_string()).collect(),
            modules: here
                .modules
                .iter()
                .map(|(alias, m)| {
                    (
                        alias.clone(),
                        m.functions.iter().map(|f| f.name.clone()).collect(),
                    )
                })
                .collect(),
            stdlib: self.builtin.stdlib.clone(),
            fields: self
                .scope
                .iter_raw()
                .filter_map(|(n, _, v)| record_fields(n, v))
                .collect(),
        };
        // After `gpu(0).` or `holders()[0].`: the fields of the record that function returns.
        for kind in crate::script::fields::Kind::ALL {
            let fields: std::collections::BTreeSet<String> = kind.fields().into_iter().collect();
            for f in kind.returned_by() {
                names.fields.insert(format!("{f}()"), fields.clone());
                names.fields.insert(format!("{f}()[]"), fields.clone());
            }
        }
        for f in &here.functions {
            names.functions.insert(f.name.clone());
            add_signature(&mut names, f);
        }
        if let Some(h) = self.editor.helper_mut() {
            h.names = names;
        }
    }
}

/// A recipe made of a session's inputs, in order, under a header the user edits. Each input
/// ends as a statement (a `;` where the REPL did without one).
fn recipe_text(name: &str, inputs: &[String]) -> String {
    let mut out = format!(
        "// {name}: (say here, in one line, what this recipe is for: `gpuloop recipes` shows this line)\n\
         //\n\
         // Saved from a gpuloop REPL session: the inputs that ran without error, in order. This\n\
         // header is yours to edit; `gpuloop recipes new` shows how a recipe declares arguments.\n\
         // A value the REPL printed is not printed by a recipe: wrap it in print() to see it.\n\n"
    );
    for input in inputs {
        let t = input.trim_end();
        let last = t.lines().last().unwrap_or("");
        let end = if t.ends_with(';') || t.ends_with('}') {
            ""
        } else if last.contains("//") {
            // A line comment would swallow the `;`.
            "\n;"
        } else {
            ";"
        };
        out.push_str(&format!("{t}{end}\n"));
    }
    out
}

/// The fields of the gpuloop record variable `name` holds, for completion after `name.`; of the
/// first record in an array, for `name[i].`.
fn record_fields(name: &str, v: &Dynamic) -> Option<(String, std::collections::BTreeSet<String>)> {
    let keys = |m: &rhai::Map| {
        crate::script::fields::record_kind(m)?;
        Some(m.keys().map(|k| k.to_string()).collect())
    };
    if let Some(m) = v.read_lock::<rhai::Map>() {
        return Some((name.to_string(), keys(&m)?));
    }
    let a = v.read_lock::<rhai::Array>()?;
    let m = a.first()?.read_lock::<rhai::Map>()?;
    Some((format!("{name}[]"), keys(&m)?))
}

fn add_signature(names: &mut Names, f: &crate::script::doc::FnMeta) {
    let params: Vec<String> = f
        .params
        .iter()
        .map(|p| p.name.clone().unwrap_or_else(|| "_".into()))
        .collect();
    let longest = names.signatures.entry(f.name.clone()).or_default();
    let text = params.join(", ");
    if text.len() > longest.len() {
        *longest = text;
    }
}

/// The names that do not change in a session: gpuloop's functions (with parameters, for
/// hints), rhai's standard library, and the stdlib modules.
fn builtin_names(engine: &Engine) -> Names {
    let mut names = Names::default();
    for f in crate::script::doc::functions(engine) {
        add_signature(&mut names, &f);
    }
    let all = help::Meta::of(engine, &AST::empty(), true);
    names.functions = all
        .functions
        .iter()
        .map(|f| f.name.clone())
        // Property accessors and operators are not called by these names.
        .filter(|n| n.starts_with(|c: char| c.is_alphabetic() || c == '_') && !n.contains('$'))
        .collect();
    names.stdlib = crate::script::modules::STDLIB
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    names
}
