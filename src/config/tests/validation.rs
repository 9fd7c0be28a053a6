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

enum Expect {
    Valid(fn(&ServiceConfig)),
    Invalid(&'static str, Rule),
}

use Expect::{Invalid, Valid};

const RETRY: &str = "methodConfig[0].retryPolicy";

fn rp(path: &str) -> String {
    format!("{RETRY}.{path}")
}

fn cases() -> Vec<(&'static str, String, Expect)> {
    let ma = "methodConfig[0].retryPolicy.maxAttempts";
    let ib = "methodConfig[0].retryPolicy.initialBackoff";
    let mb = "methodConfig[0].retryPolicy.maxBackoff";
    let bm = "methodConfig[0].retryPolicy.backoffMultiplier";
    let rc = "methodConfig[0].retryPolicy.retryableStatusCodes";
    let hp = "methodConfig[0].hedgingPolicy";
    let mt = "retryThrottling.maxTokens";
    let tr = "retryThrottling.tokenRatio";
    assert_eq!(rp("maxAttempts"), ma);

    vec![
        // ---- retryPolicy: valid ----
        (
            "retry policy, all fields",
            with_retry(&retry_policy(&[])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(r.max_attempts(), 3);
                assert_eq!(r.initial_backoff(), Duration::from_millis(100));
                assert_eq!(r.max_backoff(), Duration::from_secs(1));
                assert_eq!(r.backoff_multiplier(), 2.0);
                assert_eq!(
                    r.retryable_status_codes(),
                    GrpcCodes::from([Code::Unavailable])
                );
            }),
        ),
        (
            "maxAttempts 2, the least",
            with_retry(&retry_policy(&[("maxAttempts", Some("2"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts(), 2)),
        ),
        (
            "maxAttempts above the client cap is kept, not clamped",
            with_retry(&retry_policy(&[("maxAttempts", Some("6"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts(), 6)),
        ),
        (
            "maxAttempts beyond u32 saturates",
            with_retry(&retry_policy(&[("maxAttempts", Some("4294967296"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts(), u32::MAX)),
        ),
        (
            "maxAttempts beyond u64 saturates",
            with_retry(&retry_policy(&[("maxAttempts", Some("1e30"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts(), u32::MAX)),
        ),
        (
            "maxAttempts 2.0 (integral float) accepted, as grpc-java does",
            with_retry(&retry_policy(&[("maxAttempts", Some("2.0"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts(), 2)),
        ),
        (
            "integer status code accepted (C-core: rejected)",
            with_retry(&retry_policy(&[("retryableStatusCodes", Some("[14, 8]"))])),
            Valid(|c| {
                assert_eq!(
                    retry_of(c).retryable_status_codes(),
                    GrpcCodes::from([Code::Unavailable, Code::ResourceExhausted])
                )
            }),
        ),
        (
            "lower- and mixed-case names accepted (C-core: rejected)",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some(r#"["unavailable", "Deadline_Exceeded"]"#),
            )])),
            Valid(|c| {
                assert_eq!(
                    retry_of(c).retryable_status_codes(),
                    GrpcCodes::from([Code::Unavailable, Code::DeadlineExceeded])
                )
            }),
        ),
        (
            "repeated codes collapse",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some(r#"[14, "UNAVAILABLE", "unavailable", 14.0]"#),
            )])),
            Valid(|c| assert_eq!(retry_of(c).retryable_status_codes().len(), 1)),
        ),
        (
            "all 17 codes, OK included",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some("[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]"),
            )])),
            Valid(|c| assert_eq!(retry_of(c).retryable_status_codes().len(), 17)),
        ),
        (
            "maxBackoff below initialBackoff accepted",
            with_retry(&retry_policy(&[
                ("initialBackoff", Some("\"2s\"")),
                ("maxBackoff", Some("\"1s\"")),
            ])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(r.initial_backoff(), Duration::from_secs(2));
                assert_eq!(r.max_backoff(), Duration::from_secs(1));
            }),
        ),
        (
            "multiplier below 1 and a float",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("0.5"))])),
            Valid(|c| assert_eq!(retry_of(c).backoff_multiplier(), 0.5)),
        ),
        (
            "nanosecond backoffs",
            with_retry(&retry_policy(&[
                ("initialBackoff", Some("\"0.000000001s\"")),
                ("maxBackoff", Some("\"1.000000001s\"")),
            ])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(r.initial_backoff(), Duration::from_nanos(1));
                assert_eq!(r.max_backoff(), Duration::new(1, 1));
            }),
        ),
        (
            "unknown fields inside the policy ignored",
            with_retry(&retry_policy(&[("perAttemptRecvTimeout", Some("\"1s\""))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts(), 3)),
        ),
        // ---- retryPolicy: invalid, as C-core ----
        (
            "maxAttempts 1",
            with_retry(&retry_policy(&[("maxAttempts", Some("1"))])),
            Invalid(ma, Rule::MaxAttempts),
        ),
        (
            "maxAttempts 0",
            with_retry(&retry_policy(&[("maxAttempts", Some("0"))])),
            Invalid(ma, Rule::MaxAttempts),
        ),
        (
            "maxAttempts missing",
            with_retry(&retry_policy(&[("maxAttempts", None)])),
            Invalid(ma, Rule::Missing),
        ),
        (
            "maxAttempts null is missing",
            with_retry(&retry_policy(&[("maxAttempts", Some("null"))])),
            Invalid(ma, Rule::Missing),
        ),
        (
            "maxAttempts 2.5",
            with_retry(&retry_policy(&[("maxAttempts", Some("2.5"))])),
            Invalid(ma, Rule::MaxAttempts),
        ),
        (
            "maxAttempts -1",
            with_retry(&retry_policy(&[("maxAttempts", Some("-1"))])),
            Invalid(ma, Rule::MaxAttempts),
        ),
        (
            "maxAttempts as a string",
            with_retry(&retry_policy(&[("maxAttempts", Some("\"3\""))])),
            Invalid(ma, Rule::MaxAttempts),
        ),
        (
            "initialBackoff missing",
            with_retry(&retry_policy(&[("initialBackoff", None)])),
            Invalid(ib, Rule::Missing),
        ),
        (
            "maxBackoff missing",
            with_retry(&retry_policy(&[("maxBackoff", None)])),
            Invalid(mb, Rule::Missing),
        ),
        (
            "initialBackoff \"1\" (no unit)",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"1\""))])),
            Invalid(ib, Rule::Duration(DurationError::MissingSuffix)),
        ),
        (
            "initialBackoff \"1sec\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"1sec\""))])),
            Invalid(ib, Rule::Duration(DurationError::MissingSuffix)),
        ),
        (
            "initialBackoff \"1ms\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"1ms\""))])),
            Invalid(ib, Rule::Duration(DurationError::Malformed)),
        ),
        (
            "initialBackoff \"-1s\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"-1s\""))])),
            Invalid(ib, Rule::NotPositive),
        ),
        (
            "initialBackoff \"0s\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"0s\""))])),
            Invalid(ib, Rule::NotPositive),
        ),
        (
            "maxBackoff \"0.000s\"",
            with_retry(&retry_policy(&[("maxBackoff", Some("\"0.000s\""))])),
            Invalid(mb, Rule::NotPositive),
        ),
        (
            "initialBackoff a number",
            with_retry(&retry_policy(&[("initialBackoff", Some("0.1"))])),
            Invalid(
                ib,
                Rule::WrongType {
                    expected: "a duration string such as \"0.1s\"",
                },
            ),
        ),
        (
            "initialBackoff with 10 fractional digits",
            with_retry(&retry_policy(&[(
                "initialBackoff",
                Some("\"1.0000000001s\""),
            )])),
            Invalid(ib, Rule::Duration(DurationError::TooManyFractionDigits)),
        ),
        (
            "backoffMultiplier 0",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("0"))])),
            Invalid(bm, Rule::BackoffMultiplier),
        ),
        (
            "backoffMultiplier -2",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("-2"))])),
            Invalid(bm, Rule::BackoffMultiplier),
        ),
        (
            "backoffMultiplier missing",
            with_retry(&retry_policy(&[("backoffMultiplier", None)])),
            Invalid(bm, Rule::Missing),
        ),
        (
            "backoffMultiplier as a string",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("\"2\""))])),
            Invalid(bm, Rule::BackoffMultiplier),
        ),
        (
            "retryableStatusCodes empty",
            with_retry(&retry_policy(&[("retryableStatusCodes", Some("[]"))])),
            Invalid(rc, Rule::EmptyStatusCodes),
        ),
        (
            "retryableStatusCodes missing",
            with_retry(&retry_policy(&[("retryableStatusCodes", None)])),
            Invalid(rc, Rule::Missing),
        ),
        (
            "unknown code name",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some(r#"["UNAVAILABLE", "FOO"]"#),
            )])),
            Invalid(
                "methodConfig[0].retryPolicy.retryableStatusCodes[1]",
                Rule::UnknownStatusCode,
            ),
        ),
        (
            "code 17",
            with_retry(&retry_policy(&[("retryableStatusCodes", Some("[17]"))])),
            Invalid(
                "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
                Rule::UnknownStatusCode,
            ),
        ),
        (
            "code -1",
            with_retry(&retry_policy(&[("retryableStatusCodes", Some("[-1]"))])),
            Invalid(
                "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
                Rule::UnknownStatusCode,
            ),
        ),
        (
            "code 14.5",
            with_retry(&retry_policy(&[("retryableStatusCodes", Some("[14.5]"))])),
            Invalid(
                "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
                Rule::UnknownStatusCode,
            ),
        ),
        (
            "code number as a string",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some(r#"["14"]"#),
            )])),
            Invalid(
                "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
                Rule::UnknownStatusCode,
            ),
        ),
        (
            "code name with a space",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some(r#"[" UNAVAILABLE"]"#),
            )])),
            Invalid(
                "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
                Rule::UnknownStatusCode,
            ),
        ),
        (
            "codes not an array",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some("\"UNAVAILABLE\""),
            )])),
            Invalid(
                rc,
                Rule::WrongType {
                    expected: "an array of status codes",
                },
            ),
        ),
        (
            "retryPolicy not an object",
            with_retry("5"),
            Invalid(
                "methodConfig[0].retryPolicy",
                Rule::WrongType {
                    expected: "an object",
                },
            ),
        ),
        (
            "the first violation in document order is reported",
            with_retry(&retry_policy(&[
                ("maxAttempts", Some("1")),
                ("backoffMultiplier", Some("0")),
            ])),
            Invalid(ma, Rule::MaxAttempts),
        ),
        // ---- hedgingPolicy ----
        (
            "hedging policy, all fields",
            with_hedging(&hedging_policy(&[(
                "nonFatalStatusCodes",
                Some(r#"["UNAVAILABLE", 13, "aborted"]"#),
            )])),
            Valid(|c| {
                let h = hedging_of(c);
                assert_eq!(h.max_attempts(), 3);
                assert_eq!(h.hedging_delay(), Duration::from_millis(100));
                assert_eq!(
                    h.non_fatal_status_codes(),
                    GrpcCodes::from([Code::Unavailable, Code::Internal, Code::Aborted])
                );
                assert!(c.method_configs()[0].retry_policy().is_none());
            }),
        ),
        (
            "hedgingDelay absent is 0, codes absent are none",
            with_hedging(&hedging_policy(&[
                ("hedgingDelay", None),
                ("nonFatalStatusCodes", None),
            ])),
            Valid(|c| {
                let h = hedging_of(c);
                assert_eq!(h.hedging_delay(), Duration::ZERO);
                assert!(h.non_fatal_status_codes().is_empty());
            }),
        ),
        (
            "hedgingDelay \"0s\" and empty codes",
            with_hedging(&hedging_policy(&[
                ("hedgingDelay", Some("\"0s\"")),
                ("nonFatalStatusCodes", Some("[]")),
            ])),
            Valid(|c| {
                let h = hedging_of(c);
                assert_eq!(h.hedging_delay(), Duration::ZERO);
                assert!(h.non_fatal_status_codes().is_empty());
            }),
        ),
        (
            "hedging maxAttempts 1",
            with_hedging(&hedging_policy(&[("maxAttempts", Some("1"))])),
            Invalid(
                "methodConfig[0].hedgingPolicy.maxAttempts",
                Rule::MaxAttempts,
            ),
        ),
        (
            "hedging maxAttempts missing",
            with_hedging(&hedging_policy(&[("maxAttempts", None)])),
            Invalid("methodConfig[0].hedgingPolicy.maxAttempts", Rule::Missing),
        ),
        (
            "hedgingDelay negative",
            with_hedging(&hedging_policy(&[("hedgingDelay", Some("\"-0.5s\""))])),
            Invalid("methodConfig[0].hedgingPolicy.hedgingDelay", Rule::Negative),
        ),
        (
            "hedgingDelay without unit",
            with_hedging(&hedging_policy(&[("hedgingDelay", Some("\"5\""))])),
            Invalid(
                "methodConfig[0].hedgingPolicy.hedgingDelay",
                Rule::Duration(DurationError::MissingSuffix),
            ),
        ),
        (
            "nonFatalStatusCodes unknown",
            with_hedging(&hedging_policy(&[(
                "nonFatalStatusCodes",
                Some(r#"["UNAVAILABLE", "BOGUS"]"#),
            )])),
            Invalid(
                "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[1]",
                Rule::UnknownStatusCode,
            ),
        ),
        (
            "both policies (grpc-go, C-core: one ignored)",
            with_method_config(&format!(
                r#""name": [{{"service": "s"}}], "retryPolicy": {}, "hedgingPolicy": {}"#,
                retry_policy(&[]),
                hedging_policy(&[])
            )),
            Invalid("methodConfig[0]", Rule::BothPolicies),
        ),
        (
            "both policies, one null: only the other",
            with_method_config(&format!(
                r#""name": [{{"service": "s"}}], "retryPolicy": null, "hedgingPolicy": {}"#,
                hedging_policy(&[])
            )),
            Valid(|c| assert_eq!(hedging_of(c).max_attempts(), 3)),
        ),
        (
            "both policies reported before an invalid one",
            with_method_config(&format!(
                r#""retryPolicy": {}, "hedgingPolicy": {}"#,
                retry_policy(&[("maxAttempts", Some("1"))]),
                hedging_policy(&[])
            )),
            Invalid("methodConfig[0]", Rule::BothPolicies),
        ),
        (
            "hedgingPolicy not an object",
            with_hedging("[]"),
            Invalid(
                hp,
                Rule::WrongType {
                    expected: "an object",
                },
            ),
        ),
        // ---- retryThrottling ----
        (
            "throttling 10 / 0.1",
            with_throttling(&throttling(&[])),
            Valid(|c| {
                let t = throttling_of(c);
                assert_eq!(t.max_tokens(), 10);
                assert_eq!(t.token_ratio_milli(), 100);
                assert_eq!(t.token_ratio(), 0.1);
            }),
        ),
        (
            "tokenRatio digits past the third decimal dropped",
            with_throttling(&throttling(&[("tokenRatio", Some("0.5466"))])),
            Valid(|c| assert_eq!(throttling_of(c).token_ratio_milli(), 546)),
        ),
        (
            "tokenRatio 0.001, the least",
            with_throttling(&throttling(&[("tokenRatio", Some("0.001"))])),
            Valid(|c| assert_eq!(throttling_of(c).token_ratio_milli(), 1)),
        ),
        (
            "tokenRatio above 1",
            with_throttling(&throttling(&[("tokenRatio", Some("5"))])),
            Valid(|c| assert_eq!(throttling_of(c).token_ratio_milli(), 5000)),
        ),
        (
            "maxTokens 1000, the most",
            with_throttling(&throttling(&[("maxTokens", Some("1000"))])),
            Valid(|c| assert_eq!(throttling_of(c).max_tokens(), 1000)),
        ),
        (
            "maxTokens 1, the least; 10.0 style accepted",
            with_throttling(&throttling(&[("maxTokens", Some("1.0"))])),
            Valid(|c| assert_eq!(throttling_of(c).max_tokens(), 1)),
        ),
        (
            "maxTokens 0",
            with_throttling(&throttling(&[("maxTokens", Some("0"))])),
            Invalid(mt, Rule::MaxTokens),
        ),
        (
            "maxTokens 10.5",
            with_throttling(&throttling(&[("maxTokens", Some("10.5"))])),
            Invalid(mt, Rule::MaxTokens),
        ),
        (
            "maxTokens missing",
            with_throttling(&throttling(&[("maxTokens", None)])),
            Invalid(mt, Rule::Missing),
        ),
        (
            "maxTokens 1001 (grpc-java, C-core: accepted)",
            with_throttling(&throttling(&[("maxTokens", Some("1001"))])),
            Invalid(mt, Rule::MaxTokens),
        ),
        (
            "maxTokens -1",
            with_throttling(&throttling(&[("maxTokens", Some("-1"))])),
            Invalid(mt, Rule::MaxTokens),
        ),
        (
            "tokenRatio 0",
            with_throttling(&throttling(&[("tokenRatio", Some("0"))])),
            Invalid(tr, Rule::TokenRatio),
        ),
        (
            "tokenRatio 0.0001 is 0 after truncation",
            with_throttling(&throttling(&[("tokenRatio", Some("0.0001"))])),
            Invalid(tr, Rule::TokenRatio),
        ),
        (
            "tokenRatio 0.0009 is 0 after truncation",
            with_throttling(&throttling(&[("tokenRatio", Some("0.0009"))])),
            Invalid(tr, Rule::TokenRatio),
        ),
        (
            "tokenRatio missing",
            with_throttling(&throttling(&[("tokenRatio", None)])),
            Invalid(tr, Rule::Missing),
        ),
        (
            "tokenRatio negative",
            with_throttling(&throttling(&[("tokenRatio", Some("-0.1"))])),
            Invalid(tr, Rule::TokenRatio),
        ),
        (
            "tokenRatio as a string",
            with_throttling(&throttling(&[("tokenRatio", Some("\"0.1\""))])),
            Invalid(tr, Rule::TokenRatio),
        ),
        (
            "retryThrottling not an object",
            with_throttling("10"),
            Invalid(
                "retryThrottling",
                Rule::WrongType {
                    expected: "an object",
                },
            ),
        ),
        // ---- names ----
        (
            "service and method",
            with_method_config(r#""name": [{"service": "pkg.S", "method": "M"}]"#),
            Valid(|c| {
                let name = &c.method_configs()[0].names()[0];
                assert_eq!(name.service(), "pkg.S");
                assert_eq!(name.method(), Some("M"));
                assert!(!name.is_default());
            }),
        ),
        (
            "empty method is the whole service",
            with_method_config(r#""name": [{"service": "pkg.S", "method": ""}]"#),
            Valid(|c| assert_eq!(c.method_configs()[0].names()[0].method(), None)),
        ),
        (
            "empty service is the default",
            with_method_config(r#""name": [{"service": "", "method": null}]"#),
            Valid(|c| {
                assert!(c.method_configs()[0].names()[0].is_default());
                assert!(c.default_method_config().is_some());
            }),
        ),
        (
            "a method config without names matches nothing",
            with_method_config(r#""timeout": "1s""#),
            Valid(|c| {
                assert!(c.method_configs()[0].names().is_empty());
                assert!(c.lookup_path("/a.B/C").is_none());
            }),
        ),
        (
            "a method without a service",
            with_method_config(r#""name": [{"method": "M"}]"#),
            Invalid("methodConfig[0].name[0]", Rule::MethodWithoutService),
        ),
        (
            "a method with an empty service",
            with_method_config(r#""name": [{"service": "", "method": "M"}]"#),
            Invalid("methodConfig[0].name[0]", Rule::MethodWithoutService),
        ),
        (
            "the same method twice in one config",
            with_method_config(
                r#""name": [{"service": "s", "method": "m"}, {"service": "s", "method": "m"}]"#,
            ),
            Invalid(
                "methodConfig[0].name[1]",
                Rule::DuplicateName {
                    first: "methodConfig[0].name[0]".into(),
                },
            ),
        ),
        (
            "the same service twice across configs",
            r#"{"methodConfig": [{"name": [{"service": "a"}, {"service": "s"}]},
                                {"name": [{"service": "s", "method": ""}]}]}"#
                .into(),
            Invalid(
                "methodConfig[1].name[0]",
                Rule::DuplicateName {
                    first: "methodConfig[0].name[1]".into(),
                },
            ),
        ),
        (
            "two defaults",
            r#"{"methodConfig": [{"name": [{}]}, {"name": [{"service": ""}]}]}"#.into(),
            Invalid(
                "methodConfig[1].name[0]",
                Rule::DuplicateDefault {
                    first: "methodConfig[0].name[0]".into(),
                },
            ),
        ),
        (
            "service names are case-sensitive: no duplicate",
            r#"{"methodConfig": [{"name": [{"service": "s"}, {"service": "S"}]}]}"#.into(),
            Valid(|c| assert_eq!(c.method_configs()[0].names().len(), 2)),
        ),
        (
            "name not an array",
            with_method_config(r#""name": {"service": "s"}"#),
            Invalid(
                "methodConfig[0].name",
                Rule::WrongType {
                    expected: "an array of names",
                },
            ),
        ),
        (
            "name entry not an object",
            with_method_config(r#""name": ["s"]"#),
            Invalid(
                "methodConfig[0].name[0]",
                Rule::WrongType {
                    expected: "an object",
                },
            ),
        ),
        (
            "service not a string",
            with_method_config(r#""name": [{"service": 1}]"#),
            Invalid(
                "methodConfig[0].name[0].service",
                Rule::WrongType {
                    expected: "a string",
                },
            ),
        ),
        // ---- the other method-config fields ----
        (
            "timeout, waitForReady, message sizes kept",
            with_method_config(
                r#""name": [{}], "timeout": "30.5s", "waitForReady": false,
                   "maxRequestMessageBytes": 1024, "maxResponseMessageBytes": 4194304"#,
            ),
            Valid(|c| {
                let m = &c.method_configs()[0];
                assert_eq!(m.timeout(), Some(Duration::from_millis(30_500)));
                assert_eq!(m.wait_for_ready(), Some(false));
                assert_eq!(m.max_request_message_bytes(), Some(1024));
                assert_eq!(m.max_response_message_bytes(), Some(4_194_304));
                assert!(m.policy().is_none());
            }),
        ),
        (
            "timeout 0 is valid and kept",
            with_method_config(r#""name": [{}], "timeout": "0s""#),
            Valid(|c| assert_eq!(c.method_configs()[0].timeout(), Some(Duration::ZERO))),
        ),
        (
            "absent fields are None",
            with_method_config(r#""name": [{}]"#),
            Valid(|c| {
                let m = &c.method_configs()[0];
                assert_eq!(m.timeout(), None);
                assert_eq!(m.wait_for_ready(), None);
                assert_eq!(m.max_request_message_bytes(), None);
                assert_eq!(m.max_response_message_bytes(), None);
            }),
        ),
        (
            "timeout negative",
            with_method_config(r#""timeout": "-1s""#),
            Invalid("methodConfig[0].timeout", Rule::Negative),
        ),
        (
            "timeout \".5s\"",
            with_method_config(r#""timeout": ".5s""#),
            Invalid(
                "methodConfig[0].timeout",
                Rule::Duration(DurationError::Malformed),
            ),
        ),
        (
            "timeout a number",
            with_method_config(r#""timeout": 1"#),
            Invalid(
                "methodConfig[0].timeout",
                Rule::WrongType {
                    expected: "a duration string such as \"0.1s\"",
                },
            ),
        ),
        (
            "waitForReady a string",
            with_method_config(r#""waitForReady": "true""#),
            Invalid(
                "methodConfig[0].waitForReady",
                Rule::WrongType {
                    expected: "a boolean",
                },
            ),
        ),
        (
            "maxRequestMessageBytes negative",
            with_method_config(r#""maxRequestMessageBytes": -1"#),
            Invalid("methodConfig[0].maxRequestMessageBytes", Rule::MessageBytes),
        ),
        (
            "maxResponseMessageBytes fractional",
            with_method_config(r#""maxResponseMessageBytes": 1.5"#),
            Invalid(
                "methodConfig[0].maxResponseMessageBytes",
                Rule::MessageBytes,
            ),
        ),
        // ---- the document ----
        (
            "empty object",
            "{}".into(),
            Valid(|c| {
                assert!(c.method_configs().is_empty());
                assert!(c.retry_throttling().is_none());
            }),
        ),
        (
            "load balancing and unknown fields ignored everywhere",
            r#"{"loadBalancingPolicy": "round_robin",
                "loadBalancingConfig": [{"round_robin": {}}],
                "healthCheckConfig": {"serviceName": "x"},
                "somethingNew": [1, {"deep": [null]}],
                "methodConfig": [{"name": [{"service": "s", "extra": 1}], "future": true}]}"#
                .into(),
            Valid(|c| assert_eq!(c.method_configs().len(), 1)),
        ),
        (
            "null top-level fields are absent",
            r#"{"methodConfig": null, "retryThrottling": null}"#.into(),
            Valid(|c| assert_eq!(c, &ServiceConfig::default())),
        ),
        (
            "invalid JSON: unclosed object",
            "{".into(),
            Invalid(
                "",
                Rule::Json {
                    line: 1,
                    column: 1,
                    message: "EOF while parsing an object".into(),
                },
            ),
        ),
        (
            "invalid JSON: trailing comma",
            "{\"methodConfig\": [],\n}".into(),
            Invalid(
                "",
                Rule::Json {
                    line: 2,
                    column: 1,
                    message: "trailing comma".into(),
                },
            ),
        ),
        (
            "invalid JSON: empty document",
            "".into(),
            Invalid(
                "",
                Rule::Json {
                    line: 1,
                    column: 0,
                    message: "EOF while parsing a value".into(),
                },
            ),
        ),
        (
            "top level not an object",
            "[]".into(),
            Invalid(
                "",
                Rule::WrongType {
                    expected: "an object",
                },
            ),
        ),
        (
            "methodConfig not an array",
            r#"{"methodConfig": {}}"#.into(),
            Invalid(
                "methodConfig",
                Rule::WrongType {
                    expected: "an array of method configs",
                },
            ),
        ),
        (
            "method config not an object",
            r#"{"methodConfig": [{}, 7]}"#.into(),
            Invalid(
                "methodConfig[1]",
                Rule::WrongType {
                    expected: "an object",
                },
            ),
        ),
    ]
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
