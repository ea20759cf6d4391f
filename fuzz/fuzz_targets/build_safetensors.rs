#![no_main]
//! Every view built from a fuzzed safetensors checkpoint directory (the input split as in the
//! `safetensors_dir` target: index, config.json, one shard): the builders' validation and
//! planning against the config and the tensors, and the first chunk of each file read.
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch().join("build-st");
    common::write_checkpoint_dir(&dir, data);
    common::build_every_view(&dir, &common::scratch().join("mnt"));
});
