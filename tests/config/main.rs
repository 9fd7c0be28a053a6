//! gRPC service-config JSON at the call level: the throttle and buffer state a config's
//! policies keep, and `RetryInfo` read by policies made from the JSON (against a real tonic
//! peer). The parser's own tests (the validation table, the duration parser, name matching,
//! the examples of gRFC A6, limits on untrusted input, properties, keys gRPC does not define)
//! are unit tests of `src/config`.

#[cfg(all(feature = "retry-info", feature = "tonic"))]
#[path = "../common/mod.rs"]
mod common;
#[cfg(all(feature = "retry-info", feature = "tonic"))]
mod retry_info;
mod state;

use tower_retry_hedge::config::ServiceConfig;

/// Parses a config that must be valid.
fn parse(json: &str) -> ServiceConfig {
    ServiceConfig::from_json(json).unwrap_or_else(|e| panic!("rejected {json}: {e}"))
}
