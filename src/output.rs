//! Standard output for everything gpuloop prints: a closed pipe (`gpuloop gpus | head -1`)
//! ends the output quietly instead of panicking, as coreutils and ripgrep do.

use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` and a newline to stdout.
pub fn line(text: &str) {
    write(format_args!("{text}\n"));
}

/// Writes `text` as it is.
pub fn text(text: &str) {
    write(format_args!("{text}"));
}

/// Writes raw bytes (generated completions, man pages).
pub fn bytes(data: &[u8]) {
    if closed() {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(data).and_then(|()| out.flush()) {
        failed(e);
    }
}

fn write(args: std::fmt::Arguments) {
    bytes(args.to_string().as_bytes());
}

fn failed(e: std::io::Error) {
    // Whoever read our output has stopped: nothing later can reach them either.
    CLOSED.store(true, Ordering::SeqCst);
    if e.kind() != ErrorKind::BrokenPipe {
        eprintln!("gpuloop: cannot write to stdout: {e}");
    }
}

/// True once stdout is gone: scripts stop at their next statement, commands print no more.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// `println!` that ends quietly on a closed pipe.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::output::line(&format!($($t)*))
    };
}
