//! `gpuloop mcp` driven by real MCP clients: the official Python SDK (tests/mcp/client.py,
//! one scenario group per test) and the MCP Inspector's CLI. `.ci/run` installs both (a venv
//! under target/mcp-venv, the inspector under target/mcp-inspector); a missing Python client
//! fails loudly, a missing node skips only the inspector test, with a message.

use crate::support::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("GPULOOP_TEST_PYTHON") {
        return p.into();
    }
    let p = root().join("target/mcp-venv/bin/python");
    assert!(
        p.exists(),
        "the MCP client tests need the Python `mcp` SDK in {}: run .ci/run, or \
         `python3 -m venv target/mcp-venv && target/mcp-venv/bin/pip install mcp`",
        p.display()
    );
    p
}

/// The environment a server of this simulator needs (an MCP client passes only what it is
/// told to the server it spawns).
fn server_env(sim: &Sim) -> serde_json::Map<String, Value> {
    let mut env: serde_json::Map<String, Value> = sim
        .std_cmd()
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_str()?.to_string(), json!(v?.to_str()?))))
        .collect();
    env.insert(
        "PATH".into(),
        json!(std::env::var("PATH").unwrap_or_default()),
    );
    env
}

/// Runs one scenario of the Python client against `gpuloop SERVER_ARGS`; panics with its
/// output unless every check in it passed.
fn python_client(sim: &Sim, scenario: &str, server_args: &[&str], planted: Value) {
    python_client_in(server_env(sim), scenario, server_args, planted)
}

fn python_client_in(
    env: serde_json::Map<String, Value>,
    scenario: &str,
    server_args: &[&str],
    planted: Value,
) {
    let out = assert_cmd::Command::new(python())
        .arg(root().join("tests/mcp/client.py"))
        .arg(scenario)
        .env("GPULOOP_BIN", bin())
        .env("MCP_SERVER_ARGS", json!(server_args).to_string())
        .env("MCP_SERVER_ENV", Value::Object(env).to_string())
        .env("MCP_PLANTED", planted.to_string())
        .timeout(Duration::from_secs(300))
        .output()
        .expect("run the Python MCP client");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "Python MCP client, scenario {scenario}: {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    eprintln!("{stdout}");
}

/// Starts a holder whose launcher is then SIGKILLed: its worker is an orphan. Returns the worker.
fn plant_orphan(sim: &Sim, gpu: &str, mib: &str) -> i32 {
    let ps = sim.hold(&[
        "--gpu",
        gpu,
        "--mib",
        mib,
        "--workers",
        "1",
        "--name",
        "pt_main_thread",
    ]);
    sigkill(ps[0]);
    assert!(
        gone_within(ps[0], 10),
        "launcher {} survived SIGKILL",
        ps[0]
    );
    ps[1]
}

#[test]
fn mcp_python_client_reads_diagnoses_and_is_refused_without_allow() {
    let sim = Sim::new("2x8G");
    let orphan = plant_orphan(&sim, "1", "4096");
    let daemon = sim.hold(&["--gpu", "0", "--name", "nvidia-persistenced"])[0];
    python_client(
        &sim,
        "read_only",
        &["--sim", "2x8G", "mcp"],
        json!({ "orphan": orphan, "daemon": daemon }),
    );
    assert!(alive(orphan), "a read-only server stopped the orphan");
    // `gpuloop journal` shows the same calls.
    let lines = sim.run(&["journal", "--last", "0"]).ok().stdout;
    assert_eq!(lines.lines().count(), 9, "{lines}");
    assert!(lines.contains(" clean refused "), "{lines}");
    let j = sim.run(&["--json", "journal", "-n", "2"]).ok().json();
    assert_eq!(j.as_array().map(Vec::len), Some(2), "{j}");
    assert_eq!(j[1]["tool"], "run_recipe");
}

/// Bad arguments and refusals were JSON-RPC errors, which many clients never pass to the
/// model, so it could neither correct the call nor tell its user how to allow it.
#[test]
fn mcp_bad_arguments_and_refusals_are_tool_results_the_model_reads() {
    let sim = Sim::new("2x8G");
    let holder = sim.hold(&["--gpu", "0", "--mib", "1024"])[0];
    python_client(
        &sim,
        "errors_are_results",
        &["--sim", "2x8G", "mcp"],
        json!({ "holder": holder }),
    );
    assert!(alive(holder), "a read-only server stopped the holder");
}

/// No tool declared an outputSchema, although every one returns structured content.
#[test]
fn mcp_every_tool_declares_an_output_schema_its_results_match() {
    let sim = Sim::new("3x8G");
    let victim = sim.hold(&["--gpu", "0", "--mib", "512"])[0];
    let held = sim.hold(&["--gpu", "1", "--mib", "512"])[0];
    python_client(
        &sim,
        "output_schemas",
        &["--sim", "3x8G", "mcp", "--allow", "kill,clean,run,recipes"],
        json!({ "kill": victim, "clean": held }),
    );
}

/// With `--host`, the read-only tools gather from every host over the real sshd (each
/// record with its host) and the tools that act on one machine are refused.
#[test]
fn mcp_python_client_reads_several_hosts_and_refuses_what_acts_on_one() {
    let c = crate::ssh::Cluster::new(&[("ma", "1x8G"), ("mb", "2x8G")], &[]);
    let a = c.sim("ma").hold(&["--gpu", "0", "--mib", "100"])[0];
    let b = c.sim("mb").hold(&["--gpu", "1", "--mib", "100"])[0];
    let mut env = serde_json::Map::new();
    for (k, v) in [
        ("PATH", std::env::var("PATH").unwrap_or_default()),
        (
            "XDG_STATE_HOME",
            c.dir.path().join("state").display().to_string(),
        ),
        (
            "XDG_CONFIG_HOME",
            c.dir.path().join("config").display().to_string(),
        ),
        ("NO_COLOR", "1".into()),
    ] {
        env.insert(k.into(), json!(v));
    }
    let (cfg, remote) = (c.config.display().to_string(), bin().display().to_string());
    python_client_in(
        env,
        "hosts",
        &[
            "--ssh-config",
            &cfg,
            "--remote-bin",
            &remote,
            "--host",
            "ma,mb",
            "mcp",
            "--allow",
            "clean",
        ],
        json!({ "ma": a, "mb": b }),
    );
    assert!(alive(a) && alive(b));
}

/// The issue's "done when": given only `gpuloop mcp --sim 8x80G --allow clean`, a client finds
/// the orphaned workers of the demo mess (examples/crashed-job.rhai), cleans them, and shows
/// the verification.
#[test]
fn mcp_python_client_cleans_the_demo_mess_with_allow_clean() {
    let sim = Sim::new("8x80G");
    let mut workers: Vec<i32> = (0..6)
        .map(|g| plant_orphan(&sim, &g.to_string(), "71680"))
        .collect();
    workers.extend(sim.hold(&[
        "--gpu",
        "6",
        "--mib",
        "40960",
        "--fork-child",
        "--exit-creator",
        "--name",
        "pt_data_worker",
    ]));
    workers.extend(sim.hold(&[
        "--gpu",
        "7",
        "--mib",
        "71680",
        "--ignore-term",
        "--name",
        "python3",
    ]));
    workers.retain(|&p| alive(p));
    let keep: Vec<i32> = [
        sim.hold(&["--gpu", "0", "--name", "nvidia-persistenced"]),
        sim.hold(&["--gpu", "3", "--observer", "--name", "nvidia-smi"]),
    ]
    .concat();
    python_client(
        &sim,
        "done_when",
        &["mcp", "--sim", "8x80G", "--allow", "clean"],
        json!({ "workers": workers, "keep": keep }),
    );
}

/// Also runs a recipe (clean-node) through `run_recipe` on a third GPU an orphan holds.
#[test]
fn mcp_python_client_cancels_wait_clean_and_run_and_never_kills_daemons() {
    let sim = Sim::new("3x8G");
    let holder = sim.hold(&["--gpu", "0", "--mib", "1024"])[0];
    let daemon = sim.hold(&["--gpu", "1", "--name", "nvidia-persistenced"])[0];
    let orphan = plant_orphan(&sim, "2", "2048");
    python_client(
        &sim,
        "cancel_and_run",
        &["--sim", "3x8G", "mcp", "--allow", "kill,run,recipes"],
        json!({ "daemon": daemon, "dir": sim.path(), "orphan": orphan, "orphan_gpu": 2 }),
    );
    assert!(alive(holder), "a cancelled wait_clean must kill nothing");
    assert!(
        !alive(orphan),
        "run_recipe clean-node left the orphan {orphan}"
    );
}

/// `run_recipe` under `--allow recipes` ran `./clean-node` of the server's directory, which
/// runs any command without `--allow run`.
#[test]
fn recipes_from_cwd_mcp_run_recipe_runs_only_built_in_recipes() {
    let sim = Sim::new("2x8G");
    let (dir, marker) = crate::recipes::hostile_dir(&sim);
    python_client(
        &sim,
        "recipes_from_cwd",
        &["--sim", "2x8G", "mcp", "--allow", "recipes,clean"],
        json!({ "cwd": dir, "marker": marker }),
    );
    assert!(!marker.exists());
}

/// Issue 37, items 1 and 2: run_recipe's input schema lists each recipe's declared
/// arguments; arguments by name are checked as the command line's are, before anything runs;
/// the site's recipes run, the user's only under `mcp --user-recipes`.
#[test]
fn mcp_run_recipe_takes_declared_arguments_and_the_users_recipes_only_when_allowed() {
    let sim = Sim::new("2x8G");
    let keep = sim.hold(&["--gpu", "0", "--mib", "100"])[0];
    let held = sim.hold(&["--gpu", "1", "--mib", "100"])[0];
    let hello = |from: &str| {
        format!(
            "// site-hello: greets\n// arg who: string!  who\n\nprint(`hello ${{ARG.who}} from the {from}`);\n"
        )
    };
    crate::recipes::write_recipe(&sim.site_recipes(), "site-hello", &hello("site"));
    crate::recipes::write_recipe(&sim.user_recipes(), "site-hello", &hello("user"));
    crate::recipes::write_recipe(
        &sim.user_recipes(),
        "mine",
        "// mine: the user's own\nprint(\"mine ran\");\n",
    );
    python_client(
        &sim,
        "recipe_args",
        &["--sim", "2x8G", "mcp", "--allow", "recipes,clean"],
        json!({ "held": held, "keep": keep }),
    );
    assert!(alive(keep));
}

/// `--allow recipes` alone let the model run any command (patch-and-rerun's `command`) and
/// stop holders (clean-node), while `run` and `clean` were refused on the same server. A
/// recipe's header declares what it needs; the server refuses one that needs what it does
/// not allow, and the gpuloop that runs a recipe stops it at the first call beyond its
/// declaration. The `recipes` tool lists a refused recipe (a link) without reading it.
#[test]
fn mcp_allow_recipes_alone_runs_no_command_and_stops_nothing() {
    let sim = Sim::new("2x8G");
    let holder = sim.hold(&["--gpu", "0", "--mib", "100"])[0];
    let marker = sim.path().join("ran");
    let touch = format!("run([\"touch\", {:?}]);\n", marker.display().to_string());
    let site = sim.site_recipes();
    crate::recipes::write_recipe(
        &site,
        "undeclared",
        &format!("// undeclared: runs a command, declaring nothing\n\n{touch}"),
    );
    crate::recipes::write_recipe(
        &site,
        "quiet-killer",
        "// quiet-killer: says it only reads\n// needs: none\n\nkill(holders(0), #{ grace: 0 });\n",
    );
    crate::recipes::write_recipe(
        &site,
        "liar",
        &format!("// liar: says it stops holders\n// needs: clean\n\n{touch}"),
    );
    // A site recipe that is a link to a file only root may read: listed as refused, unread.
    let secret = sim.path().join("secret");
    std::fs::write(&secret, "// peek: SECRET-FIRST-LINE\nSECRET-BODY\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&secret, site.join("peek.rhai")).unwrap();
    python_client(
        &sim,
        "recipe_needs",
        &["--sim", "2x8G", "mcp", "--allow", "recipes"],
        json!({ "holder": holder, "marker": marker }),
    );
    assert!(
        alive(holder),
        "a recipe stopped the holder without --allow clean"
    );
}

#[test]
#[ignore = "needs node and the MCP Inspector, which bash .ci/run installs (and runs it, --include-ignored)"]
fn mcp_inspector_cli_lists_tools_and_calls_gpus() {
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "node is not installed: bash .ci/run installs it and the MCP Inspector"
    );
    let cli = root().join("target/mcp-inspector/node_modules/.bin/mcp-inspector");
    assert!(
        cli.exists(),
        "node is here but the MCP Inspector is not: run .ci/run (npm install --prefix target/mcp-inspector @modelcontextprotocol/inspector)"
    );
    let sim = Sim::new("2x8G");
    sim.hold(&["--gpu", "1", "--mib", "2048"]);
    let inspect = |method: &[&str]| -> Value {
        let mut c = assert_cmd::Command::new(&cli);
        c.arg("--cli");
        for (k, v) in server_env(&sim) {
            c.arg("-e")
                .arg(format!("{k}={}", v.as_str().unwrap_or_default()));
        }
        let out = c
            .arg(bin())
            .args(["--sim", "2x8G", "mcp", "--method"])
            .args(method)
            .timeout(Duration::from_secs(120))
            .output()
            .expect("run the MCP Inspector");
        assert!(
            out.status.success(),
            "inspector {method:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("inspector prints JSON")
    };
    let tools = inspect(&["tools/list"]);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"gpus") && names.contains(&"clean"),
        "{names:?}"
    );
    let r = inspect(&["tools/call", "--tool-name", "gpus"]);
    assert_eq!(
        r["structuredContent"]["gpus"][1]["mem_used_mib"], 2048,
        "{r}"
    );
    assert_eq!(
        r["content"][0]["text"],
        "2 GPUs (Simulated GPU 8GB): memory used on GPU 1 2048/8192 MiB"
    );
}

/// A client's first two lines: initialize, then initialized.
const HELLO: [&str; 2] = [
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
];

/// `gpuloop mcp` fed these lines on stdin until it ends, and every line it wrote, parsed.
fn raw_session(sim: &Sim, lines: &[&str]) -> (std::process::Output, Vec<Value>) {
    let out = sim
        .cmd()
        .arg("mcp")
        .write_stdin(lines.join("\n") + "\n")
        .timeout(Duration::from_secs(60))
        .output()
        .expect("run gpuloop mcp");
    let replies = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line the server writes is JSON"))
        .collect();
    (out, replies)
}

/// A line that is not JSON gets no reply: rmcp's stdio transport drops it on purpose (see
/// RELIABILITY.md), so the server must go on serving the lines after it. Well-formed JSON
/// that is no JSON-RPC message is answered "Invalid request" with no id, and a `tools/call`
/// whose params are malformed stays a protocol error (not a tool result): invalid params.
#[test]
fn mcp_a_line_that_is_not_json_is_dropped_and_the_server_goes_on() {
    let sim = Sim::new("1x8G");
    let lines = [
        HELLO[0],
        HELLO[1],
        "this is not json",
        r#"{"jsonrpc":"2.0","id":2,"#,
        r#"{"hello":"world"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"gpus","arguments":"x"}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"gpus","name":"kill"}}"#,
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"gpus","arguments":[1]}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"gpus"}}"#,
    ];
    let (out, replies) = raw_session(&sim, &lines);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut ids: Vec<String> = replies.iter().map(|r| r["id"].to_string()).collect();
    ids.sort();
    assert_eq!(ids, ["1", "3", "4", "5", "6", "7", "null"], "{replies:?}");
    let to = |id: Value| replies.iter().find(|r| r["id"] == id).expect("a reply");
    assert_eq!(to(Value::Null)["error"]["code"], -32600, "{replies:?}");
    // Issue 33, item 9: malformed tools/call params were -32601 "tools/call" (method not
    // found); JSON-RPC says -32602, invalid params, and the message says what is wrong.
    for (id, why) in [
        (3, "arguments must be an object, not a string"),
        (5, "the key \"name\" twice"),
        (6, "arguments must be an object, not an array"),
    ] {
        let e = &to(json!(id))["error"];
        assert_eq!(e["code"], -32602, "{id}: {replies:?}");
        assert!(e["message"].as_str().unwrap().contains(why), "{id}: {e}");
    }
    assert_eq!(to(json!(4))["result"], json!({}), "{replies:?}");
    assert!(to(json!(7))["result"]["content"].is_array(), "{replies:?}");
}

fn docs_mcp() -> String {
    std::fs::read_to_string(root().join("docs/mcp.md")).expect("docs/mcp.md")
}

/// The fenced block of `lang` that follows `after` in docs/mcp.md.
fn docs_block(after: &str, lang: &str) -> String {
    let docs = docs_mcp();
    let from = docs
        .find(after)
        .unwrap_or_else(|| panic!("docs/mcp.md lacks {after:?}"));
    let open = format!("```{lang}\n");
    let start = docs[from..].find(&open).expect("a fenced block") + from + open.len();
    let len = docs[start..].find("```").expect("the block's end");
    docs[start..start + len].to_string()
}

/// Splits at `sep` outside parentheses, brackets and braces.
fn split_top(s: &str, sep: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if depth == 0 && rest.starts_with(sep) {
            out.push(std::mem::take(&mut cur));
            rest = &rest[sep.len()..];
            continue;
        }
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        cur.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.push(cur);
    out
}

/// Issue 38, item 7: docs/mcp.md named the tools but not their arguments. Its table gives
/// each tool's arguments, exactly the properties of the tool's input schema, and says a tool
/// is allowed "always" exactly when the server declares it read-only.
#[test]
fn mcp_docs_give_every_tool_with_exactly_its_arguments() {
    let sim = Sim::new("1x8G");
    let list = [
        HELLO[0],
        HELLO[1],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ];
    let (_, replies) = raw_session(&sim, &list);
    let list = replies
        .into_iter()
        .find(|r| r["id"] == 2)
        .expect("a tools/list reply");
    let docs = docs_mcp();
    let tools = list["result"]["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 9, "{list}");
    for t in tools {
        let name = t["name"].as_str().unwrap();
        let row = docs
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("docs/mcp.md has no row for {name}"));
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
        assert_eq!(cells.len(), 3, "{row}");
        let read_only = t["annotations"]["readOnlyHint"] == true;
        assert_eq!(cells[1].trim() == "always", read_only, "{name}: {row}");
        let mut documented: Vec<String> = Vec::new();
        if cells[2].trim() != "none" {
            for item in split_top(cells[2].trim(), "; ") {
                for piece in split_top(&item, ", ") {
                    let arg = piece
                        .strip_prefix('`')
                        .and_then(|p| p.split_once('`'))
                        .map(|(a, _)| a.to_string())
                        .unwrap_or_else(|| panic!("{name}: {piece:?} does not name an argument"));
                    documented.push(arg);
                }
            }
        }
        documented.sort();
        let mut schema: Vec<String> = t["inputSchema"]["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        schema.sort();
        assert_eq!(documented, schema, "docs/mcp.md's row for {name}");
        for required in t["inputSchema"]["required"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let r = required.as_str().unwrap();
            assert!(
                row.contains(&format!("`{r}` (*required*")),
                "{name}: {r} is required: {row}"
            );
        }
    }
}

/// Issue 38, item 7: the plain Python SDK example of docs/mcp.md, run as written against
/// `gpuloop --sim 2x80G mcp`, prints what the docs say it prints.
#[test]
fn mcp_the_python_example_in_the_docs_runs_and_prints_what_they_show() {
    let sim = Sim::new("2x80G");
    let holder = sim.hold(&["--gpu", "0", "--mib", "1000"])[0];
    let script = sim.path().join("gpuloop_client.py");
    std::fs::write(&script, docs_block("From your own Python code", "python")).unwrap();
    let mut c = assert_cmd::Command::new(python());
    c.arg(&script)
        .arg(bin())
        .args(["--sim", "2x80G", "mcp"])
        .timeout(Duration::from_secs(120));
    for (k, v) in sim.std_cmd().get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = c.output().expect("run the docs' example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = docs_block("With a holder on GPU 0 of the simulator it prints", "text")
        .replace("4242", &holder.to_string());
    assert_eq!(stdout, shown);
    assert!(alive(holder));
}
