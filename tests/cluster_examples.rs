//! The cluster examples in tools/cluster run end to end here: the Slurm script under a
//! stand-in `sbatch` (array tasks as concurrent processes) and the Kubernetes Jobs under a
//! stand-in `kubectl` (Indexed Job pods as concurrent processes, ConfigMap as environment).
//! Both must give the bytes of one single-process materialize into the same directory.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A single-process materialize into `out` with the step script's options, moved aside;
/// the digest store (`<out>.digests`, the step script's default) is left as the cluster run
/// will find it: holding the source's digests only, so both runs record the same digest pass.
fn reference(source: &Path, out: &Path, opts: &str) -> PathBuf {
    let store = PathBuf::from(format!("{}.digests", out.display()));
    run_ok(Command::new(bin()).arg("digest").arg(source).arg("--digest-store").arg(&store));
    let snapshot = out.with_extension("digests-before");
    copy_dir(&store, &snapshot);
    let o = format!("{opts},digest_store={}", store.display());
    run_ok(Command::new(bin()).arg("materialize").arg(source).arg("--out").arg(out).args(["-o", &o]));
    let moved = out.with_extension("reference");
    std::fs::rename(out, &moved).unwrap();
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::rename(&snapshot, &store).unwrap();
    moved
}

fn assert_same_tree(a: &Path, b: &Path, what: &str) {
    assert_eq!(tree_files(a), tree_files(b), "{what}");
    for name in tree_files(a) {
        assert!(std::fs::read(a.join(&name)).unwrap() == std::fs::read(b.join(&name)).unwrap(), "{what}: {name} differs");
    }
}

fn fakes_path() -> String {
    format!("{}:{}", repo().join("tests/fakes").display(), std::env::var("PATH").unwrap_or_default())
}

#[test]
fn slurm_script_runs_digest_parts_and_finalize() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pack");
    let reference = reference(&sample(), &out, "top_k=2");
    let slurm = tmp.path().join("slurm");
    std::fs::create_dir(&slurm).unwrap();
    let r = run_ok(
        Command::new("bash")
            .arg(repo().join("tools/cluster/slurm-materialize.sh"))
            .args(["--partition=test", "--account=test"])
            .env("PATH", fakes_path())
            .env("FAKE_SLURM_DIR", &slurm)
            .env("XPACKFS_BIN", bin())
            .env("XPACKFS_SOURCE", sample())
            .env("XPACKFS_OUT", &out)
            .env("XPACKFS_PARTS", "3")
            .env("XPACKFS_OPTIONS", "top_k=2")
            .env("XPACKFS_PIECE_SIZE", "128K"),
    );
    let said = String::from_utf8_lossy(&r.stdout);
    assert!(said.contains("array 0-2"), "{said}");
    // Three jobs; the array job ran three tasks; every job succeeded.
    let jobs: Vec<serde_json::Value> =
        (1000..1003).map(|j| serde_json::from_slice(&std::fs::read(slurm.join(format!("{j}.json"))).unwrap()).unwrap()).collect();
    for (j, job) in jobs.iter().enumerate() {
        let logs: String = (0..3).filter_map(|t| std::fs::read_to_string(slurm.join(format!("{}_{t}.log", 1000 + j))).ok()).collect();
        let none = std::fs::read_to_string(slurm.join(format!("{}_None.log", 1000 + j))).unwrap_or_default();
        assert_eq!(job["rc"], 0, "job {j}: {logs}{none}");
    }
    assert!((0..3).all(|t| slurm.join(format!("1001_{t}.log")).exists()));
    assert_same_tree(&out, &reference, "slurm");
    let summary = std::fs::read_to_string(slurm.join("1002_None.log")).unwrap();
    assert!(summary.contains("\"files\""), "finalize prints its JSON summary: {summary}");
}

#[test]
fn kubernetes_jobs_run_digest_indexed_parts_and_finalize() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pack");
    let reference = reference(&sample(), &out, "top_k=2");
    let kube = tmp.path().join("kube");
    std::fs::create_dir(&kube).unwrap();
    // The manifest's /models paths point at this test's files; everything else (the part
    // count, the command, the step script) comes from the manifest.
    let env = serde_json::json!({
        "XPACKFS_SOURCE": sample(), "XPACKFS_OUT": out, "XPACKFS_BIN": bin(),
        "XPACKFS_OPTIONS": "top_k=2", "XPACKFS_PIECE_SIZE": "64K",
    });
    run_ok(
        Command::new("bash")
            .arg(repo().join("tools/cluster/k8s-run.sh"))
            .env("PATH", fakes_path())
            .env("FAKE_KUBE_DIR", &kube)
            .env("FAKE_KUBE_ENV", env.to_string()),
    );
    for i in 0..4 {
        let log = kube.join(format!("job-xpackfs-parts-{i}.log"));
        assert!(log.exists(), "pod {i} of the Indexed Job did not run");
    }
    assert_same_tree(&out, &reference, "kubernetes");
}
