//! The validation table's rows for names, the other method-config fields, and the document
//! itself.

use super::*;

pub(super) fn cases() -> Vec<(&'static str, String, Expect)> {
    vec![
        // ---- names ----
        (
            "service and method",
            with_method_config(r#""name": [{"service": "pkg.S", "method": "M"}]"#),
            Valid(|c| {
                let name = &c.method_configs()[0].names[0];
                assert_eq!(name.service, "pkg.S");
                assert_eq!(name.method.as_deref(), Some("M"));
                assert!(!name.is_default());
            }),
        ),
        (
            "empty method is the whole service",
            with_method_config(r#""name": [{"service": "pkg.S", "method": ""}]"#),
            Valid(|c| assert_eq!(c.method_configs()[0].names[0].method, None)),
        ),
        (
            "empty service is the default",
            with_method_config(r#""name": [{"service": "", "method": null}]"#),
            Valid(|c| {
                assert!(c.method_configs()[0].names[0].is_default());
                assert!(c.default_method_config().is_some());
            }),
        ),
        (
            "a method config without names matches nothing",
            with_method_config(r#""timeout": "1s""#),
            Valid(|c| {
                assert!(c.method_configs()[0].names.is_empty());
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
            Valid(|c| assert_eq!(c.method_configs()[0].names.len(), 2)),
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
                assert_eq!(m.timeout, Some(Duration::from_millis(30_500)));
                assert_eq!(m.wait_for_ready, Some(false));
                assert_eq!(m.max_request_message_bytes, Some(1024));
                assert_eq!(m.max_response_message_bytes, Some(4_194_304));
                assert!(m.policy.is_none());
            }),
        ),
        (
            "timeout 0 is valid and kept",
            with_method_config(r#""name": [{}], "timeout": "0s""#),
            Valid(|c| assert_eq!(c.method_configs()[0].timeout, Some(Duration::ZERO))),
        ),
        (
            "absent fields are None",
            with_method_config(r#""name": [{}]"#),
            Valid(|c| {
                let m = &c.method_configs()[0];
                assert_eq!(m.timeout, None);
                assert_eq!(m.wait_for_ready, None);
                assert_eq!(m.max_request_message_bytes, None);
                assert_eq!(m.max_response_message_bytes, None);
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
