//! The client side: one long-lived agent per host, opened in parallel (at most `fanout`
//! at a time), calls with ids and deadlines over its stdio, behind a blocking API.
//!
//! `pool.rs` is the session's set of connections and the blocking API over them; `conn.rs`
//! one open agent (its calls, and the tasks that read and write its pipes); `handshake.rs`
//! how an agent is started and greeted (and a pushed gpuloop sent); `progress.rs` the line a
//! one-shot shows on a terminal while the hosts come in.

mod conn;
mod handshake;
mod pool;
mod progress;

pub use pool::Pool;

use std::sync::Mutex;
use std::time::Duration;

/// How often a waiting call looks at the Ctrl-C flag.
const TICK: Duration = Duration::from_millis(50);
/// How long the session's end waits for agents to stop their jobs and exit.
const CLOSE_WAIT: Duration = Duration::from_secs(20);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
