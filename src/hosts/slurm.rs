//! Host sets from Slurm (`--hosts-from-slurm JOBID|NODELIST`): a job's nodes as
//! `scontrol show job` lists them, expanded by `scontrol show hostnames`, Slurm's own view.

use super::HostError;
use crate::process::{run_command, CommandFailure};
use std::time::Duration;

/// scontrol asks slurmctld; a busy controller answers within seconds, a dead one never.
const DEADLINE: Duration = Duration::from_secs(30);

/// What `--hosts-from-slurm` was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlurmSource {
    /// A job id: `812`, an array task `812_3`, a het component `812+1`.
    Job(String),
    /// A node list expression: `gpu[01-04],gpu10`.
    Nodes(String),
}

impl SlurmSource {
    pub(crate) fn parse(arg: &str) -> Result<SlurmSource, HostError> {
        let arg = arg.trim();
        if arg.is_empty() {
            return Err(HostError::SlurmArg {
                arg: arg.into(),
                why: "empty: give a job id or a node list".into(),
            });
        }
        Ok(if is_job_id(arg) {
            SlurmSource::Job(arg.to_string())
        } else {
            SlurmSource::Nodes(arg.to_string())
        })
    }
}

/// `812`, `812_3` (array task) or `812+1` (het component): digits, at most one `_` or `+`
/// followed by digits.
pub(crate) fn is_job_id(s: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let job = |p: &str| p == p.trim() && crate::process::origin::job_id(p).is_some();
    match s.split_once(['_', '+']) {
        Some((j, part)) => job(j) && digits(part),
        None => job(s),
    }
}

/// The nodes, in Slurm's order.
pub(crate) fn resolve(src: &SlurmSource) -> Result<Vec<String>, HostError> {
    match src {
        SlurmSource::Job(job) => {
            let arg = job.as_str();
            let out = scontrol(arg, &["show", "job", "-o", job])?;
            let list = node_list(&out);
            if list.is_empty() {
                let state = field(&out, "JobState").unwrap_or("unknown".into());
                let reason = field(&out, "Reason")
                    .filter(|r| r != "None")
                    .map(|r| format!(", reason {r}"))
                    .unwrap_or_default();
                return Err(HostError::Slurm {
                    arg: arg.into(),
                    why: format!(
                        "job {job} has no nodes yet (state {state}{reason}); wait until it runs"
                    ),
                });
            }
            hostnames(arg, &list.join(","))
        }
        SlurmSource::Nodes(list) => hostnames(list, list),
    }
}

/// `scontrol show hostnames LIST`: one name a line.
fn hostnames(arg: &str, list: &str) -> Result<Vec<String>, HostError> {
    let out = scontrol(arg, &["show", "hostnames", list])?;
    let names: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if names.is_empty() {
        return Err(HostError::SlurmArg {
            arg: arg.into(),
            why: format!("scontrol show hostnames {list:?} names no host"),
        });
    }
    // scontrol prints what it cannot parse as a name ("gpu[01-" gives "gpu]"), exit 0.
    if let Some(bad) = names.iter().find(|n| n.contains(['[', ']', ','])) {
        return Err(HostError::SlurmArg {
            arg: arg.into(),
            why: format!("not a node list Slurm can expand (scontrol show hostnames gave {bad:?})"),
        });
    }
    Ok(names)
}

/// The `NodeList=` of every record (an array or het job has several); `(null)` (a pending
/// job) counts as none.
pub(crate) fn node_list(show_job: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // An array job has a record per task: each list looked up, not searched for.
    let mut seen = std::collections::HashSet::new();
    for line in show_job.lines() {
        if let Some(l) = field(line, "NodeList") {
            if !l.is_empty() && l != "(null)" && seen.insert(l.clone()) {
                out.push(l);
            }
        }
    }
    out
}

/// The first `KEY=value` of a `scontrol -o` record.
fn field(text: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&prefix))
        .map(str::to_string)
}

fn scontrol(arg: &str, args: &[&str]) -> Result<String, HostError> {
    let slurm = |why: String| HostError::Slurm {
        arg: arg.into(),
        why,
    };
    // Apart from gpuloop, as every transport is: a SIGKILLed gpuloop leaves no scontrol.
    run_command("scontrol", args, DEADLINE, Some(rustix::process::Signal::KILL)).map_err(|f| match f {
        CommandFailure::Start(std::io::ErrorKind::NotFound, _) => slurm(
            "scontrol is not installed here (Debian/Ubuntu: slurm-client); for a plain hostlist use --host 'LIST'"
                .into(),
        ),
        CommandFailure::Start(_, e) => slurm(format!("cannot run scontrol: {e}")),
        CommandFailure::Timeout => slurm(format!(
            "scontrol {} got no answer within {}s (is slurmctld up?)",
            args.join(" "),
            DEADLINE.as_secs()
        )),
        CommandFailure::Failed(code, said) => {
            let said = said.trim().lines().last().unwrap_or("").trim().to_string();
            let said = if said.is_empty() {
                format!("scontrol exited with {code:?} and said nothing")
            } else {
                format!("scontrol said: {said}")
            };
            // A job Slurm does not know, or a list it cannot parse, is the caller's input.
            if said.contains("Invalid job id") {
                HostError::SlurmArg {
                    arg: arg.into(),
                    why: format!("no such Slurm job (it never existed or was purged); {said}"),
                }
            } else if said.contains("Invalid hostlist") || said.contains("Invalid node") {
                HostError::SlurmArg {
                    arg: arg.into(),
                    why: said,
                }
            } else {
                slurm(said)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_and_node_lists_are_told_apart() {
        for j in ["812", "812_3", "812+1"] {
            assert_eq!(SlurmSource::parse(j).unwrap(), SlurmSource::Job(j.into()));
        }
        for n in ["gpu[01-04]", "gpu01,gpu02", "812_", "_3", "8a", "812_[1-3]"] {
            assert_eq!(SlurmSource::parse(n).unwrap(), SlurmSource::Nodes(n.into()));
        }
        assert!(SlurmSource::parse(" ").is_err());
    }

    #[test]
    fn node_lists_come_from_every_record_and_pending_jobs_have_none() {
        let het = "JobId=7 HetJobId=7 JobState=RUNNING NodeList=gpu[01-02] BatchHost=gpu01\n\
                   JobId=8 HetJobId=7 JobState=RUNNING NodeList=gpu03 BatchHost=gpu03\n\
                   JobId=9 HetJobId=7 JobState=RUNNING NodeList=gpu03\n";
        assert_eq!(node_list(het), ["gpu[01-02]", "gpu03"]);
        let pending = "JobId=5 JobName=x JobState=PENDING Reason=JobHeldUser NodeList=(null)";
        assert!(node_list(pending).is_empty());
        assert_eq!(field(pending, "Reason").as_deref(), Some("JobHeldUser"));
        // ReqNodeList= and ExcNodeList= are not the job's nodes.
        assert!(node_list("ReqNodeList=gpu01 ExcNodeList=gpu02 NodeList=").is_empty());
    }
}
