//! Recipes by name: the user's (`$XDG_CONFIG_HOME/gpuloop/recipes`), the site's
//! (`/etc/gpuloop/recipes`) and the ones compiled into the binary, searched in that order;
//! a file runs by name only when `trust` says so. `gpuloop recipes` lists them all.
//!
//! The user's come first so that a person can try a change to a site or built-in recipe under
//! its own name without being root; a root epilog's `gpuloop run NAME` sees root's own
//! directory, which only root can write, and MCP's `run_recipe` leaves the user's out unless
//! the server was started with `--user-recipes`.

pub mod header;
pub(crate) mod trust;

use header::{ArgSpec, Header};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// (name, source), embedded at build time from `scripts/`.
pub(crate) const BUILT_IN: &[(&str, &str)] = &[
    (
        "clean-node",
        include_str!("../../../scripts/clean-node.rhai"),
    ),
    (
        "slurm-site-policy",
        include_str!("../../../scripts/slurm-site-policy.rhai"),
    ),
    ("vllm", include_str!("../../../scripts/vllm.rhai")),
    ("torchrun", include_str!("../../../scripts/torchrun.rhai")),
    ("ray", include_str!("../../../scripts/ray.rhai")),
    (
        "dataloader",
        include_str!("../../../scripts/dataloader.rhai"),
    ),
    ("preflight", include_str!("../../../scripts/preflight.rhai")),
    (
        "patch-and-rerun",
        include_str!("../../../scripts/patch-and-rerun.rhai"),
    ),
];

/// The site's recipe directory unless `GPULOOP_SITE_RECIPES` names another.
pub const SITE_DIR: &str = "/etc/gpuloop/recipes";

/// Where a recipe comes from, in the order they are searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    User,
    Site,
    BuiltIn,
}

impl Origin {
    pub fn name(self) -> &'static str {
        match self {
            Origin::User => "user",
            Origin::Site => "site",
            Origin::BuiltIn => "built-in",
        }
    }
}

/// The directories searched, fixed for one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    /// The user's directory; `None` when it is not searched (MCP without `--user-recipes`,
    /// or no home).
    pub user: Option<PathBuf>,
    pub site: PathBuf,
}

/// Set in the environment of the gpuloop that MCP's `run_recipe` starts without
/// `--user-recipes`: that gpuloop searches the site's and the built-in recipes only.
pub const NO_USER_RECIPES: &str = "GPULOOP_NO_USER_RECIPES";

impl Roots {
    /// From the environment: `XDG_CONFIG_HOME` (or `~/.config`), `GPULOOP_SITE_RECIPES` and
    /// `GPULOOP_NO_USER_RECIPES`.
    pub fn from_env() -> Roots {
        let site = std::env::var_os("GPULOOP_SITE_RECIPES")
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from(SITE_DIR), PathBuf::from);
        let user = if std::env::var_os(NO_USER_RECIPES).is_some_and(|v| !v.is_empty()) {
            None
        } else {
            user_dir()
        };
        Roots { user, site }
    }

    /// The same roots without the user's directory.
    pub fn without_user(&self) -> Roots {
        Roots {
            user: None,
            site: self.site.clone(),
        }
    }

    fn dirs(&self) -> Vec<(Origin, &Path)> {
        let mut out = Vec::new();
        if let Some(u) = &self.user {
            out.push((Origin::User, u.as_path()));
        }
        out.push((Origin::Site, self.site.as_path()));
        out
    }
}

/// `$XDG_CONFIG_HOME/gpuloop/recipes` (or `~/.config/gpuloop/recipes`).
pub fn user_dir() -> Option<PathBuf> {
    crate::config::config_dir().map(|d| d.join("recipes"))
}

/// A recipe found by name, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    pub origin: Origin,
    /// The file, for a user's or site recipe.
    pub path: Option<PathBuf>,
    pub source: String,
}

impl Found {
    /// Where it comes from, for messages: "built-in", "/etc/gpuloop/recipes/x.rhai".
    pub fn whence(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => self.origin.name().to_string(),
        }
    }
}

/// Why a name runs nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    #[error("no recipe named {name:?} (recipes: {names}; gpuloop recipes lists them){hint}")]
    NotFound {
        name: String,
        names: String,
        hint: String,
    },
    #[error("recipe {name:?} is refused: {why}; {}", trust::Distrust::RULE)]
    Untrusted { name: String, why: trust::Distrust },
    #[error("{name:?} is no recipe name: letters, digits, '.', '_' and '-', not starting with '.' or '-'")]
    BadName { name: String },
}

/// A recipe's name: the file is `NAME.rhai` in its directory.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The recipe `name` runs: the first of the user's, the site's and the built-in ones that has
/// it. A file that is there but fails the trust checks is an error, never skipped for the
/// next one of the same name.
pub fn find(name: &str, roots: &Roots) -> Result<Found, FindError> {
    if !valid_name(name) {
        return Err(FindError::BadName { name: name.into() });
    }
    let file = format!("{name}.rhai");
    for (origin, dir) in roots.dirs() {
        match trust::read(dir, &file) {
            Ok(Some(source)) => {
                return Ok(Found {
                    name: name.into(),
                    origin,
                    path: Some(dir.join(&file)),
                    source,
                })
            }
            Ok(None) => {}
            // A directory that cannot be trusted, with no such file in it, hides nothing.
            Err(why) if !dir.join(&file).exists() && !is_link(&dir.join(&file)) => {
                tracing::debug!("recipes: {}: {why}", dir.display());
            }
            Err(why) => {
                return Err(FindError::Untrusted {
                    name: name.into(),
                    why,
                })
            }
        }
    }
    match BUILT_IN.iter().find(|(n, _)| *n == name) {
        Some((_, src)) => Ok(Found {
            name: name.into(),
            origin: Origin::BuiltIn,
            path: None,
            source: src.to_string(),
        }),
        None => Err(FindError::NotFound {
            name: name.into(),
            names: list(roots)
                .iter()
                .filter(|r| r.refused.is_none() && r.shadowed_by.is_none())
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
                .join(", "),
            hint: format!("; to run a file, name it by its path: ./{name}"),
        }),
    }
}

fn is_link(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

/// One recipe as `gpuloop recipes` and MCP's `recipes` list it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Recipe {
    pub name: String,
    pub origin: Origin,
    /// Its file, for a user's or site recipe.
    pub path: Option<String>,
    /// The first line of its header comment, after "NAME: ".
    pub purpose: String,
    pub usage: String,
    /// The arguments its header declares.
    pub args: Vec<ArgSpec>,
    /// A recipe of the same name found earlier in the search, which runs instead of this one.
    pub shadowed_by: Option<Origin>,
    /// Why it does not run by name (the trust checks, or a header that cannot be read).
    pub refused: Option<String>,
}

impl Recipe {
    fn of(name: &str, origin: Origin, path: Option<&Path>, src: Option<&str>) -> Recipe {
        let mut r = Recipe {
            name: name.into(),
            origin,
            path: path.map(|p| p.display().to_string()),
            purpose: String::new(),
            usage: format!("gpuloop run {name}"),
            args: Vec::new(),
            shadowed_by: None,
            refused: None,
        };
        if let Some(src) = src {
            match header::parse(name, src) {
                Ok(h) => {
                    r.usage = header::usage(name, &h.args);
                    r.purpose = h.purpose;
                    r.args = h.args;
                }
                Err(e) => {
                    r.refused = Some(format!("its header, line {}: {}", e.line, e.why));
                }
            }
        }
        r
    }
}

/// Every recipe: the user's, the site's, then the built-in ones, each directory's by name.
pub fn list(roots: &Roots) -> Vec<Recipe> {
    let mut out: Vec<Recipe> = Vec::new();
    for (origin, dir) in roots.dirs() {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                let stem = n.strip_suffix(".rhai")?;
                valid_name(stem).then(|| stem.to_string())
            })
            .collect();
        names.sort();
        for name in names {
            let file = format!("{name}.rhai");
            let path = dir.join(&file);
            let mut r = match trust::read(dir, &file) {
                Ok(Some(src)) => Recipe::of(&name, origin, Some(&path), Some(&src)),
                Ok(None) => continue,
                Err(why) => {
                    // Its purpose is still worth showing; reading it runs nothing.
                    let src = crate::input::text(&path, crate::input::SCRIPT).ok();
                    let mut r = Recipe::of(&name, origin, Some(&path), src.as_deref());
                    r.refused = Some(why.to_string());
                    r
                }
            };
            r.shadowed_by = out.iter().find(|o| o.name == name).map(|o| o.origin);
            out.push(r);
        }
    }
    for (name, src) in BUILT_IN {
        let mut r = Recipe::of(name, Origin::BuiltIn, None, Some(src));
        r.shadowed_by = out.iter().find(|o| o.name == *name).map(|o| o.origin);
        out.push(r);
    }
    out
}

/// The header of a recipe's source; `name` is stripped from its purpose line.
pub fn header_of(name: &str, src: &str) -> Result<Header, header::HeaderError> {
    header::parse(name, src)
}

/// What the SCRIPT argument of `gpuloop run` and `gpuloop check` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named<'a> {
    /// `-`: the script on stdin.
    Stdin,
    /// A path: it has a `/` or ends in `.rhai` (`./clean-node`, `fix.rhai`).
    File(&'a str),
    /// Anything else is the name of a recipe, never a file of the current directory: a root
    /// epilog's `gpuloop run slurm-site-policy` must not run whatever
    /// `./slurm-site-policy` its current directory holds.
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

/// The skeleton `gpuloop recipes new NAME` writes: arguments, a dry run, a report before
/// and after.
pub fn skeleton(name: &str) -> String {
    include_str!("skeleton.rhai").replace("NAME", name)
}

/// Why a recipe could not be written into the user's directory.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{0}")]
    BadName(FindError),
    #[error("no home directory: cannot tell where the user's recipes go")]
    NoHome,
    #[error("cannot make {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// There is one by that name already, and it was not to be replaced.
    #[error("{} exists already: edit it, or remove it first", .0.display())]
    Exists(PathBuf),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn not_regular(path: &std::path::Path) -> CreateError {
    CreateError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other("not a regular file; refused"),
    }
}

/// Writes the skeleton of a new recipe into the user's directory (made if missing, mode 0755;
/// the file 0644: writable by no one else, as the trust checks want); returns its path.
pub fn create(name: &str, text: &str, overwrite: bool) -> Result<PathBuf, CreateError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if !valid_name(name) {
        return Err(CreateError::BadName(FindError::BadName {
            name: name.into(),
        }));
    }
    let dir = user_dir().ok_or(CreateError::NoHome)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .map_err(|source| CreateError::Dir {
            dir: dir.clone(),
            source,
        })?;
    let path = dir.join(format!("{name}.rhai"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(overwrite)
        .create_new(!overwrite)
        // Never through a link, and never waiting on a FIFO (refused below).
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .mode(0o644)
        .open(&path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => CreateError::Exists(path.clone()),
            // ENXIO: a FIFO that no one reads, opened without blocking.
            _ if source.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
                not_regular(&path)
            }
            _ => CreateError::Write {
                path: path.clone(),
                source,
            },
        })?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Err(not_regular(&path));
    }
    // The umask may have taken bits off, never added; group-writable umasks (002) are why
    // the mode is set again.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
        .and_then(|()| f.write_all(text.as_bytes()))
        .map_err(|source| CreateError::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_dirs() -> Roots {
        Roots {
            user: None,
            site: PathBuf::from("/nonexistent/gpuloop-recipes"),
        }
    }

    #[test]
    fn every_recipe_says_what_it_is_for_and_declares_its_arguments() {
        for r in list(&no_dirs()) {
            assert!(!r.purpose.is_empty() && r.usage.contains(&r.name), "{r:?}");
            assert_eq!(r.refused, None, "{r:?}");
            assert!(!r.args.is_empty(), "{} declares no arguments", r.name);
        }
        assert!(find("clean-node", &no_dirs()).is_ok());
        assert!(matches!(
            find("nope", &no_dirs()),
            Err(FindError::NotFound { .. })
        ));
        // `clean-node.rhai` is a file's name, never the recipe.
        assert!(find("clean-node.rhai", &no_dirs()).is_err());
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
            let found = find(&name, &no_dirs()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(found.source, src, "{name} is not built in");
        }
    }

    #[test]
    fn the_skeleton_declares_its_arguments() {
        let h = header::parse("mine", &skeleton("mine")).unwrap();
        let names: Vec<&str> = h.args.iter().map(|a| a.name.as_str()).collect();
        assert!(names.contains(&"dry-run"), "{names:?}");
        assert!(h.purpose.starts_with('('), "{}", h.purpose);
    }

    #[test]
    fn recipe_names_are_file_names_without_a_path() {
        for ok in ["clean-node", "a.b", "x_1"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".hidden", "-x", "a/b", "a b", "..", "ü"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
