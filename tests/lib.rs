//! The integration suite: the real binary on the simulated backend, with real processes.
//! One test binary (as in just), modules by feature; `support` has the harness.

mod support;

mod churn;
mod cli;
mod containers;
mod controls;
mod daemons;
mod diagnose;
mod doc;
mod driver_faults;
mod edges;
mod faults;
mod frameworks;
mod golden;
mod holders;
mod hostile;
mod hosts;
mod identity;
mod inputs;
mod journal;
mod kill;
mod kubernetes;
mod layering;
mod mcp;
mod mig;
mod modules;
mod owner;
mod parents;
mod patch;
mod recipes;
mod render;
mod repl;
mod runner;
mod scripts;
mod select;
mod sim;
mod slurm;
mod ssh;
mod stale;
mod verdicts;
