//! A background thread that runs a function at an interval until it is dropped, and the
//! progress display of long commands built on it ([`Shown`]: a bar on a terminal, else a
//! log line every 10 s). Dropping it wakes the thread at once and runs the function a last
//! time: a command that ends does not wait out the thread's interval (a sleeping progress
//! thread added 0-200 ms to the end of every `materialize`).

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

/// Progress of a long command (`materialize`, `warm`): a bar on a terminal, else a log
/// line every 10 s with the rate and the time left, until dropped.
pub struct Shown {
    ticker: Option<Ticker>,
    bar: Option<indicatif::ProgressBar>,
}

impl Shown {
    /// Show `done()` bytes of `total` for the command `what` (a bar if `bar`, else log lines).
    pub fn start(what: &'static str, total: u64, bar: bool, done: impl Fn() -> u64 + Send + 'static) -> Shown {
        let bar = bar.then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(&format!("{what} {{bar:40}} {{bytes}}/{{total_bytes}} {{binary_bytes_per_sec}} eta {{eta}}"))
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        let ticker = {
            let bar = bar.clone();
            let (started, mut last) = (std::time::Instant::now(), std::time::Instant::now());
            Ticker::start(Duration::from_millis(200), move || {
                let d = done();
                match &bar {
                    Some(b) => b.set_position(d),
                    None if last.elapsed().as_secs() >= 10 => {
                        last = std::time::Instant::now();
                        let rate = d as f64 / started.elapsed().as_secs_f64().max(1e-9);
                        let eta = if rate > 0.0 { (total - d.min(total)) as f64 / rate } else { 0.0 };
                        tracing::info!("{what}: {d}/{total} bytes ({:.0} MB/s, eta {eta:.0}s)", rate / 1e6);
                    }
                    None => {}
                }
            })
        };
        Shown { ticker: Some(ticker), bar }
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        drop(self.ticker.take());
        if let Some(b) = &self.bar {
            b.finish_and_clear();
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
