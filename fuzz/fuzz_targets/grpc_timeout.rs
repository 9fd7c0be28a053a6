//! `grpc-timeout`: `parse` on any header value, and `encode` on any duration, with the round
//! trips the module documents.
//!
//! - `parse` accepts exactly 1 to 8 ASCII digits then one of `H M S m u n`, and its value is
//!   the digits times the unit;
//! - a parsed value encodes back to a value that parses to the same duration;
//! - `encode(d)` is a valid value of at most 9 bytes that parses to `e` with
//!   `min(d, MAX_TIMEOUT) <= e`, `e - d` below one unit of the encoding, `e <= MAX_TIMEOUT`,
//!   and `e > 0` whenever `d > 0`.

#![no_main]

use std::time::Duration;

use http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use tower_retry_hedge::grpc_timeout::{encode, parse};

/// The longest timeout the format carries, `99999999H`.
const MAX_TIMEOUT: Duration = Duration::from_secs(99_999_999 * 3600);

fn unit_nanos(unit: u8) -> Option<u128> {
    Some(match unit {
        b'H' => 3_600_000_000_000,
        b'M' => 60_000_000_000,
        b'S' => 1_000_000_000,
        b'm' => 1_000_000,
        b'u' => 1_000,
        b'n' => 1,
        _ => return None,
    })
}

/// The rule of the module docs, as a plain model.
fn model(bytes: &[u8]) -> Option<Duration> {
    let (&unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value: u128 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let nanos = value * unit_nanos(unit)?;
    Some(Duration::new(
        u64::try_from(nanos / 1_000_000_000).ok()?,
        u32::try_from(nanos % 1_000_000_000).ok()?,
    ))
}

fn check_encoding(duration: Duration) {
    let encoded = encode(duration);
    let bytes = encoded.as_bytes();
    assert!(
        !bytes.is_empty() && bytes.len() <= 9,
        "{duration:?} -> {encoded:?}"
    );
    let Some(decoded) = parse(&encoded) else {
        panic!("{duration:?} encodes as {encoded:?}, which does not parse");
    };
    let unit = unit_nanos(bytes[bytes.len() - 1]).unwrap_or_default();
    assert!(decoded <= MAX_TIMEOUT, "{duration:?} -> {encoded:?}");
    assert!(
        decoded >= duration.min(MAX_TIMEOUT),
        "{duration:?} -> {encoded:?}"
    );
    if duration <= MAX_TIMEOUT {
        assert!(
            decoded.as_nanos() - duration.as_nanos() < unit,
            "{duration:?} -> {encoded:?}: more than one unit over"
        );
    }
    assert_eq!(
        decoded.is_zero(),
        duration.is_zero(),
        "{duration:?} -> {encoded:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    // Any bytes as a header value.
    if let Ok(value) = HeaderValue::from_bytes(data) {
        let parsed = parse(&value);
        assert_eq!(parsed, model(data), "{value:?}");
        if let Some(timeout) = parsed {
            // What was read is exactly representable: it encodes and parses back unchanged.
            assert_eq!(parse(&encode(timeout)), Some(timeout), "{value:?}");
        }
    }
    // The first 12 bytes as a duration (seconds, nanoseconds).
    if let Some(head) = data.get(..12) {
        let (secs, nanos) = head.split_at(8);
        let secs = u64::from_le_bytes(secs.try_into().unwrap_or_default());
        let nanos = u32::from_le_bytes(nanos.try_into().unwrap_or_default()) % 1_000_000_000;
        // Small durations are where the unit choice is subtle: scale some down.
        let duration = match data.get(12).copied().unwrap_or(0) % 4 {
            0 => Duration::new(secs, nanos),
            1 => Duration::new(secs % 100_000_000, nanos),
            2 => Duration::new(secs % 1_000, nanos),
            _ => Duration::from_nanos(u64::from(nanos)),
        };
        check_encoding(duration);
    }
});
