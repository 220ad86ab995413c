//! kill(), wait_clean(), `gpuloop kill` and `gpuloop clean` on real processes.

use crate::support::*;

#[test]
fn a_term_respecting_holder_exits_on_term_before_the_grace() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "64"])[0];
    let r = sim.eval_json(&format!("kill({p}, #{{grace: 60}})"));
    assert_eq!(r["signalled"], serde_json::json!([p]));
    assert_eq!(r["exited"], serde_json::json!([p]));
    assert_eq!(r["survivors"], serde_json::json!([]));
    // It did not sit out the 60 s grace: TERM alone ended it.
    assert!(r["elapsed_ms"].as_i64().unwrap() < 60_000);
    assert!(!alive(p));
}

#[test]
fn a_term_ignoring_holder_is_killed_after_the_grace() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "64", "--ignore-term"])[0];
    let r = sim.eval_json(&format!("kill({p}, #{{grace: 0.3}})"));
    assert_eq!(r["exited"], serde_json::json!([p]));
    assert_eq!(r["survivors"], serde_json::json!([]));
    assert!(r["elapsed_ms"].as_i64().unwrap() >= 300, "{r}");
    assert!(!alive(p));
    assert_eq!(sim.used_mib(0), 0);
}

#[test]
fn clean_frees_one_gpu_of_orphans_and_an_inheriting_child_and_nothing_else() {
    let sim = Sim::new("3x8G");
    let workers = sim.hold(&["--gpu", "1", "--mib", "100", "--workers", "2"]);
    sigkill(workers[0]);
    assert!(gone_within(workers[0], 5));
    let fork = sim.hold(&[
        "--gpu",
        "1",
        "--mib",
        "50",
        "--fork-child",
        "--exit-creator",
    ]);
    let other = sim.hold(&["--gpu", "2", "--mib", "70"])[0];
    assert_eq!(sim.used_mib(1), 250);
    let out = sim.run(&["clean", "--gpu", "1"]).ok();
    assert!(out.stdout.contains("clean"), "{}", out.stdout);
    assert_eq!(sim.used_mib(1), 0);
    for p in workers[1..].iter().chain([&fork[1]]) {
        assert!(!alive(*p), "{p} still alive");
    }
    assert!(alive(other), "a holder of another GPU was touched");
    assert_eq!(sim.used_mib(2), 70);
}

#[test]
fn clean_json_reports_the_kill_and_the_gpus() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "10"])[0];
    let j = sim.run(&["--json", "clean"]).ok().json();
    assert_eq!(j["clean"], true);
    assert_eq!(j["kill"]["exited"], serde_json::json!([p]));
    assert_eq!(j["gpus"][0]["verdict"], "clean");
}

#[test]
fn a_protected_daemon_survives_clean_and_kill_without_force() {
    let sim = Sim::new("1x8G");
    let d = sim.hold(&["--gpu", "0", "--mib", "0", "--name", "nvidia-persistenced"])[0];
    let job = sim.hold(&["--gpu", "0", "--mib", "20"])[0];
    sim.run(&["clean"]).ok();
    assert!(alive(d), "clean stopped the daemon");
    assert!(!alive(job));
    // wait_clean is satisfied: the daemon holds no memory and is no compute holder.
    assert_eq!(sim.eval("wait_clean(0, #{timeout: 5})"), "true");
    let r = sim.eval_json(&format!("kill({d})"));
    assert_eq!(r["signalled"], serde_json::json!([]));
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("protected"),
        "{r}"
    );
    assert!(alive(d));
    let all = sim.eval_json("holders((), #{all: true})");
    assert_eq!(all[0]["role"], "daemon");
    assert_eq!(all[0]["protected"], true);
    let r = sim.eval_json(&format!("kill({d}, #{{force: true}})"));
    assert_eq!(r["exited"], serde_json::json!([d]));
}

#[test]
fn dry_run_signals_nothing_and_says_what_it_would() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "10"])[0];
    let r = sim.eval_json("kill(holders(), #{dry_run: true})");
    assert_eq!(r["signalled"], serde_json::json!([]));
    assert_eq!(r["would_signal"], serde_json::json!([p]));
    assert_eq!(r["dry_run"], true);
    assert_eq!(r["exited"], serde_json::json!([]));
    let out = sim.run(&["--json", "clean", "--dry-run"]).ok();
    assert_eq!(out.json()["would_signal"], serde_json::json!([p]));
    let t = &out.json()["targets"][0];
    assert_eq!(
        (&t["pid"], &t["name"], &t["signal"], &t["gpus"]),
        (
            &serde_json::json!(p),
            &serde_json::json!("python3"),
            &serde_json::json!("TERM"),
            &serde_json::json!([0])
        )
    );
    let out = sim.run(&["kill", "--dry-run", "--signal", "INT"]).ok();
    assert!(
        out.stdout
            .contains(&format!("would send INT to:\n  {p} (python3) on GPU 0")),
        "{}",
        out.stdout
    );
    assert!(alive(p));
    assert_eq!(sim.used_mib(0), 10);
}

#[test]
fn reports_say_which_signal_ended_each_process_and_when_memory_came_back() {
    let sim = Sim::new("2x8G");
    let stubborn = sim.hold(&[
        "--gpu",
        "0",
        "--mib",
        "10",
        "--ignore-term",
        "--name",
        "trainer",
    ])[0];
    let polite = sim.hold(&["--gpu", "1", "--mib", "10"])[0];
    let out = sim.run(&["clean", "--grace", "0.5"]).ok();
    assert!(
        out.stdout.contains(&format!(
            "{stubborn} (trainer) on GPU 0 ignored TERM, got KILL after"
        )) && out
            .stdout
            .contains(&format!("{polite} (python3) on GPU 1 exited on TERM after")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("clean: memory back"), "{}", out.stdout);
    // Nothing said twice: what is left is in the report, not also in a warning.
    assert_eq!(out.stderr, "");
    let p = sim.hold(&["--gpu", "0", "--mib", "10", "--ignore-term"])[0];
    let r = sim.run(&["--json", "clean", "--grace", "0.3"]).ok().json();
    assert_eq!(r["kill"]["targets"][0]["pid"], p);
    assert_eq!(r["kill"]["targets"][0]["ended_by"], "KILL");
    assert!(r["kill"]["targets"][0]["exit_ms"].as_i64().unwrap() >= 300);
    assert!(r["wait_ms"].as_i64().is_some());
}

#[test]
fn clean_that_times_out_warns_once() {
    let sim = Sim::new("1x8G");
    sim.run(&["sim", "leak", "--gpu", "0", "--mib", "10"]).ok();
    let out = sim.run(&["clean", "--timeout", "0.3"]).code(1);
    assert!(out.stdout.contains("NOT clean"), "{}", out.stdout);
    assert_eq!(
        out.stdout.matches("[driver]").count() + out.stdout.matches(" driver ").count(),
        1,
        "{}",
        out.stdout
    );
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
}

#[test]
fn a_holder_map_whose_start_changed_is_skipped() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "10"])[0];
    let r = sim.eval_json("let h = holders()[0]; h.start += 1; kill(h)");
    assert_eq!(r["signalled"], serde_json::json!([]));
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("another process"),
        "{r}"
    );
    assert!(alive(p));
}

#[test]
fn own_pid_and_pid_one_are_refused() {
    let sim = Sim::new("1x8G");
    let r = sim.eval_json("kill([1, 0])");
    assert_eq!(r["signalled"], serde_json::json!([]));
    assert!(r["skipped"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("never signalled"));
    let out = sim
        .script(
            "self.rhai",
            r#"let me = parse_json(read_file("/proc/self/stat").split(" ")[0]);
           let r = kill(me); print(to_json(r));"#,
            &[],
        )
        .ok();
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("gpuloop itself"),
        "{r}"
    );
}

#[test]
fn a_vanished_target_is_already_gone_not_an_error() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "10"])[0];
    sigkill(p);
    assert!(gone_within(p, 5));
    let r = sim.eval_json(&format!("kill({p})"));
    assert_eq!(r["errors"], serde_json::json!([]));
    assert_eq!(r["signalled"], serde_json::json!([]));
    // Gone, or a zombie whose parent (init here) has not reaped it yet: either way, said so.
    let reason = r["skipped"][0]["reason"].as_str().unwrap();
    assert!(
        reason == "already gone"
            || reason.starts_with("zombie: it holds nothing, but its parent (pid "),
        "{r}"
    );
}

#[test]
fn tree_kill_takes_the_workers_of_a_launcher() {
    let sim = Sim::new("1x8G");
    let pids = sim.hold(&["--gpu", "0", "--mib", "10", "--workers", "2"]);
    let r = sim.eval_json(&format!("kill({})", pids[0]));
    let mut got: Vec<i64> = r["exited"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    got.sort();
    let mut want: Vec<i64> = pids.iter().map(|&p| p as i64).collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(sim.used_mib(0), 0);
}

#[test]
fn a_stopped_holder_is_still_freed() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "10"])[0];
    unsafe { libc::kill(p, libc::SIGSTOP) };
    let r = sim.eval_json(&format!("kill({p}, #{{grace: 30}})"));
    assert_eq!(r["exited"], serde_json::json!([p]), "{r}");
    assert!(
        r["elapsed_ms"].as_i64().unwrap() < 30_000,
        "TERM was not acted on: {r}"
    );
}

#[test]
fn wait_clean_times_out_on_a_leak_and_logs_the_driver_verdict() {
    let sim = Sim::new("1x8G");
    sim.run(&["sim", "leak", "--gpu", "0", "--mib", "5"]).ok();
    let out = sim.run(&["eval", "wait_clean(0, #{timeout: 0.3})"]).ok();
    assert_eq!(out.stdout.trim(), "false");
    assert!(out.stderr.contains("[driver]"), "{}", out.stderr);
    // clean on it exits 1 with the diagnosis.
    let out = sim.run(&["clean", "--timeout", "0.2"]).code(1);
    assert!(
        out.stdout.contains("driver") && out.stdout.contains("NOT clean"),
        "{}",
        out.stdout
    );
}

#[test]
fn wait_clean_returns_after_the_driver_release_not_before() {
    let sim = Sim::new("1x8G,release_ms=300");
    let p = sim.hold(&["--gpu", "0", "--mib", "64"])[0];
    let out = sim
        .script(
            "release.rhai",
            &format!(
                r#"let r = kill({p}, #{{signal: "KILL"}});
                   let ok = wait_clean(0, #{{poll_ms: 20, timeout: 20}});
                   print(`${{ok}} ${{now()}}`);"#
            ),
            &[],
        )
        .ok();
    let mut it = out.stdout.split_whitespace();
    assert_eq!(it.next(), Some("true"));
    let returned: f64 = it.next().unwrap().parse().unwrap();
    let log = std::fs::read_to_string(sim.path().join("state/released.log")).unwrap();
    let released: f64 = log
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        returned >= released,
        "wait_clean returned {:.3}s before the release",
        released - returned
    );
    println!(
        "wait_clean saw the release {:.1} ms after it",
        (returned - released) * 1e3
    );
}

#[test]
fn wait_clean_with_bad_options_is_a_clear_error() {
    let sim = Sim::new("1x8G");
    let out = sim.run(&["eval", "wait_clean(0, #{timout: 1})"]).code(1);
    assert!(
        out.stderr.contains("unknown option \"timout\""),
        "{}",
        out.stderr
    );
    let out = sim.run(&["eval", "kill(1, #{signal: \"NOPE\"})"]).code(1);
    assert!(out.stderr.contains("unknown signal"), "{}", out.stderr);
    sim.run(&["kill", "--signal", "NOPE"]).code(2);
}

#[test]
fn an_eight_gpu_tensor_parallel_job_at_full_size_is_cleaned() {
    // The shape of the real problem: 8 ranks, one per 141 GiB GPU, ~70 GiB each, every rank
    // mapping all 8 GPUs (as CUDA contexts do); the launcher is SIGKILLed.
    let sim = Sim::new("8x141G,release_ms=150");
    let mut launchers = Vec::new();
    for g in 0..8 {
        let ps = sim.hold(&[
            "--gpu",
            &g.to_string(),
            "--mib",
            "71680",
            "--workers",
            "1",
            "--map-all",
        ]);
        launchers.push(ps[0]);
    }
    for &l in &launchers {
        sigkill(l);
        assert!(gone_within(l, 5));
    }
    let before = sim.eval_json("diagnose()");
    assert!(
        before
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["verdict"] == "orphaned"),
        "{before}"
    );
    sim.run(&["clean"]).ok();
    let gpus = sim.gpus();
    assert_eq!(gpus.as_array().unwrap().len(), 8);
    for g in gpus.as_array().unwrap() {
        assert_eq!(g["mem_used_mib"], 0, "{g}");
        assert_eq!(g["mem_total_mib"], 141 * 1024);
    }
}

#[test]
fn cleanup_ensure_clean_escalates_and_resets_a_leak_only_when_allowed() {
    let sim = Sim::new("2x8G");
    let stubborn = sim.hold(&["--gpu", "0", "--mib", "30", "--ignore-term"])[0];
    sim.run(&["sim", "leak", "--gpu", "1", "--mib", "40"]).ok();
    let r = sim.eval_json(
        r#"import "cleanup" as c; c::ensure_clean((), #{grace: 0.2, timeout: 0.5, quiet: true})"#,
    );
    assert_eq!(r["clean"], false, "{r}");
    assert!(
        !alive(stubborn),
        "the TERM-ignoring holder survived the ladder"
    );
    assert_eq!(r["verdicts"][0]["verdict"], "clean");
    assert_eq!(r["verdicts"][1]["verdict"], "driver");
    assert_eq!(sim.used_mib(1), 40, "reset without allow_reset");
    let r = sim.eval_json(
        r#"import "cleanup" as c; c::ensure_clean([1], #{timeout: 2, allow_reset: true, quiet: true})"#,
    );
    assert_eq!(r["clean"], true, "{r}");
    assert!(r["steps"].to_string().contains("reset GPU 1"), "{r}");
    assert_eq!(sim.used_mib(1), 0);
}

#[test]
fn the_clean_node_recipe_prints_before_and_after_and_sets_the_exit_code() {
    let sim = Sim::new("2x8G");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/clean-node.rhai");
    let script = script.to_str().unwrap();
    let p = sim.hold(&["--gpu", "1", "--mib", "500", "--name", "vllm-worker"])[0];
    let out = sim
        .run(&["run", script, "--", "--gpus", "1", "--timeout", "5"])
        .ok();
    assert!(
        out.stdout.contains("before:") && out.stdout.contains(&format!("vllm-worker({p})")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("after:") && out.stdout.contains("clean in"),
        "{}",
        out.stdout
    );
    assert!(!alive(p));
    sim.run(&["sim", "leak", "--gpu", "0", "--mib", "9"]).ok();
    let out = sim.run(&["run", script, "--", "--timeout", "0.3"]).code(1);
    assert!(
        out.stdout.contains("[driver]") && out.stdout.contains("NOT clean"),
        "{}",
        out.stdout
    );
    let out = sim
        .run(&["run", script, "--", "--timeout", "1", "--allow-reset"])
        .ok();
    assert!(out.stdout.contains("reset GPU 0"), "{}", out.stdout);
    let out = sim.run(&["run", script, "--", "--bogus"]).code(1);
    assert!(
        out.stderr.contains("unknown argument --bogus"),
        "{}",
        out.stderr
    );
}

/// Issue 10, defect 12: a holder map with a missing or non-integer `start` was treated as a
/// bare pid, and killed whatever had the pid. It is an error now, and nothing is signalled.
#[test]
fn a_holder_map_without_a_valid_start_is_an_error_not_a_bare_pid() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "10"])[0];
    for (edit, says) in [
        ("h.start = \"123\";", "start must be an integer"),
        ("h.remove(\"start\");", "has no start"),
        ("h.start = 1.5;", "start must be an integer"),
        ("h.pidfs_ino = \"x\";", "pidfs_ino must be an integer"),
    ] {
        let out = sim
            .run(&["eval", &format!("let h = holders()[0]; {edit} kill(h)")])
            .code(1);
        assert!(out.stderr.contains(says), "{edit}: {}", out.stderr);
        assert!(alive(p), "{edit} signalled the holder");
    }
    // The map as holders() returns it still works; and a bare integer pid is a pid.
    let r = sim.eval_json("kill(holders()[0])");
    assert_eq!(r["exited"], serde_json::json!([p]));
}
