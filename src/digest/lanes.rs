//! Many sha256 streams at once: the multi-buffer engine of the digest pass.
//!
//! One sha256 stream is a chain of dependent block compressions, so a core hashes one
//! stream at the speed of its SHA extensions (about 1.3 GB/s here, the same as OpenSSL).
//! The digest pass needs far more hashing than one stream (every expert byte goes into the
//! source's, its tensor's and its slice's digest), but the tensor and slice digests are
//! many independent streams. With AVX-512, sixteen of them advance together, one per
//! 32-bit lane, through exactly the FIPS 180-4 round function ([`compress16`]): about 1.9x
//! the SHA extensions' bytes per core on this machine. Without AVX-512 (or with
//! `XPACKFS_SIMD` below avx512) each stream runs on `sha2`'s own compression (SHA
//! extensions where the CPU has them), so the engine is the same and only the speed differs.
//!
//! [`Engine`] runs [`Job`]s: a byte range of a source file hashed as one stream, and
//! optionally also cut into equal slices each hashed as its own stream. Both streams of a
//! job read the same buffer (one `pread` per buffer, never a copy per hash), and a stream
//! keeps its lane until it ends, so lanes change state only at stream ends and refills.
//! The last partial block and the padding are done per stream with `sha2`'s compression.
//! The tests check every digest against `sha2` for lengths and slice sizes around every
//! block boundary, at both kernels.

use std::sync::Arc;

use sha2::block_api::compress256;

use crate::source::{SourceError, SourceFile};
use crate::util::hex;

/// Lanes of the widest kernel.
pub const LANES: usize = 16;
/// Bytes read per job buffer refill.
const BUF: usize = 1 << 20;
/// The sha256 initial hash value.
const IV: [u32; 8] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

/// Lane states, word-major: `words[i][lane]` is word `i` of that lane's state (the layout
/// the 16-lane kernel loads directly).
type States = [[u32; LANES]; 8];

/// Which compression runs the lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `sha2`'s compression, one stream after another.
    Scalar,
    /// Sixteen streams per AVX-512 instruction.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The best kernel the CPU has at the process's SIMD level (`XPACKFS_SIMD`).
    pub fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if crate::codec::simd::level() >= crate::codec::simd::Level::Avx512
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            return Kernel::Avx512;
        }
        Kernel::Scalar
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "sha2",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => "avx512x16",
        }
    }

    /// Compress `n` consecutive 64-byte blocks starting at `ptrs[l]` into lane `l`'s state,
    /// for every lane in `active`.
    ///
    /// # Safety
    /// For every active lane, `ptrs[l]` must be valid for reads of `64 * n` bytes. Inactive
    /// lanes' pointers must be valid for reads of 64 bytes (their states are left alone).
    unsafe fn run(self, states: &mut States, ptrs: &[*const u8; LANES], active: u16, n: usize) {
        match self {
            Kernel::Scalar => {
                for (l, &p) in ptrs.iter().enumerate() {
                    if active & (1 << l) == 0 {
                        continue;
                    }
                    // SAFETY: the caller guarantees `64 * n` readable bytes at `p` for an active
                    // lane; `[u8; 64]` has alignment 1.
                    let blocks = unsafe { std::slice::from_raw_parts(p.cast::<[u8; 64]>(), n) };
                    let mut s: [u32; 8] = std::array::from_fn(|i| states[i][l]);
                    compress256(&mut s, blocks);
                    for (i, w) in s.into_iter().enumerate() {
                        states[i][l] = w;
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                // SAFETY: this kernel is only chosen when the CPU has AVX-512 F and BW
                // (`best`, or the tests' `available`); the caller guarantees the pointers.
                unsafe { x86::run16(states, ptrs, active, n) }
            }
        }
    }

    /// The kernels this CPU can run (for tests and benches).
    pub fn available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
            v.push(Kernel::Avx512);
        }
        v
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{LANES, States};

    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
        0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
        0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ];

    /// Lanes whose bit is clear in `active` keep their state (their pointers are read but
    /// their results are discarded).
    ///
    /// # Safety
    /// AVX-512 F and BW must be available; pointers as [`super::Kernel::run`] says.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn run16(states: &mut States, ptrs: &[*const u8; LANES], active: u16, n: usize) {
        // SAFETY: `States` is 8 rows of 16 u32, each exactly one 512-bit vector; unaligned loads.
        let mut st: [__m512i; 8] = std::array::from_fn(|i| unsafe { _mm512_loadu_si512(states[i].as_ptr().cast()) });
        let mut p = *ptrs;
        for _ in 0..n {
            // SAFETY: every pointer is valid for this block (caller), AVX-512 is present.
            let next = unsafe { compress16(&st, &p) };
            for (s, x) in st.iter_mut().zip(next) {
                *s = _mm512_mask_mov_epi32(*s, active, x);
            }
            for (l, q) in p.iter_mut().enumerate() {
                if active & (1 << l) != 0 {
                    // SAFETY: stays within (or one past) the caller's `64 * n` readable bytes.
                    *q = unsafe { q.add(64) };
                }
            }
        }
        for (row, s) in states.iter_mut().zip(st) {
            // SAFETY: as the loads above.
            unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), s) };
        }
    }

    /// One sha256 block compression for each of 16 lanes: lane `l` compresses the 64 bytes
    /// at `ptrs[l]` into its state (`state[i]` holds word `i` of every lane).
    ///
    /// # Safety
    /// AVX-512 F and BW must be available; each pointer must be valid for 64 bytes.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn compress16(state: &[__m512i; 8], ptrs: &[*const u8; LANES]) -> [__m512i; 8] {
        // Big-endian words: reverse the bytes of every 32-bit word.
        let bswap = _mm512_set_epi8(
            12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6,
            7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3,
        );
        // SAFETY: each pointer is valid for 64 bytes (caller); unaligned load.
        let rows: [__m512i; 16] = std::array::from_fn(|l| _mm512_shuffle_epi8(unsafe { _mm512_loadu_si512(ptrs[l].cast()) }, bswap));
        let mut w = transpose16(rows);
        let add = |a: __m512i, b: __m512i| _mm512_add_epi32(a, b);
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *state;
        macro_rules! round {
            ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident, $f:ident, $g:ident, $h:ident, $t:expr) => {{
                let t: usize = $t;
                if t >= 16 {
                    // W[t] = σ1(W[t-2]) + W[t-7] + σ0(W[t-15]) + W[t-16], in a ring of 16.
                    let w15 = w[(t + 1) & 15];
                    let w2 = w[(t + 14) & 15];
                    let s0 = _mm512_ternarylogic_epi32::<0x96>(_mm512_ror_epi32::<7>(w15), _mm512_ror_epi32::<18>(w15), _mm512_srli_epi32::<3>(w15));
                    let s1 = _mm512_ternarylogic_epi32::<0x96>(_mm512_ror_epi32::<17>(w2), _mm512_ror_epi32::<19>(w2), _mm512_srli_epi32::<10>(w2));
                    w[t & 15] = add(add(w[t & 15], s0), add(s1, w[(t + 9) & 15]));
                }
                let s1 = _mm512_ternarylogic_epi32::<0x96>(_mm512_ror_epi32::<6>($e), _mm512_ror_epi32::<11>($e), _mm512_ror_epi32::<25>($e));
                // Ch(e, f, g) = (e & f) ^ (!e & g); Maj(a, b, c) = majority.
                let ch = _mm512_ternarylogic_epi32::<0xCA>($e, $f, $g);
                let t1 = add(add($h, s1), add(ch, add(_mm512_set1_epi32(K[t] as i32), w[t & 15])));
                let s0 = _mm512_ternarylogic_epi32::<0x96>(_mm512_ror_epi32::<2>($a), _mm512_ror_epi32::<13>($a), _mm512_ror_epi32::<22>($a));
                let maj = _mm512_ternarylogic_epi32::<0xE8>($a, $b, $c);
                $d = add($d, t1);
                $h = add(t1, add(s0, maj));
            }};
        }
        // Eight rounds rotate the roles of the eight working variables back to the start.
        macro_rules! eight {
            ($t:expr) => {
                round!(a, b, c, d, e, f, g, h, $t);
                round!(h, a, b, c, d, e, f, g, $t + 1);
                round!(g, h, a, b, c, d, e, f, $t + 2);
                round!(f, g, h, a, b, c, d, e, $t + 3);
                round!(e, f, g, h, a, b, c, d, $t + 4);
                round!(d, e, f, g, h, a, b, c, $t + 5);
                round!(c, d, e, f, g, h, a, b, $t + 6);
                round!(b, c, d, e, f, g, h, a, $t + 7);
            };
        }
        eight!(0);
        eight!(8);
        eight!(16);
        eight!(24);
        eight!(32);
        eight!(40);
        eight!(48);
        eight!(56);
        let out = [a, b, c, d, e, f, g, h];
        std::array::from_fn(|i| add(state[i], out[i]))
    }

    /// Transpose 16 rows of 16 words: `out[j]` holds word `j` of every row (lane = row).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        let mut u = [_mm512_setzero_si512(); 16];
        for i in 0..4 {
            u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        // u[4i + j], 128-bit part q: word 4q + j of rows 4i..4i+3.
        let mut v = [_mm512_setzero_si512(); 16];
        for j in 0..4 {
            let (x0, x1, x2, x3) = (u[j], u[4 + j], u[8 + j], u[12 + j]);
            let y0 = _mm512_shuffle_i32x4::<0x88>(x0, x1);
            let y1 = _mm512_shuffle_i32x4::<0xDD>(x0, x1);
            let y2 = _mm512_shuffle_i32x4::<0x88>(x2, x3);
            let y3 = _mm512_shuffle_i32x4::<0xDD>(x2, x3);
            v[j] = _mm512_shuffle_i32x4::<0x88>(y0, y2);
            v[8 + j] = _mm512_shuffle_i32x4::<0xDD>(y0, y2);
            v[4 + j] = _mm512_shuffle_i32x4::<0x88>(y1, y3);
            v[12 + j] = _mm512_shuffle_i32x4::<0xDD>(y1, y3);
        }
        v
    }
}

/// The sha256 of a stream whose whole blocks are in `state` (`done` bytes so far), given
/// its last `tail` bytes (fewer than 64): padding and length, then the digest as hex.
fn finish(mut state: [u32; 8], done: u64, tail: &[u8]) -> String {
    debug_assert!(tail.len() < 64);
    let mut blocks = [[0u8; 64]; 2];
    let flat = blocks.as_flattened_mut();
    flat[..tail.len()].copy_from_slice(tail);
    flat[tail.len()] = 0x80;
    let n = if tail.len() + 9 <= 64 { 1 } else { 2 };
    let bits = (done + tail.len() as u64).wrapping_mul(8);
    flat[n * 64 - 8..n * 64].copy_from_slice(&bits.to_be_bytes());
    compress256(&mut state, &blocks[..n]);
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    hex(&out)
}

/// What to hash: `[start, end)` of `file` as one stream, and with `slice_bytes > 0` also
/// each consecutive `slice_bytes` of it as its own stream (a shorter last piece is not a
/// slice: only whole slices are hashed, as the digest pass always has).
#[derive(Clone)]
pub struct Job {
    pub file: Arc<SourceFile>,
    pub start: u64,
    pub end: u64,
    pub slice_bytes: u64,
    /// The caller's tag, returned with the digests.
    pub tag: usize,
}

/// A finished job: the whole range's sha256 and its slices' in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    pub tag: usize,
    pub sha256: String,
    pub slices: Vec<String>,
}

/// One sha256 stream in a lane: `[start, end)` of its job, hashed up to `pos`.
#[derive(Debug, Clone, Copy)]
struct Stream {
    lane: usize,
    start: u64,
    pos: u64,
    end: u64,
}

/// A job in progress: its buffer (`buf[..buf_len]` holds the file's bytes from `buf_off`;
/// the buffer is reused from finished jobs, never zeroed again), the range stream and the
/// current slice stream.
struct Active {
    job: Job,
    buf: Vec<u8>,
    buf_len: usize,
    buf_off: u64,
    whole: Option<Stream>,
    whole_sha: Option<String>,
    slice: Option<Stream>,
    slices: Vec<String>,
}

impl Active {
    fn buf_end(&self) -> u64 {
        self.buf_off + self.buf_len as u64
    }

    /// Whole blocks stream `s` can take from the buffer now.
    fn avail(&self, s: &Stream) -> u64 {
        if s.pos < self.buf_off {
            return 0;
        }
        (self.buf_end().min(s.end).saturating_sub(s.pos)) / 64
    }

    /// Read the buffer again from the lowest position any of its streams still needs.
    fn refill(&mut self) -> Result<(), SourceError> {
        let from = [self.whole, self.slice].iter().flatten().map(|s| s.pos).min().unwrap_or(self.job.end);
        let upto = [self.whole, self.slice].iter().flatten().map(|s| s.pos).max().unwrap_or(from);
        let len = ((upto - from) as usize + BUF).min((self.job.end - from) as usize);
        if self.buf.len() < len {
            // A fresh buffer, its pages mapped in one call.
            self.buf = crate::util::populated_zeroed(len);
        }
        self.buf_len = 0;
        self.job.file.read_exact_at(&mut self.buf[..len], from)?;
        self.buf_len = len;
        self.buf_off = from;
        Ok(())
    }

    fn bytes(&self, from: u64, to: u64) -> &[u8] {
        &self.buf[(from - self.buf_off) as usize..(to - self.buf_off) as usize]
    }

    fn done(&self) -> bool {
        self.whole.is_none() && self.slice.is_none()
    }
}

/// Runs jobs on up to [`LANES`] streams at once with one kernel.
pub struct Engine {
    kernel: Kernel,
    states: States,
    /// Pointer for each lane at the next run; inactive lanes read `dummy`.
    dummy: [u8; 64],
    /// Buffers of finished jobs, for the next ones (a fresh buffer costs a page fault per
    /// 4 KiB and a memset).
    spare: Vec<Vec<u8>>,
}

impl Engine {
    pub fn new(kernel: Kernel) -> Engine {
        Engine { kernel, states: [[0; LANES]; 8], dummy: [0; 64], spare: Vec::new() }
    }

    fn set_lane(&mut self, lane: usize, s: [u32; 8]) {
        for (i, w) in s.into_iter().enumerate() {
            self.states[i][lane] = w;
        }
    }

    fn lane(&self, lane: usize) -> [u32; 8] {
        std::array::from_fn(|i| self.states[i][lane])
    }

    /// Run every job `next` hands out until it returns `None`; `done` gets each finished
    /// job, `progress` the bytes of whole-range streams hashed. Stops at the first read error,
    /// and when `cancel` is set (checked at every buffer refill), leaving jobs unfinished.
    pub fn run(
        &mut self,
        mut next: impl FnMut() -> Option<Job>,
        mut done: impl FnMut(Done),
        progress: &dyn Fn(u64),
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<(), SourceError> {
        let mut active: Vec<Active> = Vec::new();
        let mut free: u16 = u16::MAX;
        let mut exhausted = false;
        loop {
            // Take jobs while two lanes are free (a job uses one or two).
            while !exhausted && free.count_ones() >= 2 {
                let Some(job) = next() else {
                    exhausted = true;
                    break;
                };
                let mut take = || {
                    let l = free.trailing_zeros() as usize;
                    free &= !(1 << l);
                    l
                };
                let whole = Stream { lane: take(), start: job.start, pos: job.start, end: job.end };
                self.set_lane(whole.lane, IV);
                let slice = (job.slice_bytes > 0 && job.end - job.start >= job.slice_bytes).then(|| {
                    let lane = take();
                    Stream { lane, start: job.start, pos: job.start, end: job.start + job.slice_bytes }
                });
                if let Some(s) = slice {
                    self.set_lane(s.lane, IV);
                }
                let buf = self.spare.pop().unwrap_or_default();
                active.push(Active { job, buf, buf_len: 0, buf_off: 0, whole: Some(whole), whole_sha: None, slice, slices: Vec::new() });
            }
            if active.is_empty() {
                return Ok(());
            }
            // Serve every stream that cannot take a block now: finish it, start its next
            // slice, or refill its job's buffer.
            for a in active.iter_mut() {
                loop {
                    let mut refill = false;
                    if let Some(s) = a.whole
                        && a.avail(&s) == 0
                    {
                        if s.end - s.pos < 64 && s.pos >= a.buf_off && s.end <= a.buf_end() {
                            a.whole_sha = Some(finish(self.lane(s.lane), s.pos - s.start, a.bytes(s.pos, s.end)));
                            progress(s.end - s.pos);
                            free |= 1 << s.lane;
                            a.whole = None;
                        } else {
                            refill = true;
                        }
                    }
                    if let Some(s) = a.slice
                        && a.avail(&s) == 0
                    {
                        if s.end - s.pos < 64 && s.pos >= a.buf_off && s.end <= a.buf_end() {
                            a.slices.push(finish(self.lane(s.lane), s.pos - s.start, a.bytes(s.pos, s.end)));
                            if s.end + a.job.slice_bytes <= a.job.end {
                                self.set_lane(s.lane, IV);
                                a.slice = Some(Stream { lane: s.lane, start: s.end, pos: s.end, end: s.end + a.job.slice_bytes });
                                continue;
                            }
                            free |= 1 << s.lane;
                            a.slice = None;
                        } else if a.whole.is_none_or(|w| s.pos < w.pos + BUF as u64) {
                            refill = true;
                        }
                        // Else the slice stream is a buffer ahead of the range stream (slices
                        // shorter than a block are finished here without lane work, so they can
                        // run ahead): it waits, so the buffer never holds more than about two
                        // buffers between them.
                    }
                    if !refill {
                        break;
                    }
                    if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                        return Ok(());
                    }
                    a.refill()?;
                }
            }
            let mut i = 0;
            while i < active.len() {
                if active[i].done() {
                    let a = active.swap_remove(i);
                    self.spare.push(a.buf);
                    done(Done { tag: a.job.tag, sha256: a.whole_sha.unwrap_or_default(), slices: a.slices });
                } else {
                    i += 1;
                }
            }
            // Run every active stream for as many blocks as the one with the fewest allows.
            let mut ptrs = [self.dummy.as_ptr(); LANES];
            let mut mask = 0u16;
            let mut n = u64::MAX;
            for a in &active {
                for s in [a.whole, a.slice].iter().flatten() {
                    let k = a.avail(s);
                    if k == 0 {
                        continue; // a slice stream waiting for the range stream
                    }
                    n = n.min(k);
                    mask |= 1 << s.lane;
                    ptrs[s.lane] = a.bytes(s.pos, s.pos).as_ptr();
                }
            }
            if mask == 0 {
                continue;
            }
            // SAFETY: every active lane's pointer is `pos` in its job's buffer with at least
            // `64 * n` bytes after it (`avail`); inactive lanes read `self.dummy`.
            unsafe { self.kernel.run(&mut self.states, &ptrs, mask, n as usize) };
            for a in active.iter_mut() {
                if let Some(s) = a.whole.as_mut().filter(|s| mask & (1 << s.lane) != 0) {
                    s.pos += 64 * n;
                    progress(64 * n);
                }
                if let Some(s) = a.slice.as_mut().filter(|s| mask & (1 << s.lane) != 0) {
                    s.pos += 64 * n;
                }
            }
        }
    }
}

/// The sha256 of whole files, many at once: every core runs an [`Engine`], each file one
/// job, opened when its turn comes (never more open than lanes). `expected`, when given,
/// holds what each file should hash to: once a file differs (or cannot be opened), files
/// after it in order are no longer started (a checker reports the first difference in order, so nothing after it
/// matters). `None` for a file: not hashed (it could not be opened or read, or came after
/// a difference); the caller hashes such files one by one to report exactly what happened.
pub fn sha256_files(paths: &[std::path::PathBuf], expected: Option<&[String]>) -> Vec<Option<String>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let n = paths.len();
    let results: parking_lot::Mutex<Vec<Option<String>>> = parking_lot::Mutex::new(vec![None; n]);
    let (next, first_bad) = (AtomicUsize::new(0), AtomicUsize::new(usize::MAX));
    let kernel = Kernel::best();
    let threads = std::thread::available_parallelism().map_or(2, |c| c.get()).min(n);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let next_job = || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n || i > first_bad.load(Ordering::Relaxed) {
                        return None;
                    }
                    match SourceFile::open(&paths[i]) {
                        Ok(f) => {
                            let end = f.size();
                            return Some(Job { file: Arc::new(f), start: 0, end, slice_bytes: 0, tag: i });
                        }
                        Err(_) if expected.is_some() => {
                            first_bad.fetch_min(i, Ordering::Relaxed);
                        }
                        Err(_) => {}
                    }
                };
                let done = |d: Done| {
                    if expected.is_some_and(|e| e.get(d.tag) != Some(&d.sha256)) {
                        first_bad.fetch_min(d.tag, Ordering::Relaxed);
                    }
                    results.lock()[d.tag] = Some(d.sha256);
                };
                // A read error ends this engine: its files in flight stay `None`.
                let _ = Engine::new(kernel).run(next_job, done, &|_| {}, &std::sync::atomic::AtomicBool::new(false));
            });
        }
    });
    results.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::sha256_hex;

    fn fixture(len: usize) -> (tempfile::NamedTempFile, Arc<SourceFile>, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), &data).unwrap();
        let f = Arc::new(SourceFile::open(tmp.path()).unwrap());
        (tmp, f, data)
    }

    fn expect(data: &[u8], job: &Job) -> Done {
        let range = &data[job.start as usize..job.end as usize];
        let slices = if job.slice_bytes == 0 { Vec::new() } else { range.chunks_exact(job.slice_bytes as usize).map(sha256_hex).collect() };
        Done { tag: job.tag, sha256: sha256_hex(range), slices }
    }

    #[test]
    fn finish_pads_like_sha256_at_every_tail_length() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        for len in 0..200 {
            let whole = len / 64 * 64;
            let mut s = IV;
            let blocks: Vec<[u8; 64]> = data[..whole].chunks_exact(64).map(|c| c.try_into().unwrap()).collect();
            compress256(&mut s, &blocks);
            assert_eq!(finish(s, whole as u64, &data[whole..len]), sha256_hex(&data[..len]), "length {len}");
        }
    }

    /// Every kernel gives `sha2`'s digests for ranges and slices of lengths around block and
    /// buffer boundaries, many jobs sharing the lanes (more jobs than lanes).
    #[test]
    fn every_kernel_matches_sha2_on_ranges_and_slices() {
        let (_tmp, file, data) = fixture(3 * BUF + 4321);
        let mut jobs = Vec::new();
        let mut start = 0u64;
        let shapes: [(u64, u64); 12] = [
            (0, 0),
            (1, 0),
            (63, 0),
            (64, 0),
            (65, 0),
            (4096, 64),
            (4096 + 7, 97),
            (200_000, 1000),
            (BUF as u64 + 100, 0),
            (640, 63),
            (128, 128),
            (1000, 3000),
        ];
        for (i, (len, slice)) in shapes.iter().cycle().take(40).enumerate() {
            let len = len + (i as u64 % 3);
            if start + len > data.len() as u64 {
                start = (i as u64 * 977) % 1000;
            }
            jobs.push(Job { file: file.clone(), start, end: start + len, slice_bytes: *slice, tag: i });
            start += len / 2 + 1;
        }
        // One job whose slices lead its range stream by a tail every slice, across refills.
        jobs.push(Job { file: file.clone(), start: 5, end: 5 + 3 * BUF as u64, slice_bytes: 4097, tag: 999 });
        for kernel in Kernel::available() {
            let mut queue = jobs.clone().into_iter();
            let mut got = Vec::new();
            let counted = std::sync::atomic::AtomicU64::new(0);
            Engine::new(kernel)
                .run(
                    || queue.next(),
                    |d| got.push(d),
                    &|n| {
                        counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    },
                    &std::sync::atomic::AtomicBool::new(false),
                )
                .unwrap();
            got.sort_by_key(|d| d.tag);
            let want: Vec<Done> = jobs.iter().map(|j| expect(&data, j)).collect::<Vec<_>>();
            let mut want = want;
            want.sort_by_key(|d| d.tag);
            assert_eq!(got, want, "kernel {}", kernel.name());
            let total: u64 = jobs.iter().map(|j| j.end - j.start).sum();
            assert_eq!(counted.into_inner(), total, "kernel {}: progress", kernel.name());
        }
    }

    /// Slices shorter than a block are finished without lane work, so their stream could
    /// run ahead of the range stream and the buffer grow with it: it waits instead.
    #[test]
    fn tiny_slices_hash_right_and_keep_the_buffer_bounded() {
        let (_tmp, file, data) = fixture(3 * BUF + 123);
        for kernel in Kernel::available() {
            for slice in [3u64, 63, 64, 65] {
                let job = Job { file: file.clone(), start: 7, end: data.len() as u64 - 3, slice_bytes: slice, tag: 0 };
                let mut jobs = vec![job.clone()].into_iter();
                let mut got = Vec::new();
                let mut engine = Engine::new(kernel);
                engine.run(|| jobs.next(), |d| got.push(d), &|_| {}, &std::sync::atomic::AtomicBool::new(false)).unwrap();
                assert_eq!(got, vec![expect(&data, &job)], "kernel {} slices of {slice}", kernel.name());
                let biggest = engine.spare.iter().map(Vec::len).max().unwrap_or(0);
                assert!(biggest <= 2 * BUF + 4096, "kernel {} slices of {slice}: a {biggest}-byte buffer", kernel.name());
            }
        }
    }

    #[test]
    fn a_read_past_the_end_is_an_error_not_a_panic() {
        let (_tmp, file, _) = fixture(1000);
        for kernel in Kernel::available() {
            let mut jobs = vec![Job { file: file.clone(), start: 500, end: 2000, slice_bytes: 100, tag: 0 }].into_iter();
            let r = Engine::new(kernel).run(|| jobs.next(), |_| {}, &|_| {}, &std::sync::atomic::AtomicBool::new(false));
            assert!(r.is_err(), "kernel {}", kernel.name());
        }
    }

    #[test]
    fn files_hash_as_sha256_and_a_difference_stops_later_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        let mut want = Vec::new();
        for (i, len) in [0usize, 1, 64, 1000, BUF + 3, 77, 5000].iter().enumerate() {
            let data: Vec<u8> = (0..*len).map(|j| (j * (i + 3)) as u8).collect();
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, &data).unwrap();
            paths.push(p);
            want.push(sha256_hex(&data));
        }
        let got = sha256_files(&paths, None);
        assert_eq!(got, want.iter().cloned().map(Some).collect::<Vec<_>>());
        // A missing file is `None`, the others still hash.
        let mut with_missing = paths.clone();
        with_missing[2] = dir.path().join("missing");
        let got = sha256_files(&with_missing, None);
        assert_eq!(got[2], None);
        assert_eq!(got[3].as_ref(), Some(&want[3]));
        // With expectations, everything before a difference is hashed.
        let mut expected = want.clone();
        expected[4] = "0".repeat(64);
        let got = sha256_files(&paths, Some(&expected));
        for i in 0..5 {
            assert_eq!(got[i].as_ref(), Some(&want[i]), "file {i}");
        }
    }
}
