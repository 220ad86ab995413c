//! The MCP tools: their argument types (and so their JSON schemas), the descriptions a model
//! reads, and each call carried out through `machine`, as the CLI does it.

use super::policy::{Permission, Policy, Refusal};
use super::summary;
use crate::gpu::Gpu;
use crate::hosts::HostSel;
use crate::inspect::diagnose::Diagnosis;
use crate::inspect::holders::Holder;
use crate::inspect::select::Selector;
use crate::inspect::wait::{WaitOpts, WaitOutcome};
use crate::inspect::{Filter, Selection};
use crate::machine::kill::Kill;
use crate::machine::wait::{Clean, WaitClean};
use crate::machine::{why_not_clean, CleanReport, Fleet, Local, Machine, Watch};
use crate::process::kill::KillReport;
use crate::process::kill::{parse_signal, KillOpts, Target};
use crate::process::Identity;
use crate::runner::{self, Cmd, Job, JobOpts, Waited};
use crate::script::recipes::header::{ArgKind, Parsed};
use crate::script::recipes::{self, Recipe, Roots};
use crate::session::Session;
use nix::sys::signal::Signal;
use rmcp::model::{Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a long call reports progress at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// One progress notification: how far (seconds so far), out of what (the timeout), and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Progress {
    pub done: f64,
    pub total: Option<f64>,
    pub message: String,
}

/// What one call runs with: the session (backend, config, hosts), the policy, the call's own
/// stop flag (set when the client cancels it or the server is stopped), and its progress sink.
pub(crate) struct Ctx<'a> {
    pub session: &'a Session,
    pub policy: &'a Policy,
    pub stop: &'a AtomicBool,
    pub progress: &'a (dyn Fn(Progress) + Sync),
    /// This tool call, journaled with every signal it leads to.
    pub served: crate::journal::Served,
}

impl Ctx<'_> {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// A finished call: the line a model can quote, the structured record (the tool's declared
/// output type, the same serde records as `--json`), the pids it signalled, and whether the
/// tool itself failed.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub summary: String,
    pub data: Value,
    pub signalled: Vec<i64>,
    pub failed: bool,
}

impl Reply {
    fn ok(summary: String, out: impl Serialize) -> Reply {
        Reply::signalled(summary, out, Vec::new())
    }

    fn signalled(summary: String, out: impl Serialize, signalled: Vec<i64>) -> Reply {
        match serde_json::to_value(out) {
            Ok(data) => Reply {
                summary,
                data,
                signalled,
                failed: false,
            },
            Err(e) => Reply {
                signalled,
                ..Reply::failed(format!("cannot encode the result: {e}"))
            },
        }
    }

    /// The tool ran but could not do its job (no such GPU, no driver, cannot start the
    /// command), or was called with arguments it cannot take: an `isError` result, which a
    /// model reads and can correct, not a protocol error.
    pub(crate) fn failed(error: impl std::fmt::Display) -> Reply {
        let error = error.to_string();
        Reply {
            data: json!(Output::<()>::Error {
                error: error.clone()
            }),
            summary: error,
            signalled: Vec::new(),
            failed: true,
        }
    }

    /// A call the policy refused: the message says what and how the person allows it.
    pub(crate) fn refused(r: &Refusal) -> Reply {
        let out = Output::<()>::Refused {
            refused: true,
            tool: r.tool.to_string(),
            allow: r.needs.name().to_string(),
        };
        Reply {
            data: json!(out),
            summary: r.to_string(),
            signalled: Vec::new(),
            failed: true,
        }
    }
}

/// A tool's structured content, as its `outputSchema` declares it: the tool's own record, or
/// (with `isError`) why it did not do its job.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
// Each branch is an object; MCP wants that said at the schema's root.
#[schemars(extend("type" = "object"))]
pub(crate) enum Output<T> {
    /// The tool's own record. Never built here (a result is sent as its record is): this
    /// branch gives the schema its shape.
    #[allow(dead_code)]
    Done(T),
    /// The server's policy refused the call; the text content says how the person running
    /// the server can allow it.
    Refused {
        #[schemars(extend("const" = true))]
        refused: bool,
        /// The tool refused.
        tool: String,
        /// The `gpuloop mcp --allow` value that permits it.
        allow: String,
    },
    /// Bad arguments, or the tool could not do its job: what went wrong and what to do.
    Error { error: String },
}

// ---- what each tool returns (its `outputSchema`) ----

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpusOut {
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct HoldersOut {
    pub holders: Vec<Holder>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct DiagnoseOut {
    /// True when every selected GPU is clean.
    pub clean: bool,
    pub gpus: Vec<Diagnosis>,
}

impl DiagnoseOut {
    fn of(gpus: Vec<Diagnosis>) -> DiagnoseOut {
        DiagnoseOut {
            clean: gpus.iter().all(|d| d.is_clean()),
            gpus,
        }
    }
}

/// How a wait ended.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum WaitEnd {
    Clean,
    TimedOut,
    Stalled,
    Respawned,
    Unsettled,
    Interrupted,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WaitOut {
    /// True when the selected GPUs were verified clean.
    pub clean: bool,
    pub outcome: WaitEnd,
    pub elapsed_ms: i64,
    /// What diagnose says of each selected GPU at the end.
    pub gpus: Vec<Diagnosis>,
}

/// `clean`'s record: the kill, the wait and the verification; a dry run returns only what
/// the kill would signal.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum CleanOut {
    Done(CleanReport),
    DryRun(KillReport),
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RunOut {
    pub command: String,
    /// The exit code; none when a signal ended it.
    pub code: Option<i64>,
    pub signal: Option<String>,
    pub ok: bool,
    pub timed_out: bool,
    pub elapsed_ms: i64,
    pub pid: i64,
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// Processes it left running, which were stopped.
    pub leftovers: Vec<i64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RecipesOut {
    pub recipes: Vec<Recipe>,
}

/// Calls that never reach the tool's work, and cancellations.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("{0}")]
    BadArguments(String),
    #[error("unknown tool {0:?}: tools/list names the tools this server has")]
    UnknownTool(String),
    /// The client cancelled (or the server was stopped); what the call started was stopped.
    #[error("cancelled")]
    Cancelled { signalled: Vec<i64> },
    /// A tool that acts (or waits) on one machine, on a server started with `--host`.
    #[error(
        "{tool}: this server was started with --host ({hosts}); over several hosts it answers \
         only the read-only gpus, holders, diagnose and recipes. To {tool} on a host, use the \
         MCP server of that host (ssh -T HOST gpuloop mcp --allow …) or `gpuloop --host …` \
         from a shell"
    )]
    NotOverHosts { tool: String, hosts: String },
}

/// The tools that act (or wait) on this machine only; with a host set they are refused,
/// while gpus, holders and diagnose gather from every host (each record with its `host`).
pub(crate) const ONE_MACHINE: &[&str] = &["wait_clean", "kill", "clean", "run", "run_recipe"];

/// A tool's arguments, read here rather than by the SDK so that a bad one is a tool result
/// the model reads; the message names the argument ("gpus: invalid type: …").
fn args<T: for<'de> Deserialize<'de>>(tool: &str, raw: Map<String, Value>) -> Result<T, CallError> {
    serde_path_to_error::deserialize(Value::Object(raw)).map_err(|e| {
        let at = e.path().to_string();
        let why = e.into_inner();
        CallError::BadArguments(if at == "." {
            format!("{tool}: {why}")
        } else {
            format!("{tool}: {at}: {why}")
        })
    })
}

fn seconds(tool: &str, what: &str, v: f64) -> Result<Duration, CallError> {
    crate::inspect::wait::seconds(v)
        .map_err(|why| CallError::BadArguments(format!("{tool}: {what} {why}")))
}

fn signal(tool: &str, name: &str) -> Result<Signal, CallError> {
    parse_signal(name).map_err(|e| CallError::BadArguments(format!("{tool}: {e}")))
}

/// A call's progress: seconds since it started, out of its longest possible time, sent at
/// most every `PROGRESS_EVERY` (the waits poll far more often).
struct Reporter<'a> {
    ctx: &'a Ctx<'a>,
    started: Instant,
    total: Option<Duration>,
    last: Option<Instant>,
}

impl<'a> Reporter<'a> {
    fn new(ctx: &'a Ctx<'a>, total: Option<Duration>) -> Reporter<'a> {
        Reporter {
            ctx,
            started: Instant::now(),
            total,
            last: None,
        }
    }

    fn send(&mut self, message: &str) {
        if self.last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        (self.ctx.progress)(Progress {
            done: self.started.elapsed().as_secs_f64(),
            total: self.total.map(|t| t.as_secs_f64()),
            message: message.to_string(),
        });
    }
}

// ---- arguments (their doc comments are the schema descriptions a model reads) ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HoldersArgs {
    /// GPU indices to look at (default: every GPU).
    #[serde(default)]
    pub gpus: Option<Vec<i64>>,
    /// MIG devices to narrow to, each a GPU of its own: "N:GI:CI", "N:GI" (every compute
    /// instance of that GPU instance) or a MIG UUID ("MIG-…", or a unique prefix), as `gpus`
    /// lists them under `mig.instances`. Each selects its parent GPU, narrowed to it.
    #[serde(default)]
    pub mig: Option<Vec<String>>,
    /// Also list observers (NVML-only clients such as nvidia-smi, which hold no memory) and
    /// protected GPU daemons. Default false: only compute holders, which hold memory.
    #[serde(default)]
    pub all: bool,
    /// Only this Kubernetes pod's processes: NAMESPACE/NAME, NAME, or its uid (or 8 characters
    /// of it at least), as the node tells it; one that fits several pods is refused.
    #[serde(default)]
    pub pod: Option<String>,
    /// Only this container's processes: its name, or its id (or 12 characters of it at least);
    /// one that fits several is refused.
    #[serde(default)]
    pub container: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SelArgs {
    /// GPU indices to look at (default: every GPU).
    #[serde(default)]
    pub gpus: Option<Vec<i64>>,
    /// MIG devices to narrow to, each a GPU of its own: "N:GI:CI", "N:GI" (every compute
    /// instance of that GPU instance) or a MIG UUID ("MIG-…", or a unique prefix), as `gpus`
    /// lists them under `mig.instances`. Each selects its parent GPU, narrowed to it.
    #[serde(default)]
    pub mig: Option<Vec<String>>,
    /// Only the GPUs this Kubernetes pod's processes use (NAMESPACE/NAME, NAME, or a uid or 8
    /// characters of it at least; it must fit one pod), each with all its holders.
    #[serde(default)]
    pub pod: Option<String>,
    /// Only the GPUs this container's processes use (a name, or an id or 12 characters of it
    /// at least; it must fit one container).
    #[serde(default)]
    pub container: Option<String>,
}

/// A pod and a container a tool was given, as a filter; an empty one is a bad argument.
fn scope_filter(
    tool: &str,
    pod: &Option<String>,
    container: &Option<String>,
) -> Result<Filter, CallError> {
    let check = |key: &str, v: &Option<String>| match v.as_deref().map(str::trim) {
        Some("") => Err(CallError::BadArguments(format!(
            "{tool}: {key} is empty: give a name, or an id or a prefix of one"
        ))),
        t => Ok(t.map(str::to_string)),
    };
    Ok(Filter {
        pod: check("pod", pod)?,
        container: check("container", container)?,
        ..Filter::default()
    })
}

/// `gpus` and `mig` as a selection over the host set: the MIG devices select their parents
/// and narrow them; a MIG device not written as one is a bad argument.
fn selection(
    s: &Session,
    tool: &str,
    gpus: &Option<Vec<i64>>,
    mig: &Option<Vec<String>>,
) -> Result<HostSel, CallError> {
    let Some(mig) = mig else {
        return Ok(HostSel::from(gpus));
    };
    let mut sels: Vec<Selector> = gpus.iter().flatten().map(|&i| Selector::Index(i)).collect();
    for m in mig {
        let sel = crate::gpu::mig::MigSel::parse(m).ok_or_else(|| {
            CallError::BadArguments(format!(
                "{tool}: mig: {m:?} is not a MIG device (N:GI:CI, N:GI or MIG-…)"
            ))
        })?;
        sels.push(Selector::Mig(sel));
    }
    Fleet::of(s)
        .select_hosts(Some(&sels), Default::default())
        .map_err(|e| CallError::BadArguments(format!("{tool}: {e}")))
}

fn d30() -> f64 {
    30.0
}
fn d5() -> f64 {
    5.0
}
fn d_true() -> bool {
    true
}
fn d_term() -> String {
    "TERM".into()
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitArgs {
    /// GPU indices to wait for (default: every GPU).
    #[serde(default)]
    pub gpus: Option<Vec<i64>>,
    /// MIG devices to narrow to, each a GPU of its own: "N:GI:CI", "N:GI" (every compute
    /// instance of that GPU instance) or a MIG UUID ("MIG-…", or a unique prefix), as `gpus`
    /// lists them under `mig.instances`. Each selects its parent GPU, narrowed to it.
    #[serde(default)]
    pub mig: Option<Vec<String>>,
    /// Seconds to wait at most (default 30). 0 asks "is it clean right now?".
    #[serde(default = "d30")]
    pub timeout: f64,
    /// Seconds to keep watching once clean (default 0): a compute holder that appears in that
    /// time (a launcher respawning a worker) makes the answer "not clean".
    #[serde(default)]
    pub settle: f64,
    /// MiB a GPU may still show as used and count as clean (default 0).
    #[serde(default)]
    pub max_used_mib: i64,
    /// Count the few MiB that other GPUs' CUDA contexts keep here as dirty too (default
    /// false: that footprint does not make a selected GPU dirty).
    #[serde(default)]
    pub strict: bool,
    /// Wait for this Kubernetes pod's processes (NAMESPACE/NAME, NAME, or a uid or 8
    /// characters of it; one pod) to leave their GPUs and their memory to come back; another pod there does not
    /// make them dirty.
    #[serde(default)]
    pub pod: Option<String>,
    /// The same for a container (a name, or an id or 12 characters of it; one container).
    #[serde(default)]
    pub container: Option<String>,
}

/// A process to stop: a holder record as `holders` returned it (its `pid` and `start` are
/// checked, so a reused pid is never hit), or a bare pid (resolved when the call runs).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "expected a pid, or a holder record with at least its pid and start (as `holders` returns it)"
)]
pub enum TargetArg {
    Pid(i64),
    Holder {
        /// Process id.
        pid: i64,
        /// Start time in clock ticks, from the holder record: (pid, start) is the identity.
        start: i64,
        /// The pidfd inode, where the holder record has one: it tells apart two processes
        /// that had the same pid within one clock tick.
        #[serde(default)]
        pidfs_ino: Option<i64>,
    },
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillArgs {
    /// Holder records (from `holders` or `diagnose`) or pids.
    pub targets: Vec<TargetArg>,
    /// Signal sent first: TERM (default), INT, KILL, HUP, …
    #[serde(default = "d_term")]
    pub signal: String,
    /// Seconds before survivors get SIGKILL (default 5; 0: TERM then KILL at once).
    #[serde(default = "d5")]
    pub grace: f64,
    /// Also stop each target's descendants and job process group (default true).
    #[serde(default = "d_true")]
    pub tree: bool,
    /// Also stop the targets' parents that have shown they restart them: torchrun's elastic
    /// agent, or a parent gpuloop saw start a holder again (diagnose says "respawning"). Any
    /// other live parent is named in the report and left alone; never init, a login or
    /// interactive shell, nor a job step's or container's manager (slurmstepd, a containerd
    /// shim, sshd, tmux, …). Default false.
    #[serde(default)]
    pub parents: bool,
    /// Report what would be signalled and signal nothing (default false; always allowed).
    #[serde(default)]
    pub dry_run: bool,
    /// Has no effect here: protected GPU daemons (nvidia-persistenced, DCGM, …) are never
    /// signalled through MCP. A person can run `gpuloop kill --force` themselves.
    #[serde(default)]
    pub force: bool,
    /// Signal only this Kubernetes pod's processes (NAMESPACE/NAME, NAME, or a uid or 8
    /// characters of it; one pod): targets, descendants and parents outside it are left alone.
    #[serde(default)]
    pub pod: Option<String>,
    /// Signal only this container's processes (a name, or an id or 12 characters of it; one
    /// container).
    #[serde(default)]
    pub container: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CleanArgs {
    /// GPU indices to clean (default: every GPU).
    #[serde(default)]
    pub gpus: Option<Vec<i64>>,
    /// MIG devices to narrow to, each a GPU of its own: "N:GI:CI", "N:GI" (every compute
    /// instance of that GPU instance) or a MIG UUID ("MIG-…", or a unique prefix), as `gpus`
    /// lists them under `mig.instances`. Each selects its parent GPU, narrowed to it.
    #[serde(default)]
    pub mig: Option<Vec<String>>,
    /// Seconds to wait for the memory to be released after the kill (default 30).
    #[serde(default = "d30")]
    pub timeout: f64,
    /// Seconds between TERM and KILL (default 5; 0: TERM then KILL at once).
    #[serde(default = "d5")]
    pub grace: f64,
    /// Also stop the holders' parents that have shown they restart them: torchrun's elastic
    /// agent, or a parent gpuloop saw start a holder again (diagnose says "respawning"; the
    /// clean watches the other live parents 1 s for it). Any other live parent is named in
    /// the report and left alone; never init, a login or interactive shell, nor a job step's
    /// or container's manager (slurmstepd, a containerd shim, sshd, tmux, …). Default false.
    #[serde(default)]
    pub parents: bool,
    /// Report what would be stopped and stop nothing (default false; always allowed).
    #[serde(default)]
    pub dry_run: bool,
    /// Stop only this Kubernetes pod's processes (NAMESPACE/NAME, NAME, or a uid or 8
    /// characters of it; one pod) and wait for the memory they held; another pod on the same GPUs is reported
    /// and left alone.
    #[serde(default)]
    pub pod: Option<String>,
    /// The same for a container (a name, or an id or 12 characters of it; one container).
    #[serde(default)]
    pub container: Option<String>,
}

/// A shell command line (run by `sh -c`) or an argv array (no shell).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "expected a shell command line (a string) or an argv array (strings)"
)]
pub(crate) enum CommandArg {
    Shell(String),
    Argv(Vec<String>),
}

fn d600() -> f64 {
    600.0
}
fn d40() -> usize {
    40
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunArgs {
    /// The command: a shell command line (`sh -c`) or an argv array.
    pub command: CommandArg,
    /// Seconds before the whole job is stopped (default 600).
    #[serde(default = "d600")]
    pub timeout: f64,
    /// Working directory (default: the server's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// How many lines of the end of stdout and of stderr to return (default 40).
    #[serde(default = "d40")]
    pub tail_lines: usize,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecipeArgs {
    /// The recipe's name, as `recipes` lists it (e.g. "clean-node").
    pub name: String,
    /// Its arguments: by name, as the recipe declares them (e.g. {"gpu": ["0,1"],
    /// "timeout": 60}), or as on the command line (e.g. ["--gpu", "0,1", "--timeout", "60"]).
    #[serde(default)]
    pub args: RecipeArgv,
    /// Seconds before the recipe is stopped (default 600).
    #[serde(default = "d600")]
    pub timeout: f64,
    /// How many lines of the end of its stdout and of its stderr to return (default 40).
    #[serde(default = "d40")]
    pub tail_lines: usize,
}

/// A recipe's arguments: the words of its command line, or its declared arguments by name.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "expected the recipe's arguments by name (an object) or as on the command line (an array of strings)"
)]
pub(crate) enum RecipeArgv {
    Words(Vec<String>),
    Named(Map<String, Value>),
}

impl Default for RecipeArgv {
    fn default() -> Self {
        RecipeArgv::Words(Vec::new())
    }
}

// ---- the tool list ----

/// A tool whose arguments are `In` and whose structured content is an `Output<Out>`.
fn tool<In: JsonSchema + 'static, Out: JsonSchema + 'static>(
    name: &'static str,
    title: &'static str,
    description: &'static str,
    read_only: bool,
) -> Tool {
    let hints = ToolAnnotations::with_title(title)
        .read_only(read_only)
        .destructive(!read_only)
        .open_world(false);
    Tool::new(name, description, serde_json::Map::new())
        .with_input_schema::<In>()
        .with_output_schema::<Output<Out>>()
        .with_title(title)
        .with_annotations(hints)
}

/// The recipe directories this server's recipes come from: the site's and the built-in
/// ones, the user's too with `--user-recipes`.
fn roots(policy: &Policy) -> Roots {
    let roots = Roots::from_env();
    if policy.user_recipes() {
        roots
    } else {
        roots.without_user()
    }
}

/// The JSON schema of one recipe's arguments by name, from its header.
fn args_schema(r: &Recipe) -> Value {
    let mut props = Map::new();
    let mut required = Vec::new();
    for a in &r.args {
        let mut p = match a.kind {
            ArgKind::Flag => json!({ "type": "boolean" }),
            ArgKind::Int => json!({ "type": "integer" }),
            ArgKind::Number => json!({ "type": "number" }),
            ArgKind::Secs => json!({ "type": "number", "minimum": 0, "maximum": 1e9 }),
            ArgKind::String | ArgKind::File | ArgKind::Gpus => json!({ "type": "string" }),
            ArgKind::Rest => json!({ "type": "array", "items": { "type": "string" } }),
        };
        if a.repeat {
            p = json!({ "type": "array", "items": p });
        }
        let what = match a.kind {
            ArgKind::Gpus => " (GPUs as --gpu takes them: 0,2  0-3  a UUID prefix)",
            ArgKind::Secs => " (seconds)",
            ArgKind::File => " (a file's path on the server's machine)",
            ArgKind::Rest => " (the command's words, as after --)",
            _ => "",
        };
        p["description"] = format!("{}{what}", a.help).into();
        if let Some(d) = a.default_value() {
            p["default"] = d.to_json();
        }
        if a.required {
            required.push(a.key());
        }
        props.insert(a.key(), p);
    }
    json!({
        "type": "object",
        "title": r.name,
        "description": format!("the arguments of {}: {}", r.name, r.purpose),
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

/// run_recipe, its schema saying which recipes there are and what arguments each takes.
fn run_recipe_tool(recipes: &[Recipe]) -> Tool {
    let mut t = tool::<RecipeArgs, RunOut>(
        "run_recipe",
        "Run a ready recipe",
        "Run one of the `recipes` by name with its arguments, exactly as `gpuloop run NAME \
         ARGS` on this server's GPUs, and return its exit code and the end of its output. \
         Arguments a recipe does not take, or values of the wrong kind, are refused before it \
         runs (args' schema lists each recipe's). Reports progress, can be cancelled (the \
         recipe and what it started are stopped). Needs the server's `--allow recipes`, and \
         what the recipe's `needs` names: `clean` (or `kill`) for one that stops processes, \
         `kill` for one that stops processes its arguments name, `run` for one that runs \
         commands or writes files; a recipe does no more than it declares.",
        false,
    );
    let runnable: Vec<&Recipe> = recipes
        .iter()
        .filter(|r| r.refused.is_none() && r.shadowed_by.is_none())
        .collect();
    let mut schema = t.input_schema.as_ref().clone();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        if let Some(name) = props.get_mut("name") {
            name["enum"] = runnable.iter().map(|r| r.name.clone()).collect();
        }
        let mut any = vec![json!({
            "type": "array",
            "items": { "type": "string" },
            "description": "the words of its command line, as after `gpuloop run NAME`",
        })];
        any.extend(runnable.iter().map(|r| args_schema(r)));
        props.insert(
            "args".into(),
            json!({
                "description": "the recipe's arguments: by name (the object of that recipe), or as on the command line",
                "anyOf": any,
            }),
        );
    }
    t.input_schema = std::sync::Arc::new(schema);
    t
}

/// Every tool, with its schema and the description a model reads; `policy` says which
/// recipes the server sees.
pub(crate) fn list(policy: &Policy) -> Vec<Tool> {
    let recipes = recipes::list(&roots(policy));
    vec![
        tool::<NoArgs, GpusOut>(
            "gpus",
            "List GPUs",
            "List the GPUs with their memory use: index, name, uuid, mem_used_mib / \
             mem_total_mib, utilization, temperature, and how many processes the driver \
             reports. Start here to see which GPUs still hold memory.",
            true,
        ),
        tool::<HoldersArgs, HoldersOut>(
            "holders",
            "Who holds the GPUs",
            "List the processes holding GPU memory (compute holders): the driver's process \
             list joined with a scan of every process's open and mapped /dev/nvidia* nodes, \
             which finds orphaned workers and forked children the driver does not list. Each \
             record has pid, start (with pid, the identity kill checks), ppid, user, name, \
             cmdline, state, role, gpus, mem. Pass these records to `kill` as targets.",
            true,
        ),
        tool::<SelArgs, DiagnoseOut>(
            "diagnose",
            "Why is GPU memory still used",
            "Explain each GPU's memory: a verdict (clean, held, orphaned, inherited, \
             other-namespace, permission, daemon, driver, reset-needed, reboot-needed, \
             remap-pending, fell-off-bus, driver-error, no-driver, …), its holders, ghost pids, \
             the GPU's own faults (Xid events with the process they name, ECC counts, remapped \
             rows, the driver's recovery action), what would block a reset, and one line of \
             advice a person can act on. Use it before and after a cleanup; quote the advice.",
            true,
        ),
        tool::<WaitArgs, WaitOut>(
            "wait_clean",
            "Wait until GPUs are free",
            "Wait until the selected GPUs have no compute holder and their memory is released \
             (instead of sleeping a fixed time); returns within one poll of the release, or \
             at the timeout with what diagnose says is left. Kills nothing. Reports progress \
             and can be cancelled.",
            true,
        ),
        tool::<KillArgs, KillReport>(
            "kill",
            "Stop processes safely",
            "Stop processes: all targets get the signal at once (through pidfds), one shared \
             grace, then SIGKILL for survivors, and exits are awaited. Holder records are \
             identity-checked (pid, start), so a reused pid is never hit. Never signalled: \
             pid <= 1, gpuloop and its ancestors, protected GPU daemons (even with force). \
             Needs the server's `--allow kill` unless dry_run is true.",
            false,
        ),
        tool::<CleanArgs, CleanOut>(
            "clean",
            "Stop GPU holders and verify",
            "The whole cleanup: stop every compute holder of the selected GPUs (TERM, grace, \
             KILL), wait until the memory is released, and report the kill and what diagnose \
             says of each GPU afterwards (`clean` is true only when verified). Reports \
             progress and can be cancelled. Needs the server's `--allow clean` unless dry_run \
             is true (a dry run lists what would be stopped).",
            false,
        ),
        tool::<RunArgs, RunOut>(
            "run",
            "Run a command",
            "Run a command (e.g. re-run the job) in its own process group with a timeout, and \
             return its exit code and the end of its output. When it ends, times out or is \
             cancelled, everything it started (descendants, its process group, double-forked \
             or setsid'd orphans) is stopped: nothing is left holding a GPU. Needs the \
             server's `--allow run`.",
            false,
        ),
        tool::<NoArgs, RecipesOut>(
            "recipes",
            "List the ready recipes",
            "List the ready Rhai recipes this server runs: the site's (/etc/gpuloop/recipes) and \
             the built-in ones (clean-node, the escalation ladder TERM -> KILL -> wait -> \
             diagnose -> verify; vllm, torchrun, ray and dataloader leftovers; preflight; \
             patch-and-rerun): name, origin, purpose, usage, the arguments each declares, and \
             what it needs beyond reading (kill, clean, run), which `run_recipe` needs allowed.",
            true,
        ),
        run_recipe_tool(&recipes),
    ]
}

// ---- the calls ----

/// Runs one tool call to its end (blocking: the server calls it off the async runtime).
pub(crate) fn call(ctx: &Ctx, name: &str, raw: Map<String, Value>) -> Result<Reply, CallError> {
    let s = ctx.session;
    // kill, clean, wait_clean and run act on this machine: with a host set they would act
    // where the records the model holds do not come from.
    if !s.is_local() && ONE_MACHINE.contains(&name) {
        return Err(CallError::NotOverHosts {
            tool: name.to_string(),
            hosts: s.host_names().join(","),
        });
    }
    match name {
        "gpus" => {
            args::<NoArgs>(name, raw)?;
            Ok(match Fleet::of(s).gpus() {
                Ok(gpus) => Reply::ok(summary::gpus(&gpus), GpusOut { gpus }),
                Err(e) => Reply::failed(e),
            })
        }
        "holders" => {
            let a: HoldersArgs = args(name, raw)?;
            let filter = scope_filter(name, &a.pod, &a.container)?;
            let sel = selection(s, name, &a.gpus, &a.mig)?;
            Ok(match Fleet::of(s).holders(&sel, a.all, &filter) {
                Ok(hs) => Reply::ok(summary::holders(&hs, a.all), HoldersOut { holders: hs }),
                Err(e) => Reply::failed(e),
            })
        }
        "diagnose" => {
            let a: SelArgs = args(name, raw)?;
            let filter = scope_filter(name, &a.pod, &a.container)?;
            let sel = selection(s, name, &a.gpus, &a.mig)?;
            Ok(match Fleet::of(s).diagnoses(&sel, &filter) {
                Ok(ds) => Reply::ok(summary::diagnoses(&ds), DiagnoseOut::of(ds)),
                Err(e) => Reply::failed(e),
            })
        }
        "wait_clean" => wait_clean(ctx, args(name, raw)?),
        "kill" => kill(ctx, args(name, raw)?),
        "clean" => clean(ctx, args(name, raw)?),
        "run" => run(ctx, args(name, raw)?),
        "recipes" => {
            args::<NoArgs>(name, raw)?;
            let list = recipes::list(&roots(ctx.policy));
            let names: Vec<String> = list
                .iter()
                .map(|r| format!("{} ({})", r.name, r.purpose))
                .collect();
            Ok(Reply::ok(
                format!(
                    "{}: {}",
                    crate::words::count(list.len(), "recipe", "recipes"),
                    names.join("; ")
                ),
                RecipesOut { recipes: list },
            ))
        }
        "run_recipe" => run_recipe(ctx, args(name, raw)?),
        other => Err(CallError::UnknownTool(other.to_string())),
    }
}

fn wait_clean(ctx: &Ctx, a: WaitArgs) -> Result<Reply, CallError> {
    let opts = WaitOpts {
        timeout: seconds("wait_clean", "timeout", a.timeout)?,
        settle: seconds("wait_clean", "settle", a.settle)?,
        max_used_mib: a.max_used_mib.max(0),
        strict: a.strict,
        ..WaitOpts::default()
    };
    let here = selection(ctx.session, "wait_clean", &a.gpus, &a.mig)?;
    let sel: Selection = here.every.clone();
    let filter = here.narrow(&scope_filter("wait_clean", &a.pod, &a.container)?);
    let only_mig = filter.only_mig();
    let started = Instant::now();
    let mut progress = Reporter::new(ctx, Some(opts.longest()));
    let wait = WaitClean {
        sel: sel.clone(),
        opts: opts.clone(),
        quiet: true,
        filter,
    };
    let outcome = Local::new(
        ctx.session,
        Watch {
            stop: ctx.stop,
            show: &mut |m| progress.send(m),
        },
    )
    .serving(ctx.served.clone())
    .ask(&wait);
    let outcome = match outcome {
        Ok(WaitOutcome::NoDriver(why)) => return Ok(Reply::failed(why)),
        Ok(o) => o,
        Err(e) => return Ok(Reply::failed(e)),
    };
    if outcome == WaitOutcome::Interrupted || ctx.stopped() {
        return Err(CallError::Cancelled {
            signalled: Vec::new(),
        });
    }
    let after = match Fleet::of(ctx.session).diagnoses(&HostSel::from(&sel), &only_mig) {
        Ok(d) => d,
        Err(e) => return Ok(Reply::failed(e)),
    };
    let elapsed = started.elapsed();
    let why = why_not_clean(&outcome, &opts);
    Ok(Reply::ok(
        summary::wait(outcome.is_clean(), elapsed, why, &after),
        WaitOut {
            clean: outcome.is_clean(),
            outcome: match outcome {
                WaitOutcome::Clean => WaitEnd::Clean,
                WaitOutcome::TimedOut => WaitEnd::TimedOut,
                WaitOutcome::Stalled => WaitEnd::Stalled,
                WaitOutcome::Respawned(_) => WaitEnd::Respawned,
                WaitOutcome::Unsettled => WaitEnd::Unsettled,
                WaitOutcome::Interrupted | WaitOutcome::NoDriver(_) => WaitEnd::Interrupted,
            },
            elapsed_ms: elapsed.as_millis() as i64,
            gpus: after,
        },
    ))
}

/// The kill tool's options as the kill engine's.
impl TryFrom<&KillArgs> for KillOpts {
    type Error = CallError;
    fn try_from(a: &KillArgs) -> Result<Self, CallError> {
        Ok(KillOpts {
            signal: signal("kill", &a.signal)?,
            grace: seconds("kill", "grace", a.grace)?,
            tree: a.tree,
            parents: a.parents,
            dry_run: a.dry_run,
            // The person's policy, not the model's: protected daemons are never signalled here.
            force: false,
            ..KillOpts::default()
        })
    }
}

fn kill(ctx: &Ctx, a: KillArgs) -> Result<Reply, CallError> {
    ctx.policy.check("kill", Permission::Kill, a.dry_run)?;
    if a.targets.is_empty() {
        return Err(CallError::BadArguments(
            "kill: targets is empty: pass holder records from `holders`, or pids".into(),
        ));
    }
    let pid = |p: i64| {
        i32::try_from(p).map_err(|_| CallError::BadArguments(format!("kill: {p} is not a pid")))
    };
    let targets = a
        .targets
        .iter()
        .map(|t| {
            let not = |what: &str, v: i64| {
                CallError::BadArguments(format!("kill: {what} {v} is not valid"))
            };
            Ok(match *t {
                TargetArg::Pid(p) => Target::Pid(pid(p)?),
                TargetArg::Holder {
                    pid: p,
                    start,
                    pidfs_ino,
                } => Target::Exact(Identity {
                    pid: pid(p)?,
                    start: u64::try_from(start).map_err(|_| not("start", start))?,
                    ino: pidfs_ino
                        .map(|i| u64::try_from(i).map_err(|_| not("pidfs_ino", i)))
                        .transpose()?,
                }),
            })
        })
        .collect::<Result<Vec<_>, CallError>>()?;
    let opts = KillOpts::try_from(&a)?;
    let scope = scope_filter("kill", &a.pod, &a.container)?;
    let mut progress = Reporter::new(ctx, Some(opts.grace));
    let kill = Kill {
        targets,
        opts,
        bound: scope.bound(),
    };
    let report = Local::new(
        ctx.session,
        Watch {
            stop: ctx.stop,
            show: &mut |m| progress.send(m),
        },
    )
    .serving(ctx.served.clone())
    .ask(&kill);
    let mut report = match report {
        Ok(r) => r,
        Err(e) => return Ok(Reply::failed(e)),
    };
    // Cancelled while it pinned, signalled or waited: it stopped there.
    if report.interrupted && ctx.stopped() {
        return Err(CallError::Cancelled {
            signalled: report.signalled,
        });
    }
    no_force_here(&mut report);
    let mut line = summary::kill(&report);
    if a.force {
        line.push_str(" (force has no effect through MCP: protected daemons are never signalled)");
    }
    let signalled = report.signalled.clone();
    Ok(Reply::signalled(line, report, signalled))
}

fn clean(ctx: &Ctx, a: CleanArgs) -> Result<Reply, CallError> {
    ctx.policy.check("clean", Permission::Clean, a.dry_run)?;
    let kill_opts = KillOpts {
        grace: seconds("clean", "grace", a.grace)?,
        parents: a.parents,
        dry_run: a.dry_run,
        force: false,
        ..KillOpts::default()
    };
    let wait = WaitOpts {
        timeout: seconds("clean", "timeout", a.timeout)?,
        ..WaitOpts::default()
    };
    let here = selection(ctx.session, "clean", &a.gpus, &a.mig)?;
    let sel: Selection = here.every.clone();
    let filter = here.narrow(&scope_filter("clean", &a.pod, &a.container)?);
    if a.dry_run {
        // Nothing is signalled, so there is nothing to wait for: say what clean would stop.
        return Ok(
            match Fleet::of(ctx.session).kill_holders(&HostSel::from(&sel), &filter, &kill_opts) {
                Ok(mut report) => {
                    no_force_here(&mut report);
                    Reply::ok(summary::kill(&report), CleanOut::DryRun(report))
                }
                Err(e) => Reply::failed(e),
            },
        );
    }
    let mut progress = Reporter::new(ctx, Some(kill_opts.grace + wait.timeout));
    progress.send("stopping the compute holders");
    let clean = Clean {
        sel,
        filter,
        kill: kill_opts,
        wait,
    };
    let r = Local::new(
        ctx.session,
        Watch {
            stop: ctx.stop,
            show: &mut |m| progress.send(m),
        },
    )
    .serving(ctx.served.clone())
    .ask(&clean);
    let mut r = match r {
        Ok(r) => r,
        Err(e) => return Ok(Reply::failed(e)),
    };
    no_force_here(&mut r.kill);
    if r.outcome == WaitOutcome::Interrupted || ctx.stopped() {
        return Err(CallError::Cancelled {
            signalled: r.kill.signalled,
        });
    }
    let (line, signalled) = (summary::clean(&r), r.kill.signalled.clone());
    Ok(Reply::signalled(line, CleanOut::Done(r), signalled))
}

/// A protected daemon kill or clean left alone: through MCP no flag stops it, so say so.
fn no_force_here(r: &mut crate::process::kill::KillReport) {
    for s in &mut r.skipped {
        s.reason.never_forced();
    }
}

fn run(ctx: &Ctx, a: RunArgs) -> Result<Reply, CallError> {
    ctx.policy.check("run", Permission::Run, false)?;
    let cmd = match a.command {
        CommandArg::Shell(s) if !s.trim().is_empty() => Cmd::Shell(s),
        CommandArg::Argv(v) if v.first().is_some_and(|c| !c.is_empty()) => Cmd::Argv(v),
        _ => return Err(CallError::BadArguments("run: the command is empty".into())),
    };
    let timeout = seconds("run", "timeout", a.timeout)?;
    run_job(ctx, &cmd, timeout, a.cwd, a.tail_lines, Vec::new())
}

fn run_recipe(ctx: &Ctx, a: RecipeArgs) -> Result<Reply, CallError> {
    ctx.policy.check("run_recipe", Permission::Recipes, false)?;
    let bad = |why: String| CallError::BadArguments(format!("run_recipe: {why}"));
    let found = recipes::find(&a.name, &roots(ctx.policy)).map_err(|e| {
        // A recipe of the user's own is there, but this server does not run those.
        let mine = recipes::valid_name(&a.name)
            && !ctx.policy.user_recipes()
            && recipes::user_dir().is_some_and(|d| d.join(format!("{}.rhai", a.name)).exists());
        bad(if mine {
            format!(
                "{} is one of the user's own recipes, which this server runs only when started with `gpuloop mcp --user-recipes` (the person who runs it decides)",
                a.name
            )
        } else {
            e.to_string()
        })
    })?;
    let header = recipes::header_of(&found.name, &found.source).map_err(|e| {
        bad(format!(
            "{}: its header, line {}: {}",
            found.name, e.line, e.why
        ))
    })?;
    // What it does beyond reading, against what this server allows, before anything runs;
    // the gpuloop that runs it enforces the same (MCP_ALLOW below).
    ctx.policy
        .check_needs(header.needs.as_deref().unwrap_or_default())?;
    let words = match a.args {
        RecipeArgv::Words(w) => w,
        RecipeArgv::Named(m) => recipes::header::argv_of(&header.args, &m)
            .map_err(|e| bad(format!("{}: {e}", found.name)))?,
    };
    // The same check `gpuloop run` makes, before anything runs.
    if !header.args.is_empty() {
        match recipes::header::parse_args(&header.args, &words) {
            Ok(Parsed::Values(_)) => {}
            Ok(Parsed::Help) => {
                return Err(bad(format!(
                    "{}: --help is no argument here: the `recipes` tool and this tool's schema list its arguments",
                    found.name
                )))
            }
            Err(e) => return Err(bad(format!("{}: {e}", found.name))),
        }
    }
    let timeout = seconds("run_recipe", "timeout", a.timeout)?;
    let exe = match std::env::current_exe() {
        Ok(p) => p.display().to_string(),
        Err(e) => {
            return Ok(Reply::failed(format!(
                "run_recipe: cannot find gpuloop: {e}"
            )))
        }
    };
    // The same gpuloop, the same simulator or driver (GPULOOP_SIM is in the environment),
    // and the same recipe: without --user-recipes that gpuloop looks past the user's too.
    // It is told what this server allows, and lets the recipe do only what its header
    // declares (nothing beyond reading where it declares nothing).
    let mut argv = vec![exe, "run".into(), found.name, "--".into()];
    argv.extend(words);
    let mut env = vec![(recipes::MCP_ALLOW.to_string(), ctx.policy.words())];
    if !ctx.policy.user_recipes() {
        env.push((recipes::NO_USER_RECIPES.to_string(), "1".to_string()));
    }
    run_job(ctx, &Cmd::Argv(argv), timeout, None, a.tail_lines, env)
}

/// Runs a job to its end (or its timeout, or the call's cancellation) and replies with its
/// exit code and the ends of its output.
fn run_job(
    ctx: &Ctx,
    cmd: &Cmd,
    timeout: Duration,
    cwd: Option<String>,
    tail_lines: usize,
    env: Vec<(String, String)>,
) -> Result<Reply, CallError> {
    let opts = JobOpts {
        timeout: Some(timeout),
        cwd: cwd.map(Into::into),
        env,
        // stdout is the MCP channel: output is captured, never echoed.
        echo: false,
        served: Some(ctx.served.clone()),
        ..JobOpts::default()
    };
    let job = match Job::spawn(cmd, opts) {
        Ok(j) => j,
        Err(e) => return Ok(Reply::failed(e)),
    };
    let mut progress = Reporter::new(ctx, Some(timeout));
    let outcome = loop {
        match job.wait(Some(Duration::from_secs(1)), ctx.stop) {
            Waited::Done(o) => break o,
            Waited::Running => {
                progress.send(&format!("running `{}` (pid {})", job.command(), job.pid()))
            }
            Waited::Interrupted => {
                job.stop(Signal::SIGTERM, None);
                return Err(CallError::Cancelled {
                    signalled: vec![i64::from(job.pid())],
                });
            }
        }
    };
    // The no-orphan guarantee: the runner stopped what the job left running when its leader
    // exited (its `leftovers`), as run() does in scripts.
    let leftovers = outcome.leftovers.clone();
    let tail = tail_lines.max(1);
    let out = RunOut {
        command: job.command().to_string(),
        code: outcome.code,
        signal: outcome.signal.clone(),
        ok: outcome.ok,
        timed_out: outcome.timed_out,
        elapsed_ms: outcome.elapsed_ms,
        pid: outcome.pid,
        stdout_tail: runner::tail(&outcome.stdout, tail),
        stderr_tail: runner::tail(&outcome.stderr, tail),
        leftovers: leftovers.clone(),
    };
    Ok(Reply::signalled(
        summary::run(job.command(), &outcome, Some(timeout), &leftovers),
        out,
        leftovers,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_bad_argument_is_named_in_the_message() {
        let e = args::<SelArgs>("diagnose", raw(json!({ "gpus": "zero" }))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "diagnose: gpus: invalid type: string \"zero\", expected a sequence"
        );
        let e = args::<KillArgs>("kill", raw(json!({ "targets": [{ "pid": 5 }] }))).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("kill: targets[0]: expected a pid, or a holder record"),
            "{e}"
        );
        let e = args::<NoArgs>("gpus", raw(json!({ "sudo": true }))).unwrap_err();
        assert!(e.to_string().contains("unknown field `sudo`"), "{e}");
    }

    #[test]
    fn a_refusal_is_an_error_result_saying_how_to_allow_it() {
        let r = Policy::default()
            .check("clean", Permission::Clean, false)
            .unwrap_err();
        let reply = Reply::refused(&r);
        assert!(reply.failed);
        assert!(reply.summary.contains("`gpuloop mcp --allow clean`"));
        assert_eq!(
            reply.data,
            json!({ "refused": true, "tool": "clean", "allow": "clean" })
        );
    }

    #[test]
    fn every_output_schema_is_an_object_that_admits_the_error_shapes() {
        for t in list(&Policy::default()) {
            let schema = t
                .output_schema
                .unwrap_or_else(|| panic!("{}: none", t.name));
            assert_eq!(schema["type"], "object", "{}", t.name);
            let required: Vec<&Value> = schema["anyOf"]
                .as_array()
                .map(|a| a.iter().map(|b| &b["required"]).collect())
                .unwrap_or_default();
            assert!(
                required.contains(&&json!(["refused", "tool", "allow"]))
                    && required.contains(&&json!(["error"])),
                "{}: {schema:?}",
                t.name
            );
        }
    }
}
