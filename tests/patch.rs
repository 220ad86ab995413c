//! The patch module: apply/revert unified diffs all or nothing, rerun_until's loop and its
//! table, and the patch-and-rerun example end to end.

use crate::support::*;
use std::path::Path;

const BASE: &str = "import torch\n\ndef forward(x):\n    y = x * 2\n    return {\"logits\": y}\n";
const DIFF: &str = "--- a/model.py\n+++ b/model.py\n@@ -2,4 +2,5 @@\n \n def forward(x):\n     y = x * 2\n-    return {\"logits\": y}\n+    out = {\"logits\": y, \"hidden_states\": [x]}\n+    return out\n";

fn setup(sim: &Sim) -> (String, String) {
    let model = sim.path().join("model.py");
    std::fs::write(&model, BASE).unwrap();
    let diff = sim.path().join("fix.diff");
    std::fs::write(&diff, DIFF).unwrap();
    (model.display().to_string(), diff.display().to_string())
}

#[test]
fn apply_and_revert_a_unified_diff() {
    let sim = Sim::new("1x1G");
    let (model, diff) = setup(&sim);
    let src = format!(
        r#"import "patch" as patch;
           let d = read_file("{diff}");
           let before = patch::is_applied("{model}", d);
           let n = patch::apply("{model}", d);
           let applied = read_file("{model}");
           let now = patch::is_applied("{model}", d);
           let again = patch::ensure("{model}", d);
           patch::revert("{model}", d);
           print(to_json(#{{n: n, before: before, now: now, again: again, applied: applied, reverted: read_file("{model}")}}));"#
    );
    let out = sim.script("apply.rhai", &src, &[]).ok();
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["n"], 1);
    assert_eq!(v["before"], false);
    assert_eq!(v["now"], true);
    assert_eq!(v["again"], false, "ensure must not apply twice");
    assert!(
        v["applied"]
            .as_str()
            .unwrap()
            .contains("\"hidden_states\": [x]"),
        "{v}"
    );
    assert_eq!(v["reverted"], BASE);
    assert!(
        out.stderr.contains("patch: applied 1 hunk(s)"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_hunk_that_does_not_apply_leaves_the_file_untouched() {
    let sim = Sim::new("1x1G");
    let (model, diff) = setup(&sim);
    let changed = BASE.replace("x * 2", "x * 3");
    std::fs::write(&model, &changed).unwrap();
    let out = sim
        .script(
            "fail.rhai",
            &format!(
                "import \"patch\" as patch;\npatch::apply(\"{model}\", read_file(\"{diff}\"));\n"
            ),
            &[],
        )
        .code(1);
    assert!(
        out.stderr
            .contains("hunk 1 (@@ -2,4 +2,5 @@) does not apply"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("line 4 is `    y = x * 3`, the diff expects `    y = x * 2`"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read_to_string(&model).unwrap(), changed);
    // No temporary file left beside it either.
    let names: Vec<_> = std::fs::read_dir(sim.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("gpuloop-patch")),
        "{names:?}"
    );
}

#[test]
fn a_multi_file_diff_on_a_directory_is_all_or_nothing() {
    let sim = Sim::new("1x1G");
    let dir = sim.path().join("repo");
    std::fs::create_dir_all(dir.join("pkg")).unwrap();
    std::fs::write(dir.join("pkg/a.py"), "a = 1\n").unwrap();
    std::fs::write(dir.join("pkg/b.py"), "b = 1\n").unwrap();
    let diff = "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n\
                diff --git a/pkg/b.py b/pkg/b.py\n--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1 @@\n-b = 1\n+b = 2\n";
    std::fs::write(sim.path().join("two.diff"), diff).unwrap();
    let d = dir.display();
    let two = sim.path().join("two.diff");
    // b.py differs from what the diff expects: neither file may change.
    std::fs::write(dir.join("pkg/b.py"), "b = 7\n").unwrap();
    let out = sim
        .run(&[
            "eval",
            &format!(r#"apply_patch("{d}", read_file("{}"))"#, two.display()),
        ])
        .code(1);
    assert!(out.stderr.contains("b.py"), "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(dir.join("pkg/a.py")).unwrap(),
        "a = 1\n"
    );
    std::fs::write(dir.join("pkg/b.py"), "b = 1\n").unwrap();
    let n = sim.eval(&format!(
        r#"apply_patch("{d}", read_file("{}"))"#,
        two.display()
    ));
    assert_eq!(n, "2");
    assert_eq!(
        std::fs::read_to_string(dir.join("pkg/a.py")).unwrap(),
        "a = 2\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("pkg/b.py")).unwrap(),
        "b = 2\n"
    );
}

#[test]
fn rerun_until_fixes_reruns_and_prints_the_attempts() {
    let sim = Sim::new("1x1G");
    let (model, diff) = setup(&sim);
    // The job fails until the patch is in; the fixer applies it once.
    let src = format!(
        r#"import "patch" as patch;
           let job = ["sh", "-c", "grep -q hidden_states {model} || {{ echo 'KeyError: hidden_states' >&2; exit 1; }}; echo extracted"];
           let seen = [];
           let r = patch::rerun_until(job, #{{
               attempts: 3,
               run: #{{echo: false}},
               fix: |result, attempt| {{ seen.push(attempt); patch::ensure("{model}", read_file("{diff}")); }},
           }});
           print(to_json(#{{ok: r.ok, attempts: r.attempts, stdout: r.result.stdout, seen: seen}}));"#
    );
    let out = sim.script("loop.rhai", &src, &[]).ok();
    let v: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["seen"], serde_json::json!([1]));
    assert_eq!(v["stdout"], "extracted\n");
    let attempts = v["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["code"], 1);
    assert_eq!(attempts[0]["error_line"], "KeyError: hidden_states");
    assert_eq!(attempts[1]["code"], 0);
    assert_eq!(attempts[1]["error_line"], "");
    assert!(
        out.stdout.contains("rerun_until: ok after 2 attempt(s)"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("KeyError: hidden_states"),
        "{}",
        out.stdout
    );
}

#[test]
fn rerun_until_cleans_leftover_holders_before_each_attempt() {
    let sim = Sim::new("2x8G");
    let left = sim.hold(&["--gpu", "1", "--mib", "500", "--workers", "2"]);
    let src = r#"import "patch" as patch;
        let r = patch::rerun_until(|n| run("exit 0", #{echo: false}), #{gpus: 1, grace: 1});
        print(to_json(r.attempts));"#;
    let out = sim.script("clean.rhai", src, &[]).ok();
    let v: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    // The two workers hold the GPU; their launcher holds nothing and is not a holder.
    assert_eq!(v[0]["killed"], 2, "{v}");
    for &p in &left[1..] {
        assert!(!alive(p), "holder {p} survived");
    }
    assert_eq!(sim.used_mib(1), 0);
}

#[test]
fn rerun_until_gives_up_when_told_or_out_of_attempts() {
    let sim = Sim::new("1x1G");
    let src = r#"import "patch" as patch;
        let a = patch::rerun_until("echo 'RuntimeError: NCCL timeout' >&2; exit 3", #{attempts: 2, run: #{echo: false}});
        let b = patch::rerun_until(["false"], #{attempts: 5, fix: |r| false});
        print(to_json([a.ok, a.attempts.len(), a.attempts[1].error_line, b.ok, b.attempts.len()]));"#;
    let out = sim.script("giveup.rhai", src, &[]).ok();
    let v: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!([false, 2, "RuntimeError: NCCL timeout", false, 1])
    );
    assert!(
        out.stdout.contains("FAILED after 2 attempt(s)"),
        "{}",
        out.stdout
    );
    let bad = sim
        .run(&[
            "eval",
            r#"import "patch" as p; p::rerun_until("true", #{atempts: 2})"#,
        ])
        .code(1);
    assert!(
        bad.stderr.contains("unknown option \"atempts\""),
        "{}",
        bad.stderr
    );
}

#[test]
fn the_patch_and_rerun_example_runs_green() {
    let sim = Sim::new("4x16G");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/patch-and-rerun");
    let model_before = std::fs::read_to_string(example.join("model.py")).unwrap();
    let out = sim
        .run(&[
            "run",
            example.join("session.rhai").to_str().unwrap(),
            "--",
            example.to_str().unwrap(),
        ])
        .ok();
    assert!(
        out.stdout.contains("rerun_until: ok after 3 attempt(s)"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("KeyError: 'hidden_states'"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("IndexError: list index out of range"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("layer 4 hidden states:"),
        "{}",
        out.stdout
    );
    // Each crash left its two workers and their launchers (each `sim hold` keeps one alive
    // as its holder's parent): run() stopped them when the job's main process exited
    // (issue 10, defect 13), before rerun_until had to kill any holder.
    assert!(
        out.stderr
            .contains("the job left 4 process(es) running (stopped)"),
        "{}",
        out.stderr
    );
    // The repository's copy of the library is untouched, and the GPUs are free.
    assert_eq!(
        std::fs::read_to_string(example.join("model.py")).unwrap(),
        model_before
    );
    for g in 0..4 {
        assert_eq!(sim.used_mib(g), 0, "GPU {g}");
    }
}

/// A new user's report, round 7: `patch::rerun_until("true")` stopped every compute holder on
/// every GPU (any user's, as root) before its first attempt, and then failed on a daemon's
/// memory on a GPU the job did not use. The GPUs it cleans are now the job's (`gpus`, else
/// CUDA_VISIBLE_DEVICES); without either it cleans none; daemon memory does not hold it back.
#[test]
fn rerun_until_cleans_only_the_jobs_gpus_and_runs_beside_a_daemon() {
    let sim = Sim::new("2x8G");
    let other = *sim.hold(&["--gpu", "1", "--mib", "500"]).last().unwrap();
    sim.hold(&[
        "--gpu",
        "0",
        "--mib",
        "100",
        "--name",
        "nvidia-persistenced",
    ]);
    let script = |cvd: Option<&str>, job_env: &str| {
        let src = format!(
            r#"import "patch" as patch;
            let r = patch::rerun_until("true", #{{run: #{{echo: false{job_env}}}}});
            print(to_json(#{{ok: r.ok, killed: r.attempts[0].killed}}));"#
        );
        let p = sim.path().join("cvd.rhai");
        std::fs::write(&p, src).unwrap();
        let out = sim
            .run_with(&["run", p.to_str().unwrap()], |c| {
                c.env_remove("CUDA_VISIBLE_DEVICES");
                if let Some(v) = cvd {
                    c.env("CUDA_VISIBLE_DEVICES", v);
                }
            })
            .ok();
        let v: serde_json::Value =
            serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
        (v, out.stderr)
    };
    // Nothing says which GPUs the job uses: nothing is cleaned, and it says so.
    let (v, err) = script(None, "");
    assert_eq!(v, serde_json::json!({"ok": true, "killed": 0}), "{err}");
    assert!(err.contains("no GPU is cleaned"), "{err}");
    assert!(
        alive(other),
        "a holder on a GPU the job does not use was stopped"
    );
    // The job's own env names GPU 0, where only the daemon's memory is: it runs.
    let (v, err) = script(None, ", env: #{CUDA_VISIBLE_DEVICES: \"0\"}");
    assert_eq!(v, serde_json::json!({"ok": true, "killed": 0}), "{err}");
    assert!(alive(other));
    // The environment names GPU 1: its holder is in the job's way and is stopped.
    let (v, err) = script(Some("1"), "");
    assert_eq!(v, serde_json::json!({"ok": true, "killed": 1}), "{err}");
    assert!(gone_within(other, 10));
    assert_eq!(sim.used_mib(1), 0);
}
