//! Text another user chose reaches no terminal raw: real processes whose comm (prctl) and
//! argv (exec) hold ESC, CSI, OSC, C1 and bidi sequences, and an Xid logged for one of them,
//! rendered through every command that shows them. Every control character is shown escaped
//! (`\x1b`, `\u{202e}`) and never written; `--json` stays the exact data.

use crate::support::*;
use serde_json::{json, Value};

/// A comm (13 bytes: prctl keeps 15) that moves the cursor up, erases the line with an 8-bit
/// CSI, and reverses what follows.
const COMM: &str = "\x1b[1A\u{9b}2K\u{202e}ok";

/// An argv that clears the screen, homes the cursor, writes the clipboard (OSC 52), hides
/// what follows, and puts a fake verdict on a line of its own; its first 15 bytes are the
/// comm.
const ARGV: &str =
    "\x1b[2J\x1b[H\x1b]52;c;Y2xlYW4=\x07\x1b[8m\r\nGPU 0 clean\n\x7f\u{2066}\u{2028}\x1b[0m";

/// What must never be written raw, with or without colour.
const RAW: &[&str] = &[
    "\x1b[1A", "\x1b[2J", "\x1b[H", "\x1b]", "\x1b[8m", "\u{9b}", "\u{202e}", "\u{2066}",
    "\u{2028}", "\x07", "\x7f", "\r",
];

/// Fails unless `out` carries none of the sequences above; without colour, no ESC at all and
/// no control character but newlines; and no line that a name's newline began.
fn clean(what: &str, out: &str, colour: bool) {
    raw_free(what, out, colour);
    assert!(
        !out.lines().any(|l| l.starts_with("GPU 0 clean")),
        "{what}: a fake line:\n{out}"
    );
}

/// As `clean`, for what a script prints: its lines are the script's (a script prints text of
/// many lines), every other control is escaped.
fn raw_free(what: &str, out: &str, colour: bool) {
    for raw in RAW {
        assert!(!out.contains(raw), "{what}: {raw:?} written raw:\n{out:?}");
    }
    if !colour {
        let bad: Vec<char> = out
            .chars()
            .filter(|&c| {
                matches!(c, '\0'..='\x1f' | '\x7f'..='\u{9f}' | '\u{202a}'..='\u{202e}')
                    && c != '\n'
            })
            .collect();
        assert!(bad.is_empty(), "{what}: {bad:?} written raw:\n{out:?}");
    }
}

fn both(what: &str, out: &Out, colour: bool) {
    clean(&format!("{what} (stdout)"), &out.stdout, colour);
    clean(&format!("{what} (stderr)"), &out.stderr, colour);
}

/// Every command that shows a process's name or command line, an Xid's name and text, the
/// journal, a script's print/log/warn, the REPL and eval's values, preflight's reason, the
/// Slurm epilog's log and drain reason, and MCP's text: escaped, with and without colour.
/// `--json` and MCP's structured content keep the exact names.
#[test]
fn names_and_command_lines_with_terminal_controls_are_shown_escaped_everywhere() {
    let sim = Sim::new("2x8G");
    let short = sim.hold(&["--gpu", "0", "--mib", "64", "--name", COMM])[0];
    let long = sim.hold(&["--gpu", "0", "--mib", "32", "--name", ARGV])[0];
    let watcher = sim.hold(&["--gpu", "0", "--observer", "--name", COMM])[0];
    let comm_of_long = std::fs::read(format!("/proc/{long}/comm")).unwrap();
    assert_eq!(
        &comm_of_long[..comm_of_long.len() - 1],
        &ARGV.as_bytes()[..15]
    );
    let argv = std::fs::read(format!("/proc/{long}/cmdline")).unwrap();
    assert!(
        argv.windows(ARGV.len()).any(|w| w == ARGV.as_bytes()),
        "the holder's argv carries the sequences"
    );
    // The driver logs an Xid for it, naming it by its comm: the kernel's /dev/kmsg escapes.
    sim.xid(0, 13, Some(short), None);
    let script = "let h = holders(0, #{all: true}); print(h[0].cmdline); print(h[1].name); \
                  log(h[1].name); warn(h[1].cmdline); debug(h[0].name); \
                  print(gpu(0).faults.xid[0].text); h.map(|h| h.name)";
    let mcp = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"holders","arguments":{"all":true}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"diagnose","arguments":{}}}"#,
    ];
    for colour in [false, true] {
        let c = if colour { "always" } else { "never" };
        let run = |args: &[&str]| sim.run(&[&["--color", c][..], args].concat());
        for args in [
            &["holders", "--all"][..],
            &["--wide", "holders"],
            &["top", "--once"],
            &["diagnose"],
            &["gpus"],
            &["kill", "--gpu", "0", "--dry-run"],
            &["reset", "--gpu", "0", "--dry-run"],
            &["wait", "--gpu", "0", "--timeout", "0"],
            &["eval", "holders(0, #{all: true})"],
            &["eval", "holders()[0].name"],
            &["eval", "diagnose(0)"],
            &["eval", "gpu(0).faults.xid"],
        ] {
            let out = run(args);
            assert!(out.code == 0 || out.code == 1, "{args:?}: {out:?}");
            both(&format!("{args:?} --color {c}"), &out, colour);
        }
        let out = run(&["eval", script]);
        assert_eq!(out.code, 0, "{out:?}");
        raw_free(&format!("script --color {c}"), &out.stdout, colour);
        raw_free(&format!("script --color {c}"), &out.stderr, colour);
        // The REPL, read from a pipe, shows its values as eval does.
        let out = sim.run_with(&["--color", c, "repl"], |cmd| {
            cmd.write_stdin("holders(0, #{all: true})\nholders()[1].name\ndiagnose(0)\n");
        });
        both(&format!("repl --color {c}"), &out, colour);
        // preflight's one-line reason names a foreign observer.
        let out = sim.run_with(&["--color", c, "run", "preflight", "--gpu", "0"], |cmd| {
            cmd.env("SLURM_JOB_USER", "alice");
        });
        assert_eq!(out.code, 1, "{out:?}");
        both(&format!("preflight --color {c}"), &out, colour);
        // MCP's text blocks.
        let out = sim
            .cmd()
            .args(["--color", c, "mcp"])
            .write_stdin(mcp.join("\n") + "\n")
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .expect("gpuloop mcp");
        let replies: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON-RPC"))
            .collect();
        for id in [2, 3] {
            let r = replies
                .iter()
                .find(|r| r["id"] == json!(id))
                .unwrap_or_else(|| panic!("no reply {id}: {replies:?}"));
            for block in r["result"]["content"].as_array().expect("content") {
                clean(&format!("mcp {id}"), block["text"].as_str().unwrap(), false);
            }
            if id == 2 {
                let names: Vec<&str> = r["result"]["structuredContent"]["holders"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h["name"].as_str().unwrap())
                    .collect();
                assert!(names.contains(&COMM), "the exact data: {names:?}");
            }
        }
        clean("mcp stderr", &String::from_utf8_lossy(&out.stderr), false);
    }
    // --json is the exact data, and no control character is written raw: serde_json escapes
    // C0, and C1, DEL and the bidi controls are written as \u escapes too.
    let out = sim.run(&["--json", "holders", "--all"]).ok();
    clean("--json holders", &out.stdout, false);
    let hs: std::collections::HashMap<i64, Value> = out
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["pid"].as_i64().unwrap(), h.clone()))
        .collect();
    let by_pid = |pid: i32| &hs[&(pid as i64)];
    assert_eq!(by_pid(short)["name"], COMM);
    assert_eq!(by_pid(watcher)["name"], COMM);
    assert!(by_pid(long)["cmdline"].as_str().unwrap().contains(ARGV));
    let g = sim.run(&["--json", "gpus"]).ok();
    clean("--json gpus", &g.stdout, false);
    let x = &g.json()[0]["faults"]["xid"][0];
    assert_eq!(x["pid"], short as i64, "{x}");
    assert_eq!(
        x["name"], COMM,
        "the name read back from the kernel's escapes: {x}"
    );
    let out = sim
        .run(&["--json", "eval", "holders(0, #{all: true})"])
        .ok();
    clean("--json eval", &out.stdout, false);
    // The kill's report names them; the journal keeps them; neither writes them raw.
    let out = sim.run(&["kill", &short.to_string()]).ok();
    both("kill", &out, false);
    let out = sim.run(&["--color", "always", "journal"]).ok();
    assert!(out.stdout.contains(&short.to_string()), "{}", out.stdout);
    both("journal", &out, true);
    clean(
        "journal --json",
        &sim.run(&["--json", "journal"]).ok().stdout,
        false,
    );
    // The Slurm epilog stops the job's holder and drains the node for memory nobody holds:
    // its log lines name the holder, and scontrol gets a reason without a control character.
    let fake = sim.path().join("slurm-bin");
    std::fs::create_dir_all(&fake).unwrap();
    let said = sim.path().join("scontrol.args");
    std::fs::write(fake.join("squeue"), "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::write(
        fake.join("scontrol"),
        format!("#!/bin/sh\nprintf '%s\\n' \"$@\" >> {}\n", said.display()),
    )
    .unwrap();
    for f in ["squeue", "scontrol"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(fake.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let job = sim.hold_with(
        &["--gpu", "1", "--mib", "64", "--setsid", "--name", ARGV],
        &[("SLURM_JOB_ID", "812")],
    )[0];
    sim.run(&["sim", "leak", "--gpu", "1", "--mib", "900"]).ok();
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = sim.run_with(&["epilog", "--timeout", "1"], |c| {
        c.envs([
            ("SLURM_JOB_ID", "812"),
            ("SLURM_JOB_USER", "root"),
            ("SLURM_JOB_GPUS", "1"),
            ("SLURMD_NODENAME", "gpu07"),
            ("PATH", path.as_str()),
        ]);
    });
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains(&format!("pid {job} (")),
        "{}",
        out.stderr
    );
    both("epilog", &out, false);
    let args = std::fs::read_to_string(&said).expect("scontrol ran");
    assert!(args.contains("reason=gpuloop: GPU 1"), "{args}");
    clean("drain reason", &args, false);
    assert!(!alive(job));
    let _ = watcher;
}
