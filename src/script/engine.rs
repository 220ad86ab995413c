//! Builds the one Rhai `Engine` every entry point uses (run, eval, check, REPL, doc).

use super::errors::{self, ScriptError, INTERRUPT_TOKEN};
use super::{bindings, modules};
use crate::session::Session;
use rhai::{Dynamic, Engine, RhaiNativeFunc, Scope, Variant, AST};
use std::path::PathBuf;
use std::sync::Arc;

/// What the engine needs to know about where it runs.
#[derive(Debug, Clone, Default)]
pub struct EngineOpts {
    /// Directory of the running script: first place `import` looks.
    pub script_dir: Option<PathBuf>,
    /// stdout carries JSON (`--json`): print() goes to stderr, so the JSON stays parseable.
    pub json: bool,
}

/// Registers a script function with its doc comment; `params` are `"name: type"` strings
/// followed by the return type, as `gpuloop doc` and the REPL's `:help` show them.
pub fn def<A: 'static, const N: usize, const X: bool, R, const F: bool, FUNC>(
    engine: &mut Engine,
    name: &str,
    params: &[&str],
    doc: &str,
    func: FUNC,
) where
    R: Variant + Clone,
    FUNC: RhaiNativeFunc<A, N, X, R, F> + Send + Sync + 'static,
{
    let comment = doc
        .trim()
        .lines()
        .map(|l| format!("/// {}", l.trim()).trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    rhai::FuncRegistration::new(name)
        .with_params_info(params)
        .with_comments([comment])
        .with_volatility(true)
        .register_into_engine(engine, func);
}

/// The engine with every gpuloop function, the module resolvers, and Ctrl-C checks.
pub fn build_engine(session: Arc<Session>, opts: &EngineOpts) -> Engine {
    let mut engine = Engine::new();
    engine.set_max_expr_depths(256, 256);
    // Long loops notice Ctrl-C between statements.
    // A closed stdout (`gpuloop run s.rhai | head`) ends the script quietly, as exit(0).
    engine.on_progress(|_| {
        if crate::interrupt::is_set() {
            Some(Dynamic::from(INTERRUPT_TOKEN))
        } else {
            crate::output::closed().then(|| Dynamic::from(0_i64))
        }
    });
    // SPEC's `until(timeout, fn)` helper: `until` is a function here, not the keyword of
    // rhai's `do { } until c` loop (write `do { } while !c` instead).
    #[allow(deprecated)] // rhai marks this hook "volatile", not deprecated
    engine.on_parse_token(|token, _, _| match token {
        rhai::Token::Until => rhai::Token::Identifier(Box::new("until".into())),
        // SPEC's `spawn(cmd)`: rhai reserves `spawn` for a future keyword.
        rhai::Token::Reserved(s) if s.as_str() == "spawn" => rhai::Token::Identifier(s),
        t => t,
    });
    if opts.json {
        engine.on_print(|s| eprintln!("{s}"));
    } else {
        engine.on_print(crate::output::line);
    }
    // A misspelt field of a gpuloop record is an error naming the fields; a script's own
    // maps read a missing field as (), and assigning one adds it, as in rhai.
    engine.on_map_missing_property(|map, prop, _| match super::fields::missing(map, prop) {
        Some(err) => Err(err),
        None => {
            map.insert(prop.into(), Dynamic::UNIT);
            match map.get_mut(prop) {
                Some(v) => v.try_into(),
                None => Ok(Dynamic::UNIT.into()),
            }
        }
    });
    engine.on_debug(|s, src, pos| eprintln!("[debug] {}{pos:?}: {s}", src.unwrap_or("")));
    bindings::gpu::register(&mut engine, &session);
    bindings::process::register(&mut engine, &session);
    bindings::helpers::register(&mut engine);
    bindings::runner::register(&mut engine, &session);
    engine.set_module_resolver(modules::resolver(opts.script_dir.clone()));
    engine
}

/// The scope every script starts with: `ARGS`.
pub fn new_scope(args: &[String]) -> Scope<'static> {
    let mut scope = Scope::new();
    let args: rhai::Array = args.iter().map(|a| Dynamic::from(a.clone())).collect();
    scope.push_constant("ARGS", args);
    scope
}

pub fn compile(engine: &Engine, file: &str, source: &str) -> Result<AST, ScriptError> {
    errors::remember(file, source);
    let mut ast = engine
        .compile(source)
        .map_err(|e| errors::from_parse(&e, file, source))?;
    ast.set_source(file);
    Ok(ast)
}

/// Compiles and runs a script; returns the value of its last expression.
pub fn run_source(
    engine: &Engine,
    scope: &mut Scope,
    file: &str,
    source: &str,
) -> Result<Dynamic, ScriptError> {
    let ast = compile(engine, file, source)?;
    engine
        .eval_ast_with_scope::<Dynamic>(scope, &ast)
        .map_err(|e| errors::from_eval(*e, file, source))
}

/// The `import "path" as alias;` statements at a script's top level: (path, alias or "",
/// where the path is written).
pub fn imports(ast: &AST) -> Vec<(String, String, rhai::Position)> {
    ast.statements()
        .iter()
        .filter_map(|s| match s {
            rhai::Stmt::Import(x, _) => match &x.0 {
                rhai::Expr::StringConstant(path, pos) => {
                    Some((path.to_string(), x.1.name.to_string(), *pos))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Finds (and compiles) every module a script imports at its top level, as running it would:
/// `gpuloop check` fails on a missing module, saying where it looked.
pub fn check_imports(
    engine: &Engine,
    ast: &AST,
    file: &str,
    source: &str,
) -> Result<(), ScriptError> {
    for (path, _, pos) in imports(ast) {
        engine
            .module_resolver()
            .resolve(engine, Some(file), &path, pos)
            .map_err(|e| errors::from_eval(*e, file, source))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_constant_imports() {
        let ast = Engine::new()
            .compile(r#"import "report" as r; let p = "x"; import p as q; import "a";"#)
            .expect("compiles");
        let found: Vec<(String, String)> =
            imports(&ast).into_iter().map(|(p, a, _)| (p, a)).collect();
        assert_eq!(
            found,
            vec![
                ("report".to_string(), "r".to_string()),
                ("a".to_string(), String::new())
            ]
        );
    }
}
