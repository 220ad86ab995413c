//! Who holds the GPUs and why memory is still used: the join of the driver's view with /proc.

pub mod diagnose;
pub mod holders;
pub(crate) mod kinds;
pub mod reset;
pub(crate) mod select;
pub(crate) mod wait;

use crate::gpu::GpuError;
use crate::process::container::Within;

/// A GPU selection: `None` is every GPU.
pub(crate) type Selection = Option<Vec<i64>>;

/// Checks a selection against the GPUs there are; an unknown index is an error, not a gap.
pub(crate) fn check_selection(sel: &Selection, gpus: &[crate::gpu::Gpu]) -> Result<(), GpuError> {
    for &i in sel.iter().flatten() {
        if !gpus.iter().any(|g| g.index == i) {
            return Err(GpuError::NoSuchGpu {
                index: i,
                count: gpus.len(),
            });
        }
    }
    Ok(())
}

pub fn selected(sel: &Selection, index: i64) -> bool {
    sel.as_ref().is_none_or(|s| s.contains(&index))
}

/// Which holders a caller wants besides the GPU selection: `#{user: "alice"}`, `#{job: 812}`,
/// `#{pod: "ml/trainer-0"}`, `#{container: "vllm"}`, `--user U`, `--mine`, `--job N`, `--pod`,
/// `--container`. It crosses the wire as given and each host reads it with its own user
/// database and its own containers (`resolve_in`): uids differ between machines, so a name
/// resolved here and sent as a number would pick another user's processes there.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    pub user: Option<User>,
    pub job: Option<i64>,
    /// A pod as given: `NAMESPACE/NAME`, `NAME`, a uid or a prefix of one (`process::scope`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// A container as given: its name, its id or a prefix of one (`process::scope`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The MIG devices the GPU selection is narrowed to (`--gpu 0:7:0`, `--gpu MIG-…`), as
    /// given: each host reads them against its own GPUs. A selection, not an owner: it
    /// leaves `is_empty` and `is_scoped` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<Vec<crate::gpu::mig::MigSel>>,
}

/// Whose processes alone a kill may signal, as given (`kill(…, #{user, pod, container})`,
/// `gpuloop kill PID --pod …`): read on the machine that signals, like a filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bound {
    pub user: Option<User>,
    pub pod: Option<String>,
    pub container: Option<String>,
}

impl Bound {
    /// No bound at all.
    pub fn is_empty(&self) -> bool {
        self.user.is_none() && self.pod.is_none() && self.container.is_none()
    }
}

/// Whose processes, as the user named them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum User {
    /// A user name, looked up where the processes are.
    Name(String),
    /// A uid given as a number: the same number on every host.
    Uid(u32),
    /// `--mine`: the account gpuloop runs as where the processes are (over ssh, the login
    /// user there).
    Me,
}

impl User {
    /// `--user` text: a number is a uid, anything else a name.
    pub fn parse(text: &str) -> User {
        match text.parse::<u32>() {
            Ok(uid) => User::Uid(uid),
            Err(_) => User::Name(text.to_string()),
        }
    }

    /// The command-line flag that names this user: "--user alice", "--mine".
    pub fn flag(&self) -> String {
        match self {
            User::Name(n) => format!("--user {n}"),
            User::Uid(u) => format!("--user {u}"),
            User::Me => "--mine".into(),
        }
    }

    /// The uid on this machine.
    pub fn uid(&self) -> Result<u32, GpuError> {
        match self {
            User::Uid(u) => Ok(*u),
            User::Me => Ok(rustix::process::getuid().as_raw()),
            User::Name(n) => {
                crate::process::user_id(n).ok_or_else(|| GpuError::NoUser { user: n.clone() })
            }
        }
    }
}

impl Filter {
    /// No filter at all: every holder.
    pub fn is_empty(&self) -> bool {
        self.user.is_none() && self.job.is_none() && !self.is_scoped()
    }

    /// It names a pod or a container: waits and cleans then wait for what that scope held,
    /// not for whole GPUs.
    pub fn is_scoped(&self) -> bool {
        self.pod.is_some() || self.container.is_some()
    }

    /// The filter as this machine reads it, its pod and container not yet resolved (that
    /// needs the processes: `resolve_in`); an unknown user name is an error.
    pub fn resolve(&self) -> Result<Resolved, GpuError> {
        Ok(Resolved {
            uid: self.user.as_ref().map(User::uid).transpose()?,
            job: self.job,
            within: None,
            instances: None,
        })
    }

    /// The filter as this machine reads it, its pod and container resolved among `holders`
    /// (every role: the places of this machine's GPU processes); one that is empty, fits
    /// nothing here or fits several is an error (`process::scope`).
    pub fn resolve_in(&self, holders: &[holders::Holder]) -> Result<Resolved, GpuError> {
        let mut r = self.resolve()?;
        r.within = scope(self.pod.as_deref(), self.container.as_deref(), holders)?;
        Ok(r)
    }

    /// `resolve_in` the inventory's holders, and its MIG devices read against its GPUs (an
    /// unknown or ambiguous one is an error that lists them).
    pub fn resolve_on(&self, inv: &holders::Inventory) -> Result<Resolved, GpuError> {
        let mut r = self.resolve_in(&inv.holders)?;
        if let Some(sels) = &self.mig {
            let devices: Vec<crate::gpu::mig::MigDevice> = inv.mig_devices().cloned().collect();
            let mut keys = Vec::new();
            for m in sels {
                for k in m.resolve(&devices, &inv.gpus)? {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
            r.instances = Some(keys);
        }
        Ok(r)
    }

    /// The filter's MIG devices alone: what a report of the selection after a clean or a
    /// wait looks at (every holder of them, whoever's).
    pub fn only_mig(&self) -> Filter {
        Filter {
            mig: self.mig.clone(),
            ..Filter::default()
        }
    }

    /// The bound a kill of this filter's holders keeps to: its user, pod and container.
    pub fn bound(&self) -> Bound {
        Bound {
            user: self.user.clone(),
            pod: self.pod.clone(),
            container: self.container.clone(),
        }
    }
}

/// A pod and a container as given, resolved among `holders`' places.
pub(crate) fn scope(
    pod: Option<&str>,
    container: Option<&str>,
    holders: &[holders::Holder],
) -> Result<Option<Within>, GpuError> {
    crate::process::scope::within(pod, container, holders.iter().map(|h| &h.origin.place))
        .map_err(|e| GpuError::BadScope(e.to_string()))
}

/// A filter with its user (and, where asked, its pod and container) resolved on this machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    pub uid: Option<u32>,
    pub job: Option<i64>,
    pub within: Option<Within>,
    /// The MIG devices the selection is narrowed to: a holder of one of them only.
    pub instances: Option<Vec<crate::gpu::mig::MigKey>>,
}

impl Resolved {
    /// No owner at all (the MIG devices, a part of the selection, aside).
    pub fn is_empty(&self) -> bool {
        self.uid.is_none() && self.job.is_none() && self.within.is_none()
    }

    /// Whether `key` is one of the MIG devices the selection is narrowed to (any, without).
    pub fn has_instance(&self, key: &crate::gpu::mig::MigKey) -> bool {
        self.instances.as_ref().is_none_or(|i| i.contains(key))
    }

    pub fn matches(&self, h: &holders::Holder) -> bool {
        self.instances
            .as_ref()
            .is_none_or(|i| h.mig.iter().any(|k| i.contains(k)))
            && self.uid.is_none_or(|u| h.uid == i64::from(u))
            && self.job.is_none_or(|j| h.origin.job == Some(j))
            && self
                .within
                .as_ref()
                .is_none_or(|w| w.holds_place(&h.origin.place))
    }
}
