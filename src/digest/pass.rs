//! The digest pass: every digest a source needs (the whole source, each file of a split
//! set, the header regions, each tensor, each expert slice), each byte read once per
//! stream family and never copied per hash.
//!
//! An expert byte goes into three digests. The whole-source digest is one sequential
//! stream, so it gets a thread of its own reading the files in order (with the header
//! regions and the per-file digests of a split set on the way). The tensor and slice
//! digests are many independent streams: [`super::lanes`] runs them as jobs (a tensor, and
//! its slices from the same buffer) sixteen lanes at a time with AVX-512, on the other
//! cores. On this 2-core machine the two sides take about the same time, so the pass runs
//! near the speed of one sha256 stream; on more cores the jobs spread over more threads.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::lanes::{Done, Engine, Job, Kernel};
use super::{DigestError, STORE_FORMAT, SourceDigests, TensorDigest, expert_slices, file_records};
use crate::source::{Source, SourceError};
use crate::util::{hex, now_iso};

/// Bytes per read of the whole-source stream.
const BLOCK: usize = 4 << 20;

/// What the whole-source thread computes.
struct Whole {
    source: Sha256,
    files: Vec<Sha256>,
    header: Sha256,
    file_headers: Vec<Sha256>,
}

/// Read every file in order and hash the whole source, each file of a split set (a single
/// file's digest is the source's) and the header regions `[0, data_offset)`.
fn whole_stream(source: &Source, data_offsets: &[u64], done: &AtomicU64, failed: &AtomicBool) -> Result<Whole, SourceError> {
    let split = source.files.len() > 1;
    let mut w = Whole {
        source: Sha256::new(),
        files: (0..source.files.len()).map(|_| Sha256::new()).collect(),
        header: Sha256::new(),
        file_headers: (0..source.files.len()).map(|_| Sha256::new()).collect(),
    };
    let mut buf = crate::util::populated_zeroed(BLOCK);
    for (i, f) in source.files.iter().enumerate() {
        let mut off = 0u64;
        while off < f.size() {
            if failed.load(Ordering::Relaxed) {
                return Ok(w);
            }
            let n = (f.size() - off).min(BLOCK as u64) as usize;
            buf.resize(n, 0);
            f.read_exact_at(&mut buf, off)?;
            w.source.update(&buf);
            if split {
                w.files[i].update(&buf);
            }
            let header_end = data_offsets[i].min(off + n as u64);
            if off < header_end {
                let bytes = &buf[..(header_end - off) as usize];
                w.header.update(bytes);
                w.file_headers[i].update(bytes);
            }
            off += n as u64;
            done.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    Ok(w)
}

/// Threads for the tensor and slice jobs next to the whole-source thread: the other cores,
/// at least one (two without the 16-lane kernel, whose single streams need more cores).
fn job_threads(kernel: Kernel) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let min = if kernel == Kernel::Scalar { 2 } else { 1 };
    cores.saturating_sub(1).max(min)
}

/// Hash everything: the whole-source stream on one thread, tensor and slice jobs on the others.
pub fn compute(source: &Source) -> Result<SourceDigests, DigestError> {
    compute_with(source, Kernel::best())
}

/// [`compute`] with a given kernel (tests run every kernel the CPU has).
pub fn compute_with(source: &Source, kernel: Kernel) -> Result<SourceDigests, DigestError> {
    let started = Instant::now();
    let nfiles = source.files.len();
    let data_offsets: Vec<u64> = match source.gguf() {
        Some(meta) => meta.headers.iter().map(|h| h.data_offset).collect(),
        None => vec![0; nfiles],
    };
    let total = source.logical_size();
    // Jobs in file order, so the job threads stay near the whole-source reader in the file.
    let mut jobs: Vec<Job> = source
        .tensors
        .iter()
        .enumerate()
        .map(|(tag, t)| {
            let n = expert_slices(t).unwrap_or(0);
            Job { file: source.files[t.file].clone(), start: t.offset, end: t.offset + t.nbytes, slice_bytes: t.nbytes.checked_div(n).unwrap_or(0), tag }
        })
        .collect();
    jobs.sort_by_key(|j| (source.tensors[j.tag].file, j.start));
    let job_bytes: u64 = jobs.iter().map(|j| j.end - j.start).sum();
    let queue = Mutex::new(jobs.into_iter());
    let results: Mutex<Vec<Done>> = Mutex::new(Vec::with_capacity(source.tensors.len()));
    let (whole_done, jobs_done) = (AtomicU64::new(0), AtomicU64::new(0));
    let failed = AtomicBool::new(false);
    let stop = AtomicBool::new(false);

    let (whole, job_errors) = std::thread::scope(|s| {
        let progress = s.spawn(|| progress(&whole_done, &jobs_done, &stop, total, job_bytes, started));
        let workers: Vec<_> = (0..job_threads(kernel))
            .map(|_| {
                s.spawn(|| {
                    let r = Engine::new(kernel).run(
                        || if failed.load(Ordering::Relaxed) { None } else { queue.lock().next() },
                        |d| results.lock().push(d),
                        &|n| {
                            jobs_done.fetch_add(n, Ordering::Relaxed);
                        },
                        &failed,
                    );
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let whole = whole_stream(source, &data_offsets, &whole_done, &failed);
        if whole.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        let job_errors: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::Relaxed);
        progress.thread().unpark();
        let _ = progress.join();
        (whole, job_errors)
    });
    let whole = whole?;
    for r in job_errors {
        r.map_err(|_| DigestError::Store { path: PathBuf::new(), what: "a hashing thread failed".into() })??;
    }
    let done_bytes = whole_done.load(Ordering::Relaxed);
    let results = results.into_inner();
    if done_bytes != total || results.len() != source.tensors.len() {
        return Err(SourceError::Changed {
            path: source.files[0].path().to_path_buf(),
            what: format!("read {done_bytes} bytes while hashing, expected {total}"),
        }
        .into());
    }
    let mut tensors = BTreeMap::new();
    for d in results {
        tensors.insert(source.tensors[d.tag].name.clone(), TensorDigest { sha256: d.sha256, slices: d.slices });
    }
    for f in &source.files {
        f.check_unchanged()?;
    }
    let source_sha256 = hex(&whole.source.finalize());
    let files_sha256: Vec<String> = if nfiles > 1 { whole.files.into_iter().map(|h| hex(&h.finalize())).collect() } else { vec![source_sha256.clone()] };
    // A file whose store states its sha256 (the Hub's LFS oid) must hash to it: otherwise the
    // bytes read are not the ones the store vouches for, and nothing computed from them is kept.
    for (f, actual) in source.files.iter().zip(&files_sha256) {
        if let Some(stated) = f.stated_sha256().filter(|s| !s.eq_ignore_ascii_case(actual)) {
            return Err(DigestError::Stated { path: f.path().to_path_buf(), stated: stated.to_string(), actual: actual.clone() });
        }
    }
    Ok(SourceDigests {
        format: STORE_FORMAT.into(),
        files: file_records(source),
        files_sha256,
        files_header_sha256: whole.file_headers.into_iter().map(|h| hex(&h.finalize())).collect(),
        source_sha256,
        header_sha256: hex(&whole.header.finalize()),
        tensors,
        computed_at: now_iso(),
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// Progress of the pass until `stop`, as source bytes done (the slower of the two sides)
/// and GB/s: a bar on a terminal, else a log line every 5 s.
fn progress(whole: &AtomicU64, jobs: &AtomicU64, stop: &AtomicBool, total: u64, job_bytes: u64, started: Instant) {
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("hashing {bar:40} {bytes}/{total_bytes} {msg} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let rate = |d: u64| d as f64 / started.elapsed().as_secs_f64().max(1e-9) / 1e9;
    let mut last_log = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(std::time::Duration::from_millis(200));
        let w = whole.load(Ordering::Relaxed);
        let j = jobs.load(Ordering::Relaxed);
        let d = if job_bytes == 0 { w } else { w.min((j as f64 / job_bytes as f64 * total as f64) as u64) };
        match &bar {
            Some(b) => {
                b.set_position(d);
                b.set_message(format!("{:.2} GB/s", rate(d)));
            }
            None if last_log.elapsed().as_secs() >= 5 => {
                last_log = Instant::now();
                tracing::info!("hashing source: {d}/{total} bytes ({:.2} GB/s)", rate(d));
            }
            None => {}
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_file_digests_of_a_single_file_are_the_sources() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/sample-moe.gguf");
        let source = Source::open(std::path::Path::new(path)).unwrap();
        let d = compute(&source).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let data_offset = source.gguf().unwrap().headers[0].data_offset as usize;
        assert_eq!(d.source_sha256, crate::util::sha256_hex(&bytes));
        assert_eq!(d.files_sha256, std::slice::from_ref(&d.source_sha256));
        assert_eq!(d.files_header_sha256, [crate::util::sha256_hex(&bytes[..data_offset])]);
        assert_eq!(d.files_header_sha256[0], d.header_sha256);
        assert_eq!(super::super::header_sha256s(&source).unwrap(), d.files_header_sha256);
    }

    /// Every tensor's and every expert slice's digest, at every kernel the CPU has, is the
    /// sha256 of those bytes of the file.
    #[test]
    fn tensor_and_slice_digests_are_the_sha256_of_their_bytes_at_every_kernel() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/sample-moe.gguf");
        let source = Source::open(std::path::Path::new(path)).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let mut with_slices = 0;
        for kernel in Kernel::available() {
            let d = compute_with(&source, kernel).unwrap();
            assert_eq!(d.tensors.len(), source.tensors.len());
            for t in &source.tensors {
                let range = &bytes[t.offset as usize..(t.offset + t.nbytes) as usize];
                let td = &d.tensors[&t.name];
                assert_eq!(td.sha256, crate::util::sha256_hex(range), "{} ({})", t.name, kernel.name());
                let want: Vec<String> = match expert_slices(t) {
                    Some(n) => range.chunks_exact((t.nbytes / n) as usize).map(crate::util::sha256_hex).collect(),
                    None => Vec::new(),
                };
                with_slices += usize::from(!want.is_empty());
                assert_eq!(td.slices, want, "{} ({})", t.name, kernel.name());
            }
        }
        assert!(with_slices > 0, "the sample has expert tensors");
    }
}
