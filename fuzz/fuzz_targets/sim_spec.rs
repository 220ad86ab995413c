//! Fuzz target: the simulator spec parser (`--sim 8x80G,minors=...`).
#![no_main]

use gpuloop::gpu::sim::SimSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = std::str::from_utf8(data) {
        if let Ok(s) = SimSpec::parse(spec) {
            // What the parser promises: a count in range, one minor per GPU.
            assert!((1..=64).contains(&s.count));
            assert_eq!(s.minors.len(), s.count);
            assert!(s.mem_bytes > 0);
        }
    }
});
