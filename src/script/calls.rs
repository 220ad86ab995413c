//! The functions a script calls, checked against those that exist: for `gpuloop check`, a call
//! that no registered function, rhai's standard library, the script's own functions or one of
//! its imports defines; for a failed run, the nearest name to a function that was not found.

use rhai::{ASTNode, Engine, EvalAltResult, Expr, Position, Stmt, AST};
use std::collections::{BTreeMap, BTreeSet};

/// Functions rhai's parser and evaluator answer themselves: no package registers them.
const KEYWORDS: &[&str] = &[
    "print",
    "debug",
    "type_of",
    "eval",
    "Fn",
    "call",
    "curry",
    "is_def_var",
    "is_def_fn",
    "is_shared",
];

/// A call of a function that nothing defines.
#[derive(Debug, PartialEq)]
pub(crate) struct UnknownCall {
    /// As written: `holdrs`, or `report::sumary` for a module's function.
    pub name: String,
    pub pos: Position,
    /// The nearest name that does exist, when it is near enough to be a typo.
    pub nearest: Option<String>,
}

/// The name before `(` of each signature rhai gives.
fn names_of(signatures: impl IntoIterator<Item = String>) -> BTreeSet<String> {
    signatures
        .into_iter()
        .filter_map(|s| s.split('(').next().map(|n| n.trim().to_string()))
        .filter(|n| !n.is_empty())
        .collect()
}

/// Every function callable by a plain name in `ast`: the engine's (its packages included),
/// rhai's keywords, and the script's own.
fn global_names(engine: &Engine, ast: &AST) -> BTreeSet<String> {
    let mut names = names_of(engine.gen_fn_signatures(true));
    names.extend(KEYWORDS.iter().map(|k| k.to_string()));
    names.extend(ast.iter_functions().map(|f| f.name.to_string()));
    names
}

/// Names a script binds to values anywhere (variables, constants, loop variables, parameters):
/// a call of one of them may call the function pointer it holds.
fn bound_names(ast: &AST) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ast
        .iter_functions()
        .flat_map(|f| f.params.into_iter().map(str::to_string))
        .collect();
    ast.walk(&mut |nodes: &[ASTNode]| {
        match nodes.last() {
            Some(ASTNode::Stmt(Stmt::Var(x, ..))) => {
                names.insert(x.0.name.to_string());
            }
            Some(ASTNode::Stmt(Stmt::For(x, ..))) => {
                names.insert(x.0.name.to_string());
                if let Some(counter) = &x.1 {
                    names.insert(counter.name.to_string());
                }
            }
            _ => {}
        }
        true
    });
    names
}

/// The calls in `ast` (its functions' bodies included) of functions that nothing defines.
/// `modules` maps each import alias to the names its module defines; a call into a namespace
/// that is not a known alias (an import with a computed path) is not judged.
pub(crate) fn unknown(
    engine: &Engine,
    ast: &AST,
    modules: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<UnknownCall> {
    let global = global_names(engine, ast);
    let bound = bound_names(ast);
    let mut found = Vec::new();
    ast.walk(&mut |nodes: &[ASTNode]| {
        // A call is an expression, or a statement of its own.
        let call = match nodes.last() {
            Some(ASTNode::Expr(Expr::FnCall(call, pos))) => Some((call, pos)),
            Some(ASTNode::Stmt(Stmt::FnCall(call, pos))) => Some((call, pos)),
            _ => None,
        };
        if let Some((call, pos)) = call {
            // Operators are calls too, of functions rhai has built in.
            if call.op_token.is_some() {
                return true;
            }
            let name = call.name.as_str();
            let verdict = if call.namespace.is_empty() {
                (!global.contains(name) && !bound.contains(name)).then(|| {
                    (
                        name.to_string(),
                        nearest(name, global.iter().map(String::as_str)),
                    )
                })
            } else {
                let root = call.namespace.root();
                modules.get(root).and_then(|defined| {
                    (call.namespace.path.len() == 1 && !defined.contains(name)).then(|| {
                        (
                            format!("{root}::{name}"),
                            nearest(name, defined.iter().map(String::as_str))
                                .map(|n| format!("{root}::{n}")),
                        )
                    })
                })
            };
            if let Some((name, nearest)) = verdict {
                found.push(UnknownCall {
                    name,
                    pos: *pos,
                    nearest,
                });
            }
        }
        true
    });
    found
}

/// The names a resolved module defines, for `unknown`.
pub(crate) fn module_names(module: &rhai::Module) -> BTreeSet<String> {
    names_of(module.gen_fn_signatures_with_mapper(std::borrow::Cow::Borrowed))
}

fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    super::fields::closest(name, candidates).map(str::to_string)
}

/// For a run that failed on a call of a function that does not exist: "did you mean `x`?",
/// from the engine's functions and the script's own; for a standard library module used
/// without its import, the import.
pub(crate) fn did_you_mean(engine: &Engine, ast: &AST, err: &EvalAltResult) -> Option<String> {
    let mut e = err;
    while let EvalAltResult::ErrorInFunctionCall(_, _, inner, _) = e {
        e = inner;
    }
    // `report::summary()` without its import: say the import.
    if let EvalAltResult::ErrorModuleNotFound(module, _) = e {
        return super::modules::STDLIB
            .iter()
            .any(|(name, _)| name == module)
            .then(|| format!("import it first: import \"{module}\" as {module};"));
    }
    let EvalAltResult::ErrorFunctionNotFound(sig, _) = e else {
        return None;
    };
    let name = sig.split('(').next().unwrap_or("").trim();
    // `alias::f`: the module's functions are not at hand here; the plain name is.
    let plain = name.rsplit("::").next().unwrap_or(name);
    let global = global_names(engine, ast);
    nearest(plain, global.iter().map(String::as_str)).map(|n| format!("did you mean `{n}`?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        let mut e = Engine::new();
        e.register_fn("holders", |_: rhai::Array| 0_i64);
        e.register_fn("wait_clean", || true);
        e
    }

    fn unknown_in(src: &str) -> Vec<(String, Option<String>)> {
        let e = engine();
        let ast = e.compile(src).expect("compiles");
        let mut modules = BTreeMap::new();
        modules.insert(
            "report".to_string(),
            ["summary".to_string()].into_iter().collect(),
        );
        unknown(&e, &ast, &modules)
            .into_iter()
            .map(|u| (u.name, u.nearest))
            .collect()
    }

    #[test]
    fn a_misspelt_function_is_found_with_its_nearest_name() {
        assert_eq!(
            unknown_in("let h = holdrs([0, 1]); wait_clean();"),
            vec![("holdrs".to_string(), Some("holders".to_string()))]
        );
    }

    #[test]
    fn own_functions_keywords_operators_and_bound_names_are_known() {
        let src = r#"
            fn twice(f, x) { f.call(x) + f(x) }
            let g = |y| y * 2;
            for (v, i) in [1, 2] { print(type_of(v) + i); }
            let s = twice(g, 3) + "a".len() + g(1);
            debug(is_def_fn("twice", 2));
            holders([]);
        "#;
        assert_eq!(unknown_in(src), vec![]);
    }

    #[test]
    fn a_modules_function_is_checked_against_that_module() {
        assert_eq!(
            unknown_in("report::sumary(); report::summary(); other::thing();"),
            vec![(
                "report::sumary".to_string(),
                Some("report::summary".to_string())
            )]
        );
    }

    #[test]
    fn a_function_defined_in_a_function_body_call_is_found_there_too() {
        assert_eq!(
            unknown_in("fn tidy() { wait_clen() }"),
            vec![("wait_clen".to_string(), Some("wait_clean".to_string()))]
        );
    }
}
