//! The wire between `gpuloop agent` and its client: line-delimited JSON, one message a line.
//!
//! The agent speaks first (`Hello`); then each `Request` carries an id, and the agent answers
//! it with exactly one `Reply` of that id (a result or an error, as data), after any number of
//! `Output` lines for a running job. Requests on one connection may overlap.
//!
//! Protocol 2 added background jobs: `spawn` answers at once with the job's pid (its output
//! then streams as `Output` lines of the spawn's id), and `job_wait`, `job_kill`,
//! `job_status` act on it by that id; and `ping`, which the agent answers at once, so a
//! client can tell a host that hangs from a call that takes long. Protocol 3 added
//! `holders_report`: the holders and how many processes could not be inspected there.
//! Protocol 4: a filter's user crosses as the user gave it (`{"name": "alice"}`,
//! `{"uid": 4242}` or `"me"`) and each agent looks it up in its own user database (protocol 3
//! sent a uid resolved on the client, which names another user where uids differ); a filter
//! with a field it does not know is refused, never read as "no filter". And `reached_as`,
//! which the client sends first: how it names the host, for the commands in advice.
//! Protocol 6: GPU records carry `faults`, diagnoses `faults` and `blockers` and four more
//! verdicts (`reset-needed`, `reboot-needed`, `remap-pending`, `fell-off-bus`), which a
//! protocol-5 client cannot read; and `reset`.

use crate::inspect::wait::WaitOpts;
pub use crate::inspect::Filter;
use crate::process::kill;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::time::Duration;
use strum::VariantNames;

/// Bumped on any change a peer of the other version could misread. 5: a `grace_ms` of 0 is
/// TERM then KILL at once (4 read it as "never KILL"), and `u64::MAX` is never KILL. 6: a
/// filter's `pod` and `container`, `wait_clean`'s `filter` (5 would wait for whole GPUs),
/// the kill options' `pod` and `container`; holders carry their container and pod; the GPUs'
/// faults, the verdicts they give, and `reset`.
pub(crate) const PROTOCOL: u32 = 6;
/// The longest request line the agent reads; longer ones get a `too_large` error.
pub(crate) const MAX_REQUEST: usize = 1024 * 1024;
/// The longest reply line the client reads (holders of a busy node fit many times over).
pub(crate) const MAX_REPLY: usize = 256 * 1024 * 1024;

/// What the agent says first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    pub protocol: u32,
    /// gpuloop's version on the remote side.
    pub version: String,
    pub hostname: String,
    pub gpus: i64,
    /// "nvml", "sim" or "none".
    pub backend: String,
}

/// One call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub call: Call,
}

/// A GPU selection on one host: `None` is every GPU.
pub(crate) type Sel = Option<Vec<i64>>;

/// A call, as it crosses the wire. Its name there (`method`) is the variant's, in snake case,
/// for serde and strum alike (`Call::VARIANTS` lists them); what the agent and the client
/// do with it comes from `Call::handling`, one exhaustive match; the agent answers an
/// operation in `machine::ops::answer`, another exhaustive match.
#[derive(
    Debug, Clone, Serialize, Deserialize, PartialEq, strum::IntoStaticStr, strum::VariantNames,
)]
#[serde(tag = "method", content = "params", rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Call {
    Gpus,
    Holders {
        sel: Sel,
        all: bool,
        /// Only one owner's (`--user`, `--mine`) or one Slurm job's (`--job`).
        #[serde(default)]
        filter: Filter,
    },
    /// `holders` with the count of processes that could not be inspected there (other
    /// users', without root): `{holders, unreadable}`.
    HoldersReport {
        sel: Sel,
        all: bool,
        #[serde(default)]
        filter: Filter,
    },
    Diagnose {
        sel: Sel,
        #[serde(default)]
        filter: Filter,
    },
    /// Targets are checked by (pid, start) there, when `start` is given.
    Kill {
        targets: Vec<KillTarget>,
        opts: KillOpts,
    },
    /// Kills the compute holders of the selection (what `gpuloop kill` does).
    KillHolders {
        sel: Sel,
        #[serde(default)]
        filter: Filter,
        opts: KillOpts,
    },
    WaitClean {
        sel: Sel,
        /// A pod or a container (`wait --pod`): the wait is for its memory alone.
        #[serde(default, skip_serializing_if = "Filter::is_empty")]
        filter: Filter,
        #[serde(flatten)]
        wait: WaitWire,
    },
    /// Kill the compute holders, wait until clean, diagnose: `gpuloop clean` in one call.
    Clean {
        sel: Sel,
        #[serde(default)]
        filter: Filter,
        kill: KillOpts,
        #[serde(flatten)]
        wait: WaitWire,
    },
    /// Runs a job there; its output comes back as `Output` lines while it runs.
    Run(RunCall),
    /// Stops the job started by request `id` (its whole tree).
    Cancel {
        id: u64,
    },
    /// Starts a job in the background and answers at once (`JobState`, running); the job
    /// is known by this request's id and stopped when the connection ends.
    Spawn(RunCall),
    /// Waits up to `timeout_ms` for a spawned job to end (`JobState`, with the outcome
    /// once it has).
    JobWait {
        job: u64,
        timeout_ms: u64,
    },
    /// Stops a spawned job's whole tree: `signal`, the grace (the job's own when `None`),
    /// KILL. Answers with its outcome.
    JobKill {
        job: u64,
        signal: String,
        grace_ms: Option<u64>,
    },
    /// Whether a spawned job's main process still runs (no outcome: a poll stays small).
    JobStatus {
        job: u64,
    },
    /// The audit journal's latest `last` records there that match (0: all).
    Journal {
        last: usize,
        #[serde(default)]
        since: Option<String>,
        #[serde(default)]
        pid: Option<i64>,
        #[serde(default)]
        user: Option<String>,
        #[serde(default)]
        front_end: Option<crate::journal::FrontEnd>,
    },
    /// Answered `true` at once by the agent's reading loop: the host is alive and reading.
    Ping,
    /// How the client names this host (`host`, as in its host set) and the gpuloop command
    /// line that reaches it from there (`gpuloop --host gpu02`): advice built there names
    /// it, so a command pasted where the client runs acts on that host. Sent once, first.
    ReachedAs {
        host: String,
        gpuloop: String,
    },
    /// `gpuloop reset` of these GPUs there: what blocks it (`dry_run`), or stop, reset,
    /// verify, restart.
    Reset {
        gpus: Vec<i64>,
        dry_run: bool,
        force: bool,
        grace_ms: u64,
        timeout_ms: u64,
        /// MIG devices, as given (`reset --dry-run --gpu 0:7:0`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mig: Option<Vec<crate::gpu::mig::MigSel>>,
    },
}

/// How the agent and the client handle a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handling {
    /// A `cancel` for it stops it there: a kill's (or clean's) grace ends, KILLing nobody,
    /// and the answer says what was signalled and what still runs; a job stops; a wait ends.
    pub cancellable: bool,
    /// Ctrl-C here (or a call timed out) is passed on as a `cancel`, and the caller goes on
    /// without the answer: a job started by this call must not outlive it, nor a wait go on
    /// polling there.
    pub stopped_there: bool,
    /// Ctrl-C here is passed on as a `cancel`, and its answer (what was signalled, what still
    /// runs) is still awaited, so the caller reports it as it would a kill on this machine.
    pub reports_interrupt: bool,
}

impl Call {
    /// The method's name on the wire.
    pub fn method(&self) -> &'static str {
        self.into()
    }

    /// The one place that says how each call is handled; a new call is a compile error here
    /// until it says.
    pub(crate) fn handling(&self) -> Handling {
        let (cancellable, stopped_there, reports_interrupt) = match self {
            Call::Kill { .. } | Call::KillHolders { .. } | Call::Clean { .. } => {
                (true, false, true)
            }
            Call::WaitClean { .. } | Call::Run(_) => (true, true, false),
            Call::Spawn(_) => (false, true, false),
            // A reset runs to its end: a GPU left half reset, or a daemon left stopped, is
            // worse than a late answer.
            Call::Reset { .. } => (false, false, false),
            Call::JobWait { .. } => (true, false, false),
            Call::Gpus
            | Call::Holders { .. }
            | Call::HoldersReport { .. }
            | Call::Diagnose { .. }
            | Call::Cancel { .. }
            | Call::JobKill { .. }
            | Call::JobStatus { .. }
            | Call::Journal { .. }
            | Call::Ping
            | Call::ReachedAs { .. } => (false, false, false),
        };
        Handling {
            cancellable,
            stopped_there,
            reports_interrupt,
        }
    }
}

/// wait_clean's options as they cross the wire, the same for `wait_clean` and `clean`
/// (flattened: the fields sit beside `sel` in the request).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct WaitWire {
    pub timeout_ms: u64,
    pub max_used_mib: i64,
    pub poll_ms: u64,
    #[serde(default)]
    pub more: WaitMore,
}

/// wait_clean's finer options (`strict`, `settle`, `stall`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WaitMore {
    pub strict: bool,
    pub settle_ms: u64,
    /// `None`: the agent's default.
    pub stall_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct KillTarget {
    pub pid: i32,
    pub start: Option<u64>,
    /// The pidfs inode, where the kernel has one: identity beyond (pid, start).
    #[serde(default)]
    pub ino: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KillOpts {
    /// A signal name: "TERM", "KILL", …
    pub signal: String,
    /// 0: TERM then KILL at once; `u64::MAX`: never KILL (`kill::grace_ms`).
    pub grace_ms: u64,
    pub tree: bool,
    pub dry_run: bool,
    pub force: bool,
    /// Also stop the targets' restarters.
    #[serde(default)]
    pub parents: bool,
    /// The one user whose processes may be signalled (a script's `kill(…, #{user})`),
    /// looked up on that host: targets, their trees, groups and parents alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<crate::inspect::User>,
    /// The one pod whose processes may be signalled, as given (`kill(…, #{pod})`), found
    /// among that host's processes: targets, trees, groups and parents alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The one container, as `pod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// The wire's kill options from the domain's (`user`, `pod` and `container` are the caller's to
/// add: the domain holds an owner and a scope already resolved on this machine, which mean
/// nothing on another).
impl From<&kill::KillOpts> for KillOpts {
    fn from(o: &kill::KillOpts) -> Self {
        KillOpts {
            signal: kill::signal_name(o.signal).to_string(),
            grace_ms: kill::grace_ms(o.grace),
            tree: o.tree,
            dry_run: o.dry_run,
            force: o.force,
            parents: o.parents,
            user: None,
            pod: None,
            container: None,
        }
    }
}

/// The domain's kill options from the wire's; an unknown signal name is the error. The
/// wire's `user` is looked up by the machine that signals.
impl TryFrom<&KillOpts> for kill::KillOpts {
    type Error = kill::UnknownSignal;
    fn try_from(o: &KillOpts) -> Result<Self, kill::UnknownSignal> {
        Ok(kill::KillOpts {
            signal: kill::parse_signal(&o.signal)?,
            grace: kill::grace_of_ms(o.grace_ms),
            tree: o.tree,
            dry_run: o.dry_run,
            force: o.force,
            parents: o.parents,
            ..kill::KillOpts::default()
        })
    }
}

impl From<&kill::Target> for KillTarget {
    fn from(t: &kill::Target) -> Self {
        match t {
            kill::Target::Pid(p) => KillTarget {
                pid: *p,
                start: None,
                ino: None,
            },
            kill::Target::Exact(id) => KillTarget {
                pid: id.pid,
                start: Some(id.start),
                ino: id.ino,
            },
        }
    }
}

impl From<&KillTarget> for kill::Target {
    fn from(t: &KillTarget) -> Self {
        match t.start {
            Some(start) => kill::Target::Exact(crate::process::Identity {
                pid: t.pid,
                start,
                ino: t.ino,
            }),
            None => kill::Target::Pid(t.pid),
        }
    }
}

impl From<&WaitOpts> for WaitWire {
    fn from(o: &WaitOpts) -> Self {
        WaitWire {
            timeout_ms: o.timeout.as_millis() as u64,
            max_used_mib: o.max_used_mib,
            poll_ms: o.poll.as_millis() as u64,
            more: WaitMore {
                strict: o.strict,
                settle_ms: o.settle.as_millis() as u64,
                stall_ms: Some(o.stall.as_millis() as u64),
            },
        }
    }
}

impl From<WaitWire> for WaitOpts {
    fn from(w: WaitWire) -> Self {
        let d = WaitOpts::default();
        WaitOpts {
            timeout: Duration::from_millis(w.timeout_ms),
            max_used_mib: w.max_used_mib,
            poll: Duration::from_millis(w.poll_ms.max(1)),
            strict: w.more.strict,
            settle: Duration::from_millis(w.more.settle_ms),
            stall: w.more.stall_ms.map_or(d.stall, Duration::from_millis),
            ..d
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunCall {
    /// `sh -c` this string, or exec this argv.
    pub shell: Option<String>,
    pub argv: Option<Vec<String>>,
    pub timeout_ms: Option<u64>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub grace_ms: u64,
    /// Stream the output back while it runs.
    pub echo: bool,
    /// Leave what the job leaves running when its leader exits.
    #[serde(default)]
    pub keep_children: bool,
}

/// A spawned job as the agent answers about it (spawn, job_wait, job_kill, job_status).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobState {
    /// The spawn request's id, which names the job in later calls.
    pub job: u64,
    /// Its pid there.
    pub pid: i64,
    /// True until its main process has exited.
    pub running: bool,
    /// How it ended, once it has and its output is collected.
    pub outcome: Option<crate::runner::Outcome>,
}

/// What the agent sends. It is written with serde and read back with `Message::read`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Hello(Hello),
    /// The answer to request `id`; `id` is `None` for a request too broken to have one.
    Reply {
        id: Option<u64>,
        #[serde(flatten)]
        body: Body,
    },
    /// A chunk of a running job's output.
    Output {
        id: u64,
        stream: Stream,
        data: String,
    },
}

/// A result as JSON text: the agent writes it once, straight from the result's type, and
/// the client parses it once into the type it expects.
pub(crate) type Raw = Box<RawValue>;

/// A reply's result as the client holds it until the caller parses it into its own type.
#[derive(Debug)]
pub enum Answered {
    /// A whole reply line of the shape the agent writes, `{"type":"reply","id":N,"ok":…}`:
    /// the caller's parse is the one read of its result (the line is not read through and
    /// its result copied out first; for a GPU list that was a third of the client's work).
    Line(String),
    /// The result alone, from a reply of any other shape.
    Raw(Raw),
}

impl Answered {
    /// The result as `T`; for a `Line`, the whole line must be that reply, nothing more.
    pub fn parse<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct OkLine<T> {
            #[serde(rename = "type")]
            _kind: IgnoredAny,
            #[serde(rename = "id")]
            _id: IgnoredAny,
            ok: T,
        }
        match self {
            Answered::Line(line) => serde_json::from_str::<OkLine<T>>(line).map(|l| l.ok),
            Answered::Raw(raw) => serde_json::from_str(raw.get()),
        }
    }
}

/// The id of a line that starts as the agent starts a result reply,
/// `{"type":"reply","id":N,"ok":`; None for any other line (`Message::read` reads those).
/// The rest is read, and checked, by the caller's `Answered::parse`.
pub fn ok_reply_id(line: &str) -> Option<u64> {
    let rest = line.strip_prefix(r#"{"type":"reply","id":"#)?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let id = rest[..digits].parse().ok()?;
    rest[digits..].starts_with(r#","ok":"#).then_some(id)
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Body {
    Ok(Raw),
    Error(WireError),
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        match (self, other) {
            (Body::Ok(a), Body::Ok(b)) => a.get() == b.get(),
            (Body::Error(a), Body::Error(b)) => a == b,
            _ => false,
        }
    }
}

impl Body {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Body {
        Body::Error(WireError {
            kind,
            message: message.into(),
        })
    }

    /// `v` as a result; an error reply if it cannot be encoded.
    pub fn ok<T: Serialize + ?Sized>(v: &T) -> Body {
        serde_json::value::to_raw_value(v).map_or_else(
            |e| {
                Body::Error(WireError {
                    kind: ErrorKind::Failed,
                    message: format!("cannot encode the result: {e}"),
                })
            },
            Body::Ok,
        )
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// An error as data: what kind, and the message a person reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Not JSON, or not a request.
    Malformed,
    TooLarge,
    UnknownMethod,
    /// The right method with the wrong parameters.
    BadParams,
    /// The call ran and failed (a GPU error, a job that could not start, …).
    Failed,
    /// A usage error on that side (an unknown GPU index, …).
    Usage,
}

impl Message {
    pub fn line(&self) -> String {
        // Serializing these types cannot fail: no maps with non-string keys, no floats NaN.
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!(r#"{{"type":"reply","id":null,"error":{{"kind":"failed","message":"cannot encode the reply: {e}"}}}}"#)
        })
    }

    /// Reads one line the agent wrote, field by field. serde's derived reader for a tagged
    /// enum buffers the whole line in a generic form first, and a result then became a
    /// `Value` the caller converted again: at 64 hosts those copies were most of the
    /// client's time per call. Here a reply's result stays the agent's JSON text.
    pub fn read(line: &str) -> Result<Message, BadMessage> {
        #[derive(Deserialize)]
        struct Fields<'a> {
            #[serde(rename = "type", borrow)]
            kind: std::borrow::Cow<'a, str>,
            #[serde(default)]
            id: Option<u64>,
            #[serde(default, borrow, deserialize_with = "present")]
            ok: Option<&'a RawValue>,
            #[serde(default)]
            error: Option<WireError>,
            #[serde(default)]
            stream: Option<Stream>,
            #[serde(default)]
            data: Option<String>,
        }
        /// A result that is `null` is still a result.
        fn present<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<&'de RawValue>, D::Error> {
            <&RawValue>::deserialize(d).map(Some)
        }
        let f: Fields =
            serde_json::from_str(line).map_err(|e| BadMessage::NotJson(e.to_string()))?;
        match (&*f.kind, f.id, f.ok, f.error, f.stream, f.data) {
            ("hello", ..) => serde_json::from_str(line)
                .map(Message::Hello)
                .map_err(|e| BadMessage::Hello(e.to_string())),
            ("reply", id, Some(v), None, None, None) => Ok(Message::Reply {
                id,
                body: Body::Ok(v.to_owned()),
            }),
            ("reply", id, None, Some(e), None, None) => Ok(Message::Reply {
                id,
                body: Body::Error(e),
            }),
            ("reply", ..) => Err(BadMessage::Reply),
            ("output", Some(id), None, None, Some(stream), Some(data)) => {
                Ok(Message::Output { id, stream, data })
            }
            ("output", ..) => Err(BadMessage::Output),
            (kind, ..) => Err(BadMessage::UnknownType(kind.to_string())),
        }
    }
}

/// A line from the agent that is no message: what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadMessage {
    /// Not JSON, or not an object with a string "type".
    #[error("{0}")]
    NotJson(String),
    #[error("a bad hello: {0}")]
    Hello(String),
    #[error("a reply needs exactly one of \"ok\" and \"error\"")]
    Reply,
    #[error("an output line needs \"id\", \"stream\" and \"data\"")]
    Output,
    #[error("unknown message type {0:?}")]
    UnknownType(String),
}

/// Parses one request line; on failure, the error reply to send (with the id when one
/// could be read, so the caller's call fails rather than waits).
pub fn parse_request(line: &str) -> Result<Request, Message> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| Message::Reply {
        id: None,
        body: Body::Error(WireError {
            kind: ErrorKind::Malformed,
            message: format!("not JSON: {e}"),
        }),
    })?;
    let id = value.get("id").and_then(serde_json::Value::as_u64);
    let fail = |kind, message: String| Message::Reply {
        id,
        body: Body::Error(WireError { kind, message }),
    };
    let Some(id_value) = id else {
        return Err(fail(
            ErrorKind::Malformed,
            "a request needs an integer \"id\"".into(),
        ));
    };
    let method = match value.get("method") {
        Some(serde_json::Value::String(m)) => m.clone(),
        _ => {
            return Err(fail(
                ErrorKind::Malformed,
                "a request needs a string \"method\"".into(),
            ))
        }
    };
    serde_json::from_value::<Request>(value).map_err(|e| {
        if Call::VARIANTS.contains(&method.as_str()) {
            fail(
                ErrorKind::BadParams,
                format!("bad params for {method} (request {id_value}): {e}"),
            )
        } else {
            fail(
                ErrorKind::UnknownMethod,
                format!(
                    "unknown method {method:?} (known: {})",
                    Call::VARIANTS.join(", ")
                ),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's own result replies are handed on whole and parse as written; anything
    /// else is left to `Message::read`, and a line that only starts like one fails to parse.
    #[test]
    fn result_replies_as_the_agent_writes_them_are_read_once_by_the_caller() {
        let gpus = vec![1_i64, 2, 3];
        let line = serde_json::to_string(&Message::Reply {
            id: Some(41),
            body: Body::ok(&gpus),
        })
        .unwrap();
        assert_eq!(ok_reply_id(&line), Some(41));
        let got: Vec<i64> = Answered::Line(line).parse().unwrap();
        assert_eq!(got, gpus);
        let error = serde_json::to_string(&Message::Reply {
            id: Some(7),
            body: Body::Error(WireError {
                kind: ErrorKind::Failed,
                message: "no".into(),
            }),
        })
        .unwrap();
        for other in [
            error.as_str(),
            r#"{"id":3,"type":"reply","ok":1}"#,
            r#"{"type":"reply","id":,"ok":1}"#,
            r#"{"type":"reply","id":99999999999999999999999,"ok":1}"#,
            r#"{"type":"output","id":3,"stream":"stdout","data":"x"}"#,
            r#"{"type":"reply","id":3}"#,
        ] {
            assert_eq!(ok_reply_id(other), None, "{other}");
        }
        for bad in [
            r#"{"type":"reply","id":3,"ok":1,"error":{"kind":"failed","message":"x"}}"#,
            r#"{"type":"reply","id":3,"ok":1,"ok":2}"#,
            r#"{"type":"reply","id":3,"ok":1} trailing"#,
            r#"{"type":"reply","id":3,"ok":[1,"#,
        ] {
            assert_eq!(ok_reply_id(bad), Some(3), "{bad}");
            assert!(Answered::Line(bad.into()).parse::<i64>().is_err(), "{bad}");
        }
    }

    #[test]
    fn wait_options_sit_beside_the_selection_on_the_wire() {
        let call = Call::WaitClean {
            sel: Some(vec![1]),
            filter: Filter::default(),
            wait: WaitWire {
                timeout_ms: 30_000,
                max_used_mib: 0,
                poll_ms: 20,
                more: WaitMore::default(),
            },
        };
        let text = serde_json::to_string(&Request {
            id: 1,
            call: call.clone(),
        })
        .unwrap();
        assert!(
            text.contains(
                r#""params":{"sel":[1],"timeout_ms":30000,"max_used_mib":0,"poll_ms":20,"more":"#
            ),
            "{text}"
        );
        let back: Request = serde_json::from_str(&text).unwrap();
        assert_eq!(back.call, call);
    }

    #[test]
    fn requests_round_trip_and_read_as_documented() {
        let r = Request {
            id: 7,
            call: Call::Holders {
                sel: Some(vec![0, 2]),
                all: true,
                filter: Filter::default(),
            },
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(
            line,
            r#"{"id":7,"method":"holders","params":{"sel":[0,2],"all":true,"filter":{"user":null,"job":null}}}"#
        );
        assert_eq!(parse_request(&line).unwrap(), r);
        assert_eq!(
            parse_request(r#"{"id":1,"method":"gpus"}"#).unwrap().call,
            Call::Gpus
        );
    }

    /// The bug: `--user alice` crossed as the uid alice has on the client, and each host
    /// matched that number, another user's there. The user now crosses as given; a request
    /// of protocol 3 (a `uid` in the filter) is refused, never read as "no filter" (which
    /// would select every user's processes).
    #[test]
    fn user_filters_cross_as_given_and_a_protocol_3_uid_is_refused() {
        use crate::inspect::User;
        for (user, wire) in [
            (User::Name("alice".into()), r#"{"name":"alice"}"#),
            (User::Uid(4242), r#"{"uid":4242}"#),
            (User::Me, r#""me""#),
        ] {
            let r = Request {
                id: 2,
                call: Call::KillHolders {
                    sel: None,
                    filter: Filter {
                        user: Some(user),
                        ..Filter::default()
                    },
                    opts: KillOpts {
                        signal: "TERM".into(),
                        grace_ms: 0,
                        tree: true,
                        dry_run: true,
                        force: false,
                        parents: false,
                        user: None,
                        pod: None,
                        container: None,
                    },
                },
            };
            let line = serde_json::to_string(&r).unwrap();
            assert!(
                line.contains(&format!(r#""filter":{{"user":{wire},"#)),
                "{line}"
            );
            assert_eq!(parse_request(&line).unwrap(), r);
        }
        assert_eq!(User::parse("4242"), User::Uid(4242));
        assert_eq!(User::parse("alice"), User::Name("alice".into()));
        let old = r#"{"id":3,"method":"kill_holders","params":{"sel":null,"filter":{"uid":4242,"job":null},"opts":{"signal":"TERM","grace_ms":1000,"tree":true,"dry_run":false,"force":false,"parents":false}}}"#;
        match parse_request(old) {
            Err(Message::Reply {
                id: Some(3),
                body: Body::Error(e),
            }) => {
                assert_eq!(e.kind, ErrorKind::BadParams);
                assert!(e.message.contains("unknown field `uid`"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn broken_requests_become_error_replies_with_their_id_when_known() {
        let kind = |line: &str| match parse_request(line) {
            Err(Message::Reply {
                id,
                body: Body::Error(e),
            }) => (id, e.kind),
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(kind("{nope"), (None, ErrorKind::Malformed));
        assert_eq!(kind(r#"{"method":"gpus"}"#), (None, ErrorKind::Malformed));
        assert_eq!(kind(r#"{"id":3}"#), (Some(3), ErrorKind::Malformed));
        assert_eq!(
            kind(r#"{"id":4,"method":"format_disk"}"#),
            (Some(4), ErrorKind::UnknownMethod)
        );
        assert_eq!(
            kind(r#"{"id":5,"method":"holders","params":{"sel":"x"}}"#),
            (Some(5), ErrorKind::BadParams)
        );
    }

    #[test]
    fn every_call_is_known_by_its_wire_name() {
        let kill = KillOpts {
            signal: "TERM".into(),
            grace_ms: 100,
            tree: false,
            dry_run: true,
            force: false,
            parents: false,
            user: None,
            pod: None,
            container: None,
        };
        let wait = WaitWire {
            timeout_ms: 1000,
            max_used_mib: 0,
            poll_ms: 50,
            more: WaitMore::default(),
        };
        let run = RunCall {
            shell: Some("true".into()),
            argv: None,
            timeout_ms: None,
            cwd: None,
            env: vec![],
            grace_ms: 5000,
            echo: false,
            keep_children: false,
        };
        let calls = [
            Call::Gpus,
            Call::Holders {
                sel: None,
                all: false,
                filter: Filter::default(),
            },
            Call::Diagnose {
                sel: Some(vec![1]),
                filter: Filter::default(),
            },
            Call::Kill {
                targets: vec![KillTarget {
                    pid: 42,
                    start: Some(7),
                    ino: None,
                }],
                opts: kill.clone(),
            },
            Call::KillHolders {
                sel: None,
                filter: Filter::default(),
                opts: kill.clone(),
            },
            Call::WaitClean {
                sel: None,
                filter: Filter::default(),
                wait,
            },
            Call::Clean {
                sel: None,
                filter: Filter::default(),
                kill,
                wait,
            },
            Call::Run(run),
            Call::Spawn(RunCall {
                shell: Some("sleep 1".into()),
                argv: None,
                timeout_ms: None,
                cwd: None,
                env: vec![],
                grace_ms: 5000,
                echo: true,
                keep_children: false,
            }),
            Call::JobWait {
                job: 3,
                timeout_ms: 10,
            },
            Call::JobKill {
                job: 3,
                signal: "TERM".into(),
                grace_ms: None,
            },
            Call::JobStatus { job: 3 },
            Call::Ping,
            Call::HoldersReport {
                sel: None,
                all: false,
                filter: Filter::default(),
            },
            Call::Cancel { id: 3 },
            Call::Journal {
                last: 20,
                since: None,
                pid: Some(4242),
                user: None,
                front_end: None,
            },
            Call::ReachedAs {
                host: "gpu02".into(),
                gpuloop: "gpuloop --host gpu02".into(),
            },
            Call::Reset {
                gpus: vec![0],
                dry_run: true,
                force: false,
                grace_ms: 5000,
                timeout_ms: 30_000,
                mig: None,
            },
        ];
        // Every call is here, and its name on the wire (serde's) is strum's.
        let mut named: Vec<&str> = calls.iter().map(Call::method).collect();
        named.sort_unstable();
        named.dedup();
        let mut all = Call::VARIANTS.to_vec();
        all.sort_unstable();
        assert_eq!(named, all);
        for (n, call) in calls.into_iter().enumerate() {
            let r = Request { id: n as u64, call };
            let line = serde_json::to_string(&r).unwrap();
            assert!(
                line.contains(&format!(r#""method":"{}""#, r.call.method())),
                "{line}"
            );
            assert_eq!(parse_request(&line).unwrap(), r);
        }
        assert_eq!(
            parse_request(r#"{"id":9,"method":"ping"}"#).unwrap().call,
            Call::Ping
        );
    }

    #[test]
    fn messages_are_one_line_each() {
        let m = Message::Output {
            id: 1,
            stream: Stream::Stdout,
            data: "a\nb\n".into(),
        };
        let line = m.line();
        assert!(!line.contains('\n'));
        assert_eq!(Message::read(&line).unwrap(), m);
    }

    /// `Message::read` reads back every message the agent writes, and refuses the rest.
    #[test]
    fn messages_read_back_as_written() {
        let gpus = r#"[{"index":0,"name":"H200"},{"index":1,"name":"é\"x"}]"#;
        for m in [
            Message::Reply {
                id: Some(7),
                body: Body::Ok(RawValue::from_string(gpus.into()).unwrap()),
            },
            Message::Reply {
                id: Some(8),
                body: Body::ok(&()),
            },
            Message::Reply {
                id: None,
                body: Body::Error(WireError {
                    kind: ErrorKind::Malformed,
                    message: "not JSON".into(),
                }),
            },
            Message::Hello(Hello {
                protocol: PROTOCOL,
                version: "1.0".into(),
                hostname: "gpu01".into(),
                gpus: 8,
                backend: "sim".into(),
            }),
        ] {
            assert_eq!(Message::read(&m.line()).unwrap(), m, "{}", m.line());
        }
        // Each refusal says which shape was wrong.
        let shape = |bad: &str| match Message::read(bad) {
            Err(BadMessage::NotJson(_)) => "json",
            Err(BadMessage::Hello(_)) => "hello",
            Err(BadMessage::Reply) => "reply",
            Err(BadMessage::Output) => "output",
            Err(BadMessage::UnknownType(_)) => "type",
            Ok(_) => "read",
        };
        for (bad, wrong) in [
            (r#"{"type":"reply","id":1}"#, "reply"),
            (
                r#"{"type":"reply","id":1,"ok":1,"error":{"kind":"failed","message":"x"}}"#,
                "reply",
            ),
            (r#"{"type":"output","id":1,"data":"x"}"#, "output"),
            (r#"{"type":"nope"}"#, "type"),
            (r#"{"type":"hello"}"#, "hello"),
            ("not json", "json"),
        ] {
            assert_eq!(shape(bad), wrong, "{bad}");
        }
    }
}
