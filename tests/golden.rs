//! Golden JSON: the shape of every record a one-shot prints with `--json`, and of every
//! message on the agent's wire, pinned by snapshots. Renaming, dropping or retyping a field
//! fails here. Values that differ from run to run (pids, start times, durations, host and
//! user names, paths) are replaced by a placeholder naming the field and its JSON type, so a
//! snapshot holds field names, types and the values that are the same on every machine.

use crate::support::*;
use gpuloop::hosts::protocol::{Call, KillOpts, KillTarget, Request, RunCall, WaitMore, WaitWire};
use gpuloop::inspect::Filter;
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Fields whose value is a pid.
const PID_FIELDS: &[&str] = &["pid", "ppid", "pgid", "sid", "holder", "gpuloop_pid"];
/// Fields whose value is a list of pids.
const PID_LISTS: &[&str] = &[
    "signalled",
    "would_signal",
    "exited",
    "survivors",
    "ghost_pids",
    "leftovers",
    // A holder's `inherited.from`: the dead creators' pids.
    "from",
];
/// Fields whose value depends on the machine, the clock or the build.
const VARYING: &[&str] = &[
    "start",
    "pidfs_ino",
    "ino",
    "elapsed_ms",
    "exit_ms",
    "wait_ms",
    "released_ms",
    "settle_ms",
    // A reparented process's parent is whatever init or subreaper the machine runs.
    "ppid_comm",
    "ppid_name",
    "time",
    "uid",
    "user",
    "hostname",
    "host",
    "version",
    "cgroup",
    "cmdline",
    // A container's id and name, and its name in its pod (tests/containers.rs).
    "container",
    "container_name",
    // Other users' processes, which only root may inspect.
    "unreadable",
];

/// `v` with every varying value replaced by `<field: type>`; pids named inside a text (an
/// advice, a reason) become `<pid>`.
fn normalise(v: &Value) -> Value {
    let mut pids = BTreeSet::new();
    collect_pids(v, None, &mut pids);
    redact(&without_quick_launchers(v), None, &pids)
}

/// `v` without the restarters of holders that exited: a launcher that only waited for its
/// holder is left out of a kill report if it exits within a short window after it, which a
/// busy machine may miss. The restarters of holders still running stay.
fn without_quick_launchers(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut m: serde_json::Map<String, Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), without_quick_launchers(v)))
                .collect();
            if let (Some(Value::Array(exited)), Some(Value::Array(rs))) =
                (m.get("exited").cloned(), m.get_mut("restarters"))
            {
                rs.retain(|r| !exited.contains(&r["holder"]));
            }
            Value::Object(m)
        }
        Value::Array(a) => Value::Array(a.iter().map(without_quick_launchers).collect()),
        _ => v.clone(),
    }
}

fn collect_pids(v: &Value, field: Option<&str>, pids: &mut BTreeSet<i64>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                collect_pids(v, Some(k), pids);
            }
        }
        Value::Array(a) => {
            for v in a {
                collect_pids(v, field, pids);
            }
        }
        Value::Number(n)
            if field.is_some_and(|f| PID_FIELDS.contains(&f) || PID_LISTS.contains(&f)) =>
        {
            pids.extend(n.as_i64());
        }
        _ => {}
    }
}

fn placeholder(field: &str, v: &Value) -> Value {
    let kind = match v {
        Value::Null => return Value::Null,
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    Value::String(format!("<{field}: {kind}>"))
}

fn redact(v: &Value, field: Option<&str>, pids: &BTreeSet<i64>) -> Value {
    match (v, field) {
        (Value::Object(m), _) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    // A user's name inside a `user` record varies with the machine.
                    let f = match (field, k.as_str()) {
                        (Some("user"), "name") => "user",
                        _ => k.as_str(),
                    };
                    (k.clone(), redact(v, Some(f), pids))
                })
                .collect(),
        ),
        (Value::Array(a), _) => {
            let mut a: Vec<Value> = a.iter().map(|v| redact(v, field, pids)).collect();
            // Records listed by pid come in pid order, which starts again at the bottom when
            // the kernel's pids wrap around: their order is not part of the shape.
            if a.iter().all(|r| r.get("pid").is_some()) {
                a.sort_by_cached_key(Value::to_string);
            }
            Value::Array(a)
        }
        (Value::Number(_), Some(f)) if PID_FIELDS.contains(&f) || PID_LISTS.contains(&f) => {
            placeholder("pid", v)
        }
        (_, Some(f)) if VARYING.contains(&f) => placeholder(f, v),
        (Value::String(s), _) if s.starts_with('/') => placeholder("path", v),
        (Value::String(s), _) => Value::String(without_times(&without_pids(s, pids))),
        _ => v.clone(),
    }
}

/// `s` with each UTC time written into it ("at 2026-12-03T14:05:12Z", an Xid's in advice)
/// replaced by `<time>`.
fn without_times(s: &str) -> String {
    const SHAPE: &[u8] = b"dddd-dd-ddTdd:dd:ddZ";
    let b = s.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let here = b.get(i..i + SHAPE.len()).is_some_and(|w| {
            w.iter().zip(SHAPE).all(|(c, p)| {
                if *p == b'd' {
                    c.is_ascii_digit()
                } else {
                    c == p
                }
            })
        });
        if here {
            out.push_str("<time>");
            i += SHAPE.len();
        } else {
            let c = s[i..].chars().next().unwrap_or_default();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `s` with each run of digits that is one of `pids` replaced by `<pid>`.
fn without_pids(s: &str, pids: &BTreeSet<i64>) -> String {
    let mut out = String::new();
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        match digits.parse::<i64>() {
            Ok(n) if pids.contains(&n) => out.push_str("<pid>"),
            _ => out.push_str(digits),
        }
        digits.clear();
    };
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

pub(crate) fn golden(name: &str, v: &Value) {
    let text = serde_json::to_string_pretty(&normalise(v)).expect("JSON");
    insta::assert_snapshot!(name, text);
}

/// The JSON a one-shot prints, whatever its exit code (a kill that leaves a process stuck
/// exits 1 and still prints its report).
fn json_of(sim: &Sim, args: &[&str]) -> Value {
    let out = sim.run(&[&["--json"], args].concat());
    assert!(
        out.code == 0 || out.code == 1,
        "{args:?} exited {}: {}",
        out.code,
        out.stderr
    );
    out.json()
}

#[test]
fn golden_gpus_holders_and_diagnose() {
    let sim = Sim::new("3x8G");
    // GPU 0: a compute holder and the child that inherited its handles (seen by fd and map,
    // not by the driver); GPU 1: a protected daemon and an observer (fd only); GPU 2: a
    // context's footprint from a process of GPU 0 that maps every GPU.
    sim.hold(&["--gpu", "0", "--mib", "64", "--fork-child"]);
    sim.hold(&["--gpu", "1", "--mib", "16", "--name", "nv-hostengine"]);
    sim.hold(&["--gpu", "1", "--observer"]);
    sim.hold(&["--gpu", "0", "--mib", "8", "--map-all"]);
    golden("gpus", &json_of(&sim, &["gpus"]));
    golden("holders", &json_of(&sim, &["holders"]));
    golden("holders_all", &json_of(&sim, &["holders", "--all"]));
    golden("diagnose", &json_of(&sim, &["diagnose"]));
}

/// The GPUs' faults (an Xid naming a process, a pending remap), the verdicts they give with
/// the clients in a reset's way, and `reset --dry-run`'s report.
#[test]
fn golden_faults_and_reset_readiness() {
    let sim = Sim::new("2x8G");
    sim.run(&["sim", "leak", "--gpu", "0", "--mib", "64"]).ok();
    let smi = sim.hold(&["--gpu", "0", "--observer", "--name", "nvidia-smi"])[0];
    sim.run(&[
        "sim",
        "fault",
        "--gpu",
        "0",
        "--xid",
        "48",
        "--pid",
        &smi.to_string(),
        "--name",
        "nvidia-smi",
    ])
    .ok();
    sim.run(&["sim", "fault", "--gpu", "1", "--remap-pending"])
        .ok();
    golden("gpus_faults", &json_of(&sim, &["gpus"]));
    golden("diagnose_faults", &json_of(&sim, &["diagnose"]));
    golden(
        "reset_dry_run",
        &json_of(&sim, &["reset", "--gpu", "0", "--dry-run"]),
    );
}

#[test]
fn golden_diagnose_of_an_inherited_gpu_names_the_ghost() {
    let sim = Sim::new("1x8G");
    sim.hold(&[
        "--gpu",
        "0",
        "--mib",
        "64",
        "--fork-child",
        "--exit-creator",
    ]);
    golden("diagnose_inherited", &json_of(&sim, &["diagnose"]));
}

#[test]
fn golden_kill_reports_dry_run_and_real() {
    let sim = Sim::new("4x8G");
    // GPU 0: a plain holder (exits on TERM) under a launcher that may restart it; GPU 1: one
    // that ignores TERM (killed at once); GPU 2: a protected daemon (skipped); GPU 3: one
    // asleep in the driver (stuck).
    sim.hold(&["--gpu", "0", "--mib", "64", "--supervise"]);
    sim.hold(&["--gpu", "1", "--mib", "64", "--ignore-term"]);
    sim.hold(&["--gpu", "2", "--mib", "16", "--name", "nv-hostengine"]);
    sim.hold(&["--gpu", "3", "--mib", "32", "--stuck"]);
    golden("kill_dry_run", &json_of(&sim, &["kill", "--dry-run"]));
    golden(
        "kill",
        &json_of(&sim, &["kill", "--gpu", "1-3", "--grace", "0.2"]),
    );
    sim.run(&["sim", "release"]).ok();
    // A holder that catches TERM, with no escalation: a survivor.
    let sim = Sim::new("1x8G");
    sim.hold(&["--gpu", "0", "--mib", "64", "--catch-term"]);
    golden("kill_survivor", &json_of(&sim, &["kill", "--grace", "0"]));
}

#[test]
fn golden_clean_and_wait() {
    let sim = Sim::new("2x8G");
    sim.hold(&["--gpu", "0", "--mib", "64"]);
    golden("clean", &json_of(&sim, &["clean", "--gpu", "0"]));
    golden("wait", &json_of(&sim, &["wait", "--gpu", "0"]));
    sim.run(&["sim", "leak", "--gpu", "1", "--mib", "8"]).ok();
    golden(
        "wait_timed_out",
        &json_of(&sim, &["wait", "--gpu", "1", "--timeout", "0.2"]),
    );
}

#[test]
fn golden_recipes_and_journal() {
    let sim = Sim::new("1x8G");
    golden("recipes", &json_of(&sim, &["recipes"]));
    sim.hold(&["--gpu", "0", "--mib", "64", "--fork-child"]);
    sim.run(&["kill"]).ok();
    golden("journal", &json_of(&sim, &["journal"]));
}

/// The maps scripts get are the same records: holders(), diagnose() and gpus() as a script
/// sees them, with the categories plain strings a script compares (`h.role == "compute"`).
#[test]
fn golden_script_maps() {
    let sim = Sim::new("2x8G");
    sim.hold(&["--gpu", "0", "--mib", "64", "--fork-child"]);
    sim.hold(&["--gpu", "1", "--mib", "16", "--name", "nv-hostengine"]);
    golden(
        "script_maps",
        &sim.eval_json("#{gpus: gpu(), holders: holders(), diagnose: diagnose()}"),
    );
    let types = sim.eval_json(
        "let h = holders()[0]; \
         [type_of(h.role), type_of(h.state), type_of(h.evidence[0]), h.role == \"compute\"]",
    );
    assert_eq!(
        types,
        serde_json::json!(["string", "string", "string", true])
    );
}

/// Every call the client sends, as its types write it, and what a real agent on the
/// simulator answers to each: the hello, replies (results and errors) and job output.
#[test]
fn golden_agent_wire() {
    let sim = Sim::new("2x8G");
    let victim = sim.hold(&["--gpu", "0", "--mib", "64"])[0];
    sim.hold(&["--gpu", "1", "--mib", "32"]);
    let mut agent = sim
        .std_cmd()
        .arg("agent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    sim.adopt(agent.id() as i32);
    let mut stdin = agent.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = agent.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a line from the agent");
        serde_json::from_str::<Value>(&line).expect("the agent writes JSON lines")
    };
    golden("wire_hello", &next());

    let opts = KillOpts {
        signal: "TERM".into(),
        grace_ms: 5_000,
        tree: true,
        dry_run: false,
        force: false,
        parents: false,
        user: None,
        pod: None,
        container: None,
    };
    let wait = WaitWire {
        timeout_ms: 10_000,
        max_used_mib: 0,
        poll_ms: 50,
        more: WaitMore::default(),
    };
    let run = RunCall {
        shell: Some("echo out".into()),
        argv: None,
        timeout_ms: Some(60_000),
        cwd: None,
        env: vec![("GOLDEN".into(), "1".into())],
        grace_ms: 1_000,
        echo: true,
        keep_children: false,
    };
    let sleeper = RunCall {
        shell: None,
        argv: Some(vec!["sleep".into(), "60".into()]),
        echo: false,
        ..run.clone()
    };
    let filter = Filter::default;
    let calls: Vec<(&str, Call)> = vec![
        (
            "reached_as",
            Call::ReachedAs {
                host: "gpu01".into(),
                gpuloop: "gpuloop --host gpu01".into(),
            },
        ),
        ("ping", Call::Ping),
        ("gpus", Call::Gpus),
        (
            "holders",
            Call::Holders {
                sel: None,
                all: false,
                filter: filter(),
            },
        ),
        (
            "holders_report",
            Call::HoldersReport {
                sel: Some(vec![0]),
                all: true,
                filter: filter(),
            },
        ),
        (
            "diagnose",
            Call::Diagnose {
                sel: Some(vec![0]),
                filter: filter(),
            },
        ),
        (
            "kill_holders",
            Call::KillHolders {
                sel: Some(vec![1]),
                filter: filter(),
                opts: KillOpts {
                    dry_run: true,
                    ..opts.clone()
                },
            },
        ),
        (
            "kill",
            Call::Kill {
                targets: vec![KillTarget {
                    pid: victim,
                    start: start_of(victim),
                    ino: None,
                }],
                opts: opts.clone(),
            },
        ),
        (
            "wait_clean",
            Call::WaitClean {
                sel: Some(vec![0]),
                // A pod no process here is in: a usage error (never "clean" for a scope that
                // names nothing).
                filter: Filter {
                    pod: Some("ml/trainer-0".into()),
                    ..Filter::default()
                },
                wait,
            },
        ),
        (
            "clean",
            Call::Clean {
                sel: Some(vec![1]),
                filter: filter(),
                kill: opts.clone(),
                wait,
            },
        ),
        ("run", Call::Run(run)),
        ("spawn", Call::Spawn(sleeper)),
        ("job_status", Call::JobStatus { job: 12 }),
        (
            "job_wait",
            Call::JobWait {
                job: 12,
                timeout_ms: 10,
            },
        ),
        (
            "job_kill",
            Call::JobKill {
                job: 12,
                signal: "TERM".into(),
                grace_ms: Some(5_000),
            },
        ),
        ("cancel", Call::Cancel { id: 999 }),
        (
            "reset",
            Call::Reset {
                gpus: vec![1],
                dry_run: true,
                force: false,
                grace_ms: 5_000,
                timeout_ms: 30_000,
                mig: None,
            },
        ),
        (
            "journal",
            Call::Journal {
                last: 2,
                since: None,
                pid: Some(victim as i64),
                user: None,
                front_end: None,
            },
        ),
    ];
    for (id, (name, call)) in (1..).zip(calls) {
        assert_eq!(call.method(), name);
        let request = serde_json::to_value(Request { id, call }).unwrap();
        writeln!(stdin, "{request}").unwrap();
        let mut answer = Vec::new();
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < end, "no reply to {name}");
            let m = next();
            let last = m["type"] == "reply";
            answer.push(m);
            if last {
                break;
            }
        }
        golden(
            &format!("wire_{name}"),
            &serde_json::json!({"request": request, "answer": answer}),
        );
    }
    // Requests the agent refuses get error replies, as data.
    for (name, line) in [
        ("wire_error_malformed", "not json".to_string()),
        (
            "wire_error_unknown_method",
            r#"{"id":100,"method":"reboot"}"#.to_string(),
        ),
        (
            "wire_error_bad_params",
            r#"{"id":101,"method":"job_wait","params":{"job":"x"}}"#.to_string(),
        ),
    ] {
        writeln!(stdin, "{line}").unwrap();
        golden(
            name,
            &serde_json::json!({"request": line, "answer": next()}),
        );
    }
    drop(stdin);
    assert!(agent.wait().unwrap().success());
}
