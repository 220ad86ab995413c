//! A journal record as one line for people.

use super::{Event, Record};
use crate::shown::shown;

/// One record for people: its texts (a target's name, a call's arguments, the command line)
/// came from other users, processes and clients, and are shown as `crate::shown` says, so a
/// record stays one line and moves nothing on the terminal.
pub(crate) fn line(r: &Record) -> String {
    let head = format!(
        "{} {} {}({}) {}",
        shown(&r.time),
        shown(&r.host),
        shown(&r.user.name),
        r.user.uid,
        r.front_end.name()
    );
    match &r.event {
        Event::Signal(s) => {
            let t = &s.target;
            let owner = t.uid.map_or_else(|| "?".into(), crate::process::user_name);
            let owner = shown(&owner);
            format!(
                "{head} {} -> pid {} ({}, {owner}, start {}): {} [{}] {}",
                s.signal,
                t.pid,
                shown(&t.comm),
                t.start,
                s.outcome,
                shown(&s.why),
                shown(&r.asked())
            )
        }
        Event::Call(c) => {
            let signalled = if c.signalled.is_empty() {
                String::new()
            } else {
                let pids: Vec<String> = c.signalled.iter().map(|p| p.to_string()).collect();
                format!(" signalled [{}]", pids.join(","))
            };
            format!(
                "{head} {} {}{signalled} {} ({} ms, server {}): {}",
                shown(&c.tool),
                c.result,
                shown(&c.arguments.to_string()),
                c.elapsed_ms,
                r.gpuloop_pid,
                shown(&c.summary)
            )
        }
    }
}

impl Record {
    /// What asked for the signal: the server call, or the command line.
    fn asked(&self) -> String {
        match &self.call {
            Some(c) => format!("call {c}"),
            None => format!("`{}`", self.argv.join(" ")),
        }
    }
}
