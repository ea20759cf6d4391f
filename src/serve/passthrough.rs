//! The FUSE passthrough state machine: which opens the kernel serves from a backing file
//! itself (a whole source file, or a file entry of the disk cache) and which go through the
//! daemon, decided per inode from what is open (see [`Passthrough`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use fuser::{BackingId, ReplyOpen};
use parking_lot::Mutex;

use super::fs::{Backing, Found};

/// FUSE passthrough (kernel 6.9+, CAP_SYS_ADMIN): files that are whole source files, and
/// files kept whole in the disk cache (file entries), are opened with that file as backing
/// file, and the kernel serves their reads and mmaps itself. One backing id per inode,
/// shared by its open handles, closed with the last one.
///
/// The kernel refuses (EIO to the client) a passthrough open of an inode that has a
/// page-cached handle open, and the reverse; so every open of a file that may pass through
/// is decided here, under one lock, from what is open: an inode with a backing id in use
/// passes through, one with other handles open does not, and only one with neither gets a
/// new backing id. (The kernel forgets a handle before it sends its release, so this
/// bookkeeping is never behind the kernel's.)
#[derive(Default)]
pub struct Passthrough {
    /// Asked for (`passthrough=auto`), then cleared if the kernel or our privileges say no.
    enabled: AtomicBool,
    inodes: Mutex<HashMap<u64, InodeOpens>>,
    by_handle: Mutex<HashMap<u64, Arc<BackingId>>>,
    next_fh: AtomicU64,
    pub opens: AtomicU64,
}

/// How [`Passthrough::open`] serves an open.
pub(super) enum Decision {
    Pass(u64, Arc<BackingId>),
    /// Through the daemon; with the error of a backing registration that failed.
    Cached(Option<std::io::Error>),
    Refuse,
}

/// Open handles of one inode that may pass through.
#[derive(Default)]
struct InodeOpens {
    backing: Weak<BackingId>,
    /// Handles served through the daemon (page-cached).
    cached: u32,
}

impl Passthrough {
    pub fn new(wanted: bool) -> Self {
        // Handles of their own number range (the filesystem numbers status-file handles from 1).
        Passthrough { enabled: AtomicBool::new(wanted), next_fh: AtomicU64::new(1 << 62), ..Default::default() }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Whether `ino` has handles open through the daemon (a new backing is then of no use).
    pub(super) fn has_cached(&self, ino: u64) -> bool {
        self.inodes.lock().get(&ino).is_some_and(|o| o.cached > 0)
    }

    /// Decide how an open of `ino` is served, from what `found` says of its backing file:
    /// the inode's backing id in use passes through (still while passthrough is disabled:
    /// the kernel would refuse anything else), unless its file entry was just found damaged
    /// (refused: the kernel would serve the damaged file, the daemon may not serve it);
    /// with none, `found`'s file is registered if the inode has no handle through the
    /// daemon; else the open is served through the daemon and counted until its release.
    pub(super) fn open(&self, ino: u64, found: &Found, enabled: bool, reply: &ReplyOpen) -> Decision {
        let mut inodes = self.inodes.lock();
        let state = inodes.entry(ino).or_default();
        let id = match (state.backing.upgrade(), found) {
            (Some(_), Found::Corrupt) => return Decision::Refuse,
            (Some(id), _) => id,
            (None, Found::Backing(b)) if enabled && state.cached == 0 && b.file().is_some() => match b.file().map(|f| reply.open_backing(f)) {
                None => {
                    state.cached += 1;
                    return Decision::Cached(None);
                }
                Some(Ok(id)) => {
                    let id = Arc::new(id);
                    state.backing = Arc::downgrade(&id);
                    id
                }
                Some(Err(e)) => {
                    state.cached += 1;
                    return Decision::Cached(Some(e));
                }
            },
            _ => {
                state.cached += 1;
                return Decision::Cached(None);
            }
        };
        drop(inodes);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if self.opens.fetch_add(1, Ordering::Relaxed) == 0 {
            let what = match found {
                Found::Backing(Backing::Source(s)) => s.path().display().to_string(),
                _ => "a file entry of the disk cache".into(),
            };
            tracing::info!("passthrough: first open served from its backing file ({what})");
        }
        self.by_handle.lock().insert(fh, id.clone());
        Decision::Pass(fh, id)
    }

    /// Inodes whose backing id is in use.
    pub fn live_inodes(&self) -> Vec<u64> {
        self.inodes.lock().iter().filter(|(_, o)| o.backing.strong_count() > 0).map(|(i, _)| *i).collect()
    }

    /// Handle `fh` of `ino` is released; returns whether it was the inode's last handle
    /// served through the daemon.
    pub(super) fn release(&self, ino: u64, fh: u64) -> bool {
        if self.by_handle.lock().remove(&fh).is_some() {
            return false;
        }
        let mut inodes = self.inodes.lock();
        let Some(state) = inodes.get_mut(&ino) else { return false };
        if state.cached == 0 {
            return false;
        }
        state.cached -= 1;
        let last = state.cached == 0;
        if last && state.backing.strong_count() == 0 {
            inodes.remove(&ino);
        }
        last
    }

    pub(super) fn disable(&self, why: &str) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            tracing::warn!("FUSE passthrough unavailable ({why}): reads go through the daemon");
        }
    }
}
