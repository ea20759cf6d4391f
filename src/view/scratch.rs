//! Scratch buffers for computations, reused: a computation's input or intermediate of a MiB
//! or more in a new buffer gets a fresh mapping whose pages fault on first write and is
//! unmapped after, a cost paid per chunk. The kt-int8 view decodes each matrix (up to 4
//! bytes per weight, 58 MB for a DeepSeek V4 expert) into one (a fresh zeroed buffer per job
//! was about a fifth of that view's time); the BF16 view reads each chunk's FP8 rows into one
//! (a new 1 MiB buffer per chunk was a sixth of the compute threads' time in a cold read).
//! Buffers go back to one process-wide pool that keeps at most [`KEEP_BYTES`]; what a
//! caller is handed holds old bytes, which it overwrites before reading them.

/// A pooled buffer, returned to its pool when dropped.
pub(crate) struct Scratch {
    v: Vec<f32>,
    pool: &'static Pool,
}

/// Buffers handed back, at most [`KEEP_BYTES`] of them.
pub(crate) struct Pool(parking_lot::Mutex<Vec<Vec<f32>>>);

static POOL: Pool = Pool::new();
const KEEP_BYTES: usize = 256 << 20;

impl Pool {
    const fn new() -> Pool {
        Pool(parking_lot::Mutex::new(Vec::new()))
    }

    /// A buffer of at least `n` f32 values (the smallest pooled one that fits, else a new one).
    fn take(&'static self, n: usize) -> Scratch {
        let mut pool = self.0.lock();
        let fit = pool.iter().enumerate().filter(|(_, v)| v.len() >= n).min_by_key(|(_, v)| v.len()).map(|(i, _)| i);
        let v = fit.map(|i| pool.swap_remove(i));
        drop(pool);
        Scratch { v: v.unwrap_or_else(|| vec![0f32; n]), pool: self }
    }
}

impl Scratch {
    /// A buffer of at least `n` f32 values from the process's pool.
    pub(crate) fn take(n: usize) -> Scratch {
        POOL.take(n)
    }

    /// A buffer of at least `n` bytes from the process's pool.
    pub(crate) fn take_bytes(n: usize) -> Scratch {
        POOL.take(n.div_ceil(4))
    }

    /// Its first `n` values (grown if needed).
    pub(crate) fn slice(&mut self, n: usize) -> &mut [f32] {
        if self.v.len() < n {
            self.v.resize(n, 0.0);
        }
        &mut self.v[..n]
    }

    /// Its first `n` bytes (grown if needed).
    pub(crate) fn bytes(&mut self, n: usize) -> &mut [u8] {
        let values = self.slice(n.div_ceil(4));
        &mut bytemuck::cast_slice_mut::<f32, u8>(values)[..n]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        let mut pool = self.pool.0.lock();
        let held: usize = pool.iter().map(|b| b.len() * 4).sum();
        if held + v.len() * 4 <= KEEP_BYTES {
            pool.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer handed back is handed out again (no fresh mapping per computation), one in
    /// use is never handed out twice, byte views have the length asked for, and the pool
    /// keeps no more than its bound.
    #[test]
    fn buffers_are_reused_never_shared_and_bounded() {
        let pool: &'static Pool = Box::leak(Box::new(Pool::new()));
        let n = 1 << 20;
        let mut a = pool.take(n);
        let first = a.bytes(4 * n).as_ptr() as usize;
        assert_eq!(a.bytes(4 * n - 3).len(), 4 * n - 3);
        let mut b = pool.take(n);
        assert_ne!(b.slice(n).as_ptr() as usize, first, "a buffer in use was handed out again");
        drop(a);
        let mut c = pool.take(n / 2);
        assert_eq!(c.slice(n / 2).as_ptr() as usize, first, "the returned buffer was not reused");
        drop((b, c));
        assert_eq!(pool.0.lock().len(), 2);
        // Over the bound: not kept.
        drop(pool.take(KEEP_BYTES / 4));
        assert_eq!(pool.0.lock().len(), 2);
    }
}
