//! Small helpers shared by every layer: hex digests, Python-compatible UTC timestamps, the
//! value parsers of options ([`args`]) and the progress thread of long commands
//! ([`ticker`]).

pub mod args;
pub mod ticker;

use sha2::{Digest, Sha256};

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
    fn utc_like_python_isoformat() {
        // datetime.fromtimestamp(t, timezone.utc).isoformat()
        assert_eq!(format_utc(0, 0), "1970-01-01T00:00:00+00:00");
        assert_eq!(format_utc(1_798_598_417, 123_456), "2026-12-30T02:40:17.123456+00:00");
        assert_eq!(format_utc(951_782_400, 5), "2000-02-29T00:00:00.000005+00:00");
    }
}
