//! The JSON examples of gRFC A6, verbatim, wrapped into full service configs.

use std::time::Duration;

use crate::classify::{Code, GrpcCodes};

use super::*;

const RETRY_POLICY: &str = r#"
"retryPolicy": {
  "maxAttempts": 4,
  "initialBackoff": "0.1s",
  "maxBackoff": "1s",
  "backoffMultiplier": 2,
  "retryableStatusCodes": [
    "UNAVAILABLE"
  ]
}
"#;

const HEDGING_POLICY: &str = r#"
"hedgingPolicy": {
  "maxAttempts": 4,
  "hedgingDelay": "0.5s",
  "nonFatalStatusCodes": [
    "UNAVAILABLE",
    "INTERNAL",
    "ABORTED"
  ]
}
"#;

const HEDGING_POLICY_AT_ONCE: &str = r#"
"hedgingPolicy": {
  "maxAttempts": 4,
  "hedgingDelay": "0s",
  "nonFatalStatusCodes": [
    "UNAVAILABLE",
    "INTERNAL",
    "ABORTED"
  ]
}
"#;

const RETRY_THROTTLING: &str = r#"
"retryThrottling": {
  "maxTokens": 10,
  "tokenRatio": 0.1
}
"#;

fn method_config(policy: &str) -> String {
    format!(r#"{{"methodConfig": [{{"name": [{{"service": "helloworld.Greeter"}}], {policy}}}]}}"#)
}

#[test]
fn retry_policy_example() {
    let config = parse(&method_config(RETRY_POLICY));
    let retry = config
        .lookup_path("/helloworld.Greeter/SayHello")
        .and_then(|m| m.retry_policy())
        .copied()
        .unwrap();
    // "a maximum of four RPC attempts (1 original RPC, and 3 retries)"
    assert_eq!(retry.max_attempts, 4);
    assert_eq!(retry.initial_backoff, Duration::from_millis(100));
    assert_eq!(retry.max_backoff, Duration::from_secs(1));
    assert_eq!(retry.backoff_multiplier, 2.0);
    // "only retrying RPCs when an UNAVAILABLE status code is received"
    assert_eq!(
        retry.retryable_status_codes,
        GrpcCodes::from([Code::Unavailable])
    );
}

#[test]
fn hedging_policy_example() {
    let config = parse(&method_config(HEDGING_POLICY));
    let hedging = hedging_of(&config);
    // "an original RPC, then up to three hedged requests ... at 500ms intervals"
    assert_eq!(hedging.max_attempts, 4);
    assert_eq!(hedging.hedging_delay, Duration::from_millis(500));
    assert_eq!(
        hedging.non_fatal_status_codes,
        GrpcCodes::from([Code::Unavailable, Code::Internal, Code::Aborted])
    );
}

#[test]
fn hedging_policy_all_at_once_example() {
    let config = parse(&method_config(HEDGING_POLICY_AT_ONCE));
    let hedging = hedging_of(&config);
    // "issues four RPCs simultaneously"
    assert_eq!(hedging.max_attempts, 4);
    assert_eq!(hedging.hedging_delay, Duration::ZERO);
    assert_eq!(hedging.non_fatal_status_codes.len(), 3);
}

#[test]
fn retry_throttling_example() {
    let config = parse(&format!("{{{RETRY_THROTTLING}}}"));
    let throttling = throttling_of(&config);
    assert_eq!(throttling.max_tokens, 10);
    assert_eq!(throttling.token_ratio_milli, 100);
    assert_eq!(throttling.token_ratio(), 0.1);
    assert!(config.method_configs().is_empty());
}

#[test]
fn all_examples_together() {
    // A retry policy for one method, hedging for the rest of its service, throttling.
    let json = format!(
        r#"{{
          "loadBalancingPolicy": "round_robin",
          "methodConfig": [
            {{ "name": [{{ "service": "helloworld.Greeter", "method": "SayHello" }}], {RETRY_POLICY} }},
            {{ "name": [{{ "service": "helloworld.Greeter" }}], {HEDGING_POLICY} }}
          ],
          {RETRY_THROTTLING}
        }}"#
    );
    let config = parse(&json);
    assert!(
        config
            .lookup_path("/helloworld.Greeter/SayHello")
            .unwrap()
            .retry_policy()
            .is_some()
    );
    assert!(
        config
            .lookup_path("/helloworld.Greeter/SayGoodbye")
            .unwrap()
            .hedging_policy()
            .is_some()
    );
    assert_eq!(throttling_of(&config).max_tokens, 10);
    assert_eq!(parse(&config.to_json()), config);
}

#[test]
fn the_schema_template_is_not_json() {
    // A6's "Integration with Service Config" block is a commented template
    // (`"maxAttempts": number`), not a config: it must be refused, not half-read.
    let template = r#"{
      "loadBalancingPolicy": string,
      "methodConfig": []
    }"#;
    let error = parse_err(template);
    assert_eq!(error.path(), "");
    assert!(error.to_string().contains("line 2"), "{error}");
}

#[test]
fn per_attempt_recv_timeout_is_written_back() {
    let json = r#"{"methodConfig": [{"name": [{"service": "s"}],
        "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": [],
            "perAttemptRecvTimeout": "0.25s"}}]}"#;
    let config = ServiceConfig::from_json(json).unwrap();
    let written = config.to_json();
    assert!(written.contains("perAttemptRecvTimeout"), "{written}");
    assert_eq!(ServiceConfig::from_json(&written).unwrap(), config);
}
