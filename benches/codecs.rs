//! Codec throughput against the reference ggml, in one process, same rows, one thread.
//!
//!     XPACKFS_GGML_LIB=$(bash tools/build_ggml_ref.sh) cargo bench --bench codecs
//!
//! Loads libggml-base.so (XPACKFS_GGML_LIB) with dlopen and times, best of several runs,
//! each quantiser (xpackfs vs ggml's quantize_<type>, 1 thread) and xpackfs's rayon
//! driver on all cores; checks the outputs are identical while at it. Prints a table.

use std::time::Instant;

use xpackfs::codec::{self, QuantType};

type QuantFn = unsafe extern "C" fn(*const f32, *mut u8, i64, i64, *const f32) -> usize;

fn rows(n: usize, k: usize) -> Vec<f32> {
    // Deterministic weight-like data: xorshift + Box-Muller-ish mix.
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

fn best<F: FnMut()>(mut f: F, reps: usize) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let lib_path = std::env::var("XPACKFS_GGML_LIB").ok();
    let lib = lib_path.as_ref().map(|p| unsafe { libloading::Library::new(p).expect("load XPACKFS_GGML_LIB") });
    if lib.is_none() {
        eprintln!("XPACKFS_GGML_LIB not set: timing xpackfs only (build the reference with tools/build_ggml_ref.sh)");
    }
    if let Some(l) = &lib {
        let init: libloading::Symbol<unsafe extern "C" fn(i32)> = unsafe { l.get(b"ggml_quantize_init").unwrap() };
        unsafe { init(16) };
    }
    // `cargo bench` passes --bench; under `cargo test --all-targets` this runs as a quick
    // smoke test (debug build, tiny sizes) instead.
    let full = std::env::args().any(|a| a == "--bench");
    let (n, k) = if full { (512usize, 4096usize) } else { (4, 256) };
    let reps = if full { 5 } else { 1 };
    let x = rows(n, k);
    let unit = vec![1.0f32; k];
    let imat: Vec<f32> = (0..k).map(|i| 0.5 + ((i * 37) % 101) as f32 / 50.0).collect();
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("quantisers: {n} rows x {k} values, best of 5; Mw/s = million weights per second");
    println!("{:<22} {:>10} {:>12} {:>8} {:>16}", "quantiser", "ggml 1t", "xpackfs 1t", "ratio", format!("xpackfs {cores}t"));
    let cases: [(&str, QuantType, &[u8], Option<&[f32]>); 5] = [
        ("Q8_0", QuantType::Q8_0, b"quantize_q8_0", None),
        ("Q2_K (no importance)", QuantType::Q2K, b"quantize_q2_K", None),
        ("Q2_K (unit importance)", QuantType::Q2K, b"quantize_q2_K", Some(&unit)),
        ("Q2_K (imatrix)", QuantType::Q2K, b"quantize_q2_K", Some(&imat)),
        ("IQ2_XXS (unit)", QuantType::Iq2Xxs, b"quantize_iq2_xxs", Some(&unit)),
    ];
    for (name, ty, sym, imp) in cases {
        let g = ty.ggml();
        let out_len = n * (k / g.block_size as usize) * g.type_size as usize;
        let mut ours = vec![0u8; out_len];
        let mw = (n * k) as f64 / 1e6;
        let t_ours = best(|| pool1.install(|| codec::quantize_rows(ty, &x, k, imp, &mut ours).unwrap()), reps);
        let mut par = vec![0u8; out_len];
        let t_par = best(|| codec::quantize_rows_par(ty, &x, k, imp, &mut par).unwrap(), reps);
        assert_eq!(ours, par);
        let ref_col = match &lib {
            Some(l) => {
                let f: libloading::Symbol<QuantFn> = unsafe { l.get(sym).unwrap() };
                let mut theirs = vec![0u8; out_len];
                let ip = imp.map_or(std::ptr::null(), |v| v.as_ptr());
                let t = best(|| unsafe { f(x.as_ptr(), theirs.as_mut_ptr(), n as i64, k as i64, ip); }, reps);
                assert!(theirs == ours, "{name}: output differs from the reference");
                Some(t)
            }
            None => None,
        };
        match ref_col {
            Some(t) => println!("{name:<22} {:>10.1} {:>12.1} {:>8.2} {:>16.1}", mw / t, mw / t_ours, t / t_ours, mw / t_par),
            None => println!("{name:<22} {:>10} {:>12.1} {:>8} {:>16.1}", "-", mw / t_ours, "-", mw / t_par),
        }
    }

    // Decoders, 1 thread (the numpy peers are timed by tools/ggml_ref.py bench).
    println!("\ndecoders: 1 thread, million values per second");
    let blocks = |ty: QuantType| {
        let g = ty.ggml();
        let mut b = vec![0u8; n * (k / g.block_size as usize) * g.type_size as usize];
        codec::quantize_rows(ty, &x, k, Some(&unit), &mut b).unwrap();
        (g, b)
    };
    let mut out = vec![0f32; n * k];
    for ty in [QuantType::Q8_0, QuantType::Q2K, QuantType::Iq2Xxs] {
        let (g, b) = blocks(ty);
        let t = best(|| codec::dequantize(g, &b, &mut out).unwrap(), reps);
        println!("{:<22} {:>10.0}", g.name, (n * k) as f64 / 1e6 / t);
    }
    let mx: Vec<u8> = (0..n * k / 32 * 17).map(|i| if i % 17 == 0 { 120 + (i % 9) as u8 } else { (i * 73) as u8 }).collect();
    let t = best(|| codec::dequantize(xpackfs::codec::GgmlType::from_name("MXFP4").unwrap(), &mx, &mut out).unwrap(), reps);
    println!("{:<22} {:>10.0}", "MXFP4 (ggml blocks)", (n * k) as f64 / 1e6 / t);
    let packed: Vec<u8> = (0..n * k / 2).map(|i| (i * 29) as u8).collect();
    let scales: Vec<u8> = (0..n * k / 32).map(|i| 118 + (i % 11) as u8).collect();
    let t = best(|| codec::mxfp4::dequantize_deepseek(&packed, &scales, k, &mut out).unwrap(), reps);
    println!("{:<22} {:>10.0}", "MXFP4 (DeepSeek)", (n * k) as f64 / 1e6 / t);
    let fp8: Vec<u8> = (0..n * k).map(|i| ((i * 13) % 126) as u8).collect();
    let geo = codec::fp8::Fp8Blocks { rows: n, cols: k, block_rows: 128, block_cols: 128 };
    let s8 = vec![120u8; n.div_ceil(128) * k.div_ceil(128)];
    let mut bf = vec![0u16; n * k];
    let t = best(|| geo.to_bf16(&fp8, 0, &s8, &mut bf).unwrap(), reps);
    println!("{:<22} {:>10.0}", "FP8 E4M3 -> BF16", (n * k) as f64 / 1e6 / t);
}
