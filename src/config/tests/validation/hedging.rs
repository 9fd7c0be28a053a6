//! The validation table's `hedgingPolicy` and `retryThrottling` rows.

use super::*;

pub(super) fn cases() -> Vec<(&'static str, String, Expect)> {
    vec![
        // ---- hedgingPolicy ----
        (
            "hedging policy, all fields",
            with_hedging(&hedging_policy(&[(
                "nonFatalStatusCodes",
                Some(r#"["UNAVAILABLE", 13, "aborted"]"#),
            )])),
            Valid(|c| {
                let h = hedging_of(c);
                assert_eq!(h.max_attempts, 3);
                assert_eq!(h.hedging_delay, Duration::from_millis(100));
                assert_eq!(
                    h.non_fatal_status_codes,
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
                assert_eq!(h.hedging_delay, Duration::ZERO);
                assert!(h.non_fatal_status_codes.is_empty());
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
                assert_eq!(h.hedging_delay, Duration::ZERO);
                assert!(h.non_fatal_status_codes.is_empty());
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
            Valid(|c| assert_eq!(hedging_of(c).max_attempts, 3)),
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
                HP,
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
                assert_eq!(t.max_tokens, 10);
                assert_eq!(t.token_ratio_milli, 100);
                assert_eq!(t.token_ratio(), 0.1);
            }),
        ),
        (
            "tokenRatio digits past the third decimal dropped",
            with_throttling(&throttling(&[("tokenRatio", Some("0.5466"))])),
            Valid(|c| assert_eq!(throttling_of(c).token_ratio_milli, 546)),
        ),
        (
            "tokenRatio 0.001, the least",
            with_throttling(&throttling(&[("tokenRatio", Some("0.001"))])),
            Valid(|c| assert_eq!(throttling_of(c).token_ratio_milli, 1)),
        ),
        (
            "tokenRatio above 1",
            with_throttling(&throttling(&[("tokenRatio", Some("5"))])),
            Valid(|c| assert_eq!(throttling_of(c).token_ratio_milli, 5000)),
        ),
        (
            "maxTokens 1000, the most",
            with_throttling(&throttling(&[("maxTokens", Some("1000"))])),
            Valid(|c| assert_eq!(throttling_of(c).max_tokens, 1000)),
        ),
        (
            "maxTokens 1, the least; 10.0 style accepted",
            with_throttling(&throttling(&[("maxTokens", Some("1.0"))])),
            Valid(|c| assert_eq!(throttling_of(c).max_tokens, 1)),
        ),
        (
            "maxTokens 0",
            with_throttling(&throttling(&[("maxTokens", Some("0"))])),
            Invalid(MT, Rule::MaxTokens),
        ),
        (
            "maxTokens 10.5",
            with_throttling(&throttling(&[("maxTokens", Some("10.5"))])),
            Invalid(MT, Rule::MaxTokens),
        ),
        (
            "maxTokens missing",
            with_throttling(&throttling(&[("maxTokens", None)])),
            Invalid(MT, Rule::Missing),
        ),
        (
            "maxTokens 1001 (grpc-java, C-core: accepted)",
            with_throttling(&throttling(&[("maxTokens", Some("1001"))])),
            Invalid(MT, Rule::MaxTokens),
        ),
        (
            "maxTokens -1",
            with_throttling(&throttling(&[("maxTokens", Some("-1"))])),
            Invalid(MT, Rule::MaxTokens),
        ),
        (
            "tokenRatio 0",
            with_throttling(&throttling(&[("tokenRatio", Some("0"))])),
            Invalid(TR, Rule::TokenRatio),
        ),
        (
            "tokenRatio 0.0001 is 0 after truncation",
            with_throttling(&throttling(&[("tokenRatio", Some("0.0001"))])),
            Invalid(TR, Rule::TokenRatio),
        ),
        (
            "tokenRatio 0.0009 is 0 after truncation",
            with_throttling(&throttling(&[("tokenRatio", Some("0.0009"))])),
            Invalid(TR, Rule::TokenRatio),
        ),
        (
            "tokenRatio missing",
            with_throttling(&throttling(&[("tokenRatio", None)])),
            Invalid(TR, Rule::Missing),
        ),
        (
            "tokenRatio negative",
            with_throttling(&throttling(&[("tokenRatio", Some("-0.1"))])),
            Invalid(TR, Rule::TokenRatio),
        ),
        (
            "tokenRatio as a string",
            with_throttling(&throttling(&[("tokenRatio", Some("\"0.1\""))])),
            Invalid(TR, Rule::TokenRatio),
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
    ]
}
