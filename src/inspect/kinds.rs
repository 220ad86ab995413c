//! The categories of a holder: its role, the evidence that it holds a GPU, and its process
//! state. Each has the name JSON, scripts and tables use, and the behaviour that depends on it.

use serde::{Deserialize, Serialize};

/// What a process does with the GPUs it has open.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Listed by the driver, or maps a GPU's node: a CUDA context.
    #[default]
    Compute,
    /// Has a GPU node open without mapping it: an NVML client (nvidia-smi, a monitor).
    Observer,
    /// A protected GPU daemon (persistenced, DCGM, MPS): never stopped without force.
    Daemon,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Compute, Role::Observer, Role::Daemon];

    /// The name scripts, JSON and tables use.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Compute => "compute",
            Role::Observer => "observer",
            Role::Daemon => "daemon",
        }
    }

    /// The role a name stands for.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Counts as a holder: what `holders()` lists without `all`, and what kill stops.
    pub(crate) fn is_compute(self) -> bool {
        self == Role::Compute
    }

    /// A protected daemon: its memory is meant to be there, and only force stops it.
    pub(crate) fn is_daemon(self) -> bool {
        self == Role::Daemon
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// How gpuloop knows a process holds a GPU.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// The driver lists it with memory on the GPU.
    Driver,
    /// It has the GPU's device node open.
    Fd,
    /// It maps the GPU's device node (a CUDA context does).
    Map,
}

impl Evidence {
    pub const ALL: [Evidence; 3] = [Evidence::Driver, Evidence::Fd, Evidence::Map];

    /// The name scripts, JSON and tables use.
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Driver => "driver",
            Evidence::Fd => "fd",
            Evidence::Map => "map",
        }
    }

    /// The evidence a name stands for.
    pub fn parse(name: &str) -> Option<Evidence> {
        Evidence::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Evidence of memory held on the GPU: an open node alone is only a handle (an NVML
    /// client has one), a listing or a mapping is a context.
    pub(crate) fn holds_memory(self) -> bool {
        self != Evidence::Fd
    }

    /// "driver+fd+map", as tables and the audit journal write a holder's evidence.
    pub fn joined(evidence: &[Evidence]) -> String {
        let names: Vec<&str> = evidence.iter().map(|e| e.as_str()).collect();
        names.join("+")
    }
}

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A process's scheduling state, from the letter in /proc/PID/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    Running,
    Sleeping,
    /// Asleep uninterruptibly (D): in the kernel or the driver; even SIGKILL waits.
    DiskSleep,
    Zombie,
    Stopped,
    TracingStop,
    Dead,
    Idle,
    Paging,
    Parked,
    Wakekill,
    Unknown,
}

impl RunState {
    const ALL: [RunState; 12] = [
        RunState::Running,
        RunState::Sleeping,
        RunState::DiskSleep,
        RunState::Zombie,
        RunState::Stopped,
        RunState::TracingStop,
        RunState::Dead,
        RunState::Idle,
        RunState::Paging,
        RunState::Parked,
        RunState::Wakekill,
        RunState::Unknown,
    ];

    /// The state a /proc/PID/stat letter stands for.
    pub(crate) fn from_letter(c: char) -> RunState {
        match c {
            'R' => RunState::Running,
            'S' => RunState::Sleeping,
            'D' => RunState::DiskSleep,
            'Z' => RunState::Zombie,
            'T' => RunState::Stopped,
            't' => RunState::TracingStop,
            'X' | 'x' => RunState::Dead,
            'I' => RunState::Idle,
            'W' => RunState::Paging,
            'P' => RunState::Parked,
            'K' => RunState::Wakekill,
            _ => RunState::Unknown,
        }
    }

    /// The name scripts, JSON and tables use.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Sleeping => "sleeping",
            RunState::DiskSleep => "disk-sleep",
            RunState::Zombie => "zombie",
            RunState::Stopped => "stopped",
            RunState::TracingStop => "tracing-stop",
            RunState::Dead => "dead",
            RunState::Idle => "idle",
            RunState::Paging => "paging",
            RunState::Parked => "parked",
            RunState::Wakekill => "wakekill",
            RunState::Unknown => "unknown",
        }
    }

    /// A state a person should notice in a table: the process cannot run on its own.
    pub(crate) fn is_trouble(self) -> bool {
        matches!(
            self,
            RunState::Zombie
                | RunState::DiskSleep
                | RunState::Stopped
                | RunState::TracingStop
                | RunState::Dead
        )
    }
}

/// A holder's state: its scheduling state, and whether its main thread has exited while
/// another thread keeps the GPU (a defunct thread-group leader). Written as one string,
/// "sleeping" or "sleeping (main thread exited)".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, schemars::JsonSchema)]
// A string in JSON and MCP's schemas, as it always was.
#[schemars(with = "String", inline)]
pub struct State {
    /// The state of the thread that holds the GPU (the process's own, unless its main
    /// thread has exited).
    pub run: RunState,
    pub main_thread_exited: bool,
}

const MAIN_THREAD_EXITED: &str = " (main thread exited)";

impl State {
    pub fn new(run: RunState) -> State {
        State {
            run,
            main_thread_exited: false,
        }
    }

    /// Read back from its string; a name gpuloop does not write is `unknown`.
    pub fn parse(text: &str) -> State {
        let (word, main_thread_exited) = match text.strip_suffix(MAIN_THREAD_EXITED) {
            Some(word) => (word, true),
            None => (text, false),
        };
        let run = RunState::ALL
            .into_iter()
            .find(|r| r.as_str() == word)
            .unwrap_or(RunState::Unknown);
        State {
            run,
            main_thread_exited,
        }
    }

    /// Asleep in the kernel or the driver: SIGKILL waits until it returns.
    pub(crate) fn is_disk_sleep(self) -> bool {
        self.run == RunState::DiskSleep
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.main_thread_exited {
            f.pad(&format!("{}{MAIN_THREAD_EXITED}", self.run.as_str()))
        } else {
            f.pad(self.run.as_str())
        }
    }
}

impl Serialize for State {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for State {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<State, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(State::parse(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_strings_json_and_scripts_always_had() {
        for r in Role::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        for e in Evidence::ALL {
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
            assert_eq!(Evidence::parse(e.as_str()), Some(e));
        }
        for (letter, name) in [('R', "running"), ('D', "disk-sleep"), ('t', "tracing-stop")] {
            assert_eq!(RunState::from_letter(letter).as_str(), name);
        }
        let defunct = State {
            run: RunState::Sleeping,
            main_thread_exited: true,
        };
        let text = serde_json::to_string(&defunct).unwrap();
        assert_eq!(text, r#""sleeping (main thread exited)""#);
        assert_eq!(serde_json::from_str::<State>(&text).unwrap(), defunct);
        assert_eq!(State::parse("disk-sleep"), State::new(RunState::DiskSleep));
        assert_eq!(State::parse("napping").run, RunState::Unknown);
        assert_eq!(Evidence::joined(&Evidence::ALL), "driver+fd+map");
    }
}
