//! Fuzz target: the config file parser (config.toml -> UserConfig).
#![no_main]

use gpuloop::config::UserConfig;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = UserConfig::parse(Path::new("config.toml"), text);
    }
});
