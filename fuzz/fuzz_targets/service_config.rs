//! Service-config JSON: `ServiceConfig::from_json`, then `.policies()`.
//!
//! Beyond "no panic", every accepted document must
//! - parse the same under the strict parse when it had no key gRPC does not define, and be
//!   refused by it when it had one;
//! - give a policy table that answers any lookup (the parser's own round trip through the
//!   JSON it would write is a property test of `src/config`).

#![no_main]

use http::Method;
use libfuzzer_sys::fuzz_target;
use tower_retry_hedge::config::ServiceConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = ServiceConfig::from_json(json) else {
        return;
    };
    match ServiceConfig::from_json_strict(json) {
        Ok(strict) => {
            assert_eq!(config.ignored_count(), 0, "strict accepted ignored keys: {json}");
            assert_eq!(strict, config, "strict and lenient parses differ: {json}");
        }
        Err(error) => assert!(
            config.ignored_count() > 0,
            "strict refused ({error}) what had no ignored key: {json}"
        ),
    }

    let policies = config.policies();
    for path in ["/a.B/C", "/", "", "/a.B/", "//C", json] {
        let _ = policies.lookup(&Method::POST, path);
        let _ = config.max_request_message_bytes(path);
    }
});
