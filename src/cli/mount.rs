//! `xpackfs mount`: check the arguments, go to the background (or not), build the view and
//! serve it. Errors before the fork are printed here; after it, the daemon hands them to
//! the waiting parent through the readiness pipe.

use std::path::Path;

use super::MountArgs;
use crate::serve::{self, daemon};
use crate::view::{self, Context, Input, Purpose};

pub fn run(a: MountArgs) -> i32 {
    let MountArgs { source, mountpoint, options } = a;
    // Absolute (the daemon leaves the working directory), symlinks kept: Input::open
    // resolves a checkpoint's and validates an INT8 tree's root as given.
    options.view.remote.apply();
    let remote = crate::source::remote::is_remote(&source);
    let source = match if remote { Ok(source.clone()) } else { std::fs::metadata(&source).and_then(|_| std::path::absolute(&source)) } {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xpackfs: source {}: {e}", source.display());
            return 1;
        }
    };
    let location = match serve::mount_location(&mountpoint, &options.serve) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("xpackfs: {e}");
            return 1;
        }
    };
    // The daemon leaves the working directory: a relative mountpoint is resolved here.
    let mountpoint = match std::path::Path::new(&mountpoint) {
        p if p.is_relative() => std::env::current_dir().map(|d| d.join(p).to_string_lossy().into_owned()).unwrap_or(mountpoint),
        _ => mountpoint,
    };
    // The gguf view's imatrix too (it records the path as written in quantize.imatrix.file).
    let mut options = options;
    if options.view.view == "gguf"
        && let Some(p) = options.view.requant.imatrix.clone().filter(|p| p.is_relative())
        && let Ok(abs) = std::path::absolute(&p)
    {
        options.view.gguf_out.imatrix_as_given = Some(p.into_os_string());
        options.view.requant.imatrix = Some(abs);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut ready = if options.serve.foreground { daemon::Readiness::foreground() } else { daemon::daemonize() };
    if ready.is_background() {
        let _ = std::env::set_current_dir("/");
    }
    daemon::block_signals();
    super::init_logging(options.serve.debug);
    let result = Context::new(Purpose::Mount, location, command, &options.view).map_err(|e| e.to_string()).and_then(|ctx| {
        let built = build(&source, &options.view, &ctx)?;
        serve::mount(&source, &mountpoint, built, ctx.tiers.clone(), &options.view.tiers, &options.serve, &mut ready).map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            if ready.is_background() {
                ready.failed(&e); // the waiting parent prints it
            } else {
                eprintln!("xpackfs: {e}");
            }
            1
        }
    }
}

fn build(source: &Path, opts: &view::ViewOptions, ctx: &Context) -> Result<view::Built, String> {
    let input = Input::open(source).map_err(|e| e.to_string())?;
    view::build(input, opts, ctx).map_err(|e| e.to_string())
}
