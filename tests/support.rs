//! The harness: a private simulator per test, holders started through `gpuloop sim hold`,
//! and every process the test started killed (by pid, after checking it is ours) at the end.

#![allow(dead_code)]

use assert_cmd::Command;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub struct Sim {
    pub dir: tempfile::TempDir,
    pub spec: String,
    started: Mutex<Vec<i32>>,
    /// Other processes the test started: (pid, start time in ticks).
    adopted: Mutex<Vec<(i32, u64)>>,
}

/// The output of one gpuloop invocation.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(self) -> Out {
        assert_eq!(
            self.code, 0,
            "expected success:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }
    pub fn code(self, code: i32) -> Out {
        assert_eq!(
            self.code, code,
            "expected exit {code}:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

pub fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("gpuloop")
}

impl Sim {
    pub fn new(spec: &str) -> Sim {
        Sim {
            dir: tempfile::Builder::new()
                .prefix("gpuloop-test-")
                .tempdir()
                .expect("tempdir"),
            spec: spec.to_string(),
            started: Mutex::new(Vec::new()),
            adopted: Mutex::new(Vec::new()),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A gpuloop command on this simulator, with the user's config kept out.
    pub fn cmd(&self) -> Command {
        let mut c = Command::from_std(self.std_cmd());
        c.timeout(std::time::Duration::from_secs(120));
        c
    }

    /// The same, as a plain std Command (for processes the test keeps running).
    pub fn std_cmd(&self) -> std::process::Command {
        let mut c = std::process::Command::new(bin());
        c.env("GPULOOP_SIM_DIR", self.dir.path().join("state"))
            .env("GPULOOP_SIM", &self.spec)
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("XDG_STATE_HOME", self.dir.path().join("state-home"))
            .env("HOME", self.dir.path())
            .env("NO_COLOR", "1")
            // The machine's own /etc/gpuloop/recipes is no test's: each has a site directory
            // of its own (missing unless the test makes it).
            .env("GPULOOP_SITE_RECIPES", self.dir.path().join("site-recipes"))
            .env_remove("GPULOOP_NO_USER_RECIPES")
            .env_remove("GPULOOP_PATH");
        c
    }

    /// The test's own recipe directories: the user's (under its XDG_CONFIG_HOME) and the
    /// site's (GPULOOP_SITE_RECIPES).
    pub fn user_recipes(&self) -> PathBuf {
        self.dir.path().join("config/gpuloop/recipes")
    }

    pub fn site_recipes(&self) -> PathBuf {
        self.dir.path().join("site-recipes")
    }

    /// gpuloop started through another program (`unshare …`, `setpriv …`), with this
    /// simulator's environment.
    pub fn wrapped(&self, wrapper: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(wrapper[0]);
        c.args(&wrapper[1..]).arg(bin());
        for (k, v) in self.std_cmd().get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Out {
        self.run_with(args, |_| {})
    }

    pub fn run_with(&self, args: &[&str], f: impl FnOnce(&mut Command)) -> Out {
        let mut c = self.cmd();
        c.args(args);
        f(&mut c);
        let o = c.output().expect("run gpuloop");
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// `gpuloop eval CODE`, expected to succeed; its stdout trimmed.
    pub fn eval(&self, code: &str) -> String {
        self.run(&["eval", code]).ok().stdout.trim().to_string()
    }

    /// `gpuloop --json eval CODE`, parsed.
    pub fn eval_json(&self, code: &str) -> serde_json::Value {
        self.run(&["--json", "eval", code]).ok().json()
    }

    /// Runs a script given as text (written into the test's directory).
    pub fn script(&self, name: &str, src: &str, args: &[&str]) -> Out {
        let p = self.dir.path().join(name);
        std::fs::write(&p, src).unwrap();
        let mut a = vec!["run", p.to_str().unwrap()];
        if !args.is_empty() {
            a.push("--");
            a.extend(args);
        }
        self.run(&a)
    }

    /// `gpuloop sim hold ARGS`: the pids it prints, remembered for the final kill.
    pub fn hold(&self, args: &[&str]) -> Vec<i32> {
        self.hold_with(args, &[])
    }

    /// `gpuloop sim hold ARGS` with extra environment (which the holders inherit).
    pub fn hold_with(&self, args: &[&str], env: &[(&str, &str)]) -> Vec<i32> {
        let out = self
            .run_with(&[&["sim", "hold"], args].concat(), |c| {
                c.envs(env.iter().copied());
            })
            .ok();
        let pids: Vec<i32> = out
            .stdout
            .lines()
            .map(|l| l.trim().parse().expect("pid"))
            .collect();
        self.started.lock().unwrap().extend(&pids);
        pids
    }

    /// Remember a process this test started some other way, for the final kill (by pid and
    /// start time, so a pid reused since is never signalled).
    pub fn adopt(&self, pid: i32) {
        if let Some(start) = start_of(pid) {
            self.adopted.lock().unwrap().push((pid, start));
        }
    }

    pub fn gpus(&self) -> serde_json::Value {
        self.run(&["--json", "gpus"]).ok().json()
    }

    /// The simulated driver logs Xid `code` on `gpu`, naming `pid` (and `name`, else that
    /// process's comm) where given: `gpuloop sim fault --xid`.
    pub fn xid(&self, gpu: usize, code: i64, pid: Option<i32>, name: Option<&str>) {
        let (gpu, code) = (gpu.to_string(), code.to_string());
        let pid = pid.map(|p| p.to_string());
        let mut args = vec!["sim", "fault", "--gpu", &gpu, "--xid", &code];
        if let Some(pid) = &pid {
            args.extend(["--pid", pid]);
        }
        if let Some(name) = name {
            args.extend(["--name", name]);
        }
        self.run(&args).ok();
    }

    pub fn used_mib(&self, gpu: usize) -> i64 {
        self.gpus()[gpu]["mem_used_mib"].as_i64().unwrap()
    }
}

/// Starts `c` with its stdout a pipe, reads the pid it prints first (a `sim hold --foreground`
/// holder's), remembers that pid for the final kill, and reaps `c` when it ends.
pub fn started_pid(sim: &Sim, mut c: std::process::Command) -> i32 {
    use std::io::BufRead;
    c.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().expect("spawn");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("a pid");
    std::thread::spawn(move || child.wait());
    let pid = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    sim.adopt(pid);
    pid
}

/// `unshare … --fork CMD` started with its own stderr kept from the test's. When its child (the
/// namespace's init) dies of SIGKILL, util-linux's unshare before 2.40 resets that signal's
/// disposition before raising it on itself; SIGKILL's cannot be reset, so it prints
/// "unshare: sigprocmask unblock failed: Invalid argument" and exits 1 (util-linux issue 2614,
/// fixed in 2.40 by skipping the reset for SIGKILL). A test that SIGKILLs the init gets that
/// line here, never in the suite's log; anything else unshare says fails the test.
pub struct Unshare {
    child: std::process::Child,
}

impl Unshare {
    /// The line of unshare < 2.40 after its child died of SIGKILL (see above).
    const KILLED_CHILD: &'static str = "unshare: sigprocmask unblock failed: Invalid argument";

    pub fn spawn(mut c: std::process::Command) -> Unshare {
        let child = c
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("unshare");
        Unshare { child }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for unshare, and fails unless it said nothing but the line above.
    pub fn wait(mut self) {
        use std::io::Read;
        let _ = self.child.wait();
        let mut said = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut said);
        }
        let other: Vec<&str> = said.lines().filter(|l| *l != Self::KILLED_CHILD).collect();
        assert!(other.is_empty(), "unshare said: {said}");
    }
}

/// `unshare --pid --fork --mount-proc bash SCRIPT` with the simulator's environment: the script
/// is pid 1 of a PID namespace of its own, where writing `ns_last_pid` forces a pid's reuse.
pub fn in_new_pid_namespace(sim: &Sim, script: &Path) -> std::process::Command {
    // Nothing waits forever: past the deadline `timeout` ends unshare, and unshare's
    // --kill-child takes the namespace's init, and so everything in the namespace, with it.
    let mut c = std::process::Command::new("timeout");
    c.args([
        "300",
        "unshare",
        "--kill-child=KILL",
        "--pid",
        "--fork",
        "--mount-proc",
        "bash",
    ])
    .arg(script);
    for (k, v) in sim.std_cmd().get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

/// What a forced-reuse script printed: its output, and the `key=value` fields of its last
/// line (its tally).
pub struct Tally {
    /// The script exited 0.
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub last: String,
}

impl Tally {
    /// One word of the tally as written; its absence fails the test, with everything the
    /// script said.
    pub fn text(&self, k: &str) -> &str {
        self.last
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .unwrap_or_else(|| {
                panic!(
                    "no {k} in {:?}\n{}\n{}",
                    self.last, self.stdout, self.stderr
                )
            })
    }

    /// One number of the tally.
    pub fn field(&self, k: &str) -> i64 {
        let v = self.text(k);
        v.parse()
            .unwrap_or_else(|_| panic!("{k}={v} is no number\n{}\n{}", self.stdout, self.stderr))
    }
}

/// Writes `script` beside the simulator and runs it as pid 1 of a new PID namespace (where
/// `ns_last_pid` makes the next fork take a chosen pid), with gpuloop (`GPULOOP_BIN`), a
/// signal log (`GPULOOP_SIGNAL_LOG`), the scratch directory (`TMPD`) and `REUSE_N`/
/// `REUSE_ROUNDS` (how many pids a round reuses, how many rounds) in its environment.
pub fn forced_reuse(sim: &Sim, name: &str, script: &str, n: usize, rounds: usize) -> Tally {
    let tmp = sim.path().to_path_buf();
    std::fs::write(tmp.join(name), script).unwrap();
    let out = in_new_pid_namespace(sim, &tmp.join(name))
        .env("GPULOOP_BIN", bin())
        .env("GPULOOP_SIGNAL_LOG", tmp.join("signals.log"))
        .env("TMPD", &tmp)
        .env("REUSE_N", n.to_string())
        .env("REUSE_ROUNDS", rounds.to_string())
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stdout.lines().last().unwrap_or_default().to_string();
    // The figures of the run (tries, reuses, hits), for the record of what was tried.
    eprintln!("forced reuse {name}: {last}");
    Tally {
        ok: out.status.success(),
        stdout,
        stderr,
        last,
    }
}

/// Fails the calling test, saying what it needs, unless gpuloop's tests run as root here. A
/// test that calls it is `#[ignore]`d with that reason, so that elsewhere the test runner lists
/// it as ignored (never as passed); `bash .ci/run` runs it as root with `--include-ignored`.
pub fn require_root(what: &str) {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test needs root ({what}): run it as root, as bash .ci/run does"
    );
}

/// Fails the calling test unless it may make a PID namespace and set its next pid (root, or
/// a container that allows it); such a test is `#[ignore]`d with that reason (see
/// `require_root`).
pub fn require_pid_reuse() {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let can = *CAN.get_or_init(|| {
        std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "sh", "-c"])
            .arg("echo 100 > /proc/sys/kernel/ns_last_pid")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(
        can,
        "this test forces pid reuse in a private PID namespace (unshare --pid, ns_last_pid), which needs root: run it as root, as bash .ci/run does"
    );
}

/// The simulator's state (`dir` and everything below it), open to other users' holders.
pub fn open_to_everyone(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let mode = if e.path().is_dir() { 0o777 } else { 0o666 };
        std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        if e.path().is_dir() {
            open_to_everyone(&e.path());
        }
    }
}

/// True if the process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().chars().next()))
        .flatten()
        .is_some_and(|st| st != 'Z' && st != 'X')
}

/// The state letter of a process (`None` if it is gone).
pub fn state_of(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

/// The parent pid of a process (0 if it is gone).
pub fn ppid(pid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit(')').next()?.to_string();
            rest.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Waits (bounded) until the process is gone; a helper for processes signalled by the test.
pub fn gone_within(pid: i32, secs: u64) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    !alive(pid)
}

/// The start time (clock ticks) of a live process: with the pid, its identity.
pub fn start_of(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Waits (bounded) until the process `(pid, start)` is gone: a reused pid (pid_max may be
/// small and the machine busy) is not the process the test started.
pub fn identity_gone_within(pid: i32, start: Option<u64>, secs: u64) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let same = || alive(pid) && start_of(pid) == start;
    while std::time::Instant::now() < end {
        if !same() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    !same()
}

pub fn sigkill(pid: i32) {
    // Only our own processes: their command line names the simulator's holder. A defunct
    // leader's own command line is empty (its memory belongs to its live threads now), so
    // its threads' are read too.
    let names_sim = |path: String| {
        std::fs::read(path)
            .map(|c| String::from_utf8_lossy(&c).contains("sim"))
            .unwrap_or(false)
    };
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .map(|t| format!("{}/cmdline", t.path().display()))
                .collect()
        })
        .unwrap_or_default();
    let ours = names_sim(format!("/proc/{pid}/cmdline")) || threads.into_iter().any(names_sim);
    if ours {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        // Stuck holders (`sim hold --stuck`) ignore SIGKILL until released.
        if self.path().join("state/stuck.cgroup").exists() {
            let _ = self.std_cmd().args(["sim", "release"]).output();
        }
        let pids = self.started.lock().map(|p| p.clone()).unwrap_or_default();
        for &p in &pids {
            sigkill(p);
        }
        // Adopted processes need not be simulator holders (a `sleep`, an `unshare`): each is
        // killed only while it is still the process the test started.
        let adopted = self.adopted.lock().map(|p| p.clone()).unwrap_or_default();
        for &(p, start) in &adopted {
            if start_of(p) == Some(start) {
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
        for &p in pids.iter().chain(adopted.iter().map(|(p, _)| p)) {
            gone_within(p, 5);
        }
    }
}

/// Runs `c` (its program, arguments and environment) with a FUSE file system that never
/// answers mounted at `mnt`, as a hung NFS or FUSE server: every lookup under it waits. The
/// mount lives in a mount namespace of its own (tests/fuse/hung_mount.py), seen by nothing
/// else on the machine. SIGTERM goes to `c` after `term_after_s` seconds (0: never). Returns
/// what the helper saw: `rc`, `termed`, `hung` (still running 30 s later), `stdout`, `stderr`.
pub fn on_hung_mount(
    c: &std::process::Command,
    mnt: &Path,
    term_after_s: &str,
) -> serde_json::Value {
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuse/hung_mount.py");
    let mut u = std::process::Command::new("unshare");
    u.args(["--mount", "--propagation", "private", "python3"])
        .arg(&helper)
        .arg(mnt)
        .arg(term_after_s)
        .arg(c.get_program())
        .args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => u.env(k, v),
            None => u.env_remove(k),
        };
    }
    let out = u.output().expect("unshare and python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the helper's JSON line")
}
