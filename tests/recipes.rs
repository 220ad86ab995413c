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

/// Writes `src` as recipe `name` in `dir` (made if missing): the directory 0755, the file 0644,
/// as the trust checks want them.
pub fn write_recipe(dir: &Path, name: &str, src: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = dir.join(format!("{name}.rhai"));
    std::fs::write(&p, src).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
}

/// A recipe that writes `marker` when it runs, so a refused one is seen not to have run.
fn marking(name: &str, marker: &Path) -> String {
    format!(
        "// {name}: writes a marker\nwrite_file({:?}, \"ran\");\nprint(\"{name} ran\");\n",
        marker.display().to_string()
    )
}

/// Issue 37, item 1: recipes by name from the user's and the site's directories, searched
/// user > site > built-in; `gpuloop recipes` lists every one with its origin, and which runs.
#[test]
fn recipe_dirs_are_searched_user_then_site_then_built_in() {
    let sim = Sim::new("1x8G");
    let (user, site) = (sim.user_recipes(), sim.site_recipes());
    write_recipe(
        &site,
        "shared",
        "// shared: the site's\nprint(\"site shared\");\n",
    );
    write_recipe(
        &user,
        "shared",
        "// shared: mine\nprint(\"user shared\");\n",
    );
    write_recipe(
        &site,
        "clean-node",
        "// clean-node: the site's own\nprint(\"site clean-node\");\n",
    );
    let run = |name: &str| sim.run(&["run", name]).ok().stdout.trim().to_string();
    assert_eq!(run("shared"), "user shared");
    assert_eq!(run("clean-node"), "site clean-node");
    // What MCP's run_recipe sets without --user-recipes: the user's are passed over.
    let out = sim.run_with(&["run", "shared"], |c| {
        c.env("GPULOOP_NO_USER_RECIPES", "1");
    });
    assert_eq!(out.stdout.trim(), "site shared");

    let list = sim.run(&["--json", "recipes"]).ok().json();
    let rows: Vec<(String, String, Option<String>)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["origin"].as_str().unwrap().to_string(),
                r["shadowed_by"].as_str().map(String::from),
            )
        })
        .collect();
    let row = |n: &str, o: &str| {
        rows.iter()
            .find(|r| r.0 == n && r.1 == o)
            .unwrap_or_else(|| panic!("no {o} {n}: {rows:?}"))
            .2
            .clone()
    };
    assert_eq!(row("shared", "user"), None);
    assert_eq!(row("shared", "site"), Some("user".into()));
    assert_eq!(row("clean-node", "site"), None);
    assert_eq!(row("clean-node", "built-in"), Some("site".into()));
    assert_eq!(row("slurm-site-policy", "built-in"), None);
    let table = sim.run(&["recipes"]).ok().stdout;
    assert!(
        table.contains("(the user recipe of this name runs instead)"),
        "{table}"
    );

    let shown = sim.run(&["recipes", "show", "shared"]).ok().stdout;
    assert!(
        shown.contains("print(\"user shared\");") && shown.contains("user recipe"),
        "{shown}"
    );
    let shown = sim.run(&["recipes", "show", "clean-node"]).ok().stdout;
    assert!(shown.contains("site clean-node"), "{shown}");
    let out = sim.run(&["recipes", "show", "nope"]).code(2);
    assert!(
        out.stderr.contains("no recipe named \"nope\""),
        "{}",
        out.stderr
    );

    std::fs::remove_file(user.join("shared.rhai")).unwrap();
    assert_eq!(run("shared"), "site shared");
}

/// Issue 37, item 1: the trust checks as sudo and ssh make them, as root: a recipe (or a
/// directory above it) owned by another user, or writable by others, never runs by name, and
/// a refused one does not fall through to another of the same name.
#[test]
#[ignore = "needs root: makes files of another user (nobody)"]
fn recipe_trust_as_root_refuses_another_users_and_open_directories() {
    require_root("to make files of another user");
    let sim = Sim::new("1x8G");
    let marker = sim.path().join("ran");
    let refused = |name: &str, says: &str| {
        let out = sim.run(&["run", name]).code(2);
        assert!(
            out.stderr
                .contains(&format!("recipe \"{name}\" is refused"))
                && out.stderr.contains(says)
                && out.stderr.contains("writable by no one else"),
            "{name}: {}",
            out.stderr
        );
        assert!(!marker.exists(), "{name} ran");
    };
    // The user's directory, made by another user (nobody) and writable by them alone.
    let user = sim.user_recipes();
    write_recipe(&user, "theirs", &marking("theirs", &marker));
    chown(&user, 65534);
    refused("theirs", "is owned by nobody");
    // A file of another user in a directory of root's.
    chown(&user, 0);
    chown(&user.join("theirs.rhai"), 65534);
    refused("theirs", "theirs.rhai is owned by nobody");
    // The site's directory open to all (as /tmp, without the sticky bit, or with it).
    let site = sim.site_recipes();
    write_recipe(&site, "open", &marking("open", &marker));
    for mode in [0o777, 0o1777, 0o775] {
        chmod(&site, mode);
        refused("open", "is writable by");
    }
    chmod(&site, 0o755);
    // A file others may write.
    chmod(&site.join("open.rhai"), 0o666);
    refused(
        "open",
        "open.rhai is writable by its group and others (mode 0666)",
    );
    // A link: whatever it points to, it is not judged as the recipe.
    chmod(&site.join("open.rhai"), 0o644);
    std::os::unix::fs::symlink(site.join("open.rhai"), site.join("linked.rhai")).unwrap();
    refused("linked", "is a symbolic link");
    // A refused recipe of the user's hides the built-in one of that name: no silent fall-back.
    write_recipe(&user, "clean-node", &marking("clean-node", &marker));
    chmod(&user.join("clean-node.rhai"), 0o646);
    refused("clean-node", "writable by others");
    // The listing says why each is refused; showing one runs nothing, and a refused one is
    // not read to be shown.
    let table = sim.run(&["recipes"]).ok().stdout;
    assert!(table.contains("REFUSED: "), "{table}");
    let out = sim.run(&["recipes", "show", "clean-node"]).code(2);
    assert!(
        !out.stdout.contains("write_file") && out.stderr.contains("writable by others"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(sim
        .run(&["recipes", "show", "open"])
        .ok()
        .stdout
        .contains("write_file"));
    assert!(!marker.exists());
    // Fixed as the message says, it runs.
    chmod(&user.join("clean-node.rhai"), 0o644);
    chown(&user.join("theirs.rhai"), 0);
    assert_eq!(sim.run(&["run", "theirs"]).ok().stdout.trim(), "theirs ran");
}

/// A recipe refused because it is a link was still read: `gpuloop recipes` (and MCP's
/// `recipes`) showed the first line of what it points to, and `recipes show` printed all of
/// it, a file only root may read. A refused file is never opened; the listing says it is
/// refused and why, and `recipes show` says why instead of a source.
#[test]
fn a_refused_recipe_is_never_read_and_listings_say_why() {
    let sim = Sim::new("1x8G");
    let site = sim.site_recipes();
    write_recipe(&site, "plain", "// plain: fine\nprint(1);\n");
    let secret = sim.path().join("secret");
    std::fs::write(&secret, "// peek: SECRET-FIRST-LINE\nSECRET-BODY\n").unwrap();
    chmod(&secret, 0o600);
    std::os::unix::fs::symlink(&secret, site.join("peek.rhai")).unwrap();
    let link = site.join("peek.rhai").display().to_string();
    let never_read = |out: &Out| {
        assert!(
            !out.stdout.contains("SECRET") && !out.stderr.contains("SECRET"),
            "{}{}",
            out.stdout,
            out.stderr
        );
    };
    let out = sim.run(&["recipes"]).ok();
    never_read(&out);
    assert!(
        out.stdout
            .contains(&format!("REFUSED: {link} is a symbolic link")),
        "{}",
        out.stdout
    );
    let out = sim.run(&["--json", "recipes"]).ok();
    never_read(&out);
    let list = out.json();
    let peek = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "peek")
        .unwrap_or_else(|| panic!("no peek: {list}"));
    assert_eq!(peek["purpose"], "", "{peek}");
    assert!(
        peek["refused"]
            .as_str()
            .is_some_and(|w| w.contains("is a symbolic link")),
        "{peek}"
    );
    for args in [
        &["recipes", "show", "peek"][..],
        &["--json", "recipes", "show", "peek"],
        &["run", "peek"],
        &["check", "peek"],
    ] {
        let out = sim.run(args).code(2);
        never_read(&out);
        assert!(
            out.stderr.contains("peek")
                && out.stderr.contains("is refused")
                && out.stderr.contains("is a symbolic link"),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert!(sim
        .run(&["recipes", "show", "plain"])
        .ok()
        .stdout
        .contains("print(1);"));
}

/// Issue 37, item 1: the same checks for a normal user (nobody): its own directory and root's
/// run; another user's, or one open to all, do not.
#[test]
#[ignore = "needs root: becomes another user (nobody) with setpriv"]
fn recipe_trust_as_a_normal_user_runs_its_own_and_roots_only() {
    require_root("to become another user (setpriv)");
    let sim = Sim::new("1x8G");
    // A tree nobody can reach: root's directories, 0755, down to nobody's home.
    let base = sim.path().join("as-nobody");
    std::fs::create_dir_all(&base).unwrap();
    chmod(sim.path(), 0o755);
    chmod(&base, 0o755);
    let home = base.join("home");
    std::fs::create_dir_all(home.join("config")).unwrap();
    let marker = home.join("ran");
    let mine = home.join("config/gpuloop/recipes");
    write_recipe(&mine, "mine", &marking("mine", &marker));
    for p in [
        home.clone(),
        home.join("config"),
        home.join("config/gpuloop"),
        mine.clone(),
        mine.join("mine.rhai"),
    ] {
        chown(&p, 65534);
    }
    let as_nobody = |site: &Path, name: &str| {
        let mut c = sim.wrapped(&[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
        c.args(["run", name])
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env("GPULOOP_SITE_RECIPES", site)
            .current_dir(&base);
        let o = c.output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let roots = base.join("site-root");
    write_recipe(
        &roots,
        "roots",
        "// roots: root's\nprint(\"root's ran\");\n",
    );
    assert_eq!(as_nobody(&roots, "mine").1.trim(), "mine ran");
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(as_nobody(&roots, "roots").1.trim(), "root's ran");
    // Another user's site directory (daemon's, uid 1), and one open to all.
    let theirs = base.join("site-daemon");
    write_recipe(&theirs, "theirs", &marking("theirs", &marker));
    chown(&theirs, 1);
    chown(&theirs.join("theirs.rhai"), 1);
    let (code, _, err) = as_nobody(&theirs, "theirs");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is owned by daemon, not by root or nobody"),
        "{err}"
    );
    let open = base.join("site-open");
    write_recipe(&open, "open", &marking("open", &marker));
    chmod(&open, 0o777);
    let (code, _, err) = as_nobody(&open, "open");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is writable by its group and others"), "{err}");
    // nobody's own directory, made writable by its group.
    chmod(&mine, 0o775);
    let (code, _, err) = as_nobody(&roots, "mine");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is writable by its group (mode 0775)"),
        "{err}"
    );
    assert!(!marker.exists(), "a refused recipe ran");
}

/// Issue 37, item 2: a recipe declares its arguments in its header; `run NAME --help` prints
/// them, and a bad one is a usage error (exit 2) before anything runs, for a recipe by name
/// and a script by path alike.
#[test]
fn declared_arguments_are_checked_before_the_recipe_runs() {
    let sim = Sim::new("1x8G");
    let src = "// greet: says hello\n\
               //\n\
               // arg name: string!    who to greet\n\
               // arg times: int = 1   how many times\n\
               // arg loud: flag       shout it\n\
               \n\
               print(\"started\");\n\
               let s = `hello ${ARG.name}`;\n\
               if ARG.loud { s.make_upper(); }\n\
               for i in 0..ARG.times { print(s); }\n";
    let path = write_recipe(&sim.user_recipes(), "greet", src);
    let path = path.to_str().unwrap();
    for script in ["greet", path] {
        let help = sim.run(&["run", script, "--help"]).ok().stdout;
        assert!(
            help.starts_with(&format!(
                "{script}: says hello\n\nusage: gpuloop run {script} --name TEXT [--times N] [--loud]"
            )),
            "{help}"
        );
        assert!(
            help.contains("  --name TEXT  who to greet (required)"),
            "{help}"
        );
        assert!(help.contains("(default: 1)"), "{help}");
        let out = sim
            .run(&["run", script, "--name", "ann", "--times=2", "--loud"])
            .ok();
        assert_eq!(out.stdout, "started\nHELLO ANN\nHELLO ANN\n");
        for (args, says) in [
            (
                &["--name", "a", "--times", "x"][..],
                "--times \"x\" is not a whole number",
            ),
            (&["--times", "2"], "--name is required: who to greet"),
            (
                &["--name", "a", "--lod"],
                "unknown argument --lod: did you mean --loud?",
            ),
            (
                &["--name", "a", "extra"],
                "unexpected argument \"extra\" (options start with --)",
            ),
        ] {
            let out = sim.run(&[&["run", script][..], args].concat()).code(2);
            assert_eq!(out.stdout, "", "{args:?}: it ran");
            assert!(
                out.stderr.starts_with(&format!(
                    "gpuloop: {script}: {says} (gpuloop run {script} --help lists its arguments)"
                )),
                "{args:?}: {}",
                out.stderr
            );
        }
    }
    // gpuloop check reads the header too: a declaration it cannot read, a use of an
    // argument the header does not declare.
    sim.run(&["check", "greet"]).ok();
    write_recipe(
        &sim.user_recipes(),
        "typo",
        "// typo: misspells its argument\n// arg timeout: secs = 3\n\nprint(\"started\");\nsleep(ARG.timout);\n",
    );
    for cmd in ["check", "run"] {
        let out = sim.run(&[cmd, "typo"]).code(2);
        assert!(!out.stdout.contains("started"), "{}", out.stdout);
        assert!(
            out.stderr.contains(
                "ARG.timout is not an argument this script declares: did you mean ARG.timeout?"
            ) && out.stderr.contains("--> typo:5:"),
            "{cmd}: {}",
            out.stderr
        );
    }
    write_recipe(
        &sim.user_recipes(),
        "badhead",
        "// badhead: a bad declaration\n//\n// arg timeout: seconds = 3   how long\nprint(\"started\");\n",
    );
    for cmd in ["check", "run"] {
        let out = sim.run(&[cmd, "badhead"]).code(2);
        assert!(
            out.stderr
                .contains("in the header: unknown type \"seconds\"")
                && out.stderr.contains("--> badhead:3:1"),
            "{cmd}: {}",
            out.stderr
        );
    }
    // A script that declares nothing still gets its words, untouched, in ARGS.
    let out = sim
        .script("plain.rhai", "print(ARGS);", &["--anything", "x"])
        .ok();
    assert_eq!(out.stdout.trim(), r#"["--anything", "x"]"#);
}

/// Issue 37, item 1: `gpuloop recipes new NAME` writes a commented skeleton (arguments, a dry
/// run, a report before and after) into the user's directory, and it runs as written.
#[test]
fn recipes_new_writes_a_skeleton_that_runs() {
    use std::os::unix::fs::PermissionsExt;
    let sim = Sim::new("2x8G");
    let out = sim.run(&["recipes", "new", "mine"]).ok();
    let path = sim.user_recipes().join("mine.rhai");
    assert!(
        out.stdout.contains(&path.display().to_string()),
        "{}",
        out.stdout
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&path), mode(&sim.user_recipes())), (0o644, 0o755));
    sim.run(&["check", "mine"]).ok();
    let help = sim.run(&["run", "mine", "--help"]).ok().stdout;
    assert!(
        help.contains("--dry-run") && help.contains("--gpu GPUS"),
        "{help}"
    );

    let holder = sim.hold(&["--gpu", "1", "--mib", "100"])[0];
    let out = sim.run(&["run", "mine", "--gpu", "1", "--dry-run"]).ok();
    assert!(
        out.stdout.contains("before:") && out.stdout.contains(&format!("would stop: [{holder}]")),
        "{}",
        out.stdout
    );
    assert!(alive(holder));
    let out = sim.run(&["run", "mine", "--gpu", "1", "--grace", "1"]).ok();
    assert!(
        out.stdout.contains("after:\n  GPU 1: 0 MiB [clean]"),
        "{}",
        out.stdout
    );
    assert!(gone_within(holder, 5));

    let out = sim.run(&["recipes", "new", "mine"]).code(2);
    assert!(out.stderr.contains("exists already"), "{}", out.stderr);
    let out = sim.run(&["recipes", "new", "../elsewhere"]).code(2);
    assert!(out.stderr.contains("is no recipe name"), "{}", out.stderr);
    let out = sim.run(&["recipes", "new", "clean-node"]).ok();
    assert!(
        out.stderr
            .contains("it runs instead of the built-in recipe clean-node"),
        "{}",
        out.stderr
    );
}

/// A recipe's `// needs:` line is all it may do: each function that signals, runs a command
/// or writes a file refuses in a recipe that did not declare it, from the command line as
/// over MCP (dry runs only read, and pass). Started as MCP's run_recipe starts it (with the
/// server's `--allow` list in GPULOOP_MCP_ALLOW), a recipe that needs what the server does not
/// allow is refused before it runs, and one that declares nothing may only read.
#[test]
fn a_recipe_does_no_more_than_its_needs_line_declares() {
    let sim = Sim::new("2x8G");
    let holder = sim.hold(&["--gpu", "0", "--mib", "100"])[0];
    let marker = sim.path().join("ran");
    let m = format!("{:?}", marker.display().to_string());
    let file = sim.path().join("f.txt");
    std::fs::write(&file, "a\n").unwrap();
    let f = format!("{:?}", file.display().to_string());
    let diff = "\"@@ -1 +1 @@\\n-a\\n+b\\n\"";
    let script = |needs: &str, body: &str| {
        let header = match needs {
            "" => String::new(),
            n => format!("// needs: {n}\n"),
        };
        sim.script("t.rhai", &format!("// t: a test\n{header}\n{body};\n"), &[])
    };
    for (needs, call, says) in [
        (
            "none",
            "kill(holders(0))".to_string(),
            "kill() signals processes",
        ),
        (
            "none",
            "kill(holders(0), #{grace: 0})".into(),
            "kill() signals processes",
        ),
        (
            "run",
            "reset_gpu(0)".into(),
            "reset_gpu() signals processes",
        ),
        (
            "clean",
            format!("run([\"touch\", {m}])"),
            "run() runs a command",
        ),
        (
            "clean",
            format!("spawn([\"touch\", {m}])"),
            "spawn() runs a command",
        ),
        (
            "kill",
            format!("write_file({m}, \"x\")"),
            "write_file() runs a command or writes a file",
        ),
        (
            "clean",
            format!("replace_in_file({f}, \"a\", \"b\")"),
            "replace_in_file()",
        ),
        (
            "clean",
            format!("apply_patch({f}, {diff})"),
            "apply_patch()",
        ),
        (
            "none",
            format!("revert_patch({f}, {diff})"),
            "revert_patch()",
        ),
    ] {
        let out = script(needs, &call).code(1);
        assert!(
            out.stderr.contains(says)
                && out.stderr.contains("which this recipe may not do")
                && out.stderr.contains(&format!("`// needs: {needs}`")),
            "{needs}: {call}: {}",
            out.stderr
        );
    }
    assert!(
        alive(holder),
        "a recipe that may not signal stopped the holder"
    );
    assert!(!marker.exists(), "a recipe that may not run ran a command");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a\n");
    // A dry run only reads.
    script(
        "none",
        "kill(holders(0), #{dry_run: true}); reset_gpu(0, #{dry_run: true})",
    )
    .ok();
    // What it declares, it does; a script that declares nothing, run by a person, does all.
    script("clean, run", &format!("write_file({m}, \"x\")")).ok();
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    script("", &format!("run([\"touch\", {m}])")).ok();
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();

    // As MCP's run_recipe starts it, with a server that allows only recipes.
    let served = |allow: &str, args: &[&str]| {
        sim.run_with(args, |c| {
            c.env("GPULOOP_MCP_ALLOW", allow);
        })
    };
    let rerun = [
        "run",
        "patch-and-rerun",
        "--gpu",
        "1",
        "--attempts",
        "1",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ];
    let out = served("", &rerun).code(2);
    assert!(
        out.stderr.contains("patch-and-rerun needs run")
            && out.stderr.contains("`gpuloop mcp --allow run`"),
        "{}",
        out.stderr
    );
    let out = served("", &["run", "clean-node", "--gpu", "0", "--grace", "0"]).code(2);
    assert!(
        out.stderr.contains("clean-node needs clean"),
        "{}",
        out.stderr
    );
    assert!(alive(holder) && !marker.exists());
    let undeclared = sim.path().join("t.rhai");
    std::fs::write(
        &undeclared,
        format!("// t: declares nothing\n\nrun([\"touch\", {m}]);\n"),
    )
    .unwrap();
    let out = served("clean,run", &["run", undeclared.to_str().unwrap()]).code(1);
    assert!(out.stderr.contains("`// needs: none`"), "{}", out.stderr);
    assert!(!marker.exists());
    served("clean,run", &rerun).ok();
    assert!(
        marker.exists(),
        "patch-and-rerun did not run its command where run is allowed"
    );
}
