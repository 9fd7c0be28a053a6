//! The `grpc-timeout` request header: parse it, and encode the time an attempt has left.
//!
//! The gRPC wire format ("gRPC over HTTP2", `Timeout → TimeoutValue TimeoutUnit`) is one to
//! eight ASCII digits followed by one unit letter:
//!
//! | unit | meaning |
//! |---|---|
//! | `H` | hours |
//! | `M` | minutes |
//! | `S` | seconds |
//! | `m` | milliseconds |
//! | `u` | microseconds |
//! | `n` | nanoseconds |
//!
//! The retry and hedge layers read it from a request to learn the call's deadline, and
//! rewrite it on every later attempt with the time that remains.
//!
//! [`parse`] is strict, as the value may come from anywhere: no sign, no whitespace, no
//! ninth digit, no other unit. It accepts leading zeros and zero itself (`0S` is a deadline
//! that has already passed), as grpc-go and tonic do.
//!
//! [`encode`] writes the shortest valid form. When a unit represents the duration exactly
//! in at most eight digits it uses the coarsest such unit (`1S`, `1500m`, `2H`); otherwise
//! it uses the finest unit that fits, rounding up, as grpc-go does, so a deadline is
//! never reported shorter than it is, at most one unit longer, and a non-zero duration is
//! never encoded as zero. Durations beyond the longest the format carries are encoded as
//! `99999999H` (about 11 400 years).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderValue;
//! use tower_retry_hedge::grpc_timeout;
//!
//! assert_eq!(grpc_timeout::parse(&HeaderValue::from_static("100m")), Some(Duration::from_millis(100)));
//! assert_eq!(grpc_timeout::parse(&HeaderValue::from_static("1.5S")), None);
//!
//! assert_eq!(grpc_timeout::encode(Duration::from_secs(1)), "1S");
//! assert_eq!(grpc_timeout::encode(Duration::from_millis(1500)), "1500m");
//! ```
//!
//! Reading a request's deadline, then stamping a later attempt with what remains of it:
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, HeaderName, HeaderValue};
//! use tower_retry_hedge::grpc_timeout;
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("grpc-timeout", HeaderValue::from_static("2S"));
//! // The first value, as tonic's server and `HeaderMap::get` read it.
//! let timeout = headers.get("grpc-timeout").and_then(grpc_timeout::parse);
//! let deadline = timeout.unwrap_or(Duration::MAX);
//!
//! let elapsed = Duration::from_nanos(1_234_567_891);
//! let remaining = deadline.saturating_sub(elapsed);
//! headers.insert("grpc-timeout", grpc_timeout::encode(remaining));
//! // 765_432_109 ns needs nine digits in `n`: rounded up to whole microseconds.
//! assert_eq!(headers["grpc-timeout"], "765433u");
//! ```

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The gRPC request header that carries the call's timeout.
pub(crate) const GRPC_TIMEOUT: &str = "grpc-timeout";

/// [`GRPC_TIMEOUT`] as a header name: looking a `&str` up parses it on every call.
pub(crate) const GRPC_TIMEOUT_NAME: HeaderName = HeaderName::from_static(GRPC_TIMEOUT);

/// The largest value eight digits hold.
const MAX_VALUE: u64 = 99_999_999;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// The units with their length in nanoseconds, coarsest first.
const UNITS: [(u8, u64); 6] = [
    (b'H', 3600 * NANOS_PER_SECOND),
    (b'M', 60 * NANOS_PER_SECOND),
    (b'S', NANOS_PER_SECOND),
    (b'm', 1_000_000),
    (b'u', 1_000),
    (b'n', 1),
];

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits, then one unit among `H`, `M`, `S`,
/// `m`, `u`, `n`. Anything else is `None`.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tower_retry_hedge::grpc_timeout::parse;
///
/// assert_eq!(parse(&HeaderValue::from_static("99999999H")), Some(Duration::from_secs(99_999_999 * 3600)));
/// assert_eq!(parse(&HeaderValue::from_static("0n")), Some(Duration::ZERO));
/// assert_eq!(parse(&HeaderValue::from_static("123456789n")), None); // nine digits
/// assert_eq!(parse(&HeaderValue::from_static("1s")), None); // `s` is not a unit
/// ```
pub fn parse(value: &HeaderValue) -> Option<Duration> {
    let (&unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let value = digits.iter().try_fold(0u64, |value, &byte| {
        let digit = byte.checked_sub(b'0').filter(|d| *d <= 9)?;
        // At most eight digits: cannot overflow.
        Some(value * 10 + u64::from(digit))
    })?;
    // `value <= 99_999_999`, so even hours fit in a u64 of seconds.
    Some(match unit {
        b'H' => Duration::from_secs(value * 3600),
        b'M' => Duration::from_secs(value * 60),
        b'S' => Duration::from_secs(value),
        b'm' => Duration::from_millis(value),
        b'u' => Duration::from_micros(value),
        b'n' => Duration::from_nanos(value),
        _ => return None,
    })
}

/// Reads `grpc-timeout` from request headers: `None` if it is absent or invalid. Only the
/// first value is read, as tonic's server and [`HeaderMap::get`] do, so a layer and the
/// server it calls agree on the deadline.
pub(crate) fn from_headers(headers: &HeaderMap) -> Option<Duration> {
    headers.get(GRPC_TIMEOUT_NAME).and_then(parse)
}

/// Encodes `timeout` as a `grpc-timeout` value in the shortest valid form.
///
/// Exact when some unit represents it in at most eight digits (the coarsest such unit,
/// which has the fewest digits); otherwise the finest unit that fits, rounded up, so the
/// value read back is at least `timeout` and less than one unit more. Zero is `0n`;
/// anything above `99999999H` (about 11 400 years) is `99999999H`.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::grpc_timeout::encode;
///
/// assert_eq!(encode(Duration::from_secs(7200)), "2H");
/// assert_eq!(encode(Duration::from_secs(90)), "90S");
/// assert_eq!(encode(Duration::from_nanos(1)), "1n");
/// assert_eq!(encode(Duration::from_nanos(100_000_001)), "100001u"); // rounded up
/// assert_eq!(encode(Duration::MAX), "99999999H");
/// ```
pub fn encode(timeout: Duration) -> HeaderValue {
    let nanos = timeout.as_nanos();
    if nanos == 0 {
        return HeaderValue::from_static("0n");
    }

    // Exact: the coarsest unit that divides the duration has the fewest digits; if its
    // value needs more than eight, every finer unit needs more too.
    for (unit, unit_nanos) in UNITS {
        let unit_nanos = u128::from(unit_nanos);
        if nanos.is_multiple_of(unit_nanos) {
            let value = nanos / unit_nanos;
            if value <= u128::from(MAX_VALUE) {
                return render(value, unit);
            }
            break;
        }
    }

    // Inexact: the finest unit whose rounded-up value fits.
    for (unit, unit_nanos) in UNITS.into_iter().rev() {
        let value = nanos.div_ceil(u128::from(unit_nanos));
        if value <= u128::from(MAX_VALUE) {
            return render(value, unit);
        }
    }
    HeaderValue::from_static("99999999H")
}

/// Writes `value` (at most eight digits) and `unit` into a header value, without going
/// through a `String`.
fn render(value: u128, unit: u8) -> HeaderValue {
    let mut buf = [0u8; 9];
    let mut start = 8;
    buf[8] = unit;
    let mut rest = value.min(u128::from(MAX_VALUE));
    loop {
        start -= 1;
        // `rest % 10 < 10`, so the cast cannot truncate.
        buf[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    // Digits and a unit letter are always a valid header value; the fallback is never taken.
    HeaderValue::from_bytes(&buf[start..]).unwrap_or_else(|_| HeaderValue::from_static("99999999H"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest timeout the format carries.
    const MAX_TIMEOUT: Duration = Duration::from_secs(MAX_VALUE * 3600);

    fn parse_str(s: &str) -> Option<Duration> {
        parse(&HeaderValue::from_str(s).unwrap())
    }

    #[test]
    fn from_headers_reads_the_first_value() {
        let mut headers = HeaderMap::new();
        assert_eq!(from_headers(&headers), None);
        headers.append(GRPC_TIMEOUT_NAME, HeaderValue::from_static("bad"));
        headers.append(GRPC_TIMEOUT_NAME, HeaderValue::from_static("1S"));
        assert_eq!(from_headers(&headers), None);
        headers.insert(GRPC_TIMEOUT_NAME, HeaderValue::from_static("250m"));
        headers.append(GRPC_TIMEOUT_NAME, HeaderValue::from_static("1S"));
        assert_eq!(from_headers(&headers), Some(Duration::from_millis(250)));
    }

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_str("3H"), Some(Duration::from_secs(3 * 3600)));
        assert_eq!(parse_str("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_str("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_str("3m"), Some(Duration::from_millis(3)));
        assert_eq!(parse_str("3u"), Some(Duration::from_micros(3)));
        assert_eq!(parse_str("3n"), Some(Duration::from_nanos(3)));
        assert_eq!(parse_str("00000001S"), Some(Duration::from_secs(1)));
    }

    #[test]
    fn render_writes_digits_then_unit() {
        assert_eq!(render(0, b'n'), "0n");
        assert_eq!(render(7, b'S'), "7S");
        assert_eq!(render(10, b'm'), "10m");
        assert_eq!(render(99_999_999, b'H'), "99999999H");
    }

    #[test]
    fn encode_prefers_the_coarsest_exact_unit() {
        let cases = [
            (Duration::from_secs(3600), "1H"),
            (Duration::from_secs(3660), "61M"),
            (Duration::from_secs(3601), "3601S"),
            (Duration::from_millis(1500), "1500m"),
            (Duration::from_micros(1_500_001), "1500001u"),
            (Duration::from_nanos(99_999_999), "99999999n"),
            (Duration::from_nanos(100_000_000), "100m"),
            (MAX_TIMEOUT, "99999999H"),
            (Duration::from_secs(99_999_999), "99999999S"),
        ];
        for (duration, expected) in cases {
            assert_eq!(encode(duration), expected, "{duration:?}");
        }
    }

    #[test]
    fn encode_rounds_up_in_the_finest_fitting_unit() {
        let cases = [
            (Duration::from_nanos(123_456_789), "123457u"),
            (Duration::from_nanos(100_000_001), "100001u"),
            // Nine digits in m once rounded up: the next unit up.
            (Duration::new(99_999, 999_999_999), "100000S"),
            (Duration::new(100_000, 1), "100001S"),
            (Duration::new(99_999_999, 1), "1666667M"),
            (Duration::new(99_999_999 * 60, 1), "1666667H"),
            (MAX_TIMEOUT - Duration::from_nanos(1), "99999999H"),
            (MAX_TIMEOUT + Duration::from_nanos(1), "99999999H"),
            (Duration::MAX, "99999999H"),
        ];
        for (duration, expected) in cases {
            assert_eq!(encode(duration), expected, "{duration:?}");
        }
    }
}
