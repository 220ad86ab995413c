//! Process trees from one snapshot of /proc: descendants and the job's process group.

use super::ProcInfo;
use std::collections::{HashMap, HashSet, VecDeque};

/// A snapshot of the process table indexed for tree walks.
pub struct Tree {
    by_pid: HashMap<i32, ProcInfo>,
    children: HashMap<i32, Vec<i32>>,
}

impl Tree {
    pub fn new(table: Vec<ProcInfo>) -> Tree {
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        for p in &table {
            children.entry(p.ppid).or_default().push(p.pid);
        }
        Tree {
            by_pid: table.into_iter().map(|p| (p.pid, p)).collect(),
            children,
        }
    }

    pub fn snapshot() -> Tree {
        Tree::new(super::process_table())
    }

    pub fn get(&self, pid: i32) -> Option<&ProcInfo> {
        self.by_pid.get(&pid)
    }

    /// The direct children of `pid`.
    pub fn children(&self, pid: i32) -> impl Iterator<Item = &ProcInfo> {
        self.children
            .get(&pid)
            .into_iter()
            .flatten()
            .filter_map(|c| self.get(*c))
    }

    /// Every process below `root` (not `root` itself), breadth first.
    pub(crate) fn descendants(&self, root: i32) -> Vec<i32> {
        let mut out = Vec::new();
        let mut seen = HashSet::from([root]);
        let mut queue = VecDeque::from([root]);
        while let Some(p) = queue.pop_front() {
            for &c in self.children.get(&p).into_iter().flatten() {
                // Zombies hold nothing; their parent reaps them.
                if self.get(c).is_some_and(ProcInfo::is_zombie) {
                    continue;
                }
                if seen.insert(c) {
                    out.push(c);
                    queue.push_back(c);
                }
            }
        }
        out
    }

    /// `pid`, then its parent, its parent's parent, … as far as this snapshot goes.
    pub(crate) fn ancestry(&self, pid: i32) -> impl Iterator<Item = &ProcInfo> {
        let mut next = self.get(pid);
        // A snapshot read while pids were reused may hold a loop.
        let mut seen = HashSet::new();
        std::iter::from_fn(move || {
            let p = next.filter(|p| seen.insert(p.pid))?;
            next = self.get(p.ppid);
            Some(p)
        })
    }

    /// The members of `pid`'s process group when `pid` leads it: the group is then `pid`'s own
    /// job, and what it double-forked or setsid'd away from its tree still carries its pgid.
    /// A group led by anyone else is never taken, not even when its leader is gone: a dead
    /// leader's pgid is shared by everything that leader's shell started (an ssh session's
    /// background jobs, a test runner's children), and those are not this target's job.
    /// Each worker that holds a GPU is a target of its own, so nothing that holds is missed.
    pub(crate) fn job_group(&self, pid: i32) -> Vec<i32> {
        let Some(p) = self.get(pid) else {
            return Vec::new();
        };
        let pgid = p.pgid;
        if pgid <= 1 || pgid != pid {
            return Vec::new();
        }
        let mut members: Vec<i32> = self
            .by_pid
            .values()
            .filter(|q| q.pgid == pgid && q.pid != pid && !q.is_zombie())
            .map(|q| q.pid)
            .collect();
        members.sort_unstable();
        members
    }

    /// True if some process (a zombie too: its group id is still taken) is in group `pgid`.
    pub(crate) fn group_exists(&self, pgid: i32) -> bool {
        self.by_pid.values().any(|p| p.pgid == pgid)
    }

    /// True if the process's job parent is gone: its process group or session leader exited.
    pub fn orphaned(&self, pid: i32) -> bool {
        let Some(p) = self.get(pid) else {
            return false;
        };
        let gone = |leader: i32| {
            leader > 1 && leader != pid && self.get(leader).is_none_or(|l| l.is_zombie())
        };
        gone(p.pgid) || gone(p.sid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, pgid: i32, sid: i32) -> ProcInfo {
        ProcInfo::sleeping(pid, ppid, pgid, sid, pid as u64)
    }

    #[test]
    fn walks_descendants_and_job_groups() {
        // 10 launches 11 and 12 in its group; 12 forked 13; 20 is unrelated; 30 leads a group
        // that 31 is in, and 32 sits in 31's group but 31 is not its leader.
        let t = Tree::new(vec![
            p(1, 0, 1, 1),
            p(5, 1, 5, 5),
            p(10, 1, 10, 5),
            p(11, 10, 10, 5),
            p(12, 10, 10, 5),
            p(13, 12, 10, 5),
            p(20, 1, 20, 20),
            p(31, 1, 30, 5),
            p(32, 1, 30, 5),
        ]);
        assert_eq!(t.descendants(10), vec![11, 12, 13]);
        let up: Vec<i32> = t.ancestry(13).map(|p| p.pid).collect();
        assert_eq!(up, vec![13, 12, 10, 1]);
        assert_eq!(t.ancestry(99).count(), 0);
        assert_eq!(t.job_group(10), vec![11, 12, 13]);
        // 11's group is led by 10, alive: not 11's own job.
        assert!(t.job_group(11).is_empty());
        // Group 30's leader is gone: 32 is 31's group-mate, not its child, and may be anything
        // the dead leader's shell started, so it is not taken with 31.
        assert!(t.job_group(31).is_empty());
        assert!(t.orphaned(31));
        assert!(!t.orphaned(11));
        assert!(!t.orphaned(20));
    }
}
