//! `gpuloop epilog` / `gpuloop prolog`, `--hosts-from-slurm` and `--transport srun` against a
//! real Slurm: slurmctld and slurmd started here (auth/none, everything under a temp dir, free
//! ports), four fake GPUs as character devices in gres.conf, and the simulator's GPUs 0-3
//! numbered as Slurm numbers them, so a sim holder started inside a job holds that job's GPUs.
//! One Slurm serves every case, in order.

use crate::support::*;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

struct Slurm {
    dir: PathBuf,
    node: String,
    conf: PathBuf,
    daemons: Vec<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The GPUs slurmd is told about in gres.conf.
enum Gres {
    /// `File=gres/nvidia[0-3]`: four whole GPUs.
    Gpus,
    /// One MIG gres per device: `MultipleFiles=` the parent's node and the device's two
    /// capability nodes (their minors, as the driver's mig-minors gives them), as a site
    /// without AutoDetect=nvml configures MIG.
    Mig(Vec<(i64, i64)>),
}

/// Makes a character device at `path` (`major`, `minor`), as the driver's nodes are.
fn mknod(path: &std::path::Path, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

impl Slurm {
    /// Writes the configuration and starts both daemons; whatever started is stopped by Drop,
    /// also when a later step fails.
    fn start(sim: &Sim) -> Slurm {
        Slurm::start_with(sim, Gres::Gpus)
    }

    fn start_with(sim: &Sim, gres: Gres) -> Slurm {
        let dir = sim.path().join("slurm");
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .expect("hostname")
            .trim()
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string();
        for sub in ["state", "spool", "gres"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // Character devices of the NVIDIA major: Slurm sets CUDA_VISIBLE_DEVICES and
        // SLURM_JOB_GPUS only for those.
        let d = dir.display().to_string();
        let (gres_conf, count) = match &gres {
            Gres::Gpus => {
                for i in 0..4u32 {
                    mknod(&dir.join(format!("gres/nvidia{i}")), 195, i);
                }
                (format!("Name=gpu File={d}/gres/nvidia[0-3]\n"), 4)
            }
            Gres::Mig(caps) => {
                mknod(&dir.join("gres/nvidia0"), 195, 0);
                let mut conf = String::new();
                for (gi, ci) in caps {
                    for m in [gi, ci] {
                        mknod(&dir.join(format!("gres/nvidia-cap{m}")), 238, *m as u32);
                    }
                    conf.push_str(&format!(
                        "Name=gpu MultipleFiles={d}/gres/nvidia0,{d}/gres/nvidia-cap{gi},{d}/gres/nvidia-cap{ci}\n"
                    ));
                }
                (conf, caps.len())
            }
        };
        let bin = bin();
        let mut env = String::new();
        for (k, v) in sim.std_cmd().get_envs() {
            if let Some(v) = v {
                env.push_str(&format!(
                    "export {}='{}'\n",
                    k.to_string_lossy(),
                    v.to_string_lossy()
                ));
            }
        }
        for hook in ["epilog", "prolog"] {
            let p = dir.join(format!("{hook}.sh"));
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\n{env}exec {} {hook} --timeout 5 --grace 1 2>>{}\n",
                    bin.display(),
                    dir.join("hooks.log").display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=gpuloop\nSlurmctldHost={node}(127.0.0.1)\nSlurmctldPort={}\nSlurmdPort={}\n\
                 AuthType=auth/none\nCredType=cred/none\nSlurmUser=root\nSlurmdUser=root\n\
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
                 ReturnToService=2\nMailProg=/bin/true\nSlurmdParameters=config_overrides\n\
                 JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
                 GresTypes=gpu\nEpilog={d}/epilog.sh\nProlog={d}/prolog.sh\nPrologFlags=Alloc\n\
                 NodeName={node} NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:{count} State=UNKNOWN\n\
                 PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP\n",
                free_port(),
                free_port()
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("gres.conf"),
            format!("AutoDetect=off\n{gres_conf}"),
        )
        .unwrap();
        let mut s = Slurm {
            dir: dir.clone(),
            node: node.clone(),
            conf,
            daemons: Vec::new(),
        };
        for (daemon, args) in [
            ("slurmctld", vec!["-D", "-i"]),
            ("slurmd", vec!["-D", "-N", &node]),
        ] {
            let log = std::fs::File::create(dir.join(format!("{daemon}.out"))).unwrap();
            let child = Command::new(daemon)
                .args(&args)
                .env("SLURM_CONF", &s.conf)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start {daemon} (is Slurm installed? .ci/run installs it): {e}")
                });
            s.daemons.push(child);
        }
        wait_until("the node to come up idle", || s.state() == "idle");
        s
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    fn out(&self, program: &str, args: &[&str]) -> String {
        let o = self.cmd(program).args(args).output().expect(program);
        assert!(
            o.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// The node's state as sinfo prints it: idle, mixed, allocated, completing, drained, ...
    fn state(&self) -> String {
        self.cmd("sinfo")
            .args(["-h", "-N", "-o", "%T"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    fn reason(&self) -> String {
        self.out("sinfo", &["-h", "-R", "-o", "%E"])
    }

    fn job_field(&self, job: i64, field: &str) -> String {
        let out = self.out("scontrol", &["show", "job", &job.to_string(), "-o"]);
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
            .unwrap_or_default()
            .to_string()
    }

    /// Submits a batch script (stdout to a file: an escaped process never holds a pipe of ours).
    fn sbatch(&self, sim: &Sim, gpus: u32, body: &str) -> i64 {
        self.sbatch_env(sim, gpus, body, &[])
    }

    /// `sbatch`, with more environment for the job (sbatch passes it on).
    fn sbatch_env(&self, sim: &Sim, gpus: u32, body: &str, env: &[(&str, &str)]) -> i64 {
        let script = self.dir.join(format!("job-{}.sh", free_port()));
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        let mut c = self.cmd("sbatch");
        for (k, v) in sim.std_cmd().get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        let o = c
            .envs(env.iter().copied())
            .env("GPULOOP", bin())
            .env("OUT", &self.dir)
            .args(["--parsable", "-c", "1", &format!("--gres=gpu:{gpus}")])
            .arg(format!("--output={}/job-%j.out", self.dir.display()))
            .arg(&script)
            .output()
            .expect("sbatch");
        assert!(
            o.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .expect("job id")
    }

    /// Waits until the job has ended and its epilog has run (the node left "completing").
    fn wait_done(&self, job: i64) {
        wait_until(&format!("job {job} to end"), || {
            let st = self.job_field(job, "JobState");
            matches!(
                st.as_str(),
                "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL"
            )
        });
        wait_until("the epilog to finish", || {
            !self.state().contains("completing")
        });
    }

    fn resume(&self) {
        self.out(
            "scontrol",
            &["update", &format!("nodename={}", self.node), "state=resume"],
        );
        wait_until("the node to be idle again", || self.state() == "idle");
    }

    /// The job's steps as `ID NAME` lines.
    fn steps(&self, job: i64) -> String {
        self.out(
            "squeue",
            &["-s", "-h", "-j", &job.to_string(), "-o", "%i %j"],
        )
    }

    fn hooks_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("hooks.log")).unwrap_or_default()
    }

    fn pids_of(&self, name: &str) -> Vec<i32> {
        let p = self.dir.join(name);
        wait_until(name, || {
            std::fs::read_to_string(&p).is_ok_and(|s| s.ends_with('\n'))
        });
        std::fs::read_to_string(&p)
            .unwrap()
            .split_whitespace()
            .map(|l| l.parse().unwrap())
            .collect()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Jobs first (their steps are slurmd's), then the daemons, by pid; a zombie is gone.
        let _ = self
            .cmd("scancel")
            .args(["--full", "-w", &self.node])
            .output();
        // Their slurmstepds end once slurmctld has them completed; stopped before that (a
        // case that failed with a job running), they would outlive the daemons.
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end
            && self
                .cmd("squeue")
                .args(["-h", "-w", &self.node])
                .output()
                .is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        for d in &self.daemons {
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
        }
        for d in &mut self.daemons {
            let end = Instant::now() + Duration::from_secs(10);
            while matches!(d.try_wait(), Ok(None)) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// Submits a job that starts `gpuloop sim hold ARGS` on its first GPU, then runs `then`;
/// returns the job and the holder pids (remembered for the final kill).
fn hold_in_job(
    sim: &Sim,
    slurm: &Slurm,
    gpus: u32,
    name: &str,
    args: &str,
    then: &str,
) -> (i64, Vec<i32>) {
    let job = slurm.sbatch(
        sim,
        gpus,
        &format!(
            "echo gpus=$SLURM_JOB_GPUS\n\"$GPULOOP\" sim hold --gpu ${{SLURM_JOB_GPUS%%,*}} {args} > \"$OUT/{name}.tmp\"\nmv \"$OUT/{name}.tmp\" \"$OUT/{name}\"\n{then}"
        ),
    );
    let pids = slurm.pids_of(name);
    for &p in &pids {
        sim.adopt(p);
    }
    (job, pids)
}

fn gpus_of(slurm: &Slurm, job: i64) -> Vec<i64> {
    let f = slurm.dir.join(format!("job-{job}.out"));
    let text = std::fs::read_to_string(&f).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("gpus="))
        .map(|g| g.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or_default()
}

/// The cases of issue 14, against one Slurm.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn epilog_prolog_and_srun_against_a_real_slurm() {
    require_root("mknod for the fake GPUs, slurmd as SlurmUser=root");
    let sim = Sim::new("4x16G");
    sim.gpus();
    let slurm = Slurm::start(&sim);
    escaped_worker_is_cleaned_and_the_node_stays_idle(&sim, &slurm, false);
    escaped_worker_is_cleaned_and_the_node_stays_idle(&sim, &slurm, true);
    two_jobs_side_by_side(&sim, &slurm);
    a_leak_nobody_holds_drains_the_node(&sim, &slurm);
    prolog_cleans_a_stray_and_the_job_runs(&sim, &slurm);
    prolog_that_cannot_clean_requeues_and_drains(&sim, &slurm);
    hosts_from_slurm_and_the_srun_transport(&sim, &slurm);
    // What the hooks said, for the record (shown with --nocapture).
    eprintln!("{}", slurm.hooks_log());
}

/// A job whose setsid'd worker keeps its GPU after the job ended (with `ignore_term`, one
/// that ignores SIGTERM): the epilog stops it, the memory is back, the node stays idle.
fn escaped_worker_is_cleaned_and_the_node_stays_idle(sim: &Sim, slurm: &Slurm, ignore_term: bool) {
    let flag = if ignore_term { "--ignore-term" } else { "" };
    let name = format!("escaped{}.pids", u8::from(ignore_term));
    let (job, pids) = hold_in_job(
        sim,
        slurm,
        1,
        &name,
        &format!("--mib 1000 --setsid {flag}"),
        "",
    );
    slurm.wait_done(job);
    let gpu = gpus_of(slurm, job)[0];
    assert_eq!(slurm.state(), "idle", "{}", slurm.hooks_log());
    for &p in &pids {
        assert!(
            !alive(p),
            "pid {p} of job {job} outlived the epilog:\n{}",
            slurm.hooks_log()
        );
    }
    assert_eq!(sim.used_mib(gpu as usize), 0);
    let log = slurm.hooks_log();
    assert!(
        log.contains("gpuloop-epilog[")
            && log.contains(&format!("job={job}"))
            && log.contains(&format!("stopping pid {}", pids[0])),
        "{log}"
    );
}

/// Two jobs on GPUs 0,1 and 2,3: the first one's epilog never touches the second's processes.
fn two_jobs_side_by_side(sim: &Sim, slurm: &Slurm) {
    let (second, theirs) = hold_in_job(
        sim,
        slurm,
        2,
        "second.pids",
        "--mib 500",
        "while [ ! -e \"$OUT/second.go\" ]; do sleep 0.1; done",
    );
    let (first, mine) = hold_in_job(sim, slurm, 2, "first.pids", "--mib 700 --setsid", "");
    wait_until("the first job to end", || {
        slurm.job_field(first, "JobState") == "COMPLETED"
    });
    wait_until("the first job's epilog", || {
        !mine.iter().any(|&p| alive(p))
            || slurm
                .hooks_log()
                .contains(&format!("job={first} user=root: GPUs"))
    });
    let (g1, g2) = (gpus_of(slurm, first), gpus_of(slurm, second));
    assert!(g1.iter().all(|g| !g2.contains(g)), "{g1:?} {g2:?}");
    for &p in &mine {
        assert!(
            !alive(p),
            "the first job's pid {p} survived:\n{}",
            slurm.hooks_log()
        );
    }
    for &p in &theirs {
        assert!(
            alive(p),
            "the first job's epilog stopped the second job's pid {p}:\n{}",
            slurm.hooks_log()
        );
    }
    assert_eq!(sim.used_mib(g2[0] as usize), 500);
    assert_eq!(slurm.job_field(second, "JobState"), "RUNNING");
    std::fs::write(slurm.dir.join("second.go"), "").unwrap();
    slurm.wait_done(second);
    assert_eq!(slurm.state(), "idle", "{}", slurm.hooks_log());
    for &p in &theirs {
        assert!(!alive(p), "the second job's pid {p} outlived its epilog");
    }
}

/// Memory nobody holds (a stuck driver): the epilog cannot clean it and drains the node with
/// a reason that says why, visible in `sinfo -R`.
fn a_leak_nobody_holds_drains_the_node(sim: &Sim, slurm: &Slurm) {
    let job = slurm.sbatch(
        sim,
        1,
        "echo gpus=$SLURM_JOB_GPUS\n\"$GPULOOP\" sim leak --gpu $SLURM_JOB_GPUS --mib 900",
    );
    slurm.wait_done(job);
    let gpu = gpus_of(slurm, job)[0];
    wait_until("the node to drain", || slurm.state().starts_with("drain"));
    let reason = slurm.reason();
    assert_eq!(
        reason,
        format!("gpuloop: GPU {gpu} 900MiB driver job={job}"),
        "{}",
        slurm.hooks_log()
    );
    assert!(reason.len() < 256);
    sim.run(&["sim", "reset", "--gpu", &gpu.to_string()]).ok();
    slurm.resume();
}

/// A GPU left dirty by an earlier job that no longer runs: the prolog stops the stray and the
/// new job runs.
fn prolog_cleans_a_stray_and_the_job_runs(sim: &Sim, slurm: &Slurm) {
    let stray = sim.hold_with(
        &["--gpu", "0", "--mib", "600"],
        &[("SLURM_JOB_ID", "999999")],
    );
    let job = slurm.sbatch(
        sim,
        4,
        "echo gpus=$SLURM_JOB_GPUS\necho ran > \"$OUT/ran-$SLURM_JOB_ID\"",
    );
    slurm.wait_done(job);
    assert_eq!(
        slurm.job_field(job, "JobState"),
        "COMPLETED",
        "{}",
        slurm.hooks_log()
    );
    assert!(slurm.dir.join(format!("ran-{job}")).exists());
    assert!(!alive(stray[0]), "{}", slurm.hooks_log());
    assert_eq!(slurm.state(), "idle");
    let log = slurm.hooks_log();
    assert!(
        log.contains("gpuloop-prolog[") && log.contains(&format!("stopping pid {}", stray[0])),
        "{log}"
    );
}

/// A dirty GPU that cannot be cleaned: the prolog drains the node and fails, so Slurm
/// requeues the job instead of running it there.
fn prolog_that_cannot_clean_requeues_and_drains(sim: &Sim, slurm: &Slurm) {
    sim.run(&["sim", "leak", "--gpu", "1", "--mib", "800"]).ok();
    let job = slurm.sbatch(
        sim,
        4,
        "echo gpus=$SLURM_JOB_GPUS\necho ran > \"$OUT/ran-$SLURM_JOB_ID\"",
    );
    wait_until("the node to drain", || slurm.state().starts_with("drain"));
    wait_until("the job to be requeued", || {
        slurm.job_field(job, "JobState") == "PENDING" && slurm.job_field(job, "Restarts") != "0"
    });
    assert!(
        !slurm.dir.join(format!("ran-{job}")).exists(),
        "the job ran on a dirty GPU"
    );
    let reason = slurm.reason();
    assert!(
        reason.starts_with("gpuloop: GPU 1 800MiB driver"),
        "{reason}\n{}",
        slurm.hooks_log()
    );
    slurm.out("scancel", &[&job.to_string()]);
    sim.run(&["sim", "reset", "--gpu", "1"]).ok();
    slurm.resume();
}

/// `--hosts-from-slurm` and `--transport srun` on a running job whose step holds every CPU of
/// the allocation (a step without --overlap would wait for it): the job's node comes from
/// scontrol, an agent reached through `srun --overlap` sees and stops a simulated holder
/// started inside the job, and nothing of the step is left afterwards; then the named errors.
fn hosts_from_slurm_and_the_srun_transport(sim: &Sim, slurm: &Slurm) {
    let (job, holder) = hold_in_job(
        sim,
        slurm,
        1,
        "srun.pids",
        "--mib 300",
        "srun --ntasks=1 sleep 600",
    );
    let j = job.to_string();
    wait_until("the job's step to run", || {
        slurm.steps(job).contains(&format!("{job}.0 sleep"))
    });
    let gpu = gpus_of(slurm, job)[0];
    let bin = bin();
    let bin = bin.to_str().unwrap();
    // The sim's environment reaches the agent as srun's default --export=ALL passes it on.
    let gpuloop = |args: &[&str]| {
        sim.run_with(args, |c| {
            c.env("SLURM_CONF", &slurm.conf).env_remove("SLURM_JOB_ID");
        })
    };
    let over_srun = ["--transport", "srun", "--remote-bin", bin];

    // The job's nodes, reached through a step of the job.
    let out = gpuloop(
        &[
            &["--hosts-from-slurm", &j],
            &over_srun[..],
            &["--json", "gpus"],
        ]
        .concat(),
    )
    .ok();
    let gpus = out.json();
    let gpus = gpus.as_array().unwrap();
    assert_eq!(gpus.len(), 4, "{}", out.stdout);
    assert!(
        gpus.iter().all(|g| g["host"] == slurm.node.as_str()),
        "{}",
        out.stdout
    );
    assert_eq!(gpus[gpu as usize]["mem_used_mib"], 300, "{}", out.stdout);

    // clean through srun stops the holder on the node; the step and its agent end with it.
    let out = gpuloop(
        &[
            &["--hosts-from-slurm", &j],
            &over_srun[..],
            &["clean", "--timeout", "20"],
        ]
        .concat(),
    )
    .ok();
    assert!(
        out.stdout
            .contains(&format!("{} (python3) on GPU {gpu} exited", holder[0])),
        "{}",
        out.stdout
    );
    assert!(!alive(holder[0]), "{}", out.stdout);
    assert_eq!(sim.used_mib(gpu as usize), 0);
    let steps = slurm.steps(job);
    assert!(!steps.contains("gpuloop-agent"), "a step was left: {steps}");
    // srun returns once its task has; the step's agent may still be in its last exit steps
    // (slurmstepd reaps it): wait for that, with a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !agents_of(job).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        agents_of(job),
        Vec::<i32>::new(),
        "an agent or srun was left"
    );

    // Each srun runs in a session of its own (as each ssh does) and dies with gpuloop: a
    // SIGKILLed gpuloop, which runs no handler, leaves no srun and no agent in the job.
    let mut g = sim.std_cmd();
    g.args(["--hosts-from-slurm", &j])
        .args(over_srun)
        .args(["eval", "hosts(); sleep(600)"])
        .env("SLURM_CONF", &slurm.conf)
        .env_remove("SLURM_JOB_ID")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let g = g.spawn().expect("gpuloop");
    let pid = g.id() as i32;
    let sruns = || -> Vec<i32> {
        agents_of(job)
            .into_iter()
            .filter(|p| ppid(*p) == pid)
            .collect()
    };
    let up = Instant::now() + DEADLINE;
    // Its srun, and the agent that srun started in the job (not srun's own child).
    while (sruns().len() != 1 || agents_of(job).len() < 2) && Instant::now() < up {
        std::thread::sleep(Duration::from_millis(50));
    }
    let srun = sruns();
    let all = agents_of(job);
    if srun.len() != 1 || all.len() < 2 {
        sigkill_own(pid);
        panic!("no srun and agent in the job: {srun:?} {all:?}");
    }
    let sid = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(3)?
                    .parse::<i32>()
                    .ok()
            })
    };
    // Said after the SIGKILL's check, so that a failure leaves no gpuloop behind.
    let srun_sid = sid(srun[0]);
    sigkill_own(pid);
    let out = g.wait_with_output().expect("gpuloop");
    assert_eq!(out.status.code(), None, "killed");
    let gone = Instant::now() + DEADLINE;
    while !agents_of(job).is_empty() && Instant::now() < gone {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        agents_of(job),
        Vec::<i32>::new(),
        "an srun or agent outlived a SIGKILLed gpuloop"
    );
    assert_eq!(srun_sid, Some(srun[0]), "srun leads no session of its own");

    // A node list: Slurm expands it; nodes outside the job are named errors, the rest answers.
    // The job is SLURM_JOB_ID's, as inside the job (salloc, a batch script).
    let list = format!("{},ghost[1-2]", slurm.node);
    let args = [
        &["--hosts-from-slurm", &list, "--skip-unreachable"],
        &over_srun[..],
        &["--json", "gpus"],
    ]
    .concat();
    let out = sim.run_with(&args, |c| {
        c.env("SLURM_CONF", &slurm.conf).env("SLURM_JOB_ID", &j);
    });
    // The node's 4 GPUs, then an entry naming each skipped node's failure.
    let items = out.json().as_array().unwrap().clone();
    assert_eq!(
        items.iter().filter(|g| g["index"].is_number()).count(),
        4,
        "{}",
        out.stderr
    );
    assert_eq!(
        items.iter().filter(|g| g["state"] == "skipped").count(),
        2,
        "{}",
        out.stdout
    );
    for ghost in ["ghost1", "ghost2"] {
        assert!(
            out.stderr.contains(&format!("host {ghost}: cannot connect: {ghost} is not a node of Slurm job {job}; srun said:")),
            "{}",
            out.stderr
        );
    }

    // --host NODE --jobid J: the same node, the job given by hand.
    let out = gpuloop(
        &[
            &["--host", &slurm.node, "--jobid", &j],
            &over_srun[..],
            &["--json", "gpus"],
        ]
        .concat(),
    )
    .ok();
    assert_eq!(out.json().as_array().unwrap().len(), 4, "{}", out.stderr);

    // A gpuloop that is not there: the host's named error, quoting slurmstepd.
    let out = gpuloop(&[
        "--hosts-from-slurm",
        &j,
        "--transport",
        "srun",
        "--remote-bin",
        "/nonexistent/gpuloop",
        "gpus",
    ])
    .code(1);
    assert!(
        out.stderr.contains(&format!(
            "host {}: gpuloop is not installed there",
            slurm.node
        )) && out
            .stderr
            .contains("execve(): /nonexistent/gpuloop: No such file or directory"),
        "{}",
        out.stderr
    );

    // A job Slurm does not know is a usage error; one without nodes yet is a runtime one.
    let out = gpuloop(&["--hosts-from-slurm", "999999", "gpus"]).code(2);
    assert!(
        out.stderr
            .contains("--hosts-from-slurm 999999: no such Slurm job"),
        "{}",
        out.stderr
    );
    let held = slurm.out(
        "sbatch",
        &[
            "--parsable",
            "--hold",
            "--output=/dev/null",
            "--wrap",
            "true",
        ],
    );
    let out = gpuloop(&["--hosts-from-slurm", &held, "gpus"]).code(1);
    assert!(
        out.stderr.contains(&format!(
            "job {held} has no nodes yet (state PENDING, reason JobHeldUser)"
        )),
        "{}",
        out.stderr
    );
    slurm.out("scancel", &[&held]);
    // srun with no job to step into: said before anything starts.
    let out = gpuloop(&[&["--host", &slurm.node], &over_srun[..], &["gpus"]].concat()).code(2);
    assert!(out.stderr.contains("none is known for"), "{}", out.stderr);

    slurm.out("scancel", &[&j]);
    slurm.wait_done(job);
    assert_eq!(slurm.state(), "idle", "{}", slurm.hooks_log());
}

/// SIGKILLs a gpuloop this test started, by pid.
fn sigkill_own(pid: i32) {
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Processes of `job` that are a gpuloop agent or an srun into it.
fn agents_of(job: i64) -> Vec<i32> {
    let env = format!("SLURM_JOB_ID={job}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let agent = args.len() >= 2 && args[1] == b"agent";
        let srun = args.first().is_some_and(|a| a.ends_with(b"srun"))
            && args.iter().any(|a| *a == job.to_string().as_bytes());
        let in_job = std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .any(|kv| kv == env.as_bytes());
        if (agent && in_job || srun) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// Without scontrol, `--hosts-from-slurm` says so and what to use instead (exit 1).
#[test]
fn hosts_from_slurm_without_scontrol_says_so() {
    let sim = Sim::new("1x8G");
    let out = sim.run_with(&["--hosts-from-slurm", "gpu[01-02]", "gpus"], |c| {
        c.env("PATH", sim.path());
    });
    let out = out.code(1);
    assert!(
        out.stderr
            .contains("--hosts-from-slurm gpu[01-02]: scontrol is not installed here")
            && out.stderr.contains("use --host"),
        "{}",
        out.stderr
    );
    let out = sim.run(&["--transport", "srun", "gpus"]).code(2);
    assert!(
        out.stderr
            .contains("--transport srun needs --host, --hosts-file or --hosts-from-slurm"),
        "{}",
        out.stderr
    );
}

/// The site-policy recipe (scripts/slurm-site-policy.rhai), on the simulator: it names the
/// job's process on a GPU outside its allocation and the GPU it would drain the node for.
#[test]
fn site_policy_recipe_says_what_it_would_stop_and_drain() {
    let sim = Sim::new("4x16G");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-site-policy.rhai");
    let script = script.to_str().unwrap();
    let env = [
        ("SLURM_JOB_ID", "812"),
        ("SLURM_JOB_GPUS", "0"),
        ("SLURMD_NODENAME", "gpu07"),
    ];
    let out = sim.run_with(&["run", script], |c| {
        c.envs(env);
    });
    let out = out.ok();
    assert!(
        out.stderr.contains("job=812: GPUs pass the site policy"),
        "{}",
        out.stderr
    );
    sim.run(&["sim", "leak", "--gpu", "1", "--mib", "900"]).ok();
    let stray = sim.hold_with(&["--gpu", "2", "--mib", "64"], &[("SLURM_JOB_ID", "812")])[0];
    let out = sim.run_with(&["run", script, "--", "--dry-run"], |c| {
        c.envs(env);
    });
    let out = out.ok();
    assert!(
        out.stderr.contains(&format!(
            "would stop pid {stray} (python3) on GPU [2] outside its allocation [0]"
        )),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("would drain gpu07: gpuloop: GPU 1 900MiB driver job=812"),
        "{}",
        out.stderr
    );
    assert!(alive(stray));
    // Review, round 7: without SLURM_JOB_GPUS every process of the job counted as outside
    // its allocation. The allocation is unknown then, and rule 3 is skipped.
    let out = sim.run_with(&["run", "slurm-site-policy", "--dry-run"], |c| {
        c.envs(env).env_remove("SLURM_JOB_GPUS");
    });
    let out = out.ok();
    assert!(out.stderr.contains("rule 3 skipped"), "{}", out.stderr);
    assert!(!out.stderr.contains("would stop"), "{}", out.stderr);
}

/// Without Slurm's environment the hooks refuse (exit 2); `--dry-run` names what the epilog
/// would stop and stops nothing.
#[test]
fn epilog_needs_a_job_and_dry_run_stops_nothing() {
    let sim = Sim::new("2x8G");
    let out = sim.run_with(&["epilog"], |c| {
        c.env_remove("SLURM_JOB_ID");
    });
    let out = out.code(2);
    assert!(
        out.stderr.contains("SLURM_JOB_ID is not set"),
        "{}",
        out.stderr
    );
    let left = sim.hold_with(
        &["--gpu", "1", "--mib", "64", "--setsid"],
        &[("SLURM_JOB_ID", "812")],
    )[0];
    let out = sim.run_with(&["epilog", "--dry-run"], |c| {
        c.envs([
            ("SLURM_JOB_ID", "812"),
            ("SLURM_JOB_GPUS", "1"),
            ("SLURMD_NODENAME", "gpu07"),
        ])
        .env("SLURM_CONF", "/nonexistent/slurm.conf");
    });
    let out = out.ok();
    assert!(
        out.stderr.contains(&format!("would stop pid {left} ")),
        "{}",
        out.stderr
    );
    assert!(alive(left));
    assert_eq!(sim.used_mib(1), 64);
}

/// A new user's report, round 7: with no GPU list in the environment (a CPU-only job, or no
/// GPU gres) the epilog said "GPUs clean: nothing to do" while it had checked no GPU and GPUs
/// were held. It now says that it knows no GPU of the job and checked none.
#[test]
fn an_epilog_without_the_jobs_gpus_says_it_checked_none() {
    let sim = Sim::new("2x8G");
    let stray = *sim.hold(&["--gpu", "1", "--mib", "64"]).last().unwrap();
    // No squeue on PATH: it fails at once ("every other job is taken as running") instead of
    // retrying a Slurm that is not there.
    let empty = tempfile::tempdir().unwrap();
    for dry in [true, false] {
        let args: &[&str] = if dry {
            &["epilog", "--dry-run"]
        } else {
            &["epilog"]
        };
        let out = sim.run_with(args, |c| {
            c.envs([("SLURM_JOB_ID", "812"), ("SLURMD_NODENAME", "gpu07")])
                .env_remove("SLURM_JOB_GPUS")
                .env_remove("CUDA_VISIBLE_DEVICES")
                .env("SLURM_CONF", "/nonexistent/slurm.conf")
                .env("PATH", empty.path());
        });
        let out = out.ok();
        assert!(
            out.stderr.contains("no GPUs known for the job"),
            "{}",
            out.stderr
        );
        assert!(!out.stderr.contains("GPUs clean"), "{}", out.stderr);
        assert!(out.stderr.contains("no GPU checked"), "{}", out.stderr);
    }
    assert!(alive(stray), "another job's holder was stopped");
}

/// The MIG devices 0:7:0 and 0:8:0 of a GPU in MIG mode: their gi and ci capability minors,
/// from the simulator's `gpus --json`.
fn mig_caps(sim: &Sim) -> Vec<(String, (i64, i64), String)> {
    let gpus = sim.gpus();
    gpus[0]["mig"]["instances"]
        .as_array()
        .expect("MIG devices")
        .iter()
        .map(|d| {
            (
                format!("{}:{}:{}", d["gpu"], d["gi"], d["ci"]),
                (
                    d["caps"]["gi"].as_i64().unwrap(),
                    d["caps"]["ci"].as_i64().unwrap(),
                ),
                d["uuid"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A MIG node (Slurm 22.05 with MIG gres as `MultipleFiles=`): the epilog cleans the finished
/// job's device while a job on the sibling device of the same GPU runs on, drains only with
/// a reason that names the device, and reads the MIG UUID forms gres/nvml writes.
#[test]
#[ignore = "needs root: bash .ci/run runs it as root (--include-ignored)"]
fn epilog_cleans_a_mig_jobs_device_and_drains_naming_it_against_a_real_slurm() {
    require_root("mknod for the fake GPUs, slurmd as SlurmUser=root");
    let sim = Sim::new("1x80G,mig=0:1g.10gb+1g.10gb");
    let devs = mig_caps(&sim);
    let slurm = Slurm::start_with(&sim, Gres::Mig(devs.iter().map(|d| d.1).collect()));
    let (mine, sibling) = (&devs[0], &devs[1]);
    assert_eq!((mine.0.as_str(), sibling.0.as_str()), ("0:7:0", "0:8:0"));
    let used = |key: &str| -> i64 {
        sim.gpus()[0]["mig"]["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| format!("{}:{}:{}", d["gpu"], d["gi"], d["ci"]) == key)
            .map(|d| d["mem_used_mib"].as_i64().unwrap())
            .unwrap()
    };
    // A job's holder on its own MIG device: the job says which (Slurm's number names none).
    let hold = |name: &str, dev: &str, args: &str, then: &str| -> (i64, Vec<i32>) {
        let job = slurm.sbatch_env(
            &sim,
            1,
            &format!(
                "echo gpus=$SLURM_JOB_GPUS\n\"$GPULOOP\" sim hold --gpu \"$DEV\" {args} > \"$OUT/{name}.tmp\"\nmv \"$OUT/{name}.tmp\" \"$OUT/{name}\"\n{then}"
            ),
            &[("DEV", dev)],
        );
        let pids = slurm.pids_of(name);
        for &p in &pids {
            sim.adopt(p);
        }
        (job, pids)
    };
    let (second, theirs) = hold(
        "mig-sibling.pids",
        &sibling.0,
        "--mib 2000",
        "while [ ! -e \"$OUT/mig-sibling.go\" ]; do sleep 0.1; done",
    );
    // The finished job's escaped worker on 0:7:0: the epilog stops it, and only it. A
    // process on the sibling device whose environment claims the first job (anyone can
    // write their own environment) does not make that device the first job's: the second
    // job runs there.
    let (first, escaped) = hold(
        "mig-first.pids",
        &mine.0,
        "--mib 1000 --setsid",
        "while [ ! -e \"$OUT/mig-first.go\" ]; do sleep 0.1; done",
    );
    let claims = sim.hold_with(
        &["--gpu", &sibling.0, "--mib", "10"],
        &[("SLURM_JOB_ID", &first.to_string())],
    );
    std::fs::write(slurm.dir.join("mig-first.go"), "").unwrap();
    wait_until("the first job to end", || {
        slurm.job_field(first, "JobState") == "COMPLETED"
    });
    wait_until("the first job's epilog", || {
        slurm
            .hooks_log()
            .contains(&format!("job={first} user=root: GPUs"))
            || slurm.state().starts_with("drain")
    });
    let log = slurm.hooks_log();
    for &p in &escaped {
        assert!(
            !alive(p),
            "pid {p} of job {first} outlived its epilog:\n{log}"
        );
    }
    for &p in &theirs {
        assert!(
            alive(p),
            "job {first}'s epilog stopped the sibling device's pid {p}:\n{log}"
        );
    }
    assert_eq!(used(&mine.0), 0);
    // The claiming process says it is the first job's: it is stopped as one of its own.
    assert!(gone_within(claims[0], 5), "{log}");
    assert_eq!(used(&sibling.0), 2000);
    assert!(!slurm.state().starts_with("drain"), "{log}");
    assert!(
        log.contains(&format!("job={first} user=root: GPUs 0:7:0 clean"))
            && log.contains(&format!(
                "leaving pid {} (python3) on GPU 0:8:0 2000MiB alone: job {second} of root; its MIG device 0:8:0 is not the job's",
                theirs[0]
            )),
        "{log}"
    );
    // Memory its worker kept on 0:7:0 that nobody holds once it is stopped: the node is
    // drained, with a reason that names the device.
    let (third, _) = hold(
        "mig-third.pids",
        &mine.0,
        "--mib 100 --setsid",
        "\"$GPULOOP\" sim leak --gpu \"$DEV\" --mib 900",
    );
    wait_until("the node to drain", || slurm.state().starts_with("drain"));
    let reason = slurm.reason();
    let short = &mine.2[..12];
    assert_eq!(
        reason,
        format!("gpuloop: GPU 0:7:0 ({short}) 900MiB driver job={third}"),
        "{}",
        slurm.hooks_log()
    );
    assert!(reason.len() < 256);
    for &p in &theirs {
        assert!(alive(p), "a drain stopped the sibling device's pid {p}");
    }
    std::fs::write(slurm.dir.join("mig-sibling.go"), "").unwrap();
    slurm.wait_done(second);
    sim.run(&["sim", "reset", "--gpu", "0"]).ok();
    slurm.resume();

    // The forms gres/nvml writes (MIG-<uuid>, MIG-GPU-<uuid>/GI/CI), through the epilog run
    // by hand for a job that is over: a stray on the job's device is stopped, one on the
    // sibling device is not the job's and is left alone.
    let gpu_uuid = sim.gpus()[0]["uuid"].as_str().unwrap().to_string();
    for form in [mine.2.clone(), format!("MIG-{gpu_uuid}/7/0")] {
        let stray = sim.hold(&["--gpu", &mine.0, "--mib", "50"]);
        let other = sim.hold_with(
            &["--gpu", &sibling.0, "--mib", "60"],
            &[("SLURM_JOB_ID", "999999")],
        );
        let out = sim.run_with(&["epilog", "--timeout", "5", "--grace", "1"], |c| {
            c.env("SLURM_CONF", &slurm.conf)
                .env("SLURM_JOB_ID", first.to_string())
                .env("SLURM_JOB_USER", "root")
                .env("SLURM_JOB_GPUS", &form)
                .env("SLURMD_NODENAME", &slurm.node);
        });
        assert_eq!(out.code, 0, "{form}: {}", out.stderr);
        assert!(gone_within(stray[0], 5), "{form}: {}", out.stderr);
        assert!(
            alive(other[0]),
            "{form}: the sibling device's stray was stopped: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("GPUs 0:7:0 clean"),
            "{form}: {}",
            out.stderr
        );
        sigkill(other[0]);
        assert!(gone_within(other[0], 5));
    }
    assert_eq!(slurm.state(), "idle", "{}", slurm.hooks_log());
    eprintln!("{}", slurm.hooks_log());
}
