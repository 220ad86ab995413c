//! One function per command, each in the file of its group; `dispatch` picks it. Each takes
//! the command as `hiargs` checked it and returns the exit code or an `Error`.

mod admin;
mod inspect;
mod kill;
mod report;
pub(crate) mod script;
pub(crate) mod sim;

use super::hiargs::{Command, HiArgs, KillTargets};
use super::Config;
use crate::error::Error;
use crate::exit::Exit;
use crate::inspect::Filter;
use crate::machine::Fleet;
use crate::session::Session;
use serde::Serialize;

pub(crate) fn dispatch(hi: &HiArgs) -> Result<Exit, Error> {
    let cfg = &hi.config;
    match &hi.command {
        Command::Run { script, args } => script::run(cfg, script, args),
        Command::Eval { code } => script::eval(cfg, code),
        Command::Check { scripts } => script::check(cfg, scripts),
        Command::Recipes(cmd) => script::recipes(cfg, cmd),
        Command::Repl => script::repl(cfg),
        Command::Doc { definitions } => script::doc(cfg, definitions.as_deref()),
        Command::Gpus { sel } => inspect::gpus(cfg, sel),
        Command::Top {
            sel,
            interval,
            once,
        } => inspect::top(cfg, sel, *interval, *once),
        Command::Holders { sel, owner, all } => inspect::holders(cfg, sel, owner, *all),
        Command::Diagnose { sel, owner, check } => inspect::diagnose(cfg, sel, owner, *check),
        Command::Wait { sel, owner, wait } => inspect::wait(cfg, sel, owner, wait),
        Command::Kill {
            targets: KillTargets::Holders { sel, owner },
            opts,
        } => kill::holders(cfg, sel, owner, opts),
        Command::Kill {
            targets: KillTargets::Pids(pids),
            opts,
        } => kill::pids(cfg, pids, opts),
        Command::Clean {
            sel,
            owner,
            wait,
            kill,
        } => kill::clean(cfg, sel, owner, wait, kill),
        Command::Reset { sel, opts } => kill::reset(cfg, sel, opts),
        Command::Hook { which, opts } => admin::hook(cfg, *which, opts),
        Command::Mcp { policy } => admin::mcp(cfg, policy),
        Command::Journal { last, filter } => admin::journal(cfg, *last, filter),
        Command::Agent => Ok(crate::agent::serve(cfg.session.clone())),
        Command::Completions { shell } => admin::completions(*shell),
        Command::Man { dir } => admin::man(dir.as_deref()),
        Command::Sim(cmd) => sim::run(cfg, cmd),
    }
}

/// The one-shots refuse to read GPUs without a driver, on this machine alone; with a host
/// set each host answers for its own driver.
fn require_local_driver(s: &Session) -> Result<(), Error> {
    if s.is_local() {
        s.require_driver()?;
    }
    Ok(())
}

/// `--user`, `--mine` and `--job` as checked here: the user goes to each host as given (a
/// name stays a name) and is looked up there; on this machine alone an unknown name is a
/// usage error at once.
fn check_owner(s: &Session, owner: &Filter) -> Result<(), Error> {
    Fleet::of(s)
        .check_filter(owner)
        .map_err(|e| Error::Usage(format!("--user: {e}")))
}

/// Prints JSON with --json, else the table. Keys come in one order everywhere, sorted by
/// name, as scripts' maps print under `eval --json`.
fn emit<T: Serialize>(cfg: &Config, v: &T, table: impl FnOnce() -> String) -> Result<Exit, Error> {
    if cfg.json {
        let sorted = serde_json::to_value(v).map_err(|e| Error::Other(e.to_string()))?;
        crate::outln!(
            "{}",
            crate::shown::json(&sorted, true).map_err(|e| Error::Other(e.to_string()))?
        );
    } else {
        crate::outln!("{}", table());
    }
    Ok(Exit::Success)
}
