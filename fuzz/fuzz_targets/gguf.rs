#![no_main]
//! GGUF headers: parsing, validation, and the expert-pack planner that reads the tensor table.
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch().join("input.gguf");
    std::fs::write(&path, data).unwrap();
    if let Ok(src) = xpackfs::source::gguf::open(&path) {
        let _ = xpackfs::view::expert_pack::plan(&src, &Default::default());
        let _ = src.stem();
    }
});
