//! Which method config a call gets: the exact method beats its service, which beats
//! the default.

use std::time::Duration;

use super::*;

/// Three levels, told apart by their timeout in seconds.
const LEVELS: &str = r#"{"methodConfig": [
    {"name": [{"service": "pkg.S", "method": "Exact"}, {"service": "pkg.T", "method": "Exact"}],
     "timeout": "1s"},
    {"name": [{"service": "pkg.S"}], "timeout": "2s"},
    {"name": [{}], "timeout": "3s"}
]}"#;

fn seconds(config: Option<&crate::config::MethodConfig>) -> Option<u64> {
    config.and_then(|c| c.timeout).map(|t| t.as_secs())
}

#[test]
fn exact_beats_service_beats_default() {
    let config = parse(LEVELS);
    let cases = [
        ("pkg.S", "Exact", Some(1)),
        ("pkg.S", "Other", Some(2)),
        ("pkg.T", "Exact", Some(1)),
        // pkg.T has only a method entry: its other methods get the default.
        ("pkg.T", "Other", Some(3)),
        ("pkg.U", "Exact", Some(3)),
        // Names are case-sensitive.
        ("pkg.s", "Exact", Some(3)),
        ("pkg.S", "exact", Some(2)),
        ("", "", Some(3)),
        ("pkg.S", "", Some(2)),
    ];
    for (service, method, expected) in cases {
        assert_eq!(
            seconds(config.method_config(service, method)),
            expected,
            "{service}/{method}"
        );
        if !service.is_empty() && !method.is_empty() {
            let path = format!("/{service}/{method}");
            assert_eq!(seconds(config.lookup_path(&path)), expected, "{path}");
        }
    }
    assert_eq!(seconds(config.default_method_config()), Some(3));
}

#[test]
fn without_a_default_unknown_methods_get_nothing() {
    let config = parse(
        r#"{"methodConfig": [
            {"name": [{"service": "pkg.S", "method": "M"}], "timeout": "1s"},
            {"name": [{"service": "pkg.T"}], "timeout": "2s"}
        ]}"#,
    );
    assert_eq!(seconds(config.lookup_path("/pkg.S/M")), Some(1));
    assert_eq!(seconds(config.lookup_path("/pkg.T/Any")), Some(2));
    assert!(config.lookup_path("/pkg.S/Other").is_none());
    assert!(config.lookup_path("/pkg.U/M").is_none());
    assert!(config.default_method_config().is_none());
    assert!(config.lookup_path("not a path").is_none());
}

#[test]
fn malformed_paths_get_the_default_only() {
    let config = parse(LEVELS);
    for path in [
        "",
        "/",
        "//",
        "pkg.S/Exact",
        "/pkg.S",
        "/pkg.S/",
        "//Exact",
        "/pkg.S/Exact/",
        "/pkg.S/Exact/extra",
        "pkg.S.Exact",
    ] {
        assert_eq!(seconds(config.lookup_path(path)), Some(3), "{path:?}");
    }
}

#[test]
fn the_most_specific_config_applies_whole() {
    // The exact method has no policy: it turns off its service's retry policy.
    let config = parse(&format!(
        r#"{{"methodConfig": [
            {{"name": [{{"service": "s"}}], "retryPolicy": {}}},
            {{"name": [{{"service": "s", "method": "NoRetry"}}], "timeout": "5s"}}
        ]}}"#,
        retry_policy(&[])
    ));
    let plain = config.lookup_path("/s/Other").unwrap();
    assert_eq!(plain.retry_policy().map(|r| r.max_attempts), Some(3));
    let exact = config.lookup_path("/s/NoRetry").unwrap();
    assert!(exact.policy.is_none());
    assert_eq!(exact.timeout, Some(Duration::from_secs(5)));
}

#[test]
fn one_config_may_name_many_methods() {
    let config = parse(&format!(
        r#"{{"methodConfig": [{{"name": [
            {{"service": "a", "method": "X"}}, {{"service": "b"}}, {{}}
        ], "hedgingPolicy": {}}}]}}"#,
        hedging_policy(&[])
    ));
    for path in ["/a/X", "/b/Y", "/c/Z", "/a/Y"] {
        let found = config.lookup_path(path).expect(path);
        assert!(found.hedging_policy().is_some(), "{path}");
        assert!(std::ptr::eq(found, &config.method_configs()[0]));
    }
}

#[test]
fn an_empty_config_matches_nothing() {
    let config = parse("{}");
    assert!(config.lookup_path("/a/b").is_none());
    assert!(config.method_config("a", "b").is_none());
}
