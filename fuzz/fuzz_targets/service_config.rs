//! Service-config JSON: `ServiceConfig::from_json`, then `.policies()`.
//!
//! Beyond "no panic", every accepted document must
//! - write back (`to_json`) as JSON that parses to an equal config, as documented;
//! - give a policy table in which each method or service named with a retry or hedging
//!   policy finds a policy of the same kind (the table must not drop one silently).

#![no_main]

use http::Method;
use libfuzzer_sys::fuzz_target;
use tower_retry_hedge::MethodPolicy;
use tower_retry_hedge::config::{MethodPolicy as ConfigPolicy, ServiceConfig};

/// A method name no config in a fuzzed document is likely to use, to reach a service entry.
const UNLISTED: &str = "fuzz-unlisted-method";

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = ServiceConfig::from_json(json) else {
        return;
    };
    let policies = config.policies();

    let written = config.to_json();
    match ServiceConfig::from_json(&written) {
        Ok(again) => assert_eq!(again, config, "to_json does not round-trip: {written}"),
        Err(error) => panic!("to_json wrote a config that does not parse ({error}): {written}"),
    }

    for method_config in config.method_configs() {
        let Some(policy) = method_config.policy() else {
            continue;
        };
        for name in method_config.names() {
            // Names with `/` cannot be told apart from a path's separator; the default name
            // (`{}`) is covered by any path no other name matches, which is hard to build.
            let service = name.service();
            if service.is_empty() || service.contains('/') {
                continue;
            }
            let path = match name.method() {
                Some(method) if method.contains('/') => continue,
                Some(method) => format!("/{service}/{method}"),
                None => {
                    if config
                        .method_config(service, UNLISTED)
                        .is_some_and(|found| !std::ptr::eq(found, method_config))
                    {
                        continue;
                    }
                    format!("/{service}/{UNLISTED}")
                }
            };
            let found = policies.lookup(&Method::POST, &path);
            let same_kind = matches!(
                (policy, found),
                (ConfigPolicy::Retry(_), Some(MethodPolicy::Retry(_)))
                    | (ConfigPolicy::Hedging(_), Some(MethodPolicy::Hedge(_)))
            );
            assert!(
                same_kind,
                "{path}: the config has {policy:?}, the table {found:?}"
            );
        }
    }
});
