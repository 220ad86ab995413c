//! The floor under any client's fan-out: one request to N agents at once, over the same
//! transport gpuloop uses, answered by the same `gpuloop agent`s, with a client that does
//! nothing but write the request lines and wait for the reply lines (no JSON read, no maps,
//! no script, no runtime: one thread, poll(2)).
//!
//!     cargo bench --bench fanout_floor --no-run   (then run the binary it names)
//!     fanout_floor SSH_CONFIG REMOTE_BIN CALLS METHOD N [N ...]
//!
//! METHOD is `gpus` (what gpu() asks each host) or `ping` (answered by the agent's reader at
//! once, with no work). WRITERS=K (env) writes each round's requests from K threads at once
//! (at most one per host), as gpuloop's shards do; by default one thread writes them all. `ssh` is whatever is first on PATH (benches/pipe_transport.py's for
//! the pipe transport), started as gpuloop starts it. For each N it prints one JSON line:
//! medians and 10th/90th percentiles (ms) of the whole round, of the writes alone, and of the
//! first and last reply. benches/hosts.py runs it beside gpuloop's own session (FLOOR=BIN).
//! It signals nothing: its agents end when their stdin closes, and it waits for each.
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};

struct Agent {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

fn start(config: &str, remote_bin: &str, host: &str) -> Agent {
    let mut child = Command::new("ssh")
        .args(["-o", "BatchMode=yes", "-T", "-F", config, "--", host])
        .arg(format!("{remote_bin} agent"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("ssh {host}: {e}"));
    let mut out = BufReader::with_capacity(1 << 20, child.stdout.take().expect("piped"));
    let mut hello = String::new();
    out.read_line(&mut hello).expect("hello");
    assert!(hello.contains("\"hello\""), "{host} said {hello:?}");
    Agent { child, out }
}

fn pct(xs: &mut [f64], p: f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() - 1) as f64 * p).round() as usize;
    (xs[i] * 1e6).round() / 1e3
}

/// Writer threads, each with its share of the agents' stdins: a round's requests are
/// written by all of them at once, as gpuloop's shards do, not one after another.
struct Writers {
    start: Vec<std::sync::mpsc::Sender<(u64, Instant)>>,
    done: std::sync::mpsc::Receiver<f64>,
}

impl Writers {
    fn new(agents: &mut [Agent], threads: usize, method: &str) -> Writers {
        let (done_tx, done) = std::sync::mpsc::channel();
        let mut shares: Vec<Vec<std::process::ChildStdin>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (i, a) in agents.iter_mut().enumerate() {
            shares[i % threads].push(a.child.stdin.take().expect("piped"));
        }
        let start = shares
            .into_iter()
            .map(|mut share| {
                let (tx, rx) = std::sync::mpsc::channel::<(u64, Instant)>();
                let (done, method) = (done_tx.clone(), method.to_string());
                std::thread::spawn(move || {
                    for (id, t0) in rx {
                        let line = format!("{{\"id\":{id},\"method\":\"{method}\"}}\n");
                        for stdin in &mut share {
                            stdin.write_all(line.as_bytes()).expect("request");
                        }
                        let _ = done.send(t0.elapsed().as_secs_f64());
                    }
                });
                tx
            })
            .collect();
        Writers { start, done }
    }
}

fn round(agents: &mut [Agent], writers: Option<&Writers>, id: u64, method: &str) -> [f64; 4] {
    let line = format!("{{\"id\":{id},\"method\":\"{method}\"}}\n");
    let t0 = Instant::now();
    match writers {
        None => {
            for a in agents.iter_mut() {
                let stdin = a.child.stdin.as_mut().expect("piped");
                stdin.write_all(line.as_bytes()).expect("request");
            }
        }
        Some(w) => {
            for tx in &w.start {
                tx.send((id, t0)).expect("writer");
            }
        }
    }
    let mut written = t0.elapsed().as_secs_f64();
    let mut left: Vec<usize> = (0..agents.len()).collect();
    let (mut first, mut buf) = (None, vec![0u8; 1 << 16]);
    while !left.is_empty() {
        let mut fds: Vec<PollFd> = left
            .iter()
            .map(|&i| PollFd::new(agents[i].out.get_ref(), PollFlags::IN))
            .collect();
        poll(&mut fds, None).expect("poll");
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        let mut still = Vec::new();
        for (k, &i) in left.iter().enumerate() {
            if !ready[k] || !read_until_line(&mut agents[i].out, &mut buf) {
                still.push(i);
            } else if first.is_none() {
                first = Some(t0.elapsed().as_secs_f64());
            }
        }
        left = still;
    }
    let all = t0.elapsed().as_secs_f64();
    if let Some(w) = writers {
        // When the last writer was done.
        written = (0..w.start.len())
            .map(|_| w.done.recv().expect("writer"))
            .fold(0.0, f64::max);
    }
    [all, written, first.unwrap_or(all), all]
}

/// Reads what is there (non-blocking); true once a whole line has come.
fn read_until_line(out: &mut BufReader<std::process::ChildStdout>, buf: &mut [u8]) -> bool {
    loop {
        match out.get_mut().read(buf) {
            Ok(0) => panic!("an agent closed its stdout"),
            Ok(n) => {
                if buf[..n].contains(&b'\n') {
                    return true;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        eprintln!("usage: fanout_floor SSH_CONFIG REMOTE_BIN CALLS METHOD N [N ...]");
        std::process::exit(2);
    }
    let (config, bin, method) = (&args[0], &args[1], &args[3]);
    let calls: u64 = args[2].parse().expect("CALLS");
    let threads: usize = std::env::var("WRITERS").map_or(1, |w| w.parse().expect("WRITERS"));
    for n in &args[4..] {
        let n: usize = n.parse().expect("N");
        let mut agents: Vec<Agent> = (1..=n)
            .map(|i| start(config, bin, &format!("h{i:02}")))
            .collect();
        for a in &agents {
            let fd = a.out.get_ref().as_fd();
            let fl = fcntl_getfl(fd).expect("getfl");
            fcntl_setfl(fd, fl | OFlags::NONBLOCK).expect("setfl");
        }
        let writers = (threads > 1).then(|| Writers::new(&mut agents, threads.min(n), method));
        let mut cols: [Vec<f64>; 4] = Default::default();
        for id in 0..calls + 10 {
            let r = round(&mut agents, writers.as_ref(), id, method);
            if id >= 10 {
                for (c, x) in cols.iter_mut().zip(r) {
                    c.push(x);
                }
            }
        }
        let [all, written, first, _] = &mut cols;
        println!(
            "{{\"hosts\":{n},\"method\":\"{method}\",\"writers\":{},\"calls\":{calls},\"round_ms\":[{},{},{}],\"writes_ms\":{},\"first_reply_ms\":{}}}",
            writers.as_ref().map_or(1, |w| w.start.len()),
            pct(all, 0.1), pct(all, 0.5), pct(all, 0.9), pct(written, 0.5), pct(first, 0.5)
        );
        // Their stdins close with the writers.
        drop(writers);
        for mut a in agents {
            drop(a.child.stdin.take());
            let _ = a.child.wait();
        }
    }
}
