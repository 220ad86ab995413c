//! The generated reference (`gpuloop doc`, `--definitions`) and shell completions.

use crate::support::Sim;
use gpuloop::script::doc;
use gpuloop::script::engine::{build_engine, EngineOpts};
use gpuloop::session::{BackendChoice, Session};
use std::sync::Arc;

fn engine() -> rhai::Engine {
    let session = Session::new(
        BackendChoice::Auto,
        gpuloop::config::UserConfig::default(),
        0,
    );
    build_engine(Arc::new(session), &EngineOpts::default())
}

/// Signatures of the functions whose doc comment is empty.
fn undocumented(fns: &[doc::FnMeta]) -> Vec<String> {
    fns.iter()
        .filter(|f| f.doc().is_empty())
        .map(|f| f.signature())
        .collect()
}

#[test]
fn every_registered_function_has_a_doc_comment() {
    let e = engine();
    let fns = doc::functions(&e);
    assert!(
        fns.iter().any(|f| f.name == "holders"),
        "the metadata lists gpuloop's functions"
    );
    let undocumented = undocumented(&fns);
    assert!(
        undocumented.is_empty(),
        "functions without a doc comment: {undocumented:?}"
    );
}

#[test]
fn every_stdlib_function_has_a_doc_comment() {
    let e = engine();
    let modules = doc::stdlib_functions(&e);
    assert!(!modules.is_empty());
    for (module, header, fns) in modules {
        assert!(
            !header.is_empty(),
            "stdlib module {module} has no //! header"
        );
        let undocumented = undocumented(&fns);
        assert!(
            undocumented.is_empty(),
            "stdlib functions without a doc comment: {undocumented:?}"
        );
    }
}

#[test]
fn doc_prints_the_reference() {
    let sim = Sim::new("2x8G");
    let out = sim.run(&["doc"]).ok();
    // Lineage and attribution fields of holder maps (issues 14 and 15) are described.
    for field in [
        "ppid_comm",
        "reparented",
        "launcher",
        "service",
        "job",
        "container",
        "cgroup",
        "#{job: 812}",
        "\"service\"",
    ] {
        assert!(out.stdout.contains(field), "doc lacks {field}");
    }
    insta::assert_snapshot!(out.stdout);
}

#[test]
fn doc_definitions_writes_rhai_definition_files() {
    let sim = Sim::new("2x8G");
    let dir = sim.path().join("defs");
    sim.run(&["doc", "--definitions", dir.to_str().expect("utf-8 path")])
        .ok();
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).expect("definitions dir") {
        let path = entry.expect("entry").path();
        assert!(
            path.to_string_lossy().ends_with(".d.rhai"),
            "{}",
            path.display()
        );
        text.push_str(&std::fs::read_to_string(&path).expect("read"));
    }
    for name in [
        "fn gpu(",
        "fn holders(",
        "fn kill(",
        "fn wait_clean(",
        "fn diagnose(",
        // The stdlib modules as imported under their names, and the scripts' scope.
        "module cleanup;",
        "fn ensure_clean(sel: ?, opts: ?) -> ?;",
        "module report;",
        "const ARGS: array;",
    ] {
        assert!(
            text.contains(name),
            "{name} missing from the definitions:\n{text}"
        );
    }
    assert!(dir.join("cleanup.d.rhai").exists());
    // Closures are not part of any module's API.
    assert!(!text.contains("anon$"), "{text}");
}

#[test]
fn doc_shows_no_internal_names() {
    let sim = Sim::new("1x8G");
    let out = sim.run(&["doc"]).ok().stdout;
    let internal: Vec<&str> = out.lines().filter(|l| l.contains('$')).collect();
    assert!(internal.is_empty(), "{internal:?}");
    assert!(out.contains("## job.pid\n\n`job.pid -> i64`"), "{out}");
}

#[test]
fn completions_name_every_subcommand() {
    let sim = Sim::new("2x8G");
    let cmd = <gpuloop::cli::args::Args as clap::CommandFactory>::command();
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect();
    assert!(subcommands.iter().any(|s| s == "repl"));
    for shell in ["bash", "zsh", "fish"] {
        let out = sim.run(&["completions", shell]).ok();
        assert!(!out.stdout.trim().is_empty(), "{shell}: empty script");
        for sub in &subcommands {
            assert!(
                out.stdout.contains(sub.as_str()),
                "{shell} completions do not name {sub}"
            );
        }
    }
}

#[test]
fn the_doc_and_the_readme_name_every_verdict() {
    let sim = Sim::new("1x8G");
    let doc = sim.run(&["doc"]).ok().stdout;
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for v in gpuloop::inspect::diagnose::VERDICTS {
        assert!(doc.contains(&format!("\"{v}\"")), "gpuloop doc lacks {v}");
        assert!(
            readme.contains(&format!("| `{v}` |")),
            "README's verdict table lacks {v}"
        );
    }
}

/// docs/reference.md is what `gpuloop doc` prints: the committed reference never drifts from
/// the functions the binary registers (regenerate it with `cargo run -- doc > docs/reference.md`).
#[test]
fn docs_reference_md_is_what_gpuloop_doc_prints() {
    let sim = Sim::new("2x8G");
    let out = sim.run(&["doc"]).ok().stdout;
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference.md"))
            .expect("docs/reference.md");
    assert!(
        committed == out,
        "docs/reference.md differs from `gpuloop doc`: run `cargo run -- doc > docs/reference.md`"
    );
}

/// A new user's report: `gpuloop man` pointed to gpuloop-run(1) … gpuloop-clean(1), but those
/// pages were never generated and no subcommand's options were in any page.
#[test]
fn man_dir_writes_a_page_for_every_subcommand_with_its_options() {
    let sim = Sim::new("1x8G");
    let dir = sim.path().join("man1");
    sim.run(&["man", "--dir", dir.to_str().expect("utf-8 path")])
        .ok();
    fn pages(cmd: &clap::Command, prefix: &str, out: &mut Vec<(String, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let name = format!("{prefix}-{}", sub.get_name());
            out.push((name.clone(), sub.clone()));
            pages(sub, &name, out);
        }
    }
    let cmd = <gpuloop::cli::args::Args as clap::CommandFactory>::command();
    let mut want = Vec::new();
    pages(&cmd, "gpuloop", &mut want);
    assert!(want.iter().any(|(n, _)| n == "gpuloop-sim-hold"));
    assert!(dir.join("gpuloop.1").exists());
    for (name, sub) in want {
        let page = std::fs::read_to_string(dir.join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("no page {name}.1: {e}"));
        assert!(page.contains(".SH OPTIONS"), "{name}.1 lists no options");
        for a in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = a.get_long() {
                // roff escapes the dashes: \-\-timeout.
                assert!(
                    page.contains(&format!("\\-\\-{}", long.replace('-', "\\-"))),
                    "{name}.1 lacks --{long}"
                );
            }
        }
    }
}

/// The `sh` blocks of README.md and docs/*.md: the lines that run gpuloop, without their
/// comments, as words (single quotes only group words there).
fn documented_commands() -> Vec<(String, Vec<String>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let mut in_sh = false;
        for line in text.lines() {
            if line.starts_with("```") {
                in_sh = line == "```sh";
                continue;
            }
            let cmd = line.split(" # ").next().unwrap_or_default().trim();
            if !in_sh || !cmd.starts_with("gpuloop ") {
                continue;
            }
            let mut words = Vec::new();
            for (i, part) in cmd.split('\'').enumerate() {
                if i % 2 == 1 {
                    words.push(part.to_string());
                } else {
                    words.extend(part.split_whitespace().map(str::to_string));
                }
            }
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            out.push((format!("{name}: {cmd}"), words));
        }
    }
    out
}

/// Every gpuloop command the README and the docs show is one gpuloop takes: the flags exist,
/// and take the values written.
#[test]
fn every_gpuloop_command_in_the_readme_and_docs_parses() {
    let commands = documented_commands();
    assert!(commands.len() > 30, "{commands:?}");
    for (where_, words) in commands {
        if let Err(e) = gpuloop::cli::args::command().try_get_matches_from(&words) {
            panic!("{where_}:\n{e}");
        }
    }
}

/// A new user follows README.md: its five commands on the simulator run as it says (the
/// `export` is the harness's own simulator), and end with GPU 2 clean.
#[test]
fn the_readmes_five_simulator_commands_run_as_it_says() {
    let sim = Sim::new("8x80G");
    let readme: Vec<_> = documented_commands()
        .into_iter()
        .filter(|(w, _)| w.starts_with("README.md"))
        .collect();
    let start = readme
        .iter()
        .position(|(_, words)| words.get(1).is_some_and(|w| w == "sim"))
        .expect("the simulator block");
    let five = &readme[start..start + 5];
    for (where_, words) in five {
        let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
        let out = sim.run(&args);
        let want = if args[0] == "diagnose" { 1 } else { 0 };
        assert_eq!(out.code, want, "{where_}\n{}{}", out.stdout, out.stderr);
        if args[0] == "holders" {
            assert!(out.stdout.contains("(reparented)"), "{}", out.stdout);
            // The child keeps its dead creator's memory, which the driver counts against the
            // dead pid: the table says so, as the README's comment does (issue 38).
            assert!(out.stdout.contains(" 70000 (inherited) "), "{}", out.stdout);
        }
        if args[0] == "diagnose" {
            assert!(out.stdout.contains("inherited"), "{}", out.stdout);
        }
    }
    assert_eq!(sim.used_mib(2), 0);
    // `sim hold` ran through the command line: its processes are ended by pid here.
    sim.run(&["sim", "stop"]).ok();
}

/// `man --dir` created each page with `File::create`: a FIFO planted at a page's name hung it
/// for ever, a link made it write the page wherever the link pointed. Pages are written as
/// every file gpuloop writes is: anything but a regular file is refused, never opened.
#[test]
fn man_dir_never_waits_on_a_fifo_nor_writes_through_a_planted_link() {
    let sim = Sim::new("1x8G");
    let dir = sim.path().join("man1");
    std::fs::create_dir(&dir).unwrap();
    let fifo = std::ffi::CString::new(dir.join("gpuloop-clean.1").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let out = sim
        .run(&["man", "--dir", dir.to_str().expect("utf-8 path")])
        .code(1);
    assert!(
        out.stderr
            .contains("gpuloop-clean.1: a FIFO, not a regular file; refused"),
        "{}",
        out.stderr
    );
    if unsafe { libc::geteuid() } == 0 {
        std::fs::remove_file(dir.join("gpuloop-clean.1")).unwrap();
        let victim = sim.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        // Written by the first run, which wrote the pages before the FIFO's.
        let page = dir.join("gpuloop-kill.1");
        std::fs::remove_file(&page).unwrap();
        std::os::unix::fs::symlink(&victim, &page).unwrap();
        std::os::unix::fs::lchown(&page, Some(65534), None).unwrap();
        let out = sim
            .run(&["man", "--dir", dir.to_str().expect("utf-8 path")])
            .code(1);
        assert!(
            out.stderr
                .contains("owned by uid 65534 (another account's)"),
            "{}",
            out.stderr
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    }
}

/// docs/security.md proves each threat by naming a test: every `module::name` it quotes is a
/// function in the sources, so a renamed or deleted test leaves no row pointing at nothing.
#[test]
fn the_threat_model_names_only_functions_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = std::fs::read_to_string(root.join("docs/security.md")).unwrap();
    let mut sources = String::new();
    for dir in ["src", "tests"] {
        let mut todo = vec![root.join(dir)];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    todo.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    sources.push_str(&std::fs::read_to_string(&p).unwrap());
                }
            }
        }
    }
    let quoted: Vec<&str> = model
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|q| {
            q.contains("::")
                && q.split("::").all(|s| {
                    !s.is_empty()
                        && s.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
        })
        .collect();
    assert!(quoted.len() > 40, "{quoted:?}");
    let missing: Vec<&&str> = quoted
        .iter()
        .filter(|q| {
            let name = q.rsplit("::").next().unwrap_or_default();
            !sources.contains(&format!("fn {name}(")) && !sources.contains(&format!("fn {name}<"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/security.md names functions that do not exist: {missing:?}"
    );
}
