//! gpuloop: scriptable act-verify-retry loops for GPUs left dirty by crashed jobs.
//!
//! Rooms (docs/ARCHITECTURE.md draws them): `gpu` (backends: NVML, simulator, none),
//! `process` (fd scan, identity, signals, trees), `inspect` (holders, diagnose, wait_clean),
//! `machine` (each operation written once, run here or through a host's agent, and the
//! fan-out over the host set), `script` (the Rhai engine and its bindings), `render` (tables
//! for people), `repl` (the interactive prompt), `mcp` (the server for AI assistants), `cli`
//! (arguments, commands, exit codes), `hosts` (the host set, transports and wire protocol),
//! `agent` (this machine served to a remote gpuloop).
//!
//! gpuloop is a program, not a library: the `pub` surface is what `src/main.rs`, the tests,
//! the benches and the fuzz targets reach, and everything else is `pub(crate)`
//! (`unreachable_pub` says so when an item is wider than it needs to be):
//! - `cli::main` and `cli::args` (the command line, for the man-page and help tests);
//! - `config::UserConfig` and `session::Session` (one invocation's world, for in-process
//!   benches);
//! - `gpu` (the `Backend` trait, `Gpu`, the simulator's `SimSpec`/`SimBackend`, the driver
//!   deadline) and `inspect` (`holders`, `diagnose`, `Filter`): the records and the join;
//! - `process` (`scan`, `kill`'s report types, `restart`, `Identity`) and `runner` (`patch`,
//!   `Outcome`);
//! - `hosts::protocol`, `hosts::hostlist` and `hosts::fold` (the wire and host lists, for the
//!   golden and fuzz targets and the host-set bench), `hosts::Pool` (its set-up, for that bench);
//! - `script` (`engine`, `doc`, `recipes`, `convert`, `display`) and `render`;
//! - `memory` (the counting allocator `main.rs` installs).

// stdout goes through `output`, which ends quietly on a closed pipe.
#![warn(clippy::print_stdout)]
// What is `pub` is the surface below; everything else is the crate's own.
#![warn(unreachable_pub)]

pub(crate) mod agent;
pub mod cli;
pub mod config;
pub(crate) mod error;
pub mod exit;
pub mod gpu;
pub mod hosts;
pub(crate) mod input;
pub mod inspect;
pub(crate) mod interrupt;
pub(crate) mod journal;
pub(crate) mod local;
pub(crate) mod machine;
pub(crate) mod mcp;
pub mod memory;
pub(crate) mod output;
pub(crate) mod pidfs;
pub mod process;
pub mod render;
pub(crate) mod repl;
pub mod runner;
pub mod script;
pub(crate) mod seconds;
pub mod session;
pub(crate) mod shown;
pub(crate) mod slurm;
pub(crate) mod stack_guard;
pub(crate) mod timeline;
pub(crate) mod trust;
pub(crate) mod utc;
pub(crate) mod words;
