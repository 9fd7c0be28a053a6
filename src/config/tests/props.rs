//! Properties: generated valid configs round-trip; nothing panics on any input.

use std::time::Duration;

use crate::backoff::Jitter;
use crate::classify::{Code, GrpcCodes};
use crate::config::{ConfigPolicy, PolicyOptions, ServiceConfig, format_duration, parse_duration};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::MAX_DURATION_SECONDS;

/// What a generated method config should parse to.
#[derive(Debug, Clone)]
struct GenMethodConfig {
    names: Vec<(String, Option<String>)>,
    policy: Option<GenPolicy>,
    timeout: Option<Duration>,
    wait_for_ready: Option<bool>,
    max_request_message_bytes: Option<u64>,
}

#[derive(Debug, Clone)]
enum GenPolicy {
    Retry {
        max_attempts: u32,
        initial: Duration,
        max: Duration,
        multiplier: f64,
        codes: Vec<Code>,
    },
    Hedging {
        max_attempts: u32,
        delay: Option<Duration>,
        codes: Option<Vec<Code>>,
    },
}

fn code() -> impl Strategy<Value = Code> {
    (0..17i32).prop_map(|n| Code::from_i32(n).unwrap())
}

fn duration(min_nanos: u64) -> impl Strategy<Value = Duration> {
    prop_oneof![
        // Everyday values: whole milliseconds up to a minute.
        (min_nanos.div_ceil(1_000_000)..60_000u64).prop_map(Duration::from_millis),
        // Anything in range, to the nanosecond.
        (0..=MAX_DURATION_SECONDS, 0..1_000_000_000u32)
            .prop_map(|(s, n)| Duration::new(s, n))
            .prop_filter("large enough", move |d| d.as_nanos()
                >= u128::from(min_nanos)),
    ]
}

fn max_attempts() -> impl Strategy<Value = u32> {
    prop_oneof![2..=10u32, 2..=u32::MAX]
}

fn policy() -> impl Strategy<Value = GenPolicy> {
    prop_oneof![
        (
            max_attempts(),
            duration(1),
            duration(1),
            prop_oneof![
                (1..100_000u32).prop_map(|m| f64::from(m) / 1000.0),
                1e-9f64..1e9,
            ],
            prop::collection::vec(code(), 1..5),
        )
            .prop_map(
                |(max_attempts, initial, max, multiplier, codes)| GenPolicy::Retry {
                    max_attempts,
                    initial,
                    max,
                    multiplier,
                    codes,
                }
            ),
        (
            max_attempts(),
            prop::option::of(duration(0)),
            prop::option::of(prop::collection::vec(code(), 0..5)),
        )
            .prop_map(|(max_attempts, delay, codes)| GenPolicy::Hedging {
                max_attempts,
                delay,
                codes,
            }),
    ]
}

fn name() -> impl Strategy<Value = (String, Option<String>)> {
    prop_oneof![
        1 => Just((String::new(), None)),
        3 => ("[a-z]{1,3}(\\.[A-Z][a-z]{0,3})?", prop::option::of("[A-Z][a-zA-Z]{0,5}")),
    ]
}

fn method_config() -> impl Strategy<Value = GenMethodConfig> {
    (
        prop::collection::vec(name(), 0..4),
        prop::option::of(policy()),
        prop::option::of(duration(0)),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<u64>()),
    )
        .prop_map(
            |(names, policy, timeout, wait_for_ready, max_request_message_bytes)| GenMethodConfig {
                names,
                policy,
                timeout,
                wait_for_ready,
                max_request_message_bytes,
            },
        )
}

fn config() -> impl Strategy<Value = (Vec<GenMethodConfig>, Option<(u32, u32)>)> {
    (
        prop::collection::vec(method_config(), 0..6),
        prop::option::of((1..=1000u32, 1..=u32::MAX)),
    )
        .prop_map(|(mut configs, throttling)| {
            // Names must be unique across the document.
            let mut seen = std::collections::HashSet::new();
            for config in &mut configs {
                config.names.retain(|name| seen.insert(name.clone()));
            }
            (configs, throttling)
        })
}

/// Writes codes the many ways A6 allows.
fn code_value(code: Code, style: usize) -> Value {
    match style % 3 {
        0 => json!(code.as_str()),
        1 => json!(code.as_str().to_ascii_lowercase()),
        _ => json!(code.as_i32()),
    }
}

fn to_json(configs: &[GenMethodConfig], throttling: Option<(u32, u32)>) -> String {
    let method_configs: Vec<Value> = configs
        .iter()
        .map(|c| {
            let names: Vec<Value> = c
                .names
                .iter()
                .map(|(service, method)| match method {
                    Some(method) => json!({"service": service, "method": method}),
                    None => json!({"service": service}),
                })
                .collect();
            let mut object = json!({ "name": names });
            match &c.policy {
                Some(GenPolicy::Retry {
                    max_attempts,
                    initial,
                    max,
                    multiplier,
                    codes,
                }) => {
                    object["retryPolicy"] = json!({
                        "maxAttempts": max_attempts,
                        "initialBackoff": format_duration(*initial),
                        "maxBackoff": format_duration(*max),
                        "backoffMultiplier": multiplier,
                        "retryableStatusCodes": codes.iter().enumerate()
                            .map(|(i, c)| code_value(*c, i)).collect::<Vec<_>>(),
                    });
                }
                Some(GenPolicy::Hedging {
                    max_attempts,
                    delay,
                    codes,
                }) => {
                    let mut policy = json!({ "maxAttempts": max_attempts });
                    if let Some(delay) = delay {
                        policy["hedgingDelay"] = json!(format_duration(*delay));
                    }
                    if let Some(codes) = codes {
                        policy["nonFatalStatusCodes"] = codes
                            .iter()
                            .enumerate()
                            .map(|(i, c)| code_value(*c, i + 1))
                            .collect();
                    }
                    object["hedgingPolicy"] = policy;
                }
                None => {}
            }
            if let Some(timeout) = c.timeout {
                object["timeout"] = json!(format_duration(timeout));
            }
            if let Some(wait) = c.wait_for_ready {
                object["waitForReady"] = json!(wait);
            }
            if let Some(bytes) = c.max_request_message_bytes {
                object["maxRequestMessageBytes"] = json!(bytes);
            }
            object
        })
        .collect();
    let mut root = json!({ "loadBalancingPolicy": "round_robin", "methodConfig": method_configs });
    if let Some((max_tokens, milli)) = throttling {
        // Written as a person would: the decimal, with its trailing zeros.
        let ratio = format!("{}.{:03}", milli / 1000, milli % 1000);
        root["retryThrottling"] = json!({
            "maxTokens": max_tokens,
            "tokenRatio": serde_json::from_str::<Value>(&ratio).unwrap(),
        });
    }
    root.to_string()
}

fn check_model(
    config: &ServiceConfig,
    expected: &[GenMethodConfig],
    throttling: Option<(u32, u32)>,
) {
    assert_eq!(config.method_configs().len(), expected.len());
    for (got, want) in config.method_configs().iter().zip(expected) {
        let names: Vec<(String, Option<String>)> = got
            .names
            .iter()
            .map(|n| (n.service.clone(), n.method.clone()))
            .collect();
        assert_eq!(names, want.names);
        assert_eq!(got.timeout, want.timeout);
        assert_eq!(got.wait_for_ready, want.wait_for_ready);
        assert_eq!(
            got.max_request_message_bytes,
            want.max_request_message_bytes
        );
        match (got.policy, &want.policy) {
            (None, None) => {}
            (
                Some(ConfigPolicy::Retry(r)),
                Some(GenPolicy::Retry {
                    max_attempts,
                    initial,
                    max,
                    multiplier,
                    codes,
                }),
            ) => {
                assert_eq!(r.max_attempts, *max_attempts);
                assert_eq!(r.initial_backoff, *initial);
                assert_eq!(r.max_backoff, *max);
                assert_eq!(r.backoff_multiplier, *multiplier);
                assert_eq!(
                    r.retryable_status_codes,
                    codes.iter().copied().collect::<GrpcCodes>()
                );
            }
            (
                Some(ConfigPolicy::Hedging(h)),
                Some(GenPolicy::Hedging {
                    max_attempts,
                    delay,
                    codes,
                }),
            ) => {
                assert_eq!(h.max_attempts, *max_attempts);
                assert_eq!(h.hedging_delay, delay.unwrap_or(Duration::ZERO));
                let codes: GrpcCodes = codes.iter().flatten().copied().collect();
                assert_eq!(h.non_fatal_status_codes, codes);
            }
            (got, want) => panic!("policy {got:?}, wanted {want:?}"),
        }
        // Each name finds this config (names are unique).
        for name in &got.names {
            let method = name.method.as_deref().unwrap_or("Zz");
            let found = config.method_config(&name.service, method);
            assert!(std::ptr::eq(found.unwrap(), got) || name.method.is_none());
        }
    }
    match (config.retry_throttling(), throttling) {
        (None, None) => {}
        (Some(t), Some((max_tokens, milli))) => {
            assert_eq!(t.max_tokens, max_tokens);
            assert_eq!(t.token_ratio_milli, milli);
        }
        (got, want) => panic!("throttling {got:?}, wanted {want:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn generated_configs_parse_to_their_model_and_round_trip(
        (configs, throttling) in config()
    ) {
        let json = to_json(&configs, throttling);
        let config = ServiceConfig::from_json(&json).map_err(|e| TestCaseError::fail(format!("{e}\n{json}")))?;
        check_model(&config, &configs, throttling);

        let written = config.to_json();
        let again = ServiceConfig::from_json(&written).map_err(|e| TestCaseError::fail(format!("{e}\n{written}")))?;
        prop_assert_eq!(&again, &config);
        prop_assert_eq!(again.to_json(), written);
    }

    /// Whatever the parse validates, the layers' policies and the throttle build from (they
    /// `expect` it): every policy, with every jitter and `perAttemptRecvTimeout` or not.
    #[test]
    fn every_validated_config_builds_its_policies(
        (configs, throttling) in config(),
        per_attempt in prop::option::of(duration(1)),
        jitter in prop::sample::select(vec![
            Jitter::GRPC, Jitter::Full, Jitter::Equal, Jitter::None,
            Jitter::Proportional(0.0), Jitter::Proportional(1.0),
        ]),
    ) {
        let mut value: Value = serde_json::from_str(&to_json(&configs, throttling)).unwrap();
        if let Some(timeout) = per_attempt {
            for entry in value["methodConfig"].as_array_mut().unwrap() {
                if let Some(policy) = entry.get_mut("retryPolicy") {
                    policy["perAttemptRecvTimeout"] = json!(format_duration(timeout));
                }
            }
        }
        let config = ServiceConfig::from_value(&value).map_err(|e| TestCaseError::fail(format!("{e}\n{value}")))?;
        prop_assert_eq!(config.throttle().is_some(), throttling.is_some());
        let policies = config.policies_builder_with(PolicyOptions::new().jitter(jitter)).build();
        prop_assert_eq!(policies.has_throttle(), throttling.is_some());
        for method_config in config.method_configs() {
            let has_policy = method_config.policy.is_some()
                || method_config.timeout.is_some()
                || method_config.wait_for_ready == Some(true);
            for name in method_config.names.iter().filter(|name| name.method.is_some()) {
                let path = format!("/{}/{}", name.service, name.method.as_deref().unwrap_or_default());
                let found = policies.lookup(&http::Method::POST, &path);
                prop_assert_eq!(found.is_some(), has_policy, "{}", path);
            }
        }
    }

    #[test]
    fn durations_format_and_parse_back(seconds in 0..=MAX_DURATION_SECONDS, nanos in 0..1_000_000_000u32) {
        let duration = Duration::new(seconds, nanos);
        prop_assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
    }

    #[test]
    fn durations_agree_with_a_reference(text in "-?[0-9]{1,14}(\\.[0-9]{0,11})?s?") {
        // Reference: the grammar by regex, the value in u128 nanoseconds.
        let grammar = regex_like(&text);
        match parse_duration(&text) {
            Ok(duration) => {
                let (negative, nanos) = grammar.expect("accepted only what the grammar allows");
                prop_assert!(!negative || nanos == 0);
                prop_assert_eq!(duration.as_nanos(), nanos);
                prop_assert!(duration.as_secs() <= MAX_DURATION_SECONDS);
            }
            Err(_) => {
                if let Some((negative, nanos)) = grammar {
                    prop_assert!(negative && nanos > 0 || nanos >= (u128::from(MAX_DURATION_SECONDS) + 1) * 1_000_000_000);
                }
            }
        }
    }

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        let _ = ServiceConfig::from_json(&text);
        let _ = parse_duration(&text);
    }

    #[test]
    fn json_like_strings_never_panic(text in "[\\[\\]{}\",:0-9a-zA-Z.\\- esn]{0,200}") {
        let _ = ServiceConfig::from_json(&text);
        let _ = ServiceConfig::from_json(&format!("{{\"methodConfig\": [{{{text}}}]}}"));
    }

    #[test]
    fn any_value_in_any_field_never_panics(
        (configs, throttling) in config(),
        field in prop::sample::select(vec![
            "maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier",
            "retryableStatusCodes", "hedgingDelay", "nonFatalStatusCodes", "timeout",
            "waitForReady", "maxRequestMessageBytes", "name", "service", "method",
            "maxTokens", "tokenRatio", "retryPolicy", "hedgingPolicy", "methodConfig",
        ]),
        replacement in json_value(),
    ) {
        let mut value: Value = serde_json::from_str(&to_json(&configs, throttling)).unwrap();
        replace_field(&mut value, field, &replacement);
        match ServiceConfig::from_value(&value) {
            Ok(config) => {
                // What parses, builds (the layers `expect` it).
                let _ = (config.policies(), config.throttle());
                prop_assert_eq!(ServiceConfig::from_json(&config.to_json()).unwrap(), config);
            }
            Err(error) => {
                let path = error.path();
                prop_assert!(path.starts_with("methodConfig") || path.starts_with("retryThrottling"), "{}", path);
                prop_assert!(!error.to_string().is_empty());
            }
        }
    }
}

/// The duration grammar `-?(0|[1-9][0-9]*)(\.[0-9]{1,9})?s` and the value in
/// nanoseconds (unbounded), or `None` when the text is outside the grammar.
fn regex_like(text: &str) -> Option<(bool, u128)> {
    let body = text.strip_suffix('s')?;
    let (negative, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (whole, fraction) = match body.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (body, None),
    };
    if whole.is_empty() || (whole.len() > 1 && whole.starts_with('0')) {
        return None;
    }
    let mut nanos: u128 = whole.parse::<u128>().ok()? * 1_000_000_000;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || fraction.len() > 9 {
            return None;
        }
        let padded = format!("{fraction:0<9}");
        nanos += padded.parse::<u128>().ok()?;
    }
    Some((negative, nanos))
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-zA-Z0-9._ -]{0,12}s?".prop_map(Value::from),
        code().prop_map(|c| Value::from(c.as_str())),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Replaces every occurrence of `field`, at any depth.
fn replace_field(value: &mut Value, field: &str, replacement: &Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == field {
                    *child = replacement.clone();
                } else {
                    replace_field(child, field, replacement);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                replace_field(item, field, replacement);
            }
        }
        _ => {}
    }
}
