//! Server pushback: `grpc-retry-pushback-ms` (gRFC A6) and HTTP `Retry-After` (RFC 9110).
//!
//! Both headers come from the server, so both are parsed as untrusted input: no panic, no
//! allocation, no overflow on any value, however long or strange.
//!
//! # `grpc-retry-pushback-ms`
//!
//! gRFC A6 lets a server say, in its response metadata, either "retry after exactly *n*
//! milliseconds" or "do not retry at all". [`grpc_pushback`] reads it into a [`Pushback`]:
//!
//! | value | result |
//! |---|---|
//! | absent | `None`: no pushback, the backoff decides |
//! | `0` … `2147483647` | `Some(After(n ms))`; leading zeros are accepted (`007` is 7 ms) |
//! | negative, empty, not a decimal, outside `i32`, `+`, whitespace, non-ASCII | `Some(Stop)` |
//! | several values | `Some(Stop)` |
//!
//! A6 asks for "no unnecessary leading zeros" but does not say what a client does with
//! them; grpc-go (`strconv.Atoi`) and gRPC C-core both accept them, and so does this
//! module: the server clearly meant a delay. For the same reason `-0` is zero, not
//! negative. Several values are ambiguous, and grpc-go treats them as "do not retry";
//! so does this module. A valid pushback does not lift `maxAttempts`.
//!
//! # `Retry-After`
//!
//! HTTP servers say when to come back with `Retry-After: <delay-seconds>` or
//! `Retry-After: <HTTP-date>` (RFC 9110 §10.2.3). [`retry_after`] reads either form into a
//! delay from `now`: a date in the past is a delay of zero, and every delay saturates at
//! `u32::MAX` seconds (about 136 years) rather than overflowing. Garbage is `None`: the
//! header is advisory, so a caller falls back on its own backoff. Callers should cap what a
//! server can make them wait (the layers' HTTP classifier does,
//! [`HttpStatuses::max_retry_after`](crate::classify::HttpStatuses::max_retry_after)).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, HeaderValue};
//! use tower_retry_hedge::pushback::{grpc_pushback, Pushback};
//!
//! let mut trailers = HeaderMap::new();
//! assert_eq!(grpc_pushback(&trailers), None);
//!
//! trailers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("250"));
//! assert_eq!(grpc_pushback(&trailers), Some(Pushback::After(Duration::from_millis(250))));
//!
//! trailers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("-1"));
//! assert_eq!(grpc_pushback(&trailers), Some(Pushback::Stop));
//! ```
//!
//! `Retry-After`, in both forms:
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use http::HeaderValue;
//! use tower_retry_hedge::pushback::retry_after;
//!
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // 06 Nov 1994 08:49:37
//!
//! let seconds = HeaderValue::from_static("120");
//! assert_eq!(retry_after(&seconds, now), Some(Duration::from_secs(120)));
//!
//! let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:50:07 GMT");
//! assert_eq!(retry_after(&date, now), Some(Duration::from_secs(30)));
//!
//! assert_eq!(retry_after(&HeaderValue::from_static("soon"), now), None);
//! ```

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};

/// What a server's pushback asks of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushback {
    /// Retry after exactly this delay (instead of the backoff delay).
    After(Duration),
    /// The server asked not to retry. This counts as a failure for the throttle.
    Stop,
}

impl Pushback {
    /// Parses one `grpc-retry-pushback-ms` value, given as bytes (as gRPC metadata maps
    /// hand them out): see the [module docs](self) for the rules.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::pushback::Pushback;
    ///
    /// assert_eq!(Pushback::parse(b"0"), Pushback::After(Duration::ZERO));
    /// assert_eq!(Pushback::parse(b"2147483647"), Pushback::After(Duration::from_millis(2_147_483_647)));
    /// assert_eq!(Pushback::parse(b"2147483648"), Pushback::Stop);
    /// assert_eq!(Pushback::parse(b" 5"), Pushback::Stop);
    /// ```
    pub fn parse(bytes: &[u8]) -> Pushback {
        let (negative, digits) = match bytes {
            [b'-', rest @ ..] => (true, rest),
            _ => (false, bytes),
        };
        let Some(millis) = parse_decimal(digits, i32::MAX.unsigned_abs().into()) else {
            return Pushback::Stop;
        };
        if negative && millis != 0 {
            return Pushback::Stop;
        }
        Pushback::After(Duration::from_millis(millis))
    }
}

/// The gRFC A6 pushback metadata key.
pub(crate) const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// Reads `grpc-retry-pushback-ms` from response headers or trailers.
///
/// `None` if the header is absent. Otherwise a signed 32-bit decimal `n` gives
/// [`Pushback::After`]`(n ms)` if `n >= 0`; a negative value, an empty one, anything not a
/// plain decimal (a leading `+`, whitespace, non-ASCII), a value outside the `i32` range,
/// and several values all give [`Pushback::Stop`]. Leading zeros are accepted.
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// use tower_retry_hedge::pushback::{grpc_pushback, Pushback};
///
/// let mut headers = HeaderMap::new();
/// headers.append("grpc-retry-pushback-ms", HeaderValue::from_static("10"));
/// headers.append("grpc-retry-pushback-ms", HeaderValue::from_static("20"));
/// assert_eq!(grpc_pushback(&headers), Some(Pushback::Stop));
/// ```
pub fn grpc_pushback(headers: &HeaderMap) -> Option<Pushback> {
    let mut values = headers.get_all(GRPC_RETRY_PUSHBACK_MS).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return Some(Pushback::Stop);
    }
    Some(Pushback::parse(first.as_bytes()))
}

/// The longest delay [`retry_after`] returns: `u32::MAX` seconds (about 136 years).
/// Longer `delay-seconds` and later dates saturate here.
pub(crate) const RETRY_AFTER_MAX: Duration = Duration::from_secs(u32::MAX as u64);

/// Reads one HTTP `Retry-After` value as a delay from `now` (RFC 9110 §10.2.3).
///
/// - `delay-seconds`: one or more ASCII digits, no sign and no fraction; leading zeros are
///   fine. Values above `u32::MAX` seconds (about 136 years) saturate to it, however many
///   digits they have.
/// - `HTTP-date`: the IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) and both obsolete forms
///   RFC 9110 asks recipients to accept (RFC 850 `Sunday, 06-Nov-94 08:49:37 GMT` and
///   asctime `Sun Nov  6 08:49:37 1994`), through [`httpdate::parse_http_date`]. A date
///   at or before `now` is [`Duration::ZERO`]; later ones saturate at `u32::MAX` seconds
///   (about 136 years).
///
/// Spaces and tabs around the value are ignored (they are not part of a field value).
/// Anything else is `None`. The result is not capped.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
/// use tower_retry_hedge::pushback::retry_after;
///
/// let now = SystemTime::now();
/// assert_eq!(retry_after(&HeaderValue::from_static("0"), now), Some(Duration::ZERO));
/// let longest = Duration::from_secs(u64::from(u32::MAX));
/// assert_eq!(retry_after(&HeaderValue::from_static("99999999999999999999"), now), Some(longest));
/// let past = HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT");
/// assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
/// assert_eq!(retry_after(&HeaderValue::from_static("-1"), now), None);
/// assert_eq!(retry_after(&HeaderValue::from_static("1.5"), now), None);
/// ```
pub fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    // `to_str` fails on obs-text, which neither form contains.
    let text = value.to_str().ok()?.trim_matches([' ', '\t']);
    if text.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        return parse_decimal_saturating(text.as_bytes(), u64::from(u32::MAX))
            .map(Duration::from_secs);
    }
    let date = httpdate::parse_http_date(text).ok()?;
    let delay = date.duration_since(now).unwrap_or(Duration::ZERO);
    Some(delay.min(RETRY_AFTER_MAX))
}

/// Reads the `Retry-After` header from response headers with [`retry_after`].
///
/// `None` if it is absent, invalid, or present more than once: `Retry-After` is a singleton
/// field (RFC 9110 §5.5), and of two disagreeing values neither can be trusted.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::{header::RETRY_AFTER, HeaderMap, HeaderValue};
/// use tower_retry_hedge::pushback::retry_after_from_headers;
///
/// let mut headers = HeaderMap::new();
/// headers.insert(RETRY_AFTER, HeaderValue::from_static("5"));
/// assert_eq!(retry_after_from_headers(&headers, SystemTime::now()), Some(Duration::from_secs(5)));
/// headers.append(RETRY_AFTER, HeaderValue::from_static("5"));
/// assert_eq!(retry_after_from_headers(&headers, SystemTime::now()), None);
/// ```
pub fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let mut values = headers.get_all(http::header::RETRY_AFTER).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    retry_after(first, now)
}

/// A non-empty string of ASCII digits as a number no greater than `max`; `None` for an
/// empty string, any other byte, or a number above `max`.
fn parse_decimal(digits: &[u8], max: u64) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &byte| {
        let digit = byte.checked_sub(b'0').filter(|d| *d <= 9)?;
        value
            .checked_mul(10)?
            .checked_add(u64::from(digit))
            .filter(|v| *v <= max)
    })
}

/// A non-empty string of ASCII digits as a number, saturating at `max`; `None` for an empty
/// string or any other byte. Reads every byte, so a long number is still checked for
/// garbage at its end.
fn parse_decimal_saturating(digits: &[u8], max: u64) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &byte| {
        let digit = byte.checked_sub(b'0').filter(|d| *d <= 9)?;
        Some(
            value
                .saturating_mul(10)
                .saturating_add(u64::from(digit))
                .min(max),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Pushback {
        Pushback::After(Duration::from_millis(n))
    }

    #[test]
    fn pushback_values() {
        let cases: &[(&[u8], Pushback)] = &[
            (b"0", ms(0)),
            (b"1", ms(1)),
            (b"250", ms(250)),
            (b"007", ms(7)),
            (b"-0", ms(0)),
            (b"0000000000000000000000000000001", ms(1)),
            (b"2147483647", ms(2_147_483_647)),
            (b"2147483648", Pushback::Stop),
            (b"-1", Pushback::Stop),
            (b"-2147483648", Pushback::Stop),
            (b"-2147483649", Pushback::Stop),
            (b"99999999999999999999999", Pushback::Stop),
            (b"", Pushback::Stop),
            (b"-", Pushback::Stop),
            (b"--1", Pushback::Stop),
            (b"+1", Pushback::Stop),
            (b" 1", Pushback::Stop),
            (b"1 ", Pushback::Stop),
            (b"1\t", Pushback::Stop),
            (b"1,2", Pushback::Stop),
            (b"1.5", Pushback::Stop),
            (b"0x10", Pushback::Stop),
            (b"1e3", Pushback::Stop),
            ("١٢".as_bytes(), Pushback::Stop),
            (b"\xff", Pushback::Stop),
        ];
        for (bytes, expected) in cases {
            assert_eq!(Pushback::parse(bytes), *expected, "{bytes:?}");
        }
    }

    #[test]
    fn decimal_limits() {
        assert_eq!(
            parse_decimal(b"18446744073709551615", u64::MAX),
            Some(u64::MAX)
        );
        assert_eq!(parse_decimal(b"18446744073709551616", u64::MAX), None);
        assert_eq!(parse_decimal(b"10", 9), None);
        assert_eq!(parse_decimal(b"9", 9), Some(9));
        assert_eq!(
            parse_decimal_saturating(b"4294967296", 4_294_967_295),
            Some(4_294_967_295)
        );
        assert_eq!(parse_decimal_saturating(&[b'9'; 10_000], 7), Some(7));
        let mut long = vec![b'9'; 10_000];
        long.push(b'x');
        assert_eq!(parse_decimal_saturating(&long, 7), None);
        assert_eq!(parse_decimal_saturating(b"", 7), None);
    }

    #[test]
    fn retry_after_trims_optional_whitespace() {
        let now = SystemTime::UNIX_EPOCH;
        let value = HeaderValue::from_static(" \t5 ");
        assert_eq!(retry_after(&value, now), Some(Duration::from_secs(5)));
        let value = HeaderValue::from_static(" Thu, 01 Jan 1970 00:00:10 GMT\t");
        assert_eq!(retry_after(&value, now), Some(Duration::from_secs(10)));
    }
}
