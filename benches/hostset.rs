//! Issue 33, item 6: what a large host set costs gpuloop itself, in process, at 2,000, 16,000
//! and 65,536 hosts (benches/hostset.py measures the whole command: a usage error's exit,
//! Ctrl-C to exit):
//! - parse: `hostlist::expand("h[1-N]")`;
//! - fold: `fold::compress` of those names (a summary's hostlist), and of names that share no
//!   group (`n<i>x<i>`: one bracket each, the worst case for the grouping);
//! - pool: `Pool::connect` over the set with the interrupt already set, and its drop: the
//!   runtimes, a task per host, the semaphore and the slots, without any ssh started (the
//!   interrupt is seen before the first permit is taken).
//!
//!     cargo bench --bench hostset            (SIZES=2000,16000,65536 REPS=5)
//!
//! One JSON line per size: the median and the slowest of REPS runs, in ms.
use gpuloop::hosts::{fold, hostlist, HostsConfig, Pool, Transport};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, f64) {
    let mut ms: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    (ms[ms.len() / 2], ms[ms.len() - 1])
}

fn main() {
    let sizes: Vec<usize> = std::env::var("SIZES")
        .unwrap_or_else(|_| "2000,16000,65536".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5)
        .max(1);
    // Set before any pool is made: every host's opening ends before it starts anything.
    static STOP: AtomicBool = AtomicBool::new(true);
    for n in sizes {
        let expr = format!("h[1-{n}]");
        let parse = time(reps, || hostlist::expand(&expr).expect("a hostlist"));
        let names = hostlist::expand(&expr).expect("a hostlist");
        let fold = time(reps, || fold::compress(&names));
        let apart: Vec<String> = (0..n).map(|i| format!("n{i}x{i}")).collect();
        let fold_apart = time(reps, || fold::compress(&apart));
        let pool = time(reps, || {
            let config = HostsConfig {
                hosts: names.clone(),
                transport: Transport::ssh(None, None),
                fanout: 32,
                skip_unreachable: false,
                connect_timeout: Duration::from_secs(30),
                call_timeout: Duration::from_secs(60),
                progress: false,
            };
            drop(Pool::connect(config, &STOP));
        });
        println!(
            "{{\"hosts\":{n},\"parse_ms\":[{:.2},{:.2}],\"fold_ms\":[{:.2},{:.2}],\"fold_apart_ms\":[{:.2},{:.2}],\"pool_setup_and_drop_ms\":[{:.2},{:.2}]}}",
            parse.0, parse.1, fold.0, fold.1, fold_apart.0, fold_apart.1, pool.0, pool.1
        );
    }
}
