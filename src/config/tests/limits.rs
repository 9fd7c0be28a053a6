//! Limits on untrusted input: document size, entry counts, nesting depth, and the
//! length of values quoted in errors.

use crate::config::{Rule, ServiceConfig};

use super::*;

#[test]
fn documents_over_the_size_cap_are_refused_before_parsing() {
    // Exactly the cap (padded with whitespace) is parsed.
    let mut json = String::from("{}");
    json.push_str(&" ".repeat(MAX_DOCUMENT_BYTES - json.len()));
    assert_eq!(json.len(), MAX_DOCUMENT_BYTES);
    assert_eq!(parse(&json), ServiceConfig::default());

    // One byte more is refused, even though it would be valid JSON.
    json.push(' ');
    let error = parse_err(&json);
    assert_eq!(
        error.rule(),
        &Rule::DocumentTooLarge {
            max: MAX_DOCUMENT_BYTES
        }
    );
    assert_eq!(error.value(), Some("1048577 bytes"));
    assert_eq!(
        error.to_string(),
        "service config: must be at most 1048576 bytes long, got 1048577 bytes"
    );
}

fn method_configs(count: usize) -> String {
    let entries = vec!["{}"; count].join(",");
    format!(r#"{{"methodConfig": [{entries}]}}"#)
}

#[test]
fn method_configs_are_capped() {
    assert_eq!(
        parse(&method_configs(MAX_METHOD_CONFIGS))
            .method_configs()
            .len(),
        MAX_METHOD_CONFIGS
    );
    let error = parse_err(&method_configs(MAX_METHOD_CONFIGS + 1));
    assert_eq!(error.path(), "methodConfig");
    assert_eq!(
        error.rule(),
        &Rule::TooManyEntries {
            max: MAX_METHOD_CONFIGS
        }
    );
}

/// `configs` method configs, each with `per_config` distinct service names.
fn names(configs: usize, per_config: usize) -> String {
    let entries: Vec<String> = (0..configs)
        .map(|i| {
            let names: Vec<String> = (0..per_config)
                .map(|j| format!(r#"{{"service": "s{i}_{j}"}}"#))
                .collect();
            format!(r#"{{"name": [{}]}}"#, names.join(","))
        })
        .collect();
    format!(r#"{{"methodConfig": [{}]}}"#, entries.join(","))
}

#[test]
fn names_are_capped_across_all_method_configs() {
    assert_eq!(MAX_NAMES % 100, 0);
    let config = parse(&names(100, MAX_NAMES / 100));
    assert!(config.lookup_path("/s99_99/M").is_some());

    // One more name, in a config of its own: the total is what counts.
    let mut json = names(100, MAX_NAMES / 100);
    json.truncate(json.len() - 2);
    json.push_str(r#",{"name": [{"service": "extra"}]}]}"#);
    let error = parse_err(&json);
    assert_eq!(error.path(), "methodConfig[100].name");
    assert_eq!(error.rule(), &Rule::TooManyNames { max: MAX_NAMES });

    // A single name array longer than the cap is refused before its names are read.
    let error = parse_err(&names(1, MAX_NAMES + 1));
    assert_eq!(error.path(), "methodConfig[0].name");
}

#[test]
fn status_code_arrays_are_capped() {
    let codes = |n: usize| vec!["14"; n].join(",");
    let ok = with_retry(&retry_policy(&[(
        "retryableStatusCodes",
        Some(&format!("[{}]", codes(MAX_STATUS_CODES))),
    )]));
    assert_eq!(retry_of(&parse(&ok)).retryable_status_codes.len(), 1);

    let too_many = with_hedging(&hedging_policy(&[(
        "nonFatalStatusCodes",
        Some(&format!("[{}]", codes(MAX_STATUS_CODES + 1))),
    )]));
    let error = parse_err(&too_many);
    assert_eq!(
        error.path(),
        "methodConfig[0].hedgingPolicy.nonFatalStatusCodes"
    );
    assert_eq!(
        error.rule(),
        &Rule::TooManyEntries {
            max: MAX_STATUS_CODES
        }
    );
}

#[test]
fn nesting_is_bounded_by_serde_json_recursion_limit() {
    // Deep nesting in an ignored field: up to the limit it parses...
    let nested = |depth: usize| {
        format!(
            r#"{{"ignored": {}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    assert_eq!(parse(&nested(100)), ServiceConfig::default());

    // ...beyond it, an error, not a stack overflow.
    for depth in [200, 100_000] {
        let error = parse_err(&nested(depth));
        match error.rule() {
            Rule::Json { message, .. } => {
                assert_eq!(message, "recursion limit exceeded", "{depth}")
            }
            other => panic!("{depth}: {other:?}"),
        }
    }
}

#[test]
fn quoted_values_are_cut() {
    let long = "x".repeat(100_000);
    let error = parse_err(&with_retry(&retry_policy(&[(
        "initialBackoff",
        Some(&format!("\"{long}\"")),
    )])));
    let value = error.value().unwrap();
    assert!(value.chars().count() <= 70, "{}", value.len());
    assert!(error.to_string().len() < 300);

    // Objects and arrays are named by their type, never written out.
    let error = parse_err(&with_retry(&retry_policy(&[(
        "maxAttempts",
        Some(&format!("[\"{long}\"]")),
    )])));
    assert_eq!(error.value(), Some("an array"));
}

#[test]
fn strange_but_valid_json_never_panics() {
    let documents = [
        "null",
        "true",
        "0",
        "\"\"",
        "{\"methodConfig\": [null]}",
        "{\"methodConfig\": [{\"name\": [null]}]}",
        "{\"methodConfig\": [{\"name\": null, \"retryPolicy\": {}}]}",
        "{\"retryThrottling\": {\"maxTokens\": 1e308, \"tokenRatio\": 1e308}}",
        "{\"retryThrottling\": {\"maxTokens\": 5, \"tokenRatio\": 1e-308}}",
        "{\"retryThrottling\": {\"maxTokens\": -0, \"tokenRatio\": -0.0}}",
        "{\"methodConfig\": [{\"name\": [{\"service\": \"\\u0000\", \"method\": \"\\ud83d\\ude00\"}]}]}",
        "{\"a\": \"\\ud800\"}",
    ];
    for json in documents {
        let _ = ServiceConfig::from_json(json);
    }
}
