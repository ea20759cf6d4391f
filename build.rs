// 1. Records the git revision the binary is built from (manifests carry it as builder.git_sha).
// 2. Builds the IQ2_XXS search tables at compile time (the quantiser's start-up used to
//    spend ~0.5 s on them): what ggml's `iq2xs_init_impl(GGML_TYPE_IQ2_XXS)` builds, from
//    the grid in src/codec/iq2_tables.rs. See src/codec/iq2_xxs.rs (`Tables`).
use std::path::PathBuf;

fn main() {
    let sha = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=XPACKFS_GIT_SHA={sha}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/codec/iq2_tables.rs");
    iq2xxs_tables();
}

const KMAP_SIZE: usize = 43692;
const NWANT: usize = 2;
/// Zeros after the last neighbour list, so a 16-lane load from any list stays in bounds.
const PAD: usize = 16;

fn kgrid() -> Vec<u16> {
    let text = std::fs::read_to_string("src/codec/iq2_tables.rs").expect("src/codec/iq2_tables.rs");
    let start = text.find("KGRID_2BIT_256: [u16; 256] = [").expect("KGRID_2BIT_256 in iq2_tables.rs");
    let body = &text[start..];
    let body = &body[body.find('=').unwrap() + 1..];
    let body = &body[body.find('[').unwrap() + 1..body.find(']').unwrap()];
    let v: Vec<u16> = body.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    assert_eq!(v.len(), 256);
    v
}

/// The map (43692 x i32): a grid point's key -> its grid index; any other key ->
/// `-(offset + 1)`, `offset` into the neighbour lists. The lists (u16): at each offset a
/// count, then that many grid points (as keys: 2 bits per coordinate), all those at the
/// two smallest distances, ordered by (distance, grid index) as ggml's qsort orders them.
#[allow(clippy::needless_range_loop)] // i is both the key and its index in the map
fn iq2xxs_tables() {
    let kgrid = kgrid();
    let levels: Vec<[i32; 8]> = kgrid.iter().map(|&g| std::array::from_fn(|k| ((g >> (2 * k)) & 3) as i32)).collect();
    let mut map = vec![-1i32; KMAP_SIZE];
    for (j, &g) in kgrid.iter().enumerate() {
        map[g as usize] = j as i32;
    }
    let mut lists: Vec<u16> = Vec::new();
    let mut d2 = [0i32; 256];
    for i in 0..KMAP_SIZE {
        if map[i] >= 0 {
            continue;
        }
        let pos: [i32; 8] = std::array::from_fn(|k| ((i >> (2 * k)) & 3) as i32);
        for (d, g) in d2.iter_mut().zip(&levels) {
            // (2g+1 - (2p+1))^2 summed: the reference's integer distance.
            *d = (0..8).map(|k| 4 * (g[k] - pos[k]) * (g[k] - pos[k])).sum();
        }
        let mut want = [i32::MAX; NWANT];
        for &d in &d2 {
            if d < want[0] {
                want[1] = want[0];
                want[0] = d;
            } else if d > want[0] && d < want[1] {
                want[1] = d;
            }
        }
        let start = lists.len();
        map[i] = -(start as i32 + 1);
        lists.push(0);
        for w in want {
            for (j, &d) in d2.iter().enumerate() {
                if d == w {
                    lists.push(kgrid[j]);
                }
            }
        }
        lists[start] = (lists.len() - start - 1) as u16;
    }
    lists.extend([0u16; PAD]);
    let big = std::env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() == Ok("big");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let map_bytes: Vec<u8> = map.iter().flat_map(|v| if big { v.to_be_bytes() } else { v.to_le_bytes() }).collect();
    let list_bytes: Vec<u8> = lists.iter().flat_map(|v| if big { v.to_be_bytes() } else { v.to_le_bytes() }).collect();
    std::fs::write(out.join("iq2xxs_map.bin"), map_bytes).unwrap();
    std::fs::write(out.join("iq2xxs_neighbours.bin"), list_bytes).unwrap();
}
