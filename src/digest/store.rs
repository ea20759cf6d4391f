//! The digest store: digests of sources and of view files remembered on disk, keyed by
//! the identity of the source files. Entries are written atomically (temp file, fsync,
//! rename).
//!
//! One rule for every key ([`identity_key`]): path, inode, size, mtime and ctime of each
//! source file, never the device number. The clients of a network filesystem see the same
//! file under different device numbers, and a store on that filesystem is meant to be shared
//! by them (a cluster materialize, several mounts); any change to a file's content changes
//! its size, mtime or ctime, and a replaced file has another inode.

use std::path::PathBuf;

use std::sync::Arc;

use super::{DigestError, FileRecord, STORE_FORMAT, SourceDigests, StoreWrite, covers, file_records};
use crate::source::{Source, SourceFile};
use crate::util::sha256_hex;

/// The store key of `tag` (what is remembered and its parameters) for these source files:
/// the sha256 of canonical JSON of the tag and the files' portable identities. The empty tag
/// is the source digests' own entry, whose key has always been the identities alone.
pub fn identity_key(tag: &str, files: &[FileRecord]) -> String {
    let v = if tag.is_empty() { serde_json::json!(portable(files)) } else { serde_json::json!({"tag": tag, "files": portable(files)}) };
    sha256_hex(crate::pyjson::dumps(&v, &crate::pyjson::Style::CANONICAL).as_bytes())
}

/// Records of open source files, for [`identity_key`].
pub fn records_of(files: &[Arc<SourceFile>]) -> Vec<FileRecord> {
    files.iter().map(|f| FileRecord { path: f.path().to_path_buf(), identity: f.identity() }).collect()
}

/// Where digests are remembered. `None` disables the store.
#[derive(Debug, Clone)]
pub struct DigestStore {
    pub dir: Option<PathBuf>,
}

impl DigestStore {
    /// `$XPACKFS_DIGEST_STORE` (`none` or `off`: no store, as for the option), else
    /// `/var/lib/xpackfs/digests` for root, else `$XDG_CACHE_HOME/xpackfs/digests` (or
    /// `~/.cache/xpackfs/digests`).
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("XPACKFS_DIGEST_STORE") {
            if p == "none" || p == "off" {
                return None;
            }
            return Some(PathBuf::from(p));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            return Some(PathBuf::from("/var/lib/xpackfs/digests"));
        }
        let cache = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(cache.join("xpackfs/digests"))
    }

    pub fn from_option(opt: Option<&str>) -> Self {
        match opt {
            Some("none") | Some("off") => DigestStore { dir: None },
            Some(p) => DigestStore { dir: Some(PathBuf::from(p)) },
            None => DigestStore { dir: Self::default_dir() },
        }
    }

    /// Source digests are keyed by the files' identities alone (see [`identity_key`]).
    fn key(files: &[FileRecord]) -> String {
        identity_key("", files)
    }

    /// The key under which the digests of a view's files are remembered: the view, its
    /// parameters (everything else the bytes depend on) and the source files.
    pub fn view_key(view: &str, params: &str, files: &[Arc<SourceFile>]) -> String {
        identity_key(&format!("view:{view}:{params}"), &records_of(files))
    }

    pub fn path_for(&self, source: &Source) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join(format!("{}.json", Self::key(&file_records(source)))))
    }

    /// Stored digests for this exact source (same paths and identities), if any.
    pub fn load(&self, source: &Source) -> Option<SourceDigests> {
        let path = self.path_for(source)?;
        let text = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<SourceDigests>(&text) {
            Ok(d) if d.format == STORE_FORMAT && portable(&d.files) == portable(&file_records(source)) && covers(&d, source) => Some(d),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("ignoring unreadable digest store entry {}: {e}", path.display());
                None
            }
        }
    }

    pub fn save(&self, digests: &SourceDigests) -> Result<Option<PathBuf>, DigestError> {
        let Some(dir) = &self.dir else { return Ok(None) };
        let path = dir.join(format!("{}.json", Self::key(&digests.files)));
        let err = |source: StoreWrite| DigestError::Write { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(|e| err(StoreWrite::CreateDir(e)))?;
        let text = serde_json::to_vec(digests).map_err(|e| err(e.into()))?;
        crate::fsutil::write_atomic(&path, &text).map_err(|e| err(e.into()))?;
        Ok(Some(path))
    }
}

impl DigestStore {
    fn view_path(&self, key: &str) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join("views").join(format!("{key}.json")))
    }

    /// Digests of a view's files remembered under `key` (which must cover the source's
    /// identity and the view's parameters).
    pub fn load_view(&self, key: &str) -> Option<Vec<String>> {
        let text = std::fs::read(self.view_path(key)?).ok()?;
        serde_json::from_slice(&text).ok()
    }

    pub fn save_view(&self, key: &str, hashes: &[String]) -> Result<(), DigestError> {
        let Some(path) = self.view_path(key) else { return Ok(()) };
        let err = |source: StoreWrite| DigestError::Write { path: path.clone(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| err(StoreWrite::CreateDir(e)))?;
        }
        let text = serde_json::to_vec(hashes).map_err(|e| err(e.into()))?;
        crate::fsutil::write_atomic(&path, &text).map_err(|e| err(e.into()))
    }
}

/// File records without the device number (see [`DigestStore`]'s key).
fn portable(files: &[FileRecord]) -> Vec<FileRecord> {
    files.iter().map(|f| FileRecord { path: f.path.clone(), identity: crate::source::FileIdentity { device: 0, ..f.identity } }).collect()
}
