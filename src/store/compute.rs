//! The compute pool: where chunks are computed, on two bounded pools of their own, off the
//! threads that serve reads.
//!
//! [`ComputePool`] runs chunk computations ("jobs") on two rayon pools: `read` for chunks
//! a reader waits for (and a reader's read-ahead), and `background` (niced, idle I/O
//! class) for warming and prewarming, so background work yields the CPU to reads at once.
//! Jobs are single-flight per key ([`super::flight`]): a second request for a key joins the
//! first. A read that
//! joins a background job promotes it (a job still queued also gets a run on the read pool;
//! one already running gets a second, hedging run there; the first result wins, the other is
//! dropped), so a reader never waits behind background work. A reader waits only for its own
//! chunk; nested parallelism in a job (`par_iter`) stays on the job's pool. A job may be
//! called more than once (hedging): it must be a pure function of what it captures.
//!
//! The pool knows nothing of the memory and disk tiers in front of it ([`super::tiers`])
//! beyond the write-behind a request hands it, run on the computing thread once the job's
//! waiters are woken.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::Panicked;
use super::disk::DiskKey;
use super::flight::{self, Flights, Joined};

/// What one job computes: its chunks, in order.
pub type Parts = Arc<[Arc<[u8]>]>;
/// A job's result as every waiter sees it.
pub type Outcome<E> = Result<Parts, Arc<E>>;
pub type Job<E> = Arc<dyn Fn() -> Result<Parts, E> + Send + Sync>;
/// Run once with a job's parts after its waiters were woken (write-behind); the flag says
/// whether a read-priority request joined it.
pub type After = Box<dyn FnOnce(&Parts, bool) + Send>;
type Done<E> = Box<dyn FnOnce(&Outcome<E>) + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Priority {
    /// A reader waits for it, or will soon (its read-ahead); also `warm` at full speed.
    Read,
    /// Work no reader waits for (prewarm, `warm --nice`): yields to reads.
    Background,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Threads of each of the two pools (default: the CPU count).
    pub threads: usize,
    /// Niceness added to the read pool's threads.
    pub read_nice: i32,
    /// Niceness added to the background pool's threads.
    pub background_nice: i32,
    /// Background threads use the idle I/O scheduling class.
    pub background_idle_io: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        PoolConfig { threads, read_nice: 0, background_nice: 19, background_idle_io: true }
    }
}

#[derive(Debug, Default)]
pub struct PoolStats {
    pub runs_read: AtomicU64,
    pub runs_background: AtomicU64,
    /// Requests that joined a job already in flight.
    pub joined: AtomicU64,
    /// Background jobs still queued when a read needed them: run on the read pool.
    pub promoted: AtomicU64,
    /// Background jobs already running when a read needed them: run again on the read pool.
    pub hedged: AtomicU64,
    /// Runs whose result came second (hedging) and was dropped.
    pub wasted: AtomicU64,
    pub failed: AtomicU64,
    pub panics: AtomicU64,
    /// How long each run took (wasted ones included: they used the core all the same).
    pub run_latency: crate::metrics::Latency,
}

struct State<E> {
    job: Job<E>,
    outcome: Option<Outcome<E>>,
    /// The highest priority a run has started at.
    running: Option<Priority>,
    read_scheduled: bool,
    read_joined: bool,
    /// The outcome is known and the write-behind done.
    settled: bool,
    after: Option<After>,
    done: Vec<Done<E>>,
}

type Flight<E> = flight::Flight<DiskKey, State<E>>;

struct Shared<E> {
    flights: Flights<DiskKey, State<E>>,
    stats: PoolStats,
}

/// Two bounded pools with single-flight per key; see the module documentation.
pub struct ComputePool<E> {
    read: rayon::ThreadPool,
    background: rayon::ThreadPool,
    shared: Arc<Shared<E>>,
}

impl<E> std::fmt::Debug for ComputePool<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputePool").field("threads", &self.read.current_num_threads()).field("in_flight", &self.in_flight()).finish()
    }
}

/// Lower the calling thread's CPU priority by `nice` and optionally put it in the idle I/O
/// class (both are per thread on Linux).
pub(crate) fn deprioritise_this_thread(nice: i32, idle_io: bool) {
    if nice > 0 {
        // SAFETY: nice() only changes the calling thread's niceness; errors are harmless.
        unsafe { libc::nice(nice) };
    }
    if idle_io {
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_IDLE: libc::c_long = 3;
        // SAFETY: ioprio_set with who = 0 changes the calling thread's I/O priority only.
        unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0 as libc::c_long, IOPRIO_CLASS_IDLE << 13) };
    }
}

fn build_pool(name: &'static str, threads: usize, nice: i32, idle_io: bool) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(move |i| format!("{name}-{i}"))
        .start_handler(move |_| deprioritise_this_thread(nice, idle_io))
        .build()
}

impl<E> ComputePool<E> {
    pub fn stats(&self) -> &PoolStats {
        &self.shared.stats
    }

    /// Jobs queued or running.
    pub fn in_flight(&self) -> usize {
        self.shared.flights.len()
    }

    pub fn threads(&self) -> usize {
        self.read.current_num_threads()
    }
}

impl<E: From<Panicked> + Send + Sync + 'static> ComputePool<E> {
    pub fn new(cfg: &PoolConfig) -> Result<Self, rayon::ThreadPoolBuildError> {
        Ok(ComputePool {
            read: build_pool("xpackfs-compute", cfg.threads, cfg.read_nice, false)?,
            background: build_pool("xpackfs-background", cfg.threads, cfg.background_nice, cfg.background_idle_io)?,
            shared: Arc::new(Shared { flights: Flights::default(), stats: PoolStats::default() }),
        })
    }

    /// Run `f` on one of the pool's threads (its `par_iter`s on that pool) and wait: `warm`
    /// and `materialize` drive their parallel loops this way, so the jobs they request run
    /// inline on the thread that asks.
    pub fn install<R: Send>(&self, prio: Priority, f: impl FnOnce() -> R + Send) -> R {
        self.pool(prio).install(f)
    }

    fn pool(&self, prio: Priority) -> &rayon::ThreadPool {
        match prio {
            Priority::Read => &self.read,
            Priority::Background => &self.background,
        }
    }

    fn on_pool_thread(&self) -> Option<Priority> {
        if self.read.current_thread_index().is_some() {
            Some(Priority::Read)
        } else if self.background.current_thread_index().is_some() {
            Some(Priority::Background)
        } else {
            None
        }
    }

    /// The job for `key` (joining one in flight, else starting `job` at `prio`), waited for.
    /// Called from one of the pool's own threads, it runs the job there instead of queueing
    /// it behind itself, and the job is in flight at that thread's priority, whatever `prio`
    /// asked: a reader that comes to wait for a job a background thread runs hedges it.
    pub fn get(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>) -> Outcome<E> {
        self.wait(key, prio, job, after, false)
    }

    /// Like [`ComputePool::get`], and waits for the write-behind too (`warm`: an entry is
    /// on disk when it returns).
    pub fn get_settled(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>) -> Outcome<E> {
        self.wait(key, prio, job, after, true)
    }

    fn wait(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>, settled: bool) -> Outcome<E> {
        let inline = self.on_pool_thread();
        // The priority the job runs at here, if it runs here.
        let f = self.submit(key, inline.unwrap_or(prio), job, after, inline.is_none());
        if let Some(p) = inline {
            run(&self.shared, &f, p);
        }
        let st = f.wait_until(|st| st.outcome.is_some() && (st.settled || !settled));
        st.outcome.clone().unwrap()
    }

    /// Like [`ComputePool::get`] without waiting: `done` gets the outcome (on a pool
    /// thread, or here if it is already known).
    pub fn request(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>, done: impl FnOnce(&Outcome<E>) + Send + 'static) {
        let f = self.submit(key, prio, job, after, true);
        let mut st = f.lock();
        match st.outcome.clone() {
            Some(o) => {
                drop(st);
                done(&o);
            }
            None => st.done.push(Box::new(done)),
        }
    }

    /// Whether a job for `key` is queued or running.
    pub fn is_in_flight(&self, key: &DiskKey) -> bool {
        self.shared.flights.contains(key)
    }

    /// If a background job for `key` is in flight, give it a run at read priority (a reader
    /// is about to wait for it, perhaps through another cache's single-flight).
    pub fn promote(&self, key: &DiskKey) {
        if let Some(f) = self.shared.flights.get(key) {
            self.want_read(&f);
        }
    }

    fn submit(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>, schedule: bool) -> Arc<Flight<E>> {
        let start = || State {
            job: job.clone(),
            outcome: None,
            running: None,
            read_scheduled: prio == Priority::Read,
            read_joined: false,
            settled: false,
            after,
            done: Vec::new(),
        };
        let f = match self.shared.flights.join(key, || None::<std::convert::Infallible>, start) {
            Joined::Leader(f) => f,
            Joined::Joiner(f) => {
                self.shared.stats.joined.fetch_add(1, Relaxed);
                if prio == Priority::Read {
                    self.want_read(&f);
                }
                return f;
            }
            Joined::Found(nothing) => match nothing {},
        };
        if schedule {
            self.spawn(&f, prio);
        }
        f
    }

    fn want_read(&self, f: &Arc<Flight<E>>) {
        let mut st = f.lock();
        st.read_joined = true;
        if st.outcome.is_some() || st.read_scheduled {
            return;
        }
        st.read_scheduled = true;
        let stat = if st.running.is_some() { &self.shared.stats.hedged } else { &self.shared.stats.promoted };
        stat.fetch_add(1, Relaxed);
        drop(st);
        self.spawn(f, Priority::Read);
    }

    fn spawn(&self, f: &Arc<Flight<E>>, prio: Priority) {
        let (shared, f) = (self.shared.clone(), f.clone());
        self.pool(prio).spawn_fifo(move || run(&shared, &f, prio));
    }
}

/// One run of a flight's job at `prio`, unless it is done or already running at `prio` or
/// higher.
fn run<E: From<Panicked> + Send + Sync + 'static>(shared: &Shared<E>, f: &Arc<Flight<E>>, prio: Priority) {
    let job = {
        let mut st = f.lock();
        let go = st.outcome.is_none()
            && match st.running {
                None => true,
                Some(Priority::Background) => prio == Priority::Read,
                Some(Priority::Read) => false,
            };
        if !go {
            return;
        }
        st.running = Some(prio);
        st.job.clone()
    };
    let stat = if prio == Priority::Read { &shared.stats.runs_read } else { &shared.stats.runs_background };
    stat.fetch_add(1, Relaxed);
    let started = std::time::Instant::now();
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job()));
    shared.stats.run_latency.record(started.elapsed().as_micros() as u64);
    let out = match out {
        Ok(Ok(parts)) => Ok(parts),
        Ok(Err(e)) => {
            shared.stats.failed.fetch_add(1, Relaxed);
            Err(Arc::new(e))
        }
        Err(panic) => {
            shared.stats.panics.fetch_add(1, Relaxed);
            let msg = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            Err(Arc::new(E::from(Panicked(msg))))
        }
    };
    let (done, after, read_joined) = {
        let mut st = f.lock();
        if st.outcome.is_some() {
            shared.stats.wasted.fetch_add(1, Relaxed);
            return;
        }
        st.outcome = Some(out.clone());
        f.notify();
        (std::mem::take(&mut st.done), st.after.take(), st.read_joined)
    };
    for d in done {
        d(&out);
    }
    if let (Ok(parts), Some(after)) = (&out, after) {
        // Write-behind. Until it is done the flight stays findable (with its outcome), so
        // nobody recomputes a chunk that is on its way into the caches.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| after(parts, read_joined))).is_err() {
            tracing::error!("write-behind of a computed chunk panicked");
        }
    }
    f.lock().settled = true;
    f.notify();
    shared.flights.land(f);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::disk::KeyBuilder;
    use crate::store::error::TestError;
    use parking_lot::{Condvar, Mutex};
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A latch the tests open when they are ready.
    #[derive(Default)]
    pub(crate) struct Gate(Mutex<bool>, Condvar);
    impl Gate {
        pub(crate) fn open(&self) {
            *self.0.lock() = true;
            self.1.notify_all();
        }
        pub(crate) fn wait(&self) {
            let mut g = self.0.lock();
            while !*g {
                self.1.wait(&mut g);
            }
        }
    }

    pub(crate) fn key(i: u64) -> DiskKey {
        KeyBuilder::new("compute-test").producer().chunk(i)
    }

    pub(crate) fn pool(threads: usize) -> Arc<ComputePool<TestError>> {
        Arc::new(ComputePool::new(&PoolConfig { threads, ..PoolConfig::default() }).unwrap())
    }

    pub(crate) fn bytes(v: &[u8]) -> Parts {
        Arc::from([Arc::<[u8]>::from(v)])
    }

    pub(crate) fn job(f: impl Fn() -> Result<Parts, TestError> + Send + Sync + 'static) -> Job<TestError> {
        Arc::new(f)
    }

    /// Run `f` on a thread and fail (instead of hanging) if it does not finish in time.
    pub(crate) fn within<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what}: still waiting after 60 s"))
    }

    pub(crate) fn settle(p: &ComputePool<TestError>) {
        let t = std::time::Instant::now();
        while p.in_flight() > 0 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(p.in_flight(), 0);
    }

    pub(crate) fn on_background_thread() -> bool {
        std::thread::current().name().is_some_and(|n| n.starts_with("xpackfs-background"))
    }

    #[test]
    fn one_computation_per_key_shared_by_every_waiter() {
        let p = pool(2);
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            std::thread::sleep(Duration::from_millis(50));
            Ok(bytes(b"chunk"))
        });
        let results: Vec<Parts> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| p.get(key(1), Priority::Read, &j, None).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(calls.load(Relaxed), 1);
        assert!(results.iter().all(|r| Arc::ptr_eq(r, &results[0]) && &*r[0] == b"chunk"));
        assert!(p.stats().joined.load(Relaxed) >= 1);
        settle(&p);
        // The one run, timed: its 50 ms fall in the bucket up to 2^16 us.
        assert_eq!(p.stats().run_latency.quantile(1.0), 1 << 16);
    }

    #[test]
    fn errors_and_panics_reach_every_waiter_and_are_not_kept() {
        let p = pool(2);
        let e = p.get(key(1), Priority::Read, &job(|| Err(TestError::Failed("t: bad".into()))), None).unwrap_err();
        assert!(matches!(&*e, TestError::Failed(why) if why == "t: bad"));
        settle(&p);
        let e = p.get(key(1), Priority::Background, &job(|| panic!("boom")), None).unwrap_err();
        assert!(e.to_string().contains("panicked: boom"), "{e}");
        settle(&p);
        assert_eq!(&*p.get(key(1), Priority::Read, &job(|| Ok(bytes(b"ok"))), None).unwrap()[0], b"ok");
        assert_eq!((p.stats().failed.load(Relaxed), p.stats().panics.load(Relaxed)), (1, 1));
    }

    #[test]
    fn reads_do_not_wait_behind_background_work() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        for i in 0..6 {
            let g = gate.clone();
            p.request(
                key(100 + i),
                Priority::Background,
                &job(move || {
                    g.wait();
                    Ok(bytes(b"slow"))
                }),
                None,
                |_| {},
            );
        }
        let p2 = p.clone();
        let got = within("a read behind six blocked background jobs", move || p2.get(key(1), Priority::Read, &job(|| Ok(bytes(b"fast"))), None));
        assert_eq!(&*got.unwrap()[0], b"fast");
        gate.open();
        settle(&p);
    }

    #[test]
    fn a_read_promotes_a_queued_background_job() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        for i in 0..2 {
            let g = gate.clone();
            p.request(
                key(100 + i),
                Priority::Background,
                &job(move || {
                    g.wait();
                    Ok(bytes(b"blocker"))
                }),
                None,
                |_| {},
            );
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            Ok(bytes(b"wanted"))
        });
        p.request(key(1), Priority::Background, &j, None, |_| {}); // queued behind the blockers
        let (p2, j2) = (p.clone(), j.clone());
        let got = within("a read of a queued background job", move || p2.get(key(1), Priority::Read, &j2, None));
        assert_eq!(&*got.unwrap()[0], b"wanted");
        assert_eq!(p.stats().promoted.load(Relaxed), 1);
        gate.open();
        settle(&p);
        assert_eq!(calls.load(Relaxed), 1, "the queued background run must not run again");
    }

    #[test]
    fn a_read_hedges_a_running_background_job() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        let started = Arc::new(Gate::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let (g, s, c) = (gate.clone(), started.clone(), calls.clone());
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            if on_background_thread() {
                s.open();
                g.wait();
                return Ok(bytes(b"late"));
            }
            Ok(bytes(b"hedged"))
        });
        p.request(key(1), Priority::Background, &j, None, |_| {});
        started.wait();
        let (p2, j2) = (p.clone(), j.clone());
        let got = within("a read of a running background job", move || p2.get(key(1), Priority::Read, &j2, None));
        assert_eq!(&*got.unwrap()[0], b"hedged");
        assert_eq!(p.stats().hedged.load(Relaxed), 1);
        gate.open();
        let t = std::time::Instant::now();
        while p.stats().wasted.load(Relaxed) == 0 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!((calls.load(Relaxed), p.stats().wasted.load(Relaxed)), (2, 1));
    }

    /// Defect of issue 23: a pool thread that ran a job inline recorded it at the priority
    /// asked for, not the one it ran at; a background thread asking at read priority (a
    /// file entry written during a prewarm, through a producer that asked at read priority)
    /// left a later reader waiting behind niced work instead of hedging it.
    #[test]
    fn a_job_run_inline_on_a_background_thread_is_hedged_by_a_read() {
        let p = pool(2);
        let (gate, started) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
        let calls = Arc::new(AtomicUsize::new(0));
        let (g, s, c) = (gate.clone(), started.clone(), calls.clone());
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            if on_background_thread() {
                s.open();
                g.wait();
                return Ok(bytes(b"late"));
            }
            Ok(bytes(b"hedged"))
        });
        let (p2, j2) = (p.clone(), j.clone());
        let inline = std::thread::spawn(move || p2.install(Priority::Background, || p2.get(key(1), Priority::Read, &j2, None).map(|v| v[0].to_vec())));
        started.wait();
        let (p2, j2) = (p.clone(), j.clone());
        let got = within("a read of a job a background thread runs inline", move || p2.get(key(1), Priority::Read, &j2, None));
        assert_eq!(&*got.unwrap()[0], b"hedged");
        assert_eq!(p.stats().hedged.load(Relaxed), 1);
        assert_eq!(p.stats().runs_background.load(Relaxed), 1, "the inline run counts as background");
        gate.open();
        assert_eq!(inline.join().unwrap().unwrap(), b"hedged", "the first result wins for every waiter");
        settle(&p);
        assert_eq!(calls.load(Relaxed), 2);
    }

    #[test]
    fn write_behind_runs_once_after_waiters_are_woken() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        let (afters, calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let c = calls.clone();
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            Ok(bytes(b"x"))
        });
        let after = |g: Arc<Gate>, a: Arc<AtomicUsize>| -> After {
            Box::new(move |_, _| {
                g.wait();
                a.fetch_add(1, Relaxed);
            })
        };
        let (p2, j2, a) = (p.clone(), j.clone(), after(gate.clone(), afters.clone()));
        within("a waiter while the write-behind is blocked", move || p2.get(key(1), Priority::Read, &j2, Some(a))).unwrap();
        // While the write-behind runs, the key is not computed again.
        let (p2, j2, a) = (p.clone(), j.clone(), after(gate.clone(), afters.clone()));
        within("a second request during the write-behind", move || p2.get(key(1), Priority::Read, &j2, Some(a))).unwrap();
        assert_eq!(calls.load(Relaxed), 1);
        gate.open();
        settle(&p);
        assert_eq!(afters.load(Relaxed), 1, "a joiner's write-behind is not run again");
    }

    #[test]
    fn requests_call_back_and_nested_gets_run_inline() {
        let p = pool(1);
        let (tx, rx) = std::sync::mpsc::channel();
        p.request(key(1), Priority::Read, &job(|| Ok(bytes(b"cb"))), None, move |o| tx.send(o.as_ref().map(|v| v[0].to_vec()).ok()).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)).unwrap().unwrap(), b"cb");
        // A job that needs another key, on a one-thread pool: run inline, not queued behind itself.
        let inner = p.clone();
        let outer = job(move || {
            let v = inner.get(key(3), Priority::Read, &job(|| Ok(bytes(b"inner"))), None).map_err(TestError::Shared)?;
            Ok(bytes(&[&v[0][..], b"+outer"].concat()))
        });
        let p2 = p.clone();
        let got = within("a nested get on a one-thread pool", move || p2.get(key(2), Priority::Read, &outer, None));
        assert_eq!(&*got.unwrap()[0], b"inner+outer");
    }

    #[test]
    fn background_threads_run_niced() {
        let p = pool(1);
        let nice = || {
            // SAFETY: getpriority has no memory preconditions; who = 0 is the calling thread.
            let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            Ok(bytes(&n.to_le_bytes()))
        };
        let read = p.get(key(1), Priority::Read, &job(nice), None).unwrap();
        let bg = p.get(key(2), Priority::Background, &job(nice), None).unwrap();
        let n = |v: &Parts| i32::from_le_bytes(v[0][..4].try_into().unwrap());
        assert!(n(&bg) >= (n(&read) + 19).min(19), "background nice {} vs read {}", n(&bg), n(&read));
    }
}
