//! The one-shot commands and global flags.

use crate::support::*;

#[test]
fn gpus_table_and_json() {
    let sim = Sim::new("2x8G");
    let out = sim.run(&["gpus"]).ok();
    assert!(
        out.stdout.contains("GPU") && out.stdout.contains("8192"),
        "{}",
        out.stdout
    );
    assert_eq!(sim.gpus().as_array().unwrap().len(), 2);
}

#[test]
fn eval_prints_the_last_value() {
    let sim = Sim::new("1x8G");
    assert_eq!(sim.eval("40 + 2"), "42");
    assert_eq!(sim.run(&["eval", "let x = 1;"]).ok().stdout, "");
}

#[test]
fn usage_errors_exit_2() {
    let sim = Sim::new("1x8G");
    sim.run(&["no-such-command"]).code(2);
    sim.run(&["kill", "--grace", "-1"]).code(2);
    sim.run(&["clean", "--timeout", "nan"]).code(2);
}

#[test]
fn no_driver_warns_once_and_gpu_is_empty() {
    // Without --sim on a machine without libnvidia-ml.so.1 (CI), gpu() is [] with one warning.
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a real GPU machine: covered by tests/gpu/run.sh
    }
    let out = assert_cmd::Command::new(bin())
        .env_remove("GPULOOP_SIM")
        .env("HOME", "/nonexistent")
        .args(["eval", "[gpu().len(), gpu().len(), holders().len()]"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[0, 0, 0]");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("warning: no NVIDIA driver").count(), 1, "{err}");
}

#[test]
fn the_readme_demo_runs_green_and_leaves_nothing() {
    let sim = Sim::new("8x80G");
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/crashed-job.rhai");
    let out = sim.run(&["run", demo.to_str().unwrap()]).ok();
    assert!(
        out.stdout.contains("[orphaned]") && out.stdout.contains("[inherited]"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("clean: true"), "{}", out.stdout);
    let left = sim.eval_json("holders((), #{all: true})");
    assert_eq!(
        left,
        serde_json::json!([]),
        "the demo left processes behind"
    );
    assert!(sim
        .gpus()
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g["mem_used"] == 0));
}

#[test]
fn verbose_logs_what_it_measured_and_did() {
    let sim = Sim::new("1x8G");
    let p = sim.hold(&["--gpu", "0", "--mib", "5"])[0];
    let out = sim.run(&["-v", "clean"]).ok();
    assert!(
        out.stderr.contains("inventory: 1 GPU from sim"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("kill: TERM -> pid {p}")),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("wait_clean: clean after"),
        "{}",
        out.stderr
    );
    let quiet = sim.run(&["clean"]).ok();
    assert!(!quiet.stderr.contains("inventory:"), "{}", quiet.stderr);
}

/// Runs `c` with `stdin` on its stdin; its exit code and stderr.
fn fed(mut c: std::process::Command, stdin: &str) -> Out {
    use std::io::Write;
    c.stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let o = child.wait_with_output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs gpuloop with its stdout a pipe whose reader is already gone (`… | head -1` once head
/// has exited): every write fails with EPIPE.
fn with_closed_stdout(sim: &Sim, args: &[&str], stdin: &str) -> Out {
    let (r, w) = rustix::pipe::pipe().unwrap();
    drop(r);
    let mut c = sim.std_cmd();
    c.args(args).stdout(std::process::Stdio::from(w));
    fed(c, stdin)
}

#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let sim = Sim::new("64x80G");
    for args in [
        &["--json", "gpus"][..],
        &["gpus"],
        &["completions", "bash"],
        &["doc"],
        &["eval", "for i in 0..100000 { print(i) }"],
        &["run", "-"],
    ] {
        let out = with_closed_stdout(&sim, args, "loop { print(\"y\"); }");
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
        assert_eq!(out.stderr, "", "{args:?}");
    }
}

/// Runs gpuloop with its stdout `stdout` (a shell redirection: `>/dev/full`, `>&-`) and
/// `stdin` on its stdin.
fn with_stdout(sim: &Sim, args: &[&str], stdin: &str, stdout: &str) -> Out {
    let mut c = sim.wrapped(&["sh", "-c", &format!("exec \"$0\" \"$@\" {stdout}")]);
    c.args(args).stdout(std::process::Stdio::null());
    fed(c, stdin)
}

/// `gpuloop --json holders > state.json && …` went on with an empty file when the disk was
/// full: gpuloop warned but exited 0. A write to stdout that fails (other than to a closed
/// pipe, above) now fails the command, with what failed: a full disk (/dev/full), a
/// descriptor not open for writing, a stdout closed before gpuloop started; for every command
/// that prints: the one-shots, --json, a script's output, the REPL's and MCP's replies.
#[test]
fn a_stdout_that_cannot_be_written_fails_every_command_that_prints() {
    let sim = Sim::new("2x8G");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let init = format!("{init}\n");
    for (stdout, says) in [
        (
            ">/dev/full",
            "cannot write to stdout: No space left on device",
        ),
        ("1</dev/null", "cannot write to stdout: Bad file descriptor"),
        (
            ">&-",
            "cannot write to stdout: it was closed when gpuloop started",
        ),
    ] {
        for (args, stdin) in [
            (&["--json", "holders"][..], ""),
            (&["gpus"], ""),
            (&["--json", "gpus"], ""),
            (&["completions", "bash"], ""),
            (&["man"], ""),
            (&["--help"], ""),
            (&["eval", "1 + 1"], ""),
            (&["--json", "eval", "gpu()"], ""),
            (&["run", "-"], "print(\"freed\");"),
            (&["repl"], "40 + 2\n"),
            (&["mcp"], init.as_str()),
        ] {
            let out = with_stdout(&sim, args, stdin, stdout);
            assert_eq!(out.code, 1, "{stdout} {args:?}: {}", out.stderr);
            assert_eq!(
                out.stderr.matches(says).count(),
                1,
                "{stdout} {args:?}: {}",
                out.stderr
            );
        }
    }
    // A command's own failure keeps its code (a usage error is 2, never 1).
    let out = with_stdout(&sim, &["eval", "let x = ;"], "", ">/dev/full");
    assert_eq!(out.code, 2, "{}", out.stderr);
    // Printing nothing, nothing failed.
    let out = with_stdout(&sim, &["eval", "()"], "", ">/dev/full");
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// A new user's report, round 7: `gpuloop … 2>&1 | head -1` panicked (exit 101) at the first
/// warning, log line or error written after head had gone: only stdout ended quietly. With
/// stderr a pipe whose reader is gone, each command ends with its own exit code, no panic.
#[test]
fn a_closed_stderr_never_panics() {
    let sim = Sim::new("2x8G");
    for (args, code) in [
        (&["eval", "for i in 0..3000 { warn(`line ${i}`) }"][..], 0),
        (&["-v", "eval", "for i in 0..3000 { log(`line ${i}`) }"], 0),
        (&["eval", "retry(3, || throw \"x\")"], 1),
        (&["eval", "throw \"boom\""], 1),
        (&["eval", "let x = ;"], 2),
        (&["--bogus-flag"], 2),
        (&["-v", "clean"], 0),
    ] {
        use std::io::Write;
        let (r, w) = rustix::pipe::pipe().unwrap();
        drop(r);
        let mut c = sim.std_cmd();
        c.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::from(w));
        let o = c.output().unwrap();
        let _ = std::io::stdout().flush();
        assert_eq!(
            o.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

#[test]
fn json_is_one_shape_everywhere_and_errors_are_json_too() {
    let sim = Sim::new("2x8G");
    let p = sim.hold(&["--gpu", "1", "--mib", "64"])[0];
    // The same fields, in the same order, from a command and from a script.
    let keys =
        |v: &serde_json::Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let raw = |args: &[&str]| sim.run(&[&["--json"], args].concat()).ok().stdout;
    let cmd = raw(&["gpus"]);
    let script = raw(&["eval", "gpu()"]);
    assert_eq!(cmd, script);
    let h = &sim.run(&["--json", "holders"]).ok().json()[0];
    assert_eq!(
        (&h["pid"], &h["mem"], &h["mem_mib"]),
        (
            &serde_json::json!(p),
            &serde_json::json!(64 << 20),
            &serde_json::json!(64)
        )
    );
    assert_eq!(raw(&["holders"]), raw(&["eval", "holders()"]));
    let d = sim.run(&["--json", "diagnose"]).code(1).json();
    assert_eq!(
        (&d[1]["mem_used"], &d[1]["mem_used_mib"]),
        (&serde_json::json!(64 << 20), &serde_json::json!(64))
    );
    let mut sorted = keys(&d[1]);
    sorted.sort();
    assert_eq!(keys(&d[1]), sorted);
    // print() under --json goes to stderr: stdout is only the value.
    let out = sim
        .run(&["--json", "eval", "print(\"hello\"); 40 + 2"])
        .ok();
    assert_eq!(out.json(), 42);
    assert_eq!(out.stderr, "hello\n");
    // Errors under --json are JSON on stderr, with the usual exit codes.
    for (args, code, want) in [
        (
            &["--json", "gpus", "--gpu", "7"][..],
            2,
            "no GPU with index 7",
        ),
        (&["--json", "eval", "throw \"nope\""], 1, "nope"),
        (&["--json", "no-such-command"], 2, "unrecognized subcommand"),
    ] {
        let out = sim.run(args).code(code);
        assert_eq!(out.stdout, "", "{args:?}");
        let e: serde_json::Value = serde_json::from_str(out.stderr.trim())
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", out.stderr));
        assert!(e["error"].as_str().unwrap().contains(want), "{e}");
    }
}

#[test]
fn color_is_auto_always_or_never() {
    let sim = Sim::new("1x8G");
    // NO_COLOR is set by the harness and stdout is a pipe: auto means none.
    assert!(!sim.run(&["gpus"]).ok().stdout.contains('\x1b'));
    assert!(sim
        .run(&["--color", "always", "gpus"])
        .ok()
        .stdout
        .contains("\x1b[1m"));
    assert!(!sim
        .run(&["--color", "never", "diagnose"])
        .ok()
        .stdout
        .contains('\x1b'));
    sim.run(&["--color", "sometimes", "gpus"]).code(2);
}

#[test]
fn help_lists_global_flags_apart_the_environment_and_a_man_page() {
    let sim = Sim::new("1x8G");
    let help = sim.run(&["--help"]).ok().stdout;
    for want in [
        "Global options:",
        "GPULOOP_SIM_DIR",
        "GPULOOP_PATH",
        "Exit codes:",
    ] {
        assert!(help.contains(want), "--help lacks {want}:\n{help}");
    }
    // A command's own options come first, the global ones under their own heading.
    let clean = sim.run(&["clean", "--help"]).ok().stdout;
    let (own, global) = clean
        .split_once("Global options:")
        .expect("a global heading");
    assert!(
        own.contains("--timeout") && !own.contains("--sim <SPEC>"),
        "{clean}"
    );
    assert!(
        global.contains("--sim <SPEC>") && global.contains("--json"),
        "{clean}"
    );
    // docs/simulator.md and --help give the same --sim spec.
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/simulator.md")).unwrap();
    for key in gpuloop::gpu::sim::OPTIONS {
        assert!(
            docs.contains(&format!(",{key}=")),
            "docs/simulator.md's --sim lacks {key}"
        );
    }
    let man = sim.run(&["man"]).ok().stdout;
    assert!(
        man.contains(".TH gpuloop 1") && man.contains(".SH NAME"),
        "{man}"
    );
}

/// A new user's report: every command's `-h` repeated all the global and host options (about
/// 30 lines, even for `man` and `sim hold`). `-h` lists the command's own options, then one
/// line naming the global ones; `--help` lists them all, after the command's own.
#[test]
fn a_commands_short_help_shows_its_own_options_and_one_line_for_the_global_ones() {
    let sim = Sim::new("1x8G");
    for cmd in [
        &["man"][..],
        &["completions"],
        &["journal"],
        &["sim", "hold"],
        &["clean"],
        &["mcp"],
    ] {
        let short = sim.run(&[cmd, &["-h"]].concat()).ok().stdout;
        for global in ["--sim <SPEC>", "--hosts-file <FILE>", "--host-timeout"] {
            assert!(
                !short.contains(global),
                "{cmd:?} -h lists {global}:\n{short}"
            );
        }
        let last = short.trim_end().lines().last().unwrap_or_default();
        assert_eq!(
            last,
            "Global options: --sim --json -v --color --wide --limit --host … (gpuloop --help)",
            "{cmd:?} -h:\n{short}"
        );
        let long = sim.run(&[cmd, &["--help"]].concat()).ok().stdout;
        let (own, global) = long
            .split_once("Global options:")
            .unwrap_or_else(|| panic!("{cmd:?} --help has no global heading:\n{long}"));
        assert!(own.contains("-h, --help"), "{cmd:?}: {own}");
        assert!(
            global.contains("--sim <SPEC>") && global.contains("--host-timeout"),
            "{cmd:?} --help: {global}"
        );
    }
    // gpuloop's own -h still lists them, and the global options still work after a command.
    let top = sim.run(&["-h"]).ok().stdout;
    assert!(top.contains("--sim <SPEC>"), "{top}");
    assert_eq!(
        sim.run(&["gpus", "--json"])
            .ok()
            .json()
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

/// The simulator's default directory is shared by every session of a user: --help says so,
/// and how to give a session its own.
#[test]
fn help_says_the_default_sim_dir_is_shared_and_how_to_have_one_of_ones_own() {
    let sim = Sim::new("1x8G");
    let help = sim.run(&["--help"]).ok().stdout;
    assert!(help.contains("/tmp/gpuloop-sim-UID"), "{help}");
    assert!(
        help.contains("every session of a user shares the default"),
        "{help}"
    );
    assert!(help.contains("GPULOOP_SIM_DIR=$(mktemp -d)"), "{help}");
}

/// Defect 1: the word after SCRIPT was parsed by gpuloop when it spelled one of its flags:
/// `run a.rhai --json` gave the script no ARGS, `-v x` turned on gpuloop's logs, `--help`
/// printed gpuloop's help, and `--host X` would have sent the script to another host.
/// Issue 33, item 7: handing them to the script silently was no better: `run fix.rhai --sim
/// 4x80G` ran on the real driver. A gpuloop option before `--` is a usage error, and nothing
/// runs; after `--` it is the script's.
#[test]
fn every_word_after_the_script_is_the_scripts_own() {
    let sim = Sim::new("1x8G");
    let p = sim.path().join("args.rhai");
    let ran = sim.path().join("ran");
    std::fs::write(
        &p,
        format!(
            "write_file({:?}, \"x\"); print(to_json(ARGS));",
            ran.display()
        ),
    )
    .unwrap();
    let script = p.to_str().unwrap();
    for args in [
        &["--json"][..],
        &["-v", "x"],
        &["x", "-vv"],
        &["--host", "elsewhere"],
        &["--host=elsewhere"],
        &["--sim", "1x1G", "-h"],
        &["--limit", "calls=10"],
        &["--hosts-file", "f", "--", "y"],
        &["--all-rows"],
    ] {
        let out = sim.run(&[&["run", script], args].concat()).code(2);
        assert!(
            out.stderr.contains("is gpuloop's own option") && out.stderr.contains("after --"),
            "{args:?}: {}",
            out.stderr
        );
        assert!(!ran.exists(), "{args:?}: the script ran");
    }
    for (args, want) in [
        (&["--help"][..], r#"["--help"]"#),
        (&["--", "--json"], r#"["--json"]"#),
        (&["--", "--host", "elsewhere"], r#"["--host","elsewhere"]"#),
        (
            &["x", "--", "--sim", "1x1G"],
            r#"["x","--","--sim","1x1G"]"#,
        ),
        (
            &["--gpu", "0", "--timeout", "1"],
            r#"["--gpu","0","--timeout","1"]"#,
        ),
        // The older spelling: a `--` right after SCRIPT is dropped, a later one kept.
        (&["--", "-v", "x"], r#"["-v","x"]"#),
        (&["--", "--", "x"], r#"["--","x"]"#),
        (&["x", "--", "y"], r#"["x","--","y"]"#),
    ] {
        let out = sim.run(&[&["run", script], args].concat()).ok();
        assert_eq!(out.stdout.trim(), want, "{args:?}");
        assert_eq!(out.stderr, "", "{args:?}: gpuloop took a flag");
    }
    // gpuloop's own flags still go before SCRIPT.
    let out = sim.run(&["run", "-v", script, "q"]).ok();
    assert_eq!(out.stdout.trim(), r#"["q"]"#);
    assert!(out.stderr.contains("DEBUG"), "{}", out.stderr);
    let out = sim.run(&["--json", "run", "--", script, "q"]).ok();
    assert_eq!(
        out.stderr.trim(),
        r#"["q"]"#,
        "print() goes to stderr under --json"
    );
    let out = sim.run(&["run", "--bogus", script]).code(2);
    assert!(out.stderr.contains("'--bogus'"), "{}", out.stderr);
    // A recipe's --help is the recipe's, and each documented spelling of its flags works.
    let out = sim.run(&["run", "clean-node", "--help"]).ok();
    assert!(
        out.stdout
            .contains("usage: gpuloop run clean-node [--gpu GPUS...] [--timeout SECS]"),
        "{}",
        out.stdout
    );
    for args in [
        &["run", "clean-node", "--gpu", "0", "--timeout", "1"][..],
        &["run", "clean-node", "--gpus", "0", "--timeout", "1"],
        &["run", "clean-node", "--", "--gpu", "0", "--timeout", "1"],
    ] {
        let out = sim.run(args).ok();
        assert!(out.stdout.contains("clean in"), "{args:?}: {}", out.stdout);
    }
}

/// Defect 2: `clean -h` interleaved the global --limit and host flags (--host, --transport,
/// --jobid, …) with clean's own options; each command's own options come first, together.
#[test]
fn each_commands_own_options_are_listed_apart_from_the_global_ones() {
    let sim = Sim::new("1x8G");
    for (cmd, own) in [
        ("clean", &["--gpu", "--user", "--timeout", "--force"][..]),
        ("holders", &["--gpu", "--all"]),
        ("run", &[]),
    ] {
        let help = sim.run(&[cmd, "-h"]).ok().stdout;
        let (_, rest) = help.split_once("\nOptions:\n").expect("an Options heading");
        // The command's own section ends at the next heading.
        let section = rest.split("\n\n").next().unwrap_or_default();
        for flag in own {
            assert!(
                section.contains(flag),
                "{cmd}: {flag} not in its own options:\n{help}"
            );
        }
        for global in [
            "--limit",
            "--host",
            "--hosts-file",
            "--hosts-from-slurm",
            "--transport",
            "--jobid",
            "--fanout",
            "--sim",
            "--json",
        ] {
            // An option line starts with its flag, indented by at most 6 (help text, wrapped
            // further in, may name a flag anywhere).
            let listed = section.lines().any(|l| {
                let t = l.trim_start();
                let t = t
                    .split_once(", ")
                    .filter(|(s, _)| s.len() == 2)
                    .map_or(t, |(_, r)| r);
                l.len() - l.trim_start().len() <= 6
                    && (t == global
                        || t.starts_with(&format!("{global} "))
                        || t.starts_with(&format!("{global}=")))
            });
            assert!(
                !listed,
                "{cmd}: the global {global} among its own options:\n{section}"
            );
        }
        // `-h` folds the global options into one line; `--help` lists them under headings.
        let long = sim.run(&[cmd, "--help"]).ok().stdout;
        assert!(
            long.contains("Global options:") && long.contains("Hosts (global options):"),
            "{long}"
        );
    }
}

/// Defect 7: `clean --timeout 1e99` and `wait --timeout inf` said "must be a non-negative
/// number"; `--limit string=abc` said `unknown unit 'C'`; `holders(#{all: true})` and
/// `wait_clean(#{timeout: 1})` failed with "found a map"; `holders((), #{job: "812"})`
/// refused the string `env("SLURM_JOB_ID")` gives.
#[test]
fn small_messages_say_what_is_wrong_and_options_maps_stand_alone() {
    let sim = Sim::new("2x8G");
    for (args, want) in [
        (
            &["clean", "--timeout", "1e99"][..],
            "--timeout 1e99 is not a number of seconds: it must be finite, from 0 to 1e9",
        ),
        (
            &["wait", "--timeout", "inf"],
            "--timeout inf is not a number of seconds: it must be finite",
        ),
        (
            &["kill", "--grace", "-1"],
            "--grace -1 is not a number of seconds",
        ),
        (
            &["--limit", "string=abc", "gpus"],
            r#"--limit "string=abc": "abc" is not a whole number, optionally with a unit: K, M or G"#,
        ),
        (
            &["--limit", "string=5T", "gpus"],
            r#""5T" has an unknown unit 'T'"#,
        ),
    ] {
        let out = sim.run(args).code(2);
        assert!(out.stderr.contains(want), "{args:?}: {}", out.stderr);
    }
    sim.run(&["--limit", "string=64M", "gpus"]).ok();
    let out = sim
        .run(&["eval", "wait_clean(0, #{timeout: 1e99})"])
        .code(1);
    assert!(
        out.stderr
            .contains("option timeout: 1e99 is not a number of seconds: it must be finite"),
        "{}",
        out.stderr
    );
    let job = sim.hold_with(&["--gpu", "1", "--mib", "8"], &[("SLURM_JOB_ID", "812")])[0];
    sim.hold(&["--gpu", "0", "--observer"]);
    // An options map alone: the selector defaults to every GPU.
    assert_eq!(sim.eval("holders(#{all: true}).len()"), "2");
    assert_eq!(sim.eval("holders(#{job: 812}).len()"), "1");
    assert_eq!(sim.eval("wait_clean(#{timeout: 0, quiet: true})"), "false");
    assert_eq!(sim.eval("diagnose(#{on_error: \"skip\"}).len()"), "2");
    // A job id as a string of digits, as env("SLURM_JOB_ID") gives it.
    let out = sim
        .run_with(
            &[
                "eval",
                "holders((), #{job: env(\"SLURM_JOB_ID\")}).map(|h| h.pid)",
            ],
            |c| {
                c.env("SLURM_JOB_ID", "812");
            },
        )
        .ok();
    assert_eq!(out.stdout.trim(), format!("[{job}]"));
    let out = sim.run(&["eval", "holders((), #{job: \"81x\"})"]).code(1);
    assert!(
        out.stderr.contains("must be a Slurm job id"),
        "{}",
        out.stderr
    );
    let doc = sim.run(&["doc"]).ok().stdout;
    for sig in [
        "`holders(opts: Map) -> Array`",
        "`wait_clean(opts: Map) -> bool`",
        "`diagnose(opts: Map) -> Array`",
    ] {
        assert!(doc.contains(sig), "gpuloop doc lacks {sig}");
    }
}

/// A new user's report (issue 38): Ctrl-C during `gpuloop wait` exited 130 without a word.
/// It now says what was still held, which GPUs and by whom, and leaves the holders alone.
#[test]
fn ctrl_c_during_wait_says_what_is_still_held() {
    use std::io::BufRead;
    let sim = Sim::new("3x8G");
    let holder = sim.hold(&["--gpu", "1", "--mib", "300", "--name", "vllm_worker"])[0];
    // -vv logs every poll: the SIGINT goes once the wait is polling.
    let mut g = sim
        .std_cmd()
        .args(["-vv", "wait", "--timeout", "120"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start gpuloop wait");
    let stderr = g.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let polling = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains("still dirty") => break true,
            Ok(_) => {}
            Err(_) => break false,
        }
    };
    if !polling {
        let _ = g.kill();
    }
    assert!(polling, "gpuloop wait never polled");
    unsafe { libc::kill(g.id() as i32, libc::SIGINT) };
    let code = {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(40);
        loop {
            if let Some(st) = g.try_wait().expect("wait") {
                break st.code();
            }
            if std::time::Instant::now() > end {
                let _ = g.kill();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    reader.join().expect("reader");
    let said: Vec<String> = rx.try_iter().collect();
    let said = said.join("\n");
    assert_eq!(code, Some(130), "{said}");
    let at = said
        .find("gpuloop: wait: interrupted; still not clean:")
        .unwrap_or_else(|| panic!("no word of what is held:\n{said}"));
    let report = &said[at..];
    assert!(report.contains("GPU 1 "), "{report}");
    assert!(
        report.contains(&format!("vllm_worker({holder})")),
        "{report}"
    );
    assert!(
        !report.contains("GPU 0 "),
        "a clean GPU was named: {report}"
    );
    assert!(alive(holder), "the wait killed its holder");
}

/// `gpuloop top`: a line per GPU with its memory and utilisation, each compute holder under
/// its GPU, biggest first; one frame into a pipe, with --once or --json; a bad --interval is a
/// usage error.
#[test]
fn top_shows_each_gpu_with_its_holders_under_it() {
    let sim = Sim::new("3x8G");
    let big = sim.hold(&["--gpu", "1", "--mib", "700"])[0];
    let small = sim.hold(&["--gpu", "1", "--mib", "100"])[0];
    let other = sim.hold(&["--gpu", "2", "--mib", "300"])[0];
    let out = sim.run(&["top"]).ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} missing:\n{}", out.stdout))
    };
    assert!(
        lines[0].contains("GPU") && lines[0].contains("MEMORY MiB"),
        "{}",
        out.stdout
    );
    assert!(
        lines[at("800 / 8192")].contains(&big.to_string()),
        "{}",
        out.stdout
    );
    assert_eq!(
        at(&small.to_string()),
        at(&big.to_string()) + 1,
        "{}",
        out.stdout
    );
    assert!(
        lines[at("300 / 8192")].contains(&other.to_string()),
        "{}",
        out.stdout
    );
    assert!(lines[at("0 / 8192")].contains(" - "), "{}", out.stdout);
    let v = sim.run(&["--json", "top", "--gpu", "1"]).ok().json();
    assert_eq!(v["gpus"].as_array().unwrap().len(), 1, "{v}");
    let mut pids: Vec<i64> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["pid"].as_i64().unwrap())
        .collect();
    pids.sort_unstable();
    let mut want = vec![i64::from(big), i64::from(small)];
    want.sort_unstable();
    assert_eq!(pids, want, "{v}");
    let bad = sim.run(&["top", "--interval", "0"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--interval"), "{}", bad.stderr);
    assert_eq!(sim.run(&["top", "--gpu", "7"]).code, 2);
}

/// The entries of clap's option, argument and command lists in a help text whose description
/// wraps: a flag line with its description beside it and any line under it, or a flag alone
/// on its line (clap's next-line layout) with more than one line under it.
fn wrapped_entries(help: &str) -> Vec<String> {
    let is_entry = |l: &str| {
        let indent = l.len() - l.trim_start().len();
        indent == 2 || (indent == 6 && l.trim_start().starts_with('-'))
    };
    let mut wrapped = Vec::new();
    let mut in_list = false;
    let lines: Vec<&str> = help.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        i += 1;
        if !l.starts_with(' ') {
            // clap's own headings; the top level's hand-written "Environment:" is no list.
            in_list =
                l.ends_with(':') && (l.contains("ptions") || l == "Arguments:" || l == "Commands:");
            continue;
        }
        if !in_list || !is_entry(l) {
            continue;
        }
        let beside = l
            .trim()
            .split("  ")
            .filter(|p| !p.trim().is_empty())
            .count()
            > 1;
        let mut under = 0;
        while i < lines.len() && lines[i].starts_with("   ") && !is_entry(lines[i]) {
            under += 1;
            i += 1;
        }
        if under > usize::from(!beside) {
            wrapped.push(l.trim().to_string());
        }
    }
    wrapped
}

/// Issue 38, item 8: `clean -h` printed 37 lines, every flag's whole text wrapped under it.
/// `-h` is one line per flag, argument and command (clap's convention, as ripgrep's), on a
/// terminal 80 or 100 columns wide, for every command; `--help` keeps the long text.
#[test]
fn every_commands_short_help_is_one_line_per_flag_and_long_help_keeps_the_whole_text() {
    let sim = Sim::new("1x8G");
    let help = |cmd: &[String], flag: &str, cols: &str| {
        let args: Vec<&str> = cmd.iter().map(String::as_str).chain([flag]).collect();
        sim.run_with(&args, |c| {
            c.env("COLUMNS", cols);
        })
        .ok()
        .stdout
    };
    // Every command, as the help lists them.
    let mut commands: Vec<Vec<String>> = Vec::new();
    let mut todo = vec![Vec::new()];
    while let Some(cmd) = todo.pop() {
        let out = help(&cmd, "-h", "100");
        if let Some((_, list)) = out.split_once("\nCommands:\n") {
            for l in list.split("\n\n").next().unwrap_or_default().lines() {
                let name = l.split_whitespace().next().unwrap_or_default();
                if l.starts_with("  ") && !l.starts_with("   ") && name != "help" {
                    todo.push([cmd.clone(), vec![name.to_string()]].concat());
                }
            }
        }
        commands.push(cmd);
    }
    assert!(commands.len() > 25, "{commands:?}");
    for cols in ["80", "100"] {
        for cmd in &commands {
            let out = help(cmd, "-h", cols);
            let wrapped = wrapped_entries(&out);
            assert!(
                wrapped.is_empty(),
                "`{} -h` at {cols} columns wraps {wrapped:?}:\n{out}",
                ["gpuloop".to_string()]
                    .iter()
                    .chain(cmd)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
    // The check sees a wrapped entry: `--help`'s are.
    let clean = |flag| help(&["clean".to_string()], flag, "100");
    assert!(!wrapped_entries(&clean("--help")).is_empty());
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (short, long) = (squash(&clean("-h")), squash(&clean("--help")));
    for text in [
        "holders and kill take only theirs; diagnose, wait and clean judge the GPUs they hold",
        "torchrun's elastic agent, or a parent gpuloop saw start a holder again",
        "0: KILL at once, as docker stop -t 0; inf: never KILL",
        "As nvidia-smi -i takes them",
    ] {
        assert!(long.contains(text), "clean --help lacks {text:?}:\n{long}");
        assert!(!short.contains(text), "clean -h has {text:?}:\n{short}");
    }
    let lines = |flag| clean(flag).lines().count();
    assert!(lines("-h") * 2 < lines("--help"), "{}", clean("-h"));
}
