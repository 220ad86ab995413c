//! `gpuloop sim …`: the GPU simulator's commands, and the holder and watcher processes it
//! starts (which run before anything else: `internal`).

use super::emit;
use super::kill::kill_done;
use crate::cli::args::{Args, Cmd, SimCmd};
use crate::cli::hiargs::SimCommand;
use crate::cli::Config;
use crate::error::Error;
use crate::exit::Exit;
use crate::gpu::sim::hold;
use crate::gpu::sim::SimBackend;
use crate::machine::ops::{HolderList, Holders};
use crate::machine::{Local, Machine};
use crate::process::kill::{KillOpts, Target};
use crate::render::{self, Style};
use std::time::Duration;

/// `gpuloop sim …`: the simulator's commands run for a person or a test.
pub(super) fn run(cfg: &Config, cmd: &SimCommand) -> Result<Exit, Error> {
    let sim = cfg.session.sim()?;
    match cmd {
        SimCommand::Hold(opts) => {
            let pids = hold::launch(&sim, opts)?;
            if cfg.json {
                crate::outln!("{}", serde_json::to_string(&pids).unwrap_or_default());
            } else {
                for p in pids {
                    crate::outln!("{p}");
                }
            }
            Ok(Exit::Success)
        }
        SimCommand::Leak { gpu, mib } => {
            let (gpu, mig) = sim.target(gpu)?;
            sim.leak(gpu, mig, *mib)?;
            Ok(Exit::Success)
        }
        SimCommand::Fault {
            gpu,
            inject,
            drm_modeset,
        } => {
            if let Some(on) = drm_modeset {
                sim.set_drm_modeset(*on)?;
            }
            if let Some(gpu) = gpu {
                sim.inject(*gpu, inject)?;
            }
            Ok(Exit::Success)
        }
        SimCommand::Reset { gpu } => {
            crate::gpu::Backend::reset(&sim, *gpu, &crate::process::helpers::output)?;
            Ok(Exit::Success)
        }
        SimCommand::Ls => {
            let hs = sim_holders(cfg)?;
            emit(cfg, &hs, || render::holders(&hs, Style::stdout()))
        }
        SimCommand::Stop => {
            let mut targets: Vec<Target> = Vec::new();
            for h in sim_holders(cfg)? {
                // A `--workers` launcher holds nothing itself: it is the holders' parent.
                let mut pid = h.pid as i32;
                while let Ok(p) = crate::process::read_stat(pid) {
                    if !is_sim_holder(&crate::process::cmdline(pid)) {
                        break;
                    }
                    let t = Target::Exact(p.identity());
                    if !targets.contains(&t) {
                        targets.push(t);
                    }
                    pid = p.ppid;
                }
            }
            let opts = KillOpts {
                signal: nix::sys::signal::Signal::SIGKILL,
                tree: false,
                // A simulated nvidia-persistenced is still the simulator's own.
                force: true,
                ..KillOpts::default()
            };
            // Stuck holders go only once released: thaw them after the KILL is pending.
            let mut report = Local::on_terminal(&cfg.session, |m| m.kill(&targets, &opts));
            if !report.stuck.is_empty() {
                crate::gpu::sim::stuck::release(&sim)?;
                let end = std::time::Instant::now() + Duration::from_secs(5);
                while report
                    .stuck
                    .iter()
                    .any(|s| crate::process::alive(s.pid as i32))
                    && std::time::Instant::now() < end
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let (gone, stuck) = report
                    .stuck
                    .drain(..)
                    .partition(|s| !crate::process::alive(s.pid as i32));
                report.stuck = stuck;
                report
                    .exited
                    .extend(gone.into_iter().map(|s: crate::process::kill::Stuck| s.pid));
            }
            kill_done(cfg, &report)
        }
        SimCommand::Release => {
            let n = crate::gpu::sim::stuck::release(&sim)?;
            crate::outln!(
                "released {}",
                crate::words::count(n, "stuck holder", "stuck holders")
            );
            Ok(Exit::Success)
        }
    }
}

/// Every process holding the simulator's device nodes that `gpuloop sim hold` started:
/// others that opened them (a test, a script) are not the simulator's to stop. Read on this
/// machine only, whatever the host set: the simulator is this machine's, and `sim stop` acts
/// on these pids here.
fn sim_holders(cfg: &Config) -> Result<Vec<crate::inspect::holders::Holder>, Error> {
    let list = HolderList(Holders {
        sel: None,
        all: true,
        filter: crate::inspect::Filter::default(),
    });
    let mut hs = Local::on_terminal(&cfg.session, |m| m.ask(&list))?;
    hs.retain(|h| is_sim_holder(&h.cmdline));
    Ok(hs)
}

fn is_sim_holder(cmdline: &str) -> bool {
    cmdline.contains(" sim hold ") && cmdline.contains("--as-holder")
}

/// The holder and watcher processes: single-threaded, no signal handlers, no config.
pub(crate) fn internal(args: &Args) -> Result<Exit, Error> {
    let spec = args.sim.as_deref().filter(|s| !s.trim().is_empty());
    let sim = SimBackend::open(&crate::gpu::sim::state_dir(), spec)?;
    match &args.cmd {
        Cmd::Sim(SimCmd::Watch { alloc }) => {
            crate::gpu::sim::watch(&sim, alloc, sim.spec.release_ms)?;
            Ok(Exit::Success)
        }
        // The holder: `sim hold`'s flags, checked as the command checks them.
        Cmd::Sim(cmd) => match SimCommand::new(cmd)? {
            SimCommand::Hold(opts) if opts.foreground => hold::run_foreground(&sim, &opts),
            SimCommand::Hold(opts) => hold::run_holder(&sim, &opts),
            _ => Ok(Exit::Usage),
        },
        _ => Ok(Exit::Usage),
    }
}
