//! Whether gpuloop may read a file as code or configuration (or write one beside it), judged
//! as sudo judges sudoers and ssh an authorized_keys file: the file, its directory and every
//! directory above it owned by root or by the user gpuloop runs as, writable by no one else,
//! and the file itself no link. Run as root, that leaves only root's files: never one another
//! account could have written or swapped.
//!
//! Code gpuloop finds by name (recipes, modules) passes this rule whoever runs it. Files a
//! person or the environment names by path (a script, `--hosts-file`, config.toml, the REPL's
//! history and `:save`) pass it when gpuloop runs as root (`as_root`), where another account's
//! file would be a way to root; a user reads what they name as they name it.
//!
//! The path is walked one directory at a time with `openat` and `O_NOFOLLOW`, each step
//! checked on the opened descriptor (a link on the way followed only when root or the user
//! made it), and the file is read (or written) from the descriptor that was checked: nothing
//! can be swapped between the check and the read.

use crate::input::{Kind, ReadError};
use rustix::fs::{fstat, openat, FileType, Mode, OFlags, Stat, CWD};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Why a file may not be read (or written) as code or configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Distrust {
    #[error("{path} is owned by {owner}, not by root or {me} (the user gpuloop runs as)")]
    Owner {
        path: PathBuf,
        owner: String,
        me: String,
    },
    #[error("{path} is writable by {who} (mode {mode:04o}): {}", fix(path, *mode))]
    Writable {
        path: PathBuf,
        who: &'static str,
        mode: u32,
    },
    #[error("{path} is a symbolic link: gpuloop reads it only as the file itself, never through a link (name or copy the file it points to, or link its directory instead)")]
    Link { path: PathBuf },
    #[error("{path} is {what}, not a regular file")]
    NotFile { path: PathBuf, what: &'static str },
    #[error("{path}: {why}")]
    Unreadable { path: PathBuf, why: String },
}

/// How to mend a directory or file others may write.
fn fix(path: &Path, mode: u32) -> String {
    if mode & 0o1000 != 0 {
        // A sticky directory open to all (/tmp) cannot be closed: what is read goes elsewhere.
        "a directory anyone may write into is no place for what gpuloop reads: move it to one only root or you can write".into()
    } else {
        format!("chmod go-w {}", path.display())
    }
}

impl Distrust {
    /// Whether the file fails the rule itself (its owner, its mode, a link), rather than
    /// being no regular file or unreadable.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            Distrust::Owner { .. } | Distrust::Writable { .. } | Distrust::Link { .. }
        )
    }

    /// The rule a refusal is made under, for the end of its message.
    pub const RULE: &'static str = "gpuloop reads a recipe, a module (or, as root, any script or configuration) only when it and every directory above it are owned by root or by the user gpuloop runs as, and writable by no one else (as sudo and ssh require of their files)";
}

/// Who may own and write what gpuloop reads: root, and the user gpuloop runs as. A group a
/// site names (a team's recipe folder) would be one more field here, judged in `judge`.
#[derive(Debug, Clone, Copy)]
struct Rule {
    uid: u32,
}

impl Rule {
    fn current() -> Rule {
        Rule {
            uid: rustix::process::geteuid().as_raw(),
        }
    }
}

/// Whether files named by path pass the rule too: when gpuloop runs as root.
pub(crate) fn as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A directory that passed: it and every directory above it, opened at its real path (the
/// links on the way followed).
#[derive(Debug)]
pub(crate) struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens `dir` if it and the directories above it pass; `Ok(None)` when it does not exist.
    pub(crate) fn open(dir: &Path) -> Result<Option<Dir>, Distrust> {
        walk(dir, None, Rule::current())
    }

    /// Opens `dir`, making the directories of it that are missing (with `mode`), each made
    /// only inside one that passed.
    pub(crate) fn make(dir: &Path, mode: u32) -> Result<Dir, Distrust> {
        walk(dir, Some(mode), Rule::current())?.ok_or_else(|| Distrust::Unreadable {
            path: dir.to_path_buf(),
            why: "it went away while it was made".into(),
        })
    }

    /// The text of the file `name` in it, if it passes; `Ok(None)` when there is none.
    pub(crate) fn read(&self, name: &str, kind: Kind) -> Result<Option<String>, Distrust> {
        let path = self.path.join(name);
        match self.read_bytes(name, kind)? {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| Distrust::Unreadable {
                    path,
                    why: "not UTF-8 text".into(),
                }),
        }
    }

    fn read_bytes(&self, name: &str, kind: Kind) -> Result<Option<Vec<u8>>, Distrust> {
        let path = self.path.join(name);
        let Some(fd) = self.open_file(name, OFlags::RDONLY)? else {
            return Ok(None);
        };
        crate::input::opened(std::fs::File::from(fd), kind)
            .map(Some)
            .map_err(|e| Distrust::Unreadable {
                path,
                why: e.to_string(),
            })
    }

    /// Creates the file `name` (or, with `replace`, empties the one there, if it passes) with
    /// `mode`, and returns it open for writing.
    pub(crate) fn create(
        &self,
        name: &str,
        mode: u32,
        replace: bool,
    ) -> Result<std::fs::File, WriteError> {
        let path = self.path.join(name);
        let mut flags = OFlags::WRONLY | OFlags::CREATE;
        if !replace {
            flags |= OFlags::EXCL;
        }
        let fd = match openat(
            &self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => return Err(WriteError::Exists(path)),
            Err(rustix::io::Errno::LOOP) => return Err(Distrust::Link { path }.into()),
            // A FIFO no one reads, opened without waiting for a reader.
            Err(rustix::io::Errno::NXIO) => {
                return Err(Distrust::NotFile {
                    path,
                    what: "a FIFO",
                }
                .into())
            }
            Err(e) => return Err(unreadable(&path, e).into()),
        };
        let st = stat(&fd, &path)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Distrust::NotFile {
                path,
                what: what(st.st_mode),
            }
            .into());
        }
        judge(&path, &st, Rule::current(), false)?;
        // The umask may have taken bits off, never added; the mode is set again for a
        // group-writable umask (002).
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .and_then(|()| rustix::fs::ftruncate(&fd, 0))
            .map_err(|e| unreadable(&path, e))?;
        Ok(std::fs::File::from(fd))
    }

    /// The file `name` opened (no link followed, no FIFO waited on) and judged; `Ok(None)`
    /// when there is none.
    fn open_file(&self, name: &str, access: OFlags) -> Result<Option<OwnedFd>, Distrust> {
        let path = self.path.join(name);
        let fd = match openat(
            &self.fd,
            name,
            access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP) => return Err(Distrust::Link { path }),
            Err(e) => return Err(unreadable(&path, e)),
        };
        let st = stat(&fd, &path)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Distrust::NotFile {
                path,
                what: what(st.st_mode),
            });
        }
        judge(&path, &st, Rule::current(), false)?;
        Ok(Some(fd))
    }
}

/// Why a file could not be written through a `Dir`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error("{0}")]
    Refused(#[from] Distrust),
    /// There is one by that name, and it was not to be replaced.
    #[error("{} exists already", .0.display())]
    Exists(PathBuf),
}

/// The text of `dir/file`, if it and the directories above it pass; `Ok(None)` when the
/// directory or the file does not exist.
pub(crate) fn read(dir: &Path, file: &str, kind: Kind) -> Result<Option<String>, Distrust> {
    match Dir::open(dir)? {
        Some(d) => d.read(file, kind),
        None => Ok(None),
    }
}

/// `read` for a search along several directories (recipes, modules): a directory that does
/// not pass, with no `file` in it, hides nothing and is passed over (`Ok(None)`); one with a
/// `file` in it is refused, never passed over for the next of the same name.
pub(crate) fn lookup(dir: &Path, file: &str, kind: Kind) -> Result<Option<String>, Distrust> {
    match read(dir, file, kind) {
        // Only the name is looked at, never followed: a link is there as much as a file.
        Err(why) if std::fs::symlink_metadata(dir.join(file)).is_err() => {
            tracing::debug!("{}: {why}", dir.display());
            Ok(None)
        }
        r => r,
    }
}

/// Why a file named by path was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NamedError {
    #[error("{0}")]
    Read(#[from] ReadError),
    #[error("{0}{tail}", tail = if .0.is_refusal() { AS_ROOT } else { "" })]
    Refused(Distrust),
}

/// The rule for files named by path, for the end of a refusal's message.
const AS_ROOT: &str = "; run as root, gpuloop reads a file it is named only when the file and every directory above it are root's and writable by no one else, never through a link";

/// The bytes of a file a person or the environment names by path: as root, only when it
/// passes the rule (read from the descriptor that was judged); as anyone else, as
/// `input::file` reads every file.
pub(crate) fn named(path: &Path, kind: Kind) -> Result<Vec<u8>, NamedError> {
    if !as_root() {
        return Ok(crate::input::file(path, kind)?);
    }
    let not_found = || NamedError::Read(ReadError::Io(rustix::io::Errno::NOENT.into()));
    let (dir, name) = split(path).ok_or_else(|| {
        NamedError::Refused(Distrust::NotFile {
            path: path.to_path_buf(),
            what: "a directory",
        })
    })?;
    let dir = Dir::open(&dir)
        .map_err(NamedError::Refused)?
        .ok_or_else(not_found)?;
    dir.read_bytes(&name, kind)
        .map_err(NamedError::Refused)?
        .ok_or_else(not_found)
}

/// `dir` and the file name of `path` (`x.rhai` is in `.`); `None` for a path that names no
/// file (`/`, `..`).
pub(crate) fn split(path: &Path) -> Option<(PathBuf, String)> {
    let name = path.file_name()?.to_str()?.to_string();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Some((dir, name))
}

/// As root, stdin that is a file (`gpuloop run - < FILE`) passes the rule as that file:
/// owned by root and writable by no one else. A pipe or a terminal is what the person types
/// or pipes.
pub(crate) fn stdin_file() -> Result<(), Distrust> {
    if !as_root() {
        return Ok(());
    }
    let path = Path::new("<stdin>");
    let st = fstat(std::io::stdin()).map_err(|e| unreadable(path, e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(());
    }
    // Its name, for the message: where the shell opened it from.
    let named = std::fs::read_link("/proc/self/fd/0").unwrap_or_else(|_| path.to_path_buf());
    judge(&named, &st, Rule::current(), false)
}

/// The most symbolic links followed on one path, as the kernel allows (`ELOOP`).
const MAX_LINKS: usize = 40;

/// Opens `dir` one component at a time from `/`, judging each directory on its descriptor
/// (the ones missing made with `make`'s mode, inside one that passed; `Ok(None)` without it).
/// A symbolic link on the way (a config directory linked to a dotfiles checkout) is followed,
/// as ssh follows it, only when it is root's or the rule's user's: it lies in a directory
/// that passed, so no one else could have made or changed it.
fn walk(dir: &Path, make: Option<u32>, rule: Rule) -> Result<Option<Dir>, Distrust> {
    let named = |why: String| Distrust::Unreadable {
        path: dir.to_path_buf(),
        why,
    };
    let dir = if dir.is_relative() {
        std::env::current_dir()
            .map_err(|e| named(e.to_string()))?
            .join(dir)
    } else {
        dir.to_path_buf()
    };
    let mut todo = parts(&dir);
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = Path::new("/");
    let fd = openat(CWD, root, flags | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| unreadable(root, e))?;
    judge(root, &stat(&fd, root)?, rule, !todo.is_empty())?;
    // The directories opened so far, `/` first: `..` goes back one.
    let mut opened: Vec<(OwnedFd, PathBuf)> = vec![(fd, root.to_path_buf())];
    let (mut links, mut steps) = (0, 0);
    while let Some(part) = todo.pop_front() {
        // Each step opens, makes or follows one name; a path that keeps changing under the
        // walk ends it.
        steps += 1;
        if steps > 4 * (MAX_LINKS + 1) + dir.as_os_str().len() {
            return Err(named("it kept changing while it was walked".into()));
        }
        if part == ".." {
            if opened.len() > 1 {
                opened.pop();
            }
            continue;
        }
        let (at_fd, at) = opened.last().ok_or_else(|| named("no directory".into()))?;
        let path = at.join(&part);
        let fd = match openat(at_fd, &part, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => {
                let Some(mode) = make else {
                    return Ok(None);
                };
                mkdir(at_fd, &part, &path, mode, rule)?;
                todo.push_front(part);
                continue;
            }
            Err(e) => return Err(unreadable(&path, e)),
        };
        let st = stat(&fd, &path)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(unreadable(&path, rustix::io::Errno::LOOP));
                }
                // Who made the link, in a directory that passed: root or the rule's user.
                let owner = st.st_uid;
                if owner != 0 && owner != rule.uid {
                    return Err(Distrust::Owner {
                        path,
                        owner: crate::process::user_name(owner),
                        me: crate::process::user_name(rule.uid),
                    });
                }
                let target = rustix::fs::readlinkat(at_fd, &part, Vec::new())
                    .map_err(|e| unreadable(&path, e))?;
                let target = Path::new(std::ffi::OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    opened.truncate(1);
                }
                for p in parts(target).into_iter().rev() {
                    todo.push_front(p);
                }
            }
            FileType::Directory => {
                judge(&path, &st, rule, !todo.is_empty())?;
                opened.push((fd, path));
            }
            _ => {
                return Err(Distrust::NotFile {
                    path,
                    what: "a file where a directory is named",
                })
            }
        }
    }
    Ok(opened.pop().map(|(fd, path)| Dir { fd, path }))
}

/// The names of a path, `..` kept: a link's target is resolved by the walk, not as text.
fn parts(path: &Path) -> std::collections::VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Makes the directory `part` in `at` (which passed) with `mode`, set again after: the umask
/// may have taken bits off.
fn mkdir(
    at: &OwnedFd,
    part: &OsString,
    path: &Path,
    mode: u32,
    rule: Rule,
) -> Result<(), Distrust> {
    match rustix::fs::mkdirat(at, part, Mode::from_raw_mode(mode)) {
        Ok(()) => {}
        // Made since it was looked for: it is judged as any other.
        Err(rustix::io::Errno::EXIST) => return Ok(()),
        Err(e) => return Err(unreadable(path, e)),
    }
    let made = openat(
        at,
        part,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| unreadable(path, e))?;
    if stat(&made, path)?.st_uid == rule.uid {
        rustix::fs::fchmod(&made, Mode::from_raw_mode(mode)).map_err(|e| unreadable(path, e))?;
    }
    Ok(())
}

fn unreadable(path: &Path, e: rustix::io::Errno) -> Distrust {
    Distrust::Unreadable {
        path: path.to_path_buf(),
        why: std::io::Error::from(e).to_string(),
    }
}

fn stat(fd: &OwnedFd, path: &Path) -> Result<Stat, Distrust> {
    fstat(fd).map_err(|e| unreadable(path, e))
}

/// What a file that is no regular file is, for messages.
fn what(mode: u32) -> &'static str {
    match FileType::from_raw_mode(mode) {
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "not a regular file",
    }
}

/// Owned by root or the rule's user, writable by no one else. A directory above the one read
/// from may be open to all when it is root's and sticky (`/tmp`): there no one can rename or
/// remove what is not theirs.
fn judge(path: &Path, st: &Stat, rule: Rule, above: bool) -> Result<(), Distrust> {
    let owner = st.st_uid;
    if owner != 0 && owner != rule.uid {
        return Err(Distrust::Owner {
            path: path.to_path_buf(),
            owner: crate::process::user_name(owner),
            me: crate::process::user_name(rule.uid),
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
    use crate::input::SCRIPT;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_file_open_to_others_or_behind_a_link_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("recipes");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o755);
        std::fs::write(dir.join("ok.rhai"), "1").unwrap();
        chmod(&dir.join("ok.rhai"), 0o644);
        assert_eq!(read(&dir, "ok.rhai", SCRIPT), Ok(Some("1".into())));
        assert_eq!(read(&dir, "none.rhai", SCRIPT), Ok(None));
        assert_eq!(read(&t.path().join("nowhere"), "ok.rhai", SCRIPT), Ok(None));

        chmod(&dir.join("ok.rhai"), 0o666);
        let e = read(&dir, "ok.rhai", SCRIPT).unwrap_err();
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

        // A sticky directory open to all is no place for what gpuloop reads, even its own.
        chmod(&dir, 0o1777);
        let e = read(&dir, "ok.rhai", SCRIPT).unwrap_err();
        assert!(matches!(e, Distrust::Writable { .. }), "{e}");
        assert!(
            e.to_string().contains("no place for what gpuloop reads"),
            "{e}"
        );
        // A directory that does not pass, without the file: nothing is hidden there.
        assert_eq!(lookup(&dir, "none.rhai", SCRIPT), Ok(None));
        assert!(lookup(&dir, "ok.rhai", SCRIPT).is_err());
        chmod(&dir, 0o775);
        assert!(matches!(
            read(&dir, "ok.rhai", SCRIPT),
            Err(Distrust::Writable {
                who: "its group",
                ..
            })
        ));
        chmod(&dir, 0o755);

        std::os::unix::fs::symlink(dir.join("ok.rhai"), dir.join("link.rhai")).unwrap();
        assert!(matches!(
            read(&dir, "link.rhai", SCRIPT),
            Err(Distrust::Link { .. })
        ));
        std::fs::create_dir(dir.join("d.rhai")).unwrap();
        assert!(matches!(
            read(&dir, "d.rhai", SCRIPT),
            Err(Distrust::NotFile {
                what: "a directory",
                ..
            })
        ));
    }

    #[test]
    fn links_on_the_way_are_followed_and_judged_where_they_lead() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        std::fs::write(real.join("sub/m.rhai"), "1").unwrap();
        // A link of our own to a directory that passes, relative, with `..` in it.
        std::os::unix::fs::symlink("real/sub/../sub", t.path().join("via")).unwrap();
        let d = Dir::open(&t.path().join("via")).unwrap().unwrap();
        assert_eq!(
            d.path.as_path(),
            std::fs::canonicalize(real.join("sub")).unwrap()
        );
        assert_eq!(d.read("m.rhai", SCRIPT), Ok(Some("1".into())));
        // Where it leads is judged: there, a directory others may write.
        chmod(&real, 0o777);
        assert!(matches!(
            Dir::open(&t.path().join("via")),
            Err(Distrust::Writable { .. })
        ));
        chmod(&real, 0o755);
        // A loop of links ends.
        std::os::unix::fs::symlink("b", t.path().join("a")).unwrap();
        std::os::unix::fs::symlink("a", t.path().join("b")).unwrap();
        assert!(Dir::open(&t.path().join("a")).is_err());
        // A file where a directory is named.
        assert!(matches!(
            Dir::open(&real.join("sub/m.rhai")),
            Err(Distrust::NotFile { .. })
        ));
        // Made through a link: inside where it leads.
        let made = Dir::make(&t.path().join("via/new/deeper"), 0o755).unwrap();
        assert_eq!(
            made.path.as_path(),
            std::fs::canonicalize(real.join("sub/new/deeper")).unwrap()
        );
    }

    #[test]
    fn directories_are_made_and_files_written_only_where_they_pass() {
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("a/b/c");
        let d = Dir::make(&deep, 0o700).unwrap();
        for p in [t.path().join("a"), t.path().join("a/b"), deep.clone()] {
            let m = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
            assert_eq!(m, 0o700, "{}", p.display());
        }
        use std::io::Write;
        d.create("f", 0o644, false)
            .unwrap()
            .write_all(b"one")
            .unwrap();
        assert!(matches!(
            d.create("f", 0o644, false),
            Err(WriteError::Exists(_))
        ));
        d.create("f", 0o644, true)
            .unwrap()
            .write_all(b"two")
            .unwrap();
        assert_eq!(std::fs::read_to_string(deep.join("f")).unwrap(), "two");
        assert!(
            d.open_file("f", OFlags::RDONLY).unwrap().is_some()
                && d.open_file("g", OFlags::RDONLY).unwrap().is_none()
        );
        // Never through a link, never into a directory others may write.
        let target = t.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, deep.join("l")).unwrap();
        assert!(matches!(
            d.create("l", 0o644, true),
            Err(WriteError::Refused(Distrust::Link { .. }))
        ));
        assert!(matches!(
            d.open_file("l", OFlags::RDONLY).map(|f| f.is_some()),
            Err(Distrust::Link { .. })
        ));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        chmod(&t.path().join("a"), 0o777);
        assert!(matches!(
            Dir::make(&deep.join("d"), 0o755),
            Err(Distrust::Writable { .. })
        ));
        assert!(!deep.join("d").exists());
    }
}
