//! Hashing bytes as they stream past: the sha256 of a whole stream and of wanted
//! sub-ranges of it, taken in one pass (materialize hashes what it writes this way).

use sha2::{Digest, Sha256};

use crate::util::hex;

/// Hashes bytes of one file streamed in order from `start`: the sha256 of everything
/// streamed, and of every wanted `(offset, len)` range lying wholly inside what is streamed.
pub struct RangeHasher {
    whole: Sha256,
    pos: u64,
    /// (start, end, hasher), sorted by start; removed when finished.
    open: Vec<(u64, u64, Sha256)>,
    finished: Vec<(u64, u64, String)>,
}

impl RangeHasher {
    pub fn new(start: u64, end: u64, wanted: &[(u64, u64)]) -> Self {
        let mut open: Vec<(u64, u64, Sha256)> =
            wanted.iter().filter(|(o, l)| *o >= start && o.saturating_add(*l) <= end).map(|&(o, l)| (o, o + l, Sha256::new())).collect();
        open.sort_by_key(|r| (r.0, r.1));
        let mut h = RangeHasher { whole: Sha256::new(), pos: start, open, finished: Vec::new() };
        h.close_finished();
        h
    }

    fn close_finished(&mut self) {
        let pos = self.pos;
        let mut i = 0;
        while i < self.open.len() {
            if self.open[i].1 <= pos {
                let (a, b, h) = self.open.remove(i);
                self.finished.push((a, b - a, hex(&h.finalize())));
            } else {
                i += 1;
            }
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.whole.update(bytes);
        let (lo, hi) = (self.pos, self.pos + bytes.len() as u64);
        for (a, b, h) in &mut self.open {
            if *a >= hi {
                break;
            }
            let (s, e) = ((*a).max(lo), (*b).min(hi));
            if s < e {
                h.update(&bytes[(s - lo) as usize..(e - lo) as usize]);
            }
        }
        self.pos = hi;
        self.close_finished();
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The sha256 of everything streamed, and `(offset, len, sha256)` of every wanted range
    /// that was streamed completely.
    pub fn finish(self) -> (String, Vec<(u64, u64, String)>) {
        (hex(&self.whole.finalize()), self.finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::sha256_hex;

    #[test]
    fn range_hasher_matches_direct_hashes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let wanted = [(0, 10_000), (5, 0), (100, 900), (950, 3000), (9_999, 1), (9_000, 2_000), (4_000, 10)];
        for (start, end) in [(0u64, 10_000u64), (950, 4_000), (100, 1_000)] {
            let mut h = RangeHasher::new(start, end, &wanted);
            // Uneven pieces, so ranges start and end inside updates.
            let mut pos = start as usize;
            for step in [1usize, 333, 4096, 17].iter().cycle() {
                if pos >= end as usize {
                    break;
                }
                let n = (*step).min(end as usize - pos);
                h.update(&data[pos..pos + n]);
                pos += n;
            }
            let (whole, mut ranges) = h.finish();
            assert_eq!(whole, sha256_hex(&data[start as usize..end as usize]));
            ranges.sort();
            let mut expect: Vec<(u64, u64, String)> =
                wanted.iter().filter(|(o, l)| *o >= start && o + l <= end).map(|&(o, l)| (o, l, sha256_hex(&data[o as usize..(o + l) as usize]))).collect();
            expect.sort();
            assert_eq!(ranges, expect, "streamed [{start}, {end})");
        }
    }
}
