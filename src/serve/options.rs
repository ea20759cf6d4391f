//! Mount options. Every option can be given as a flag (`--top-k 6`) or in `-o` form
//! (`-o top_k=6`, as fstab and `mount -t fuse.xpackfs` pass them); both end up in
//! [`MountOptions::set`]. Generic mount options that mean nothing to a read-only
//! virtual filesystem (rw, dev, suid, noatime, _netdev, x-systemd.*, ...) are accepted
//! and ignored so that fstab lines work.

use std::path::PathBuf;

use crate::view::expert_pack::PackOptions;

/// (key, takes a value, help). The single list from which `-o` parsing and the help text come.
pub const OPTIONS: &[(&str, bool, &str)] = &[
    ("view", true, "view to serve: auto (default: expert-pack for GGUF, bf16-cache for safetensors), expert-pack, bf16-cache, requant, kt-int8"),
    ("imatrix", true, "requant: llama.cpp importance matrix (GGUF or legacy imatrix.dat) instead of unit importance"),
    ("w1", true, "requant: ggml type for gate (w1) experts: IQ2_XXS (default), Q2_K, Q8_0"),
    ("w2", true, "requant: ggml type for down (w2) experts: Q2_K (default), IQ2_XXS, Q8_0"),
    ("w3", true, "requant: ggml type for up (w3) experts: IQ2_XXS (default), Q2_K, Q8_0"),
    ("numa_count", true, "kt-int8: NUMA parts (kt-kernel threadpool count), default 1"),
    ("verify_hashes", false, "INT8 tree mounts: hash every file while validating the tree before mounting"),
    ("passthrough", true, "auto|off: files that are whole source files (INT8 tree mounts) are read by the kernel straight from the source with FUSE passthrough (kernel 6.9+, root); auto (default) falls back to reads through the daemon where unavailable"),
    ("stats", true, "on|off: /.xpackfs/stats.json (default on; off for kt-int8 views and INT8 trees, whose root must hold nothing else)"),
    ("cache_mb", true, "byte budget of the computed-chunk cache in MiB (default 1024)"),
    ("name", true, "file name stem of the pack (default: the source's stem)"),
    ("model_ref", true, "model reference recorded in the manifest (default deepseek-v4-flash)"),
    ("model_identity_sha256", true, "model identity digest, 64 hex (default: sha256 of the GGUF header)"),
    ("config_sha256", true, "config digest, 64 hex (default: sha256 of config_blob, else of the GGUF header)"),
    ("config_blob", true, "config file whose sha256 is the config digest"),
    ("num_layers", true, "expected layer count (checked against the source)"),
    ("num_experts", true, "expected routed-expert count (checked against the source)"),
    ("top_k", true, "experts per token recorded in the header (default: GGUF expert_used_count, else 6)"),
    ("alignment", true, "pack alignment, a power of two (default 4096)"),
    ("source_sha256", true, "expected sha256 of the source; the mount fails if it differs"),
    ("digest_store", true, "directory of remembered digests, or 'none' (default /var/lib/xpackfs/digests for root)"),
    ("threads", true, "FUSE worker threads (default: the CPU count, at least 2, at most 8)"),
    ("clone_fd", true, "on|off: one /dev/fuse descriptor per worker thread (default on)"),
    ("direct_io", true, "auto|on|off: reads bypass the kernel's page cache of the mount (FOPEN_DIRECT_IO; mmap keeps working with FUSE_DIRECT_IO_ALLOW_MMAP, kernel 6.6+). auto (default): for files made of source bytes only (the expert pack), whose source is page-cached already: 2-3x faster cold reads and no second copy in memory; computed files keep the page cache"),
    ("source_io", true, "auto|direct|buffered: how reads of a handle read the source. auto (default): as the client opened the file, so a client reading with O_DIRECT (SGLang's loader) makes the daemon read the source with O_DIRECT too and leaves nothing in the page cache; direct/buffered: every handle"),
    ("direct_threads", true, "threads that serve the reads of direct (O_DIRECT) handles, so that many reach the device at once while page-cache reads stay on the FUSE workers (default 32; 0: on the FUSE workers)"),
    ("direct_piece_kb", true, "reads of direct handles larger than this many KiB are read as parallel pieces of it (default 0: whole; measured no gain with the direct-read pool, see tools/bench_serve.py)"),
    ("async_dio", true, "on|off: FUSE_ASYNC_DIO, the kernel sends the requests of one large O_DIRECT read at once (default on)"),
    ("max_background", true, "pending background (readahead) requests the kernel may queue (default: fuser's, 16)"),
    ("max_read", true, "largest read request in bytes, up to 1 MiB (default 1 MiB)"),
    ("read_ahead_kb", true, "kernel readahead of the mount in KiB (default: kernel's)"),
    ("allow_other", false, "let other users access the mount"),
    ("allow_root", false, "let root access the mount"),
    ("auto_unmount", false, "unmount when the daemon dies (needs fusermount3)"),
    ("mountpoint_path", true, "path the manifest names for the mount (when the mountpoint is /dev/fd/N)"),
    ("log_file", true, "append logs here when running in the background"),
    ("debug", false, "debug logging"),
    ("foreground", false, "stay in the foreground (same as -f)"),
];

/// Generic options accepted and ignored.
const IGNORED: &[&str] = &[
    "rw", "ro", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime", "norelatime",
    "strictatime", "nodiratime", "diratime", "async", "sync", "dirsync", "auto", "noauto", "user", "nouser", "users",
    "owner", "group", "defaults", "_netdev", "nofail", "default_permissions", "lazytime", "nolazytime", "silent", "loud",
    "nosymfollow", "symfollow",
];

#[derive(Debug, Clone)]
pub struct MountOptions {
    pub view: String,
    pub recipe: crate::view::requant::Recipe,
    pub cache_mb: usize,
    pub numa_count: usize,
    pub verify_hashes: bool,
    pub stats: Option<bool>,
    pub passthrough: bool,
    pub pack: PackOptions,
    pub digest_store: Option<String>,
    pub threads: usize,
    pub clone_fd: bool,
    pub max_background: Option<u16>,
    /// None: auto (identity files only); Some(true/false): every file / none.
    pub direct_io: Option<bool>,
    /// None: auto (each handle as the client opened it); Some: every handle.
    pub source_io: Option<crate::source::SourceIo>,
    pub direct_threads: usize,
    pub direct_piece_kb: usize,
    pub async_dio: bool,
    pub max_read: u32,
    pub read_ahead_kb: Option<u32>,
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    pub mountpoint_path: Option<PathBuf>,
    pub log_file: Option<PathBuf>,
    pub debug: bool,
    pub foreground: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            view: "auto".into(),
            recipe: Default::default(),
            cache_mb: 1024,
            numa_count: 1,
            verify_hashes: false,
            stats: None,
            passthrough: true,
            pack: PackOptions::default(),
            digest_store: None,
            threads: default_threads(),
            clone_fd: true,
            max_background: None,
            direct_io: None,
            source_io: None,
            direct_threads: 32,
            direct_piece_kb: 0,
            async_dio: true,
            max_read: 1 << 20,
            read_ahead_kb: None,
            allow_other: false,
            allow_root: false,
            auto_unmount: false,
            mountpoint_path: None,
            log_file: None,
            debug: false,
            foreground: false,
        }
    }
}

/// More workers than cores only adds context switches to the transport (measured with
/// tools/bench_serve.py: on 2 cores, 2 workers read the pack 1.1-1.4x faster than 8).
fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(8).clamp(2, 8)
}

fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("option {key}: {v:?} is not a valid number"))
}

impl MountOptions {
    /// Apply one option, `key` with or without `=value`.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<(), String> {
        if key.starts_with("x-") || key.starts_with("comment") {
            return Ok(());
        }
        let key = key.replace('-', "_");
        let key = key.as_str();
        if IGNORED.contains(&key) {
            return Ok(());
        }
        let Some(&(_, takes_value, _)) = OPTIONS.iter().find(|o| o.0 == key) else {
            return Err(format!("unknown option {key:?}; see `xpackfs mount --help`"));
        };
        let v = match (takes_value, value) {
            (true, Some(v)) => v,
            (true, None) => return Err(format!("option {key} needs a value ({key}=...)")),
            (false, None) => "",
            (false, Some(v)) => return Err(format!("option {key} takes no value, got {v:?}")),
        };
        let p = &mut self.pack;
        match key {
            "view" => {
                if !["auto", "expert-pack", "bf16-cache", "requant", "kt-int8"].contains(&v) {
                    return Err(format!("option view: unknown view {v:?}; available: auto, expert-pack, bf16-cache, requant, kt-int8"));
                }
                self.view = v.into()
            }
            "imatrix" => self.recipe.imatrix = Some(v.into()),
            "w1" | "w2" | "w3" => {
                let q = crate::codec::QuantType::from_name(v).ok_or_else(|| format!("option {key}: {v:?} is not one of IQ2_XXS, Q2_K, Q8_0"))?;
                match key {
                    "w1" => self.recipe.w1 = q,
                    "w2" => self.recipe.w2 = q,
                    _ => self.recipe.w3 = q,
                }
            }
            "numa_count" => {
                self.numa_count = num(key, v)?;
                if self.numa_count == 0 {
                    return Err("option numa_count: must be at least 1".into());
                }
            }
            "verify_hashes" => self.verify_hashes = true,
            "stats" => {
                self.stats = Some(match v {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(format!("option stats: {v:?} is not on or off")),
                })
            }
            "max_background" => {
                let n: u16 = num(key, v)?;
                if n == 0 {
                    return Err("option max_background: must be at least 1".into());
                }
                self.max_background = Some(n);
            }
            "direct_io" => {
                self.direct_io = match v {
                    "auto" => None,
                    "on" | "true" | "1" => Some(true),
                    "off" | "false" | "0" => Some(false),
                    _ => return Err(format!("option direct_io: {v:?} is not auto, on or off")),
                }
            }
            "source_io" => {
                self.source_io = match v {
                    "auto" => None,
                    "direct" => Some(crate::source::SourceIo::Direct),
                    "buffered" => Some(crate::source::SourceIo::Buffered),
                    _ => return Err(format!("option source_io: {v:?} is not auto, direct or buffered")),
                }
            }
            "direct_threads" => {
                self.direct_threads = num(key, v)?;
                if self.direct_threads > 256 {
                    return Err("option direct_threads: must be 0..=256".into());
                }
            }
            "direct_piece_kb" => {
                self.direct_piece_kb = num(key, v)?;
                if self.direct_piece_kb != 0 && !(4..=1024).contains(&self.direct_piece_kb) {
                    return Err("option direct_piece_kb: must be 0 or 4..=1024".into());
                }
            }
            "async_dio" => {
                self.async_dio = match v {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(format!("option async_dio: {v:?} is not on or off")),
                }
            }
            "clone_fd" => {
                self.clone_fd = match v {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(format!("option clone_fd: {v:?} is not on or off")),
                }
            }
            "passthrough" => {
                self.passthrough = match v {
                    "auto" | "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(format!("option passthrough: {v:?} is not auto or off")),
                }
            }
            "cache_mb" => {
                self.cache_mb = num(key, v)?;
                if self.cache_mb == 0 {
                    return Err("option cache_mb: must be at least 1".into());
                }
            }
            "name" => {
                if v.is_empty() || v.contains('/') || v == "." || v == ".." {
                    return Err(format!("option name: {v:?} is not a plain file name"));
                }
                p.name = Some(v.into())
            }
            "model_ref" => p.model_ref = v.into(),
            "model_identity_sha256" => p.model_identity_sha256 = Some(hex64(key, v)?),
            "config_sha256" => p.config_sha256 = Some(hex64(key, v)?),
            "config_blob" => p.config_blob = Some(v.into()),
            "num_layers" => p.num_layers = Some(num(key, v)?),
            "num_experts" => p.num_experts = Some(num(key, v)?),
            "top_k" => p.top_k = Some(num(key, v)?),
            "alignment" => {
                let a: u64 = num(key, v)?;
                if a == 0 || !a.is_power_of_two() {
                    return Err(format!("option alignment: {a} is not a power of two"));
                }
                p.alignment = a
            }
            "source_sha256" => p.source_sha256 = Some(hex64(key, v)?),
            "digest_store" => self.digest_store = Some(v.into()),
            "threads" => {
                self.threads = num(key, v)?;
                if self.threads == 0 || self.threads > 256 {
                    return Err("option threads: must be 1..=256".into());
                }
            }
            "max_read" => {
                self.max_read = num(key, v)?;
                if !(4096..=1 << 20).contains(&self.max_read) {
                    return Err("option max_read: must be 4096..=1048576".into());
                }
            }
            "read_ahead_kb" => self.read_ahead_kb = Some(num(key, v)?),
            "allow_other" => self.allow_other = true,
            "allow_root" => self.allow_root = true,
            "auto_unmount" => self.auto_unmount = true,
            "mountpoint_path" => self.mountpoint_path = Some(v.into()),
            "log_file" => self.log_file = Some(v.into()),
            "debug" => self.debug = true,
            "foreground" => self.foreground = true,
            _ => unreachable!("option {key} listed but not handled"),
        }
        Ok(())
    }

    /// Apply a comma-separated `-o` list.
    pub fn apply_list(&mut self, list: &str) -> Result<(), String> {
        for item in list.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            self.set(k, v)?;
        }
        Ok(())
    }
}

fn hex64(key: &str, v: &str) -> Result<String, String> {
    if v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(v.to_ascii_lowercase())
    } else {
        Err(format!("option {key}: {v:?} is not a sha256 (64 hex digits)"))
    }
}

pub fn help_text() -> String {
    let mut s = String::from("Mount options (as -o key[=value],... or as --key value flags):\n");
    for (k, takes, help) in OPTIONS {
        let left = if *takes { format!("{k}=VALUE") } else { k.to_string() };
        s.push_str(&format!("  {left:<28} {help}\n"));
    }
    s.push_str("  Generic options (rw, ro, nodev, nosuid, noatime, _netdev, nofail, x-systemd.*, ...) are ignored;\n  the mount is always read-only.\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fstab_style_list() {
        let mut o = MountOptions::default();
        o.apply_list("rw,nodev,nosuid,_netdev,x-systemd.automount,top_k=4,alignment=65536,allow_other,debug").unwrap();
        assert_eq!(o.pack.top_k, Some(4));
        assert_eq!(o.pack.alignment, 65536);
        assert!(o.allow_other && o.debug);
    }

    #[test]
    fn bad_options_are_named() {
        let mut o = MountOptions::default();
        assert!(o.apply_list("bogus=1").unwrap_err().contains("bogus"));
        assert!(o.apply_list("alignment=3000").unwrap_err().contains("power of two"));
        assert!(o.apply_list("top_k").unwrap_err().contains("needs a value"));
        assert!(o.apply_list("source_sha256=abc").unwrap_err().contains("64 hex"));
        assert!(o.apply_list("name=../x").unwrap_err().contains("plain file name"));
        assert!(o.apply_list("source_io=sideways").unwrap_err().contains("auto, direct or buffered"));
        assert!(o.apply_list("direct_threads=1000").unwrap_err().contains("0..=256"));
    }

    #[test]
    fn source_io_modes() {
        let mut o = MountOptions::default();
        assert_eq!((o.source_io, o.async_dio, o.direct_threads), (None, true, 32));
        o.apply_list("source_io=direct,async_dio=off,direct_threads=0").unwrap();
        assert_eq!((o.source_io, o.async_dio, o.direct_threads), (Some(crate::source::SourceIo::Direct), false, 0));
        o.apply_list("source_io=buffered").unwrap();
        assert_eq!(o.source_io, Some(crate::source::SourceIo::Buffered));
        o.apply_list("source_io=auto").unwrap();
        assert_eq!(o.source_io, None);
    }
}
