//! The validation table's `retryPolicy` rows: valid ones, and every rejection C-core makes.

use super::*;

pub(super) fn cases() -> Vec<(&'static str, String, Expect)> {
    vec![
        // ---- retryPolicy: valid ----
        (
            "retry policy, all fields",
            with_retry(&retry_policy(&[])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(r.max_attempts, 3);
                assert_eq!(r.initial_backoff, Duration::from_millis(100));
                assert_eq!(r.max_backoff, Duration::from_secs(1));
                assert_eq!(r.backoff_multiplier, 2.0);
                assert_eq!(
                    r.retryable_status_codes,
                    GrpcCodes::from([Code::Unavailable])
                );
            }),
        ),
        (
            "maxAttempts 2, the least",
            with_retry(&retry_policy(&[("maxAttempts", Some("2"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts, 2)),
        ),
        (
            "maxAttempts above the client cap is kept, not clamped",
            with_retry(&retry_policy(&[("maxAttempts", Some("6"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts, 6)),
        ),
        (
            "maxAttempts beyond u32 saturates",
            with_retry(&retry_policy(&[("maxAttempts", Some("4294967296"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts, u32::MAX)),
        ),
        (
            "maxAttempts beyond u64 saturates",
            with_retry(&retry_policy(&[("maxAttempts", Some("1e30"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts, u32::MAX)),
        ),
        (
            "maxAttempts 2.0 (integral float) accepted, as grpc-java does",
            with_retry(&retry_policy(&[("maxAttempts", Some("2.0"))])),
            Valid(|c| assert_eq!(retry_of(c).max_attempts, 2)),
        ),
        (
            "integer status code accepted (C-core: rejected)",
            with_retry(&retry_policy(&[("retryableStatusCodes", Some("[14, 8]"))])),
            Valid(|c| {
                assert_eq!(
                    retry_of(c).retryable_status_codes,
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
                    retry_of(c).retryable_status_codes,
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
            Valid(|c| assert_eq!(retry_of(c).retryable_status_codes.len(), 1)),
        ),
        (
            "all 17 codes, OK included",
            with_retry(&retry_policy(&[(
                "retryableStatusCodes",
                Some("[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]"),
            )])),
            Valid(|c| assert_eq!(retry_of(c).retryable_status_codes.len(), 17)),
        ),
        (
            "maxBackoff below initialBackoff accepted",
            with_retry(&retry_policy(&[
                ("initialBackoff", Some("\"2s\"")),
                ("maxBackoff", Some("\"1s\"")),
            ])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(r.initial_backoff, Duration::from_secs(2));
                assert_eq!(r.max_backoff, Duration::from_secs(1));
            }),
        ),
        (
            "multiplier below 1 and a float",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("0.5"))])),
            Valid(|c| assert_eq!(retry_of(c).backoff_multiplier, 0.5)),
        ),
        (
            "nanosecond backoffs",
            with_retry(&retry_policy(&[
                ("initialBackoff", Some("\"0.000000001s\"")),
                ("maxBackoff", Some("\"1.000000001s\"")),
            ])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(r.initial_backoff, Duration::from_nanos(1));
                assert_eq!(r.max_backoff, Duration::new(1, 1));
            }),
        ),
        (
            "perAttemptRecvTimeout is read",
            with_retry(&retry_policy(&[(
                "perAttemptRecvTimeout",
                Some("\"1.5s\""),
            )])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(
                    r.per_attempt_recv_timeout,
                    Some(Duration::from_millis(1500))
                );
                assert_eq!(r.max_attempts, 3);
            }),
        ),
        (
            "perAttemptRecvTimeout absent is none",
            with_retry(&retry_policy(&[])),
            Valid(|c| assert_eq!(retry_of(c).per_attempt_recv_timeout, None)),
        ),
        (
            "perAttemptRecvTimeout lets retryableStatusCodes be empty, as in C-core",
            with_retry(&retry_policy(&[
                ("perAttemptRecvTimeout", Some("\"0.05s\"")),
                ("retryableStatusCodes", Some("[]")),
            ])),
            Valid(|c| {
                let r = retry_of(c);
                assert_eq!(r.retryable_status_codes, GrpcCodes::empty());
                assert_eq!(r.per_attempt_recv_timeout, Some(Duration::from_millis(50)));
            }),
        ),
        // ---- retryPolicy: invalid, as C-core ----
        (
            "maxAttempts 1",
            with_retry(&retry_policy(&[("maxAttempts", Some("1"))])),
            Invalid(MA, Rule::MaxAttempts),
        ),
        (
            "maxAttempts 0",
            with_retry(&retry_policy(&[("maxAttempts", Some("0"))])),
            Invalid(MA, Rule::MaxAttempts),
        ),
        (
            "maxAttempts missing",
            with_retry(&retry_policy(&[("maxAttempts", None)])),
            Invalid(MA, Rule::Missing),
        ),
        (
            "maxAttempts null is missing",
            with_retry(&retry_policy(&[("maxAttempts", Some("null"))])),
            Invalid(MA, Rule::Missing),
        ),
        (
            "maxAttempts 2.5",
            with_retry(&retry_policy(&[("maxAttempts", Some("2.5"))])),
            Invalid(MA, Rule::MaxAttempts),
        ),
        (
            "maxAttempts -1",
            with_retry(&retry_policy(&[("maxAttempts", Some("-1"))])),
            Invalid(MA, Rule::MaxAttempts),
        ),
        (
            "maxAttempts as a string",
            with_retry(&retry_policy(&[("maxAttempts", Some("\"3\""))])),
            Invalid(MA, Rule::MaxAttempts),
        ),
        (
            "initialBackoff missing",
            with_retry(&retry_policy(&[("initialBackoff", None)])),
            Invalid(IB, Rule::Missing),
        ),
        (
            "maxBackoff missing",
            with_retry(&retry_policy(&[("maxBackoff", None)])),
            Invalid(MB, Rule::Missing),
        ),
        (
            "initialBackoff \"1\" (no unit)",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"1\""))])),
            Invalid(IB, Rule::Duration(DurationError::MissingSuffix)),
        ),
        (
            "initialBackoff \"1sec\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"1sec\""))])),
            Invalid(IB, Rule::Duration(DurationError::MissingSuffix)),
        ),
        (
            "initialBackoff \"1ms\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"1ms\""))])),
            Invalid(IB, Rule::Duration(DurationError::Malformed)),
        ),
        (
            "initialBackoff \"-1s\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"-1s\""))])),
            Invalid(IB, Rule::NotPositive),
        ),
        (
            "initialBackoff \"0s\"",
            with_retry(&retry_policy(&[("initialBackoff", Some("\"0s\""))])),
            Invalid(IB, Rule::NotPositive),
        ),
        (
            "maxBackoff \"0.000s\"",
            with_retry(&retry_policy(&[("maxBackoff", Some("\"0.000s\""))])),
            Invalid(MB, Rule::NotPositive),
        ),
        (
            "initialBackoff a number",
            with_retry(&retry_policy(&[("initialBackoff", Some("0.1"))])),
            Invalid(
                IB,
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
            Invalid(IB, Rule::Duration(DurationError::TooManyFractionDigits)),
        ),
        (
            "backoffMultiplier 0",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("0"))])),
            Invalid(BM, Rule::BackoffMultiplier),
        ),
        (
            "backoffMultiplier -2",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("-2"))])),
            Invalid(BM, Rule::BackoffMultiplier),
        ),
        (
            "backoffMultiplier missing",
            with_retry(&retry_policy(&[("backoffMultiplier", None)])),
            Invalid(BM, Rule::Missing),
        ),
        (
            "backoffMultiplier as a string",
            with_retry(&retry_policy(&[("backoffMultiplier", Some("\"2\""))])),
            Invalid(BM, Rule::BackoffMultiplier),
        ),
        (
            "retryableStatusCodes empty",
            with_retry(&retry_policy(&[("retryableStatusCodes", Some("[]"))])),
            Invalid(RC, Rule::EmptyStatusCodes),
        ),
        (
            "retryableStatusCodes missing",
            with_retry(&retry_policy(&[("retryableStatusCodes", None)])),
            Invalid(RC, Rule::Missing),
        ),
        (
            "retryableStatusCodes missing, even with perAttemptRecvTimeout",
            with_retry(&retry_policy(&[
                ("perAttemptRecvTimeout", Some("\"1s\"")),
                ("retryableStatusCodes", None),
            ])),
            Invalid(RC, Rule::Missing),
        ),
        (
            "perAttemptRecvTimeout 0s, as C-core (must be greater than 0)",
            with_retry(&retry_policy(&[("perAttemptRecvTimeout", Some("\"0s\""))])),
            Invalid(PT, Rule::NotPositive),
        ),
        (
            "perAttemptRecvTimeout negative",
            with_retry(&retry_policy(&[("perAttemptRecvTimeout", Some("\"-1s\""))])),
            Invalid(PT, Rule::NotPositive),
        ),
        (
            "perAttemptRecvTimeout without its unit",
            with_retry(&retry_policy(&[("perAttemptRecvTimeout", Some("\"1\""))])),
            Invalid(PT, Rule::Duration(DurationError::MissingSuffix)),
        ),
        (
            "perAttemptRecvTimeout as a number",
            with_retry(&retry_policy(&[("perAttemptRecvTimeout", Some("1"))])),
            Invalid(
                PT,
                Rule::WrongType {
                    expected: "a duration string such as \"0.1s\"",
                },
            ),
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
                RC,
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
            Invalid(MA, Rule::MaxAttempts),
        ),
    ]
}
