//! The host name a record carries for this machine, "local", until a client of several hosts
//! names the host it came from. Every room may use it; it knows nothing of hosts itself.

/// The name that means this machine, reached without ssh.
pub const LOCAL: &str = "local";

/// A record's host until the client names it: this machine (serde's default for `host`).
pub fn local() -> String {
    LOCAL.into()
}
