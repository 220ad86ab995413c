//! The Rhai layer: one place builds the engine, thin bindings, module resolution, errors.

pub mod bindings;
pub mod convert;
pub mod display;
pub mod doc;
pub mod engine;
pub mod errors;
pub mod fields;
pub mod modules;
pub mod recipes;
mod record;

pub use engine::{build_engine, run_source, EngineOpts};
pub use errors::ScriptError;
