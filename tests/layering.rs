//! The rooms' import rules (docs/ARCHITECTURE.md): a lower room never reaches into a room
//! above it, and only the script rooms know Rhai. Read from the sources, so a new `use` that
//! breaks a rule fails here.

use std::path::{Path, PathBuf};

/// (room, the rooms it must never import).
const RULES: &[(&str, &[&str])] = &[
    // Process facts know no hosts, no verdicts, no scripts.
    (
        "process",
        &[
            "hosts", "inspect", "machine", "slurm", "script", "cli", "mcp",
        ],
    ),
    // The join of the driver and the scan: one machine's facts, whoever asks.
    (
        "inspect",
        &["hosts", "machine", "slurm", "script", "cli", "mcp"],
    ),
    // A backend knows no signals and no hosts.
    (
        "gpu",
        &[
            "process", "inspect", "hosts", "machine", "script", "cli", "mcp",
        ],
    ),
    // The host set and its wire carry calls; they do not make them.
    (
        "hosts",
        &["machine", "agent", "slurm", "script", "cli", "mcp", "repl"],
    ),
    // The journal records what the rooms above it do; it asks none of them.
    (
        "journal",
        &[
            "gpu", "inspect", "hosts", "machine", "runner", "agent", "slurm", "script", "cli",
            "mcp", "repl", "render",
        ],
    ),
    // An operation is the same whoever asks: no front end inside it.
    (
        "machine",
        &["agent", "script", "cli", "mcp", "repl", "render"],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The rooms of this crate a source names, `crate::room::…` or `crate::{room, …}`, comments
/// left out.
fn rooms_named(source: &str) -> Vec<String> {
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rooms = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // A group: its top-level names, each up to `::`, `,`, whitespace or `}`.
            let mut depth = 0;
            let mut name = String::new();
            let mut first = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !name.is_empty() {
                            rooms.push(std::mem::take(&mut name));
                        }
                        first = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 && first {
                    if c.is_alphanumeric() || c == '_' {
                        name.push(c);
                    } else if !name.is_empty() {
                        rooms.push(std::mem::take(&mut name));
                        first = false;
                    }
                }
            }
            if !name.is_empty() {
                rooms.push(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            rooms.push(name);
        }
    }
    rooms
}

#[test]
fn lower_rooms_never_import_the_rooms_above_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (room, never) in RULES {
        let mut files = Vec::new();
        rust_files(&src.join(room), &mut files);
        assert!(!files.is_empty(), "no sources under src/{room}");
        for file in files {
            let source = std::fs::read_to_string(&file).expect("read source");
            for named in rooms_named(&source) {
                if never.contains(&named.as_str()) {
                    broken.push(format!("{} uses crate::{named}", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The rooms that hold script values; everything else takes and returns plain Rust types.
const RHAI_ROOMS: &[&str] = &["script", "repl"];

/// Whether a source names the `rhai` crate (`rhai::…`, `use rhai;`), comments left out.
fn uses_rhai(source: &str) -> bool {
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .any(|l| {
            l.match_indices("rhai").any(|(at, _)| {
                let before = l[..at].chars().next_back();
                let after = &l[at + "rhai".len()..];
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                    && (after.starts_with("::") || after.starts_with(';'))
            })
        })
}

#[test]
fn rhai_stays_in_the_script_rooms() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("render.rs")),
        "src/render.rs is not where this test looks"
    );
    let broken: Vec<String> = files
        .iter()
        .filter(|f| {
            let room = f.strip_prefix(&src).ok().and_then(|r| r.iter().next());
            !room.is_some_and(|r| RHAI_ROOMS.iter().any(|ok| r == *ok))
        })
        .filter(|f| uses_rhai(&std::fs::read_to_string(f).expect("read source")))
        .map(|f| format!("{} uses rhai", f.display()))
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_rhai_reader_sees_uses_and_not_words() {
    assert!(uses_rhai("use rhai::{Array, Dynamic};"));
    assert!(uses_rhai("let v: rhai::Dynamic = x;"));
    assert!(uses_rhai("use rhai;"));
    assert!(!uses_rhai("// rhai::Dynamic in a comment"));
    assert!(!uses_rhai("let p = \"a .rhai script\";"));
    assert!(!uses_rhai("use crate::script::rhai_walk::x;"));
}

#[test]
fn the_import_reader_sees_paths_and_groups() {
    let source = "use crate::gpu::Gpu;\n// crate::hosts in a comment\nuse crate::{\n    journal,\n    process::{self, kill},\n};\nlet h = crate::hosts::local();";
    assert_eq!(rooms_named(source), ["gpu", "journal", "process", "hosts"]);
}
