//! The top-level error: everything a command can fail with, and the exit code it means.

use crate::config::ConfigError;
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
}

impl Error {
    pub fn code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Config(_) => 2,
            Error::Script(e) => e.code(),
            Error::Gpu(e) if e.is_usage() => 2,
            Error::Action(e) => e.exit_code(),
            Error::Gpu(_) | Error::Other(_) => 1,
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
