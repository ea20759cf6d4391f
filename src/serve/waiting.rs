//! Threads that serve reads which wait for a chunk (loaded from the disk cache or computed on
//! the compute pool), so FUSE workers stay free for metadata, status files and bytes that
//! are ready. They only block: plain threads on a channel, not a rayon pool (whose idle
//! workers spin, taking CPU from the computation they wait for).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use parking_lot::Mutex;

type Task = Box<dyn FnOnce() + Send>;

/// A fixed set of threads running queued tasks in order.
pub struct WaitingPool {
    tx: Mutex<Sender<Task>>,
}

impl WaitingPool {
    /// `threads` threads; enough for every read the kernel keeps in flight (its readahead
    /// requests plus the clients' own reads), more queue here.
    pub fn new(threads: usize) -> std::io::Result<WaitingPool> {
        let (tx, rx) = channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx: Arc<Mutex<Receiver<Task>>> = rx.clone();
            std::thread::Builder::new().name(format!("xpackfs-wait-{i}")).spawn(move || {
                loop {
                    let task = rx.lock().recv();
                    match task {
                        Ok(task) => task(),
                        Err(_) => return,
                    }
                }
            })?;
        }
        Ok(WaitingPool { tx: Mutex::new(tx) })
    }

    /// Run `task` on one of the threads (here, if they are gone).
    pub fn spawn(&self, task: impl FnOnce() + Send + 'static) {
        if let Err(e) = self.tx.lock().send(Box::new(task)) {
            (e.0)();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_while_others_block() {
        let pool = WaitingPool::new(2).unwrap();
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        pool.spawn(move || {
            let _ = gate_rx.recv();
        });
        let (tx, rx) = std::sync::mpsc::channel();
        pool.spawn(move || tx.send(7).unwrap());
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(60)), Ok(7), "a task behind a blocked one");
        gate_tx.send(()).unwrap();
    }
}
