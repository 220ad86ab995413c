//! Selecting GPUs and holders as nvidia-smi users type it: lists, ranges, UUIDs, bus ids,
//! owners, plain pids; negative numbers get gpuloop's own message.

use crate::support::*;
use serde_json::Value;

fn indices(v: &Value, key: &str) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| g[key].as_i64().unwrap())
        .collect()
}

#[test]
fn gpu_takes_lists_ranges_uuids_and_bus_ids_on_the_command_line_and_in_scripts() {
    let sim = Sim::new("4x8G");
    let gpus = sim.gpus();
    let uuid = gpus[2]["uuid"].as_str().unwrap();
    let prefix = &uuid[..8];
    let bus = gpus[3]["bus_id"].as_str().unwrap();
    let json = |args: &[&str]| sim.run(&[&["--json"], args].concat()).ok().json();
    assert_eq!(indices(&json(&["gpus", "--gpu", "0,1"]), "index"), [0, 1]);
    assert_eq!(
        indices(&json(&["gpus", "--gpu", "1-3"]), "index"),
        [1, 2, 3]
    );
    assert_eq!(
        indices(&json(&["gpus", "--gpu", prefix, "--gpu", bus]), "index"),
        [2, 3]
    );
    assert_eq!(indices(&json(&["diagnose", "--gpu", "0-1"]), "gpu"), [0, 1]);
    // The same forms in scripts' selectors, alone or in arrays.
    let script = format!(
        "[diagnose(\"0,2\").map(|d| d.gpu), diagnose([\"{prefix}\", 0]).map(|d| d.gpu), holders(\"{bus}\").len()]"
    );
    assert_eq!(
        sim.eval_json(&script),
        serde_json::json!([[0, 2], [0, 2], 0])
    );
    // Bad selectors are usage errors that say why.
    let out = sim.run(&["gpus", "--gpu", "3-1"]).code(2);
    assert!(out.stderr.contains("backwards"), "{}", out.stderr);
    let out = sim.run(&["holders", "--gpu", "GPU-"]).code(2);
    assert!(out.stderr.contains("matches 4 GPUs"), "{}", out.stderr);
    let out = sim.run(&["kill", "--gpu", "GPU-ffff"]).code(2);
    assert!(out.stderr.contains("no GPU with UUID"), "{}", out.stderr);
    let out = sim.run(&["eval", "holders(\"0,,1\")"]).code(1);
    assert!(out.stderr.contains("empty item"), "{}", out.stderr);
}

#[test]
fn user_and_mine_select_holders_by_owner() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "8"])[0];
    let mine = sim.run(&["--json", "holders", "--mine"]).ok().json();
    assert_eq!(indices(&mine, "pid"), [p as i64]);
    let uid = nix::unistd::getuid().as_raw().to_string();
    let by_uid = sim.run(&["--json", "holders", "--user", &uid]).ok().json();
    assert_eq!(indices(&by_uid, "pid"), [p as i64]);
    // Someone else's view: nothing of ours is selected, so nothing is stopped.
    let other = if uid == "65534" { "0" } else { "65534" };
    let r = sim.run(&["--json", "kill", "--user", other]).ok().json();
    assert_eq!(r["signalled"], serde_json::json!([]));
    assert!(alive(p));
    let me = format!("holders((), #{{user: {uid}}}).map(|h| h.pid)");
    assert_eq!(sim.eval_json(&me), serde_json::json!([p]));
    let them = format!("holders((), #{{user: \"{other}\"}}).len()");
    assert_eq!(sim.eval(&them), "0");
    let out = sim.run(&["clean", "--user", "no-such-user-here"]).code(2);
    assert!(out.stderr.contains("no user"), "{}", out.stderr);
    sim.run(&["holders", "--user", "root", "--mine"]).code(2);
    let help = sim.run(&["clean", "--help"]).ok().stdout;
    assert!(help.contains("every user's processes"), "{help}");
}

/// Defect 3: SPEC gives every one-shot `--user U` and `--job N`, but `wait --user`, `wait
/// --job`, `diagnose --user` and `diagnose --mine` were rejected (`wait --job 5` suggested the
/// srun transport's `--jobid`). They pick the GPUs those processes hold, each judged whole.
#[test]
fn wait_and_diagnose_take_user_mine_and_job() {
    let sim = Sim::new("4x8G");
    sim.hold(&["--gpu", "1", "--mib", "8"]);
    sim.hold_with(&["--gpu", "2", "--mib", "16"], &[("SLURM_JOB_ID", "812")]);
    let uid = nix::unistd::getuid().as_raw().to_string();
    let other = if uid == "65534" { "0" } else { "65534" };
    let gpus = |args: &[&str], code: i32| {
        let out = sim.run(&[&["--json"], args].concat()).code(code);
        let v = out.json();
        indices(v.get("gpus").unwrap_or(&v), "gpu")
    };
    assert_eq!(gpus(&["diagnose", "--mine"], 1), [1, 2]);
    assert_eq!(gpus(&["diagnose", "--user", &uid], 1), [1, 2]);
    assert_eq!(gpus(&["diagnose", "--job", "812"], 1), [2]);
    assert_eq!(gpus(&["diagnose", "--user", other], 0), Vec::<i64>::new());
    // wait: the GPUs they hold now must come clean; this one stays held, so not in time.
    let t = ["--timeout", "0.2"];
    assert_eq!(gpus(&[&["wait", "--job", "812"][..], &t].concat(), 1), [2]);
    assert_eq!(gpus(&[&["wait", "--mine"][..], &t].concat(), 1), [1, 2]);
    assert_eq!(
        gpus(&[&["wait", "--mine", "--gpu", "1,3"][..], &t].concat(), 1),
        [1]
    );
    // Nothing of theirs holds a GPU: nothing to wait for, though GPUs 1 and 2 are held.
    for args in [&["wait", "--user", other][..], &["wait", "--job", "5"]] {
        let out = sim.run(args).ok();
        assert!(
            out.stderr.contains("nothing to wait for") && !out.stderr.contains("--jobid"),
            "{args:?}: {}",
            out.stderr
        );
    }
    sim.run(&["wait", "--user", "root", "--mine"]).code(2);
    let help = sim.run(&["wait", "--help"]).ok().stdout;
    assert!(help.contains("the GPUs those processes hold"), "{help}");
}

#[test]
fn kill_takes_plain_pids_under_the_same_rules() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "8"])[0];
    let r = sim
        .run(&["--json", "kill", &p.to_string(), "1", "--grace", "5"])
        .ok()
        .json();
    assert_eq!(r["exited"], serde_json::json!([p]));
    assert_eq!(r["skipped"][0]["pid"], 1);
    assert!(!alive(p));
    let out = sim.run(&["kill", "12", "--gpu", "0"]).code(2);
    assert!(out.stderr.contains("not both"), "{}", out.stderr);
    let out = sim.run(&["kill", "0"]).code(2);
    assert!(out.stderr.contains("not a process id"), "{}", out.stderr);
}

#[test]
fn negative_numbers_get_gpuloops_own_message() {
    let sim = Sim::new("1x8G");
    for (args, want) in [
        (
            &["kill", "--grace", "-1"][..],
            "--grace -1 is not a number of seconds",
        ),
        (
            &["clean", "--timeout", "-5"],
            "--timeout -5 is not a number of seconds",
        ),
        (
            &["wait", "--timeout", "-5"],
            "--timeout -5 is not a number of seconds",
        ),
        (&["kill", "-3"], "-3 is not a process id"),
        (&["gpus", "--gpu", "-1"], "not negative"),
        (
            &["sim", "hold", "--gpu", "0", "--mib", "-1"],
            "--mib must be non-negative",
        ),
        (
            &["sim", "hold", "--gpu", "0", "--workers", "-2"],
            "--workers must be",
        ),
    ] {
        let out = sim.run(args).code(2);
        assert!(out.stderr.contains(want), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("unexpected argument"), "{args:?}");
    }
}
