//! Fuzz target: hostlist expressions (`gpu[01-16],login1`) -> host names, within the limits
//! on how many and how long.
#![no_main]

use gpuloop::hosts::hostlist::{expand, MAX_HOSTS, MAX_NAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(names) = expand(text) {
            assert!(!names.is_empty() && names.len() <= MAX_HOSTS);
            assert!(names.iter().all(|n| n.len() <= MAX_NAME));
        }
    }
});
