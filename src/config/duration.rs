//! proto3 JSON durations (`"0.1s"`), as the service config writes them.

use std::fmt;
use std::time::Duration;

use super::MAX_DURATION_SECONDS;

/// Why a string is not a non-negative proto3 JSON duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DurationError {
    /// The string does not end with `s`.
    MissingSuffix,
    /// The number before the `s` is not `-?(0|[1-9][0-9]*)(\.[0-9]+)?`.
    Malformed,
    /// More than 9 digits after the decimal point (finer than a nanosecond).
    TooManyFractionDigits,
    /// More than 315 576 000 000 seconds (either sign).
    OutOfRange,
    /// A well-formed duration below zero.
    Negative,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DurationError::MissingSuffix => "duration must end with 's'",
            DurationError::Malformed => {
                "duration must be a decimal number of seconds without exponent, such as \"1.5s\""
            }
            DurationError::TooManyFractionDigits => {
                "duration must have at most 9 digits after the decimal point"
            }
            DurationError::OutOfRange => "duration must be within 315576000000 seconds",
            DurationError::Negative => "duration must not be negative",
        })
    }
}

impl std::error::Error for DurationError {}

/// Parses a proto3 JSON duration (the content of the JSON string, without quotes):
/// an optional `-`, whole seconds, optionally `.` and 1 to 9 digits, and `s`.
///
/// The grammar is exact: no `+`, no exponent, no whitespace, no leading zeros (`"01s"`),
/// no `".5s"` nor `"1.s"` (A6 requires the number to be a valid JSON number; the
/// protobuf reference parser rejects these two as well). Seconds range over
/// ±315 576 000 000 seconds (10 000 years, as protobuf's `Duration`). No floating point is
/// involved.
///
/// Negative durations are valid proto3 but no A6 field allows them, so they are
/// reported as [`DurationError::Negative`]; `"-0s"` and `"-0.000s"` are zero.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let number = s.strip_suffix('s').ok_or(DurationError::MissingSuffix)?;
    let (negative, unsigned) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number),
    };
    let (whole, fraction) = match unsigned.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (unsigned, None),
    };

    let whole_is_json = match whole.as_bytes() {
        [] => false,
        [b'0'] => true,
        [b'0', ..] => false,
        digits => digits.iter().all(u8::is_ascii_digit),
    };
    if !whole_is_json {
        return Err(DurationError::Malformed);
    }

    let mut nanos: u32 = 0;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return Err(DurationError::Malformed);
        }
        if fraction.len() > 9 {
            return Err(DurationError::TooManyFractionDigits);
        }
        let mut scale = 100_000_000;
        for digit in fraction.bytes() {
            nanos += u32::from(digit - b'0') * scale;
            scale /= 10;
        }
    }

    let mut seconds: u64 = 0;
    for digit in whole.bytes() {
        seconds = seconds
            .checked_mul(10)
            .and_then(|s| s.checked_add(u64::from(digit - b'0')))
            .filter(|s| *s <= MAX_DURATION_SECONDS)
            .ok_or(DurationError::OutOfRange)?;
    }

    if negative && (seconds > 0 || nanos > 0) {
        return Err(DurationError::Negative);
    }
    Ok(Duration::new(seconds, nanos))
}

/// Formats a duration the way protobuf writes proto3 JSON durations: whole seconds,
/// then 0, 3, 6 or 9 fractional digits, then `s` (`"1s"`, `"0.100s"`,
/// `"1.000000001s"`).
///
/// The result parses back with [`parse_duration`] when the duration is at most
/// 315 576 000 000 seconds long, which every duration of a parsed config is.
pub(crate) fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let nanos = duration.subsec_nanos();
    if nanos == 0 {
        format!("{seconds}s")
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{seconds}.{nanos:09}s")
    }
}
