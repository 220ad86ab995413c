//! The command line as clap sees it: the raw flags, which `hiargs` checks into a `Config` and
//! a `Command` before anything runs.

use clap::{Args as ClapArgs, Parser, Subcommand};
use std::path::PathBuf;

/// The heading global flags are listed under, apart from each command's own.
const GLOBAL: &str = "Global options";
/// The heading of the global flags that name and reach several hosts.
const HOSTS: &str = "Hosts (global options)";

const AFTER_HELP: &str = "\
Scripts: gpuloop [OPTIONS] run SCRIPT [ARGS…] (or a built-in recipe: gpuloop recipes): everything
after SCRIPT is the script's ARGS, untouched (a first `--` is dropped); reference: gpuloop doc.

Exit codes: 0 success; 1 runtime error, or clean/wait/diagnose finding a selected GPU not
clean, or no driver; 2 usage or compile error; 130 interrupted.

Environment:
  GPULOOP_SIM      the --sim spec: simulated GPUs held by real processes
  GPULOOP_SIM_DIR  the simulator's state directory (default $XDG_RUNTIME_DIR/gpuloop-sim, else
                   /tmp/gpuloop-sim-UID): every session of a user shares the default; one of
                   its own: export GPULOOP_SIM_DIR=$(mktemp -d)
  GPULOOP_PATH     directories (colon-separated) where `import` looks for modules
  SLURM_JOB_ID     the job --transport srun steps into, unless --jobid or
                   --hosts-from-slurm JOBID names one
  NO_COLOR         no colour with --color auto";

#[derive(Debug, Parser)]
#[command(
    name = "gpuloop",
    version,
    about = "Scriptable act-verify-retry loops for GPUs left dirty by crashed jobs",
    after_help = AFTER_HELP
)]
pub struct Args {
    /// Simulated GPUs, e.g. 8x80G.
    ///
    /// Simulated GPUs instead of the driver. The value is COUNTxSIZE[,release_ms=MS][,minors=A:B:…][,name=NAME][,foreign_pids=hidden|raw][,mig=N:PROFILE+…][,mig_pending=N:enabled|disabled],
    /// e.g. 8x80G, 2x141G,release_ms=150 (SIZE in M, G or T) or 2x80G,mig=0:1g.10gb+3g.40gb
    /// (GPU 0 in MIG mode with those instances; docs/simulator.md); state in GPULOOP_SIM_DIR.
    #[arg(
        long,
        global = true,
        env = "GPULOOP_SIM",
        value_name = "SPEC",
        help_heading = GLOBAL
    )]
    pub sim: Option<String>,
    /// Print JSON instead of tables.
    ///
    /// Errors too, on stderr: {"error": …}; over several hosts each host that failed is also in
    /// the document, as {"host", "state", "error"}.
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,
    /// More logs (-v, -vv).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = GLOBAL)]
    pub verbose: u8,
    /// When to colour: auto, always, never.
    ///
    /// auto: on a terminal, unless NO_COLOR is set.
    #[arg(
        long,
        global = true,
        value_name = "WHEN",
        default_value = "auto",
        hide_possible_values = true,
        help_heading = GLOBAL
    )]
    pub color: ColorArg,
    /// Whole command lines and every row.
    ///
    /// Tables otherwise cut command lines to the terminal's width, and over several hosts fold
    /// the clean hosts' rows into one line.
    #[arg(long, visible_alias = "all-rows", global = true, help_heading = GLOBAL)]
    pub wide: bool,
    /// A resource limit for scripts (repeatable).
    ///
    /// NAME is one of array, string (bytes; K/M/G), map, calls, expr_depth, depth, memory
    /// (bytes; K/M/G). Also [limits] in config.toml.
    #[arg(long = "limit", global = true, value_name = "NAME=N", help_heading = GLOBAL)]
    pub limits: Vec<String>,
    #[command(flatten)]
    pub hosts: HostFlags,
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// Each command's kind, `CmdKind`, is derived from this enum (named as on the command line,
/// `CmdKind::from_str("gpus")`), and `CmdKind::needs` says, in one exhaustive match, what each
/// needs before it runs.
#[derive(Debug, Subcommand, strum::EnumDiscriminants)]
#[strum_discriminants(
    name(CmdKind),
    derive(strum::EnumString, strum::IntoStaticStr),
    strum(serialize_all = "kebab-case")
)]
pub enum Cmd {
    /// Run a Rhai script or a recipe; the words after it are its ARGS.
    ///
    /// SCRIPT is a file (`-` reads it from stdin) or a recipe's name; everything after it is in
    /// its ARGS.
    ///
    /// gpuloop's own options go before SCRIPT. After it, one of them (`--sim`, `--host`,
    /// `--json`, `-v`, `--limit`, …) before a `--` is a usage error, never applied (a rehearsal
    /// must not go live, nor a script run on other hosts than the ones named before it);
    /// after `--` it is the script's. `--help` and a recipe's own flags are the script's. A
    /// `--` right after SCRIPT is accepted and dropped.
    Run {
        /// The script or recipe, then its ARGS, verbatim.
        ///
        /// SCRIPT is a file's path (it has a `/` or ends in `.rhai`), `-` for stdin, or any
        /// other word, a recipe (gpuloop recipes); the script's arguments follow it, verbatim:
        /// its ARGS.
        // One positional, because clap matches a known flag even after a single-valued
        // positional: only a trailing var arg takes every word after its first value as is.
        #[arg(
            required = true,
            num_args = 1..,
            trailing_var_arg = true,
            value_names = ["SCRIPT", "ARGS"]
        )]
        argv: Vec<String>,
    },
    /// Evaluate code and print the value of its last expression.
    Eval {
        /// Rhai code, e.g. 'holders().len()'.
        code: String,
    },
    /// Compile scripts without running them.
    ///
    /// The modules they import are loaded, which runs their top level, as an import does.
    Check {
        /// Scripts or recipes to compile.
        ///
        /// Script files, or names of recipes, each compiled with the modules it imports.
        #[arg(required = true)]
        scripts: Vec<PathBuf>,
    },
    /// List the recipes, show one, or start a new one.
    ///
    /// The recipes are yours, the site's and the built-in ones; run one with `gpuloop run NAME
    /// ARGS…`.
    ///
    /// Searched in this order: $XDG_CONFIG_HOME/gpuloop/recipes (~/.config/gpuloop/recipes),
    /// /etc/gpuloop/recipes (GPULOOP_SITE_RECIPES names another), then the built-in ones. A
    /// file runs by name only when it and every directory above it are owned by root or by the
    /// user gpuloop runs as and writable by no one else.
    Recipes {
        #[command(subcommand)]
        cmd: Option<RecipesCmd>,
    },
    /// Interactive Rhai prompt with every gpuloop function.
    ///
    /// `:help` lists the functions, `:quit` leaves.
    Repl,
    /// Print the reference of every script function (Markdown).
    Doc {
        /// Write Rhai definition files for editors into DIR.
        ///
        /// Instead of printing the reference.
        #[arg(long, value_name = "DIR")]
        definitions: Option<PathBuf>,
    },
    /// List the GPUs.
    Gpus {
        #[command(flatten)]
        sel: GpuSel,
    },
    /// Each GPU at a glance, with its holders.
    ///
    /// Utilisation, memory, temperature and who holds each GPU; on a terminal it redraws
    /// every --interval seconds until Ctrl-C, else it prints once.
    Top {
        #[command(flatten)]
        sel: GpuSel,
        /// Seconds between redraws on a terminal.
        #[arg(long, default_value_t = 1.0, value_name = "SECS")]
        interval: f64,
        /// Print one frame and exit, even on a terminal.
        #[arg(long)]
        once: bool,
    },
    /// List the processes holding GPUs.
    Holders {
        #[command(flatten)]
        sel: GpuSel,
        #[command(flatten)]
        owner: Owner,
        /// Also observers and protected GPU daemons.
        ///
        /// Observers are NVML-only clients (nvidia-smi, nvitop, exporters): they have the
        /// nodes open and map nothing.
        #[arg(long)]
        all: bool,
    },
    /// Say why GPU memory is still used; exit 1 if not clean.
    ///
    /// Exit 1 if a selected GPU is not clean.
    Diagnose {
        #[command(flatten)]
        sel: GpuSel,
        /// Print nothing; only the exit code says.
        ///
        /// The exit code says whether every selected GPU is clean.
        #[arg(long)]
        check: bool,
        #[command(flatten)]
        owner: Owner,
    },
    /// Stop the GPUs' compute holders, or PIDs: TERM, grace, KILL.
    ///
    /// Stops the compute holders of the selected GPUs, or the given PIDs.
    ///
    /// As root this stops every user's processes on those GPUs: --user or --mine narrows it.
    Kill {
        /// Processes to stop instead of the GPUs' holders.
        ///
        /// The same safety rules: never pid 1, gpuloop or its ancestors; protected daemons
        /// only with --force.
        #[arg(value_name = "PID", allow_negative_numbers = true)]
        pids: Vec<i64>,
        #[command(flatten)]
        sel: GpuSel,
        #[command(flatten)]
        owner: Owner,
        #[command(flatten)]
        kill: KillFlags,
    },
    /// Kill the holders, wait until the GPUs are free, report.
    ///
    /// Exit 1 if a selected GPU is not clean at the end.
    ///
    /// As root this stops every user's processes on those GPUs: --user or --mine narrows it.
    Clean {
        #[command(flatten)]
        sel: GpuSel,
        #[command(flatten)]
        owner: Owner,
        /// Seconds to wait for the memory.
        ///
        /// After the kill, until the memory is back.
        #[arg(
            long,
            default_value_t = 30.0,
            value_name = "SECS",
            allow_negative_numbers = true
        )]
        timeout: f64,
        #[command(flatten)]
        wait: WaitFlags,
        #[command(flatten)]
        kill: KillFlags,
    },
    /// Wait until the GPUs are free, killing nothing.
    ///
    /// Exit 1 if a selected GPU is not clean in time.
    ///
    /// With --user, --mine or --job it waits for the GPUs those processes hold when it starts:
    /// until they are gone and those GPUs are clean (memory back, no compute holder of
    /// anyone's). When they hold no selected GPU there is nothing to wait for: it says so.
    Wait {
        #[command(flatten)]
        sel: GpuSel,
        #[command(flatten)]
        owner: Owner,
        /// Seconds to wait for the memory.
        ///
        /// Until the memory is back and no compute holder is left.
        #[arg(
            long,
            default_value_t = 30.0,
            value_name = "SECS",
            allow_negative_numbers = true
        )]
        timeout: f64,
        #[command(flatten)]
        wait: WaitFlags,
    },
    /// Reset GPUs, or list what blocks a reset (--dry-run).
    ///
    /// Lists every client that blocks the reset (--dry-run), or stops them, resets, verifies
    /// the GPU came back (its UUID answers, 0 MiB used) and starts again, through systemctl,
    /// the system units it stopped.
    ///
    /// Exit 0 when every GPU was reset and verified and every daemon it stopped runs again
    /// (with --dry-run: when a reset can work and nothing blocks it), 1 otherwise. Where no
    /// reset can work (the GPU fell off the bus, the driver asks for a reboot) nothing is
    /// stopped. Protected daemons (nvidia-persistenced, DCGM, the fabric manager, MPS; a name
    /// proven by who runs the process and what it runs) and systemd system units' main
    /// processes are stopped only with --force, a unit through systemctl; a daemon outside
    /// any system unit is not started again (the report says what it ran); nvidia_drm with
    /// modeset=1 is never unloaded for you. With a host set, name each GPU with its host:
    /// --gpu HOST:N.
    Reset {
        #[command(flatten)]
        sel: GpuSel,
        /// List what blocks the reset; change nothing.
        ///
        /// Each client that would block the reset, and what stops it; nothing is stopped or
        /// reset.
        #[arg(long)]
        dry_run: bool,
        /// Also stop protected daemons and units.
        ///
        /// Protected GPU daemons and systemd system units' main processes (a unit through
        /// systemctl); each unit is started again after the reset, a daemon outside any is not.
        #[arg(long)]
        force: bool,
        /// Seconds between TERM and KILL.
        ///
        /// For the processes it stops; 0: KILL at once.
        #[arg(
            long,
            default_value_t = 5.0,
            value_name = "SECS",
            allow_negative_numbers = true
        )]
        grace: f64,
        /// Seconds the GPU may take to come back.
        ///
        /// After the reset, until it answers again (its UUID, 0 MiB used).
        #[arg(
            long,
            default_value_t = 30.0,
            value_name = "SECS",
            allow_negative_numbers = true
        )]
        timeout: f64,
    },
    /// Slurm's Epilog=: stop what the job left, verify, or drain.
    ///
    /// Stops what the finished job left on its GPUs, verifies, or drains the node.
    ///
    /// Reads SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_GPUS (or CUDA_VISIBLE_DEVICES) and
    /// SLURMD_NODENAME. Never touches another running job's processes. Exit 1 after draining.
    Epilog {
        #[command(flatten)]
        hook: HookFlags,
    },
    /// Slurm's Prolog=: verify the job's GPUs, clean, or drain.
    ///
    /// Verifies the starting job's GPUs; cleans what belongs to no running job, or drains the
    /// node and exits 1 so Slurm requeues the job.
    Prolog {
        #[command(flatten)]
        hook: HookFlags,
    },
    /// Serve gpuloop's tools to an AI assistant over MCP (stdio).
    ///
    /// Read-only unless allowed.
    #[command(
        after_help = "Read-only by default: gpus, holders, diagnose, wait_clean, and dry runs of kill and clean.\n\
                      --allow (or `[mcp] allow = [...]` in config.toml) opens more. Protected GPU daemons are never signalled.\n\
                      Every call is journaled: gpuloop journal.\n\
                      Claude Code: claude mcp add gpuloop -- gpuloop mcp --allow clean\n\
                      Remote node:  claude mcp add gpu-node -- ssh node gpuloop mcp --allow clean"
    )]
    Mcp {
        /// Also allow: kill, clean, run, recipes.
        ///
        /// Comma-separated or repeated.
        #[arg(long, value_name = "WHAT", value_delimiter = ',')]
        allow: Vec<String>,
        /// Also serve your own recipes.
        ///
        /// run_recipe and recipes also see your own recipes ($XDG_CONFIG_HOME/gpuloop/recipes);
        /// without it only the site's and the built-in ones, which the site's admin vets.
        #[arg(long)]
        user_recipes: bool,
    },
    /// Show the audit journal of signals and MCP calls.
    ///
    /// Every signal gpuloop sent (who asked, through which front end, to which process, why,
    /// and what came of it) and every MCP call. With --host, each host's own journal, in host
    /// order.
    Journal {
        /// Show the last N records (0: all).
        #[arg(long, short = 'n', default_value_t = 20, value_name = "N")]
        last: usize,
        /// Only records since a time or an age.
        ///
        /// A UTC time (2026-12-01, 2026-12-01T14:05) or an age (10m, 2h, 3d).
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// Only signals to this pid, and calls that signalled it.
        #[arg(long, value_name = "PID")]
        pid: Option<i64>,
        /// Only what this user (name or uid) ran.
        #[arg(long, value_name = "USER")]
        user: Option<String>,
        /// Only records of this front end (cli, mcp, …).
        ///
        /// One of cli, script, mcp, agent, epilog, prolog.
        #[arg(long, value_name = "NAME", hide_possible_values = true, value_parser = clap::builder::PossibleValuesParser::new(crate::journal::FrontEnd::NAMES))]
        front_end: Option<String>,
    },
    /// Shell completions.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): gpuloop man > gpuloop.1.
    ///
    /// --dir DIR writes one page per command.
    Man {
        /// Write a page per command into DIR.
        ///
        /// gpuloop.1 and a page per command (gpuloop-clean.1, gpuloop-sim-hold.1, …) into DIR,
        /// instead of printing gpuloop.1.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Serve this machine to a remote gpuloop (what --host starts).
    ///
    /// Line-delimited JSON on stdin/stdout; `--host` starts it through ssh or srun.
    Agent,
    /// The GPU simulator: start holders, leak memory, reset.
    #[command(subcommand)]
    Sim(SimCmd),
    /// The guard process that stops a killed gpuloop's jobs (started by gpuloop itself).
    #[command(hide = true, name = crate::runner::guard::SUBCOMMAND)]
    #[strum_discriminants(strum(serialize = "__guard"))]
    Guard,
}

/// `gpuloop recipes show NAME`, `gpuloop recipes new NAME`.
#[derive(Debug, Subcommand)]
pub enum RecipesCmd {
    /// Print a recipe's arguments and usage, then its source.
    Show {
        /// The recipe's name, as `gpuloop recipes` lists it.
        name: String,
    },
    /// Start a new recipe in your recipe directory.
    ///
    /// Writes the commented skeleton of a new recipe (arguments, a dry run, a report before
    /// and after) into your recipe directory, and prints its path.
    New {
        /// The new recipe's name.
        ///
        /// Letters, digits, '.', '_', '-'.
        name: String,
    },
}

/// Several hosts, reached through the system's OpenSSH client or a Slurm step (srun).
#[derive(Debug, Clone, ClapArgs)]
pub struct HostFlags {
    /// Act on these hosts (repeatable).
    ///
    /// ssh destinations or aliases, hostlists like 'gpu[01-16],login1'; `local` is this
    /// machine without ssh.
    #[arg(long = "host", global = true, value_name = "DEST", help_heading = HOSTS)]
    pub hosts: Vec<String>,
    /// Hosts from a file.
    ///
    /// One destination or hostlist per line, `#` comments.
    #[arg(long, global = true, value_name = "FILE", help_heading = HOSTS)]
    pub hosts_file: Vec<PathBuf>,
    /// Hosts from Slurm: a job's nodes, or a node list.
    ///
    /// Repeatable. A job id (812, 812_3, 812+1) gives the job's nodes (`scontrol show job`), a
    /// node list ('gpu[01-16]') is expanded by `scontrol show hostnames`. Adds to --host and
    /// --hosts-file.
    #[arg(long, global = true, value_name = "JOBID|NODELIST", help_heading = HOSTS)]
    pub hosts_from_slurm: Vec<String>,
    /// How to reach the hosts: ssh or srun.
    ///
    /// ssh: `ssh -o BatchMode=yes HOST gpuloop agent`; srun: a step of a running job, `srun
    /// --overlap --jobid J -w NODE gpuloop agent`, where ssh to compute nodes is refused.
    #[arg(long, global = true, value_name = "HOW", default_value = "ssh", hide_possible_values = true, help_heading = HOSTS)]
    pub transport: TransportArg,
    /// The Slurm job --transport srun steps into.
    ///
    /// For nodes no --hosts-from-slurm JOBID listed; default: $SLURM_JOB_ID.
    #[arg(long, global = true, value_name = "J", help_heading = HOSTS)]
    pub jobid: Option<String>,
    /// The gpuloop to run on the hosts.
    ///
    /// By default gpuloop on their PATH, or where there is none this one, sent there: see
    /// --no-push.
    #[arg(long, global = true, value_name = "PATH", help_heading = HOSTS)]
    pub remote_bin: Option<String>,
    /// ssh client config file (ssh -F FILE).
    #[arg(long, global = true, value_name = "FILE", help_heading = HOSTS)]
    pub ssh_config: Option<PathBuf>,
    /// Connections opened in parallel (pdsh -f).
    #[arg(long, global = true, value_name = "N", default_value_t = crate::hosts::DEFAULT_FANOUT, help_heading = HOSTS)]
    pub fanout: usize,
    /// Go on without the hosts that cannot be reached.
    ///
    /// They are listed (as errors, and in --json as {"host", "error"} entries), and a
    /// one-shot's exit code then covers the hosts that answered (still 1 if none did). Without
    /// it an unreachable host makes the exit code 1.
    #[arg(long, global = true, help_heading = HOSTS)]
    pub skip_unreachable: bool,
    /// Seconds a host may take to answer.
    ///
    /// Its connection (ssh's ConnectTimeout too; without this option 10 s, as pdsh's, and 30 s
    /// for the agent's hello), a call (beyond the time it asks for itself, like a wait's
    /// timeout) or the ping sent every 5 s while a long call runs (60 s without this option).
    /// A host that hangs fails its part with a timeout error naming it; the others go on.
    #[arg(long, global = true, value_name = "SECS", help_heading = HOSTS)]
    pub host_timeout: Option<f64>,
    /// Open new ssh connections each run.
    ///
    /// By default a one-shot command (gpus, holders,
    /// diagnose, kill, clean, wait) leaves each connection open for 60 s (OpenSSH's
    /// ControlMaster, sockets in $XDG_RUNTIME_DIR/gpuloop or /tmp/gpuloop-ssh-UID, mode
    /// 0700), so the next run skips the handshake; a ControlPath in your ssh config wins.
    #[arg(long, global = true, help_heading = HOSTS)]
    pub no_reuse: bool,
    /// Never send this gpuloop to a host.
    ///
    /// By default a host reached over ssh with no usable
    /// gpuloop on its PATH (none, or one of another protocol) receives this binary into
    /// ~/.cache/gpuloop (or $XDG_CACHE_HOME/gpuloop) there, SHA-256 checked before it runs
    /// and reused by later runs, where it can run (same architecture, a glibc at least as
    /// new as it needs). Not with --remote-bin, which names the one gpuloop to run there.
    #[arg(long, global = true, help_heading = HOSTS)]
    pub no_push: bool,
}

/// The command line as parsed and documented: `Args`, with each command's short help (`-h`)
/// listing its own options and the global ones folded into one line at the end (`--help`
/// still lists them all, after the command's own).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let cmd = Args::command();
    let globals: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.clone().hide_short_help(true))
        .collect();
    let name = |a: &clap::Arg| match (a.get_long(), a.get_short()) {
        (_, Some(c)) => format!("-{c}"),
        (Some(l), None) => format!("--{l}"),
        (None, None) => a.get_id().to_string(),
    };
    let general: Vec<String> = globals
        .iter()
        .filter(|a| a.get_help_heading() == Some(GLOBAL))
        .map(name)
        .collect();
    let line = format!(
        "Global options: {} --host … (gpuloop --help)",
        general.join(" ")
    );
    fold_globals(cmd, &globals, &line)
}

/// Gives every subcommand, at any depth, its own copy of the global options hidden from `-h`,
/// before clap would copy them in unchanged, and the line that names them instead.
fn fold_globals(cmd: clap::Command, globals: &[clap::Arg], line: &str) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names.iter().fold(cmd, |cmd, name| {
        cmd.mut_subcommand(name, |sub| {
            let long = sub.get_after_help().map(|h| h.to_string());
            let short = match &long {
                Some(h) => format!("{h}\n\n{line}"),
                None => line.to_string(),
            };
            let mut sub = globals
                .iter()
                .fold(sub, |sub, a| sub.arg(a.clone()))
                .after_help(short);
            sub = match long {
                Some(h) => sub.after_long_help(h),
                // `--help` lists the global options themselves: no line pointing elsewhere.
                None => sub.after_long_help(""),
            };
            fold_globals(sub, globals, line)
        })
    })
}

impl HostFlags {
    /// The flags that name hosts; empty for this machine alone.
    pub fn sources(&self) -> crate::hosts::HostSources<'_> {
        crate::hosts::HostSources {
            exprs: &self.hosts,
            files: &self.hosts_file,
            slurm: &self.hosts_from_slurm,
        }
    }
}

#[derive(Debug, Clone, ClapArgs)]
pub struct GpuSel {
    /// GPUs: 0, 0,1, 0-3, a UUID or a bus id (default all).
    ///
    /// As nvidia-smi -i takes them: an index, a list, a range, a UUID (or a unique prefix of
    /// one) or a PCI bus id; repeatable; default every GPU. A MIG device is a GPU of its own:
    /// N:GI:CI, N:GI (every compute instance of that GPU instance), or MIG-<uuid> (or a
    /// unique prefix); a GPU selects all its MIG devices. With several hosts, DEST:N is GPU N
    /// of host DEST (a part of numbers alone is never a host: 0:7 is a MIG device).
    #[arg(long = "gpu", value_name = "ID", allow_hyphen_values = true)]
    pub gpus: Vec<String>,
}

/// `--user`, `--mine`, `--job`: whose processes. holders and kill take only theirs; diagnose,
/// wait and clean judge the GPUs they hold (each with every user's holders there).
#[derive(Debug, Clone, ClapArgs)]
pub struct Owner {
    /// Only processes of this user (a name or a uid).
    ///
    /// holders and kill take only theirs;
    /// diagnose, wait and clean judge the GPUs they hold. With --host each host looks the name
    /// up in its own user database (uids differ between machines); a host that does not know
    /// it fails its part, naming the user.
    #[arg(long, value_name = "USER", conflicts_with = "mine")]
    pub user: Option<String>,
    /// Only your own processes, as --user.
    ///
    /// Those of the account gpuloop runs as. With --host that is, on each host, the account
    /// its agent runs as there (the ssh login user).
    #[arg(long)]
    pub mine: bool,
    /// Only processes of this Slurm job, as --user.
    ///
    /// The job is read from their environment or cgroup.
    #[arg(long, value_name = "JOBID", value_parser = job_id)]
    pub job: Option<i64>,
    /// Only processes of this Kubernetes pod.
    ///
    /// NAMESPACE/NAME, NAME (in whichever namespace has it), or its uid (or its first 8
    /// characters at least), as the node tells it (cgroups, the runtime's state, the
    /// kubelet's directories; no API server). It must fit one pod among the processes on the
    /// GPUs: one that fits several (a deleted pod and its successor of the same name) or none
    /// is a usage error that lists each by uid. Every signal stays inside it, trees and
    /// parents included; wait and clean wait for the memory its processes held.
    #[arg(long, value_name = "POD", value_parser = scope_text)]
    pub pod: Option<String>,
    /// Only processes of this container, as --pod.
    ///
    /// Its name (docker's, podman's, or its name in its pod) or its id (or its first 12
    /// characters at least); it must fit one container, as --pod must fit one pod.
    #[arg(long, value_name = "NAME|ID", value_parser = scope_text)]
    pub container: Option<String>,
}

/// `--pod`, `--container`: not empty.
fn scope_text(s: &str) -> Result<String, String> {
    match s.trim() {
        "" => Err("give a name, or an id or a prefix of one".into()),
        t => Ok(t.to_string()),
    }
}

/// `--job`: a positive decimal Slurm job id.
fn job_id(s: &str) -> Result<i64, String> {
    crate::process::origin::job_id(s)
        .ok_or_else(|| format!("{s:?} is not a Slurm job id (a positive decimal number, as 812)"))
}

/// How `clean` and `wait` judge "clean".
#[derive(Debug, Clone, ClapArgs)]
pub struct WaitFlags {
    /// Seconds to keep watching once clean.
    ///
    /// Keep watching this many seconds after it reads clean: a holder coming back (a
    /// restarter) makes it not clean.
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    pub settle: f64,
    /// Demand 0 MiB, daemons' and footprints too.
    ///
    /// Also where the rest is what protected daemons keep (an MPS server's context) or the
    /// CUDA footprint of jobs on other GPUs.
    #[arg(long)]
    pub strict: bool,
    /// Give up after SECS unheld and unmoving.
    ///
    /// Stop waiting once nothing holds the memory left and it has not moved this long (0:
    /// wait the whole timeout).
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    pub stall: f64,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct HookFlags {
    /// Seconds to wait before draining.
    ///
    /// For the memory to be released, before the node is drained.
    #[arg(
        long,
        default_value_t = 30.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    pub timeout: f64,
    /// Seconds between TERM and KILL (0: at once).
    ///
    /// Seconds between SIGTERM and SIGKILL (0: KILL at once; inf: never KILL).
    #[arg(
        long,
        default_value_t = 5.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    pub grace: f64,
    /// Say what would be stopped and drained; do neither.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct KillFlags {
    /// Signal to send first.
    #[arg(long, default_value = "TERM", value_name = "SIG")]
    pub signal: String,
    /// Seconds before survivors get SIGKILL.
    ///
    /// 0: KILL at once, as docker stop -t 0; inf: never KILL: kill waits for them to exit,
    /// clean until --timeout.
    #[arg(
        long,
        default_value_t = 5.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    pub grace: f64,
    /// Say what would be signalled, signal nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also stop protected daemons and units.
    ///
    /// Protected GPU daemons and systemd units' main processes (systemd restarts those: stop
    /// the unit instead).
    #[arg(long)]
    pub force: bool,
    /// Also stop parents that restart their holders.
    ///
    /// The holders' parents that have shown they restart them: torchrun's elastic
    /// agent, or a parent gpuloop saw start a holder again (remembered on this machine, or in
    /// this run: clean watches the other live parents 1 s for it). Any other live parent is
    /// named and left alone; never init, a login or interactive shell, nor a job step's or
    /// container's manager (slurmstepd, a containerd shim, conmon, runc, tini, sshd, sudo,
    /// tmux, screen).
    #[arg(long)]
    pub parents: bool,
}

#[derive(Debug, Subcommand)]
pub enum SimCmd {
    /// Start processes that hold simulated GPU memory.
    ///
    /// Prints their pids, one per line (the holder first, then the children it forked; with
    /// --workers or --supervise the launcher first, then the workers), once they hold. A
    /// launcher process stays alive as their parent.
    Hold {
        /// The GPU to hold: N, or N:GI:CI, MIG-… on MIG.
        ///
        /// An index, or, on a GPU in MIG mode (`--sim …,mig=N:PROFILES`), one of its
        /// instances: N:GI:CI, N:GI (its first compute instance) or its MIG UUID (or a
        /// unique prefix of one). A MIG holder maps its parent's node and opens the
        /// instance's two capability nodes, as a CUDA job on a MIG device does.
        #[arg(long, allow_hyphen_values = true, value_name = "GPU")]
        gpu: String,
        /// MiB each holder allocates.
        ///
        /// Each worker's with --workers; more than the GPU has left fails, as a real
        /// allocation does.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        mib: i64,
        /// Process name (comm), e.g. nvidia-persistenced.
        ///
        /// With nvidia-cuda-mps-server, its launcher (its parent) is named as MPS's control
        /// daemon, as on a real MPS node.
        #[arg(long)]
        name: Option<String>,
        /// Open the node, map nothing (an NVML-only client).
        #[arg(long)]
        observer: bool,
        /// Ignore SIGTERM.
        #[arg(long)]
        ignore_term: bool,
        /// Fork a child that inherits the CUDA-like handles.
        #[arg(long)]
        fork_child: bool,
        /// Fork N workers that each hold MIB.
        ///
        /// The first process, the launcher, holds nothing.
        #[arg(
            long,
            default_value_t = 0,
            value_name = "N",
            allow_negative_numbers = true
        )]
        workers: i64,
        /// Leave the process group (setsid), as vLLM workers do.
        #[arg(long)]
        setsid: bool,
        /// With --fork-child: the creator exits, its child holds.
        #[arg(long, requires = "fork_child")]
        exit_creator: bool,
        /// Map every GPU's node, 3 MiB on each other GPU.
        ///
        /// A 3 MiB footprint on each GPU but the held one, as a CUDA context keeps when it can
        /// see several GPUs.
        #[arg(long)]
        map_all: bool,
        /// Keep the launcher in the caller's process group.
        ///
        /// The launcher (the holders' parent, which stays alive as theirs) stays in the
        /// caller's process group, as `launcher &` in a script does; by default it leads its
        /// own group, as a job an interactive shell or setsid starts.
        #[arg(long)]
        shared_group: bool,
        /// The process started is the holder; no detaching.
        ///
        /// It prints its pid, holds until killed and never detaches (for unshare, a supervisor
        /// or a job scheduler).
        #[arg(long, conflicts_with_all = ["workers", "fork_child", "supervise", "setsid", "shared_group"])]
        foreground: bool,
        /// The launcher restarts its holder when it dies.
        ///
        /// The launcher (first pid printed) restarts its holder (the second) whenever it dies,
        /// like torchrun's agent.
        #[arg(long, conflicts_with_all = ["workers", "fork_child"])]
        supervise: bool,
        /// Catch SIGTERM and carry on.
        ///
        /// A handler that does nothing: only SIGKILL ends it.
        #[arg(long)]
        catch_term: bool,
        /// On TERM, fork a child that keeps it, and exit.
        ///
        /// The child is a process no look before the signal saw (a handler that starts a
        /// helper, which inherits the CUDA context). The child's pid is not printed.
        #[arg(long, conflicts_with_all = ["ignore_term", "catch_term", "foreground"])]
        fork_on_term: bool,
        /// Unlisted by the driver for MS ms.
        ///
        /// For this many ms after allocating, the driver counts the memory but lists no
        /// process for it, as a real driver does while a CUDA context is being made.
        #[arg(long, default_value_t = 0, value_name = "MS")]
        unlisted_ms: u64,
        /// Sleep in D state, as if stuck in the driver.
        ///
        /// Once holding, sleep uninterruptibly (D state) like a process stuck in the driver:
        /// SIGKILL does not end it until `sim release` (cgroup-v1 freezer; needs root).
        #[arg(long, conflicts_with = "foreground")]
        stuck: bool,
        /// A defunct leader whose other thread holds.
        ///
        /// Once holding, the holder's main thread exits (SYS_exit) while another thread keeps
        /// the handles: a defunct thread-group leader (`python <defunct>`) still holding the GPU.
        #[arg(long, conflicts_with_all = ["foreground", "workers", "fork_child", "supervise", "stuck"])]
        defunct_leader: bool,
        /// Also open the MIG capability node.
        ///
        /// dev/nvidia-caps/nvidia-cap1, as DCGM or `nvidia-smi mig` does: a reset fails while
        /// it is open.
        #[arg(long)]
        caps: bool,
        #[arg(long, hide = true)]
        as_holder: bool,
    },
    /// Let the stuck holders go (sim hold --stuck).
    ///
    /// As a driver call that returns: those KILLed meanwhile exit now.
    Release,
    /// Mark memory used with no holder at all.
    ///
    /// As a stuck driver does; only `sim reset` frees it.
    Leak {
        /// The GPU: N, or N:GI:CI, MIG-… on MIG.
        ///
        /// An index, or on a GPU in MIG mode one of its MIG devices (N:GI:CI, N:GI, or its
        /// MIG UUID or a unique prefix of one).
        #[arg(long, allow_hyphen_values = true, value_name = "GPU")]
        gpu: String,
        /// MiB to mark used.
        #[arg(long, allow_negative_numbers = true)]
        mib: i64,
    },
    /// Give a simulated GPU a fault: Xid, ECC, remap, …
    ///
    /// As the driver would report it: an Xid in the simulator's kernel log, volatile ECC
    /// errors, a pending row remap, a recovery action, a fall off the bus; or load nvidia_drm
    /// with modeset.
    Fault {
        /// The GPU (index); not for --drm-modeset alone.
        #[arg(long, allow_negative_numbers = true)]
        gpu: Option<i64>,
        /// Log this Xid for the GPU (e.g. 31, 48, 79).
        ///
        /// As the driver writes it into the kernel log.
        #[arg(long, value_name = "CODE")]
        xid: Option<i64>,
        /// The pid the Xid names.
        #[arg(long, requires = "xid")]
        pid: Option<i64>,
        /// The process name in the Xid (else --pid's comm).
        ///
        /// Cut to 15 bytes, as a comm is. Without it, the comm of the --pid process now, as
        /// the driver names the process that opened the GPU.
        #[arg(long, requires = "xid")]
        name: Option<String>,
        /// The Xid's message after its code.
        ///
        /// The driver's usual one by default.
        #[arg(long, requires = "xid")]
        text: Option<String>,
        /// Add N corrected ECC errors.
        ///
        /// Corrected (single-bit) errors, volatile ones: as the driver counts them since the
        /// last reset.
        #[arg(long, default_value_t = 0, value_name = "N")]
        ecc_corrected: i64,
        /// Add N uncorrected ECC errors.
        ///
        /// Uncorrected (double-bit) errors, volatile ones: as the driver counts them since the
        /// last reset.
        #[arg(long, default_value_t = 0, value_name = "N")]
        ecc_uncorrected: i64,
        /// A row waits to be remapped at the next reset.
        #[arg(long)]
        remap_pending: bool,
        /// A row remap failed.
        #[arg(long)]
        remap_failure: bool,
        /// The recovery action the driver asks for.
        ///
        /// One of none, gpu-reset, node-reboot, drain-p2p, drain-and-reset,
        /// recover-imex-domain.
        #[arg(long, value_name = "ACTION")]
        recovery: Option<String>,
        /// The GPU falls off the bus.
        ///
        /// Every read fails ("GPU is lost"), Xid 79 is logged, and a reset cannot reach it.
        #[arg(long)]
        off_bus: bool,
        /// Heal the GPU first, as a reboot does.
        #[arg(long)]
        clear: bool,
        /// Load (on) or unload (off) nvidia_drm, modeset=1.
        ///
        /// The simulated nvidia_drm with modeset=1, which refuses every reset while loaded.
        #[arg(long, value_name = "on|off")]
        drm_modeset: Option<String>,
        /// Persistence mode on or off (nvidia-smi -pm).
        ///
        /// Turn the GPU's persistence mode on or off (on by default).
        #[arg(long, value_name = "on|off")]
        persistence: Option<String>,
    },
    /// Reset a simulated GPU, with the driver's semantics.
    ///
    /// Refused while a process holds it or has its node (or a MIG capability) open, while
    /// nvidia_drm has modeset, or when it fell off the bus; afterwards its memory nobody held
    /// is free, its volatile ECC counts are 0 and a pending remap is applied.
    Reset {
        /// The GPU (index).
        #[arg(long, allow_negative_numbers = true)]
        gpu: i64,
    },
    /// List the live simulated holders.
    Ls,
    /// End every live simulated holder.
    ///
    /// The simulator's own processes only, by pid.
    Stop,
    /// The release watcher (started by `sim hold` when release_ms is set).
    #[command(hide = true)]
    Watch { alloc: PathBuf },
}

/// `--transport ssh|srun`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// The system's OpenSSH client.
    Ssh,
    /// A step of a running Slurm job (srun --overlap).
    Srun,
}

/// `--color auto|always|never`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ColorArg {
    /// On a terminal, unless NO_COLOR is set.
    Auto,
    Always,
    Never,
}

impl From<ColorArg> for crate::output::ColorChoice {
    fn from(c: ColorArg) -> Self {
        match c {
            ColorArg::Auto => crate::output::ColorChoice::Auto,
            ColorArg::Always => crate::output::ColorChoice::Always,
            ColorArg::Never => crate::output::ColorChoice::Never,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every argument of every command, hidden ones aside, with the commands' path.
    fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if a.is_hide_set() || id == "help" || id == "version" {
                continue;
            }
            if a.get_help().is_none() && a.get_long_help().is_none() {
                out.push(format!("{path} {id}"));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_about().is_none() && sub.get_name() != "help" {
                out.push(format!("{path} {} (the command)", sub.get_name()));
            }
            undocumented(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_command_positional_and_option_says_what_it_is() {
        let mut missing = Vec::new();
        undocumented(&Args::command(), "gpuloop", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
    }

    /// Defect 2: `--limit` and the host flags were global without a heading, so every
    /// command's help listed them among its own options.
    #[test]
    fn every_global_flag_has_a_heading_of_its_own() {
        let cmd = Args::command();
        let bare: Vec<&str> = cmd
            .get_arguments()
            .filter(|a| a.is_global_set() && a.get_help_heading().is_none())
            .map(|a| a.get_id().as_str())
            .collect();
        assert!(bare.is_empty(), "global flags without a heading: {bare:?}");
    }

    /// Every command at any depth, with its path.
    fn all_commands(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        out.push((path.to_string(), cmd.clone()));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            all_commands(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    /// `-h` gives each flag a line; every long text it had is still in
    /// `--help`, whole.
    #[test]
    fn long_help_shows_every_arguments_long_text() {
        let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut root = command().term_width(100);
        root.build();
        let mut cmds = Vec::new();
        all_commands(&root, "gpuloop", &mut cmds);
        let mut long_texts = 0;
        for (path, mut cmd) in cmds {
            let help = squash(&cmd.render_long_help().to_string());
            for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(long) = a.get_long_help() {
                    long_texts += 1;
                    let long = squash(&long.to_string());
                    assert!(help.contains(&long), "{path} --help lacks {long:?}");
                }
                let short = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                assert!(!short.contains('\n'), "{path} {}: {short:?}", a.get_id());
            }
        }
        assert!(long_texts > 60, "{long_texts}");
    }

    #[test]
    fn journal_front_end_help_names_every_front_end() {
        let help = Args::command()
            .find_subcommand("journal")
            .and_then(|j| {
                j.get_arguments()
                    .find(|a| a.get_id() == "front_end")
                    .cloned()
            })
            .and_then(|a| a.get_long_help().map(|h| h.to_string()))
            .unwrap_or_default();
        for name in crate::journal::FrontEnd::NAMES {
            assert!(
                help.contains(name),
                "--front-end's help lacks {name}: {help}"
            );
        }
    }

    #[test]
    fn sim_help_names_every_option_the_parser_takes() {
        let cmd = Args::command();
        let sim = cmd
            .get_arguments()
            .find(|a| a.get_id() == "sim")
            .and_then(|a| a.get_long_help().map(|h| h.to_string()))
            .unwrap_or_default();
        for key in crate::gpu::sim::OPTIONS {
            assert!(
                sim.contains(&format!("{key}=")),
                "--sim help lacks {key}: {sim}"
            );
        }
    }
}
