//! Driver faults: a backend that fails the way NVML does (errors, garbage pids, calls that
//! never return), behind the same deadline wrapper the NVML backend runs behind.

use gpuloop::gpu::deadline::Deadline;
use gpuloop::gpu::{Backend, DeviceNodes, DriverProc, Gpu, GpuError, MIB};
use gpuloop::inspect::holders::Inventory;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the next driver call does.
enum Fault {
    Answer,
    Error(&'static str),
    /// Blocks until the sender is dropped or sends: a call stuck in the driver.
    Hang(mpsc::Receiver<()>),
}

struct Faulty {
    nodes: DeviceNodes,
    fault: Mutex<Fault>,
    /// The pids the driver lists on GPU 0.
    listed: Vec<i32>,
}

impl Faulty {
    fn new(listed: Vec<i32>) -> Faulty {
        Faulty {
            nodes: DeviceNodes::new("/nonexistent-gpuloop-test/dev"),
            fault: Mutex::new(Fault::Answer),
            listed,
        }
    }
}

impl Backend for Faulty {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn gpus(&self) -> Result<Vec<Gpu>, GpuError> {
        let hang = match &*self.fault.lock().unwrap() {
            Fault::Answer => None,
            Fault::Error(e) => return Err(GpuError::Nvml(e.to_string())),
            Fault::Hang(_) => Some(()),
        };
        if hang.is_some() {
            // Hold no lock while hung: take the receiver out and wait on it.
            let rx = match std::mem::replace(&mut *self.fault.lock().unwrap(), Fault::Answer) {
                Fault::Hang(rx) => rx,
                _ => unreachable!(),
            };
            let _ = rx.recv();
        }
        let procs = self
            .listed
            .iter()
            .map(|&pid| DriverProc { pid, mem: 64 * MIB })
            .collect();
        Ok(vec![Gpu::new(
            0,
            0,
            "GPU-faulty".into(),
            "Faulty".into(),
            "0000:00:00.0".into(),
            1024 * MIB,
            64 * MIB,
            procs,
        )])
    }

    fn nodes(&self) -> &DeviceNodes {
        &self.nodes
    }

    fn foreign_pid_namespace(&self) -> bool {
        false
    }

    fn reset(&self, _: i64) -> Result<(), GpuError> {
        Ok(())
    }
}

#[test]
fn a_hung_driver_call_is_given_up_after_the_deadline_and_blocks_nothing_after() {
    let faulty = Arc::new(Faulty::new(vec![]));
    let (release, rx) = mpsc::channel();
    *faulty.fault.lock().unwrap() = Fault::Hang(rx);
    let bounded = Deadline::new(faulty.clone(), Duration::from_millis(300));
    let e = bounded.gpus().unwrap_err().to_string();
    assert!(e.contains("did not return within 0.3 s"), "{e}");
    // While that call is stuck, later ones fail at once rather than pile up.
    let e = bounded.mem_used(&[0]).unwrap_err().to_string();
    assert!(e.contains("earlier driver call has not returned"), "{e}");
    // Inventory (what holders/diagnose/wait_clean use) reports it as an error, no panic.
    assert!(Inventory::take(&bounded, &[]).is_err());
    // The driver comes back: so does gpuloop.
    release.send(()).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match bounded.gpus() {
            Ok(g) => {
                assert_eq!(g.len(), 1);
                break;
            }
            Err(e) => assert!(std::time::Instant::now() < end, "never recovered: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_driver_error_is_an_error_not_a_panic_nor_an_empty_clean_answer() {
    let faulty = Arc::new(Faulty::new(vec![]));
    *faulty.fault.lock().unwrap() = Fault::Error("GPU is lost");
    let bounded = Deadline::new(faulty, Duration::from_secs(10));
    let e = Inventory::take(&bounded, &[]).err().unwrap().to_string();
    assert!(e.contains("GPU is lost"), "{e}");
}

/// Drivers return garbage entries: pid 0, negative and absurd pids, init, and pids of live
/// processes that use no GPU at all. None of them may become a holder (and so a target).
#[test]
fn garbage_pids_from_the_driver_never_become_holders() {
    let mut bystander = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let by = bystander.id() as i32;
    let me = std::process::id() as i32;
    let faulty = Arc::new(Faulty::new(vec![0, -5, 1, i32::MAX, 4_194_304, me, by]));
    let bounded = Deadline::new(faulty, Duration::from_secs(10));
    let inv = Inventory::take(&bounded, &[]).unwrap();
    assert!(
        inv.holders.is_empty(),
        "{:?}",
        inv.holders.iter().map(|h| h.pid).collect::<Vec<_>>()
    );
    // They are reported as what they are: listed by the driver, not holders here.
    let ghosts = inv.ghosts.get(&0).cloned().unwrap_or_default();
    assert!(ghosts.contains(&i64::from(by)), "{ghosts:?}");
    let _ = bystander.kill();
    let _ = bystander.wait();
}
