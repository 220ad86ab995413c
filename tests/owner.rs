//! `--user U` and `--mine` bound every process a kill signals: the holders they pick, and
//! also those holders' trees, process groups and parents. Another user's process met on the
//! way is left alone and named in the report. Needs root (processes of `nobody` are made with
//! setpriv).

use crate::ssh::Cluster;
use crate::support::*;
use std::path::Path;

const AS_NOBODY: &str = "setpriv --reuid=65534 --regid=65534 --clear-groups";

fn root() {
    require_root("to start processes of another user");
}

/// Waits (bounded) for a file the test's processes write their pid to.
fn pid_in(path: &Path) -> i32 {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Ok(pid) = text.trim().parse() {
            return pid;
        }
        assert!(std::time::Instant::now() < end, "nothing in {path:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Runs `script` with bash as the leader of a new session (`$1` is gpuloop, `$D` the test's
/// directory) and returns the pid of the holder it starts, as `sim hold --foreground` prints it.
fn start(sim: &Sim, script: &str) -> i32 {
    let mut c = sim.wrapped(&["setsid", "bash", "-c", script, "bash"]);
    c.env("D", sim.path());
    started_pid(sim, c)
}

/// A root holder leading its group, with a child and a group member (double-forked away from
/// its tree) that are `nobody`'s: returns (holder, child, member).
fn root_holder_with_nobodys_processes(sim: &Sim) -> (i32, i32, i32) {
    let script = format!(
        r#"{AS_NOBODY} sleep 1000 & echo $! > "$D/child"
           ( {AS_NOBODY} sleep 1000 & echo $! > "$D/member" )
           exec "$1" sim hold --foreground --gpu 0 --mib 64"#
    );
    let holder = start(sim, &script);
    let (child, member) = (
        pid_in(&sim.path().join("child")),
        pid_in(&sim.path().join("member")),
    );
    sim.adopt(child);
    sim.adopt(member);
    (holder, child, member)
}

/// The reason the report gives for leaving `pid` alone.
fn skipped(report: &serde_json::Value, pid: i32) -> String {
    report["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .find(|s| s["pid"] == pid)
        .and_then(|s| s["reason"].as_str())
        .unwrap_or_else(|| panic!("pid {pid} is not among the skipped: {report}"))
        .to_string()
}

fn assert_left_alone(report: &serde_json::Value, pid: i32, reason: &str) {
    assert!(alive(pid), "pid {pid} was signalled: {report}");
    assert_eq!(skipped(report, pid), reason, "{report}");
    assert!(
        !report["signalled"]
            .as_array()
            .expect("signalled")
            .contains(&pid.into()),
        "{report}"
    );
}

/// The report stopped the root holder alone, and left nobody's child and group member,
/// each named with the bound (`said`) that kept them out.
fn assert_only_the_holder_stopped(
    r: &serde_json::Value,
    (holder, child, member): (i32, i32, i32),
    said: &str,
) {
    assert_eq!(r["signalled"], serde_json::json!([holder]), "{r}");
    assert!(gone_within(holder, 10));
    let reason = format!("owned by nobody, outside {said}");
    assert_left_alone(r, child, &reason);
    assert_left_alone(r, member, &reason);
}

/// `kill --mine` as root took the holder's child and its group member, both `nobody`'s,
/// through the tree walk.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn kill_mine_as_root_signals_nobodys_child_and_group_member_never() {
    root();
    let sim = Sim::new("1x8G");
    let (holder, child, member) = root_holder_with_nobodys_processes(&sim);
    let out = sim
        .run(&["--json", "kill", "--mine", "--gpu", "0", "--grace", "5"])
        .ok();
    let r = out.json();
    assert_only_the_holder_stopped(&r, (holder, child, member), "--mine");
}

/// `clean --user nobody --parents` stopped the root-owned parent of nobody's holder. The
/// parent names itself as torchrun's agent does, so that `--parents` would stop it were it
/// nobody's.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn clean_user_nobody_with_parents_signals_a_root_parent_never() {
    root();
    let sim = Sim::new("1x8G");
    sim.gpus();
    open_to_everyone(sim.path());
    let script = format!(
        r#"echo $$ > "$D/parent"
           printf pt_elastic > /proc/$$/comm
           {AS_NOBODY} "$1" sim hold --foreground --gpu 0 --mib 64 &
           wait
           exec sleep 1000"#
    );
    let holder = start(&sim, &script);
    let parent = pid_in(&sim.path().join("parent"));
    sim.adopt(parent);
    let out = sim.run(&[
        "--json",
        "clean",
        "--user",
        "nobody",
        "--parents",
        "--gpu",
        "0",
        "--grace",
        "5",
        "--timeout",
        "10",
    ]);
    let r = out.json();
    assert!(gone_within(holder, 10), "{r}");
    assert_left_alone(&r["kill"], parent, "owned by root, outside --user nobody");
    assert_eq!(out.code, 0, "{r}");
}

/// The same bound over a host: the agent resolves `--mine` there and bounds its kill.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn kill_mine_over_a_host_signals_another_users_tree_member_never() {
    root();
    let c = Cluster::new(&[("wa", "1x8G")], &[]);
    let (holder, child, member) = root_holder_with_nobodys_processes(c.sim("wa"));
    let out = c
        .run(&["--host", "wa", "--json", "kill", "--mine", "--grace", "5"])
        .ok();
    let r = out.json();
    assert_only_the_holder_stopped(&r, (holder, child, member), "--mine");
}

/// A script's `kill(holders(0, #{user}))` picked that user's holders, but the kill itself
/// walked their trees and groups unbounded: `kill()` takes the same bound (`user`, `mine`),
/// here and on each target's host.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn a_scripts_kill_with_mine_signals_nobodys_child_and_group_member_never() {
    root();
    let sim = Sim::new("1x8G");
    let (holder, child, member) = root_holder_with_nobodys_processes(&sim);
    let out = sim
        .run(&[
            "eval",
            r#"to_json(kill(holders(0, #{user: "root"}), #{mine: true, grace: 5}))"#,
        ])
        .ok();
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("a report");
    assert_only_the_holder_stopped(&r, (holder, child, member), "--mine");

    let c = Cluster::new(&[("wb", "1x8G")], &[]);
    let (holder, child, member) = root_holder_with_nobodys_processes(c.sim("wb"));
    let out = c
        .run(&[
            "--host",
            "wb",
            "eval",
            r#"to_json(kill(holders(0), #{user: "root", grace: 5}).by_host.wb)"#,
        ])
        .ok();
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("a report");
    assert_only_the_holder_stopped(&r, (holder, child, member), "--user root");
}

/// `--user nobody` took the owner of /proc/PID for the process's owner: that is its
/// effective uid. A process of nobody's effective uid that keeps root as its saved uid (it
/// can become root again) was signalled. Inside the bound is a process wholly that user's.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn kill_user_nobody_signals_no_process_that_keeps_another_uid() {
    root();
    let sim = Sim::new("1x8G");
    let mut c = std::process::Command::new("python3");
    c.args([
        "-c",
        "import os, sys, time; os.setresuid(65534, 65534, 0); print(os.getpid(), flush=True); time.sleep(120)",
    ]);
    let p = started_pid(&sim, c);
    let r = sim.eval_json(&format!("kill({p}, #{{user: \"nobody\"}})"));
    assert_eq!(r["signalled"], serde_json::json!([]), "{r}");
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .is_some_and(|s| s.contains("owned by root, outside --user nobody")),
        "{r}"
    );
    assert!(alive(p));
}
