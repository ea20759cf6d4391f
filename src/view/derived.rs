//! Derived files: manifests whose bytes hold the sha256 of other files (or of ranges of
//! them, or of source ranges). Every view's manifests go through this one mechanism.
//!
//! * Size known at mount: hex digests have a fixed length, so the file's size is that of its
//!   rendering with placeholder digests (checked again when it is rendered for real).
//! * Bytes on first read: the digests come from the digest store when it remembers them
//!   (under a key from [`DigestStore::view_key`]: the view, its parameters and the source
//!   files' identity), else they are computed by reading the inputs through the view, then
//!   remembered. A later mount of the unchanged source renders at once.
//! * Recorded while streaming: a view input's range is declared on its file
//!   ([`VirtualFile::want_digest`]), so `materialize`, which writes data files before
//!   derived ones, hashes those ranges on the way and the derived file reads nothing again.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::{ViewError, vfile::VirtualFile};
use crate::digest::DigestStore;
use crate::source::SourceFile;

/// One digest a derived file needs.
#[derive(Debug, Clone)]
pub enum Input {
    /// `len` bytes at `offset` of a file of the view.
    View { file: Arc<VirtualFile>, offset: u64, len: u64 },
    /// `len` bytes at `offset` of a source file, as they are.
    Source { file: Arc<SourceFile>, offset: u64, len: u64 },
}

impl Input {
    /// The whole of a file of the view.
    pub fn whole(file: &Arc<VirtualFile>) -> Input {
        Input::View { file: file.clone(), offset: 0, len: file.size() }
    }

    fn sha256(&self) -> Result<String, ViewError> {
        match self {
            Input::View { file, offset, len } => file.sha256_range(*offset, *len),
            Input::Source { file, offset, len } => hash_source(file, *offset, *len),
        }
    }
}

type Render = dyn Fn(&[String]) -> Vec<u8> + Send + Sync;

/// A derived file before it is placed in a tree.
pub struct Derived {
    inputs: Vec<Input>,
    key: String,
    store: DigestStore,
    render: Box<Render>,
    what: String,
}

const PLACEHOLDER: &str = "0000000000000000000000000000000000000000000000000000000000000000";

impl Derived {
    /// `render` gets one lowercase hex sha256 per input, in order. `key` identifies the
    /// inputs' bytes in the digest store (see [`DigestStore::view_key`]); an empty key: not
    /// remembered (inputs that are cheap or always streamed first). `what` names the file in
    /// log lines.
    pub fn new(
        what: impl Into<String>,
        store: &DigestStore,
        key: String,
        inputs: Vec<Input>,
        render: impl Fn(&[String]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Derived {
        for input in &inputs {
            if let Input::View { file, offset, len } = input {
                file.want_digest(*offset, *len);
            }
        }
        Derived { inputs, key, store: store.clone(), render: Box::new(render), what: what.into() }
    }

    /// The size of the rendered file.
    pub fn len(&self) -> u64 {
        (self.render)(&vec![PLACEHOLDER.to_string(); self.inputs.len()]).len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The inputs' digests: remembered ones, else computed through the view and remembered.
    pub fn digests(&self) -> Result<Vec<String>, ViewError> {
        let remembered = !self.key.is_empty();
        if let Some(d) = remembered.then(|| self.store.load_view(&self.key)).flatten().filter(|d| d.len() == self.inputs.len()) {
            return Ok(d);
        }
        let unknown = self.inputs.iter().filter(|i| !matches!(i, Input::View { file, offset, len } if file.known_digest(*offset, *len).is_some())).count();
        if unknown > 0 {
            let then = if remembered { "; the digests will be remembered" } else { "" };
            tracing::info!("{}: hashing {unknown} of {} input(s) through the view{then}", self.what, self.inputs.len());
        }
        let digests = self.inputs.iter().map(Input::sha256).collect::<Result<Vec<_>, _>>()?;
        if remembered && let Err(e) = self.store.save_view(&self.key, &digests) {
            tracing::warn!("{}: could not remember the digests: {e}", self.what);
        }
        Ok(digests)
    }

    /// The bytes, now.
    pub fn render(&self) -> Result<Vec<u8>, ViewError> {
        Ok((self.render)(&self.digests()?))
    }

    /// A file of [`Derived::len`] bytes rendered on first read (see the module docs).
    pub fn into_file(self) -> VirtualFile {
        let len = self.len();
        VirtualFile::lazy(len, move || self.render())
    }

    /// A file rendered now, for files no reader should wait for on its first read (the
    /// expert pack's manifest, which SGLang reads at start-up).
    pub fn into_file_now(self) -> Result<VirtualFile, ViewError> {
        Ok(VirtualFile::from_bytes(self.render()?))
    }
}

/// A written manifest (for the views' `materialize --verify` hooks).
pub fn read_json(out: &std::path::Path, name: &str) -> Result<serde_json::Value, ViewError> {
    let path = out.join(name);
    let bytes = std::fs::read(&path).map_err(|e| ViewError::Verify { file: name.to_string(), rule: format!("cannot read {}: {e}", path.display()) })?;
    serde_json::from_slice(&bytes).map_err(|e| ViewError::Verify { file: name.to_string(), rule: format!("not JSON: {e}") })
}

/// sha256 of a source range, read in large chunks.
pub fn hash_source(file: &SourceFile, offset: u64, len: u64) -> Result<String, ViewError> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; (len.min(8 << 20)) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset + done)?;
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(crate::util::hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::sha256_hex;

    fn temp_store() -> (tempfile::TempDir, DigestStore) {
        let d = tempfile::tempdir().unwrap();
        let s = DigestStore { dir: Some(d.path().to_path_buf()) };
        (d, s)
    }

    #[test]
    fn rendered_from_digests_remembered_and_streamed() {
        let (_d, store) = temp_store();
        let data = Arc::new(VirtualFile::from_bytes(b"hello world".to_vec()));
        let make = |store: &DigestStore| {
            Derived::new("test manifest", store, "k1".into(), vec![Input::whole(&data), Input::View { file: data.clone(), offset: 6, len: 5 }], |h| {
                format!("{}\n{}\n", h[0], h[1]).into_bytes()
            })
        };
        let f = make(&store).into_file();
        // The whole file's digest is always taken by a writer; only the sub-range is declared.
        assert_eq!(data.digest_ranges(), vec![(6, 5)]);
        let expect = format!("{}\n{}\n", sha256_hex(b"hello world"), sha256_hex(b"world"));
        assert_eq!(f.size(), expect.len() as u64);
        let mut buf = vec![0u8; expect.len()];
        assert_eq!(f.read_at(0, &mut buf, crate::store::ReadCtx::CLIENT).unwrap(), expect.len());
        assert_eq!(buf, expect.as_bytes());
        // Remembered: a store entry that says otherwise is what a second build renders.
        store.save_view("k1", &["a".repeat(64), "b".repeat(64)]).unwrap();
        assert_eq!(make(&store).render().unwrap(), format!("{}\n{}\n", "a".repeat(64), "b".repeat(64)).into_bytes());
        // Streamed: digests recorded on the file are used without reading it.
        let (_d2, empty) = temp_store();
        data.record_digest(6, 5, "c".repeat(64));
        let text = String::from_utf8(make(&empty).render().unwrap()).unwrap();
        assert!(text.ends_with(&format!("{}\n", "c".repeat(64))));
    }

    #[test]
    fn a_rendering_whose_length_depends_on_the_digests_is_an_error() {
        // sha256("x") starts with '2', the placeholder does not: 63 bytes rendered, 64 announced.
        let data = Arc::new(VirtualFile::from_bytes(b"x".to_vec()));
        let f = Derived::new("bad", &DigestStore { dir: None }, "k".into(), vec![Input::whole(&data)], |h| h[0].trim_start_matches('2').as_bytes().to_vec())
            .into_file();
        let mut buf = vec![0u8; 64];
        assert!(f.read_at(0, &mut buf, crate::store::ReadCtx::CLIENT).is_err());
    }
}
