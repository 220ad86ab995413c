//! Recipes run by name: a bare name is a built-in recipe, never a file of the current
//! directory, from the command line, a Slurm epilog's `exec gpuloop run NAME` and MCP.

use crate::support::*;
use std::path::{Path, PathBuf};

/// A directory planted with hostile scripts under the names of the recipes and of the module
/// clean-node imports; each writes `marker` when it runs. Returns (dir, marker).
pub fn hostile_dir(sim: &Sim) -> (PathBuf, PathBuf) {
    let dir = sim.path().join("hostile-cwd");
    std::fs::create_dir_all(&dir).unwrap();
    let marker = sim.path().join("pwned");
    let evil = format!(
        "write_file({:?}, \"pwned\");\n",
        marker.display().to_string()
    );
    for name in [
        "clean-node",
        "clean-node.rhai",
        "slurm-site-policy",
        "slurm-site-policy.rhai",
        "cleanup.rhai",
    ] {
        std::fs::write(dir.join(name), &evil).unwrap();
    }
    (dir, marker)
}

fn in_dir(dir: &Path) -> impl FnOnce(&mut assert_cmd::Command) + '_ {
    move |c| {
        c.current_dir(dir);
    }
}

/// `gpuloop run clean-node` ran `./clean-node` of the current directory before the built-in
/// recipe (and the recipe imported `./cleanup.rhai`); a path still runs the file.
#[test]
fn recipes_from_cwd_a_bare_name_never_runs_a_file_of_the_current_directory() {
    let sim = Sim::new("2x8G");
    let (dir, marker) = hostile_dir(&sim);
    let out = sim
        .run_with(
            &["run", "clean-node", "--gpus", "0", "--timeout", "1"],
            in_dir(&dir),
        )
        .ok();
    assert!(out.stdout.contains("clean in"), "{}", out.stdout);
    sim.run_with(&["check", "clean-node"], in_dir(&dir)).ok();
    assert!(!marker.exists(), "a file of the current directory ran");

    // Not a recipe: a usage error that says how to name a file.
    let out = sim.run_with(&["run", "nope"], in_dir(&dir)).code(2);
    assert!(
        out.stderr.contains("no recipe named \"nope\"") && out.stderr.contains("./nope"),
        "{}",
        out.stderr
    );
    assert!(!marker.exists());

    // A path (a slash, or .rhai) is a file.
    for path in ["./clean-node", "clean-node.rhai"] {
        sim.run_with(&["run", path], in_dir(&dir)).ok();
        assert!(marker.exists(), "{path} did not run the file");
        std::fs::remove_file(&marker).unwrap();
    }
}

/// A Slurm epilog runs `exec gpuloop run slurm-site-policy` as root, in whatever directory
/// slurmd gives it.
#[test]
fn recipes_from_cwd_an_epilogs_exec_gpuloop_run_runs_the_built_in_policy() {
    let sim = Sim::new("2x8G");
    let (dir, marker) = hostile_dir(&sim);
    let epilog = dir.join("60-site-policy");
    std::fs::write(
        &epilog,
        format!(
            "#!/bin/sh\nexec {} run slurm-site-policy -- --dry-run\n",
            bin().display()
        ),
    )
    .unwrap();
    let env = sim.std_cmd();
    let out = std::process::Command::new("sh")
        .arg(&epilog)
        .envs(env.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .envs([
            ("SLURM_JOB_ID", "812"),
            ("SLURM_JOB_GPUS", "0"),
            ("SLURMD_NODENAME", "gpu07"),
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("GPUs pass the site policy"), "{stderr}");
    assert!(!marker.exists(), "the epilog ran ./slurm-site-policy");
}
