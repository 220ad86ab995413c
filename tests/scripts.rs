//! Running scripts: exit codes, error rendering, ARGS, stdin, and the helpers.

use crate::support::*;

#[test]
fn a_syntax_error_exits_2_with_file_line_col_and_caret() {
    let sim = Sim::new("1x8G");
    let out = sim
        .script("bad.rhai", "let a = 1;\nlet b = a +* 2;\n", &[])
        .code(2);
    let p = sim.path().join("bad.rhai");
    assert!(
        out.stderr.contains(&format!("{}:2:", p.display())),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("let b = a +* 2;"), "{}", out.stderr);
    assert!(
        out.stderr.lines().any(|l| l.trim_end().ends_with('^')),
        "{}",
        out.stderr
    );
}

#[test]
fn a_runtime_error_exits_1_with_position() {
    let sim = Sim::new("1x8G");
    let out = sim
        .script("rt.rhai", "let x = 1;\nlet y = x + nope;\n", &[])
        .code(1);
    assert!(out.stderr.contains("rt.rhai:2:13"), "{}", out.stderr);
    assert!(out.stderr.contains("nope"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"));
}

#[test]
fn an_error_inside_a_function_points_into_it() {
    let sim = Sim::new("1x8G");
    let out = sim
        .script("f.rhai", "fn f(x) {\n  x.no_such_method()\n}\nf(1);\n", &[])
        .code(1);
    assert!(out.stderr.contains("f.rhai:2:"), "{}", out.stderr);
    assert!(out.stderr.contains("in call to f()"), "{}", out.stderr);
}

#[test]
fn exit_sets_the_code_and_throw_is_a_runtime_error() {
    let sim = Sim::new("1x8G");
    sim.script(
        "e.rhai",
        "print(\"before\"); exit(7); print(\"after\");",
        &[],
    )
    .code(7);
    sim.script("e0.rhai", "exit();", &[]).code(0);
    let out = sim.script("t.rhai", "throw \"boom\";", &[]).code(1);
    assert!(out.stderr.contains("boom"), "{}", out.stderr);
}

#[test]
fn args_reach_the_script_and_stdin_scripts_run() {
    let sim = Sim::new("1x8G");
    let out = sim
        .script(
            "a.rhai",
            "print(ARGS.len()); print(ARGS[1]);",
            &["x", "--flag"],
        )
        .ok();
    assert_eq!(out.stdout, "2\n--flag\n");
    let out = sim.run_with(&["run", "-"], |c| {
        c.write_stdin("print(gpu().len() + 40);");
    });
    assert_eq!(out.ok().stdout.trim(), "41");
}

#[test]
fn missing_script_and_check() {
    let sim = Sim::new("1x8G");
    let out = sim.run(&["run", "/nonexistent/x.rhai"]).code(2);
    assert!(out.stderr.contains("cannot read script"), "{}", out.stderr);
    std::fs::write(sim.path().join("good.rhai"), "let x = gpu();").unwrap();
    std::fs::write(sim.path().join("bad.rhai"), "let x = ;").unwrap();
    let good = sim.path().join("good.rhai");
    let bad = sim.path().join("bad.rhai");
    sim.run(&["check", good.to_str().unwrap()]).ok();
    let out = sim
        .run(&["check", good.to_str().unwrap(), bad.to_str().unwrap()])
        .code(2);
    assert!(out.stderr.contains("bad.rhai:1:"), "{}", out.stderr);
}

#[test]
fn helpers_files_json_env() {
    let sim = Sim::new("1x8G");
    let f = sim.path().join("lib.py");
    std::fs::write(&f, "a = 1\nb = a\n").unwrap();
    let code = format!(
        r#"let p = "{}";
           let n = replace_in_file(p, "a", "z");
           let j = parse_json("{{\"k\": [1, 2.5, null, true]}}");
           write_file(p + ".out", to_json(j));
           [n, read_file(p), file_exists(p + ".out"), file_exists("/no/such"), env("NO_SUCH_VAR_X"), j.k[1]]"#,
        f.display()
    );
    let v = sim.eval_json(&code);
    assert_eq!(
        v,
        serde_json::json!([2, "z = 1\nb = z\n", true, false, null, 2.5])
    );
    assert_eq!(
        std::fs::read_to_string(sim.path().join("lib.py.out")).unwrap(),
        r#"{"k":[1,2.5,null,true]}"#
    );
    let out = sim.run(&["eval", "parse_json(\"{oops\")"]).code(1);
    assert!(out.stderr.contains("parse_json"), "{}", out.stderr);
    let out = sim.run(&["eval", "read_file(\"/no/such/file\")"]).code(1);
    assert!(out.stderr.contains("/no/such/file"), "{}", out.stderr);
}

#[test]
fn retry_and_until() {
    let sim = Sim::new("1x8G");
    let v = sim.eval_json(
        r#"let n = 0;
           let r = retry(5, |i| { if i < 3 { throw "not yet " + i } i * 10 });
           let u = until(2, |i| i >= 3);
           let never = until(0.1, || false);
           [r, u, never]"#,
    );
    assert_eq!(v, serde_json::json!([30, true, false]));
    let out = sim
        .run(&["eval", "retry(2, || { throw \"always\" })"])
        .code(1);
    assert!(out.stderr.contains("always"), "{}", out.stderr);
    assert!(out.stderr.contains("attempt 1/2 failed"), "{}", out.stderr);
}

#[test]
fn log_and_warn_go_to_stderr() {
    let sim = Sim::new("1x8G");
    let out = sim
        .run(&[
            "eval",
            "log(\"hello\"); warn(\"careful\"); sleep(0.01); now() > 1.0e9",
        ])
        .ok();
    assert_eq!(out.stdout.trim(), "true");
    assert!(
        out.stderr.contains("hello") && out.stderr.contains("warning: careful"),
        "{}",
        out.stderr
    );
}

#[test]
fn sigint_stops_a_sleeping_script_with_130() {
    let sim = Sim::new("1x8G");
    let mut child = sim
        .std_cmd()
        .args(["eval", "print(\"started\"); sleep(60)"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "started");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
}

/// Issue 10, defect 7: `exit(-1)` exited 0 (clamped), and `exit("failed")`, `exit(false)`
/// and `exit(1.0)` exited 0. Integers map to their status (out of range: 1); anything else
/// exits 1 with the value on stderr.
#[test]
fn exit_keeps_the_status_and_never_turns_a_failure_into_success() {
    let sim = Sim::new("1x1G");
    for (code, status, stderr) in [
        ("exit(-1)", 1, ""),
        ("exit(256)", 1, ""),
        ("exit(7)", 7, ""),
        ("exit(255)", 255, ""),
        ("exit(0)", 0, ""),
        ("exit()", 0, ""),
        (r#"exit("failed")"#, 1, "failed"),
        ("exit(false)", 1, "false"),
        ("exit(1.0)", 1, "1.0"),
        ("exit(0.0)", 1, "0.0"),
        ("fn f() { exit(-5) } f()", 1, ""),
    ] {
        let out = sim.run(&["eval", code]).code(status);
        assert_eq!(out.stderr.trim(), stderr, "{code}");
    }
}

/// Issue 10, defect 8: `log(2.5)` called rhai's log10 and printed nothing, so
/// `log(now() - t0)` lost the message. log and warn accept any value.
#[test]
fn log_of_a_float_prints_it_instead_of_taking_a_logarithm() {
    let sim = Sim::new("1x1G");
    let out = sim
        .run(&[
            "eval",
            r#"log(2.5); log(3); log(true); log([1, "a"]); log(#{x: ()}); warn(0.5); warn(42); log(100.0, 10.0)"#,
        ])
        .ok();
    let lines: Vec<&str> = out.stderr.lines().collect();
    let want = ["2.5", "3", "true", "[1, \"a\"]", "#{\"x\": ()}"];
    for (line, want) in lines.iter().zip(want) {
        assert!(line.ends_with(&format!("] {want}")), "{line:?} vs {want}");
    }
    assert_eq!(lines[5], "warning: 0.5");
    assert_eq!(lines[6], "warning: 42");
    // The two-argument logarithm is still rhai's.
    assert_eq!(out.stdout.trim(), "2.0");
}

/// Issue 10, defect 11: `read_file()` on a FIFO blocked (and ignored Ctrl-C), and
/// `write_file()` on a FIFO replaced it with a regular file. Both refuse non-regular files.
#[test]
fn read_file_and_write_file_refuse_a_fifo_instead_of_blocking_or_replacing_it() {
    let sim = Sim::new("1x1G");
    let fifo = sim.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let f = fifo.display();
    for call in [
        format!(r#"read_file("{f}")"#),
        format!(r#"write_file("{f}", "x")"#),
        format!(r#"replace_in_file("{f}", "a", "b")"#),
        r#"read_file("/dev/null")"#.to_string(),
    ] {
        let out = sim.run(&["eval", &call]).code(1);
        assert!(
            out.stderr.contains("not a regular file"),
            "{call}: {}",
            out.stderr
        );
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
}

#[test]
fn a_misspelt_field_of_a_gpuloop_map_is_an_error_naming_the_fields() {
    let sim = Sim::new("1x8G");
    let out = sim
        .run(&[
            "eval",
            "let d = diagnose()[0];\nif d.verdikt != \"clean\" { 1 }",
        ])
        .code(1);
    assert!(
        out.stderr
            .contains("a diagnosis map has no field `verdikt`: did you mean `verdict`?")
            && out.stderr.contains("(fields: advice, ")
            && out.stderr.contains(", verdict)")
            && out.stderr.contains("<eval>:2:6"),
        "{}",
        out.stderr
    );
    // Scripts' own maps keep rhai's ways: a missing field reads as (), assigning adds it.
    assert_eq!(
        sim.eval("let m = #{a: 1}; m.b = 2; [m.b, m.zz ?? 7]"),
        "[2, 7]"
    );
}

#[test]
fn trim_returns_the_string_and_still_trims_in_place() {
    let sim = Sim::new("1x8G");
    assert_eq!(
        sim.eval("let s = run([\"echo\", \" hi \"], #{echo: false}).stdout.trim(); `[${s}]`"),
        "[hi]"
    );
    assert_eq!(sim.eval("let s = \" x \"; s.trim(); `[${s}]`"), "[x]");
    assert_eq!(
        sim.eval("let s = \" y \"; `[${s.trimmed()}][${s}]`"),
        "[y][ y ]"
    );
}

#[test]
fn retry_shows_each_failure_with_its_line_and_caret() {
    let sim = Sim::new("1x8G");
    let out = sim
        .run(&["eval", "retry(2, |i| {\n  throw `nope ${i}`\n})"])
        .code(1);
    let first = out.stderr.split("retry: attempt 2").next().unwrap();
    assert!(
        first.contains("retry: attempt 1/2 failed:\nerror: nope 1\n --> <eval>:2:3")
            && first.contains("2 |   throw `nope ${i}`\n  |   ^"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("Runtime error"), "{}", out.stderr);
    assert!(!out.stderr.contains("anon$"), "{}", out.stderr);
    // The last failure is the script's error, shown once.
    assert_eq!(out.stderr.matches("nope 2").count(), 1, "{}", out.stderr);
}

#[test]
fn check_and_run_resolve_imports_and_say_where_they_looked() {
    let sim = Sim::new("1x8G");
    let p = sim.path().join("imp.rhai");
    std::fs::write(&p, "import \"nosuchmod\" as m;\nm::f();\n").unwrap();
    let want = format!(
        "module not found: nosuchmod (looked in {}",
        sim.path().join("nosuchmod.rhai").display()
    );
    let out = sim.run(&["check", p.to_str().unwrap()]).code(2);
    assert!(
        out.stderr.contains(&want) && out.stderr.contains("the standard library (report"),
        "{}",
        out.stderr
    );
    let out = sim.run(&["run", p.to_str().unwrap()]).code(2);
    assert!(out.stderr.contains(&want), "{}", out.stderr);
    std::fs::write(&p, "import \"report\" as r;\n").unwrap();
    sim.run(&["check", p.to_str().unwrap()]).ok();
}

/// Issue 38, item 3: `gpuloop check` passed a script that called `holdrs([0,1])` and a
/// module's misspelt function, and neither the run's error nor an option's said what was meant.
#[test]
fn check_names_calls_nothing_defines_and_errors_say_what_was_meant() {
    let sim = Sim::new("2x8G");
    let p = sim.path().join("typo.rhai");
    std::fs::write(
        &p,
        "import \"report\" as report;\nfn tidy(f) { f(1) }\nlet h = holdrs([0, 1]);\nprint(report::sumary(h));\n",
    )
    .unwrap();
    let out = sim.run(&["check", p.to_str().unwrap()]).code(2);
    for want in [
        "no function `holdrs` is defined",
        "did you mean `holders`?",
        "typo.rhai:3:9",
        "no function `report::sumary` is defined",
        "did you mean `report::summary`?",
    ] {
        assert!(out.stderr.contains(want), "{want}\n{}", out.stderr);
    }
    // What the script defines, binds or imports is never reported.
    assert!(
        !out.stderr.contains("`f`") && !out.stderr.contains("tidy"),
        "{}",
        out.stderr
    );
    let out = sim.run(&["run", p.to_str().unwrap()]).code(1);
    assert!(
        out.stderr.contains("help: did you mean `holders`?"),
        "{}",
        out.stderr
    );
    let out = sim.run(&["eval", "holders(#{al: true})"]).code(1);
    assert!(out.stderr.contains("did you mean `all`?"), "{}", out.stderr);
}

/// Defect 4: script mistakes were runtime errors. `run clean-node -- --gpus 99` printed the
/// "before:" table, then `no GPU with index 99`, rc 1; `--timeout abc` a raw float-parsing
/// error, rc 1; a missing module rc 1 from `run` (after the lines above the import had run)
/// but rc 2 from `check`; slurm-site-policy threw (rc 1) for bad arguments.
#[test]
fn script_mistakes_are_usage_errors_found_before_anything_runs() {
    let sim = Sim::new("2x8G");
    for (args, want) in [
        (
            &["--gpu", "99"][..],
            "gpuloop: clean-node: --gpu 99: no GPU with index 99",
        ),
        (
            &["--gpus", "99"],
            "gpuloop: clean-node: --gpu 99: no GPU with index 99",
        ),
        (
            &["--", "--gpu", "99"],
            "gpuloop: clean-node: --gpu 99: no GPU with index 99",
        ),
        (
            &["--timeout", "abc"],
            "gpuloop: clean-node: --timeout \"abc\" is not seconds",
        ),
        (
            &["--grace", "-1"],
            "gpuloop: clean-node: --grace -1 is not a number of seconds",
        ),
        (
            &["--timeout"],
            "gpuloop: clean-node: --timeout needs a value: seconds",
        ),
    ] {
        let out = sim.run(&[&["run", "clean-node"], args].concat()).code(2);
        assert_eq!(out.stdout, "", "{args:?}: printed before the usage error");
        assert!(out.stderr.starts_with(want), "{args:?}: {}", out.stderr);
    }
    let policy = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/slurm-site-policy.rhai"
    );
    for (args, want) in [
        (&["--bogus"][..], "unknown argument --bogus"),
        (
            &["--max-temp", "hot"],
            "--max-temp \"hot\" is not a whole number",
        ),
    ] {
        let want = format!("gpuloop: {policy}: {want}");
        let out = sim.run(&[&["run", policy], args].concat()).code(2);
        assert!(out.stderr.starts_with(&want), "{args:?}: {}", out.stderr);
    }
    // A missing module: exit 2 from run and check alike, and run runs nothing first, also
    // where the import sits in a function body.
    for (name, src) in [
        ("top.rhai", "print(\"ran\");\nimport \"nosuchmod\" as m;\n"),
        (
            "fn.rhai",
            "fn f() { import \"nosuchmod\" as m; m::g() }\nprint(\"ran\");\nf();\n",
        ),
    ] {
        let p = sim.path().join(name);
        std::fs::write(&p, src).unwrap();
        let p = p.to_str().unwrap();
        let out = sim.run(&["run", p]).code(2);
        assert_eq!(out.stdout, "", "{name}: ran before the error");
        assert!(
            out.stderr.contains("module not found: nosuchmod"),
            "{}",
            out.stderr
        );
        sim.run(&["check", p]).code(2);
    }
    // One computed at run time can only fail then: still a usage error.
    let out = sim
        .run(&["eval", "let m = \"nosuch\" + \"mod\"; import m as x;"])
        .code(2);
    assert!(
        out.stderr.contains("module not found: nosuchmod"),
        "{}",
        out.stderr
    );
}

#[test]
fn usage_exits_2() {
    let sim = Sim::new("1x8G");
    let out = sim.run(&["eval", "usage(\"t.rhai GPU…\")"]).code(2);
    assert_eq!(out.stderr, "usage: t.rhai GPU…\n");
}

/// Issue 10, defect 10: `[].pad(2000000000, 0)`, 40 string doublings and `blob(1e11)`
/// aborted with out-of-memory (134), 100,000 nested arrays or maps with a stack overflow.
/// Each limit (array, string, map, calls, depth; config.toml `[limits]` or `--limit`) is a
/// script error instead.
#[test]
fn resource_limits_are_errors_never_an_abort() {
    let sim = Sim::new("1x1G");
    for (limit, code, want) in [
        ("", "[].pad(2000000000, 0)", "is more than the array limit"),
        ("", "blob(100000000000)", "is more than the array limit"),
        (
            "",
            r#""".pad(10000000000, "x")"#,
            "is more than the string limit",
        ),
        (
            "string=1M",
            r#"let s = "x"; for i in 0..40 { s += s; } s.len()"#,
            "holds a string longer than 1048576, the string limit",
        ),
        (
            "array=500",
            "let a = []; for i in 0..100000 { a = [a]; } 1",
            "holds more array elements than 500, the array limit",
        ),
        (
            "map=500",
            "let m = #{}; for i in 0..100000 { m = #{x: m}; } 1",
            "holds more map entries than 500, the map limit",
        ),
        // Issue 33, item 5: nesting 200,000 deep took over an hour (each step measured the
        // whole value); it ends at the depth limit, in milliseconds.
        (
            "",
            "let a = []; for i in 0..200000 { a = [a]; } 1",
            "nested deeper than 1000, the depth limit",
        ),
        (
            "",
            "let m = #{}; for i in 0..200000 { m = #{x: m}; } 1",
            "nested deeper than 1000, the depth limit",
        ),
        (
            "",
            "fn f(n) { if n == 0 { 0 } else { 1 + f(n - 1) } } f(100000)",
            "nested deeper than the calls limit",
        ),
        ("depth=5", "[[[[[[[1]]]]]]]", "more than 5 deep"),
        ("depth=5", "to_json([[[[[[[1]]]]]]])", "more than 5 deep"),
    ] {
        let mut args = vec![];
        if !limit.is_empty() {
            args.extend(["--limit", limit]);
        }
        args.extend(["eval", code]);
        let out = sim.run(&args).code(1);
        assert!(out.stderr.contains(want), "{code}: {}", out.stderr);
        assert!(out.stderr.contains("--limit"), "{code}: {}", out.stderr);
    }
    // The REPL prints through the same check (it walked any value it was handed).
    let out = sim
        .cmd()
        .args(["--limit", "depth=5", "repl"])
        .write_stdin("[[[[[[[1]]]]]]]\n")
        .output()
        .expect("gpuloop repl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("more than 5 deep"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // Within the limits all is as before, and config.toml sets them too.
    assert_eq!(sim.eval("[[[[[[[1]]]]]]].len()"), "1");
    let cfg = sim.path().join("config/gpuloop");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(cfg.join("config.toml"), "[limits]\narray = 10\n").unwrap();
    let out = sim.run(&["eval", "[].pad(11, 0)"]).code(1);
    assert!(
        out.stderr.contains("more than the array limit of 10"),
        "{}",
        out.stderr
    );
    assert_eq!(sim.eval("let a = []; a.pad(10, 0); a.len()"), "10");
    for bad in ["nope=1", "array=0", "array", "string=1Q"] {
        let out = sim.run(&["--limit", bad, "eval", "1"]).code(2);
        assert!(out.stderr.contains("--limit"), "{bad}: {}", out.stderr);
    }
    std::fs::write(cfg.join("config.toml"), "[limits]\narrays = 10\n").unwrap();
    let out = sim.run(&["eval", "1"]).code(2);
    assert!(out.stderr.contains("unknown field"), "{}", out.stderr);
}

/// Issue: a script with a `#!` first line (made executable, run as a program) did not
/// compile under `gpuloop run` though a module's did. The line is left blank, so an error
/// further down still names its own line.
#[test]
fn a_shebang_first_line_is_skipped_and_line_numbers_hold() {
    let sim = Sim::new("1x8G");
    let shebang = "#!/usr/bin/env -S gpuloop run\n";
    let out = sim
        .script(
            "ok.rhai",
            &format!("{shebang}print(gpu().len() + 41);\n"),
            &[],
        )
        .ok();
    assert_eq!(out.stdout.trim(), "42", "{}", out.stderr);
    let out = sim.run_with(&["run", "-"], |c| {
        c.write_stdin(format!("{shebang}print(gpu().len() + 1);\n"));
    });
    assert_eq!(out.ok().stdout.trim(), "2");
    let out = sim
        .script(
            "bad.rhai",
            &format!("{shebang}let a = 1;\nlet b = a +* 2;\n"),
            &[],
        )
        .code(2);
    let p = sim.path().join("bad.rhai");
    assert!(
        out.stderr.contains(&format!("{}:3:", p.display())),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("let b = a +* 2;"), "{}", out.stderr);
}

/// A script's `env("GPULOOP_EXE")` is this very gpuloop, as in a job's environment, whatever
/// the inherited variable says: gpuloop answers it without setting its own environment.
#[test]
fn env_gpuloop_exe_is_this_gpuloop_not_an_inherited_value() {
    let sim = Sim::new("1x8G");
    let exe = bin().canonicalize().unwrap();
    let out = sim
        .run_with(
            &[
                "eval",
                r#"[env("GPULOOP_EXE"), run("printf %s \"$GPULOOP_EXE\"", #{echo: false}).stdout]"#,
            ],
            |c| {
                c.env("GPULOOP_EXE", "/elsewhere/gpuloop");
            },
        )
        .ok();
    let want = exe.display().to_string();
    assert_eq!(
        out.stdout.trim(),
        format!(r#"["{want}", "{want}"]"#),
        "{}",
        out.stderr
    );
}

/// write_file wrote its temporary (`.NAME.gpuloop-tmp`, a name anyone could guess) through
/// whatever was there: a link planted at that name made gpuloop (root, in an epilog) overwrite
/// the link's target, and a FIFO there hung it. Its temporary is now a new file of its own,
/// never a name found there; a directory link of another account's on the way is not followed.
#[test]
fn write_file_never_writes_through_a_planted_link_nor_waits_on_a_fifo() {
    let sim = Sim::new("1x8G");
    let dir = sim.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    let victim = sim.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join(".report.txt.gpuloop-tmp")).unwrap();
    let fifo = std::ffi::CString::new(dir.join(".other.gpuloop-tmp").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let (report, other) = (dir.join("report.txt"), dir.join("other"));
    sim.run(&[
        "eval",
        &format!(
            r#"write_file("{}", "new"); write_file("{}", "x"); replace_in_file("{}", "new", "newer")"#,
            report.display(),
            other.display(),
            report.display()
        ),
    ])
    .ok();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "newer");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "x");
    assert!(!std::fs::symlink_metadata(&report).unwrap().is_symlink());
    if unsafe { libc::geteuid() } == 0 {
        // Another account's link to a directory: not followed, nothing written there.
        let elsewhere = sim.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = sim.path().join("theirs");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), None).unwrap();
        let out = sim
            .run(&[
                "eval",
                &format!(r#"write_file("{}/f", "x")"#, link.display()),
            ])
            .code(1);
        assert!(
            out.stderr
                .contains("owned by uid 65534 (another account's)"),
            "{}",
            out.stderr
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
