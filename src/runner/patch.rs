//! Unified diffs applied to (or reverted from) files, all or nothing, with a precise error
//! when a hunk does not match: the patch half of a patch-and-rerun loop.

use diffy::patch_set::{FileOperation, ParseOptions, PatchKind, PatchSet};
use diffy::{Line, Patch};
use rustix::fs::{
    fchmod, fchown, fstat, openat, renameat, renameat_with, statat, unlinkat, AtFlags, FileType,
    Mode, OFlags, RenameFlags, Stat,
};
use rustix::io::Errno;
use std::borrow::Cow;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// The largest file apply_patch reads: a diff is for source and config files, and a file
/// that is larger (or endless, like /dev/zero behind a link) is refused, never read whole.
pub(crate) const MAX_FILE: u64 = 64 << 20;

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
    // Every path is checked (and its directory opened) before any hunk: a path outside the
    // directory is the error.
    let places = changes
        .iter()
        .map(|change| match (&change.path, is_dir) {
            (Some(p), true) => Place::inside(target, p),
            (None, true) => Err(PatchError::Unsupported(format!(
                "the diff names no file; give the file to patch, not the directory {}",
                target.display()
            ))),
            (_, false) => Place::file(target),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut planned: Vec<(Place, Option<String>)> = Vec::new();
    let mut hunks = 0;
    for (change, mut place) in changes.iter().zip(places) {
        let (create, delete) = match direction {
            Direction::Apply => (change.create, change.delete),
            Direction::Revert => (change.delete, change.create),
        };
        let patch = match direction {
            Direction::Apply => Cow::Borrowed(&change.patch),
            Direction::Revert => Cow::Owned(change.patch.reverse()),
        };
        let shown = place.shown.display().to_string();
        let base = if create {
            if place.exists() {
                return Err(PatchError::Io {
                    path: shown,
                    why: "the diff creates this file, but it already exists".into(),
                });
            }
            String::new()
        } else {
            place.read()?
        };
        let new = diffy::apply(&base, &patch).map_err(|e| {
            let n = hunk_number(&e.to_string());
            hunk_error(&shown, &base, &patch, n, &change.patch, direction)
        })?;
        hunks += patch.hunks().len();
        planned.push((place, (!delete).then_some(new)));
    }
    if !dry_run {
        write_all(&planned)?;
    }
    Ok(Applied {
        files: planned.into_iter().map(|(p, _)| p.shown).collect(),
        hunks,
    })
}

/// A file to patch: its directory, opened once, and its name there. Every read and write
/// goes through that directory's descriptor, never by path again, so a directory swapped for
/// a symbolic link after the check changes nothing: what was opened is what is written.
struct Place {
    dir: OwnedFd,
    name: String,
    /// The path as the user sees it, for messages and the result.
    shown: PathBuf,
    /// The file as it was read: checked again when it is replaced, and its owner, group
    /// and mode given to the new file.
    was: Option<Stat>,
}

impl Place {
    /// `dir`/`rel`, refused when it would leave `dir`: an absolute path, a `..` component, or
    /// a symbolic link anywhere on the way (even one that stays inside: it could be swapped).
    /// Diffs come from tools and LLM fixers; a header like `+++ b/../../etc/profile` must not
    /// write anywhere but inside the directory.
    fn inside(dir: &Path, rel: &str) -> Result<Place, PatchError> {
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
        let mut names: Vec<&str> = p
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => n.to_str(),
                _ => None,
            })
            .collect();
        let Some(name) = names.pop() else {
            return Err(outside("no file"));
        };
        let mut fd = open_dir(rustix::fs::CWD, dir, true).map_err(|e| io_err(dir, e))?;
        for (i, n) in names.iter().enumerate() {
            fd = open_dir(&fd, Path::new(n), false).map_err(|e| match e {
                Errno::LOOP => outside(&format!(
                    "which goes through the symbolic link {}",
                    names[..=i].join("/")
                )),
                e => io_err(&dir.join(names[..=i].join("/")), e),
            })?;
        }
        Ok(Place {
            dir: fd,
            name: name.to_string(),
            shown: dir.join(p),
            was: None,
        })
    }

    /// The file `path` itself (the diff's names are ignored): its directory is the user's to
    /// name, the file must not be a link.
    fn file(path: &Path) -> Result<Place, PatchError> {
        let (Some(name), parent) = (path.file_name().and_then(|n| n.to_str()), path.parent())
        else {
            return Err(io_err(path, Errno::ISDIR));
        };
        let parent = match parent {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Ok(Place {
            dir: open_dir(rustix::fs::CWD, parent, true).map_err(|e| io_err(parent, e))?,
            name: name.to_string(),
            shown: path.to_path_buf(),
            was: None,
        })
    }

    fn io(&self, e: Errno) -> PatchError {
        io_err(&self.shown, e)
    }

    /// The name's entry, the entry itself (a link is not followed).
    fn stat(&self) -> Result<Option<Stat>, PatchError> {
        match statat(&self.dir, self.name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(self.io(e)),
        }
    }

    fn exists(&self) -> bool {
        !matches!(self.stat(), Ok(None))
    }

    /// Reads the file, which must be a regular file (a link is refused and left a link; a
    /// FIFO is refused at once, never waited on) of at most [`MAX_FILE`] bytes of UTF-8.
    fn read(&mut self) -> Result<String, PatchError> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd =
            openat(&self.dir, self.name.as_str(), flags, Mode::empty()).map_err(|e| match e {
                Errno::LOOP => self.refuse(
                    "a symbolic link; only regular files are patched (nothing was written)",
                ),
                e => self.io(e),
            })?;
        let st = fstat(&fd).map_err(|e| self.io(e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(self.refuse("not a regular file; only regular files are patched"));
        }
        if st.st_size as u64 > MAX_FILE {
            return Err(self.too_big());
        }
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| PatchError::Io {
                path: self.shown.display().to_string(),
                why: e.to_string(),
            })?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(self.too_big());
        }
        self.was = Some(st);
        String::from_utf8(bytes)
            .map_err(|_| self.refuse("not UTF-8 text; only text files can be patched"))
    }

    fn refuse(&self, why: &str) -> PatchError {
        PatchError::Io {
            path: self.shown.display().to_string(),
            why: why.into(),
        }
    }

    fn too_big(&self) -> PatchError {
        self.refuse(&format!(
            "larger than {} MiB; only files up to that size are patched",
            MAX_FILE >> 20
        ))
    }

    /// `.NAME.gpuloop-patch`, beside the file.
    fn temp_name(&self) -> String {
        format!(".{}.gpuloop-patch", self.name)
    }

    /// Writes `content` to the temporary beside the file, with the file's owner, group and
    /// mode (root patching another user's file leaves it theirs).
    fn write_temp(&self, content: &str) -> Result<(), PatchError> {
        let tmp = self.temp_name();
        // A temporary left by an earlier crash (or planted: it is removed, never followed).
        match unlinkat(&self.dir, tmp.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(self.io(e)),
        }
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mode = if self.was.is_some() { 0o600 } else { 0o666 };
        let fd = openat(&self.dir, tmp.as_str(), flags, Mode::from_raw_mode(mode))
            .map_err(|e| self.io(e))?;
        let kept = self.was.as_ref().map_or(Ok(()), |was| {
            // The owner first: a chown clears the set-id bits that the mode then restores.
            // Only root may give a file away; anyone else keeps their own new file.
            match fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(was.st_uid)),
                Some(rustix::fs::Gid::from_raw(was.st_gid)),
            ) {
                Ok(()) | Err(Errno::PERM) => {}
                Err(e) => return Err(e),
            }
            fchmod(&fd, Mode::from_raw_mode(was.st_mode & 0o7777))
        });
        let mut file = std::fs::File::from(fd);
        let written = kept
            .map_err(std::io::Error::from)
            .and_then(|()| std::io::Write::write_all(&mut file, content.as_bytes()));
        if let Err(e) = written {
            self.remove_temp();
            return Err(PatchError::Io {
                path: self.shown.display().to_string(),
                why: e.to_string(),
            });
        }
        Ok(())
    }

    fn remove_temp(&self) {
        let _ = unlinkat(&self.dir, self.temp_name().as_str(), AtFlags::empty());
    }

    /// True if the name is still the very file that was read (or, for a new file, nothing).
    fn unchanged(&self) -> Result<bool, PatchError> {
        Ok(match (&self.was, self.stat()?) {
            (Some(was), Some(now)) => was.st_ino == now.st_ino && was.st_dev == now.st_dev,
            (None, None) => true,
            _ => false,
        })
    }

    fn changed(&self) -> PatchError {
        self.refuse("it changed while it was being patched (replaced, or turned into a link); it was left as it is")
    }

    /// Puts the temporary in the file's place. An existing file is exchanged with it
    /// atomically and what came out is checked to be the file that was read (a link or
    /// another file swapped in meanwhile is put back); a new file never replaces anything.
    fn commit(&self) -> Result<(), PatchError> {
        let (tmp, name) = (self.temp_name(), self.name.as_str());
        if self.was.is_none() {
            return match renameat_with(
                &self.dir,
                tmp.as_str(),
                &self.dir,
                name,
                RenameFlags::NOREPLACE,
            ) {
                Ok(()) => Ok(()),
                Err(Errno::EXIST) => Err(self.changed()),
                Err(Errno::INVAL | Errno::NOSYS) if !self.exists() => {
                    renameat(&self.dir, tmp.as_str(), &self.dir, name).map_err(|e| self.io(e))
                }
                Err(e) => Err(self.io(e)),
            };
        }
        match renameat_with(
            &self.dir,
            tmp.as_str(),
            &self.dir,
            name,
            RenameFlags::EXCHANGE,
        ) {
            Ok(()) => {
                let out = statat(&self.dir, tmp.as_str(), AtFlags::SYMLINK_NOFOLLOW);
                let same = matches!((&out, &self.was), (Ok(o), Some(w)) if o.st_ino == w.st_ino && o.st_dev == w.st_dev);
                if !same {
                    let _ = renameat_with(
                        &self.dir,
                        tmp.as_str(),
                        &self.dir,
                        name,
                        RenameFlags::EXCHANGE,
                    );
                    self.remove_temp();
                    return Err(self.changed());
                }
                self.remove_temp();
                Ok(())
            }
            // A file system without exchange: check, then rename (a narrow window remains).
            Err(Errno::INVAL | Errno::NOSYS) => {
                if !self.unchanged()? {
                    self.remove_temp();
                    return Err(self.changed());
                }
                renameat(&self.dir, tmp.as_str(), &self.dir, name).map_err(|e| self.io(e))
            }
            Err(e) => Err(self.io(e)),
        }
    }

    /// Removes the file the diff deletes, if it is still the file that was read.
    fn delete(&self) -> Result<(), PatchError> {
        if !self.unchanged()? {
            return Err(self.changed());
        }
        unlinkat(&self.dir, self.name.as_str(), AtFlags::empty()).map_err(|e| self.io(e))
    }
}

/// Opens a directory: the user's own path follows links (`follow`), a component of a diff's
/// path never does.
fn open_dir(at: impl std::os::fd::AsFd, path: &Path, follow: bool) -> Result<OwnedFd, Errno> {
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    match openat(&at, path, flags, Mode::empty()) {
        // O_DIRECTORY with O_NOFOLLOW on a link says ENOTDIR on some kernels: tell it apart.
        Err(Errno::NOTDIR) if !follow => match statat(&at, path, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => Err(Errno::LOOP),
            _ => Err(Errno::NOTDIR),
        },
        r => r,
    }
}

fn io_err(path: &Path, e: Errno) -> PatchError {
    PatchError::Io {
        path: path.display().to_string(),
        why: std::io::Error::from(e).to_string(),
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

/// Writes every new file to a temporary beside it first, then puts them all in place: a
/// failure before that leaves every file as it was.
fn write_all(planned: &[(Place, Option<String>)]) -> Result<(), PatchError> {
    let mut temps: Vec<&Place> = Vec::new();
    for (place, content) in planned {
        let Some(content) = content else { continue };
        if let Err(e) = place.write_temp(content) {
            temps.iter().for_each(|p| p.remove_temp());
            return Err(e);
        }
        temps.push(place);
    }
    for (i, place) in temps.iter().enumerate() {
        if let Err(e) = place.commit() {
            temps[i..].iter().for_each(|p| p.remove_temp());
            return Err(e);
        }
    }
    for (place, content) in planned {
        if content.is_none() {
            place.delete()?;
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

    /// `+++ b/../outside.txt` and absolute paths once wrote outside the tree.
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
        // Inside is fine, also through ./; a link is refused even where it stays inside
        // (it could point elsewhere by the time the file is written).
        let diff = format!("--- a/./f.txt\n+++ b/./f.txt\n{hunk}");
        assert_eq!(
            apply(&dir, &diff, Direction::Apply, false).unwrap().hunks,
            1
        );
        std::os::unix::fs::symlink(&dir, dir.join("here")).unwrap();
        let diff = format!("--- a/here/f.txt\n+++ b/here/f.txt\n{hunk}");
        let e = apply(&dir, &diff, Direction::Revert, false).unwrap_err();
        assert!(e.to_string().contains("symbolic link here"), "{e}");
    }

    /// A directory swapped for a symbolic link while apply_patch runs: the path was checked,
    /// then written by name, so writes landed outside the tree.
    #[test]
    fn apply_patch_through_a_swapped_directory_never_writes_outside() {
        use rustix::fs::{renameat_with, RenameFlags, CWD};
        use std::os::unix::fs::MetadataExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let top = tempfile::tempdir().unwrap();
        let (tree, outside) = (top.path().join("tree"), top.path().join("outside"));
        let (sub, aside) = (tree.join("sub"), tree.join("aside"));
        for d in [&sub, &outside] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("f.txt"), BASE).unwrap();
        }
        std::os::unix::fs::symlink(&outside, &aside).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let before = ino(&outside.join("f.txt"));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        // Swaps `sub` (the directory) and `aside` (a link out of the tree) atomically, as
        // fast as it can: `sub` is always there, one or the other.
        let swapper = {
            let (done, sub, aside) = (done.clone(), sub.clone(), aside.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let _ = renameat_with(CWD, &sub, CWD, &aside, RenameFlags::EXCHANGE);
                }
            })
        };
        let forward = "--- a/sub/f.txt\n+++ b/sub/f.txt\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n";
        // Up to 10,000 tries, stopping at the first write outside.
        for _ in 0..5_000 {
            let _ = apply(&tree, forward, Direction::Apply, false);
            let _ = apply(&tree, forward, Direction::Revert, false);
            if ino(&outside.join("f.txt")) != before {
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let names: Vec<_> = std::fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.txt")]);
        // A write replaces the file: the one outside must be the very file it was.
        assert_eq!(
            ino(&outside.join("f.txt")),
            before,
            "a patch replaced the file outside"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("f.txt")).unwrap(),
            BASE
        );
    }

    /// A link in the tree, even one that stays inside, is refused and left a link.
    #[test]
    fn apply_patch_refuses_a_symbolic_link_and_keeps_it_a_link() {
        let (d, p) = file(BASE);
        let link = d.path().join("link.txt");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        std::os::unix::fs::symlink(d.path().join("dir"), d.path().join("dirlink")).unwrap();
        std::fs::write(d.path().join("dir/f.txt"), BASE).unwrap();
        let hunk = "@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n";
        for (target, name) in [
            (d.path().to_path_buf(), "link.txt"),
            (d.path().to_path_buf(), "dirlink/f.txt"),
            (link.clone(), "link.txt"),
        ] {
            let diff = format!("--- a/{name}\n+++ b/{name}\n{hunk}");
            let e = apply(&target, &diff, Direction::Apply, false).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{name}: {e}");
        }
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), BASE);
        assert_eq!(
            std::fs::read_to_string(d.path().join("dir/f.txt")).unwrap(),
            BASE
        );
    }

    /// Root patching another user's file left it owned by root.
    #[test]
    fn apply_patch_as_root_keeps_the_files_owner_and_mode() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: only root can patch another user's file");
            return;
        }
        let (_d, p) = file(BASE);
        std::os::unix::fs::chown(&p, Some(65534), Some(65533)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        apply(&p, DIFF, Direction::Apply, false).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 65533, 0o640));
        apply(&p, DIFF, Direction::Revert, false).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65533));
    }

    /// A FIFO is refused at once, never waited on.
    #[test]
    fn apply_patch_refuses_a_fifo() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("f.txt");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, Mode::from_raw_mode(0o600)).unwrap();
        let e = apply(d.path(), DIFF, Direction::Apply, false).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn garbage_is_a_parse_error() {
        let (_d, p) = file(BASE);
        let e = apply(&p, "hello\n", Direction::Apply, false).unwrap_err();
        assert!(matches!(e, PatchError::Empty | PatchError::Parse(_)), "{e}");
    }
}
