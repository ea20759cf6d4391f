//! Untrusted JSON files (`config.json`, safetensors indexes, INT8 manifests): regular files
//! only, a byte cap checked before reading, and a cap on the number of JSON values checked
//! by a first pass that allocates nothing, before the document is built as a
//! [`serde_json::Value`] (whose size is about 100 bytes per value, so the value cap is what
//! bounds memory). Nesting is bounded by serde_json's recursion limit (128).
//!
//! No indexing that could panic here (`clippy::indexing_slicing` is denied).
#![deny(clippy::indexing_slicing)]

use std::cell::Cell;
use std::path::Path;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::SourceError;
use super::file::regular_err;
use crate::fsutil;

/// Why a JSON file was not read.
#[derive(Debug)]
pub enum JsonError {
    /// Not a regular file, missing, unreadable.
    Source(SourceError),
    TooLarge {
        len: u64,
        cap: u64,
    },
    TooManyValues {
        cap: u64,
    },
    NotUtf8(std::str::Utf8Error),
    Syntax(serde_json::Error),
}

/// Counts values (and object keys) without building them; fails past `max`.
struct Count<'a> {
    n: &'a Cell<u64>,
    max: u64,
    over: &'a Cell<bool>,
}

impl Count<'_> {
    fn bump<E: serde::de::Error>(&self) -> Result<(), E> {
        self.n.set(self.n.get() + 1);
        if self.n.get() > self.max {
            self.over.set(true);
            return Err(E::custom("too many JSON values"));
        }
        Ok(())
    }
    fn again(&self) -> Count<'_> {
        Count { n: self.n, max: self.max, over: self.over }
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.bump()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.bump()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.bump()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.bump()
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.bump()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.bump()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.bump()?;
        while seq.next_element_seed(self.again())?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.bump()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            self.bump()?;
            map.next_value_seed(self.again())?;
        }
        Ok(())
    }
}

/// Check that `text` is one JSON document of at most `max_values` values (keys included).
pub fn check_values(text: &[u8], max_values: u64) -> Result<(), JsonError> {
    let (n, over) = (Cell::new(0), Cell::new(false));
    let mut de = serde_json::Deserializer::from_slice(text);
    let r = Count { n: &n, max: max_values, over: &over }.deserialize(&mut de).and_then(|()| de.end());
    match r {
        Err(_) if over.get() => Err(JsonError::TooManyValues { cap: max_values }),
        Err(e) => Err(JsonError::Syntax(e)),
        Ok(()) => Ok(()),
    }
}

/// Read a JSON file within the caps.
pub fn read_capped(path: &Path, max_bytes: u64, max_values: u64) -> Result<serde_json::Value, JsonError> {
    let text = if super::remote::is_remote(path) {
        match super::remote::stat(path).map_err(|e| JsonError::Source(e.into()))? {
            Some(super::remote::Kind::File(m)) if m.size > max_bytes => return Err(JsonError::TooLarge { len: m.size, cap: max_bytes }),
            _ => super::remote::read_capped(path, max_bytes).map_err(|e| JsonError::Source(e.into()))?,
        }
    } else {
        fsutil::read_bounded(path, max_bytes).map_err(|e| match e {
            fsutil::LimitedError::Regular(e) => JsonError::Source(regular_err(path, e)),
            fsutil::LimitedError::TooLarge { len, cap } => JsonError::TooLarge { len, cap },
        })?
    };
    std::str::from_utf8(&text).map_err(JsonError::NotUtf8)?;
    check_values(&text, max_values)?;
    serde_json::from_slice(&text).map_err(JsonError::Syntax)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_before_anything_is_built() {
        // 10 values: the object, key a, the array, 1, 2, the inner object, key b, null, key c, "x".
        assert!(check_values(br#"{"a": [1, 2, {"b": null}], "c": "x"}"#, 10).is_ok());
        assert!(matches!(check_values(br#"{"a": [1, 2, {"b": null}], "c": "x"}"#, 9), Err(JsonError::TooManyValues { cap: 9 })));
        assert!(matches!(check_values(b"[1, 2", 100), Err(JsonError::Syntax(_))));
        assert!(matches!(check_values(b"[1] 2", 100), Err(JsonError::Syntax(_))));
        let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        match check_values(deep.as_bytes(), 1 << 20) {
            Err(JsonError::Syntax(e)) => assert!(e.to_string().contains("recursion limit exceeded"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn caps_and_file_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        std::fs::write(&p, b"{\"k\": [1, 2, 3]}").unwrap();
        assert_eq!(read_capped(&p, 100, 100).unwrap()["k"][2], 3);
        assert!(matches!(read_capped(&p, 10, 100), Err(JsonError::TooLarge { len: 16, cap: 10 })));
        assert!(matches!(read_capped(&p, 100, 3), Err(JsonError::TooManyValues { cap: 3 })));
        std::fs::write(&p, b"{\"k\": \"\xff\"}").unwrap();
        assert!(matches!(read_capped(&p, 100, 100), Err(JsonError::NotUtf8(_))));
        match read_capped(dir.path(), 100, 100) {
            Err(JsonError::Source(e)) => assert!(e.to_string().ends_with("is a directory, not a regular file"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
