//! Ready recipes, compiled into the binary like the stdlib, so `gpuloop run clean-node` works
//! from anywhere; `gpuloop recipes` lists them.

use serde::Serialize;

/// (name, source), embedded at build time from `scripts/`.
pub(crate) const RECIPES: &[(&str, &str)] = &[
    ("clean-node", include_str!("../../scripts/clean-node.rhai")),
    (
        "slurm-site-policy",
        include_str!("../../scripts/slurm-site-policy.rhai"),
    ),
];

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Recipe {
    pub name: &'static str,
    /// The first line of its header comment, after "name: ".
    pub purpose: String,
    pub usage: String,
}

/// Every recipe with its one-line purpose and how to run it.
pub fn list() -> Vec<Recipe> {
    RECIPES
        .iter()
        .map(|(name, src)| {
            let comment = |l: &&str| l.starts_with("//");
            let text = |l: &str| l.trim_start_matches('/').trim().to_string();
            let purpose = src.lines().find(comment).map(text).unwrap_or_default();
            let purpose = purpose
                .strip_prefix(&format!("{name}: "))
                .map(str::to_string)
                .unwrap_or(purpose);
            let usage = src
                .lines()
                .take_while(comment)
                .map(text)
                .find(|l| l.starts_with("gpuloop run"))
                .unwrap_or_else(|| format!("gpuloop run {name}"));
            Recipe {
                name,
                purpose,
                usage,
            }
        })
        .collect()
}

/// A built-in recipe's source by its exact name (`clean-node`).
pub fn find(name: &str) -> Option<&'static str> {
    RECIPES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// What the SCRIPT argument of `gpuloop run` and `gpuloop check` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named<'a> {
    /// `-`: the script on stdin.
    Stdin,
    /// A path: it has a `/` or ends in `.rhai` (`./clean-node`, `fix.rhai`).
    File(&'a str),
    /// Anything else is the name of a built-in recipe, never a file: a root epilog's
    /// `gpuloop run slurm-site-policy` must not run whatever `./slurm-site-policy` its
    /// current directory holds.
    Recipe(&'a str),
}

impl<'a> Named<'a> {
    pub fn of(script: &'a str) -> Named<'a> {
        if script == "-" {
            Named::Stdin
        } else if script.contains('/') || script.ends_with(".rhai") {
            Named::File(script)
        } else {
            Named::Recipe(script)
        }
    }
}

/// The recipe names, comma-separated, for messages.
pub fn names() -> String {
    RECIPES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_says_what_it_is_for() {
        for r in list() {
            assert!(!r.purpose.is_empty() && r.usage.contains(r.name), "{r:?}");
        }
        assert!(find("clean-node").is_some() && find("nope").is_none());
        // `clean-node.rhai` is a file's name, never the recipe.
        assert!(find("clean-node.rhai").is_none());
    }

    #[test]
    fn a_name_with_a_slash_or_rhai_is_a_file_anything_else_a_recipe() {
        assert_eq!(Named::of("-"), Named::Stdin);
        for f in [
            "./clean-node",
            "x/y",
            "/etc/x",
            "fix.rhai",
            "clean-node.rhai",
        ] {
            assert_eq!(Named::of(f), Named::File(f));
        }
        for r in ["clean-node", "slurm-site-policy", "nope", "fix.rhai.bak"] {
            assert_eq!(Named::of(r), Named::Recipe(r));
        }
    }

    /// The bug: `scripts/slurm-site-policy.rhai` was called a recipe, but
    /// only clean-node was built in. Every script in `scripts/` is one, runnable by name.
    #[test]
    fn every_script_in_scripts_is_built_in() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            let src = std::fs::read_to_string(&path).unwrap();
            assert_eq!(find(&name), Some(src.as_str()), "{name} is not built in");
        }
    }
}
