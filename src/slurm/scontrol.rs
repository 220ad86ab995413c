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

/// `scontrol update nodename=NODE state=drain reason=REASON`.
pub(crate) fn drain(node: &str, reason: &str) -> Result<(), String> {
    if node.is_empty() {
        return Err("no node name (SLURMD_NODENAME unset, no hostname)".into());
    }
    // scontrol takes a hostlist here: only ever one node, this one.
    if !super::is_node_name(node) {
        return Err(format!("{node:?} is not one node's name"));
    }
    let (node_arg, reason_arg) = (format!("nodename={node}"), format!("reason={reason}"));
    command_output(
        "scontrol",
        &["update", &node_arg, "state=drain", &reason_arg],
        DEADLINE,
    )
    .map(|_| ())
    .ok_or_else(|| "scontrol update failed".to_string())
}
