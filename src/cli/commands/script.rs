//! The commands of the script engine: run, eval, check, recipes, repl, doc.

use super::emit;
use crate::cli::hiargs::RecipesCommand;
use crate::cli::Config;
use crate::error::Error;
use crate::exit::Exit;
use crate::render::{self, Style};
use crate::script::engine::{build_engine, new_scope, run_source, EngineOpts};
use crate::script::modules::Imports;
use crate::script::recipes::header::{ArgKind, ArgValue, Header, Parsed};
use crate::script::recipes::needs::{self, Powers};
use crate::script::recipes::{self, Found, Named, Origin, Roots};
use std::path::{Path, PathBuf};

/// The script SCRIPT names: stdin, a file (a path), or a recipe (a bare name, never a file
/// of the current directory). Which one is decided from the word alone, and a name that is
/// no recipe (or one the trust checks refuse) is refused before anything runs.
pub(crate) enum Script {
    Stdin,
    /// A recipe has no directory of its own: its imports come from GPULOOP_PATH, the user's
    /// modules and the standard library, never from the current directory either; a
    /// built-in one's from the standard library alone.
    Recipe(Found),
    /// The path as given (it has a `/` or ends in `.rhai`).
    File(String),
}

impl Script {
    pub(crate) fn named(script: &str) -> Result<Script, Error> {
        Ok(match Named::of(script) {
            Named::Stdin => Script::Stdin,
            Named::Recipe(name) => Script::Recipe(
                recipes::find(name, &Roots::from_env()).map_err(|e| Error::Usage(e.to_string()))?,
            ),
            Named::File(path) => Script::File(path.to_string()),
        })
    }

    /// The name its header's purpose line starts with: a recipe's name, a file's stem.
    fn stem(&self) -> String {
        match self {
            Script::Stdin => String::new(),
            Script::Recipe(f) => f.name.clone(),
            Script::File(p) => Path::new(p)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }

    /// Its name for messages, its source, and where its imports are looked up. As root, a
    /// file (by path, or on stdin) is read only when it passes the trust checks.
    fn read(&self) -> Result<(String, String, Imports), Error> {
        use crate::input::{self, ReadError};
        use crate::trust::NamedError;
        let script = match self {
            Script::Stdin => {
                crate::trust::stdin_file().map_err(|why| {
                    Error::Usage(format!(
                        "cannot read the script from stdin: {}",
                        NamedError::Refused(why)
                    ))
                })?;
                let src = input::stdin(input::SCRIPT)
                    .and_then(|b| String::from_utf8(b).map_err(|_| ReadError::NotUtf8))
                    .map_err(|e| match e {
                        ReadError::Interrupted => Error::Interrupted,
                        e => Error::Usage(format!("cannot read the script from stdin: {e}")),
                    })?;
                let src = input::without_bom(&src).to_string();
                let script_dir = std::env::current_dir().ok();
                return Ok(("<stdin>".into(), src, Imports::Files { script_dir }));
            }
            Script::Recipe(found) => {
                let imports = match found.origin {
                    Origin::BuiltIn => Imports::Stdlib,
                    Origin::User | Origin::Site => Imports::Files { script_dir: None },
                };
                return Ok((
                    found.name.clone(),
                    input::without_bom(&found.source).to_string(),
                    imports,
                ));
            }
            Script::File(script) => script,
        };
        let path = Path::new(script);
        let src = crate::trust::named(path, input::SCRIPT)
            .and_then(|b| String::from_utf8(b).map_err(|_| ReadError::NotUtf8.into()))
            .map_err(|e| {
                let hint = match e {
                    // Only a missing file may have meant a recipe.
                    NamedError::Read(ReadError::Io(ref io))
                        if io.kind() == std::io::ErrorKind::NotFound =>
                    {
                        " (gpuloop recipes lists the recipes, which run by name)".to_string()
                    }
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
            Imports::Files { script_dir: dir },
        ))
    }
}

/// A script's header, read: a declaration that cannot be read is a compile error at its line.
fn header(script: &Script, file: &str, src: &str) -> Result<Header, Error> {
    recipes::header_of(&script.stem(), src).map_err(|e| {
        Error::Script(crate::script::errors::at_line(
            &format!("in the header: {}", e.why),
            e.line,
            file,
            src,
        ))
    })
}

/// What the script may do beyond reading. Started by MCP's `run_recipe` (`MCP_ALLOW` set):
/// what its header's `// needs:` line declares (nothing without one), and only when the
/// server's `--allow` permits all of it. Run by a person: what that line declares, or
/// everything when there is none.
fn powers(file: &str, header: &Header) -> Result<Powers, Error> {
    let Some(allowed) = std::env::var_os(recipes::MCP_ALLOW) else {
        return Ok(header.needs.as_deref().map_or(Powers::ALL, Powers::only));
    };
    let allowed = allowed.to_string_lossy().into_owned();
    let needs = header.needs.clone().unwrap_or_default();
    if let Some(n) = needs::Need::first_refused(&needs, allowed.split(',')) {
        return Err(Error::Usage(format!(
            "{file} needs {n} (its header says `// needs: {}`), which this MCP server does not allow: the person who runs it can allow it with `gpuloop mcp --allow {}`",
            needs::words(&needs),
            n.allowed_by()[0]
        )));
    }
    Ok(Powers::only(&needs))
}

/// The declared arguments' values from the command line, checked before anything runs (a
/// mistake is a usage error, exit 2); `None` when it asked for `--help`, which is printed.
fn arguments(
    cfg: &Config,
    name: &str,
    header: &Header,
    args: &[String],
) -> Result<Option<Vec<(String, ArgValue)>>, Error> {
    if header.args.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let usage = |why: String| {
        Error::Usage(format!(
            "{name}: {why} (gpuloop run {name} --help lists its arguments)"
        ))
    };
    let values = match recipes::header::parse_args(&header.args, args) {
        Ok(Parsed::Help) => {
            crate::outln!("{}", recipes::header::help(name, header));
            return Ok(None);
        }
        Ok(Parsed::Values(v)) => v,
        Err(e) => return Err(usage(e.0)),
    };
    // GPUs are checked against the machines too: `--gpu 9` on a node of 8 is a usage error
    // before the recipe acts, as it is for the one-shots.
    for (spec, (_, v)) in header.args.iter().zip(&values) {
        if spec.kind != ArgKind::Gpus {
            continue;
        }
        let given: Vec<String> = match v {
            ArgValue::Str(s) => vec![s.clone()],
            ArgValue::List(l) => l
                .iter()
                .filter_map(|v| match v {
                    ArgValue::Str(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => continue,
        };
        if given.is_empty() {
            continue;
        }
        let sel = crate::cli::hiargs::Selection::parse(&crate::cli::args::GpuSel {
            gpus: given.clone(),
        })
        .map_err(|e| usage(format!("--{} {}: {e}", spec.name, given.join(","))))?;
        // The hosts and the driver answer first (their failure is no usage error); a GPU
        // they do not have is.
        let checked = sel.on(&cfg.session).and_then(|hs| {
            crate::machine::Fleet::of(&cfg.session)
                .holders(&hs, false, &crate::inspect::Filter::default())
                .map_err(Error::from)
        });
        match checked {
            Ok(_) => {}
            Err(e) if e.exit() == Exit::Usage => {
                return Err(usage(format!("--{} {}: {e}", spec.name, given.join(","))))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Some(values))
}

/// `gpuloop run SCRIPT ARGS…`: the script, with ARGS (and its declared arguments, ARG) in
/// its scope.
pub(super) fn run(cfg: &Config, script: &Script, args: &[String]) -> Result<Exit, Error> {
    let (file, src, imports) = script.read()?;
    let header = header(script, &file, &src)?;
    let powers = powers(&file, &header)?;
    let Some(values) = arguments(cfg, &file, &header, args)? else {
        return Ok(Exit::Success);
    };
    // Whatever the script started (run/spawn) is stopped when this goes out of scope.
    let _jobs = crate::runner::Supervisor::start();
    let session = cfg.session.clone();
    let engine = build_engine(
        session,
        &EngineOpts {
            imports,
            json: cfg.json,
            powers,
        },
    );
    let mut scope = new_scope(args, &values);
    let ast = crate::script::engine::compile(&engine, &file, &src)?;
    crate::script::engine::check_declared(&ast, &header.args, &file, &src)?;
    let _ = crate::script::engine::run_ast(&engine, &mut scope, &ast, &file, &src)?;
    Ok(Exit::Success)
}

/// `gpuloop eval CODE`: the value of its last expression.
pub(super) fn eval(cfg: &Config, code: &str) -> Result<Exit, Error> {
    let _jobs = crate::runner::Supervisor::start();
    let session = cfg.session.clone();
    let script_dir = std::env::current_dir().ok();
    let engine = build_engine(
        session,
        &EngineOpts {
            imports: Imports::Files { script_dir },
            json: cfg.json,
            ..EngineOpts::default()
        },
    );
    let mut scope = new_scope(&[], &[]);
    let v = run_source(&engine, &mut scope, "<eval>", code)?;
    let depth = cfg.session.config.limits.depth;
    if let Some(text) =
        crate::script::display::show(&v, cfg.json, Style::stdout(), depth).map_err(Error::Other)?
    {
        crate::outln!("{text}");
    }
    Ok(Exit::Success)
}

/// `gpuloop check`: compiles each script, reads its header's declared arguments and checks
/// its uses of them, finds the modules it imports, as `run` would, and the calls of functions
/// that nothing defines.
pub(super) fn check(cfg: &Config, scripts: &[PathBuf]) -> Result<Exit, Error> {
    let mut failed = 0;
    for p in scripts {
        let read = Script::named(&p.display().to_string()).and_then(|s| {
            let (file, src, imports) = s.read()?;
            let h = header(&s, &file, &src)?;
            Ok((file, src, imports, h))
        });
        let (file, src, imports, header) = match read {
            Ok(s) => s,
            Err(e @ Error::Script(_)) => {
                crate::errln!("{e}");
                failed += 1;
                continue;
            }
            Err(e) => {
                crate::errln!("gpuloop: {e}");
                failed += 1;
                continue;
            }
        };
        let engine = build_engine(
            cfg.session.clone(),
            &EngineOpts {
                imports,
                json: cfg.json,
                ..EngineOpts::default()
            },
        );
        let checked = crate::script::engine::compile(&engine, &file, &src).and_then(|ast| {
            crate::script::engine::check_declared(&ast, &header.args, &file, &src)?;
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
    Ok(if failed > 0 {
        Exit::Usage
    } else {
        Exit::Success
    })
}

/// `gpuloop doc`: the reference in Markdown, or definition files for editors.
pub(super) fn doc(cfg: &Config, definitions: Option<&Path>) -> Result<Exit, Error> {
    let engine = build_engine(cfg.session.clone(), &EngineOpts::default());
    match definitions {
        Some(dir) => {
            crate::script::doc::write_definitions(&engine, dir).map_err(Error::Other)?;
            crate::outln!("wrote Rhai definitions to {}", dir.display());
        }
        None => crate::output::text(&crate::script::doc::markdown(&engine)),
    }
    Ok(Exit::Success)
}

/// `gpuloop recipes`: every recipe with where it comes from and what it is for; `show`
/// prints one's usage and source, `new` writes a skeleton into the user's directory.
pub(super) fn recipes(cfg: &Config, cmd: &RecipesCommand) -> Result<Exit, Error> {
    let roots = Roots::from_env();
    match cmd {
        RecipesCommand::List => {
            let rs = recipes::list(&roots);
            emit(cfg, &rs, || render::recipes(&rs))
        }
        RecipesCommand::Show(name) => {
            // The one that runs by that name, not one it shadows, read as running it reads
            // it: a refused one is never opened, and the error says why.
            let found = recipes::find(name, &roots).map_err(|e| Error::Usage(e.to_string()))?;
            let recipe = recipes::Recipe::of(
                &found.name,
                found.origin,
                found.path.as_deref(),
                Some(&found.source),
            );
            let shown = Shown {
                recipe,
                source: found.source,
            };
            emit(cfg, &shown, || {
                render::recipe(&shown.recipe, &shown.help(), &shown.source)
            })
        }
        RecipesCommand::New(name) => {
            let path = recipes::create(name, &recipes::skeleton(name), false)
                .map_err(|e| Error::Usage(e.to_string()))?;
            let shadows = recipes::list(&roots)
                .into_iter()
                .find(|r| r.name == *name && r.origin != recipes::Origin::User);
            crate::outln!(
                "wrote {}: edit it, then: gpuloop run {name} --help",
                path.display()
            );
            if let Some(r) = shadows {
                crate::errln!(
                    "note: it runs instead of the {} recipe {name} (gpuloop recipes shows both)",
                    r.origin.name()
                );
            }
            Ok(Exit::Success)
        }
    }
}

/// `gpuloop recipes show NAME`: the recipe as listed, and its source.
#[derive(serde::Serialize)]
struct Shown {
    #[serde(flatten)]
    recipe: recipes::Recipe,
    source: String,
}

impl Shown {
    /// What `gpuloop run NAME --help` prints.
    fn help(&self) -> String {
        match recipes::header_of(&self.recipe.name, &self.source) {
            Ok(h) => recipes::header::help(&self.recipe.name, &h),
            Err(e) => format!("its header, line {}: {}", e.line, e.why),
        }
    }
}

/// `gpuloop repl`.
pub(super) fn repl(cfg: &Config) -> Result<Exit, Error> {
    crate::repl::run(cfg.session.clone(), cfg.json)
}
