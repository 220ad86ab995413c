//! The host name a record carries for this machine, "local", until a client of several hosts
//! names the host it came from. Every room may use it; it knows nothing of hosts itself.

/// The name that means this machine, reached without ssh.
pub const LOCAL: &str = "local";

/// A record's host until the client names it: this machine (serde's default for `host`).
pub fn local() -> String {
    LOCAL.into()
}

/// Whether a host name (of a record, or of the host set) means this machine.
pub fn is_local(host: &str) -> bool {
    host == LOCAL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_default_host_is_this_machine_and_no_other_name_is() {
        assert!(is_local(&local()));
        assert!(!is_local("gpu01") && !is_local("Local") && !is_local(""));
    }
}
