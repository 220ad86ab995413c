//! The job runner: a command in its own process group, its output streamed and captured in
//! bounded memory, a timeout, and its whole tree stopped (TERM, grace, KILL) when it must go.
//!
//! `job` spawns and waits, `capture` keeps head and tail of each stream, `supervise` makes
//! gpuloop a child subreaper and stops trees through the kill engine, `guard` outlives a
//! killed gpuloop to stop its jobs, `patch` applies the unified diffs a patch-and-rerun loop
//! is made of.

pub(crate) mod capture;
pub(crate) mod guard;
pub(crate) mod job;
pub mod patch;
pub(crate) mod supervise;

pub use job::Job;
pub(crate) use job::Waited;
pub(crate) use supervise::Supervisor;

use crate::process::kill::signal_name;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// What to run: a shell command line (`sh -c`) or an argv (no shell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    Shell(String),
    Argv(Vec<String>),
}

impl Cmd {
    /// The command as a person would type it, for messages.
    pub fn display(&self) -> String {
        match self {
            Cmd::Shell(s) => s.clone(),
            Cmd::Argv(argv) => argv
                .iter()
                .map(|a| {
                    let plain = !a.is_empty()
                        && a.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
                    if plain {
                        a.clone()
                    } else {
                        format!("'{}'", a.replace('\'', r"'\''"))
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// How to run it.
#[derive(Debug, Clone)]
pub struct JobOpts {
    /// Stop the tree after this long (`timed_out` in the outcome).
    pub timeout: Option<Duration>,
    pub cwd: Option<PathBuf>,
    /// Added to (or replacing in) gpuloop's own environment.
    pub env: Vec<(String, String)>,
    /// Stream the output live to gpuloop's stdout/stderr while capturing it.
    pub echo: bool,
    /// Between TERM and KILL when the tree is stopped.
    pub grace: Duration,
    /// Leave what the job left running when its leader exits (else it is stopped).
    pub keep_children: bool,
    /// Where the output goes instead of gpuloop's own stdout/stderr when `echo` is off
    /// (the agent sends it to its client).
    pub sink: Option<Sink>,
    /// The server call the job runs for, journaled with every signal its stop sends.
    pub(crate) served: Option<crate::journal::Served>,
}

/// Receives a job's output chunks: `(is_stdout, bytes)`.
pub(crate) type SinkFn = dyn Fn(bool, &[u8]) + Send + Sync;

/// Where a job's output goes besides the capture.
#[derive(Clone)]
pub struct Sink(pub std::sync::Arc<SinkFn>);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}

impl Default for JobOpts {
    fn default() -> Self {
        JobOpts {
            timeout: None,
            cwd: None,
            env: Vec::new(),
            echo: true,
            grace: Duration::from_secs(5),
            keep_children: false,
            sink: None,
            served: None,
        }
    }
}

/// How a job ended: the result map scripts get.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Outcome {
    /// Exit code, or `None` when a signal ended it.
    pub code: Option<i64>,
    /// "TERM", "KILL", "SEGV", … when a signal ended it.
    pub signal: Option<String>,
    /// Exit code 0 and not timed out.
    pub ok: bool,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed_ms: i64,
    pub pid: i64,
    /// The job's processes still running when its leader exited (stopped by then, unless
    /// `keep_children`). A result without them (a script's own map) read back has none.
    #[serde(default)]
    pub leftovers: Vec<i64>,
}

impl Outcome {
    /// "exited with code 3", "was killed by SEGV", "timed out after 2.0s (stopped with TERM)".
    pub fn how(&self, timeout: Option<Duration>) -> String {
        let ended = match (self.code, &self.signal) {
            (Some(c), _) => format!("exited with code {c}"),
            (None, Some(s)) => format!("was killed by {s}"),
            (None, None) => "ended".to_string(),
        };
        if self.timed_out {
            let after =
                timeout.map_or(String::new(), |t| format!(" after {:.1}s", t.as_secs_f64()));
            return format!("timed out{after} and was stopped ({ended})");
        }
        ended
    }

    /// The last `lines` lines of stderr (at most 4 KiB), for error messages.
    pub(crate) fn stderr_tail(&self, lines: usize) -> String {
        tail(&self.stderr, lines)
    }
}

/// The last `lines` lines of `text` (at most 4 KiB), trailing blank lines dropped.
pub fn tail(text: &str, lines: usize) -> String {
    let text = text.trim_end();
    let start = text
        .char_indices()
        .rev()
        .filter(|&(_, c)| c == '\n')
        .nth(lines.saturating_sub(1))
        .map_or(0, |(i, _)| i + 1);
    let mut tail = &text[start..];
    if tail.len() > 4096 {
        let mut cut = tail.len() - 4096;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = &tail[cut..];
    }
    tail.to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the command is empty")]
    Empty,
    #[error("cannot start `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("cwd {dir}: {why}")]
    Cwd { dir: String, why: String },
    #[error("interrupted")]
    Interrupted,
    /// A job on another host could not be run or followed to its end.
    #[error("on {host}: {why}")]
    Remote { host: String, why: String },
    #[error(
        "pid {pid} did not exit even after SIGKILL (stuck in the kernel or the driver, state D?)"
    )]
    Stuck { pid: i32 },
}

/// Runs a job to its end: spawns it, waits (up to its timeout), returns its outcome.
/// Ctrl-C (`interrupted`) stops the whole tree and returns `RunError::Interrupted`.
pub fn run(cmd: &Cmd, opts: JobOpts, interrupted: &AtomicBool) -> Result<Outcome, RunError> {
    let job = Job::spawn(cmd, opts)?;
    match job.wait(None, interrupted) {
        Waited::Done(o) => Ok(o),
        // Without a wait timeout the job ends first; kept for completeness of the match.
        Waited::Running => job
            .stop(Signal::SIGTERM, None)
            .ok_or(RunError::Stuck { pid: job.pid() }),
        Waited::Interrupted => {
            job.stop(Signal::SIGTERM, None);
            Err(RunError::Interrupted)
        }
    }
}

/// Signal name for an exit status's signal number.
fn name_of(sig: i32) -> String {
    Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| signal_name(s).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> JobOpts {
        JobOpts {
            echo: false,
            ..JobOpts::default()
        }
    }

    #[test]
    fn displays_argv_as_a_shell_would_read_it() {
        let c = Cmd::Argv(vec![
            "python3".into(),
            "-c".into(),
            "print('hi')".into(),
            "".into(),
        ]);
        assert_eq!(c.display(), r#"python3 -c 'print('\''hi'\'')' ''"#);
        assert_eq!(Cmd::Shell("a | b".into()).display(), "a | b");
    }

    #[test]
    fn describes_how_a_job_ended_and_keeps_the_stderr_tail() {
        let o = Outcome {
            code: Some(3),
            signal: None,
            ok: false,
            timed_out: false,
            stdout: String::new(),
            stderr: "e1\ne2\ne3\ne4\n".into(),
            elapsed_ms: 5,
            pid: 42,
            leftovers: Vec::new(),
        };
        assert_eq!(o.how(None), "exited with code 3");
        assert_eq!(o.stderr_tail(2), "e3\ne4");
        assert_eq!(o.stderr_tail(10), "e1\ne2\ne3\ne4");
        let killed = Outcome {
            code: None,
            signal: Some("TERM".into()),
            timed_out: true,
            ..o
        };
        assert_eq!(
            killed.how(Some(Duration::from_millis(300))),
            "timed out after 0.3s and was stopped (was killed by TERM)"
        );
    }

    #[test]
    fn an_interrupt_stops_the_job_and_says_so() {
        let interrupted = AtomicBool::new(true);
        let r = run(
            &Cmd::Argv(vec!["sleep".into(), "332".into()]),
            quiet(),
            &interrupted,
        );
        assert!(matches!(r, Err(RunError::Interrupted)), "{r:?}");
    }

    #[test]
    fn spawn_errors_name_the_command_or_the_directory() {
        let never = AtomicBool::new(false);
        let e = run(&Cmd::Argv(vec!["/nonexistent/x".into()]), quiet(), &never).unwrap_err();
        assert!(
            e.to_string().starts_with("cannot start `/nonexistent/x`"),
            "{e}"
        );
        let opts = JobOpts {
            cwd: Some("/nonexistent/dir".into()),
            ..quiet()
        };
        let e = run(&Cmd::Shell("true".into()), opts, &never).unwrap_err();
        assert!(e.to_string().starts_with("cwd /nonexistent/dir"), "{e}");
        assert!(matches!(
            run(&Cmd::Argv(vec![]), quiet(), &never),
            Err(RunError::Empty)
        ));
    }
}
