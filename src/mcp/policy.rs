//! What the person running `gpuloop mcp` lets the model do: read-only unless `--allow`ed.

use crate::script::recipes::needs::Need;
use std::collections::BTreeSet;
use std::fmt;

/// One thing beyond reading that a person can allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    Kill,
    Clean,
    Run,
    Recipes,
}

impl Permission {
    pub const ALL: [Permission; 4] = [
        Permission::Kill,
        Permission::Clean,
        Permission::Run,
        Permission::Recipes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Permission::Kill => "kill",
            Permission::Clean => "clean",
            Permission::Run => "run",
            Permission::Recipes => "recipes",
        }
    }

    fn parse(s: &str) -> Option<Permission> {
        Permission::ALL
            .into_iter()
            .find(|p| p.name() == s.trim().to_ascii_lowercase())
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown permission {0:?} for mcp (allow takes kill, clean, run, recipes)")]
pub(crate) struct UnknownPermission(pub String);

/// The server's policy, fixed when it starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Policy {
    allowed: BTreeSet<Permission>,
    /// `--user-recipes`: `recipes` and `run_recipe` see the user's own recipes too.
    user_recipes: bool,
}

/// A call the policy refuses: the tool, and the permission that would allow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refused: `{tool}` {what} is not allowed by this server's policy, which is {allows}. The person who runs the server can allow it with `gpuloop mcp --allow {needs}` or `[mcp] allow = [\"{needs}\"]` in config.toml{hint}"
)]
pub struct Refusal {
    pub tool: &'static str,
    pub what: &'static str,
    pub needs: Permission,
    pub hint: &'static str,
    /// What this server allows (`Policy::describe`): "read-only", or "read-only + clean".
    pub allows: String,
}

impl Policy {
    /// The union of `--allow` values and the config's `[mcp] allow`, each possibly "a,b".
    pub(crate) fn from_lists<'a>(
        lists: impl IntoIterator<Item = &'a String>,
    ) -> Result<Policy, UnknownPermission> {
        let mut allowed = BTreeSet::new();
        for item in lists {
            for word in item.split(',').filter(|w| !w.trim().is_empty()) {
                allowed
                    .insert(Permission::parse(word).ok_or_else(|| UnknownPermission(word.into()))?);
            }
        }
        Ok(Policy {
            allowed,
            user_recipes: false,
        })
    }

    /// The same policy, with the user's own recipes seen or not (`--user-recipes`).
    pub(crate) fn with_user_recipes(self, on: bool) -> Policy {
        Policy {
            user_recipes: on,
            ..self
        }
    }

    /// Whether `recipes` and `run_recipe` see the user's own recipes.
    pub(crate) fn user_recipes(&self) -> bool {
        self.user_recipes
    }

    pub(crate) fn allows(&self, p: Permission) -> bool {
        self.allowed.contains(&p)
    }

    /// "read-only" or "read-only + kill, clean".
    pub(crate) fn describe(&self) -> String {
        let mine = if self.user_recipes {
            " (recipes: the user's own too)"
        } else {
            ""
        };
        if self.allowed.is_empty() {
            return format!("read-only{mine}");
        }
        let names: Vec<&str> = self.allowed.iter().map(|p| p.name()).collect();
        format!("read-only + {}{mine}", names.join(", "))
    }

    /// The `--allow` words, as `gpuloop run` reads them from `recipes::MCP_ALLOW`.
    pub(crate) fn words(&self) -> String {
        let names: Vec<&str> = self.allowed.iter().map(|p| p.name()).collect();
        names.join(",")
    }

    /// Checks that this server allows everything a recipe's header declares it needs: a
    /// recipe served here does no more than the server's own `--allow` list permits.
    pub(crate) fn check_needs(&self, needs: &[Need]) -> Result<(), Refusal> {
        let names: Vec<&str> = self.allowed.iter().map(|p| p.name()).collect();
        let Some(need) = Need::first_refused(needs, names.iter().copied()) else {
            return Ok(());
        };
        let (what, p) = match need {
            Need::Kill => (
                "(a recipe that signals processes its caller names)",
                Permission::Kill,
            ),
            Need::Clean => ("(a recipe that stops GPU holders)", Permission::Clean),
            Need::Run => (
                "(a recipe that runs commands or writes files)",
                Permission::Run,
            ),
        };
        Err(Refusal {
            tool: "run_recipe",
            what,
            needs: p,
            hint: ". Each recipe's `needs` (the `recipes` tool lists them) says what it does beyond reading.",
            allows: self.describe(),
        })
    }

    /// Checks a call that needs `p`; `dry_run` calls of kill and clean only read.
    pub(crate) fn check(
        &self,
        tool: &'static str,
        p: Permission,
        dry_run: bool,
    ) -> Result<(), Refusal> {
        if dry_run || self.allows(p) {
            return Ok(());
        }
        let (what, hint) = match p {
            Permission::Kill | Permission::Clean => (
                "(signalling processes)",
                "; a dry run (`dry_run: true`) is always allowed and shows what it would stop.",
            ),
            Permission::Run => ("(running a command)", "."),
            Permission::Recipes => ("(running a recipe)", "."),
        };
        let allows = self.describe();
        Err(Refusal {
            tool,
            what,
            needs: p,
            hint,
            allows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_comma_lists_and_refuses_unknown_words() {
        let p = Policy::from_lists(&["kill,clean".to_string(), "Run".to_string()]).unwrap();
        assert!(p.allows(Permission::Kill) && p.allows(Permission::Clean));
        assert!(p.allows(Permission::Run) && !p.allows(Permission::Recipes));
        assert_eq!(p.describe(), "read-only + kill, clean, run");
        let e = Policy::from_lists(&["clean,nuke".to_string()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown permission \"nuke\" for mcp (allow takes kill, clean, run, recipes)"
        );
    }

    #[test]
    fn a_recipe_is_refused_what_the_server_does_not_allow() {
        let p = Policy::from_lists(&["recipes,clean".to_string()]).unwrap();
        assert!(p.check_needs(&[]).is_ok());
        assert!(p.check_needs(&[Need::Clean]).is_ok());
        let e = p.check_needs(&[Need::Clean, Need::Run]).unwrap_err();
        assert_eq!(e.needs, Permission::Run);
        assert!(e.to_string().contains("`gpuloop mcp --allow run`"), "{e}");
        assert_eq!(
            p.check_needs(&[Need::Kill]).unwrap_err().needs,
            Permission::Kill
        );
        // kill may stop any process: a recipe that stops holders needs no more.
        let p = Policy::from_lists(&["kill".to_string()]).unwrap();
        assert!(p.check_needs(&[Need::Clean, Need::Kill]).is_ok());
        assert_eq!(p.words(), "kill");
    }

    #[test]
    fn read_only_by_default_but_dry_runs_pass() {
        let p = Policy::default();
        assert_eq!(p.describe(), "read-only");
        assert!(p.check("clean", Permission::Clean, true).is_ok());
        let e = p.check("clean", Permission::Clean, false).unwrap_err();
        assert_eq!(e.needs, Permission::Clean);
        assert!(e.to_string().contains("`gpuloop mcp --allow clean`"), "{e}");
    }
}
