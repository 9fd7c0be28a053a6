//! Writing a service config back as service-config JSON.

use std::time::Duration;

use serde_json::{Map, Number, Value};

use super::{ConfigPolicy, MethodConfig, ServiceConfig, format_duration};
use crate::classify::GrpcCodes;

/// A whole service config as service-config JSON, which parses back to an equal value.
pub(super) fn service_config_value(config: &ServiceConfig) -> Value {
    let mut root = Map::new();
    if !config.method_configs.is_empty() {
        let list = config
            .method_configs
            .iter()
            .map(method_config_value)
            .collect();
        root.insert("methodConfig".to_owned(), Value::Array(list));
    }
    if let Some(throttling) = config.retry_throttling {
        let mut object = Map::new();
        object.insert("maxTokens".to_owned(), throttling.max_tokens.into());
        object.insert("tokenRatio".to_owned(), float(throttling.token_ratio()));
        root.insert("retryThrottling".to_owned(), Value::Object(object));
    }
    Value::Object(root)
}

fn float(f: f64) -> Value {
    // Every float of a parsed config is finite; `Null` is unreachable.
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn codes_value(codes: GrpcCodes) -> Value {
    Value::Array(
        codes
            .iter()
            .map(|code| Value::String(code.as_str().to_owned()))
            .collect(),
    )
}

fn duration_value(duration: Duration) -> Value {
    Value::String(format_duration(duration))
}

fn method_config_value(config: &MethodConfig) -> Value {
    let mut object = Map::new();
    let names = config
        .names
        .iter()
        .map(|name| {
            let mut object = Map::new();
            if !name.service.is_empty() {
                object.insert("service".to_owned(), Value::String(name.service.clone()));
            }
            if let Some(method) = &name.method {
                object.insert("method".to_owned(), Value::String(method.clone()));
            }
            Value::Object(object)
        })
        .collect();
    object.insert("name".to_owned(), Value::Array(names));
    match &config.policy {
        Some(ConfigPolicy::Retry(retry)) => {
            let mut policy = Map::new();
            policy.insert("maxAttempts".to_owned(), retry.max_attempts.into());
            policy.insert(
                "initialBackoff".to_owned(),
                duration_value(retry.initial_backoff),
            );
            policy.insert("maxBackoff".to_owned(), duration_value(retry.max_backoff));
            policy.insert(
                "backoffMultiplier".to_owned(),
                float(retry.backoff_multiplier),
            );
            policy.insert(
                "retryableStatusCodes".to_owned(),
                codes_value(retry.retryable_status_codes),
            );
            if let Some(timeout) = retry.per_attempt_recv_timeout {
                policy.insert("perAttemptRecvTimeout".to_owned(), duration_value(timeout));
            }
            object.insert("retryPolicy".to_owned(), Value::Object(policy));
        }
        Some(ConfigPolicy::Hedging(hedging)) => {
            let mut policy = Map::new();
            policy.insert("maxAttempts".to_owned(), hedging.max_attempts.into());
            policy.insert(
                "hedgingDelay".to_owned(),
                duration_value(hedging.hedging_delay),
            );
            policy.insert(
                "nonFatalStatusCodes".to_owned(),
                codes_value(hedging.non_fatal_status_codes),
            );
            object.insert("hedgingPolicy".to_owned(), Value::Object(policy));
        }
        None => {}
    }
    if let Some(timeout) = config.timeout {
        object.insert("timeout".to_owned(), duration_value(timeout));
    }
    if let Some(wait) = config.wait_for_ready {
        object.insert("waitForReady".to_owned(), Value::Bool(wait));
    }
    if let Some(bytes) = config.max_request_message_bytes {
        object.insert("maxRequestMessageBytes".to_owned(), bytes.into());
    }
    if let Some(bytes) = config.max_response_message_bytes {
        object.insert("maxResponseMessageBytes".to_owned(), bytes.into());
    }
    Value::Object(object)
}
