#![no_main]
//! The value-counting pass in front of every untrusted JSON file (source::json): it must
//! accept exactly what serde_json parses, count at most the cap, and never allocate per value.
use libfuzzer_sys::fuzz_target;
use xpackfs::source::json::{JsonError, check_values};

fuzz_target!(|data: &[u8]| {
    let parsed = serde_json::from_slice::<serde_json::Value>(data);
    match (check_values(data, 1 << 20), &parsed) {
        (Ok(()), Err(e)) => panic!("counted as valid, but serde_json says {e}"),
        (Err(JsonError::Syntax(e)), Ok(_)) => panic!("serde_json parses it, the count pass says {e}"),
        _ => {}
    }
    if let Ok(v) = &parsed {
        fn count(v: &serde_json::Value) -> u64 {
            match v {
                serde_json::Value::Array(a) => 1 + a.iter().map(count).sum::<u64>(),
                serde_json::Value::Object(m) => 1 + m.values().map(|x| 1 + count(x)).sum::<u64>(),
                _ => 1,
            }
        }
        let n = count(v);
        // Duplicate keys collapse in a Value, so the pass may count more, never fewer.
        assert!(check_values(data, n.saturating_sub(1)).is_err(), "{n} values fit a cap of {}", n - 1);
    }
});
