//! Commands run on a machine: `run()` to the end, `spawn()` in the background. A remote job
//! runs under its host's agent, which stops it (whole tree) when the connection ends.

use super::{ActionError, Ask, Fleet, Received, Remote};
use crate::hosts::protocol::{self, Call, JobState};
use crate::hosts::LOCAL;
use crate::process::kill::{self, signal_name};
use crate::runner::{self, Cmd, Job, JobOpts, Outcome, RunError, Waited};
use crate::session::Session;
use nix::sys::signal::Signal;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs a command to its end on another host. Here a job runs under `runner` directly, and
/// the agent runs one under its job table (its output streams back, a cancel stops it):
/// neither is a `Local` operation.
pub(crate) struct Run<'a> {
    pub cmd: &'a Cmd,
    pub opts: &'a JobOpts,
}

impl Ask for Run<'_> {
    type Reply = Outcome;
    fn call(&self) -> Call {
        Call::Run(run_call(self.cmd, self.opts))
    }
    /// No deadline unless the job has one: a lost link still ends the call at once.
    fn takes(&self) -> Option<Duration> {
        self.opts.timeout?.checked_add(self.opts.grace)
    }
}

impl Received for Outcome {
    fn received_from(&mut self, _: &str) {}
}

impl Received for JobState {
    fn received_from(&mut self, _: &str) {}
}

/// The calls about a spawned job, which its host's agent answers from its job table.
enum JobCall {
    Spawn(protocol::RunCall),
    Status {
        job: u64,
    },
    Wait {
        job: u64,
        slice: Duration,
    },
    Stop {
        job: u64,
        signal: Signal,
        grace: Duration,
    },
}

impl Ask for JobCall {
    type Reply = JobState;
    fn call(&self) -> Call {
        match self {
            JobCall::Spawn(rc) => Call::Spawn(rc.clone()),
            JobCall::Status { job } => Call::JobStatus { job: *job },
            JobCall::Wait { job, slice } => Call::JobWait {
                job: *job,
                timeout_ms: slice.as_millis() as u64,
            },
            JobCall::Stop { job, signal, grace } => Call::JobKill {
                job: *job,
                signal: signal_name(*signal).to_string(),
                grace_ms: Some(kill::grace_ms(*grace)),
            },
        }
    }
    fn takes(&self) -> Option<Duration> {
        match self {
            JobCall::Spawn(_) | JobCall::Status { .. } => Some(Duration::ZERO),
            JobCall::Wait { slice, .. } => Some(*slice),
            // The stop's grace, the wait after SIGKILL and the output's drain; a stop that
            // never KILLs (`grace: "inf"`) waits for the tree: no deadline.
            JobCall::Stop { grace, .. } => grace.checked_add(Duration::from_secs(10)),
        }
    }
}

/// A job as it crosses the wire to an agent.
fn run_call(cmd: &Cmd, opts: &JobOpts) -> protocol::RunCall {
    let (shell, argv) = match cmd {
        Cmd::Shell(l) => (Some(l.clone()), None),
        Cmd::Argv(a) => (None, Some(a.clone())),
    };
    protocol::RunCall {
        shell,
        argv,
        timeout_ms: opts.timeout.map(|t| t.as_millis() as u64),
        cwd: opts.cwd.as_ref().map(|p| p.display().to_string()),
        env: opts.env.clone(),
        grace_ms: kill::grace_ms(opts.grace),
        echo: opts.echo,
        keep_children: opts.keep_children,
    }
}

/// A failed call to a job's host, as a job error.
fn remote_run_err(host: &str, e: ActionError) -> RunError {
    match e {
        ActionError::Interrupted => RunError::Interrupted,
        e => RunError::Remote {
            host: host.to_string(),
            why: e.to_string(),
        },
    }
}

/// The remote machine a job runs on; `None` for this one.
fn job_host<'a>(s: &'a Session, host: Option<&'a str>) -> Result<Option<Remote<'a>>, RunError> {
    Fleet::of(s).remote(host).map_err(|why| RunError::Remote {
        host: host.unwrap_or(LOCAL).to_string(),
        why,
    })
}

/// Runs a job on a host of the set (`None` or `"local"`: here, streamed as it runs; a
/// remote job's output comes back prefixed with its host's name).
pub(crate) fn run(
    s: &Session,
    host: Option<&str>,
    cmd: &Cmd,
    opts: JobOpts,
) -> Result<Outcome, RunError> {
    match job_host(s, host)? {
        None => runner::run(cmd, opts, s.interrupted()),
        Some(m) => m
            .call(&Run { cmd, opts: &opts })
            .map_err(|e| remote_run_err(m.host, e)),
    }
}

/// A job started by spawn(): here, or on a host of the set under its agent (which stops
/// it, whole tree, when the connection ends). Both answer the same questions.
pub(crate) enum Spawned {
    Local(Job),
    Remote(RemoteJob),
}

/// A background job on another host, known to its agent by the spawn request's id.
pub(crate) struct RemoteJob {
    session: Arc<Session>,
    host: String,
    job: u64,
    pid: i32,
    cmd: String,
    timeout: Option<Duration>,
    grace: Duration,
    /// Its outcome, once seen (the agent's answer does not change after).
    outcome: Mutex<Option<Outcome>>,
}

/// What spawn() gives a script: the job, and whether waiting throws on failure (`check`).
#[derive(Clone)]
pub(crate) struct JobHandle {
    pub job: Arc<Spawned>,
    pub check: bool,
}

impl std::fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.job.fmt(f)
    }
}

impl std::fmt::Debug for Spawned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spawned::Local(j) => j.fmt(f),
            Spawned::Remote(r) => write!(f, "Job(pid {} on {}: {})", r.pid, r.host, r.cmd),
        }
    }
}

/// How long one remote wait asks the agent to wait: a wait without end is a series of
/// these, so a host that stops answering is noticed within the call deadline.
const WAIT_SLICE: Duration = Duration::from_secs(10);

/// Starts a job in the background, here or on a host of the set.
pub(crate) fn spawn(
    s: &Arc<Session>,
    host: Option<&str>,
    cmd: &Cmd,
    opts: JobOpts,
) -> Result<Spawned, RunError> {
    let Some(m) = job_host(s, host)? else {
        return Job::spawn(cmd, opts).map(Spawned::Local);
    };
    let st = m
        .call(&JobCall::Spawn(run_call(cmd, &opts)))
        .map_err(|e| remote_run_err(m.host, e))?;
    Ok(Spawned::Remote(RemoteJob {
        session: s.clone(),
        host: m.host.to_string(),
        job: st.job,
        pid: st.pid as i32,
        cmd: cmd.display(),
        timeout: opts.timeout,
        grace: opts.grace,
        outcome: Mutex::new(None),
    }))
}

impl Spawned {
    pub(crate) fn pid(&self) -> i32 {
        match self {
            Spawned::Local(j) => j.pid(),
            Spawned::Remote(r) => r.pid,
        }
    }

    /// Where it runs: `local`, or the host's name.
    pub(crate) fn host(&self) -> &str {
        match self {
            Spawned::Local(_) => LOCAL,
            Spawned::Remote(r) => &r.host,
        }
    }

    pub(crate) fn command(&self) -> &str {
        match self {
            Spawned::Local(j) => j.command(),
            Spawned::Remote(r) => &r.cmd,
        }
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        match self {
            Spawned::Local(j) => j.timeout(),
            Spawned::Remote(r) => r.timeout,
        }
    }

    /// True until the job's main process has exited.
    pub(crate) fn running(&self) -> Result<bool, RunError> {
        let r = match self {
            Spawned::Local(j) => return Ok(j.running()),
            Spawned::Remote(r) => r,
        };
        if r.done().is_some() {
            return Ok(false);
        }
        let st = r.call(&JobCall::Status { job: r.job }, &NEVER)?;
        Ok(st.running)
    }

    /// Waits for the outcome, up to `timeout` (forever with `None`), waking on Ctrl-C.
    pub(crate) fn wait(
        &self,
        timeout: Option<Duration>,
        interrupted: &'static AtomicBool,
    ) -> Result<Waited, RunError> {
        let r = match self {
            Spawned::Local(j) => return Ok(j.wait(timeout, interrupted)),
            Spawned::Remote(r) => r,
        };
        let end = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(o) = r.done() {
                return Ok(Waited::Done(o));
            }
            let slice = match end {
                Some(e) => e.saturating_duration_since(std::time::Instant::now()),
                None => WAIT_SLICE,
            }
            .min(WAIT_SLICE);
            let st = match r.call(&JobCall::Wait { job: r.job, slice }, interrupted) {
                Err(RunError::Interrupted) => return Ok(Waited::Interrupted),
                other => other?,
            };
            if let Some(o) = r.record(st) {
                return Ok(Waited::Done(o));
            }
            if end.is_some_and(|e| std::time::Instant::now() >= e) {
                return Ok(Waited::Running);
            }
        }
    }

    /// Stops the whole tree (`signal`, the grace, SIGKILL) and returns the outcome; `None`
    /// if the main process outlived SIGKILL. On a finished job it stops what it left behind.
    pub(crate) fn stop(
        &self,
        signal: Signal,
        grace: Option<Duration>,
    ) -> Result<Option<Outcome>, RunError> {
        let r = match self {
            Spawned::Local(j) => return Ok(j.stop(signal, grace)),
            Spawned::Remote(r) => r,
        };
        let stop = JobCall::Stop {
            job: r.job,
            signal,
            grace: grace.unwrap_or(r.grace),
        };
        let st = r.call(&stop, &NEVER)?;
        Ok(r.record(st))
    }
}

/// Never set: a stop must reach the agent even after Ctrl-C.
static NEVER: AtomicBool = AtomicBool::new(false);

impl RemoteJob {
    fn done(&self) -> Option<Outcome> {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Keeps the outcome the agent sent, if any, and prints the rest of the job's output.
    fn record(&self, st: JobState) -> Option<Outcome> {
        let o = st.outcome?;
        if let Some(pool) = self.session.pool() {
            pool.flush_output(&self.host, self.job);
        }
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(o.clone());
        Some(o)
    }

    /// A call about this job, ended early by `interrupted`.
    fn call(&self, call: &JobCall, interrupted: &'static AtomicBool) -> Result<JobState, RunError> {
        let remote = job_host(&self.session, Some(&self.host))?.ok_or(RunError::Remote {
            host: self.host.clone(),
            why: "no host set".into(),
        })?;
        Remote {
            interrupted,
            ..remote
        }
        .call(call)
        .map_err(|e| remote_run_err(&self.host, e))
    }
}
