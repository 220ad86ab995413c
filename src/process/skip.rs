//! Why kill() left a process alone: a `SkipReason` says it as a category with its facts; the
//! words are made from it at the edge (`Display`, and the JSON, which carries the words).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// What a refused daemon's reason says would stop it (`Forcing::Allowed` in a kill).
const FORCE_ANYWAY: &str = "force stops it anyway: --force, or force: true in a script";
/// The same, where a holders kill left a daemon that holds memory out.
const FORCE_HINT: &str = "--force stops it";
/// Through MCP no flag stops a daemon: what its reasons say instead.
const NEVER_FORCED: &str = "MCP never stops it (the person can, with --force)";

/// Whether the caller could stop a protected daemon anyway, and so what its reason advises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Forcing {
    /// With `--force` (or `force: true`).
    #[default]
    Allowed,
    /// Never through this front end (MCP).
    Never,
}

/// Why a process was not signalled. Everything that decides by a reason (a target that is
/// gone, a daemon MCP never forces) matches a variant; only `Display` makes words.
#[derive(Debug, Clone, PartialEq, Eq, schemars::JsonSchema)]
// A string in JSON and MCP's schemas, as it always was.
#[schemars(
    with = "String",
    inline,
    description = "Why it was not signalled, in words (gone, protected, outside the scope, …)."
)]
pub enum SkipReason {
    /// It had exited before it could be signalled: not an error for a holder seen earlier,
    /// but a bare pid the command line named that does not exist is.
    Gone,
    /// pid 1, 0 or below.
    NeverSignalled {
        pid: i32,
    },
    /// kill(2) of a kernel thread's pid once reached kthreadd and every kernel thread.
    KernelThread {
        pid: i32,
        comm: String,
    },
    /// gpuloop itself.
    Itself,
    Ancestor {
        pid: i32,
        comm: String,
    },
    /// A zombie whose threads are all gone holds nothing; its parent must reap it.
    Zombie {
        ppid: i32,
    },
    /// A protected GPU daemon, refused by the kill.
    Protected {
        comm: String,
        forcing: Forcing,
    },
    /// A protected GPU daemon that holds memory, left out of a holders kill.
    DaemonHolds {
        name: String,
        mib: i64,
        gpus: Vec<i64>,
        forcing: Forcing,
    },
    /// The main process of a systemd unit, which would restart it; `stop` is the command
    /// that stops the unit, as a person types it there.
    UnitMain {
        unit: String,
        stop: String,
    },
    /// Outside the kill's bound (`--user`, `--pod`, `--container`): where it is, and why.
    Outside(String),
    /// No longer tied (`what`: "a child of", "in the process group of") to the pinned
    /// process it was found through: its pid may have been reused.
    Untied {
        pid: i32,
        comm: String,
        what: &'static str,
        anchor: i32,
        anchor_comm: String,
    },
    /// It could not be pinned: /proc unreadable, or its pid now another process's.
    Unpinned(String),
    /// Its host could not be reached.
    Unreachable {
        host: String,
        detail: String,
    },
    /// Could not act on the signal asked for, so it got (`sent`) or would get KILL at once.
    KilledAtOnce {
        pid: i32,
        why: String,
        sent: bool,
    },
    /// The words of another host's agent: only the words cross the wire.
    Said(String),
}

impl SkipReason {
    /// The process had exited before it could be signalled.
    pub(crate) fn is_gone(&self) -> bool {
        matches!(self, SkipReason::Gone)
    }

    /// Through a front end that never forces (MCP): a daemon's reason says so, not which
    /// flag would stop it.
    pub(crate) fn never_forced(&mut self) {
        if let SkipReason::Protected { forcing, .. } | SkipReason::DaemonHolds { forcing, .. } =
            self
        {
            *forcing = Forcing::Never;
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let force = |forcing: &Forcing, allowed: &'static str| match forcing {
            Forcing::Allowed => allowed,
            Forcing::Never => NEVER_FORCED,
        };
        match self {
            SkipReason::Gone => f.write_str("already gone"),
            SkipReason::NeverSignalled { pid } => write!(f, "pid {pid} is never signalled"),
            SkipReason::KernelThread { pid, comm } => {
                write!(f, "pid {pid} ({comm}) is a kernel thread: never signalled")
            }
            SkipReason::Itself => f.write_str("that is gpuloop itself"),
            SkipReason::Ancestor { pid, comm } => {
                write!(f, "pid {pid} ({comm}) is an ancestor of gpuloop")
            }
            SkipReason::Zombie { ppid } => write!(
                f,
                "zombie: it holds nothing, but its parent (pid {ppid}) must reap it"
            ),
            SkipReason::Protected { comm, forcing } => write!(
                f,
                "protected: {comm} is a GPU daemon ({})",
                force(forcing, FORCE_ANYWAY)
            ),
            SkipReason::DaemonHolds {
                name,
                mib,
                gpus,
                forcing,
            } => {
                let gpus: Vec<String> = gpus.iter().map(i64::to_string).collect();
                write!(
                    f,
                    "{name} is a protected GPU daemon ({mib} MiB on GPU {}): left alone; stop its service, or {}",
                    gpus.join(","),
                    force(forcing, FORCE_HINT)
                )
            }
            SkipReason::UnitMain { unit, stop } => write!(
                f,
                "main process of systemd unit {unit}, which would restart it: {stop} (or --force)"
            ),
            SkipReason::Outside(why) | SkipReason::Unpinned(why) | SkipReason::Said(why) => {
                f.write_str(why)
            }
            SkipReason::Untied {
                pid,
                comm,
                what,
                anchor,
                anchor_comm,
            } => write!(
                f,
                "pid {pid} ({comm}) is no longer {what} pid {anchor} ({anchor_comm}): its pid may have been reused; not signalled"
            ),
            SkipReason::Unreachable { host, detail } => {
                write!(f, "host {host} unreachable: {detail}")
            }
            SkipReason::KilledAtOnce { pid, why, sent } => {
                let verb = if *sent { "sent" } else { "would send" };
                write!(f, "pid {pid} {why}: {verb} KILL at once")
            }
        }
    }
}

/// The words, as the report's JSON has always carried them.
impl Serialize for SkipReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// From another host the words arrive; `Gone`, whose words are fixed, arrives as itself.
impl<'de> Deserialize<'de> for SkipReason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let words = String::deserialize(d)?;
        Ok(SkipReason::from(words))
    }
}

impl From<String> for SkipReason {
    fn from(words: String) -> Self {
        if words == SkipReason::Gone.to_string() {
            SkipReason::Gone
        } else {
            SkipReason::Said(words)
        }
    }
}

impl From<&str> for SkipReason {
    fn from(words: &str) -> Self {
        SkipReason::from(words.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every() -> Vec<SkipReason> {
        vec![
            SkipReason::Gone,
            SkipReason::NeverSignalled { pid: 1 },
            SkipReason::KernelThread {
                pid: 2,
                comm: "kthreadd".into(),
            },
            SkipReason::Itself,
            SkipReason::Ancestor {
                pid: 40,
                comm: "bash".into(),
            },
            SkipReason::Zombie { ppid: 7 },
            SkipReason::Protected {
                comm: "nvidia-persiste".into(),
                forcing: Forcing::Allowed,
            },
            SkipReason::DaemonHolds {
                name: "nv-hostengine".into(),
                mib: 300,
                gpus: vec![0, 1],
                forcing: Forcing::Allowed,
            },
            SkipReason::UnitMain {
                unit: "vllm.service".into(),
                stop: "systemctl stop vllm.service".into(),
            },
            SkipReason::Outside("owned by root, outside --user nobody".into()),
            SkipReason::Untied {
                pid: 9,
                comm: "python3".into(),
                what: "a child of",
                anchor: 8,
                anchor_comm: "torchrun".into(),
            },
            SkipReason::Unpinned("cannot open /proc/9: denied".into()),
            SkipReason::Unreachable {
                host: "gpu01".into(),
                detail: "cannot connect: refused".into(),
            },
            SkipReason::KilledAtOnce {
                pid: 5,
                why: "ignores TERM (SigIgn)".into(),
                sent: true,
            },
        ]
    }

    /// The words the reports and the journal have always shown.
    #[test]
    fn each_reason_says_what_it_said_as_text() {
        let words: Vec<String> = every().iter().map(ToString::to_string).collect();
        assert_eq!(
            words,
            [
                "already gone",
                "pid 1 is never signalled",
                "pid 2 (kthreadd) is a kernel thread: never signalled",
                "that is gpuloop itself",
                "pid 40 (bash) is an ancestor of gpuloop",
                "zombie: it holds nothing, but its parent (pid 7) must reap it",
                "protected: nvidia-persiste is a GPU daemon (force stops it anyway: --force, or force: true in a script)",
                "nv-hostengine is a protected GPU daemon (300 MiB on GPU 0,1): left alone; stop its service, or --force stops it",
                "main process of systemd unit vllm.service, which would restart it: systemctl stop vllm.service (or --force)",
                "owned by root, outside --user nobody",
                "pid 9 (python3) is no longer a child of pid 8 (torchrun): its pid may have been reused; not signalled",
                "cannot open /proc/9: denied",
                "host gpu01 unreachable: cannot connect: refused",
                "pid 5 ignores TERM (SigIgn): sent KILL at once",
            ]
        );
    }

    /// The JSON carries the words; from another host they come back as words, except the
    /// one reason whose words are fixed, which comes back as itself.
    #[test]
    fn the_json_is_the_words_and_gone_comes_back_as_gone() {
        for r in every() {
            let json = serde_json::to_value(&r).unwrap();
            assert_eq!(json, serde_json::Value::String(r.to_string()));
            let back: SkipReason = serde_json::from_value(json).unwrap();
            assert_eq!(back.to_string(), r.to_string());
            assert_eq!(back.is_gone(), r == SkipReason::Gone, "{r}");
        }
    }

    /// MCP never forces: a daemon's reason says so instead of naming the flag; nothing
    /// else changes.
    #[test]
    fn never_forced_rewords_only_the_daemons() {
        for mut r in every() {
            let before = r.to_string();
            r.never_forced();
            let after = r.to_string();
            match r {
                SkipReason::Protected { .. } | SkipReason::DaemonHolds { .. } => {
                    assert!(after.contains(NEVER_FORCED), "{after}");
                    assert!(!after.contains("--force stops it") && !after.contains("force: true"));
                }
                _ => assert_eq!(before, after),
            }
        }
    }
}
