//! `gpuloop agent`: this machine's primitives served over stdin/stdout, one JSON message a
//! line (`hosts::protocol`), for a gpuloop elsewhere that reached it through ssh.
//!
//! It says hello, then answers requests, each on a worker thread of its own so a long
//! wait_clean or a running job does not hold up the others (an idle worker is reused: a
//! thread per request was a good part of a quick call's cost). It is the subreaper of the jobs it runs
//! (`run`, and `spawn`'s background jobs); when its stdin closes (the client ended, or the
//! link dropped) it stops them all and exits.

use crate::hosts::protocol::{
    self, Body, Call, ErrorKind, Hello, JobState, Message, Request, RunCall, Stream,
};
use crate::input::{next_line, TooLarge};
use crate::inspect::diagnose::Reach;
use crate::journal::{FrontEnd, Served};
use crate::machine::{ops, Local, Watch};
use crate::process::kill::parse_signal;
use crate::runner::{Cmd, Job, JobOpts, RunError, Sink, Waited};
use crate::session::Session;
use nix::sys::signal::Signal;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The agent's stdout, shared by every request's thread: one whole line at a time.
#[derive(Clone)]
struct Out(Arc<Mutex<std::io::Stdout>>);

impl Out {
    fn send(&self, m: &Message) {
        let mut line = m.line();
        line.push('\n');
        let out = lock(&self.0);
        let mut out = out.lock();
        // A closed stdout means the client is gone; stdin's EOF ends the agent. Any other
        // failure (a full disk) makes its exit status 1.
        if let Err(e) = out.write_all(line.as_bytes()).and_then(|()| out.flush()) {
            crate::output::failed(&e);
        }
    }
}

fn reply(id: Option<u64>, body: Body) -> Message {
    Message::Reply { id, body }
}

fn error(kind: ErrorKind, message: impl Into<String>) -> Body {
    Body::error(kind, message)
}

/// What runs on behalf of the client: cancel flags of the running calls (a `run`'s job, a
/// `job_wait`), and the background jobs of `spawn`, each by its request id.
#[derive(Default)]
struct Jobs {
    cancels: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    spawned: Mutex<HashMap<u64, Slot>>,
    /// Signalled when a spawn's slot leaves `Starting`.
    started: std::sync::Condvar,
}

/// A spawn's id is taken when its request is read, before its worker starts the job, so a
/// `job_kill` or `cancel` right behind it finds it, and a second spawn of that id is refused.
enum Slot {
    Starting,
    Started(Arc<Job>),
}

impl Jobs {
    /// A cancel flag for request `id`, dropped from the table with the guard.
    fn cancel_flag(self: &Arc<Jobs>, id: u64) -> CancelGuard {
        let flag = Arc::new(AtomicBool::new(false));
        lock(&self.cancels).insert(id, flag.clone());
        CancelGuard {
            jobs: self.clone(),
            id,
            flag,
        }
    }

    /// Takes `id` for a spawn; false if a spawn already has it.
    fn reserve(&self, id: u64) -> bool {
        match lock(&self.spawned).entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Slot::Starting);
                true
            }
        }
    }

    /// What the spawn of `id` came to: its job, or `None` (it failed), its slot dropped.
    fn settle(&self, id: u64, job: Option<Arc<Job>>) {
        let mut spawned = lock(&self.spawned);
        match job {
            Some(j) => spawned.insert(id, Slot::Started(j)),
            None => spawned.remove(&id),
        };
        self.started.notify_all();
    }

    /// The job spawned as `job`, once it has started (a spawn still starting is waited for:
    /// a fork and an exec).
    fn spawned(&self, job: u64) -> Result<Arc<Job>, Body> {
        let mut spawned = lock(&self.spawned);
        loop {
            match spawned.get(&job) {
                Some(Slot::Started(j)) => return Ok(j.clone()),
                Some(Slot::Starting) => {
                    spawned = self
                        .started
                        .wait(spawned)
                        .unwrap_or_else(|e| e.into_inner());
                }
                None => {
                    return Err(error(
                        ErrorKind::Usage,
                        format!("no job {job} was spawned on this connection"),
                    ))
                }
            }
        }
    }

    /// Cancels request `id`: its wait or run ends; a spawned job of that id is stopped
    /// (in the background: a stop takes the job's grace, and one still starting is waited
    /// for). False if there is no such request.
    fn cancel(self: &Arc<Self>, id: u64) -> bool {
        let flagged = lock(&self.cancels)
            .get(&id)
            .map(|f| f.store(true, Ordering::SeqCst))
            .is_some();
        let spawn = lock(&self.spawned).contains_key(&id);
        if spawn {
            let jobs = self.clone();
            let _ = std::thread::Builder::new()
                .name(format!("cancel-{id}"))
                .spawn(move || {
                    if let Ok(job) = jobs.spawned(id) {
                        job.stop(Signal::SIGTERM, None);
                    }
                });
        }
        flagged || spawn
    }
}

/// A request's cancel flag: set by a `cancel` of its id, or when the client goes away.
struct CancelGuard {
    jobs: Arc<Jobs>,
    id: u64,
    flag: Arc<AtomicBool>,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        lock(&self.jobs.cancels).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves until stdin closes; returns the exit code.
pub(crate) fn serve(session: Arc<Session>) -> crate::exit::Exit {
    let _jobs = crate::runner::Supervisor::start();
    let out = Out(Arc::new(Mutex::new(std::io::stdout())));
    let (gpus, backend) = match session.backend() {
        Ok(b) => (b.gpus().map_or(0, |g| g.len() as i64), b.kind()),
        Err(e) => {
            crate::errln!("warning: {e}");
            (0, crate::gpu::BackendKind::NoDriver)
        }
    };
    out.send(&Message::Hello(Hello {
        protocol: protocol::PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        hostname: crate::hosts::hostname(),
        gpus,
        backend: backend.to_string(),
    }));
    let jobs: Arc<Jobs> = Arc::default();
    let workers = Workers::new();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    loop {
        let line = match next_line(&mut input, protocol::MAX_REQUEST) {
            Ok(None) | Err(_) => break,
            Ok(Some(Err(TooLarge))) => {
                out.send(&reply(
                    None,
                    error(
                        ErrorKind::TooLarge,
                        format!("request longer than {} bytes", protocol::MAX_REQUEST),
                    ),
                ));
                continue;
            }
            Ok(Some(Ok(l))) => l,
        };
        let Ok(text) = std::str::from_utf8(&line) else {
            out.send(&reply(
                None,
                error(ErrorKind::Malformed, "a request must be UTF-8 JSON"),
            ));
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        let req = match protocol::parse_request(text) {
            Ok(r) => r,
            Err(m) => {
                out.send(&m);
                continue;
            }
        };
        if let Call::Ping = req.call {
            out.send(&reply(Some(req.id), Body::ok(&true)));
            continue;
        }
        if let Call::ReachedAs { host, gpuloop } = req.call {
            // Read before the next line: every later request's advice names the host.
            session.reached_as(Reach {
                host: Some(host),
                gpuloop,
            });
            out.send(&reply(Some(req.id), Body::ok(&true)));
            continue;
        }
        if let Call::Cancel { id } = req.call {
            let found = jobs.cancel(id);
            out.send(&reply(Some(req.id), Body::ok(&found)));
            continue;
        }
        // A spawn takes its id here, before the next line is read, for the same reason.
        if matches!(req.call, Call::Spawn(_)) && !jobs.reserve(req.id) {
            out.send(&reply(
                Some(req.id),
                error(
                    ErrorKind::Usage,
                    format!(
                        "a job was already spawned as {} on this connection: each spawn needs an id of its own",
                        req.id
                    ),
                ),
            ));
            continue;
        }
        // A call a cancel can stop gets its flag here, before the next line is read: a
        // cancel right behind it (Ctrl-C at once) finds it, whenever its worker starts.
        let cancel = req
            .call
            .handling()
            .cancellable
            .then(|| jobs.cancel_flag(req.id));
        let (id, is_spawn) = (req.id, matches!(req.call, Call::Spawn(_)));
        let (s, o, j) = (session.clone(), out.clone(), jobs.clone());
        let spawned = workers.run(Box::new(move || {
            let id = req.id;
            // The signals this request sends are journaled with the client's call.
            let call = serde_json::to_value(&req.call).unwrap_or_default();
            let served = Served::new(FrontEnd::Agent, call);
            let body = handle(&s, req, &o, &j, cancel, served);
            o.send(&reply(Some(id), body));
        }));
        if let Err(e) = spawned {
            if is_spawn {
                jobs.settle(id, None);
            }
            out.send(&reply(
                None,
                error(ErrorKind::Failed, format!("cannot start a thread: {e}")),
            ));
        }
    }
    // The client is gone: end every call; the Supervisor's drop then stops the trees of
    // every job, run or spawned, and reaps them before the agent exits.
    for f in lock(&jobs.cancels).values() {
        f.store(true, Ordering::SeqCst);
    }
    crate::exit::Exit::Success
}

/// A request's work, run on a worker.
type Task = Box<dyn FnOnce() + Send>;

/// The agent's worker threads: a request goes to an idle one, or to a new one when all are
/// busy (a long wait or job never holds up a quick call). Workers stay for the next
/// requests, and end when the agent drops this.
struct Workers {
    tx: std::sync::mpsc::Sender<Task>,
    rx: Arc<Mutex<std::sync::mpsc::Receiver<Task>>>,
    /// Workers waiting for a task and not yet promised one.
    idle: Arc<std::sync::atomic::AtomicUsize>,
}

impl Workers {
    fn new() -> Workers {
        let (tx, rx) = std::sync::mpsc::channel();
        Workers {
            tx,
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::default(),
        }
    }

    fn run(&self, task: Task) -> std::io::Result<()> {
        // An idle worker claimed here takes the task from the channel: there are never more
        // tasks queued than workers that will take them.
        if self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            if let Err(e) = self.tx.send(task) {
                return Err(std::io::Error::other(format!("no worker: {e}")));
            }
            return Ok(());
        }
        let (rx, idle) = (self.rx.clone(), self.idle.clone());
        std::thread::Builder::new()
            .name("agent-worker".into())
            .spawn(move || {
                let mut task = task;
                loop {
                    task();
                    idle.fetch_add(1, Ordering::SeqCst);
                    // The lock is held only while waiting; the agent's end closes the channel.
                    match lock(&rx).recv() {
                        Ok(t) => task = t,
                        Err(_) => return,
                    }
                }
            })
            .map(drop)
    }
}

fn handle(
    s: &Session,
    req: Request,
    out: &Out,
    jobs: &Arc<Jobs>,
    cancel: Option<CancelGuard>,
    served: Served,
) -> Body {
    let never = AtomicBool::new(false);
    let stop = cancel.as_ref().map_or(&never, |c| &*c.flag);
    // No progress line: the client has its own.
    let mut quiet = |_: &str| {};
    let mut here = Local::new(
        s,
        Watch {
            stop,
            show: &mut quiet,
        },
    )
    .serving(served.clone());
    if let Some(body) = ops::answer(&req.call, &mut here) {
        return body;
    }
    match req.call {
        Call::Run(rc) => {
            let cancel = cancel.unwrap_or_else(|| jobs.cancel_flag(req.id));
            run(req.id, rc, out, cancel, served)
        }
        Call::Spawn(rc) => spawn(req.id, rc, out, jobs, served),
        Call::JobWait { job, timeout_ms } => match jobs.spawned(job) {
            Ok(j) => {
                let cancel = cancel.unwrap_or_else(|| jobs.cancel_flag(req.id));
                j.wait(Some(Duration::from_millis(timeout_ms)), &cancel.flag);
                state(job, &j, true)
            }
            Err(b) => b,
        },
        Call::JobKill {
            job,
            signal,
            grace_ms,
        } => {
            let sig = match parse_signal(&signal) {
                Ok(sig) => sig,
                Err(why) => return error(ErrorKind::BadParams, why.to_string()),
            };
            match jobs.spawned(job) {
                Ok(j) => match j.stop_for(
                    Some(&served),
                    sig,
                    grace_ms.map(crate::process::kill::grace_of_ms),
                ) {
                    Some(_) => state(job, &j, true),
                    None => error(
                        ErrorKind::Failed,
                        RunError::Stuck { pid: j.pid() }.to_string(),
                    ),
                },
                Err(b) => b,
            }
        }
        Call::JobStatus { job } => match jobs.spawned(job) {
            Ok(j) => state(job, &j, false),
            Err(b) => b,
        },
        Call::Ping => Body::ok(&true),
        Call::Cancel { .. } | Call::ReachedAs { .. } => error(ErrorKind::Failed, "answered inline"),
        // Every other call names an operation, answered above.
        _ => error(ErrorKind::Failed, "answered as an operation"),
    }
}

/// A spawned job's state; its outcome only when asked (a status poll stays small).
fn state(job: u64, j: &Job, with_outcome: bool) -> Body {
    let outcome = if with_outcome { j.outcome() } else { None };
    Body::ok(&JobState {
        job,
        pid: j.pid().into(),
        running: j.running(),
        outcome,
    })
}

/// The job a run or spawn request describes; its output goes to the client as `Output`
/// lines of request `id`.
fn job_of(id: u64, rc: RunCall, out: &Out, served: Served) -> Result<(Cmd, JobOpts), Body> {
    let cmd = match (rc.shell, rc.argv) {
        (Some(l), None) => Cmd::Shell(l),
        (None, Some(a)) => Cmd::Argv(a),
        _ => {
            return Err(error(
                ErrorKind::BadParams,
                "run and spawn need exactly one of shell and argv",
            ))
        }
    };
    let sink = rc.echo.then(|| {
        let out = out.clone();
        Sink(Arc::new(move |stdout: bool, data: &[u8]| {
            out.send(&Message::Output {
                id,
                stream: if stdout {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                },
                data: String::from_utf8_lossy(data).into_owned(),
            })
        }))
    });
    let opts = JobOpts {
        timeout: rc.timeout_ms.map(Duration::from_millis),
        cwd: rc.cwd.map(Into::into),
        env: rc.env,
        echo: false,
        grace: crate::process::kill::grace_of_ms(rc.grace_ms),
        keep_children: rc.keep_children,
        sink,
        served: Some(served),
    };
    Ok((cmd, opts))
}

/// Starts a background job and answers at once; it runs until it ends, a `job_kill`, its
/// timeout, or the connection's end.
fn spawn(id: u64, rc: RunCall, out: &Out, jobs: &Jobs, served: Served) -> Body {
    let (cmd, opts) = match job_of(id, rc, out, served) {
        Ok(x) => x,
        Err(b) => {
            jobs.settle(id, None);
            return b;
        }
    };
    match Job::spawn(&cmd, opts) {
        Ok(job) => {
            let job = Arc::new(job);
            jobs.settle(id, Some(job.clone()));
            state(id, &job, false)
        }
        Err(e) => {
            jobs.settle(id, None);
            error(ErrorKind::Failed, e.to_string())
        }
    }
}

/// Runs a job, streaming its output to the client; a cancel (or the client going away)
/// stops its whole tree.
fn run(id: u64, rc: RunCall, out: &Out, cancel: CancelGuard, served: Served) -> Body {
    let (cmd, opts) = match job_of(id, rc, out, served) {
        Ok(x) => x,
        Err(b) => return b,
    };
    let result = Job::spawn(&cmd, opts).and_then(|job| match job.wait(None, &cancel.flag) {
        Waited::Done(o) => Ok(o),
        Waited::Running | Waited::Interrupted => job
            .stop(Signal::SIGTERM, None)
            .ok_or(RunError::Stuck { pid: job.pid() }),
    });
    drop(cancel);
    match result {
        Ok(o) => Body::ok(&o),
        Err(e) => error(ErrorKind::Failed, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task waiting does not hold up the next one, and a worker that is done takes the
    /// next task instead of a new thread starting.
    #[test]
    fn workers_run_tasks_at_once_and_are_reused() {
        use std::sync::mpsc::channel;
        let w = Workers::new();
        let (release_tx, release_rx) = channel::<()>();
        let (done_tx, done_rx) = channel::<&str>();
        let d = done_tx.clone();
        w.run(Box::new(move || {
            let _ = release_rx.recv();
            let _ = d.send("long");
        }))
        .unwrap();
        let d = done_tx.clone();
        w.run(Box::new(move || {
            let _ = d.send("quick");
        }))
        .unwrap();
        let wait = Duration::from_secs(60);
        assert_eq!(done_rx.recv_timeout(wait), Ok("quick"));
        release_tx.send(()).unwrap();
        assert_eq!(done_rx.recv_timeout(wait), Ok("long"));
        let deadline = std::time::Instant::now() + wait;
        while w.idle.load(Ordering::SeqCst) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the workers never came back"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for _ in 0..10 {
            let d = done_tx.clone();
            w.run(Box::new(move || {
                let _ = d.send("again");
            }))
            .unwrap();
            assert_eq!(done_rx.recv_timeout(wait), Ok("again"));
            while w.idle.load(Ordering::SeqCst) < 2 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "a worker never came back"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // Two workers did all twelve tasks: no thread beyond them was started.
        assert_eq!(Arc::strong_count(&w.idle), 3);
    }
}
