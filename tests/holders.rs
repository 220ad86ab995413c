//! holders(): what the fd/mapping scan joined with the driver list finds.

use crate::support::*;
use serde_json::Value;

fn pids_in(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|h| h["pid"].as_i64().unwrap())
        .collect()
}

#[test]
fn finds_a_plain_holder_with_every_field() {
    let sim = Sim::new("2x8G");
    let p = sim.hold(&["--gpu", "1", "--mib", "300"])[0];
    let hs = sim.eval_json("holders()");
    assert_eq!(pids_in(&hs), vec![p as i64]);
    let h = &hs[0];
    assert_eq!(h["gpus"], serde_json::json!([1]));
    assert_eq!(h["mem"], 300 * 1024 * 1024);
    assert_eq!(h["role"], "compute");
    assert_eq!(h["evidence"], serde_json::json!(["driver", "fd", "map"]));
    assert_eq!(h["state"], "sleeping");
    assert_eq!(h["protected"], false);
    // Its launcher stays alive as its parent and leads the job's process group.
    assert_eq!(h["pgid"], h["ppid"]);
    assert_eq!(h["ppid_comm"], "launcher");
    assert_eq!(h["launcher"]["pid"], h["ppid"]);
    assert_eq!(h["launcher"]["name"], "launcher");
    assert_eq!(h["reparented"], false);
    assert!(h["start"].as_i64().unwrap() > 0);
    assert!(h["cmdline"].as_str().unwrap().contains("sim hold"));
    assert_eq!(h["user"], whoami());
    // By selection: GPU 0 has nobody.
    assert_eq!(sim.eval("holders(0).len()"), "0");
    assert_eq!(sim.eval("holders([0, 1]).len()"), "1");
}

fn whoami() -> String {
    let uid = unsafe { libc::getuid() };
    nix_user(uid)
}

fn nix_user(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines()
                .find(|l| l.split(':').nth(2) == Some(&uid.to_string()))
                .and_then(|l| l.split(':').next().map(str::to_string))
        })
        .unwrap_or_else(|| uid.to_string())
}

#[test]
fn finds_orphaned_workers_after_their_parent_was_killed() {
    let sim = Sim::new("2x8G");
    let pids = sim.hold(&["--gpu", "0", "--mib", "100", "--workers", "3"]);
    let (parent, workers) = (pids[0], &pids[1..]);
    assert_eq!(workers.len(), 3);
    sigkill(parent);
    assert!(gone_within(parent, 5));
    let hs = sim.eval_json("holders(0)");
    let mut found = pids_in(&hs);
    found.sort();
    let mut want: Vec<i64> = workers.iter().map(|&p| p as i64).collect();
    want.sort();
    assert_eq!(found, want);
    assert_eq!(sim.used_mib(0), 300);
}

#[test]
fn an_observer_only_with_all() {
    let sim = Sim::new("2x8G");
    let obs = sim.hold(&["--gpu", "0", "--observer"])[0];
    assert_eq!(sim.eval("holders().len()"), "0");
    let all = sim.eval_json("holders((), #{all: true})");
    assert_eq!(pids_in(&all), vec![obs as i64]);
    assert_eq!(all[0]["role"], "observer");
    assert_eq!(all[0]["evidence"], serde_json::json!(["fd"]));
    assert_eq!(all[0]["gpus"], serde_json::json!([0]));
}

/// A creator that allocated `mib` on `gpu`, forked a child that inherits its handles, and
/// exited: (creator, child), once the creator is gone.
fn crashed_creator(sim: &Sim, gpu: &str, mib: &str) -> (i32, i32) {
    let pids = sim.hold(&["--gpu", gpu, "--mib", mib, "--fork-child", "--exit-creator"]);
    assert!(gone_within(pids[0], 5));
    (pids[0], pids[1])
}

#[test]
fn a_forked_child_holding_inherited_handles_after_its_creator_exited() {
    let sim = Sim::new("2x8G");
    let (creator, child) = crashed_creator(&sim, "1", "200");
    let hs = sim.eval_json("holders()");
    assert_eq!(pids_in(&hs), vec![child as i64]);
    // The driver names the dead creator, not the child: the scan is what finds it.
    assert_eq!(hs[0]["evidence"], serde_json::json!(["fd", "map"]));
    assert_eq!(hs[0]["gpus"], serde_json::json!([1]));
    let d = sim.eval_json("diagnose(1)");
    assert_eq!(d[0]["verdict"], "inherited");
    assert_eq!(d[0]["ghost_pids"], serde_json::json!([creator]));
    assert_eq!(d[0]["mem_used_mib"], 200);
}

/// A new user's report (issue 38): in the README's own crash, `holders` showed 0 MiB for the
/// forked child that keeps a dead creator's memory alive, because the driver counts that
/// memory against the dead pid; the table pointed away from the one process to stop. The
/// child now carries what it keeps alive, marked as inherited, in the table and the JSON.
#[test]
fn a_forked_child_shows_the_memory_it_keeps_alive_as_inherited() {
    let sim = Sim::new("3x8G");
    let (creator, child) = crashed_creator(&sim, "1", "200");
    // Beside it, a plain holder (its own memory, nothing inherited), and a creator that is
    // alive with its child: that memory is the creator's, and the child inherits nothing.
    let plain = sim.hold(&["--gpu", "0", "--mib", "300"])[0];
    let live = sim.hold(&["--gpu", "2", "--mib", "50", "--fork-child"]);
    let hs = sim.run(&["--json", "holders"]).ok().json();
    let of = |pid: i32| {
        hs.as_array()
            .unwrap()
            .iter()
            .find(|h| h["pid"] == pid as i64)
            .unwrap_or_else(|| panic!("no holder {pid}: {hs}"))
            .clone()
    };
    let h = of(child);
    assert_eq!(h["mem"], 0, "the driver counts it against the creator");
    assert_eq!(
        h["inherited"],
        serde_json::json!({"from": [creator], "mem": 200 * 1024 * 1024, "mem_mib": 200})
    );
    assert_eq!(of(plain)["inherited"], Value::Null);
    assert_eq!(of(plain)["mem_mib"], 300);
    assert_eq!(of(live[0])["mem_mib"], 50);
    assert_eq!(of(live[1])["inherited"], Value::Null);
    // The table alone points the right way.
    let table = sim.run(&["holders"]).ok().stdout;
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with(&child.to_string()))
        .unwrap_or_else(|| panic!("no row for {child}:\n{table}"));
    assert!(row.contains(" 200 (inherited) "), "{table}");
    // A selection counts only its own GPUs: the child holds nothing on GPU 0.
    let hs = sim.eval_json("holders([0, 1])");
    let h = hs
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["pid"] == child as i64);
    assert_eq!(h.expect("the child")["inherited"]["mem_mib"], 200);
    assert_eq!(sim.eval_json("holders(0)")[0]["inherited"], Value::Null);
}

#[test]
fn a_process_that_left_the_process_group() {
    let sim = Sim::new("2x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "50", "--setsid"])[0];
    let hs = sim.eval_json("holders()");
    assert_eq!(pids_in(&hs), vec![p as i64]);
    assert_eq!(hs[0]["sid"], p as i64);
    assert_eq!(hs[0]["pgid"], p as i64);
}

#[test]
fn nothing_for_zombies() {
    // The creator of an allocation dies but its parent (the launcher, stopped) does not reap
    // it yet: the driver still lists the zombie creator while its forked child holds the handles.
    let sim = Sim::new("1x8G");
    let pids = sim.hold(&["--gpu", "0", "--mib", "10", "--fork-child"]);
    let (creator, child) = (pids[0], pids[1]);
    let launcher = ppid(creator);
    unsafe { libc::kill(launcher, libc::SIGSTOP) };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while state_of(launcher) != Some('T') {
        assert!(std::time::Instant::now() < end, "launcher did not stop");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    sigkill(creator);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while alive(creator) {
        assert!(std::time::Instant::now() < end, "creator did not exit");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The creator is a zombie now (exists in /proc, state Z).
    assert!(std::path::Path::new(&format!("/proc/{creator}")).exists());
    let all = sim.eval_json("holders((), #{all: true})");
    assert_eq!(pids_of(&all), vec![child as i64]);
    let d = sim.eval_json("diagnose(0)");
    assert_eq!(d[0]["ghost_pids"], serde_json::json!([creator]));
    unsafe { libc::kill(launcher, libc::SIGCONT) };
    assert!(
        gone_within(launcher, 10),
        "the launcher ends with its last child"
    );
}

fn pids_of(v: &Value) -> Vec<i64> {
    pids_in(v)
}

#[test]
fn unknown_gpu_index_is_a_script_error_not_a_panic() {
    let sim = Sim::new("2x8G");
    let out = sim.run(&["eval", "holders(9)"]).code(1);
    assert!(out.stderr.contains("no GPU with index 9"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"));
    let out = sim.run(&["eval", "gpu(-1)"]).code(1);
    assert!(
        out.stderr.contains("no GPU with index -1"),
        "{}",
        out.stderr
    );
    let out = sim.run(&["holders", "--gpu", "4"]).code(2);
    assert!(out.stderr.contains("no GPU with index 4"), "{}", out.stderr);
}

#[test]
fn holders_one_shot_prints_a_table_and_json() {
    let sim = Sim::new("2x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "64", "--name", "python3"])[0];
    let out = sim.run(&["holders"]).ok();
    assert!(
        out.stdout.contains("PID") && out.stdout.contains(&p.to_string()),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("python3"));
    let j = sim.run(&["--json", "holders", "--gpu", "0"]).ok().json();
    assert_eq!(j[0]["pid"], p as i64);
    assert_eq!(j[0]["name"], "python3");
}

/// The bug: a process whose main thread exited while another thread keeps the GPU (State Z,
/// Threads 2, an empty /proc/PID/fd, the driver listing PID) was no holder; the GPU was
/// called `other-namespace` ("pids that do not exist here") and `clean` failed with the
/// memory still held. Its threads show what it holds, and it is killed by its pid.
#[test]
fn a_defunct_leader_whose_threads_hold_the_gpu_is_a_live_holder() {
    let sim = Sim::new("2x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "100", "--defunct-leader"])[0];
    let q = sim.hold(&["--gpu", "1", "--mib", "50", "--defunct-leader"])[0];
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while state_of(p) != Some('Z') || state_of(q) != Some('Z') {
        assert!(std::time::Instant::now() < end, "the leader did not exit");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap();
    assert!(status.contains("Threads:\t2"), "{status}");
    let hs = sim.run(&["--json", "holders", "--gpu", "0"]).ok().json();
    assert_eq!(pids_in(&hs), vec![p as i64], "{hs}");
    assert_eq!(hs[0]["state"], "sleeping (main thread exited)");
    assert_eq!(hs[0]["mem_mib"], 100);
    assert_eq!(hs[0]["gpus"], serde_json::json!([0]));
    let d = sim
        .run(&["--json", "diagnose", "--gpu", "0"])
        .code(1)
        .json();
    assert_eq!(d[0]["verdict"], "held", "{d}");
    assert_eq!(d[0]["ghost_pids"], serde_json::json!([]), "{d}");
    let out = sim.run(&["clean", "--gpu", "0", "--timeout", "10"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        gone_within(p, 10),
        "the defunct leader's process still runs"
    );
    assert_eq!(sim.used_mib(0), 0);
}

/// Starts `python3` mapping `path` (one page, shared) with `also` open; returns it once it
/// maps it (the simulator's drop kills it if the test fails first).
fn map_file(sim: &Sim, path: &std::path::Path, also: &std::path::Path) -> std::process::Child {
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            "import mmap, sys, time\n\
             f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 4096)\n\
             g = open(sys.argv[2], 'rb')\n\
             print('ready', flush=True); time.sleep(1000)",
        ])
        .arg(path)
        .arg(also)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let pid = child.id() as i32;
    sim.adopt(pid);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(
        line.trim(),
        "ready",
        "python3 did not map {}",
        path.display()
    );
    child
}

/// The bugs: a process that maps only nvidiactl was a "compute" holder of no GPU, which
/// `kill --dry-run` with no --gpu would TERM; and a mapped file named `/x /dev/nvidia1`
/// made its process a compute holder of GPU 1.
#[test]
fn false_holders_from_maps_parsing_nvidiactl_alone_and_a_spaced_path_hold_no_gpu() {
    let sim = Sim::new("2x8G");
    sim.run(&["gpus"]).ok();
    let dev = sim.path().join("state/dev");
    let ctl_child = map_file(&sim, &dev.join("nvidiactl"), &dev.join("nvidia-uvm"));
    let ctl = ctl_child.id() as i32;
    // "<tmp>/x <tmp>/state/dev/nvidia1": a path with a space, then a node's path.
    let spaced = std::path::PathBuf::from(format!(
        "{}/x {}",
        sim.path().display(),
        dev.join("nvidia1").display()
    ));
    std::fs::create_dir_all(spaced.parent().unwrap()).unwrap();
    std::fs::write(&spaced, vec![0u8; 4096]).unwrap();
    let decoy_child = map_file(&sim, &spaced, &dev.join("nvidiactl"));
    let decoy = decoy_child.id() as i32;
    let holder = sim.hold(&["--gpu", "0", "--mib", "10"])[0];
    let all = sim.run(&["--json", "holders", "--all"]).ok().json();
    let of = |pid: i32| all.as_array().unwrap().iter().find(|h| h["pid"] == pid);
    let c = of(ctl).unwrap_or_else(|| panic!("{all}"));
    assert_eq!(c["role"], "observer", "{c}");
    assert_eq!(c["gpus"], serde_json::json!([]), "{c}");
    // The decoy has nvidiactl open and maps a file whose name only contains a node's path.
    let d = of(decoy).unwrap_or_else(|| panic!("{all}"));
    assert_eq!(d["role"], "observer", "{d}");
    assert_eq!(d["gpus"], serde_json::json!([]), "{d}");
    let out = sim.run(&["--json", "kill", "--dry-run"]).ok().json();
    let would: Vec<i64> = out["would_signal"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    assert_eq!(would, vec![holder as i64], "{out}");
    for mut c in [ctl_child, decoy_child] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
