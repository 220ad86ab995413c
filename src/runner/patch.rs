//! Unified diffs applied to (or reverted from) files, all or nothing, with a precise error
//! when a hunk does not match: the patch half of a patch-and-rerun loop.

use diffy::patch_set::{FileOperation, ParseOptions, PatchKind, PatchSet};
use diffy::{Line, Patch};
use std::borrow::Cow;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Apply,
    Revert,
}

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("the diff does not parse: {0}")]
    Parse(String),
    #[error("the diff has no hunks (expected a unified diff: ---/+++ headers and @@ hunks)")]
    Empty,
    #[error("{path}: {why}")]
    Io { path: String, why: String },
    #[error("{path}: hunk {hunk} ({header}) does not apply: {why}{hint}")]
    Hunk {
        path: String,
        hunk: usize,
        header: String,
        why: String,
        hint: String,
    },
    #[error("{0}")]
    Unsupported(String),
}

/// What a successful apply (or revert) changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub files: Vec<PathBuf>,
    pub hunks: usize,
}

/// One file's change, parsed.
struct FileChange<'a> {
    /// Path named by the diff (prefix stripped), `None` for a headerless diff.
    path: Option<String>,
    create: bool,
    delete: bool,
    patch: Patch<'a, str>,
}

/// Applies (or reverts) `diff` to `target`: a file (the diff must change exactly one file;
/// its header names are ignored) or a directory (paths from the headers, `a/` `b/` prefixes
/// stripped as git writes them). Nothing is written unless every hunk of every file
/// applies; each file is replaced atomically. With `dry_run` nothing is written at all.
pub fn apply(
    target: &Path,
    diff: &str,
    direction: Direction,
    dry_run: bool,
) -> Result<Applied, PatchError> {
    let changes = parse(diff)?;
    let is_dir = target.is_dir();
    if !is_dir && changes.len() > 1 {
        return Err(PatchError::Unsupported(format!(
            "the diff changes {} files; give the directory they are in, not {}",
            changes.len(),
            target.display()
        )));
    }
    // Every path is checked before any hunk: a path outside the directory is the error.
    let paths = changes
        .iter()
        .map(|change| match (&change.path, is_dir) {
            (Some(p), true) => inside(target, p),
            (None, true) => Err(PatchError::Unsupported(format!(
                "the diff names no file; give the file to patch, not the directory {}",
                target.display()
            ))),
            (_, false) => Ok(target.to_path_buf()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut planned: Vec<(PathBuf, Option<String>)> = Vec::new();
    let mut hunks = 0;
    for (change, path) in changes.iter().zip(paths) {
        let (create, delete) = match direction {
            Direction::Apply => (change.create, change.delete),
            Direction::Revert => (change.delete, change.create),
        };
        let patch = match direction {
            Direction::Apply => Cow::Borrowed(&change.patch),
            Direction::Revert => Cow::Owned(change.patch.reverse()),
        };
        let shown = path.display().to_string();
        let base = if create {
            if path.exists() {
                return Err(PatchError::Io {
                    path: shown,
                    why: "the diff creates this file, but it already exists".into(),
                });
            }
            String::new()
        } else {
            read(&path)?
        };
        let new = diffy::apply(&base, &patch).map_err(|e| {
            let n = hunk_number(&e.to_string());
            hunk_error(&shown, &base, &patch, n, &change.patch, direction)
        })?;
        hunks += patch.hunks().len();
        planned.push((path, (!delete).then_some(new)));
    }
    if !dry_run {
        write_all(&planned)?;
    }
    Ok(Applied {
        files: planned.into_iter().map(|(p, _)| p).collect(),
        hunks,
    })
}

/// `dir`/`rel`, refused when it would leave `dir`: an absolute path, a `..` component, or
/// a symbolic link on the way that points out. Diffs come from tools and LLM fixers; a
/// header like `+++ b/../../etc/profile` must not write anywhere but inside the directory.
fn inside(dir: &Path, rel: &str) -> Result<PathBuf, PatchError> {
    let outside = |why: &str| {
        PatchError::Unsupported(format!(
            "the diff names {rel:?}, {why}: only files inside {} are patched (nothing was written)",
            dir.display()
        ))
    };
    let p = Path::new(rel);
    if rel.is_empty() || p.is_absolute() {
        return Err(outside("an absolute path"));
    }
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(outside("a path that leaves the directory"));
    }
    let joined = dir.join(p);
    let root = dir.canonicalize().map_err(|e| PatchError::Io {
        path: dir.display().to_string(),
        why: e.to_string(),
    })?;
    // The deepest part that exists, symbolic links resolved, must still be inside.
    let mut probe = joined.clone();
    while std::fs::symlink_metadata(&probe).is_err() && probe.pop() {}
    match probe.canonicalize() {
        Ok(real) if real.starts_with(&root) => Ok(joined),
        Ok(_) => Err(outside("which a symbolic link points out of the directory")),
        // A dangling link: where it points is outside anything we can check.
        Err(_) => Err(outside("which goes through a dangling symbolic link")),
    }
}

/// True if `diff` is applied to `target`: it reverts cleanly and does not apply again.
/// A diff that does not parse is an error, not "not applied".
pub fn is_applied(target: &Path, diff: &str) -> Result<bool, PatchError> {
    parse(diff)?;
    let reverts = apply(target, diff, Direction::Revert, true).is_ok();
    let applies = match apply(target, diff, Direction::Apply, true) {
        Ok(_) => true,
        Err(PatchError::Hunk { .. }) => false,
        // A missing file or a path outside the directory is not "not applied".
        Err(e) => return Err(e),
    };
    Ok(reverts && !applies)
}

fn parse(diff: &str) -> Result<Vec<FileChange<'_>>, PatchError> {
    let mut out = Vec::new();
    let has_headers = diff
        .lines()
        .any(|l| l.starts_with("--- ") || l.starts_with("diff --git "));
    if !has_headers {
        // Bare hunks (what people paste): one file, named by the caller.
        let patch = Patch::from_str(diff).map_err(|e| PatchError::Parse(e.to_string()))?;
        if patch.hunks().is_empty() {
            return Err(PatchError::Empty);
        }
        out.push(FileChange {
            path: None,
            create: false,
            delete: false,
            patch,
        });
        return Ok(out);
    }
    let format = if diff.lines().any(|l| l.starts_with("diff --git ")) {
        ParseOptions::gitdiff()
    } else {
        ParseOptions::unidiff()
    };
    for file in PatchSet::parse(diff, format) {
        let file = file.map_err(|e| PatchError::Parse(e.to_string()))?;
        let op = file.operation().clone();
        let PatchKind::Text(patch) = file.into_patch() else {
            return Err(PatchError::Unsupported(
                "binary diffs are not supported".into(),
            ));
        };
        let (path, create, delete) = match &op {
            FileOperation::Modify { original, modified } => {
                let (o, m) = strip_git_prefixes(original, modified);
                if o != m {
                    return Err(PatchError::Unsupported(format!(
                        "the diff renames {o} to {m}; only changes in place are supported"
                    )));
                }
                (m, false, false)
            }
            FileOperation::Create(p) => (strip_one(p, "b/"), true, false),
            FileOperation::Delete(p) => (strip_one(p, "a/"), false, true),
            FileOperation::Rename { from, to } | FileOperation::Copy { from, to } => {
                return Err(PatchError::Unsupported(format!(
                    "the diff renames or copies {from} to {to}; only changes in place are supported"
                )))
            }
        };
        out.push(FileChange {
            path: Some(path),
            create,
            delete,
            patch,
        });
    }
    if out.is_empty()
        || out
            .iter()
            .all(|c| c.patch.hunks().is_empty() && !c.create && !c.delete)
    {
        return Err(PatchError::Empty);
    }
    Ok(out)
}

/// git writes `a/path` and `b/path`; a plain `diff -u` writes the paths as they were.
fn strip_git_prefixes(original: &str, modified: &str) -> (String, String) {
    match (original.strip_prefix("a/"), modified.strip_prefix("b/")) {
        (Some(o), Some(m)) => (o.to_string(), m.to_string()),
        _ => (original.to_string(), modified.to_string()),
    }
}

fn strip_one(path: &str, prefix: &str) -> String {
    path.strip_prefix(prefix).unwrap_or(path).to_string()
}

/// diffy says "error applying hunk #N".
fn hunk_number(msg: &str) -> usize {
    msg.rsplit('#')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(1)
}

/// Says which line of the file differs from what the hunk expects, and whether the diff
/// looks applied already.
fn hunk_error(
    path: &str,
    base: &str,
    patch: &Patch<'_, str>,
    n: usize,
    original: &Patch<'_, str>,
    direction: Direction,
) -> PatchError {
    let Some(hunk) = patch.hunks().get(n.saturating_sub(1)) else {
        return PatchError::Hunk {
            path: path.to_string(),
            hunk: n,
            header: "?".into(),
            why: "no match".into(),
            hint: String::new(),
        };
    };
    let old = hunk.old_range();
    let new = hunk.new_range();
    let header = format!(
        "@@ -{},{} +{},{} @@",
        old.start(),
        old.len(),
        new.start(),
        new.len()
    );
    let file: Vec<&str> = base.lines().collect();
    let expected: Vec<&str> = hunk
        .lines()
        .iter()
        .filter_map(|l| match l {
            Line::Context(s) | Line::Delete(s) => Some(s.trim_end_matches(['\n', '\r'])),
            Line::Insert(_) => None,
        })
        .collect();
    let first = old.start().max(1);
    let why = match expected.iter().enumerate().find(|(i, want)| {
        file.get(first - 1 + i)
            .is_none_or(|have| have.trim_end_matches('\r') != **want)
    }) {
        Some((i, want)) => match file.get(first - 1 + i) {
            Some(have) => format!(
                "line {} is `{}`, the diff expects `{}` (and the hunk matches nowhere else)",
                first + i,
                have.trim_end(),
                want
            ),
            None => format!(
                "the file has {} lines, the hunk expects `{}` at line {}",
                file.len(),
                want,
                first + i
            ),
        },
        None => "its lines are there, but not where the hunks before it leave them".into(),
    };
    // The opposite direction applying cleanly means the work is already done.
    let opposite = match direction {
        Direction::Apply => original.reverse(),
        Direction::Revert => original.clone(),
    };
    let hint = if diffy::apply(base, &opposite).is_ok() {
        match direction {
            Direction::Apply => "; the diff looks already applied (it reverts cleanly)",
            Direction::Revert => "; the diff looks not applied (it applies cleanly)",
        }
    } else {
        ""
    };
    PatchError::Hunk {
        path: path.to_string(),
        hunk: n,
        header,
        why,
        hint: hint.into(),
    }
}

fn read(path: &Path) -> Result<String, PatchError> {
    let io = |why: String| PatchError::Io {
        path: path.display().to_string(),
        why,
    };
    let bytes = std::fs::read(path).map_err(|e| io(e.to_string()))?;
    String::from_utf8(bytes)
        .map_err(|_| io("not UTF-8 text; only text files can be patched".into()))
}

/// Writes every new file to a temporary beside it first, then renames them all: a failure
/// before the renames leaves every file as it was.
fn write_all(planned: &[(PathBuf, Option<String>)]) -> Result<(), PatchError> {
    let io = |path: &Path, e: std::io::Error| PatchError::Io {
        path: path.display().to_string(),
        why: e.to_string(),
    };
    let mut temps: Vec<(PathBuf, &Path)> = Vec::new();
    let cleanup = |temps: &[(PathBuf, &Path)]| {
        for (tmp, _) in temps {
            let _ = std::fs::remove_file(tmp);
        }
    };
    for (path, content) in planned {
        let Some(content) = content else { continue };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.gpuloop-patch"));
        let written = std::fs::write(&tmp, content).and_then(|()| {
            if let Ok(meta) = std::fs::metadata(path) {
                std::fs::set_permissions(&tmp, meta.permissions())?;
            }
            Ok(())
        });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            cleanup(&temps);
            return Err(io(path, e));
        }
        temps.push((tmp, path));
    }
    for (tmp, path) in &temps {
        if let Err(e) = std::fs::rename(tmp, path) {
            cleanup(&temps);
            return Err(io(path, e));
        }
    }
    for (path, content) in planned {
        if content.is_none() {
            std::fs::remove_file(path).map_err(|e| io(path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "a\nb\nc\nd\ne\nf\ng\nh\n";
    const DIFF: &str = "--- a/f.txt\n+++ b/f.txt\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n@@ -6,3 +6,4 @@\n f\n g\n+g2\n h\n";

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.txt");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn applies_and_reverts() {
        let (_d, p) = file(BASE);
        let r = apply(&p, DIFF, Direction::Apply, false).unwrap();
        assert_eq!(r.hunks, 2);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "a\nb\nC\nd\ne\nf\ng\ng2\nh\n"
        );
        assert!(is_applied(&p, DIFF).unwrap());
        apply(&p, DIFF, Direction::Revert, false).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), BASE);
        assert!(!is_applied(&p, DIFF).unwrap());
    }

    #[test]
    fn a_failing_second_hunk_leaves_the_file_untouched() {
        let changed = BASE.replace("g\n", "G\n");
        let (_d, p) = file(&changed);
        let e = apply(&p, DIFF, Direction::Apply, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hunk 2 (@@ -6,3 +6,4 @@)"), "{e}");
        assert!(e.contains("line 7 is `G`, the diff expects `g`"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), changed);
    }

    #[test]
    fn says_when_the_diff_is_already_applied() {
        let (_d, p) = file(BASE);
        apply(&p, DIFF, Direction::Apply, false).unwrap();
        let e = apply(&p, DIFF, Direction::Apply, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("looks already applied"), "{e}");
    }

    #[test]
    fn bare_hunks_and_directories() {
        let (d, p) = file(BASE);
        let bare = "@@ -1,2 +1,2 @@\n-a\n+A\n b\n";
        apply(&p, bare, Direction::Apply, false).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().starts_with("A\nb\n"));
        let e = apply(d.path(), bare, Direction::Apply, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("names no file"), "{e}");
        let r = apply(d.path(), DIFF, Direction::Apply, false).unwrap();
        assert_eq!(r.files, vec![d.path().join("f.txt")]);
    }

    /// Issue 10, defect 6: `+++ b/../outside.txt` and absolute paths were honoured.
    #[test]
    fn apply_patch_refuses_paths_that_leave_the_directory() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("repo");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("f.txt"), BASE).unwrap();
        std::fs::write(top.path().join("outside.txt"), BASE).unwrap();
        std::os::unix::fs::symlink(top.path(), dir.join("up")).unwrap();
        let outside = top.path().join("outside.txt");
        let hunk = "@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n";
        let good = format!("--- a/f.txt\n+++ b/f.txt\n{hunk}");
        for name in [
            "../outside.txt".to_string(),
            "sub/../../outside.txt".to_string(),
            outside.display().to_string(),
            "up/outside.txt".to_string(),
        ] {
            // A good change first: all or nothing, so it must not be written either.
            let diff = format!("{good}--- a/{name}\n+++ b/{name}\n{hunk}");
            let diff = diff.replace("a//", "/").replace("b//", "/");
            for direction in [Direction::Apply, Direction::Revert] {
                let e = apply(&dir, &diff, direction, false).unwrap_err();
                assert!(e.to_string().contains("nothing was written"), "{name}: {e}");
            }
            assert_eq!(std::fs::read_to_string(&outside).unwrap(), BASE, "{name}");
            assert_eq!(std::fs::read_to_string(dir.join("f.txt")).unwrap(), BASE);
        }
        // Inside is fine, also through ./ and a link that stays inside.
        std::os::unix::fs::symlink(&dir, dir.join("here")).unwrap();
        let diff = format!("--- a/./here/f.txt\n+++ b/./here/f.txt\n{hunk}");
        assert_eq!(
            apply(&dir, &diff, Direction::Apply, false).unwrap().hunks,
            1
        );
    }

    #[test]
    fn garbage_is_a_parse_error() {
        let (_d, p) = file(BASE);
        let e = apply(&p, "hello\n", Direction::Apply, false).unwrap_err();
        assert!(matches!(e, PatchError::Empty | PatchError::Parse(_)), "{e}");
    }
}
