//! Fuzz target: the unified-diff parser and hunk application behind apply_patch, as a dry
//! run against one small file (nothing is written).
#![no_main]

use gpuloop::runner::patch::{apply, Direction};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The file the diffs are tried against, in a private directory (run.sh points TMPDIR at one
/// it removes afterwards).
fn target() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gpuloop-fuzz-patch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzz directory");
        let file = dir.join("train.py");
        std::fs::write(&file, "import torch\nlr = 0.1\nbatch = 32\nprint(lr)\n")
            .expect("write the target file");
        file
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(diff) = std::str::from_utf8(data) {
        for direction in [Direction::Apply, Direction::Revert] {
            let _ = apply(target(), diff, direction, true);
        }
    }
});
