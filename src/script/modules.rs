//! `import` resolution: the script's directory, `GPULOOP_PATH`, the user's modules directory,
//! then the standard library compiled into the binary.

use rhai::module_resolvers::{FileModuleResolver, ModuleResolversCollection};
use rhai::{Engine, EvalAltResult, Module, ModuleResolver, Position, Scope, Shared};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The standard library: (module name, source), embedded at build time.
pub const STDLIB: &[(&str, &str)] = &[
    ("report", include_str!("../../stdlib/report.rhai")),
    ("cleanup", include_str!("../../stdlib/cleanup.rhai")),
    ("patch", include_str!("../../stdlib/patch.rhai")),
    ("workers", include_str!("../../stdlib/workers.rhai")),
];

/// How the error of a module found nowhere begins: an import computed at run time that
/// finds nothing is still a usage error (exit 2), as a missing constant one is before the
/// script runs.
pub const NOT_FOUND: &str = "module not found: ";

/// The resolver chain: the directories of `search_path`, then the standard library (the order
/// docs/scripting.md gives); a module found nowhere is an error that says where it was
/// looked for.
pub fn resolver(script_dir: Option<PathBuf>) -> Resolver {
    let mut chain = ModuleResolversCollection::new();
    let dirs = search_path(script_dir);
    for d in &dirs {
        chain.push(FileModuleResolver::new_with_path(d));
    }
    chain.push(Stdlib::default());
    Resolver { chain, dirs }
}

/// The directories `import` looks in, in order, before the standard library.
pub fn search_path(script_dir: Option<PathBuf>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = script_dir.into_iter().collect();
    if let Some(path) = std::env::var_os("GPULOOP_PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs.extend(crate::config::config_dir().map(|d| d.join("modules")));
    dirs
}

/// The chain, and the directories it searches for the message when nothing has the module.
pub struct Resolver {
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

/// The embedded standard library, compiled on first import with the importing engine.
#[derive(Default)]
pub struct Stdlib {
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
        let mut ast = engine.compile(src).map_err(|e| {
            Box::new(EvalAltResult::ErrorInModule(
                format!("stdlib/{name}.rhai"),
                e.into(),
                pos,
            ))
        })?;
        ast.set_source(format!("stdlib/{name}.rhai"));
        let module = Module::eval_ast_as_new(Scope::new(), &ast, engine).map_err(|e| {
            Box::new(EvalAltResult::ErrorInModule(
                format!("stdlib/{name}.rhai"),
                e,
                pos,
            ))
        })?;
        let module: Shared<Module> = module.into();
        if let Ok(mut c) = self.cache.lock() {
            c.insert(name.to_string(), module.clone());
        }
        Ok(module)
    }
}
