//! The Rhai layer: one place builds the engine, thin bindings, module resolution, errors.

pub(crate) mod bindings;
pub(crate) mod calls;
pub mod convert;
pub mod display;
pub mod doc;
pub mod engine;
pub(crate) mod errors;
pub(crate) mod fields;
pub(crate) mod modules;
pub mod recipes;
mod record;

pub use engine::{build_engine, EngineOpts};
pub(crate) use errors::ScriptError;
