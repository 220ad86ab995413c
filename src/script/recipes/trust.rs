//! Whether a recipe file may run by name, judged as sudo judges sudoers and ssh an
//! authorized_keys file: the file, its directory and every directory above it owned by root
//! or by the user gpuloop runs as, and writable by no one else. Run as root, that leaves only
//! root's files: never a recipe another user could have written or swapped.
//!
//! The path is walked one directory at a time with `openat` and `O_NOFOLLOW`, each step
//! checked on the opened descriptor, and the file is read from the descriptor that was
//! checked: nothing can be swapped between the check and the read.

use rustix::fs::{fstat, openat, FileType, Mode, OFlags, Stat, CWD};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// Why a recipe may not run by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Distrust {
    #[error("{path} is owned by {owner}, not by root or {me} (the user gpuloop runs as)")]
    Owner {
        path: PathBuf,
        owner: String,
        me: String,
    },
    #[error("{path} is writable by {who} (mode {mode:04o}): chmod go-w {path}")]
    Writable {
        path: PathBuf,
        who: &'static str,
        mode: u32,
    },
    #[error("{path} is a symbolic link: a recipe is run only from the file itself (copy it there, or link its directory)")]
    Link { path: PathBuf },
    #[error("{path} is {what}, not a file")]
    NotFile { path: PathBuf, what: &'static str },
    #[error("{path}: {why}")]
    Unreadable { path: PathBuf, why: String },
}

impl Distrust {
    /// The rule a refusal is made under, for the end of its message.
    pub const RULE: &'static str = "a recipe runs by name only when it and every directory above it are owned by root or by the user gpuloop runs as, and writable by no one else (as sudo and ssh require of their files)";
}

/// The bytes of `dir/file`, if it and the directories above it pass; `Ok(None)` when the
/// directory or the file does not exist.
pub(crate) fn read(dir: &Path, file: &str) -> Result<Option<String>, Distrust> {
    let uid = rustix::process::geteuid().as_raw();
    let Some(dir_fd) = open_dir(dir, uid)? else {
        return Ok(None);
    };
    let path = dir.join(file);
    let unreadable = |why: String| Distrust::Unreadable {
        path: path.clone(),
        why,
    };
    let fd = match openat(
        &dir_fd,
        file,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::LOOP) => return Err(Distrust::Link { path }),
        Err(e) => return Err(unreadable(e.to_string())),
    };
    let st = fstat(&fd).map_err(|e| unreadable(e.to_string()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        let f = std::fs::File::from(fd);
        let what = f.metadata().map_or("not a regular file", |m| {
            crate::input::kind_of(m.file_type())
        });
        return Err(Distrust::NotFile { path, what });
    }
    judge(&path, &st, uid, false)?;
    let bytes = crate::input::opened(std::fs::File::from(fd), crate::input::SCRIPT)
        .map_err(|e| unreadable(e.to_string()))?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| unreadable("not UTF-8 text".into()))
}

/// Opens `dir` one component at a time from `/`, judging each on its descriptor.
fn open_dir(dir: &Path, uid: u32) -> Result<Option<OwnedFd>, Distrust> {
    // Links in the path the person gave (a config directory linked to a dotfiles checkout)
    // are resolved first, as ssh does; every directory of the resolved path is then judged.
    let real = match std::fs::canonicalize(dir) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Distrust::Unreadable {
                path: dir.to_path_buf(),
                why: e.to_string(),
            })
        }
    };
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let unreadable = |path: &Path, e: rustix::io::Errno| Distrust::Unreadable {
        path: path.to_path_buf(),
        why: e.to_string(),
    };
    let root = Path::new("/");
    let mut fd = openat(CWD, root, flags, Mode::empty()).map_err(|e| unreadable(root, e))?;
    let mut at = PathBuf::from("/");
    let parts: Vec<&std::ffi::OsStr> = real
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            _ => None,
        })
        .collect();
    judge(&at, &stat(&fd, &at)?, uid, !parts.is_empty())?;
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        fd = match openat(&fd, *part, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            // Replaced by a link after it was resolved.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return Err(Distrust::Link { path: at })
            }
            Err(e) => return Err(unreadable(&at, e)),
        };
        judge(&at, &stat(&fd, &at)?, uid, i + 1 < parts.len())?;
    }
    Ok(Some(fd))
}

fn stat(fd: &OwnedFd, path: &Path) -> Result<Stat, Distrust> {
    fstat(fd).map_err(|e| Distrust::Unreadable {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// Owned by root or `uid`, writable by no one else. A directory above the recipe directory
/// may be open to all when it is root's and sticky (`/tmp`): there no one can rename or
/// remove what is not theirs.
fn judge(path: &Path, st: &Stat, uid: u32, above: bool) -> Result<(), Distrust> {
    let owner = st.st_uid;
    if owner != 0 && owner != uid {
        return Err(Distrust::Owner {
            path: path.to_path_buf(),
            owner: crate::process::user_name(owner),
            me: crate::process::user_name(uid),
        });
    }
    let mode = st.st_mode & 0o7777;
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !(above && sticky && owner == 0) {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "its group and others",
            (true, false) => "its group",
            _ => "others",
        };
        return Err(Distrust::Writable {
            path: path.to_path_buf(),
            who,
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_recipe_open_to_others_or_behind_a_link_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("recipes");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o755);
        std::fs::write(dir.join("ok.rhai"), "1").unwrap();
        chmod(&dir.join("ok.rhai"), 0o644);
        assert_eq!(read(&dir, "ok.rhai"), Ok(Some("1".into())));
        assert_eq!(read(&dir, "none.rhai"), Ok(None));
        assert_eq!(read(&t.path().join("nowhere"), "ok.rhai"), Ok(None));

        chmod(&dir.join("ok.rhai"), 0o666);
        let e = read(&dir, "ok.rhai").unwrap_err();
        assert!(
            matches!(
                e,
                Distrust::Writable {
                    who: "its group and others",
                    mode: 0o666,
                    ..
                }
            ),
            "{e}"
        );
        chmod(&dir.join("ok.rhai"), 0o644);

        // A sticky directory open to all is no place for recipes, even one of our own.
        chmod(&dir, 0o1777);
        assert!(matches!(
            read(&dir, "ok.rhai"),
            Err(Distrust::Writable { .. })
        ));
        chmod(&dir, 0o775);
        assert!(matches!(
            read(&dir, "ok.rhai"),
            Err(Distrust::Writable {
                who: "its group",
                ..
            })
        ));
        chmod(&dir, 0o755);

        std::os::unix::fs::symlink(dir.join("ok.rhai"), dir.join("link.rhai")).unwrap();
        assert!(matches!(
            read(&dir, "link.rhai"),
            Err(Distrust::Link { .. })
        ));
        std::fs::create_dir(dir.join("d.rhai")).unwrap();
        assert!(matches!(
            read(&dir, "d.rhai"),
            Err(Distrust::NotFile {
                what: "a directory",
                ..
            })
        ));
    }
}
