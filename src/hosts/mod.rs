//! Several hosts: the host set (hostlists, hosts files), how each host is reached (the
//! transports), the wire protocol the agent and the client share, and the client that keeps
//! one agent per host open for a whole session.
//!
//! Async (tokio) stays inside this room: `Pool` offers a blocking API to `machine::Fleet`,
//! which does the fan-out, so the CLI and the bindings never branch on "remote".

pub(crate) mod client;
pub mod fold;
pub mod hostlist;
pub mod protocol;
pub(crate) mod push;
pub(crate) mod slurm;
pub(crate) mod transport;

pub use client::Pool;
pub use transport::Transport;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::local::{is_local, local, LOCAL};

/// What went wrong with the host set or one host. A host's error says `host NAME: ` and
/// then its detail; the detail is made on its own (`detail`), never cut out of the message.
#[derive(Debug, Clone)]
pub enum HostError {
    BadHostlist {
        expr: String,
        why: String,
    },
    HostsFile {
        path: PathBuf,
        why: String,
    },
    Connect {
        host: String,
        why: String,
    },
    /// `why` says what was run there, what it said, and what to do (the advice depends on
    /// whether `--remote-bin` was given).
    NoAgent {
        host: String,
        why: String,
    },
    Version {
        host: String,
        theirs: String,
        their_protocol: u32,
        ours: String,
        our_protocol: u32,
    },
    /// The host's own gpuloop speaks another protocol, and this transport can push this
    /// gpuloop there: the connection is made again with the pushed copy (never shown).
    PushNeeded {
        host: String,
        theirs: String,
        their_protocol: u32,
    },
    Lost {
        host: String,
        method: String,
        why: String,
    },
    Timeout {
        host: String,
        method: String,
        secs: f64,
    },
    /// The call failed there; `usage` when the agent called it a usage mistake (an unknown
    /// user or GPU there), which is exit 2 as it would be here.
    Remote {
        host: String,
        message: String,
        usage: bool,
    },
    Protocol {
        host: String,
        why: String,
    },
    /// `--hosts-from-slurm` got something Slurm does not know (exit 2).
    SlurmArg {
        arg: String,
        why: String,
    },
    /// Slurm could not answer `--hosts-from-slurm` (exit 1).
    Slurm {
        arg: String,
        why: String,
    },
    NoJob {
        hosts: String,
    },
    Unknown {
        host: String,
        known: String,
    },
    Interrupted,
}

impl std::error::Error for HostError {}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host() {
            Some(h) => write!(f, "host {h}: {}", self.detail()),
            None => f.write_str(&self.detail()),
        }
    }
}

impl HostError {
    /// The host this error is about, if any.
    pub fn host(&self) -> Option<&str> {
        match self {
            HostError::Connect { host, .. }
            | HostError::NoAgent { host, .. }
            | HostError::Version { host, .. }
            | HostError::PushNeeded { host, .. }
            | HostError::Lost { host, .. }
            | HostError::Timeout { host, .. }
            | HostError::Remote { host, .. }
            | HostError::Protocol { host, .. } => Some(host),
            HostError::BadHostlist { .. }
            | HostError::HostsFile { .. }
            | HostError::SlurmArg { .. }
            | HostError::Slurm { .. }
            | HostError::NoJob { .. }
            | HostError::Unknown { .. }
            | HostError::Interrupted => None,
        }
    }

    /// What went wrong, without the leading `host NAME: ` of the whole message.
    pub(crate) fn detail(&self) -> String {
        match self {
            HostError::BadHostlist { expr, why } => format!("bad host list {expr:?}: {why}"),
            HostError::HostsFile { path, why } => format!("hosts file {}: {why}", path.display()),
            HostError::Connect { why, .. } => format!("cannot connect: {why}"),
            HostError::NoAgent { why, .. } => why.clone(),
            HostError::Version {
                theirs,
                their_protocol,
                ours,
                our_protocol,
                ..
            } => format!("its gpuloop {theirs} speaks protocol {their_protocol}, this gpuloop {ours} speaks {our_protocol}: install the same version on both sides"),
            HostError::PushNeeded {
                theirs,
                their_protocol,
                ..
            } => format!(
                "its gpuloop {theirs} speaks protocol {their_protocol}, this gpuloop {} speaks {}: this one is pushed there instead",
                env!("CARGO_PKG_VERSION"),
                protocol::PROTOCOL
            ),
            HostError::Lost { method, why, .. } => {
                format!("connection lost during {method}: {why}")
            }
            HostError::Timeout { method, secs, .. } => format!(
                "{method} got no answer within {secs:.0}s (host hung or network down)"
            ),
            HostError::Remote { message, .. } => message.clone(),
            HostError::Protocol { why, .. } => {
                format!("the agent sent something unreadable: {why}")
            }
            HostError::SlurmArg { arg, why } | HostError::Slurm { arg, why } => {
                format!("--hosts-from-slurm {arg}: {why}")
            }
            HostError::NoJob { hosts } => format!("--transport srun steps into a Slurm job, and none is known for {hosts}: give --hosts-from-slurm JOBID, --jobid J, or run inside the job (SLURM_JOB_ID)"),
            HostError::Unknown { host, known } => {
                format!("no host {host:?} in the host set ({known})")
            }
            HostError::Interrupted => "interrupted".into(),
        }
    }

    /// What went wrong in a few words, alike for every host it happened to: a summary's
    /// detail, where hosts that failed the same way fold into one row.
    pub fn kind(&self) -> &'static str {
        match self {
            HostError::Connect { .. } => "cannot connect",
            HostError::NoAgent { .. } => "no gpuloop there",
            HostError::Version { .. } | HostError::PushNeeded { .. } => "another gpuloop version",
            HostError::Lost { .. } => "connection lost",
            HostError::Timeout { .. } => "no answer",
            HostError::Protocol { .. } => "unreadable agent",
            HostError::Interrupted => "interrupted",
            HostError::BadHostlist { .. }
            | HostError::HostsFile { .. }
            | HostError::Remote { .. }
            | HostError::SlurmArg { .. }
            | HostError::Slurm { .. }
            | HostError::NoJob { .. }
            | HostError::Unknown { .. } => "failed",
        }
    }

    /// A mistake in what was asked (exit 2), wherever it was found: here or on the host.
    pub(crate) fn is_usage(&self) -> bool {
        matches!(
            self,
            HostError::Remote { usage: true, .. }
                | HostError::Unknown { .. }
                | HostError::SlurmArg { .. }
                | HostError::BadHostlist { .. }
        )
    }

    /// The host could not be used at all (as opposed to a call that failed there).
    pub fn unreachable(&self) -> bool {
        matches!(
            self,
            HostError::Connect { .. }
                | HostError::NoAgent { .. }
                | HostError::Version { .. }
                | HostError::PushNeeded { .. }
                | HostError::Lost { .. }
                | HostError::Timeout { .. }
                | HostError::Protocol { .. }
        )
    }
}

/// This machine's host name (the kernel's, as `hostname` prints it).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Everything about reaching the hosts, as the command line gave it.
#[derive(Debug, Clone)]
pub struct HostsConfig {
    /// Destinations in order, `local` included as given.
    pub hosts: Vec<String>,
    pub transport: Transport,
    /// Parallel connection attempts (pdsh's -f).
    pub fanout: usize,
    /// Go on without hosts that cannot be reached, reporting them.
    pub skip_unreachable: bool,
    /// How long a connection may take to say hello.
    pub connect_timeout: Duration,
    /// How long a host may take to answer (`--host-timeout`): a call's deadline beyond the
    /// time it asks for itself, and how long a ping may go unanswered during a long call.
    pub call_timeout: Duration,
    /// A one-shot on a terminal: a progress line (`12/64 hosts answered`) while hosts are
    /// still coming, and each host that fails said as it fails.
    pub progress: bool,
}

pub(crate) const DEFAULT_FANOUT: usize = 32;
pub(crate) const DEFAULT_HOST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the host set comes from, as the command line gave it; they add up, in this order.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostSources<'a> {
    /// `--host` hostlist expressions.
    pub exprs: &'a [String],
    /// `--hosts-file` files.
    pub files: &'a [PathBuf],
    /// `--hosts-from-slurm` job ids and node lists.
    pub slurm: &'a [String],
}

impl HostSources<'_> {
    pub fn is_empty(&self) -> bool {
        self.exprs.is_empty() && self.files.is_empty() && self.slurm.is_empty()
    }
}

impl HostsConfig {
    /// Builds the host set from every source; each host once, in the order first named.
    /// With `--transport srun`, a host a job listed is reached through that job.
    pub(crate) fn from_args(
        src: HostSources,
        mut transport: Transport,
    ) -> Result<HostsConfig, HostError> {
        let mut set = hostlist::HostSet::default();
        let too_many = |why: String| HostError::BadHostlist {
            expr: "the host set".into(),
            why,
        };
        for e in src.exprs {
            set.add_expr(e)?;
        }
        for f in src.files {
            for name in read_hosts_file(f)? {
                set.add(name).map_err(too_many)?;
            }
        }
        for arg in src.slurm {
            let from = slurm::SlurmSource::parse(arg)?;
            let names = slurm::resolve(&from)?;
            if let (slurm::SlurmSource::Job(job), Transport::Srun(o)) = (&from, &mut transport) {
                for n in &names {
                    o.jobs.entry(n.clone()).or_insert_with(|| job.clone());
                }
            }
            for name in names {
                set.add(name).map_err(too_many)?;
            }
        }
        if set.is_empty() {
            return Err(too_many("names no host".into()));
        }
        let hosts = set.into_names();
        if let Transport::Srun(o) = &transport {
            let jobless: Vec<&str> = hosts
                .iter()
                .filter(|h| !is_local(h) && o.job_for(h).is_none())
                .map(String::as_str)
                .collect();
            if !jobless.is_empty() {
                return Err(HostError::NoJob {
                    hosts: jobless.join(", "),
                });
            }
        }
        Ok(HostsConfig {
            hosts,
            transport,
            fanout: DEFAULT_FANOUT,
            skip_unreachable: false,
            connect_timeout: Duration::from_secs(30),
            call_timeout: DEFAULT_HOST_TIMEOUT,
            progress: false,
        })
    }
}

/// One destination (or hostlist expression) per line; `#` starts a comment.
pub(crate) fn read_hosts_file(path: &Path) -> Result<Vec<String>, HostError> {
    let err = |why: String| HostError::HostsFile {
        path: path.to_path_buf(),
        why,
    };
    // As root only a file that passes the trust checks: its lines say where root connects.
    let bytes =
        crate::trust::named(path, crate::input::HOSTS_FILE).map_err(|e| err(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| err("not UTF-8 text".into()))?;
    let mut set = hostlist::HostSet::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        set.add_expr(line)
            .map_err(|e| err(format!("line {}: {e}", n + 1)))?;
    }
    if set.is_empty() {
        return Err(err("names no host".into()));
    }
    Ok(set.into_names())
}

/// A GPU selection over a host set: indices meant on every host, and `"dest:index"` ones;
/// and the MIG devices that narrow it (`N:GI:CI` on every host, or a MIG UUID on the one
/// host there is), read where the GPUs are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HostSel {
    /// `None` with no `at` entries: every GPU of every host.
    pub every: Option<Vec<i64>>,
    pub at: BTreeMap<String, Vec<i64>>,
    /// The MIG devices the selection is narrowed to, on the GPUs no other selector names.
    pub mig: Option<Vec<crate::gpu::mig::MigSel>>,
}

impl HostSel {
    pub(crate) fn all() -> HostSel {
        HostSel::default()
    }

    /// What to select on `host`: `Some(None)` every GPU, `Some(Some(ix))` those, `None` the
    /// host is not selected at all.
    pub(crate) fn on(&self, host: &str) -> Option<Option<Vec<i64>>> {
        if self.every.is_none() && self.at.is_empty() {
            return Some(None);
        }
        let mut ix: Vec<i64> = self.every.clone().unwrap_or_default();
        if let Some(more) = self.at.get(host) {
            for i in more {
                if !ix.contains(i) {
                    ix.push(*i);
                }
            }
        }
        (!ix.is_empty()).then_some(Some(ix))
    }

    /// Parses one selector string: `"dest:index"`; anything else is `None`. A host part of
    /// decimal numbers alone (`0:7`, `0:7:0`) is no host: that is a MIG device.
    pub(crate) fn parse_host_index(s: &str) -> Option<(String, i64)> {
        // A list is no one host's GPU (`0:7:0,0:8:0`).
        if s.contains(',') || crate::gpu::mig::MigSel::parse(s).is_some() {
            return None;
        }
        let (host, ix) = s.rsplit_once(':')?;
        let ix = ix.trim().parse().ok()?;
        (!host.is_empty()).then(|| (host.to_string(), ix))
    }

    /// `filter` with the selection's MIG devices: what each host narrows its holders, its
    /// diagnoses and its waits to.
    pub(crate) fn narrow(&self, filter: &crate::inspect::Filter) -> crate::inspect::Filter {
        let mut f = filter.clone();
        if self.mig.is_some() {
            f.mig.clone_from(&self.mig);
        }
        f
    }
}

impl From<&Option<Vec<i64>>> for HostSel {
    fn from(s: &Option<Vec<i64>>) -> HostSel {
        HostSel {
            every: s.clone(),
            ..HostSel::default()
        }
    }
}

impl From<Option<Vec<i64>>> for HostSel {
    fn from(s: Option<Vec<i64>>) -> HostSel {
        HostSel {
            every: s,
            ..HostSel::default()
        }
    }
}

impl From<&HostSel> for HostSel {
    fn from(s: &HostSel) -> HostSel {
        s.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's error is `host NAME: ` and its detail, made apart: the words are those the
    /// messages always had, and the detail is never cut out of the message.
    #[test]
    fn a_host_error_is_its_host_then_its_detail() {
        let h = || "gpu01".to_string();
        let cases = [
            (
                HostError::Connect {
                    host: h(),
                    why: "ssh: refused".into(),
                },
                "cannot connect: ssh: refused",
            ),
            (
                HostError::NoAgent {
                    host: h(),
                    why: "gpuloop: command not found".into(),
                },
                "gpuloop: command not found",
            ),
            (
                HostError::Version {
                    host: h(),
                    theirs: "0.9".into(),
                    their_protocol: 3,
                    ours: "1.0".into(),
                    our_protocol: 6,
                },
                "its gpuloop 0.9 speaks protocol 3, this gpuloop 1.0 speaks 6: install the same version on both sides",
            ),
            (
                HostError::Lost {
                    host: h(),
                    method: "kill".into(),
                    why: "eof".into(),
                },
                "connection lost during kill: eof",
            ),
            (
                HostError::Timeout {
                    host: h(),
                    method: "gpus".into(),
                    secs: 60.0,
                },
                "gpus got no answer within 60s (host hung or network down)",
            ),
            (
                HostError::Remote {
                    host: h(),
                    message: "no user \"x\" there".into(),
                    usage: true,
                },
                "no user \"x\" there",
            ),
            (
                HostError::Protocol {
                    host: h(),
                    why: "junk".into(),
                },
                "the agent sent something unreadable: junk",
            ),
        ];
        for (e, detail) in cases {
            assert_eq!(e.detail(), detail);
            assert_eq!(e.to_string(), format!("host gpu01: {detail}"));
        }
        let e = HostError::Unknown {
            host: "gpu9".into(),
            known: "gpu01".into(),
        };
        assert_eq!(e.to_string(), "no host \"gpu9\" in the host set (gpu01)");
        assert_eq!(e.detail(), e.to_string());
    }

    /// A host whose gpuloop speaks another protocol, where this one can be pushed, is a
    /// variant of its own: the retry with the pushed copy matches it, not a marker string.
    #[test]
    fn a_push_needed_is_its_own_error_and_unreachable_until_pushed() {
        let e = HostError::PushNeeded {
            host: "gpu01".into(),
            theirs: "0.9".into(),
            their_protocol: 3,
        };
        assert!(e.unreachable() && !e.is_usage());
        assert_eq!(e.kind(), "another gpuloop version");
        assert!(!e.to_string().contains("(push)"), "{e}");
    }

    #[test]
    fn hosts_files_take_comments_and_hostlists() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hosts");
        std::fs::write(&p, "# the cluster\ngpu[01-02]  # rack 1\n\nlogin1\n").unwrap();
        assert_eq!(read_hosts_file(&p).unwrap(), ["gpu01", "gpu02", "login1"]);
        std::fs::write(&p, "# nothing\n").unwrap();
        assert!(read_hosts_file(&p)
            .unwrap_err()
            .to_string()
            .contains("names no host"));
        std::fs::write(&p, "ok\nbad[1-\n").unwrap();
        assert!(read_hosts_file(&p)
            .unwrap_err()
            .to_string()
            .contains("line 2"));
    }

    #[test]
    fn selections_combine_every_host_and_one_host_indices() {
        let mut s = HostSel::from(Some(vec![0]));
        s.at.insert("b".into(), vec![3]);
        assert_eq!(s.on("a"), Some(Some(vec![0])));
        assert_eq!(s.on("b"), Some(Some(vec![0, 3])));
        let only_b = HostSel {
            every: None,
            at: [("b".to_string(), vec![1])].into(),
            mig: None,
        };
        assert_eq!(only_b.on("a"), None);
        assert_eq!(HostSel::all().on("a"), Some(None));
        assert_eq!(
            HostSel::parse_host_index("alice@gpu01:3"),
            Some(("alice@gpu01".into(), 3))
        );
        assert_eq!(HostSel::parse_host_index("GPU-abc"), None);
        // `N:GI` and `N:GI:CI` are MIG devices, never a host named "0".
        assert_eq!(HostSel::parse_host_index("0:7"), None);
        assert_eq!(HostSel::parse_host_index("0:7:0"), None);
    }
}
