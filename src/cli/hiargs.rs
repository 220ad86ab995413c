//! The command line made ready to run: clap's raw flags (`args::Args`) checked and turned into
//! one `Command` with the options the operations take, before anything runs.
//!
//! Whatever the arguments alone decide is decided here, and a mistake is a usage error
//! (exit 2): selections parsed, flags that exclude each other, durations, signals, filters, a
//! recipe's name. What needs this machine or the host set (a user's name looked up, `--gpu
//! host:N` checked against the hosts, the driver loaded) is left to the command itself.

use super::args::{Cmd, GpuSel, HookFlags, KillFlags, Owner, RecipesCmd, SimCmd, WaitFlags};
use super::commands::script::Script;
use super::Config;
use crate::error::Error;
use crate::gpu::faults::RecoveryAction;
use crate::gpu::sim::hold::HoldOpts;
use crate::hosts::HostSel;
use crate::inspect::select::{self, Selector};
use crate::inspect::wait::WaitOpts;
use crate::inspect::{Filter, User};
use crate::mcp::policy::Policy;
use crate::process::kill::{self, parse_signal, KillOpts};
use crate::session::Session;
use crate::slurm::{Hook, HookOpts};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Everything a command needs: the settings every command shares, and this one's own.
pub(crate) struct HiArgs {
    pub(crate) config: Config,
    pub(crate) command: Command,
}

impl HiArgs {
    /// The global settings first (their mistakes are said first), then the command's.
    pub(crate) fn from_low(args: &super::args::Args) -> Result<HiArgs, Error> {
        let config = Config::from_args(args)?;
        let command = Command::new(&args.cmd, &config.session.config)?;
        Ok(HiArgs { config, command })
    }
}

/// One command, checked: each variant holds what its function in `commands` takes.
pub(crate) enum Command {
    Run {
        script: Script,
        /// The script's ARGS, the `--` after SCRIPT (if any) dropped.
        args: Vec<String>,
    },
    Eval {
        code: String,
    },
    Check {
        scripts: Vec<PathBuf>,
    },
    Recipes(RecipesCommand),
    Repl,
    Doc {
        definitions: Option<PathBuf>,
    },
    Gpus {
        sel: Selection,
    },
    Top {
        sel: Selection,
        interval: Duration,
        once: bool,
    },
    Holders {
        sel: Selection,
        owner: Filter,
        all: bool,
    },
    Diagnose {
        sel: Selection,
        owner: Filter,
        check: bool,
    },
    Kill {
        targets: KillTargets,
        opts: KillOpts,
    },
    Clean {
        sel: Selection,
        owner: Filter,
        wait: WaitOpts,
        /// Boxed: the kill's and the wait's options together would make every command as
        /// large as this one.
        kill: Box<KillOpts>,
    },
    Wait {
        sel: Selection,
        owner: Filter,
        wait: WaitOpts,
    },
    Reset {
        sel: Selection,
        opts: ResetOpts,
    },
    /// `epilog` and `prolog`.
    Hook {
        which: Hook,
        opts: HookOpts,
    },
    Mcp {
        policy: Policy,
    },
    Journal {
        last: usize,
        filter: crate::journal::Filter,
    },
    Completions {
        shell: clap_complete::Shell,
    },
    Man {
        dir: Option<PathBuf>,
    },
    Agent,
    Sim(SimCommand),
}

/// `reset`'s flags, checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResetOpts {
    pub dry_run: bool,
    pub force: bool,
    pub grace: Duration,
    pub timeout: Duration,
}

/// `gpuloop recipes` and its subcommands.
pub(crate) enum RecipesCommand {
    List,
    Show(String),
    New(String),
}

/// What `gpuloop kill` stops: the selected GPUs' holders, or processes named by pid.
pub(crate) enum KillTargets {
    Holders { sel: Selection, owner: Filter },
    Pids(Vec<i32>),
}

/// The simulator's commands `dispatch` runs (the holder and the watcher run before it:
/// `commands::sim::internal`).
pub(crate) enum SimCommand {
    Hold(HoldOpts),
    Release,
    Leak {
        /// `--gpu` as given (an index or a MIG instance), read against the simulator.
        gpu: String,
        mib: i64,
    },
    Fault {
        gpu: Option<i64>,
        inject: crate::gpu::sim::faults::Inject,
        drm_modeset: Option<bool>,
    },
    Reset {
        gpu: i64,
    },
    Ls,
    Stop,
}

impl Command {
    /// `config` is the user's config.toml, whose `[mcp] allow` joins `mcp --allow`.
    fn new(cmd: &Cmd, config: &crate::config::UserConfig) -> Result<Command, Error> {
        Ok(match cmd {
            Cmd::Run { argv } => {
                let Some((script, args)) = argv.split_first() else {
                    return Err(Error::Usage("run: give a SCRIPT".into()));
                };
                // `run SCRIPT -- ARGS…`, the older spelling, still works: that `--` is no
                // argument.
                let args = match args.split_first() {
                    Some((first, rest)) if first == "--" => rest,
                    _ => {
                        refuse_global_options(script, args)?;
                        args
                    }
                };
                Command::Run {
                    script: Script::named(script)?,
                    args: args.to_vec(),
                }
            }
            Cmd::Eval { code } => Command::Eval { code: code.clone() },
            Cmd::Check { scripts } => Command::Check {
                scripts: scripts.clone(),
            },
            Cmd::Recipes { cmd } => Command::Recipes(match cmd {
                None => RecipesCommand::List,
                Some(RecipesCmd::Show { name }) => RecipesCommand::Show(name.clone()),
                Some(RecipesCmd::New { name }) => {
                    if !crate::script::recipes::valid_name(name) {
                        return Err(Error::Usage(
                            crate::script::recipes::FindError::BadName { name: name.clone() }
                                .to_string(),
                        ));
                    }
                    RecipesCommand::New(name.clone())
                }
            }),
            Cmd::Repl => Command::Repl,
            Cmd::Doc { definitions } => Command::Doc {
                definitions: definitions.clone(),
            },
            Cmd::Gpus { sel } => Command::Gpus {
                sel: Selection::parse(sel)?,
            },
            Cmd::Top {
                sel,
                interval,
                once,
            } => {
                let interval = seconds(*interval, "--interval")?;
                if interval < Duration::from_millis(100) {
                    return Err(Error::Usage(
                        "--interval: at least 0.1 seconds between redraws".into(),
                    ));
                }
                Command::Top {
                    sel: Selection::parse(sel)?,
                    interval,
                    once: *once,
                }
            }
            Cmd::Holders { sel, owner, all } => Command::Holders {
                sel: Selection::parse(sel)?,
                owner: owner.into(),
                all: *all,
            },
            Cmd::Diagnose { sel, check, owner } => Command::Diagnose {
                sel: Selection::parse(sel)?,
                owner: owner.into(),
                check: *check,
            },
            Cmd::Kill {
                pids,
                sel,
                owner,
                kill,
            } => {
                let opts = KillOpts::try_from(kill)?;
                let targets = if pids.is_empty() {
                    KillTargets::Holders {
                        sel: Selection::parse(sel)?,
                        owner: owner.into(),
                    }
                } else if !sel.gpus.is_empty() || !Filter::from(owner).is_empty() {
                    return Err(Error::Usage(
                        "kill: give PIDs or --gpu/--user/--mine/--job/--pod/--container, not both"
                            .into(),
                    ));
                } else {
                    KillTargets::Pids(pids.iter().map(|&p| pid(p)).collect::<Result<_, _>>()?)
                };
                Command::Kill { targets, opts }
            }
            Cmd::Clean {
                sel,
                owner,
                timeout,
                wait,
                kill,
            } => Command::Clean {
                wait: wait_opts(*timeout, wait)?,
                sel: Selection::parse(sel)?,
                owner: owner.into(),
                kill: Box::new(KillOpts::try_from(kill)?),
            },
            Cmd::Wait {
                sel,
                owner,
                timeout,
                wait,
            } => Command::Wait {
                sel: Selection::parse(sel)?,
                owner: owner.into(),
                wait: wait_opts(*timeout, wait)?,
            },
            Cmd::Reset {
                sel,
                dry_run,
                force,
                grace: g,
                timeout,
            } => {
                if sel.gpus.is_empty() {
                    return Err(Error::Usage(
                        "reset: name the GPUs to reset with --gpu (e.g. --gpu 0; with --host, --gpu HOST:N)".into(),
                    ));
                }
                Command::Reset {
                    sel: Selection::parse(sel)?,
                    opts: ResetOpts {
                        dry_run: *dry_run,
                        force: *force,
                        grace: grace(*g)?,
                        timeout: seconds(*timeout, "--timeout")?,
                    },
                }
            }
            Cmd::Epilog { hook } => Command::Hook {
                which: Hook::Epilog,
                opts: hook.try_into()?,
            },
            Cmd::Prolog { hook } => Command::Hook {
                which: Hook::Prolog,
                opts: hook.try_into()?,
            },
            Cmd::Mcp {
                allow,
                user_recipes,
            } => Command::Mcp {
                policy: Policy::from_lists(allow.iter().chain(&config.mcp_allow))
                    .map_err(|e| Error::Usage(e.to_string()))?
                    .with_user_recipes(*user_recipes),
            },
            Cmd::Journal {
                last,
                since,
                pid,
                user,
                front_end,
            } => Command::Journal {
                last: *last,
                filter: crate::journal::Filter {
                    since: since
                        .as_deref()
                        .map(crate::journal::parse_since)
                        .transpose()
                        .map_err(Error::Usage)?,
                    pid: *pid,
                    user: user.clone(),
                    front_end: front_end
                        .as_deref()
                        .map(str::parse)
                        .transpose()
                        .map_err(Error::Usage)?,
                },
            },
            Cmd::Completions { shell } => Command::Completions { shell: *shell },
            Cmd::Man { dir } => Command::Man { dir: dir.clone() },
            Cmd::Agent => Command::Agent,
            Cmd::Sim(cmd) => Command::Sim(SimCommand::new(cmd)?),
            // Run by `cli::main` before a config is built.
            Cmd::Guard => return Err(Error::Other("the guard is internal".into())),
        })
    }
}

impl SimCommand {
    pub(crate) fn new(cmd: &SimCmd) -> Result<SimCommand, Error> {
        Ok(match cmd {
            SimCmd::Hold { mib, workers, .. } => {
                if *mib < 0 {
                    return Err(Error::Usage(format!(
                        "--mib must be non-negative, got {mib}"
                    )));
                }
                if !(0..=4096).contains(workers) {
                    return Err(Error::Usage(format!(
                        "--workers must be between 0 and 4096, got {workers}"
                    )));
                }
                SimCommand::Hold(hold_opts(cmd))
            }
            SimCmd::Release => SimCommand::Release,
            SimCmd::Leak { gpu, mib } => {
                if *mib <= 0 {
                    return Err(Error::Usage("--mib must be positive".into()));
                }
                SimCommand::Leak {
                    gpu: gpu.clone(),
                    mib: *mib,
                }
            }
            SimCmd::Fault {
                gpu,
                xid,
                pid,
                name,
                text,
                ecc_corrected,
                ecc_uncorrected,
                remap_pending,
                remap_failure,
                recovery,
                off_bus,
                clear,
                drm_modeset,
                persistence,
            } => {
                let on_off = |flag: &str, v: &Option<String>| match v.as_deref() {
                    None => Ok(None),
                    Some("on") => Ok(Some(true)),
                    Some("off") => Ok(Some(false)),
                    Some(other) => Err(Error::Usage(format!("{flag} {other:?}: use on or off"))),
                };
                let drm_modeset = on_off("--drm-modeset", drm_modeset)?;
                let persistence = on_off("--persistence", persistence)?;
                let recovery = match recovery.as_deref() {
                    None => None,
                    Some(a) => Some(RecoveryAction::parse(a).ok_or_else(|| {
                        Error::Usage(format!(
                            "--recovery {a:?}: one of {}",
                            RecoveryAction::NAMES.join(", ")
                        ))
                    })?),
                };
                if *ecc_corrected < 0 || *ecc_uncorrected < 0 {
                    return Err(Error::Usage(
                        "--ecc-corrected and --ecc-uncorrected take a count of errors to add (0 or more)".into(),
                    ));
                }
                if xid.is_some_and(|x| x < 0) || pid.is_some_and(|p| p <= 0) {
                    return Err(Error::Usage(
                        "--xid takes a code and --pid a process id, both positive".into(),
                    ));
                }
                let inject = crate::gpu::sim::faults::Inject {
                    xid: *xid,
                    pid: *pid,
                    name: name.clone(),
                    text: text.clone(),
                    ecc_corrected: *ecc_corrected,
                    ecc_uncorrected: *ecc_uncorrected,
                    remap_pending: *remap_pending,
                    remap_failure: *remap_failure,
                    recovery,
                    off_bus: *off_bus,
                    clear: *clear,
                    persistence,
                };
                let some_fault = xid.is_some()
                    || *ecc_corrected > 0
                    || *ecc_uncorrected > 0
                    || *remap_pending
                    || *remap_failure
                    || recovery.is_some()
                    || *off_bus
                    || *clear
                    || persistence.is_some();
                match (gpu, some_fault, drm_modeset) {
                    (None, true, _) => {
                        return Err(Error::Usage(
                            "sim fault: name the GPU with --gpu".into(),
                        ))
                    }
                    (_, false, None) => {
                        return Err(Error::Usage(
                            "sim fault: say what fault (--xid, --ecc-corrected, --ecc-uncorrected, --remap-pending, --remap-failure, --recovery, --off-bus, --clear, --persistence, --drm-modeset)".into(),
                        ))
                    }
                    _ => {}
                }
                SimCommand::Fault {
                    gpu: *gpu,
                    inject,
                    drm_modeset,
                }
            }
            SimCmd::Reset { gpu } => SimCommand::Reset { gpu: *gpu },
            SimCmd::Ls => SimCommand::Ls,
            SimCmd::Stop => SimCommand::Stop,
            SimCmd::Watch { .. } => return Err(Error::Usage("sim watch is internal".into())),
        })
    }
}

/// `sim hold`'s flags as the holder takes them (the default for any other `sim` command).
pub(crate) fn hold_opts(cmd: &SimCmd) -> HoldOpts {
    match cmd {
        SimCmd::Hold {
            gpu,
            mib,
            name,
            observer,
            ignore_term,
            fork_child,
            workers,
            setsid,
            exit_creator,
            map_all,
            shared_group,
            foreground,
            supervise,
            catch_term,
            fork_on_term,
            unlisted_ms,
            stuck,
            defunct_leader,
            caps,
            ..
        } => HoldOpts {
            target: gpu.clone(),
            gpu: 0,
            mig: None,
            mib: *mib,
            name: name.clone(),
            observer: *observer,
            ignore_term: *ignore_term,
            fork_child: *fork_child,
            workers: u32::try_from(*workers).unwrap_or(0),
            setsid: *setsid,
            exit_creator: *exit_creator,
            map_all: *map_all,
            shared_group: *shared_group,
            foreground: *foreground,
            supervise: *supervise,
            catch_term: *catch_term,
            fork_on_term: *fork_on_term,
            unlisted_ms: *unlisted_ms,
            stuck: *stuck,
            defunct_leader: *defunct_leader,
            caps: *caps,
        },
        _ => HoldOpts::default(),
    }
}

/// `--gpu` values, parsed: GPUs of every host (indices, ranges, UUIDs, bus ids) and GPUs of
/// one host (`dest:index`). Which hosts there are is the session's: `on` checks against them.
pub(crate) struct Selection {
    every: Vec<Selector>,
    at: BTreeMap<String, Vec<i64>>,
}

impl Selection {
    /// Each `--gpu` value is a comma list of indices, ranges, UUIDs, bus ids, or `dest:index`.
    pub(crate) fn parse(sel: &GpuSel) -> Result<Selection, Error> {
        let mut every = Vec::new();
        let mut at: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for text in &sel.gpus {
            // Item by item: `0:7:0,1` is a MIG device and a GPU, `gpu01:3,gpu02:1` two hosts'.
            for part in text.split(',') {
                match HostSel::parse_host_index(part) {
                    Some((host, i)) => at.entry(host).or_default().push(i),
                    None => every.extend(select::parse(part)?),
                }
            }
        }
        Ok(Selection { every, at })
    }

    /// The selection over the session's host set (every GPU of every host when no `--gpu`).
    pub(crate) fn on(&self, s: &Session) -> Result<HostSel, Error> {
        if self.every.is_empty() && self.at.is_empty() {
            return Ok(HostSel::all());
        }
        let every = (!self.every.is_empty()).then_some(self.every.as_slice());
        Ok(crate::machine::Fleet::of(s).select_hosts(every, self.at.clone())?)
    }
}

/// `--user U` or `--mine`, `--job N`, `--pod`, `--container`, as a holder filter. Each stays as
/// given (a name stays a name): the user is looked up, the pod and container found, where the
/// processes are (`commands::check_owner`).
impl From<&Owner> for Filter {
    fn from(owner: &Owner) -> Filter {
        let user = match (&owner.user, owner.mine) {
            (_, true) => Some(User::Me),
            (Some(u), false) => Some(User::parse(u)),
            (None, false) => None,
        };
        Filter {
            user,
            job: owner.job,
            pod: owner.pod.clone(),
            container: owner.container.clone(),
            mig: None,
        }
    }
}

/// The kill flags of `kill` and `clean`: the signal by name, the grace in seconds; a kill
/// from the command line takes the targets' trees.
impl TryFrom<&KillFlags> for KillOpts {
    type Error = Error;

    fn try_from(k: &KillFlags) -> Result<KillOpts, Error> {
        Ok(KillOpts {
            signal: parse_signal(&k.signal).map_err(|e| Error::Usage(e.to_string()))?,
            grace: grace(k.grace)?,
            tree: true,
            dry_run: k.dry_run,
            force: k.force,
            parents: k.parents,
            ..KillOpts::default()
        })
    }
}

/// `epilog`'s and `prolog`'s `--timeout`, `--grace` and `--dry-run`.
impl TryFrom<&HookFlags> for HookOpts {
    type Error = Error;

    fn try_from(h: &HookFlags) -> Result<HookOpts, Error> {
        Ok(HookOpts {
            timeout: seconds(h.timeout, "--timeout")?,
            grace: grace(h.grace)?,
            dry_run: h.dry_run,
        })
    }
}

/// `clean`'s and `wait`'s `--timeout`, `--settle`, `--stall` and `--strict`.
fn wait_opts(timeout: f64, w: &WaitFlags) -> Result<WaitOpts, Error> {
    Ok(WaitOpts {
        timeout: seconds(timeout, "--timeout")?,
        settle: seconds(w.settle, "--settle")?,
        stall: seconds(w.stall, "--stall")?,
        strict: w.strict,
        ..WaitOpts::default()
    })
}

/// A PID named to `kill`: a positive number that fits a pid.
fn pid(p: i64) -> Result<i32, Error> {
    i32::try_from(p)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| Error::Usage(format!("kill: {p} is not a process id")))
}

fn seconds(v: f64, what: &str) -> Result<Duration, Error> {
    crate::inspect::wait::seconds(v).map_err(|why| Error::Usage(format!("{what} {why}")))
}

/// `--grace SECS`, or `--grace inf` for never sending KILL.
fn grace(v: f64) -> Result<Duration, Error> {
    kill::grace_seconds(v).map_err(|why| Error::Usage(format!("--grace {why}")))
}

/// `run SCRIPT ARGS…`: a gpuloop global option among ARGS before a `--` is a usage error.
/// `gpuloop run fix.rhai --sim 4x80G` ran the script on the real driver, with the simulator's
/// spec in its ARGS: a rehearsal that went live. The options are clap's global ones, so this
/// stays true as options are added; a recipe's own flags (`--gpu`, `--timeout`) are none.
fn refuse_global_options(script: &str, args: &[String]) -> Result<(), Error> {
    use clap::CommandFactory;
    let command = super::args::Args::command();
    let globals: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|a| a.is_global_set())
        .collect();
    let is_global = |word: &str| {
        globals.iter().any(|a| {
            let longs = a.get_long_and_visible_aliases().unwrap_or_default();
            let long = word.strip_prefix("--").is_some_and(|w| {
                let name = w.split_once('=').map_or(w, |(n, _)| n);
                longs.contains(&name)
            });
            let short = a.get_short().is_some_and(|c| {
                word.strip_prefix('-').is_some_and(|w| {
                    !w.is_empty() && !w.starts_with('-') && w.chars().all(|x| x == c)
                })
            });
            long || short
        })
    };
    let before_dash = args.iter().take_while(|a| *a != "--");
    match before_dash.map(String::as_str).find(|w| is_global(w)) {
        None => Ok(()),
        Some(word) => {
            let flag = word.split_once('=').map_or(word, |(f, _)| f);
            Err(Error::Usage(format!(
                "run {script}: {flag} is gpuloop's own option, not the script's: put it before SCRIPT (gpuloop {word} … run {script}), or after -- to hand it to the script (gpuloop run {script} -- {word} …)"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::Args;
    use clap::Parser;

    fn command(line: &str) -> Result<Command, Error> {
        let args = Args::try_parse_from(line.split_whitespace()).expect("clap parses it");
        Command::new(&args.cmd, &Default::default())
    }

    fn usage(line: &str) -> String {
        match command(line) {
            Err(Error::Usage(m)) => m,
            Err(e) => panic!("{line}: not a usage error: {e}"),
            Ok(_) => panic!("{line}: accepted"),
        }
    }

    #[test]
    fn argument_mistakes_are_usage_errors_before_anything_runs() {
        assert_eq!(
            usage("gpuloop kill 12 --gpu 0"),
            "kill: give PIDs or --gpu/--user/--mine/--job/--pod/--container, not both"
        );
        assert_eq!(
            usage("gpuloop kill 12 --pod ml/trainer-0"),
            "kill: give PIDs or --gpu/--user/--mine/--job/--pod/--container, not both"
        );
        assert_eq!(usage("gpuloop kill 0"), "kill: 0 is not a process id");
        assert_eq!(
            usage("gpuloop kill 4294967296"),
            "kill: 4294967296 is not a process id"
        );
        assert!(usage("gpuloop clean --signal BOGUS").starts_with("unknown signal \"BOGUS\""));
        assert!(usage("gpuloop kill --grace -1").starts_with("--grace "));
        assert!(usage("gpuloop wait --settle nan").starts_with("--settle "));
        assert!(usage("gpuloop epilog --timeout -1").starts_with("--timeout "));
        assert!(usage("gpuloop mcp --allow bogus").contains("unknown permission \"bogus\""));
        assert!(usage("gpuloop journal --since yesterday-ish").contains("yesterday-ish"));
        assert!(usage("gpuloop run no-such-recipe").starts_with("no recipe named"));
        assert_eq!(
            usage("gpuloop sim leak --gpu 0 --mib 0"),
            "--mib must be positive"
        );
        assert!(usage("gpuloop reset").starts_with("reset: name the GPUs to reset with --gpu"));
        assert!(usage("gpuloop reset --gpu 0 --grace -1").starts_with("--grace "));
        assert_eq!(
            usage("gpuloop sim fault --xid 31"),
            "sim fault: name the GPU with --gpu"
        );
        assert!(usage("gpuloop sim fault --gpu 0").starts_with("sim fault: say what fault"));
        assert!(usage("gpuloop sim fault --gpu 0 --recovery reboot").contains("node-reboot"));
        assert!(usage("gpuloop sim fault --drm-modeset maybe").contains("use on or off"));
        assert_eq!(
            usage("gpuloop sim hold --gpu 0 --workers 5000"),
            "--workers must be between 0 and 4096, got 5000"
        );
        // A bad --gpu is the selector's own usage error (exit 2), as the GPUs' checks say it.
        let e = command("gpuloop gpus --gpu 3-1").err().expect("refused");
        assert_eq!(e.exit(), crate::exit::Exit::Usage, "{e}");
    }

    #[test]
    fn the_kill_flags_become_the_kill_options() {
        let Ok(Command::Kill { opts, targets }) =
            command("gpuloop kill --signal INT --grace 0 --force --parents --dry-run 7 8")
        else {
            panic!("not a kill");
        };
        assert_eq!(opts.signal, nix::sys::signal::Signal::SIGINT);
        assert_eq!(opts.grace, Duration::ZERO);
        assert!(opts.tree && opts.force && opts.parents && opts.dry_run);
        assert!(matches!(targets, KillTargets::Pids(p) if p == [7, 8]));
    }

    #[test]
    fn run_drops_one_dash_dash_after_the_script() {
        let Ok(Command::Run { args, .. }) = command("gpuloop run ./x.rhai -- -- a") else {
            panic!("not a run");
        };
        assert_eq!(args, ["--", "a"]);
    }
}
