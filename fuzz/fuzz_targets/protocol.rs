//! Fuzz target: the agent protocol decoders, both sides of the wire. The agent's
//! `parse_request` on any line (a request it accepts re-encodes to a line it accepts again;
//! one it refuses gets an error reply that encodes to one line), and the client's reader of
//! the agent's lines (`Message::read`: a message it reads re-encodes to one line that reads
//! back the same; and the result replies it hands on whole, `ok_reply_id` and
//! `Answered::parse`, which must agree with `Message::read`) and of reply results into the
//! records it hands on.
#![no_main]

use gpuloop::gpu::Gpu;
use gpuloop::hosts::protocol::{self, Answered, Body, JobState, Message, Request};
use gpuloop::inspect::diagnose::Diagnosis;
use gpuloop::inspect::holders::Holder;
use gpuloop::process::kill::KillReport;
use gpuloop::runner::Outcome;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    // The agent side.
    match protocol::parse_request(line) {
        Ok(r) => {
            let again = serde_json::to_string(&r).expect("a parsed request encodes");
            let back: Request = protocol::parse_request(&again)
                .unwrap_or_else(|e| panic!("{again} no longer parses: {e:?}"));
            assert_eq!(back.id, r.id);
            assert_eq!(back.call.method(), r.call.method());
        }
        Err(reply) => {
            assert!(matches!(reply, Message::Reply { body: Body::Error(_), .. }));
            let text = reply.line();
            assert!(!text.contains('\n'), "{text}");
            assert_eq!(Message::read(&text).expect("an error reply reads back"), reply);
        }
    }
    // The client side: what `read_replies` does with each line of the agent's (its reader
    // splits at newlines, so a line it reads never holds one).
    for line in line.split('\n') {
        // A line that starts as the agent writes a result goes to its caller whole: what
        // the caller's parse takes, the general reader takes too, with the same id and result.
        if let Some(id) = protocol::ok_reply_id(line) {
            let whole = Answered::Line(line.to_string());
            if let Ok(v) = whole.parse::<serde_json::Value>() {
                match Message::read(line) {
                    Ok(Message::Reply { id: Some(i), body: Body::Ok(raw) }) => {
                        assert_eq!(i, id, "{line}");
                        let general: serde_json::Value =
                            serde_json::from_str(raw.get()).expect("a read result is JSON");
                        assert_eq!(general, v, "{line}");
                    }
                    other => panic!("{line}: the caller's parse took it, the reader: {other:?}"),
                }
            }
            let _ = whole.parse::<Vec<Gpu>>();
            let _ = whole.parse::<Vec<Holder>>();
            let _ = whole.parse::<KillReport>();
        }
        let Ok(m) = Message::read(line) else {
            continue;
        };
        let text = m.line();
        assert!(!text.contains('\n'), "{text}");
        assert_eq!(Message::read(&text).expect("a message read re-encodes readably"), m);
        if let Message::Reply { body: Body::Ok(v), .. } = m {
            let v = v.get();
            let _ = serde_json::from_str::<Vec<Gpu>>(v);
            let _ = serde_json::from_str::<Vec<Holder>>(v);
            let _ = serde_json::from_str::<Vec<Diagnosis>>(v);
            let _ = serde_json::from_str::<KillReport>(v);
            let _ = serde_json::from_str::<JobState>(v);
            let _ = serde_json::from_str::<Outcome>(v);
        }
    }
});
