//! Keys gRPC does not define: listed with their path and a "did you mean", refused by a
//! strict parse, named when they stand where a required field is missing, and bounded
//! whatever the document. The warning they log is tested in `tests/tracing`, where the
//! subscriber is the process-wide default.

use std::time::Duration;

use crate::config::{IgnoredKey, Rule, ServiceConfig};

use super::*;

/// Each ignored key as `path (did you mean …?)`.
fn ignored(config: &ServiceConfig) -> Vec<String> {
    config.ignored().iter().map(IgnoredKey::to_string).collect()
}

/// A strict parse's error for a config that must be refused.
fn strict_err(json: &str) -> ConfigError {
    match ServiceConfig::from_json_strict(json) {
        Ok(config) => panic!("strict parse accepted {json}: {config:?}"),
        Err(error) => error,
    }
}

/// Typos at every depth the parser reads, in every object gRPC defines.
const TYPOS: &str = r#"{
  "retryThrotling": {"maxTokens": 10, "tokenRatio": 0.1},
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [
    {
      "name": [{"service": "pkg.Search", "methdo": "Query"}],
      "timeOut": "1s",
      "hedgingPolicy": {"maxAttempts": 3, "hedgeDelay": "0.5s",
                        "nonFatalStatusCodes": ["UNAVAILABLE"]}
    },
    {
      "name": [{"service": "pkg.Users"}],
      "retry_policy": {"maxAttempts": 3}
    },
    {
      "name": [{"service": "pkg.Orders"}],
      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
                      "retryableStatusCode": ["ABORTED"], "owner": "team-orders"}
    }
  ],
  "healthCheckConfig": {"service_name": "pkg.Health"},
  "connectionScaling": {"maxConnectionPerSubchannel": 4}
}"#;

#[test]
fn typos_are_listed_at_every_depth_with_suggestions() {
    let config = parse(TYPOS);
    assert_eq!(
        ignored(&config),
        [
            "retryThrotling (did you mean retryThrottling?)",
            "methodConfig[0].timeOut (did you mean timeout?)",
            "methodConfig[0].name[0].methdo (did you mean method?)",
            "methodConfig[0].hedgingPolicy.hedgeDelay (did you mean hedgingDelay?)",
            "methodConfig[1].retry_policy (did you mean retryPolicy?)",
            "methodConfig[2].retryPolicy.owner",
            "methodConfig[2].retryPolicy.retryableStatusCode (did you mean retryableStatusCodes?)",
            "healthCheckConfig.service_name (did you mean serviceName?)",
            "connectionScaling.maxConnectionPerSubchannel (did you mean maxConnectionsPerSubchannel?)",
        ]
    );
    assert_eq!(config.ignored_count(), 9);

    let hedge = &config.ignored()[3];
    assert_eq!(hedge.path(), "methodConfig[0].hedgingPolicy.hedgeDelay");
    assert_eq!(hedge.key(), "hedgeDelay");
    assert_eq!(hedge.suggestion(), Some("hedgingDelay"));
    assert_eq!(config.ignored()[5].suggestion(), None);

    // What each typo did, which the list explains: every hedge at once, no timeout, the
    // whole service instead of one method, no retries for pkg.Users, no throttle.
    let search = config
        .method_config("pkg.Search", "Other")
        .expect("pkg.Search");
    assert_eq!(
        search.hedging_policy().expect("hedging").hedging_delay,
        Duration::ZERO
    );
    assert_eq!(search.timeout, None);
    assert!(
        config
            .method_config("pkg.Users", "Get")
            .expect("pkg.Users")
            .policy
            .is_none()
    );
    assert!(config.retry_throttling().is_none());
}

#[test]
fn case_and_snake_case_spellings_are_near_misses() {
    // grpc-go's case-insensitive decoding would read these; this crate, grpc-java and C-core
    // do not, so they are reported, with the field they stand for.
    let config = parse(&with_method_config(
        r#""name": [{}], "WaitForReady": true, "max_request_message_bytes": 1024"#,
    ));
    assert_eq!(
        ignored(&config),
        [
            "methodConfig[0].WaitForReady (did you mean waitForReady?)",
            "methodConfig[0].max_request_message_bytes (did you mean maxRequestMessageBytes?)",
        ]
    );
}

#[test]
fn fields_grpc_defines_are_never_reported() {
    // Every field of gRPC's service config (and perAttemptRecvTimeout, which grpc-java and
    // C-core read), most of which this crate does not use; and a load balancer's own
    // configuration, whose keys are its own.
    let json = r#"{
      "loadBalancingPolicy": "round_robin",
      "loadBalancingConfig": [
        {"weighted_round_robin": {"enableOobLoadReport": false, "anythingAtAll": 1}},
        {"xds_cluster_impl_experimental": {"cluster": "c", "childPolicy": [{"x": {"y": 1}}]}},
        {"a_policy_this_client_does_not_know": {"z": true}}
      ],
      "methodConfig": [
        {"name": [{"service": "s", "method": "m"}],
         "waitForReady": true, "timeout": "1s",
         "maxRequestMessageBytes": 1024, "maxResponseMessageBytes": 2048,
         "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                         "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
                         "perAttemptRecvTimeout": "0.5s"}},
        {"name": [{"service": "h"}],
         "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0s", "nonFatalStatusCodes": []}}
      ],
      "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
      "healthCheckConfig": {"serviceName": "pkg.Health"},
      "connectionScaling": {"maxConnectionsPerSubchannel": 4}
    }"#;
    let config = parse(json);
    assert!(config.ignored().is_empty(), "{:?}", config.ignored());
    assert_eq!(config.ignored_count(), 0);
    assert_eq!(ServiceConfig::from_json_strict(json), Ok(config));

    // Fields this crate does not read are not typed either: only their keys are checked,
    // and only in an object.
    let config = parse(r#"{"healthCheckConfig": "odd", "connectionScaling": [1]}"#);
    assert!(config.ignored().is_empty());
}

#[test]
fn a_strict_parse_refuses_unknown_keys_with_their_path() {
    let cases = [
        (
            r#"{"retryThrotling": {}}"#.to_owned(),
            "retryThrotling",
            Some("retryThrottling"),
        ),
        (
            with_hedging(&hedging_policy(&[("hedgeDelay", Some("\"0.5s\""))])),
            "methodConfig[0].hedgingPolicy.hedgeDelay",
            Some("hedgingDelay"),
        ),
        (
            with_retry(&retry_policy(&[("owner", Some("\"me\""))])),
            "methodConfig[0].retryPolicy.owner",
            None,
        ),
        (
            with_method_config(r#""name": [{"service": "s", "methdo": "m"}]"#),
            "methodConfig[0].name[0].methdo",
            Some("method"),
        ),
        (
            with_throttling(&throttling(&[("tokenRatios", Some("1"))])),
            "retryThrottling.tokenRatios",
            Some("tokenRatio"),
        ),
        (
            r#"{"healthCheckConfig": {"service": "x"}}"#.to_owned(),
            "healthCheckConfig.service",
            None,
        ),
        (
            r#"{"methodConfig": [{"name": [{}], "odd key": 1}]}"#.to_owned(),
            r#"methodConfig[0]["odd key"]"#,
            None,
        ),
    ];
    for (json, path, suggestion) in cases {
        // A plain parse takes each of them.
        let config = parse(&json);
        assert_eq!(config.ignored()[0].path(), path, "{json}");
        let error = strict_err(&json);
        assert_eq!(error.path(), path, "{json}");
        assert_eq!(error.rule(), &Rule::UnknownField { suggestion }, "{json}");
        assert_eq!(error.value(), None);
    }

    let error = strict_err(&with_hedging(&hedging_policy(&[(
        "hedgeDelay",
        Some("\"0.5s\""),
    )])));
    assert_eq!(
        error.to_string(),
        "methodConfig[0].hedgingPolicy.hedgeDelay: is not a field of gRPC's service config \
         (did you mean hedgingDelay?)"
    );
    let error = strict_err(&with_retry(&retry_policy(&[("owner", Some("1"))])));
    assert_eq!(
        error.to_string(),
        "methodConfig[0].retryPolicy.owner: is not a field of gRPC's service config"
    );

    // The unknown keys of an object come before its other errors; earlier objects' errors
    // come first.
    let json = with_retry(&retry_policy(&[
        ("maxAttempts", Some("1")),
        ("x", Some("1")),
    ]));
    assert_eq!(strict_err(&json).path(), "methodConfig[0].retryPolicy.x");
    assert_eq!(parse_err(&json).rule(), &Rule::MaxAttempts);
    let json = r#"{"methodConfig": [{"name": [{}], "timeout": "1"}], "retryThrottling": {"x": 1}}"#;
    assert_eq!(strict_err(json).path(), "methodConfig[0].timeout");

    // From a `Value` too.
    let value: serde_json::Value = serde_json::from_str(r#"{"future": {}}"#).unwrap();
    assert_eq!(
        ServiceConfig::from_value_strict(&value).unwrap_err().rule(),
        &Rule::UnknownField { suggestion: None }
    );
    assert_eq!(
        ServiceConfig::from_value(&value).unwrap().ignored()[0].path(),
        "future"
    );
}

#[test]
fn a_missing_required_field_names_its_near_miss() {
    let error = parse_err(&with_retry(&retry_policy(&[
        ("maxAttempts", None),
        ("maxAttempt", Some("3")),
    ])));
    assert_eq!(error.path(), "methodConfig[0].retryPolicy.maxAttempts");
    assert_eq!(error.rule(), &Rule::Missing);
    assert_eq!(error.near_miss(), Some("maxAttempt"));
    assert_eq!(
        error.to_string(),
        "methodConfig[0].retryPolicy.maxAttempts: is required \
         (found \"maxAttempt\": did you mean maxAttempts?)"
    );

    let cases = [
        (
            with_retry(&retry_policy(&[
                ("initialBackoff", None),
                ("InitialBackoff", Some("\"0.1s\"")),
            ])),
            "methodConfig[0].retryPolicy.initialBackoff",
            "InitialBackoff",
        ),
        (
            with_retry(&retry_policy(&[
                ("retryableStatusCodes", None),
                ("retryable_status_codes", Some("[14]")),
            ])),
            "methodConfig[0].retryPolicy.retryableStatusCodes",
            "retryable_status_codes",
        ),
        (
            with_hedging(&hedging_policy(&[
                ("maxAttempts", None),
                ("maxAtempts", Some("3")),
            ])),
            "methodConfig[0].hedgingPolicy.maxAttempts",
            "maxAtempts",
        ),
        (
            with_throttling(&throttling(&[
                ("maxTokens", None),
                ("max_tokens", Some("10")),
            ])),
            "retryThrottling.maxTokens",
            "max_tokens",
        ),
    ];
    for (json, path, found) in cases {
        let error = parse_err(&json);
        assert_eq!(error.path(), path, "{json}");
        assert_eq!(error.rule(), &Rule::Missing, "{json}");
        assert_eq!(error.near_miss(), Some(found), "{json}");
        let field = path.rsplit('.').next().unwrap();
        assert!(
            error
                .to_string()
                .ends_with(&format!("(found {found:?}: did you mean {field}?)")),
            "{error}"
        );
    }

    // A key that is a near miss of another field is not this one's; no near miss, no hint.
    let error = parse_err(&with_retry(&retry_policy(&[
        ("maxAttempts", None),
        ("maxBackof", Some("\"1s\"")),
    ])));
    assert_eq!(error.near_miss(), None);
    assert_eq!(
        error.to_string(),
        "methodConfig[0].retryPolicy.maxAttempts: is required"
    );
    let error = parse_err(&with_retry(&retry_policy(&[("backoffMultiplier", None)])));
    assert_eq!(error.near_miss(), None);

    // A strict parse reports the near miss itself first, with the same suggestion.
    let error = strict_err(&with_retry(&retry_policy(&[
        ("maxAttempts", None),
        ("maxAttempt", Some("3")),
    ])));
    assert_eq!(error.path(), "methodConfig[0].retryPolicy.maxAttempt");
    assert_eq!(
        error.rule(),
        &Rule::UnknownField {
            suggestion: Some("maxAttempts")
        }
    );
}

#[test]
fn ignored_keys_do_not_change_the_config() {
    let clean = parse(&with_hedging(&hedging_policy(&[])));
    let noisy = parse(&with_hedging(&hedging_policy(&[("note", Some("\"x\""))])));
    assert_eq!(noisy.ignored().len(), 1);
    assert_eq!(noisy, clean);
    // Written back, the keys are gone, and so is their report.
    let again = parse(&noisy.to_json());
    assert_eq!(again, noisy);
    assert!(again.ignored().is_empty());
    // serde, as a field of a larger document, reports them too.
    let embedded: serde_json::Value = serde_json::json!({"grpc": {"future": 1}});
    let config: ServiceConfig = serde_json::from_value(embedded["grpc"].clone()).unwrap();
    assert_eq!(config.ignored()[0].path(), "future");
}

/// `count` unknown keys, spread over every depth, and a few very long ones.
fn hostile(count: usize) -> String {
    let keys = |prefix: &str, n: usize| -> String {
        (0..n)
            .map(|i| format!(r#""{prefix}{i}": {i}"#))
            .collect::<Vec<_>>()
            .join(",")
    };
    let per = count / 5;
    let long = "k".repeat(100_000);
    format!(
        r#"{{ {root}, "{long}": 1,
             "methodConfig": [{{ {method}, "name": [{{ {name} }}],
               "retryPolicy": {{ {retry}, "{long}x": 2, "maxAttempts": 2,
                 "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                 "retryableStatusCodes": [14] }} }}],
             "retryThrottling": {{ {throttle}, "maxTokens": 1, "tokenRatio": 1 }} }}"#,
        root = keys("root", per),
        method = keys("method", per),
        name = keys("name", per),
        retry = keys("retry", per),
        throttle = keys("throttle", per),
    )
}

#[test]
fn a_hostile_config_gives_bounded_output() {
    let json = hostile(20_000);
    let config = parse(&json);
    assert_eq!(config.ignored_count(), 20_002);
    assert_eq!(config.ignored().len(), MAX_IGNORED_KEYS);
    for key in config.ignored() {
        assert!(key.key().chars().count() <= MAX_KEY_CHARS + 1, "{key:?}");
        assert!(key.path().chars().count() <= 200, "{key:?}");
        assert!(key.to_string().chars().count() <= 250, "{key:?}");
    }
    // The 100 000-character key sorts first at the top level: cut, quoted, no suggestion.
    let long = &config.ignored()[0];
    assert_eq!(long.key(), format!("{}\u{2026}", "k".repeat(MAX_KEY_CHARS)));
    assert_eq!(long.path(), format!("[{:?}]", long.key()));
    assert_eq!(long.suggestion(), None);

    // A strict parse stops at the first.
    let error = strict_err(&json);
    assert!(
        error.path().chars().count() <= MAX_KEY_CHARS + 10,
        "{error}"
    );

    // A missing field among tens of thousands of keys: one near miss named, a short error.
    let many: Vec<String> = (0..40_000)
        .map(|i| format!(r#""maxAttempt{i}": 1"#))
        .collect();
    let json = with_retry(&format!("{{{}}}", many.join(",")));
    let error = parse_err(&json);
    assert_eq!(error.rule(), &Rule::Missing);
    assert_eq!(error.near_miss(), Some("maxAttempt0"));
    assert!(error.to_string().len() < 200, "{error}");
}
