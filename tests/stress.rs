//! Many threads and processes read random ranges of every view (pread, mmap, O_DIRECT)
//! while the chunk cache is squeezed to 1 MiB; every byte is checked against the
//! materialized output; the daemon's memory stays bounded.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use common::*;

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

fn all_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(all_files(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn concurrent_random_reads_of_every_view_under_cache_pressure() {
    let v41 = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(v41.path()).args(["--variant", "v41", "--inter", "256"]));
    let cases: Vec<(std::path::PathBuf, &str)> = vec![
        (sample(), "top_k=2"),
        (v41.path().to_path_buf(), "view=bf16-cache"),
        (v41.path().to_path_buf(), "view=requant"),
        (sample(), "view=kt-int8,numa_count=2"),
    ];
    for (source, opts) in cases {
        let reference = tempfile::tempdir().unwrap();
        let r = Command::new(bin())
            .arg("materialize")
            .arg(&source)
            .arg("--out")
            .arg(reference.path())
            .args(["--margin-gib", "0", "-o", &format!("{opts},digest_store=none")])
            .output()
            .unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let m = Mount::new(&source, &[opts, "cache_mb=1"]);
        let daemon = live_processes_mentioning(&m.mountpoint.to_string_lossy())[0];
        // The expert pack's manifest names where its pack is: take the mount's as reference.
        // materialize also writes the seed's build checkpoint, which the mount does not serve.
        for f in all_files(reference.path()) {
            if f.to_string_lossy().ends_with(".pack.manifest.json") {
                std::fs::copy(m.mountpoint.join(f.file_name().unwrap()), &f).unwrap();
            }
            if f.to_string_lossy().ends_with(".pack.checkpoint.json") {
                std::fs::remove_file(&f).unwrap();
            }
        }
        // Processes (pread / mmap / O_DIRECT) ...
        let children: Vec<_> = (0..3)
            .map(|i| {
                python()
                    .arg(repo().join("tools/peers/stress_reader.py"))
                    .arg(&m.mountpoint)
                    .arg(reference.path())
                    .args(["--seconds", "3", "--seed", &i.to_string()])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // ... and threads (pread), at the same time.
        let files: Vec<_> = all_files(reference.path());
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (files, m, reference) = (&files, &m, reference.path());
                s.spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t + 11);
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
                    while std::time::Instant::now() < deadline {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let f = &files[(x % files.len() as u64) as usize];
                        let want = std::fs::read(f).unwrap();
                        if want.is_empty() {
                            continue;
                        }
                        let rel = f.strip_prefix(reference).unwrap();
                        let off = (x >> 20) % want.len() as u64;
                        let len = ((x >> 40) % (512 << 10)).min(want.len() as u64 - off) as usize + 1;
                        let len = len.min(want.len() - off as usize);
                        let mut buf = vec![0u8; len];
                        let fh = std::fs::File::open(m.mountpoint.join(rel)).unwrap();
                        fh.read_exact_at(&mut buf, off).unwrap();
                        assert!(buf == want[off as usize..off as usize + len], "{}: bytes differ at {off}", rel.display());
                    }
                });
            }
        });
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "{opts}: a reader process found a difference");
        }
        let rss = rss_kb(daemon);
        assert!(rss < 256 * 1024, "{opts}: daemon RSS {rss} kB with a 1 MiB cache");
        m.unmount();
    }
}
