//! The top-level error: everything a command can fail with, and how the command then ends.

use crate::config::ConfigError;
use crate::exit::Exit;
use crate::gpu::GpuError;
use crate::machine::ActionError;
use crate::script::ScriptError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad arguments or input: exit 2.
    #[error("{0}")]
    Usage(String),
    #[error("{}", .0.message())]
    Script(ScriptError),
    #[error("{0}")]
    Gpu(#[from] GpuError),
    /// An operation on a machine of the host set: its own exit code.
    #[error("{0}")]
    Action(#[from] ActionError),
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Other(String),
    /// Ctrl-C or SIGTERM before the command had anything to say (exit 130, nothing printed).
    #[error("")]
    Interrupted,
}

impl Error {
    /// How the command ends with this error.
    pub fn exit(&self) -> Exit {
        match self {
            Error::Usage(_) | Error::Config(_) => Exit::Usage,
            Error::Script(e) => e.exit(),
            Error::Gpu(e) if e.is_usage() => Exit::Usage,
            Error::Gpu(GpuError::Interrupted) => Exit::Interrupted,
            Error::Action(e) => e.exit(),
            Error::Gpu(_) | Error::Other(_) => Exit::Failure,
            Error::Interrupted => Exit::Interrupted,
        }
    }
}

impl From<crate::slurm::SlurmError> for Error {
    fn from(e: crate::slurm::SlurmError) -> Self {
        match e {
            crate::slurm::SlurmError::Gpu(g) => Error::Gpu(g),
            crate::slurm::SlurmError::Action(a) => Error::Action(a),
            other => Error::Usage(other.to_string()),
        }
    }
}

impl From<ScriptError> for Error {
    fn from(e: ScriptError) -> Self {
        Error::Script(e)
    }
}
