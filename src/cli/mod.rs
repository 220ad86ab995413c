//! The command line: parse (`args`), check into a `Config` and a `Command` (`hiargs`), run
//! the command (`commands`), map errors to exit codes.

pub mod args;
mod commands;
mod hiargs;

use crate::error::Error;
use crate::exit::Exit;
use crate::session::{BackendChoice, Session};
use args::{Args, Cmd, CmdKind, SimCmd};
use std::sync::Arc;

/// Validated settings every command needs.
pub(crate) struct Config {
    pub json: bool,
    pub session: Arc<Session>,
}

impl Config {
    fn from_args(args: &Args) -> Result<Config, Error> {
        // An empty GPULOOP_SIM means no simulator, like an unset one (`parse` refuses --sim "").
        let choice = match args.sim.as_ref().filter(|s| !s.trim().is_empty()) {
            Some(spec) => {
                // Reject a bad spec before anything runs.
                crate::gpu::sim::SimSpec::parse(spec)?;
                BackendChoice::Sim {
                    dir: crate::gpu::sim::state_dir(),
                    spec: Some(spec.clone()),
                }
            }
            // `gpuloop sim …` without --sim uses the spec the state directory has.
            None if matches!(args.cmd, Cmd::Sim(_)) => BackendChoice::Sim {
                dir: crate::gpu::sim::state_dir(),
                spec: None,
            },
            None => BackendChoice::Auto,
        };
        let mut config = crate::config::UserConfig::load()?;
        for item in &args.limits {
            config
                .limits
                .set(item)
                .map_err(|e| Error::Usage(e.to_string()))?;
        }
        crate::script::engine::check_stack(&config.limits).map_err(Error::Usage)?;
        let mut session = Session::new(choice, config, args.verbose);
        if let Some(mut hosts) = hosts_config(&args.hosts, one_shot(&args.cmd))? {
            // Progress goes to a person: a terminal, and not under --json.
            hosts.progress = one_shot(&args.cmd)
                && !args.json
                && std::io::IsTerminal::is_terminal(&std::io::stderr());
            session = session.with_hosts(hosts);
        }
        Ok(Config {
            json: args.json,
            session: Arc::new(session),
        })
    }
}

/// The arguments, with `--sim ""` refused: an empty `GPULOOP_SIM` means unset, but an empty
/// spec given on the command line is a mistake (`gpuloop --sim "$SPEC" clean` with `SPEC`
/// unset would otherwise clean the real GPUs).
fn parse(argv: &[std::ffi::OsString]) -> Result<Args, clap::Error> {
    use clap::error::ErrorKind;
    use clap::{parser::ValueSource, CommandFactory, FromArgMatches};
    let mut cmd = Args::command();
    let matches = match cmd.try_get_matches_from_mut(argv) {
        Ok(m) => m,
        // Help comes from the command as documented (each command's -h folds the global
        // options into one line); building that costs time a one-shot need not spend.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            return Err(args::command()
                .try_get_matches_from(argv)
                .err()
                .unwrap_or(e))
        }
        Err(e) => return Err(e),
    };
    let args = Args::from_arg_matches(&matches)?;
    let given = std::iter::successors(Some(&matches), |m| m.subcommand().map(|(_, m)| m))
        .any(|m| m.value_source("sim") == Some(ValueSource::CommandLine));
    if given && args.sim.as_deref().is_some_and(|s| s.trim().is_empty()) {
        return Err(cmd.error(
            clap::error::ErrorKind::InvalidValue,
            "--sim needs a spec like 8x80G: an empty one would mean the real GPUs (leave --sim out for them)",
        ));
    }
    Ok(args)
}

/// `--host`/`--hosts-file`/`--hosts-from-slurm` into a host set; `None` when none was given.
///
/// `one_shot`: connections may outlive the run, for the next one. Scripts, the REPL and the
/// MCP server hold theirs for their whole life; a kept connection's master process would be
/// theirs to reap (gpuloop is their jobs' subreaper) and taken for a job's orphan.
fn hosts_config(
    f: &args::HostFlags,
    one_shot: bool,
) -> Result<Option<crate::hosts::HostsConfig>, Error> {
    use crate::hosts::{HostError, Transport};
    let srun = f.transport == args::TransportArg::Srun;
    let src = f.sources();
    if src.is_empty() {
        for (given, flag) in [
            (f.remote_bin.is_some(), "--remote-bin"),
            (f.ssh_config.is_some(), "--ssh-config"),
            (f.skip_unreachable, "--skip-unreachable"),
            (srun, "--transport srun"),
            (f.jobid.is_some(), "--jobid"),
        ] {
            if given {
                return Err(Error::Usage(format!(
                    "{flag} needs --host, --hosts-file or --hosts-from-slurm"
                )));
            }
        }
        return Ok(None);
    }
    if f.fanout == 0 {
        return Err(Error::Usage("--fanout must be at least 1".into()));
    }
    if let Some(t) = f.host_timeout {
        if !(t > 0.0 && t <= crate::inspect::wait::MAX_SECS) {
            return Err(Error::Usage(format!(
                "--host-timeout {t}: it must be a finite number of seconds, more than 0 and at most {:e} (about 31 years)",
                crate::inspect::wait::MAX_SECS
            )));
        }
    }
    let transport = if srun {
        if f.ssh_config.is_some() {
            return Err(Error::Usage(
                "--ssh-config is for --transport ssh, not srun".into(),
            ));
        }
        if let Some(j) = &f.jobid {
            if !crate::hosts::slurm::is_job_id(j) {
                return Err(Error::Usage(format!(
                    "--jobid {j:?}: not a Slurm job id (812, 812_3, 812+1)"
                )));
            }
        }
        // Inside a job (a batch script, salloc's shell) srun's own default is that job.
        let env_job = std::env::var("SLURM_JOB_ID")
            .ok()
            .filter(|j| crate::hosts::slurm::is_job_id(j));
        Transport::srun(f.remote_bin.clone(), f.jobid.clone().or(env_job))
    } else {
        if f.jobid.is_some() {
            return Err(Error::Usage("--jobid needs --transport srun".into()));
        }
        Transport::ssh(f.ssh_config.clone(), f.remote_bin.clone())
    };
    let mut cfg = crate::hosts::HostsConfig::from_args(src, transport).map_err(|e| match e {
        // Slurm not answering is the cluster's state, not the command line's.
        HostError::Slurm { .. } => Error::Other(e.to_string()),
        e => Error::Usage(e.to_string()),
    })?;
    cfg.fanout = f.fanout;
    cfg.skip_unreachable = f.skip_unreachable;
    // A host that does not answer its connection is the same as one that does not answer a
    // call: --host-timeout bounds both, ssh's own TCP connect included.
    if let Some(t) = f.host_timeout {
        cfg.call_timeout = std::time::Duration::from_secs_f64(t);
        cfg.connect_timeout = cfg.call_timeout;
    }
    if let crate::hosts::Transport::Ssh(o) = &mut cfg.transport {
        if let Some(t) = f.host_timeout {
            o.connect_timeout_s = (t.ceil() as u64).max(1);
        }
        o.push = !f.no_push && f.remote_bin.is_none();
        if one_shot && !f.no_reuse {
            match crate::hosts::transport::reuse_dir() {
                Ok(dir) => o.reuse = Some(dir),
                Err(why) => crate::errln!("gpuloop: not keeping ssh connections: {why}"),
            }
        }
    }
    Ok(Some(cfg))
}

/// What a command needs before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Needs {
    /// It runs once and ends: its connections to the hosts may serve the next run. Scripts,
    /// the REPL and the MCP server hold theirs for their whole life.
    one_shot: bool,
    /// How soon it reads this machine's driver.
    driver: Driver,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// As its first real work, whatever its arguments: NVML starts loading before clap
    /// parses the command line.
    First,
    /// First thing only when no pids are named (`kill` of the holders): known after parsing.
    FirstWithoutPids,
    /// Later, or never.
    Later,
}

impl CmdKind {
    /// The one place that says what each command needs; a new command is a compile error
    /// here until it says.
    fn needs(self) -> Needs {
        let (one_shot, driver) = match self {
            CmdKind::Gpus
            | CmdKind::Top
            | CmdKind::Holders
            | CmdKind::Diagnose
            | CmdKind::Clean
            | CmdKind::Wait => (true, Driver::First),
            CmdKind::Kill => (true, Driver::FirstWithoutPids),
            CmdKind::Epilog | CmdKind::Prolog => (false, Driver::First),
            CmdKind::Run
            | CmdKind::Eval
            | CmdKind::Check
            | CmdKind::Recipes
            | CmdKind::Repl
            | CmdKind::Doc
            | CmdKind::Mcp
            | CmdKind::Journal
            | CmdKind::Completions
            | CmdKind::Man
            | CmdKind::Agent
            | CmdKind::Sim
            | CmdKind::Reset
            | CmdKind::Guard => (false, Driver::Later),
        };
        Needs { one_shot, driver }
    }
}

/// The commands that run once and end: their connections may serve the next run.
fn one_shot(cmd: &Cmd) -> bool {
    CmdKind::from(cmd).needs().one_shot
}

/// Whether the raw command line is `gpuloop [FLAGS] ONE-SHOT …` (`Driver::First`, after
/// only global flags that take no value) on this machine's driver: no simulator, no host set.
/// Read before clap parses (~1 ms on the H200 machine: the load began 1.1-1.3 ms after `main`
/// when it waited for clap, 0.2-0.3 ms with this), so that NVML starts loading at
/// once; other spellings are caught after parsing (`wants_driver`). Never true where clap
/// would not select the NVML backend.
fn driver_first(argv: &[std::ffi::OsString], sim: bool) -> bool {
    let valueless = |a: &str| {
        matches!(a, "--json" | "--wide" | "--verbose")
            || a.starts_with("--color=")
            || (a.len() > 1 && a.starts_with('-') && a[1..].bytes().all(|b| b == b'v'))
    };
    let first = argv
        .iter()
        .skip(1)
        .find(|a| a.to_str().is_none_or(|a| !valueless(a)))
        .and_then(|a| a.to_str());
    let kind = first.and_then(|a| a.parse::<CmdKind>().ok());
    !sim && kind.is_some_and(|k| k.needs().driver == Driver::First)
        && !argv.iter().any(|a| {
            let a = a.as_encoded_bytes();
            a.starts_with(b"--sim") || a.starts_with(b"--host")
        })
}

/// Whether the parsed command is a one-shot that reads this machine's driver first thing.
fn wants_driver(args: &Args) -> bool {
    let local = args.hosts.sources().is_empty();
    let sim = args.sim.as_ref().is_some_and(|s| !s.trim().is_empty());
    let one_shot = match CmdKind::from(&args.cmd).needs().driver {
        Driver::First => true,
        Driver::FirstWithoutPids => {
            !matches!(&args.cmd, Cmd::Kill { pids, .. } if !pids.is_empty())
        }
        Driver::Later => false,
    };
    local && !sim && one_shot
}

/// Runs gpuloop and returns the process exit code.
pub fn main() -> i32 {
    crate::timeline::start();
    // Jobs learn this very gpuloop's path as GPULOOP_EXE from the runner, which sets it on
    // each job it starts (`runner::job`): nothing here changes the environment for it.
    if let Ok(exe) = std::env::current_exe() {
        crate::runner::guard::enable(exe);
    }
    // NVML's load and init (~10 ms on an H200) is most of a one-shot's time: it starts before
    // anything else, and overlaps it all.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let sim = std::env::var_os("GPULOOP_SIM").is_some_and(|v| !v.is_empty());
    if driver_first(&argv, sim) {
        crate::gpu::nvml::preload();
    }
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            // --help and --version are answers, not errors.
            let answer = matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            );
            if !answer && std::env::args().any(|a| a == "--json") {
                json_error(&e.render().to_string());
            } else if let Some(closed) = crate::output::unwritable().filter(|_| !e.use_stderr()) {
                // Help for a stdout that cannot take it fails, as any output does.
                crate::output::failed(&closed);
            } else if let Err(e) = e.print() {
                crate::output::failed(&e);
            }
            // clap's own mapping: an answer on stdout is success, anything on stderr usage.
            let end = match e.use_stderr() {
                true => Exit::Usage,
                false => Exit::Success,
            };
            return exit_code(Ok(end), false);
        }
    };
    // Every signal from here on is journaled as this command's.
    crate::journal::start(
        front_end(&args.cmd),
        argv.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    );
    // The simulator's holder and watcher must start no threads before they fork.
    if let Cmd::Sim(
        SimCmd::Hold {
            as_holder: true, ..
        }
        | SimCmd::Hold {
            foreground: true, ..
        }
        | SimCmd::Watch { .. },
    ) = &args.cmd
    {
        return exit_code(commands::sim::internal(&args), false);
    }
    if let Cmd::Guard = &args.cmd {
        return exit_code(Ok(crate::runner::guard::main()), false);
    }
    export_for_children(&args);
    if wants_driver(&args) {
        crate::gpu::nvml::preload();
    }
    crate::interrupt::install();
    crate::output::set_color(args.color.into());
    crate::output::set_wide(args.wide);
    init_logs(args.verbose);
    let result = hiargs::HiArgs::from_low(&args).and_then(|hi| on_script_thread(&hi));
    let code = exit_code(result, args.json);
    tracing::debug!("done at {:.1} ms", crate::timeline::ms());
    if crate::gpu::nvml::load_pending() {
        // A load of the driver library that never returned may hold the loader's lock, which
        // the C library's exit waits for: end now (stdout was flushed by exit_code).
        // SAFETY: _exit ends the process at once; nothing of Rust's needs to run after it.
        unsafe { libc::_exit(code) }
    }
    code
}

/// The one place a command's end becomes the process's exit status (as ripgrep's `main`):
/// its `Exit`, or its error, said (as `{"error": …}` under --json) and mapped to the `Exit`
/// it means; a command whose output could not be written (other than to a closed pipe) has
/// failed, whatever it found.
fn exit_code(result: Result<Exit, Error>, json: bool) -> i32 {
    let end = match result {
        Ok(end) => end,
        Err(e) => {
            report(&e, json);
            e.exit()
        }
    };
    match crate::output::finish() {
        true => end.worse(Exit::Failure).code(),
        false => end.code(),
    }
}

/// Puts the simulator in the environment every child inherits: the jobs run() and MCP's
/// run_recipe start, and the `gpuloop …` they call back, see the same simulated GPUs as this
/// gpuloop without each place that starts a process knowing the simulator (`sim hold` passes
/// it to its holders itself). One process-wide set, here, because no thread exists yet: the
/// NVML preload and the interrupt handler start after it, and libc's getenv on another
/// thread races with setenv. `Config::from_args` reads the arguments and changes nothing.
fn export_for_children(args: &Args) {
    if let Some(spec) = args.sim.as_ref().filter(|s| !s.trim().is_empty()) {
        std::env::set_var("GPULOOP_SIM", spec);
        std::env::set_var("GPULOOP_SIM_DIR", crate::gpu::sim::state_dir());
    }
}

/// The front end the audit journal names for a command. The guard acts for the gpuloop that
/// started it, which tells it its front end.
fn front_end(cmd: &Cmd) -> crate::journal::FrontEnd {
    use crate::journal::FrontEnd;
    match cmd {
        Cmd::Run { .. } | Cmd::Eval { .. } | Cmd::Check { .. } | Cmd::Repl => FrontEnd::Script,
        Cmd::Epilog { .. } => FrontEnd::Epilog,
        Cmd::Prolog { .. } => FrontEnd::Prolog,
        Cmd::Mcp { .. } => FrontEnd::Mcp,
        Cmd::Agent => FrontEnd::Agent,
        Cmd::Guard => crate::journal::inherited().unwrap_or(FrontEnd::Script),
        _ => FrontEnd::Cli,
    }
}

/// Runs the command on a thread whose stack is sized for the deepest value the limits
/// allow: rhai (and serde, and our renderers) walk nested values recursively, and the main
/// thread's 8 MiB would overflow (an abort, exit 134) long before a limit said so.
fn on_script_thread(hi: &hiargs::HiArgs) -> Result<Exit, Error> {
    let stack = crate::script::engine::stack_size(&hi.config.session.config.limits);
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("gpuloop-script".into())
            .stack_size(stack)
            .spawn_scoped(scope, || {
                crate::stack_guard::watch_this_thread();
                commands::dispatch(hi)
            });
        match worker {
            Ok(handle) => handle.join().unwrap_or_else(|_| {
                Err(Error::Other(
                    "internal error (a panic); please report it".into(),
                ))
            }),
            // Never a smaller stack (the main thread's) with the limits still in force: that
            // overflows where the limits promised an error.
            Err(e) => Err(Error::Other(format!(
                "cannot reserve the script's stack of {} MiB ({e}): lower --limit calls or depth",
                stack >> 20
            ))),
        }
    })
}

/// `-v`: what gpuloop decides and measures (debug), `-vv`: every poll and signal (trace).
fn init_logs(verbose: u8) {
    let level = match verbose {
        0 => return,
        1 => "gpuloop=debug",
        _ => "gpuloop=trace",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(level))
        .with_writer(|| crate::output::Stderr)
        .with_ansi(crate::output::color_stderr())
        .with_target(false)
        .without_time()
        .try_init();
}

/// Prints the error (as `{"error": …}` under --json, so that a program reading JSON gets
/// JSON on both streams).
fn report(e: &Error, json: bool) {
    let msg = e.to_string();
    // An error may quote what other users chose (a process's name, a path): its controls are
    // shown escaped, its lines (a script's source line and caret) kept.
    let msg = crate::shown::text(&msg);
    if !msg.is_empty() {
        if json {
            json_error(&msg);
        } else if matches!(e, Error::Script(_)) {
            crate::errln!("{msg}");
        } else {
            crate::errln!("gpuloop: {msg}");
        }
    }
}

fn json_error(msg: &str) {
    let msg = msg.trim_end().trim_start_matches("error: ");
    let error = serde_json::json!({ "error": msg });
    crate::errln!("{}", crate::shown::json(&error, false).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn argv(line: &str) -> Vec<std::ffi::OsString> {
        line.split_whitespace().map(Into::into).collect()
    }

    #[test]
    fn building_the_config_changes_no_environment_variable() {
        let spec = "3x7G,release_ms=1";
        let args = Args::try_parse_from(["gpuloop", "--sim", spec, "gpus"]).unwrap();
        let before: Vec<_> = ["GPULOOP_SIM", "GPULOOP_SIM_DIR"]
            .map(std::env::var_os)
            .into();
        Config::from_args(&args).expect("a valid config");
        let after: Vec<_> = ["GPULOOP_SIM", "GPULOOP_SIM_DIR"]
            .map(std::env::var_os)
            .into();
        assert_eq!(before, after);
    }

    #[test]
    fn every_subcommand_clap_knows_is_a_command_kind_by_its_name() {
        use clap::CommandFactory;
        for sub in Args::command().get_subcommands() {
            let kind: CmdKind = sub
                .get_name()
                .parse()
                .unwrap_or_else(|_| panic!("{}", sub.get_name()));
            assert_eq!(<&str>::from(kind), sub.get_name());
        }
    }

    #[test]
    fn nvml_starts_before_parsing_only_for_a_one_shot_on_this_machines_driver() {
        for yes in [
            "gpuloop gpus",
            "gpuloop holders --gpu 0 --json",
            "gpuloop -v --json --color=never diagnose",
            "gpuloop -vv clean --timeout 5",
        ] {
            assert!(driver_first(&argv(yes), false), "{yes}");
        }
        for no in [
            "gpuloop",
            "gpuloop run gpus",
            "gpuloop eval holders",
            "gpuloop --sim 2x8G gpus",
            "gpuloop gpus --sim=2x8G",
            "gpuloop --host a gpus",
            "gpuloop holders --hosts-file f",
            "gpuloop --limit memory=1G gpus",
            "gpuloop --color never gpus",
            "gpuloop kill 1234",
            "gpuloop sim hold --name holders",
        ] {
            assert!(!driver_first(&argv(no), false), "{no}");
        }
        assert!(
            !driver_first(&argv("gpuloop gpus"), true),
            "GPULOOP_SIM set"
        );
    }

    #[test]
    fn nvml_starts_after_parsing_for_every_spelling_of_a_local_one_shot() {
        let wants = |line: &str| {
            let mut v = argv(line);
            if !line.contains("--sim") {
                // An empty --sim is no simulator, whatever GPULOOP_SIM says.
                v.splice(1..1, ["--sim".into(), "".into()]);
            }
            wants_driver(&Args::try_parse_from(v).unwrap())
        };
        assert!(wants("gpuloop --color never gpus"));
        assert!(wants("gpuloop --limit memory=1G holders --all"));
        assert!(wants("gpuloop kill --gpu 0"));
        assert!(!wants("gpuloop kill 1234"));
        assert!(!wants("gpuloop --sim 2x8G gpus"));
        assert!(!wants("gpuloop --host a gpus"));
        assert!(!wants("gpuloop eval 1"));
        assert!(!wants("gpuloop repl"));
    }
}
