//! Value parsers for options (`--key value` and `-o key=value` alike), each with its rule in
//! the message: ranges for numbers, powers of two, digests, plain file names, on/off. Their
//! refusal is an [`InvalidValue`], which the option parsers of the layers use too.

use std::fmt::Display;

/// A value an option refuses: the value as the message shows it (as given, quoted; or the
/// number it parsed to) and the rule it breaks. Clap shows it after the option's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{shown} {rule}")]
pub struct InvalidValue {
    shown: String,
    rule: String,
}

impl InvalidValue {
    /// `s`, the value as given, breaks `rule`.
    pub fn given(s: &str, rule: impl Into<String>) -> Self {
        InvalidValue { shown: format!("{s:?}"), rule: rule.into() }
    }

    /// `v`, the number the value parsed to, breaks `rule`.
    pub fn number(v: impl Display, rule: impl Into<String>) -> Self {
        InvalidValue { shown: v.to_string(), rule: rule.into() }
    }
}

/// An integer within `min..=max`. Negative and overlong inputs get the range in the message,
/// not a parse error.
pub fn int_in<T>(min: T, max: T) -> impl Fn(&str) -> Result<T, InvalidValue> + Clone + Send + Sync + 'static
where
    T: TryFrom<i128> + TryInto<i128> + Copy + Display + Send + Sync + 'static,
{
    let wide = |v: T| -> i128 { v.try_into().unwrap_or(i128::MAX) };
    let (lo, hi) = (wide(min), wide(max));
    move |s: &str| {
        let rule = || {
            if hi >= u32::MAX as i128 && lo <= 1 { format!("must be an integer of at least {min}") } else { format!("must be an integer from {min} to {max}") }
        };
        let v: i128 = s.trim().parse().map_err(|_| InvalidValue::given(s, rule()))?;
        if v < lo || v > hi {
            return Err(InvalidValue::number(v, rule()));
        }
        T::try_from(v).map_err(|_| InvalidValue::number(v, rule()))
    }
}

/// A power of two within `min..=max`.
pub fn power_of_two(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, InvalidValue> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v = int_in::<u64>(min, max)(s).map_err(|e| InvalidValue { rule: format!("{}, a power of two", e.rule), ..e })?;
        if !v.is_power_of_two() {
            return Err(InvalidValue::number(v, format!("is not a power of two (from {min} to {max})")));
        }
        Ok(v)
    }
}

/// A sha256 as 64 hex digits, lowercased.
pub fn hex64(s: &str) -> Result<String, InvalidValue> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(InvalidValue::given(s, "is not a sha256 (64 hex digits)"))
    }
}

/// A file name without directories.
pub fn plain_file_name(s: &str) -> Result<String, InvalidValue> {
    if s.is_empty() || s.contains('/') || s.contains('\0') || s == "." || s == ".." || s.len() > 200 {
        return Err(InvalidValue::given(s, "is not a plain file name (no '/', at most 200 bytes)"));
    }
    Ok(s.to_string())
}

/// on/off (also true/false, yes/no, 1/0).
pub fn switch(s: &str) -> Result<bool, InvalidValue> {
    match s {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(InvalidValue::given(s, "is not on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_in_messages() {
        let threads = int_in::<u16>(1, 256);
        assert_eq!(threads("8"), Ok(8));
        assert!(threads("0").unwrap_err().to_string().contains("from 1 to 256"));
        assert!(threads("-1").unwrap_err().to_string().contains("from 1 to 256"));
        assert!(threads("99999999999999999999999999999999999999999").unwrap_err().to_string().contains("from 1 to 256"));
        assert!(int_in::<u64>(1, u64::MAX)("0").unwrap_err().to_string().contains("at least 1"));
        let align = power_of_two(1, 1 << 30);
        assert_eq!(align("65536"), Ok(65536));
        assert!(align("3000").unwrap_err().to_string().contains("power of two"));
        assert!(align("1099511627776").unwrap_err().to_string().contains("from 1 to 1073741824"));
        assert!(hex64("abc").unwrap_err().to_string().contains("64 hex"));
        assert!(plain_file_name("../x").unwrap_err().to_string().contains("plain file name"));
        assert_eq!(switch("off"), Ok(false));
    }
}
