#![no_main]
//! kt-kernel INT8 manifests, validated against a small tree (one layer, one NUMA part), and
//! the INT8 tree view built from what validated (the files read at both ends).
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let root = common::scratch().join("int8");
    let numa = root.join("_layer_0/_numa_0");
    if !numa.is_dir() {
        std::fs::create_dir_all(&numa).unwrap();
        std::fs::write(numa.join("INT8_gate_0_4096Byte_quant_.kt"), vec![0u8; 4096]).unwrap();
    }
    std::fs::write(root.join("kt-weight-manifest.json"), data).unwrap();
    let _ = xpackfs::view::kt_int8::validate::validate(&root, &Default::default(), Some(true));
    if let Ok(tree) = xpackfs::view::kt_int8::existing_tree::build(&root, true) {
        common::read_ends(&tree);
    }
});
