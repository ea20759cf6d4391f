//! Single-flight, the one mechanism of the storage layer: one piece of work per key at a
//! time; whoever asks for a key while its work is in flight joins that flight instead of
//! repeating the work. The memory tier's loads ([`super::memory`]), the compute pool's jobs
//! ([`super::compute`]) and the tiers' queued prefetches ([`super::tiers`]) are each a
//! [`Flights`] map; they differ only in the state a flight carries (a load's result; a
//! job's priorities, waiters and write-behind; nothing) and in what its leader does.
//!
//! A flight is found by its key from the moment it starts until its leader lands it
//! ([`Flights::land`]); its state is behind its own lock, with a condition variable for
//! those who wait on it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};

/// One piece of work in flight: its key, and the state its leader and joiners share.
pub struct Flight<K, S> {
    pub key: K,
    state: Mutex<S>,
    cv: Condvar,
}

impl<K, S> Flight<K, S> {
    /// Its state, locked.
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.state.lock()
    }

    /// Wake everyone waiting on it (after changing its state).
    pub fn notify(&self) {
        self.cv.notify_all();
    }

    /// Wait (releasing the lock) until its state satisfies `done`; returns it locked.
    pub fn wait_until(&self, mut done: impl FnMut(&S) -> bool) -> MutexGuard<'_, S> {
        let mut st = self.state.lock();
        while !done(&st) {
            self.cv.wait(&mut st);
        }
        st
    }
}

/// How [`Flights::join`] went.
pub enum Joined<R, F> {
    /// What the caller looks for was found (under the map's lock): no flight.
    Found(R),
    /// A new flight: the caller leads it (does the work, then lands it).
    Leader(F),
    /// A flight already under way, joined.
    Joiner(F),
}

/// The flights in progress, by key.
pub struct Flights<K, S> {
    map: Mutex<HashMap<K, Arc<Flight<K, S>>>>,
}

impl<K, S> Default for Flights<K, S> {
    fn default() -> Self {
        Flights { map: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash + Copy, S> Flights<K, S> {
    /// The flight for `key`: joined if one is in flight, else `found()` if that finds what
    /// the caller wants (checked under the map's lock, so a flight that just landed its
    /// result is not started again), else a new one in state `start()`, led by the caller.
    pub fn join<R>(&self, key: K, found: impl FnOnce() -> Option<R>, start: impl FnOnce() -> S) -> Joined<R, Arc<Flight<K, S>>> {
        let mut map = self.map.lock();
        if let Some(f) = map.get(&key) {
            return Joined::Joiner(f.clone());
        }
        if let Some(r) = found() {
            return Joined::Found(r);
        }
        let f = Arc::new(Flight { key, state: Mutex::new(start()), cv: Condvar::new() });
        map.insert(key, f.clone());
        Joined::Leader(f)
    }

    /// The flight for `key`, if one is in flight.
    pub fn get(&self, key: &K) -> Option<Arc<Flight<K, S>>> {
        self.map.lock().get(key).cloned()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.map.lock().contains_key(key)
    }

    /// Flights in progress.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The flight `f` is over: no longer found by its key (a later flight of the same key
    /// is left alone).
    pub fn land(&self, f: &Arc<Flight<K, S>>) {
        let mut map = self.map.lock();
        if map.get(&f.key).is_some_and(|g| Arc::ptr_eq(g, f)) {
            map.remove(&f.key);
        }
    }

    /// The flight of `key` is over, whichever it is.
    pub fn land_key(&self, key: &K) {
        self.map.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_leader_per_key_until_it_lands() {
        let flights: Flights<u32, Option<u8>> = Flights::default();
        let Joined::Leader(f) = flights.join(1, || None::<()>, || None) else { panic!("first: leader") };
        assert!(matches!(flights.join(1, || Some(()), || None), Joined::Joiner(_)), "joined before found is asked");
        assert!(matches!(flights.join(2, || Some(7), || None), Joined::Found(7)));
        assert_eq!(flights.len(), 1);
        let waiter = {
            let f = f.clone();
            std::thread::spawn(move || *f.wait_until(|s| s.is_some()))
        };
        *f.lock() = Some(42);
        f.notify();
        assert_eq!(waiter.join().unwrap(), Some(42));
        flights.land(&f);
        assert!(flights.is_empty());
        // A later flight of the same key is not landed by an old one.
        let Joined::Leader(g) = flights.join(1, || None::<()>, || None) else { panic!("a new leader") };
        flights.land(&f);
        assert!(flights.contains(&1));
        flights.land(&g);
        assert!(!flights.contains(&1));
    }
}
