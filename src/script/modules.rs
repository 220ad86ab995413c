//! `import` resolution: the script's directory, `GPULOOP_PATH`, the user's modules directory,
//! then the standard library compiled into the binary; a built-in recipe's imports, the
//! standard library alone. A module file is read only when it passes the trust checks
//! (`crate::trust`), as a recipe is, whoever runs gpuloop.

use rhai::module_resolvers::ModuleResolversCollection;
use rhai::{Engine, EvalAltResult, Module, ModuleResolver, Position, Scope, Shared};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The standard library: (module name, source), embedded at build time.
pub(crate) const STDLIB: &[(&str, &str)] = &[
    ("report", include_str!("../../stdlib/report.rhai")),
    ("cleanup", include_str!("../../stdlib/cleanup.rhai")),
    ("patch", include_str!("../../stdlib/patch.rhai")),
    ("workers", include_str!("../../stdlib/workers.rhai")),
    ("checks", include_str!("../../stdlib/checks.rhai")),
];

/// How the error of a module found nowhere begins: an import computed at run time that
/// finds nothing is still a usage error (exit 2), as a missing constant one is before the
/// script runs.
pub(crate) const NOT_FOUND: &str = "module not found: ";

/// Where a script's `import`s come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Imports {
    /// Files of the script's directory (if it has one), `GPULOOP_PATH` and the user's
    /// modules directory, each read only when it passes the trust checks; then the standard
    /// library.
    Files { script_dir: Option<PathBuf> },
    /// The standard library compiled into the binary, nothing else: a built-in recipe's, so
    /// that nothing the environment names (GPULOOP_PATH, XDG_CONFIG_HOME, the current
    /// directory) can stand in for a module it imports.
    Stdlib,
}

impl Default for Imports {
    fn default() -> Self {
        Imports::Files { script_dir: None }
    }
}

/// The resolver chain: the directories of `search_path`, then the standard library (the order
/// docs/scripting.md gives); a module found nowhere is an error that says where it was
/// looked for.
pub(crate) fn resolver(imports: &Imports) -> Resolver {
    let mut chain = ModuleResolversCollection::new();
    let dirs = match imports {
        Imports::Files { script_dir } => search_path(script_dir.clone()),
        Imports::Stdlib => Vec::new(),
    };
    for d in &dirs {
        chain.push(Dir::new(d));
    }
    chain.push(Stdlib::default());
    Resolver { chain, dirs }
}

/// The directories `import` looks in, in order, before the standard library.
pub(crate) fn search_path(script_dir: Option<PathBuf>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = script_dir.into_iter().collect();
    if let Some(path) = std::env::var_os("GPULOOP_PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs.extend(crate::config::config_dir().map(|d| d.join("modules")));
    dirs
}

/// The chain, and the directories it searches for the message when nothing has the module.
pub(crate) struct Resolver {
    chain: ModuleResolversCollection,
    dirs: Vec<PathBuf>,
}

impl Resolver {
    /// "looked in DIR/NAME.rhai, …, and the standard library (report, cleanup, patch)".
    fn looked(&self, path: &str) -> String {
        let file = if path.ends_with(".rhai") {
            path.to_string()
        } else {
            format!("{path}.rhai")
        };
        let mut places: Vec<String> = self
            .dirs
            .iter()
            .map(|d| d.join(&file).display().to_string())
            .collect();
        let names: Vec<&str> = STDLIB.iter().map(|(n, _)| *n).collect();
        places.push(format!("the standard library ({})", names.join(", ")));
        format!(
            "{path} (looked in {}; GPULOOP_PATH adds directories)",
            places.join(", ")
        )
    }
}

impl ModuleResolver for Resolver {
    fn resolve(
        &self,
        engine: &Engine,
        source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<Shared<Module>, Box<EvalAltResult>> {
        self.chain
            .resolve(engine, source, path, pos)
            .map_err(|e| match *e {
                // Not ErrorModuleNotFound: rhai would replace it with its own, without the path.
                EvalAltResult::ErrorModuleNotFound(name, p) if name == path => {
                    Box::new(EvalAltResult::ErrorRuntime(
                        format!("{NOT_FOUND}{}", self.looked(path)).into(),
                        p,
                    ))
                }
                e => Box::new(e),
            })
    }
}

/// Modules in one directory: `NAME.rhai` under it, read only when it and every directory
/// above it pass the trust checks (a file another account could write, or a link, is an
/// error naming it and why, never passed over for the next directory), as a regular file of
/// bounded size (a FIFO is an error naming it, never a hang), and compiled once.
pub(crate) struct Dir {
    dir: PathBuf,
    cache: Mutex<HashMap<PathBuf, Shared<Module>>>,
}

impl Dir {
    pub(crate) fn new(dir: &Path) -> Dir {
        Dir {
            dir: dir.to_path_buf(),
            cache: Mutex::default(),
        }
    }

    /// `dir/path` with the extension `.rhai` (replacing any other, as rhai's own resolver does).
    fn file(&self, path: &str) -> PathBuf {
        let mut file = self.dir.join(path);
        file.set_extension("rhai");
        file
    }
}

/// Compiles a module's source and runs it as a module, its errors and carets named `source`
/// (the import path, or `stdlib/NAME.rhai`).
fn load(
    engine: &Engine,
    src: &str,
    source: &str,
    pos: Position,
) -> Result<Shared<Module>, Box<EvalAltResult>> {
    let in_module =
        |e: EvalAltResult| Box::new(EvalAltResult::ErrorInModule(source.into(), e.into(), pos));
    let mut ast = engine.compile(src).map_err(|e| in_module(e.into()))?;
    ast.set_source(source);
    Ok(Module::eval_ast_as_new(Scope::new(), &ast, engine)
        .map_err(|e| in_module(*e))?
        .into())
}

impl ModuleResolver for Dir {
    fn resolve(
        &self,
        engine: &Engine,
        _source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<Shared<Module>, Box<EvalAltResult>> {
        let file = self.file(path);
        if let Some(m) = self.cache.lock().ok().and_then(|c| c.get(&file).cloned()) {
            return Ok(m);
        }
        let in_module =
            |e: EvalAltResult| Box::new(EvalAltResult::ErrorInModule(path.into(), e.into(), pos));
        let not_found = || Box::new(EvalAltResult::ErrorModuleNotFound(path.into(), pos));
        // `import "lib/x"` and `import "../x"`: the directory it names is judged whole, from /.
        let Some((dir, name)) = crate::trust::split(&file) else {
            return Err(not_found());
        };
        let src = match crate::trust::lookup(&dir, &name, crate::input::MODULE) {
            Ok(Some(src)) => src,
            Ok(None) => return Err(not_found()),
            Err(why) => {
                let said = if why.is_refusal() {
                    format!(
                        "module {} is refused: {why}; {}",
                        file.display(),
                        crate::trust::Distrust::RULE
                    )
                } else {
                    format!("cannot read module {}: {why}", file.display())
                };
                return Err(in_module(EvalAltResult::ErrorRuntime(
                    said.into(),
                    Position::NONE,
                )));
            }
        };
        let module = load(engine, super::engine::source_text(&src), path, pos)?;
        if let Ok(mut c) = self.cache.lock() {
            c.insert(file, module.clone());
        }
        Ok(module)
    }
}

/// The embedded standard library, compiled on first import with the importing engine.
#[derive(Default)]
pub(crate) struct Stdlib {
    cache: Mutex<HashMap<String, Shared<Module>>>,
}

impl ModuleResolver for Stdlib {
    fn resolve(
        &self,
        engine: &Engine,
        _source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<Shared<Module>, Box<EvalAltResult>> {
        let name = path.trim_end_matches(".rhai");
        if let Some(m) = self.cache.lock().ok().and_then(|c| c.get(name).cloned()) {
            return Ok(m);
        }
        let Some((_, src)) = STDLIB.iter().find(|(n, _)| *n == name) else {
            return Err(Box::new(EvalAltResult::ErrorModuleNotFound(
                path.into(),
                pos,
            )));
        };
        let module = load(engine, src, &format!("stdlib/{name}.rhai"), pos)?;
        if let Ok(mut c) = self.cache.lock() {
            c.insert(name.to_string(), module.clone());
        }
        Ok(module)
    }
}
