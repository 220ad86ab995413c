//! The container runtimes' state files as gpuloop reads them: each through the one bounded
//! reader, and what it said remembered between runs, beside the journal, for as long as that
//! still holds.
//!
//! A node's containers outlive many scans. A bundle's annotations (11 KiB of `config.json`
//! and more, for a few names) are written when its container is created and never change,
//! and a container's id is never reused: what a bundle said stands for as long as its runtime
//! lists the container, which one listing of the runtime's directory per scan tells. Other
//! state files can change (docker's `config.v2.json` on a rename, containers/storage's list
//! of names): what one said stands while the file is unchanged (same device, inode, size,
//! modification and change times), one `stat` instead of an open, a read and a parse. What
//! is remembered is trusted as far as the journal is: `runtime-state.json` is read and
//! written only in gpuloop's own state directory
//! and only while that directory and the file are this user's alone (owned by this user, not
//! writable by group or others, no link followed, no second hard link), so nobody else can
//! plant what a `--pod` or `--container` scope resolves names through. A file changed less
//! than a second before it was read is not remembered (a second write within the clock's
//! tick would leave its times as they were), as git treats a racily clean index entry.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The file it is kept in, in the journal's directory.
const FILE: &str = "runtime-state.json";
/// How much of that file is read at most.
const MAX_BYTES: u64 = 4 << 20;
/// How many state files it remembers; the latest read are kept.
const MAX_FILES: usize = 1024;

/// What one state file said, as far as gpuloop reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Said {
    /// An OCI bundle's annotations (containerd, CRI-O, podman): those gpuloop reads.
    Annotations { keys: BTreeMap<String, String> },
    /// docker's `config.v2.json`: the container's name, and the labels gpuloop reads.
    Docker {
        name: Option<String>,
        labels: BTreeMap<String, String>,
    },
    /// containers/storage's `containers.json`: each container's first name, by id.
    Names { names: BTreeMap<String, String> },
}

/// Which file, and which version of it: what any rewrite or replacement changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Version {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Version {
    fn of(m: &std::fs::Metadata) -> Version {
        Version {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Changed less than a second before `now`: another write may yet come within the same
    /// tick of the clock and leave these times as they are.
    fn settled(&self, now: std::time::SystemTime) -> bool {
        let now = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let (s, ns) = self.ctime;
        i128::from(s) * 1_000_000_000 + i128::from(ns) + 1_000_000_000 <= now
    }
}

/// One remembered state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    path: PathBuf,
    version: Version,
    said: Said,
    /// For a bundle: the runtime directory that lists its container, and the container's id
    /// there. The entry goes once a scan finds the container no longer listed.
    #[serde(default)]
    container: Option<(PathBuf, String)>,
}

/// The state files of one scan: what earlier runs remembered (loaded only once the scan has
/// met a container, so a node without containers reads nothing), and what this one read. The
/// default remembers nothing.
#[derive(Debug, Default)]
pub(crate) struct StateFiles {
    /// The state directory it is kept in; `None` remembers nothing (tests, no state directory).
    dir: Option<PathBuf>,
    remembered: OnceLock<HashMap<PathBuf, (Version, Said)>>,
    read: Mutex<Vec<Entry>>,
    /// The entries of each runtime state directory looked in (`None`: not there), listed once.
    listed: Mutex<HashMap<PathBuf, Option<HashSet<String>>>>,
    /// How many state files were read (not taken from memory).
    reads: AtomicUsize,
}

impl StateFiles {
    /// Remembers in gpuloop's state directory (the journal's), if there is one.
    pub(crate) fn remembered() -> StateFiles {
        StateFiles::in_dir(crate::journal::dir().ok())
    }

    pub(crate) fn in_dir(dir: Option<PathBuf>) -> StateFiles {
        StateFiles {
            dir,
            ..StateFiles::default()
        }
    }

    /// What the bundle `<dir>/<id>/<rel>` (a container's `config.json`) says: remembered for
    /// as long as its runtime lists the container in `dir`, else read and `parse`d. `None`
    /// when the runtime does not list it there.
    pub(crate) fn bundle(
        &self,
        dir: &Path,
        id: &str,
        rel: &str,
        parse: impl Fn(&[u8]) -> Said,
    ) -> Option<Said> {
        if !self.lists(dir, id) {
            return None;
        }
        let path = dir.join(id).join(rel);
        if let Some((_, said)) = self.memory().get(&path) {
            return Some(said.clone());
        }
        let container = (dir.to_path_buf(), id.to_string());
        self.read_and_keep(&path, parse, Some(container))
    }

    /// Whether `dir` has an entry `name`, from its listing (read once).
    pub(crate) fn lists(&self, dir: &Path, name: &str) -> bool {
        let Ok(mut listed) = self.listed.lock() else {
            return false;
        };
        if let Some(names) = listed.get(dir) {
            return names.as_ref().is_some_and(|n| n.contains(name));
        }
        let names: Option<HashSet<String>> = std::fs::read_dir(dir).ok().map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        });
        let there = names.as_ref().is_some_and(|n| n.contains(name));
        listed.insert(dir.to_path_buf(), names);
        there
    }

    /// What the state file at `path` says: remembered while it is the very version read
    /// before, else read and `parse`d. `None` when it is not there (or cannot be read:
    /// another runtime's, a file being rewritten).
    pub(crate) fn said(&self, path: &Path, parse: impl Fn(&[u8]) -> Said) -> Option<Said> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::debug!("container state {}: {e}", path.display());
                return None;
            }
        };
        if let Some((v, said)) = self.memory().get(path) {
            if *v == Version::of(&meta) {
                return Some(said.clone());
            }
        }
        self.read_and_keep(path, parse, None)
    }

    /// Reads and `parse`s the state file at `path`, and keeps what it said for the next runs
    /// unless it changed within the last second.
    fn read_and_keep(
        &self,
        path: &Path,
        parse: impl Fn(&[u8]) -> Said,
        container: Option<(PathBuf, String)>,
    ) -> Option<Said> {
        // The version is the one fstat saw before the read: what was read is of that version
        // or a later one, which the next stat tells apart.
        let (bytes, meta) = read(path)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let version = Version::of(&meta);
        let said = parse(&bytes);
        if self.dir.is_some() && version.settled(std::time::SystemTime::now()) {
            if let Ok(mut read) = self.read.lock() {
                read.push(Entry {
                    path: path.to_path_buf(),
                    version,
                    said: said.clone(),
                    container,
                });
            }
        }
        Some(said)
    }

    /// How many state files were read, not taken from memory.
    pub(crate) fn reads(&self) -> usize {
        self.reads.load(Ordering::Relaxed)
    }

    /// Loads what earlier runs remembered (nothing where they remembered nothing).
    pub(crate) fn prepare(&self) {
        self.memory();
    }

    /// Whether what earlier runs remembered has been loaded.
    #[cfg(test)]
    pub(crate) fn loaded(&self) -> bool {
        self.remembered.get().is_some()
    }

    fn memory(&self) -> &HashMap<PathBuf, (Version, Said)> {
        self.remembered.get_or_init(|| {
            let Some(dir) = &self.dir else {
                return HashMap::new();
            };
            let bytes = match crate::journal::read_state(dir, FILE, MAX_BYTES) {
                Ok(bytes) => bytes.unwrap_or_default(),
                Err(e) => {
                    tracing::debug!("runtime state not remembered: {e}");
                    Vec::new()
                }
            };
            entries(&bytes)
                .into_iter()
                .map(|e| (e.path, (e.version, e.said)))
                .collect()
        })
    }

    /// Keeps what this scan read for the next runs (nothing to write when it read nothing).
    /// A file that cannot be written costs the next run the reads, nothing more.
    pub(crate) fn keep(&self) {
        let (Some(dir), Ok(read), Ok(listed)) = (&self.dir, self.read.lock(), self.listed.lock())
        else {
            return;
        };
        if read.is_empty() {
            return;
        }
        let kept = crate::journal::update_state(dir, FILE, MAX_BYTES, |old| {
            serde_json::to_vec(&merged(entries(old), &read, &listed)).unwrap_or_default()
        });
        if let Err(e) = kept {
            tracing::debug!("runtime state not remembered: {e}");
        }
    }
}

/// The entries of the file's text; a damaged file remembers nothing.
fn entries(text: &[u8]) -> Vec<Entry> {
    if text.is_empty() {
        return Vec::new();
    }
    serde_json::from_slice(text).unwrap_or_default()
}

/// The entries remembered, with those just `read` in place of any of the same paths, less the
/// bundles of containers this scan found no longer `listed`, the [`MAX_FILES`] latest kept.
fn merged(
    mut all: Vec<Entry>,
    read: &[Entry],
    listed: &HashMap<PathBuf, Option<HashSet<String>>>,
) -> Vec<Entry> {
    let gone = |e: &Entry| {
        e.container.as_ref().is_some_and(|(dir, id)| {
            listed
                .get(dir)
                .is_some_and(|names| names.as_ref().is_none_or(|n| !n.contains(id)))
        })
    };
    all.retain(|e| !gone(e) && read.iter().all(|r| r.path != e.path));
    all.extend(read.iter().cloned());
    let over = all.len().saturating_sub(MAX_FILES);
    all.drain(..over);
    all
}

/// A runtime's state file, through the one bounded reader, and its version as fstat saw it
/// before the read.
fn read(path: &Path) -> Option<(Vec<u8>, std::fs::Metadata)> {
    match crate::input::file_as_of(path, crate::input::RUNTIME_STATE) {
        Ok(read) => Some(read),
        Err(crate::input::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::debug!("container state {}: {e}", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(name: &str) -> Said {
        Said::Annotations {
            keys: BTreeMap::from([("io.kubernetes.pod.name".to_string(), name.to_string())]),
        }
    }

    /// A bundle written more than a second ago, as a running container's is.
    fn settled_file(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }

    fn parse(bytes: &[u8]) -> Said {
        annotations(std::str::from_utf8(bytes).unwrap())
    }

    #[test]
    fn a_file_read_once_is_taken_from_memory_while_it_is_unchanged() {
        let top = tempfile::tempdir().unwrap();
        let state = top.path().join("state/gpuloop");
        let bundle = top.path().join("bundle/config.json");
        settled_file(&bundle, "trainer-0");
        let first = StateFiles::in_dir(Some(state.clone()));
        assert_eq!(first.said(&bundle, parse), Some(annotations("trainer-0")));
        first.keep();
        let mode = std::fs::metadata(state.join(FILE)).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
        // The next run: remembered, not read (a parse that would panic is never called).
        let next = StateFiles::in_dir(Some(state.clone()));
        assert_eq!(
            next.said(&bundle, |_| unreachable!("read again")),
            Some(annotations("trainer-0"))
        );
        assert!(next.read.lock().unwrap().is_empty());
        // Rewritten (a new size, new times): read again.
        std::fs::write(&bundle, "trainer-1").unwrap();
        let again = StateFiles::in_dir(Some(state.clone()));
        assert_eq!(again.said(&bundle, parse), Some(annotations("trainer-1")));
        // Changed this very second: read, and not remembered.
        assert!(again.read.lock().unwrap().is_empty());
        // Gone: nothing, whatever was remembered.
        std::fs::remove_file(&bundle).unwrap();
        assert_eq!(StateFiles::in_dir(Some(state)).said(&bundle, parse), None);
    }

    /// What is remembered is only ever this user's own: a memory that is a link, writable by
    /// others, or in a directory writable by others is not read (and not written), and the
    /// bundle itself is read.
    #[test]
    fn a_memory_someone_else_could_write_is_never_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let bundle = top.path().join("bundle/config.json");
        settled_file(&bundle, "trainer-0");
        let version = Version::of(&std::fs::metadata(&bundle).unwrap());
        // What a planter would write: the bundle's very version, said to be another pod's.
        let planted = serde_json::to_vec(&[Entry {
            path: bundle.clone(),
            version,
            said: annotations("victim"),
            container: None,
        }])
        .unwrap();
        let fresh = |name: &str| {
            let dir = top.path().join(name).join("gpuloop");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
            dir
        };
        let said = |dir: &Path| StateFiles::in_dir(Some(dir.to_path_buf())).said(&bundle, parse);
        // The control: this user's own file, 0600, is what is remembered.
        let own = fresh("own");
        std::fs::write(own.join(FILE), &planted).unwrap();
        std::fs::set_permissions(own.join(FILE), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(said(&own), Some(annotations("victim")));
        // Writable by others.
        let open = fresh("open");
        std::fs::write(open.join(FILE), &planted).unwrap();
        std::fs::set_permissions(open.join(FILE), std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(said(&open), Some(annotations("trainer-0")));
        // A link to a planted file.
        let linked = fresh("linked");
        std::os::unix::fs::symlink(own.join(FILE), linked.join(FILE)).unwrap();
        assert_eq!(said(&linked), Some(annotations("trainer-0")));
        // A second hard link (the planter keeps a name for it).
        let hard = fresh("hard");
        std::fs::hard_link(own.join(FILE), hard.join(FILE)).unwrap();
        assert_eq!(said(&hard), Some(annotations("trainer-0")));
        // A directory others can write to.
        let shared = fresh("shared");
        std::fs::write(shared.join(FILE), &planted).unwrap();
        std::fs::set_permissions(shared.join(FILE), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(said(&shared), Some(annotations("trainer-0")));
        // And none of them is written over by what was read.
        let files = StateFiles::in_dir(Some(open.clone()));
        files.said(&bundle, parse);
        files.keep();
        assert_eq!(std::fs::read(open.join(FILE)).unwrap(), planted);
    }

    /// A bundle's annotations never change while its container exists: remembered, it is not
    /// looked at again (not even a stat) while the runtime lists the container, and never
    /// once it does not.
    #[test]
    fn a_bundle_is_remembered_while_its_runtime_lists_the_container() {
        let top = tempfile::tempdir().unwrap();
        let state = top.path().join("state/gpuloop");
        let store = top.path().join("overlay-containers");
        let id = "4f3c2a1b0d9e";
        settled_file(&store.join(id).join("userdata/config.json"), "trainer-0");
        let first = StateFiles::in_dir(Some(state.clone()));
        let look = |files: &StateFiles, parse: &dyn Fn(&[u8]) -> Said| {
            files.bundle(&store, id, "userdata/config.json", parse)
        };
        assert_eq!(look(&first, &parse), Some(annotations("trainer-0")));
        // Another id in the same store is not there: nothing read, nothing said.
        assert_eq!(
            first.bundle(&store, "0123456789ab", "userdata/config.json", |_| {
                unreachable!("read")
            }),
            None
        );
        first.keep();
        let next = StateFiles::in_dir(Some(state.clone()));
        assert_eq!(
            look(&next, &|_| unreachable!("read again")),
            Some(annotations("trainer-0"))
        );
        // The runtime forgot the container: what was remembered of it says nothing, and goes
        // once a scan that lists the store keeps what it read of another container.
        std::fs::remove_dir_all(store.join(id)).unwrap();
        let other = "0123456789ab";
        settled_file(&store.join(other).join("userdata/config.json"), "infer");
        let gone = StateFiles::in_dir(Some(state.clone()));
        assert_eq!(look(&gone, &|_| unreachable!("read")), None);
        assert_eq!(
            gone.bundle(&store, other, "userdata/config.json", parse),
            Some(annotations("infer"))
        );
        gone.keep();
        let kept = std::fs::read_to_string(state.join(FILE)).unwrap();
        assert!(kept.contains(other) && !kept.contains(id), "{kept}");
    }

    #[test]
    fn the_latest_files_are_kept() {
        let entry = |i: usize| Entry {
            path: PathBuf::from(format!("/b/{i}")),
            version: Version {
                dev: 1,
                ino: i as u64,
                size: 1,
                mtime: (0, 0),
                ctime: (0, 0),
            },
            said: annotations(&i.to_string()),
            container: None,
        };
        let old: Vec<Entry> = (0..MAX_FILES).map(entry).collect();
        let mut again = entry(5);
        again.said = annotations("five");
        let all = merged(old, &[again, entry(MAX_FILES)], &HashMap::new());
        assert_eq!(all.len(), MAX_FILES);
        assert_eq!(all[0].path, PathBuf::from("/b/1"));
        assert_eq!(all[MAX_FILES - 2].said, annotations("five"));
        assert_eq!(
            all.iter().filter(|e| e.path == Path::new("/b/5")).count(),
            1
        );
        assert!(entries(b"not json").is_empty());
    }
}
