//! The objects of a service config, one table each: every field gRPC defines there
//! (`grpc/service_config/service_config.proto`, and `perAttemptRecvTimeout`, which grpc-java
//! and C-core read), in the order it is read, whether it is required, how its value is read
//! into the model, and how it is written back. A service-config key is spelled here and
//! nowhere else (outlier detection's are in `outlier`).
//!
//! A reader is `|c, v, at, reader|`: what the object's fields before it made, the field's
//! value, its path, and the state of the document's read; a writer is `|c|`.

use std::time::Duration;

use serde_json::{Number, Value};

use super::index::Slot;
use super::parse::{
    array, backoff_multiplier, boolean, max_attempts, max_tokens, message_bytes,
    non_negative_duration, positive_duration, status_codes, string, token_ratio,
};
use super::table::{Field, Reader, keys_only, read, set, write};
use super::{
    ConfigError, ConfigPolicy, HedgingPolicyConfig, MAX_METHOD_CONFIGS, MAX_NAMES, MethodConfig,
    MethodName, RetryPolicyConfig, RetryThrottling, Rule, ServiceConfig, format_duration,
};
use crate::classify::GrpcCodes;

/// The document.
pub(super) const ROOT: &[Field<ServiceConfig>] = &[
    Field::unread("loadBalancingPolicy"),
    // Each load balancer's own configuration: not looked into.
    Field::unread("loadBalancingConfig"),
    Field::optional("methodConfig", read_method_configs, |c| {
        let list = &c.method_configs;
        (!list.is_empty()).then(|| list.iter().map(|m| write(METHOD_CONFIG, m)).collect())
    }),
    Field::optional(
        "retryThrottling",
        |c, v, at, reader| {
            let throttling = read(v, at, RETRY_THROTTLING, reader)?;
            set(&mut c.retry_throttling, Some(throttling))
        },
        |c| Some(write(RETRY_THROTTLING, c.retry_throttling.as_ref()?)),
    ),
    Field::read_only("healthCheckConfig", |_, v, at, reader| {
        keys_only(v, at, reader, HEALTH_CHECK_CONFIG)
    }),
    Field::read_only("connectionScaling", |_, v, at, reader| {
        keys_only(v, at, reader, CONNECTION_SCALING)
    }),
];

/// The key of a method config's names, which the path of a repeated name also spells.
const NAMES: &str = "name";

/// An entry of `methodConfig`. `retryPolicy` and `hedgingPolicy` are read after the names and
/// before the rest, so that holding both is reported before an error in either.
pub(super) const METHOD_CONFIG: &[Field<MethodConfig>] = &[
    Field::optional(NAMES, read_names, |c| {
        Some(c.names.iter().map(|name| write(NAME, name)).collect())
    }),
    Field::exclusive(
        "retryPolicy",
        |c, v, at, reader| {
            let retry = read(v, at, RETRY_POLICY, reader)?;
            set(&mut c.policy, Some(ConfigPolicy::Retry(retry)))
        },
        |c| Some(write(RETRY_POLICY, c.retry_policy()?)),
    ),
    Field::exclusive(
        "hedgingPolicy",
        |c, v, at, reader| {
            let hedging = read(v, at, HEDGING_POLICY, reader)?;
            set(&mut c.policy, Some(ConfigPolicy::Hedging(hedging)))
        },
        |c| Some(write(HEDGING_POLICY, c.hedging_policy()?)),
    ),
    Field::optional(
        "timeout",
        |c, v, at, _| set(&mut c.timeout, Some(non_negative_duration(v, at)?)),
        |c| c.timeout.map(duration_value),
    ),
    Field::optional(
        "waitForReady",
        |c, v, at, _| set(&mut c.wait_for_ready, Some(boolean(v, at)?)),
        |c| c.wait_for_ready.map(Value::Bool),
    ),
    Field::optional(
        "maxRequestMessageBytes",
        |c, v, at, _| {
            set(
                &mut c.max_request_message_bytes,
                Some(message_bytes(v, at)?),
            )
        },
        |c| c.max_request_message_bytes.map(Value::from),
    ),
    Field::optional(
        "maxResponseMessageBytes",
        |c, v, at, _| {
            set(
                &mut c.max_response_message_bytes,
                Some(message_bytes(v, at)?),
            )
        },
        |c| c.max_response_message_bytes.map(Value::from),
    ),
];

/// An entry of a method config's `name`. An empty `method` is an absent one.
pub(super) const NAME: &[Field<MethodName>] = &[
    Field::optional(
        "service",
        |c, v, at, _| set(&mut c.service, string(v, at)?.to_owned()),
        |c| (!c.service.is_empty()).then(|| Value::from(c.service.as_str())),
    ),
    Field::optional(
        "method",
        |c, v, at, _| {
            let method = string(v, at)?;
            set(
                &mut c.method,
                (!method.is_empty()).then(|| method.to_owned()),
            )
        },
        |c| c.method.as_deref().map(Value::from),
    ),
];

/// The key a retry policy and a hedging policy share.
const MAX_ATTEMPTS: &str = "maxAttempts";

/// `retryPolicy`. `perAttemptRecvTimeout` is read before `retryableStatusCodes`, which may be
/// empty with it (as in C-core: only timeouts are retried then), but is still required.
pub(super) const RETRY_POLICY: &[Field<RetryPolicyConfig>] = &[
    Field::required(
        MAX_ATTEMPTS,
        |c, v, at, _| set(&mut c.max_attempts, max_attempts(v, at)?),
        |c| Some(c.max_attempts.into()),
    ),
    Field::required(
        "initialBackoff",
        |c, v, at, _| set(&mut c.initial_backoff, positive_duration(v, at)?),
        |c| Some(duration_value(c.initial_backoff)),
    ),
    Field::required(
        "maxBackoff",
        |c, v, at, _| set(&mut c.max_backoff, positive_duration(v, at)?),
        |c| Some(duration_value(c.max_backoff)),
    ),
    Field::required(
        "backoffMultiplier",
        |c, v, at, _| set(&mut c.backoff_multiplier, backoff_multiplier(v, at)?),
        |c| Number::from_f64(c.backoff_multiplier).map(Value::Number),
    ),
    Field::optional(
        "perAttemptRecvTimeout",
        |c, v, at, _| {
            set(
                &mut c.per_attempt_recv_timeout,
                Some(positive_duration(v, at)?),
            )
        },
        |c| c.per_attempt_recv_timeout.map(duration_value),
    ),
    Field::required(
        "retryableStatusCodes",
        |c, v, at, _| {
            let codes = status_codes(v, at, c.per_attempt_recv_timeout.is_none())?;
            set(&mut c.retryable_status_codes, codes)
        },
        |c| Some(codes_value(c.retryable_status_codes)),
    ),
];

/// `hedgingPolicy`. An absent `hedgingDelay` is zero (all attempts at once), absent
/// `nonFatalStatusCodes` none.
pub(super) const HEDGING_POLICY: &[Field<HedgingPolicyConfig>] = &[
    Field::required(
        MAX_ATTEMPTS,
        |c, v, at, _| set(&mut c.max_attempts, max_attempts(v, at)?),
        |c| Some(c.max_attempts.into()),
    ),
    Field::optional(
        "hedgingDelay",
        |c, v, at, _| set(&mut c.hedging_delay, non_negative_duration(v, at)?),
        |c| Some(duration_value(c.hedging_delay)),
    ),
    Field::optional(
        "nonFatalStatusCodes",
        |c, v, at, _| set(&mut c.non_fatal_status_codes, status_codes(v, at, false)?),
        |c| Some(codes_value(c.non_fatal_status_codes)),
    ),
];

/// `retryThrottling`.
pub(super) const RETRY_THROTTLING: &[Field<RetryThrottling>] = &[
    Field::required(
        "maxTokens",
        |c, v, at, _| set(&mut c.max_tokens, max_tokens(v, at)?),
        |c| Some(c.max_tokens.into()),
    ),
    Field::required(
        "tokenRatio",
        |c, v, at, _| set(&mut c.token_ratio_milli, token_ratio(v, at)?),
        |c| Number::from_f64(c.token_ratio()).map(Value::Number),
    ),
];

/// `healthCheckConfig`: not read; only its keys are checked.
const HEALTH_CHECK_CONFIG: &[Field<()>] = &[Field::unread("serviceName")];

/// `connectionScaling`: not read; only its keys are checked.
const CONNECTION_SCALING: &[Field<()>] = &[Field::unread("maxConnectionsPerSubchannel")];

/// `methodConfig`: every entry read, and its names indexed (a name given twice is an error).
fn read_method_configs(
    config: &mut ServiceConfig,
    value: &Value,
    path: &str,
    reader: &mut Reader,
) -> Result<(), ConfigError> {
    let list = array(value, path, "an array of method configs")?;
    if list.len() > MAX_METHOD_CONFIGS {
        let max = MAX_METHOD_CONFIGS;
        return Err(ConfigError::new(path, Rule::TooManyEntries { max }));
    }
    let name_path = |slot: Slot| format!("{path}[{}].{NAMES}[{}]", slot.config, slot.name);
    config.method_configs.reserve_exact(list.len());
    for (i, entry) in list.iter().enumerate() {
        let method_config: MethodConfig =
            read(entry, &format!("{path}[{i}]"), METHOD_CONFIG, reader)?;
        for (j, name) in method_config.names.iter().enumerate() {
            let slot = Slot { config: i, name: j };
            config.index.insert(name, slot, name_path)?;
        }
        config.method_configs.push(method_config);
    }
    Ok(())
}

/// A method config's `name`: at most `MAX_NAMES` across all method configs; a method without
/// a service is an error.
fn read_names(
    config: &mut MethodConfig,
    value: &Value,
    path: &str,
    reader: &mut Reader,
) -> Result<(), ConfigError> {
    let list = array(value, path, "an array of names")?;
    reader.names_seen = reader.names_seen.saturating_add(list.len());
    if reader.names_seen > MAX_NAMES {
        return Err(ConfigError::new(
            path,
            Rule::TooManyNames { max: MAX_NAMES },
        ));
    }
    config.names.reserve_exact(list.len());
    for (j, entry) in list.iter().enumerate() {
        let at = format!("{path}[{j}]");
        let name: MethodName = read(entry, &at, NAME, reader)?;
        if name.service.is_empty() && name.method.is_some() {
            return Err(ConfigError::new(at, Rule::MethodWithoutService));
        }
        config.names.push(name);
    }
    Ok(())
}

fn duration_value(duration: Duration) -> Value {
    Value::String(format_duration(duration))
}

fn codes_value(codes: GrpcCodes) -> Value {
    codes
        .iter()
        .map(|code| Value::from(code.as_str()))
        .collect()
}
