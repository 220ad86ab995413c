//! Criterion benchmarks of the in-process primitives on this machine's real process table:
//! the /proc GPU scan, the maps parser, the simulator's gpu() and the holders() join; and the
//! per-host work of a `--host` client: parsing a host's `gpus` reply and building the script's
//! maps from it.

use criterion::{criterion_group, criterion_main, Criterion};
use gpuloop::gpu::sim::SimBackend;
use gpuloop::gpu::{Backend, DeviceNodes, Gpu};
use gpuloop::inspect::holders::Inventory;
use gpuloop::process::scan;
use std::hint::black_box;

/// A CUDA process's maps: ~2,000 lines, a few of them device nodes.
fn cuda_like_maps() -> Vec<u8> {
    let mut s = String::new();
    for i in 0..2000u64 {
        let path = match i % 400 {
            0 => "/dev/nvidiactl",
            1 => "/dev/nvidia0",
            2 => "/dev/nvidia-uvm",
            3..=200 => "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
            _ => "",
        };
        s.push_str(&format!(
            "{:012x}-{:012x} rw-s 00000000 00:05 {} {}\n",
            0x7f00_0000_0000u64 + i * 4096,
            0x7f00_0000_1000u64 + i * 4096,
            1000 + i,
            path
        ));
    }
    s.into_bytes()
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = SimBackend::open(dir.path(), Some("8x80G")).expect("sim");
    let nodes = DeviceNodes::new(dir.path().join("dev"));
    let maps = cuda_like_maps();
    let real = DeviceNodes::new("/dev");
    let config = gpuloop::config::UserConfig::default();
    let (protected, roots) = (config.protected, config.containers);

    c.bench_function("scan /proc (all processes, fds)", |b| {
        b.iter(|| black_box(scan::scan(&nodes, &|_| {})))
    });
    c.bench_function("parse_maps 2000-line CUDA maps", |b| {
        b.iter(|| black_box(scan::parse_maps(black_box(&maps), &real)))
    });
    c.bench_function("sim gpu() 8 GPUs", |b| b.iter(|| black_box(sim.gpus())));
    c.bench_function("holders() inventory, sim 8 GPUs", |b| {
        b.iter(|| black_box(Inventory::take(&sim, &protected, &roots)))
    });
    // One host's reply to `gpus` as the agent writes it, and what the client does with it.
    let reply = serde_json::to_string(&sim.gpus().expect("sim gpus")).expect("json");
    c.bench_function("client: parse one host's gpus reply, 8 GPUs", |b| {
        b.iter(|| black_box(serde_json::from_str::<Vec<Gpu>>(black_box(&reply)).expect("parse")))
    });
    let gpus: Vec<Gpu> = serde_json::from_str(&reply).expect("parse");
    c.bench_function("client: 8 GPU records to script maps, and dropped", |b| {
        b.iter(|| black_box(gpuloop::script::convert::to_array(black_box(&gpus)).expect("maps")))
    });
}

criterion_group!(primitives, benches);
criterion_main!(primitives);
