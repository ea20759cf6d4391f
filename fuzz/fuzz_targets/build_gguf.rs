#![no_main]
//! Every view built from a fuzzed GGUF file (expert-pack, kimi-pack, bf16-cache, requant,
//! kt-int8): the builders' validation and planning on headers the parsers accepted, and the
//! first chunk of each file read.
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch();
    let path = dir.join("model.gguf");
    std::fs::write(&path, data).unwrap();
    common::build_every_view(&path, &dir.join("mnt"));
});
