//! The progress line of a one-shot over several hosts on a terminal.

use super::lock;
use crate::hosts::HostError;
use crate::output::ProgressLine;
use std::sync::{Arc, Mutex};

/// On a terminal, while a one-shot's hosts are still coming: `12/64 hosts answered` on one
/// line of stderr, rewritten as each answers, and each host said at once above it as it
/// comes in (its failure, or the line the command makes of its answer).
pub(super) struct Progress {
    /// `--skip-unreachable`: an unreachable host is a warning.
    skip: bool,
    state: Mutex<Phase>,
    /// The hosts whose failure was said already (the command does not say it again).
    pub(super) said: Mutex<std::collections::HashSet<String>>,
    /// What the command says of one host's answer (see `Pool::say_each`).
    pub(super) line: Mutex<Option<LineOf>>,
}

/// A host's one line made from its answer (`None`: nothing to say of it); the answer is of
/// the type the command asked for, or of another call's, of which it says nothing.
type LineOf = Arc<dyn Fn(&str, &dyn std::any::Any) -> Option<String> + Send + Sync>;

/// One round of a progress line: what the hosts do ("connected", "answered"), and those
/// still to come, in host-set order; and the line on stderr.
struct Phase {
    what: &'static str,
    total: usize,
    waiting: Vec<String>,
    shown: ProgressLine,
}

/// The line names the hosts still to come once they are this few.
const NAME_LAST: usize = 8;

impl Progress {
    /// The progress of a one-shot whose stderr is a terminal (`skip`: `--skip-unreachable`).
    pub(super) fn new(skip: bool) -> Progress {
        Progress {
            skip,
            state: Mutex::new(Phase {
                what: "",
                total: 0,
                waiting: Vec::new(),
                shown: ProgressLine::on_terminal(),
            }),
            said: Mutex::default(),
            line: Mutex::default(),
        }
    }

    pub(super) fn start(&self, hosts: Vec<String>, what: &'static str) {
        let mut st = lock(&self.state);
        st.what = what;
        st.total = hosts.len();
        st.waiting = hosts;
        self.draw(&mut st);
    }

    fn draw(&self, st: &mut Phase) {
        let done = st.total - st.waiting.len();
        let mut line = format!("{done}/{} hosts {}", st.total, st.what);
        if !st.waiting.is_empty() && st.waiting.len() <= NAME_LAST.min(st.total - 1) {
            line.push_str(&format!(
                "; waiting for {}",
                crate::hosts::fold::compress(&st.waiting)
            ));
        }
        st.shown.show(&line);
    }

    /// What the command says of `host`'s answer, if anything.
    pub(super) fn line_of(&self, host: &str, answer: &dyn std::any::Any) -> Option<String> {
        let line = lock(&self.line).clone()?;
        line(host, answer)
    }

    /// One host is in (`failed`: and this is why; `said`: the line made of its answer;
    /// either said now).
    pub(super) fn tick(&self, host: &str, failed: Option<&HostError>, said: Option<String>) {
        let mut st = lock(&self.state);
        st.waiting.retain(|h| h != host);
        if let Some(line) = said {
            st.shown.above(&line);
        }
        if let Some(e) = failed {
            if lock(&self.said).insert(host.to_string()) {
                let how = match self.skip && e.unreachable() {
                    true => "warning: skipping",
                    false => "gpuloop:",
                };
                st.shown.above(&format!("{how} {e}"));
            }
        }
        self.draw(&mut st);
    }

    pub(super) fn clear(&self) {
        lock(&self.state).shown.clear();
    }
}
