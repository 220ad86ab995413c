//! Fuzz target: the agent protocol decoders, both sides of the wire. The agent's
//! `parse_request` on any line (a request it accepts re-encodes to a line it accepts again;
//! one it refuses gets an error reply that encodes to one line), and the client's decoding of
//! the agent's lines (`Message`) and of reply bodies into the records it hands on.
#![no_main]

use gpuloop::gpu::Gpu;
use gpuloop::hosts::protocol::{self, Body, Message, Request};
use gpuloop::inspect::diagnose::Diagnosis;
use gpuloop::inspect::holders::Holder;
use gpuloop::process::kill::KillReport;
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
            serde_json::from_str::<Message>(&text).expect("an error reply decodes");
        }
    }
    // The client side.
    if let Ok(m) = serde_json::from_str::<Message>(line) {
        assert!(!m.line().contains('\n'));
        if let Message::Reply { body: Body::Ok(v), .. } = m {
            let _ = serde_json::from_value::<Vec<Gpu>>(v.clone());
            let _ = serde_json::from_value::<Vec<Holder>>(v.clone());
            let _ = serde_json::from_value::<Vec<Diagnosis>>(v.clone());
            let _ = serde_json::from_value::<KillReport>(v);
        }
    }
});
