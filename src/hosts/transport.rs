//! How a host is reached: in-process (`local`), or an agent started through OpenSSH or
//! through a Slurm step (`srun --overlap --jobid J -w NODE gpuloop agent`).
//!
//! A transport only says which command starts `gpuloop agent` for a destination and how to
//! read that command's failure; the client does the rest (stdio framing, hello, deadlines).
//! To add one, add a variant, its argv in `launch`, and its failure reading in `classify`.

use super::HostError;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub enum Transport {
    /// The system's OpenSSH client.
    Ssh(SshOpts),
    /// A step of a running Slurm job, where ssh to compute nodes is refused (pam_slurm_adopt).
    Srun(SrunOpts),
}

#[derive(Debug, Clone, Default)]
pub struct SrunOpts {
    /// The gpuloop to run there (`gpuloop`, found on the node's PATH, by default).
    pub remote_bin: String,
    /// `--remote-bin` was given: advice then names that path, not the PATH.
    pub bin_given: bool,
    /// The job each node is reached through: the job `--hosts-from-slurm JOBID` listed it in.
    pub jobs: BTreeMap<String, String>,
    /// The job for any other node (`--jobid`, else `SLURM_JOB_ID`).
    pub default_job: Option<String>,
}

impl SrunOpts {
    pub fn job_for(&self, node: &str) -> Option<&str> {
        self.jobs
            .get(node)
            .or(self.default_job.as_ref())
            .map(String::as_str)
    }
}

/// srun settings read from the environment that would turn the agent's stdio into something
/// else than one pipe each way: a pseudo-terminal (echo, CRLF), `0: ` labels, files.
const SRUN_IO_ENV: [&str; 5] = [
    "SLURM_UNBUFFEREDIO",
    "SLURM_LABELIO",
    "SLURM_STDINMODE",
    "SLURM_STDOUTMODE",
    "SLURM_STDERRMODE",
];

#[derive(Debug, Clone, Default)]
pub struct SshOpts {
    /// `-F FILE`.
    pub config: Option<PathBuf>,
    /// The gpuloop to run there (`gpuloop`, found on the remote PATH, by default).
    pub remote_bin: String,
    /// `--remote-bin` was given: advice then names that path, not the PATH.
    pub bin_given: bool,
    /// ssh's own ConnectTimeout, in seconds.
    pub connect_timeout_s: u64,
    /// Where connections are kept between runs (OpenSSH's ControlMaster sockets, a private
    /// directory); `None`: a new connection each run.
    pub reuse: Option<PathBuf>,
    /// A host without a usable gpuloop receives this one (`push`); not with `--no-push`,
    /// nor with `--remote-bin`, which names the one program to run there.
    pub push: bool,
}

/// How long a kept connection outlives the run that opened it (ssh's ControlPersist).
pub(crate) const PERSIST_S: u64 = 60;
/// ssh's own default TCP connect timeout without `--host-timeout`: pdsh's.
pub(crate) const CONNECT_TIMEOUT_S: u64 = 10;

/// A command that starts an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    /// Variables removed from the program's environment.
    pub env_remove: Vec<String>,
}

impl Transport {
    pub fn ssh(config: Option<PathBuf>, remote_bin: Option<String>) -> Transport {
        Transport::Ssh(SshOpts {
            config,
            bin_given: remote_bin.is_some(),
            remote_bin: remote_bin.unwrap_or_else(|| "gpuloop".into()),
            connect_timeout_s: CONNECT_TIMEOUT_S,
            reuse: None,
            push: false,
        })
    }

    pub fn srun(remote_bin: Option<String>, default_job: Option<String>) -> Transport {
        Transport::Srun(SrunOpts {
            bin_given: remote_bin.is_some(),
            remote_bin: remote_bin.unwrap_or_else(|| "gpuloop".into()),
            jobs: BTreeMap::new(),
            default_job,
        })
    }

    /// Whether a host without a usable gpuloop is sent this one.
    pub fn pushes(&self) -> bool {
        matches!(self, Transport::Ssh(o) if o.push)
    }

    /// What the transport's process gets when gpuloop dies without closing it (SIGKILL):
    /// ssh is killed, and its host's sshd then closes the agent's stdin, which ends the
    /// agent; srun is asked to end its step (SIGTERM: srun passes it on to the agent, which
    /// stops its jobs and exits), since a killed srun would leave the step's agent to Slurm.
    pub fn death_signal(&self) -> rustix::process::Signal {
        match self {
            Transport::Ssh(_) => rustix::process::Signal::KILL,
            Transport::Srun(_) => rustix::process::Signal::TERM,
        }
    }

    /// The program that reaches the hosts, for messages ("ssh said: …").
    pub fn program(&self) -> &'static str {
        match self {
            Transport::Ssh(_) => "ssh",
            Transport::Srun(_) => "srun",
        }
    }

    /// The command that starts `gpuloop agent` on `dest`. `mux`: through a connection kept
    /// in the reuse directory (only where the user's ssh config keeps none of its own).
    /// `skip_path`: where gpuloop is pushed, the one on the PATH is not to be used (it speaks
    /// another protocol).
    pub fn launch(&self, dest: &str, mux: bool, skip_path: bool) -> Result<Launch, HostError> {
        Ok(match self {
            Transport::Ssh(o) => {
                // BatchMode: never prompt (there is no one to answer); host key checking is
                // left to the user's config.
                let mut args = vec![
                    "-o".to_string(),
                    "BatchMode=yes".into(),
                    "-o".into(),
                    format!("ConnectTimeout={}", o.connect_timeout_s),
                    "-T".into(),
                ];
                if let (true, Some(dir)) = (mux, &o.reuse) {
                    // The first run's ssh becomes the master and stays PERSIST_S after its
                    // last session; later runs' ssh become its clients (no handshake). The
                    // keepalives end a master whose host went away, so it cannot hold later
                    // runs for long (each is bounded by its hello timeout anyway).
                    for opt in [
                        "ControlMaster=auto".to_string(),
                        format!("ControlPersist={PERSIST_S}"),
                        format!(
                            "ControlPath={}",
                            control_path(dir, dest, o.config.as_deref()).display()
                        ),
                        "ServerAliveInterval=5".into(),
                        "ServerAliveCountMax=2".into(),
                    ] {
                        args.push("-o".into());
                        args.push(opt);
                    }
                }
                args.extend(o.destination(dest));
                if o.push {
                    // The remote command: find or receive a gpuloop, then run its agent.
                    args.pop();
                    args.push(super::push::script(skip_path));
                }
                Launch {
                    program: "ssh".into(),
                    args,
                    env_remove: Vec::new(),
                }
            }
            Transport::Srun(o) => {
                let job = o.job_for(dest).ok_or_else(|| HostError::NoJob {
                    hosts: dest.to_string(),
                })?;
                // One task on that one node, in the job's allocation, beside its running
                // steps (--overlap shares CPUs, memory and GRES with them, so it never waits
                // for them: 22.05's meaning). stdin goes to the one task, its stdout comes
                // back through a pipe: line-delimited JSON both ways; the agent flushes each
                // line. EOF on srun's stdin reaches the agent, which exits, ending the step.
                // No --unbuffered (it means a pty), no --quiet (srun's warnings are what a
                // failed connection quotes). --mpi=none: no PMI set-up for a step that is no
                // MPI program. Without --overlap, beside a step holding every CPU of the
                // job, srun waits silently (seen on 22.05): the connection then times out.
                let args = [
                    "--jobid",
                    job,
                    "--nodelist",
                    dest,
                    "--nodes=1",
                    "--ntasks=1",
                    "--overlap",
                    "--mpi=none",
                    "--job-name=gpuloop-agent",
                    "--",
                    // srun execs it directly, no shell: a path with spaces is one word.
                    &o.remote_bin,
                    "agent",
                ];
                Launch {
                    program: "srun".into(),
                    args: args.iter().map(|a| a.to_string()).collect(),
                    env_remove: SRUN_IO_ENV.iter().map(|v| v.to_string()).collect(),
                }
            }
        })
    }

    /// The socket a connection to `dest` is kept at; `None` where connections are not kept.
    pub fn kept_socket(&self, dest: &str) -> Option<PathBuf> {
        let Transport::Ssh(o) = self else { return None };
        let dir = o.reuse.as_ref()?;
        Some(control_path(dir, dest, o.config.as_deref()))
    }

    /// `ssh -G`: the user's effective config for `dest`, read before reusing a connection
    /// (their own ControlPath wins). `None` where connections are not reused.
    pub fn show_config(&self, dest: &str) -> Option<Launch> {
        let Transport::Ssh(o) = self else { return None };
        o.reuse.as_ref()?;
        let mut args = vec!["-G".to_string()];
        args.extend(o.destination(dest));
        args.pop();
        Some(Launch {
            program: "ssh".into(),
            args,
            env_remove: Vec::new(),
        })
    }

    /// The command line that runs gpuloop against `dest` the way this transport reaches it
    /// (`gpuloop --host gpu02`, with `--ssh-config`, `--transport srun --jobid J`,
    /// `--remote-bin` as they were given): what advice built on that host tells a person
    /// to run where this gpuloop runs.
    pub fn gpuloop_for(&self, dest: &str) -> String {
        let mut words = vec!["gpuloop".to_string()];
        let remote_bin = match self {
            Transport::Ssh(o) => {
                if let Some(f) = &o.config {
                    words.push("--ssh-config".into());
                    words.push(shell_quote(&f.display().to_string()));
                }
                &o.remote_bin
            }
            Transport::Srun(o) => {
                words.push("--transport srun".into());
                if let Some(job) = o.job_for(dest) {
                    words.push(format!("--jobid {}", shell_quote(job)));
                }
                &o.remote_bin
            }
        };
        if remote_bin != "gpuloop" {
            words.push(format!("--remote-bin {}", shell_quote(remote_bin)));
        }
        words.push(format!("--host {}", shell_quote(dest)));
        words.join(" ")
    }

    /// Reads why the command ended before the agent said hello: its exit code and stderr.
    pub fn classify(&self, dest: &str, code: Option<i32>, stderr: &str) -> HostError {
        let program = self.program();
        let said = stderr.trim();
        let said = if said.is_empty() {
            match code {
                Some(c) => format!("{program} exited with code {c} and said nothing"),
                None => format!("{program} was killed by a signal"),
            }
        } else {
            said.lines()
                .rev()
                .take(4)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" / ")
        };
        match self {
            Transport::Ssh(o) => {
                // 127: the remote shell found no such command; 126: found, not executable.
                let missing = matches!(code, Some(126 | 127))
                    || said.contains("command not found")
                    || said.contains("No such file or directory") && code != Some(255);
                if missing {
                    HostError::NoAgent {
                        host: dest.to_string(),
                        why: no_agent(&o.remote_bin, o.bin_given, &format!("ssh said: {said}")),
                    }
                } else {
                    HostError::Connect {
                        host: dest.to_string(),
                        why: format!("ssh said: {said}"),
                    }
                }
            }
            Transport::Srun(o) => {
                let host = dest.to_string();
                let job = o.job_for(dest).unwrap_or("?");
                // slurmstepd could not start the agent: "execve(): PATH: No such file or
                // directory" (exit 2) or "…: Permission denied" (exit 13).
                if said.contains("execve()") {
                    return HostError::NoAgent {
                        host,
                        why: no_agent(&o.remote_bin, o.bin_given, &format!("srun said: {said}")),
                    };
                }
                let what = if said.contains("Invalid job id") {
                    format!("Slurm job {job} does not exist")
                } else if said.contains("has expired")
                    || said.contains("already completing or completed")
                {
                    format!("Slurm job {job} has ended")
                } else if said.contains("pending execution") {
                    format!("Slurm job {job} is not running yet")
                } else if said.contains("Requested node configuration is not available")
                    || said.contains("Invalid node name")
                {
                    format!("{dest} is not a node of Slurm job {job}")
                } else if said.contains("Unable to create step") {
                    format!("Slurm refused a step in job {job}")
                } else {
                    format!("no step in Slurm job {job}")
                };
                HostError::Connect {
                    host,
                    why: format!("{what}; srun said: {said}"),
                }
            }
        }
    }
}

/// Why no agent started, and what to do: with `--remote-bin` given, that path is what did
/// not run (a PATH or another --remote-bin is no answer to that).
fn no_agent(bin: &str, given: bool, said: &str) -> String {
    if given {
        format!(
            "gpuloop is not installed there at --remote-bin {} ({said}); give the path of a gpuloop on that host",
            shell_quote(bin)
        )
    } else {
        format!(
            "gpuloop is not installed there or not on its PATH ({said}); install it there or give --remote-bin PATH"
        )
    }
}

impl SshOpts {
    /// `[-F FILE] [-p PORT] -- HOST COMMAND`: the words after ssh's own options.
    fn destination(&self, dest: &str) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(f) = &self.config {
            args.push("-F".into());
            args.push(f.display().to_string());
        }
        let (host, port) = split_port(dest);
        if let Some(port) = port {
            args.push("-p".into());
            args.push(port.to_string());
        }
        args.push("--".into());
        args.push(host);
        // One word for the remote shell: a path with spaces stays one path.
        args.push(format!("{} agent", shell_quote(&self.remote_bin)));
        args
    }
}

/// The socket of a kept connection: a hash of the destination as named and the config file,
/// short enough for a socket's path (ssh adds 17 bytes to it while it binds). Known without
/// asking ssh, so a later run that finds it uses it without reading the config again. One
/// per alias: a master carries the options of the alias that opened it (OpenSSH's clients do
/// not pass their SetEnv through it), so two aliases of one server get a master each.
fn control_path(dir: &std::path::Path, dest: &str, config: Option<&std::path::Path>) -> PathBuf {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(dest.as_bytes());
    h.update([0]);
    if let Some(c) = config {
        h.update(c.as_os_str().as_encoded_bytes());
    }
    let tag: String = h.finalize()[..10]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.join(tag)
}

/// Whether `ssh -G`'s output sets a ControlPath (unset, it prints none at all).
pub(crate) fn sets_control_path(shown: &str) -> bool {
    shown.lines().any(|l| {
        let mut w = l.split_whitespace();
        w.next()
            .is_some_and(|k| k.eq_ignore_ascii_case("controlpath"))
            && w.next().is_some_and(|v| v != "none")
    })
}

/// Why a directory is not safe to keep a user's sockets or files in: the directory, and
/// what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.said())]
pub(crate) struct UnsafeDir {
    pub path: PathBuf,
    pub fault: DirFault,
}

#[derive(Debug)]
pub(crate) enum DirFault {
    /// It could not be read (or, missing, created).
    Unreadable(std::io::Error),
    CannotCreate(std::io::Error),
    Link,
    /// Another user's (not root's either).
    Owner {
        uid: u32,
        want: u32,
    },
    /// Others may write to it, and it is no root-owned sticky directory.
    Writable {
        mode: u32,
    },
    /// The directory itself: not a directory of this user closed to others.
    NotPrivate,
}

impl UnsafeDir {
    fn said(&self) -> String {
        let p = self.path.display();
        match &self.fault {
            DirFault::Unreadable(e) => format!("{p}: {e}"),
            DirFault::CannotCreate(e) => format!("cannot create {p}: {e}"),
            DirFault::Link => format!("{p}: it is a symbolic link"),
            DirFault::Owner { uid, want } => {
                format!("{p}: it belongs to uid {uid}, not to uid {want} or root")
            }
            DirFault::Writable { mode } => format!("{p}: others may write to it (mode {mode:o})"),
            DirFault::NotPrivate => {
                format!("{p} is not a directory of this user closed to others (mode 0700)")
            }
        }
    }
}

/// The private directory kept connections live in: `$XDG_RUNTIME_DIR/gpuloop`, else
/// `/tmp/gpuloop-ssh-UID`; created with mode 0700, and used only if it is a directory (not a
/// link) of this user that no one else may enter; otherwise why not.
pub(crate) fn reuse_dir() -> Result<PathBuf, UnsafeDir> {
    let uid = rustix::process::geteuid().as_raw();
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("gpuloop"),
        None => PathBuf::from(format!("/tmp/gpuloop-ssh-{uid}")),
    };
    private_dir(dir, uid)
}

/// Whether `dir` and every directory above it, up to `/`, is safe to keep something of
/// `uid`'s under, as sudo and ssh judge it: no link, owned by `uid` or root, writable by no
/// one else (a root-owned sticky directory such as /tmp excepted: others cannot rename or
/// remove what is in it). The same rule as the pushed copy's cache (`push::script`).
pub(crate) fn safe_path(dir: &std::path::Path, uid: u32) -> Result<(), UnsafeDir> {
    use std::os::unix::fs::MetadataExt;
    for p in dir.ancestors() {
        let at = |fault| UnsafeDir {
            path: p.to_path_buf(),
            fault,
        };
        let m = std::fs::symlink_metadata(p).map_err(|e| at(DirFault::Unreadable(e)))?;
        let fault = if m.file_type().is_symlink() {
            Some(DirFault::Link)
        } else if m.uid() != uid && m.uid() != 0 {
            Some(DirFault::Owner {
                uid: m.uid(),
                want: uid,
            })
        } else if m.mode() & 0o022 != 0 && !(m.uid() == 0 && m.mode() & 0o1000 != 0) {
            Some(DirFault::Writable {
                mode: m.mode() & 0o7777,
            })
        } else {
            None
        };
        if let Some(fault) = fault {
            return Err(at(fault));
        }
    }
    Ok(())
}

/// `dir`, created 0700 if missing, if it is a directory (not a link) of `uid` that no one
/// else may enter, under directories that are safe (`safe_path`).
fn private_dir(dir: PathBuf, uid: u32) -> Result<PathBuf, UnsafeDir> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Some(parent) = dir.parent() {
        safe_path(parent, uid)?;
    }
    let at = |fault| UnsafeDir {
        path: dir.clone(),
        fault,
    };
    if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(at(DirFault::CannotCreate(e)));
        }
    }
    let m = std::fs::symlink_metadata(&dir).map_err(|e| at(DirFault::Unreadable(e)))?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(at(DirFault::NotPrivate));
    }
    Ok(dir)
}

/// Quotes a word for a POSIX shell unless it needs none.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `host:port`, `user@host:port` or `[v6addr]:port` into the destination and port ssh takes
/// apart: OpenSSH reads a port only from `-p` or an `ssh://` URI, and `host:port` given whole
/// is a host name it cannot resolve. Anything else (an alias, an `ssh://` URI, a bare IPv6
/// address) is passed on as it is.
fn split_port(dest: &str) -> (String, Option<&str>) {
    let whole = (dest.to_string(), None);
    let Some((host, port)) = dest.rsplit_once(':') else {
        return whole;
    };
    let numeric = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    if !numeric || dest.starts_with("ssh://") {
        return whole;
    }
    let (user, name) = match host.rsplit_once('@') {
        Some((u, n)) => (Some(u), n),
        None => (None, host),
    };
    let name = match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        Some(v6) => v6,
        // A bare IPv6 address: its last group is not a port.
        None if name.contains(':') || name.is_empty() => return whole,
        None => name,
    };
    let dest = match user {
        Some(u) => format!("{u}@{name}"),
        None => name.to_string(),
    };
    (dest, Some(port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kept connections' sockets live in a directory only this user may enter: one that is
    /// open to others, a link, or another user's is refused (someone could plant the
    /// ControlPath there); a missing one is made 0700.
    #[test]
    fn the_kept_connections_directory_is_this_users_and_closed_or_refused() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        let made = private_dir(t.path().join("new"), uid).unwrap();
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);

        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_dir(open.clone(), uid).unwrap_err();
        assert!(
            matches!(e.fault, DirFault::NotPrivate) && e.path == open,
            "{e}"
        );
        assert!(e.to_string().contains("closed to others"), "{e}");

        let link = t.path().join("link");
        std::os::unix::fs::symlink(&made, &link).unwrap();
        assert!(private_dir(link, uid).is_err());

        // Another user's: the same directory judged for a uid that does not own it.
        assert!(private_dir(made, uid + 1).is_err());

        // Its parent is judged too. One anyone may write to (not a
        // root-owned sticky one) lets another account replace the socket directory itself.
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(shared.join("gpuloop"), uid).unwrap_err();
        assert!(matches!(e.fault, DirFault::Writable { mode: 0o777 }), "{e}");
        assert!(
            e.to_string().contains("others may write to it (mode 777)"),
            "{e}"
        );
        assert!(
            !shared.join("gpuloop").exists(),
            "made under an unsafe parent"
        );
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let sticky = private_dir(shared.join("gpuloop"), uid);
        assert_eq!(sticky.is_ok(), uid == 0, "{sticky:?}");
        let linked = t.path().join("linked");
        std::os::unix::fs::symlink(t.path().join("new"), &linked).unwrap();
        let e = private_dir(linked.join("sub"), uid).unwrap_err();
        assert!(matches!(e.fault, DirFault::Link) && e.path == linked, "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }

    /// `--host localhost:22` once reached ssh whole ("Could not resolve hostname
    /// localhost:22"), though docs/cluster.md gives `host:port` as a destination.
    #[test]
    fn host_port_becomes_ssh_dash_p() {
        let t = Transport::ssh(None, None);
        let line = |d: &str| t.launch(d, false, false).unwrap().args.join(" ");
        assert!(
            line("gpu01:2222").contains("-p 2222 -- gpu01 "),
            "{}",
            line("gpu01:2222")
        );
        assert!(line("alice@gpu01:22").contains("-p 22 -- alice@gpu01 "));
        assert!(line("[::1]:2222").contains("-p 2222 -- ::1 "));
        for same in [
            "gpu01",
            "ssh://gpu01:22",
            "::1",
            "fe80::1",
            "gpu01:",
            "alias:x",
        ] {
            assert!(
                line(same).contains(&format!("-- {same} ")),
                "{same}: {}",
                line(same)
            );
            assert!(!line(same).contains("-p "), "{same}");
        }
    }

    /// A user's report: ssh's connect timeout was 15 s where pdsh's is 10 s.
    #[test]
    fn ssh_connect_timeout_is_pdshs_unless_host_timeout_says() {
        let line = Transport::ssh(None, None)
            .launch("gpu01", false, false)
            .unwrap()
            .args
            .join(" ");
        assert!(line.contains("-o ConnectTimeout=10 "), "{line}");
    }

    #[test]
    fn a_kept_connection_is_one_per_alias_in_the_private_dir() {
        let mut t = Transport::ssh(Some("/etc/cfg".into()), None);
        if let Transport::Ssh(o) = &mut t {
            o.reuse = Some("/run/user/7/gpuloop".into());
        }
        let line = |d: &str, mux| t.launch(d, mux, false).unwrap().args.join(" ");
        let a = line("gpu01", true);
        assert!(
            a.contains(
                "-o ControlMaster=auto -o ControlPersist=60 -o ControlPath=/run/user/7/gpuloop/"
            ),
            "{a}"
        );
        assert!(a.contains("ServerAliveInterval="), "{a}");
        let sock = t.kept_socket("gpu01").unwrap();
        assert!(
            a.contains(&format!("ControlPath={} ", sock.display())),
            "{a}"
        );
        // Two aliases of one server: a master each (SetEnv and the like are the master's).
        assert_ne!(a, line("gpu01b", true).replace("gpu01b", "gpu01"));
        assert_eq!(a, line("gpu01", true));
        // The user's ControlPath wins: no options of ours at all.
        assert!(!line("gpu01", false).contains("Control"));
        assert!(sets_control_path("user root\ncontrolpath /tmp/x-%C\n"));
        assert!(!sets_control_path("user root\ncontrolmaster false\n"));
        assert!(!sets_control_path("controlpath none\n"));
    }

    #[test]
    fn missing_agent_advice_depends_on_whether_remote_bin_was_given() {
        let e = Transport::ssh(None, Some("/opt/gpuloop".into())).classify(
            "gpu01",
            Some(127),
            "bash: line 1: /opt/gpuloop: No such file or directory\n",
        );
        let e = e.to_string();
        assert!(e.contains("at --remote-bin /opt/gpuloop"), "{e}");
        assert!(!e.contains("PATH"), "{e}");
        let e = Transport::ssh(None, None)
            .classify("gpu01", Some(127), "bash: gpuloop: command not found\n")
            .to_string();
        assert!(
            e.contains("not on its PATH") && e.contains("give --remote-bin PATH"),
            "{e}"
        );
    }

    #[test]
    fn pushing_replaces_the_remote_command_with_the_script() {
        let mut t = Transport::ssh(None, None);
        if let Transport::Ssh(o) = &mut t {
            o.push = true;
        }
        let l = t.launch("gpu01", false, false).unwrap();
        let cmd = l.args.last().unwrap();
        assert!(cmd.starts_with("sh -c 'command -v gpuloop "), "{cmd}");
        let l = t.launch("gpu01", false, true).unwrap();
        assert!(!l.args.last().unwrap().contains("command -v"));
    }

    #[test]
    fn advice_names_the_host_and_how_it_is_reached() {
        assert_eq!(
            Transport::ssh(None, None).gpuloop_for("gpu02"),
            "gpuloop --host gpu02"
        );
        assert_eq!(
            Transport::ssh(Some("/etc/my ssh".into()), Some("/opt/gpuloop".into()))
                .gpuloop_for("alice@gpu02"),
            "gpuloop --ssh-config '/etc/my ssh' --remote-bin /opt/gpuloop --host alice@gpu02"
        );
        assert_eq!(
            Transport::srun(None, Some("812".into())).gpuloop_for("gpu02"),
            "gpuloop --transport srun --jobid 812 --host gpu02"
        );
    }

    #[test]
    fn ssh_never_prompts_and_keeps_host_key_checking() {
        let t = Transport::ssh(Some("/tmp/cfg".into()), Some("/opt/my gpuloop".into()));
        let l = t.launch("alice@gpu01", false, false).unwrap();
        assert_eq!(l.program, "ssh");
        let line = l.args.join(" ");
        assert!(line.starts_with("-o BatchMode=yes"), "{line}");
        assert!(
            line.contains("-F /tmp/cfg -- alice@gpu01 '/opt/my gpuloop' agent"),
            "{line}"
        );
        assert!(!line.contains("StrictHostKeyChecking"), "{line}");
    }

    #[test]
    fn failures_before_hello_are_named_and_quote_ssh() {
        let t = Transport::ssh(None, None);
        let e = t.classify(
            "gpu01",
            Some(127),
            "bash: line 1: gpuloop: command not found\n",
        );
        assert!(matches!(e, HostError::NoAgent { .. }), "{e}");
        assert!(e.to_string().contains("command not found"), "{e}");
        let e = t.classify(
            "gpu02",
            Some(255),
            "ssh: connect to host gpu02 port 22: Connection refused\n",
        );
        assert_eq!(
            e.to_string(),
            "host gpu02: cannot connect: ssh said: ssh: connect to host gpu02 port 22: Connection refused"
        );
    }

    #[test]
    fn srun_steps_into_the_nodes_job_beside_its_steps() {
        let mut t = Transport::srun(Some("/opt/my gpuloop".into()), Some("900".into()));
        if let Transport::Srun(o) = &mut t {
            o.jobs.insert("gpu01".into(), "812_3".into());
        }
        let l = t.launch("gpu01", false, false).unwrap();
        assert_eq!(l.program, "srun");
        assert_eq!(
            l.args.join(" "),
            "--jobid 812_3 --nodelist gpu01 --nodes=1 --ntasks=1 --overlap --mpi=none \
             --job-name=gpuloop-agent -- /opt/my gpuloop agent"
        );
        assert_eq!(l.args[l.args.len() - 2], "/opt/my gpuloop");
        assert!(l.env_remove.iter().any(|v| v == "SLURM_UNBUFFEREDIO"));
        assert!(t
            .launch("gpu02", false, false)
            .unwrap()
            .args
            .join(" ")
            .starts_with("--jobid 900 "));
        let jobless = Transport::srun(None, None);
        assert!(matches!(
            jobless.launch("gpu02", false, false),
            Err(HostError::NoJob { .. })
        ));
    }

    /// What srun 22.05 prints in each case, as measured against a real Slurm.
    #[test]
    fn srun_failures_are_named() {
        let t = Transport::srun(None, Some("812".into()));
        let cases = [
            (
                Some(1),
                "srun: error: Unable to confirm allocation for job 812: Invalid job id specified\n\
                 srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 812\n",
                "host gpu01: cannot connect: Slurm job 812 does not exist; srun said: srun: error: Unable",
            ),
            (
                Some(1),
                "srun: error: Slurm job 812 has expired\n",
                "Slurm job 812 has ended;",
            ),
            (
                Some(1),
                "srun: error: Unable to confirm allocation for job 812: Job is pending execution\n",
                "Slurm job 812 is not running yet;",
            ),
            (
                Some(1),
                "srun: error: Unable to create step for job 812: Requested node configuration is not available\n",
                "gpu01 is not a node of Slurm job 812;",
            ),
            (
                Some(1),
                "srun: error: Unable to create step for job 812: Memory required by task is not available\n",
                "Slurm refused a step in job 812;",
            ),
            (None, "", "no step in Slurm job 812; srun said: srun was killed by a signal"),
        ];
        for (code, stderr, want) in cases {
            let e = t.classify("gpu01", code, stderr);
            assert!(matches!(e, HostError::Connect { .. }), "{e}");
            assert!(e.to_string().contains(want), "{e}\nwanted: {want}");
        }
        let e = t.classify(
            "gpu01",
            Some(2),
            "slurmstepd-gpu01: error: execve(): gpuloop: No such file or directory\n\
             srun: error: gpu01: task 0: Exited with exit code 2\n",
        );
        assert!(matches!(e, HostError::NoAgent { .. }), "{e}");
        assert!(e.to_string().contains("give --remote-bin PATH"), "{e}");
    }
}
