//! The validation table: valid configs with the model they give, invalid ones with the
//! path and rule of the error.
//!
//! Every rejection gRPC C-core makes is here, and so are the places where we
//! deliberately differ from it (integer and lower-case codes accepted, `2.0` accepted,
//! `maxTokens` 1001 rejected, both policies rejected).

use std::time::Duration;

use crate::classify::{Code, GrpcCodes};
use crate::config::{DurationError, Rule, ServiceConfig};

use super::*;

mod document;
mod hedging;
mod retry;

enum Expect {
    Valid(fn(&ServiceConfig)),
    Invalid(&'static str, Rule),
}

use Expect::{Invalid, Valid};

const RETRY: &str = "methodConfig[0].retryPolicy";

const MA: &str = "methodConfig[0].retryPolicy.maxAttempts";
const IB: &str = "methodConfig[0].retryPolicy.initialBackoff";
const MB: &str = "methodConfig[0].retryPolicy.maxBackoff";
const BM: &str = "methodConfig[0].retryPolicy.backoffMultiplier";
const RC: &str = "methodConfig[0].retryPolicy.retryableStatusCodes";
const PT: &str = "methodConfig[0].retryPolicy.perAttemptRecvTimeout";
const HP: &str = "methodConfig[0].hedgingPolicy";
const MT: &str = "retryThrottling.maxTokens";
const TR: &str = "retryThrottling.tokenRatio";

fn rp(path: &str) -> String {
    format!("{RETRY}.{path}")
}

/// Every row of the table, by concern.
fn cases() -> Vec<(&'static str, String, Expect)> {
    assert_eq!(rp("maxAttempts"), MA);
    let mut cases = retry::cases();
    cases.extend(hedging::cases());
    cases.extend(document::cases());
    cases
}

#[test]
fn validation_table() {
    let cases = cases();
    assert!(cases.len() >= 50, "only {} cases", cases.len());
    let (mut valid, mut invalid) = (0, 0);
    for (name, json, expect) in cases {
        println!("case: {name}");
        match expect {
            Valid(check) => {
                valid += 1;
                let config = parse(&json);
                check(&config);
                // Whatever parses writes back to JSON that parses to the same model.
                assert_eq!(parse(&config.to_json()), config, "{name}: round trip");
            }
            Invalid(path, rule) => {
                invalid += 1;
                let error = parse_err(&json);
                assert_eq!(error.path(), path, "{name}: {error}");
                assert_eq!(error.rule(), &rule, "{name}: {error}");
                let text = error.to_string();
                let prefix = if path.is_empty() {
                    "service config"
                } else {
                    path
                };
                assert!(text.starts_with(&format!("{prefix}: ")), "{name}: {text}");
                assert!(text.contains(&rule.to_string()), "{name}: {text}");
            }
        }
    }
    println!("{valid} valid, {invalid} invalid");
    assert!(valid >= 20 && invalid >= 40);
}

#[test]
fn messages_name_the_path_the_rule_and_the_value() {
    let cases = [
        (
            with_retry(&retry_policy(&[("maxAttempts", Some("1"))])),
            "methodConfig[0].retryPolicy.maxAttempts: must be an integer >= 2, got 1",
        ),
        (
            with_retry(&retry_policy(&[("initialBackoff", Some("\"1\""))])),
            "methodConfig[0].retryPolicy.initialBackoff: must be a proto3 JSON duration: \
             duration must end with 's', got \"1\"",
        ),
        (
            with_retry(&retry_policy(&[("maxBackoff", Some("\"-1s\""))])),
            "methodConfig[0].retryPolicy.maxBackoff: must be a duration > 0, got \"-1s\"",
        ),
        (
            with_retry(&retry_policy(&[("maxBackoff", None)])),
            "methodConfig[0].retryPolicy.maxBackoff: is required",
        ),
        (
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some("[\"nope\"]"),
            )])),
            "methodConfig[0].retryPolicy.retryableStatusCodes[0]: must be a gRPC status \
             code: an integer 0-16 or a case-insensitive name, got \"nope\"",
        ),
        (
            with_throttling(&throttling(&[("maxTokens", Some("1001"))])),
            "retryThrottling.maxTokens: must be an integer in (0, 1000], got 1001",
        ),
        (
            with_retry("[]"),
            "methodConfig[0].retryPolicy: must be an object, got an array",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s"}]}, {"name": [{"service": "s"}]}]}"#
                .to_owned(),
            "methodConfig[1].name[0]: repeats the name at methodConfig[0].name[0]",
        ),
        (
            "{\n  \"methodConfig\": [\n}".to_owned(),
            "service config: invalid JSON at line 3 column 1: expected value",
        ),
    ];
    for (json, message) in cases {
        assert_eq!(parse_err(&json).to_string(), message);
    }
}

#[test]
fn errors_are_std_errors_with_duration_sources() {
    let error = parse_err(&with_retry(&retry_policy(&[(
        "initialBackoff",
        Some("\"1m\""),
    )])));
    let source = std::error::Error::source(&error).expect("a source");
    assert_eq!(source.to_string(), DurationError::MissingSuffix.to_string());
    assert_eq!(error.value(), Some("\"1m\""));

    let error = parse_err(&with_retry(&retry_policy(&[("maxAttempts", Some("1"))])));
    assert!(std::error::Error::source(&error).is_none());
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(error);
    assert!(boxed.to_string().contains("maxAttempts"));
}

#[test]
fn from_str_and_deserialize_agree_with_from_json() {
    let json = with_retry(&retry_policy(&[]));
    let parsed: ServiceConfig = json.parse().unwrap();
    assert_eq!(parsed, parse(&json));

    let via_serde: ServiceConfig = serde_json::from_str(&json).unwrap();
    assert_eq!(via_serde, parsed);
    assert_eq!(parse(&parsed.to_json()), parsed);

    // Validation errors surface through serde too, with their path.
    let bad = with_retry(&retry_policy(&[("maxAttempts", Some("1"))]));
    let error = serde_json::from_str::<ServiceConfig>(&bad).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("methodConfig[0].retryPolicy.maxAttempts: must be an integer >= 2"),
        "{error}"
    );
}
