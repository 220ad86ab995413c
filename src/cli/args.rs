//! The command line as clap sees it; `Config` turns it into something ready to run.

use clap::{Args as ClapArgs, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "gpuloop",
    version,
    about = "Scriptable act-verify-retry loops for GPUs left dirty by crashed jobs",
    after_help = "Scripts: gpuloop run SCRIPT [-- ARGS…]; reference: gpuloop doc.\nSimulator: --sim 8x80G (or GPULOOP_SIM) uses simulated GPUs held by real processes."
)]
pub struct Args {
    /// Use simulated GPUs: COUNTxSIZE[,release_ms=MS][,minors=A:B:…], e.g. 8x80G.
    #[arg(long, global = true, env = "GPULOOP_SIM", value_name = "SPEC")]
    pub sim: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// More logs (-v, -vv).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run a Rhai script (`-` reads it from stdin); arguments after `--` are in ARGS.
    Run {
        script: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Evaluate code and print the value of its last expression.
    Eval { code: String },
    /// Compile scripts without running them.
    Check {
        #[arg(required = true)]
        scripts: Vec<PathBuf>,
    },
    /// Interactive Rhai prompt with every gpuloop function (:help lists them, :quit leaves).
    Repl,
    /// Print the reference of every script function (Markdown).
    Doc {
        /// Write Rhai definition files for editors into DIR instead.
        #[arg(long, value_name = "DIR")]
        definitions: Option<PathBuf>,
    },
    /// List the GPUs.
    Gpus,
    /// List the processes holding GPUs.
    Holders {
        #[command(flatten)]
        sel: GpuSel,
        /// Also observers (NVML-only clients) and protected GPU daemons.
        #[arg(long)]
        all: bool,
    },
    /// Say why GPU memory is still used.
    Diagnose {
        #[command(flatten)]
        sel: GpuSel,
    },
    /// Stop the compute holders of the selected GPUs (TERM, grace, KILL).
    Kill {
        #[command(flatten)]
        sel: GpuSel,
        #[command(flatten)]
        kill: KillFlags,
    },
    /// Kill the holders, wait until the GPUs are free, report (exit 1 if not clean).
    Clean {
        #[command(flatten)]
        sel: GpuSel,
        /// Seconds to wait for the memory to be released.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
        #[command(flatten)]
        kill: KillFlags,
    },
    /// Shell completions.
    Completions { shell: clap_complete::Shell },
    /// The GPU simulator: start holders, leak memory, reset.
    #[command(subcommand)]
    Sim(SimCmd),
}

#[derive(Debug, Clone, ClapArgs)]
pub struct GpuSel {
    /// GPU index (repeatable); default all.
    #[arg(long = "gpu", value_name = "N")]
    pub gpus: Vec<i64>,
}

#[derive(Debug, Clone, ClapArgs)]
pub struct KillFlags {
    /// Signal to send first.
    #[arg(long, default_value = "TERM")]
    pub signal: String,
    /// Seconds before survivors get SIGKILL (0: no escalation).
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// Say what would be signalled, signal nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also stop protected GPU daemons.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Subcommand)]
pub enum SimCmd {
    /// Start real processes holding simulated GPU memory; prints their pids, one per line
    /// (the started process first, then the children it forked), once they hold.
    Hold {
        #[arg(long)]
        gpu: i64,
        #[arg(long, default_value_t = 0)]
        mib: i64,
        /// Process name (comm), e.g. nvidia-persistenced.
        #[arg(long)]
        name: Option<String>,
        /// Open the device node without mapping it (an NVML-only client).
        #[arg(long)]
        observer: bool,
        /// Ignore SIGTERM.
        #[arg(long)]
        ignore_term: bool,
        /// Fork a child that inherits the CUDA-like handles.
        #[arg(long)]
        fork_child: bool,
        /// Fork N workers that each hold MIB; the first process holds nothing.
        #[arg(long, default_value_t = 0)]
        workers: u32,
        /// Leave the process group (setsid), as vLLM workers do.
        #[arg(long)]
        setsid: bool,
        /// With --fork-child: the creator exits, only the child holds.
        #[arg(long, requires = "fork_child")]
        exit_creator: bool,
        /// Map every GPU's node and keep a 3 MiB footprint on the others, as a CUDA context
        /// does when it can see several GPUs.
        #[arg(long)]
        map_all: bool,
        #[arg(long, hide = true)]
        as_holder: bool,
    },
    /// Mark memory used with no holder at all (a stuck driver); only `sim reset` frees it.
    Leak {
        #[arg(long)]
        gpu: i64,
        #[arg(long)]
        mib: i64,
    },
    /// Reset a simulated GPU (fails while processes hold it, as on real GPUs).
    Reset {
        #[arg(long)]
        gpu: i64,
    },
    /// The release watcher (started by `sim hold` when release_ms is set).
    #[command(hide = true)]
    Watch { alloc: PathBuf },
}
