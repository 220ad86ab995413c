//! A GPU daemon's name is a claim; only who runs the process and who installed its program
//! prove it (`process::daemon`). Another user's process named as a daemon neither blocks a
//! reset, nor hides from a clean, nor gets its file run as root when a reset starts the
//! daemons it stopped again; a real daemon (root's, or a system account's running the
//! daemon's own root-installed program) stays protected. Needs root: the other users'
//! processes are made with setpriv.

use crate::support::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const NOBODY: u32 = 65534;
/// `daemon`, a system account on every Linux distribution.
const SYSTEM: u32 = 1;

fn root() {
    require_root("to start processes of other users");
}

/// A simulator whose nodes other users may open.
fn shared_sim(spec: &str) -> Sim {
    let sim = Sim::new(spec);
    sim.gpus();
    open_to_everyone(sim.path());
    sim
}

/// `sim hold --foreground ARGS` run as `uid` through the program `exe` (gpuloop, or a link to
/// it), with `argv0` as its argv[0]: returns its pid, remembered for the final kill.
fn hold_as(sim: &Sim, uid: u32, exe: &Path, argv0: &str, args: &[&str]) -> i32 {
    let mut c = std::process::Command::new("setpriv");
    c.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        "bash",
        "-c",
        r#"exec -a "$0" "$@""#,
        argv0,
    ])
    .arg(exe)
    .args(["sim", "hold", "--foreground"])
    .args(args);
    for (k, v) in sim.std_cmd().get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    started_pid(sim, c)
}

/// A file that leaves `marker` behind if anything runs it, at `path`, owned by `nobody` as an
/// attacker's file would be.
fn trap(path: &Path, marker: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        path,
        format!("#!/bin/sh\necho \"$(id -u)\" > '{}'\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
}

fn blocker(report: &Value, pid: i32) -> Value {
    report[0]["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("{pid} not among the blockers: {report}"))
}

fn holder(sim: &Sim, pid: i32) -> Value {
    let hs = sim.run(&["--json", "holders", "--all"]).ok().json();
    hs.as_array()
        .unwrap()
        .iter()
        .find(|h| h["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("{pid} not among the holders: {hs}"))
}

/// `reset` started the "daemons" it stopped again from their own /proc/PID/cmdline: a user
/// whose process's argv[0] was a file of theirs named `nvidia-cuda-mps` (no --force needed:
/// that name was a daemon's kind but not protected) or `nvidia-persistenced` (with --force)
/// had root run it. Now neither is a daemon (another user's, not root's program), both are
/// stopped as the observers they are, no restart is attempted, and the files never run.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn a_reset_never_runs_a_file_another_user_named_after_a_daemon() {
    root();
    let sim = shared_sim("1x8G");
    sim.run(&["sim", "leak", "--gpu", "0", "--mib", "9"]).ok();
    let evil = sim.path().join("evil");
    let mut pids = Vec::new();
    let mut markers = Vec::new();
    for name in ["nvidia-cuda-mps", "nvidia-persistenced"] {
        let (file, marker) = (evil.join(name), sim.path().join(format!("ran-{name}")));
        trap(&file, &marker);
        markers.push(marker);
        let argv0 = file.to_str().unwrap();
        pids.push(hold_as(
            &sim,
            NOBODY,
            &bin(),
            argv0,
            &["--observer", "--gpu", "0"],
        ));
    }
    let out = sim.run(&["--json", "reset", "--gpu", "0", "--force", "--grace", "1"]);
    let r = out.json();
    let steps = r[0]["steps"].as_array().unwrap();
    let started: Vec<&Value> = steps.iter().filter(|s| s["action"] == "restart").collect();
    // What a restart started has had its time: it is gone (the trap exits at once).
    for s in &started {
        let detail = s["detail"].as_str().unwrap_or_default();
        if let Some(pid) = detail
            .strip_prefix("pid ")
            .and_then(|d| d.split(':').next())
        {
            gone_within(pid.parse().unwrap_or(0), 10);
        }
    }
    for m in &markers {
        assert!(
            !m.exists(),
            "{} ran, as uid {}: {r}",
            m.display(),
            std::fs::read_to_string(m).unwrap_or_default().trim()
        );
    }
    assert!(started.is_empty(), "something was started again: {r}");
    for &pid in &pids {
        let b = blocker(&r, pid);
        assert_eq!(b["kind"], "observer", "{b}");
        assert_eq!(b["protected"], false, "{b}");
        assert!(gone_within(pid, 10), "{r}");
    }
    assert_eq!(
        (r[0]["reset"].clone(), out.code),
        (Value::Bool(true), 0),
        "{r}"
    );
}

/// Another user's process named as a GPU daemon: a reset without --force refused to stop
/// anything for it (anyone could block every reset with a name), and clean left a compute
/// holder so named alone and counted its memory as a daemon's, so `clean` read clean with
/// the memory still held. Now it is the observer or compute holder it is: the reset stops it
/// and goes on, clean stops it and frees the memory. A real daemon (root's, running a root
/// program) is still protected: clean leaves it, and a reset without --force refuses.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn another_users_process_named_as_a_daemon_neither_blocks_a_reset_nor_hides_from_clean() {
    root();
    let sim = shared_sim("3x8G");
    let name = ["--name", "nvidia-cuda-mps-server"];
    let hider = hold_as(
        &sim,
        NOBODY,
        &bin(),
        "python3",
        &[&["--gpu", "0", "--mib", "64"][..], &name].concat(),
    );
    let blocker_pid = hold_as(
        &sim,
        NOBODY,
        &bin(),
        "nvidia-persistenced",
        &["--gpu", "1", "--observer", "--name", "nvidia-persistenced"],
    );
    assert_eq!(holder(&sim, hider)["role"], "compute");
    assert_eq!(holder(&sim, blocker_pid)["protected"], false);
    let out = sim.run(&[
        "--json",
        "clean",
        "--gpu",
        "0",
        "--grace",
        "1",
        "--timeout",
        "10",
    ]);
    assert!(gone_within(hider, 10), "{}", out.stdout);
    assert_eq!(sim.used_mib(0), 0, "{}", out.stdout);
    assert_eq!(out.code, 0, "{}", out.stdout);
    sim.run(&["sim", "leak", "--gpu", "1", "--mib", "9"]).ok();
    let out = sim.run(&["--json", "reset", "--gpu", "1", "--grace", "1"]);
    let r = out.json();
    assert_eq!(out.code, 0, "{r}");
    assert_eq!(blocker(&r, blocker_pid)["kind"], "observer", "{r}");
    assert!(gone_within(blocker_pid, 10), "{r}");
    assert_eq!(sim.used_mib(1), 0);
    // A real one: root's, running root's program (the MPS server of the node's MPS).
    let real = sim.hold(&[
        "--gpu",
        "2",
        "--mib",
        "32",
        "--name",
        "nvidia-cuda-mps-server",
    ]);
    let server = *real.last().unwrap();
    let h = holder(&sim, server);
    assert_eq!(
        (h["role"].clone(), h["protected"].clone()),
        ("daemon".into(), true.into()),
        "{h}"
    );
    let out = sim.run(&[
        "--json",
        "clean",
        "--gpu",
        "2",
        "--grace",
        "1",
        "--timeout",
        "2",
    ]);
    assert!(alive(server), "{}", out.stdout);
    let r = sim.run(&["--json", "reset", "--gpu", "2"]).code(1).json();
    assert_eq!(r[0]["steps"][0]["action"], "refuse", "{r}");
    assert!(alive(server), "{r}");
}

/// The real nvidia-persistenced runs as its own system account, from a root-installed file
/// of that name: that is proof. The same account running gpuloop under the name, or nobody
/// running the very same file, is not: a system account can run any root program under any
/// argv[0], and nobody is nobody.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn a_system_account_proves_a_daemons_name_only_with_the_daemons_own_program() {
    root();
    let sim = shared_sim("1x8G");
    // Installed as root installs a program: root's file, in root's directory, named as the
    // daemon (a link to gpuloop, which then plays the daemon).
    let bin_dir: PathBuf = sim.path().join("sbin");
    std::fs::create_dir(&bin_dir).unwrap();
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let installed = bin_dir.join("nvidia-persistenced");
    std::fs::hard_link(bin(), &installed).unwrap();
    let argv0 = installed.to_str().unwrap();
    let observe = ["--observer", "--gpu", "0"];
    let real = hold_as(&sim, SYSTEM, &installed, argv0, &observe);
    let borrowed = hold_as(
        &sim,
        SYSTEM,
        &bin(),
        "nvidia-persistenced",
        &["--observer", "--gpu", "0", "--name", "nvidia-persistenced"],
    );
    let nobodys = hold_as(&sim, NOBODY, &installed, argv0, &observe);
    for (pid, protected) in [(real, true), (borrowed, false), (nobodys, false)] {
        let h = holder(&sim, pid);
        assert_eq!(h["protected"], protected, "{pid}: {h}");
        assert_eq!(
            h["role"],
            if protected { "daemon" } else { "observer" },
            "{h}"
        );
    }
    // kill() itself refuses the real one, and only it, unless forced.
    let r = sim.eval_json(&format!(
        "kill([{real}, {borrowed}, {nobodys}], #{{grace: 1}})"
    ));
    let mut signalled: Vec<i64> = r["signalled"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    signalled.sort();
    let mut want = vec![i64::from(borrowed), i64::from(nobodys)];
    want.sort();
    assert_eq!(signalled, want, "{r}");
    assert!(alive(real), "{r}");
    assert!(gone_within(borrowed, 10) && gone_within(nobodys, 10), "{r}");
}

/// Runs as pid 1 of a new PID namespace. Each round starts N processes of nobody's named
/// `nvidia-persistenced` with GPU 0's node open, has gpuloop judge them (each is listed, and
/// not protected: nobody's), kills them, and makes each pid's next fork a root process under
/// that name running root's `sleep` (what rule 1 proves). Then `kill()` of those bare pids:
/// every one must be refused as protected (the proof is read through the process pinned for
/// the signal, never from the look before), the signal log empty. The control: a nobody's
/// process at a reused pid is signalled.
const REUSE: &str = r#"
set -u
B="$GPULOOP_BIN"; N="$REUSE_N"; ROUNDS="$REUSE_ROUNDS"; LOG="$GPULOOP_SIGNAL_LOG"
AS_NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"
listed=0; unprotected=0; reused=0; refused=0; hit=0; tried=0
gone() { while [ -e /proc/$1 ]; do sleep 0.005; done; }
fake() {
  $AS_NOBODY bash -c 'exec -a nvidia-persistenced "$0" sim hold --foreground --observer --gpu 0 --name nvidia-persistenced' "$B" > "$TMPD/fake.$1" &
}
for r in $(seq "$ROUNDS"); do
  fakes=()
  for i in $(seq "$N"); do fake "$i"; fakes+=($!); done
  for i in $(seq "$N"); do until [ -s "$TMPD/fake.$i" ]; do sleep 0.005; done; done
  "$B" --json holders --all > "$TMPD/h.json" || { echo "holders failed"; exit 3; }
  for p in "${fakes[@]}"; do
    j=$("$B" eval "to_json(parse_json(read_file(\"$TMPD/h.json\")).filter(|h| h.pid == $p).map(|h| h[\"protected\"]))")
    [ "$j" = "[false]" ] && unprotected=$((unprotected+1))
    [ "$j" != "[]" ] && listed=$((listed+1))
  done
  for p in "${fakes[@]}"; do kill -9 "$p"; done
  for p in "${fakes[@]}"; do wait "$p" 2>/dev/null; gone "$p"; done
  daemons=()
  for p in "${fakes[@]}"; do
    echo $((p-1)) > /proc/sys/kernel/ns_last_pid
    bash -c 'exec -a nvidia-persistenced sleep 1000' & s=$!
    daemons+=("$s"); tried=$((tried+1))
    [ "$s" = "$p" ] && reused=$((reused+1))
  done
  "$B" eval "to_json(kill([$(IFS=,; echo "${daemons[*]}")], #{grace: 5}))" > "$TMPD/report.json" 2>&1 || { echo "kill failed"; cat "$TMPD/report.json"; exit 3; }
  refused=$((refused + $(grep -o "is a GPU daemon" "$TMPD/report.json" | wc -l)))
  for s in "${daemons[@]}"; do
    st=$(awk '{print $3}' /proc/$s/stat 2>/dev/null || echo gone)
    case "$st" in S|R) ;; *) hit=$((hit+1));; esac
  done
  kill -9 "${daemons[@]}"; wait "${daemons[@]}" 2>/dev/null
  rm -f "$TMPD"/fake.*
done
lines=$(wc -l < "$LOG" 2>/dev/null || echo 0)
# The control: nobody's process under the name, at a reused pid, is no daemon: signalled.
$AS_NOBODY bash -c 'exec -a nvidia-persistenced sleep 1000' & c=$!
"$B" eval "kill($c, #{grace: 5})" > /dev/null
wait "$c" 2>/dev/null; cstatus=$?
clines=$(grep -c "^$c " "$LOG" 2>/dev/null || echo 0)
echo "listed=$listed unprotected=$unprotected tried=$tried reused=$reused refused=$refused hit=$hit logged=$lines control_logged=$clines control_status=$cstatus"
"#;

#[test]
#[ignore = "needs root for a private PID namespace and other users' processes: bash .ci/run runs it as root (--include-ignored)"]
fn a_daemons_proof_is_read_from_the_process_signalled_under_forced_reuse() {
    root();
    require_pid_reuse();
    let sim = shared_sim("1x8G");
    let (n, rounds) = (5, 6);
    let t = forced_reuse(&sim, "reuse.sh", REUSE, n, rounds);
    assert!(t.ok, "{}\n{}", t.stdout, t.stderr);
    let (field, last) = (|k: &str| t.field(k), &t.last);
    let total = (n * rounds) as i64;
    assert_eq!(field("listed"), total, "{last}");
    assert_eq!(
        field("unprotected"),
        total,
        "nobody's were judged daemons: {last}"
    );
    assert_eq!(field("tried"), total, "{last}");
    assert_eq!(field("reused"), total, "every pid was reused: {last}");
    assert_eq!(field("refused"), total, "each daemon was refused: {last}");
    assert_eq!(
        field("hit"),
        0,
        "a daemon that reused a pid was signalled: {last}"
    );
    assert_eq!(field("logged"), 0, "signals were sent: {last}");
    assert_eq!(field("control_logged"), 1, "{last}");
    assert_eq!(field("control_status"), 128 + 15, "{last}");
}
