//! Processes as /proc shows them: stat fields, identity `(pid, start, pidfs inode)`, users, command lines.

pub mod container;
pub(crate) mod daemon;
pub(crate) mod helpers;
pub(crate) mod identity;
pub mod kill;
pub(crate) mod origin;
pub mod restart;
pub(crate) mod runtime_state;
pub mod scan;
pub(crate) mod scope;
pub(crate) mod signal_log;
pub mod skip;
pub(crate) mod tree;

use serde::Serialize;
use std::collections::HashMap;
use std::io;
use std::sync::{Mutex, OnceLock};

/// The fields of /proc/PID/stat that gpuloop uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    /// The kernel's per-process flags (PF_*), e.g. `PF_KTHREAD` for kernel threads.
    pub flags: u32,
    /// Start time in clock ticks since boot; with the pid it identifies the process.
    pub start: u64,
}

/// `PF_KTHREAD` from linux/sched.h: set on every kernel thread.
const PF_KTHREAD: u32 = 0x0020_0000;

/// A process identity that survives PID reuse: the pid, its start time in clock ticks and,
/// where the kernel has pidfs, the inode of its pidfd (unique for the boot, so two processes
/// that had the same pid within one clock tick still differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Identity {
    pub pid: i32,
    pub start: u64,
    pub ino: Option<u64>,
}

impl Identity {
    /// An identity known by pid and start time only.
    pub fn new(pid: i32, start: u64) -> Identity {
        Identity {
            pid,
            start,
            ino: None,
        }
    }
}

impl ProcInfo {
    pub fn identity(&self) -> Identity {
        Identity::new(self.pid, self.start)
    }

    pub(crate) fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// A kernel thread (kthreadd and its children): never signalled.
    pub(crate) fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

#[cfg(test)]
impl ProcInfo {
    /// A sleeping process named `p<pid>`, for tests of what is decided on a process table.
    pub fn sleeping(pid: i32, ppid: i32, pgid: i32, sid: i32, start: u64) -> ProcInfo {
        ProcInfo {
            pid,
            flags: 0,
            comm: format!("p{pid}"),
            state: 'S',
            ppid,
            pgid,
            sid,
            start,
        }
    }
}

/// Parses the text of /proc/PID/stat; the comm may hold spaces and parentheses.
pub(crate) fn parse_stat(pid: i32, text: &str) -> Option<ProcInfo> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut f = text.get(close + 2..)?.split_ascii_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok()?;
    let sid = f.next()?.parse().ok()?;
    // Then tty_nr, tpgid, flags; starttime is the 13th field after flags.
    let flags = f.nth(2)?.parse().ok()?;
    let start = f.nth(12)?.parse().ok()?;
    Some(ProcInfo {
        pid,
        comm,
        state,
        ppid,
        pgid,
        sid,
        flags,
        start,
    })
}

/// Reads /proc/PID/stat; `NotFound` when the process is gone. One open, one read and one
/// close (`read_to_string` adds a statx and a second read): a look at the whole process
/// table reads one for every process.
pub(crate) fn read_stat(pid: i32) -> io::Result<ProcInfo> {
    let fd = rustix::fs::open(
        format!("/proc/{pid}/stat").as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    // A stat line is a few hundred bytes; one that fills the buffer is read to its end.
    let mut buf = [0u8; 4096];
    let n = rustix::io::read(&fd, &mut buf)?;
    let mut all = buf[..n].to_vec();
    if n == buf.len() {
        std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut all)?;
    }
    parse_stat(pid, &String::from_utf8_lossy(&all))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat"))
}

/// True if the process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    pid > 0 && read_stat(pid).is_ok_and(|p| !p.is_zombie())
}

/// Every pid in /proc, in no particular order.
pub(crate) fn all_pids() -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect()
}

/// The CPU time this thread has used: what a part of a look costs, whatever else runs on the
/// machine (for -v and the benches).
pub(crate) fn thread_cpu() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The cores this process may use, looked up once (the lookup reads cgroup files).
pub(crate) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// One pass over /proc: the stat of every live process, read on a few threads as the GPU
/// scan reads the fds (on a 16-core GPU node, 8,000 stats read one by one cost clean 70 ms
/// more than its scan).
pub(crate) fn process_table() -> Vec<ProcInfo> {
    let pids = all_pids();
    let mut table: Vec<ProcInfo> = across_threads(&pids, |pid| read_stat(pid).ok())
        .0
        .into_iter()
        .filter_map(|(_, p)| p)
        .collect();
    // In pid order, as /proc lists them: trees and reports walk children in that order.
    table.sort_unstable_by_key(|p| p.pid);
    table
}

/// Most threads a walk over the process table uses: /proc reads scale to a few threads, and
/// each costs a clone().
const MAX_THREADS: usize = 8;

/// About how many processes make starting one more thread worth it.
const PER_THREAD: usize = 64;

/// How many processes a thread takes at a time.
const CHUNK: usize = 8;

/// `look` at every pid, on a few scoped threads (not a global pool: a one-shot command would
/// pay for starting one thread per core); the results in no particular order, and the CPU time
/// the threads spent. Each thread takes the next few processes until none are left: a holder
/// costs many times what another process does (its maps, its lineage), and holders come at
/// regular strides of pids (a launcher and its worker, forked one after the other), which fixed
/// shares would give all to one thread.
pub(crate) fn across_threads<T: Send>(
    pids: &[i32],
    look: impl Fn(i32) -> T + Sync,
) -> (Vec<(i32, T)>, std::time::Duration) {
    let threads = cores()
        .min(MAX_THREADS)
        .min(pids.len().div_ceil(PER_THREAD))
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let cpu = Mutex::new(std::time::Duration::ZERO);
    let share = || -> Vec<(i32, T)> {
        let start = thread_cpu();
        let mut done = Vec::new();
        loop {
            let at = next.fetch_add(CHUNK, std::sync::atomic::Ordering::Relaxed);
            if at >= pids.len() {
                if let Ok(mut c) = cpu.lock() {
                    *c += thread_cpu().saturating_sub(start);
                }
                return done;
            }
            let taken = &pids[at..(at + CHUNK).min(pids.len())];
            done.extend(taken.iter().map(|&pid| (pid, look(pid))));
        }
    };
    let all = std::thread::scope(|sc| {
        let others: Vec<_> = (1..threads).map(|_| sc.spawn(share)).collect();
        let mut all = share();
        let mut lost = false;
        for h in others {
            match h.join() {
                Ok(done) => all.extend(done),
                Err(_) => lost = true,
            }
        }
        if lost {
            // A thread that panicked had what it took done again here rather than lost.
            let seen: std::collections::HashSet<i32> = all.iter().map(|(p, _)| *p).collect();
            let missed: Vec<i32> = pids.iter().copied().filter(|p| !seen.contains(p)).collect();
            all.extend(missed.into_iter().map(|pid| (pid, look(pid))));
        }
        all
    });
    (all, cpu.into_inner().unwrap_or_default())
}

/// The owner of a process as `ps` shows it: its effective uid, which owns its /proc directory.
pub fn uid(pid: i32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// The uid a user name (or a number) stands for; `None` when the user database does not know it.
pub(crate) fn user_id(name: &str) -> Option<u32> {
    if let Ok(uid) = name.parse::<u32>() {
        return Some(uid);
    }
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

/// A user name for a uid, cached; the number when the user database does not know it.
pub(crate) fn user_name(uid: u32) -> String {
    static CACHE: OnceLock<Mutex<HashMap<u32, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(n) = cache.lock().ok().and_then(|c| c.get(&uid).cloned()) {
        return n;
    }
    let name = nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string());
    if let Ok(mut c) = cache.lock() {
        c.insert(uid, name.clone());
    }
    name
}

/// The name to show a person for a process: a known restarter by what it is ("torchrun agent
/// (restarts its workers)"); where the kernel cut the comm to 15 bytes (`VLLM::EngineCor`,
/// `nvidia-persiste`), the full name from the command line: argv[0]'s base name, or the
/// process title the program set; otherwise its comm.
pub(crate) fn display_name(comm: &str, cmdline: &str) -> String {
    if let Some(known) = restart::launcher(comm, cmdline) {
        return known.to_string();
    }
    let first = cmdline.split(' ').next().unwrap_or("");
    let base = first.rsplit('/').next().unwrap_or(first);
    if comm.len() == 15 && base.len() > comm.len() && base.starts_with(comm) {
        base.to_string()
    } else {
        comm.to_string()
    }
}

/// The command line with NULs as spaces; empty for kernel threads and the unreadable.
pub fn cmdline(pid: i32) -> String {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return String::new();
    };
    cmdline_text(&raw)
}

/// The text of a raw /proc/PID/cmdline: NULs as spaces, the trailing one dropped.
pub(crate) fn cmdline_text(raw: &[u8]) -> String {
    let trimmed = raw.strip_suffix(b"\0").unwrap_or(raw);
    String::from_utf8_lossy(trimmed).replace('\0', " ")
}

/// gpuloop itself and every ancestor up to init: never signalled.
pub(crate) fn self_and_ancestors() -> Vec<i32> {
    let mut out = vec![std::process::id() as i32];
    let mut pid = out[0];
    while let Ok(p) = read_stat(pid) {
        if p.ppid <= 0 || out.contains(&p.ppid) {
            break;
        }
        out.push(p.ppid);
        pid = p.ppid;
    }
    out
}

/// Runs a program to its end with a deadline and returns its stdout; `None` if it cannot
/// start, fails, or overruns (then it is killed and reaped).
pub(crate) fn command_output(
    program: &str,
    args: &[&str],
    timeout: std::time::Duration,
) -> Option<String> {
    run_command(program, args, timeout, None).ok()
}

/// Why a program run by [`run_command`] gave no output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommandFailure {
    /// It could not be started (not installed, not executable).
    Start(std::io::ErrorKind, String),
    /// It ran past the deadline (it was killed and reaped).
    Timeout,
    /// It exited with a failure (`None`: killed by a signal) and said this on stderr.
    Failed(Option<i32>, String),
}

/// Runs a program to its end with a deadline: its stdout, or why not, with its stderr.
/// `apart`: in a session of its own, dying with gpuloop by that signal (a host's transport:
/// `helpers::apart_hook`).
pub(crate) fn run_command(
    program: &str,
    args: &[&str],
    timeout: std::time::Duration,
    apart: Option<rustix::process::Signal>,
) -> Result<String, CommandFailure> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    // Registered as gpuloop's own, so that the job runner never takes it for a job's orphan.
    let (mut child, helper) = helpers::start(
        || {
            let mut cmd = Command::new(program);
            cmd.args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(death) = apart {
                // SAFETY: the hook only makes async-signal-safe system calls and allocates
                // nothing. This thread waits for the child below, so the death signal,
                // which follows the forking thread, cannot come early.
                unsafe { cmd.pre_exec(helpers::apart_hook(death)) };
            }
            cmd.spawn()
        },
        |c| Some(c.id()),
    )
    .map_err(|e| CommandFailure::Start(e.kind(), e.to_string()))?;
    // Both pipes are drained at once, so a chatty program never blocks on a full one.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut out);
            }
            out
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    helpers::forget(helper);
    let (out, err) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    match status {
        None => Err(CommandFailure::Timeout),
        Some(st) if st.success() => Ok(out),
        Some(st) => Err(CommandFailure::Failed(st.code(), err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_comm() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let p = parse_stat(4242, line).unwrap();
        assert_eq!(p.comm, "a) b (c)");
        assert_eq!(
            (p.state, p.ppid, p.pgid, p.sid, p.flags, p.start),
            ('S', 1, 4242, 4242, 4194560, 987654)
        );
        assert!(!p.is_kernel_thread());
    }

    #[test]
    fn names_cut_by_the_kernel_are_shown_whole() {
        assert_eq!(
            display_name("VLLM::EngineCor", "VLLM::EngineCore"),
            "VLLM::EngineCore"
        );
        assert_eq!(
            display_name("nvidia-persiste", "/usr/bin/nvidia-persistenced --verbose"),
            "nvidia-persistenced"
        );
        // A comm not cut, or a command line that is not the same name, stays the comm.
        assert_eq!(
            display_name("python3", "/usr/bin/python3.12 x.py"),
            "python3"
        );
        assert_eq!(
            display_name("pt_main_thread1", "python3 train.py"),
            "pt_main_thread1"
        );
        assert_eq!(
            display_name("pt_elastic", "/usr/bin/python3 /usr/bin/torchrun train.py"),
            "torchrun agent (restarts its workers)"
        );
    }

    #[test]
    fn kthreadd_is_a_kernel_thread() {
        // Pid 2 is kthreadd on the host, but only in the initial PID namespace.
        if let Some(p) = read_stat(2).ok().filter(|p| p.comm == "kthreadd") {
            assert!(p.is_kernel_thread());
        }
        assert!(!read_stat(std::process::id() as i32)
            .unwrap()
            .is_kernel_thread());
    }

    #[test]
    fn reads_own_stat() {
        let me = read_stat(std::process::id() as i32).unwrap();
        assert!(me.start > 0);
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(alive(me.pid));
        assert!(!alive(0));
    }
}
