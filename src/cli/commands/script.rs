//! The commands of the script engine: run, eval, check, recipes, repl, doc.

use super::emit;
use crate::cli::Config;
use crate::error::Error;
use crate::render::{self, Style};
use crate::script::engine::{build_engine, new_scope, run_source, EngineOpts};
use std::path::{Path, PathBuf};

/// The script SCRIPT names: stdin, a file (a path), or a built-in recipe (a bare name, never
/// a file of the current directory). Which one is decided from the word alone, and a name
/// that is no recipe is refused before anything runs.
pub(crate) enum Script {
    Stdin,
    /// A recipe has no directory of its own: its imports come from GPULOOP_PATH, the user's
    /// modules and the standard library, never from the current directory either.
    Recipe {
        name: String,
        src: &'static str,
    },
    /// The path as given (it has a `/` or ends in `.rhai`).
    File(String),
}

impl Script {
    pub(crate) fn named(script: &str) -> Result<Script, Error> {
        use crate::script::recipes::{self, Named};
        Ok(match Named::of(script) {
            Named::Stdin => Script::Stdin,
            Named::Recipe(name) => Script::Recipe {
                name: name.to_string(),
                src: recipes::find(name).ok_or_else(|| {
                    Error::Usage(format!(
                        "no recipe named {name:?} (built-in recipes: {}; gpuloop recipes lists \
                         them); to run a file, name it by its path: ./{name}",
                        recipes::names()
                    ))
                })?,
            },
            Named::File(path) => Script::File(path.to_string()),
        })
    }

    /// Its name for messages, its source, and the directory its imports are looked up in.
    fn read(&self) -> Result<(String, String, Option<PathBuf>), Error> {
        use crate::input::{self, ReadError};
        let script = match self {
            Script::Stdin => {
                let src = input::stdin(input::SCRIPT)
                    .and_then(|b| String::from_utf8(b).map_err(|_| ReadError::NotUtf8))
                    .map_err(|e| match e {
                        ReadError::Interrupted => {
                            Error::Script(crate::script::ScriptError::Interrupted)
                        }
                        e => Error::Usage(format!("cannot read the script from stdin: {e}")),
                    })?;
                let src = input::without_bom(&src).to_string();
                return Ok(("<stdin>".into(), src, std::env::current_dir().ok()));
            }
            Script::Recipe { name, src } => return Ok((name.clone(), src.to_string(), None)),
            Script::File(script) => script,
        };
        let path = Path::new(script);
        let src = input::text(path, input::SCRIPT).map_err(|e| {
            let hint = match e {
                // Only a missing file may have meant a recipe.
                ReadError::Io(ref io) if io.kind() == std::io::ErrorKind::NotFound => format!(
                    " (built-in recipes: {}; gpuloop recipes lists them)",
                    crate::script::recipes::names()
                ),
                _ => String::new(),
            };
            Error::Usage(format!("cannot read script {script}: {e}{hint}"))
        })?;
        let dir = path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .and_then(|p| p.canonicalize().ok());
        Ok((
            script.to_string(),
            input::without_bom(&src).to_string(),
            dir,
        ))
    }
}

/// `gpuloop run SCRIPT ARGS…`: the script, with ARGS in its scope.
pub(super) fn run(cfg: &Config, script: &Script, args: &[String]) -> Result<i32, Error> {
    let (file, src, dir) = script.read()?;
    // Whatever the script started (run/spawn) is stopped when this goes out of scope.
    let _jobs = crate::runner::Supervisor::start();
    let session = cfg.session.clone();
    let engine = build_engine(
        session,
        &EngineOpts {
            script_dir: dir,
            json: cfg.json,
        },
    );
    let mut scope = new_scope(args);
    let _ = run_source(&engine, &mut scope, &file, &src)?;
    Ok(0)
}

/// `gpuloop eval CODE`: the value of its last expression.
pub(super) fn eval(cfg: &Config, code: &str) -> Result<i32, Error> {
    let _jobs = crate::runner::Supervisor::start();
    let session = cfg.session.clone();
    let dir = std::env::current_dir().ok();
    let engine = build_engine(
        session,
        &EngineOpts {
            script_dir: dir,
            json: cfg.json,
        },
    );
    let mut scope = new_scope(&[]);
    let v = run_source(&engine, &mut scope, "<eval>", code)?;
    let depth = cfg.session.config.limits.depth;
    if let Some(text) =
        crate::script::display::show(&v, cfg.json, Style::stdout(), depth).map_err(Error::Other)?
    {
        crate::outln!("{text}");
    }
    Ok(0)
}

/// `gpuloop check`: compiles each script, finds the modules it imports, as `run` would, and
/// the calls of functions that nothing defines.
pub(super) fn check(cfg: &Config, scripts: &[PathBuf]) -> Result<i32, Error> {
    let mut failed = 0;
    for p in scripts {
        let (file, src, dir) = match Script::named(&p.display().to_string()).and_then(|s| s.read())
        {
            Ok(s) => s,
            Err(e) => {
                crate::errln!("gpuloop: {e}");
                failed += 1;
                continue;
            }
        };
        let engine = build_engine(
            cfg.session.clone(),
            &EngineOpts {
                script_dir: dir,
                json: cfg.json,
            },
        );
        let checked = crate::script::engine::compile(&engine, &file, &src).and_then(|ast| {
            crate::script::engine::check_imports(&engine, &ast, &file, &src)?;
            crate::script::engine::check_calls(&engine, &ast, &file, &src)
        });
        match checked {
            Ok(()) => crate::outln!("ok: {file}"),
            Err(e) => {
                crate::errln!("{}", e.message());
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 { 2 } else { 0 })
}

/// `gpuloop doc`: the reference in Markdown, or definition files for editors.
pub(super) fn doc(cfg: &Config, definitions: Option<&Path>) -> Result<i32, Error> {
    let engine = build_engine(cfg.session.clone(), &EngineOpts::default());
    match definitions {
        Some(dir) => {
            crate::script::doc::write_definitions(&engine, dir).map_err(Error::Other)?;
            crate::outln!("wrote Rhai definitions to {}", dir.display());
        }
        None => crate::output::text(&crate::script::doc::markdown(&engine)),
    }
    Ok(0)
}

/// `gpuloop recipes`: the recipes built in, with what each is for.
pub(super) fn recipes(cfg: &Config) -> Result<i32, Error> {
    let rs = crate::script::recipes::list();
    emit(cfg, &rs, || render::recipes(&rs))
}

/// `gpuloop repl`.
pub(super) fn repl(cfg: &Config) -> Result<i32, Error> {
    crate::repl::run(cfg.session.clone(), cfg.json)
}
