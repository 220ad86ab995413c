//! Which container, and which Kubernetes pod, a process runs in, from the node alone: its
//! cgroup path names the runtime, the container's id and the pod's uid; what the runtimes and
//! the kubelet keep on disk (the OCI bundle's annotations, docker's `config.v2.json`,
//! containers/storage's list, the kubelet's pod and log directories) names them. No API
//! server is asked, and a process outside any container costs no read at all.
//!
//! Where the runtimes keep their state, as their sources write it:
//! - containerd (and k3s, RKE2 under /run/k3s): the task's bundle
//!   `<state>/io.containerd.runtime.v2.task/<namespace>/<id>/config.json` (runtime v2's
//!   `NewBundle`), with the CRI plugin's annotations `io.kubernetes.cri.sandbox-name`,
//!   `-namespace`, `-uid` and `io.kubernetes.cri.container-name`;
//! - CRI-O and podman (containers/storage): `<runroot or graphroot>/<driver>-containers/<id>/
//!   userdata/config.json` (CRI-O saves it in both; podman as root in the graph root), with
//!   `io.kubernetes.pod.name`, `.namespace`, `.uid` and `io.kubernetes.container.name`;
//!   `io.container.manager: libpod` marks podman's; the names are in the graph root's
//!   `<driver>-containers/containers.json`;
//! - docker: `<root>/containers/<id>/config.v2.json` (`Name`, and `Config.Labels`, where
//!   dockershim and cri-dockerd put the same `io.kubernetes.*` keys);
//! - the kubelet: `<root>/pods/<uid>` while it knows the pod,
//!   `/var/log/pods/<namespace>_<name>_<uid>/<container>/`, and a link for each container it
//!   started, `/var/log/containers/<pod>_<namespace>_<container>-<id>.log`
//!   (kuberuntime's `logSymlink`): one listing of that directory names the pods of all its
//!   containers, so their bundles are read only for containers the kubelet did not start.

use super::runtime_state::{Said, StateFiles};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The container runtime that started a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Runtime {
    #[serde(rename = "docker")]
    Docker,
    #[serde(rename = "containerd")]
    Containerd,
    #[serde(rename = "cri-o")]
    CriO,
    #[serde(rename = "podman")]
    Podman,
}

impl Runtime {
    /// The name JSON, scripts and tables use.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Podman => "podman",
        }
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The Kubernetes pod a process runs in, as the node knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Pod {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
    /// The container's name in the pod.
    pub container: Option<String>,
    /// The kubelet no longer knows the pod (no `pods/<uid>` in its directory): its
    /// processes outlived it.
    pub deleted: bool,
}

impl Pod {
    /// "ml/trainer-0", or, where the node does not tell the name, "uid 1a2b3c4d".
    pub fn label(&self) -> String {
        match (&self.namespace, &self.name, &self.uid) {
            (Some(ns), Some(name), _) => format!("{ns}/{name}"),
            (None, Some(name), _) => name.clone(),
            (_, None, Some(uid)) => format!("uid {}", short(uid, 8)),
            (_, None, None) => "unknown".into(),
        }
    }
}

/// The container a process runs in, and its pod: part of every record that carries a pid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Place {
    /// The container's id (docker, containerd, CRI-O, podman), from the cgroup path.
    pub container: Option<String>,
    /// The container's own name where the runtime keeps one (docker's, podman's, CRI-O's,
    /// nerdctl's).
    pub container_name: Option<String>,
    /// "docker", "containerd", "cri-o" or "podman".
    pub runtime: Option<Runtime>,
    /// The runtime no longer knows the container (no state of it on disk) while its
    /// processes live on: a shim that died, a runtime restarted without them.
    pub container_deleted: bool,
    pub pod: Option<Pod>,
}

impl Place {
    /// Not in a container, as far as the node tells.
    pub fn is_empty(&self) -> bool {
        self.container.is_none() && self.pod.is_none()
    }

    /// The processes outlived their pod or their container.
    pub fn gone(&self) -> bool {
        self.container_deleted || self.pod.as_ref().is_some_and(|p| p.deleted)
    }

    /// How a person is told where it runs: "pod ml/trainer-0 (deleted)", "container vllm",
    /// "container 3839ae72c1f0"; `None` outside any container.
    pub fn describe(&self) -> Option<String> {
        if let Some(p) = &self.pod {
            let deleted = match (p.deleted, self.container_deleted) {
                (true, _) => " (deleted)",
                (false, true) => " (container deleted)",
                (false, false) => "",
            };
            return Some(format!("pod {}{deleted}", p.label()));
        }
        let deleted = if self.container_deleted {
            " (deleted)"
        } else {
            ""
        };
        Some(format!("container {}{deleted}", self.short_name()?))
    }

    /// The container's name, else its id's first 12 characters.
    pub fn short_name(&self) -> Option<String> {
        self.container_name
            .clone()
            .or_else(|| self.container.as_deref().map(|c| short(c, 12)))
    }
}

/// The first `n` characters of an id.
pub(crate) fn short(id: &str, n: usize) -> String {
    id.chars().take(n).collect()
}

/// What a cgroup path alone says: the runtime (from the scope's prefix), the container's id,
/// the pod's uid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Ids {
    pub runtime: Option<Runtime>,
    pub id: Option<String>,
    pub pod_uid: Option<String>,
}

impl Ids {
    pub(crate) fn is_empty(&self) -> bool {
        self.id.is_none() && self.pod_uid.is_none()
    }
}

/// The scope prefixes the runtimes name a container's cgroup with (systemd driver:
/// `docker-<id>.scope`; CRI-O's cgroupfs driver keeps the prefix too: `crio-<id>`).
const PREFIXES: &[(&str, Runtime)] = &[
    ("docker-", Runtime::Docker),
    ("cri-containerd-", Runtime::Containerd),
    ("nerdctl-", Runtime::Containerd),
    ("crio-", Runtime::CriO),
    ("libpod-", Runtime::Podman),
];

/// A container id after a runtime's prefix: hex, 12 characters at least (64 in practice).
fn is_id(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A bare path component that is a container id: 64 hex characters, nothing less (a
/// directory of another name under a pod is not taken for one).
fn is_full_id(s: &str) -> bool {
    s.len() == 64 && is_id(s)
}

/// A pod uid: 36 characters with dashes, or 32 hex digits (a static pod's, from the hash of
/// its manifest).
pub(crate) fn is_uid(s: &str) -> bool {
    (s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        || (s.len() == 36
            && s.bytes().enumerate().all(|(i, b)| {
                matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
            }))
}

/// The pod uid a component names: `pod<uid>` (cgroupfs driver) or
/// `kubepods[-QOS]-pod<uid with _ for ->.slice` (systemd driver).
fn pod_uid_of(comp: &str) -> Option<String> {
    let uid = match comp.strip_suffix(".slice") {
        Some(slice) => slice
            .rfind("-pod")
            .map(|at| &slice[at + 4..])?
            .replace('_', "-"),
        None => comp.strip_prefix("pod")?.to_string(),
    };
    is_uid(&uid).then_some(uid)
}

/// What one cgroup path says of the container and pod: `kubepods-burstable-pod<uid>.slice/
/// cri-containerd-<id>.scope`, `/kubepods/burstable/pod<uid>/<id>`, `crio-<id>.scope`,
/// `docker-<id>.scope`, `/docker/<id>`, `libpod-<id>.scope`, …
pub(crate) fn ids_of(path: &str) -> Ids {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let kube = comps.iter().any(|c| c.contains("kubepods"));
    let mut ids = Ids::default();
    let mut pod_at = None;
    for (i, c) in comps.iter().enumerate() {
        if kube && ids.pod_uid.is_none() {
            if let Some(uid) = pod_uid_of(c) {
                ids.pod_uid = Some(uid);
                pod_at = Some(i);
                continue;
            }
        }
        if ids.id.is_some() {
            continue;
        }
        let base = c.strip_suffix(".scope").unwrap_or(c);
        if let Some((id, rt)) = PREFIXES.iter().find_map(|(p, rt)| {
            base.strip_prefix(p)
                .filter(|id| is_id(id))
                .map(|id| (id, *rt))
        }) {
            ids.id = Some(id.to_string());
            ids.runtime = Some(rt);
            continue;
        }
        if i > 0 && is_full_id(c) {
            let runtime = match comps[i - 1] {
                "docker" => Some(Runtime::Docker),
                "libpod_parent" => Some(Runtime::Podman),
                // The kubelet's cgroupfs driver names the container by its bare id; which
                // runtime made it is for its state on disk to say.
                _ if pod_at == Some(i - 1) => None,
                _ => continue,
            };
            ids.id = Some(c.to_string());
            ids.runtime = runtime;
        }
    }
    ids
}

/// Where the runtimes and the kubelet keep their state on this node: `[containers]` in
/// config.toml.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Roots {
    /// containerd's task state directories (`<dir>/<namespace>/<id>/config.json`).
    pub containerd: Vec<PathBuf>,
    /// containers/storage roots, run and graph (CRI-O, podman):
    /// `<root>/<driver>-containers/<id>/userdata/config.json`.
    pub storage: Vec<PathBuf>,
    /// docker's data roots (`<root>/containers/<id>/config.v2.json`).
    pub docker: Vec<PathBuf>,
    /// The kubelet's root directory (`<root>/pods/<uid>` while it knows the pod).
    pub kubelet: PathBuf,
    /// The kubelet's pod log directory (`<dir>/<namespace>_<name>_<uid>/<container>/`).
    pub pod_logs: PathBuf,
    /// The kubelet's links to its containers' logs (`<dir>/<pod>_<namespace>_<container>-<id>.log`).
    pub container_logs: PathBuf,
}

impl Default for Roots {
    fn default() -> Roots {
        Roots {
            containerd: vec![
                "/run/containerd/io.containerd.runtime.v2.task".into(),
                "/run/k3s/containerd/io.containerd.runtime.v2.task".into(),
            ],
            storage: vec![
                "/run/containers/storage".into(),
                "/var/lib/containers/storage".into(),
            ],
            docker: vec!["/var/lib/docker".into()],
            kubelet: "/var/lib/kubelet".into(),
            pod_logs: "/var/log/pods".into(),
            container_logs: "/var/log/containers".into(),
        }
    }
}

/// Where each fact gpuloop reads is among a bundle's annotations (or docker's labels): the
/// CRI's key (containerd), then CRI-O's and podman's.
const POD_UID: [&str; 2] = ["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"];
const POD_NAMESPACE: [&str; 2] = [
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
];
const POD_NAME: [&str; 2] = ["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"];
const NAME_IN_POD: [&str; 2] = [
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
];
/// nerdctl's name for a container of containerd's.
const NERDCTL_NAME: &str = "nerdctl/name";
/// `libpod` marks podman's containers among containers/storage's.
const MANAGER: &str = "io.container.manager";
/// All of them: what is kept of a bundle's annotations.
const KEYS: [&str; 10] = [
    POD_UID[0],
    POD_UID[1],
    POD_NAMESPACE[0],
    POD_NAMESPACE[1],
    POD_NAME[0],
    POD_NAME[1],
    NAME_IN_POD[0],
    NAME_IN_POD[1],
    NERDCTL_NAME,
    MANAGER,
];

/// The keys gpuloop reads, of a bundle's annotations or docker's labels.
fn kept(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter()
        .filter(|(k, _)| KEYS.contains(&k.as_str()))
        .collect()
}

/// An OCI bundle's `config.json`, as far as gpuloop reads it.
#[derive(Debug, Default, Deserialize)]
struct Bundle {
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
}

/// A bundle's annotations. A `config.json` is the whole OCI spec (11 KiB for a bare podman
/// container, more with mounts and seccomp), of which gpuloop needs one object: that object
/// is parsed alone where its key is found, and the whole document only where it is not
/// (then without annotations, or another shape than the runtimes write).
fn annotations(bytes: &[u8]) -> HashMap<String, String> {
    const KEY: &[u8] = b"\"annotations\"";
    for at in memchr::memmem::find_iter(bytes, KEY) {
        let rest = bytes[at + KEY.len()..].trim_ascii_start();
        let Some(value) = rest.strip_prefix(b":") else {
            continue;
        };
        let mut one = serde_json::Deserializer::from_slice(value).into_iter();
        if let Some(Ok(map)) = one.next() {
            return map;
        }
    }
    serde_json::from_slice::<Bundle>(bytes)
        .ok()
        .and_then(|b| b.annotations)
        .unwrap_or_default()
}

/// docker's `config.v2.json`, as far as gpuloop reads it.
#[derive(Debug, Default, Deserialize)]
struct DockerConfig {
    #[serde(rename = "Name", default)]
    name: Option<String>,
    #[serde(rename = "Config", default)]
    config: Option<DockerInner>,
}

#[derive(Debug, Default, Deserialize)]
struct DockerInner {
    #[serde(rename = "Labels", default)]
    labels: Option<HashMap<String, String>>,
}

/// One entry of containers/storage's `containers.json`.
#[derive(Debug, Deserialize)]
struct Stored {
    id: String,
    #[serde(default)]
    names: Option<Vec<String>>,
}

/// What a bundle's `config.json` says.
fn bundle(bytes: &[u8]) -> Said {
    Said::Annotations {
        keys: kept(annotations(bytes)),
    }
}

/// What docker's `config.v2.json` says.
fn docker_config(bytes: &[u8]) -> Said {
    let c: DockerConfig = serde_json::from_slice(bytes).unwrap_or_default();
    Said::Docker {
        name: c.name.map(|n| n.trim_start_matches('/').to_string()),
        labels: kept(c.config.and_then(|c| c.labels).unwrap_or_default()),
    }
}

/// What containers/storage's `containers.json` says: each container's first name.
fn stored(bytes: &[u8]) -> Said {
    Said::Names {
        names: serde_json::from_slice::<Vec<Stored>>(bytes)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| Some((c.id, c.names?.into_iter().next()?)))
            .collect(),
    }
}

/// A container's state found on disk.
struct Found {
    runtime: Runtime,
    /// The bundle's annotations, or docker's labels, that gpuloop reads.
    keys: BTreeMap<String, String>,
    name: Option<String>,
}

/// The first of `keys` that `map` has, not empty.
fn first(map: &BTreeMap<String, String>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| map.get(*k).filter(|v| !v.is_empty()).cloned())
}

/// The directories in `dir` (none when it is not there).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// The entries of one of the kubelet's directories (name, and whether a directory), where
/// it is trusted: the directory itself (no link followed), owned by root or by the user
/// gpuloop runs as, and writable by no one else. The names read there pick what a `--pod`
/// scope signals, and the log directories sit under `/var/log`, which some systems let a
/// group write (Ubuntu's `syslog`): a directory another user could have made or filled names
/// nothing. `None` where it is not there or not trusted.
fn kubelet_entries(dir: &Path) -> Option<Vec<(String, bool)>> {
    use rustix::fs::{FileType, Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::open(dir, flags, Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    let me = rustix::process::geteuid().as_raw();
    if (st.st_uid != 0 && st.st_uid != me) || st.st_mode & 0o022 != 0 {
        tracing::debug!(
            "{}: owned by uid {} with mode {:04o}, not root's or this user's alone: it names no pod",
            dir.display(),
            st.st_uid,
            st.st_mode & 0o7777
        );
        return None;
    }
    let entries = rustix::fs::Dir::read_from(&fd).ok()?;
    Some(
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_str().ok()?;
                let dir = matches!(e.file_type(), FileType::Directory | FileType::Unknown);
                (name != "." && name != "..").then(|| (name.to_string(), dir))
            })
            .collect(),
    )
}

/// A pod as its log directory names it: (namespace, name, the containers it logged).
type Logged = (String, String, Vec<String>);

/// A container the kubelet started, as the link to its log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Linked {
    pod: String,
    namespace: String,
    container: String,
}

impl Linked {
    /// `<pod>_<namespace>_<container>-<id>.log` (no name of a pod, namespace or container has
    /// a '_'): the container's id and its pod. A name the kubelet cut at 255 bytes (the id's
    /// end gone) names nothing.
    fn parse(name: &str) -> Option<(String, Linked)> {
        let base = name.strip_suffix(".log")?;
        let (names, id) = base.rsplit_once('-')?;
        if !is_full_id(id) {
            return None;
        }
        let mut parts = names.splitn(3, '_');
        let (pod, namespace, container) = (parts.next()?, parts.next()?, parts.next()?);
        if [pod, namespace, container].iter().any(|s| s.is_empty()) {
            return None;
        }
        let linked = Linked {
            pod: pod.into(),
            namespace: namespace.into(),
            container: container.into(),
        };
        Some((id.to_string(), linked))
    }
}

/// Resolves the places of the processes of one scan: each container's and pod's state is
/// read once (cached by what the cgroup said; what earlier runs read of it remembered, see
/// `runtime_state`), each runtime's directories listed once, and nothing at all is read for a
/// process outside any container. Shared by the scan's threads, each of which looks up
/// the places of the processes it finds.
pub(crate) struct Resolver<'a> {
    roots: &'a Roots,
    files: StateFiles,
    places: Mutex<HashMap<Ids, Place>>,
    /// containerd's `<root>/<namespace>` directories.
    namespaces: OnceLock<Vec<PathBuf>>,
    /// The namespace the last container was found in, looked in first next (Kubernetes'
    /// containers are all in one, k8s.io).
    namespace_hit: AtomicUsize,
    /// containers/storage's `<root>/<driver>-containers` directories.
    stores: OnceLock<Vec<PathBuf>>,
    /// The store the last container was found in, looked in first next (a node's containers
    /// are in one: podman's graph root, CRI-O's run root).
    store_hit: AtomicUsize,
    /// containers/storage's names, by id.
    names: OnceLock<HashMap<String, String>>,
    /// The kubelet's pod log directories, by pod uid.
    logged: OnceLock<HashMap<String, Logged>>,
    /// The containers the kubelet started, by id, as their log links name them.
    linked: OnceLock<HashMap<String, Linked>>,
    /// The pod uids the kubelet knows (`<root>/pods/<uid>`), listed once; `None` where its
    /// `pods` directory cannot be listed (no pod can then be told deleted).
    known_pods: OnceLock<Option<HashSet<String>>>,
    /// Some root of containerd's, containers/storage's, docker's state is there.
    there: [OnceLock<bool>; 3],
    /// The time the threads that looked spent on the runtimes' and the kubelet's state (for
    /// -v and the benches), in µs.
    spent_us: AtomicU64,
    /// How many containers the kubelet's log links named.
    linked_n: AtomicUsize,
    /// A process in a container has been looked up.
    met: AtomicBool,
}

/// What one scan's resolver did, for -v and the benches.
pub(crate) struct Resolved {
    /// Places resolved (each once).
    pub places: usize,
    /// Of which the kubelet's log links named.
    pub linked: usize,
    /// The runtimes' state files read (not taken from memory).
    pub read: usize,
    /// The time the scan's threads spent on them.
    pub spent: std::time::Duration,
}

impl<'a> Resolver<'a> {
    /// Reads the runtimes' state files, and remembers none of them.
    #[cfg(test)]
    pub(crate) fn new(roots: &'a Roots) -> Resolver<'a> {
        Resolver::with_files(roots, StateFiles::default())
    }

    /// Takes what earlier runs read of the runtimes' state files from what they remembered in
    /// gpuloop's state directory, while it still holds (a bundle while its container is
    /// listed, another file while it is unchanged); [`Resolver::keep`] remembers what this one
    /// reads.
    pub(crate) fn remembering(roots: &'a Roots) -> Resolver<'a> {
        Resolver::with_files(roots, StateFiles::remembered())
    }

    fn with_files(roots: &'a Roots, files: StateFiles) -> Resolver<'a> {
        Resolver {
            roots,
            files,
            places: Mutex::default(),
            namespaces: OnceLock::new(),
            namespace_hit: AtomicUsize::new(0),
            stores: OnceLock::new(),
            store_hit: AtomicUsize::new(0),
            names: OnceLock::new(),
            logged: OnceLock::new(),
            linked: OnceLock::new(),
            known_pods: OnceLock::new(),
            there: Default::default(),
            spent_us: AtomicU64::new(0),
            linked_n: AtomicUsize::new(0),
            met: AtomicBool::new(false),
        }
    }

    /// Loads what earlier runs remembered, where they remembered anything, once the scan has
    /// met a process in a container: for a thread that would otherwise wait while the scan's
    /// threads look for the containers' processes. Where the scan has met none yet, nothing
    /// is read (a node without containers reads nothing): the first lookup that needs the
    /// memory loads it then.
    pub(crate) fn prepare(&self) {
        if self.met.load(Ordering::Relaxed) {
            self.files.prepare();
        }
    }

    /// Remembers the runtimes' state files this scan read, for the next runs.
    pub(crate) fn keep(&self) {
        self.files.keep();
    }

    /// How many places were resolved (each read once), how, and the time that took.
    pub(crate) fn resolved(&self) -> Resolved {
        Resolved {
            places: self.places.lock().map_or(0, |p| p.len()),
            linked: self.linked_n.load(Ordering::Relaxed),
            read: self.files.reads(),
            spent: std::time::Duration::from_micros(self.spent_us.load(Ordering::Relaxed)),
        }
    }

    /// The place a cgroup path's ids stand for; empty ids read nothing.
    pub(crate) fn place(&self, ids: &Ids) -> Place {
        if ids.is_empty() {
            return Place::default();
        }
        self.met.store(true, Ordering::Relaxed);
        if let Some(p) = self.places.lock().ok().and_then(|m| m.get(ids).cloned()) {
            return p;
        }
        // Read without the lock held: two threads that meet one container both read it, alike.
        // Timed by the clock the vDSO reads (a thread's CPU clock would cost two system calls
        // per container).
        let t = std::time::Instant::now();
        let p = self.resolve(ids);
        self.spent_us
            .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
        if let Ok(mut m) = self.places.lock() {
            m.entry(ids.clone()).or_insert_with(|| p.clone());
        }
        p
    }

    fn resolve(&self, ids: &Ids) -> Place {
        // A container of a pod (its cgroup says which) that the kubelet links the log of is
        // named by that link: its bundle is not read, only looked for in the runtime's
        // listing.
        let linked = match (&ids.id, &ids.pod_uid) {
            (Some(id), Some(_)) => self.linked().get(id),
            _ => None,
        };
        if linked.is_some() {
            self.linked_n.fetch_add(1, Ordering::Relaxed);
        }
        let (found, known) = match &ids.id {
            Some(id) => self.find(ids.runtime, id, linked.is_none()),
            None => (None, false),
        };
        let keys = found.as_ref().map(|f| &f.keys);
        let get = |names: &[&str]| keys.and_then(|k| first(k, names));
        let uid = ids.pod_uid.clone().or_else(|| get(&POD_UID));
        let (namespace, name, in_pod) = match linked {
            Some(l) => (
                Some(l.namespace.clone()),
                Some(l.pod.clone()),
                Some(l.container.clone()),
            ),
            None => (get(&POD_NAMESPACE), get(&POD_NAME), get(&NAME_IN_POD)),
        };
        let pod = (uid.is_some() || name.is_some()).then(|| self.pod(uid, namespace, name, in_pod));
        Place {
            container: ids.id.clone(),
            container_name: found.as_ref().and_then(|f| f.name.clone()),
            runtime: found.as_ref().map(|f| f.runtime).or(ids.runtime),
            // Only where the runtime is known and its state is there to look in: a runtime
            // of another root, or a node whose state is not mounted, tells nothing.
            container_deleted: found.is_none() && known,
            pod,
        }
    }

    /// The pod, completed from the kubelet's log directory where the runtime's state did not
    /// name it, and told deleted when the kubelet no longer knows its uid.
    fn pod(
        &self,
        uid: Option<String>,
        mut namespace: Option<String>,
        mut name: Option<String>,
        mut container: Option<String>,
    ) -> Pod {
        if let Some(u) = &uid {
            if name.is_none() || namespace.is_none() || container.is_none() {
                if let Some((ns, n, logged)) = self.logged().get(u) {
                    namespace = namespace.or_else(|| Some(ns.clone()));
                    name = name.or_else(|| Some(n.clone()));
                    // Only a pod of one container says which one this is.
                    if let [one] = logged.as_slice() {
                        container = container.or_else(|| Some(one.clone()));
                    }
                }
            }
        }
        let deleted = match (&uid, self.known_pods()) {
            (Some(u), Some(known)) => !known.contains(u),
            _ => false,
        };
        Pod {
            namespace,
            name,
            uid,
            container,
            deleted,
        }
    }

    fn known_pods(&self) -> Option<&HashSet<String>> {
        self.known_pods
            .get_or_init(|| {
                let pods = kubelet_entries(&self.roots.kubelet.join("pods"))?;
                Some(pods.into_iter().map(|(name, _)| name).collect())
            })
            .as_ref()
    }

    fn logged(&self) -> &HashMap<String, Logged> {
        let dir = &self.roots.pod_logs;
        self.logged.get_or_init(|| {
            kubelet_entries(dir)
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, is_dir)| *is_dir)
                .filter_map(|(base, _)| {
                    // `<namespace>_<name>_<uid>`: neither a namespace nor a pod name has a '_'.
                    let mut parts = base.splitn(3, '_');
                    let (ns, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
                    let containers = subdirs(&dir.join(&base))
                        .iter()
                        .filter_map(|c| Some(c.file_name()?.to_str()?.to_string()))
                        .collect();
                    Some((
                        uid.to_string(),
                        (ns.to_string(), name.to_string(), containers),
                    ))
                })
                .collect()
        })
    }

    fn linked(&self) -> &HashMap<String, Linked> {
        self.linked.get_or_init(|| {
            kubelet_entries(&self.roots.container_logs)
                .unwrap_or_default()
                .iter()
                .filter_map(|(name, _)| Linked::parse(name))
                .collect()
        })
    }

    /// The container's state on disk, and whether the runtime's state was there to look in
    /// (a root of the runtime the cgroup named exists). A bundle is read only where
    /// `read_bundle`: else the runtime's listing alone says the container is there.
    fn find(&self, runtime: Option<Runtime>, id: &str, read_bundle: bool) -> (Option<Found>, bool) {
        let mut known = false;
        let order: &[Runtime] = match runtime {
            Some(Runtime::Containerd) => &[Runtime::Containerd],
            Some(Runtime::CriO) | Some(Runtime::Podman) => &[Runtime::CriO],
            Some(Runtime::Docker) => &[Runtime::Docker],
            None => &[Runtime::Containerd, Runtime::CriO, Runtime::Docker],
        };
        for rt in order {
            let (found, there) = match rt {
                Runtime::Containerd => self.containerd(id, read_bundle),
                Runtime::Docker => self.docker(id),
                _ => self.storage(id, runtime, read_bundle),
            };
            known |= there;
            if found.is_some() {
                return (found, true);
            }
        }
        (None, known && runtime.is_some())
    }

    /// Whether a root of runtime state `k` (0 containerd, 1 containers/storage, 2 docker)
    /// is there, looked at once.
    fn there(&self, k: usize) -> bool {
        let roots = self.roots;
        *self.there[k].get_or_init(|| match k {
            0 => roots.containerd.iter().any(|r| r.is_dir()),
            1 => roots.storage.iter().any(|r| r.is_dir()),
            _ => roots.docker.iter().any(|r| r.join("containers").is_dir()),
        })
    }

    fn containerd(&self, id: &str, read_bundle: bool) -> (Option<Found>, bool) {
        let there = self.there(0);
        let roots = &self.roots.containerd;
        let namespaces = self
            .namespaces
            .get_or_init(|| roots.iter().flat_map(|r| subdirs(r)).collect());
        let found = hit_first(namespaces, &self.namespace_hit, |ns| {
            self.annotations(ns, id, "config.json", read_bundle)
        });
        let Some(keys) = found else {
            return (None, there);
        };
        let found = Found {
            runtime: Runtime::Containerd,
            name: first(&keys, &[NERDCTL_NAME]),
            keys,
        };
        (Some(found), there)
    }

    fn storage(
        &self,
        id: &str,
        runtime: Option<Runtime>,
        read_bundle: bool,
    ) -> (Option<Found>, bool) {
        let there = self.there(1);
        let roots = &self.roots.storage;
        let stores = self.stores.get_or_init(|| {
            roots
                .iter()
                .flat_map(|r| subdirs(r))
                .filter(|d| {
                    d.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.ends_with("-containers"))
                })
                .collect()
        });
        let found = hit_first(stores, &self.store_hit, |s| {
            self.annotations(s, id, "userdata/config.json", read_bundle)
        });
        let Some(keys) = found else {
            return (None, there);
        };
        // Without the bundle read, as the cgroup named it (`libpod-`), else CRI-O's: the
        // kubelet starts no podman container.
        let runtime = match keys.get(MANAGER).map(String::as_str) {
            Some("libpod") => Runtime::Podman,
            Some(_) => Runtime::CriO,
            None if runtime == Some(Runtime::Podman) => Runtime::Podman,
            None => Runtime::CriO,
        };
        let name = self.stored_names().get(id).cloned();
        (
            Some(Found {
                runtime,
                keys,
                name,
            }),
            true,
        )
    }

    /// The annotations gpuloop reads of the bundle `<dir>/<id>/<rel>`, where the runtime lists
    /// the container in `dir`; none, and the bundle not read, unless `read`.
    fn annotations(
        &self,
        dir: &Path,
        id: &str,
        rel: &str,
        read_bundle: bool,
    ) -> Option<BTreeMap<String, String>> {
        if !read_bundle {
            return self.files.lists(dir, id).then(BTreeMap::new);
        }
        match self.files.bundle(dir, id, rel, bundle)? {
            Said::Annotations { keys } => Some(keys),
            _ => None,
        }
    }

    /// Every container's name that containers/storage keeps, read once.
    fn stored_names(&self) -> &HashMap<String, String> {
        self.names.get_or_init(|| {
            let stores = self.stores.get().map_or(&[][..], Vec::as_slice);
            stores
                .iter()
                .filter_map(
                    |s| match self.files.said(&s.join("containers.json"), stored)? {
                        Said::Names { names } => Some(names),
                        _ => None,
                    },
                )
                .flatten()
                .collect()
        })
    }

    fn docker(&self, id: &str) -> (Option<Found>, bool) {
        let there = self.there(2);
        let roots = &self.roots.docker;
        let found = roots.iter().find_map(|r| {
            let path = r.join("containers").join(id).join("config.v2.json");
            match self.files.said(&path, docker_config)? {
                Said::Docker { name, labels } => Some(Found {
                    runtime: Runtime::Docker,
                    name,
                    keys: labels,
                }),
                _ => None,
            }
        });
        (found, there)
    }
}

/// The first of `dirs` where `look` finds something, looking first in the one `hit` says the
/// last thing was found in (then in their order); `hit` is set to where this one was.
fn hit_first<T>(
    dirs: &[PathBuf],
    hit: &AtomicUsize,
    look: impl Fn(&Path) -> Option<T>,
) -> Option<T> {
    let first = hit
        .load(Ordering::Relaxed)
        .min(dirs.len().saturating_sub(1));
    let order = std::iter::once(first).chain((0..dirs.len()).filter(|&i| i != first));
    for i in order {
        if let Some(found) = dirs.get(i).and_then(|d| look(d)) {
            hit.store(i, Ordering::Relaxed);
            return Some(found);
        }
    }
    None
}

/// A pod or a container as a person named it (`--pod`, `--container`, a script's or an MCP
/// tool's `pod`/`container`), resolved on the machine whose processes it picks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Within {
    /// The uids of the pods picked (`None`: any pod or none).
    pub pods: Option<BTreeSet<String>>,
    /// The ids of the containers picked (`None`: any container or none).
    pub containers: Option<BTreeSet<String>>,
    /// How the caller named it ("--pod ml/trainer-0"), for the reason a process outside it
    /// is left alone.
    pub said: String,
}

impl Within {
    /// Whether a process of these ids (its cgroup's) is inside: in one of the pods and one of
    /// the containers picked.
    pub(crate) fn holds(&self, ids: &Ids) -> bool {
        let pod_ok = self
            .pods
            .as_ref()
            .is_none_or(|ps| ids.pod_uid.as_ref().is_some_and(|u| ps.contains(u)));
        let ctr_ok = self
            .containers
            .as_ref()
            .is_none_or(|cs| ids.id.as_ref().is_some_and(|c| cs.contains(c)));
        pod_ok && ctr_ok
    }

    /// Whether a place (a holder's) is inside.
    pub fn holds_place(&self, p: &Place) -> bool {
        let pod_ok = self.pods.as_ref().is_none_or(|ps| {
            p.pod
                .as_ref()
                .and_then(|p| p.uid.as_ref())
                .is_some_and(|u| ps.contains(u))
        });
        let ctr_ok = self
            .containers
            .as_ref()
            .is_none_or(|cs| p.container.as_ref().is_some_and(|c| cs.contains(c)));
        pod_ok && ctr_ok
    }

    /// Why a process whose cgroup reads `cgroup` is outside, if it is: "in no pod, outside
    /// --pod ml/trainer-0". A process whose cgroup cannot be read is outside.
    pub(crate) fn excludes(&self, cgroup: std::io::Result<Vec<u8>>) -> Option<String> {
        let text = match cgroup {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => return Some(format!("cgroup unreadable ({e}), outside {}", self.said)),
        };
        let ids = super::origin::parse_cgroup(&text).ids;
        if self.holds(&ids) {
            return None;
        }
        let where_ = match (&ids.pod_uid, &ids.id) {
            (Some(u), _) if self.pods.is_some() => format!("in pod uid {}", short(u, 8)),
            (_, Some(c)) => format!("in container {}", short(c, 12)),
            (Some(u), None) => format!("in pod uid {}", short(u, 8)),
            (None, None) => "in no container".into(),
        };
        Some(format!("{where_}, outside {}", self.said))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
    const UID: &str = "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d";

    fn ids(runtime: Option<Runtime>, id: Option<&str>, uid: Option<&str>) -> Ids {
        Ids {
            runtime,
            id: id.map(str::to_string),
            pod_uid: uid.map(str::to_string),
        }
    }

    #[test]
    fn every_cgroup_shape_the_runtimes_make() {
        let uid_ = UID.replace('-', "_");
        let cases = [
            // systemd driver, cgroup v2 and v1 alike
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"),
                ids(Some(Runtime::Containerd), Some(ID), Some(UID)),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope"),
                ids(Some(Runtime::CriO), Some(ID), Some(UID)),
            ),
            (
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/docker-{ID}.scope"),
                ids(Some(Runtime::Docker), Some(ID), Some(UID)),
            ),
            // cgroupfs driver: a bare id under the pod, the runtime unknown
            (
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                ids(None, Some(ID), Some(UID)),
            ),
            (format!("/kubepods/pod{UID}/{ID}"), ids(None, Some(ID), Some(UID))),
            // CRI-O's and podman's cgroupfs names keep their prefix
            (
                format!("/kubepods/besteffort/pod{UID}/crio-{ID}"),
                ids(Some(Runtime::CriO), Some(ID), Some(UID)),
            ),
            (
                format!("/kubepods/burstable/pod{UID}/libpod-{ID}"),
                ids(Some(Runtime::Podman), Some(ID), Some(UID)),
            ),
            // no Kubernetes
            (format!("/system.slice/docker-{ID}.scope"), ids(Some(Runtime::Docker), Some(ID), None)),
            (format!("/docker/{ID}"), ids(Some(Runtime::Docker), Some(ID), None)),
            (format!("/machine.slice/libpod-{ID}.scope"), ids(Some(Runtime::Podman), Some(ID), None)),
            (format!("/libpod_parent/libpod-{ID}"), ids(Some(Runtime::Podman), Some(ID), None)),
            (format!("/system.slice/crio-{ID}.scope"), ids(Some(Runtime::CriO), Some(ID), None)),
            // k3s-in-docker and kind nest the kubelet's slices under another
            (
                format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"),
                ids(Some(Runtime::Containerd), Some(ID), Some(UID)),
            ),
            // a static pod's uid is 32 hex digits
            (
                format!("/kubepods/burstable/pod0123456789abcdef0123456789abcdef/{ID}"),
                ids(None, Some(ID), Some("0123456789abcdef0123456789abcdef")),
            ),
            // a pod's own cgroup (its pause process with the systemd driver's conmon)
            (format!("/kubepods/burstable/pod{UID}"), ids(None, None, Some(UID))),
        ];
        for (path, want) in cases {
            assert_eq!(ids_of(&path), want, "{path}");
        }
    }

    #[test]
    fn what_is_no_container() {
        for path in [
            "/system.slice/sshd.service",
            "/user.slice/user-1000.slice/session-3.scope",
            "/process_api/c5d40451cb45e9265f9f7dcbf3b931b2",
            // conmon's own scopes are not the container
            &format!("/machine.slice/libpod-conmon-{ID}.scope"),
            &format!("/system.slice/crio-conmon-{ID}.scope"),
            // a short hex name under a pod is no container id, nor a pod without kubepods
            &format!("/kubepods/burstable/pod{UID}/deadbeef"),
            &format!("/pods/pod{UID}"),
        ] {
            let got = ids_of(path);
            assert!(got.id.is_none(), "{path}: {got:?}");
        }
        assert_eq!(
            ids_of(&format!("/kubepods/burstable/pod{UID}/deadbeef"))
                .pod_uid
                .as_deref(),
            Some(UID)
        );
        assert!(ids_of(&format!("/pods/pod{UID}")).is_empty());
    }

    /// A node's state directories, as the runtimes and the kubelet lay them out.
    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new() -> Node {
            Node {
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn roots(&self) -> Roots {
            let d = self.dir.path();
            Roots {
                containerd: vec![d.join("run/containerd/io.containerd.runtime.v2.task")],
                storage: vec![
                    d.join("run/containers/storage"),
                    d.join("var/lib/containers/storage"),
                ],
                docker: vec![d.join("var/lib/docker")],
                kubelet: d.join("var/lib/kubelet"),
                pod_logs: d.join("var/log/pods"),
                container_logs: d.join("var/log/containers"),
            }
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        fn mkdir(&self, rel: &str) {
            std::fs::create_dir_all(self.dir.path().join(rel)).unwrap();
        }
    }

    #[test]
    fn containerd_task_bundles_name_the_pod() {
        let node = Node::new();
        node.write(
            &format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json"),
            &serde_json::json!({
                "ociVersion": "1.1.0",
                "annotations": {
                    "io.kubernetes.cri.container-type": "container",
                    "io.kubernetes.cri.container-name": "trainer",
                    "io.kubernetes.cri.sandbox-id": "9".repeat(64),
                    "io.kubernetes.cri.sandbox-name": "trainer-0",
                    "io.kubernetes.cri.sandbox-namespace": "ml",
                    "io.kubernetes.cri.sandbox-uid": UID,
                }
            })
            .to_string(),
        );
        node.mkdir(&format!("var/lib/kubelet/pods/{UID}"));
        let roots = node.roots();
        let r = Resolver::new(&roots);
        // The cgroupfs driver's bare id: the runtime is found by its state.
        let p = r.place(&ids_of(&format!("/kubepods/burstable/pod{UID}/{ID}")));
        assert_eq!(p.runtime, Some(Runtime::Containerd));
        assert_eq!(p.container.as_deref(), Some(ID));
        assert!(!p.container_deleted);
        let pod = p.pod.clone().unwrap();
        assert_eq!(
            (
                pod.namespace.as_deref(),
                pod.name.as_deref(),
                pod.uid.as_deref(),
                pod.container.as_deref(),
                pod.deleted
            ),
            (
                Some("ml"),
                Some("trainer-0"),
                Some(UID),
                Some("trainer"),
                false
            )
        );
        assert_eq!(p.describe().as_deref(), Some("pod ml/trainer-0"));
        // The kubelet forgets the pod: its processes are a deleted pod's (a new resolver, as a
        // new scan).
        std::fs::remove_dir(node.dir.path().join(format!("var/lib/kubelet/pods/{UID}"))).unwrap();
        let p = Resolver::new(&roots).place(&ids_of(&format!("/kubepods/burstable/pod{UID}/{ID}")));
        assert!(p.pod.as_ref().unwrap().deleted);
        assert_eq!(p.describe().as_deref(), Some("pod ml/trainer-0 (deleted)"));
        // The shim died and containerd removed the bundle: the runtime forgot the container.
        std::fs::remove_dir_all(node.dir.path().join(format!(
            "run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}"
        )))
        .unwrap();
        let p = Resolver::new(&roots).place(&ids_of(&format!(
            "/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        )));
        assert!(p.container_deleted && p.gone(), "{p:?}");
    }

    #[test]
    fn the_kubelets_log_links_name_its_containers_pods_without_their_bundles() {
        let node = Node::new();
        // containerd lists the container, but its bundle cannot be read (a directory where
        // config.json would be): only the kubelet's link can name the pod.
        node.mkdir(&format!(
            "run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json"
        ));
        node.mkdir(&format!("var/lib/kubelet/pods/{UID}"));
        let roots = node.roots();
        let cgroup = format!("/kubepods/besteffort/pod{UID}/{ID}");
        let p = Resolver::new(&roots).place(&ids_of(&cgroup));
        assert_eq!((p.runtime, p.container_deleted), (None, false));
        assert_eq!(p.describe().as_deref(), Some("pod uid 1a2b3c4d"));
        // The kubelet's link for it (a link to its pod's log, not followed), beside others:
        // a name cut at 255 bytes, and a file of another shape.
        let links = node.dir.path().join("var/log/containers");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            format!("/var/log/pods/ml_trainer-0_{UID}/trainer-main/0.log"),
            links.join(format!("trainer-0_ml_trainer-main-{ID}.log")),
        )
        .unwrap();
        node.write(
            &format!("var/log/containers/{}-{}.log", "x".repeat(180), &ID[..40]),
            "",
        );
        node.write("var/log/containers/README", "");
        let p = Resolver::new(&roots).place(&ids_of(&cgroup));
        let pod = p.pod.clone().unwrap();
        assert_eq!(
            (
                pod.label(),
                pod.uid.as_deref(),
                pod.container.as_deref(),
                pod.deleted
            ),
            (
                "ml/trainer-0".to_string(),
                Some(UID),
                Some("trainer-main"),
                false
            )
        );
        assert_eq!(p.runtime, Some(Runtime::Containerd));
        assert!(!p.container_deleted);
        // The runtime no longer lists it (the systemd driver's cgroup names the runtime): the
        // link names the pod, the container is gone.
        std::fs::remove_dir_all(node.dir.path().join(format!(
            "run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}"
        )))
        .unwrap();
        let p = Resolver::new(&roots).place(&ids_of(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        )));
        assert_eq!(
            p.describe().as_deref(),
            Some("pod ml/trainer-0 (container deleted)")
        );
        // A process in no pod is never named by a link, even one with its container's id.
        let p = Resolver::new(&roots).place(&ids_of(&format!("/docker/{ID}")));
        assert!(p.pod.is_none(), "{p:?}");
    }

    #[test]
    fn the_kubelets_directories_name_nothing_another_user_could_write() {
        use std::os::unix::fs::PermissionsExt;
        let node = Node::new();
        node.mkdir(&format!("var/log/pods/ml_trainer-0_{UID}/trainer"));
        node.mkdir("var/log/containers");
        node.mkdir(&format!("var/lib/kubelet/pods/{UID}"));
        let d = node.dir.path();
        std::os::unix::fs::symlink(
            format!("/var/log/pods/ml_trainer-0_{UID}/trainer/0.log"),
            d.join(format!("var/log/containers/trainer-0_ml_trainer-{ID}.log")),
        )
        .unwrap();
        let roots = node.roots();
        let cgroup = ids_of(&format!("/kubepods/burstable/pod{UID}/{ID}"));
        let named = || Resolver::new(&roots).place(&cgroup).describe().unwrap();
        let chmod = |rel: &str, mode: u32| {
            std::fs::set_permissions(d.join(rel), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        assert_eq!(named(), "pod ml/trainer-0");
        // The links' directory writable by its group: only the pod log directory names it.
        chmod("var/log/containers", 0o775);
        assert_eq!(named(), "pod ml/trainer-0");
        // Both writable by others: nothing names the pod; the kubelet's pods directory, too,
        // then tells no pod deleted.
        chmod("var/log/pods", 0o777);
        assert_eq!(named(), "pod uid 1a2b3c4d");
        std::fs::remove_dir(d.join(format!("var/lib/kubelet/pods/{UID}"))).unwrap();
        assert_eq!(named(), "pod uid 1a2b3c4d (deleted)");
        chmod("var/lib/kubelet/pods", 0o757);
        assert_eq!(named(), "pod uid 1a2b3c4d");
        // Back to the kubelet's own modes: named again.
        for dir in ["var/log/containers", "var/log/pods", "var/lib/kubelet/pods"] {
            chmod(dir, 0o755);
        }
        assert_eq!(named(), "pod ml/trainer-0 (deleted)");
        // Owned by another user (as root can make it): named by nothing.
        if rustix::process::geteuid().is_root() {
            let nobody = Some(rustix::process::Uid::from_raw(65534));
            for dir in ["var/log/containers", "var/log/pods"] {
                rustix::fs::chown(d.join(dir), nobody, None).unwrap();
            }
            assert_eq!(named(), "pod uid 1a2b3c4d (deleted)");
        }
    }

    #[test]
    fn a_log_link_is_read_as_the_kubelet_names_it() {
        let id = "c".repeat(64);
        let (got, l) = Linked::parse(&format!("vllm-7f9c-0_ml-prod_engine-core-{id}.log")).unwrap();
        assert_eq!(got, id);
        assert_eq!(
            (l.pod.as_str(), l.namespace.as_str(), l.container.as_str()),
            ("vllm-7f9c-0", "ml-prod", "engine-core")
        );
        for bad in [
            format!("p_ns_c-{id}"),
            format!("p_ns_c-{}.log", &id[..63]),
            format!("p_ns-{id}.log"),
            format!("p__c-{id}.log"),
            format!("p_ns_-{id}.log"),
        ] {
            assert_eq!(Linked::parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn docker_config_v2_names_the_container_and_dockershim_pods() {
        let node = Node::new();
        node.write(
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            r#"{"ID":"4f3c","Name":"/vllm","State":{"Running":true,"Pid":1234},"Config":{"Image":"vllm/vllm-openai","Labels":null}}"#,
        );
        let roots = node.roots();
        let p = Resolver::new(&roots).place(&ids_of(&format!("/system.slice/docker-{ID}.scope")));
        assert_eq!(
            (
                p.runtime,
                p.container_name.as_deref(),
                p.pod.is_none(),
                p.container_deleted
            ),
            (Some(Runtime::Docker), Some("vllm"), true, false)
        );
        assert_eq!(p.describe().as_deref(), Some("container vllm"));
        node.write(
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            &serde_json::json!({
                "Name": "/k8s_trainer_trainer-0_ml_uid_0",
                "Config": {"Labels": {
                    "io.kubernetes.pod.name": "trainer-0",
                    "io.kubernetes.pod.namespace": "ml",
                    "io.kubernetes.pod.uid": UID,
                    "io.kubernetes.container.name": "trainer"
                }}
            })
            .to_string(),
        );
        let p =
            Resolver::new(&roots).place(&ids_of(&format!("/kubepods/besteffort/pod{UID}/{ID}")));
        assert_eq!(p.runtime, Some(Runtime::Docker));
        let pod = p.pod.unwrap();
        assert_eq!(
            (pod.label(), pod.container.as_deref()),
            ("ml/trainer-0".to_string(), Some("trainer"))
        );
        // No kubelet directory here: nothing is told deleted.
        assert!(!pod.deleted);
    }

    #[test]
    fn cri_o_and_podman_in_containers_storage() {
        let node = Node::new();
        let annotations = |manager: Option<&str>| {
            let mut a = serde_json::json!({
                "io.kubernetes.pod.name": "infer-1",
                "io.kubernetes.pod.namespace": "serving",
                "io.kubernetes.pod.uid": UID,
                "io.kubernetes.container.name": "server",
            });
            if let Some(m) = manager {
                a["io.container.manager"] = m.into();
            }
            serde_json::json!({ "annotations": a }).to_string()
        };
        node.write(
            &format!("run/containers/storage/overlay-containers/{ID}/userdata/config.json"),
            &annotations(None),
        );
        node.write(
            "var/lib/containers/storage/overlay-containers/containers.json",
            &serde_json::json!([{"id": ID, "names": ["k8s_server_infer-1_serving_x_0"]}])
                .to_string(),
        );
        node.mkdir("var/lib/kubelet/pods");
        let roots = node.roots();
        let p = Resolver::new(&roots).place(&ids_of(&format!("/kubepods.slice/crio-{ID}.scope")));
        assert_eq!(p.runtime, Some(Runtime::CriO));
        assert_eq!(
            p.container_name.as_deref(),
            Some("k8s_server_infer-1_serving_x_0")
        );
        let pod = p.pod.clone().unwrap();
        assert_eq!(
            (pod.label(), pod.uid.as_deref()),
            ("serving/infer-1".to_string(), Some(UID))
        );
        // The kubelet's pods directory is there and has no such uid.
        assert!(pod.deleted);
        node.write(
            &format!("run/containers/storage/overlay-containers/{ID}/userdata/config.json"),
            &annotations(Some("libpod")),
        );
        let p = Resolver::new(&roots).place(&ids_of(&format!("/machine.slice/libpod-{ID}.scope")));
        assert_eq!(p.runtime, Some(Runtime::Podman));
    }

    #[test]
    fn the_kubelet_log_directory_names_a_pod_the_runtime_does_not() {
        let node = Node::new();
        node.mkdir(&format!("var/log/pods/ml_trainer-0_{UID}/trainer"));
        node.mkdir("var/lib/kubelet/pods");
        let roots = node.roots();
        let p = Resolver::new(&roots).place(&ids(None, None, Some(UID)));
        let pod = p.pod.unwrap();
        assert_eq!(
            (pod.label(), pod.container.as_deref(), pod.deleted),
            ("ml/trainer-0".to_string(), Some("trainer"), true)
        );
    }

    #[test]
    fn annotations_are_read_alone_or_from_the_whole_bundle() {
        let want = HashMap::from([("io.kubernetes.pod.name".to_string(), "p".to_string())]);
        // A string "annotations" before the key, and the key itself.
        let doc = br#"{"process":{"args":["annotations"],"env":["X=\"annotations\": 1"]},
            "annotations" : {"io.kubernetes.pod.name":"p"},"linux":{}}"#;
        assert_eq!(annotations(doc), want);
        // No annotations, a document of another shape, not JSON: nothing.
        assert!(annotations(br#"{"ociVersion":"1.1.0"}"#).is_empty());
        assert!(annotations(br#"{"annotations":null}"#).is_empty());
        assert!(annotations(b"not json").is_empty());
    }

    #[test]
    fn nothing_is_read_for_a_process_in_no_container() {
        // Roots that cannot be read at all: an empty place, and no error.
        let roots = Roots {
            containerd: vec!["/proc/self/mem".into()],
            storage: vec![],
            docker: vec![],
            kubelet: "/nonexistent".into(),
            pod_logs: "/nonexistent".into(),
            container_logs: "/nonexistent".into(),
        };
        let r = Resolver::new(&roots);
        assert_eq!(r.place(&Ids::default()), Place::default());
        assert!(
            r.namespaces.get().is_none()
                && r.logged.get().is_none()
                && r.linked.get().is_none()
                && r.known_pods.get().is_none()
        );
    }

    #[test]
    fn what_earlier_runs_remembered_is_loaded_only_once_a_container_is_met() {
        let node = Node::new();
        let roots = node.roots();
        let state = node.dir.path().join("state/gpuloop");
        // An earlier run remembered something.
        crate::journal::update_state(&state, "runtime-state.json", 1 << 20, |_| b"[]".to_vec())
            .unwrap();
        // A scan that met no container: prepared, and nothing read.
        let r = Resolver::with_files(&roots, StateFiles::in_dir(Some(state.clone())));
        assert_eq!(r.place(&Ids::default()), Place::default());
        r.prepare();
        assert!(!r.files.loaded());
        // One that met a container: prepared, the memory is loaded.
        r.place(&ids_of(&format!("/kubepods/burstable/pod{UID}/{ID}")));
        r.prepare();
        assert!(r.files.loaded());
    }

    #[test]
    fn a_signal_bound_reads_the_cgroup() {
        let w = Within {
            pods: Some(BTreeSet::from([UID.to_string()])),
            containers: None,
            said: "--pod ml/trainer-0".into(),
        };
        let inside = format!("0::/kubepods/burstable/pod{UID}/{ID}\n");
        assert_eq!(w.excludes(Ok(inside.into_bytes())), None);
        let outside = "0::/user.slice/user-1000.slice/session-3.scope\n".to_string();
        assert_eq!(
            w.excludes(Ok(outside.into_bytes())).as_deref(),
            Some("in no container, outside --pod ml/trainer-0")
        );
        let e = std::io::Error::new(std::io::ErrorKind::NotFound, "process is gone");
        assert!(w.excludes(Err(e)).unwrap().starts_with("cgroup unreadable"));
    }
}
