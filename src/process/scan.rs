//! The GPU scan: one parallel pass over /proc finding every process with a GPU device node open,
//! and, for those, which nodes it has mapped (what a CUDA context does). Everything known about
//! a process is read through its /proc directory fd, so it all belongs to one process.

use super::identity::{self, ProcDir};
use super::origin::Lineage;
use super::ProcInfo;
use crate::gpu::{DeviceNodes, Node};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A set of device nodes: GPU minors plus "some shared node".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSet {
    /// Sorted, distinct minors of /dev/nvidiaN nodes.
    pub minors: Vec<u32>,
    /// nvidiactl, nvidia-uvm and the like (MIG capabilities too).
    pub shared: bool,
    /// A MIG capability node (`/dev/nvidia-caps/…`).
    pub caps: bool,
    /// The minors of the MIG capability nodes (`nvidia-capM`), sorted, distinct: which
    /// instances (or `config`, `monitor`) the driver's `mig-minors` says they grant.
    pub cap_minors: Vec<u32>,
}

impl NodeSet {
    pub fn is_empty(&self) -> bool {
        self.minors.is_empty() && !self.shared
    }

    fn add(&mut self, node: Node) {
        match node {
            Node::Gpu(m) => {
                if let Err(at) = self.minors.binary_search(&m) {
                    self.minors.insert(at, m);
                }
            }
            Node::Shared => self.shared = true,
            Node::Caps(minor) => {
                self.shared = true;
                self.caps = true;
                if let Some(m) = minor {
                    if let Err(at) = self.cap_minors.binary_search(&m) {
                        self.cap_minors.insert(at, m);
                    }
                }
            }
        }
    }
}

/// A process that has GPU device nodes open, with its identity and facts read through the
/// same /proc directory fd as its fds and maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUser {
    pub pid: i32,
    pub open: NodeSet,
    pub mapped: NodeSet,
    pub info: ProcInfo,
    /// The pidfs inode of the process, where the kernel has pidfs.
    pub ino: Option<u64>,
    pub cmdline: String,
    pub uid: Option<u32>,
    /// The thread-group leader has exited (it is a zombie) while other threads of it live on
    /// and hold the nodes: `info.state` is then that live thread's state, and its fds and maps
    /// were read through `/proc/PID/task/TID`.
    pub defunct_leader: bool,
    /// Its parent and ancestors, cgroup and environment, read beside the scan.
    pub(crate) lineage: Lineage,
}

/// What one scan found.
#[derive(Debug, Default)]
pub struct Scan {
    pub users: Vec<NodeUser>,
    /// Processes whose fds we may not read (another user's, without root).
    pub unreadable: Vec<i32>,
    /// How many processes were looked at.
    pub scanned: usize,
    /// The CPU time the scan took, on all its threads together (the lookups `found` made
    /// included).
    pub cpu: std::time::Duration,
    /// The time the users' lineage took to read, on all the scan's threads together.
    pub lineage: std::time::Duration,
}

enum Outcome {
    /// A user, and the time its lineage took to read.
    User(Box<NodeUser>, std::time::Duration),
    None,
    Denied,
}

/// Scans every process (except this one) for open and mapped device nodes, on a few threads;
/// `found` is told each user as a thread finds it (the caller looks up its containers while
/// the scan goes on).
pub fn scan(nodes: &DeviceNodes, found: &(dyn Fn(&NodeUser) + Sync)) -> Scan {
    let me = std::process::id() as i32;
    let pids: Vec<i32> = super::all_pids().into_iter().filter(|&p| p != me).collect();
    let (outcomes, cpu) = super::across_threads(&pids, |pid| {
        let o = scan_one(pid, nodes);
        if let Outcome::User(u, _) = &o {
            found(u);
        }
        o
    });
    let mut out = Scan {
        scanned: pids.len(),
        cpu,
        ..Scan::default()
    };
    for (pid, o) in outcomes {
        match o {
            Outcome::User(u, spent) => {
                out.users.push(*u);
                out.lineage += spent;
            }
            Outcome::Denied => out.unreadable.push(pid),
            Outcome::None => {}
        }
    }
    out.users.sort_by_key(|u| u.pid);
    out.unreadable.sort_unstable();
    out
}

/// Looks again at only these processes, each as `scan` looks at one: after the signals, a
/// wait re-reads the processes it already knows rather than every process of the machine.
pub fn rescan(pids: &[i32], nodes: &DeviceNodes) -> Scan {
    let mut out = Scan {
        scanned: pids.len(),
        ..Scan::default()
    };
    for &pid in pids {
        match scan_one(pid, nodes) {
            Outcome::User(u, spent) => {
                out.users.push(*u);
                out.lineage += spent;
            }
            Outcome::Denied => out.unreadable.push(pid),
            Outcome::None => {}
        }
    }
    out.users.sort_by_key(|u| u.pid);
    out
}

/// Looks at one process; processes that vanish mid-scan are simply not users.
///
/// The fds, the maps and the stat are all read through one /proc directory fd, and the pidfd
/// is opened before the stat: every fact is the same process's, or the process is dropped as
/// gone (read by pid at different times, a holder that died in between would lend its
/// evidence to whatever reused its pid).
fn scan_one(pid: i32, nodes: &DeviceNodes) -> Outcome {
    let Ok(dir) = ProcDir::open(pid) else {
        return Outcome::None;
    };
    let (open, fds) = match open_nodes_in(&dir, "fd", nodes) {
        Ok(found) => found,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Outcome::Denied,
        Err(_) => return Outcome::None,
    };
    // A process with no fds at all is a kernel thread, or a thread-group leader that has
    // exited while its other threads live on (`pthread_exit` or SYS_exit from the main
    // thread): its own fd table is gone, its threads' is not.
    let thread = if fds == 0 { live_thread(&dir) } else { None };
    let open = match &thread {
        Some((tid, _)) => match open_nodes_in(&dir, &format!("task/{tid}/fd"), nodes) {
            Ok((set, _)) => set,
            Err(_) => return Outcome::None,
        },
        None => open,
    };
    if open.is_empty() {
        return Outcome::None;
    }
    let (mut info, ino) = match identity::bound_identity(&dir) {
        Ok(Some(found)) => found,
        Ok(None) => return Outcome::None,
        // No pidfd (an old kernel, no fds left): the stat, read through `dir`, still is its own.
        Err(_) => match dir.stat() {
            Ok(info) => (info, None),
            Err(_) => return Outcome::None,
        },
    };
    if let Some((_, state)) = thread {
        info.state = state;
    }
    if info.is_zombie() {
        return Outcome::None;
    }
    let maps_of = match &thread {
        Some((tid, _)) => format!("task/{tid}/maps"),
        None => "maps".to_string(),
    };
    let mapped = match dir.read(&maps_of) {
        Ok(maps) => parse_maps(&maps, nodes),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => NodeSet::default(),
        Err(_) => return Outcome::None,
    };
    let cmdline = dir.cmdline();
    let uid = dir.uid().ok();
    // Its own files through `dir`, its parent's and ancestors' by pid, before the check below
    // (a process still there then had its pid all along).
    // Timed by the clock the vDSO reads: a thread's CPU clock would cost two system calls
    // per holder.
    let t = std::time::Instant::now();
    let lineage = Lineage::read(&info, Some(&dir));
    let spent = t.elapsed();
    // A last read through `dir`: if the process is gone now, the maps, command line and
    // lineage above may be empty or another's for that reason, so it is not reported at all.
    if dir.stat().is_err() {
        return Outcome::None;
    }
    Outcome::User(
        Box::new(NodeUser {
            pid,
            open,
            mapped,
            info,
            ino,
            cmdline,
            uid,
            defunct_leader: thread.is_some(),
            lineage,
        }),
        spent,
    )
}

/// For a zombie thread-group leader, one of its threads that still runs: (tid, state).
/// `None` for a live process, a kernel thread, or a zombie that is all gone (it holds
/// nothing: its parent only has to reap it).
pub(crate) fn live_thread(dir: &ProcDir) -> Option<(i32, char)> {
    // Most processes without fds are kernel threads: one thread, told without reading a file.
    if dir.threads().ok()? < 2 || !dir.stat().ok()?.is_zombie() {
        return None;
    }
    let mut tasks = rustix::fs::Dir::new(dir.open_at("task", true).ok()?).ok()?;
    while let Some(Ok(entry)) = tasks.read() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .ok()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        if tid == dir.pid {
            continue;
        }
        let Ok(stat) = dir.read(&format!("task/{tid}/stat")) else {
            continue;
        };
        if let Some(t) = super::parse_stat(tid, &String::from_utf8_lossy(&stat)) {
            if !t.is_zombie() {
                return Some((tid, t.state));
            }
        }
    }
    None
}

/// The device nodes among a process's open fds: one readlinkat per fd into a stack buffer.
#[cfg(test)]
fn open_nodes(pid: i32, nodes: &DeviceNodes) -> io::Result<NodeSet> {
    open_nodes_in(&ProcDir::open(pid)?, "fd", nodes).map(|(set, _)| set)
}

/// The device nodes among the fds listed in `fd_dir` (`fd`, or `task/TID/fd`), and how many
/// fds there are in all.
fn open_nodes_in(
    proc_dir: &ProcDir,
    fd_dir: &str,
    nodes: &DeviceNodes,
) -> io::Result<(NodeSet, usize)> {
    // The listing reads through this fd itself (`read_from` would reopen it: two more
    // system calls for each of the machine's processes); readlinkat does not move it.
    let mut dir = rustix::fs::Dir::new(proc_dir.open_at(fd_dir, true)?)?;
    // SAFETY: `dir` owns this fd and outlives every use of the borrow below.
    let dirfd = unsafe { BorrowedFd::borrow_raw(dir.fd()?.as_raw_fd()) };
    let mut set = NodeSet::default();
    let mut fds = 0;
    let mut buf = [0u8; 512];
    let prefix = nodes.prefix();
    while let Some(entry) = dir.read() {
        let Ok(entry) = entry else { break };
        let name: &CStr = entry.file_name();
        if name.to_bytes().first() == Some(&b'.') {
            continue;
        }
        fds += 1;
        let n = match rustix::fs::readlinkat_raw(dirfd, name, &mut buf[..]) {
            Ok(n) if n > 0 => n,
            // Whether its fds may be read is decided for the whole process: once one is
            // refused, so is every other (a process of another container has hundreds).
            Err(rustix::io::Errno::ACCESS) => break,
            _ => continue,
        };
        let target = &buf[..n];
        if target.starts_with(prefix) {
            if let Some(node) = nodes.classify(target) {
                set.add(node);
            }
        }
    }
    Ok((set, fds))
}

/// Finds node paths in maps text. The path is the sixth field of a line: after five fields
/// separated by whitespace (address, perms, offset, device, inode) and the padding after
/// them, and it runs to the end of the line, spaces included. A node path found anywhere
/// else (inside `/tmp/x /dev/nvidia2`, a file whose name has a space) is not a mapping of
/// that node.
pub fn parse_maps(maps: &[u8], nodes: &DeviceNodes) -> NodeSet {
    let mut set = NodeSet::default();
    let finder = memchr::memmem::Finder::new(nodes.prefix());
    for at in finder.find_iter(maps) {
        let line_start = memchr::memrchr(b'\n', &maps[..at]).map_or(0, |i| i + 1);
        if path_field(&maps[line_start..at]) != Some(at - line_start) {
            continue;
        }
        let end = memchr::memchr(b'\n', &maps[at..]).map_or(maps.len(), |e| at + e);
        let path = &maps[at..end];
        let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
        if let Some(node) = nodes.classify(path) {
            set.add(node);
        }
    }
    set
}

/// Where the path field of a maps line starts, given the line up to (not including) a
/// candidate path: after five fields and the whitespace that follows them, or `None` if the
/// line has fewer fields before it.
fn path_field(line: &[u8]) -> Option<usize> {
    let mut i = 0;
    for _ in 0..5 {
        while line.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        let field = i;
        while line.get(i).is_some_and(|b| !b.is_ascii_whitespace()) {
            i += 1;
        }
        if i == field {
            return None;
        }
    }
    while line.get(i).is_some_and(|&b| b == b' ' || b == b'\t') {
        i += 1;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cuda_like_maps() {
        let nodes = DeviceNodes::new("/dev");
        let maps = b"7f00-7f01 rw-s 00000000 00:05 123 /dev/nvidiactl\n\
7f01-7f02 rw-s 00000000 00:05 124 /dev/nvidia2\n\
7f02-7f03 rw-s 00000000 00:05 124 /dev/nvidia2\n\
7f03-7f04 rw-s 00000000 00:05 125 /dev/nvidia-uvm\n\
7f04-7f05 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n\
7f05-7f06 rw-p 00000000 00:00 0 \n";
        let set = parse_maps(maps, &nodes);
        assert_eq!(set.minors, vec![2]);
        assert!(set.shared);
        assert!(parse_maps(b"7f04-7f05 r-xp 00000000 08:01 99 /lib/libc.so\n", &nodes).is_empty());
    }

    /// The bug: any node path preceded by a space counted, so a mapped file named
    /// `/tmp/x /dev/nvidia2` made its process a compute holder of GPU 2.
    #[test]
    fn false_holders_from_maps_parsing_a_path_with_a_space_is_one_path() {
        let nodes = DeviceNodes::new("/dev");
        let spaced = b"7f00-7f01 rw-s 00000000 08:01 77 /tmp/x /dev/nvidia2\n";
        assert!(parse_maps(spaced, &nodes).is_empty());
        let deep = b"7f00-7f01 rw-s 00000000 08:01 77                 /tmp/a b /dev/nvidiactl\n";
        assert!(parse_maps(deep, &nodes).is_empty());
        // The real node, padded to the path column as the kernel prints it, or deleted.
        let padded = b"7f00-7f01 rw-s 00000000 00:05 124                        /dev/nvidia3\n\
7f01-7f02 rw-s 00000000 00:05 125 /dev/nvidia4 (deleted)\n";
        assert_eq!(parse_maps(padded, &nodes).minors, vec![3, 4]);
        // A line cut short never has a path field.
        assert!(parse_maps(b"7f00-7f01 rw-s /dev/nvidia1\n", &nodes).is_empty());
        assert!(parse_maps(b"/dev/nvidia1\n", &nodes).is_empty());
    }

    #[test]
    fn finds_own_open_node_file() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("nvidia5");
        std::fs::write(&node, b"x").unwrap();
        let _f = std::fs::File::open(&node).unwrap();
        let nodes = DeviceNodes::new(dir.path());
        let set = open_nodes(std::process::id() as i32, &nodes).unwrap();
        assert_eq!(set.minors, vec![5]);
    }
}
