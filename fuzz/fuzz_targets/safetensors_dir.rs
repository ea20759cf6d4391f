#![no_main]
//! A safetensors checkpoint directory: the input is split at the first two 0xff 0xfe 0xfd 0xfc
//! markers into model.safetensors.index.json, config.json and one shard
//! (model-00001-of-00001.safetensors); missing parts are left out.
use libfuzzer_sys::fuzz_target;

mod common;

const MARK: &[u8] = b"\xff\xfe\xfd\xfc";

fn split(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.windows(MARK.len()).position(|w| w == MARK) {
        Some(i) => (&data[..i], Some(&data[i + MARK.len()..])),
        None => (data, None),
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch().join("stdir");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (index, rest) = split(data);
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
    if let Some(rest) = rest {
        let (config, shard) = split(rest);
        std::fs::write(dir.join("config.json"), config).unwrap();
        if let Some(shard) = shard {
            std::fs::write(dir.join("model-00001-of-00001.safetensors"), shard).unwrap();
        }
    }
    if let Ok(src) = xpackfs::source::Source::open(&dir) {
        for t in &src.tensors {
            assert!(t.offset + t.nbytes <= src.files[t.file].size());
        }
    }
});
