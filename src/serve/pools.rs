//! The read pools: plain threads that serve reads the FUSE workers hand over, so a worker
//! goes back for the next request instead of holding its thread on the device (reads of
//! direct handles: clients' `O_DIRECT` ones, and the readahead of packs kept in the mount's
//! page cache) or on a chunk being loaded or computed, or on a remote source's part being
//! fetched (reads that would wait).

use std::sync::Arc;

use parking_lot::Mutex;

/// Threads that serve reads waiting for chunks or the network: one per read the kernel may
/// keep in flight (16 readahead requests by default, plus the clients' own reads). Mounts of
/// remote files let the kernel keep 64 readahead requests in flight and still get 32: 80
/// threads showed no gain, for 64 remote objects read at once or for the pack.
pub const WAITING_THREADS: usize = 32;

/// Threads that serve reads handed over by the FUSE workers: one pool for reads of direct
/// handles, another for reads that wait for a chunk (threads named `xpackfs-dio-N` and
/// `xpackfs-wait-N`). A direct read holds its thread on the device for the whole request,
/// so the FUSE worker hands it over and goes back for the next request: the requests of one client `preadv` (async direct I/O sends them at once)
/// and of its concurrent readers (or the kernel's readahead requests of a pack) reach the
/// device together, as a local reader's do, while other reads stay on the few FUSE workers.
///
/// Plain threads taking jobs from one queue, not a work-stealing pool: a read may wait for
/// a chunk another read is computing, and a thread of a work-stealing pool that waits inside
/// its own computation's parallel loop can pick up, and block on, the very read that waits
/// for it.
pub struct ReadPool {
    queue: Mutex<std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>>,
}

impl ReadPool {
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        if let Err(std::sync::mpsc::SendError(job)) = self.queue.lock().send(Box::new(job)) {
            job(); // the threads are gone (shutting down): serve it here
        }
    }
}

/// A pool of `threads` threads named `xpackfs-{name}-N`; `threads == 0`: no pool (the reads
/// stay on the FUSE worker).
pub fn read_pool(name: &str, threads: usize) -> std::io::Result<Option<Arc<ReadPool>>> {
    if threads == 0 {
        return Ok(None);
    }
    let (tx, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..threads {
        let rx = rx.clone();
        std::thread::Builder::new().name(format!("xpackfs-{name}-{i}")).spawn(move || {
            loop {
                let job = rx.lock().recv();
                match job {
                    Ok(job) => job(),
                    Err(_) => return,
                }
            }
        })?;
    }
    Ok(Some(Arc::new(ReadPool { queue: Mutex::new(tx) })))
}
