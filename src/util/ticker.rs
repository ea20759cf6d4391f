//! A background thread that runs a function at an interval until it is dropped (progress
//! bars and log lines of long commands). Dropping it wakes the thread at once and runs the
//! function a last time: a command that ends does not wait out the thread's interval (a
//! sleeping progress thread added 0-200 ms to the end of every `materialize`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Run `tick` every `every` on a thread of its own, and at least once after the drop
    /// begins (the last tick sees the final state).
    pub fn start(every: Duration, mut tick: impl FnMut() + Send + 'static) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("xpackfs-progress".into())
                .spawn(move || {
                    // park_timeout may return early (an unpark, or spuriously): a tick is then
                    // early, never late.
                    loop {
                        let last = stop.load(Ordering::Acquire);
                        if !last {
                            std::thread::park_timeout(every);
                        }
                        tick();
                        if last {
                            break;
                        }
                    }
                })
                .map_err(|e| tracing::warn!("no progress thread: {e}"))
                .ok()
        };
        Ticker { stop, thread }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    #[test]
    fn it_ticks_and_a_drop_ends_it_at_once_after_a_last_tick() {
        let n = Arc::new(AtomicU64::new(0));
        let t = {
            let n = n.clone();
            Ticker::start(Duration::from_millis(10), move || {
                n.fetch_add(1, Ordering::Relaxed);
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while n.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "no ticks");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(t);
        // An hour's interval: the drop must not wait for it.
        let n = Arc::new(AtomicU64::new(0));
        let t = {
            let n = n.clone();
            Ticker::start(Duration::from_secs(3600), move || {
                n.fetch_add(1, Ordering::Relaxed);
            })
        };
        let started = Instant::now();
        drop(t);
        assert!(started.elapsed() < Duration::from_secs(60), "the drop waited for the interval");
        assert!(n.load(Ordering::Relaxed) >= 1, "no tick after the drop began");
    }
}
