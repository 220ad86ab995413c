//! A machine answers operations: this one (`Local`: the backend, /proc, signals) or another
//! through its agent (`Remote`: one connection of the host set's pool). Each operation is
//! written once, as an `Op`: what it does here (`Op::here`), the call that asks an agent for
//! it (`Ask::call`), and the type of its answer (`Ask::Reply`), so a caller can never read a
//! reply as the wrong type. The agent answers a call by running the same `Op` on its `Local`.
//!
//! `fleet` runs an operation on every machine of the host set at once and keeps each host's
//! part apart (`PerHost`); what an unreachable host does to the call is the fleet's
//! `OnError`, passed explicitly. `ops` holds the read-only operations, `kill` and `wait` the
//! ones that act, `jobs` the commands run on a machine.
//!
//! Adding a read-only operation: an `Op` in `ops.rs` (its work here and its `Call`), its
//! variant in `hosts/protocol.rs` (its wire name comes from the variant's, and
//! `Call::handling` must say how it is handled: an exhaustive match), its arm in
//! `ops::answer` (what the agent runs for it: exhaustive too), a front end that asks the
//! fleet for it, and a test. Forgetting the handling or the answer does not compile.

pub(crate) mod fleet;
pub(crate) mod jobs;
pub(crate) mod kill;
pub(crate) mod ops;
pub(crate) mod reset;
pub(crate) mod wait;

pub(crate) use fleet::{Fleet, PerHost};
pub(crate) use kill::{holder_targets, holder_why};
pub(crate) use ops::HoldersReport;
pub(crate) use wait::{describe_diagnosis, why_not_clean, CleanReport};

use crate::gpu::GpuError;
use crate::hosts::protocol::Call;
use crate::hosts::{HostError, Pool};
use crate::journal::Served;
use crate::session::Session;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Why an operation failed, wherever it ran, and how a command that fails so ends.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ActionError {
    /// A mistake in what was asked, found before anything ran (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The GPUs or the processes of a machine (exit 1; 2 where the GPU layer says the
    /// mistake was the caller's, such as an unknown GPU or user).
    #[error("{0}")]
    Gpu(GpuError),
    /// A host of the set: unreachable, or the call failed there (exit 2 where the agent
    /// called it a usage mistake, as the same mistake is here).
    #[error("{0}")]
    Host(HostError),
    /// The operation failed on the machine for a reason of its own (its journal unreadable).
    #[error("{0}")]
    Failed(String),
    #[error("interrupted")]
    Interrupted,
}

impl ActionError {
    /// A mistake in what was asked, here or on a host.
    pub fn is_usage(&self) -> bool {
        match self {
            ActionError::Usage(_) => true,
            ActionError::Gpu(e) => e.is_usage(),
            ActionError::Host(e) => e.is_usage(),
            ActionError::Failed(_) | ActionError::Interrupted => false,
        }
    }

    /// What went wrong in a few words, alike for every host it happened to: a summary's
    /// row, where hosts that failed the same way fold into one.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ActionError::Usage(_) => "usage error",
            ActionError::Gpu(e) => e.kind(),
            ActionError::Host(e) => e.kind(),
            ActionError::Failed(_) => "failed",
            ActionError::Interrupted => "interrupted",
        }
    }

    /// The host could not be reached or used (as opposed to a call that failed there).
    pub fn unreachable(&self) -> bool {
        matches!(self, ActionError::Host(e) if e.unreachable())
    }

    pub fn exit(&self) -> crate::exit::Exit {
        use crate::exit::Exit;
        match self {
            ActionError::Interrupted => Exit::Interrupted,
            e if e.is_usage() => Exit::Usage,
            _ => Exit::Failure,
        }
    }
}

impl From<GpuError> for ActionError {
    fn from(e: GpuError) -> Self {
        match e {
            GpuError::Interrupted => ActionError::Interrupted,
            e => ActionError::Gpu(e),
        }
    }
}

impl From<HostError> for ActionError {
    fn from(e: HostError) -> Self {
        match e {
            HostError::Interrupted => ActionError::Interrupted,
            e => ActionError::Host(e),
        }
    }
}

/// A call an agent answers, and the type of its answer.
pub(crate) trait Ask {
    type Reply: Serialize + DeserializeOwned + Received + Send + 'static;
    /// The call as it crosses the wire.
    fn call(&self) -> Call;
    /// How long the call may take by design (a grace, a wait's timeout), before the host's
    /// call timeout counts; `None`: no bound (a job without a timeout, a grace without end).
    fn takes(&self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

/// An operation any machine answers: here with `here`, elsewhere through its `Ask::call`.
pub(crate) trait Op: Ask {
    fn here(&self, m: &mut Local) -> Result<Self::Reply, ActionError>;
}

/// What a reply needs once it has come from another host: every record in it that carries a
/// pid or a GPU names that host (a `kill()` of it must go there, never here), and what the
/// wire leaves out is read back.
pub(crate) trait Received {
    fn received_from(&mut self, host: &str);
}

/// One machine: it answers any operation.
pub(crate) trait Machine {
    fn ask<O: Op>(&mut self, op: &O) -> Result<O::Reply, ActionError>;
}

/// How a long operation (kill's grace, a wait, a clean) shows progress and learns it must
/// stop: a line on a terminal and Ctrl-C for the CLI and scripts; progress notifications and
/// a per-call flag for the MCP server; a cancel flag for the agent.
pub(crate) struct Watch<'a> {
    pub stop: &'a AtomicBool,
    pub show: &'a mut dyn FnMut(&str),
}

/// This machine, as one session sees it, with the watch of the call being answered.
pub(crate) struct Local<'a> {
    pub s: &'a Session,
    pub watch: Watch<'a>,
    /// The server call being answered (an MCP tool call, a remote client's request): the
    /// signals it leads to are journaled with it.
    pub served: Option<Served>,
}

impl<'a> Local<'a> {
    pub(crate) fn new(s: &'a Session, watch: Watch<'a>) -> Local<'a> {
        Local {
            s,
            watch,
            served: None,
        }
    }

    /// This machine answering the server call `served`.
    pub(crate) fn serving(self, served: Served) -> Local<'a> {
        Local {
            served: Some(served),
            ..self
        }
    }

    /// Runs `f` on this machine with the terminal's watch: a progress line on stderr (when
    /// it is a terminal), cleared afterwards, and Ctrl-C.
    pub(crate) fn on_terminal<T>(s: &Session, f: impl FnOnce(&mut Local) -> T) -> T {
        let mut line = crate::output::ProgressLine::default();
        let out = f(&mut Local {
            s,
            watch: Watch {
                stop: s.interrupted(),
                show: &mut |text| line.show(text),
            },
            served: None,
        });
        line.clear();
        out
    }
}

impl Machine for Local<'_> {
    fn ask<O: Op>(&mut self, op: &O) -> Result<O::Reply, ActionError> {
        op.here(self)
    }
}

/// Another host of the set, reached through its agent on the session's pool.
pub(crate) struct Remote<'a> {
    pub pool: &'a Pool,
    pub host: &'a str,
    /// What ends a call early: Ctrl-C, or never (a stop must reach the agent even then).
    pub interrupted: &'static AtomicBool,
}

impl Remote<'_> {
    /// Any call the agent answers (a job's wait or stop as well as an operation).
    pub(crate) fn call<A: Ask>(&self, a: &A) -> Result<A::Reply, ActionError> {
        let deadline = deadline(self.pool, a.takes());
        let mut r: A::Reply = self
            .pool
            .call(self.host, a.call(), deadline, self.interrupted)?;
        r.received_from(self.host);
        Ok(r)
    }
}

/// A remote call's deadline: what it takes by design, and the host's call timeout on top.
pub(crate) fn deadline(pool: &Pool, takes: Option<Duration>) -> Option<Duration> {
    takes?.checked_add(pool.config.call_timeout)
}

impl Machine for Remote<'_> {
    fn ask<O: Op>(&mut self, op: &O) -> Result<O::Reply, ActionError> {
        self.call(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A summary row's words come from the error's variant, not from the text before its
    /// first ": ": hosts that lack the same GPU fold into one row whatever their counts
    /// (the text's first part, "no GPU with index 9 (this machine has 8)", kept them apart).
    #[test]
    fn hosts_that_failed_the_same_way_say_the_same_few_words() {
        let no_gpu = |count| ActionError::Gpu(GpuError::NoSuchGpu { index: 9, count });
        assert_eq!(no_gpu(8).kind(), no_gpu(4).kind());
        assert_eq!(no_gpu(8).kind(), "no such GPU");
        let lost = ActionError::from(HostError::Timeout {
            host: "gpu01".into(),
            method: "gpus".into(),
            secs: 60.0,
        });
        assert_eq!(lost.kind(), "no answer");
        assert_eq!(
            ActionError::from(HostError::Interrupted).kind(),
            "interrupted"
        );
    }
}
