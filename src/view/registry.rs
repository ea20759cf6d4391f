//! The registry of views and the one way to build one: [`build`] takes an [`Input`] (a
//! checkpoint or an existing INT8 tree), the [`ViewOptions`] and a [`Context`] (what the
//! view is built for, the digest store, the chunk tiers: memory cache, disk cache and
//! compute pool, one set per process) and gives a [`Built`] view, behind a guard that turns
//! a bug in a builder into an error instead of a dead process.
//!
//! A view is a module under `view/` with a unit struct implementing [`View`]; adding one
//! means adding it to [`VIEWS`] (and, if it has options, one `#[command(flatten)]` field in
//! [`ViewOptions`]). `serve` and `materialize` never name a view's module: they build views
//! through this module and read what it gives, a [`Built`] tree of virtual files (`tree`,
//! `vfile`), like any other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Tiers, Tree, ViewError, bf16_cache, expert_pack, gguf_out, kimi_pack, kt_int8, requant};
use crate::digest::DigestStore;
use crate::source::{Source, SourceFile};
use crate::util::args::{int_in, plain_file_name};

/// Every view, in the order `view=auto` asks them whether they are the default.
pub static VIEWS: &[&dyn View] = &[
    &kt_int8::existing_tree::Int8TreeView,
    &expert_pack::ExpertPackView,
    &kimi_pack::KimiPackView,
    &bf16_cache::Bf16CacheView,
    &requant::RequantView,
    &kt_int8::KtInt8View,
    &gguf_out::GgufView,
];

/// What every view provides.
pub trait View: Sync {
    /// The `view=` name.
    fn name(&self) -> &'static str;
    /// One line for `--help`.
    fn summary(&self) -> &'static str;
    /// Whether `view=auto` picks this view for `input`.
    fn is_default_for(&self, _input: &Input) -> bool {
        false
    }
    /// Check the input against the view's rules and lay out its files.
    fn build(&self, input: &Input, opts: &ViewOptions, ctx: &Context) -> Result<Tree, ViewError>;
    /// `materialize --verify`, after every written file was re-hashed from disk and found equal
    /// to what was written: check the digests the view's manifests declare. `written` maps
    /// each file's path to its sha256.
    fn verify(&self, _built: &Built, _out: &Path, _written: &HashMap<String, String>) -> Result<(), ViewError> {
        Ok(())
    }
    /// Whether the root must hold nothing but the view's files (no `/.xpackfs` status
    /// directory unless asked for): trees that kt-kernel validates as a whole.
    fn exclusive_root(&self) -> bool {
        false
    }
}

/// Options of the views (`-o key=value` or `--key value`); those of one view only carry its
/// name in their help.
#[derive(Debug, Clone, clap::Args)]
pub struct ViewOptions {
    /// View to serve: auto (expert-pack for GGUF, bf16-cache for safetensors, int8-tree for an
    /// existing INT8 tree), or one of the views listed below
    #[arg(long, default_value = "auto", value_parser = view_name, help_heading = "View")]
    pub view: String,
    /// Directory of remembered digests, or 'none' (default /var/lib/xpackfs/digests for root,
    /// else ~/.cache/xpackfs/digests; $XPACKFS_DIGEST_STORE overrides)
    #[arg(long, value_name = "DIR", help_heading = "View")]
    pub digest_store: Option<String>,
    /// Byte budget of the computed-chunk memory cache, MiB
    #[arg(long, value_name = "MIB", default_value = "1024", value_parser = int_in::<u64>(1, 1 << 24), help_heading = "Chunk caches")]
    pub cache_mb: u64,
    /// File name stem of the pack (default: the source's stem)
    #[arg(long, value_parser = plain_file_name, help_heading = "View")]
    pub name: Option<String>,
    #[command(flatten)]
    pub tiers: crate::store::Options,
    #[command(flatten)]
    pub remote: crate::source::remote::Options,
    #[command(flatten)]
    pub pack: expert_pack::Options,
    #[command(flatten)]
    pub kimi: kimi_pack::Options,
    #[command(flatten)]
    pub requant: requant::Options,
    #[command(flatten)]
    pub kt_int8: kt_int8::Options,
    #[command(flatten)]
    pub gguf_out: gguf_out::Options,
}

impl Default for ViewOptions {
    fn default() -> Self {
        use clap::{Args, FromArgMatches};
        let cmd = ViewOptions::augment_args(clap::Command::new("defaults").no_binary_name(true));
        let m = cmd.try_get_matches_from(Vec::<String>::new()).expect("every view option has a default");
        ViewOptions::from_arg_matches(&m).expect("defaults parse")
    }
}

/// A `view` value that is neither `auto` nor a view's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown view {0:?}: auto, {names}", names = VIEWS.iter().map(|v| v.name()).collect::<Vec<_>>().join(", "))]
pub struct UnknownView(pub String);

fn view_name(s: &str) -> Result<String, UnknownView> {
    if s == "auto" || VIEWS.iter().any(|v| v.name() == s) { Ok(s.to_string()) } else { Err(UnknownView(s.to_string())) }
}

/// What a view is built from.
#[derive(Debug)]
pub enum Input {
    /// A GGUF file (or split set) or a safetensors checkpoint, parsed from headers.
    Checkpoint(Source),
    /// A directory holding a kt-kernel INT8 tree (its manifest at the root).
    Int8Tree(PathBuf),
}

impl Input {
    /// The input at `path`. A checkpoint is opened under its canonical path: the identity of
    /// source files (which disk-cache and digest-store keys hold) is the same whichever
    /// spelling of the path a command was given (relative, through a symlink). An INT8 tree
    /// keeps the path as given, so that its validator sees (and refuses) a symlinked root,
    /// as `validate-int8` does.
    pub fn open(path: &Path) -> Result<Input, ViewError> {
        if kt_int8::existing_tree::is_int8_tree(path) {
            if crate::source::remote::is_remote(path) {
                return Ok(Input::Int8Tree(path.to_path_buf()));
            }
            return Ok(Input::Int8Tree(std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())));
        }
        let canonical = std::fs::canonicalize(path);
        Ok(Input::Checkpoint(Source::open(canonical.as_deref().unwrap_or(path))?))
    }

    /// The checkpoint, for views that read one.
    pub fn source(&self, view: &'static str) -> Result<&Source, ViewError> {
        match self {
            Input::Checkpoint(s) => Ok(s),
            Input::Int8Tree(p) => Err(ViewError::layout(view, format!("{} is an INT8 tree, not a checkpoint (mount it with view=auto)", p.display()))),
        }
    }
}

/// What a view is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Served by a mount: manifests that readers need at once are rendered at build time.
    Mount,
    /// Written by `materialize`: manifests are derived files, written after the data files
    /// from the digests taken while writing them.
    Materialize,
}

/// Everything a build needs besides the input and the options.
#[derive(Debug, Clone)]
pub struct Context {
    pub purpose: Purpose,
    /// Where the files are seen (the mountpoint, or the output directory): manifests that
    /// name a file's path name it there.
    pub location: PathBuf,
    /// The command recorded in manifests.
    pub command: String,
    pub store: DigestStore,
    /// Where computed chunks are looked up and computed: memory (`cache_mb`), the disk cache
    /// (`disk_cache`), the compute pool (`compute_threads`).
    pub tiers: Arc<Tiers>,
}

impl Context {
    pub fn new(purpose: Purpose, location: PathBuf, command: String, opts: &ViewOptions) -> Result<Context, ViewError> {
        Ok(Context {
            purpose,
            location,
            command,
            store: DigestStore::from_option(opts.digest_store.as_deref()),
            tiers: Tiers::from_options((opts.cache_mb << 20) as usize, &opts.tiers)?,
        })
    }
}

/// A built view: its files, which view it is, what it was built from, and the source files
/// it reads.
pub struct Built {
    pub tree: Tree,
    pub view: &'static dyn View,
    pub input: Input,
    /// The source files whose identity the view's bytes depend on.
    pub sources: Vec<Arc<SourceFile>>,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built").field("view", &self.view.name()).field("tree", &self.tree).finish()
    }
}

/// The view `opts.view` names, or for `auto` the default one for `input`.
pub fn resolve(name: &str, input: &Input) -> Result<&'static dyn View, ViewError> {
    if name == "auto" {
        return VIEWS
            .iter()
            .copied()
            .find(|v| v.is_default_for(input))
            .ok_or_else(|| ViewError::option("view", "no view is the default for this source: name one with view=..."));
    }
    VIEWS.iter().copied().find(|v| v.name() == name).ok_or_else(|| ViewError::option("view", UnknownView(name.to_string()).to_string()))
}

/// Build the view `opts.view` of `input`. A panic in a builder (a bug) becomes an error.
pub fn build(input: Input, opts: &ViewOptions, ctx: &Context) -> Result<Built, ViewError> {
    let view = resolve(&opts.view, &input)?;
    let tree = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| view.build(&input, opts, ctx)))
        .unwrap_or_else(|_| Err(ViewError::Internal(format!("building the {} view failed (a bug: it panicked)", view.name()))))?;
    let sources = match &input {
        Input::Checkpoint(s) => s.files.clone(),
        Input::Int8Tree(_) => tree.vfiles().filter_map(|f| f.whole_source().cloned()).collect(),
    };
    Ok(Built { tree, view, input, sources })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_defaults_parse() {
        let mut names: Vec<&str> = VIEWS.iter().map(|v| v.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), VIEWS.len());
        let o = ViewOptions::default();
        assert_eq!((o.view.as_str(), o.cache_mb), ("auto", 1024));
        assert!(view_name("nope").unwrap_err().to_string().contains("expert-pack"));
    }
}
