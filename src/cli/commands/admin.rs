//! The commands around the GPU work: the Slurm hooks, the MCP server, the audit journal,
//! and what documents gpuloop (completions, man pages).

use crate::cli::args::Args;
use crate::cli::Config;
use crate::error::Error;
use crate::exit::Exit;
use crate::mcp::policy::Policy;
use crate::slurm::{Hook, HookOpts, JobEnv};
use std::path::Path;

/// `gpuloop epilog` / `gpuloop prolog`.
pub(super) fn hook(cfg: &Config, which: Hook, opts: &HookOpts) -> Result<Exit, Error> {
    let env = JobEnv::from(|k| std::env::var(k).ok())?;
    Ok(crate::slurm::run(&cfg.session, which, &env, opts)?)
}

/// `gpuloop mcp`: the tools served over stdio, as far as the policy allows.
pub(super) fn mcp(cfg: &Config, policy: &Policy) -> Result<Exit, Error> {
    crate::mcp::serve(cfg.session.clone(), policy.clone()).map_err(|e| Error::Other(e.to_string()))
}

/// `gpuloop journal`: the records are streamed (with `--json`, as a JSON array written as it
/// is read), so a journal of any size is shown in bounded memory.
pub(super) fn journal(
    cfg: &Config,
    last: usize,
    filter: &crate::journal::Filter,
) -> Result<Exit, Error> {
    use crate::journal;
    if !cfg.session.is_local() {
        return journal_of_hosts(cfg, last, filter);
    }
    let err = |e: journal::JournalError| Error::Other(e.to_string());
    let dir = journal::dir().map_err(err)?;
    let mut first = true;
    let found = journal::last(&dir, filter, last, &mut |r| {
        if cfg.json {
            let sep = if first { "[\n  " } else { ",\n  " };
            crate::output::text(&format!(
                "{sep}{}",
                crate::shown::json(&r, false).unwrap_or_default()
            ));
        } else {
            crate::outln!("{}", journal::line(&r));
        }
        first = false;
    })
    .map_err(err)?;
    if cfg.json {
        crate::outln!("{}", if first { "[]" } else { "\n]" });
    }
    let path = dir.join(journal::FILE);
    if found.bad > 0 {
        crate::errln!(
            "gpuloop: warning: {} of {} {} not journal records",
            crate::words::count(found.bad, "line", "lines"),
            path.display(),
            crate::words::pick(found.bad, "is", "are")
        );
    }
    if found.matched == 0 && !cfg.json {
        crate::errln!("nothing journaled that matches ({})", path.display());
    }
    Ok(Exit::Success)
}

/// `gpuloop man`: the page of gpuloop itself on stdout, or with `dir` every command's page
/// (gpuloop.1, gpuloop-clean.1, gpuloop-sim-hold.1, …) written there, each with all its options.
pub(super) fn man(dir: Option<&Path>) -> Result<Exit, Error> {
    let cmd = <Args as clap::CommandFactory>::command();
    let Some(dir) = dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut out)
            .map_err(|e| Error::Other(format!("man page: {e}")))?;
        crate::output::bytes(&out);
        return Ok(Exit::Success);
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Other(format!("writing man pages into {}: {e}", dir.display())))?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    write_pages(&cmd, dir)?;
    crate::outln!("wrote the man pages into {}", dir.display());
    Ok(Exit::Success)
}

/// Writes the page of `cmd` and of each of its commands (as `clap_mangen::generate_to` names
/// them) into `dir`, each as every file gpuloop writes is (`journal::files::replace`): never
/// through another account's link, never into a FIFO.
fn write_pages(cmd: &clap::Command, dir: &Path) -> Result<(), Error> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render(&mut page)
        .map_err(|e| Error::Other(format!("man page: {e}")))?;
    crate::journal::files::replace(&dir.join(man.get_filename()), &page)
        .map_err(|e| Error::Other(format!("writing man pages: {e}")))
}

/// `gpuloop completions SHELL`.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<Exit, Error> {
    let mut cmd = <Args as clap::CommandFactory>::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gpuloop", &mut out);
    crate::output::bytes(&out);
    Ok(Exit::Success)
}

/// `gpuloop --host … journal`: each host's latest records that match, in host order, and a
/// row for each host that could not answer.
fn journal_of_hosts(
    cfg: &Config,
    last: usize,
    filter: &crate::journal::Filter,
) -> Result<Exit, Error> {
    use crate::machine::{ops::Journal, Fleet};
    let op = |_| Journal {
        last,
        filter: filter.clone(),
    };
    let parts = Fleet::of(&cfg.session).each(&crate::hosts::HostSel::all(), op)?;
    let (parts, mut rows) = super::report::per_host(cfg, parts)?;
    let mut records = Vec::new();
    for (h, part) in parts {
        if part.bad > 0 {
            crate::errln!(
                "gpuloop: warning: {h}: {} of {} {} not journal records",
                crate::words::count(part.bad, "line", "lines"),
                part.path,
                crate::words::pick(part.bad, "is", "are")
            );
        }
        let n = part.records.len();
        rows.push(super::report::row(
            &h,
            crate::render::HostState::Ok,
            crate::words::count(n, "record", "records"),
        ));
        records.extend(part.records);
    }
    super::report::emit_hosts(cfg, &records, &rows, || {
        let lines: Vec<String> = records.iter().map(crate::journal::line).collect();
        lines.join("\n")
    })?;
    super::report::summary(cfg, rows, true)
}
