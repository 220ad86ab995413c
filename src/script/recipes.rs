//! Ready recipes, compiled into the binary like the stdlib, so `gpuloop run clean-node` works
//! from anywhere; `gpuloop recipes` lists them.

use serde::Serialize;

/// (name, source), embedded at build time from `scripts/`.
pub const RECIPES: &[(&str, &str)] = &[
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

/// A recipe's source by name (`clean-node` or `clean-node.rhai`).
pub fn find(name: &str) -> Option<&'static str> {
    let name = name.strip_suffix(".rhai").unwrap_or(name);
    RECIPES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_says_what_it_is_for() {
        for r in list() {
            assert!(!r.purpose.is_empty() && r.usage.contains(r.name), "{r:?}");
        }
        assert!(find("clean-node.rhai").is_some() && find("nope").is_none());
    }

    /// A new user's report, round 7: `scripts/slurm-site-policy.rhai` was called a recipe, but
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
