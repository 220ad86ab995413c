//! gpu(), holders(), diagnose(), wait_clean().

use crate::hosts::HostSel;
use crate::inspect::wait::{WaitOpts, WaitOutcome};
use crate::inspect::{Filter, User};
use crate::machine::reset::Reset;
use crate::machine::Fleet;
use crate::script::convert::{
    script_err, selectors, to_array, to_map, to_script, Opts, RhaiResult,
};
use crate::script::engine::def;
use crate::script::recipes::needs::{Act, Powers};
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

pub(crate) fn register(engine: &mut Engine, session: &Arc<Session>, powers: Powers) {
    let s = session.clone();
    def(
        engine,
        "gpu",
        &["Array"],
        "Every GPU, as maps: index, uuid, name, minor (the N of /dev/nvidiaN), bus_id,
         mem_total, mem_used, mem_free (bytes), mem_used_mib, mem_total_mib, util (% or ()),
         temp_c (or ()), procs (processes the driver reports), host, and faults: what the GPU
         reports about its own faults, each () where it does not (not applicable, never an
         error): ecc (#{corrected, uncorrected}: volatile counts), remapped_rows
         (#{correctable, uncorrectable, pending, failure}), retired_pages (#{single_bit,
         double_bit, pending}; () on GPUs that remap rows), recovery_action (what the driver
         asks for: \"none\", \"gpu-reset\", \"node-reboot\", \"drain-p2p\",
         \"drain-and-reset\", \"recover-imex-domain\"), xid (its Xid events, as xids()
         gives them, without gpu and host) and log_error (why the kernel log could not be
         read, or ()); mig: #{current, pending} (its MIG mode, \"enabled\" or \"disabled\",
         now and at its next reset) and instances (its MIG devices, each a GPU of its own:
         #{gpu, gi, ci, profile, uuid, mem_total, mem_used, mem_used_mib, mem_total_mib,
         caps: #{gi, ci}, the minors of the capability nodes that grant it}), or () on a GPU
         without MIG. A GPU the driver fails to read (an error, or no answer within
         GPULOOP_DRIVER_TIMEOUT) makes this an error that names it; gpu(i) still reads the
         others, and diagnose() reports it as \"driver-error\" (or \"fell-off-bus\").",
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
        let o = Opts::new(&opts, "diagnose", &["pod", "container", "on_error"])?;
        let sel = selection(s, &sel)?;
        let fleet = Fleet::of(s).skipping(o.on_error()?);
        let filter = Filter {
            pod: o.scope("pod")?,
            container: o.scope("container")?,
            ..Filter::default()
        };
        to_array(&fleet.diagnoses(&sel, &filter).map_err(to_script)?)
    };
    let s = session.clone();
    def(
        engine,
        "diagnose",
        &["sel: i64 | String | Array | ()", "opts: Map", "Array"],
        "diagnose() with options: on_error: \"skip\" goes on without hosts that cannot be
         reached (reported once); pod or container (as holders() takes them): only the GPUs
         that pod's or container's processes use, each with all its holders.",
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
         pid, ppid, pgid, sid, start, uid, user, name, cmdline, state, role, gpus, mig (the
         MIG devices it holds, #{gpu, gi, ci}: those the driver lists it on and those whose
         capability node it has open; [] off MIG), mem (bytes
         the driver counts against it), inherited (#{from, mem, mem_mib}: what it keeps alive
         of dead creators' memory, which the driver counts against their pids `from`, as a
         forked child of a crashed worker does; or ()), evidence (\"driver\", \"fd\", \"map\"), protected, host; lineage: ppid_comm (the
         parent's name), reparented (the parent is init or a subreaper, or started after it: its
         own parent is gone), launcher (#{pid, start, name, host} of the nearest live ancestor
         that is not a shell, init or subreaper, or ()), service (the systemd unit from its
         cgroup, or ()); attribution: job (Slurm job id from its environment or cgroup, or ()), container
         (the container's id, from its cgroup, or ()), container_name, runtime (\"docker\",
         \"containerd\", \"cri-o\", \"podman\"), container_deleted (its runtime no longer
         knows it), pod (#{namespace, name, uid, container, deleted} when Kubernetes started
         it, read from the node: the runtime's state and the kubelet's directories; deleted:
         the kubelet no longer knows the pod), cgroup (its cgroup path, or ()).",
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
         \"0-3\", a UUID or a unique prefix of one, a PCI bus id, a MIG device as \"0:7:0\",
         \"0:7\" or \"MIG-<uuid>\"), or an array of those. A MIG device narrows its GPU to the
         holders of that device.",
        move |sel: Dynamic| -> RhaiResult<Array> {
            to_array(
                &Fleet::of(&s)
                    .holders(&selection(&s, &sel)?, false, &Filter::default())
                    .map_err(to_script)?,
            )
        },
    );
    let holders = |s: &Session, sel: Dynamic, opts: Map| -> RhaiResult<Array> {
        let o = Opts::new(
            &opts,
            "holders",
            &["all", "user", "job", "pod", "container", "on_error"],
        )?;
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
            pod: o.scope("pod")?,
            container: o.scope("container")?,
            mig: None,
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
         env(\"SLURM_JOB_ID\")}); #{pod: \"ml/trainer-0\"} only that Kubernetes pod's
         (NAMESPACE/NAME, NAME, or a uid or 8 characters of it); #{container: \"vllm\"}
         only that container's (its name, or its id or 12 characters of it), each read on
         each host from its own node, each fitting one pod or container there (else an error
         lists each by uid or id, or what there is).",
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
         advice (one line to act on; it never advises a reset while a driver client is open),
         faults (as gpu() has them), blockers (where the advice is a reset: what would block
         it, as reset_blockers()) and mig (a GPU in MIG mode is diagnosed per MIG device, each
         a GPU of its own: the device, as gpu()'s mig.instances give it, with gpu its parent's
         index and the memory, holders and verdict its own; () for a whole GPU).
         Verdicts: \"clean\"; \"held\" (compute holders); \"stuck\" (a holder asleep in the
         driver, D state: SIGKILL takes effect only when the driver call returns, or after a
         reset); \"respawning\" (a parent of a holder this session stopped started it again); \"orphaned\" (the job's launcher is gone: its
         group or session leader exited, or it was reparented to init or a subreaper);
         \"inherited\" (the creator died, a forked child holds its handles); \"service\" (a
         systemd unit's main process holds it: systemctl stop UNIT); \"daemon\" (a protected GPU
         daemon holds it: stop its service, or kill with force); \"footprint\" (only the CUDA
         footprint of processes of other GPUs); \"other-namespace\" (held from another PID
         namespace); \"permission\" (processes gpuloop may not inspect); \"driver\" (used,
         nobody holds it: only a reset frees it); \"reset-needed\" (nobody holds it and the
         GPU's faults ask for a reset: the driver's recovery action, or an Xid NVIDIA's catalog
         resolves with one, such as 48, 95, 119); \"reboot-needed\" (the driver's recovery
         action, or an Xid such as 79, asks for a node reboot); \"remap-pending\" (a row
         remap waits for a reset); \"fell-off-bus\" (the GPU is lost: Xid 79 or NVML's \"GPU
         is lost\"; reboot); the last four are never clean, whatever the memory reads;
         \"driver-error\" (the driver failed to read
         this GPU, or did not answer in time: its memory is unknown, never clean; the advice
         quotes the error); \"no-driver\" (the driver did not load:
         nothing is verified; gpu is () when no GPU was selected); \"unknown\" (a verdict
         from a newer gpuloop on another host, which this one does not know: never clean).",
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
                "pod",
                "container",
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
        let filter = Filter {
            pod: o.scope("pod")?,
            container: o.scope("container")?,
            ..Filter::default()
        };
        let fleet = Fleet::of(s).skipping(o.on_error()?);
        let outcome = fleet.wait(&sel, &filter, &w, quiet);
        match outcome.map_err(to_script)? {
            // Memory back is not enough where a GPU's own faults ask for a reset or a reboot:
            // the judgement `gpuloop wait` and `clean` make, from one diagnosis.
            WaitOutcome::Clean => {
                let ds = fleet
                    .diagnoses(&sel, &Filter::default())
                    .map_err(to_script)?;
                let unfit: Vec<_> = ds.iter().filter(|d| d.verdict.needs_action()).collect();
                if !unfit.is_empty() && !quiet {
                    crate::errln!("warning: GPUs not clean: their faults ask for action:");
                    for d in &unfit {
                        crate::errln!("  {}", crate::machine::wait::describe_diagnosis(d));
                    }
                }
                Ok(unfit.is_empty())
            }
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
         it does not use (see strict). False, whatever the memory reads, where a GPU's own
         faults ask for a reset or a reboot (diagnose()'s reset-needed, reboot-needed,
         remap-pending, fell-off-bus). The same judgement as diagnose(), clean, the Slurm
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
         warning), pod or container (as holders() takes them): waits for that pod's or
         container's processes, as they are when it begins, to leave the GPUs they use and for
         the memory they held to come back; what else uses those GPUs (another pod) does not
         make them dirty. On a terminal it shows progress; when not clean it warns once with what
         diagnose() says is left.",
        move |sel: Dynamic, opts: Map| wait(&s, sel, opts),
    );

    let reset = move |s: &Session, sel: Dynamic, opts: Map| -> RhaiResult<Array> {
        let o = Opts::new(
            &opts,
            "reset_gpu",
            &["force", "dry_run", "grace", "timeout"],
        )?;
        let grace = o.grace("grace", Duration::from_secs(5))?;
        let timeout = o
            .secs("timeout", Some(Duration::from_secs(30)))?
            .unwrap_or(Duration::from_secs(30));
        let (force, dry_run) = (o.bool("force", false)?, o.bool("dry_run", false)?);
        // A reset stops what is in its way and resets the GPU: as much as clean.
        if !dry_run {
            powers
                .check(Act::Signal, "reset_gpu()")
                .map_err(script_err)?;
        }
        let sel = selection(s, &sel)?;
        let reports = Fleet::of(s)
            .reset(&sel, |gpus| Reset {
                gpus,
                dry_run,
                force,
                grace,
                timeout,
                mig: sel.mig.clone(),
            })
            .map_err(to_script)?;
        // A reset that did not happen, or did not bring the GPU back, is the script's error,
        // with each step said.
        if let Some(r) = reports.iter().find(|r| !r.ok && !r.dry_run) {
            let steps: Vec<String> = r
                .steps
                .iter()
                .filter(|st| !st.ok)
                .map(|st| format!("{} {}: {}", st.action, st.target, st.detail))
                .collect();
            return Err(to_script(crate::gpu::GpuError::Reset {
                index: r.gpu,
                why: steps.join("; "),
            }));
        }
        to_array(&reports)
    };
    let s = session.clone();
    def(
        engine,
        "reset_gpu",
        &["gpu: i64 | String", "Map"],
        "Resets one GPU, the last resort for memory nobody holds (verdicts \"driver\",
         \"reset-needed\", \"remap-pending\"), as `gpuloop reset --gpu N` does: stops every
         client in its way that it may (compute holders and observers by signal; protected
         daemons and systemd system units' main processes only with force, a unit through
         systemctl), resets (`nvidia-smi -r -i N` on real GPUs, the simulator's reset under
         --sim), verifies that the GPU answers with its UUID and 0 MiB used, and starts again
         through systemctl the system units it stopped (a daemon outside any is not started
         again: its restart step fails and says what it ran). Stops
         nothing where no reset can work (the GPU fell off the bus, or the driver asks for a
         reboot: the report's cannot says why). Returns the report map: gpu, uuid, cannot,
         blockers (as reset_blockers()), steps (#{action, target, ok, detail}: action
         \"refuse\", \"stop\", \"reset\", \"verify\" or \"restart\"), reset, verified, ok,
         host. Throws, naming the steps that failed, when the GPU was not reset and verified
         or a daemon it stopped is not running again. With a host set name the GPU with its
         host (\"gpu02:3\"): an index alone does not say whose GPU it is.",
        move |sel: Dynamic| -> RhaiResult<Dynamic> {
            let mut rs = reset(&s, sel, Map::new())?;
            Ok(rs.pop().unwrap_or(Dynamic::UNIT))
        },
    );
    let s = session.clone();
    def(
        engine,
        "reset_gpu",
        &["gpu: i64 | String", "opts: Map", "Map"],
        "reset_gpu() with options: force (default false: also stop protected daemons and system
         units' main processes), grace (seconds between TERM and KILL for what it stops, default 5, or
         \"inf\"), timeout (seconds the GPU may take to come back, default 30), dry_run
         (default false: true stops and resets nothing and never throws; the report's
         blockers say what is in the way, ok is true when nothing is).",
        move |sel: Dynamic, opts: Map| -> RhaiResult<Dynamic> {
            let mut rs = reset(&s, sel, opts)?;
            Ok(rs.pop().unwrap_or(Dynamic::UNIT))
        },
    );
    let s = session.clone();
    def(
        engine,
        "reset_blockers",
        &["gpu: i64 | String", "Array"],
        "Every client that would make a reset of the GPU (or a MIG change) fail, as `gpuloop
         reset --gpu N --dry-run` lists them: maps of kind (\"compute\", \"observer\",
         \"persistenced\", \"dcgm\", \"fabric-manager\", \"mps\", \"display\", \"daemon\",
         \"caps\", \"module\"), pid, start and pidfs_ino (the identity a holder has; () for
         the nvidia_drm module), name, cmdline, user, protected (a GPU daemon whose name is
         proven by who runs it and what it runs, never by the name alone: stopped only with
         force), service (the systemd unit it is the main process of, or ()), user_unit (that
         unit is a user manager's: its user's client, signalled without force), caps (it has /dev/nvidia-caps/* open),
         stop (\"signal\", \"unit\", \"mps-quit\", \"unload\"), how (the command that
         stops it), host. Empty when nothing is in the way.",
        move |sel: Dynamic| -> RhaiResult<Array> {
            let sel = selection(&s, &sel)?;
            let reports = Fleet::of(&s)
                .reset(&sel, |gpus| Reset {
                    gpus,
                    dry_run: true,
                    force: false,
                    grace: Duration::ZERO,
                    timeout: Duration::ZERO,
                    mig: sel.mig.clone(),
                })
                .map_err(to_script)?;
            let all: Vec<_> = reports.into_iter().flat_map(|r| r.blockers).collect();
            to_array(&all)
        },
    );

    let xids = |s: &Session, sel: Dynamic, since: Option<&Dynamic>| -> RhaiResult<Array> {
        let since = match since {
            None => f64::NEG_INFINITY,
            Some(v) => v
                .as_float()
                .or_else(|_| v.as_int().map(|i| i as f64))
                .map_err(|_| {
                    script_err(format!(
                        "xids: since must be a time in seconds since the epoch (as now() gives), not a {}",
                        v.type_name()
                    ))
                })?,
        };
        let sel = selection(s, &sel)?;
        let gpus = Fleet::of(s).gpus().map_err(to_script)?;
        let events: Vec<GpuXid> = gpus
            .iter()
            .filter(|g| match sel.on(&g.host) {
                None => false,
                Some(one) => crate::inspect::selected(&one, g.index),
            })
            .flat_map(|g| {
                g.faults
                    .iter()
                    .flat_map(|f| &f.xid)
                    .filter(|x| x.time >= since)
                    .map(|x| GpuXid {
                        gpu: g.index,
                        host: g.host.clone(),
                        xid: x.clone(),
                    })
            })
            .collect();
        to_array(&events)
    };
    let s = session.clone();
    def(
        engine,
        "xids",
        &["Array"],
        "Every Xid event the kernel log holds for the GPUs (the latest 32 of each GPU, and the
         NVSwitches' SXids, listed on every GPU), oldest first: maps of gpu, host, kind
         (\"xid\" or \"sxid\"), code, time (seconds since the epoch, as now()), pid and name
         (the process the driver names, or (): the pid the kernel writes, the name that
         process gave itself), text (the driver's message), bus_id, meaning, action and cause
         (what NVIDIA's Xid catalog says it is, to do first: \"none\", \"restart-app\",
         \"reset-gpu\", \"reboot-node\", and where it comes from: \"application\" for the
         application's own fault, which leaves the GPU usable, \"hardware\", \"driver\"; ()
         for a code gpuloop's table lacks).
         The log is read as dmesg reads it (/dev/kmsg, or config.toml's kernel_log): where it
         may not be read, gpu().faults.log_error says why.",
        move || xids(&s, Dynamic::UNIT, None),
    );
    let s = session.clone();
    def(
        engine,
        "xids",
        &["since: f64 | i64", "Array"],
        "The Xid events logged at or after `since` (seconds since the epoch, as now() gives):
         after `let t = now(); run(cmd);`, xids(t) says how the run ended on the GPUs (each
         event's gpu, code, meaning, pid: \"the run ended with Xid 31 on GPU 2: a memory fault
         in your kernel\").",
        move |since: Dynamic| xids(&s, Dynamic::UNIT, Some(&since)),
    );
    let s = session.clone();
    def(
        engine,
        "xids",
        &[
            "sel: i64 | String | Array | ()",
            "since: f64 | i64",
            "Array",
        ],
        "xids(since) for the selected GPUs only.",
        move |sel: Dynamic, since: Dynamic| xids(&s, sel, Some(&since)),
    );
}

/// An Xid event as xids() hands it to scripts: the GPU's index and host beside it.
#[derive(serde::Serialize)]
struct GpuXid {
    gpu: i64,
    host: String,
    #[serde(flatten)]
    xid: crate::gpu::faults::Xid,
}
