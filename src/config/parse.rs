//! Reading service-config JSON: the document, and the readers of its values, each naming the
//! path of what it reads. The objects' tables (in `objects`) put them together.

use std::time::Duration;

use serde_json::{Map, Number, Value};

use super::objects::ROOT;
use super::table::{Reader, read};
use super::unknown::{Unknown, UnknownKeys};
use super::{
    ConfigError, DurationError, MAX_DOCUMENT_BYTES, MAX_STATUS_CODES, Rule, ServiceConfig,
    parse_duration,
};
use crate::classify::{Code, GrpcCodes};

/// A whole service config, validated; keys gRPC does not define are refused (`strict`) or
/// kept in [`ServiceConfig::ignored`].
pub(super) fn parse_service_config(
    value: &Value,
    strict: bool,
) -> Result<ServiceConfig, ConfigError> {
    let mode = if strict {
        Unknown::Refuse
    } else {
        Unknown::Keep
    };
    let mut reader = Reader::new(UnknownKeys::new(mode));
    let mut config: ServiceConfig = read(value, "", ROOT, &mut reader)?;
    config.ignored = reader.unknown.kept;
    config.ignored_count = reader.unknown.count;
    Ok(config)
}

/// A JSON document of at most 1 MiB.
pub(super) fn document(json: &str) -> Result<Value, ConfigError> {
    if json.len() > MAX_DOCUMENT_BYTES {
        return Err(ConfigError::document_too_large(json.len()));
    }
    serde_json::from_str(json).map_err(|e| ConfigError::from_json_error(&e))
}

pub(super) fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A field of an object; `null` counts as absent, as in proto3 JSON.
pub(super) fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

pub(super) fn object<'a>(
    value: &'a Value,
    path: &str,
) -> Result<&'a Map<String, Value>, ConfigError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(path, "an object", value))
}

pub(super) fn array<'a>(
    value: &'a Value,
    path: &str,
    expected: &'static str,
) -> Result<&'a Vec<Value>, ConfigError> {
    value
        .as_array()
        .ok_or_else(|| wrong_type(path, expected, value))
}

pub(super) fn string<'a>(value: &'a Value, path: &str) -> Result<&'a str, ConfigError> {
    value
        .as_str()
        .ok_or_else(|| wrong_type(path, "a string", value))
}

pub(super) fn boolean(value: &Value, path: &str) -> Result<bool, ConfigError> {
    value
        .as_bool()
        .ok_or_else(|| wrong_type(path, "a boolean", value))
}

/// `value`, at `path`, is not of the JSON type `expected` (such as `a string`).
pub(super) fn wrong_type(path: &str, expected: &'static str, value: &Value) -> ConfigError {
    ConfigError::got(path, Rule::WrongType { expected }, value)
}

/// Why a value is not a proto3 JSON integer >= 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotUnsigned {
    /// Neither a number nor a string.
    WrongType,
    /// A number below zero or with a fraction, or a string of anything but decimal digits.
    Invalid,
}

/// The one reader of proto3 JSON integers >= 0, saturated to `u64`: a JSON number without a
/// fraction (`2`, `2.0`, `2e0`; `-0` is zero), or a string of decimal digits (`"2"`), as
/// proto3 JSON also writes integers.
pub(super) fn unsigned(value: &Value) -> Result<u64, NotUnsigned> {
    match value {
        Value::Number(number) => {
            if let Some(n) = number.as_u64() {
                return Ok(n);
            }
            let float = number.as_f64().unwrap_or(f64::NAN);
            // An `i64` that is not a `u64` is below zero; `-0.0 < 0.0` is false: negative zero
            // is zero. Float-to-int `as` saturates.
            if number.is_i64() || !float.is_finite() || float.fract() != 0.0 || float < 0.0 {
                return Err(NotUnsigned::Invalid);
            }
            Ok(float as u64)
        }
        Value::String(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(text.bytes().fold(0u64, |n, digit| {
                n.saturating_mul(10).saturating_add(u64::from(digit - b'0'))
            }))
        }
        Value::String(_) => Err(NotUnsigned::Invalid),
        _ => Err(NotUnsigned::WrongType),
    }
}

/// An integer >= 0 of the service config: a JSON number only, as gRPC's parsers read these
/// fields (grpc-go decodes them into Go integers), so a string is refused.
fn number(value: &Value) -> Option<u64> {
    value.as_number().and_then(|_| unsigned(value).ok())
}

fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `maxAttempts`: an integer >= 2, saturated to `u32::MAX`.
pub(super) fn max_attempts(value: &Value, path: &str) -> Result<u32, ConfigError> {
    match number(value) {
        Some(n) if n >= 2 => Ok(saturate_u32(n)),
        _ => Err(ConfigError::got(path, Rule::MaxAttempts, value)),
    }
}

/// `maxRequestMessageBytes`, `maxResponseMessageBytes`: an integer >= 0, saturated.
pub(super) fn message_bytes(value: &Value, path: &str) -> Result<u64, ConfigError> {
    number(value).ok_or_else(|| ConfigError::got(path, Rule::MessageBytes, value))
}

/// `maxTokens`: an integer in (0, 1000].
pub(super) fn max_tokens(value: &Value, path: &str) -> Result<u32, ConfigError> {
    match number(value) {
        Some(n @ 1..=1000) => Ok(saturate_u32(n)),
        _ => Err(ConfigError::got(path, Rule::MaxTokens, value)),
    }
}

/// `tokenRatio`, in thousandths: a number that is > 0 once cut to three decimals.
pub(super) fn token_ratio(value: &Value, path: &str) -> Result<u32, ConfigError> {
    match value.as_number().map(token_ratio_milli) {
        Some(milli) if milli > 0 => Ok(milli),
        _ => Err(ConfigError::got(path, Rule::TokenRatio, value)),
    }
}

/// `backoffMultiplier`: a finite number > 0.
pub(super) fn backoff_multiplier(value: &Value, path: &str) -> Result<f64, ConfigError> {
    match value.as_f64() {
        Some(m) if m > 0.0 && m.is_finite() => Ok(m),
        _ => Err(ConfigError::got(path, Rule::BackoffMultiplier, value)),
    }
}

/// A duration string; `Ok(Err(()))` when well-formed but negative.
fn duration(value: &Value, path: &str) -> Result<Result<Duration, ()>, ConfigError> {
    let Some(text) = value.as_str() else {
        return Err(wrong_type(
            path,
            "a duration string such as \"0.1s\"",
            value,
        ));
    };
    match parse_duration(text) {
        Ok(d) => Ok(Ok(d)),
        Err(DurationError::Negative) => Ok(Err(())),
        Err(error) => Err(ConfigError::got(path, Rule::Duration(error), value)),
    }
}

pub(super) fn positive_duration(value: &Value, path: &str) -> Result<Duration, ConfigError> {
    match duration(value, path)? {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(ConfigError::got(path, Rule::NotPositive, value)),
    }
}

pub(super) fn non_negative_duration(value: &Value, path: &str) -> Result<Duration, ConfigError> {
    duration(value, path)?.map_err(|()| ConfigError::got(path, Rule::Negative, value))
}

pub(super) fn status_codes(
    value: &Value,
    path: &str,
    non_empty: bool,
) -> Result<GrpcCodes, ConfigError> {
    let list = array(value, path, "an array of status codes")?;
    if list.len() > MAX_STATUS_CODES {
        return Err(ConfigError::new(
            path,
            Rule::TooManyEntries {
                max: MAX_STATUS_CODES,
            },
        ));
    }
    if non_empty && list.is_empty() {
        return Err(ConfigError::new(path, Rule::EmptyStatusCodes));
    }
    let mut codes = GrpcCodes::empty();
    for (k, entry) in list.iter().enumerate() {
        let code = match entry {
            Value::String(name) => name.parse::<Code>().ok(),
            _ => number(entry)
                .and_then(|n| i32::try_from(n).ok())
                .and_then(Code::from_i32),
        };
        match code {
            Some(code) => codes.insert(code),
            None => {
                return Err(ConfigError::got(
                    format!("{path}[{k}]"),
                    Rule::UnknownStatusCode,
                    entry,
                ));
            }
        }
    }
    Ok(codes)
}

/// `tokenRatio` in thousandths, digits past the third decimal dropped, saturated to
/// `u32::MAX`; 0 for anything not a number > 0.
fn token_ratio_milli(number: &Number) -> u32 {
    if let Some(n) = number.as_u64() {
        return saturate_u32(n.saturating_mul(1000));
    }
    let Some(f) = number.as_f64() else { return 0 };
    if f.is_nan() || f <= 0.0 {
        return 0;
    }
    if f >= 4_294_967.296 {
        return u32::MAX;
    }
    // Truncate the shortest decimal that reads back as `f` (Rust's `Display` for
    // floats: never an exponent), so that 0.3 gives 300 although the float is a
    // hair below 0.3.
    let text = f.to_string();
    let (whole, fraction) = text.split_once('.').unwrap_or((text.as_str(), ""));
    let whole: u32 = whole.parse().unwrap_or(0);
    let mut milli = whole.saturating_mul(1000);
    let mut scale = 100;
    for digit in fraction.bytes().take(3) {
        milli = milli.saturating_add(u32::from(digit.wrapping_sub(b'0') % 10) * scale);
        scale /= 10;
    }
    milli
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ratio_truncates_decimal_text() {
        let milli = |json: &str| {
            let value: Value = serde_json::from_str(json).unwrap();
            token_ratio_milli(value.as_number().unwrap())
        };
        assert_eq!(milli("0.1"), 100);
        assert_eq!(milli("0.3"), 300);
        assert_eq!(milli("0.5466"), 546);
        assert_eq!(milli("0.0009"), 0);
        assert_eq!(milli("0.001"), 1);
        assert_eq!(milli("1e-3"), 1);
        assert_eq!(milli("2"), 2000);
        assert_eq!(milli("2.0"), 2000);
        assert_eq!(milli("4294967.295"), u32::MAX);
        assert_eq!(milli("4294967.2959"), u32::MAX);
        assert_eq!(milli("1e300"), u32::MAX);
        assert_eq!(milli("99999999999"), u32::MAX);
        assert_eq!(milli("-0.5"), 0);
        assert_eq!(milli("-3"), 0);
        assert_eq!(milli("0"), 0);
    }

    #[test]
    fn integers_are_numbers_without_fraction_or_decimal_strings() {
        let int = |json: &str| unsigned(&serde_json::from_str::<Value>(json).unwrap());
        assert_eq!(int("2"), Ok(2));
        assert_eq!(int("2.0"), Ok(2));
        assert_eq!(int("2e0"), Ok(2));
        assert_eq!(int("-0"), Ok(0));
        assert_eq!(int("-0.0"), Ok(0));
        assert_eq!(int("-1"), Err(NotUnsigned::Invalid));
        assert_eq!(int("-1.0"), Err(NotUnsigned::Invalid));
        assert_eq!(int("2.5"), Err(NotUnsigned::Invalid));
        assert_eq!(int("1e30"), Ok(u64::MAX));
        assert_eq!(int("18446744073709551616"), Ok(u64::MAX));
        assert_eq!(int("\"2\""), Ok(2));
        assert_eq!(int("\"007\""), Ok(7));
        assert_eq!(int("\"99999999999999999999999\""), Ok(u64::MAX));
        for text in ["\"\"", "\"-1\"", "\"+1\"", "\"1e2\"", "\" 1\"", "\"1.0\""] {
            assert_eq!(int(text), Err(NotUnsigned::Invalid), "{text}");
        }
        for other in ["true", "null", "[]", "{}"] {
            assert_eq!(int(other), Err(NotUnsigned::WrongType), "{other}");
        }
        // The service config's integers are numbers only.
        assert_eq!(number(&serde_json::json!("2")), None);
        assert_eq!(number(&serde_json::json!(2)), Some(2));
    }
}
