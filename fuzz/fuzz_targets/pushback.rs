//! `grpc-retry-pushback-ms`: `Pushback::parse` on any bytes, and `grpc_pushback` on header
//! maps holding one or two values.
//!
//! Checked against a model of the documented rule: an optional `-`, then one or more ASCII
//! digits whose value is at most `i32::MAX` (leading zeros allowed) gives `After(n ms)` when
//! `n >= 0` (`-0` is zero); everything else is `Stop`.

#![no_main]

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tower_retry_hedge::pushback::{Pushback, grpc_pushback};

const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// The rule of the module docs, written as plainly as possible.
fn model(bytes: &[u8]) -> Pushback {
    let (negative, digits) = match bytes.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, bytes),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Pushback::Stop;
    }
    let significant = match digits.iter().position(|&b| b != b'0') {
        Some(first) => &digits[first..],
        None => return Pushback::After(Duration::ZERO),
    };
    if negative || significant.len() > 10 {
        return Pushback::Stop;
    }
    let value = significant
        .iter()
        .fold(0u64, |value, &b| value * 10 + u64::from(b - b'0'));
    if value > i32::MAX as u64 {
        return Pushback::Stop;
    }
    Pushback::After(Duration::from_millis(value))
}

fuzz_target!(|data: &[u8]| {
    // The first byte says how many values the header map holds; the rest is split in two.
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let parsed = Pushback::parse(rest);
    assert_eq!(parsed, model(rest), "{rest:?}");
    if let Pushback::After(delay) = parsed {
        assert!(delay <= Duration::from_millis(i32::MAX as u64));
    }

    let mut headers = HeaderMap::new();
    match mode % 3 {
        0 => assert_eq!(grpc_pushback(&headers), None),
        1 => {
            let Ok(value) = HeaderValue::from_bytes(rest) else {
                return;
            };
            headers.insert(GRPC_RETRY_PUSHBACK_MS, value);
            assert_eq!(grpc_pushback(&headers), Some(parsed));
        }
        _ => {
            let (first, second) = rest.split_at(rest.len() / 2);
            let (Ok(first), Ok(second)) = (
                HeaderValue::from_bytes(first),
                HeaderValue::from_bytes(second),
            ) else {
                return;
            };
            headers.append(GRPC_RETRY_PUSHBACK_MS, first);
            headers.append(GRPC_RETRY_PUSHBACK_MS, second);
            assert_eq!(grpc_pushback(&headers), Some(Pushback::Stop));
        }
    }
});
