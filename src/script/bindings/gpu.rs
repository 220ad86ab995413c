//! gpu(), holders(), diagnose(), wait_clean().

use crate::hosts::HostSel;
use crate::inspect::wait::{WaitOpts, WaitOutcome};
use crate::inspect::{Filter, User};
use crate::machine::Fleet;
use crate::script::convert::{
    script_err, selectors, to_array, to_map, to_script, Opts, RhaiResult,
};
use crate::script::engine::def;
use crate::session::Session;
use rhai::{Array, Dynamic, Engine, Map};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A script's GPU selector over the host set: indices, `--gpu` strings (UUIDs and bus ids
/// looked up on this machine) and `"dest:index"` for one host's GPU.
fn selection(s: &Session, sel: &Dynamic) -> RhaiResult<HostSel> {
    let items = match sel.clone().try_cast::<Array>() {
        Some(a) => a,
        None if sel.is_unit() => return Ok(HostSel::all()),
        None => vec![sel.clone()],
    };
    let mut at: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut rest = Array::new();
    for x in items {
        let text = x.clone().into_immutable_string().ok();
        match text.as_deref().and_then(HostSel::parse_host_index) {
            Some((host, i)) => at.entry(host).or_default().push(i),
            None => rest.push(x),
        }
    }
    let sels = if rest.is_empty() && !at.is_empty() {
        None
    } else {
        selectors(&Dynamic::from_array(rest))?
    };
    Fleet::of(s)
        .select_hosts(sels.as_deref(), at)
        .map_err(to_script)
}

pub(crate) fn register(engine: &mut Engine, session: &Arc<Session>) {
    let s = session.clone();
    def(
        engine,
        "gpu",
        &["Array"],
        "Every GPU, as maps: index, uuid, name, minor (the N of /dev/nvidiaN), bus_id,
         mem_total, mem_used, mem_free (bytes), mem_used_mib, mem_total_mib, util (% or ()),
         temp_c (or ()), procs (processes the driver reports), host. A GPU the driver fails
         to read (an error, or no answer within GPULOOP_DRIVER_TIMEOUT) makes this an error
         that names it; gpu(i) still reads the others, and diagnose() reports it as
         \"driver-error\".",
        move || -> RhaiResult<Array> {
            // Each host's maps are built on its own task as its reply comes in.
            let parts = Fleet::of(&s)
                .gpus_per_host_as(|gs| (crate::gpu::unread(&gs, |_| true), to_array(&gs)))
                .map_err(to_script)?;
            let parts = Fleet::of(&s).answered_parts(parts).map_err(to_script)?;
            let mut all = Array::new();
            for (unread, maps) in parts {
                if let Some(e) = unread {
                    return Err(to_script(e));
                }
                all.extend(maps?);
            }
            Ok(all)
        },
    );
    let s = session.clone();
    def(
        engine,
        "gpu",
        &["index: i64", "Map"],
        "One GPU by index, as the maps of gpu(); an unknown index, or a GPU the driver fails
         to read, is an error.",
        move |index: i64| -> RhaiResult<Dynamic> {
            let g = Fleet::of(&s).gpu(index).map_err(to_script)?;
            if let Some(e) = crate::gpu::unread(std::slice::from_ref(&g), |_| true) {
                return Err(to_script(e));
            }
            to_map(&g)
        },
    );

    let s = session.clone();
    def(
        engine,
        "gpu",
        &["sel: String", "Map"],
        "One GPU named as --gpu names one: \"2\", a UUID or a unique prefix of one, a PCI bus
         id, or \"dest:index\" (a host of --host and a GPU index). A name that matches no GPU,
         several GPUs, or a GPU on several hosts is an error.",
        move |sel: &str| -> RhaiResult<Dynamic> {
            let g = match HostSel::parse_host_index(sel) {
                Some((host, index)) => Fleet::of(&s).gpu_at(&host, index),
                None => Fleet::of(&s).gpu_named(sel),
            }
            .map_err(to_script)?;
            to_map(&g)
        },
    );
    let s = session.clone();
    def(
        engine,
        "hosts",
        &["Array"],
        "The host set (--host, --hosts-file, --hosts-from-slurm; [\"local\"] without them), connecting to every
         host if not done yet: maps of name, local, reachable, hostname, version and gpus
         (from the agent's hello), error (why it cannot be reached, or ()).",
        move || -> RhaiResult<Array> { to_array(&Fleet::of(&s).hosts()) },
    );
    let diagnose = |s: &Session, sel: Dynamic, opts: Map| -> RhaiResult<Array> {
        let o = Opts::new(&opts, "diagnose", &["on_error"])?;
        let sel = selection(s, &sel)?;
        let fleet = Fleet::of(s).skipping(o.on_error()?);
        to_array(
            &fleet
                .diagnoses(&sel, &Filter::default())
                .map_err(to_script)?,
        )
    };
    let s = session.clone();
    def(
        engine,
        "diagnose",
        &["sel: i64 | String | Array | ()", "opts: Map", "Array"],
        "diagnose() with options: on_error: \"skip\" goes on without hosts that cannot be
         reached (reported once).",
        move |sel: Dynamic, opts: Map| diagnose(&s, sel, opts),
    );
    let s = session.clone();
    def(
        engine,
        "diagnose",
        &["opts: Map", "Array"],
        "diagnose() of every GPU with options: diagnose(#{on_error: \"skip\"}) is
         diagnose((), #{on_error: \"skip\"}).",
        move |opts: Map| diagnose(&s, Dynamic::UNIT, opts),
    );

    let s = session.clone();
    def(
        engine,
        "holders",
        &["Array"],
        "Compute holders of every GPU: processes the driver lists or that map a GPU device node
         (orphaned workers and forked children holding inherited handles included). Maps:
         pid, ppid, pgid, sid, start, uid, user, name, cmdline, state, role, gpus, mem (bytes
         the driver counts against it), inherited (#{from, mem, mem_mib}: what it keeps alive
         of dead creators' memory, which the driver counts against their pids `from`, as a
         forked child of a crashed worker does; or ()), evidence (\"driver\", \"fd\", \"map\"), protected, host; lineage: ppid_comm (the
         parent's name), reparented (the parent is init or a subreaper, or started after it: its
         own parent is gone), launcher (#{pid, start, name, host} of the nearest live ancestor
         that is not a shell, init or subreaper, or ()), service (the systemd unit from its
         cgroup, or ()); attribution: job (Slurm job id from its environment or cgroup, or ()), container
         (docker/containerd id or Kubernetes pod uid, or ()), cgroup (its cgroup path, or ()).",
        move || -> RhaiResult<Array> {
            to_array(&Fleet::of(&s).holders(&HostSel::all(), false, &Filter::default()).map_err(to_script)?)
        },
    );
    let s = session.clone();
    def(
        engine,
        "holders",
        &["sel: i64 | String | Array", "Array"],
        "Compute holders of the selected GPUs: an index, a string as `--gpu` takes it (\"0,1\",
         \"0-3\", a UUID or a unique prefix of one, a PCI bus id), or an array of those.",
        move |sel: Dynamic| -> RhaiResult<Array> {
            to_array(
                &Fleet::of(&s)
                    .holders(&selection(&s, &sel)?, false, &Filter::default())
                    .map_err(to_script)?,
            )
        },
    );
    let holders = |s: &Session, sel: Dynamic, opts: Map| -> RhaiResult<Array> {
        let o = Opts::new(&opts, "holders", &["all", "user", "job", "on_error"])?;
        let all = o.bool("all", false)?;
        // The user goes to each host as given, and each looks it up in its own user
        // database: uids differ between machines.
        let user = match o.raw("user") {
            None => None,
            Some(u) => Some(match u.as_int() {
                Ok(n) => User::Uid(
                    u32::try_from(n)
                        .map_err(|_| script_err(format!("holders: user {n} is not a valid uid")))?,
                ),
                Err(_) => User::parse(&u.to_string()),
            }),
        };
        let filter = Filter {
            user,
            job: o.job_id("job")?,
        };
        Fleet::of(s)
            .check_filter(&filter)
            .map_err(|e| script_err(format!("holders: {e}")))?;
        let fleet = Fleet::of(s).skipping(o.on_error()?);
        to_array(
            &fleet
                .holders(&selection(s, &sel)?, all, &filter)
                .map_err(to_script)?,
        )
    };
    let s = session.clone();
    def(
        engine,
        "holders",
        &["sel: i64 | String | Array | ()", "opts: Map", "Array"],
        "Holders with options: #{all: true} also returns observers (NVML-only clients such as
         nvidia-smi, which open the nodes but map nothing) and protected GPU daemons;
         #{user: \"alice\"} (a name or a uid) only that user's processes, the name looked
         up on each host in its own user database (an unknown name is that host's error);
         #{job: 812} only that Slurm job's (a string of digits too: #{job:
         env(\"SLURM_JOB_ID\")}).",
        move |sel: Dynamic, opts: Map| holders(&s, sel, opts),
    );
    let s = session.clone();
    def(
        engine,
        "holders",
        &["opts: Map", "Array"],
        "Holders of every GPU with options: holders(#{all: true}) is holders((), #{all: true}).",
        move |opts: Map| holders(&s, Dynamic::UNIT, opts),
    );

    let s = session.clone();
    def(
        engine,
        "diagnose",
        &["Array"],
        "Why memory is still used, per GPU: maps of gpu, mem_used_mib, holders (the GPU's
         compute holders, as holders(i)), daemons (protected GPU daemons on it), footprint
         (#{pid, name, gpus, host} of other GPUs' processes whose CUDA context keeps a few MiB
         here), ghost_pids (pids the driver lists that are dead or not visible here), verdict and
         advice (one line to act on; it never advises a reset while a driver client is open).
         Verdicts: \"clean\"; \"held\" (compute holders); \"stuck\" (a holder asleep in the
         driver, D state: SIGKILL takes effect only when the driver call returns, or after a
         reset); \"respawning\" (a parent of a holder this session stopped started it again); \"orphaned\" (the job's launcher is gone: its
         group or session leader exited, or it was reparented to init or a subreaper);
         \"inherited\" (the creator died, a forked child holds its handles); \"service\" (a
         systemd unit's main process holds it: systemctl stop UNIT); \"daemon\" (a protected GPU
         daemon holds it: stop its service, or kill with force); \"footprint\" (only the CUDA
         footprint of processes of other GPUs); \"other-namespace\" (held from another PID
         namespace); \"permission\" (processes gpuloop may not inspect); \"driver\" (used,
         nobody holds it: only a reset frees it); \"driver-error\" (the driver failed to read
         this GPU, or did not answer in time: its memory is unknown, never clean; the advice
         quotes the error); \"no-driver\" (the driver did not load:
         nothing is verified; gpu is () when no GPU was selected).",
        move || -> RhaiResult<Array> {
            to_array(&Fleet::of(&s).diagnoses(&HostSel::all(), &Filter::default()).map_err(to_script)?)
        },
    );
    let s = session.clone();
    def(
        engine,
        "diagnose",
        &["sel: i64 | String | Array", "Array"],
        "diagnose() for the selected GPUs.",
        move |sel: Dynamic| -> RhaiResult<Array> {
            to_array(
                &Fleet::of(&s)
                    .diagnoses(&selection(&s, &sel)?, &Filter::default())
                    .map_err(to_script)?,
            )
        },
    );

    let wait = |s: &Session, sel: Dynamic, opts: Map| -> RhaiResult<bool> {
        let o = Opts::new(
            &opts,
            "wait_clean",
            &[
                "timeout",
                "max_used_mib",
                "poll_ms",
                "strict",
                "settle",
                "stall",
                "quiet",
                "on_error",
            ],
        )?;
        let d = WaitOpts::default();
        let w = WaitOpts {
            timeout: o.secs("timeout", Some(d.timeout))?.unwrap_or(d.timeout),
            max_used_mib: super::not_negative(o.int("max_used_mib", 0)?, "max_used_mib")?,
            poll: Duration::from_millis(
                super::not_negative(o.int("poll_ms", d.poll.as_millis() as i64)?, "poll_ms")?.max(1)
                    as u64,
            ),
            strict: o.bool("strict", d.strict)?,
            settle: o.secs("settle", Some(d.settle))?.unwrap_or(d.settle),
            stall: o.secs("stall", Some(d.stall))?.unwrap_or(d.stall),
            ..d
        };
        let quiet = o.bool("quiet", false)?;
        let sel = selection(s, &sel)?;
        let outcome = Fleet::of(s).skipping(o.on_error()?).wait(&sel, &w, quiet);
        match outcome.map_err(to_script)? {
            WaitOutcome::Clean => Ok(true),
            WaitOutcome::Interrupted => Err(super::interrupted()),
            _ => Ok(false),
        }
    };
    let s = session.clone();
    def(
        engine,
        "wait_clean",
        &["bool"],
        "Waits until every GPU has no memory used and no compute holder; true as soon as that
         is so (within one poll), false after 30 s, or earlier when nothing holds the memory left
         and it stopped moving (waiting cannot help), or a stopped holder's parent started it
         again. Observers and daemons do not make a GPU dirty, nor does the memory a protected
         daemon keeps (an MPS server's context), nor the few MiB a CUDA context keeps on GPUs
         it does not use (see strict). The same judgement as diagnose(), clean, the Slurm
         hooks and MCP. False without a driver.",
        move || wait(&s, Dynamic::UNIT, Map::new()),
    );
    let s = session.clone();
    def(
        engine,
        "wait_clean",
        &["sel: i64 | String | Array | ()", "bool"],
        "wait_clean() for the selected GPUs.",
        move |sel: Dynamic| wait(&s, sel, Map::new()),
    );
    let s = session.clone();
    def(
        engine,
        "wait_clean",
        &["opts: Map", "bool"],
        "wait_clean() of every GPU with options: wait_clean(#{timeout: 60}) is
         wait_clean((), #{timeout: 60}).",
        move |opts: Map| wait(&s, Dynamic::UNIT, opts),
    );
    let s = session.clone();
    def(
        engine,
        "wait_clean",
        &["sel: i64 | String | Array | ()", "opts: Map", "bool"],
        "wait_clean() with options: timeout (seconds, default 30), max_used_mib (default 0),
         poll_ms (default 20), strict (default false: true demands max_used_mib even where the
         rest is what protected daemons keep or the CUDA footprint of jobs on other GPUs), settle (seconds to
         keep watching after it reads clean: a compute holder coming back makes it false),
         stall (seconds, default 1: stop early once nothing holds the memory left and it has not
         moved this long; 0 waits the whole timeout), quiet (default false: true skips the
         warning). On a terminal it shows progress; when not clean it warns once with what
         diagnose() says is left.",
        move |sel: Dynamic, opts: Map| wait(&s, sel, opts),
    );

    let s = session.clone();
    def(
        engine,
        "reset_gpu",
        &["index: i64", "()"],
        "Resets one GPU, the last resort for memory nobody holds (verdict \"driver\"): runs
         `nvidia-smi -r -i N` on real GPUs (needs root and an idle GPU), `sim reset` in the
         simulator. Fails, with the driver's reason, while processes still use the GPU.
         It acts on this machine's GPUs only: with --host it is an error (a diagnosis of
         another host's GPU N is not this machine's GPU N); reset there, on the host itself.",
        move |index: i64| -> RhaiResult<()> { Fleet::of(&s).reset_gpu(index).map_err(to_script) },
    );
}
