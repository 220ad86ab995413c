//! The DaemonSet that runs gpuloop on Kubernetes nodes (deploy/kubernetes/daemonset.yaml):
//! valid against the Kubernetes schemas, checked by PyPI's kubernetes-validate (`.ci/run`
//! installs it in target/mcp-venv), and true to what gpuloop reads: the host's PID
//! namespace, and every default state directory mounted read-only where gpuloop looks.

use gpuloop::process::container::Roots;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifest() -> PathBuf {
    root().join("deploy/kubernetes/daemonset.yaml")
}

/// The Python with kubernetes-validate (and PyYAML, which it needs).
fn python() -> PathBuf {
    let p = std::env::var_os("GPULOOP_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/mcp-venv/bin/python"));
    let ok = Command::new(&p)
        .args(["-c", "import kubernetes_validate, yaml"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the manifest tests need PyPI's kubernetes-validate in {}: run .ci/run, or \
         `target/mcp-venv/bin/python -m pip install kubernetes-validate`",
        p.display()
    );
    p
}

/// `kubernetes-validate --strict FILE` (unknown fields are errors too): its output, and
/// whether it passed.
fn validate(file: &Path) -> (bool, String) {
    let out = Command::new(python())
        .args(["-m", "kubernetes_validate", "--strict"])
        .arg(file)
        .output()
        .expect("kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_daemonset_manifest_validates_against_the_kubernetes_schemas() {
    let (ok, out) = validate(&manifest());
    assert!(ok, "{out}");
    assert!(
        out.contains("passed for resource daemonset/gpuloop"),
        "{out}"
    );
    // The check can fail: a manifest with a field of the wrong type does.
    let text = std::fs::read_to_string(manifest()).expect("manifest");
    assert!(text.contains("hostPID: true"));
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, text.replace("hostPID: true", "hostPID: \"yes\"")).expect("write");
    let (ok, out) = validate(&broken);
    assert!(!ok, "a broken manifest passed: {out}");
}

/// The manifest's documents as JSON.
fn documents() -> Vec<Value> {
    let out = Command::new(python())
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(manifest())
        .output()
        .expect("python");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn the_daemonset_sees_the_hosts_processes_and_mounts_what_gpuloop_reads() {
    let docs = documents();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let pod = &kind("DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    let mounts = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    let volumes = pod["volumes"].as_array().expect("volumes");
    let mounted = |path: &Path| {
        let m = mounts
            .iter()
            .find(|m| m["mountPath"] == path.display().to_string())
            .unwrap_or_else(|| panic!("{} is not mounted", path.display()));
        assert_eq!(m["readOnly"], true, "{m}");
        let v = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("its volume");
        assert_eq!(v["hostPath"]["path"], m["mountPath"], "{v}");
    };
    let r = Roots::default();
    for p in r.containerd.iter().chain(&r.storage) {
        mounted(p);
    }
    for p in &r.docker {
        mounted(&p.join("containers"));
    }
    mounted(&r.kubelet.join("pods"));
    mounted(&r.pod_logs);
    mounted(&r.container_logs);
    // The config it ships is gpuloop's own defaults, spelt out for a site to change.
    let toml = kind("ConfigMap")["data"]["config.toml"]
        .as_str()
        .expect("config.toml");
    let cfg = gpuloop::config::UserConfig::parse(Path::new("config.toml"), toml).expect("parses");
    assert_eq!(cfg.containers, r);
}
