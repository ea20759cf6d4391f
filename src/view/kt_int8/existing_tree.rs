//! Read-only mounts of existing kt-kernel INT8 trees, local or remote (`s3://BUCKET/PREFIX/`
//! and the other source URLs: then every read is a conditional ranged GET, as for any
//! remote source, and passthrough does not apply). The tree is validated first (the same
//! rules and the same code as `validate-int8`; an invalid tree is refused with the
//! validator's message), and what is served is exactly what the validator listed: the
//! manifest and its files, each the whole source file, opened (as a regular file) right
//! after validation and held open.
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

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::validate::{self, Expect, LEGACY_MANIFEST_NAME, MANIFEST_NAME};
use crate::source::SourceFile;
use crate::view::{Extent, Ino, ROOT_INO, Tree, ViewError, VirtualFile};

/// A directory with a manifest (or anything in its place: the validator then says what is
/// wrong with it) is an INT8 tree.
pub fn is_int8_tree(path: &Path) -> bool {
    let present = |n: &str| crate::source::present(&path.join(n));
    crate::source::is_dir(path) && (present(MANIFEST_NAME) || present(LEGACY_MANIFEST_NAME))
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
            crate::view::Input::Checkpoint(_) => {
                Err(ViewError::layout("int8-tree", "the source is a checkpoint, not an INT8 tree (no kt-weight-manifest.json)"))
            }
        }
    }
    fn verify(&self, _built: &crate::view::Built, out: &Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
        super::verify_written_tree(out, written)
    }
    fn exclusive_root(&self) -> bool {
        true
    }
}

/// Validate the tree at `root` and serve exactly what was validated: the manifest and the
/// files it lists (nothing added to the directories since is served).
pub fn build(root: &Path, verify_hashes: bool) -> Result<Tree, ViewError> {
    let v = validate::validate(root, &Expect::default(), Some(verify_hashes))?;
    let mut tree = Tree::new();
    let manifest = v.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    add_file(&mut tree, ROOT_INO, &manifest, &v.path)?;
    let mut dirs: BTreeMap<String, Ino> = BTreeMap::new();
    for rel in &v.files {
        let mut ino = ROOT_INO;
        let mut parts: Vec<&str> = rel.split('/').collect();
        let Some(name) = parts.pop() else { continue };
        let mut prefix = String::new();
        for d in parts {
            prefix = if prefix.is_empty() { d.to_string() } else { format!("{prefix}/{d}") };
            ino = match dirs.get(&prefix) {
                Some(&i) => i,
                None => {
                    if tree.lookup(ino, d).is_some() {
                        return Err(ViewError::Internal(format!("INT8 tree: {prefix} is both a file and a directory")));
                    }
                    let i = tree.add_dir(ino, d);
                    dirs.insert(prefix.clone(), i);
                    i
                }
            };
        }
        add_file(&mut tree, ino, name, &v.root.join(rel))?;
    }
    Ok(tree)
}

fn add_file(tree: &mut Tree, dir: Ino, name: &str, path: &Path) -> Result<(), ViewError> {
    if tree.lookup(dir, name).is_some() {
        return Err(ViewError::Internal(format!("INT8 tree: {} listed twice", path.display())));
    }
    let file = Arc::new(SourceFile::open(path)?);
    let mut f = VirtualFile::new();
    let len = file.size();
    f.push(Extent::Source { file, offset: 0, len });
    tree.add_file(dir, name, f);
    Ok(())
}
