//! End-to-end direct I/O, mounted for real: a client that opens the pack with `O_DIRECT`
//! gets the pack's bytes (aligned and unaligned reads, whole objects and SGLang's splits,
//! split sets, never a short read) while the daemon reads the source with `O_DIRECT`
//! too: the source stays out of the page cache, and a source changed under an open direct
//! handle gives `EIO`. Peers: SGLang's own reader (tools/peers/sglang_read.py, checking every
//! role against its index digest) and gguf-py's reader (tools/peers/check_pack.py).

mod common;

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use common::*;

/// A GGUF whose expert objects are multiples of 4096 bytes (hidden 512 x ff 256 MXFP4: 69,632
/// bytes per role), as SGLang's direct-I/O mode requires, with tensor data at GGUF's
/// 32-byte alignment (so the source ranges are not 4096-aligned). `split`: tensors per part.
fn make_gguf(dir: &Path, name: &str, layers: u32, experts: u32, split: Option<u32>) -> Vec<PathBuf> {
    let mut cmd = python();
    cmd.arg(repo().join("tools/fixtures/make_sample_gguf.py")).arg(dir.join(name)).args(["--hidden", "512", "--ff", "256", "--top-k", "2"]);
    cmd.args(["--layers", &layers.to_string(), "--experts", &experts.to_string(), "--fast-random"]);
    if let Some(n) = split {
        cmd.args(["--split-max-tensors", &n.to_string()]);
    }
    run_ok(&mut cmd);
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "gguf")).collect();
    parts.sort();
    parts
}

struct Layout {
    data_start: u64,
    stride: u64,
    payload: u64,
    objects: u64,
}

fn layout(manifest: &Path) -> Layout {
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    let n = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("manifest has no {k}"));
    Layout { data_start: n("data_start"), stride: n("object_stride"), payload: n("object_payload_bytes"), objects: n("object_count") }
}

fn open_direct(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).unwrap()
}

/// One `pread` that must return exactly `buf.len()` bytes.
fn read_exact_once(f: &std::fs::File, buf: &mut [u8], off: u64, what: &str) {
    let n = f.read_at(buf, off).unwrap_or_else(|e| panic!("{what}: read of {} at {off}: {e}", buf.len()));
    assert_eq!(n, buf.len(), "{what}: short read at {off}");
}

/// SGLang's own reader over the pack (every role checked against its index digest).
fn sglang_read(pack: &Path, direct: bool, splits: u32) -> serde_json::Value {
    let mut cmd = python();
    cmd.arg(repo().join("tools/peers/sglang_read.py")).arg(pack).args(["--splits", &splits.to_string(), "--verify", "--json"]);
    if direct {
        cmd.arg("--direct-io");
    }
    cmd.env("XPACKFS_SHARED", shared());
    serde_json::from_slice(&run_ok(&mut cmd).stdout).unwrap()
}

#[test]
fn o_direct_reads_equal_the_pack_for_every_object() {
    let tmp = tempfile::tempdir().unwrap();
    let single = tmp.path().join("single");
    let split = tmp.path().join("split");
    std::fs::create_dir_all(&single).unwrap();
    std::fs::create_dir_all(&split).unwrap();
    // The split set's mount also cuts direct reads into parallel pieces (direct_piece_kb).
    for (parts, opts) in [(make_gguf(&single, "d.gguf", 2, 8, None), ""), (make_gguf(&split, "d.gguf", 2, 8, Some(7)), "direct_piece_kb=64")] {
        let m = Mount::new(&parts[0], &[opts]);
        let pack = m.path("d.pack");
        let refs: Vec<&Path> = parts.iter().map(|p| p.as_path()).collect();
        // Buffered and O_DIRECT reads equal gguf-py's slices of the source (every object).
        let mut cmd = python();
        cmd.arg(repo().join("tools/peers/check_pack.py")).arg("--source").args(&refs).arg("--pack").arg(&pack).args(["--modes", "pread,direct"]);
        run_ok(&mut cmd);
        let expected = std::fs::read(&pack).unwrap();
        let l = layout(&m.path("d.pack.manifest.json"));
        assert_eq!(l.payload % 4096, 0, "the fixture must have 4096-multiple objects");
        let f = open_direct(&pack);
        let mut buf = memmap2::MmapMut::map_anon(l.payload as usize + 8192).unwrap();
        for i in 0..l.objects {
            let off = l.data_start + i * l.stride;
            let want = &expected[off as usize..(off + l.payload) as usize];
            // SGLang's loader: one read per object into an aligned buffer.
            read_exact_once(&f, &mut buf[..l.payload as usize], off, "one read per object");
            assert!(&buf[..l.payload as usize] == want, "object {i}: O_DIRECT bytes differ");
            // Unaligned offset, length and buffer (FUSE accepts them under O_DIRECT).
            let (skew, len) = (1 + (i as usize * 517) % 4000, l.payload as usize - 4099);
            read_exact_once(&f, &mut buf[3..3 + len], off + skew as u64, "unaligned");
            assert!(buf[3..3 + len] == expected[off as usize + skew..off as usize + skew + len], "object {i}: unaligned O_DIRECT bytes differ");
        }
        // SGLang's splits: four 4096-aligned ranges per object, read at once.
        let cuts: Vec<u64> = (0..4).map(|p| l.payload * p / 4 / 4096 * 4096).chain([l.payload]).collect();
        std::thread::scope(|s| {
            for part in 0..4 {
                let (f, expected, cuts) = (&f, &expected, &cuts);
                s.spawn(move || {
                    let mut buf = memmap2::MmapMut::map_anon(l.payload as usize).unwrap();
                    for i in 0..l.objects {
                        let off = l.data_start + i * l.stride + cuts[part];
                        let len = (cuts[part + 1] - cuts[part]) as usize;
                        read_exact_once(f, &mut buf[..len], off, "split");
                        assert!(buf[..len] == expected[off as usize..off as usize + len], "object {i} split {part} differs");
                    }
                });
            }
        });
        // Whole-pack O_DIRECT reads of 1 MiB by 4 threads at once (with direct_piece_kb, each
        // request read as parallel pieces by the daemon's direct-read pool).
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (f, expected) = (&f, &expected);
                s.spawn(move || {
                    let mut buf = memmap2::MmapMut::map_anon(1 << 20).unwrap();
                    let mut off = (t << 20) % expected.len() as u64 / 4096 * 4096;
                    for _ in 0..expected.len().div_ceil(1 << 20) {
                        let n = f.read_at(&mut buf[..], off).unwrap();
                        assert_eq!(n, (expected.len() - off as usize).min(1 << 20), "short read at {off}");
                        assert!(buf[..n] == expected[off as usize..off as usize + n], "1 MiB O_DIRECT read at {off}");
                        off = (off + n as u64) % expected.len() as u64;
                    }
                });
            }
        });
        // SGLang's own reader, loader defaults (O_DIRECT, one read per object) and 4 splits.
        for splits in [1, 4] {
            let r = sglang_read(&pack, true, splits);
            assert_eq!((r["verified"].as_u64(), r["io_errors"].as_u64()), (Some(l.objects), Some(0)), "{splits} splits: {r}");
        }
        drop(f);
        m.unmount();
    }
}

#[test]
fn a_source_changed_under_an_o_direct_handle_gives_eio() {
    for case in ["rewritten", "truncated"] {
        let tmp = tempfile::tempdir().unwrap();
        let src = make_gguf(tmp.path(), "c.gguf", 2, 8, None).remove(0);
        let log = tmp.path().join("daemon.log");
        let m = Mount::new(&src, &[&format!("log_file={}", log.display())]);
        let l = layout(&m.path("c.pack.manifest.json"));
        let f = open_direct(&m.path("c.pack"));
        let mut buf = memmap2::MmapMut::map_anon(l.payload as usize).unwrap();
        let last = l.data_start + (l.objects - 1) * l.stride;
        read_exact_once(&f, &mut buf[..], last, "before the change");
        let size = std::fs::metadata(&src).unwrap().len();
        let w = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
        match case {
            "rewritten" => w.write_all_at(&[0xAB; 64], size - 4096).unwrap(),
            _ => w.set_len(size / 2).unwrap(),
        }
        drop(w);
        for off in [last, l.data_start] {
            match f.read_at(&mut buf[..], off) {
                Ok(n) => panic!("{case}: {n} bytes served from a changed source"),
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{case}: {e}"),
            }
        }
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("source changed while in use"), "{case}: no log line:\n{text}");
        drop(f);
        m.unmount();
    }
}

/// Reading the whole pack, with O_DIRECT or buffered (the mount's page cache then holds the
/// pack; also with `direct_io=off`), leaves (almost) none of the source in the page cache;
/// with `source_io=buffered`, or buffered with `direct_io=on` (the pack read through the
/// daemon from the source's page cache), all of it stays (so the measure can fail).
#[test]
fn whole_pack_reads_leave_the_source_out_of_the_page_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let src = make_gguf(tmp.path(), "p.gguf", 4, 32, None).remove(0);
    let size = std::fs::metadata(&src).unwrap().len();
    let cases = [
        ("", true, 10, 0),
        ("", false, 10, 0),
        ("direct_io=off", false, 10, 0),
        ("direct_io=on", true, 10, 0),
        ("direct_io=on", false, 100, 90),
        ("source_io=buffered", true, 100, 90),
        ("source_io=buffered", false, 100, 90),
    ];
    for (opts, direct, at_most, at_least) in cases {
        let m = Mount::new(&src, &[opts]);
        let pack = m.path("p.pack");
        let l = layout(&m.path("p.pack.manifest.json"));
        drop_cached(&src); // the mount's digest pass read it
        let r = sglang_read(&pack, direct, 1);
        assert_eq!(r["verified"].as_u64(), Some(l.objects));
        let pct = cached_bytes(&src) * 100 / size;
        eprintln!("[{opts}] O_DIRECT={direct}: {pct}% of the source cached");
        assert!(
            (at_least..=at_most).contains(&pct),
            "[{opts}] O_DIRECT={direct}: {pct}% of the source cached after reading the pack, want {at_least}..={at_most}%"
        );
        m.unmount();
    }
}
