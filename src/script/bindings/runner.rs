//! run(), spawn() and the Job handle; apply_patch(), call_fn() and friends for the patch module.

use crate::machine::jobs::{self, JobHandle};
use crate::process::kill::parse_signal;
use crate::runner::patch::{self, Direction};
use crate::runner::{Cmd, JobOpts, Outcome, RunError, Waited};
use crate::script::convert::{script_err, secs_arg, to_map, Opts, RhaiResult};
use crate::script::engine::def;
use crate::script::recipes::needs::{Act, Powers};
use crate::session::Session;
use nix::sys::signal::Signal;
use rhai::{Array, Dynamic, Engine, EvalAltResult, FnPtr, ImmutableString, Map, NativeCallContext};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const RUN_OPTS: &[&str] = &[
    "timeout",
    "cwd",
    "env",
    "echo",
    "grace",
    "check",
    "keep_children",
    "host",
];

/// A command string (for `sh -c`) or an argv array (numbers become their text).
fn command(func: &str, v: &Dynamic) -> RhaiResult<Cmd> {
    if let Ok(s) = v.clone().into_immutable_string() {
        if s.trim().is_empty() {
            return Err(script_err(format!("{func}: the command is empty")));
        }
        return Ok(Cmd::Shell(s.to_string()));
    }
    if let Some(a) = v.clone().try_cast::<Array>() {
        let argv = a
            .iter()
            .map(|x| {
                if x.is_string() || x.is_int() || x.is_float() || x.is_bool() {
                    Ok(x.to_string())
                } else {
                    Err(script_err(format!(
                        "{func}: argv elements must be strings, found a {}",
                        x.type_name()
                    )))
                }
            })
            .collect::<RhaiResult<Vec<String>>>()?;
        if argv.first().is_none_or(String::is_empty) {
            return Err(script_err(format!("{func}: the argv array is empty")));
        }
        return Ok(Cmd::Argv(argv));
    }
    Err(script_err(format!(
        "{func}: expected a command string or an argv array, found a {}",
        v.type_name()
    )))
}

/// Options of run()/spawn(), and whether `check` was asked for.
fn job_opts(func: &'static str, opts: &Map) -> RhaiResult<(JobOpts, bool)> {
    let o = Opts::new(opts, func, RUN_OPTS)?;
    let d = JobOpts::default();
    let env = match o.raw("env") {
        None => Vec::new(),
        Some(v) => {
            let m = v.clone().try_cast::<Map>().ok_or_else(|| {
                script_err(format!(
                    "{func}: option env must be a map, not a {}",
                    v.type_name()
                ))
            })?;
            m.into_iter()
                .map(|(k, v)| {
                    if v.is_map() || v.is_array() || v.is_unit() {
                        return Err(script_err(format!(
                            "{func}: env value of {k} must be a string, not a {}",
                            v.type_name()
                        )));
                    }
                    Ok((k.to_string(), v.to_string()))
                })
                .collect::<RhaiResult<Vec<_>>>()?
        }
    };
    let job = JobOpts {
        timeout: o.secs("timeout", None)?,
        cwd: o.string("cwd")?.map(PathBuf::from),
        env,
        echo: o.bool("echo", d.echo)?,
        grace: o.grace("grace", d.grace)?,
        keep_children: o.bool("keep_children", false)?,
        ..JobOpts::default()
    };
    Ok((job, o.bool("check", false)?))
}

fn run_err(func: &str, e: RunError) -> Box<EvalAltResult> {
    match e {
        RunError::Interrupted => super::interrupted(),
        e => script_err(format!("{func}: {e}")),
    }
}

/// The result map; with `check`, a failure is an error carrying the stderr tail.
fn finish(
    job_cmd: &str,
    timeout: Option<Duration>,
    o: Outcome,
    check: bool,
) -> RhaiResult<Dynamic> {
    if check && !o.ok {
        let tail = o.stderr_tail(20);
        let tail = if tail.is_empty() {
            " (stderr was empty)".to_string()
        } else {
            format!("; stderr ends with:\n{tail}")
        };
        return Err(script_err(format!("`{job_cmd}` {}{tail}", o.how(timeout))));
    }
    to_map(&o)
}

fn run(s: &Session, cmd: &Dynamic, opts: &Map) -> RhaiResult<Dynamic> {
    let cmd = command("run", cmd)?;
    let host = Opts::new(opts, "run", RUN_OPTS)?.string("host")?;
    let (opts, check) = job_opts("run", opts)?;
    let timeout = opts.timeout;
    let o = jobs::run(s, host.as_deref(), &cmd, opts).map_err(|e| run_err("run", e))?;
    finish(&cmd.display(), timeout, o, check)
}

fn spawn(s: &Arc<Session>, cmd: &Dynamic, opts: &Map) -> RhaiResult<JobHandle> {
    let cmd = command("spawn", cmd)?;
    let host = Opts::new(opts, "spawn", RUN_OPTS)?.string("host")?;
    let (opts, check) = job_opts("spawn", opts)?;
    let job = jobs::spawn(s, host.as_deref(), &cmd, opts).map_err(|e| run_err("spawn", e))?;
    Ok(JobHandle {
        job: Arc::new(job),
        check,
    })
}

fn wait(h: &JobHandle, timeout: Option<Duration>) -> RhaiResult<Dynamic> {
    let job = &h.job;
    match job
        .wait(timeout, crate::interrupt::flag())
        .map_err(|e| run_err("wait", e))?
    {
        Waited::Done(o) => finish(job.command(), job.timeout(), o, h.check),
        Waited::Running => Ok(Dynamic::UNIT),
        Waited::Interrupted => {
            let _ = job.stop(Signal::SIGTERM, None);
            Err(super::interrupted())
        }
    }
}

fn stop(h: &JobHandle, opts: &Map) -> RhaiResult<Dynamic> {
    let o = Opts::new(opts, "kill", &["signal", "grace"])?;
    let signal = match o.string("signal")? {
        None => Signal::SIGTERM,
        Some(name) => parse_signal(&name).map_err(|e| script_err(format!("kill: {e}")))?,
    };
    let grace = match o.raw("grace") {
        Some(_) => Some(o.grace("grace", Duration::ZERO)?),
        None => None,
    };
    match h.job.stop(signal, grace).map_err(|e| run_err("kill", e))? {
        Some(o) => to_map(&o),
        None => Err(run_err("kill", RunError::Stuck { pid: h.job.pid() })),
    }
}

fn patch_file(
    powers: Powers,
    func: &str,
    path: &str,
    diff: &str,
    direction: Direction,
) -> RhaiResult<i64> {
    powers
        .check(Act::Run, &format!("{func}()"))
        .map_err(script_err)?;
    patch::apply(Path::new(path), diff, direction, false)
        .map(|a| a.hunks as i64)
        .map_err(|e| script_err(format!("{func}: {e}")))
}

pub(crate) fn register(engine: &mut Engine, session: &Arc<Session>, powers: Powers) {
    engine.register_type_with_name::<JobHandle>("Job");
    // run() and spawn() start commands: only a script that may run them.
    let may_run = move |func: &str| powers.check(Act::Run, func).map_err(script_err);

    let s = session.clone();
    def(
        engine,
        "run",
        &["cmd: String | Array", "Map"],
        "Runs a job to its end and returns #{code, signal, ok, timed_out, stdout, stderr,
         elapsed_ms, pid, leftovers}. cmd is a string (run by sh -c) or an argv array (no shell).
         code is () when a signal ended it (signal is then \"TERM\", \"KILL\", \"SEGV\", ...);
         ok is code == 0 and not timed out. Output is echoed live and captured; stdin is
         /dev/null. Bounded memory: each of stdout and stderr keeps its first 256 KiB and last
         1 MiB, the middle replaced by a line [gpuloop: N bytes dropped]; invalid UTF-8 becomes
         U+FFFD. The job gets its own process group and GPULOOP_EXE (this gpuloop) in its
         environment. On timeout, Ctrl-C and script end its whole tree (descendants, its
         process group, and orphans that double-forked or called setsid) gets TERM, the grace,
         then KILL, and is reaped. Ctrl-C then ends the script (exit 130). When the main
         process exits, what the job left running is stopped the same way before run()
         returns; leftovers lists those pids.",
        move |cmd: Dynamic| {
            may_run("run()")?;
            run(&s, &cmd, &Map::new())
        },
    );
    let s = session.clone();
    def(
        engine,
        "run",
        &["cmd: String | Array", "opts: Map", "Map"],
        "run() with options: timeout (seconds, default none), cwd, env (a map added to the
         environment), echo (default true), grace (seconds between TERM and KILL, default 5;
         0 means TERM then KILL at once; \"inf\" never KILLs: the stop waits until the tree
         has exited, and Ctrl-C then KILLs it), check (default false: when true a failure throws, with the
         end of stderr), keep_children (default false: when true, what the job leaves running
         after its main process exits is kept, and still listed in leftovers), host (a host of
         --host: the job runs there under its agent, which stops its whole tree on timeout,
         Ctrl-C, script end or a dropped connection; its output streams back as
         \"[host] line\").",
        move |cmd: Dynamic, opts: Map| {
            may_run("run()")?;
            run(&s, &cmd, &opts)
        },
    );
    let s = session.clone();
    def(
        engine,
        "spawn",
        &["cmd: String | Array", "Job"],
        "Starts a job in the background (a server to poll, a holder to race against) and
         returns its handle: job.pid, job.host, job.wait([timeout]), job.kill([opts]),
         job.running(). Same command forms, capture and echo as run(); stopped, whole tree,
         when the script ends.",
        move |cmd: Dynamic| {
            may_run("spawn()")?;
            spawn(&s, &cmd, &Map::new())
        },
    );
    let s = session.clone();
    def(
        engine,
        "spawn",
        &["cmd: String | Array", "opts: Map", "Job"],
        "spawn() with run()'s options; timeout stops the job even if nobody waits, check makes
         wait() throw on failure. With host (a host of --host) the job runs there under its
         agent, which stops its whole tree on kill(), timeout, script end or a dropped
         connection; its output streams back as \"[host] line\", job.pid is its pid there,
         and wait(), kill() and running() act on it over the connection (a host that stops
         answering fails them with a timeout error naming it).",
        move |cmd: Dynamic, opts: Map| {
            may_run("spawn()")?;
            spawn(&s, &cmd, &opts)
        },
    );

    rhai::FuncRegistration::new_getter("pid")
        .with_params_info(["job: &mut Job", "i64"])
        .with_comments(["/// The job's pid (the leader of its process group)."])
        .register_into_engine(engine, |h: &mut JobHandle| -> i64 { h.job.pid().into() });
    rhai::FuncRegistration::new_getter("host")
        .with_params_info(["job: &mut Job", "String"])
        .with_comments(["/// Where the job runs: \"local\", or the host of spawn()'s host option."])
        .register_into_engine(engine, |h: &mut JobHandle| -> String {
            h.job.host().to_string()
        });
    def(
        engine,
        "wait",
        &["job: &mut Job", "Map"],
        "Waits for a spawned job to end and returns run()'s result map (throws on failure if
         it was spawned with check). Ctrl-C stops the job and ends the script.",
        |h: &mut JobHandle| wait(h, None),
    );
    def(
        engine,
        "wait",
        &["job: &mut Job", "timeout: i64 | f64", "Map | ()"],
        "Waits at most timeout seconds: the result map if the job ended, () if it still runs.",
        |h: &mut JobHandle, timeout: Dynamic| wait(h, Some(secs_arg(&timeout, "wait")?)),
    );
    def(
        engine,
        "kill",
        &["job: &mut Job", "Map"],
        "Stops the job's whole tree (TERM, the job's grace, KILL; descendants, its process
         group and its orphans) and returns the result map once it ended. On a job that
         already ended it stops what the job left behind.",
        |h: &mut JobHandle| stop(h, &Map::new()),
    );
    def(
        engine,
        "kill",
        &["job: &mut Job", "opts: Map", "Map"],
        "job.kill() with options: signal (default \"TERM\"), grace (seconds before KILL,
         default the job's; 0 means TERM then KILL at once; \"inf\" never KILLs and waits
         for the tree to exit).",
        |h: &mut JobHandle, opts: Map| stop(h, &opts),
    );
    def(
        engine,
        "running",
        &["job: &mut Job", "bool"],
        "True until the job's main process has exited.",
        |h: &mut JobHandle| h.job.running().map_err(|e| run_err("running", e)),
    );
    def(
        engine,
        "to_string",
        &["job: &mut Job", "String"],
        "The job as text: Job(pid N: command), Job(pid N on HOST: command) on another host.",
        |h: &mut JobHandle| format!("{:?}", h.job),
    );
    def(
        engine,
        "to_debug",
        &["job: &mut Job", "String"],
        "The job as text, for debug(): Job(pid N: command).",
        |h: &mut JobHandle| format!("{:?}", h.job),
    );

    def(
        engine,
        "call_fn",
        &["f: Fn", "args: Array", "?"],
        "Calls the closure f with args, or with only the leading ones f takes (a callback may
         ignore trailing arguments, e.g. a fixer |result| given (result, attempt)). Errors
         inside f propagate as they are.",
        |ctx: NativeCallContext, f: FnPtr, args: Array| -> RhaiResult<Dynamic> {
            let own = format!("{} ", f.fn_name());
            let mut n = args.len();
            loop {
                let r = f.call_raw(&ctx, None, args[..n].to_vec());
                match r {
                    Err(e)
                        if n > 0
                            && matches!(&*e, EvalAltResult::ErrorFunctionNotFound(sig, _) if sig.starts_with(&own)) =>
                    {
                        n -= 1
                    }
                    r => return r,
                }
            }
        },
    );
    def(
        engine,
        "apply_patch",
        &["path: String", "diff: String", "i64"],
        "Applies a unified diff to path, a file (the diff changes one file; its header names
         are ignored; bare @@ hunks are fine) or a directory (files named by the ---/+++
         headers, git's a/ b/ prefixes stripped). All or nothing: when a hunk does not apply,
         the error says which line differs (and whether the diff looks already applied) and no
         file is touched. Returns the number of hunks applied.",
        move |path: ImmutableString, diff: ImmutableString| {
            patch_file(powers, "apply_patch", &path, &diff, Direction::Apply)
        },
    );
    def(
        engine,
        "revert_patch",
        &["path: String", "diff: String", "i64"],
        "Undoes a unified diff applied with apply_patch (applies its reverse), all or nothing.
         Returns the number of hunks reverted.",
        move |path: ImmutableString, diff: ImmutableString| {
            patch_file(powers, "revert_patch", &path, &diff, Direction::Revert)
        },
    );
    def(
        engine,
        "patch_applied",
        &["path: String", "diff: String", "bool"],
        "True if the diff is applied to path: it reverts cleanly and does not apply again.
         Lets a fixer patch only once.",
        |path: ImmutableString, diff: ImmutableString| -> RhaiResult<bool> {
            patch::is_applied(Path::new(path.as_str()), &diff)
                .map_err(|e| script_err(format!("patch_applied: {e}")))
        },
    );
}
