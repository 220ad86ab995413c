//! Snapshots of what people see: the GPU and holder tables, diagnosis and kill summaries, and
//! script values as the REPL and `eval` print them; built from fixed records, not live pids.

use gpuloop::gpu::{Gpu, MIB};
use gpuloop::inspect::diagnose::Diagnosis;
use gpuloop::inspect::holders::{Evidence, Holder, Role, State};
use gpuloop::process::kill::{KillError, KillReport, Skipped, Stopped, Stuck};
use gpuloop::process::restart::{Restarter, Shown};
use gpuloop::render::{self, Style};
use gpuloop::script::display;
use rhai::Dynamic;

const COLOR: Style = Style {
    color: true,
    width: None,
    ids: false,
};

fn gpu(index: i64, used_mib: i64, util: Option<i64>) -> Gpu {
    let mut g = Gpu::new(
        index,
        index,
        format!("GPU-0000000{index}-aaaa-4000-8000-000000000000"),
        "NVIDIA H200".into(),
        format!("00000000:{:02X}:00.0", 0x18 + index),
        143_771 * MIB,
        used_mib * MIB,
        vec![],
    );
    g.util = util;
    g.temp_c = util.map(|u| 30 + u / 4);
    g.procs = i64::from(used_mib > 0);
    g
}

fn gpus() -> Vec<Gpu> {
    vec![
        gpu(0, 0, Some(0)),
        gpu(1, 81_920, Some(97)),
        gpu(2, 0, None),
    ]
}

fn holder(pid: i64, gpus: Vec<i64>, state: &str, cmdline: &str) -> Holder {
    let gpus_clone = gpus.clone();
    Holder {
        pid,
        ppid: 1,
        pgid: pid,
        sid: pid,
        start: 123_456,
        pidfs_ino: None,
        uid: 1000,
        user: "alice".into(),
        name: "python3".into(),
        cmdline: cmdline.into(),
        state: State::parse(state),
        role: Role::Compute,
        gpus,
        mig: Vec::new(),
        mem: 40_960 * MIB,
        mem_mib: 40_960,
        inherited: None,
        inherited_on: Default::default(),
        evidence: Evidence::ALL.to_vec(),
        protected: false,
        host: "local".into(),
        origin: Default::default(),
        maps: gpus_clone,
        opens: Vec::new(),
        caps: false,
        caps_all: false,
    }
}

fn holders() -> Vec<Holder> {
    let mut running = holder(
        4242,
        vec![1],
        "running",
        "python3 train.py --config llama.yaml",
    );
    running.ppid = 4200;
    running.origin.ppid_comm = "torchrun".into();
    // A worker of a killed launcher, reparented to init, left by a Slurm job.
    let mut orphan = holder(
        4243,
        vec![1, 2],
        "disk-sleep",
        "python3 -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3-70B --tensor-parallel-size 8",
    );
    orphan.origin.ppid_comm = "systemd".into();
    orphan.origin.reparented = true;
    orphan.origin.job = Some(812);
    vec![running, orphan]
}

fn diagnoses() -> Vec<Diagnosis> {
    vec![
        Diagnosis {
            gpu: Some(0),
            mem_used: 0,
            mem_used_mib: 0,
            holders: vec![],
            daemons: vec![],
            footprint: vec![],
            ghost_pids: vec![],
            verdict: gpuloop::inspect::diagnose::Verdict::Clean,
            advice: "GPU 0 is free".into(),
            host: "local".into(),
            faults: None,
            blockers: Vec::new(),
            mig: None,
        },
        Diagnosis {
            gpu: Some(1),
            mem_used: 81_920 * MIB,
            mem_used_mib: 81_920,
            holders: holders(),
            daemons: vec![],
            footprint: vec![],
            ghost_pids: vec![9999],
            verdict: gpuloop::inspect::diagnose::Verdict::Orphaned,
            advice: "the job that started these workers is gone: kill them (gpuloop kill --gpu 1)"
                .into(),
            host: "local".into(),
            faults: None,
            blockers: Vec::new(),
            mig: None,
        },
    ]
}

fn kill_report() -> KillReport {
    KillReport {
        signalled: vec![4242, 4243],
        exited: vec![4242],
        survivors: vec![4243],
        skipped: vec![Skipped {
            pid: 1,
            reason: "init".into(),
        }],
        errors: vec![KillError {
            pid: 4243,
            error: "still in uninterruptible sleep after SIGKILL".into(),
        }],
        targets: vec![
            Stopped {
                pid: 4242,
                name: "python3".into(),
                gpus: vec![0, 1],
                signal: "TERM".into(),
                ended_by: Some("KILL".into()),
                exit_ms: Some(5003),
            },
            Stopped {
                pid: 4243,
                name: "pt_main_thread".into(),
                gpus: vec![1],
                signal: "TERM".into(),
                ended_by: None,
                exit_ms: None,
            },
            Stopped {
                pid: 4250,
                name: "torchrun".into(),
                gpus: vec![],
                signal: "TERM".into(),
                ended_by: Some("TERM".into()),
                exit_ms: Some(120),
            },
        ],
        killed_at_once: vec![Skipped {
            pid: 4244,
            reason: "pid 4244 ignores TERM (SigIgn): sent KILL at once".into(),
        }],
        stuck: vec![Stuck {
            pid: 4245,
            name: "python3".into(),
            wchan: "__refrigerator".into(),
        }],
        interrupted: false,
        elapsed_ms: 5012,
        dry_run: false,
        would_signal: vec![],
        restarters: vec![
            Restarter {
                pid: 4200,
                name: "bash".into(),
                holder: 4242,
                shown: None,
                identity: gpuloop::process::Identity::new(4200, 1),
                holder_identity: gpuloop::process::Identity::new(4242, 2),
            },
            Restarter {
                pid: 4201,
                name: "torchrun agent (restarts its workers)".into(),
                holder: 4243,
                shown: Some(Shown::Launcher),
                identity: gpuloop::process::Identity::new(4201, 1),
                holder_identity: gpuloop::process::Identity::new(4243, 2),
            },
        ],
        by_host: Default::default(),
    }
}

/// The same targets in a dry run: nothing signalled, what would be.
fn dry_run_report() -> KillReport {
    let mut r = kill_report();
    r.dry_run = true;
    r.would_signal = std::mem::take(&mut r.signalled);
    r.exited.clear();
    r.survivors.clear();
    r.errors.clear();
    for t in &mut r.targets {
        t.ended_by = None;
        t.exit_ms = None;
    }
    r
}

/// A record as scripts see it: the serde map the bindings hand over.
fn script<T: serde::Serialize>(v: &T) -> Dynamic {
    rhai::serde::to_dynamic(v).expect("to_dynamic")
}

#[test]
fn gpu_table() {
    insta::assert_snapshot!(render::gpus(&gpus(), Style::PLAIN));
}

#[test]
fn gpu_table_of_several_hosts() {
    let mut gs = gpus();
    gs[2].host = "node7".into();
    insta::assert_snapshot!(render::gpus(&gs, Style::PLAIN));
}

#[test]
fn holder_table() {
    insta::assert_snapshot!(render::holders(&holders(), Style::PLAIN));
}

#[test]
fn diagnosis_summary() {
    insta::assert_snapshot!(render::diagnoses(&diagnoses(), Style::PLAIN));
}

#[test]
fn kill_report_summary() {
    insta::assert_snapshot!(render::kill_report(&kill_report(), Style::PLAIN));
}

#[test]
fn dry_run_report_names_signal_and_gpus() {
    insta::assert_snapshot!(render::kill_report(&dry_run_report(), Style::PLAIN));
    // As a script prints the map kill(…, #{dry_run: true}) returns.
    assert_eq!(
        display::value(&script(&dry_run_report()), Style::PLAIN),
        render::kill_report(&dry_run_report(), Style::PLAIN)
    );
}

#[test]
fn empty_lists_say_so() {
    assert_eq!(render::gpus(&[], Style::PLAIN), "no GPUs");
    assert_eq!(render::holders(&[], Style::PLAIN), "no holders");
}

#[test]
fn colour_does_not_move_anything() {
    let pairs = [
        (
            render::gpus(&gpus(), COLOR),
            render::gpus(&gpus(), Style::PLAIN),
        ),
        (
            render::holders(&holders(), COLOR),
            render::holders(&holders(), Style::PLAIN),
        ),
        (
            render::diagnoses(&diagnoses(), COLOR),
            render::diagnoses(&diagnoses(), Style::PLAIN),
        ),
        (
            render::kill_report(&kill_report(), COLOR),
            render::kill_report(&kill_report(), Style::PLAIN),
        ),
    ];
    for (colored, plain) in pairs {
        assert_ne!(colored, plain, "colour was asked for");
        let stripped: Vec<String> = render::strip_ansi(&colored)
            .lines()
            .map(|l| l.trim_end().to_string())
            .collect();
        assert_eq!(stripped.join("\n"), plain);
    }
}

#[test]
fn script_values_print_like_the_commands() {
    // What gpu(), holders(), diagnose() and kill() return prints as the one-shots do.
    assert_eq!(
        display::value(&script(&gpus()), Style::PLAIN),
        render::gpus(&gpus(), Style::PLAIN)
    );
    assert_eq!(
        display::value(&script(&holders()), Style::PLAIN),
        render::holders(&holders(), Style::PLAIN)
    );
    assert_eq!(
        display::value(&script(&diagnoses()), Style::PLAIN),
        render::diagnoses(&diagnoses(), Style::PLAIN)
    );
    assert_eq!(
        display::value(&script(&kill_report()), Style::PLAIN),
        render::kill_report(&kill_report(), Style::PLAIN)
    );
}

#[test]
fn one_gpu_map_prints_as_a_literal() {
    insta::assert_snapshot!(display::value(
        &script(&gpu(1, 81_920, Some(97))),
        Style::PLAIN
    ));
}

#[test]
fn run_result_summary() {
    let engine = rhai::Engine::new();
    let ok: Dynamic = engine
        .eval(r#"#{code: 0, signal: (), ok: true, timed_out: false, stdout: "a\nb\n", stderr: "", elapsed_ms: 1530, pid: 777}"#)
        .expect("map");
    let killed: Dynamic = engine
        .eval(r#"#{code: (), signal: "KILL", ok: false, timed_out: true, stdout: "", stderr: "oom\n", elapsed_ms: 60000, pid: 778}"#)
        .expect("map");
    insta::assert_snapshot!(format!(
        "{}\n{}",
        display::value(&ok, Style::PLAIN),
        display::value(&killed, Style::PLAIN)
    ));
}

#[test]
fn json_of_script_values() {
    let v = script(&gpus());
    let json = display::json(&v);
    assert_eq!(json, serde_json::to_value(gpus()).expect("json"));
}

const NARROW: Style = Style {
    color: false,
    width: Some(130),
    ids: false,
};

#[test]
fn holder_table_fits_the_terminal_and_diagnosis_advice_wraps_between_words() {
    let table = render::holders(&holders(), NARROW);
    assert!(table.lines().all(|l| l.chars().count() <= 130), "{table}");
    let narrow = Style {
        width: Some(90),
        ..NARROW
    };
    let advice = render::diagnoses(&diagnoses(), narrow);
    assert!(advice.lines().all(|l| l.chars().count() <= 90), "{advice}");
    // A flag is never cut in two.
    assert!(advice.contains("(gpuloop kill --gpu 1)"), "{advice}");
    insta::assert_snapshot!(format!("{table}\n\n{advice}"));
}

/// Every text a record carries that another user or process chose (a comm, a command line, a
/// user, the parent's name, a systemd unit, a container's and a pod's names and ids, a
/// host's name, advice and reasons that quote them, errors) is drawn by every renderer with
/// its controls shown escaped: none of the sequences is written raw, with or without colour
/// and at any width, and no newline in a name starts a line of its own.
#[test]
fn every_text_of_every_record_is_drawn_with_its_controls_escaped() {
    use gpuloop::inspect::reset::{Blocker, BlockerKind, ResetReport, Step, StepKind, Stop};
    use gpuloop::process::container::{Place, Pod};
    const EVIL: &str = "\x1b[2J\x1b]52;c;eA==\x07\u{9b}1A\u{202e}\r\nFAKE\x1b[8m\x7f";
    let evil = |what: &str| format!("{what}{EVIL}");
    let mut h = holder(4242, vec![0, 1], "running", &evil("python3 train.py "));
    h.name = evil("py");
    h.user = evil("u");
    h.host = evil("node");
    h.origin.ppid_comm = evil("bash");
    h.origin.ppid_name = evil("launcher");
    h.origin.service = Some(evil("unit"));
    h.origin.service_main = true;
    h.origin.job = Some(812);
    h.origin.place = Place {
        container: Some(evil("3839ae72")),
        container_name: Some(evil("vllm")),
        runtime: None,
        container_deleted: true,
        pod: Some(Pod {
            namespace: Some(evil("ml")),
            name: Some(evil("trainer")),
            uid: Some(evil("1a2b")),
            container: Some(evil("main")),
            deleted: true,
        }),
    };
    let mut other = h.clone();
    other.pid = 4243;
    other.origin.service_main = false;
    other.origin.reparented = true;
    other.origin.place.pod = None;
    let hs = vec![h.clone(), other];
    let mut gs = gpus();
    gs[1].name = evil("H200");
    gs[1].host = evil("node");
    gs[1].bus_id = evil("bus");
    gs[2].error = Some(evil("GPU 2: "));
    let mut ds = diagnoses();
    ds[1].holders = hs.clone();
    ds[1].advice = evil("advice ");
    ds[1].host = evil("node");
    let mut kr = kill_report();
    for t in &mut kr.targets {
        t.name = evil("t");
    }
    kr.skipped[0].reason = evil("skip ").as_str().into();
    kr.killed_at_once[0].reason = evil("pid 4244 ").as_str().into();
    kr.errors[0].error = evil("error ");
    kr.stuck[0].name = evil("stuck");
    kr.stuck[0].wchan = evil("wchan");
    for r in &mut kr.restarters {
        r.name = evil("restarter");
    }
    let mut dry = kr.clone();
    dry.dry_run = true;
    let mut hosts = kr.clone();
    hosts.by_host = [(evil("node"), kr.clone())].into_iter().collect();
    let reset = ResetReport {
        gpu: 0,
        uuid: evil("GPU-"),
        dry_run: false,
        blockers: vec![Blocker {
            kind: BlockerKind::Observer,
            pid: Some(4242),
            start: Some(1),
            pidfs_ino: None,
            name: evil("smi"),
            cmdline: evil("nvidia-smi "),
            user: evil("u"),
            protected: false,
            service: Some(evil("unit")),
            user_unit: false,
            caps: false,
            mig: Vec::new(),
            stop: Stop::Signal,
            how: evil("kill 4242 "),
            host: evil("node"),
        }],
        steps: vec![Step {
            action: StepKind::Stop,
            target: evil("4242 "),
            ok: false,
            detail: evil("detail "),
        }],
        reset: false,
        verified: false,
        ok: false,
        cannot: Some(evil("off the bus ")),
        mig: None,
        host: evil("node"),
    };
    let mut dry_reset = reset.clone();
    dry_reset.dry_run = true;
    let wide = Style { ids: true, ..COLOR };
    for style in [Style::PLAIN, COLOR, NARROW, wide] {
        for (what, out) in [
            ("gpus", render::gpus(&gs, style)),
            ("holders", render::holders(&hs, style)),
            ("diagnoses", render::diagnoses(&ds, style)),
            ("kill", render::kill_report(&kr, style)),
            ("dry run", render::kill_report(&dry, style)),
            ("over hosts", render::kill_report(&hosts, style)),
            ("top", render::top(&gs, &hs, style)),
            (
                "reset",
                render::reset_reports(std::slice::from_ref(&reset), style),
            ),
            (
                "dry reset",
                render::reset_reports(std::slice::from_ref(&dry_reset), style),
            ),
            ("script value", display::value(&script(&hs), style)),
        ] {
            for raw in [
                "\x1b[2J", "\x1b]", "\x07", "\u{9b}", "\u{202e}", "\r", "\x1b[8m", "\x7f",
            ] {
                assert!(!out.contains(raw), "{what}: {raw:?} written raw:\n{out:?}");
            }
            assert!(
                !out.lines().any(|l| l.trim_start().starts_with("FAKE")),
                "{what}: a name's newline began a line:\n{out}"
            );
            if !style.color {
                assert!(!out.contains('\x1b'), "{what}: {out:?}");
            }
        }
    }
}
