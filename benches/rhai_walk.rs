//! What Rhai itself costs a call that returns many records: after a native function returns
//! an array of maps, Rhai walks it once for its size limits and, for `let`, once more to set
//! each value's access mode. This times both, for 64 hosts' worth of GPU records (512 maps of
//! 14 fields), built on the script's own thread (`same`), on 4 other threads as gpuloop's
//! shards build them (`cross`), or on 4 other threads and then touched on the script's
//! (`warm`: the cost of moving them into its cache first).
//!
//!     cargo bench --bench rhai_walk --no-run   (then run the binary it names)
//!     rhai_walk HOSTS on|off same|cross|warm     (on: gpuloop's size limits set)
//!
//! Prints, per script form, the median per call, the native function's median, and the
//! difference: Rhai's own work on the result.
use gpuloop::gpu::Gpu;
use rhai::{Array, Engine};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

/// One host's 8 records, as gpuloop's simulator reports an idle 8x80G machine.
fn gpus(h: usize) -> Vec<Gpu> {
    (0..8)
        .map(|i| {
            let mut g = Gpu::new(
                i,
                i,
                format!("GPU-9e3779b9-5151-4000-8000-00000000000{i}"),
                "Simulated GPU 80GB".into(),
                format!("00000000:1{i}:00.0"),
                85899345920,
                0,
                Vec::new(),
            );
            (g.util, g.temp_c, g.host) = (Some(0), Some(34), format!("h{h:02}"));
            g
        })
        .collect()
}

fn maps(h: usize) -> Array {
    gpus(h)
        .iter()
        .map(|g| rhai::serde::to_dynamic(g).unwrap())
        .collect()
}
fn main() {
    let hosts: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let limits = std::env::args().nth(2).unwrap() == "on";
    let mode = std::env::args().nth(3).unwrap();
    let cross = mode != "same";
    let warm = mode == "warm";
    let mut e = Engine::new();
    if limits {
        e.set_max_array_size(10_000_000);
        e.set_max_map_size(1_000_000);
        e.set_max_string_size(1 << 28);
    }
    // worker threads that build maps, like shards
    let (tx, rx) = mpsc::channel::<mpsc::Sender<Array>>();
    let rx = Arc::new(Mutex::new(rx));
    let nthreads = 4;
    for _ in 0..nthreads {
        let rx = rx.clone();
        std::thread::spawn(move || loop {
            let r = rx.lock().unwrap().recv();
            match r {
                Ok(back) => {
                    let mut all = Array::new();
                    for h in 0..hosts / nthreads {
                        all.extend(maps(h));
                    }
                    back.send(all).unwrap();
                }
                Err(_) => return,
            }
        });
    }
    let tx = Mutex::new(tx);
    let native = Arc::new(Mutex::new(Vec::<f64>::new()));
    let n2 = native.clone();
    e.register_fn("f", move || -> Array {
        let t = Instant::now();
        let out = if cross {
            let mut all = Array::new();
            let mut rxs = vec![];
            for _ in 0..nthreads {
                let (b, r) = mpsc::channel();
                tx.lock().unwrap().send(b).unwrap();
                rxs.push(r);
            }
            for r in rxs {
                all.extend(r.recv().unwrap());
            }
            all
        } else {
            let mut all = Array::new();
            for h in 0..hosts {
                all.extend(maps(h));
            }
            all
        };
        let mut out = out;
        if warm {
            for m in out.iter_mut() {
                if let Some(mut map) = m.write_lock::<rhai::Map>() {
                    for v in map.values_mut() {
                        let t = v.tag();
                        v.set_tag(t);
                    }
                }
            }
        }
        n2.lock().unwrap().push(t.elapsed().as_secs_f64());
        out
    });
    for script in ["let g = f();", "f();", "let g = f(); g = ();"] {
        native.lock().unwrap().clear();
        let n = 2000;
        let full = format!("let d = []; for i in 0..{n} {{ let a = timestamp(); {script} d.push(a.elapsed); }} d.sort(); d[d.len()/2]");
        let t = Instant::now();
        let med: f64 = e.eval(&full).unwrap();
        let tot = t.elapsed().as_secs_f64();
        let mut nat = native.lock().unwrap().clone();
        nat.sort_by(f64::total_cmp);
        let nm = nat[nat.len() / 2];
        println!("{hosts} hosts limits={limits} mode={mode} {script:24} median {:.1} us, native median {:.1} us, after native {:.1} us, mean {:.1} us", med*1e6, nm*1e6, (med-nm)*1e6, tot/n as f64*1e6);
    }
}
