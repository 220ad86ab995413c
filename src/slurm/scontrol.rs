//! The Slurm commands a prolog/epilog needs: which jobs run on this node, and draining it.

use crate::process::command_output;
use std::collections::BTreeSet;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(10);

/// The jobs running (or completing, configuring, suspended) on `node`; `None` if squeue fails.
pub(crate) fn running_jobs(node: &str) -> Option<BTreeSet<i64>> {
    let mut args = vec![
        "-h",
        "-o",
        "%A",
        "-t",
        "RUNNING,COMPLETING,CONFIGURING,SUSPENDED",
    ];
    if !node.is_empty() {
        args.extend(["-w", node]);
    }
    let out = command_output("squeue", &args, DEADLINE)?;
    Some(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Why a node could not be drained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DrainError {
    #[error("no node name (SLURMD_NODENAME unset, no hostname)")]
    NoNode,
    /// scontrol would read it as a hostlist of several nodes.
    #[error("{0:?} is not one node's name")]
    NotOneNode(String),
    #[error("scontrol update failed")]
    Failed,
}

/// `scontrol update nodename=NODE state=drain reason=REASON`.
pub(crate) fn drain(node: &str, reason: &str) -> Result<(), DrainError> {
    if node.is_empty() {
        return Err(DrainError::NoNode);
    }
    // scontrol takes a hostlist here: only ever one node, this one.
    if !super::is_node_name(node) {
        return Err(DrainError::NotOneNode(node.to_string()));
    }
    // The reason is read by people (`sinfo -R`) and by scripts that parse scontrol's output:
    // no control character in it, however it was made.
    let reason = crate::shown::shown(reason);
    let (node_arg, reason_arg) = (format!("nodename={node}"), format!("reason={reason}"));
    command_output(
        "scontrol",
        &["update", &node_arg, "state=drain", &reason_arg],
        DEADLINE,
    )
    .map(|_| ())
    .ok_or(DrainError::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is wrong with the node is decided before scontrol runs, each its own error.
    #[test]
    fn a_node_that_is_not_one_is_refused_before_scontrol_runs() {
        assert_eq!(drain("", "gpuloop: x"), Err(DrainError::NoNode));
        assert_eq!(
            drain("gpu[01-02]", "gpuloop: x"),
            Err(DrainError::NotOneNode("gpu[01-02]".into()))
        );
        assert_eq!(
            DrainError::NotOneNode("a,b".into()).to_string(),
            r#""a,b" is not one node's name"#
        );
    }
}
