//! gpuloop: scriptable act-verify-retry loops for GPUs left dirty by crashed jobs.
//!
//! Rooms: `gpu` (backends: NVML, simulator, none), `process` (fd scan, identity, signals,
//! trees), `inspect` (holders, diagnose, wait_clean), `machine` (each operation written once, run
//! here or through a host's agent, and the fan-out over the host set), `script` (the Rhai engine and its bindings), `render` (tables for people),
//! `repl` (the interactive prompt), `mcp` (the server for AI assistants), `cli` (arguments,
//! commands, exit codes), `hosts` (the host set, transports and wire protocol for several
//! hosts), `agent` (this machine served to a remote gpuloop).

// stdout goes through `output`, which ends quietly on a closed pipe.
#![warn(clippy::print_stdout)]

pub mod agent;
pub mod cli;
pub mod config;
pub mod error;
pub mod gpu;
pub mod hosts;
pub mod input;
pub mod inspect;
pub mod interrupt;
pub mod journal;
pub mod local;
pub mod machine;
pub mod mcp;
pub mod memory;
pub mod output;
pub mod process;
pub mod render;
pub mod repl;
pub mod runner;
pub mod script;
pub mod seconds;
pub mod session;
pub mod slurm;
pub mod stack_guard;
pub mod timeline;
