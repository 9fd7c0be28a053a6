//! The header parsers, as untrusted input: `grpc-retry-pushback-ms`, `Retry-After` and
//! `grpc-timeout`. Table tests for valid, boundary and hostile values, then property tests.

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use tower_retry_hedge::grpc_timeout;
use tower_retry_hedge::pushback::{Pushback, grpc_pushback, retry_after, retry_after_from_headers};

const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
/// The longest timeout `grpc-timeout` carries, `99999999H`.
const MAX_TIMEOUT: Duration = Duration::from_secs(99_999_999 * 3600);
/// Where `Retry-After` delays saturate, as `pushback` documents: `u32::MAX` seconds.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(u32::MAX as u64);

fn value(bytes: &[u8]) -> HeaderValue {
    HeaderValue::from_bytes(bytes).expect("test values are valid header values")
}

fn ten_kb(byte: u8) -> Vec<u8> {
    vec![byte; 10 * 1024]
}

/// Hostile values that every parser must reject without panicking.
fn hostile() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = [
        &b""[..],
        b" ",
        b"\t",
        b"-",
        b"+",
        b"x",
        b"1X",
        b"-1S",
        b"+1S",
        b" 1S",
        b"1S ",
        b"1 S",
        b"1,2",
        b"1.5",
        b"0x1F",
        "１S".as_bytes(), // full-width digit
        "١S".as_bytes(),  // Arabic-Indic digit
        "1Ｓ".as_bytes(),
        b"\x80\xff",
    ]
    .iter()
    .map(|v| v.to_vec())
    .collect();
    values.push(ten_kb(b'x'));
    let mut digits_then_garbage = ten_kb(b'9');
    digits_then_garbage.push(b'x');
    values.push(digits_then_garbage);
    values
}

fn pushback(bytes: &[u8]) -> Option<Pushback> {
    let mut headers = HeaderMap::new();
    headers.insert(GRPC_RETRY_PUSHBACK_MS, value(bytes));
    grpc_pushback(&headers)
}

fn after_ms(ms: u64) -> Option<Pushback> {
    Some(Pushback::After(Duration::from_millis(ms)))
}

#[test]
fn pushback_valid_and_boundary_values() {
    let cases: &[(&[u8], Option<Pushback>)] = &[
        (b"0", after_ms(0)),
        (b"1", after_ms(1)),
        (b"100", after_ms(100)),
        (b"007", after_ms(7)),
        (b"-0", after_ms(0)),
        (b"2147483647", after_ms(i32::MAX as u64)),
        (b"02147483647", after_ms(i32::MAX as u64)),
        (b"2147483648", Some(Pushback::Stop)),
        (b"4294967296", Some(Pushback::Stop)),
        (b"-1", Some(Pushback::Stop)),
        (b"-2147483648", Some(Pushback::Stop)),
        (b"-2147483649", Some(Pushback::Stop)),
    ];
    for (bytes, expected) in cases {
        assert_eq!(
            pushback(bytes),
            *expected,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(
        pushback(i32::MAX.to_string().as_bytes()),
        after_ms(2_147_483_647)
    );
    assert_eq!(
        pushback(i32::MIN.to_string().as_bytes()),
        Some(Pushback::Stop)
    );
}

#[test]
fn pushback_hostile_values_stop() {
    for bytes in hostile() {
        assert_eq!(
            pushback(&bytes),
            Some(Pushback::Stop),
            "{:?}",
            String::from_utf8_lossy(&bytes)
        );
    }
    assert_eq!(pushback(&ten_kb(b'9')), Some(Pushback::Stop));
    let mut zeros_then_one = ten_kb(b'0');
    zeros_then_one.push(b'1');
    assert_eq!(pushback(&zeros_then_one), after_ms(1));
}

#[test]
fn pushback_absent_or_repeated() {
    let mut headers = HeaderMap::new();
    assert_eq!(grpc_pushback(&headers), None);
    headers.insert("grpc-status", value(b"14"));
    assert_eq!(grpc_pushback(&headers), None);
    headers.append(GRPC_RETRY_PUSHBACK_MS, value(b"10"));
    assert_eq!(grpc_pushback(&headers), after_ms(10));
    headers.append(GRPC_RETRY_PUSHBACK_MS, value(b"10"));
    assert_eq!(grpc_pushback(&headers), Some(Pushback::Stop));
}

/// 06 Nov 1994 08:49:37 GMT, the date of RFC 9110's examples.
fn rfc_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)
}

#[test]
fn retry_after_delay_seconds() {
    let now = rfc_now();
    let cases: &[(&[u8], Option<Duration>)] = &[
        (b"0", Some(Duration::ZERO)),
        (b"1", Some(Duration::from_secs(1))),
        (b"120", Some(Duration::from_secs(120))),
        (b"000120", Some(Duration::from_secs(120))),
        (b" 120\t", Some(Duration::from_secs(120))),
        (b"2147483647", Some(Duration::from_secs(2_147_483_647))),
        (b"2147483648", Some(Duration::from_secs(2_147_483_648))),
        (b"-2147483648", None),
        (b"4294967295", Some(RETRY_AFTER_MAX)),
        (b"4294967296", Some(RETRY_AFTER_MAX)),
        (b"18446744073709551616", Some(RETRY_AFTER_MAX)),
        (b"-1", None),
        (b"+1", None),
        (b"1.5", None),
        (b"1e3", None),
        (b"1 2", None),
        (b"120s", None),
    ];
    for (bytes, expected) in cases {
        assert_eq!(
            retry_after(&value(bytes), now),
            *expected,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(RETRY_AFTER_MAX, Duration::from_secs(u64::from(u32::MAX)));
    assert_eq!(
        retry_after(&value(&ten_kb(b'9')), now),
        Some(RETRY_AFTER_MAX)
    );
}

#[test]
fn retry_after_http_dates_in_all_three_formats() {
    let now = rfc_now();
    let thirty = Some(Duration::from_secs(30));
    for date in [
        "Sun, 06 Nov 1994 08:50:07 GMT",  // IMF-fixdate
        "Sunday, 06-Nov-94 08:50:07 GMT", // obsolete RFC 850
        "Sun Nov  6 08:50:07 1994",       // obsolete asctime
    ] {
        assert_eq!(retry_after(&value(date.as_bytes()), now), thirty, "{date}");
    }
    // At or before now: zero.
    for date in [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:36 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
    ] {
        assert_eq!(
            retry_after(&value(date.as_bytes()), now),
            Some(Duration::ZERO),
            "{date}"
        );
    }
    // Far future: saturates at the documented maximum.
    let far = value(b"Fri, 31 Dec 9999 23:59:59 GMT");
    assert_eq!(retry_after(&far, now), Some(RETRY_AFTER_MAX));
    // Invalid dates.
    for date in [
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 06 Nov 1994 25:49:37 GMT",
        "Mon, 06 Nov 1994 08:49:37 GMT", // wrong weekday
        "Sun, 31 Feb 1994 08:49:37 GMT",
        "Sun, 06 Nov 1969 08:49:37 GMT",
        "1994-11-06T08:49:37Z",
        "tomorrow",
    ] {
        assert_eq!(retry_after(&value(date.as_bytes()), now), None, "{date}");
    }
}

#[test]
fn retry_after_hostile_values_are_none() {
    for bytes in hostile() {
        assert_eq!(
            retry_after(&value(&bytes), rfc_now()),
            None,
            "{:?}",
            String::from_utf8_lossy(&bytes)
        );
    }
}

#[test]
fn retry_after_from_headers_reads_one_value() {
    let now = rfc_now();

    let mut headers = HeaderMap::new();
    assert_eq!(retry_after_from_headers(&headers, now), None);
    headers.insert(RETRY_AFTER, value(b"5"));
    assert_eq!(
        retry_after_from_headers(&headers, now),
        Some(Duration::from_secs(5))
    );
    headers.append(RETRY_AFTER, value(b"7"));
    assert_eq!(retry_after_from_headers(&headers, now), None);
    // One field line holding a list is not a valid value either.
    headers.insert(RETRY_AFTER, value(b"5, 7"));
    assert_eq!(retry_after_from_headers(&headers, now), None);
}

fn timeout(bytes: &[u8]) -> Option<Duration> {
    grpc_timeout::parse(&value(bytes))
}

#[test]
fn grpc_timeout_valid_and_boundary_values() {
    let cases: &[(&[u8], Option<Duration>)] = &[
        (b"1H", Some(Duration::from_secs(3600))),
        (b"1M", Some(Duration::from_secs(60))),
        (b"1S", Some(Duration::from_secs(1))),
        (b"1m", Some(Duration::from_millis(1))),
        (b"1u", Some(Duration::from_micros(1))),
        (b"1n", Some(Duration::from_nanos(1))),
        (b"0S", Some(Duration::ZERO)),
        (b"00000000n", Some(Duration::ZERO)),
        (b"99999999n", Some(Duration::from_nanos(99_999_999))),
        (b"99999999H", Some(MAX_TIMEOUT)),
        (b"100000000n", None), // nine digits
        (b"000000001S", None), // nine digits, even with leading zeros
        (b"2147483647S", None),
        (b"2147483648S", None),
        (b"-2147483648S", None),
        (b"S", None),
        (b"1", None),
        (b"1h", None),
        (b"1s", None),
        (b"1ms", None),
        (b"1SS", None),
    ];
    for (bytes, expected) in cases {
        assert_eq!(
            timeout(bytes),
            *expected,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(MAX_TIMEOUT, Duration::from_secs(99_999_999 * 3600));
}

#[test]
fn grpc_timeout_hostile_values_are_none() {
    for bytes in hostile() {
        assert_eq!(
            timeout(&bytes),
            None,
            "{:?}",
            String::from_utf8_lossy(&bytes)
        );
    }
    let mut long = ten_kb(b'1');
    long.push(b'S');
    assert_eq!(timeout(&long), None);
}

#[test]
fn grpc_timeout_encodes_the_shortest_form() {
    let cases = [
        (Duration::ZERO, "0n"),
        (Duration::from_secs(1), "1S"),
        (Duration::from_millis(1500), "1500m"),
        (Duration::from_secs(7200), "2H"),
        (Duration::from_secs(300), "5M"),
        (Duration::from_nanos(1), "1n"),
        (Duration::from_nanos(1_001), "1001n"),
        (Duration::from_nanos(123_456_789), "123457u"),
        (Duration::from_secs(u64::MAX), "99999999H"),
        (Duration::MAX, "99999999H"),
    ];
    for (duration, expected) in cases {
        assert_eq!(grpc_timeout::encode(duration), expected, "{duration:?}");
    }
}

/// The unit's length, from a valid encoded value's last byte.
fn unit_of(encoded: &HeaderValue) -> Duration {
    match encoded.as_bytes().last() {
        Some(b'H') => Duration::from_secs(3600),
        Some(b'M') => Duration::from_secs(60),
        Some(b'S') => Duration::from_secs(1),
        Some(b'm') => Duration::from_millis(1),
        Some(b'u') => Duration::from_micros(1),
        Some(b'n') => Duration::from_nanos(1),
        other => panic!("not a unit: {other:?}"),
    }
}

/// The units, coarsest first, with their length in nanoseconds.
const UNITS: [(char, u128); 6] = [
    ('H', 3_600_000_000_000),
    ('M', 60_000_000_000),
    ('S', 1_000_000_000),
    ('m', 1_000_000),
    ('u', 1_000),
    ('n', 1),
];

/// `value` of the unit at `UNITS[unit]`, for values of at most eight digits.
fn duration_of(value: u64, unit: usize) -> Duration {
    let nanos = u128::from(value) * UNITS[unit].1;
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    let subsec = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
    Duration::new(secs, subsec)
}

/// Durations up to `MAX_TIMEOUT`, spread over every order of magnitude and every unit.
fn encodable_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=MAX_TIMEOUT.as_secs(), 0u32..1_000_000_000)
            .prop_map(|(s, n)| Duration::new(s, n).min(MAX_TIMEOUT)),
        (0u32..64, any::<u64>())
            .prop_map(|(shift, bits)| Duration::from_nanos(bits >> shift).min(MAX_TIMEOUT)),
        (0u64..=99_999_999, 0usize..6).prop_map(|(value, unit)| duration_of(value, unit)),
        (0u64..=99_999_999, 0usize..6, 1u64..1_000).prop_map(|(value, unit, nanos)| (duration_of(
            value, unit
        )
            + Duration::from_nanos(nanos))
        .min(MAX_TIMEOUT)),
    ]
}

/// Bytes that form a valid header value, biased toward the characters parsers care about.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => b'0'..=b'9',
        2 => prop::sample::select(&b"HMSmun-+ .,:GMT"[..]),
        1 => Just(b'\t'),
        1 => 0x20u8..=0x7e,
        1 => 0x80u8..=0xff,
    ];
    prop::collection::vec(byte, 0..40)
}

proptest! {
    #[test]
    fn encode_round_trips_within_one_unit(d in encodable_duration()) {
        let encoded = grpc_timeout::encode(d);
        let bytes = encoded.as_bytes();
        prop_assert!((2..=9).contains(&bytes.len()), "{encoded:?}");
        let back = grpc_timeout::parse(&encoded);
        prop_assert!(back.is_some(), "{encoded:?} does not parse");
        let back = back.unwrap_or_default();
        prop_assert!(back >= d, "{d:?} encoded as {encoded:?} reads back shorter: {back:?}");
        prop_assert!(back < d + unit_of(&encoded), "{d:?} -> {encoded:?} -> {back:?}");
        prop_assert!(d.is_zero() || !back.is_zero());
        // No leading zeros: a shorter form would exist.
        prop_assert!(bytes[0] != b'0' || bytes.len() == 2);
    }

    #[test]
    fn encode_is_exact_when_a_unit_fits(value in 0u64..=99_999_999, unit in 0usize..6) {
        let d = duration_of(value, unit);
        let encoded = grpc_timeout::encode(d);
        prop_assert_eq!(grpc_timeout::parse(&encoded), Some(d));
        // The shortest form: never more digits than the given one.
        prop_assert!(encoded.len() <= value.to_string().len() + 1, "{:?} for {}{}", encoded, value, UNITS[unit].0);
    }

    #[test]
    fn encode_saturates_beyond_the_maximum(extra in 1u64..=u64::MAX / 2) {
        let d = MAX_TIMEOUT.saturating_add(Duration::from_nanos(extra));
        prop_assert_eq!(grpc_timeout::encode(d), "99999999H");
    }

    #[test]
    fn grpc_timeout_parse_matches_a_model(digits in "[0-9]{1,8}", unit in "[HMSmun]") {
        let text = format!("{digits}{unit}");
        let n: u64 = digits.parse().unwrap_or(u64::MAX);
        let index = UNITS.iter().position(|(u, _)| unit.starts_with(*u)).unwrap_or(0);
        let expected = duration_of(n, index);
        prop_assert_eq!(timeout(text.as_bytes()), Some(expected));
    }

    #[test]
    fn parsers_never_panic_on_header_bytes(bytes in header_bytes()) {
        let v = value(&bytes);
        let parsed = grpc_timeout::parse(&v);
        // Accepted exactly when the bytes are 1-8 digits and a unit.
        let well_formed = bytes.len() >= 2
            && bytes.len() <= 9
            && bytes[..bytes.len() - 1].iter().all(u8::is_ascii_digit)
            && b"HMSmun".contains(&bytes[bytes.len() - 1]);
        prop_assert_eq!(parsed.is_some(), well_formed);

        let pushback = Pushback::parse(&bytes);
        let is_plain_number = {
            let digits = bytes.strip_prefix(b"-").unwrap_or(&bytes);
            !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
        };
        if !is_plain_number {
            prop_assert_eq!(pushback, Pushback::Stop);
        }

        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        if let Some(delay) = retry_after(&v, now) {
            prop_assert!(delay <= RETRY_AFTER_MAX);
        }
    }

    #[test]
    fn parsers_never_panic_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        // Only what can be a header value reaches the parsers.
        if let Ok(v) = HeaderValue::from_bytes(&bytes) {
            let _ = grpc_timeout::parse(&v);
            let _ = retry_after(&v, SystemTime::now());
        }
        let _ = Pushback::parse(&bytes);
    }

    #[test]
    fn pushback_reads_every_i32(n in any::<i32>()) {
        let expected = if n >= 0 {
            Pushback::After(Duration::from_millis(n.unsigned_abs().into()))
        } else {
            Pushback::Stop
        };
        prop_assert_eq!(pushback(n.to_string().as_bytes()), Some(expected));
    }

    #[test]
    fn pushback_rejects_every_value_outside_i32(n in prop_oneof![
        i64::from(i32::MAX) + 1..=i64::MAX,
        i64::MIN..=i64::from(i32::MIN) - 1,
    ]) {
        prop_assert_eq!(pushback(n.to_string().as_bytes()), Some(Pushback::Stop));
    }

    #[test]
    fn retry_after_reads_every_delay_seconds(n in any::<u64>(), zeros in 0usize..5) {
        let text = format!("{}{n}", "0".repeat(zeros));
        let expected = Duration::from_secs(n.min(u64::from(u32::MAX)));
        prop_assert_eq!(retry_after(&value(text.as_bytes()), rfc_now()), Some(expected));
    }

    #[test]
    fn retry_after_reads_every_http_date(offset in 0u64..4_000_000_000, ahead in any::<bool>()) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let date = if ahead {
            now + Duration::from_secs(offset)
        } else {
            now - Duration::from_secs(offset.min(1_700_000_000))
        };
        let text = httpdate::fmt_http_date(date);
        let expected = if ahead { Duration::from_secs(offset) } else { Duration::ZERO };
        prop_assert_eq!(retry_after(&value(text.as_bytes()), now), Some(expected));
    }
}
