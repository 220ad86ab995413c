//! kill(): targets and options from script values into the identity-safe kill.

use crate::inspect::{Bound, User};
use crate::machine::Fleet;
use crate::process::kill::{parse_signal, KillOpts, Target};
use crate::process::Identity;
use crate::script::convert::{script_err, to_map, to_script, Opts, RhaiResult};
use crate::script::engine::def;
use crate::session::Session;
use rhai::{Array, Dynamic, Engine, Map};
use std::sync::Arc;

/// A pid, a holder map (pid + start: checked before signalling), or an array of either.
fn targets(v: &Dynamic) -> RhaiResult<Vec<(Option<String>, Target)>> {
    if let Some(pid) = v.clone().try_cast::<i64>() {
        return Ok(vec![(None, Target::Pid(pid_of(pid)?))]);
    }
    if let Some(m) = v.clone().try_cast::<Map>() {
        // A holder map says which host it runs on: the kill goes there.
        let host = m
            .get("host")
            .and_then(|h| h.clone().into_immutable_string().ok())
            .map(|h| h.to_string());
        return Ok(vec![(host, Target::Exact(map_identity(&m)?))]);
    }
    if let Some(a) = v.clone().try_cast::<Array>() {
        let mut out = Vec::new();
        for t in &a {
            out.extend(targets(t)?);
        }
        return Ok(out);
    }
    Err(script_err(format!(
        "kill: expected a pid, a holder map or an array of them, found a {}",
        v.type_name()
    )))
}

/// The identity a holder map carries: an integer `pid` and `start`, and `pidfs_ino` where
/// the kernel has pidfs. A map without a valid `start` is an error, never
/// a bare pid (that would signal whatever has the pid now). Bare pids are only integers.
fn map_identity(m: &Map) -> RhaiResult<Identity> {
    let int = |key: &str| -> RhaiResult<Option<i64>> {
        match m.get(key) {
            None => Ok(None),
            Some(v) if v.is_unit() => Ok(None),
            Some(v) => v.as_int().map(Some).map_err(|t| {
                script_err(format!(
                    "kill: a holder map's {key} must be an integer, found a {t}"
                ))
            }),
        }
    };
    let pid = int("pid")?.ok_or_else(|| {
        script_err("kill: a map target needs an integer pid (a holder map from holders())")
    })?;
    let pid = pid_of(pid)?;
    let start = int("start")?.ok_or_else(|| {
        script_err(format!(
            "kill: the map for pid {pid} has no start, so its identity cannot be checked \
             (use a holder map from holders(), or pass the bare pid {pid})"
        ))
    })?;
    let start = u64::try_from(start)
        .map_err(|_| script_err(format!("kill: start {start} is not a valid start time")))?;
    let ino = int("pidfs_ino")?
        .map(|i| {
            u64::try_from(i)
                .map_err(|_| script_err(format!("kill: pidfs_ino {i} is not a valid inode")))
        })
        .transpose()?;
    Ok(Identity { pid, start, ino })
}

fn pid_of(pid: i64) -> RhaiResult<i32> {
    i32::try_from(pid).map_err(|_| script_err(format!("kill: {pid} is not a valid pid")))
}

/// The options kill() takes.
const KILL_OPTS: &[&str] = &[
    "signal",
    "grace",
    "tree",
    "dry_run",
    "force",
    "parents",
    "on_error",
    "user",
    "mine",
    "pod",
    "container",
];

/// kill()'s `user` (a name or a uid) or `mine: true`, `pod` and `container`: whose processes
/// alone it may signal.
fn kill_bound(opts: &Map) -> RhaiResult<Bound> {
    let o = Opts::new(opts, "kill", KILL_OPTS)?;
    Ok(Bound {
        user: kill_user(opts)?,
        pod: o.scope("pod")?,
        container: o.scope("container")?,
    })
}

/// kill()'s `user` (a name or a uid) or `mine: true`.
fn kill_user(opts: &Map) -> RhaiResult<Option<User>> {
    let o = Opts::new(opts, "kill", KILL_OPTS)?;
    let user = match o.raw("user") {
        None => None,
        Some(u) => Some(match u.as_int() {
            Ok(n) => User::Uid(
                u32::try_from(n)
                    .map_err(|_| script_err(format!("kill: user {n} is not a valid uid")))?,
            ),
            Err(_) => User::parse(&u.to_string()),
        }),
    };
    match (user, o.bool("mine", false)?) {
        (Some(_), true) => Err(script_err("kill: give user or mine, not both")),
        (user, false) => Ok(user),
        (None, true) => Ok(Some(User::Me)),
    }
}

/// kill()'s option map as the kill engine's options (its `user`, `mine` and `on_error` are
/// read apart: they say where and whom, not how).
impl TryFrom<&Map> for KillOpts {
    type Error = Box<rhai::EvalAltResult>;
    fn try_from(opts: &Map) -> RhaiResult<KillOpts> {
        let o = Opts::new(opts, "kill", KILL_OPTS)?;
        let d = KillOpts::default();
        let signal = match o.string("signal")? {
            None => d.signal,
            Some(name) => parse_signal(&name).map_err(|e| script_err(format!("kill: {e}")))?,
        };
        Ok(KillOpts {
            signal,
            grace: o.grace("grace", d.grace)?,
            tree: o.bool("tree", d.tree)?,
            dry_run: o.bool("dry_run", d.dry_run)?,
            force: o.bool("force", d.force)?,
            parents: o.bool("parents", d.parents)?,
            ..KillOpts::default()
        })
    }
}

/// `on_error` of kill()'s options: "skip" goes on without unreachable hosts.
fn on_error_of(opts: &Map) -> RhaiResult<bool> {
    Opts::new(opts, "kill", KILL_OPTS)?.on_error()
}

/// Runs the kill; an interrupt during the grace ends the script (exit 130) after saying
/// what was signalled and what still runs, un-KILLed.
fn run_kill(
    s: &Session,
    target: &Dynamic,
    opts: &KillOpts,
    bound: &Bound,
    skip: bool,
) -> RhaiResult<Dynamic> {
    let targets = targets(target)?;
    let report = Fleet::of(s)
        .skipping(skip)
        .kill(&targets, opts, bound)
        .map_err(to_script)?;
    if report.interrupted {
        crate::errln!(
            "kill interrupted during the grace: signalled {:?}, exited {:?}, still running (not KILLed) {:?}",
            report.signalled, report.exited, report.survivors
        );
    }
    if report.interrupted || crate::interrupt::is_set() {
        return Err(super::interrupted());
    }
    to_map(&report)
}

pub(crate) fn register(engine: &mut Engine, session: &Arc<Session>) {
    let s = session.clone();
    def(
        engine,
        "kill",
        &["target: i64 | Map | Array", "Map"],
        "Stops processes safely: SIGTERM to every target (and its descendants) at once, one
         shared 5 s grace, then SIGKILL to survivors; exits are awaited, not slept for.
         Holder maps are checked by (pid, start, pidfs_ino) through a pidfd, so a recycled pid
         is never hit; a map without an integer start is an error. Never signals pid <= 1,
         kernel threads, gpuloop or its ancestors; GPU daemons only with force. A target that
         cannot act on the signal (it ignores it, or is a PID-namespace init without a handler
         for it) gets SIGKILL at once. Returns a map: signalled, exited, survivors (pids),
         skipped (#{pid, reason}), errors (#{pid, error}), killed_at_once (#{pid, reason}),
         stuck (#{pid, name, wchan}: KILLed but asleep in the driver, D state), restarters
         (#{pid, name, holder, shown}: live parents of the targets that may start them again,
         e.g. a shell loop or torchrun's agent, left running; shown is \"launcher\" (a launcher
         known to restart its workers), \"restarted\" (gpuloop saw it restart a holder) or ();
         later waits and diagnoses watch for them), elapsed_ms.
         Ctrl-C during the grace stops the waiting and KILLs nobody: the script ends (130)
         saying what was signalled and what still runs.",
        move |target: Dynamic| -> RhaiResult<Dynamic> {
            run_kill(&s, &target, &KillOpts::default(), &Bound::default(), false)
        },
    );
    let s = session.clone();
    def(
        engine,
        "kill",
        &["target: i64 | Map | Array", "opts: Map", "Map"],
        "kill() with options: signal (\"TERM\" default, any name like \"INT\", \"KILL\"),
         grace (seconds before SIGKILL, default 5; 0 = TERM then KILL at once, as docker stop
         -t 0; \"inf\" = never KILL: it waits for them to exit, Ctrl-C stops the waiting),
         tree (default true:
         descendants too), dry_run (report, signal nothing), force (allow protected daemons),
         parents (default false: also stop the targets' parents that have shown they restart
         them, under the same identity and protection rules: torchrun's elastic agent, or a
         parent gpuloop saw start a holder again, in this run (a wait_clean that saw it) or
         remembered on this machine; any other live parent is left running and listed in
         restarters; never init, a login or interactive shell, nor a job step's or container's
         manager such as slurmstepd, a containerd shim, conmon, tini, sshd, sudo or tmux),
         on_error (\"skip\": go on without hosts that cannot be reached; each target of such a
         host is in skipped, with what ssh said), user (a name or a uid) or mine: true (only
         that user's processes are signalled, looked up on each target's host: the targets,
         their trees, groups and parents; anyone else's is in skipped, with why), pod
         (NAMESPACE/NAME, NAME, or a uid or 8 characters of it) and container (a name, or
         an id or 12 characters of it), each fitting one pod or container (else an error
         lists each by uid or id): only that pod's or container's
         processes are signalled, each read through its pidfd (a process at a reused pid is
         outside), trees, groups and parents alike.
         With several hosts each holder map is killed on its own host, where its identity is
         checked (by_host holds each host's report); a bare pid is then ambiguous.",
        move |target: Dynamic, opts: Map| -> RhaiResult<Dynamic> {
            let skip = on_error_of(&opts)?;
            run_kill(
                &s,
                &target,
                &KillOpts::try_from(&opts)?,
                &kill_bound(&opts)?,
                skip,
            )
        },
    );
}
