//! Bounded capture of a job's output: the first and the last bytes, a marker for the middle.
//!
//! A job may print gigabytes (a training loop at debug level); gpuloop keeps at most
//! `HEAD + TAIL` bytes per stream however much goes through, and says how much it dropped.

/// Bytes kept from the start of a stream (the command's banner, its configuration).
pub(crate) const HEAD: usize = 256 * 1024;
/// Bytes kept from the end of a stream (where the traceback is).
pub(crate) const TAIL: usize = 1024 * 1024;

/// A fixed-size ring holding the last `cap` bytes pushed into it.
#[derive(Debug)]
struct Ring {
    buf: Vec<u8>,
    cap: usize,
    /// Index of the oldest byte once the ring is full.
    start: usize,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            buf: Vec::new(),
            cap,
            start: 0,
        }
    }

    fn len(&self) -> usize {
        self.buf.len()
    }

    fn push(&mut self, mut data: &[u8]) {
        if self.cap == 0 {
            return;
        }
        if data.len() >= self.cap {
            data = &data[data.len() - self.cap..];
            self.buf.clear();
            self.buf.extend_from_slice(data);
            self.start = 0;
            return;
        }
        // Still filling: append what fits, wrap the rest.
        let room = self.cap - self.buf.len();
        let fill = room.min(data.len());
        self.buf.extend_from_slice(&data[..fill]);
        data = &data[fill..];
        while !data.is_empty() {
            let n = (self.cap - self.start).min(data.len());
            self.buf[self.start..self.start + n].copy_from_slice(&data[..n]);
            self.start = (self.start + n) % self.cap;
            data = &data[n..];
        }
    }

    fn contiguous(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.buf.len());
        out.extend_from_slice(&self.buf[self.start..]);
        out.extend_from_slice(&self.buf[..self.start]);
        out
    }
}

/// One stream's capture: head, tail ring, and the total seen.
#[derive(Debug)]
pub(crate) struct Capture {
    head: Vec<u8>,
    head_cap: usize,
    tail: Ring,
    total: u64,
}

impl Default for Capture {
    fn default() -> Self {
        Capture::with_limits(HEAD, TAIL)
    }
}

impl Capture {
    pub(crate) fn with_limits(head: usize, tail: usize) -> Capture {
        Capture {
            head: Vec::new(),
            head_cap: head,
            tail: Ring::new(tail),
            total: 0,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let fill = (self.head_cap - self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..fill]);
        self.tail.push(&data[fill..]);
    }

    /// Bytes that went through but are kept neither in the head nor in the tail.
    pub(crate) fn dropped(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    /// The kept text; invalid UTF-8 is replaced (U+FFFD), never an error. When bytes were
    /// dropped, a line `[gpuloop: N bytes dropped]` stands where they were, and the tail
    /// starts at a line boundary when one is near.
    pub(crate) fn text(&self) -> String {
        let tail = self.tail.contiguous();
        let dropped = self.dropped();
        if dropped == 0 {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        // Start the tail on a whole line if a newline is within its first 4 KiB.
        let cut = tail
            .iter()
            .take(4096)
            .position(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!(
            "[gpuloop: {} bytes dropped]\n",
            dropped + cut as u64
        ));
        out.push_str(&String::from_utf8_lossy(&tail[cut..]));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_everything_below_the_limits() {
        let mut c = Capture::with_limits(4, 8);
        c.push(b"ab");
        c.push(b"cdefg");
        assert_eq!(c.text(), "abcdefg");
        assert_eq!(c.dropped(), 0);
    }

    #[test]
    fn keeps_head_and_tail_with_a_marker() {
        let mut c = Capture::with_limits(4, 6);
        for chunk in [&b"HEAD"[..], b"middle-", b"more-middle", b"\nTAIL!"] {
            c.push(chunk);
        }
        // total 28, kept 4 + 6; the tail starts after its newline.
        assert_eq!(c.text(), "HEAD\n[gpuloop: 19 bytes dropped]\nTAIL!");
    }

    #[test]
    fn ring_wraps_many_times_and_keeps_order() {
        let mut c = Capture::with_limits(0, 5);
        for i in 0..1000u32 {
            c.push(format!("{}", i % 10).as_bytes());
        }
        assert_eq!(c.tail.contiguous(), b"56789");
        c.push(b"0123456789abc");
        assert_eq!(c.tail.contiguous(), b"89abc");
        assert_eq!(c.dropped(), 1013 - 5);
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let mut c = Capture::default();
        c.push(b"ok \xff\xfe end");
        assert_eq!(c.text(), "ok \u{fffd}\u{fffd} end");
    }
}
