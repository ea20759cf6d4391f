//! Small helpers shared by every layer: hex digests, Python-compatible UTC timestamps,
//! fresh buffers whose pages are mapped in one call ([`populate_for_write`]), the value
//! parsers of options ([`args`]) and the progress thread of long commands ([`ticker`]).

pub mod args;
pub mod ticker;

use std::sync::Arc;

use sha2::{Digest, Sha256};

/// Below this many bytes a buffer's pages are left to fault in one by one.
const POPULATE_MIN: usize = 256 << 10;

/// Map the pages of a fresh buffer of `len` bytes at `ptr` writable in one system call
/// (`MADV_POPULATE_WRITE`, Linux 5.14) instead of one page fault per 4 KiB as it is first
/// written: 214 fresh 1 MiB buffers written here took 111-139 ms faulting, 92-101 ms
/// populated first; cold reads of the BF16 view, whose chunks are such buffers, took 0.85x
/// the time. Only whole pages inside the buffer are touched; their contents do not change.
/// False when nothing was populated (a small buffer, or a kernel that refuses the call: the
/// pages then fault in as before).
pub fn populate_for_write(ptr: *mut u8, len: usize) -> bool {
    if len < POPULATE_MIN {
        return false;
    }
    let page = 4096usize;
    let start = (ptr as usize).next_multiple_of(page);
    let end = (ptr as usize + len) & !(page - 1);
    // SAFETY: the range lies inside the caller's buffer, page-aligned; populating pages
    // neither moves nor changes memory, so nothing the caller holds is invalidated.
    end > start && unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE) } == 0
}

/// A zeroed buffer of `len` bytes whose pages are already mapped ([`populate_for_write`]):
/// for a buffer that is about to be overwritten whole (a fetched part, a computed chunk).
pub fn populated_zeroed(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let _ = populate_for_write(v.as_mut_ptr(), len);
    v
}

/// [`populated_zeroed`] as the `Arc<[u8]>` the caches keep (a computed chunk, a chunk read
/// from the disk tier), filled in place through `Arc::get_mut` before it is shared.
pub fn populated_zeroed_arc(len: usize) -> Arc<[u8]> {
    // SAFETY: zeroed bytes are initialised `u8`s.
    let mut a = unsafe { Arc::<[u8]>::new_zeroed_slice(len).assume_init() };
    if let Some(bytes) = Arc::get_mut(&mut a) {
        let _ = populate_for_write(bytes.as_mut_ptr(), len);
    }
    a
}

pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub fn now_iso() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format_utc(now.as_secs() as i64, now.subsec_micros())
}

/// `datetime.isoformat()` of an aware UTC datetime: `2026-11-30T02:40:17.123456+00:00`.
pub fn format_utc(secs: i64, micros: u32) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let frac = if micros == 0 { String::new() } else { format!(".{micros:06}") };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}+00:00", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populating_a_buffer_keeps_its_bytes() {
        for len in [0, 1, 4095, POPULATE_MIN - 1, POPULATE_MIN, (2 << 20) + 16] {
            let v = populated_zeroed(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&b| b == 0), "{len}");
            // Bytes already written (a buffer that is not fresh) are left as they are, at
            // any alignment of the buffer.
            let mut w: Vec<u8> = (0..len + 7).map(|i| (i * 31 % 251) as u8).collect();
            let before = w.clone();
            for skew in [0, 3, 7] {
                let part = &mut w[skew..skew + len];
                let _ = populate_for_write(part.as_mut_ptr(), part.len());
            }
            assert_eq!(w, before, "{len}");
        }
    }

    /// Minor page faults of this thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage writes the struct it is given.
        unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &mut u);
            u.ru_minflt
        }
    }

    #[test]
    fn a_populated_buffer_is_written_without_page_faults() {
        let len = 8 << 20;
        // Fresh mappings of small pages on both sides: the allocator could hand a test a
        // buffer it has touched before (its mmap threshold moves as other tests free theirs),
        // and the machine's transparent huge page setting must not matter.
        let fresh_mapping = || {
            // SAFETY: a new private anonymous mapping; the advice only changes how it is mapped.
            unsafe {
                let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
                assert_ne!(p, libc::MAP_FAILED);
                libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
                p.cast::<u8>()
            }
        };
        let write = |p: *mut u8| {
            let before = minor_faults();
            for off in (0..len).step_by(4096) {
                // SAFETY: `p` is a writable mapping of `len` bytes (volatile: the write must happen).
                unsafe { std::ptr::write_volatile(p.add(off), 1) };
            }
            minor_faults() - before
        };
        let (fresh, populated) = (fresh_mapping(), fresh_mapping());
        let faulted = write(fresh);
        let refused = !populate_for_write(populated, len);
        let after = write(populated);
        // SAFETY: the mappings made above, unmapped once.
        unsafe {
            libc::munmap(fresh.cast(), len);
            libc::munmap(populated.cast(), len);
        }
        if refused {
            eprintln!("this kernel refuses MADV_POPULATE_WRITE; nothing to check");
            return;
        }
        assert!(faulted >= 1024, "a fresh buffer faulted only {faulted} times");
        assert!(after <= 4, "a populated buffer faulted {after} times");
    }

    #[test]
    fn utc_like_python_isoformat() {
        // datetime.fromtimestamp(t, timezone.utc).isoformat()
        assert_eq!(format_utc(0, 0), "1970-01-01T00:00:00+00:00");
        assert_eq!(format_utc(1_798_598_417, 123_456), "2026-12-30T02:40:17.123456+00:00");
        assert_eq!(format_utc(951_782_400, 5), "2000-02-29T00:00:00.000005+00:00");
    }
}
