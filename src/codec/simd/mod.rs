//! Runtime-dispatched SIMD versions of the codecs, bit-exact with the scalar ones.
//!
//! The scalar code in `codec::*` is the reference and the fallback (and all that exists
//! on other targets). Here each lane of a vector carries one independent block, sub-block,
//! row or search candidate through exactly the scalar operations in the same order: no
//! fused multiply-add, no reassociation, the same `nearest_int` bit trick; branches become
//! per-lane masks. So every level gives the same bytes, and the tests check that at every
//! level the machine has.
//!
//! The level ([`Level`]) is chosen once per process: the best the CPU has
//! (`is_x86_feature_detected!`), or `XPACKFS_SIMD=scalar|avx2|avx512` (lower levels only:
//! a level the CPU lacks falls back to the best it has, and [`level_note`] says why).
//! Kernels are written once against the small [`Simd`] trait over `std::arch` intrinsics
//! and instantiated for AVX2 (8 lanes) and AVX-512 (16 lanes) inside
//! `#[target_feature]` functions; a `Simd` value exists only once the features are known
//! to be present, which is what makes the intrinsics sound to call.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub(crate) mod decode;
#[cfg(target_arch = "x86_64")]
pub(crate) mod iq2_xxs;
#[cfg(target_arch = "x86_64")]
pub(crate) mod iq4_nl;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kquants;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kt_int8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q2_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q3_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q4_0;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q4_1;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q4_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q6_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q8_0;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// A dispatch level. Ordered: a level implies the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Scalar,
    /// AVX2 + F16C, 8 f32 lanes.
    Avx2,
    /// AVX-512 F + BW + VL (+ AVX2, F16C), 16 f32 lanes.
    Avx512,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Scalar, Level::Avx2, Level::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name().eq_ignore_ascii_case(name.trim()))
    }

    /// f32 lanes per vector at this level.
    pub fn lanes(self) -> usize {
        match self {
            Level::Scalar => 1,
            Level::Avx2 => 8,
            Level::Avx512 => 16,
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The best level this CPU supports.
pub fn detected() -> Level {
    static D: OnceLock<Level> = OnceLock::new();
    *D.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if x86::Avx512::new().is_some() {
                return Level::Avx512;
            }
            if x86::Avx2::new().is_some() {
                return Level::Avx2;
            }
        }
        Level::Scalar
    })
}

/// Every level this CPU can run, lowest first (what the tests iterate over).
pub fn available() -> Vec<Level> {
    Level::ALL.into_iter().filter(|&l| l <= detected()).collect()
}

struct Chosen {
    level: Level,
    note: Option<String>,
}

fn chosen() -> &'static Chosen {
    static C: OnceLock<Chosen> = OnceLock::new();
    C.get_or_init(|| choose(std::env::var("XPACKFS_SIMD").ok().as_deref(), detected()))
}

fn choose(env: Option<&str>, best: Level) -> Chosen {
    match env.map(str::trim).filter(|v| !v.is_empty()) {
        None => Chosen { level: best, note: None },
        Some(v) => match Level::from_name(v) {
            Some(l) if l <= best => Chosen { level: l, note: Some(format!("forced by XPACKFS_SIMD={v}")) },
            Some(l) => Chosen { level: best, note: Some(format!("XPACKFS_SIMD={v} asks for {l}, which this CPU lacks; using {best}")) },
            None => Chosen { level: best, note: Some(format!("XPACKFS_SIMD={v:?} is not one of scalar, avx2, avx512; using {best}")) },
        },
    }
}

/// The level the codecs use in this process (read once, at first use).
pub fn level() -> Level {
    chosen().level
}

/// Why [`level`] is not simply the best detected level (forced, or a request refused).
pub fn level_note() -> Option<&'static str> {
    chosen().note.as_deref()
}

/// `avx512` or `avx2 (forced by XPACKFS_SIMD=avx2)`: for `--version`, logs and stats.
pub fn describe() -> String {
    match level_note() {
        Some(n) => format!("{} ({n})", level()),
        None => level().name().to_string(),
    }
}

/// A requested level, lowered to what this CPU can run (so no caller can reach an
/// instruction the CPU lacks).
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn clamp(level: Level) -> Level {
    level.min(detected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_choice() {
        assert_eq!(choose(None, Level::Avx512).level, Level::Avx512);
        assert_eq!(choose(Some(""), Level::Avx2).level, Level::Avx2);
        let c = choose(Some("AVX2"), Level::Avx512);
        assert_eq!((c.level, c.note.is_some()), (Level::Avx2, true));
        let c = choose(Some("avx512"), Level::Avx2);
        assert_eq!(c.level, Level::Avx2);
        assert!(c.note.unwrap().contains("lacks"));
        let c = choose(Some("sse9"), Level::Scalar);
        assert_eq!(c.level, Level::Scalar);
        assert!(c.note.unwrap().contains("not one of"));
        assert_eq!(choose(Some("scalar"), Level::Avx512).level, Level::Scalar);
    }

    #[test]
    fn clamp_never_exceeds_the_cpu() {
        for l in Level::ALL {
            assert!(clamp(l) <= detected());
        }
        assert_eq!(available().first(), Some(&Level::Scalar));
    }
}
