//! What gpuloop is handed, at its worst: endless and huge files, FIFOs, stdin that never
//! ends or never comes, host lists nested 20,000 deep or naming millions, Slurm variables
//! that name many nodes or no job, a byte-order mark. Each is a clear error (exit 2, or 130
//! for a signal) within a deadline: never a hang, an abort or an out-of-memory kill.

use crate::support::*;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Every command here answers at once; this only bounds a hang (the defect under test).
const DEADLINE: Duration = Duration::from_secs(60);

/// Waits for a started gpuloop, at most `DEADLINE`; a hang is KILLed (it is this test's
/// child) and fails the test. An abort shows as 128 + its signal.
fn finish(mut child: Child, what: &str) -> Out {
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut s);
            }
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = pipe(child.stdout.take().map(|o| Box::new(o) as _));
    let err = pipe(child.stderr.take().map(|e| Box::new(e) as _));
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {DEADLINE:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        code: status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// `gpuloop ARGS` on `sim` with `stdin`, waited for as `finish` does.
fn run_in(sim: &Sim, args: &[&str], stdin: Stdio) -> Out {
    let child = sim
        .std_cmd()
        .args(args)
        .current_dir(sim.path())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuloop");
    finish(child, &args.join(" "))
}

fn run(sim: &Sim, args: &[&str]) -> Out {
    run_in(sim, args, Stdio::null())
}

fn zero() -> Stdio {
    std::fs::File::open("/dev/zero").unwrap().into()
}

/// A file of `len` bytes that takes no disk (a hole).
fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn has(out: &Out, words: &[&str]) {
    for w in words {
        assert!(out.stderr.contains(w), "{w:?} not in: {}", out.stderr);
    }
}

/// Issue: `run /dev/zero`, `run - < /dev/zero`, `--hosts-file /dev/zero`, a module linked
/// to /dev/zero and `repl < /dev/zero` read until the machine ran out of memory (24 GB, an
/// out-of-memory kill). Each is refused now, naming the file and the limit.
#[test]
fn endless_and_huge_inputs_are_refused_naming_the_file_and_the_limit() {
    let sim = Sim::new("1x1G");
    let dir = sim.path();
    std::fs::write(dir.join("one.rhai"), "1").unwrap();

    let out = run(&sim, &["run", "/dev/zero"]).code(2);
    has(
        &out,
        &["cannot read script /dev/zero", "a character device"],
    );
    let out = run_in(&sim, &["run", "-"], zero()).code(2);
    has(&out, &["from stdin", "larger than 16 MiB"]);
    let out = run(&sim, &["--hosts-file", "/dev/zero", "check", "./one.rhai"]).code(2);
    has(&out, &["hosts file /dev/zero", "a character device"]);
    std::os::unix::fs::symlink("/dev/zero", dir.join("zmod.rhai")).unwrap();
    std::fs::write(dir.join("imp.rhai"), "import \"zmod\" as z;\n1").unwrap();
    // A module is read only as the file itself: the link is refused, never opened.
    let out = run(&sim, &["run", "./imp.rhai"]).code(2);
    has(&out, &["module", "zmod.rhai", "is a symbolic link"]);
    let out = run_in(&sim, &["repl"], zero()).code(2);
    has(
        &out,
        &["a line larger than 1 MiB (the limit of a REPL line)"],
    );

    // Regular files past their limit: read no further than the limit.
    sparse(&dir.join("big.rhai"), (16 << 20) + 1);
    let out = run(&sim, &["run", "./big.rhai"]).code(2);
    has(
        &out,
        &["cannot read script ./big.rhai", "larger than 16 MiB"],
    );
    let out = run(&sim, &["check", "./big.rhai"]).code(2);
    has(&out, &["larger than 16 MiB"]);
    sparse(&dir.join("hosts"), (4 << 20) + 1);
    let out = run(&sim, &["--hosts-file", "hosts", "check", "./one.rhai"]).code(2);
    has(&out, &["hosts file hosts", "larger than 4 MiB"]);
    sparse(&dir.join("bigmod.rhai"), (16 << 20) + 1);
    std::fs::write(dir.join("imp2.rhai"), "import \"bigmod\" as b;\n1").unwrap();
    let out = run(&sim, &["run", "./imp2.rhai"]).code(2);
    has(&out, &["bigmod.rhai", "larger than 16 MiB"]);
    let conf = dir.join("config/gpuloop");
    std::fs::create_dir_all(&conf).unwrap();
    std::os::unix::fs::symlink("/dev/zero", conf.join("config.toml")).unwrap();
    let out = run(&sim, &["eval", "1"]).code(2);
    let endless = if unsafe { libc::geteuid() } == 0 {
        // As root config.toml is read only as the file itself.
        "is a symbolic link"
    } else {
        "a character device"
    };
    has(&out, &["config file", "config.toml", endless]);
    std::fs::remove_file(conf.join("config.toml")).unwrap();
    sparse(&conf.join("config.toml"), (1 << 20) + 1);
    let out = run(&sim, &["eval", "1"]).code(2);
    has(&out, &["config.toml", "larger than 1 MiB"]);
    std::fs::remove_file(conf.join("config.toml")).unwrap();
    // read_file reads no more than a string may hold.
    let out = run(
        &sim,
        &[
            "--limit",
            "string=1M",
            "eval",
            &format!("read_file({:?})", dir.join("hosts").display()),
        ],
    )
    .code(1);
    has(&out, &["read_file(", "larger than 1 MiB"]);
    // Under the limits all of these work.
    std::fs::write(dir.join("hosts"), "local\n").unwrap();
    run(&sim, &["--hosts-file", "hosts", "check", "./one.rhai"]).ok();
    let out = run_in(
        &sim,
        &["repl"],
        Stdio::from(std::fs::File::open(dir.join("one.rhai")).unwrap()),
    )
    .ok();
    assert_eq!(out.stdout.trim(), "1");
}

/// Issue: a FIFO as the script, a module, or the hosts file blocked gpuloop for a writer
/// that never came, and INT, TERM and HUP did not end it. It is refused at once.
#[test]
fn fifos_are_refused_at_once_never_waited_for() {
    let sim = Sim::new("1x1G");
    let dir = sim.path();
    let mode = rustix::fs::Mode::RWXU;
    rustix::fs::mkfifoat(rustix::fs::CWD, dir.join("fifo"), mode).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, dir.join("fmod.rhai"), mode).unwrap();
    std::fs::write(dir.join("one.rhai"), "1").unwrap();
    std::fs::write(dir.join("imp.rhai"), "import \"fmod\" as f;\n1").unwrap();
    for args in [
        &["run", "./fifo"][..],
        &["check", "./fifo"],
        &["--hosts-file", "./fifo", "check", "./one.rhai"],
        &["run", "./imp.rhai"],
        &["check", "./imp.rhai"],
    ] {
        let out = run(&sim, args).code(2);
        has(&out, &["a FIFO, not a regular file"]);
    }
}

/// Issue: `run -` (and `repl` with piped input) blocked on a pipe nobody writes to ignored
/// Ctrl-C, TERM and HUP (the handlers restart the read). Each ends it now with 130.
#[test]
fn stdin_blocked_on_a_silent_pipe_ends_on_int_term_and_hup() {
    let sim = Sim::new("1x1G");
    for (cmd, sig) in [
        ("run", libc::SIGINT),
        ("run", libc::SIGTERM),
        ("run", libc::SIGHUP),
        ("repl", libc::SIGINT),
        ("repl", libc::SIGTERM),
    ] {
        let args: &[&str] = if cmd == "run" {
            &["run", "-"]
        } else {
            &["repl"]
        };
        let mut child = sim
            .std_cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuloop");
        // The write end stays open and silent until the end of this round.
        let _silent = child.stdin.take();
        let pid = child.id() as i32;
        // Once gpuloop catches the signal, it is an interrupt, whether it comes before the
        // read starts or while it waits.
        let caught = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    let mask = s
                        .lines()
                        .find_map(|l| l.strip_prefix("SigCgt:"))?
                        .trim()
                        .to_string();
                    u64::from_str_radix(&mask, 16).ok()
                })
                .is_some_and(|m| m & (1 << (sig - 1)) != 0)
        };
        let end = Instant::now() + DEADLINE;
        while !caught(pid) {
            assert!(Instant::now() < end, "gpuloop never installed its handlers");
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: our own child, still running (not reaped).
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        let out = finish(child, &format!("{cmd} then signal {sig}"));
        assert_eq!(out.code, 130, "{cmd}, signal {sig}: {}", out.stderr);
    }
}

/// Issue: 20,000 nested groups (`x[1][1]…`) overflowed the stack (abort 134) from every
/// front end that reads a host list, and `gpu[1-65535]` took 17 s of CPU. They are usage
/// errors (exit 2) at once now; the largest set allowed is 65,536 hosts.
#[test]
fn deep_and_huge_host_lists_are_usage_errors_never_an_abort() {
    let sim = Sim::new("1x1G");
    let dir = sim.path();
    std::fs::write(dir.join("one.rhai"), "1").unwrap();
    let groups = format!("x{}", "[1]".repeat(20_000));
    let brackets = format!("{}1{}", "[".repeat(20_000), "]".repeat(20_000));
    std::fs::write(dir.join("deep"), format!("{groups}\n")).unwrap();
    std::fs::write(dir.join("nested"), format!("{brackets}\n")).unwrap();
    for (args, says) in [
        (
            vec!["--host", &groups, "check", "./one.rhai"],
            "longer than 1024 bytes",
        ),
        (
            vec!["--host", &brackets, "check", "./one.rhai"],
            "nested brackets",
        ),
        (
            vec!["--hosts-file", "deep", "check", "./one.rhai"],
            "line 1",
        ),
        (
            vec!["--hosts-file", "nested", "eval", "hosts()"],
            "nested brackets",
        ),
        (
            vec!["--host", &groups, "eval", "hosts()"],
            "longer than 1024 bytes",
        ),
        (vec!["--host", &groups, "gpus"], "longer than 1024 bytes"),
        (
            vec!["--host", "gpu[1-65537]", "check", "./one.rhai"],
            "more than 65536 hosts",
        ),
        (
            vec!["--host", "gpu[1-9999999999]", "gpus"],
            "more than 65536 hosts",
        ),
        (
            vec!["--host", "n[1-300][1-300]", "gpus"],
            "more than 65536 hosts",
        ),
    ] {
        let out = run(&sim, &args).code(2);
        has(&out, &["bad host list", says]);
        assert!(
            out.stderr.len() < 1000,
            "the error quotes 60 KB: {}",
            out.stderr.len()
        );
    }
    // 65,536 hosts from a file plus one more on the command line pass the cap.
    let names: String = (0..65_536).map(|i| format!("h{i}\n")).collect();
    std::fs::write(dir.join("many"), names).unwrap();
    let out = run(
        &sim,
        &[
            "--hosts-file",
            "many",
            "--host",
            "one-more",
            "check",
            "./one.rhai",
        ],
    )
    .code(2);
    has(&out, &["more than 65536 hosts in all"]);
    // The largest set is taken (nothing connects before a command needs the hosts).
    let out = run(&sim, &["--host", "gpu[1-65536]", "check", "./one.rhai"]).ok();
    assert!(out.stdout.contains("ok: ./one.rhai"), "{}", out.stdout);
}

/// Issue: a UTF-8 byte-order mark before a script (as some editors write it) was a compile
/// error, "Unexpected '\u{feff}'". It is skipped, in scripts, stdin and modules.
#[test]
fn a_byte_order_mark_before_a_script_or_module_is_skipped() {
    let sim = Sim::new("1x1G");
    let dir = sim.path();
    let bom = "\u{feff}";
    std::fs::write(
        dir.join("bom.rhai"),
        format!("{bom}let x = 1;\nprint(x + 1);"),
    )
    .unwrap();
    std::fs::write(dir.join("m.rhai"), format!("{bom}fn two() {{ 2 }}")).unwrap();
    std::fs::write(
        dir.join("imp.rhai"),
        format!("{bom}import \"m\" as m;\nprint(m::two());"),
    )
    .unwrap();
    for script in ["./bom.rhai", "./imp.rhai"] {
        let out = run(&sim, &["run", script]).ok();
        assert_eq!(out.stdout.trim(), "2");
        run(&sim, &["check", script]).ok();
    }
    let out = run_in(
        &sim,
        &["run", "-"],
        Stdio::from(std::fs::File::open(dir.join("bom.rhai")).unwrap()),
    )
    .ok();
    assert_eq!(out.stdout.trim(), "2");
    // A mistake after the mark is shown with the caret where the mistake is.
    std::fs::write(dir.join("bad.rhai"), format!("{bom}1 +* 2")).unwrap();
    let out = run(&sim, &["run", "./bad.rhai"]).code(2);
    has(&out, &["bad.rhai:1:4", "1 | 1 +* 2\n  |    ^"]);
}

/// Issue: `gpuloop --json eval 'usage("bad")'` and `exit("msg")` printed plain text where a
/// program reads JSON. Under --json they print `{"error": …}`; without it, the text.
#[test]
fn usage_and_exit_with_a_reason_print_json_errors_under_json() {
    let sim = Sim::new("1x1G");
    for (code, exit, msg) in [
        ("usage(\"bad\")", 2, "usage: bad"),
        ("exit(\"msg\")", 1, "msg"),
        ("exit(2.5)", 1, "2.5"),
    ] {
        let out = run(&sim, &["--json", "eval", code]).code(exit);
        let err: serde_json::Value = serde_json::from_str(out.stderr.trim())
            .unwrap_or_else(|e| panic!("{code}: not JSON ({e}): {}", out.stderr));
        assert_eq!(err["error"], msg, "{code}");
        assert_eq!(out.stdout, "");
        let out = run(&sim, &["eval", code]).code(exit);
        assert_eq!(out.stderr.trim(), msg, "{code}");
    }
    // Plain exit codes print nothing, as before.
    let out = run(&sim, &["--json", "eval", "exit(3)"]).code(3);
    assert_eq!(out.stderr, "");
}

/// Fake `scontrol` and `squeue` that record how they were called.
fn fake_slurm(dir: &Path) -> std::path::PathBuf {
    let bin = dir.join("fake-slurm");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("slurm-calls");
    for tool in ["scontrol", "squeue"] {
        let p = bin.join(tool);
        std::fs::write(
            &p,
            format!("#!/bin/sh\necho \"{tool} $*\" >> '{}'\n", log.display()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    bin
}

/// `gpuloop HOOK --timeout SECS` on GPU 0 as Slurm would run it, with `vars` and the fake
/// Slurm tools in `bin` first on its PATH.
fn slurm_hook(sim: &Sim, bin: &Path, hook: &str, secs: &str, vars: &[(&str, &str)]) -> Out {
    let child = sim
        .std_cmd()
        .args([hook, "--timeout", secs])
        .envs(vars.iter().copied())
        .env("SLURM_JOB_GPUS", "0")
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuloop");
    finish(child, hook)
}

/// Issue: `SLURMD_NODENAME='n[1-100]'` reached `scontrol update nodename=n[1-100]
/// state=drain`, which drains a hundred nodes; `SLURM_JOB_ID` of -1, 0 or +812 was taken.
/// The hooks refuse both (exit 2) and call no Slurm command.
#[test]
fn slurm_hooks_drain_only_their_own_node_and_take_only_a_real_job_id() {
    let sim = Sim::new("1x1G");
    let bin = fake_slurm(sim.path());
    let log = sim.path().join("slurm-calls");
    // Memory nobody holds: the epilog would drain the node.
    run(&sim, &["sim", "leak", "--gpu", "0", "--mib", "500"]).ok();
    let hook = |hook: &str, vars: &[(&str, &str)]| slurm_hook(&sim, &bin, hook, "1", vars);
    for node in ["n[1-100]", "a,b", "n 1"] {
        for h in ["epilog", "prolog"] {
            let out = hook(h, &[("SLURM_JOB_ID", "812"), ("SLURMD_NODENAME", node)]).code(2);
            has(&out, &["is not one node's name"]);
        }
    }
    for id in ["-1", "0", "+812", "0x32c"] {
        let out = hook(
            "epilog",
            &[("SLURM_JOB_ID", id), ("SLURMD_NODENAME", "gpu07")],
        )
        .code(2);
        has(&out, &["is not a job id"]);
    }
    assert!(
        !log.exists(),
        "Slurm was called: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    // A plain node name is drained, that one only.
    let out = hook(
        "epilog",
        &[("SLURM_JOB_ID", "812"), ("SLURMD_NODENAME", "gpu07")],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(
        calls.contains("scontrol update nodename=gpu07 state=drain"),
        "{calls}"
    );
    // --job takes the same ids.
    for id in ["0", "-1", "+812"] {
        let out = run(&sim, &["holders", &format!("--job={id}")]).code(2);
        has(&out, &["not a Slurm job id"]);
    }
    run(&sim, &["holders", "--job", "812"]).ok();
    let out = run(&sim, &["eval", "holders(#{job: 0})"]).code(1);
    has(&out, &["must be a Slurm job id"]);
}

/// Issue: the agent answered "no job 5" to a `job_kill` sent right after `spawn` (the spawn
/// was still starting on its worker), and took a second spawn of the same id. The id is
/// taken as the request is read now: the kill finds the job, the duplicate is refused.
#[test]
fn the_agent_finds_a_job_killed_right_after_its_spawn_and_refuses_a_duplicate_id() {
    use std::io::{BufRead, BufReader, Write};
    let sim = Sim::new("1x1G");
    let mut agent = sim
        .std_cmd()
        .arg("agent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the agent");
    let spawn = r#"{"id": 5, "method": "spawn", "params": {"shell": "sleep 600", "argv": null, "timeout_ms": null, "cwd": null, "env": [], "grace_ms": 5000, "echo": false, "keep_children": false}}"#;
    let kill = r#"{"id": 6, "method": "job_kill", "params": {"job": 5, "signal": "KILL", "grace_ms": null}}"#;
    let mut stdin = agent.stdin.take().unwrap();
    // All three in one write: the kill and the duplicate are read while the spawn starts.
    stdin
        .write_all(format!("{spawn}\n{kill}\n{spawn}\n").as_bytes())
        .unwrap();
    let mut lines = BufReader::new(agent.stdout.take().unwrap()).lines();
    // Three replies come, whatever they say (the hello first).
    let mut replies = Vec::new();
    while replies.len() < 3 {
        let line = lines.next().expect("a reply").unwrap();
        let m: serde_json::Value = serde_json::from_str(&line).unwrap();
        if m["type"] == "reply" {
            replies.push(m);
        }
    }
    let find = |id: u64, error: bool| {
        replies
            .iter()
            .find(|m| m["id"] == id && m.get("error").is_some() == error)
            .unwrap_or_else(|| panic!("no reply {id} (error: {error}): {replies:?}"))
    };
    let (spawned, killed) = (find(5, false), find(6, false));
    let refused = &find(5, true)["error"];
    let pid = spawned["ok"]["pid"].as_i64().unwrap() as i32;
    assert_eq!(killed["ok"]["job"], 5, "{killed}");
    assert_eq!(killed["ok"]["running"], false, "{killed}");
    assert_eq!(refused["kind"], "usage", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("already spawned as 5"),
        "{refused}"
    );
    assert!(gone_within(pid, 60), "the job {pid} still runs");
    drop(stdin);
    let out = finish(agent, "the agent after its stdin closed");
    assert_eq!(out.code, 0);
}

/// The epilog waited with its own loop, not the machine's: a job's launcher that started its
/// holder again after the epilog's kill was not seen restarting it (the wait ran to its
/// timeout), nor remembered for a later diagnose. It waits as every front end does now.
#[test]
fn the_epilog_sees_a_restarter_start_its_holder_again_and_remembers_it() {
    let sim = Sim::new("1x8G");
    let bin = fake_slurm(sim.path());
    let pids = sim.hold_with(
        &["--gpu", "0", "--mib", "100", "--supervise"],
        &[("SLURM_JOB_ID", "812")],
    );
    assert_eq!(pids.len(), 2, "{pids:?}");
    let vars = [("SLURM_JOB_ID", "812"), ("SLURMD_NODENAME", "gpu07")];
    let out = slurm_hook(&sim, &bin, "epilog", "30", &vars);
    let seen = std::fs::read_to_string(sim.path().join("state-home/gpuloop/restarters.json"))
        .unwrap_or_default();
    assert!(
        seen.contains(&format!("\"pid\":{}", pids[0])),
        "the launcher {} was not remembered: {seen}\n{}\n{}",
        pids[0],
        out.stdout,
        out.stderr
    );
    // The launcher and the holder it started last.
    sim.run(&["sim", "stop"]).ok();
    assert!(gone_within(pids[0], 10));
}

/// Issue 33, item 4: `--limit calls=1M` aborted with a stack overflow (exit 134): its stack
/// (64 GiB) could not be had and the script ran on the main thread with the limit in force.
/// It is a usage error naming the largest value that works, and that value works.
#[test]
fn a_calls_limit_whose_stack_cannot_be_had_is_a_usage_error_naming_the_largest() {
    let sim = Sim::new("1x8G");
    let deep = "fn f(n) { if n == 0 { 0 } else { 1 + f(n - 1) } } f(20000)";
    let out = sim.run(&["--limit", "calls=1M", "eval", deep]).code(2);
    let largest: usize = out
        .stderr
        .split("the largest calls limit that works is ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(largest > 20_000, "{}", out.stderr);
    let out = sim
        .run(&["--limit", &format!("calls={largest}"), "eval", deep])
        .ok();
    assert_eq!(out.stdout.trim(), "20000");
}

/// As root, gpuloop read the files it was named (a script, `run -` from a file,
/// `--hosts-file`, config.toml) and made the user's recipes (`recipes new`, the REPL's
/// `:save`) wherever they were, through any directory or link another account could change:
/// that account's lines ran, or set what root allows, as root. Each is read or written now
/// only when the file and every directory above it are root's and writable by no one else,
/// and never through a link.
#[test]
#[ignore = "needs root: makes directories and files of another user (nobody)"]
fn as_root_what_another_account_can_write_is_neither_read_nor_written() {
    require_root("to make files of another user");
    let sim = Sim::new("1x1G");
    let dir = sim.path();
    let marker = dir.join("ran");
    let marking = format!("write_file({:?}, \"ran\");\n", marker.display().to_string());
    let nobody = |p: &Path| std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    let chmod = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap()
    };
    let refused = |out: Out, words: &[&str]| {
        let out = out.code(2);
        has(&out, words);
        has(
            &out,
            &["run as root, gpuloop reads a file it is named only when"],
        );
        assert!(!marker.exists(), "{}", out.stderr);
    };

    // A script by path in a directory of nobody's, and one named through a link.
    let theirs = dir.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("s.rhai"), &marking).unwrap();
    nobody(&theirs);
    let s = theirs.join("s.rhai").display().to_string();
    refused(
        run(&sim, &["run", &s]),
        &["cannot read script", "theirs is owned by nobody"],
    );
    refused(run(&sim, &["check", &s]), &["theirs is owned by nobody"]);
    std::fs::write(dir.join("mine.rhai"), &marking).unwrap();
    std::os::unix::fs::symlink(dir.join("mine.rhai"), dir.join("link.rhai")).unwrap();
    refused(
        run(&sim, &["run", "./link.rhai"]),
        &["link.rhai is a symbolic link"],
    );
    // A script on stdin from a file nobody owns.
    std::fs::write(dir.join("stdin.rhai"), &marking).unwrap();
    nobody(&dir.join("stdin.rhai"));
    let stdin = Stdio::from(std::fs::File::open(dir.join("stdin.rhai")).unwrap());
    refused(
        run_in(&sim, &["run", "-"], stdin),
        &["from stdin", "stdin.rhai is owned by nobody"],
    );
    // The hosts file, nobody's.
    std::fs::write(dir.join("hosts"), "local\n").unwrap();
    nobody(&dir.join("hosts"));
    refused(
        run(&sim, &["--hosts-file", "hosts", "gpus"]),
        &["hosts file hosts", "hosts is owned by nobody"],
    );
    // config.toml writable by its group, allowing the MCP server to run commands.
    let conf = dir.join("config/gpuloop");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("config.toml"), "[mcp]\nallow = [\"run\"]\n").unwrap();
    chmod(&conf.join("config.toml"), 0o664);
    refused(
        run(&sim, &["gpus"]),
        &[
            "config file",
            "config.toml is writable by its group (mode 0664)",
        ],
    );
    chmod(&conf.join("config.toml"), 0o644);
    // The user's recipe directory a link to nobody's: nothing is written there.
    std::fs::create_dir(dir.join("their-recipes")).unwrap();
    nobody(&dir.join("their-recipes"));
    std::os::unix::fs::symlink(dir.join("their-recipes"), conf.join("recipes")).unwrap();
    let out = run(&sim, &["recipes", "new", "planted"]).code(2);
    has(
        &out,
        &["cannot write there", "their-recipes is owned by nobody"],
    );
    assert!(!dir.join("their-recipes/planted.rhai").exists());

    // Root's own, as they are named, are read.
    std::fs::remove_file(dir.join("link.rhai")).unwrap();
    run(&sim, &["run", "./mine.rhai"]).ok();
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    std::os::unix::fs::chown(dir.join("hosts"), Some(0), Some(0)).unwrap();
    run(&sim, &["--hosts-file", "hosts", "gpus"]).ok();
    let stdin = Stdio::from(std::fs::File::open(dir.join("mine.rhai")).unwrap());
    run_in(&sim, &["run", "-"], stdin).ok();
    assert!(marker.exists());
}
