//! Reading service-config JSON: field readers that name the path of what they read, and
//! one parser per object of the document.

use std::time::Duration;

use serde_json::{Map, Number, Value};

use super::index::Slot;
use super::unknown::{UnknownKeys, fields, near_miss};
use super::{
    ConfigError, ConfigPolicy, DurationError, HedgingPolicyConfig, MAX_DOCUMENT_BYTES,
    MAX_METHOD_CONFIGS, MAX_NAMES, MAX_STATUS_CODES, MethodConfig, MethodName, RetryPolicyConfig,
    RetryThrottling, Rule, ServiceConfig, parse_duration,
};
use crate::classify::{Code, GrpcCodes};

/// A whole service config, validated; keys gRPC does not define are refused (`strict`) or
/// kept in [`ServiceConfig::ignored`].
pub(super) fn parse_service_config(
    value: &Value,
    strict: bool,
) -> Result<ServiceConfig, ConfigError> {
    let mut unknown = UnknownKeys::new(strict);
    let root = object(value, "")?;
    unknown.check(root, "", fields::ROOT)?;
    let mut config = ServiceConfig::default();
    if let Some(list) = field(root, "methodConfig") {
        let path = "methodConfig";
        let list = array(list, path, "an array of method configs")?;
        if list.len() > MAX_METHOD_CONFIGS {
            return Err(ConfigError::new(
                path,
                Rule::TooManyEntries {
                    max: MAX_METHOD_CONFIGS,
                },
            ));
        }
        config.method_configs.reserve_exact(list.len());
        let mut names_seen = 0;
        for (i, entry) in list.iter().enumerate() {
            let path = format!("methodConfig[{i}]");
            let method_config = parse_method_config(entry, &path, &mut names_seen, &mut unknown)?;
            for (j, name) in method_config.names.iter().enumerate() {
                config.index.insert(name, Slot { config: i, name: j })?;
            }
            config.method_configs.push(method_config);
        }
    }
    if let Some(throttling) = field(root, "retryThrottling") {
        config.retry_throttling = Some(parse_throttling(
            throttling,
            "retryThrottling",
            &mut unknown,
        )?);
    }
    // Fields this crate does not read: only their keys are checked, and only in an object.
    for (key, known) in [
        ("healthCheckConfig", fields::HEALTH_CHECK_CONFIG),
        ("connectionScaling", fields::CONNECTION_SCALING),
    ] {
        if let Some(Value::Object(object)) = field(root, key) {
            unknown.check(object, key, known)?;
        }
    }
    config.ignored = unknown.kept;
    config.ignored_count = unknown.count;
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

/// A required field of an object whose fields are `known`; when it is absent, the error
/// names a key of the object that is a near miss of it.
fn required<'a>(
    object: &'a Map<String, Value>,
    path: &str,
    key: &'static str,
    known: &'static [&'static str],
) -> Result<(&'a Value, String), ConfigError> {
    let path = child(path, key);
    match field(object, key) {
        Some(value) => Ok((value, path)),
        None => Err(ConfigError::missing(
            path,
            key,
            near_miss(object, known, key),
        )),
    }
}

pub(super) fn object<'a>(
    value: &'a Value,
    path: &str,
) -> Result<&'a Map<String, Value>, ConfigError> {
    value.as_object().ok_or_else(|| {
        ConfigError::got(
            path,
            Rule::WrongType {
                expected: "an object",
            },
            value,
        )
    })
}

fn array<'a>(
    value: &'a Value,
    path: &str,
    expected: &'static str,
) -> Result<&'a Vec<Value>, ConfigError> {
    value
        .as_array()
        .ok_or_else(|| ConfigError::got(path, Rule::WrongType { expected }, value))
}

fn string<'a>(value: &'a Value, path: &str) -> Result<&'a str, ConfigError> {
    value.as_str().ok_or_else(|| {
        ConfigError::got(
            path,
            Rule::WrongType {
                expected: "a string",
            },
            value,
        )
    })
}

/// An integral JSON number (`2`, `2.0`, `2e0`), saturated to `u64`; `Err(())` for a
/// negative one, `None` for anything else.
fn integer(value: &Value) -> Option<Result<u64, ()>> {
    let number = value.as_number()?;
    if let Some(n) = number.as_u64() {
        return Some(Ok(n));
    }
    if number.is_i64() {
        // Not a u64, so below zero.
        return Some(Err(()));
    }
    let f = number.as_f64()?;
    if !f.is_finite() || f.fract() != 0.0 {
        return None;
    }
    // `-0.0 < 0.0` is false: negative zero is zero. Float-to-int `as` saturates.
    Some(if f < 0.0 { Err(()) } else { Ok(f as u64) })
}

fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn parse_max_attempts(value: &Value, path: &str) -> Result<u32, ConfigError> {
    match integer(value) {
        Some(Ok(n)) if n >= 2 => Ok(saturate_u32(n)),
        _ => Err(ConfigError::got(path, Rule::MaxAttempts, value)),
    }
}

/// A duration string; `Ok(Err(()))` when well-formed but negative.
fn duration(value: &Value, path: &str) -> Result<Result<Duration, ()>, ConfigError> {
    let Some(text) = value.as_str() else {
        return Err(ConfigError::got(
            path,
            Rule::WrongType {
                expected: "a duration string such as \"0.1s\"",
            },
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

fn parse_status_codes(
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
            _ => match integer(entry) {
                Some(Ok(n)) => i32::try_from(n).ok().and_then(Code::from_i32),
                _ => None,
            },
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

fn parse_retry_policy(
    value: &Value,
    path: &str,
    unknown: &mut UnknownKeys,
) -> Result<RetryPolicyConfig, ConfigError> {
    let object = object(value, path)?;
    let known = fields::RETRY_POLICY;
    unknown.check(object, path, known)?;

    let (value, at) = required(object, path, "maxAttempts", known)?;
    let max_attempts = parse_max_attempts(value, &at)?;

    let (value, at) = required(object, path, "initialBackoff", known)?;
    let initial_backoff = positive_duration(value, &at)?;

    let (value, at) = required(object, path, "maxBackoff", known)?;
    let max_backoff = positive_duration(value, &at)?;

    let (value, at) = required(object, path, "backoffMultiplier", known)?;
    let backoff_multiplier = match value.as_f64() {
        Some(m) if m > 0.0 && m.is_finite() => m,
        _ => return Err(ConfigError::got(at, Rule::BackoffMultiplier, value)),
    };

    let per_attempt_recv_timeout = match field(object, "perAttemptRecvTimeout") {
        Some(value) => Some(positive_duration(
            value,
            &child(path, "perAttemptRecvTimeout"),
        )?),
        None => None,
    };

    // As in C-core: with a per-attempt timeout the codes may be empty (only timeouts are
    // retried then), but the key is still required.
    let (value, at) = required(object, path, "retryableStatusCodes", known)?;
    let retryable_status_codes =
        parse_status_codes(value, &at, per_attempt_recv_timeout.is_none())?;

    Ok(RetryPolicyConfig {
        max_attempts,
        initial_backoff,
        max_backoff,
        backoff_multiplier,
        retryable_status_codes,
        per_attempt_recv_timeout,
    })
}

fn parse_hedging_policy(
    value: &Value,
    path: &str,
    unknown: &mut UnknownKeys,
) -> Result<HedgingPolicyConfig, ConfigError> {
    let object = object(value, path)?;
    let known = fields::HEDGING_POLICY;
    unknown.check(object, path, known)?;

    let (value, at) = required(object, path, "maxAttempts", known)?;
    let max_attempts = parse_max_attempts(value, &at)?;

    let hedging_delay = match field(object, "hedgingDelay") {
        Some(value) => non_negative_duration(value, &child(path, "hedgingDelay"))?,
        None => Duration::ZERO,
    };

    let non_fatal_status_codes = match field(object, "nonFatalStatusCodes") {
        Some(value) => parse_status_codes(value, &child(path, "nonFatalStatusCodes"), false)?,
        None => GrpcCodes::empty(),
    };

    Ok(HedgingPolicyConfig {
        max_attempts,
        hedging_delay,
        non_fatal_status_codes,
    })
}

fn parse_name(
    value: &Value,
    path: &str,
    unknown: &mut UnknownKeys,
) -> Result<MethodName, ConfigError> {
    let object = object(value, path)?;
    unknown.check(object, path, fields::NAME)?;
    let service = match field(object, "service") {
        Some(value) => string(value, &child(path, "service"))?,
        None => "",
    };
    let method = match field(object, "method") {
        Some(value) => string(value, &child(path, "method"))?,
        None => "",
    };
    if service.is_empty() && !method.is_empty() {
        return Err(ConfigError::new(path, Rule::MethodWithoutService));
    }
    Ok(MethodName {
        service: service.to_owned(),
        method: (!method.is_empty()).then(|| method.to_owned()),
    })
}

fn parse_message_bytes(value: &Value, path: &str) -> Result<u64, ConfigError> {
    match integer(value) {
        Some(Ok(n)) => Ok(n),
        _ => Err(ConfigError::got(path, Rule::MessageBytes, value)),
    }
}

fn parse_method_config(
    value: &Value,
    path: &str,
    names_seen: &mut usize,
    unknown: &mut UnknownKeys,
) -> Result<MethodConfig, ConfigError> {
    let object = object(value, path)?;
    unknown.check(object, path, fields::METHOD_CONFIG)?;

    let mut names = Vec::new();
    if let Some(list) = field(object, "name") {
        let at = child(path, "name");
        let list = array(list, &at, "an array of names")?;
        *names_seen = names_seen.saturating_add(list.len());
        if *names_seen > MAX_NAMES {
            return Err(ConfigError::new(at, Rule::TooManyNames { max: MAX_NAMES }));
        }
        names.reserve_exact(list.len());
        for (j, name) in list.iter().enumerate() {
            names.push(parse_name(name, &format!("{at}[{j}]"), unknown)?);
        }
    }

    let policy = match (field(object, "retryPolicy"), field(object, "hedgingPolicy")) {
        (Some(_), Some(_)) => return Err(ConfigError::new(path, Rule::BothPolicies)),
        (Some(retry), None) => Some(ConfigPolicy::Retry(parse_retry_policy(
            retry,
            &child(path, "retryPolicy"),
            unknown,
        )?)),
        (None, Some(hedging)) => Some(ConfigPolicy::Hedging(parse_hedging_policy(
            hedging,
            &child(path, "hedgingPolicy"),
            unknown,
        )?)),
        (None, None) => None,
    };

    let timeout = field(object, "timeout")
        .map(|value| non_negative_duration(value, &child(path, "timeout")))
        .transpose()?;

    let wait_for_ready = field(object, "waitForReady")
        .map(|value| {
            value.as_bool().ok_or_else(|| {
                ConfigError::got(
                    child(path, "waitForReady"),
                    Rule::WrongType {
                        expected: "a boolean",
                    },
                    value,
                )
            })
        })
        .transpose()?;

    let max_request_message_bytes = field(object, "maxRequestMessageBytes")
        .map(|value| parse_message_bytes(value, &child(path, "maxRequestMessageBytes")))
        .transpose()?;
    let max_response_message_bytes = field(object, "maxResponseMessageBytes")
        .map(|value| parse_message_bytes(value, &child(path, "maxResponseMessageBytes")))
        .transpose()?;

    Ok(MethodConfig {
        names,
        policy,
        timeout,
        wait_for_ready,
        max_request_message_bytes,
        max_response_message_bytes,
    })
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

fn parse_throttling(
    value: &Value,
    path: &str,
    unknown: &mut UnknownKeys,
) -> Result<RetryThrottling, ConfigError> {
    let object = object(value, path)?;
    let known = fields::RETRY_THROTTLING;
    unknown.check(object, path, known)?;

    let (value, at) = required(object, path, "maxTokens", known)?;
    let max_tokens = match integer(value) {
        Some(Ok(n @ 1..=1000)) => saturate_u32(n),
        _ => return Err(ConfigError::got(at, Rule::MaxTokens, value)),
    };

    let (value, at) = required(object, path, "tokenRatio", known)?;
    let token_ratio_milli = match value.as_number().map(token_ratio_milli) {
        Some(milli) if milli > 0 => milli,
        _ => return Err(ConfigError::got(at, Rule::TokenRatio, value)),
    };

    Ok(RetryThrottling {
        max_tokens,
        token_ratio_milli,
    })
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
    fn integers_accept_integral_floats_only() {
        let int = |json: &str| integer(&serde_json::from_str::<Value>(json).unwrap());
        assert_eq!(int("2"), Some(Ok(2)));
        assert_eq!(int("2.0"), Some(Ok(2)));
        assert_eq!(int("2e0"), Some(Ok(2)));
        assert_eq!(int("-0"), Some(Ok(0)));
        assert_eq!(int("-0.0"), Some(Ok(0)));
        assert_eq!(int("-1"), Some(Err(())));
        assert_eq!(int("-1.0"), Some(Err(())));
        assert_eq!(int("2.5"), None);
        assert_eq!(int("\"2\""), None);
        assert_eq!(int("1e30"), Some(Ok(u64::MAX)));
        assert_eq!(int("18446744073709551616"), Some(Ok(u64::MAX)));
    }
}
