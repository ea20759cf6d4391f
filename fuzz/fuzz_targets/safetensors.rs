#![no_main]
//! safetensors shard headers, read as a single-file checkpoint.
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch().join("st");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), data).unwrap();
    if let Ok(src) = xpackfs::source::Source::open(&dir) {
        for t in &src.tensors {
            assert!(t.offset + t.nbytes <= src.files[t.file].size());
        }
    }
});
