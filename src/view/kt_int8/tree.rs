//! Read-only mounts of existing kt-kernel INT8 trees. The tree is validated first (the same
//! rules as `validate-int8`; an invalid tree is refused with the validator's message), and
//! every file is the whole source file, held open since validation.
//!
//! With FUSE passthrough (kernel 6.9+, root; `passthrough=auto`, the default) an open checks
//! the file (identity of the held descriptor, and that its path still names it) and hands
//! the kernel that descriptor: reads and mmaps then run at the source filesystem's speed
//! without the daemon. A file changed before an open gives EIO at the open; a file replaced
//! by a rename keeps serving the validated original. What passthrough cannot do is stop a
//! handle that is already open from seeing a later in-place write to the same inode.
//! Without passthrough (`passthrough=off`, or where unavailable) every read goes through
//! `SourceFile::read_exact_at`, which checks the file after each read: EIO, never new bytes,
//! even on handles opened before the change.

use std::path::Path;
use std::sync::Arc;

use crate::view::{Extent, Ino, Tree, ViewError, VirtualFile, ROOT_INO};
use crate::source::SourceFile;
use super::validate::{self, Expect, LEGACY_MANIFEST_NAME, MANIFEST_NAME};

pub fn is_int8_tree(path: &Path) -> bool {
    path.is_dir() && (path.join(MANIFEST_NAME).exists() || path.join(LEGACY_MANIFEST_NAME).exists())
}

/// Mounts of existing INT8 trees (chosen by `view=auto` for a directory holding one).
pub struct Int8TreeView;

impl crate::view::View for Int8TreeView {
    fn name(&self) -> &'static str {
        "int8-tree"
    }
    fn summary(&self) -> &'static str {
        "an existing kt-kernel INT8 tree, validated, served read-only (FUSE passthrough where possible)"
    }
    fn is_default_for(&self, input: &crate::view::Input) -> bool {
        matches!(input, crate::view::Input::Int8Tree(_))
    }
    fn build(&self, input: &crate::view::Input, opts: &crate::view::ViewOptions, _ctx: &crate::view::Context) -> Result<Tree, ViewError> {
        match input {
            crate::view::Input::Int8Tree(root) => build(root, opts.kt_int8.verify_hashes),
            crate::view::Input::Checkpoint(_) => Err(ViewError::layout("int8-tree", "the source is a checkpoint, not an INT8 tree (no kt-weight-manifest.json)")),
        }
    }
    fn verify(&self, _built: &crate::view::Built, out: &Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
        super::verify_written_tree(out, written)
    }
    fn exclusive_root(&self) -> bool {
        true
    }
}

pub fn build(root: &Path, verify_hashes: bool) -> Result<Tree, ViewError> {
    let v = validate::validate(root, &Expect::default(), Some(verify_hashes))?;
    let mut tree = Tree::new();
    add_dir(&mut tree, ROOT_INO, &v.root)?;
    Ok(tree)
}

fn add_dir(tree: &mut Tree, ino: Ino, dir: &Path) -> Result<(), ViewError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| ViewError::Source(crate::source::SourceError::Io { path: dir.to_path_buf(), source: e }))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if path.is_dir() {
            let child = tree.add_dir(ino, &name);
            add_dir(tree, child, &path)?;
        } else {
            let file = Arc::new(SourceFile::open(&path)?);
            let mut f = VirtualFile::new();
            let len = file.size();
            f.push(Extent::Source { file, offset: 0, len });
            tree.add_file(ino, &name, f);
        }
    }
    Ok(())
}
