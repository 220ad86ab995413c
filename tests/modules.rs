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
    let sim = Sim::new("2x8G");
    let p = sim.hold(&["--gpu", "1", "--mib", "42", "--name", "trainer"])[0];
    let out = sim
        .script(
            "r.rhai",
            "import \"report\" as r; print(r::summary());",
            &[],
        )
        .ok();
    assert!(
        out.stdout
            .contains("2 GPU(s), 1 with memory used, 1 compute holder(s)"),
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
