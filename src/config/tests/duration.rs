//! The proto3 JSON duration parser: valid, invalid and boundary strings.

use std::time::Duration;

use crate::config::{DurationError, format_duration, parse_duration};

use super::MAX_DURATION_SECONDS;

#[test]
fn valid_durations() {
    let cases: &[(&str, Duration)] = &[
        ("0s", Duration::ZERO),
        ("1s", Duration::from_secs(1)),
        ("0.1s", Duration::from_millis(100)),
        ("0.5s", Duration::from_millis(500)),
        ("1.5s", Duration::from_millis(1500)),
        ("10.10s", Duration::from_millis(10_100)),
        ("100s", Duration::from_secs(100)),
        ("0.000000001s", Duration::from_nanos(1)),
        ("1.000000001s", Duration::new(1, 1)),
        ("0.123456789s", Duration::new(0, 123_456_789)),
        ("0.999999999s", Duration::new(0, 999_999_999)),
        ("0.000s", Duration::ZERO),
        ("3.000001s", Duration::new(3, 1_000)),
        ("-0s", Duration::ZERO),
        ("-0.000000000s", Duration::ZERO),
        ("315576000000s", Duration::from_secs(MAX_DURATION_SECONDS)),
        (
            "315576000000.999999999s",
            Duration::new(MAX_DURATION_SECONDS, 999_999_999),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_duration(text), Ok(*expected), "{text:?}");
    }
}

#[test]
fn invalid_durations() {
    use DurationError::*;
    let cases: &[(&str, DurationError)] = &[
        ("", MissingSuffix),
        ("1", MissingSuffix),
        ("1S", MissingSuffix),
        ("1sec", MissingSuffix),
        ("1m", MissingSuffix),
        ("1s ", MissingSuffix),
        ("s", Malformed),
        ("-s", Malformed),
        ("1ms", Malformed),
        ("1ss", Malformed),
        (" 1s", Malformed),
        ("1 s", Malformed),
        ("+1s", Malformed),
        ("--1s", Malformed),
        ("01s", Malformed),
        ("00s", Malformed),
        ("00.5s", Malformed),
        (".5s", Malformed),
        ("-.5s", Malformed),
        ("1.s", Malformed),
        ("1..5s", Malformed),
        ("1.5.5s", Malformed),
        ("1.-5s", Malformed),
        ("1,5s", Malformed),
        ("1e3s", Malformed),
        ("1.5e3s", Malformed),
        ("0x1s", Malformed),
        ("NaNs", Malformed),
        ("infs", Malformed),
        ("\u{661}s", Malformed), // ARABIC-INDIC DIGIT ONE
        ("1.0000000001s", TooManyFractionDigits),
        ("0.0000000001s", TooManyFractionDigits),
        ("315576000001s", OutOfRange),
        ("315576000000000s", OutOfRange),
        ("99999999999999999999999999s", OutOfRange),
        ("-315576000001s", OutOfRange),
        ("-1s", Negative),
        ("-0.5s", Negative),
        ("-0.000000001s", Negative),
        ("-315576000000s", Negative),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_duration(text), Err(*expected), "{text:?}");
    }
}

#[test]
fn nine_fraction_digits_but_not_ten() {
    assert_eq!(
        parse_duration("0.100000000s"),
        Ok(Duration::from_millis(100))
    );
    assert_eq!(
        parse_duration("0.1000000000s"),
        Err(DurationError::TooManyFractionDigits)
    );
    assert_eq!(parse_duration("2.000000009s"), Ok(Duration::new(2, 9)));
    assert_eq!(
        parse_duration("2.0000000090s"),
        Err(DurationError::TooManyFractionDigits)
    );
}

#[test]
fn range_boundary() {
    let max = format!("{MAX_DURATION_SECONDS}s");
    let over = format!("{}s", MAX_DURATION_SECONDS + 1);
    assert_eq!(
        parse_duration(&max),
        Ok(Duration::from_secs(MAX_DURATION_SECONDS))
    );
    assert_eq!(parse_duration(&over), Err(DurationError::OutOfRange));
}

#[test]
fn errors_display_lower_case_and_name_the_rule() {
    for error in [
        DurationError::MissingSuffix,
        DurationError::Malformed,
        DurationError::TooManyFractionDigits,
        DurationError::OutOfRange,
        DurationError::Negative,
    ] {
        let text = error.to_string();
        assert!(text.starts_with("duration "), "{text}");
    }
    assert_eq!(
        DurationError::MissingSuffix.to_string(),
        "duration must end with 's'"
    );
}

#[test]
fn format_writes_protobuf_style() {
    let cases = [
        (Duration::ZERO, "0s"),
        (Duration::from_secs(5), "5s"),
        (Duration::from_millis(100), "0.100s"),
        (Duration::from_micros(1_500_001), "1.500001s"),
        (Duration::new(1, 1), "1.000000001s"),
        (Duration::from_secs(MAX_DURATION_SECONDS), "315576000000s"),
    ];
    for (duration, text) in cases {
        assert_eq!(format_duration(duration), text);
        assert_eq!(parse_duration(text), Ok(duration));
    }
}
