//! Builds the one Rhai `Engine` every entry point uses (run, eval, check, REPL, doc).

use super::errors::{self, MemoryLimit, ScriptError, INTERRUPT_TOKEN};
use super::recipes::header::{ArgSpec, ArgValue};
use super::recipes::needs::Powers;
use super::{bindings, modules};
use crate::config::Limits;
use crate::session::Session;
use rhai::{Dynamic, Engine, RhaiNativeFunc, Scope, Variant, AST};
use std::sync::Arc;

/// What the engine needs to know about where it runs.
#[derive(Debug, Clone, Default)]
pub struct EngineOpts {
    /// Where `import` looks: the running script's directory first (if it has one), or, for a
    /// built-in recipe, the standard library alone.
    pub(crate) imports: modules::Imports,
    /// stdout carries JSON (`--json`): print() goes to stderr, so the JSON stays parseable.
    pub(crate) json: bool,
    /// What the script may do beyond reading: everything, or what its header's `// needs:`
    /// line declares (the functions that signal, run or write refuse the rest).
    pub(crate) powers: Powers,
}

impl EngineOpts {
    /// The same, letting the script do only what `powers` allows.
    pub fn with_powers(self, powers: Powers) -> EngineOpts {
        EngineOpts { powers, ..self }
    }
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

/// Stack bytes per level of nesting of a value, measured (release and debug builds) on the
/// deepest recursions a nested value meets: rhai's size checks, clone, drop and display,
/// serde, and our renderer. Debug frames are larger.
const STACK_PER_LEVEL: usize = if cfg!(debug_assertions) {
    16 << 10
} else {
    4 << 10
};
/// Stack for everything else a script does.
const STACK_BASE: usize = 64 << 20;

/// Stack bytes per script-function call nested in another.
const STACK_PER_CALL: usize = 64 << 10;
/// The largest stack gpuloop reserves for a script (address space: only what a script
/// really nests is ever touched). Past it a limit is refused, never met with a smaller stack.
pub(crate) const MAX_STACK: usize = 8 << 30;

/// The script thread's stack for these limits (saturating: `check_stack` refuses the ones
/// that would pass `MAX_STACK`).
pub(crate) fn stack_size(limits: &Limits) -> usize {
    STACK_BASE
        .saturating_add(limits.depth.saturating_mul(STACK_PER_LEVEL))
        .saturating_add(limits.calls.saturating_mul(STACK_PER_CALL))
}

/// Refuses the `calls` and `depth` limits whose stack would pass `MAX_STACK`, naming the
/// largest value that works of the one that can give way.
pub(crate) fn check_stack(limits: &Limits) -> Result<(), String> {
    if stack_size(limits) <= MAX_STACK {
        return Ok(());
    }
    let room = MAX_STACK - STACK_BASE;
    let calls_room = room.saturating_sub(limits.depth.saturating_mul(STACK_PER_LEVEL));
    let depth_room = room.saturating_sub(limits.calls.saturating_mul(STACK_PER_CALL));
    // Name calls when the depth leaves room for some, else depth.
    let largest = if calls_room >= STACK_PER_CALL {
        format!(
            "the largest calls limit that works is {} (with depth={})",
            calls_room / STACK_PER_CALL,
            limits.depth
        )
    } else {
        format!(
            "the largest depth limit that works is {} (with calls={})",
            depth_room / STACK_PER_LEVEL,
            limits.calls
        )
    };
    Err(format!(
        "--limit calls={} with depth={} needs a script stack of {} MiB, more than the {} MiB gpuloop reserves: {largest}",
        limits.calls,
        limits.depth,
        stack_size(limits) >> 20,
        MAX_STACK >> 20,
    ))
}

/// The engine with every gpuloop function, the module resolvers, and Ctrl-C checks.
pub fn build_engine(session: Arc<Session>, opts: &EngineOpts) -> Engine {
    let mut engine = Engine::new();
    errors::Sources::attach(&mut engine);
    let limits = session.config.limits;
    engine.set_max_expr_depths(limits.expr_depth, limits.expr_depth);
    engine.set_max_call_levels(limits.calls);
    // Not rhai's size limits: it measures the whole value after each change, which made
    // nesting N deep, or pushing N elements, cost N² (a one-line script ran for an hour).
    // The `array`, `map`, `string` and `depth` limits are checked as a variable is read
    // (`convert::check_read`, bounded steps), and `memory` bounds what is built.
    #[allow(deprecated)] // rhai marks this hook "volatile", not deprecated
    engine.on_var(move |name, _, ctx| {
        match ctx
            .scope()
            .get(name)
            .map(|v| super::convert::check_read(v, &limits))
        {
            Some(Err(over)) => Err(super::convert::script_err(format!(
                "the value of `{name}` {over}"
            ))),
            _ => Ok(None),
        }
    });
    // Long loops notice Ctrl-C between statements.
    // A closed stdout (`gpuloop run s.rhai | head`) ends the script quietly, as exit(0).
    // Memory past the `memory` limit ends it with an error (one load of the allocator's count).
    engine.on_progress(move |_| {
        if crate::interrupt::is_set() {
            Some(Dynamic::from(INTERRUPT_TOKEN))
        } else if crate::memory::in_use() > limits.memory {
            Some(Dynamic::from(MemoryLimit(limits.memory)))
        } else {
            crate::output::closed().then(|| Dynamic::from(0_i64))
        }
    });
    // The `until(timeout, fn)` helper (docs/scripting.md): `until` is a function here, not
    // the keyword of rhai's `do { } until c` loop (write `do { } while !c` instead).
    #[allow(deprecated)] // rhai marks this hook "volatile", not deprecated
    engine.on_parse_token(|token, _, _| match token {
        rhai::Token::Until => rhai::Token::Identifier(Box::new("until".into())),
        // The `spawn(cmd)` function: rhai reserves `spawn` for a future keyword.
        rhai::Token::Reserved(s) if s.as_str() == "spawn" => rhai::Token::Identifier(s),
        t => t,
    });
    // What a script prints quotes what other users chose (a holder's name, its command
    // line): its controls are shown escaped, its lines kept.
    if opts.json {
        engine.on_print(|s| crate::errln!("{}", crate::shown::text(s)));
    } else {
        engine.on_print(|s| crate::output::line(&crate::shown::text(s)));
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
    engine.on_debug(|s, src, pos| {
        crate::errln!(
            "[debug] {}{pos:?}: {}",
            crate::shown::text(src.unwrap_or("")),
            crate::shown::text(s)
        )
    });
    bindings::gpu::register(&mut engine, &session, opts.powers);
    bindings::process::register(&mut engine, &session, opts.powers);
    bindings::helpers::register(&mut engine, &limits, opts.powers);
    bindings::runner::register(&mut engine, &session, opts.powers);
    engine.set_module_resolver(modules::resolver(&opts.imports));
    engine
}

/// The scope every script starts with: `ARGS` (the words after SCRIPT) and `ARG` (the
/// values of the arguments its header declares, by name).
pub(crate) fn new_scope(args: &[String], values: &[(String, ArgValue)]) -> Scope<'static> {
    let mut scope = Scope::new();
    let args: rhai::Array = args.iter().map(|a| Dynamic::from(a.clone())).collect();
    scope.push_constant("ARGS", args);
    let arg: rhai::Map = values
        .iter()
        .map(|(k, v)| (k.as_str().into(), arg_value(v)))
        .collect();
    scope.push_constant("ARG", arg);
    scope
}

fn arg_value(v: &ArgValue) -> Dynamic {
    match v {
        ArgValue::Unit => Dynamic::UNIT,
        ArgValue::Bool(b) => Dynamic::from(*b),
        ArgValue::Int(i) => Dynamic::from(*i),
        ArgValue::Float(f) => Dynamic::from(*f),
        ArgValue::Str(s) => Dynamic::from(s.clone()),
        ArgValue::List(l) => Dynamic::from(l.iter().map(arg_value).collect::<rhai::Array>()),
    }
}

/// Every `ARG.name` a script reads (`ARG.name`, `ARG["name"]` with a constant name), with
/// where: checked against its header's declarations.
fn arg_reads(ast: &AST) -> Vec<(String, rhai::Position)> {
    let mut found = Vec::new();
    ast.walk(&mut |nodes: &[rhai::ASTNode]| {
        if let Some(rhai::ASTNode::Expr(rhai::Expr::Dot(x, _, _) | rhai::Expr::Index(x, _, _))) =
            nodes.last()
        {
            let on_arg = matches!(&x.lhs, rhai::Expr::Variable(v, _, _) if v.1 == "ARG");
            let name = match &x.rhs {
                rhai::Expr::Property(p, pos) => Some((p.2.to_string(), *pos)),
                rhai::Expr::StringConstant(s, pos) => Some((s.to_string(), *pos)),
                // `ARG.gpu.is_empty()`: the property is the first of a chain.
                rhai::Expr::Dot(inner, _, _) | rhai::Expr::Index(inner, _, _) => match &inner.lhs {
                    rhai::Expr::Property(p, pos) => Some((p.2.to_string(), *pos)),
                    _ => None,
                },
                _ => None,
            };
            if let (true, Some(n)) = (on_arg, name) {
                found.push(n);
            }
        }
        true
    });
    found
}

/// A script reading `ARG.x` for an `x` its header does not declare is a compile error: a
/// misspelt argument would otherwise read as `()` and do the default silently.
pub(crate) fn check_declared(
    ast: &AST,
    declared: &[ArgSpec],
    file: &str,
    source: &str,
) -> Result<(), ScriptError> {
    let keys: Vec<String> = declared.iter().map(ArgSpec::key).collect();
    for (name, pos) in arg_reads(ast) {
        if keys.contains(&name) {
            continue;
        }
        let known = if keys.is_empty() {
            "its header declares no arguments (`// arg NAME: TYPE …` lines)".to_string()
        } else {
            let hint = super::fields::closest(&name, keys.iter().map(String::as_str))
                .map(|c| format!("did you mean ARG.{c}? "))
                .unwrap_or_default();
            format!("{hint}(declared: {})", keys.join(", "))
        };
        return Err(ScriptError::Compile(errors::render(
            &format!("ARG.{name} is not an argument this script declares: {known}"),
            pos,
            file,
            source,
        )));
    }
    Ok(())
}

/// A script's or module's text as it is compiled: without a byte-order mark (editors on
/// Windows start a file with one, which rhai reads as a stray character), and with a first
/// line `#!…` left blank, so that the file can be run as a program and its line numbers
/// still hold.
pub(crate) fn source_text(src: &str) -> &str {
    let src = crate::input::without_bom(src);
    match src.strip_prefix("#!") {
        Some(rest) => rest.find('\n').map_or("", |i| &rest[i..]),
        None => src,
    }
}

pub fn compile(engine: &Engine, file: &str, source: &str) -> Result<AST, ScriptError> {
    let source = source_text(source);
    errors::remember(engine, file, source);
    let mut ast = engine
        .compile(source)
        .map_err(|e| errors::from_parse(&e, file, source))?;
    ast.set_source(file);
    Ok(ast)
}

/// Compiles a script, finds the modules it imports (as `gpuloop check` does: a missing one
/// is a compile error, before anything runs), and runs it; returns the value of its last
/// expression.
pub(crate) fn run_source(
    engine: &Engine,
    scope: &mut Scope,
    file: &str,
    source: &str,
) -> Result<Dynamic, ScriptError> {
    let ast = compile(engine, file, source)?;
    run_ast(engine, scope, &ast, file, source)
}

/// Finds the modules a compiled script imports, then runs it.
pub(crate) fn run_ast(
    engine: &Engine,
    scope: &mut Scope,
    ast: &AST,
    file: &str,
    source: &str,
) -> Result<Dynamic, ScriptError> {
    check_imports(engine, ast, file, source)?;
    engine
        .eval_ast_with_scope::<Dynamic>(scope, ast)
        .map_err(|e| {
            let hint = super::calls::did_you_mean(engine, ast, &e);
            errors::from_eval(*e, file, source).with_help(hint)
        })
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

/// Every `import` with a constant path anywhere in a script: at its top level, in blocks
/// and in function bodies (where it runs only when the function is called).
fn static_imports(ast: &AST) -> Vec<(String, rhai::Position)> {
    let mut found = Vec::new();
    ast.walk(&mut |nodes: &[rhai::ASTNode]| {
        if let Some(rhai::ASTNode::Stmt(rhai::Stmt::Import(x, _))) = nodes.last() {
            if let rhai::Expr::StringConstant(path, pos) = &x.0 {
                found.push((path.to_string(), *pos));
            }
        }
        true
    });
    found
}

/// Finds (and compiles) every module a script imports with a constant path, as running it
/// would: a missing module, or one that does not compile, is a compile error (exit 2) that
/// says where it looked, from `gpuloop check` and `gpuloop run` alike.
pub(crate) fn check_imports(
    engine: &Engine,
    ast: &AST,
    file: &str,
    source: &str,
) -> Result<(), ScriptError> {
    for (path, pos) in static_imports(ast) {
        engine
            .module_resolver()
            .resolve(engine, Some(file), &path, pos)
            .map_err(|e| match errors::from_eval(*e, file, source) {
                ScriptError::Runtime(m) => ScriptError::Compile(m),
                other => other,
            })?;
    }
    Ok(())
}

/// `gpuloop check`: every call of a function that nothing defines (not the engine, rhai's
/// standard library, the script's own functions, nor the module a top-level `import … as
/// alias` names), each with the nearest name that exists; a compile error (exit 2).
pub(crate) fn check_calls(
    engine: &Engine,
    ast: &AST,
    file: &str,
    source: &str,
) -> Result<(), ScriptError> {
    let mut modules = std::collections::BTreeMap::new();
    for (path, alias, pos) in imports(ast) {
        if alias.is_empty() {
            continue;
        }
        if let Ok(m) = engine
            .module_resolver()
            .resolve(engine, Some(file), &path, pos)
        {
            modules.insert(alias, super::calls::module_names(&m));
        }
    }
    let unknown = super::calls::unknown(engine, ast, &modules);
    if unknown.is_empty() {
        return Ok(());
    }
    let said: Vec<String> = unknown
        .iter()
        .map(|u| {
            let help = u
                .nearest
                .as_ref()
                .map(|n| format!("\n  help: did you mean `{n}`?"))
                .unwrap_or_default();
            let msg = format!(
                "no function `{}` is defined (gpuloop doc lists them)",
                u.name
            );
            format!("{}{help}", errors::render(&msg, u.pos, file, source))
        })
        .collect();
    Err(ScriptError::Compile(said.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UserConfig;
    use crate::session::BackendChoice;

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

    /// The bug: `--limit calls=1M` wanted a 64 GiB stack, its thread could not be
    /// had, and the script ran on the main thread's 8 MiB with the limit in force: an abort.
    #[test]
    fn a_limit_whose_stack_cannot_be_had_is_refused_naming_the_largest_that_works() {
        let mut limits = Limits::default();
        assert_eq!(check_stack(&limits), Ok(()));
        limits.calls = 1 << 20;
        let why = check_stack(&limits).unwrap_err();
        let largest: usize = why
            .split("the largest calls limit that works is ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{why}"));
        limits.calls = largest;
        assert_eq!(check_stack(&limits), Ok(()), "{why}");
        limits.calls = largest + 1;
        assert!(check_stack(&limits).is_err());
        limits.calls = usize::MAX;
        assert!(check_stack(&limits).is_err());
        limits.calls = 256;
        limits.depth = usize::MAX / 2;
        assert!(check_stack(&limits)
            .unwrap_err()
            .contains("the largest depth limit that works is"));
    }

    /// The bug: 100,000 nested arrays or maps aborted with a stack overflow.
    /// Values nested as deep as the `depth` limit are cloned, compared, size-checked,
    /// printed, turned to JSON and dropped on a stack of `stack_size()`.
    #[test]
    fn values_nested_to_the_depth_limit_fit_the_script_stack() {
        const DEPTH: usize = 3_000;
        let mut config = UserConfig::default();
        config.limits.depth = DEPTH;
        // Only the share the depth adds, and 8 MiB (a main thread's) for the rest: the
        // per-level figure is what is under test.
        let stack = DEPTH * STACK_PER_LEVEL + (8 << 20);
        let session = Arc::new(Session::new(BackendChoice::Auto, config, 0));
        let worker = std::thread::Builder::new()
            .stack_size(stack)
            .spawn(move || {
                let engine = build_engine(session, &EngineOpts::default());
                let mut v = Dynamic::from(1_i64);
                // One level short: `[a]` below is DEPTH deep, what the limit allows.
                for i in 0..DEPTH - 1 {
                    v = if i % 2 == 0 {
                        Dynamic::from(vec![v])
                    } else {
                        let mut m = rhai::Map::new();
                        m.insert("x".into(), v);
                        Dynamic::from(m)
                    };
                }
                let mut scope = Scope::new();
                scope.push("a", v);
                let src =
                    "let b = a; let same = a == b; let t = to_string(a); let j = to_json(a); \
                       let c = [a]; c.push(1); [same, t.len() > 3000, j.len() > 3000, c.len()]";
                engine
                    .eval_with_scope::<rhai::Array>(&mut scope, src)
                    .map(|r| r.len())
            });
        let got = worker.expect("spawn").join().expect("no overflow");
        assert_eq!(got.map_err(|e| e.to_string()), Ok(4));
    }
}
