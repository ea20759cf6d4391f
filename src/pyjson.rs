//! `json.dumps` as CPython writes it, for manifests that must match the seeds byte for
//! byte: key order (insertion or sorted), `indent`, `separators`, `ensure_ascii`, and
//! float `repr` (`1e-05`, `1e+16`, `12.0`).

use serde_json::Value;

#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub indent: Option<usize>,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
    pub item_sep: &'static str,
    pub key_sep: &'static str,
}

impl Style {
    /// `json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False)` (the seeds' manifests).
    pub const PRETTY_SORTED: Style = Style { indent: Some(2), sort_keys: true, ensure_ascii: false, item_sep: ",", key_sep: ": " };
    /// `json.dumps(v, sort_keys=True, separators=(",", ":"))` (canonical hashing).
    pub const CANONICAL: Style = Style { indent: None, sort_keys: true, ensure_ascii: true, item_sep: ",", key_sep: ":" };
    /// `json.dumps(v, separators=(",", ":"))` (insertion order).
    pub const COMPACT: Style = Style { indent: None, sort_keys: false, ensure_ascii: true, item_sep: ",", key_sep: ":" };
    /// `json.dumps(v, sort_keys=True)` (default separators).
    pub const DEFAULT_SORTED: Style = Style { indent: None, sort_keys: true, ensure_ascii: true, item_sep: ", ", key_sep: ": " };
}

pub fn dumps(value: &Value, style: &Style) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style, 0);
    out
}

fn newline(out: &mut String, style: &Style, depth: usize) {
    if let Some(n) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                out.push_str(&float_repr(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Value::String(s) => write_string(out, s, style.ensure_ascii),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_sep);
                }
                newline(out, style, depth + 1);
                write_value(out, item, style, depth + 1);
            }
            newline(out, style, depth);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_sep);
                }
                newline(out, style, depth + 1);
                write_string(out, k, style.ensure_ascii);
                out.push_str(style.key_sep);
                write_value(out, v, style, depth + 1);
            }
            newline(out, style, depth);
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// CPython's `repr(float)`: shortest round-trip digits, exponent form when the decimal
/// exponent is < -4 or >= 16.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1; // value = 0.DIGITS * 10^decpt
    if !(-4 < decpt && decpt <= 16) {
        let rest = &digits[1..];
        let m = if rest.is_empty() { digits[..1].to_string() } else { format!("{}.{}", &digits[..1], rest) };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{m}e{esign}{:02}", exp.abs());
    }
    let n = digits.len() as i32;
    if decpt <= 0 {
        format!("{sign}0.{}{}", "0".repeat((-decpt) as usize), digits)
    } else if decpt >= n {
        format!("{sign}{}{}.0", digits, "0".repeat((decpt - n) as usize))
    } else {
        format!("{sign}{}.{}", &digits[..decpt as usize], &digits[decpt as usize..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_like_cpython() {
        // Expected strings are what CPython 3.11 prints for repr() of each value.
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (-2.5e-7, "-2.5e-07"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (0.30000000000000004, "0.30000000000000004"),
        ];
        for (f, s) in cases {
            assert_eq!(float_repr(f), s);
        }
    }

    #[test]
    fn pretty_sorted_like_json_dumps() {
        let v = json!({"b": [1, {"z": [], "a": {}}], "a": "é\u{7f}\"\n", "c": null});
        assert_eq!(
            dumps(&v, &Style::PRETTY_SORTED),
            "{\n  \"a\": \"é\u{7f}\\\"\\n\",\n  \"b\": [\n    1,\n    {\n      \"a\": {},\n      \"z\": []\n    }\n  ],\n  \"c\": null\n}"
        );
        assert_eq!(dumps(&v, &Style::CANONICAL), "{\"a\":\"\\u00e9\\u007f\\\"\\n\",\"b\":[1,{\"a\":{},\"z\":[]}],\"c\":null}");
        assert_eq!(dumps(&json!({"k": "\u{1F600}"}), &Style::DEFAULT_SORTED), "{\"k\": \"\\ud83d\\ude00\"}");
        assert_eq!(dumps(&v, &Style::COMPACT), "{\"b\":[1,{\"z\":[],\"a\":{}}],\"a\":\"\\u00e9\\u007f\\\"\\n\",\"c\":null}");
    }
}
