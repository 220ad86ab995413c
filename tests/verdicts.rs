//! One meaning of "clean": every GPU state the simulator can make, judged by every front end
//! (diagnose's exit code, `diagnose --check`, `wait`, a script's wait_clean, MCP diagnose's
//! `clean` field and its text, the Slurm epilog's dry run and real run). They must all agree.

use crate::support::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

/// One MCP call to a fresh `gpuloop mcp` over stdio: (structured result, text).
fn mcp_diagnose(sim: &Sim, gpus: &[i64]) -> (Value, String) {
    let mut child = sim
        .std_cmd()
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("gpuloop mcp");
    let mut stdin = child.stdin.take().unwrap();
    let lines = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "verdicts-test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "diagnose", "arguments": {"gpus": gpus}}}),
    ];
    for l in &lines {
        writeln!(stdin, "{l}").unwrap();
    }
    stdin.flush().unwrap();
    let mut answer = Value::Null;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap_or(Value::Null);
        if v["id"] == 2 {
            answer = v;
            break;
        }
    }
    drop(stdin);
    let _ = child.wait();
    let result = &answer["result"];
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (result["structuredContent"].clone(), text)
}

/// Every front end's answer to "is GPU 1 clean?", by name.
fn judgements(sim: &Sim, real_epilog: bool) -> Vec<(&'static str, bool)> {
    let fake = sim.path().join("fake-slurm");
    std::fs::create_dir_all(&fake).unwrap();
    for tool in ["squeue", "scontrol"] {
        let p = fake.join(tool);
        std::fs::write(&p, "#!/bin/sh\nexit 0\n").unwrap();
        let mut perm = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&p, perm).unwrap();
    }
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let epilog = |dry: bool| {
        let mut args = vec!["epilog", "--timeout", "1"];
        if dry {
            args.push("--dry-run");
        }
        sim.run_with(&args, |c| {
            c.env("SLURM_JOB_ID", "7")
                .env("SLURM_JOB_USER", "root")
                .env("SLURM_JOB_GPUS", "1")
                .env("SLURMD_NODENAME", "n1")
                .env("PATH", &path);
        })
    };
    let (structured, text) = mcp_diagnose(sim, &[1]);
    let dry = epilog(true);
    let mut out = vec![
        (
            "diagnose exit",
            sim.run(&["diagnose", "--gpu", "1"]).code == 0,
        ),
        (
            "diagnose --check",
            sim.run(&["diagnose", "--check", "--gpu", "1"]).code == 0,
        ),
        (
            "wait --timeout 0",
            sim.run(&["wait", "--gpu", "1", "--timeout", "0"]).code == 0,
        ),
        (
            "wait_clean()",
            sim.eval("wait_clean(1, #{timeout: 0})") == "true",
        ),
        (
            "MCP clean field",
            structured["clean"]
                .as_bool()
                .unwrap_or_else(|| panic!("{structured}")),
        ),
        ("MCP text", text.starts_with("the selected GPU is clean")),
        (
            "epilog --dry-run",
            dry.code == 0 && dry.stderr.contains("GPUs clean: nothing to do"),
        ),
    ];
    if real_epilog {
        out.push(("epilog", epilog(false).code == 0));
    }
    out
}

/// The bug: a 3 MiB CUDA footprint of a GPU-0 job on GPU 1 was clean to diagnose (exit 0) and
/// to MCP's text, not clean to MCP's `clean` field, and a reason to drain for the epilog's dry
/// run. Each state below is judged by every front end; any two that differ fail the test.
#[test]
fn one_meaning_of_clean_every_verdict_through_every_front_end() {
    // (name, how to make it on a fresh simulator, clean?, no compute holder on GPU 1 to stop)
    type Make = fn(&Sim);
    let states: &[(&str, Make, bool, bool)] = &[
        ("clean", |_| {}, true, true),
        (
            "held",
            |s| {
                s.hold(&["--gpu", "1", "--mib", "100"]);
            },
            false,
            false,
        ),
        (
            "orphaned",
            |s| {
                let ps = s.hold(&["--gpu", "1", "--mib", "100", "--workers", "1"]);
                sigkill(ps[0]);
                assert!(gone_within(ps[0], 10));
            },
            false,
            false,
        ),
        (
            "inherited",
            |s| {
                s.hold(&[
                    "--gpu",
                    "1",
                    "--mib",
                    "100",
                    "--fork-child",
                    "--exit-creator",
                ]);
            },
            false,
            false,
        ),
        (
            "footprint",
            |s| {
                s.hold(&["--gpu", "0", "--mib", "100", "--map-all"]);
            },
            true,
            true,
        ),
        (
            "daemon",
            |s| {
                s.hold(&[
                    "--gpu",
                    "1",
                    "--mib",
                    "66",
                    "--name",
                    "nvidia-cuda-mps-server",
                ]);
            },
            true,
            true,
        ),
        // A daemon that only has the node open keeps no memory: memory nobody holds is the
        // driver's, and the daemon is what blocks the reset (issue 36).
        (
            "driver",
            |s| {
                s.hold(&["--gpu", "1", "--observer", "--name", "nvidia-persistenced"]);
                s.run(&["sim", "leak", "--gpu", "1", "--mib", "100"]).ok();
            },
            false,
            true,
        ),
        (
            "driver",
            |s| {
                s.run(&["sim", "leak", "--gpu", "1", "--mib", "100"]).ok();
            },
            false,
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (verdict, make, clean, nothing_to_stop) in states {
        let sim = Sim::new("2x8G");
        make(&sim);
        let d = sim.run(&["--json", "diagnose", "--gpu", "1"]).json();
        assert_eq!(d[0]["verdict"], *verdict, "{d}");
        for (front, said) in judgements(&sim, *nothing_to_stop) {
            if said != *clean {
                failures.push(format!(
                    "{verdict}: {front} says {}, expected {}",
                    if said { "clean" } else { "not clean" },
                    if *clean { "clean" } else { "not clean" }
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Memory a protected daemon keeps (an MPS server's context) is not dirt, unless `--strict`:
/// clean stops the MPS client, leaves the server, exits 0 and lists what the server keeps.
#[test]
fn mps_daemon_memory_does_not_make_a_gpu_unclean_unless_strict() {
    let sim = Sim::new("2x8G");
    let server = sim.hold(&[
        "--gpu",
        "1",
        "--mib",
        "66",
        "--name",
        "nvidia-cuda-mps-server",
    ])[0];
    let client = sim.hold(&["--gpu", "1", "--mib", "500"])[0];
    let out = sim.run(&["clean", "--gpu", "1", "--timeout", "10"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(gone_within(client, 10));
    assert!(alive(server), "the MPS server was stopped");
    let said = format!("66 MiB: MPS server pid {server}");
    assert!(out.stdout.contains(&said), "{}", out.stdout);
    assert!(
        out.stdout.contains("echo quit | nvidia-cuda-mps-control")
            && !out.stdout.contains("systemctl"),
        "{}",
        out.stdout
    );
    assert_eq!(sim.used_mib(1), 66);
    // Strict counts it, in every front end that takes it.
    sim.run(&["clean", "--gpu", "1", "--timeout", "1", "--strict"])
        .code(1);
    sim.run(&["wait", "--gpu", "1", "--timeout", "0", "--strict"])
        .code(1);
    assert_eq!(
        sim.eval("wait_clean(1, #{timeout: 0, strict: true})"),
        "false"
    );
    assert_eq!(sim.eval("wait_clean(1, #{timeout: 0})"), "true");
    assert!(alive(server));
}

/// A new user's report (issue 38): MCP's diagnose of one held GPU ended with "; 0 other
/// GPU(s) clean". It says the other GPUs only when there are some, in the right number.
#[test]
fn mcp_diagnose_text_counts_the_other_gpus_in_words() {
    let sim = Sim::new("3x8G");
    sim.hold(&["--gpu", "1", "--mib", "100"]);
    let (_, one) = mcp_diagnose(&sim, &[1]);
    assert!(one.starts_with("GPU 1 [held]"), "{one}");
    assert!(!one.contains("other GPU"), "{one}");
    let (_, two) = mcp_diagnose(&sim, &[0, 1]);
    assert!(two.ends_with("; 1 other GPU clean"), "{two}");
    let (_, three) = mcp_diagnose(&sim, &[0, 1, 2]);
    assert!(three.ends_with("; 2 other GPUs clean"), "{three}");
}
