//! Which processes are protected GPU daemons: a name only claims it; who runs the process and
//! who installed the program it runs prove it.
//!
//! Any user can start a process whose comm or argv[0] is `nvidia-persistenced`. Were the name
//! enough, that process would block every reset without `--force`, hide from a clean, and
//! make the memory it holds read as a daemon's (clean). So a process that goes by a protected
//! name (`kill::is_named`) is a protected daemon only when one of these holds:
//!
//! 1. every uid it has (real, effective, saved) is root's, and the file it runs is root's,
//!    writable by no one else, in a directory that is root's and writable by no one else;
//! 2. every uid it has is root's or a system account's (below 1000: nvidia-persistenced drops
//!    to its own account), and the file it runs is such a root-installed file *named* as a
//!    protected daemon (a system account can run `/usr/bin/sleep` under any argv[0]; it
//!    cannot name a root-owned file);
//! 3. its uids are as in 2, and it is the main process of a systemd system unit, as systemd
//!    itself says (`MainPID`);
//! 4. for a gpuloop not run as root, every uid it has is the invoker's own: no one else chose
//!    its name (a person's own X server or MPS daemon is kept from their own clean).
//!
//! The file is the one the kernel runs (`/proc/PID/exe`); its path, as the kernel records it,
//! is looked up inside the process's own root (`/proc/PID/root`: a container's image for a
//! DaemonSet's dcgm-exporter) one directory at a time, following no link, and the file found
//! there must be the same inode. Nothing of it is opened for reading, followed or run. Where
//! the kernel hides a process's executable from this gpuloop (another user's process, for a
//! gpuloop not run as root), rule 1 rests on the uids alone: only root makes a process whose
//! every uid is root's.
//!
//! A process that claims a name without proof is what its evidence says (compute or
//! observer): kill and clean stop it when they target it, a reset stops it as any client
//! (without `--force`), and it is never started again.

use super::identity::ProcDir;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use std::os::fd::OwnedFd;

/// The first uid of a person's account; below it (root apart), system accounts
/// (login.defs' `SYS_UID_MAX` is 999 on Debian, Ubuntu, RHEL and SUSE).
const FIRST_PERSON_UID: u32 = 1000;

/// True if `dir`'s process goes by one of the protected `names` and the claim is proven (see
/// the module's rules).
pub(crate) fn is_protected<S: AsRef<str>>(
    dir: &ProcDir,
    comm: &str,
    cmdline: &str,
    names: &[S],
) -> bool {
    super::kill::is_named(comm, cmdline, names) && proven(dir, names)
}

/// `is_protected` for the process a scan found at `pid` with start time `start`: false when
/// that process is gone (whatever has the pid now is not the one found).
pub(crate) fn is_protected_pid<S: AsRef<str>>(
    pid: i32,
    start: u64,
    comm: &str,
    cmdline: &str,
    names: &[S],
) -> bool {
    if !super::kill::is_named(comm, cmdline, names) {
        return false;
    }
    let Ok(dir) = ProcDir::open(pid) else {
        return false;
    };
    dir.stat().is_ok_and(|p| p.start == start) && proven(&dir, names)
}

/// Whether `dir`'s process is what its protected name says: the module's rules 1 to 4.
pub(crate) fn proven<S: AsRef<str>>(dir: &ProcDir, names: &[S]) -> bool {
    let me = rustix::process::geteuid().as_raw();
    let Ok(uids) = dir.uids() else {
        return false;
    };
    match Owner::of(uids, me) {
        Owner::Other => false,
        Owner::Invoker => true,
        owner => decide(owner, &Program::of(dir), names) || unit_main(dir),
    }
}

/// Who a process runs as, as far as proof goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Every uid is root's.
    Root,
    /// Every uid is the invoker's, a gpuloop not run as root.
    Invoker,
    /// Every uid is root's or a system account's (some of them not root's).
    System,
    /// Any other: no name it takes is proof of anything.
    Other,
}

impl Owner {
    fn of(uids: [u32; 3], me: u32) -> Owner {
        if uids.iter().all(|&u| u == 0) {
            Owner::Root
        } else if me != 0 && uids.iter().all(|&u| u == me) {
            Owner::Invoker
        } else if uids.iter().all(|&u| u < FIRST_PERSON_UID) {
            Owner::System
        } else {
            Owner::Other
        }
    }
}

/// What /proc shows of the file a process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Program {
    /// The kernel does not show it to this gpuloop (another user's process, without root).
    Hidden,
    /// A file root installed: root's, writable by no one else, in a root-owned directory
    /// writable by no one else; `name` is its name there.
    Installed { name: String },
    /// Anything else: another owner, a writable file or directory, a path that does not lead
    /// back to the same file, a process that runs no file.
    Other,
}

impl Program {
    fn of(dir: &ProcDir) -> Program {
        match installed(dir) {
            Ok(Some(name)) => Program::Installed { name },
            Ok(None) => Program::Other,
            Err(rustix::io::Errno::ACCESS | rustix::io::Errno::PERM) => Program::Hidden,
            Err(_) => Program::Other,
        }
    }
}

/// The module's rules 1, 2 and 4 on what was read.
fn decide<S: AsRef<str>>(owner: Owner, program: &Program, names: &[S]) -> bool {
    match (owner, program) {
        (Owner::Other, _) => false,
        (Owner::Invoker, _) => true,
        (Owner::Root, Program::Hidden | Program::Installed { .. }) => true,
        (Owner::System, Program::Installed { name }) => {
            names.iter().any(|n| n.as_ref() == name.as_str())
        }
        (Owner::Root | Owner::System, _) => false,
    }
}

/// Root's, and writable by no one else.
fn roots_alone(st: &Stat) -> bool {
    st.st_uid == 0 && st.st_mode & 0o022 == 0
}

/// The name of the file `dir`'s process runs, where root installed it (`Program::Installed`);
/// `None` where not. An error where the kernel would not show the executable.
fn installed(dir: &ProcDir) -> rustix::io::Result<Option<String>> {
    let exe = rustix::fs::statat(dir.fd(), "exe", AtFlags::empty())?;
    if FileType::from_raw_mode(exe.st_mode) != FileType::RegularFile || !roots_alone(&exe) {
        return Ok(None);
    }
    let link = rustix::fs::readlinkat(dir.fd(), "exe", Vec::new())?;
    let link = link.to_string_lossy();
    // A file replaced or removed since it was started (a package upgrade) is still the one
    // checked above; its path names where it was.
    let (path, deleted) = match link.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (link.as_ref(), false),
    };
    let Some((parent, name)) = path.rsplit_once('/') else {
        return Ok(None);
    };
    let Some(parent) = walk(dir, parent)? else {
        return Ok(None);
    };
    if !roots_alone(&rustix::fs::fstat(&parent)?) || name.is_empty() {
        return Ok(None);
    }
    if !deleted {
        let there = match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        if (there.st_dev, there.st_ino) != (exe.st_dev, exe.st_ino) {
            return Ok(None);
        }
    }
    Ok(Some(name.to_string()))
}

/// The directory `path` names inside the process's own root, opened one component at a time
/// without following a link (`O_PATH`: nothing in it is read); `None` where a component is a
/// link, missing, or not a plain name.
fn walk(dir: &ProcDir, path: &str) -> rustix::io::Result<Option<OwnedFd>> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut at = rustix::fs::openat(dir.fd(), "root", flags, Mode::empty())?;
    let Some(rest) = path.strip_prefix('/').or(path.is_empty().then_some("")) else {
        return Ok(None);
    };
    for comp in rest.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return Ok(None);
        }
        at = match rustix::fs::openat(&at, comp, flags | OFlags::NOFOLLOW, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
    }
    Ok(Some(at))
}

/// The module's rule 3: `dir`'s process is the main process of a system unit, as systemd
/// says (a user manager's units are their user's to name, and are no proof).
fn unit_main(dir: &ProcDir) -> bool {
    let Ok(text) = dir.read("cgroup") else {
        return false;
    };
    let cg = super::origin::parse_cgroup(&String::from_utf8_lossy(&text));
    match (&cg.service, cg.user_unit) {
        (Some(unit), false) => super::origin::unit_info(unit).main_pid == Some(dir.pid),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &["nvidia-persistenced", "dcgm-exporter"];

    #[test]
    fn the_owner_is_root_a_system_account_the_invoker_or_anyone() {
        assert_eq!(Owner::of([0, 0, 0], 0), Owner::Root);
        // nvidia-persistenced --user nvidia-persistenced drops to its own system account.
        assert_eq!(Owner::of([117, 117, 117], 0), Owner::System);
        assert_eq!(Owner::of([0, 117, 0], 0), Owner::System);
        // A setuid-root program a user started keeps the user as its real uid.
        assert_eq!(Owner::of([1000, 0, 0], 0), Owner::Other);
        assert_eq!(Owner::of([65534, 65534, 65534], 0), Owner::Other);
        // The invoker's own processes, for a gpuloop not run as root; never for root's.
        assert_eq!(Owner::of([1000, 1000, 1000], 1000), Owner::Invoker);
        assert_eq!(Owner::of([1000, 1000, 0], 1000), Owner::Other);
        assert_eq!(Owner::of([1001, 1001, 1001], 1000), Owner::Other);
        assert_eq!(Owner::of([1000, 1000, 1000], 0), Owner::Other);
    }

    #[test]
    fn a_name_is_proof_only_with_an_owner_and_a_program_to_back_it() {
        let installed = |n: &str| Program::Installed { name: n.into() };
        // Root's, running a root-installed program: a site's exporter that a script runs.
        assert!(decide(Owner::Root, &installed("python3.12"), NAMES));
        assert!(decide(Owner::Root, &Program::Hidden, NAMES));
        assert!(!decide(Owner::Root, &Program::Other, NAMES));
        // A system account proves its name only with the daemon's own program.
        assert!(decide(
            Owner::System,
            &installed("nvidia-persistenced"),
            NAMES
        ));
        assert!(!decide(Owner::System, &installed("sleep"), NAMES));
        assert!(!decide(Owner::System, &Program::Hidden, NAMES));
        // The invoker's own: no one else named it.
        assert!(decide(Owner::Invoker, &Program::Other, NAMES));
        // Another user's process, whatever it runs.
        for p in [
            installed("nvidia-persistenced"),
            Program::Hidden,
            Program::Other,
        ] {
            assert!(!decide(Owner::Other, &p, NAMES));
        }
    }

    #[test]
    fn this_process_runs_a_file_it_is_judged_by() {
        let dir = ProcDir::open(std::process::id() as i32).unwrap();
        let me = std::env::current_exe().unwrap();
        let name = me.file_name().unwrap().to_string_lossy().into_owned();
        // The test binary is whoever built it's, in a directory of theirs: installed only
        // where that is root, and the file is writable by no one else.
        match Program::of(&dir) {
            Program::Installed { name: found } => assert_eq!(found, name),
            Program::Other => {}
            Program::Hidden => panic!("a process's own executable is never hidden from it"),
        }
        assert!(walk(&dir, "/no/such/dir").unwrap().is_none());
        assert!(walk(&dir, "/proc/../etc").unwrap().is_none());
        assert!(walk(&dir, "relative").unwrap().is_none());
    }
}
