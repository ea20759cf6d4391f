//! Value parsers for options (`--key value` and `-o key=value` alike), each with its rule in
//! the message: ranges for numbers, powers of two, digests, plain file names, on/off.

use std::fmt::Display;

/// An integer within `min..=max`. Negative and overlong inputs get the range in the message,
/// not a parse error.
pub fn int_in<T>(min: T, max: T) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i128> + TryInto<i128> + Copy + Display + Send + Sync + 'static,
{
    let wide = |v: T| -> i128 { v.try_into().unwrap_or(i128::MAX) };
    let (lo, hi) = (wide(min), wide(max));
    move |s: &str| {
        let rule = || {
            if hi >= u32::MAX as i128 && lo <= 1 { format!("must be an integer of at least {min}") } else { format!("must be an integer from {min} to {max}") }
        };
        let v: i128 = s.trim().parse().map_err(|_| format!("{s:?} {}", rule()))?;
        if v < lo || v > hi {
            return Err(format!("{v} {}", rule()));
        }
        T::try_from(v).map_err(|_| format!("{v} {}", rule()))
    }
}

/// A power of two within `min..=max`.
pub fn power_of_two(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v = int_in::<u64>(min, max)(s).map_err(|e| format!("{e}, a power of two"))?;
        if !v.is_power_of_two() {
            return Err(format!("{v} is not a power of two (from {min} to {max})"));
        }
        Ok(v)
    }
}

/// A sha256 as 64 hex digits, lowercased.
pub fn hex64(s: &str) -> Result<String, String> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) { Ok(s.to_ascii_lowercase()) } else { Err(format!("{s:?} is not a sha256 (64 hex digits)")) }
}

/// A file name without directories.
pub fn plain_file_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains('/') || s.contains('\0') || s == "." || s == ".." || s.len() > 200 {
        return Err(format!("{s:?} is not a plain file name (no '/', at most 200 bytes)"));
    }
    Ok(s.to_string())
}

/// on/off (also true/false, yes/no, 1/0).
pub fn switch(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{s:?} is not on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_in_messages() {
        let threads = int_in::<u16>(1, 256);
        assert_eq!(threads("8"), Ok(8));
        assert!(threads("0").unwrap_err().contains("from 1 to 256"));
        assert!(threads("-1").unwrap_err().contains("from 1 to 256"));
        assert!(threads("99999999999999999999999999999999999999999").unwrap_err().contains("from 1 to 256"));
        assert!(int_in::<u64>(1, u64::MAX)("0").unwrap_err().contains("at least 1"));
        let align = power_of_two(1, 1 << 30);
        assert_eq!(align("65536"), Ok(65536));
        assert!(align("3000").unwrap_err().contains("power of two"));
        assert!(align("1099511627776").unwrap_err().contains("from 1 to 1073741824"));
        assert!(hex64("abc").unwrap_err().contains("64 hex"));
        assert!(plain_file_name("../x").unwrap_err().contains("plain file name"));
        assert_eq!(switch("off"), Ok(false));
    }
}
