//! `import` from each resolver level: script dir, GPULOOP_PATH, config dir, embedded stdlib.

use crate::support::*;

#[test]
fn imports_resolve_in_order() {
    let sim = Sim::new("2x8G");
    let root = sim.path();
    let (scripts, path1, path2, cfg) = (
        root.join("scripts"),
        root.join("p1"),
        root.join("p2"),
        root.join("config/gpuloop/modules"),
    );
    for d in [&scripts, &path1, &path2, &cfg] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(scripts.join("local.rhai"), "fn who() { \"script-dir\" }").unwrap();
    std::fs::write(path2.join("onpath.rhai"), "fn who() { \"gpuloop-path\" }").unwrap();
    std::fs::write(cfg.join("user.rhai"), "fn who() { \"config-dir\" }").unwrap();
    // The script dir wins over GPULOOP_PATH, which wins over the config dir and the stdlib.
    std::fs::write(path1.join("local.rhai"), "fn who() { \"shadowed\" }").unwrap();
    std::fs::write(cfg.join("onpath.rhai"), "fn who() { \"shadowed\" }").unwrap();
    std::fs::write(cfg.join("report.rhai"), "fn who() { \"user-report\" }").unwrap();
    let main = scripts.join("main.rhai");
    std::fs::write(
        &main,
        r#"import "local" as a; import "onpath" as b; import "user" as c; import "report" as d;
           import "cleanup" as e;
           print(a::who()); print(b::who()); print(c::who()); print(d::who());"#,
    )
    .unwrap();
    let gpuloop_path = format!("{}:{}", path1.display(), path2.display());
    let out = sim
        .run_with(&["run", main.to_str().unwrap()], |c| {
            c.env("GPULOOP_PATH", &gpuloop_path);
        })
        .ok();
    assert_eq!(
        out.stdout,
        "script-dir\ngpuloop-path\nconfig-dir\nuser-report\n"
    );
}

#[test]
fn the_stdlib_report_module_summarises() {
    let sim = Sim::new("3x8G");
    let p = sim.hold(&["--gpu", "1", "--mib", "42", "--name", "trainer"])[0];
    // A new user's report, round 7: a GPU whose only memory is a daemon's read "free".
    sim.hold(&[
        "--gpu",
        "2",
        "--mib",
        "100",
        "--name",
        "nvidia-persistenced",
    ]);
    let out = sim
        .script(
            "r.rhai",
            "import \"report\" as r; print(r::summary());",
            &[],
        )
        .ok();
    assert!(
        out.stdout
            .contains("3 GPU(s), 2 with memory used, 1 compute holder(s)"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("GPU 1: 42/8192 MiB  trainer({p})")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("GPU 0: 0/8192 MiB  free"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("GPU 2: 100/8192 MiB  no compute holder (diagnose() says whose)"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_missing_module_is_a_clear_error() {
    let sim = Sim::new("1x8G");
    let out = sim
        .script("m.rhai", "import \"no_such_module\" as m;", &[])
        .code(2);
    assert!(out.stderr.contains("no_such_module"), "{}", out.stderr);
    assert!(out.stderr.contains("m.rhai:1:"), "{}", out.stderr);
}

/// Issue 10, defect 9: `cleanup::ensure_clean(0, #{graze: 0.2, tiemout: 1})` silently used
/// defaults, `patch::rerun_until` checked `fix` only after a failure, and errors like
/// "Function not found: ! (i64)" named no option. The stdlib checks its options with the
/// built-ins' helper (`check_opts`), before it does anything.
#[test]
fn stdlib_options_are_checked_up_front_and_errors_name_the_option() {
    let sim = Sim::new("1x1G");
    let ran = sim.path().join("ran");
    for (code, want) in [
        (
            r#"import "cleanup" as c; c::ensure_clean(0, #{graze: 0.2, tiemout: 1})"#.to_string(),
            r#"cleanup::ensure_clean: unknown option "graze""#.to_string(),
        ),
        (
            r#"import "cleanup" as c; c::ensure_clean(0, #{allow_reset: 1})"#.to_string(),
            "cleanup::ensure_clean: option allow_reset must be true or false".to_string(),
        ),
        (
            r#"import "cleanup" as c; c::ensure_clean(0, #{timeout: -2})"#.to_string(),
            "cleanup::ensure_clean: option timeout: -2 is not a number of seconds".to_string(),
        ),
        (
            format!(
                r#"import "patch" as p; p::rerun_until("touch {}", #{{fix: 3}})"#,
                ran.display()
            ),
            "patch::rerun_until: option fix must be a closure (Fn)".to_string(),
        ),
        (
            format!(
                r#"import "patch" as p; p::rerun_until("touch {}", #{{run: #{{tiemout: 1}}}})"#,
                ran.display()
            ),
            r#"patch::rerun_until: option run: unknown option "tiemout""#.to_string(),
        ),
        (
            r#"check_opts("mine::f", #{n: "x"}, #{n: "int|array"})"#.to_string(),
            "mine::f: option n must be an integer or an array, not a string".to_string(),
        ),
    ] {
        let out = sim.run(&["eval", &code]).code(1);
        assert!(out.stderr.contains(&want), "{code}: {}", out.stderr);
        assert!(!out.stderr.contains("Runtime error"), "{}", out.stderr);
    }
    assert!(
        !ran.exists(),
        "rerun_until ran the job before checking its options"
    );
    assert_eq!(
        sim.eval(r#"to_json(check_opts("f", (), #{a: "int"})) + to_json(check_opts("f", #{a: 1}, #{a: "int"}))"#),
        r#"{}{"a":1}"#
    );
}

/// Reads a pid a background holder wrote to `path` (bounded wait).
fn pid_in(path: &std::path::Path) -> i32 {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(p) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
            return p;
        }
        assert!(std::time::Instant::now() < end, "no pid in {path:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// SPEC's stdlib has "vLLM/torchrun worker cleanup"; there was no such module. `workers`
/// groups the holders into jobs (a launcher and its workers; a holder started by a holder, as
/// vLLM's engine core starts its workers) and stops one job whole, its restarter included.
#[test]
fn workers_groups_jobs_and_stops_one_whole_with_its_restarter() {
    let sim = Sim::new("4x8G");
    let plain = sim.hold(&["--gpu", "0", "--mib", "100", "--workers", "2"]);
    let sup = sim.hold(&["--gpu", "1", "--mib", "50", "--supervise"]);
    // A vLLM-shaped chain, orphaned: an "engine core" holding GPU 2 whose child holds it too.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let mut c = sim.std_cmd();
    c.env("GPULOOP_BIN", bin());
    let status = std::process::Command::new("setsid")
        .args([
            "-f",
            "bash",
            "-c",
            &format!(
                r#""$GPULOOP_BIN" sim hold --foreground --gpu 2 --mib 30 > {d}/worker & exec -a VLLM_EngineCore "$GPULOOP_BIN" sim hold --foreground --gpu 2 --mib 40 > {d}/engine"#
            ),
        ])
        .envs(c.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .status()
        .expect("setsid");
    assert!(status.success());
    let (engine, worker) = (
        pid_in(&dir.path().join("engine")),
        pid_in(&dir.path().join("worker")),
    );
    sim.adopt(engine);
    sim.adopt(worker);
    // Review, round 7: two unrelated jobs that one daemon (here a "crond", a copy of bash by
    // that name) started through shells of their own sessions were one job, because they
    // shared that distant launcher; stop() would have taken both.
    let crond = dir.path().join("crond");
    std::fs::copy("/bin/bash", &crond).unwrap();
    // Each job's shell stays the holder's parent (`; :`); the holder's errors reach the
    // test's stderr (fd 3), the shell's report of its end ("Terminated", "Killed") does not.
    let one = |gpu: u32, out: &str| {
        format!(
            r#"setsid bash -c '"$GPULOOP_BIN" sim hold --foreground --gpu {gpu} --mib 10 > {d}/{out} 2>&3 3>&-; :' 3>&2 2>/dev/null &"#
        )
    };
    let mut cron = std::process::Command::new(&crond)
        .args([
            "-c",
            &format!("{} {} wait", one(0, "cron_a"), one(3, "cron_b")),
        ])
        .envs(c.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .spawn()
        .expect("crond");
    let (cron_a, cron_b) = (
        pid_in(&dir.path().join("cron_a")),
        pid_in(&dir.path().join("cron_b")),
    );
    sim.adopt(cron_a);
    sim.adopt(cron_b);

    let jobs = sim.eval_json(
        r#"import "workers" as w;
        w::jobs().map(|j| #{kind: j.kind, launcher: if j.launcher == () { 0 } else { j.launcher.pid },
                            orphaned: j.orphaned, pids: j.pids, gpus: j.gpus, mem_mib: j.mem_mib})"#,
    );
    let pids = |v: &serde_json::Value| {
        let mut p: Vec<i64> = v["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        p.sort();
        p
    };
    assert_eq!(jobs.as_array().unwrap().len(), 5, "{jobs}");
    for p in [cron_a, cron_b] {
        let mine: Vec<&serde_json::Value> = jobs
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["pids"].as_array().unwrap().contains(&p.into()))
            .collect();
        assert_eq!(mine.len(), 1, "{jobs}");
        assert_eq!(pids(mine[0]), [p as i64], "cron's jobs were joined: {jobs}");
        assert_eq!(mine[0]["launcher"], 0, "{jobs}");
    }
    // Largest first: the two workers of GPU 0 (200 MiB), the vLLM chain (70), the supervised one.
    assert_eq!(jobs[0]["launcher"], plain[0], "{jobs}");
    assert_eq!(pids(&jobs[0]), [plain[1] as i64, plain[2] as i64], "{jobs}");
    assert_eq!(jobs[0]["gpus"], serde_json::json!([0]));
    let mut chain = [engine as i64, worker as i64];
    chain.sort();
    assert_eq!(pids(&jobs[1]), chain, "{jobs}");
    assert_eq!(jobs[1]["kind"], "vllm", "{jobs}");
    assert_eq!(jobs[1]["orphaned"], true, "{jobs}");
    assert_eq!(jobs[1]["mem_mib"], 70, "{jobs}");
    assert_eq!(jobs[2]["launcher"], sup[0], "{jobs}");

    // Stopping the supervised job takes its supervisor too, once it has shown it restarts
    // (a clean saw it start its holder again); the others run on, one of them on the same
    // GPU (its memory stays: the job is done when the driver lists none of its own).
    let out = sim
        .run(&["clean", "--gpu", "1", "--grace", "2", "--settle", "5"])
        .code(1);
    assert!(out.stdout.contains("respawning"), "{}", out.stdout);
    let again = sim.eval("until(60, || holders(1).len() > 0); holders(1)[0].ppid");
    assert_eq!(again, sup[0].to_string());
    let beside = *sim
        .hold(&["--gpu", "1", "--mib", "20", "--setsid"])
        .last()
        .unwrap();
    // Its parent is stopped only when asked (parents: true), as clean --parents.
    let dry = sim.eval_json(&format!(
        r#"import "workers" as w;
        let j = w::jobs(1).filter(|j| j.launcher != () && j.launcher.pid == {})[0];
        [w::stop(j, #{{dry_run: true}}).kill.would_signal, w::stop(j, #{{dry_run: true, parents: true}}).kill.would_signal]"#,
        sup[0]
    ));
    assert!(
        !dry[0].as_array().unwrap().contains(&sup[0].into()),
        "{dry}"
    );
    assert!(dry[1].as_array().unwrap().contains(&sup[0].into()), "{dry}");
    let r = sim.eval_json(&format!(
        r#"import "workers" as w;
        let j = w::jobs(1).filter(|j| j.launcher != () && j.launcher.pid == {})[0];
        let r = w::stop(j, #{{grace: 2, parents: true}});
        #{{signalled: r.kill.signalled, clean: r.clean, shared_gpus: r.shared_gpus, left: r.kill.restarters}}"#,
        sup[0]
    ));
    assert_eq!(r["clean"], true, "{r}");
    assert_eq!(r["shared_gpus"], true, "{r}");
    assert!(alive(beside), "the other job on the same GPU was stopped");
    assert!(
        r["signalled"].as_array().unwrap().contains(&sup[0].into()),
        "{r}"
    );
    assert_eq!(r["left"], serde_json::json!([]), "{r}");
    assert!(gone_within(sup[0], 10));
    for p in [plain[1], plain[2], engine, worker, cron_a, cron_b] {
        assert!(alive(p), "pid {p} of another job was stopped");
    }
    // The orphaned chain goes whole.
    let r = sim.eval_json(r#"import "workers" as w; w::stop(w::jobs(2)[0], #{grace: 2}).clean"#);
    assert_eq!(r, true);
    assert!(gone_within(engine, 10) && gone_within(worker, 10));
    assert_eq!(sim.used_mib(2), 0);
    assert!(alive(plain[1]));
    // One of cron's jobs goes alone.
    let r = sim.eval_json(&format!(
        r#"import "workers" as w; w::stop(w::jobs().filter(|j| j.pids.contains({cron_a}))[0], #{{grace: 2}}).kill.signalled"#
    ));
    assert_eq!(r, serde_json::json!([cron_a]), "{r}");
    assert!(gone_within(cron_a, 10) && alive(cron_b));
    // Our "crond" (by pid, its child); cron_b is the simulator's to end (adopted).
    let _ = cron.kill();
    let _ = cron.wait();
}

fn chmod(p: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A module that writes `marker` when it is imported, and has `who()`.
fn marking_module(dir: &std::path::Path, name: &str, marker: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.rhai")),
        format!(
            "write_file({:?}, \"imported\");\nfn who() {{ \"{name}\" }}\n",
            marker.display().to_string()
        ),
    )
    .unwrap();
}

/// `import` read a module from any directory the script's, GPULOOP_PATH and the user's
/// modules directory named, whoever could write it: as root, a module in a directory another
/// account owns ran as root. Every import path now reads a module only when it and every
/// directory above it are root's or the invoker's and writable by no one else, and no link;
/// a refused one is an error naming the file and why, never passed over for the next.
#[test]
#[ignore = "needs root: makes directories and files of another user (nobody)"]
fn modules_another_account_can_write_are_refused_on_every_import_path() {
    require_root("to make files of another user");
    let sim = Sim::new("1x8G");
    let root = sim.path();
    let marker = root.join("imported");
    let scripts = root.join("scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    let main = scripts.join("main.rhai");
    std::fs::write(&main, "import \"helper\" as h;\nprint(h::who());\n").unwrap();
    let run = |path: Option<&std::path::Path>| {
        sim.run_with(&["run", main.to_str().unwrap()], |c| {
            if let Some(p) = path {
                c.env("GPULOOP_PATH", p);
            }
        })
    };
    let refused = |out: Out, file: &std::path::Path, why: &str| {
        let out = out.code(2);
        assert!(
            out.stderr
                .contains(&format!("module {} is refused", file.display()))
                && out.stderr.contains(why)
                && out.stderr.contains("writable by no one else"),
            "{}",
            out.stderr
        );
        assert!(!marker.exists(), "a refused module ran");
    };

    // GPULOOP_PATH: a directory of nobody's.
    let theirs = root.join("theirs");
    marking_module(&theirs, "helper", &marker);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    refused(
        run(Some(&theirs)),
        &theirs.join("helper.rhai"),
        "theirs is owned by nobody, not by root",
    );
    // GPULOOP_PATH through a link nobody made (it could point anywhere, at any time), to a
    // directory that passes; through root's own link, it is read.
    let good = root.join("good");
    marking_module(&good, "helper", &marker);
    let via = root.join("via");
    std::os::unix::fs::symlink(&good, &via).unwrap();
    std::os::unix::fs::lchown(&via, Some(65534), Some(65534)).unwrap();
    refused(
        run(Some(&via)),
        &via.join("helper.rhai"),
        "via is owned by nobody, not by root",
    );
    std::os::unix::fs::lchown(&via, Some(0), Some(0)).unwrap();
    assert_eq!(run(Some(&via)).ok().stdout.trim(), "helper");
    std::fs::remove_file(&marker).unwrap();
    // The user's modules directory, writable by its group.
    let mine = root.join("config/gpuloop/modules");
    marking_module(&mine, "helper", &marker);
    chmod(&mine, 0o775);
    refused(
        run(None),
        &mine.join("helper.rhai"),
        "modules is writable by its group (mode 0775)",
    );
    chmod(&mine, 0o755);
    // The script's own directory: a module there that nobody owns, or a link.
    marking_module(&scripts, "helper", &marker);
    std::os::unix::fs::chown(scripts.join("helper.rhai"), Some(65534), Some(65534)).unwrap();
    refused(
        run(None),
        &scripts.join("helper.rhai"),
        "helper.rhai is owned by nobody",
    );
    std::fs::remove_file(scripts.join("helper.rhai")).unwrap();
    std::os::unix::fs::symlink(mine.join("helper.rhai"), scripts.join("helper.rhai")).unwrap();
    refused(
        run(None),
        &scripts.join("helper.rhai"),
        "helper.rhai is a symbolic link",
    );
    std::fs::remove_file(scripts.join("helper.rhai")).unwrap();
    // `gpuloop check` refuses it as running would.
    let out = sim.run_with(&["check", main.to_str().unwrap()], |c| {
        c.env("GPULOOP_PATH", &theirs);
    });
    refused(out, &theirs.join("helper.rhai"), "is owned by nobody");

    // A directory that fails the checks but has no such module hides nothing: the import
    // goes on to the next place (here the user's modules, then the standard library).
    std::fs::remove_file(theirs.join("helper.rhai")).unwrap();
    assert_eq!(run(Some(&theirs)).ok().stdout.trim(), "helper");
    std::fs::remove_file(&marker).unwrap();
    std::fs::write(&main, "import \"report\" as r;\nprint(r::summary());\n").unwrap();
    run(Some(&theirs)).ok();
}

/// A built-in recipe imported its modules (clean-node's `cleanup`) from GPULOOP_PATH and the
/// user's modules directory before the standard library, so whatever those named ran inside
/// `clean-node` or `preflight`, as root under an epilog. It imports the standard library
/// compiled into gpuloop, nothing else; a script of the user's still imports their modules.
#[test]
fn built_in_recipes_import_only_the_standard_library() {
    let sim = Sim::new("1x8G");
    let root = sim.path();
    let marker = root.join("imported");
    let on_path = root.join("on-path");
    for dir in [on_path.clone(), root.join("config/gpuloop/modules")] {
        for name in ["cleanup", "checks", "report", "workers", "patch"] {
            marking_module(&dir, name, &marker);
        }
    }
    let with_path = |c: &mut assert_cmd::Command| {
        c.env("GPULOOP_PATH", &on_path);
    };
    let out = sim
        .run_with(&["run", "clean-node", "--timeout", "1"], with_path)
        .ok();
    assert!(out.stdout.contains("clean in"), "{}", out.stdout);
    sim.run_with(&["check", "clean-node"], with_path).ok();
    sim.run_with(&["run", "preflight", "--quiet"], with_path);
    sim.run_with(&["run", "vllm", "--dry-run"], with_path).ok();
    assert!(
        !marker.exists(),
        "a built-in recipe imported a module of GPULOOP_PATH"
    );
    // A script of one's own imports from GPULOOP_PATH, as it always did.
    let out = sim
        .run_with(&["eval", "import \"cleanup\" as c; c::who()"], with_path)
        .ok();
    assert_eq!(out.stdout.trim(), "cleanup");
    assert!(marker.exists());
}
