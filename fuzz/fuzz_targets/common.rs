// Shared by the fuzz targets: a per-process scratch directory on tmpfs when there is one.
use std::path::PathBuf;

pub fn scratch() -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let dir = base.join(format!("xpackfs-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Build every checkpoint view of the input at `path` through the registry, as a mount
/// would (digests remembered nowhere, memory cache only, one compute thread), and read the
/// first and last 4 KiB of every file, so that planners and the first chunk of every codec
/// path run on fuzzed headers. Errors are the expected outcome; a panic is a finding. One
/// context (and so one set of compute threads) serves every run, as in a daemon: threads
/// that ended between runs would be reported as leaks.
pub fn build_every_view(path: &std::path::Path, location: &std::path::Path) {
    use std::sync::OnceLock;
    use xpackfs::view::{self, Context, Input, Purpose, ViewOptions};
    static BASE: OnceLock<(ViewOptions, Context)> = OnceLock::new();
    let (base, ctx) = BASE.get_or_init(|| {
        let mut o = ViewOptions::default();
        o.digest_store = Some("none".into());
        o.cache_mb = 16;
        o.tiers.compute_threads = Some(1);
        // The requant view's manifests hold each shard's sha256, so reading one computes the
        // whole shard: with the default IQ2_XXS / Q2_K recipe that was 75% of an input's time
        // (about 2 s under coverage instrumentation), and build_safetensors replayed its seeds
        // and little else. Q8_0 keeps the view's planning, validation and manifests fuzzed at
        // a fraction of the cost; the IQ2_XXS and Q2_K quantisers are checked against ggml by
        // the randomized differential test and on hostile floats by tests/hostile.rs.
        o.requant.w1 = xpackfs::codec::QuantType::Q8_0;
        o.requant.w2 = xpackfs::codec::QuantType::Q8_0;
        o.requant.w3 = xpackfs::codec::QuantType::Q8_0;
        let ctx = Context::new(Purpose::Mount, location.to_path_buf(), "fuzz".into(), &o).expect("default options make a context");
        (o, ctx)
    });
    // Every view the registry lists except the INT8 tree (which reads trees, not checkpoints).
    for name in view::VIEWS.iter().map(|v| v.name()).filter(|n| *n != "int8-tree") {
        let Ok(input) = Input::open(path) else { return };
        let mut opts = base.clone();
        opts.view = name.into();
        if let Ok(built) = view::build(input, &opts, ctx) {
            read_ends(&built.tree);
        }
    }
}

/// Read the first and last 4 KiB of every file of a built view (errors are fine).
pub fn read_ends(tree: &xpackfs::view::Tree) {
    let mut buf = vec![0u8; 4096];
    for (_, f) in tree.files().into_iter().take(64) {
        let _ = f.read_at(0, &mut buf, xpackfs::store::ReadCtx::CLIENT);
        let _ = f.read_at(f.size().saturating_sub(4096), &mut buf, xpackfs::store::ReadCtx::CLIENT);
    }
}

const MARK: &[u8] = b"\xff\xfe\xfd\xfc";

fn split(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.windows(MARK.len()).position(|w| w == MARK) {
        Some(i) => (&data[..i], Some(&data[i + MARK.len()..])),
        None => (data, None),
    }
}

/// A safetensors checkpoint directory at `dir` (emptied first): the input is split at the
/// first two 0xff 0xfe 0xfd 0xfc markers into model.safetensors.index.json, config.json and
/// one shard (model-00001-of-00001.safetensors); missing parts are left out.
pub fn write_checkpoint_dir(dir: &std::path::Path, data: &[u8]) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let (index, rest) = split(data);
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
    if let Some(rest) = rest {
        let (config, shard) = split(rest);
        std::fs::write(dir.join("config.json"), config).unwrap();
        if let Some(shard) = shard {
            std::fs::write(dir.join("model-00001-of-00001.safetensors"), shard).unwrap();
        }
    }
}
