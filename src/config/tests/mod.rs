//! The parser's tests: the validation table, the duration parser, name matching, the
//! examples of gRFC A6, limits on untrusted input, properties, and keys gRPC does not define.

mod a6;
mod duration;
mod limits;
mod matching;
mod props;
mod unknown;
mod validation;

use crate::config::{
    ConfigError, HedgingPolicyConfig, RetryPolicyConfig, RetryThrottling, ServiceConfig,
};

// The limits on untrusted input that the `config` module documents.
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
const MAX_METHOD_CONFIGS: usize = 10_000;
const MAX_NAMES: usize = 10_000;
const MAX_STATUS_CODES: usize = 100;
const MAX_DURATION_SECONDS: u64 = 315_576_000_000;
const MAX_IGNORED_KEYS: usize = 100;
const MAX_KEY_CHARS: usize = 64;

/// Parses a config that must be valid.
fn parse(json: &str) -> ServiceConfig {
    ServiceConfig::from_json(json).unwrap_or_else(|e| panic!("rejected {json}: {e}"))
}

/// Parses a config that must be invalid.
fn parse_err(json: &str) -> ConfigError {
    match ServiceConfig::from_json(json) {
        Ok(config) => panic!("accepted {json}: {config:?}"),
        Err(error) => error,
    }
}

/// A JSON object made of `base` fields (raw JSON values), each replaced by its
/// override (`Some(raw)`) or removed (`None`); overrides of absent keys are appended.
fn object(base: &[(&str, &str)], overrides: &[(&str, Option<&str>)]) -> String {
    let mut fields = Vec::new();
    for (key, value) in base {
        match overrides.iter().find(|(k, _)| k == key) {
            Some((_, Some(raw))) => fields.push(format!("{key:?}: {raw}")),
            Some((_, None)) => {}
            None => fields.push(format!("{key:?}: {value}")),
        }
    }
    for (key, value) in overrides {
        if let (false, Some(raw)) = (base.iter().any(|(k, _)| k == key), value) {
            fields.push(format!("{key:?}: {raw}"));
        }
    }
    format!("{{{}}}", fields.join(", "))
}

/// A valid retry policy with some fields replaced or removed.
fn retry_policy(overrides: &[(&str, Option<&str>)]) -> String {
    object(
        &[
            ("maxAttempts", "3"),
            ("initialBackoff", "\"0.1s\""),
            ("maxBackoff", "\"1s\""),
            ("backoffMultiplier", "2"),
            ("retryableStatusCodes", "[\"UNAVAILABLE\"]"),
        ],
        overrides,
    )
}

/// A valid hedging policy with some fields replaced or removed.
fn hedging_policy(overrides: &[(&str, Option<&str>)]) -> String {
    object(
        &[
            ("maxAttempts", "3"),
            ("hedgingDelay", "\"0.1s\""),
            ("nonFatalStatusCodes", "[\"UNAVAILABLE\"]"),
        ],
        overrides,
    )
}

/// A valid retry throttling with some fields replaced or removed.
fn throttling(overrides: &[(&str, Option<&str>)]) -> String {
    object(&[("maxTokens", "10"), ("tokenRatio", "0.1")], overrides)
}

/// A config whose one method config, for service `s`, has this retry policy.
fn with_retry(policy: &str) -> String {
    format!(r#"{{"methodConfig": [{{"name": [{{"service": "s"}}], "retryPolicy": {policy}}}]}}"#)
}

/// A config whose one method config, for service `s`, has this hedging policy.
fn with_hedging(policy: &str) -> String {
    format!(r#"{{"methodConfig": [{{"name": [{{"service": "s"}}], "hedgingPolicy": {policy}}}]}}"#)
}

/// A config with only this retry throttling.
fn with_throttling(throttling: &str) -> String {
    format!(r#"{{"retryThrottling": {throttling}}}"#)
}

/// A config whose one method config has these fields (raw JSON, without braces).
fn with_method_config(fields: &str) -> String {
    format!(r#"{{"methodConfig": [{{{fields}}}]}}"#)
}

/// The retry policy of the first method config.
fn retry_of(config: &ServiceConfig) -> RetryPolicyConfig {
    *config.method_configs()[0]
        .retry_policy()
        .expect("a retry policy")
}

/// The hedging policy of the first method config.
fn hedging_of(config: &ServiceConfig) -> HedgingPolicyConfig {
    *config.method_configs()[0]
        .hedging_policy()
        .expect("a hedging policy")
}

/// The retry throttling.
fn throttling_of(config: &ServiceConfig) -> RetryThrottling {
    config.retry_throttling().expect("retry throttling")
}
