//! The one sequential pass over a source that feeds every hasher from the same buffers:
//! whole source, each file of a split set, header regions, each tensor, each expert slice.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::{expert_slices, file_records, DigestError, SourceDigests, TensorDigest, STORE_FORMAT};
use crate::source::{Source, SourceError};
use crate::util::{hex, now_iso};

const CHUNK: usize = 8 << 20;

/// Hash everything in one sequential pass over the source files.
pub fn compute(source: &Source) -> Result<SourceDigests, DigestError> {
    let started = Instant::now();
    let data_offsets: Vec<u64> = match source.gguf() {
        Some(meta) => meta.headers.iter().map(|h| h.data_offset).collect(),
        None => vec![0; source.files.len()],
    };
    let total = source.logical_size();

    struct Region<'a> {
        name: &'a str,
        start: u64,
        end: u64,
        slice_bytes: u64,
        hasher: Sha256,
        slice: Sha256,
        slices: Vec<String>,
    }
    // Per file: tensor regions sorted by offset (they do not overlap).
    let mut per_file: Vec<Vec<Region>> = (0..source.files.len()).map(|_| Vec::new()).collect();
    for t in &source.tensors {
        let n = expert_slices(t).unwrap_or(0);
        per_file[t.file].push(Region {
            name: &t.name,
            start: t.offset,
            end: t.offset + t.nbytes,
            slice_bytes: t.nbytes.checked_div(n).unwrap_or(0),
            hasher: Sha256::new(),
            slice: Sha256::new(),
            slices: Vec::new(),
        });
    }
    for regions in &mut per_file {
        regions.sort_by_key(|r| r.start);
    }

    let mut whole = Sha256::new();
    let mut header = Sha256::new();
    let split = source.files.len() > 1;
    let mut file_whole: Vec<Sha256> = (0..source.files.len()).map(|_| Sha256::new()).collect();
    let mut file_header: Vec<Sha256> = (0..source.files.len()).map(|_| Sha256::new()).collect();
    let mut done_bytes = 0u64;
    let mut last_log = Instant::now();
    let files = source.files.clone();
    let (tx, rx) = sync_channel::<Result<(usize, u64, Arc<Vec<u8>>), SourceError>>(3);
    let reader = std::thread::spawn(move || {
        for (i, f) in files.iter().enumerate() {
            let mut off = 0u64;
            while off < f.size() {
                let n = (f.size() - off).min(CHUNK as u64) as usize;
                let mut buf = vec![0u8; n];
                let r = f.read_exact_at(&mut buf, off).map(|_| (i, off, Arc::new(buf)));
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    return;
                }
                off += n as u64;
            }
        }
    });

    let mut cursor = vec![0usize; per_file.len()];
    for msg in rx {
        let (fi, off, buf) = msg?;
        let end = off + buf.len() as u64;
        let regions = &mut per_file[fi];
        let cur = &mut cursor[fi];
        let header_end = data_offsets[fi].min(end);
        let (fw, fh) = (&mut file_whole[fi], &mut file_header[fi]);
        rayon::join(
            || {
                whole.update(&buf[..]);
                // A split set's files are hashed one by one too (a single file's digest is the source's).
                if split {
                    fw.update(&buf[..]);
                }
            },
            || {
                if off < header_end {
                    header.update(&buf[..(header_end - off) as usize]);
                    fh.update(&buf[..(header_end - off) as usize]);
                }
                while *cur < regions.len() && regions[*cur].end <= off && regions[*cur].end > regions[*cur].start {
                    *cur += 1;
                }
                let mut i = *cur;
                while i < regions.len() && regions[i].start < end {
                    let r = &mut regions[i];
                    let a = r.start.max(off);
                    let b = r.end.min(end);
                    if a < b {
                        let bytes = &buf[(a - off) as usize..(b - off) as usize];
                        r.hasher.update(bytes);
                        if r.slice_bytes > 0 {
                            let mut pos = a;
                            while pos < b {
                                let slice_no = (pos - r.start).checked_div(r.slice_bytes).unwrap_or(0);
                                let slice_end = r.start + (slice_no + 1) * r.slice_bytes;
                                let upto = slice_end.min(b);
                                r.slice.update(&buf[(pos - off) as usize..(upto - off) as usize]);
                                if upto == slice_end {
                                    let h = std::mem::take(&mut r.slice);
                                    r.slices.push(hex(&h.finalize()));
                                }
                                pos = upto;
                            }
                        }
                    }
                    i += 1;
                }
            },
        );
        done_bytes += buf.len() as u64;
        if last_log.elapsed().as_secs() >= 5 {
            last_log = Instant::now();
            let rate = done_bytes as f64 / started.elapsed().as_secs_f64() / 1e6;
            tracing::info!("hashing source: {done_bytes}/{total} bytes ({rate:.0} MB/s)");
        }
    }
    reader.join().map_err(|_| DigestError::Store { path: PathBuf::new(), what: "reader thread panicked".into() })?;
    if done_bytes != total {
        return Err(SourceError::Changed {
            path: source.files[0].path().to_path_buf(),
            what: format!("read {done_bytes} bytes while hashing, expected {total}"),
        }
        .into());
    }
    let mut tensors = BTreeMap::new();
    for r in per_file.into_iter().flatten() {
        tensors.insert(r.name.to_string(), TensorDigest { sha256: hex(&r.hasher.finalize()), slices: r.slices });
    }
    for f in &source.files {
        f.check_unchanged()?;
    }
    let source_sha256 = hex(&whole.finalize());
    let files_sha256 = if split { file_whole.into_iter().map(|h| hex(&h.finalize())).collect() } else { vec![source_sha256.clone()] };
    Ok(SourceDigests {
        format: STORE_FORMAT.into(),
        files: file_records(source),
        files_sha256,
        files_header_sha256: file_header.into_iter().map(|h| hex(&h.finalize())).collect(),
        source_sha256,
        header_sha256: hex(&header.finalize()),
        tensors,
        computed_at: now_iso(),
        elapsed_s: started.elapsed().as_secs_f64(),
    })
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
}
