//! One job: spawned in its own process group, watched by a monitor thread (exit, timeout),
//! its two streams read by threads that echo and capture; waited for, or stopped whole.

use super::capture::Capture;
use super::supervise;
use super::{name_of, Cmd, JobOpts, Outcome, RunError};
use crate::journal::Served;
use crate::process::Identity;
use nix::sys::signal::Signal;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::{pidfd_open, waitid, Pid, PidfdFlags, WaitId, WaitIdOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// After the leader exits, how long the readers may take to empty the pipes (output a
/// lingering background process keeps writing is not waited for).
const DRAIN: Duration = Duration::from_secs(2);
/// How long a stop waits for the outcome after SIGKILL before calling the job stuck.
const AFTER_KILL: Duration = Duration::from_secs(5);
/// The readers wake this often to notice that the leader exited.
const READ_TICK: Duration = Duration::from_millis(50);

/// What `wait` saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    Done(Outcome),
    /// The wait's own timeout passed; the job still runs.
    Running,
    /// Ctrl-C; the job still runs (the caller decides to stop it).
    Interrupted,
}

#[derive(Default)]
struct State {
    exited: bool,
    timed_out: bool,
    outcome: Option<Outcome>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// One stop at a time (a timeout and a Ctrl-C may race).
    stopping: Mutex<()>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running (or finished) job; cheap to share behind an `Arc`.
pub struct Job {
    id: Identity,
    cmd: String,
    timeout: Option<Duration>,
    grace: Duration,
    /// The server call it runs for, journaled with the signals of its stop.
    served: Option<Served>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Job(pid {}: {})", self.id.pid, self.cmd)
    }
}

impl Job {
    /// Starts the job: stdin from /dev/null, stdout and stderr captured (and echoed), in a
    /// process group of its own so a terminal's Ctrl-C reaches gpuloop, which stops it.
    pub fn spawn(cmd: &Cmd, opts: JobOpts) -> Result<Job, RunError> {
        let shown = cmd.display();
        let mut command = match cmd {
            Cmd::Shell(line) => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(line);
                c
            }
            Cmd::Argv(argv) => {
                let (first, rest) = argv.split_first().ok_or(RunError::Empty)?;
                if first.is_empty() {
                    return Err(RunError::Empty);
                }
                let mut c = Command::new(first);
                c.args(rest);
                c
            }
        };
        if let Some(dir) = &opts.cwd {
            // std would report a bad cwd as if the program were missing.
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(RunError::Cwd {
                        dir: dir.display().to_string(),
                        why: "not a directory".into(),
                    })
                }
                Err(e) => {
                    return Err(RunError::Cwd {
                        dir: dir.display().to_string(),
                        why: e.to_string(),
                    })
                }
            }
            command.current_dir(dir);
        }
        // A job can call back into this very gpuloop (`$GPULOOP_EXE sim hold …`).
        if let Ok(exe) = std::env::current_exe() {
            command.env("GPULOOP_EXE", exe);
        }
        command
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .env(supervise::JOB_MARK, supervise::job_mark())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);

        let started = Instant::now();
        let spawn_err = |e: std::io::Error| RunError::Spawn {
            cmd: shown.clone(),
            source: e,
        };
        let (mut child, id) =
            supervise::spawn_registered(opts.grace, command).map_err(spawn_err)?;
        let pid = id.pid;
        let pidfd = Pid::from_raw(pid).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());

        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stopping: Mutex::new(()),
        });
        let job = Job {
            id,
            cmd: shown.clone(),
            timeout: opts.timeout,
            grace: opts.grace,
            served: opts.served.clone(),
            shared: shared.clone(),
        };

        let exited = Arc::new(AtomicBool::new(false));
        let (drained_tx, drained_rx) = channel();
        let mut captures = Vec::new();
        let streams: [(Option<Box<dyn ReadFd>>, Echo); 2] = [
            (
                child.stdout.take().map(|p| Box::new(p) as Box<dyn ReadFd>),
                Echo::Stdout,
            ),
            (
                child.stderr.take().map(|p| Box::new(p) as Box<dyn ReadFd>),
                Echo::Stderr,
            ),
        ];
        let mut started_threads = Ok(());
        for (pipe, echo) in streams {
            let capture = Arc::new(Mutex::new(Capture::default()));
            captures.push(capture.clone());
            let Some(pipe) = pipe else {
                let _ = drained_tx.send(());
                continue;
            };
            let reader = Reader {
                echo: opts.echo.then_some(echo),
                sink: opts.sink.clone().map(|s| (s, matches!(echo, Echo::Stdout))),
                capture,
                exited: exited.clone(),
                drained: drained_tx.clone(),
            };
            if let Err(e) = std::thread::Builder::new()
                .name(format!("job-{pid}-{echo:?}"))
                .spawn(move || reader.run(pipe))
            {
                started_threads = Err(e);
            }
        }
        let monitor = Monitor {
            id,
            started,
            timeout: opts.timeout,
            grace: opts.grace,
            keep_children: opts.keep_children,
            served: opts.served.clone(),
            pidfd,
            shared,
            captures,
            exited,
            drained: drained_rx,
        };
        let spawned = started_threads.and_then(|()| {
            std::thread::Builder::new()
                .name(format!("job-{pid}"))
                .spawn(move || monitor.run(child))
                .map(drop)
        });
        if let Err(e) = spawned {
            // Without its threads the job cannot be watched: do not leave it running.
            abandon(id);
            return Err(spawn_err(e));
        }
        Ok(job)
    }

    pub fn pid(&self) -> i32 {
        self.id.pid
    }

    pub fn command(&self) -> &str {
        &self.cmd
    }

    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// True until the job's main process has exited.
    pub fn running(&self) -> bool {
        !self.shared.lock().exited
    }

    /// The outcome once the job ended and its output was collected; `None` before.
    pub fn outcome(&self) -> Option<Outcome> {
        self.shared.lock().outcome.clone()
    }

    /// Waits for the outcome, up to `timeout` (forever with `None`), waking on Ctrl-C.
    pub fn wait(&self, timeout: Option<Duration>, interrupted: &AtomicBool) -> Waited {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.shared.lock();
        loop {
            if let Some(o) = &st.outcome {
                return Waited::Done(o.clone());
            }
            if interrupted.load(Ordering::Relaxed) {
                return Waited::Interrupted;
            }
            let now = Instant::now();
            let mut slice = Duration::from_millis(50);
            if let Some(d) = deadline {
                if now >= d {
                    return Waited::Running;
                }
                slice = slice.min(d - now);
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, slice)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Stops the whole tree (`signal`, the grace, SIGKILL) and returns the outcome; `None`
    /// if the main process outlived SIGKILL. On a finished job it stops what it left behind.
    pub fn stop(&self, signal: Signal, grace: Option<Duration>) -> Option<Outcome> {
        self.stop_for(self.served.as_ref(), signal, grace)
    }

    /// `stop`, its signals journaled with `served`: the server call that asked for the stop
    /// (a remote client's `job_kill`), not the one that started the job.
    pub(crate) fn stop_for(
        &self,
        served: Option<&Served>,
        signal: Signal,
        grace: Option<Duration>,
    ) -> Option<Outcome> {
        {
            let _one = self
                .shared
                .stopping
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let grace = grace.unwrap_or(self.grace);
            supervise::stop_tree(Some(self.id), signal, grace, served);
        }
        let never = AtomicBool::new(false);
        match self.wait(Some(AFTER_KILL + DRAIN), &never) {
            Waited::Done(o) => Some(o),
            _ => None,
        }
    }
}

/// Kills and reaps a job whose threads could not start (its `Child` handle is gone).
fn abandon(id: Identity) {
    supervise::stop_tree(Some(id), Signal::SIGKILL, Duration::ZERO, None);
    supervise::exiting(id);
    if let Some(pid) = Pid::from_raw(id.pid) {
        let end = Instant::now() + AFTER_KILL;
        while Instant::now() < end {
            match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG) {
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                _ => break,
            }
        }
    }
    supervise::finished(id);
}

/// A pipe end the readers can poll and read.
trait ReadFd: Read + AsFd + Send {}
impl<T: Read + AsFd + Send> ReadFd for T {}

#[derive(Debug, Clone, Copy)]
enum Echo {
    Stdout,
    Stderr,
}

struct Reader {
    echo: Option<Echo>,
    sink: Option<(super::Sink, bool)>,
    capture: Arc<Mutex<Capture>>,
    exited: Arc<AtomicBool>,
    drained: Sender<()>,
}

impl Reader {
    /// Reads until EOF, echoing and capturing. Once the leader exited and the pipe is empty
    /// it reports "drained", and keeps reading for whatever still holds the pipe.
    fn run(self, mut pipe: Box<dyn ReadFd>) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut told = false;
        let tick = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: READ_TICK.as_nanos() as i64,
        };
        loop {
            let ready = {
                let mut fds = [PollFd::new(&pipe, PollFlags::IN)];
                match poll(&mut fds, Some(&tick)) {
                    Ok(n) => n > 0,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => true,
                }
            };
            if !ready {
                if !told && self.exited.load(Ordering::SeqCst) {
                    let _ = self.drained.send(());
                    told = true;
                }
                continue;
            }
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.echo_chunk(&buf[..n]);
                    self.capture
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(&buf[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if !told {
            let _ = self.drained.send(());
        }
    }

    /// Raw bytes to the terminal: whatever the job printed, even invalid UTF-8; a closed
    /// stdout of gpuloop's own is not the job's problem.
    fn echo_chunk(&self, chunk: &[u8]) {
        if let Some((sink, stdout)) = &self.sink {
            (sink.0)(*stdout, chunk);
        }
        match self.echo {
            Some(Echo::Stdout) => crate::output::bytes(chunk),
            Some(Echo::Stderr) => {
                let _ = std::io::stderr().lock().write_all(chunk);
            }
            None => {}
        }
    }
}

struct Monitor {
    id: Identity,
    started: Instant,
    timeout: Option<Duration>,
    grace: Duration,
    keep_children: bool,
    served: Option<Served>,
    pidfd: Option<OwnedFd>,
    shared: Arc<Shared>,
    captures: Vec<Arc<Mutex<Capture>>>,
    exited: Arc<AtomicBool>,
    drained: Receiver<()>,
}

impl Monitor {
    fn run(self, mut child: Child) {
        let deadline = self.timeout.map(|t| self.started + t);
        if !self.wait_exit(deadline) {
            self.shared.lock().timed_out = true;
            {
                let _one = self
                    .shared
                    .stopping
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let served = self.served.as_ref();
                supervise::stop_tree(Some(self.id), Signal::SIGTERM, self.grace, served);
            }
            // A main process that survives SIGKILL is stuck in the kernel: keep watching.
            while !self.wait_exit(Some(Instant::now() + AFTER_KILL)) {
                tracing::warn!("job pid {} still exists after SIGKILL", self.id.pid);
            }
        }
        supervise::exiting(self.id);
        let status = child.wait();
        let elapsed = self.started.elapsed();
        self.shared.lock().exited = true;
        supervise::finished(self.id);
        // What the job left running (background children, daemons it forked) would outlive
        // the result and pile up across re-runs, holding GPUs: stop it, unless kept.
        let leftovers = if self.keep_children {
            supervise::leftovers(self.id)
        } else {
            let _one = self
                .shared
                .stopping
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            supervise::stop_tree(
                Some(self.id),
                Signal::SIGTERM,
                self.grace,
                self.served.as_ref(),
            )
        };
        if !leftovers.is_empty() {
            tracing::debug!(
                "job pid {}: {} left running when it exited{}: {leftovers:?}",
                self.id.pid,
                crate::words::count(leftovers.len(), "process", "processes"),
                if self.keep_children {
                    " (kept)"
                } else {
                    ", stopped"
                }
            );
        }

        self.exited.store(true, Ordering::SeqCst);
        let drain_end = Instant::now() + DRAIN;
        for _ in 0..self.captures.len() {
            let left = drain_end.saturating_duration_since(Instant::now());
            if self.drained.recv_timeout(left).is_err() {
                break;
            }
        }
        let text = |i: usize| {
            self.captures
                .get(i)
                .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).text())
                .unwrap_or_default()
        };
        let (code, signal) = match status {
            Ok(s) => (s.code().map(i64::from), s.signal().map(name_of)),
            Err(_) => (None, None),
        };
        let mut st = self.shared.lock();
        let timed_out = st.timed_out;
        st.outcome = Some(Outcome {
            code,
            signal,
            ok: code == Some(0) && !timed_out,
            timed_out,
            stdout: text(0),
            stderr: text(1),
            elapsed_ms: elapsed.as_millis() as i64,
            pid: self.id.pid.into(),
            leftovers,
        });
        drop(st);
        self.shared.changed.notify_all();
    }

    /// True once the main process exited (it is left unreaped, a zombie that keeps its pid
    /// and its group's id); false when `deadline` passed first.
    fn wait_exit(&self, deadline: Option<Instant>) -> bool {
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return false;
            }
            match &self.pidfd {
                Some(fd) => {
                    let ts = left.map(|l| rustix::time::Timespec {
                        tv_sec: l.as_secs() as i64,
                        tv_nsec: i64::from(l.subsec_nanos()),
                    });
                    let mut fds = [PollFd::new(fd, PollFlags::IN)];
                    if let Ok(n) = poll(&mut fds, ts.as_ref()) {
                        if n > 0 {
                            return true;
                        }
                    }
                }
                // Kernels without pidfds: look every 20 ms.
                None => {
                    let exited = Pid::from_raw(self.id.pid).is_none_or(|p| {
                        !matches!(
                            waitid(
                                WaitId::Pid(p),
                                WaitIdOptions::EXITED
                                    | WaitIdOptions::NOHANG
                                    | WaitIdOptions::NOWAIT
                            ),
                            Ok(None)
                        )
                    });
                    if exited {
                        return true;
                    }
                    std::thread::sleep(left.map_or(Duration::from_millis(20), |l| {
                        l.min(Duration::from_millis(20))
                    }));
                }
            }
        }
    }
}
