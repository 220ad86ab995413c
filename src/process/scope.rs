//! What a `--pod` or `--container` text picks among the places of this machine's GPU
//! processes: exactly one pod and one container, or an error that says why not and how to name
//! each candidate exactly.
//!
//! A name is something two objects can share: a StatefulSet's `trainer-0` re-created with a new
//! uid while the deleted one's orphan lives on, `trainer-0` in two namespaces, a container name
//! every replica of a pod has, a container whose name looks like another's id. So a text picks
//! by these rules, the same for the command line, scripts and MCP, on each host:
//! - a whole uid (a whole container id) is that pod (that container), whatever else a name or
//!   a prefix would match: uids and ids are given by the kubelet and the runtime, never chosen;
//! - otherwise every pod (container) that the text names, by `NAMESPACE/NAME` or by `NAME` in
//!   any namespace (by its own name or its name in its pod), and every one whose uid (id) it
//!   begins, if it is long enough to be a prefix (8 characters of a uid, 12 of an id: what
//!   gpuloop, docker and podman show), is a candidate;
//! - one candidate is the scope; several are an ambiguity that lists each with the selector
//!   that names it alone; none is an error that lists what is there. A scope that names nothing
//!   is never "nothing to do": a typo, the wrong node and a node whose pods' names cannot be
//!   read (the kubelet's directories not mounted) look alike from here, and in the last one the
//!   pod's processes hold the GPU.

use super::container::{is_uid, short, Place, Pod, Within};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// How much of a pod's uid a prefix needs: what gpuloop shows of one ("uid 1a2b3c4d").
pub(crate) const UID_PREFIX_MIN: usize = 8;
/// How much of a container's id a prefix needs: what gpuloop, docker and podman show of one.
pub(crate) const ID_PREFIX_MIN: usize = 12;

/// Which of the two a scope's text names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Pod,
    Container,
}

impl Kind {
    fn noun(self, n: usize) -> &'static str {
        match (self, n) {
            (Kind::Pod, 1) => "pod",
            (Kind::Pod, _) => "pods",
            (Kind::Container, 1) => "container",
            (Kind::Container, _) => "containers",
        }
    }

    /// What names one alone.
    fn key(self) -> &'static str {
        match self {
            Kind::Pod => "uid",
            Kind::Container => "id",
        }
    }

    fn prefix_min(self) -> usize {
        match self {
            Kind::Pod => UID_PREFIX_MIN,
            Kind::Container => ID_PREFIX_MIN,
        }
    }
}

/// A pod or a container a scope's text could mean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The selector that names it alone: `--pod <uid>`, `--container <id>`.
    pub(crate) exact: String,
    /// What it is: "ml/trainer-0", "trainer in pod ml/trainer-0", "vllm".
    pub(crate) what: String,
    /// Its pod or its container is gone while its processes live on.
    pub(crate) deleted: bool,
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let deleted = if self.deleted { ", deleted" } else { "" };
        write!(f, "{} ({}{deleted})", self.exact, self.what)
    }
}

/// Why a scope picks no target here: it is empty, names nothing, or names more than one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScopeError {
    Empty(Kind),
    /// Nothing on this machine's GPUs is in it.
    Nothing {
        kind: Kind,
        /// The scope as given ("--pod ml/trainer-9", "--pod ml/a --container x").
        said: String,
        /// What there is to pick from.
        here: Vec<Candidate>,
        /// Of `here`, the pods the node tells no name of.
        unnamed: usize,
        /// The text could be a uid's or an id's beginning, too short to be read as one.
        short_prefix: bool,
    },
    /// More than one pod or container fits.
    Ambiguous {
        kind: Kind,
        said: String,
        fits: Vec<Candidate>,
    },
}

impl std::error::Error for ScopeError {}

/// At most this many candidates are listed when a scope names nothing.
const LISTED: usize = 8;

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |c: &[Candidate]| c.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        match self {
            ScopeError::Empty(Kind::Pod) => write!(
                f,
                "--pod: give NAMESPACE/NAME, NAME, or a pod's uid (or its first {UID_PREFIX_MIN} characters at least)"
            ),
            ScopeError::Empty(Kind::Container) => write!(
                f,
                "--container: give a container's name or id (or its first {ID_PREFIX_MIN} characters at least)"
            ),
            ScopeError::Nothing {
                kind,
                said,
                here,
                unnamed,
                short_prefix,
            } => {
                if here.is_empty() {
                    write!(
                        f,
                        "{said}: no process on this node's GPUs is in a {}",
                        kind.noun(1)
                    )?;
                } else {
                    write!(
                        f,
                        "{said}: no process on this node's GPUs is in such a {}",
                        kind.noun(1)
                    )?;
                    let mut shown = list(&here[..here.len().min(LISTED)]);
                    if here.len() > LISTED {
                        shown.push(format!("and {} more", here.len() - LISTED));
                    }
                    write!(
                        f,
                        "; the {} there: {}",
                        kind.noun(here.len()),
                        shown.join(", ")
                    )?;
                }
                if *unnamed > 0 {
                    write!(
                        f,
                        "; the node names {} of them by uid alone (the kubelet's directories are not readable here: are they mounted? docs/kubernetes.md)",
                        unnamed
                    )?;
                }
                if *short_prefix {
                    let a = match kind {
                        Kind::Pod => "a uid",
                        Kind::Container => "an id",
                    };
                    write!(
                        f,
                        "; {a} prefix needs {} characters at least",
                        kind.prefix_min()
                    )?;
                }
                Ok(())
            }
            ScopeError::Ambiguous { kind, said, fits } => write!(
                f,
                "{said} fits {} {} here; name one by its {}: {}",
                fits.len(),
                kind.noun(fits.len()),
                kind.key(),
                list(fits).join(", ")
            ),
        }
    }
}

/// The pod and the container a `--pod`/`--container` text picks among the places of this
/// machine's GPU processes (every role), by the rules above; `None` when neither is given.
/// With both, the container is looked for in that pod.
pub(crate) fn within<'p>(
    pod: Option<&str>,
    container: Option<&str>,
    places: impl Iterator<Item = &'p Place>,
) -> Result<Option<Within>, ScopeError> {
    if pod.is_none() && container.is_none() {
        return Ok(None);
    }
    let places: Vec<&Place> = places.collect();
    let mut said = Vec::new();
    let pods = match pod {
        None => None,
        Some(text) => {
            said.push(format!("--pod {}", text.trim()));
            Some(pick_pod(text, &places, &said.join(" "))?)
        }
    };
    let containers = match container {
        None => None,
        Some(text) => {
            said.push(format!("--container {}", text.trim()));
            Some(pick_container(
                text,
                &places,
                pods.as_deref(),
                &said.join(" "),
            )?)
        }
    };
    Ok(Some(Within {
        pods: pods.map(|u| BTreeSet::from([u])),
        containers: containers.map(|c| BTreeSet::from([c])),
        said: said.join(" "),
    }))
}

/// Characters a uid (or a prefix of one) is made of.
fn uid_like(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The one pod `text` names, by its uid.
fn pick_pod(text: &str, places: &[&Place], said: &str) -> Result<String, ScopeError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ScopeError::Empty(Kind::Pod));
    }
    // Each pod once, by its uid: a pod without one cannot be told from another.
    let mut pods: BTreeMap<&str, &Pod> = BTreeMap::new();
    for p in places.iter().filter_map(|p| p.pod.as_ref()) {
        if let Some(uid) = p.uid.as_deref() {
            pods.entry(uid).or_insert(p);
        }
    }
    let lower = text.to_ascii_lowercase();
    if is_uid(&lower) && pods.contains_key(lower.as_str()) {
        return Ok(lower);
    }
    let named = |p: &Pod| match text.split_once('/') {
        Some((ns, name)) => p.namespace.as_deref() == Some(ns) && p.name.as_deref() == Some(name),
        None => p.name.as_deref() == Some(text),
    };
    let could_be_prefix = !text.contains('/') && uid_like(text);
    let prefix = could_be_prefix && text.len() >= UID_PREFIX_MIN;
    let candidate = |uid: &str, p: &Pod| Candidate {
        exact: format!("--pod {uid}"),
        what: match (&p.namespace, &p.name) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.clone(),
            _ => format!("uid {}", short(uid, UID_PREFIX_MIN)),
        },
        deleted: p.deleted,
    };
    let looked = Looked {
        kind: Kind::Pod,
        said,
        unnamed: pods.values().filter(|p| p.name.is_none()).count(),
        short_prefix: could_be_prefix && !prefix,
    };
    looked.one_of(
        &pods,
        |uid, p| named(p) || (prefix && uid.starts_with(&lower)),
        candidate,
    )
}

/// What a scope's text was looked for as, for the error that says it picked nothing or more
/// than one.
struct Looked<'a> {
    kind: Kind,
    said: &'a str,
    unnamed: usize,
    short_prefix: bool,
}

impl Looked<'_> {
    /// The one of `found` (pods by uid, containers by id) that `fits`, or the error that
    /// lists the ones that fit (or, where none does, all there are).
    fn one_of<T: Copy>(
        self,
        found: &BTreeMap<&str, T>,
        fits: impl Fn(&str, T) -> bool,
        candidate: impl Fn(&str, T) -> Candidate,
    ) -> Result<String, ScopeError> {
        let fit: Vec<(&str, T)> = found
            .iter()
            .filter(|(k, v)| fits(k, **v))
            .map(|(k, v)| (*k, *v))
            .collect();
        let said = self.said.to_string();
        match fit.as_slice() {
            [(k, _)] => Ok(k.to_string()),
            [] => Err(ScopeError::Nothing {
                kind: self.kind,
                said,
                here: found.iter().map(|(k, v)| candidate(k, *v)).collect(),
                unnamed: self.unnamed,
                short_prefix: self.short_prefix,
            }),
            _ => Err(ScopeError::Ambiguous {
                kind: self.kind,
                said,
                fits: fit.into_iter().map(|(k, v)| candidate(k, v)).collect(),
            }),
        }
    }
}

/// The one container `text` names (in the pod `pod`, where one is given), by its id.
fn pick_container(
    text: &str,
    places: &[&Place],
    pod: Option<&str>,
    said: &str,
) -> Result<String, ScopeError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ScopeError::Empty(Kind::Container));
    }
    let in_pod = |p: &Place| {
        pod.is_none_or(|uid| p.pod.as_ref().and_then(|q| q.uid.as_deref()) == Some(uid))
    };
    let mut ctrs: BTreeMap<&str, &Place> = BTreeMap::new();
    for p in places.iter().filter(|p| in_pod(p)) {
        if let Some(id) = p.container.as_deref() {
            ctrs.entry(id).or_insert(p);
        }
    }
    let lower = text.to_ascii_lowercase();
    let could_be_prefix = text.bytes().all(|b| b.is_ascii_hexdigit());
    if could_be_prefix && ctrs.contains_key(lower.as_str()) {
        return Ok(lower);
    }
    let named = |p: &Place| {
        p.container_name.as_deref() == Some(text)
            || p.pod.as_ref().and_then(|q| q.container.as_deref()) == Some(text)
    };
    let prefix = could_be_prefix && text.len() >= ID_PREFIX_MIN;
    let candidate = |id: &str, p: &Place| {
        let name = p
            .pod
            .as_ref()
            .and_then(|q| q.container.clone())
            .or_else(|| p.container_name.clone())
            .unwrap_or_else(|| short(id, ID_PREFIX_MIN));
        Candidate {
            exact: format!("--container {id}"),
            what: match &p.pod {
                Some(q) => format!("{name} in pod {}", q.label()),
                None => name,
            },
            deleted: p.gone(),
        }
    };
    let looked = Looked {
        kind: Kind::Container,
        said,
        unnamed: 0,
        short_prefix: could_be_prefix && !prefix,
    };
    looked.one_of(
        &ctrs,
        |id, p| named(p) || (prefix && id.starts_with(&lower)),
        candidate,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::container::Runtime;

    const ID: &str = "4f3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
    const UID: &str = "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d";

    fn place(uid: &str, ns: &str, name: &str, id: &str, ctr: &str, deleted: bool) -> Place {
        Place {
            container: Some(id.into()),
            container_name: None,
            runtime: Some(Runtime::Containerd),
            container_deleted: false,
            pod: Some(Pod {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                container: Some(ctr.into()),
                deleted,
            }),
        }
    }

    /// ml/trainer-0's container, of uid UID and id ID.
    fn trainer_0() -> Place {
        place(UID, "ml", "trainer-0", ID, "trainer", false)
    }

    /// A live pod's container of id "bbbb…", named "trainer" in its pod.
    fn other(uid: &str, ns: &str, name: &str) -> Place {
        place(uid, ns, name, &"b".repeat(64), "trainer", false)
    }

    fn docker(id: &str, name: &str) -> Place {
        Place {
            container: Some(id.into()),
            container_name: Some(name.into()),
            runtime: Some(Runtime::Docker),
            ..Place::default()
        }
    }

    fn pick(
        places: &[Place],
        pod: Option<&str>,
        ctr: Option<&str>,
    ) -> Result<(Option<String>, Option<String>), ScopeError> {
        let w = within(pod, ctr, places.iter())?.expect("a scope");
        let one = |s: Option<BTreeSet<String>>| {
            s.map(|s| {
                assert_eq!(s.len(), 1, "{s:?}");
                s.into_iter().next().unwrap_or_default()
            })
        };
        Ok((one(w.pods), one(w.containers)))
    }

    #[test]
    fn a_name_picks_one_pod_in_any_namespace_or_says_which() {
        let b_uid = "1a2b9999-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
        let all = [
            trainer_0(),
            place(b_uid, "default", "infer", &"b".repeat(64), "server", false),
        ];
        let upper = UID.to_uppercase();
        for (text, uid) in [
            ("ml/trainer-0", UID),
            ("trainer-0", UID),
            ("infer", b_uid),
            ("1a2b3c4d", UID),
            (upper.as_str(), UID),
        ] {
            assert_eq!(
                pick(&all, Some(text), None).unwrap().0.as_deref(),
                Some(uid),
                "{text}"
            );
        }
        assert!(within(None, None, all.iter()).unwrap().is_none());
        assert_eq!(
            within(Some(" "), None, all.iter()).unwrap_err(),
            ScopeError::Empty(Kind::Pod)
        );
        // A prefix that fits two uids.
        let e = pick(&all, Some("1a2b-"), None).unwrap_err().to_string();
        assert!(e.contains("a uid prefix needs 8 characters"), "{e}");
        let two = [
            all[0].clone(),
            place(
                "1a2b3c4d-0000-7a8b-9c0d-1e2f3a4b5c6d",
                "x",
                "y",
                &"c".repeat(64),
                "z",
                false,
            ),
        ];
        let e = pick(&two, Some("1a2b3c4d"), None).unwrap_err().to_string();
        assert!(
            e.contains("--pod 1a2b3c4d fits 2 pods here; name one by its uid: ")
                && e.contains(&format!("--pod {UID} (ml/trainer-0)"))
                && e.contains("--pod 1a2b3c4d-0000-7a8b-9c0d-1e2f3a4b5c6d (x/y)"),
            "{e}"
        );
    }

    /// A StatefulSet's pod re-created with a new uid while the deleted one's orphan still
    /// holds a GPU: the name fits both, and the error names each by its uid.
    #[test]
    fn a_deleted_pod_and_its_live_successor_are_ambiguous_by_name() {
        let new_uid = "9f8e7d6c-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
        let all = [
            place(UID, "ml", "trainer-0", ID, "trainer", true),
            other(new_uid, "ml", "trainer-0"),
        ];
        for text in ["ml/trainer-0", "trainer-0"] {
            let e = pick(&all, Some(text), None).unwrap_err();
            let ScopeError::Ambiguous { fits, .. } = &e else {
                panic!("{e}")
            };
            assert_eq!(
                fits,
                &[
                    Candidate {
                        exact: format!("--pod {UID}"),
                        what: "ml/trainer-0".into(),
                        deleted: true
                    },
                    Candidate {
                        exact: format!("--pod {new_uid}"),
                        what: "ml/trainer-0".into(),
                        deleted: false
                    },
                ]
            );
            assert!(e.to_string().contains("(ml/trainer-0, deleted)"), "{e}");
        }
        // The selector the error gives picks that pod alone.
        assert_eq!(pick(&all, Some(UID), None).unwrap().0.as_deref(), Some(UID));
        assert_eq!(
            pick(&all, Some(new_uid), None).unwrap().0.as_deref(),
            Some(new_uid)
        );
        // Two namespaces, one name.
        let ns = [trainer_0(), other(new_uid, "research", "trainer-0")];
        assert!(matches!(
            pick(&ns, Some("trainer-0"), None),
            Err(ScopeError::Ambiguous { .. })
        ));
        assert_eq!(
            pick(&ns, Some("research/trainer-0"), None)
                .unwrap()
                .0
                .as_deref(),
            Some(new_uid)
        );
    }

    /// A pod named like another pod's uid prefix is ambiguous with it; a whole uid is that pod
    /// whatever is named like it.
    #[test]
    fn a_name_that_looks_like_a_uid_never_wins_over_it() {
        let all = [
            trainer_0(),
            other(
                "5555aaaa-5e6f-7a8b-9c0d-1e2f3a4b5c6d",
                "default",
                "1a2b3c4d",
            ),
        ];
        assert!(matches!(
            pick(&all, Some("1a2b3c4d"), None),
            Err(ScopeError::Ambiguous { .. })
        ));
        let named_as_uid = [
            all[0].clone(),
            place(
                "5555aaaa-5e6f-7a8b-9c0d-1e2f3a4b5c6d",
                "default",
                UID,
                &"b".repeat(64),
                "x",
                false,
            ),
        ];
        assert_eq!(
            pick(&named_as_uid, Some(UID), None).unwrap().0.as_deref(),
            Some(UID)
        );
    }

    #[test]
    fn a_scope_that_names_nothing_says_what_there_is() {
        let all = [trainer_0()];
        let e = pick(&all, Some("ml/trainer-9"), None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!("--pod ml/trainer-9: no process on this node's GPUs is in such a pod; the pod there: --pod {UID} (ml/trainer-0)")
        );
        let e = pick(&[], Some("ml/trainer-0"), None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--pod ml/trainer-0: no process on this node's GPUs is in a pod"
        );
        // Pods the node names by uid alone: the kubelet's directories were not read.
        let mut unnamed = all[0].clone();
        if let Some(p) = &mut unnamed.pod {
            p.name = None;
            p.namespace = None;
        }
        let e = pick(&[unnamed.clone()], Some("ml/trainer-0"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("--pod {UID} (uid 1a2b3c4d)"))
                && e.contains("the node names 1 of them by uid alone"),
            "{e}"
        );
        assert_eq!(
            pick(&[unnamed], Some(UID), None).unwrap().0.as_deref(),
            Some(UID)
        );
        // A short hex text is neither a name here nor a prefix.
        let e = pick(&all, Some("1a2b"), None).unwrap_err().to_string();
        assert!(
            e.contains("a uid prefix needs 8 characters at least"),
            "{e}"
        );
        let e = pick(&all, None, Some("vllm")).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "--container vllm: no process on this node's GPUs is in such a container"
            ) && e.contains(&format!("--container {ID} (trainer in pod ml/trainer-0)")),
            "{e}"
        );
        let e = pick(&all, Some("ml/trainer-0"), Some("server"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--pod ml/trainer-0 --container server: no process"),
            "{e}"
        );
    }

    #[test]
    fn a_container_name_that_fits_several_is_ambiguous() {
        let b = "b".repeat(64);
        let all = [
            trainer_0(),
            other(
                "1a2b9999-5e6f-7a8b-9c0d-1e2f3a4b5c6d",
                "default",
                "trainer-1",
            ),
        ];
        let e = pick(&all, None, Some("trainer")).unwrap_err();
        let ScopeError::Ambiguous { fits, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(
            fits.iter().map(|c| c.exact.as_str()).collect::<Vec<_>>(),
            [format!("--container {ID}"), format!("--container {b}")]
        );
        assert!(
            e.to_string().contains("trainer in pod default/trainer-1"),
            "{e}"
        );
        // In one pod it is one container.
        assert_eq!(
            pick(&all, Some("ml/trainer-0"), Some("trainer")).unwrap(),
            (Some(UID.to_string()), Some(ID.to_string()))
        );
        assert_eq!(
            pick(&all, None, Some(&ID[..12])).unwrap().1.as_deref(),
            Some(ID)
        );
        assert_eq!(pick(&all, None, Some(ID)).unwrap().1.as_deref(), Some(ID));
    }

    /// A container named like another's id: its prefix fits both (an error), its whole id is
    /// that container.
    #[test]
    fn a_container_named_like_another_id_never_wins_over_it() {
        let all = [docker(ID, "victim"), docker(&"b".repeat(64), &ID[..12])];
        let e = pick(&all, None, Some(&ID[..12])).unwrap_err();
        assert!(matches!(e, ScopeError::Ambiguous { .. }), "{e}");
        assert_eq!(pick(&all, None, Some(ID)).unwrap().1.as_deref(), Some(ID));
        let whole = [docker(ID, "victim"), docker(&"b".repeat(64), ID)];
        assert_eq!(pick(&whole, None, Some(ID)).unwrap().1.as_deref(), Some(ID));
        // Too short to be a prefix: only a name.
        let e = pick(&all, None, Some(&ID[..6])).unwrap_err().to_string();
        assert!(
            e.contains("an id prefix needs 12 characters at least"),
            "{e}"
        );
    }
}
