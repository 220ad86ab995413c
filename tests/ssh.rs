//! A real OpenSSH server on 127.0.0.1 for the several-hosts tests: throw-away host and user
//! keys in a temp dir, `sshd -D -f CONFIG -p PORT` started once for the whole test binary
//! and stopped by pid at exit. Hosts are aliases in a client config generated per test,
//! each with its own simulator (`SetEnv GPULOOP_SIM… GPULOOP_SIM_DIR…`, `AcceptEnv` on the
//! server); the host key is pre-trusted in a known_hosts file of the temp dir, and host key
//! checking stays on (`StrictHostKeyChecking yes`).

use crate::support::{bin, Out, Sim};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct Sshd {
    pub dir: PathBuf,
    pub port: u16,
}

static SSHD: OnceLock<Sshd> = OnceLock::new();
static SSHD_PID: AtomicI32 = AtomicI32::new(0);
static SSHD_DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn stop_sshd() {
    let pid = SSHD_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // Our own child, by pid.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    if let Some(d) = SSHD_DIR.get() {
        let _ = std::fs::remove_dir_all(d);
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen (openssh-client; .ci/run installs it)");
    assert!(st.success(), "ssh-keygen failed");
}

/// The shared server, started on first use.
pub fn sshd() -> &'static Sshd {
    SSHD.get_or_init(start)
}

fn start() -> Sshd {
    let sshd = Path::new("/usr/sbin/sshd");
    assert!(
        sshd.exists(),
        "/usr/sbin/sshd is missing: install openssh-server (.ci/run does)"
    );
    let dir = tempfile::Builder::new()
        .prefix("gpuloop-sshd-")
        .tempdir()
        .expect("tempdir")
        .keep();
    let _ = SSHD_DIR.set(dir.clone());
    unsafe { libc::atexit(stop_sshd) };
    keygen(&dir.join("host_key"));
    keygen(&dir.join("id"));
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).expect("authorized_keys");
    let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).expect("host key");
    let host_pub: Vec<&str> = host_pub.split_whitespace().take(2).collect();
    std::fs::write(
        dir.join("known_hosts"),
        format!("gpuloop-test-sshd {}\n", host_pub.join(" ")),
    )
    .expect("known_hosts");
    let port = free_port();
    let d = dir.display();
    // MaxStartups/MaxSessions: the benchmark opens 64 connections at once.
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "ListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             PermitRootLogin prohibit-password\nUsePAM no\n\
             AcceptEnv GPULOOP_SIM GPULOOP_SIM_DIR XDG_CACHE_HOME XDG_STATE_HOME XDG_CONFIG_HOME BASH_ENV\n\
             MaxStartups 256\nMaxSessions 256\nPrintMotd no\nLogLevel ERROR\n"
        ),
    )
    .expect("sshd_config");
    if unsafe { libc::geteuid() } == 0 {
        // sshd's privilege separation directory (Debian creates it only when the service runs).
        let _ = std::fs::create_dir_all("/run/sshd");
    }
    // Started from a thread that lives as long as the test binary: PDEATHSIG then stops
    // sshd even if the binary is killed before its atexit runs.
    let (tx, rx) = std::sync::mpsc::channel();
    let (cfg, log) = (dir.join("sshd_config"), dir.join("sshd.log"));
    std::thread::spawn(move || {
        let mut c = Command::new("/usr/sbin/sshd");
        c.arg("-D")
            .arg("-f")
            .arg(&cfg)
            .arg("-p")
            .arg(port.to_string())
            .arg("-E")
            .arg(&log)
            .stdin(Stdio::null())
            // Not in the test binary's process group: other tests kill process groups of
            // the processes they start, and this server is not theirs.
            .process_group(0);
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        match c.spawn() {
            Ok(mut child) => {
                let _ = tx.send(Ok(child.id() as i32));
                let _ = child.wait();
            }
            Err(e) => {
                let _ = tx.send(Err(e.to_string()));
            }
        }
        loop {
            std::thread::park();
        }
    });
    let pid = rx.recv().expect("sshd thread").expect("start sshd");
    SSHD_PID.store(pid, Ordering::SeqCst);
    let end = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        let log = std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default();
        assert!(
            Instant::now() < end && crate::support::alive(pid),
            "sshd did not start listening on {port}: {log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Sshd { dir, port }
}

/// Host aliases of one test, each with its own simulator, in a client config of its own.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// XDG_RUNTIME_DIR of its gpuloop runs.
    run: tempfile::TempDir,
    pub sims: Vec<(String, Sim)>,
    pub config: PathBuf,
}

impl Cluster {
    /// `hosts`: (alias, simulator spec). `down` aliases point at a port nobody listens on.
    pub fn new(hosts: &[(&str, &str)], down: &[&str]) -> Cluster {
        let s = sshd();
        let dir = tempfile::Builder::new()
            .prefix("gpuloop-cluster-")
            .tempdir()
            .expect("tempdir");
        let d = s.dir.display();
        let mut cfg = String::new();
        let mut sims = Vec::new();
        let common = |port: u16| {
            format!(
                "  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d}/id\n  IdentitiesOnly yes\n  \
                 UserKnownHostsFile {d}/known_hosts\n  GlobalKnownHostsFile /dev/null\n  HostKeyAlias gpuloop-test-sshd\n  \
                 StrictHostKeyChecking yes\n  LogLevel ERROR\n",
                user = whoami()
            )
        };
        for (alias, spec) in hosts {
            let sim = Sim::new(spec);
            cfg.push_str(&format!(
                // The agent's journal and remembered restarters are the simulated host's
                // own, as the host's are on a real machine (never this user's home).
                "Host {alias}\n{}  SetEnv GPULOOP_SIM={spec} GPULOOP_SIM_DIR={} XDG_STATE_HOME={}\n",
                common(s.port),
                sim.path().join("state").display(),
                sim.path().join("state-home").display()
            ));
            sims.push((alias.to_string(), sim));
        }
        let closed = free_port();
        for alias in down {
            cfg.push_str(&format!("Host {alias}\n{}", common(closed)));
        }
        let config = dir.path().join("ssh_config");
        std::fs::write(&config, cfg).expect("ssh config");
        let run = tempfile::Builder::new()
            .prefix("glr-")
            .tempdir()
            .expect("tempdir");
        Cluster {
            dir,
            run,
            sims,
            config,
        }
    }

    /// The cluster's own XDG_RUNTIME_DIR (mode 0700, as a login's is), short as a login's
    /// is: a socket's path has at most 107 bytes.
    pub fn runtime_dir(&self) -> PathBuf {
        self.run.path().to_path_buf()
    }

    /// The directory gpuloop keeps this cluster's ssh connections in.
    pub fn kept_dir(&self) -> PathBuf {
        self.runtime_dir().join("gpuloop")
    }

    /// The sockets of the connections kept now.
    pub fn kept(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.kept_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    }

    /// `ssh -O OP` on each connection gpuloop keeps (check, exit): what the last one said.
    pub fn control(&self, alias: &str, op: &str) -> Out {
        let mut last = None;
        for socket in self.kept() {
            last = Some(self.control_at(alias, &socket, op));
        }
        last.unwrap_or(Out {
            code: 255,
            stdout: String::new(),
            stderr: "no kept connection".into(),
        })
    }

    /// `ssh -O OP` on one socket.
    pub fn control_at(&self, alias: &str, socket: &Path, op: &str) -> Out {
        let o = Command::new("ssh")
            .arg("-F")
            .arg(&self.config)
            .arg("-o")
            .arg(format!("ControlPath={}", socket.display()))
            .args(["-O", op, alias])
            .stdin(Stdio::null())
            .output()
            .expect("ssh -O");
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// More variables for `alias`'s SetEnv (`XDG_CACHE_HOME=…`; the server accepts those
    /// and BASH_ENV, which the login shell, bash, reads first).
    pub fn set_env(&self, alias: &str, vars: &str) {
        let text = std::fs::read_to_string(&self.config).expect("ssh config");
        let mut out = String::new();
        let mut inside = false;
        for l in text.lines() {
            if let Some(a) = l.strip_prefix("Host ") {
                inside = a == alias;
            }
            if inside && l.trim_start().starts_with("SetEnv ") {
                out.push_str(&format!("{l} {vars}\n"));
            } else {
                out.push_str(l);
                out.push('\n');
            }
        }
        std::fs::write(&self.config, out).expect("ssh config");
    }

    /// Adds lines to the client config.
    pub fn add_config(&self, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.config)
            .expect("ssh config");
        f.write_all(text.as_bytes()).expect("ssh config");
    }

    pub fn sim(&self, alias: &str) -> &Sim {
        &self.sims.iter().find(|(a, _)| a == alias).expect("alias").1
    }

    /// gpuloop on this cluster's client config (not in simulator mode itself).
    pub fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_with(&bin(), args)
    }

    /// `cmd` with another program started as the agent on the hosts.
    pub fn cmd_with(&self, remote_bin: &Path, args: &[&str]) -> Command {
        let mut c = self.bare_cmd();
        c.arg("--remote-bin").arg(remote_bin).args(args);
        c
    }

    /// gpuloop on this cluster's client config, without --remote-bin.
    pub fn bare_cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.arg("--ssh-config")
            .arg(&self.config)
            .env_remove("GPULOOP_SIM")
            .env_remove("GPULOOP_SIM_DIR")
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            // Connections kept between one-shots live here, and end with the cluster.
            .env("XDG_RUNTIME_DIR", self.runtime_dir())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            // Out of reach of other tests' process-group kills, as the server is.
            .process_group(0);
        c
    }

    pub fn run(&self, args: &[&str]) -> Out {
        let o = self.cmd(args).output().expect("run gpuloop");
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Writes a script into the test's directory and returns its path.
    pub fn script(&self, name: &str, src: &str) -> String {
        let p = self.dir.path().join(name);
        let mut f = std::fs::File::create(&p).expect("script");
        f.write_all(src.as_bytes()).expect("script");
        p.display().to_string()
    }
}

impl Drop for Cluster {
    /// Ends the ssh connections gpuloop kept to this cluster's hosts: nothing a test started
    /// outlives it.
    fn drop(&mut self) {
        let Ok(text) = std::fs::read_to_string(&self.config) else {
            return;
        };
        // Any alias reaches the test server; the socket names the master.
        let Some(alias) = text
            .lines()
            .filter_map(|l| l.strip_prefix("Host "))
            .find(|a| !a.contains('*'))
        else {
            return;
        };
        for socket in self.kept() {
            self.control_at(alias, &socket, "exit");
        }
    }
}

fn whoami() -> String {
    let o = Command::new("id").arg("-un").output().expect("id -un");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Pids of live processes whose command line contains `needle`.
pub fn pids_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && crate::support::alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// The agent serving `sim` (its environment names that simulator's directory).
pub fn agent_of(sim: &Sim) -> Vec<i32> {
    let want = format!("GPULOOP_SIM_DIR={}", sim.path().join("state").display());
    pids_with(" agent")
        .into_iter()
        .filter(|p| {
            let exe_ok = std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == bin());
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            exe_ok
                && String::from_utf8_lossy(&env)
                    .split('\0')
                    .any(|kv| kv == want)
        })
        .collect()
}

/// Waits (bounded) for a condition; false at the deadline.
pub fn within(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// A new user's report, round 7: `--host host:port` reached ssh whole ("Could not resolve
/// hostname"), though SPEC gives `host:port` as a destination. The port now goes to `ssh -p`,
/// ahead of the config's; records and selectors keep the destination as it was named.
#[test]
fn a_destination_with_a_port_reaches_that_port() {
    let c = Cluster::new(&[("pa", "2x8G")], &[]);
    let port = sshd().port;
    let dest = format!("pa:{port}");
    let out = c.run(&["--host", &dest, "--json", "gpus"]).ok();
    let gs = out.json();
    assert_eq!(gs.as_array().unwrap().len(), 2, "{gs}");
    assert_eq!(gs[0]["host"], dest.as_str(), "{gs}");
    let one = c
        .run(&["--host", &dest, "eval", &format!("gpu(\"{dest}:1\").index")])
        .ok();
    assert_eq!(one.stdout.trim(), "1");
    // The port given wins over the alias's own: a closed one is refused, and ssh says so.
    let closed = free_port();
    let out = c.run(&["--host", &format!("pa:{closed}"), "gpus"]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains(&format!("port {closed}")),
        "{}",
        out.stderr
    );
}
