#![no_main]
//! A safetensors checkpoint directory: the input is split at the first two 0xff 0xfe 0xfd 0xfc
//! markers into model.safetensors.index.json, config.json and one shard
//! (model-00001-of-00001.safetensors); missing parts are left out.
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch().join("stdir");
    common::write_checkpoint_dir(&dir, data);
    if let Ok(src) = xpackfs::source::Source::open(&dir) {
        for t in &src.tensors {
            assert!(t.offset + t.nbytes <= src.files[t.file].size());
        }
    }
});
