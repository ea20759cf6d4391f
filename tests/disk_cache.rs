//! The persistent disk cache through real mounts, `warm` and `materialize`: restarts compute
//! nothing and serve the same bytes as the seeds; damaged entries (flipped, truncated,
//! deleted, a daemon killed mid-write) are never served; the bound holds, also for two mounts
//! sharing a directory; a changed source or recipe never meets old entries; an interrupted
//! `warm` resumes, and a warm cache serves mounts and `materialize` with nothing computed.
//!
//! Every child that writes is bounded: the cache by its `disk_cache_gb` (at most 0.25 GiB
//! here), the daemons by the views they serve, and each waits for a parent that is alive.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// The small V4.1 checkpoint of the requant tests (24 quantised chunks).
fn v41(dir: &Path, extra: &[&str]) -> PathBuf {
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(dir).args(["--variant", "v41", "--inter", "256"]).args(extra));
    std::fs::canonicalize(dir).unwrap()
}

/// A V4 checkpoint whose kt-int8 view is 100 MB (48 sibling groups): heavy cache writes.
fn v4_large(dir: &Path) -> PathBuf {
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(dir).args(["--hidden", "2048", "--inter", "1024", "--experts", "8"]));
    std::fs::canonicalize(dir).unwrap()
}

/// Every file of a mount (the status directory left out), read whole.
fn read_all(mnt: &Path) -> BTreeMap<String, Vec<u8>> {
    tree_files(mnt)
        .into_iter()
        .filter(|n| !n.starts_with(".xpackfs"))
        .map(|n| (n.clone(), std::fs::read(mnt.join(&n)).unwrap_or_else(|e| panic!("{n}: {e}"))))
        .collect()
}

fn stats(m: &Mount) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(m.path(".xpackfs/stats.json")).unwrap()).unwrap()
}

fn computed(s: &serde_json::Value) -> u64 {
    s["cache"]["bytes_computed"].as_u64().unwrap()
}

/// Until the mount's compute jobs (and their writes behind, of chunks and of whole files)
/// are done.
fn settle(m: &Mount) {
    wait_until("compute jobs and file entries to settle", Duration::from_secs(120), || {
        let s = stats(m);
        s["compute"]["in_flight"].as_u64() == Some(0) && s["passthrough"]["file_entries_pending"].as_u64() == Some(0)
    });
}

/// Data files of the file entries of a cache directory (their seals beside them).
fn file_entries(cache: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let Ok(shards) = std::fs::read_dir(cache.join("files")) else { return v };
    for shard in shards.flatten() {
        v.extend(std::fs::read_dir(shard.path()).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_none()));
    }
    v.sort();
    v
}

/// Entry files of a cache directory and their total size.
fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let Ok(shards) = std::fs::read_dir(cache.join("entries")) else { return v };
    for shard in shards.flatten() {
        v.extend(std::fs::read_dir(shard.path()).unwrap().flatten().map(|e| e.path()));
    }
    v.sort();
    v
}

/// Bytes of every entry: chunk entries, file entries and their seals.
fn entry_bytes(cache: &Path) -> u64 {
    let seals = file_entries(cache).into_iter().map(|p| p.with_extension("seal"));
    entries(cache).into_iter().chain(file_entries(cache)).chain(seals).map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum()
}

fn cache_opt(cache: &Path, gib: &str) -> [String; 2] {
    [format!("disk_cache={}", cache.display()), format!("disk_cache_gb={gib}")]
}

fn opts<'a>(base: &[&'a str], extra: &'a [String]) -> Vec<&'a str> {
    base.iter().copied().chain(extra.iter().map(String::as_str)).collect()
}

#[test]
fn a_restarted_mount_computes_nothing_and_serves_the_seeds_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let c = cache_opt(&cache, "0.25");

    // requant: the first mount computes and keeps every chunk, the second only reads them.
    let src = v41(&dir.path().join("v41"), &[]);
    let seed = tempfile::tempdir().unwrap();
    seed_requant(&src, seed.path(), &[]);
    let first = Mount::new(&src, &opts(&["view=requant"], &c));
    let a = read_all(&first.mountpoint);
    settle(&first);
    let s1 = stats(&first);
    first.unmount();
    assert!(computed(&s1) > 0 && s1["disk_cache"]["writes"].as_u64().unwrap() > 0, "{s1}");
    // Served bytes by origin (the tier each chunk was found in when read; manifests are
    // computed on first read): none from disk on the first mount.
    let served = |s: &serde_json::Value, origin: &str| s["bytes_served_by_origin"][origin].as_u64().unwrap();
    let total = |s: &serde_json::Value| ["identity", "as_is", "memory", "disk", "computed"].iter().map(|o| served(s, o)).sum::<u64>();
    assert!(served(&s1, "computed") > 0 && served(&s1, "disk") == 0 && total(&s1) == s1["bytes_served"].as_u64().unwrap(), "{s1}");
    let second = Mount::new(&src, &opts(&["view=requant"], &c));
    let b = read_all(&second.mountpoint);
    let s2 = stats(&second);
    second.unmount();
    assert_eq!(computed(&s2), 0, "the second mount computed chunks: {s2}");
    // Every chunk byte read once, each from the disk cache: by this read, or by its
    // read-ahead into memory.
    assert_eq!(served(&s2, "disk") + served(&s2, "memory"), s2["cache"]["bytes_from_disk"].as_u64().unwrap(), "{s2}");
    assert_eq!(total(&s2), s2["bytes_served"].as_u64().unwrap(), "{s2}");
    assert_eq!(s2["compute"]["runs_read"].as_u64(), Some(0), "{s2}");
    assert_eq!(s2["cache"]["bytes_from_disk"], s1["cache"]["bytes_computed"], "{s2}");
    assert_eq!(s2["disk_cache"]["corrupt"].as_u64(), Some(0));
    assert!(a == b, "the second mount's bytes differ from the first's");
    for name in tree_files(seed.path()) {
        assert!(std::fs::read(seed.path().join(&name)).unwrap() == b[&name], "{name}: the restarted mount differs from the seed's output");
    }

    // kt-int8 (sibling groups): validated by the seed and the numpy oracle, then restarted
    // (with the status file, which the validator would refuse at the root).
    let int8 = ["view=kt-int8", "numa_count=2"];
    let first = Mount::new(&sample(), &opts(&int8, &c));
    let validate = python()
        .arg(repo().join("tools/peers/seed_validate_int8.py"))
        .arg("--seeds")
        .arg(shared().join("seeds"))
        .arg(&first.mountpoint)
        .args(["--layers", "0,1,2", "--numa-count", "2", "--expert-num", "8", "--hidden-size", "256", "--intermediate-size", "128", "--verify-hashes"])
        .output()
        .unwrap();
    assert!(validate.status.success(), "{}", String::from_utf8_lossy(&validate.stderr));
    run_ok(python().arg(repo().join("tools/peers/check_int8.py")).arg("--source").arg(sample()).arg("--tree").arg(&first.mountpoint));
    let a = read_all(&first.mountpoint);
    // (No status file to watch: give the last writes behind a moment.)
    wait_until("every kt-int8 entry on disk", Duration::from_secs(60), || entries(&cache).len() >= 24 + a.len() - 1);
    first.unmount();
    let second = Mount::new(&sample(), &opts(&["view=kt-int8", "numa_count=2", "stats=on"], &c));
    let b = read_all(&second.mountpoint);
    let s = stats(&second);
    second.unmount();
    assert_eq!(computed(&s), 0, "{s}");
    assert!(s["disk_cache"]["hits"].as_u64().unwrap() >= a.len() as u64 - 1, "{s}");
    assert!(a == b, "kt-int8: the second mount's bytes differ from the first's");
}

#[test]
fn damaged_entries_are_detected_recomputed_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // Chunk entries (file entries: `file_entries_serve_restarts_through_the_kernel...`).
    let [a, b] = cache_opt(&cache, "0.25");
    let c = [a, b, "disk_cache_files=off".to_string()];
    let src = v41(&dir.path().join("v41"), &[]);
    let reference = Mount::new(&src, &["view=requant"]);
    let want = read_all(&reference.mountpoint);
    reference.unmount();
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    assert!(read_all(&m.mountpoint) == want);
    settle(&m);
    m.unmount();

    // One entry with a flipped payload byte, one truncated, one deleted.
    let e = entries(&cache);
    assert!(e.len() >= 3);
    let payloads: u64 = e[..3].iter().map(|p| std::fs::metadata(p).unwrap().len() - 64).sum();
    let mut raw = std::fs::read(&e[0]).unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 0x40;
    std::fs::write(&e[0], raw).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&e[1]).unwrap();
    f.set_len(f.metadata().unwrap().len() / 2).unwrap();
    drop(f);
    std::fs::remove_file(&e[2]).unwrap();

    let log = dir.path().join("log");
    let m = Mount::new(&src, &opts(&["view=requant", &format!("log_file={}", log.display())], &c));
    assert!(read_all(&m.mountpoint) == want, "a damaged entry was served");
    let s = stats(&m);
    m.unmount();
    let d = &s["disk_cache"];
    assert_eq!(d["corrupt"].as_u64(), Some(2), "{s}");
    assert_eq!(d["misses"].as_u64(), Some(3), "{s}");
    assert_eq!(d["writes"].as_u64(), Some(3), "the three chunks are written again: {s}");
    assert_eq!(computed(&s), payloads, "exactly the three chunks are computed again: {s}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(log.matches("is corrupt").count(), 2, "{log}");
    assert!(log.contains("checksum mismatch") && log.contains("payload bytes"), "{log}");
    // Rewritten: a third mount computes nothing.
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    assert!(read_all(&m.mountpoint) == want);
    assert_eq!(computed(&stats(&m)), 0);
    m.unmount();
}

#[test]
fn a_daemon_killed_during_heavy_cache_writes_leaves_nothing_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let src = v4_large(&dir.path().join("v4"));
    let cache = dir.path().join("cache");
    let c = cache_opt(&cache, "0.25");
    let int8 = ["view=kt-int8", "numa_count=2", "stats=on"];
    for round in 0..3 {
        let m = Mount::new(&src, &opts(&int8, &c));
        let needle = m.mountpoint.to_string_lossy().to_string();
        let pids = live_processes_mentioning(&needle);
        assert_eq!(pids.len(), 1, "{pids:?}");
        // Readers make the daemon compute and write behind; it is killed mid-way.
        let files: Vec<PathBuf> = tree_files(&m.mountpoint).into_iter().filter(|n| n.ends_with(".kt")).map(|n| m.mountpoint.join(n)).collect();
        let readers: Vec<_> = files
            .chunks(files.len().div_ceil(3))
            .map(|part| {
                let part = part.to_vec();
                std::thread::spawn(move || part.iter().for_each(|f| drop(std::fs::read(f))))
            })
            .collect();
        let before = entries(&cache).len();
        wait_until("cache writes", Duration::from_secs(120), || entries(&cache).len() >= before + 4 + round);
        run_ok(Command::new("kill").arg("-9").arg(pids[0].to_string()));
        for r in readers {
            let _ = r.join();
        }
        let _ = Command::new("umount").arg("-l").arg(&m.mountpoint).status();
        wait_until("the killed daemon to be gone", Duration::from_secs(10), || live_processes_mentioning(&needle).is_empty());
    }
    let reference = Mount::new(&src, &["view=kt-int8", "numa_count=2"]);
    let want = read_all(&reference.mountpoint);
    reference.unmount();
    let m = Mount::new(&src, &opts(&int8, &c));
    let got = read_all(&m.mountpoint);
    settle(&m);
    let s = stats(&m);
    m.unmount();
    assert!(got == want, "after kill -9 and a remount, bytes differ from a mount without the cache");
    assert!(s["disk_cache"]["hits"].as_u64().unwrap() > 0, "{s}");
    assert!(std::fs::read_dir(cache.join("tmp")).unwrap().count() == 0, "stale temporary files were not removed");
}

#[test]
fn a_cache_smaller_than_the_view_keeps_its_bound_also_when_shared() {
    let dir = tempfile::tempdir().unwrap();
    let src = v4_large(&dir.path().join("v4"));
    let reference = Mount::new(&src, &["view=kt-int8", "numa_count=2"]);
    let want = read_all(&reference.mountpoint);
    reference.unmount();
    let view_bytes: u64 = want.values().map(|v| v.len() as u64).sum();
    // A quarter of the view.
    let budget = view_bytes / 4;
    let gib = format!("{}", budget as f64 / (1u64 << 30) as f64);
    let cache = dir.path().join("cache");
    let c = cache_opt(&cache, &gib);
    let int8 = ["view=kt-int8", "numa_count=2", "stats=on"];
    let m = Mount::new(&src, &opts(&int8, &c));
    for _ in 0..2 {
        assert!(read_all(&m.mountpoint) == want, "a bounded cache served wrong bytes");
        settle(&m);
        assert!(entry_bytes(&cache) <= budget, "{} bytes of entries, bound {budget}", entry_bytes(&cache));
    }
    let s = stats(&m);
    m.unmount();
    assert!(s["disk_cache"]["evictions"].as_u64().unwrap() > 0, "{s}");
    assert!(s["disk_cache"]["size_bytes"].as_u64().unwrap() <= budget, "{s}");

    // Two mounts sharing the directory, read concurrently (each by two readers).
    let (a, b) = (Mount::new(&src, &opts(&int8, &c)), Mount::new(&src, &opts(&int8, &c)));
    let want = std::sync::Arc::new(want);
    std::thread::scope(|scope| {
        for (i, m) in [&a, &b, &a, &b].into_iter().enumerate() {
            let (want, mnt) = (want.clone(), m.mountpoint.clone());
            scope.spawn(move || {
                let mut names: Vec<&String> = want.keys().collect();
                if i % 2 == 1 {
                    names.reverse();
                }
                for n in names {
                    assert!(std::fs::read(mnt.join(n)).unwrap() == want[n], "{n}: wrong bytes from a shared cache");
                }
            });
        }
    });
    settle(&a);
    settle(&b);
    let (sa, sb) = (stats(&a), stats(&b));
    a.unmount();
    b.unmount();
    assert!(entry_bytes(&cache) <= budget, "two mounts: {} bytes of entries, bound {budget}", entry_bytes(&cache));
    // One shared account of the directory, within the bound, and each mount wrote into it.
    let (da, db) = (&sa["disk_cache"], &sb["disk_cache"]);
    assert_eq!(da["size_bytes"], db["size_bytes"], "{sa} {sb}");
    assert!(da["size_bytes"].as_u64().unwrap() <= budget, "{sa}");
    assert!(da["writes"].as_u64().unwrap() > 0 && db["writes"].as_u64().unwrap() > 0, "{sa} {sb}");
    assert_eq!(sa["disk_cache"]["corrupt"].as_u64().unwrap() + sb["disk_cache"]["corrupt"].as_u64().unwrap(), 0);
}

#[test]
fn a_changed_recipe_or_source_never_meets_old_entries() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let c = cache_opt(&cache, "0.25");
    let src = v41(&dir.path().join("v41"), &[]);
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    let default_recipe = read_all(&m.mountpoint);
    settle(&m);
    m.unmount();

    // w1=Q8_0: the gate experts are recomputed (misses), up and down found (hits).
    let reference = Mount::new(&src, &["view=requant", "w1=Q8_0"]);
    let want = read_all(&reference.mountpoint);
    reference.unmount();
    assert!(want != default_recipe);
    let m = Mount::new(&src, &opts(&["view=requant", "w1=Q8_0"], &c));
    assert!(read_all(&m.mountpoint) == want, "w1=Q8_0 served entries of another recipe");
    let s = stats(&m);
    m.unmount();
    let (hits, misses) = (s["disk_cache"]["hits"].as_u64().unwrap(), s["disk_cache"]["misses"].as_u64().unwrap());
    assert!(hits > 0 && misses > 0 && computed(&s) > 0, "{s}");

    // A shard rewritten in place (same size, one byte of an expert weight changed).
    let shard = std::fs::read_dir(&src).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "safetensors")).min().unwrap();
    let bytes = std::fs::read(&shard).unwrap();
    let hlen = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + hlen]).unwrap();
    let (name, t) = header
        .as_object()
        .unwrap()
        .iter()
        .find(|(n, _)| n.contains(".ffn.experts.") && n.ends_with(".w1.weight"))
        .expect("an expert weight in the first shard");
    let at = 8 + hlen + t["data_offsets"][0].as_u64().unwrap() as usize;
    let mut changed = bytes.clone();
    changed[at] ^= 0x77;
    std::fs::write(&shard, &changed).unwrap();
    let reference = Mount::new(&src, &["view=requant"]);
    let want = read_all(&reference.mountpoint);
    reference.unmount();
    assert!(want != default_recipe, "changing {name} changed no output byte");
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    assert!(read_all(&m.mountpoint) == want, "a changed source was served old entries");
    let s = stats(&m);
    m.unmount();
    assert!(s["disk_cache"]["misses"].as_u64().unwrap() > 0 && computed(&s) > 0, "{s}");
}

#[test]
fn an_interrupted_warm_resumes_then_mounts_and_materialize_compute_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = v41(&dir.path().join("v41"), &["--inter", "512", "--hidden", "1024", "--experts", "8"]);
    let cache = dir.path().join("cache");
    let store = dir.path().join("store");
    let o = format!("view=requant,disk_cache={},disk_cache_gb=0.25,digest_store={}", cache.display(), store.display());
    // Interrupted with kill -9 once some entries are written.
    let mut child = Command::new(bin()).arg("warm").arg(&src).arg("-o").arg(&o).stderr(std::process::Stdio::null()).spawn().unwrap();
    let total = 48;
    let t = std::time::Instant::now();
    while entries(&cache).len() < 3 && t.elapsed() < Duration::from_secs(300) && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let done = entries(&cache).len();
    assert!((1..total).contains(&done), "{done} entries when interrupted");
    // Resumed (the source named by a relative path, as the mount will not name it: the
    // entries are keyed by its canonical path): what is there is not computed again.
    let out = run_ok(Command::new(bin()).current_dir(dir.path()).arg("warm").arg("v41").arg("-o").arg(&o).arg("--json"));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["warm"]["items"].as_u64(), Some(total as u64), "{r}");
    assert!(r["warm"]["present"].as_u64().unwrap() >= done as u64, "{r}");
    assert_eq!(r["warm"]["present"].as_u64().unwrap() + r["warm"]["computed"].as_u64().unwrap(), total as u64, "{r}");
    assert_eq!(r["warm"]["failed"].as_u64(), Some(0), "{r}");
    assert_eq!(entries(&cache).len(), total);

    // A mount and materialize compute nothing; the bytes are those of a mount without cache.
    let reference = Mount::new(&src, &["view=requant"]);
    let want = read_all(&reference.mountpoint);
    reference.unmount();
    let m = Mount::new(&src, &opts(&["view=requant"], &cache_opt(&cache, "0.25")));
    assert!(read_all(&m.mountpoint) == want);
    let s = stats(&m);
    m.unmount();
    assert_eq!(computed(&s), 0, "{s}");
    let out_dir = dir.path().join("out");
    let out = run_ok(Command::new(bin()).arg("materialize").arg(&src).arg("--out").arg(&out_dir).args(["--margin-gib", "0", "--json", "-o", &o]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["chunks"]["bytes_computed"].as_u64(), Some(0), "{r}");
    assert!(r["chunks"]["bytes_from_disk"].as_u64().unwrap() > 0, "{r}");
    for (name, bytes) in &want {
        assert!(std::fs::read(out_dir.join(name)).unwrap() == *bytes, "{name}: materialize from the warm cache differs");
    }

    // Warming one file only, and refusals.
    let out = run_ok(Command::new(bin()).arg("warm").arg(&src).arg("-o").arg(&o).arg("--json").arg("quant-00002-of-00003.safetensors"));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["warm"]["items"].as_u64().unwrap() < total as u64 && r["warm"]["computed"].as_u64() == Some(0), "{r}");
    let no_cache = Command::new(bin()).arg("warm").arg(&src).args(["-o", "view=requant"]).output().unwrap();
    assert!(!no_cache.status.success() && String::from_utf8_lossy(&no_cache.stderr).contains("disk_cache=DIR"));
    let bad_path = Command::new(bin()).arg("warm").arg(&src).arg("-o").arg(&o).arg("nope.bin").output().unwrap();
    assert!(String::from_utf8_lossy(&bad_path.stderr).contains("\"nope.bin\" is not a file or directory of the view"));
}

#[test]
fn prewarm_fills_the_cache_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let src = v41(&dir.path().join("v41"), &[]);
    let cache = dir.path().join("cache");
    let c = cache_opt(&cache, "0.25");
    let m = Mount::new(&src, &opts(&["view=requant", "prewarm=on"], &c));
    // A client read meanwhile is served (and correct: compared below).
    let plan = std::fs::read(m.path("plan.json")).unwrap();
    assert!(!plan.is_empty());
    wait_until("prewarm to write every chunk", Duration::from_secs(300), || entries(&cache).len() == 24);
    settle(&m);
    let s = stats(&m);
    m.unmount();
    assert!(s["compute"]["runs_background"].as_u64().unwrap() > 0, "{s}");
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    let got = read_all(&m.mountpoint);
    assert_eq!(computed(&stats(&m)), 0);
    m.unmount();
    let reference = Mount::new(&src, &["view=requant"]);
    assert!(read_all(&reference.mountpoint) == got);
    reference.unmount();
}

#[test]
fn file_entries_serve_restarts_through_the_kernel_and_are_never_served_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let c = cache_opt(&cache, "0.25");
    // Shards of 1.3-2.2 MiB: each gets a file entry.
    let src = v41(&dir.path().join("v41"), &["--inter", "512", "--hidden", "1024", "--experts", "8"]);
    let seed = tempfile::tempdir().unwrap();
    seed_requant(&src, seed.path(), &[]);
    let shards: Vec<String> = tree_files(seed.path()).into_iter().filter(|n| n.ends_with(".safetensors")).collect();
    assert_eq!(shards.len(), 3);
    let want: BTreeMap<String, Vec<u8>> = tree_files(seed.path()).into_iter().map(|n| (n.clone(), std::fs::read(seed.path().join(&n)).unwrap())).collect();
    let n = shards.len() as u64;

    // The first mount computes; each shard, once closed with every chunk on disk, is kept
    // whole behind.
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    assert!(read_all(&m.mountpoint) == want, "first mount differs from the seed");
    settle(&m);
    let s = stats(&m);
    m.unmount();
    assert_eq!(s["disk_cache"]["file_writes"].as_u64(), Some(n), "{s}");
    assert_eq!(file_entries(&cache).len(), shards.len());

    // The second serves the shards from them through the kernel: nothing computed, nothing
    // read from chunk entries; buffered, O_DIRECT and mmap reads are the seed's bytes.
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    for name in &shards {
        assert!(std::fs::read(m.path(name)).unwrap() == want[name], "{name}: a restart through file entries differs from the seed");
        let out = run_ok(python().arg("-c").arg(ODIRECT_AND_MMAP).arg(m.path(name)));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), sha256_hex(&want[name]), "{name}: O_DIRECT / mmap through passthrough");
    }
    let s = stats(&m);
    // (The manifests hold digests of the shards: reading them may read chunk entries.)
    assert!(read_all(&m.mountpoint) == want, "a restart through file entries differs from the seed");
    m.unmount();
    assert_eq!(computed(&s), 0, "{s}");
    assert_eq!(s["cache"]["bytes_from_disk"].as_u64(), Some(0), "shards came from chunk entries: {s}");
    assert!(s["passthrough"]["opens"].as_u64().unwrap() >= 3 * n, "{s}");
    assert_eq!(s["disk_cache"]["file_rechecks"].as_u64(), Some(0), "{s}");

    // Damaged between mounts: a flipped byte, a truncation, a damaged seal. Each is found
    // at open, logged, deleted, and the shard is served from its chunk entries instead.
    let files = file_entries(&cache);
    let mut raw = std::fs::read(&files[0]).unwrap();
    let mid = raw.len() / 2;
    raw[mid] ^= 0x01;
    std::fs::write(&files[0], raw).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&files[1]).unwrap();
    f.set_len(f.metadata().unwrap().len() - 1).unwrap();
    drop(f);
    let seal = files[2].with_extension("seal");
    let mut raw = std::fs::read(&seal).unwrap();
    raw[100] ^= 0x80;
    std::fs::write(&seal, raw).unwrap();
    let log = dir.path().join("log");
    let m = Mount::new(&src, &opts(&["view=requant", &format!("log_file={}", log.display())], &c));
    assert!(read_all(&m.mountpoint) == want, "a damaged file entry was served");
    settle(&m);
    let s = stats(&m);
    m.unmount();
    assert_eq!(s["disk_cache"]["corrupt"].as_u64(), Some(n), "{s}");
    assert_eq!(computed(&s), 0, "the chunk entries serve the damaged shards: {s}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("is corrupt").count(), 3, "{text}");
    for why in ["checksum mismatch", "data has"] {
        assert!(text.contains(why), "{why}: {text}");
    }
    // Kept whole again behind that mount's reads: the next restart passes them through.
    assert_eq!(s["disk_cache"]["file_writes"].as_u64(), Some(n), "{s}");
    let m = Mount::new(&src, &opts(&["view=requant"], &c));
    assert!(read_all(&m.mountpoint) == want);
    let s = stats(&m);
    m.unmount();
    assert_eq!((s["disk_cache"]["file_hits"].as_u64(), s["disk_cache"]["corrupt"].as_u64()), (Some(n), Some(0)), "{s}");

    // The kernel refuses to mix passthrough and page-cached handles of one file: a handle
    // open through the daemon while its file entry appears (written by another process)
    // keeps new opens of that file on the daemon, until it is closed.
    let name = &shards[1];
    let entry = file_entries(&cache).into_iter().find(|p| std::fs::metadata(p).unwrap().len() == want[name].len() as u64).unwrap();
    std::fs::remove_file(entry.with_extension("seal")).unwrap();
    std::fs::remove_file(&entry).unwrap();
    let m = Mount::new(&src, &opts(&["view=requant", "disk_cache_files=on"], &c));
    let held = std::fs::File::open(m.path(name)).unwrap();
    let mut head = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&held, &mut head, 0).unwrap();
    let o = format!("view=requant,disk_cache={},disk_cache_gb=0.25", cache.display());
    run_ok(std::process::Command::new(bin()).arg("warm").arg(&src).arg("-o").arg(&o).arg(name));
    assert_eq!(file_entries(&cache).len(), shards.len(), "warm kept the shard whole");
    let opens = stats(&m)["passthrough"]["opens"].as_u64().unwrap();
    assert!(std::fs::read(m.path(name)).unwrap() == want[name], "a second open while one is held");
    assert_eq!(stats(&m)["passthrough"]["opens"].as_u64().unwrap(), opens, "passed through next to a page-cached handle");
    drop(held);
    wait_until("the held handle's release", Duration::from_secs(10), || {
        std::fs::read(m.path(name)).unwrap() == want[name] && stats(&m)["passthrough"]["opens"].as_u64().unwrap() > opens
    });

    // Damaged in place while a handle passes it through: the kernel would serve the damage
    // to new opens and the daemon may not serve them beside it, so they are refused (EIO)
    // until that handle is closed; then they are served from chunk entries.
    let held = std::fs::File::open(m.path(name)).unwrap();
    let entry = file_entries(&cache).into_iter().find(|p| std::fs::metadata(p).unwrap().len() == want[name].len() as u64).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&entry).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\xff\x00", 1000).unwrap();
    drop(f);
    let refused = std::fs::File::open(m.path(name)).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EIO), "{refused}");
    drop(held);
    wait_until("the held handle's release", Duration::from_secs(10), || std::fs::read(m.path(name)).is_ok_and(|b| b == want[name]));
    assert!(!entry.exists(), "the damaged entry is deleted");
    m.unmount();
}
