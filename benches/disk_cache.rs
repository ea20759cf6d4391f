//! The disk cache tier against its peers, in one process, A and B alternated:
//!
//!     cargo bench --no-run && flock /tmp/xpackfs-bench.lock cargo bench --bench disk_cache
//!
//! 1. Hit reads: `DiskCache::get` of N entries vs reading the same bytes from plain files
//!    in the same directory, page cache hot and dropped (`posix_fadvise(DONTNEED)` on both
//!    sets of files before each cold round). Target >= 0.8x.
//! 2. Miss path: reading chunks computed by the real IQ2_XXS quantiser through `Tiers`
//!    with the disk cache (disk miss + compute + write-behind) vs without it (compute
//!    only), fresh chunks each round. Target <= 10% overhead.
//! 3. Eviction: puts into a cache over its budget (evicting as they go) vs puts into one
//!    with room, for chunk-sized (1 MiB) and tiny (4 KiB, the worst case: all metadata)
//!    entries, and the time of one eviction pass over many entries.
//!
//! `XPACKFS_BENCH_DIR` picks the directory (default: the system temporary directory).
//! Without `--bench` (under `cargo test --all-targets`) it runs once on tiny sizes.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use xpackfs::codec::{self, QuantType};
use xpackfs::store::compute::{ComputePool, PoolConfig};
use xpackfs::store::disk::{DiskCacheConfig, HEADER_BYTES};
use xpackfs::store::{ChunkCache, DiskCache, DiskKey, KeyBuilder, ReadCtx};
use xpackfs::view::{Group, Tiers};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn drop_pages(path: &Path) {
    let f = File::open(path).unwrap();
    // SAFETY: a valid open descriptor; the call only drops clean cached pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn data(i: u64, len: usize) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ i;
    (0..len / 8)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s.to_le_bytes()
        })
        .collect()
}

fn entry_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(dir.join("entries")).unwrap().flatten() {
        out.extend(std::fs::read_dir(shard.path()).unwrap().flatten().map(|e| e.path()));
    }
    out
}

fn hit_reads(root: &Path, n: u64, len: usize, rounds: usize) {
    let dir = root.join("hits");
    let plain = root.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let cache = DiskCache::open(DiskCacheConfig::new(&dir, 1 << 40));
    let keys: Vec<DiskKey> = (0..n).map(|i| KeyBuilder::new("bench").u64("i", i).finish()).collect();
    for (i, k) in keys.iter().enumerate() {
        let d = data(i as u64, len);
        assert!(cache.put(k, &d));
        std::fs::write(plain.join(i.to_string()), &d).unwrap();
    }
    // Written back, so that DONTNEED can drop the pages.
    let files: Vec<PathBuf> = entry_files(&dir).into_iter().chain((0..n).map(|i| plain.join(i.to_string()))).collect();
    for f in &files {
        File::open(f).unwrap().sync_all().unwrap();
    }
    let read_cache = || {
        let t = Instant::now();
        for k in &keys {
            std::hint::black_box(cache.get(k).expect("hit"));
        }
        t.elapsed().as_secs_f64()
    };
    let read_plain = || {
        let t = Instant::now();
        for i in 0..n {
            let f = File::open(plain.join(i.to_string())).unwrap();
            // The same allocation as the cache's (zeroed pages, faulted in by the read).
            // SAFETY: zeroed memory is a valid `[u8]`.
            let mut buf: Arc<[u8]> = unsafe { Arc::<[u8]>::new_zeroed_slice(len).assume_init() };
            f.read_exact_at(Arc::get_mut(&mut buf).unwrap(), 0).unwrap();
            std::hint::black_box(buf);
        }
        t.elapsed().as_secs_f64()
    };
    let gb = (n as usize * len) as f64 / 1e9;
    for cold in [false, true] {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            for which in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
                if cold {
                    files.iter().for_each(|f| drop_pages(f));
                }
                if which == 0 { a.push(gb / read_cache()) } else { b.push(gb / read_plain()) }
            }
        }
        let (a, b) = (median(a), median(b));
        println!(
            "hit reads, page cache {}: {n} x {} KiB: disk cache {a:.2} GB/s, plain file {b:.2} GB/s, ratio {:.2}x (target >= 0.8x)",
            if cold { "dropped" } else { "hot" },
            len >> 10,
            a / b
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&plain).unwrap();
}

fn miss_path(root: &Path, chunks: u64, rows: usize, k: usize, rounds: usize) {
    let x: Vec<f32> =
        data(7, rows * k * 4).chunks_exact(4).map(|b| (u32::from_le_bytes(b.try_into().unwrap()) >> 8) as f32 / (1u32 << 24) as f32 - 0.5).collect();
    let x = Arc::new(x);
    let unit = Arc::new(vec![1.0f32; k]);
    let g = QuantType::Iq2Xxs.ggml();
    let out_len = rows * k / g.block_size as usize * g.type_size as usize;
    let pool = Arc::new(ComputePool::new(&PoolConfig::default()).unwrap());
    let dir = root.join("miss");
    let mut round_no = 0u64;
    let mut run = |with_disk: bool| -> f64 {
        round_no += 1;
        let disk = with_disk.then(|| Arc::new(DiskCache::open(DiskCacheConfig::new(&dir, 1 << 40))));
        let tiers = Tiers::new(Arc::new(ChunkCache::new(1 << 30)), disk, pool.clone());
        let t = Instant::now();
        for c in 0..chunks {
            let (x, unit) = (x.clone(), unit.clone());
            let key = KeyBuilder::new("bench-miss").u64("round", round_no).producer().chunk(c);
            let group = Arc::new(Group::single((round_no, c), key, move || {
                let mut out = vec![0u8; out_len];
                codec::quantize_rows_par(QuantType::Iq2Xxs, &x, k, Some(&unit), &mut out).map_err(|e| xpackfs::view::ViewError::Internal(e.to_string()))?;
                Ok(out)
            }));
            std::hint::black_box(tiers.get(&group, 0, ReadCtx::CLIENT).unwrap());
        }
        // Until the last write-behind is done.
        while tiers.pool.in_flight() > 0 {
            std::thread::yield_now();
        }
        t.elapsed().as_secs_f64()
    };
    run(false); // warm-up (IQ2_XXS tables, page faults)
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        for which in if r % 2 == 0 { [false, true] } else { [true, false] } {
            let s = run(which);
            if which { on.push(s) } else { off.push(s) }
        }
    }
    let (off, on) = (median(off), median(on));
    println!(
        "miss path: {chunks} chunks of {} KiB (IQ2_XXS of {rows} x {k}): compute only {:.1} ms/chunk, with disk cache {:.1} ms/chunk, overhead {:+.1}% (target <= 10%)",
        out_len >> 10,
        off * 1e3 / chunks as f64,
        on * 1e3 / chunks as f64,
        (on / off - 1.0) * 100.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn eviction(root: &Path, n: u64, len: usize, rounds: usize) {
    let payload = data(3, len);
    let entry = HEADER_BYTES + len as u64;
    let mut round_no = 0u64;
    let mut puts = |budget: u64| -> (f64, u64) {
        round_no += 1;
        let dir = root.join(format!("evict-{round_no}"));
        let c = DiskCache::open(DiskCacheConfig::new(&dir, budget));
        let t = Instant::now();
        for i in 0..n {
            c.put(&KeyBuilder::new("bench-evict").u64("i", i).finish(), &payload);
        }
        let s = t.elapsed().as_secs_f64();
        let ev = c.snapshot().evictions;
        std::fs::remove_dir_all(&dir).unwrap();
        (s, ev)
    };
    let (mut room, mut full, mut evicted) = (Vec::new(), Vec::new(), 0);
    for r in 0..rounds {
        for which in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
            if which == 0 {
                room.push(puts(1 << 40).0);
            } else {
                let (s, ev) = puts(n * entry / 4);
                full.push(s);
                evicted = ev;
            }
        }
    }
    let (room, full) = (median(room), median(full));
    println!(
        "eviction: {n} puts of {} KiB: with room {:.1} us/put, over budget (1/4 of the data, {evicted} evictions) {:.1} us/put, ratio {:.2}x",
        len >> 10,
        room * 1e6 / n as f64,
        full * 1e6 / n as f64,
        full / room
    );
    // One pass over a large directory: recount + evict 10% (low water).
    let dir = root.join("evict-pass");
    let c = DiskCache::open(DiskCacheConfig::new(&dir, 1 << 40));
    for i in 0..n {
        c.put(&KeyBuilder::new("bench-pass").u64("i", i).finish(), &payload);
    }
    drop(c);
    let c = DiskCache::open(DiskCacheConfig::new(&dir, n * entry - 1));
    let t = Instant::now();
    let report = c.evict(false);
    let s = t.elapsed().as_secs_f64();
    println!(
        "eviction pass: scanned {} entries, evicted {} in {:.1} ms ({:.2} us per entry scanned); readers take no lock meanwhile",
        report.scanned,
        report.evicted,
        s * 1e3,
        s * 1e6 / report.scanned.max(1) as f64
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let base = std::env::var_os("XPACKFS_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let root = tempfile::tempdir_in(base).unwrap();
    println!("disk cache benchmarks in {} ({} cores)", root.path().display(), std::thread::available_parallelism().map_or(1, |n| n.get()));
    if full {
        hit_reads(root.path(), 256, 2 << 20, 7);
        miss_path(root.path(), 8, 512, 4096, 5);
        eviction(root.path(), 400, 1 << 20, 3);
        eviction(root.path(), 20_000, 4 << 10, 3);
    } else {
        hit_reads(root.path(), 4, 64 << 10, 1);
        miss_path(root.path(), 2, 16, 256, 1);
        eviction(root.path(), 50, 1 << 10, 1);
    }
}
