//! The progress line of a one-shot over several hosts on a terminal.

use super::lock;
use crate::hosts::HostError;
use crate::output::ProgressLine;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// The hosts still to come, by their place in the round (the line names the last few in
    /// order); a host that comes in is taken out by its place, never by a search (which made
    /// a round over 65,536 hosts quadratic).
    waiting: BTreeMap<usize, String>,
    place: HashMap<String, Vec<usize>>,
    /// When the line was last drawn.
    drawn: Option<Instant>,
    shown: ProgressLine,
}

/// The line is drawn at most this often while many hosts are still to come (65,536 hosts
/// interrupted at once drew it 65,536 times).
const REDRAW: Duration = Duration::from_millis(50);

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
                waiting: BTreeMap::new(),
                place: HashMap::new(),
                drawn: None,
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
        st.place.clear();
        for (i, h) in hosts.iter().enumerate() {
            st.place.entry(h.clone()).or_default().push(i);
        }
        st.waiting = hosts.into_iter().enumerate().collect();
        st.drawn = None;
        self.draw(&mut st, true);
    }

    /// Draws the line (`now`: even if it was drawn a moment ago: a line said above wiped it).
    fn draw(&self, st: &mut Phase, now: bool) {
        let few = st.waiting.len() <= NAME_LAST;
        if !now && !few && st.drawn.is_some_and(|t| t.elapsed() < REDRAW) {
            return;
        }
        st.drawn = Some(Instant::now());
        let done = st.total - st.waiting.len();
        let mut line = format!("{done}/{} hosts {}", st.total, st.what);
        if !st.waiting.is_empty() && st.waiting.len() <= NAME_LAST.min(st.total - 1) {
            let names: Vec<&String> = st.waiting.values().collect();
            line.push_str(&format!(
                "; waiting for {}",
                crate::hosts::fold::compress(&names)
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
        if let Some(i) = st.place.get_mut(host).and_then(Vec::pop) {
            st.waiting.remove(&i);
        }
        let wiped = said.is_some();
        if let Some(line) = said {
            st.shown.above(&line);
        }
        // An interrupt ends the run: nothing is said for each host it stopped.
        let failed = failed.filter(|e| !matches!(e, HostError::Interrupted));
        let wiped = match failed {
            Some(e) if lock(&self.said).insert(host.to_string()) => {
                let how = match self.skip && e.unreachable() {
                    true => "warning: skipping",
                    false => "gpuloop:",
                };
                st.shown.above(&format!("{how} {e}"));
                true
            }
            _ => wiped,
        };
        self.draw(&mut st, wiped);
    }

    pub(super) fn clear(&self) {
        lock(&self.state).shown.clear();
    }
}
