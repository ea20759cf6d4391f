#![no_main]
//! llama.cpp importance matrices (GGUF and legacy imatrix.dat).
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch().join("imatrix.dat");
    std::fs::write(&path, data).unwrap();
    if let Ok(m) = xpackfs::view::imatrix::Imatrix::open(&path) {
        for name in ["blk.0.ffn_gate_exps.weight", "layers.0.ffn.experts.1.w2.weight"] {
            let _ = m.row(name, 256);
            let _ = m.row(name, 32);
        }
    }
});
