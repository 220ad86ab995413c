//! Ready recipes, compiled into the binary like the stdlib, so `gpuloop run clean-node` works
//! from anywhere; `gpuloop recipes` lists them.

use serde::Serialize;

/// (name, source), embedded at build time from `scripts/`.
pub const RECIPES: &[(&str, &str)] =
    &[("clean-node", include_str!("../../scripts/clean-node.rhai"))];

#[derive(Debug, Clone, Serialize)]
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
}
