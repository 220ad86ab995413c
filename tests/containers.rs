//! Containers and Kubernetes pods on a real runtime (issue 35): podman, with runc and the
//! cgroupfs manager, starts containers whose cgroup parents are shaped like the kubelet's,
//! with the CRI's annotations and the simulator's node files mounted in, so that a process in
//! a container holds a simulated GPU as a CUDA process in a pod holds a real one. The kubelet
//! is a directory of the test's (`[containers] kubelet` in config.toml): a pod it does not
//! list is a deleted pod. `.ci/run` installs podman, runc and busybox-static; where they are
//! missing these tests fail, saying so.

use crate::ssh::{within, Cluster};
use crate::support::*;
use serde_json::{json, Value};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

const NEED: &str =
    "the container tests need podman, runc and busybox-static, as root (.ci/run installs them)";

/// podman as it runs on such a machine as root: runc (crun refuses a hybrid cgroup layout),
/// the cgroupfs manager.
fn podman(args: &[&str]) -> std::process::Output {
    Command::new("podman")
        .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman: {e}: {NEED}"))
}

fn podman_ok(args: &[&str]) -> String {
    let o = podman(args);
    assert!(
        o.status.success(),
        "podman {args:?} failed ({NEED}): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The shared libraries a dynamically linked program loads, as `ldd` names them.
fn shared_libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// The image every container of a test run starts from, imported once (`podman import`: no
/// registry): busybox-static and the libraries gpuloop links; gpuloop itself is mounted in,
/// so a rebuild needs no new image. Its tag names its content, so a later run reuses it.
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let busybox = Path::new("/bin/busybox");
        assert!(busybox.exists(), "no /bin/busybox: {NEED}");
        let libs = shared_libraries(&bin());
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for f in std::iter::once(busybox).chain(libs.iter().map(PathBuf::as_path)) {
            f.hash(&mut h);
            std::fs::read(f).expect("read").hash(&mut h);
        }
        let tag = format!("localhost/gpuloop-test:{:016x}", h.finish());
        if podman(&["image", "exists", &tag]).status.success() {
            return tag;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        for d in ["bin", "proc", "sys", "dev", "tmp", "etc"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        std::fs::copy(busybox, root.join("bin/busybox")).expect("busybox");
        for tool in ["sh", "sleep", "cat"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).expect("link");
        }
        for lib in &libs {
            let to = root.join(lib.strip_prefix("/").expect("absolute"));
            std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
            std::fs::copy(lib, &to).expect("library");
        }
        let tar = dir.path().join("root.tar");
        let ok = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("tar");
        assert!(ok.success(), "tar of the image's root");
        podman_ok(&["import", tar.to_str().expect("path"), &tag]);
        tag
    })
}

/// A pod as the kubelet would start it: its namespace, name, uid and the container's name.
struct Pod {
    ns: &'static str,
    name: &'static str,
    uid: String,
    container: &'static str,
}

impl Pod {
    /// A pod with a uid of its own that starts with `prefix` (8 hex digits): two pods of one
    /// prefix share a uid prefix, as `--pod PREFIX` must then refuse.
    fn new(ns: &'static str, name: &'static str, container: &'static str, prefix: &str) -> Pod {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64;
        Pod {
            ns,
            name,
            container,
            uid: format!(
                "{prefix}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                std::process::id() & 0xffff,
                n & 0xfff,
                t & 0xfff,
                t & 0xffff_ffff_ffff
            ),
        }
    }

    /// The kubelet's cgroup for it, cgroupfs driver: `/kubepods/burstable/pod<uid>`.
    fn cgroup_parent(&self) -> String {
        format!("/kubepods/burstable/pod{}", self.uid)
    }
}

/// The node's kubelet and container runtimes as the simulator's config.toml names them: the
/// kubelet's directory (a pod is known while `pods/<uid>` is there) and its log directory
/// are the test's; the runtimes' state is podman's own, unless `storage` says otherwise.
struct Node {
    kubelet: PathBuf,
    container_logs: PathBuf,
}

impl Node {
    fn new(sim: &Sim, storage: Option<&Path>) -> Node {
        // The simulated driver is the host's: set up here, it reports pids in this PID
        // namespace (a container's holder would otherwise set it up in its own).
        sim.run(&["gpus"]).ok();
        let kubelet = sim.path().join("kubelet");
        std::fs::create_dir_all(kubelet.join("pods")).expect("kubelet");
        let logs = sim.path().join("pod-logs");
        std::fs::create_dir_all(&logs).expect("pod logs");
        let container_logs = sim.path().join("container-logs");
        std::fs::create_dir_all(&container_logs).expect("container logs");
        let mut cfg = format!(
            "[containers]\nkubelet = {:?}\npod_logs = {:?}\ncontainer_logs = {:?}\n",
            kubelet.display().to_string(),
            logs.display().to_string(),
            container_logs.display().to_string()
        );
        if let Some(s) = storage {
            cfg.push_str(&format!("storage = [{:?}]\n", s.display().to_string()));
        }
        let dir = sim.path().join("config/gpuloop");
        std::fs::create_dir_all(&dir).expect("config dir");
        std::fs::write(dir.join("config.toml"), cfg).expect("config.toml");
        Node {
            kubelet,
            container_logs,
        }
    }

    /// Links the log of `pod`'s container `ctr` as the kubelet does for a container it starts.
    fn links(&self, pod: &Pod, ctr: &Ctr) {
        let link = format!("{}_{}_{}-{}.log", pod.name, pod.ns, pod.container, ctr.id);
        let target = format!(
            "/var/log/pods/{}_{}_{}/{}/0.log",
            pod.ns, pod.name, pod.uid, pod.container
        );
        std::os::unix::fs::symlink(target, self.container_logs.join(link)).expect("log link");
    }

    /// The kubelet knows `pod` (it is not deleted).
    fn knows(&self, pod: &Pod) {
        std::fs::create_dir_all(self.kubelet.join("pods").join(&pod.uid)).expect("pod dir");
    }
}

/// A container the test started, removed (and its pod's cgroup with it) when dropped.
struct Ctr {
    name: String,
    id: String,
    /// The host pid of its first process.
    pid: i32,
    parent: Option<String>,
}

impl Ctr {
    /// Starts `cmd` in a container of `pod` (or of none) on `sim`'s GPUs, and waits until it
    /// has printed `lines` lines (a holder prints its pid once it holds).
    fn start(sim: &Sim, pod: Option<&Pod>, cmd: &[&str], lines: usize) -> Ctr {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "gpuloop-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        Ctr::start_named(sim, pod, &name, cmd, lines)
    }

    /// `start`, with the container's name given.
    fn start_named(sim: &Sim, pod: Option<&Pod>, name: &str, cmd: &[&str], lines: usize) -> Ctr {
        let name = name.to_string();
        let dir = sim.path().display().to_string();
        let mount_bin = format!("{}:/gpuloop:ro", bin().display());
        let mount_sim = format!("{dir}:{dir}");
        let sim_dir = format!("GPULOOP_SIM_DIR={dir}/state");
        let spec = format!("GPULOOP_SIM={}", sim.spec);
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &name,
            // podman's default file limit is above what such a machine allows.
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "-v",
            &mount_bin,
            "-v",
            &mount_sim,
            "-e",
            &sim_dir,
            "-e",
            &spec,
        ]
        .map(str::to_string)
        .to_vec();
        let parent = pod.map(Pod::cgroup_parent);
        if let (Some(p), Some(parent)) = (pod, &parent) {
            args.extend(["--cgroup-parent".to_string(), parent.clone()]);
            for (k, v) in [
                ("io.kubernetes.pod.name", p.name),
                ("io.kubernetes.pod.namespace", p.ns),
                ("io.kubernetes.pod.uid", p.uid.as_str()),
                ("io.kubernetes.container.name", p.container),
            ] {
                args.extend(["--annotation".to_string(), format!("{k}={v}")]);
            }
        }
        args.push(image().to_string());
        args.extend(cmd.iter().map(|s| s.to_string()));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = podman_ok(&argv);
        let mut ctr = Ctr {
            name,
            id,
            pid: 0,
            parent,
        };
        let printed = within(60, || {
            podman(&["logs", &ctr.name])
                .stdout
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .count()
                >= lines
        });
        assert!(
            printed,
            "container {} printed nothing: {}",
            ctr.name,
            String::from_utf8_lossy(&podman(&["logs", &ctr.name]).stderr)
        );
        ctr.pid = podman_ok(&["inspect", "-f", "{{.State.Pid}}", &ctr.name])
            .parse()
            .expect("a pid");
        ctr
    }

    /// A container whose process holds `mib` MiB of GPU 0.
    fn holding(sim: &Sim, pod: Option<&Pod>, mib: i64) -> Ctr {
        let mib = mib.to_string();
        Ctr::start(sim, pod, &Ctr::hold(&mib), 1)
    }

    /// The command of a container whose process holds `mib` MiB of GPU 0.
    fn hold(mib: &str) -> [&str; 8] {
        [
            "/gpuloop",
            "sim",
            "hold",
            "--gpu",
            "0",
            "--mib",
            mib,
            "--foreground",
        ]
    }
}

impl Drop for Ctr {
    fn drop(&mut self) {
        podman(&["rm", "-f", "-t", "0", &self.name]);
        // The pod's cgroup is left behind the container, with conmon's below it (podman's
        // cgroupfs manager puts conmon in `<parent>/conmon`); conmon may take a moment to go.
        if let Some(parent) = &self.parent {
            let dirs: Vec<PathBuf> = cgroup_mounts()
                .into_iter()
                .map(|m| m.0.join(parent.trim_start_matches('/')))
                .collect();
            within(10, || {
                dirs.iter().all(|d| {
                    for sub in ["conmon".to_string(), format!("libpod-{}", self.id)] {
                        let _ = std::fs::remove_dir(d.join(sub));
                    }
                    let _ = std::fs::remove_dir(d);
                    !d.exists()
                })
            });
        }
    }
}

/// The cgroup file systems mounted here: (mount point, file system type, super options).
fn cgroup_mounts() -> Vec<(PathBuf, String, String)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (before, after) = l.split_once(" - ")?;
            let point = before.split_whitespace().nth(4)?;
            let mut a = after.split_whitespace();
            let (fs, _, opts) = (a.next()?, a.next()?, a.next()?);
            fs.starts_with("cgroup")
                .then(|| (PathBuf::from(point), fs.to_string(), opts.to_string()))
        })
        .collect()
}

/// The `cgroup.procs` file of each cgroup `pid` is in: one per v1 hierarchy, or v2's one.
fn cgroup_procs(pid: i32) -> Vec<PathBuf> {
    let mounts = cgroup_mounts();
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .expect("cgroup")
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            let (point, _, _) = mounts.iter().find(|(_, fs, opts)| match ctrls {
                "" => fs == "cgroup2",
                _ => fs == "cgroup" && ctrls.split(',').all(|c| opts.split(',').any(|o| o == c)),
            })?;
            let procs = point
                .join(path.trim_start_matches('/'))
                .join("cgroup.procs");
            procs.exists().then_some(procs)
        })
        .collect()
}

/// Moves `pid` into the cgroups whose `cgroup.procs` files are `to`.
fn move_into(pid: i32, to: &[PathBuf]) {
    assert!(!to.is_empty(), "no cgroup to move {pid} into");
    for f in to {
        std::fs::write(f, pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", f.display()));
    }
}

/// The pids of a list of holder records, sorted.
fn pids_of(hs: &Value) -> Vec<i64> {
    let mut p: Vec<i64> = hs
        .as_array()
        .expect("an array")
        .iter()
        .map(|h| h["pid"].as_i64().expect("pid"))
        .collect();
    p.sort_unstable();
    p
}

fn by_pid(hs: &Value, pid: i32) -> Value {
    hs.as_array()
        .expect("an array")
        .iter()
        .find(|h| h["pid"] == pid)
        .unwrap_or_else(|| panic!("no holder {pid} in {hs}"))
        .clone()
}

/// The MCP server on this simulator, given `calls` (tool name, arguments) after the
/// handshake: each call's result, in order.
fn mcp(sim: &Sim, allow: &str, calls: &[(&str, Value)]) -> Vec<Value> {
    let mut lines = vec![
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ];
    for (i, (name, args)) in calls.iter().enumerate() {
        lines.push(
            json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
            "params": {"name": name, "arguments": args}}),
        );
    }
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let out = sim
        .cmd()
        .args(["mcp", "--allow", allow])
        .write_stdin(text)
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .expect("gpuloop mcp");
    let replies: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (1..=calls.len())
        .map(|id| {
            replies
                .iter()
                .find(|r| r["id"] == id)
                .unwrap_or_else(|| panic!("no reply {id}: {replies:?}"))["result"]
                .clone()
        })
        .collect()
}

/// Issue 35's scenario: two pods on one GPU, one of them deleted. The holder table names
/// both; the driver lists each container's process by its host pid; the deleted pod's
/// holder is an orphan named by its pod; the scopes pick each pod and container by name, uid
/// prefix and id prefix, from the command line, a script and MCP; `clean --pod` stops the
/// deleted pod alone, waits for its memory, and says the other pod still uses the GPU.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn two_pods_on_one_gpu_one_deleted_clean_stops_that_pod_alone() {
    let sim = Sim::new("1x8G");
    let node = Node::new(&sim, None);
    let a = Pod::new("ml", "trainer-0", "trainer", "aaaa1111");
    let b = Pod::new("default", "infer", "server", "aaaa2222");
    // The kubelet knows b; a was deleted, its process lives on.
    node.knows(&b);
    let ca = Ctr::holding(&sim, Some(&a), 1000);
    let cb = Ctr::holding(&sim, Some(&b), 500);
    assert_eq!(sim.used_mib(0), 1500);
    // The kubelet links the log of b's container (a's went with its pod): b is named by the
    // link, a by its bundle.
    node.links(&b, &cb);
    let v = sim.run(&["-v", "holders"]).ok().stderr;
    assert!(v.contains("(1 named by the kubelet's log links"), "{v}");

    let t = sim.run(&["holders"]).ok().stdout;
    assert!(
        t.contains("CONTAINER/POD")
            && t.contains("ml/trainer-0 (trainer, deleted)")
            && t.contains("default/infer (server)"),
        "{t}"
    );
    assert!(!t.contains(&a.uid), "{t}");
    let wide = sim.run(&["--wide", "holders"]).ok().stdout;
    assert!(
        wide.contains("POD UID") && wide.contains(&a.uid) && wide.contains(&ca.id),
        "{wide}"
    );

    let hs = sim.run(&["--json", "holders"]).ok().json();
    let ha = by_pid(&hs, ca.pid);
    // The simulated driver lists a container's process by its host pid, as a real one does:
    // the memory is its own.
    assert_eq!(ha["mem_mib"], 1000, "{ha}");
    assert!(ha["evidence"]
        .as_array()
        .unwrap()
        .contains(&json!("driver")));
    assert_eq!(
        (&ha["runtime"], &ha["container"], &ha["container_name"]),
        (&json!("podman"), &json!(ca.id), &json!(ca.name)),
        "{ha}"
    );
    assert_eq!(
        ha["pod"],
        json!({"namespace": "ml", "name": "trainer-0", "uid": a.uid,
               "container": "trainer", "deleted": true})
    );
    assert_eq!(by_pid(&hs, cb.pid)["pod"]["deleted"], false);
    crate::golden::golden("holder_in_a_deleted_pod", &ha);

    let d = sim.run(&["--json", "diagnose"]).code(1).json();
    assert_eq!(d[0]["verdict"], "orphaned", "{d}");
    let advice = d[0]["advice"].as_str().unwrap();
    assert!(
        advice.contains("pod ml/trainer-0 (deleted)")
            && advice.contains(&format!("gpuloop clean --gpu 0 --pod {}", a.uid)),
        "{advice}"
    );

    let picked = |args: &[&str]| -> Vec<i64> {
        pids_of(
            &sim.run(&[&["--json", "holders"], args].concat())
                .ok()
                .json(),
        )
    };
    let (pa, pb) = (vec![i64::from(ca.pid)], vec![i64::from(cb.pid)]);
    assert_eq!(picked(&["--pod", "ml/trainer-0"]), pa);
    assert_eq!(
        picked(&["--pod", "infer"]),
        pb,
        "a bare name: namespace default"
    );
    assert_eq!(picked(&["--pod", &b.uid[..13]]), pb);
    assert_eq!(picked(&["--pod", &a.uid]), pa);
    assert_eq!(picked(&["--container", &ca.id[..12]]), pa);
    assert_eq!(
        picked(&["--container", "trainer"]),
        pa,
        "its name in the pod"
    );
    assert_eq!(picked(&["--container", &cb.name]), pb, "podman's name");
    let e = sim.run(&["holders", "--pod", "ml/nothing"]).code(2).stderr;
    assert!(
        e.contains("no process on this node's GPUs is in such a pod")
            && e.contains(&format!("--pod {} (ml/trainer-0, deleted)", a.uid))
            && e.contains(&format!("--pod {} (default/infer)", b.uid)),
        "{e}"
    );
    let e = sim.run(&["holders", "--pod", "aaaa"]).code(2).stderr;
    assert!(
        e.contains("a uid prefix needs 8 characters at least"),
        "{e}"
    );
    sim.run(&["holders", "--pod", ""]).code(2);

    let names = sim.eval(
        r#"holders(#{pod: "ml/trainer-0"}).map(|h| `${h.pod.namespace}/${h.pod.name}:${h.pod.deleted}:${h.runtime}`)"#,
    );
    assert_eq!(names, r#"["ml/trainer-0:true:podman"]"#);
    // kill() bounded to a pod leaves a process of another pod alone (and says why).
    let r = sim.eval_json(&format!(
        r#"kill({}, #{{pod: "ml/trainer-0", dry_run: true}})"#,
        cb.pid
    ));
    assert_eq!(r["would_signal"], json!([]), "{r}");
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("outside --pod ml/trainer-0"),
        "{r}"
    );

    let [holders, diagnosed, killed] = &mcp(
        &sim,
        "kill",
        &[
            ("holders", json!({"pod": "ml/trainer-0"})),
            ("diagnose", json!({"container": cb.name})),
            (
                "kill",
                json!({"targets": [cb.pid], "pod": "ml/trainer-0", "dry_run": true}),
            ),
        ],
    )[..] else {
        unreachable!()
    };
    assert_eq!(
        pids_of(&holders["structuredContent"]["holders"]),
        pa,
        "{holders}"
    );
    assert_eq!(
        diagnosed["structuredContent"]["gpus"][0]["gpu"], 0,
        "{diagnosed}"
    );
    assert_eq!(
        killed["structuredContent"]["would_signal"],
        json!([]),
        "{killed}"
    );

    let r = sim
        .run(&[
            "--json",
            "clean",
            "--pod",
            "ml/trainer-0",
            "--timeout",
            "60",
        ])
        .ok()
        .json();
    assert_eq!(r["clean"], true, "{r}");
    assert_eq!(r["kill"]["signalled"], json!([ca.pid]), "{r}");
    assert!(!alive(ca.pid) && alive(cb.pid));
    assert_eq!(sim.used_mib(0), 500);
    assert_eq!(r["gpus"][0]["verdict"], "held", "{r}");
    let advice = r["gpus"][0]["advice"].as_str().unwrap();
    assert!(advice.contains("pod default/infer"), "{advice}");

    // `wait --pod` waits for that pod's memory alone: another pod on the GPU (c) does not
    // keep it waiting, and it kills nothing.
    let c = Pod::new("default", "other", "x", "eeee1111");
    node.knows(&c);
    let cc = Ctr::holding(&sim, Some(&c), 200);
    let out = sim
        .run(&["--json", "wait", "--pod", "infer", "--timeout", "0.3"])
        .code(1);
    assert_eq!(out.json()["clean"], false);
    assert!(alive(cb.pid));
    let mut w = sim.std_cmd();
    w.args([
        "-v",
        "--json",
        "wait",
        "--pod",
        "default/infer",
        "--timeout",
        "120",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut waiting = w.spawn().expect("wait");
    sim.adopt(waiting.id() as i32);
    // Its second look (-v says each) fixes what the pod holds: the kill comes after it.
    let log = std::io::BufReader::new(waiting.stderr.take().expect("stderr"));
    let mut lines = std::io::BufRead::lines(log);
    let mut looks = 0;
    while looks < 2 {
        let line = lines.next().expect("the wait's log").expect("read");
        looks += usize::from(line.contains("inventory:"));
    }
    sim.run(&["kill", "--pod", "default/infer", "--grace", "0"])
        .ok();
    std::thread::spawn(move || lines.for_each(drop));
    let out = waiting.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["clean"], true, "{r}");
    assert!(alive(cc.pid));
    assert_eq!(sim.used_mib(0), 200);
}

/// A pod's name is what the runtime's state on disk says, or what this user's gpuloop
/// remembered of it: a container's bundle read once is remembered in the state directory,
/// and a planted memory (another owner's, writable by others, in a directory another user
/// owns) never moves a `--pod` scope onto another pod's processes.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_planted_memory_of_runtime_state_never_moves_a_pod_scope() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let sim = Sim::new("1x8G");
    let node = Node::new(&sim, None);
    let a = Pod::new("ml", "trainer-0", "trainer", "cccc1111");
    let b = Pod::new("default", "infer", "server", "cccc2222");
    node.knows(&a);
    node.knows(&b);
    let ca = Ctr::holding(&sim, Some(&a), 300);
    let cb = Ctr::holding(&sim, Some(&b), 200);
    let picked = |args: &[&str]| -> Vec<i64> {
        pids_of(
            &sim.run(&[&["--json", "holders"], args].concat())
                .ok()
                .json(),
        )
    };
    // A bundle is remembered once it has not changed for a second; a scan looks until then.
    let dir = sim.path().join("state-home/gpuloop");
    let memory = dir.join("runtime-state.json");
    let bundle = |c: &Ctr| {
        format!(
            "/var/lib/containers/storage/overlay-containers/{}/userdata/config.json",
            c.id
        )
    };
    let remembered = within(30, || {
        picked(&[]);
        std::fs::read_to_string(&memory)
            .is_ok_and(|t| t.contains(&bundle(&ca)) && t.contains(&bundle(&cb)))
    });
    assert!(remembered, "{:?}", std::fs::read_to_string(&memory));
    let meta = std::fs::metadata(&memory).expect("memory");
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 0));
    // From memory, the same as from the bundles.
    assert_eq!(picked(&["--pod", "ml/trainer-0"]), vec![i64::from(ca.pid)]);
    assert_eq!(picked(&["--pod", "default/infer"]), vec![i64::from(cb.pid)]);

    // What a planter writes: b's bundle, its very version, said to be ml/trainer-0's.
    let mut entries: Value = serde_json::from_slice(&std::fs::read(&memory).unwrap()).unwrap();
    for e in entries.as_array_mut().unwrap() {
        if e["path"] == json!(bundle(&cb)) {
            e["said"]["annotations"]["keys"]["io.kubernetes.pod.name"] = json!("trainer-0");
            e["said"]["annotations"]["keys"]["io.kubernetes.pod.namespace"] = json!("ml");
        }
    }
    let planted = serde_json::to_vec(&entries).unwrap();
    let plant = |mode: u32, owner: u32| {
        let _ = std::fs::remove_file(&memory);
        std::fs::write(&memory, &planted).unwrap();
        std::fs::set_permissions(&memory, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&memory, Some(owner), Some(owner)).unwrap();
    };
    // The control: in this user's own memory, the forgery is believed (memory is what names
    // the pods here: both are ml/trainer-0 now, so that name picks neither), so the cases
    // below would fail if it were believed there too.
    plant(0o600, 0);
    let e = sim
        .run(&["holders", "--pod", "ml/trainer-0"])
        .code(2)
        .stderr;
    assert!(
        e.contains(&format!("--pod {} (ml/trainer-0)", b.uid)),
        "{e}"
    );
    // Another owner's, or writable by others: not believed, and not written over.
    for (mode, owner) in [(0o600, 65534), (0o666, 0), (0o644, 65534)] {
        plant(mode, owner);
        assert_eq!(
            picked(&["--pod", "ml/trainer-0"]),
            vec![i64::from(ca.pid)],
            "mode {mode:o}, owner {owner}"
        );
        let r = sim
            .run(&["--json", "clean", "--pod", "ml/trainer-0", "--dry-run"])
            .ok()
            .json();
        assert_eq!(r["would_signal"], json!([ca.pid]), "{r}");
        assert_eq!(std::fs::read(&memory).unwrap(), planted);
    }
    // A directory another user owns (as `sudo -E` keeps a user's XDG_STATE_HOME).
    plant(0o600, 0);
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    assert_eq!(picked(&["--pod", "ml/trainer-0"]), vec![i64::from(ca.pid)]);
    std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
    // Removed, the memory is written again from the bundles as they are.
    std::fs::remove_file(&memory).unwrap();
    assert_eq!(picked(&["--pod", "ml/trainer-0"]), vec![i64::from(ca.pid)]);
    assert!(within(30, || {
        picked(&[]);
        std::fs::read_to_string(&memory).is_ok_and(|t| t.contains(&bundle(&cb)))
    }));
    assert_eq!(picked(&["--pod", "default/infer"]), vec![i64::from(cb.pid)]);
    assert!(alive(ca.pid) && alive(cb.pid));
}

/// Every signal stays inside the scope, trees included: a forked child of a pod's holder that
/// was moved out of the pod (into the test's own cgroups) is left alone, and said.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_pod_scope_leaves_a_child_outside_the_pod_alone() {
    let sim = Sim::new("1x8G");
    let node = Node::new(&sim, None);
    let a = Pod::new("ml", "trainer-1", "trainer", "bbbb1111");
    node.knows(&a);
    // A shell is the container's init, so the holder's child outlives the holder.
    let _c = Ctr::start(
        &sim,
        Some(&a),
        &[
            "sh",
            "-c",
            "/gpuloop sim hold --gpu 0 --mib 100 --fork-child; sleep 1000",
        ],
        2,
    );
    let hs = sim
        .run(&["--json", "holders", "--pod", "ml/trainer-1"])
        .ok()
        .json();
    let pids = pids_of(&hs);
    assert_eq!(pids.len(), 2, "{hs}");
    // The child is the holder whose parent is the other.
    let (holder, child) = match by_pid(&hs, pids[1] as i32)["ppid"] == pids[0] {
        true => (pids[0] as i32, pids[1] as i32),
        false => (pids[1] as i32, pids[0] as i32),
    };
    assert_eq!(by_pid(&hs, child)["ppid"], holder, "{hs}");
    sim.adopt(child);
    move_into(child, &cgroup_procs(std::process::id() as i32));
    let out = sim.run(&[
        "--json",
        "kill",
        "--gpu",
        "0",
        "--pod",
        "ml/trainer-1",
        "--grace",
        "0",
    ]);
    let r = out.json();
    assert_eq!(r["signalled"], json!([holder]), "{r}");
    let why = r["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["pid"] == child)
        .unwrap_or_else(|| panic!("{child} not skipped: {r}"))["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(why.contains("outside --pod ml/trainer-1"), "{why}");
    assert!(alive(child) && !alive(holder));
}

/// A pod `ml/NAME` the kubelet knows, its container running a shell that holds nothing, and
/// the `cgroup.procs` files of that container's cgroups (to move a test's processes into it).
fn a_pod_to_move_into(sim: &Sim, name: &'static str, prefix: &str) -> (Pod, Ctr, Vec<String>) {
    let node = Node::new(sim, None);
    let a = Pod::new("ml", name, "trainer", prefix);
    node.knows(&a);
    let c = Ctr::start(sim, Some(&a), &["sh", "-c", "echo up; sleep 1000"], 1);
    let procs: Vec<String> = cgroup_procs(c.pid)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        procs
            .iter()
            .any(|p| p.contains(&a.uid) && p.contains(&c.id)),
        "{procs:?}"
    );
    (a, c, procs)
}

/// The scope is read through each process's pin: with forced pid reuse in a private PID
/// namespace, a pod's holder exits and an innocent outside the pod takes its pid; a kill
/// bounded to the pod, given that pid, leaves the innocent alone and still stops the pod's
/// other holder.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn an_innocent_at_a_reused_pid_outside_the_pod_is_never_signalled() {
    require_pid_reuse();
    let sim = Sim::new("1x8G");
    let (_a, _c, pod_procs) = a_pod_to_move_into(&sim, "trainer-2", "cccc1111");
    let script = format!(
        r#"G=$GPULOOP_BIN
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/h1" & h1=$!
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/h2" & h2=$!
until [ -s "$TMPD/h1" ] && [ -s "$TMPD/h2" ]; do sleep 0.01; done
for p in $h1 $h2; do for f in {procs}; do echo $p > "$f"; done; done
inpod=$("$G" --json holders --pod ml/trainer-2 | grep -c '"pid": ')
kill -KILL $h1; wait $h1
echo $((h1 - 1)) > /proc/sys/kernel/ns_last_pid
sleep 1000 & innocent=$!
"$G" --json eval "kill([$h2, $innocent], #{{pod: \"ml/trainer-2\", grace: 0}})" > "$TMPD/kill.json"
state() {{ sed 's/.*) //' /proc/$1/stat 2>/dev/null | cut -c1; }}
alive=0; case "$(state $innocent)" in ""|Z) ;; *) alive=1 ;; esac
h2gone=0; case "$(state $h2)" in ""|Z) h2gone=1 ;; esac
kill -KILL $innocent
reused=0; [ "$innocent" = "$h1" ] && reused=1
echo "inpod=$inpod reused=$reused innocent_alive=$alive h2_gone=$h2gone"
"#,
        procs = pod_procs.join(" ")
    );
    let t = forced_reuse(&sim, "reuse.sh", &script, 1, 1);
    assert_eq!(t.field("inpod"), 2, "{}\n{}", t.stdout, t.stderr);
    assert_eq!(t.field("reused"), 1, "{}\n{}", t.stdout, t.stderr);
    assert_eq!(t.field("innocent_alive"), 1, "{}\n{}", t.stdout, t.stderr);
    assert_eq!(t.field("h2_gone"), 1, "{}\n{}", t.stdout, t.stderr);
    let report = std::fs::read_to_string(sim.path().join("kill.json")).expect("kill.json");
    assert!(report.contains("outside --pod ml/trainer-2"), "{report}");
}

/// A container its runtime has forgotten (no state of it on disk: here the storage root the
/// config names is empty) while its process lives on: orphaned, named, and `clean
/// --container` takes it.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_container_its_runtime_forgot_is_an_orphan_clean_takes() {
    let sim = Sim::new("1x8G");
    let empty = sim.path().join("no-storage");
    std::fs::create_dir_all(&empty).expect("mkdir");
    Node::new(&sim, Some(&empty));
    let c = Ctr::holding(&sim, None, 300);
    let h = by_pid(&sim.run(&["--json", "holders"]).ok().json(), c.pid);
    assert_eq!(
        (
            &h["container"],
            &h["runtime"],
            &h["container_deleted"],
            &h["pod"]
        ),
        (&json!(c.id), &json!("podman"), &json!(true), &Value::Null),
        "{h}"
    );
    let d = sim.run(&["--json", "diagnose"]).code(1).json();
    let advice = d[0]["advice"].as_str().unwrap();
    assert_eq!(d[0]["verdict"], "orphaned", "{d}");
    assert!(
        advice.contains(&format!("container {} (deleted)", &c.id[..12]))
            && advice.contains(&format!("--container {}", c.id)),
        "{advice}"
    );
    let r = sim
        .run(&[
            "--json",
            "clean",
            "--container",
            &c.id[..12],
            "--timeout",
            "60",
        ])
        .ok()
        .json();
    assert_eq!(r["clean"], true, "{r}");
    assert!(!alive(c.pid));
}

/// The scopes cross the wire as given, and each host finds its own pods: over --host, a
/// deleted pod is named, picked and cleaned there, the other pod left alone.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn pod_scopes_over_a_host_are_read_and_kept_there() {
    let cl = Cluster::new(&[("pa", "1x8G")], &[]);
    let sim = cl.sim("pa");
    let node = Node::new(sim, None);
    cl.set_env(
        "pa",
        &format!("XDG_CONFIG_HOME={}", sim.path().join("config").display()),
    );
    let a = Pod::new("ml", "trainer-3", "trainer", "dddd1111");
    let b = Pod::new("default", "infer-3", "server", "dddd2222");
    node.knows(&b);
    let ca = Ctr::holding(sim, Some(&a), 200);
    let cb = Ctr::holding(sim, Some(&b), 100);
    let hs = cl
        .run(&["--host", "pa", "--json", "holders", "--pod", "ml/trainer-3"])
        .ok()
        .json();
    assert_eq!(pids_of(&hs), [i64::from(ca.pid)], "{hs}");
    assert_eq!(
        (&hs[0]["host"], &hs[0]["pod"]["deleted"]),
        (&json!("pa"), &json!(true))
    );
    let out = cl
        .run(&[
            "--host",
            "pa",
            "eval",
            r#"holders(#{container: "server"}).map(|h| h.pid)"#,
        ])
        .ok();
    assert_eq!(out.stdout.trim(), format!("[{}]", cb.pid));
    let r = cl
        .run(&[
            "--host",
            "pa",
            "--json",
            "clean",
            "--pod",
            "ml/trainer-3",
            "--timeout",
            "60",
        ])
        .ok()
        .json();
    assert_eq!(r["clean"], true, "{r}");
    assert!(!alive(ca.pid) && alive(cb.pid));
}

/// dcgm-exporter as a DaemonSet runs it: root in its container, running its image's own
/// program. A daemon's name is proven by the program it runs, looked up inside the process's
/// own root: there, the container's. It stays a protected daemon, as on a GPU node it must:
/// listed as one, and never signalled without force.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_daemonsets_exporter_root_in_its_container_stays_a_protected_daemon() {
    let sim = Sim::new("1x8G");
    Node::new(&sim, None);
    let cmd = [
        "/gpuloop",
        "sim",
        "hold",
        "--foreground",
        "--observer",
        "--gpu",
        "0",
        "--name",
        "dcgm-exporter",
    ];
    let c = Ctr::start(&sim, None, &cmd, 1);
    let h = by_pid(&sim.run(&["--json", "holders", "--all"]).ok().json(), c.pid);
    assert_eq!(
        (&h["role"], &h["protected"], &h["container"]),
        (&json!("daemon"), &json!(true), &json!(c.id)),
        "{h}"
    );
    let r = sim.eval_json(&format!("kill({}, #{{grace: 1}})", c.pid));
    assert_eq!(r["signalled"], json!([]), "{r}");
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .is_some_and(|s| s.contains("is a GPU daemon")),
        "{r}"
    );
    assert!(alive(c.pid));
}

/// The stderr of a run that must fail as a usage error (exit 2).
fn refused(sim: &Sim, args: &[&str]) -> String {
    let out = sim.run(args);
    assert_eq!(out.code, 2, "{args:?}: {}\n{}", out.stdout, out.stderr);
    out.stderr
}

/// A StatefulSet's pod re-created with a new uid while the deleted one's orphan still holds
/// the GPU: `ml/trainer-0` (or `trainer-0`) names both, so it picks neither. Every command,
/// script function and MCP tool refuses it (exit 2 on the command line) and lists each pod
/// with its uid, whether deleted, and the selector that names it alone; so does a container
/// name the two share. diagnose's advice names the orphan by its uid, and following it stops
/// the orphan alone.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_deleted_pods_name_is_its_successors_too_so_it_picks_neither() {
    let sim = Sim::new("1x8G");
    let node = Node::new(&sim, None);
    let old = Pod::new("ml", "trainer-0", "trainer", "ffff1111");
    let new = Pod::new("ml", "trainer-0", "trainer", "ffff2222");
    node.knows(&new);
    let co = Ctr::holding(&sim, Some(&old), 300);
    let cn = Ctr::holding(&sim, Some(&new), 200);
    node.links(&new, &cn);
    let pods = [
        format!("--pod {} (ml/trainer-0, deleted)", old.uid),
        format!("--pod {} (ml/trainer-0)", new.uid),
    ];
    let ctrs = [
        format!(
            "--container {} (trainer in pod ml/trainer-0, deleted)",
            co.id
        ),
        format!("--container {} (trainer in pod ml/trainer-0)", cn.id),
    ];
    let lists = |e: &str, which: &[String; 2]| {
        assert!(
            e.contains("fits 2") && which.iter().all(|c| e.contains(c.as_str())),
            "{e}"
        );
    };
    for args in [
        &["holders", "--pod", "ml/trainer-0"][..],
        &["holders", "--pod", "trainer-0"],
        &["diagnose", "--check", "--pod", "ml/trainer-0"],
        &["kill", "--pod", "ml/trainer-0", "--dry-run"],
        &["kill", "--gpu", "0", "--pod", "trainer-0", "--grace", "0"],
        &["clean", "--pod", "ml/trainer-0", "--timeout", "5"],
        &["wait", "--pod", "ml/trainer-0", "--timeout", "1"],
    ] {
        lists(&refused(&sim, args), &pods);
    }
    for args in [
        &["holders", "--container", "trainer"][..],
        &["clean", "--container", "trainer", "--timeout", "5"],
        &["kill", "--container", "trainer", "--grace", "0"],
    ] {
        lists(&refused(&sim, args), &ctrs);
    }
    assert!(alive(co.pid) && alive(cn.pid));
    let picked = |args: &[&str]| -> Vec<i64> {
        pids_of(
            &sim.run(&[&["--json", "holders"], args].concat())
                .ok()
                .json(),
        )
    };
    assert_eq!(picked(&["--pod", &new.uid]), [i64::from(cn.pid)]);
    assert_eq!(picked(&["--pod", &old.uid[..13]]), [i64::from(co.pid)]);
    assert_eq!(
        picked(&["--pod", &new.uid, "--container", "trainer"]),
        [i64::from(cn.pid)]
    );

    // A script's options and MCP's arguments, under the same rules.
    for code in [
        r#"holders(#{pod: "ml/trainer-0"})"#.to_string(),
        r#"diagnose(#{pod: "trainer-0"})"#.to_string(),
        r#"wait_clean(0, #{pod: "ml/trainer-0", timeout: 1})"#.to_string(),
        format!(r#"kill({}, #{{pod: "ml/trainer-0", grace: 0}})"#, cn.pid),
    ] {
        let out = sim.run(&["eval", &code]);
        assert_eq!(out.code, 1, "{code}: {}", out.stderr);
        lists(&out.stderr, &pods);
    }
    let e = sim
        .run(&["eval", r#"holders(#{container: "trainer"})"#])
        .code(1)
        .stderr;
    lists(&e, &ctrs);
    let replies = mcp(
        &sim,
        "kill,clean",
        &[
            ("holders", json!({"pod": "ml/trainer-0"})),
            ("diagnose", json!({"pod": "trainer-0"})),
            ("wait_clean", json!({"pod": "ml/trainer-0", "timeout": 1})),
            ("kill", json!({"targets": [cn.pid], "pod": "ml/trainer-0"})),
            ("clean", json!({"pod": "ml/trainer-0", "timeout": 5})),
            ("clean", json!({"container": "trainer", "timeout": 5})),
        ],
    );
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r["isError"], true, "{i}: {r}");
        let text = r["content"][0]["text"].as_str().unwrap_or_default();
        lists(text, if i == 5 { &ctrs } else { &pods });
    }
    assert!(alive(co.pid) && alive(cn.pid));

    // diagnose names the orphan by its uid; what it advises stops the orphan alone.
    let d = sim.run(&["--json", "diagnose"]).code(1).json();
    assert_eq!(d[0]["verdict"], "orphaned", "{d}");
    let advice = d[0]["advice"].as_str().unwrap();
    let cmd = format!("gpuloop clean --gpu 0 --pod {}", old.uid);
    assert!(advice.ends_with(&cmd), "{advice}");
    let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
    let r = sim
        .run(&[&["--json"], &args[..], &["--timeout", "60"]].concat())
        .ok()
        .json();
    assert_eq!(r["clean"], true, "{r}");
    assert_eq!(r["kill"]["signalled"], json!([co.pid]), "{r}");
    assert!(!alive(co.pid) && alive(cn.pid));
    assert_eq!(sim.used_mib(0), 200);
}

/// A container named like another's id prefix fits both (an error, never the name's
/// container alone); its whole id picks it.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_container_named_like_another_ids_prefix_never_takes_its_place() {
    let sim = Sim::new("1x8G");
    Node::new(&sim, None);
    let victim = Ctr::holding(&sim, None, 300);
    let prefix = &victim.id[..12];
    let hold = Ctr::hold("200");
    let namesake = Ctr::start_named(&sim, None, prefix, &hold, 1);
    let e = refused(&sim, &["clean", "--container", prefix, "--timeout", "5"]);
    assert!(
        e.contains("fits 2 containers")
            && e.contains(&format!("--container {} ({prefix})", namesake.id))
            && e.contains(&format!("--container {} ({})", victim.id, victim.name)),
        "{e}"
    );
    refused(&sim, &["kill", "--container", prefix, "--grace", "0"]);
    assert!(alive(victim.pid) && alive(namesake.pid));
    let r = sim
        .run(&[
            "--json",
            "clean",
            "--container",
            &victim.id,
            "--timeout",
            "60",
        ])
        .ok()
        .json();
    assert_eq!(r["kill"]["signalled"], json!([victim.pid]), "{r}");
    assert!(!alive(victim.pid) && alive(namesake.pid));
}

/// A scope that names nothing on this node (a typo; the kubelet's directories and the
/// runtime's state not mounted, so the node names its pods by uid alone) while a pod's
/// process holds the GPU: every command fails (exit 2), saying what there is, as an unknown
/// user does; nothing reads clean, nothing is signalled. The pod's uid still names it.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_scope_that_names_nothing_here_fails_plainly() {
    let sim = Sim::new("1x8G");
    let node = Node::new(&sim, None);
    let a = Pod::new("ml", "trainer-4", "trainer", "abab1111");
    node.knows(&a);
    let c = Ctr::holding(&sim, Some(&a), 300);
    let there = format!("--pod {} (ml/trainer-4)", a.uid);
    for (args, what) in [
        (&["holders", "--pod", "ml/trainer-5"][..], &a.uid),
        (&["diagnose", "--check", "--pod", "ml/trainer-5"], &a.uid),
        (&["wait", "--pod", "ml/trainer-5", "--timeout", "1"], &a.uid),
        (
            &["clean", "--pod", "ml/trainer-5", "--timeout", "1"],
            &a.uid,
        ),
        (&["clean", "--pod", "ml/trainer-5", "--dry-run"], &a.uid),
        (&["kill", "--pod", "ml/trainer-5", "--grace", "0"], &a.uid),
        (&["wait", "--container", "vllm", "--timeout", "1"], &c.id),
        (
            &[
                "clean",
                "--pod",
                "ml/trainer-4",
                "--container",
                "vllm",
                "--timeout",
                "1",
            ],
            &c.id,
        ),
    ] {
        let e = refused(&sim, args);
        assert!(
            e.contains("no process on this node's GPUs is in such a") && e.contains(what.as_str()),
            "{args:?}: {e}"
        );
    }
    let e = refused(&sim, &["diagnose", "--check", "--pod", "ml/trainer-5"]);
    assert!(e.contains(&there), "{e}");
    let out = sim.run(&[
        "eval",
        r#"wait_clean(0, #{pod: "ml/trainer-5", timeout: 1})"#,
    ]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains(&there), "{}", out.stderr);
    let r = &mcp(
        &sim,
        "clean",
        &[("clean", json!({"pod": "ml/trainer-5", "timeout": 1}))],
    )[0];
    assert_eq!(r["isError"], true, "{r}");
    assert!(alive(c.pid));

    // The node as a DaemonSet without the kubelet's directories and the runtime's state
    // mounted sees: pod uids in the cgroups, and no names.
    let empty = sim.path().join("not-mounted");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let cfg = format!(
        "[containers]\nkubelet = {0:?}\npod_logs = {0:?}\ncontainer_logs = {0:?}\nstorage = [{0:?}]\n",
        empty.display().to_string()
    );
    std::fs::write(sim.path().join("config/gpuloop/config.toml"), cfg).expect("config");
    for args in [
        &["diagnose", "--check", "--pod", "ml/trainer-4"][..],
        &["wait", "--pod", "ml/trainer-4", "--timeout", "1"],
        &["clean", "--pod", "ml/trainer-4", "--timeout", "1"],
    ] {
        let e = refused(&sim, args);
        assert!(
            e.contains(&format!("--pod {} (uid {})", a.uid, &a.uid[..8]))
                && e.contains("by uid alone"),
            "{args:?}: {e}"
        );
    }
    assert!(alive(c.pid));
    let r = sim
        .run(&["--json", "clean", "--pod", &a.uid, "--timeout", "60"])
        .ok()
        .json();
    assert_eq!(r["kill"]["signalled"], json!([c.pid]), "{r}");
    assert!(!alive(c.pid));
}

/// Over several hosts each host reads a scope among its own processes, and a pod runs on one
/// node: a name that picks a pod on two hosts (a deleted pod's orphan on one, its successor
/// on the other) is refused before anything is signalled; a host where the scope names
/// nothing fails its own part, named; the uid takes the orphan alone.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn over_hosts_a_pod_name_on_two_nodes_picks_neither() {
    let cl = Cluster::new(&[("pa", "1x8G"), ("pb", "1x8G")], &[]);
    let (sa, sb) = (cl.sim("pa"), cl.sim("pb"));
    Node::new(sa, None);
    let nb = Node::new(sb, None);
    for (alias, sim) in [("pa", sa), ("pb", sb)] {
        cl.set_env(
            alias,
            &format!("XDG_CONFIG_HOME={}", sim.path().join("config").display()),
        );
    }
    let old = Pod::new("ml", "trainer-0", "trainer", "acac1111");
    let new = Pod::new("ml", "trainer-0", "trainer", "acac2222");
    nb.knows(&new);
    let co = Ctr::holding(sa, Some(&old), 200);
    let cn = Ctr::holding(sb, Some(&new), 100);
    nb.links(&new, &cn);
    let both = ["--host", "pa", "--host", "pb"];
    for args in [
        &["clean", "--pod", "ml/trainer-0", "--timeout", "5"][..],
        &["kill", "--pod", "trainer-0", "--grace", "0"],
        &["wait", "--pod", "ml/trainer-0", "--timeout", "1"],
    ] {
        let out = cl.run(&[&both[..], args].concat());
        assert_eq!(out.code, 2, "{args:?}: {}\n{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains("fits pods on 2 hosts")
                && out
                    .stderr
                    .contains(&format!("pa: --pod {} (ml/trainer-0, deleted)", old.uid))
                && out
                    .stderr
                    .contains(&format!("pb: --pod {} (ml/trainer-0)", new.uid)),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert!(alive(co.pid) && alive(cn.pid));
    // Read-only, each host's pod is listed with its host and uid.
    let hs = cl
        .run(&[&both[..], &["--json", "holders", "--pod", "ml/trainer-0"]].concat())
        .ok()
        .json();
    assert_eq!(pids_of(&hs), {
        let mut p = vec![i64::from(co.pid), i64::from(cn.pid)];
        p.sort_unstable();
        p
    });
    // The orphan's uid: pa cleans it; pb, where it names nothing, says so, and the run is
    // a usage error for it.
    let out = cl.run(&[&both[..], &["clean", "--pod", &old.uid, "--timeout", "60"]].concat());
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("pb")
            && out
                .stderr
                .contains("no process on this node's GPUs is in such a pod"),
        "{}",
        out.stderr
    );
    assert!(!alive(co.pid) && alive(cn.pid));
}

/// The scopes as this change reads them (a container's id prefix, a pod's whole uid, a
/// clean's rounds kept to the pod its first look found), tried against forced pid reuse in a
/// private PID namespace: holder maps taken by `#{container}` and killed after one holder's
/// pid went to an innocent GPU holder outside the container; bare pids killed under the
/// pod's uid after the same; `clean --pod UID` with those innocents on the GPU. No innocent
/// is signalled (the signal log says so, by pid and start time); the scope's other holders are.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn reused_pids_on_the_scope_paths_are_never_signalled() {
    require_pid_reuse();
    let sim = Sim::new("1x8G");
    let (a, c, procs) = a_pod_to_move_into(&sim, "trainer-5", "cdcd1111");
    let script = format!(
        r#"G=$GPULOOP_BIN
state() {{ sed 's/.*) //' /proc/$1/stat 2>/dev/null | cut -c1; }}
start() {{ sed 's/.*) //' /proc/$1/stat 2>/dev/null | cut -d' ' -f20; }}
gone() {{ case "$(state $1)" in ""|Z) echo 1 ;; *) echo 0 ;; esac; }}
into() {{ for f in {procs}; do echo $1 > "$f"; done; }}
held() {{ until [ -s "$TMPD/$1" ]; do sleep 0.01; done; }}
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/h1" & h1=$!
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/h2" & h2=$!
held h1; held h2; into $h1; into $h2
# 1: holder maps taken by the container's id prefix; h1's pid goes to an innocent holder.
"$G" --json eval 'let hs = holders(#{{container: "{id12}"}});
  write_file(env("TMPD") + "/took", `${{hs.len()}}`);
  until(60, || file_exists(env("TMPD") + "/go"));
  kill(hs, #{{container: "{id12}", grace: 0}})' > "$TMPD/kill1.json" 2>&1 & k=$!
until [ -s "$TMPD/took" ]; do sleep 0.01; done
kill -KILL $h1; wait $h1
echo $((h1 - 1)) > /proc/sys/kernel/ns_last_pid
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/i1" & i1=$!
held i1; touch "$TMPD/go"; wait $k
r1=0; [ "$i1" = "$h1" ] && r1=1
# 2: bare pids under the pod's whole uid, one of them reused by an innocent holder.
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/h3" & h3=$!
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/h4" & h4=$!
held h3; held h4; into $h3; into $h4
kill -KILL $h3; wait $h3
echo $((h3 - 1)) > /proc/sys/kernel/ns_last_pid
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/i2" & i2=$!
held i2
r2=0; [ "$i2" = "$h3" ] && r2=1
"$G" --json eval "kill([$h3, $h4], #{{pod: \"{uid}\", grace: 0}})" > "$TMPD/kill2.json" 2>&1
# 3: clean --pod UID with both innocents holding the GPU.
"$G" sim hold --gpu 0 --mib 64 --foreground > "$TMPD/h5" & h5=$!
held h5; into $h5
"$G" --json clean --pod {uid} --grace 0 --timeout 30 > "$TMPD/clean.json" 2>&1
wrong=0
for i in $i1 $i2; do
  n=$(grep -c "^$i $(start $i) " "$TMPD/signals.log" 2>/dev/null); wrong=$((wrong + ${{n:-0}}))
done
echo "took=$(cat "$TMPD/took") reused=$((r1 + r2)) innocents_alive=$(( (1 - $(gone $i1)) + (1 - $(gone $i2)) )) scope_gone=$(( $(gone $h2) + $(gone $h4) + $(gone $h5) )) wrong=$wrong logged=$(cat "$TMPD/signals.log" | wc -l)"
kill -KILL $i1 $i2
"#,
        procs = procs.join(" "),
        id12 = &c.id[..12],
        uid = a.uid,
    );
    let t = forced_reuse(&sim, "scope-reuse.sh", &script, 2, 1);
    let why = || {
        let read = |f: &str| std::fs::read_to_string(sim.path().join(f)).unwrap_or_default();
        format!(
            "{}\n{}\nkill1: {}\nkill2: {}\nclean: {}",
            t.stdout,
            t.stderr,
            read("kill1.json"),
            read("kill2.json"),
            read("clean.json")
        )
    };
    assert_eq!(t.field("took"), 2, "{}", why());
    assert_eq!(t.field("reused"), 2, "{}", why());
    assert_eq!(t.field("wrong"), 0, "{}", why());
    // The scope's three holders' signals are in the log that showed no innocent's.
    assert!(t.field("logged") >= 3, "{}", why());
    assert_eq!(t.field("innocents_alive"), 2, "{}", why());
    assert_eq!(t.field("scope_gone"), 3, "{}", why());
}

/// A pod that asked for a MIG device (`nvidia.com/mig-1g.10gb`): its process is attributed to
/// its device as any other, `--pod` picks it, and a clean of the pod stops it alone while a
/// job on the sibling device of the same GPU runs on; the pod's memory is back on its device.
#[test]
#[ignore = "needs root, podman, runc and busybox-static: bash .ci/run installs them and runs it as root (--include-ignored)"]
fn a_pod_on_a_mig_device_is_cleaned_alone_beside_the_sibling_devices_job() {
    let sim = Sim::new("1x80G,mig=0:1g.10gb+1g.10gb");
    let node = Node::new(&sim, None);
    let a = Pod::new("ml", "mig-0", "trainer", "cccc1111");
    node.knows(&a);
    let cmd = [
        "/gpuloop",
        "sim",
        "hold",
        "--gpu",
        "0:7:0",
        "--mib",
        "1000",
        "--foreground",
    ];
    let c = Ctr::start(&sim, Some(&a), &cmd, 1);
    let sibling = sim.hold(&["--gpu", "0:8:0", "--mib", "2000"]);
    let hs = sim
        .run(&["--json", "holders", "--pod", "ml/mig-0"])
        .ok()
        .json();
    assert_eq!(pids_of(&hs), [i64::from(c.pid)], "{hs}");
    let h = by_pid(&hs, c.pid);
    assert_eq!(h["mig"], json!([{"gpu": 0, "gi": 7, "ci": 0}]), "{h}");
    assert_eq!(h["mem_mib"], 1000, "{h}");
    let r = sim
        .run(&["--json", "clean", "--pod", "ml/mig-0", "--timeout", "10"])
        .ok()
        .json();
    assert_eq!(r["clean"], true, "{r}");
    assert!(gone_within(c.pid, 10), "{r}");
    assert!(
        alive(sibling[0]),
        "the sibling device's job was stopped: {r}"
    );
    let gpus = sim.gpus();
    let used: Vec<i64> = gpus[0]["mig"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["mem_used_mib"].as_i64().unwrap())
        .collect();
    assert_eq!(used, [0, 2000], "{gpus}");
}
