//! How a gpuloop command ends, and the one place that becomes the process's exit code.
//!
//! A command returns an `Exit` (it ran; this is how it went) or an error; each error says
//! which `Exit` it means (`Error::exit`, `ActionError::exit`, `ScriptError::exit`), and
//! `cli::exit_code` prints the error and turns either into the status, as ripgrep's `main`.

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done, and everything is as asked.
    Success,
    /// 1: done, but not as it should be (a GPU not clean, a survivor, a host that failed),
    /// or a failure of the machine (a script's runtime error, no driver).
    Failure,
    /// 2: a mistake in what was asked (a usage or compile error).
    Usage,
    /// 130: Ctrl-C or SIGTERM ended it (128 + SIGINT, as shells say it).
    Interrupted,
    /// A script's own `exit(N)`: N as given.
    Code(u8),
}

impl Exit {
    /// The process's exit status.
    pub fn code(self) -> i32 {
        match self {
            Exit::Success => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::Interrupted => 130,
            Exit::Code(n) => i32::from(n),
        }
    }

    /// The status a script's `exit(code)` asks for: 0 to 255 as given, anything else a
    /// failure (which must never read as success, as `exit(-1)` clamped to 0 once did).
    pub(crate) fn of_script(code: i64) -> Exit {
        u8::try_from(code).map_or(Exit::Failure, Exit::Code)
    }

    pub fn is_success(self) -> bool {
        self.code() == 0
    }

    /// The worse of two ends of one command (its hosts', its parts'): the higher status, so
    /// that an interrupt outranks a usage error, which outranks a failure.
    pub(crate) fn worse(self, other: Exit) -> Exit {
        if other.code() > self.code() {
            other
        } else {
            self
        }
    }

    /// `Success` when `ok`, else `Failure`: a command's verdict on what it found.
    pub(crate) fn success_if(ok: bool) -> Exit {
        match ok {
            true => Exit::Success,
            false => Exit::Failure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statuses scripts and tests rely on (the contract's 0, 1, 2 and 130).
    #[test]
    fn each_end_is_its_documented_status() {
        let codes: Vec<i32> = [Exit::Success, Exit::Failure, Exit::Usage, Exit::Interrupted]
            .into_iter()
            .map(Exit::code)
            .collect();
        assert_eq!(codes, [0, 1, 2, 130]);
        assert_eq!(Exit::Code(42).code(), 42);
    }

    #[test]
    fn a_scripts_exit_code_outside_a_status_is_a_failure_never_success() {
        assert_eq!(Exit::of_script(0).code(), 0);
        assert_eq!(Exit::of_script(255).code(), 255);
        assert_eq!(Exit::of_script(-1), Exit::Failure);
        assert_eq!(Exit::of_script(256), Exit::Failure);
        assert!(Exit::of_script(0).is_success() && !Exit::of_script(3).is_success());
    }

    #[test]
    fn the_worse_end_wins_interrupted_over_usage_over_failure() {
        assert_eq!(Exit::Success.worse(Exit::Failure), Exit::Failure);
        assert_eq!(Exit::Usage.worse(Exit::Failure), Exit::Usage);
        assert_eq!(Exit::Usage.worse(Exit::Interrupted), Exit::Interrupted);
        assert_eq!(Exit::Failure.worse(Exit::Success), Exit::Failure);
    }
}
