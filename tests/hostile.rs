//! Every function a script can call, called with every wrong type and out-of-range value
//! (issue 10): a clear script error each time (or a defined result), never a panic, an
//! abort or a Rust debug dump. The list of functions comes from the engine's metadata, so
//! a function registered without a row here fails the test.

use gpuloop::script::doc;
use gpuloop::script::engine::{build_engine, EngineOpts};
use gpuloop::session::{BackendChoice, Session};
use rhai::EvalAltResult;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a hostile call must do besides not panicking.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    /// A script error (a runtime error, or the script ending through exit/usage).
    Err,
    /// Any result: the value is defined for this input (log of anything, kill(0) refused
    /// in its report, …).
    Any,
}
use Want::{Any, Err};

/// name → hostile calls. `$DIR` is a private directory, `$FILE` a file in it.
fn table() -> BTreeMap<&'static str, Vec<(&'static str, Want)>> {
    let job_receivers = |f: &'static str| -> Vec<(&'static str, Want)> {
        match f {
            "wait" => vec![
                ("wait(5)", Err),
                ("wait(\"x\", 1)", Err),
                ("wait((), -1)", Err),
            ],
            "running" => vec![("running(5)", Err), ("running(())", Err)],
            "get$pid" => vec![("5.pid", Err), ("\"x\".pid", Err)],
            "get$host" => vec![("5.host", Err), ("[1].host", Err)],
            "to_string" => vec![("to_string(())", Any), ("to_string([1])", Any)],
            "to_debug" => vec![("to_debug(())", Any), ("to_debug(#{a: [1]})", Any)],
            _ => vec![],
        }
    };
    let mut t: BTreeMap<&'static str, Vec<(&'static str, Want)>> = BTreeMap::new();
    let sel_rows = |f: &'static str| -> Vec<(String, Want)> {
        [
            "-1",
            "99",
            "1.5",
            "\"x\"",
            "[1.5]",
            "[()]",
            "#{}",
            "9223372036854775807",
            "[-1, 0]",
        ]
        .iter()
        .map(|v| (format!("{f}({v})"), Err))
        .collect()
    };
    let leak = |v: Vec<(String, Want)>| -> Vec<(&'static str, Want)> {
        v.into_iter()
            .map(|(s, w)| (&*Box::leak(s.into_boxed_str()), w))
            .collect()
    };
    // holders(), diagnose() and wait_clean() take an options map alone (every GPU): an empty
    // one is a fine call; an unknown option in it is not.
    let opts_alone = |f: &'static str| -> Vec<(String, Want)> {
        sel_rows(f)
            .into_iter()
            .map(|(c, w)| match c.ends_with("(#{})") {
                true => (format!("{f}(#{{bogus: 1}})"), Err),
                false => (c, w),
            })
            .collect()
    };
    t.insert("gpu", leak(sel_rows("gpu")));
    let mut holders = leak(opts_alone("holders"));
    holders.extend([
        ("holders(0, #{all: 1})", Err),
        ("holders(0, #{bogus: 1})", Err),
        ("holders(0, 5)", Err),
        ("holders((), #{user: 5})", Any),
    ]);
    t.insert("holders", holders);
    t.insert("diagnose", leak(opts_alone("diagnose")));
    let mut wait_clean = leak(opts_alone("wait_clean"));
    wait_clean.extend([
        ("wait_clean(0, #{timeout: -1})", Err),
        ("wait_clean(0, #{timeout: \"x\"})", Err),
        ("wait_clean(0, #{timeout: 1e300})", Err),
        ("wait_clean(0, #{max_used_mib: 1.5})", Err),
        ("wait_clean(0, #{bogus: 1})", Err),
        ("wait_clean(0, 5)", Err),
    ]);
    t.insert("wait_clean", wait_clean);
    let mut reset = leak(sel_rows("reset_gpu"));
    reset.retain(|(c, _)| !c.contains("[-1, 0]"));
    reset.extend([
        ("reset_gpu(0, #{bogus: 1})", Err),
        ("reset_gpu(0, #{grace: -1})", Err),
        ("reset_gpu(0, #{timeout: \"x\"})", Err),
        ("reset_gpu(0, #{force: 1})", Err),
        ("reset_gpu(0, 5)", Err),
    ]);
    t.insert("reset_gpu", reset);
    let mut blockers = leak(sel_rows("reset_blockers"));
    blockers.retain(|(c, _)| !c.contains("[-1, 0]"));
    t.insert("reset_blockers", blockers);
    t.insert(
        "xids",
        vec![
            ("xids(\"x\")", Err),
            ("xids(#{})", Err),
            ("xids([1.5], 0)", Err),
            ("xids(0, \"x\")", Err),
            ("xids(\"zz\", 0)", Err),
            ("xids(1e300)", Any),
        ],
    );
    t.insert(
        "kill",
        vec![
            ("kill(-1)", Any),
            ("kill(0)", Any),
            ("kill(1)", Any),
            ("kill(9223372036854775807)", Err),
            ("kill(-9223372036854775807)", Err),
            ("kill(\"1\")", Err),
            ("kill(1.5)", Err),
            ("kill([1.5])", Err),
            ("kill([[1]])", Any),
            ("kill(#{pid: 1})", Err),
            ("kill(#{pid: 1, start: \"123\"})", Err),
            ("kill(#{pid: \"x\", start: 1})", Err),
            ("kill(#{pid: 2, start: -1})", Err),
            ("kill(0, #{signal: \"NOPE\"})", Err),
            ("kill(0, #{signal: 5000})", Err),
            ("kill(0, #{grace: -1})", Err),
            ("kill(0, #{grace: \"x\"})", Err),
            ("kill(0, #{bogus: 1})", Err),
            ("kill(0, 5)", Err),
            ("kill((), #{})", Err),
        ],
    );
    let job_rows = |f: &'static str| -> Vec<(String, Want)> {
        [
            "42",
            "()",
            "[]",
            "[()]",
            "[[\"a\"]]",
            "\"\"",
            "\"   \"",
            "#{}",
            "\"true\", #{timeout: -1}",
            "\"true\", #{timeout: \"x\"}",
            "\"true\", #{grace: -1}",
            "\"true\", #{env: 5}",
            "\"true\", #{env: #{A: [1]}}",
            "\"true\", #{cwd: 5}",
            "\"true\", #{echo: 1}",
            "\"true\", #{check: \"yes\"}",
            "\"true\", #{keep_children: 1}",
            "\"true\", #{host: 5}",
            "\"true\", #{host: \"nowhere\"}",
            "\"true\", #{bogus: 1}",
            "\"true\", 5",
        ]
        .iter()
        .map(|v| (format!("{f}({v})"), Err))
        .collect()
    };
    t.insert("run", leak(job_rows("run")));
    t.insert("spawn", leak(job_rows("spawn")));
    for f in [
        "wait",
        "running",
        "get$pid",
        "get$host",
        "to_string",
        "to_debug",
    ] {
        t.insert(f, job_receivers(f));
    }
    t.get_mut("kill")
        .expect("kill row")
        .extend([("kill(\"x\", #{})", Err)]);
    t.insert(
        "sleep",
        vec![
            ("sleep(-1)", Err),
            ("sleep(-0.5)", Err),
            ("sleep(1e300)", Err),
            ("sleep(\"x\")", Err),
            ("sleep(())", Err),
        ],
    );
    t.insert("now", vec![("now(1)", Err)]);
    t.insert("hosts", vec![("hosts(1)", Err), ("hosts(\"x\")", Err)]);
    let any_value = |f: &'static str| -> Vec<(String, Want)> {
        [
            "()", "2.5", "-1", "[1, [2]]", "#{a: ()}", "true", "'c'", "blob(3)", "|| 1",
        ]
        .iter()
        .map(|v| (format!("{f}({v})"), Any))
        .collect()
    };
    t.insert("log", leak(any_value("log")));
    t.insert("warn", leak(any_value("warn")));
    t.insert(
        "env",
        vec![
            ("env(5)", Err),
            ("env(())", Err),
            ("env(\"\")", Any),
            ("env(\"A=B\")", Any),
        ],
    );
    t.insert(
        "read_file",
        vec![
            ("read_file(\"/nonexistent/x\")", Err),
            ("read_file(\"\")", Err),
            ("read_file(\"/dev/null\")", Err),
            ("read_file(\"$DIR\")", Err),
            ("read_file(5)", Err),
        ],
    );
    t.insert(
        "write_file",
        vec![
            ("write_file(\"\", \"x\")", Err),
            ("write_file(\"/nonexistent/dir/f\", \"x\")", Err),
            ("write_file(\"$DIR\", \"x\")", Err),
            ("write_file(\"/dev/null\", \"x\")", Err),
            ("write_file(5, \"x\")", Err),
            ("write_file(\"$FILE\", 5)", Err),
        ],
    );
    t.insert(
        "replace_in_file",
        vec![
            ("replace_in_file(\"/nonexistent/x\", \"a\", \"b\")", Err),
            ("replace_in_file(\"$FILE\", \"\", \"b\")", Err),
            ("replace_in_file(\"$DIR\", \"a\", \"b\")", Err),
            ("replace_in_file(\"$FILE\", 1, 2)", Err),
        ],
    );
    t.insert(
        "file_exists",
        vec![("file_exists(5)", Err), ("file_exists(\"\")", Any)],
    );
    t.insert(
        "parse_json",
        vec![
            ("parse_json(\"{\")", Err),
            ("parse_json(\"\")", Err),
            ("parse_json(\"[\".pad(100000, '['))", Err),
            ("parse_json(\"1e999\")", Any),
            ("parse_json(5)", Err),
        ],
    );
    t.insert(
        "to_json",
        vec![
            ("to_json(|| 1)", Err),
            ("to_json(blob(2))", Any),
            ("to_json(1.0 / 0.0)", Any),
            ("to_json('c')", Any),
        ],
    );
    t.insert(
        "exit",
        vec![
            ("exit(-1)", Err),
            ("exit(300)", Err),
            ("exit(\"x\")", Err),
            ("exit(1.5)", Err),
            ("exit(())", Err),
        ],
    );
    t.insert("usage", vec![("usage(5)", Err), ("usage(())", Err)]);
    t.insert(
        "pad",
        vec![
            ("[].pad(1 << 40, 0)", Err),
            ("[].pad(-5, 0)", Any),
            ("[].pad(\"x\", 0)", Err),
            ("blob(1).pad(1 << 40, 0)", Err),
            ("\"\".pad(1 << 40, \"x\")", Err),
            ("\"\".pad(1 << 40, 'x')", Err),
            ("\"\".pad(3, \"\")", Any),
        ],
    );
    t.insert(
        "blob",
        vec![
            ("blob(1 << 40)", Err),
            ("blob(-1)", Any),
            ("blob(1 << 40, 7)", Err),
            ("blob(\"x\")", Err),
        ],
    );
    t.insert(
        "retry",
        vec![
            ("retry(0, || 1)", Err),
            ("retry(-5, || 1)", Err),
            ("retry(\"x\", || 1)", Err),
            ("retry(2, 5)", Err),
            ("retry(2, |a, b, c| 1)", Err),
        ],
    );
    t.insert(
        "until",
        vec![
            ("until(-1, || true)", Err),
            ("until(1e300, || true)", Err),
            ("until(\"x\", || true)", Err),
            ("until(1, 5)", Err),
        ],
    );
    t.insert(
        "call_fn",
        vec![
            ("call_fn(5, [])", Err),
            ("call_fn(|x| x, 5)", Err),
            ("call_fn(|x| x, [])", Err),
        ],
    );
    t.insert(
        "check_opts",
        vec![
            ("check_opts(\"f\", 5, #{})", Err),
            ("check_opts(\"f\", #{a: 1}, #{a: \"nope\"})", Err),
            ("check_opts(\"f\", #{a: 1}, #{a: 5})", Err),
            ("check_opts(\"f\", #{b: 1}, #{a: \"int\"})", Err),
            ("check_opts(5, #{}, #{})", Err),
            ("check_opts(\"f\", #{a: -1}, #{a: \"secs\"})", Err),
        ],
    );
    let patch_rows = |f: &'static str| -> Vec<(String, Want)> {
        [
            "\"/nonexistent/x\", \"@@ -1 +1 @@\\n-a\\n+b\\n\"",
            "\"$FILE\", \"garbage\"",
            "\"$FILE\", \"\"",
            "\"$DIR\", \"--- a/../x\\n+++ b/../x\\n@@ -1 +1 @@\\n-a\\n+b\\n\"",
            "\"$DIR\", \"--- /etc/passwd\\n+++ /etc/passwd\\n@@ -1 +1 @@\\n-a\\n+b\\n\"",
            "\"$DIR\", \"@@ -1 +1 @@\\n-a\\n+b\\n\"",
            "5, \"x\"",
            "\"$FILE\", 5",
        ]
        .iter()
        .map(|v| (format!("{f}({v})"), Err))
        .collect()
    };
    t.insert("apply_patch", leak(patch_rows("apply_patch")));
    t.insert("revert_patch", leak(patch_rows("revert_patch")));
    t.insert("patch_applied", leak(patch_rows("patch_applied")));
    t.insert("trim", vec![("trim(5)", Err), ("trim(())", Err)]);
    t.insert("trimmed", vec![("trimmed(5)", Err), ("trimmed([1])", Err)]);
    t
}

/// A private directory with the file `f.txt` ("a\n") in it, and an engine on a simulator
/// of its own there, built with `opts`.
fn engine_in_a_private_dir(
    opts: &EngineOpts,
) -> (tempfile::TempDir, std::path::PathBuf, rhai::Engine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("f.txt");
    std::fs::write(&file, "a\n").expect("write");
    let session = Session::new(
        BackendChoice::Sim {
            dir: dir.path().join("state"),
            spec: Some("2x1G".into()),
        },
        gpuloop::config::UserConfig::default(),
        0,
    );
    let engine = build_engine(Arc::new(session), opts);
    (dir, file, engine)
}

#[test]
fn every_function_with_every_wrong_type_and_out_of_range_value_is_a_clear_error() {
    let (dir, file, engine) = engine_in_a_private_dir(&EngineOpts::default());
    let table = table();

    let names: std::collections::BTreeSet<String> = doc::functions(&engine)
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert!(
        names.contains("holders"),
        "the metadata lists gpuloop's functions"
    );
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| table.get(n.as_str()).is_none_or(|rows| rows.is_empty()))
        .collect();
    assert!(
        missing.is_empty(),
        "registered without a row in tests/hostile.rs (add its wrong types and out-of-range values): {missing:?}"
    );

    let mut calls = 0;
    let mut failures = Vec::new();
    for (name, rows) in &table {
        for (call, want) in rows {
            let code = call
                .replace("$DIR", &dir.path().display().to_string())
                .replace("$FILE", &file.display().to_string());
            calls += 1;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine.eval::<rhai::Dynamic>(&code)
            }));
            let problem = match result {
                Result::Err(_) => Some("panicked".to_string()),
                Ok(Ok(v)) if *want == Err => Some(format!("succeeded with {v:?}")),
                Ok(Ok(_)) => None,
                Ok(Result::Err(e)) => {
                    let msg = match &*e {
                        EvalAltResult::ErrorTerminated(..) => None,
                        e => Some(e.to_string()),
                    };
                    msg.filter(|m| {
                        m.trim().is_empty()
                            || m.contains("gpuloop::")
                            || m.contains("alloc::")
                            || m.contains("Dynamic(")
                            || m.contains("panicked")
                    })
                    .map(|m| format!("unclear error: {m}"))
                }
            };
            if let Some(p) = problem {
                failures.push(format!("{name}: {code}: {p}"));
            }
        }
    }
    assert!(calls > 200, "only {calls} hostile calls");
    assert!(
        failures.is_empty(),
        "{} of {calls} calls:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Nothing was written outside the private directory, nor the file replaced by junk.
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "a\n");
}

/// The functions that act beyond reading: each refuses in a script whose `// needs:` line did
/// not declare what it does (a call here that would act, were it allowed).
const ACTS: &[(&str, &str)] = &[
    ("kill", "kill(999999999)"),
    ("reset_gpu", "reset_gpu(0)"),
    ("run", "run(\"true\")"),
    ("spawn", "spawn(\"true\")"),
    ("write_file", "write_file(\"$FILE\", \"x\")"),
    (
        "replace_in_file",
        "replace_in_file(\"$FILE\", \"a\", \"b\")",
    ),
    (
        "apply_patch",
        "apply_patch(\"$FILE\", \"@@ -1 +1 @@\\n-a\\n+b\\n\")",
    ),
    (
        "revert_patch",
        "revert_patch(\"$FILE\", \"@@ -1 +1 @@\\n-b\\n+a\\n\")",
    ),
];

/// Every function a script can call either only reads or is one of `ACTS`, which refuse in a
/// script that may do nothing beyond reading (`// needs: none`); no other function ever says
/// so. The list comes from the engine's metadata: a function registered in neither list
/// fails the test, so a new function that acts is declared here, with its check.
#[test]
fn every_function_that_signals_runs_or_writes_refuses_without_its_need() {
    use gpuloop::script::recipes::needs::Powers;
    const READS: &[&str] = &[
        "blob",
        "call_fn",
        "check_opts",
        "diagnose",
        "env",
        "exit",
        "file_exists",
        "get$host",
        "get$pid",
        "gpu",
        "holders",
        "hosts",
        "log",
        "now",
        "pad",
        "parse_json",
        "patch_applied",
        "read_file",
        "reset_blockers",
        "retry",
        "running",
        "sleep",
        "to_debug",
        "to_json",
        "to_string",
        "trim",
        "trimmed",
        "until",
        "usage",
        "wait",
        "wait_clean",
        "warn",
        "xids",
    ];
    let opts = EngineOpts::default().with_powers(Powers::only(&[]));
    let (dir, file, engine) = engine_in_a_private_dir(&opts);
    let names: Vec<String> = doc::functions(&engine)
        .into_iter()
        .map(|f| f.name)
        .collect();
    let unplaced: Vec<&String> = names
        .iter()
        .filter(|n| !READS.contains(&n.as_str()) && !ACTS.iter().any(|(a, _)| a == n))
        .collect();
    assert!(
        unplaced.is_empty(),
        "registered in neither READS nor ACTS of tests/hostile.rs (does it signal, run a command or write a file?): {unplaced:?}"
    );
    let refusal = "which this recipe may not do";
    for (name, call) in ACTS {
        let code = call.replace("$FILE", &file.display().to_string());
        let e = engine
            .eval::<rhai::Dynamic>(&code)
            .expect_err(&code)
            .to_string();
        assert!(
            e.contains(&format!("{name}() ")) && e.contains(refusal),
            "{code}: {e}"
        );
    }
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "a\n");
    // The functions that only read never refuse so, whatever they are called with.
    for (name, rows) in table() {
        if !READS.contains(&name) {
            continue;
        }
        for (call, _) in rows {
            let code = call
                .replace("$DIR", &dir.path().display().to_string())
                .replace("$FILE", &file.display().to_string());
            if let Result::Err(e) = engine.eval::<rhai::Dynamic>(&code) {
                assert!(!e.to_string().contains(refusal), "{code}: {e}");
            }
        }
    }
}

/// Issue 10, defect 10, what no limit bounds: a closure that captures a closure, 300,000
/// times over, is built in linear time (no size limit counts it) and dropped recursively at
/// script end, which overflowed the script thread's stack (an abort, 134). It is an error
/// naming the cause now. With `--limit depth=10` the stack is the 64 MiB base, which a debug
/// build overflows; a release build's smaller frames may not, and then the script works.
#[test]
fn a_value_nested_past_the_stack_is_an_error_never_an_abort() {
    let sim = crate::support::Sim::new("1x1G");
    let chain = "let f = || 1; for i in 0..300000 { let g = f; f = || g; } 1";
    let out = sim.run(&["--limit", "depth=10", "eval", chain]);
    if cfg!(debug_assertions) {
        let out = out.code(1);
        assert!(out.stderr.contains("ran out of stack"), "{}", out.stderr);
        assert!(out.stderr.contains("--limit depth"), "{}", out.stderr);
    } else {
        assert!(matches!(out.code, 0 | 1), "{}: {}", out.code, out.stderr);
    }
}

/// Issue 10, defect 10, what the size limits do not count: a closure curried with itself
/// doubles each step (curried arguments are in no array, map or string). The `memory` limit
/// (bytes the process has allocated, checked between the script's steps) ends it with an
/// error naming the limit, long before the machine runs out of memory.
#[test]
fn a_value_that_doubles_past_the_memory_limit_is_an_error_never_an_oom_kill() {
    let sim = crate::support::Sim::new("1x1G");
    let doubling = "let f = Fn(\"abs\"); for i in 0..60 { f = f.curry(f); } 1";
    let out = sim
        .run(&["--limit", "memory=64M", "eval", doubling])
        .code(1);
    assert!(out.stderr.contains("64 MiB of memory"), "{}", out.stderr);
    assert!(out.stderr.contains("--limit memory"), "{}", out.stderr);
    // The caret points at the step that passed the limit.
    assert!(out.stderr.contains("f.curry(f)"), "{}", out.stderr);
    // Under the limit, the same kind of script works.
    let small = "let f = Fn(\"abs\"); for i in 0..10 { f = f.curry(f); } 1";
    let out = sim.run(&["--limit", "memory=64M", "eval", small]).ok();
    assert_eq!(out.stdout.trim(), "1");
}
