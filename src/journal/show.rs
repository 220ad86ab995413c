//! A journal record as one line for people.

use super::{Event, Record};

/// One record for people.
pub(crate) fn line(r: &Record) -> String {
    let head = format!(
        "{} {} {}({}) {}",
        r.time,
        r.host,
        r.user.name,
        r.user.uid,
        r.front_end.name()
    );
    match &r.event {
        Event::Signal(s) => {
            let t = &s.target;
            let owner = t.uid.map_or_else(|| "?".into(), crate::process::user_name);
            format!(
                "{head} {} -> pid {} ({}, {owner}, start {}): {} [{}] {}",
                s.signal,
                t.pid,
                t.comm,
                t.start,
                s.outcome,
                s.why,
                r.asked()
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
                c.tool, c.result, c.arguments, c.elapsed_ms, r.gpuloop_pid, c.summary
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
