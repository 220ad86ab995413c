//! Churn: about a thousand short-lived processes a second, some of them holding simulated
//! GPUs, while holders()/kill()/wait_clean() run in a loop in one gpuloop and `gpuloop clean`
//! runs again and again beside it. Every signal gpuloop sends is logged (GPULOOP_SIGNAL_LOG)
//! and checked against the processes that were GPU holders: zero errors, zero panics, zero
//! signals to anything else. GPULOOP_CHURN_SECS makes the run longer (RELIABILITY.md).

use crate::support::*;
use std::collections::HashSet;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// (pid, start) of every process that held a GPU node: the only legitimate targets.
type Legit = Arc<Mutex<HashSet<(i64, u64)>>>;

/// Pids `sim hold` printed, with the clock-tick window of that call: a holder the loop kills
/// before the test can read its start time still started inside that window.
type Windows = Arc<Mutex<Vec<(i64, u64, u64)>>>;

/// Clock ticks since boot now (what /proc/PID/stat's start time counts).
fn ticks_now() -> u64 {
    let up = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    let secs: f64 = up
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    (secs * unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64) as u64
}

/// Forks a child that does nothing (`node` None) or maps the GPU node and holds it for a few
/// milliseconds; only async-signal-safe calls run in the child.
fn fork_one(node: Option<&CString>, hold_ms: u64) -> i32 {
    // SAFETY: the child calls only async-signal-safe functions (open, mmap, write, nanosleep,
    // _exit) on data prepared before the fork; a vfork child only calls _exit.
    unsafe {
        if node.is_none() {
            #[allow(deprecated)]
            let pid = libc::vfork();
            if pid == 0 {
                libc::_exit(0);
            }
            return pid;
        }
        let mut fds = [0; 2];
        if node.is_some() && libc::pipe(fds.as_mut_ptr()) != 0 {
            return -1;
        }
        let pid = libc::fork();
        if pid == 0 {
            if let Some(node) = node {
                libc::setpgid(0, 0);
                let fd = libc::open(node.as_ptr(), libc::O_RDWR);
                if fd >= 0 {
                    libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        fd,
                        0,
                    );
                }
                libc::write(fds[1], b"x".as_ptr().cast(), 1);
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: (hold_ms * 1_000_000) as i64,
                };
                libc::nanosleep(&ts, std::ptr::null_mut());
            }
            libc::_exit(0);
        }
        if node.is_some() {
            libc::close(fds[1]);
            if pid > 0 {
                let mut b = [0u8; 1];
                libc::read(fds[0], b.as_mut_ptr().cast(), 1);
            }
            libc::close(fds[0]);
        }
        pid
    }
}

fn reap(pid: i32) {
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
}

#[test]
fn churn_no_signal_reaches_a_process_that_was_not_a_holder() {
    let secs: u64 = std::env::var("GPULOOP_CHURN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let sim = Arc::new(Sim::new("4x16G"));
    // The simulator's state (and its device nodes) exists once it has been used.
    sim.gpus();
    let log = sim.path().join("signals.log");
    let legit: Legit = Arc::default();
    let windows: Windows = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let (forked, gpu_forked, sim_holders) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut threads = Vec::new();

    // 1. ~1000 short-lived processes a second; one in ten maps a GPU node for 1–20 ms.
    {
        let (stop, legit, forked, gpu_forked) = (
            stop.clone(),
            legit.clone(),
            forked.clone(),
            gpu_forked.clone(),
        );
        let nodes: Vec<CString> = (0..4)
            .map(|i| {
                CString::new(
                    sim.path()
                        .join(format!("state/dev/nvidia{i}"))
                        .to_str()
                        .unwrap(),
                )
                .unwrap()
            })
            .collect();
        threads.push(std::thread::spawn(move || {
            let mut n: u64 = 0;
            let began = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                // Pace to about 1000 a second.
                let due = began + Duration::from_micros(n * 1000);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                n += 1;
                if n.is_multiple_of(10) {
                    let node = &nodes[(n / 10 % 4) as usize];
                    let pid = fork_one(Some(node), 1 + n % 20);
                    if pid > 0 {
                        // Still alive (or a zombie until reaped): its identity is stable.
                        if let Some(start) = start_of(pid) {
                            legit.lock().unwrap().insert((pid.into(), start));
                        }
                        gpu_forked.fetch_add(1, Ordering::Relaxed);
                        std::thread::spawn(move || reap(pid));
                    }
                } else {
                    let pid = fork_one(None, 0);
                    if pid > 0 {
                        reap(pid);
                    }
                }
                forked.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    // 2. Simulated GPU holders, started one after another (the holders are targets; their
    // launchers, which hold nothing, are not).
    {
        let (stop, legit, sim, count, windows) = (
            stop.clone(),
            legit.clone(),
            sim.clone(),
            sim_holders.clone(),
            windows.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let gpu = (i % 4).to_string();
                let lo = ticks_now();
                let out = sim.run(&["sim", "hold", "--gpu", &gpu, "--mib", "64"]);
                let hi = ticks_now();
                // A holder the loop kills while it starts makes `sim hold` fail, and its pid
                // is never printed: such holders are known by name and start window only.
                windows.lock().unwrap().push((0, lo, hi));
                if out.code != 0 {
                    continue;
                }
                for p in out
                    .stdout
                    .lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                {
                    sim.adopt(p);
                    windows.lock().unwrap().push((p.into(), lo, hi));
                    if let Some(start) = start_of(p) {
                        legit.lock().unwrap().insert((p.into(), start));
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    // 3. `gpuloop clean` again and again, beside the script below.
    let cleans = Arc::new(Mutex::new(Vec::new()));
    {
        let (stop, sim, log, cleans) = (stop.clone(), sim.clone(), log.clone(), cleans.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = sim.run_with(
                    &["--json", "clean", "--grace", "0.2", "--timeout", "0.3"],
                    |c| {
                        c.env("GPULOOP_SIGNAL_LOG", &log);
                    },
                );
                cleans.lock().unwrap().push((out.code, out.stderr));
            }
        }));
    }

    // 4. The loop a script would run.
    let script = format!(
        r#"let end = now() + {secs}.0;
let rounds = 0; let signalled = 0; let errors = [];
while now() < end {{
    let hs = holders();
    let r = kill(hs, #{{grace: 0.2}});
    signalled += r.signalled.len();
    errors += r.errors;
    wait_clean((), #{{timeout: 0.1, quiet: true}});
    rounds += 1;
}}
print(`rounds=${{rounds}} signalled=${{signalled}} errors=${{errors.len()}} ${{errors}}`);"#
    );
    let began = Instant::now();
    let out = sim.run_with(
        &["run", sim.path().join("churn.rhai").to_str().unwrap()],
        |c| {
            std::fs::write(sim.path().join("churn.rhai"), &script).unwrap();
            c.env("GPULOOP_SIGNAL_LOG", &log);
        },
    );
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = began.elapsed().as_secs_f64();
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    let summary = out.stdout.lines().last().unwrap_or_default().to_string();
    assert!(summary.contains("errors=0 "), "{summary}");
    for (code, stderr) in cleans.lock().unwrap().iter() {
        assert!(matches!(code, 0 | 1), "clean exited {code}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    // Every signal went to a process that held a GPU node, identified by (pid, start).
    let legit = legit.lock().unwrap();
    let windows = windows.lock().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut wrong = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let id = (f[0].parse::<i64>().unwrap(), f[1].parse::<u64>().unwrap());
        let comm = f.get(4..).map(|c| c.join(" ")).unwrap_or_default();
        // A simulated holder (named python3, as `sim hold` names them) that started during
        // a `sim hold` call; the churn's own processes and the launchers have other names.
        let in_window = comm == "python3"
            && windows.iter().any(|&(p, lo, hi)| {
                (p == 0 || p == id.0) && lo.saturating_sub(1) <= id.1 && id.1 <= hi + 1
            });
        if !legit.contains(&id) && !in_window {
            wrong.push(line.to_string());
        }
    }
    let forked = forked.load(Ordering::Relaxed);
    let figures = format!(
        "{elapsed:.1} s: {forked} processes forked ({:.0}/s), {} of them mapping a GPU node, {} sim holders, {} clean runs, {summary}, {} signals logged",
        forked as f64 / elapsed,
        gpu_forked.load(Ordering::Relaxed),
        sim_holders.load(Ordering::Relaxed),
        cleans.lock().unwrap().len(),
        text.lines().count()
    );
    eprintln!("churn: {figures}");
    assert!(
        wrong.is_empty(),
        "signals to non-targets: {wrong:?}\n{figures}"
    );
    // The run did what it claims: real churn, and holders really were killed. How fast the
    // machine forks is a figure (printed above), not something a test may require.
    assert!(forked > 0, "{figures}");
    assert!(gpu_forked.load(Ordering::Relaxed) > 0, "{figures}");
    assert!(sim_holders.load(Ordering::Relaxed) > 0, "{figures}");
    assert!(text.lines().count() > 0, "{figures}");
}
