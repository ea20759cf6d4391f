//! The expert-pack view, mounted for real and checked against independent peers:
//! gguf-py's GGUFReader (through tools/peers/check_pack.py), the first seed itself, and
//! plain syscalls (pread, mmap, O_DIRECT).

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const ID: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const CFG: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn check_pack(sources: &[&Path], pack: &Path, modes: &str) {
    let mut cmd = python();
    cmd.arg(repo().join("tools/peers/check_pack.py")).arg("--source").args(sources).arg("--pack").arg(pack).arg("--modes").arg(modes);
    run_ok(&mut cmd);
}

#[test]
fn pack_equals_gguf_reader_slices_through_pread_mmap_and_o_direct() {
    let m = Mount::new(&sample(), &[]);
    let names: Vec<String> = std::fs::read_dir(&m.mountpoint).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, [".xpackfs", "sample-moe.pack", "sample-moe.pack.manifest.json"]);
    check_pack(&[&sample()], &m.path("sample-moe.pack"), "pread,mmap,direct");
    m.unmount();
}

#[test]
fn pack_and_manifest_match_the_seed_build() {
    let out = tempfile::tempdir().unwrap();
    seed_expert_pack(
        &sample(),
        out.path(),
        &["--model-identity-sha256", ID, "--config-sha256", CFG, "--top-k", "2", "--alignment", "8192", "--model-ref", "toy-moe"],
    );
    let m = Mount::new(&sample(), &[&format!("model_identity_sha256={ID}"), &format!("config_sha256={CFG}"), "top_k=2", "alignment=8192", "model_ref=toy-moe"]);
    let seed_pack = std::fs::read(out.path().join("sample-moe.pack")).unwrap();
    let our_pack = std::fs::read(m.path("sample-moe.pack")).unwrap();
    assert_eq!(seed_pack.len(), our_pack.len());
    assert!(seed_pack == our_pack, "mounted pack differs from the seed's pack");

    // Manifests: equal except what records when, where and by which program.
    let load = |p: &Path| -> serde_json::Value { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    let mut seed = load(&out.path().join("sample-moe.pack.manifest.json"));
    let mut ours = load(&m.path("sample-moe.pack.manifest.json"));
    assert_eq!(ours["pack_path"], m.path("sample-moe.pack").to_string_lossy().as_ref());
    for v in [&mut seed, &mut ours] {
        let o = v.as_object_mut().unwrap();
        for k in ["created_at", "pack_path", "builder"] {
            assert!(o.remove(k).is_some(), "manifest lacks {k}");
        }
        o["transform"].as_object_mut().unwrap().remove("tool_sha256").expect("tool_sha256");
    }
    assert_eq!(seed, ours);
    // Text form: what json.dump(indent=2, sort_keys=True, ensure_ascii=False) + "\n" writes.
    let text = std::fs::read_to_string(m.path("sample-moe.pack.manifest.json")).unwrap();
    assert!(text.starts_with("{\n  \"alignment\": 8192,\n") && text.ends_with("}\n"));
    m.unmount();

    // materialize writes the seed's three files: the same pack, the same manifest (but for
    // the same fields) and the completed checkpoint.
    let mat = tempfile::tempdir().unwrap();
    let opts = format!("model_identity_sha256={ID},config_sha256={CFG},top_k=2,alignment=8192,model_ref=toy-moe,digest_store=none");
    run_ok(Command::new(bin()).arg("materialize").arg(sample()).arg("--out").arg(mat.path()).args(["--margin-gib", "0", "--verify", "-o", &opts]));
    let mut names: Vec<String> = std::fs::read_dir(mat.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut seed_names: Vec<String> = std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    seed_names.sort();
    assert_eq!(names, seed_names);
    assert!(std::fs::read(mat.path().join("sample-moe.pack")).unwrap() == seed_pack);
    let mut mat_manifest = load(&mat.path().join("sample-moe.pack.manifest.json"));
    for k in ["created_at", "pack_path", "builder"] {
        mat_manifest.as_object_mut().unwrap().remove(k);
    }
    mat_manifest["transform"].as_object_mut().unwrap().remove("tool_sha256");
    assert_eq!(mat_manifest, seed);
    let mut seed_ck = load(&out.path().join("sample-moe.pack.checkpoint.json"));
    let mut our_ck = load(&mat.path().join("sample-moe.pack.checkpoint.json"));
    let our_manifest_sha = xpackfs::digest::sha256_hex(&std::fs::read(mat.path().join("sample-moe.pack.manifest.json")).unwrap());
    assert_eq!(our_ck["manifest_sha256"], our_manifest_sha.as_str());
    assert_eq!(seed_ck["entries"].as_array().unwrap().len(), 3 * 8 * 3);
    for v in [&mut seed_ck, &mut our_ck] {
        let o = v.as_object_mut().unwrap();
        // When, by which program, and the digest of a manifest that differs in those fields.
        for k in ["started_at", "completed_at", "tool_sha256", "manifest_sha256"] {
            assert!(o.remove(k).is_some(), "checkpoint lacks {k}");
        }
    }
    assert_eq!(our_ck, seed_ck);
    let text = std::fs::read_to_string(mat.path().join("sample-moe.pack.checkpoint.json")).unwrap();
    assert!(text.starts_with("{\n  \"completed_at\": ") && text.ends_with("}\n"));
}

#[test]
fn checker_fails_on_corrupted_packs() {
    // The checker must be able to fail: corrupt one payload byte, then one index byte.
    let m = Mount::new(&sample(), &[]);
    let good = std::fs::read(m.path("sample-moe.pack")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let manifest = std::fs::read_to_string(m.path("sample-moe.pack.manifest.json")).unwrap();
    let pack = tmp.path().join("sample-moe.pack");
    let manifest = manifest.replace(&m.path("sample-moe.pack").to_string_lossy().to_string(), &pack.to_string_lossy());
    std::fs::write(tmp.path().join("sample-moe.pack.manifest.json"), manifest).unwrap();
    std::fs::write(&pack, &good).unwrap();
    check_pack(&[&sample()], &pack, "pread");
    for (offset, what) in [(good.len() - 60_000, "object"), (176 + 328 * 5 + 20, "index entry")] {
        let mut bad = good.clone();
        bad[offset] ^= 0x40;
        std::fs::write(&pack, &bad).unwrap();
        let out = python().arg(repo().join("tools/peers/check_pack.py")).args(["--source"]).arg(sample()).arg("--pack").arg(&pack).output().unwrap();
        assert!(!out.status.success(), "checker accepted a pack with a corrupted {what}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("FAIL"), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn split_gguf_set_is_one_source() {
    let tmp = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_sample_gguf.py")).arg(tmp.path().join("split.gguf")).args(["--split-max-tensors", "9"]));
    let mut parts: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().path()).collect();
    parts.sort();
    assert!(parts.len() >= 3, "expected a split set, got {parts:?}");
    // Mount by naming any part.
    let m = Mount::new(&parts[1], &[]);
    let parts_ref: Vec<&Path> = parts.iter().map(|p| p.as_path()).collect();
    check_pack(&parts_ref, &m.path("split.pack"), "pread");
    // Same tensors as the single-file sample: the object region is identical.
    let single = Mount::new(&sample(), &[]);
    let a = std::fs::read(m.path("split.pack")).unwrap();
    let b = std::fs::read(single.path("sample-moe.pack")).unwrap();
    assert_eq!(a.len(), b.len());
    assert!(a[24576..] == b[24576..], "object bytes differ between the split set and the single file");
    m.unmount();
    single.unmount();

    // A missing part refuses to mount, naming it.
    std::fs::remove_file(&parts[2]).unwrap();
    let err = Mount::try_new(&parts[0], &[]).err().expect("mount of an incomplete split set succeeded");
    let msg = String::from_utf8_lossy(&err.stderr);
    assert!(msg.contains("part of a") && msg.contains("split set is missing"), "{msg}");
}

#[test]
fn o_direct_aligned_ranges_and_concurrent_random_reads() {
    let m = Mount::new(&sample(), &[]);
    let pack = m.path("sample-moe.pack");
    let expected = std::fs::read(&pack).unwrap();
    // O_DIRECT reads of 4096-aligned ranges into an aligned buffer, as SGLang's direct-io mode does.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&pack).unwrap();
        let mut buf = memmap2::MmapMut::map_anon(64 * 4096).unwrap();
        for (off, len) in [(0usize, 4096usize), (24576, 53248), (4096 * 7, 4096 * 3), (expected.len() - 4096, 4096)] {
            let n = f.read_at(&mut buf[..len], off as u64).unwrap();
            assert_eq!(n, len);
            assert!(buf[..len] == expected[off..off + len], "O_DIRECT read at {off}");
        }
    }
    // mmap of the whole file.
    {
        let f = std::fs::File::open(&pack).unwrap();
        // SAFETY: a read-only mapping of a file nothing truncates while the test reads it.
        let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
        assert!(map[..] == expected[..]);
    }
    // Threads reading random ranges with pread (caches dropped between rounds).
    let f = std::sync::Arc::new(std::fs::File::open(&pack).unwrap());
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let f = f.clone();
            let expected = &expected;
            s.spawn(move || {
                let mut x = 0x9E3779B97F4A7C15u64.wrapping_mul(t + 1);
                for _ in 0..200 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (x % expected.len() as u64) as usize;
                    let len = ((x >> 32) % (300_000)) as usize;
                    let mut buf = vec![0u8; len];
                    let n = f.read_at(&mut buf, off as u64).unwrap();
                    let want = &expected[off..(off + len).min(expected.len())];
                    assert_eq!(&buf[..n], want);
                    // SAFETY: posix_fadvise on an open descriptor; no memory is passed.
                    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&*f), 0, 0, libc::POSIX_FADV_DONTNEED) };
                }
            });
        }
    });
    drop(f);
    m.unmount();
}

#[test]
fn read_only_everywhere() {
    let m = Mount::new(&sample(), &[]);
    let line = mounts_line(&m.mountpoint).unwrap();
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields[2], "fuse.xpackfs", "{line}");
    assert!(fields[3].split(',').any(|o| o == "ro"), "{line}");
    let err = std::fs::OpenOptions::new().write(true).open(m.path("sample-moe.pack")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::write(m.path("new-file"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = std::fs::remove_file(m.path("sample-moe.pack")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let meta = std::fs::metadata(m.path("sample-moe.pack")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o444);
    m.unmount();
}

#[test]
fn umount_leaves_no_process_and_remount_is_instant_from_the_store() {
    let m = Mount::new(&sample(), &[]);
    let needle = m.mountpoint.to_string_lossy().to_string();
    assert_eq!(live_processes_mentioning(&needle).len(), 1, "one daemon per mount");
    m.unmount();
    assert!(live_processes_mentioning(&needle).is_empty());
    // Second mount with the same store reads only headers: the store entry is used.
    // One entry for the source's digests, one for the pack's own digest (pack_sha256).
    let entries = |dir: &std::path::Path| std::fs::read_dir(dir).map(|d| d.flatten().filter(|e| e.path().is_file()).count()).unwrap_or(0);
    assert_eq!((entries(m.store.path()), entries(&m.store.path().join("views"))), (1, 1), "digests were remembered");
    let out =
        Command::new(bin()).arg("mount").arg(sample()).arg(&m.mountpoint).arg("-o").arg(format!("digest_store={}", m.store.path().display())).output().unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("source digests from the store") && !log.contains("hashing"), "{log}");
    m.unmount();
}

#[test]
fn mount_helper_forms() {
    // `mount -t fuse.xpackfs` runs mount.fuse3 with PATH cleared, which execs
    // `xpackfs SRC MNT -o opts` from the shell's default path (/usr/local/bin is on it).
    // Inside a private mount namespace, /usr/local/bin is bind-mounted over with a
    // directory holding only this build's binary, so the real helper path is tested
    // without touching the host.
    let m_dir = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let mnt = m_dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let bin_dir = m_dir.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    std::os::unix::fs::symlink(bin(), bin_dir.join("xpackfs")).unwrap();
    let report = m_dir.path().join("inspect.json");
    let script = format!(
        "set -e\n\
         mount --bind {bin_dir} /usr/local/bin\n\
         mount -t fuse.xpackfs {src} {mnt} -o rw,nodev,nosuid,noatime,_netdev,x-systemd.automount,top_k=3,digest_store={store}\n\
         grep -q \" {mnt} fuse.xpackfs ro,\" /proc/mounts\n\
         {bin} inspect {mnt}/sample-moe.pack --limit 0 > {report}\n\
         umount {mnt}\n",
        bin_dir = bin_dir.display(),
        src = sample().display(),
        mnt = mnt.display(),
        store = store.path().display(),
        bin = bin(),
        report = report.display(),
    );
    run_ok(Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(v["header"]["top_k"], 3, "top_k from -o reached the view");
    wait_until("daemon exit", Duration::from_secs(10), || live_processes_mentioning(&mnt.to_string_lossy()).is_empty());
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());

    // The same argv form directly, and the flag form: both give the same files.
    run_ok(Command::new(bin()).arg(sample()).arg(&mnt).arg("-o").arg(format!("top_k=3,digest_store={}", store.path().display())));
    let a = std::fs::read(mnt.join("sample-moe.pack")).unwrap();
    umount(&mnt);
    wait_until("daemon exit", Duration::from_secs(10), || live_processes_mentioning(&mnt.to_string_lossy()).is_empty());
    run_ok(Command::new(bin()).arg("mount").arg(sample()).arg(&mnt).args(["--top-k", "3", "--digest-store"]).arg(store.path()));
    let b = std::fs::read(mnt.join("sample-moe.pack")).unwrap();
    assert!(a == b);
    umount(&mnt);

    // mount.fuse3 with drop_privileges opens /dev/fuse itself and passes /dev/fd/N.
    wait_until("daemon exit", Duration::from_secs(10), || live_processes_mentioning(&mnt.to_string_lossy()).is_empty());
    run_ok(Command::new("mount.fuse3").env("PATH", &path).arg(format!("xpackfs#{}", sample().display())).arg(&mnt).arg("-o").arg(format!(
        "drop_privileges,mountpoint_path={},digest_store={}",
        mnt.display(),
        store.path().display()
    )));
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(mnt.join("sample-moe.pack.manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["pack_path"], mnt.join("sample-moe.pack").to_string_lossy().as_ref());
    assert_eq!(std::fs::read(mnt.join("sample-moe.pack")).unwrap().len(), a.len());
    // Given a descriptor, the daemon cannot set the mount's readahead, so the pack is read
    // through the daemon (FOPEN_DIRECT_IO) rather than in 128 KiB readahead requests.
    assert_eq!(cached_bytes(&mnt.join("sample-moe.pack")), 0, "the pack entered the page cache of a mount without readahead");
    umount(&mnt);
}

#[test]
fn foreground_sigterm_unmounts_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut child = Command::new(bin()).arg("mount").arg(sample()).arg(&mnt).args(["-f", "-o", "digest_store=none"]).spawn().unwrap();
    wait_until("foreground mount", Duration::from_secs(20), || mounts_line(&mnt).is_some());
    assert!(std::fs::metadata(mnt.join("sample-moe.pack")).is_ok());
    // SAFETY: kill() takes plain integers; the pid is a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(mounts_line(&mnt).is_none(), "still mounted after SIGTERM");
}

#[test]
fn inspect_summarises_packs() {
    let m = Mount::new(&sample(), &[]);
    let out = run_ok(Command::new(bin()).arg("inspect").arg(m.path("sample-moe.pack")).args(["--limit", "2"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["header"]["num_layers"], 3);
    assert_eq!(v["header"]["num_experts"], 8);
    assert_eq!(v["role_counts"]["gate"], 24);
    assert_eq!(v["role_counts"]["down"], 24);
    assert_eq!(v["payload_bytes"], 72 * 17408);
    assert_eq!(v["entries"].as_array().unwrap().len(), 2);
    assert_eq!(v["entries"][1]["role_id"], 1);
    let bad = Command::new(bin()).arg("inspect").arg(sample()).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bad magic"));
    m.unmount();
}

#[test]
fn read_ahead_kb_option_sets_the_mounts_bdi() {
    // Also a regression test: setting it once stat()ed the mountpoint before the session
    // ran, and the mount deadlocked on its own GETATTR.
    let read_ahead = |m: &Mount| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let dev = info.lines().map(|l| l.split(' ').collect::<Vec<_>>()).find(|f| f[4] == m.mountpoint.to_string_lossy()).map(|f| f[2].to_string()).unwrap();
        std::fs::read_to_string(format!("/sys/class/bdi/{dev}/read_ahead_kb")).unwrap().trim().to_string()
    };
    let m = Mount::new(&sample(), &["read_ahead_kb=2048"]);
    assert_eq!(read_ahead(&m), "2048");
    m.unmount();
    // A view with computed files reads ahead as much as one request by default (max_read);
    // one with files of source bytes, which it reads with direct I/O, eight requests.
    let cases = [
        (&["view=kt-int8"][..], "1024"),
        (&["view=kt-int8", "max_read=262144"], "256"),
        (&["view=kt-int8", "read_ahead_kb=64"], "64"),
        (&[], "8192"),
        (&["max_read=262144"], "2048"),
    ];
    for (opts, kb) in cases {
        let m = Mount::new(&sample(), opts);
        assert_eq!(read_ahead(&m), kb, "{opts:?}");
        m.unmount();
    }
}

#[test]
fn stats_json_reports_reads_and_the_cache() {
    let m = Mount::new(&sample(), &[]);
    let read_stats = || -> serde_json::Value { serde_json::from_slice(&std::fs::read(m.path(".xpackfs/stats.json")).unwrap()).unwrap() };
    let before = read_stats();
    // The codecs' SIMD level in use is reported (the level `xpackfs --version` names).
    assert!(["scalar", "avx2", "avx512"].iter().any(|l| before["codec_simd"].as_str().is_some_and(|s| s.starts_with(l))), "{before}");
    let pack = std::fs::read(m.path("sample-moe.pack")).unwrap();
    let after = read_stats();
    assert!(after["reads"].as_u64().unwrap() > before["reads"].as_u64().unwrap());
    assert!(after["bytes_served"].as_u64().unwrap() >= pack.len() as u64);
    assert!(after["read_latency_us"]["p99"].as_u64().unwrap() >= after["read_latency_us"]["p50"].as_u64().unwrap());
    assert_eq!(after["cache"]["budget_bytes"], 1024u64 << 20);
    assert_eq!(after["files"], 2);
    // Not part of the view: materialize and listings of the view's files leave it out.
    assert!(std::fs::metadata(m.path(".xpackfs")).unwrap().is_dir());
    m.unmount();
    // INT8 views keep their root exactly as the validator wants it.
    let m = Mount::new(&sample(), &["view=kt-int8"]);
    assert!(std::fs::metadata(m.path(".xpackfs")).is_err());
    m.unmount();
}

/// The pack is made of source bytes: by default the mount's page cache holds it (its source
/// is read around the page cache, see tests/direct_io.rs), `direct_io=on` bypasses it;
/// mmap works either way; computed files keep the page cache.
#[test]
fn the_mount_caches_the_pack_unless_direct_io_is_on() {
    for (opts, expect_cached) in [("top_k=2", true), ("top_k=2,direct_io=on", false)] {
        let m = Mount::new(&sample(), &[opts]);
        let pack = m.path("sample-moe.pack");
        let bytes = std::fs::read(&pack).unwrap();
        let cached = cached_bytes(&pack);
        assert_eq!(cached > 0, expect_cached, "{opts}: {cached} bytes of the pack cached after reading it");
        check_pack(&[&sample()], &pack, "mmap");
        assert_eq!(bytes.len() as u64, std::fs::metadata(&pack).unwrap().len());
        m.unmount();
    }
    let v4 = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(v4.path()).args(["--variant", "v4", "--inter", "256"]));
    let m = Mount::new(v4.path(), &["view=bf16-cache"]);
    let shard = m.path("non-expert-000.safetensors");
    std::fs::read(&shard).unwrap();
    assert!(cached_bytes(&shard) > 0, "computed BF16 shards keep the page cache");
    m.unmount();
}
