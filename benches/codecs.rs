//! Codec throughput against the reference ggml, in one process, on the same rows, at
//! every SIMD level this CPU has, on one thread and on all cores.
//!
//!     XPACKFS_GGML_LIB=$(bash tools/build_ggml_ref.sh) flock /tmp/xpackfs-bench.lock cargo bench --bench codecs [-- NAME...]
//!
//! NAME... keeps the codecs whose names contain one of them; XPACKFS_BENCH_REPS sets the
//! repetitions, XPACKFS_BENCH_ROWS the rows of the quantiser tests (512; 32 fit in L2),
//! XPACKFS_BENCH_CLOCK=cpu times process CPU time instead of wall time.
//!
//! `XPACKFS_BENCH_ONLY=Q6_K` times only the quantisers whose label contains it (and no
//! decoders); it combines with NAME....
//!
//! Loads libggml-base.so (XPACKFS_GGML_LIB) with dlopen. Each repetition times every
//! variant once in turn (ggml 1 thread, each level 1 thread, ggml all cores, each level
//! all cores: ggml's row functions run under the same rayon split as xpackfs's), and the
//! table gives medians; ratios are against ggml with the same thread count (or, where ggml
//! has no such codec, against xpackfs's scalar level). Every output is checked identical to
//! ggml's (or the scalar level's) while at it.

use std::time::Instant;

use rayon::prelude::*;
use xpackfs::codec::simd::{self, Level};
use xpackfs::codec::{self, GgmlType, QuantType, fp8, kt_int8, mxfp4};

type QuantFn = unsafe extern "C" fn(*const f32, *mut u8, i64, i64, *const f32) -> usize;
type DequantFn = unsafe extern "C" fn(*const u8, *mut f32, i64);

fn rows(n: usize, k: usize) -> Vec<f32> {
    // Deterministic weight-like data: xorshift + a mix of two uniforms.
    let mut s = 0x2545F4914F6CDD1Du64;
    (0..n * k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            let v = ((s >> 16) & 0xFFFF) as f32 / 65536.0;
            (u - 0.5) * 0.04 + (v - 0.5) * 0.01
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Time every variant `reps` times, interleaved; medians in seconds.
fn interleaved(variants: &mut [Box<dyn FnMut() + '_>], reps: usize) -> Vec<f64> {
    let mut t = vec![Vec::new(); variants.len()];
    // XPACKFS_BENCH_CLOCK=cpu: the process's CPU time instead of wall time (steadier on a
    // shared machine; the all-core columns then add up the threads' time).
    let cpu = std::env::var("XPACKFS_BENCH_CLOCK").is_ok_and(|v| v == "cpu");
    let reps = std::env::var("XPACKFS_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(reps);
    for _ in 0..reps {
        for (i, f) in variants.iter_mut().enumerate() {
            let (t0, c0) = (Instant::now(), process_cpu_seconds());
            f();
            t[i].push(if cpu { process_cpu_seconds() - c0 } else { t0.elapsed().as_secs_f64() });
        }
    }
    t.into_iter().map(median).collect()
}

fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

struct Table {
    cores: usize,
}

impl Table {
    fn header(&self, what: &str, unit: &str, peer: &str) {
        println!("\n{what} ({unit}; ratio = xpackfs / {peer}, same thread count)");
        println!(
            "| {:<24} | {:<7} | {:>10} | {:>10} | {:>6} | {:>10} | {:>10} | {:>6} |",
            "codec",
            "level",
            format!("{peer} 1t"),
            "xpackfs 1t",
            "ratio",
            format!("{peer} {}t", self.cores),
            format!("xpackfs {}t", self.cores),
            "ratio"
        );
        println!("|{:-<26}|{:-<9}|{:->12}|{:->12}|{:->8}|{:->12}|{:->12}|{:->8}|", "", "", "", "", "", "", "", "");
    }
    /// `t`: [peer 1t, level... 1t, peer Nt, level... Nt] in seconds for `m` million units.
    fn rows(&self, name: &str, levels: &[Level], t: &[f64], m: f64) {
        let nl = levels.len();
        for (i, l) in levels.iter().enumerate() {
            let (p1, x1, pn, xn) = (t[0], t[1 + i], t[1 + nl], t[2 + nl + i]);
            println!(
                "| {:<24} | {:<7} | {:>10.1} | {:>10.1} | {:>6.2} | {:>10.1} | {:>10.1} | {:>6.2} |",
                name,
                l.name(),
                m / p1,
                m / x1,
                p1 / x1,
                m / pn,
                m / xn,
                pn / xn
            );
        }
    }
}

fn main() {
    let lib_path = std::env::var("XPACKFS_GGML_LIB").ok();
    // SAFETY: loading the reference ggml library, whose initialisers are plain C.
    let lib = lib_path.as_ref().map(|p| unsafe { libloading::Library::new(p).expect("load XPACKFS_GGML_LIB") });
    let Some(lib) = lib else {
        eprintln!("XPACKFS_GGML_LIB not set: build the reference with tools/build_ggml_ref.sh (nothing timed)");
        return;
    };
    // SAFETY: ggml_quantize_init(type) builds the IQ2 tables; called once, before any use.
    unsafe {
        let init: libloading::Symbol<unsafe extern "C" fn(i32)> = lib.get(b"ggml_quantize_init").unwrap();
        init(16);
    }
    // `cargo bench` passes --bench; under `cargo test --all-targets` this runs as a quick
    // smoke test (debug build, tiny sizes, one repetition) instead.
    let full = std::env::args().any(|a| a == "--bench");
    // `cargo bench --bench codecs -- IQ4 Q5_1`: only the codecs whose names contain one of these.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let (n, k) = if full { (512usize, 4096usize) } else { (64, 256) };
    let n = std::env::var("XPACKFS_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(n);
    let reps = if full { 5 } else { 1 };
    let xv = rows(n, k);
    let x: &[f32] = &xv;
    let unit = vec![1.0f32; k];
    let imat: Vec<f32> = (0..k).map(|i| 0.5 + ((i * 37) % 101) as f32 / 50.0).collect();
    let levels = simd::available();
    let table = Table { cores: rayon::current_num_threads() };
    let pool1v = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let pool1 = &pool1v;
    println!(
        "{n} rows x {k} values, median of {reps}; SIMD levels {:?}; process level {}",
        levels.iter().map(|l| l.name()).collect::<Vec<_>>(),
        simd::describe()
    );
    println!("(machine load during the run: {})", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());

    table.header("quantisers", "million weights/s", "ggml");
    // (label, type, the ggml symbol, importance)
    type Case<'a> = (&'a str, QuantType, &'a [u8], Option<&'a [f32]>);
    let cases: [Case; 26] = [
        ("Q8_0", QuantType::Q8_0, b"quantize_q8_0", None),
        ("Q2_K (reference path)", QuantType::Q2K, b"quantize_q2_K", None),
        ("Q2_K (unit importance)", QuantType::Q2K, b"quantize_q2_K", Some(&unit)),
        ("Q2_K (imatrix)", QuantType::Q2K, b"quantize_q2_K", Some(&imat)),
        ("IQ2_XXS (unit)", QuantType::Iq2Xxs, b"quantize_iq2_xxs", Some(&unit)),
        ("IQ2_XXS (imatrix)", QuantType::Iq2Xxs, b"quantize_iq2_xxs", Some(&imat)),
        ("Q3_K (reference path)", QuantType::Q3K, b"quantize_q3_K", None),
        ("Q3_K (imatrix)", QuantType::Q3K, b"quantize_q3_K", Some(&imat)),
        ("Q4_K (reference path)", QuantType::Q4K, b"quantize_q4_K", None),
        ("Q4_K (imatrix)", QuantType::Q4K, b"quantize_q4_K", Some(&imat)),
        ("Q5_K (reference path)", QuantType::Q5K, b"quantize_q5_K", None),
        ("Q5_K (imatrix)", QuantType::Q5K, b"quantize_q5_K", Some(&imat)),
        ("Q6_K (reference path)", QuantType::Q6K, b"quantize_q6_K", None),
        ("Q6_K (imatrix)", QuantType::Q6K, b"quantize_q6_K", Some(&imat)),
        ("Q4_0 (reference path)", QuantType::Q4_0, b"quantize_q4_0", None),
        ("Q4_0 (imatrix)", QuantType::Q4_0, b"quantize_q4_0", Some(&imat)),
        ("Q4_1 (reference path)", QuantType::Q4_1, b"quantize_q4_1", None),
        ("Q4_1 (imatrix)", QuantType::Q4_1, b"quantize_q4_1", Some(&imat)),
        ("Q5_0 (reference path)", QuantType::Q5_0, b"quantize_q5_0", None),
        ("Q5_0 (imatrix)", QuantType::Q5_0, b"quantize_q5_0", Some(&imat)),
        ("Q5_1 (reference path)", QuantType::Q5_1, b"quantize_q5_1", None),
        ("Q5_1 (imatrix)", QuantType::Q5_1, b"quantize_q5_1", Some(&imat)),
        ("IQ4_NL (no importance)", QuantType::Iq4Nl, b"quantize_iq4_nl", None),
        ("IQ4_NL (imatrix)", QuantType::Iq4Nl, b"quantize_iq4_nl", Some(&imat)),
        ("IQ4_XS (no importance)", QuantType::Iq4Xs, b"quantize_iq4_xs", None),
        ("IQ4_XS (imatrix)", QuantType::Iq4Xs, b"quantize_iq4_xs", Some(&imat)),
    ];
    // XPACKFS_BENCH_ONLY=Q4_K: only the quantisers whose label contains it (and no decoders).
    let only = std::env::var("XPACKFS_BENCH_ONLY").ok();
    for (name, ty, sym, imp) in cases {
        if !wanted(name) || only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let g = ty.ggml();
        let row_bytes = k / g.block_size as usize * g.type_size as usize;
        // SAFETY: the symbol has this C signature in ggml-quants.h.
        let f: QuantFn = unsafe { *lib.get::<QuantFn>(sym).unwrap() };
        let ip = imp.map_or(0usize, |v| v.as_ptr() as usize);
        let ggml = move |src: &[f32], dst: &mut [u8]| {
            // SAFETY: src holds dst.len() / row_bytes rows of k values; ip is null or k values.
            unsafe { f(src.as_ptr(), dst.as_mut_ptr(), (dst.len() / row_bytes) as i64, k as i64, ip as *const f32) };
        };
        let mut outs: Vec<Vec<u8>> = (0..2 + 2 * levels.len()).map(|_| vec![0u8; n * row_bytes]).collect();
        {
            let mut it = outs.iter_mut();
            let mut v: Vec<Box<dyn FnMut() + '_>> = Vec::new();
            let o = it.next().unwrap();
            v.push(Box::new(|| ggml(x, o)));
            for &l in &levels {
                let o = it.next().unwrap();
                // On this thread, as ggml's 1-thread column runs: `quantize_rows_at` is
                // single-threaded, and a hop into a one-thread pool would time a thread's
                // wake-up (tens of microseconds here) along with the codec.
                v.push(Box::new(move || codec::quantize_rows_at(l, ty, x, k, imp, o).unwrap()));
            }
            let o = it.next().unwrap();
            v.push(Box::new(|| x.par_chunks(16 * k).zip(o.par_chunks_mut(16 * row_bytes)).for_each(|(s, d)| ggml(s, d))));
            for &l in &levels {
                let o = it.next().unwrap();
                v.push(Box::new(move || codec::quantize_rows_par_at(l, ty, x, k, imp, o).unwrap()));
            }
            let t = interleaved(&mut v, reps);
            drop(v);
            table.rows(name, &levels, &t, (n * k) as f64 / 1e6);
        }
        for o in &outs[1..] {
            assert!(*o == outs[0], "{name}: output differs from the reference");
        }
    }

    if only.is_some() {
        return;
    }
    // Decoders on 64 rows (1 MiB of f32 out, cache-resident: the codec's speed, not the
    // memory system's), many more repetitions since each run is short.
    let (n, reps) = if full { (64, 41) } else { (n, reps) };
    let x = &x[..n * k];
    table.header(&format!("decoders, {n} rows x {k}, median of {reps}"), "million values/s", "ggml");
    for name in ["Q8_0", "Q2_K", "Q4_K", "Q6_K", "IQ2_XXS", "MXFP4", "F16", "BF16"] {
        if !wanted(name) {
            continue;
        }
        let ty = GgmlType::from_name(name).unwrap();
        let (bs, ts) = (ty.block_size as usize, ty.type_size as usize);
        let src: Vec<u8> = match name {
            "F16" => x.iter().flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes()).collect(),
            "BF16" => x.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect(),
            "MXFP4" => (0..n * k / 32 * 17).map(|i| if i % 17 == 0 { 120 + (i % 9) as u8 } else { (i * 73 % 256) as u8 }).collect(),
            _ => {
                let sym = format!("quantize_{}", name.to_lowercase().replace("_k", "_K"));
                // SAFETY: as above.
                let f: QuantFn = unsafe { *lib.get::<QuantFn>(sym.as_bytes()).unwrap() };
                let mut b = vec![0u8; n * k / bs * ts];
                // SAFETY: n rows of k values into n * k / bs blocks; unit importance.
                unsafe { f(x.as_ptr(), b.as_mut_ptr(), n as i64, k as i64, unit.as_ptr()) };
                b
            }
        };
        let sym = match name {
            "F16" => "ggml_fp16_to_fp32_row".to_string(),
            "BF16" => "ggml_bf16_to_fp32_row".to_string(),
            _ => format!("dequantize_row_{}", name.to_lowercase().replace("_k", "_K")),
        };
        // SAFETY: dequantize_row_* / ggml_*_to_fp32_row(src, dst, count) in ggml.h.
        let f: DequantFn = unsafe { *lib.get::<DequantFn>(sym.as_bytes()).unwrap() };
        let ggml = move |s: &[u8], d: &mut [f32]| {
            // SAFETY: s holds whole blocks decoding to d.len() values.
            unsafe { f(s.as_ptr(), d.as_mut_ptr(), d.len() as i64) }
        };
        let chunk = 1 << 16;
        let mut outs: Vec<Vec<f32>> = (0..2 + 2 * levels.len()).map(|_| vec![0f32; n * k]).collect();
        {
            let mut it = outs.iter_mut();
            let mut v: Vec<Box<dyn FnMut() + '_>> = Vec::new();
            let o = it.next().unwrap();
            let s = &src;
            v.push(Box::new(move || ggml(s, o)));
            for &l in &levels {
                let o = it.next().unwrap();
                v.push(Box::new(move || codec::dequantize_at(l, ty, s, o).unwrap()));
            }
            let o = it.next().unwrap();
            v.push(Box::new(move || s.par_chunks(chunk / bs * ts).zip(o.par_chunks_mut(chunk)).for_each(|(s, d)| ggml(s, d))));
            for &l in &levels {
                let o = it.next().unwrap();
                v.push(Box::new(move || {
                    s.par_chunks(chunk / bs * ts).zip(o.par_chunks_mut(chunk)).for_each(|(s, d)| codec::dequantize_at(l, ty, s, d).unwrap())
                }));
            }
            let t = interleaved(&mut v, reps);
            drop(v);
            table.rows(name, &levels, &t, (n * k) as f64 / 1e6);
        }
        for o in &outs[1..] {
            assert!(o.iter().map(|v| v.to_bits()).eq(outs[0].iter().map(|v| v.to_bits())), "{name}: decoded values differ from the reference");
        }
    }

    // No ggml peer: ratios against xpackfs's own scalar level (the "scalar" rows read 1.00).
    table.header(&format!("xpackfs-only codecs, {n} rows x {k}, median of {reps}"), "million values/s", "scalar");
    let packed: Vec<u8> = (0..n * k / 2).map(|i| (i * 29 % 256) as u8).collect();
    let scales: Vec<u8> = (0..n * k / 32).map(|i| 118 + (i % 11) as u8).collect();
    let fp8w: Vec<u8> = (0..n * k).map(|i| ((i * 13) % 126) as u8).collect();
    let geo = fp8::Fp8Blocks { rows: n, cols: k, block_rows: 128, block_cols: 128 };
    let s8 = vec![120u8; n.div_ceil(128) * k.div_ceil(128)];
    let (kn, kk) = (n / 64 * 64, k);
    type Job<'a> = Box<dyn Fn(Level, bool) + Sync + 'a>;
    let jobs: Vec<(&str, Job)> = vec![
        (
            "MXFP4 (DeepSeek) -> f32",
            Box::new(|l: Level, par: bool| {
                let mut o = vec![0f32; n * k];
                if par {
                    o.par_chunks_mut(16 * k)
                        .zip(packed.par_chunks(8 * k))
                        .zip(scales.par_chunks(k / 2))
                        .for_each(|((d, p), s)| mxfp4::dequantize_deepseek_at(l, p, s, k, d).unwrap());
                } else {
                    mxfp4::dequantize_deepseek_at(l, &packed, &scales, k, &mut o).unwrap();
                }
                std::hint::black_box(o);
            }),
        ),
        (
            "FP8 E4M3 -> BF16",
            Box::new(|l: Level, par: bool| {
                let mut o = vec![0u16; n * k];
                if par {
                    fp8w.par_chunks(16 * k).zip(o.par_chunks_mut(16 * k)).enumerate().for_each(|(c, (w, d))| geo.to_bf16_at(l, w, 16 * c, &s8, d).unwrap());
                } else {
                    geo.to_bf16_at(l, &fp8w, 0, &s8, &mut o).unwrap();
                }
                std::hint::black_box(o);
            }),
        ),
        (
            "kt INT8 quantise + pack",
            Box::new(|l: Level, par: bool| {
                let w = &x[..kn * kk];
                let mut packed = vec![0u8; kn * kk];
                let mut d = vec![0f32; kn];
                if par {
                    packed.par_chunks_mut(64 * kk).zip(d.par_chunks_mut(64)).zip(w.par_chunks(64 * kk)).for_each(|((p, d), w)| {
                        let mut q = vec![0i8; 64 * kk];
                        kt_int8::quantize_at(l, w, 64, kk, &mut q, d).unwrap();
                        kt_int8::pack(&q, 64, kk, p).unwrap();
                    });
                } else {
                    let mut q = vec![0i8; kn * kk];
                    kt_int8::quantize_at(l, w, kn, kk, &mut q, &mut d).unwrap();
                    kt_int8::pack(&q, kn, kk, &mut packed).unwrap();
                }
                std::hint::black_box((packed, d));
            }),
        ),
    ];
    for (name, job) in &jobs {
        if !wanted(name) {
            continue;
        }
        let mut v: Vec<Box<dyn FnMut() + '_>> = Vec::new();
        v.push(Box::new(|| pool1.install(|| job(Level::Scalar, false))));
        for &l in &levels {
            v.push(Box::new(move || pool1.install(|| job(l, false))));
        }
        v.push(Box::new(|| job(Level::Scalar, true)));
        for &l in &levels {
            v.push(Box::new(move || job(l, true)));
        }
        let t = interleaved(&mut v, reps);
        table.rows(name, &levels, &t, (n * k) as f64 / 1e6);
    }
    // (Bit-exactness of these three at every level is tests/codec_simd.rs's job.)
}
