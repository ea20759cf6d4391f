#![no_main]
//! GGUF headers: parsing, validation, and the expert-pack planner that reads the tensor table.
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch().join("input.gguf");
    std::fs::write(&path, data).unwrap();
    if let Ok(src) = xpackfs::source::gguf::open(&path) {
        // The default options come from clap's parser: made once, not per input (it was a
        // sixth of this target's time).
        static OPTIONS: std::sync::OnceLock<xpackfs::view::expert_pack::Options> = std::sync::OnceLock::new();
        let _ = xpackfs::view::expert_pack::plan(&src, OPTIONS.get_or_init(Default::default));
        let _ = src.stem();
    }
});
