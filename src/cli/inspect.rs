//! `xpackfs inspect`: the seed's `inspect_pack` summary of any expert-pack file (a mount's,
//! a materialized copy, or one written by SGLang's own builder). The pack must be a regular
//! file (a FIFO or a device is refused before it is opened); every size the header declares
//! is checked, without overflow, against the file before anything is read from it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::view::expert_pack::format::{ENTRY_BYTES, FORMAT, HEADER_BYTES, IndexEntry, PackHeader, ROLE_NAMES};

/// The seed's `inspect_pack` summary of any pack file.
pub fn inspect(path: &std::path::Path, limit: usize) -> Result<Value, String> {
    use std::os::unix::fs::FileExt;
    let (f, meta) = crate::source::open_regular(path).map_err(|e| e.to_string())?;
    let size = meta.len();
    let mut hb = vec![0u8; HEADER_BYTES as usize];
    f.read_exact_at(&mut hb, 0).map_err(|e| format!("{}: cannot read the header: {e}", path.display()))?;
    let header = PackHeader::decode(&hb).ok_or_else(|| format!("{}: not an {FORMAT} file (bad magic)", path.display()))?;
    if header.header_bytes as u64 != HEADER_BYTES || header.entry_bytes as u64 != ENTRY_BYTES {
        return Err(format!(
            "{}: header_bytes/entry_bytes are {}/{}, expected {HEADER_BYTES}/{ENTRY_BYTES}",
            path.display(),
            header.header_bytes,
            header.entry_bytes
        ));
    }
    let index_bytes = header
        .index_count
        .checked_mul(ENTRY_BYTES)
        .filter(|n| HEADER_BYTES.checked_add(*n).is_some_and(|end| end <= size && end <= header.data_start))
        .ok_or_else(|| {
            format!("{}: index of {} entries does not fit before data_start {} / file size {size}", path.display(), header.index_count, header.data_start)
        })?;
    let mut role_counts = BTreeMap::new();
    let mut payload = 0u64;
    let mut first = Vec::new();
    let mut buf = vec![0u8; (ENTRY_BYTES * 4096) as usize];
    let mut off = 0u64;
    let mut index = 0u64;
    while off < index_bytes {
        let n = (index_bytes - off).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], HEADER_BYTES + off).map_err(|e| format!("{}: {e}", path.display()))?;
        for chunk in buf[..n].chunks_exact(ENTRY_BYTES as usize) {
            let e = IndexEntry::decode(chunk);
            let role = ROLE_NAMES.get(e.role_id as usize).copied().unwrap_or("unknown");
            *role_counts.entry(role.to_string()).or_insert(0u64) += 1;
            payload = payload
                .checked_add(e.pack_nbytes)
                .ok_or_else(|| format!("{}: index entry {index}: pack_nbytes {} makes the payload total overflow", path.display(), e.pack_nbytes))?;
            if first.len() < limit {
                first.push(serde_json::to_value(&e).map_err(|e| e.to_string())?);
            }
            index += 1;
        }
        off += n as u64;
    }
    Ok(json!({
        "path": path.to_string_lossy(),
        "size": size,
        "header": header,
        "role_counts": role_counts,
        "payload_bytes": payload,
        "entries": first,
    }))
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    pack: std::path::PathBuf,
    /// Entries to show
    #[arg(long, default_value = "12", value_parser = crate::util::args::int_in::<usize>(0, 1 << 20))]
    limit: usize,
}

pub fn run(a: InspectArgs) -> i32 {
    match inspect(&a.pack, a.limit) {
        Ok(v) => {
            println!("{}", crate::pyjson::dumps(&v, &crate::pyjson::Style::PRETTY_SORTED));
            0
        }
        Err(e) => {
            eprintln!("xpackfs: {e}");
            1
        }
    }
}
