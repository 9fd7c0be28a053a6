//! gRPC service-config JSON, parsed and validated by every rule of gRFC A6.
//!
//! [`ServiceConfig::from_json`] reads the JSON a grpc-go, grpc-java or grpc C-core
//! client would be given (`methodConfig`, `retryPolicy`, `hedgingPolicy`, `timeout`,
//! `retryThrottling`, ...), validates it, and makes the layers' [`Policies`](crate::Policies)
//! from it: the same [`RetryPolicy`](crate::RetryPolicy) and
//! [`HedgePolicy`](crate::HedgePolicy) a policy written in code is, so there is one policy
//! model. Every violation is a [`ConfigError`] that names the JSON path and the rule broken,
//! such as `methodConfig[0].retryPolicy.maxAttempts: must be an integer >= 2, got 1`.
//!
//! # Example
//!
//! The configuration of the gRFC A6 document:
//!
//! ```
//! use std::time::Duration;
//! use http::Method;
//! use tower_retry_hedge::backoff::Backoff;
//! use tower_retry_hedge::config::ServiceConfig;
//! use tower_retry_hedge::MethodPolicy;
//!
//! let json = r#"{
//!   "loadBalancingPolicy": "round_robin",
//!   "methodConfig": [{
//!     "name": [{ "service": "helloworld.Greeter", "method": "SayHello" }],
//!     "retryPolicy": {
//!       "maxAttempts": 4,
//!       "initialBackoff": "0.1s",
//!       "maxBackoff": "1s",
//!       "backoffMultiplier": 2,
//!       "retryableStatusCodes": ["UNAVAILABLE"]
//!     }
//!   }],
//!   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
//! }"#;
//!
//! let config = ServiceConfig::from_json(json)?;
//! assert_eq!(config.throttle().expect("retryThrottling").max_tokens(), 10);
//!
//! let policies = config.policies();
//! let Some(MethodPolicy::Retry(retry)) =
//!     policies.lookup(&Method::POST, "/helloworld.Greeter/SayHello")
//! else {
//!     panic!("a retry policy");
//! };
//! assert_eq!(retry.max_attempts(), 4);
//! // The first wait is `initialBackoff`, the later ones stop at `maxBackoff`: each with
//! // gRPC's ±20 % jitter.
//! let first = retry.backoff().delay(0);
//! assert!(first >= Duration::from_millis(80) && first <= Duration::from_millis(120));
//! assert!(retry.backoff().delay(10) <= Duration::from_millis(1200));
//!
//! // Other methods have no configuration: no default was given.
//! assert!(policies.lookup(&Method::POST, "/helloworld.Greeter/SayGoodbye").is_none());
//! # Ok::<(), tower_retry_hedge::config::ConfigError>(())
//! ```
//!
//! A hedging policy for a whole service, a default for everything else, and errors:
//!
//! ```
//! use std::time::Duration;
//! use http::Method;
//! use tower_retry_hedge::config::{Rule, ServiceConfig};
//! use tower_retry_hedge::MethodPolicy;
//!
//! let json = r#"{
//!   "methodConfig": [
//!     { "name": [{ "service": "pkg.Search" }],
//!       "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.05s",
//!                          "nonFatalStatusCodes": ["unavailable", 8] } },
//!     { "name": [{}], "timeout": "2.5s", "waitForReady": true }
//!   ]
//! }"#;
//! let config: ServiceConfig = json.parse()?;
//! let policies = config.policies();
//!
//! match policies.lookup(&Method::POST, "/pkg.Search/Query") {
//!     Some(MethodPolicy::Hedge(hedge)) => {
//!         assert_eq!(hedge.max_attempts(), 3);
//!         assert_eq!(hedge.delay().current(), Duration::from_millis(50));
//!     }
//!     other => panic!("expected hedging, got {other:?}"),
//! }
//!
//! // The default has no retry or hedging policy: a deadline, and wait-for-ready.
//! let other = policies.lookup(&Method::POST, "/pkg.Users/Get").expect("the default");
//! assert!(matches!(other, MethodPolicy::WaitForReady(_)));
//! assert_eq!(other.timeout(), Some(Duration::from_millis(2500)));
//!
//! let err = ServiceConfig::from_json(
//!     r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1}}]}"#,
//! )
//! .unwrap_err();
//! assert_eq!(err.path(), "methodConfig[0].retryPolicy.maxAttempts");
//! assert_eq!(err.rule(), &Rule::MaxAttempts);
//! assert_eq!(
//!     err.to_string(),
//!     "methodConfig[0].retryPolicy.maxAttempts: must be an integer >= 2, got 1"
//! );
//! # Ok::<(), tower_retry_hedge::config::ConfigError>(())
//! ```
//!
//! # What is accepted
//!
//! * Top level: `methodConfig` and `retryThrottling` are read; every other field
//!   gRPC defines (`loadBalancingPolicy`, `loadBalancingConfig`, `healthCheckConfig`,
//!   ...) is accepted and ignored, as are keys gRPC does not define anywhere, as gRPC
//!   does, but those are reported (see [Unknown keys](#unknown-keys)). Fields that
//!   are read must have the right type. A field whose value is `null` counts as absent,
//!   as in proto3 JSON. When an object repeats a key, the last value wins (as in
//!   grpc-go).
//! * `retryPolicy`: `maxAttempts` an integer >= 2; `initialBackoff` and `maxBackoff`
//!   durations > 0; `backoffMultiplier` a number > 0; `retryableStatusCodes` a
//!   non-empty array of codes. All required.
//! * `hedgingPolicy`: `maxAttempts` an integer >= 2 (required); `hedgingDelay` a
//!   duration >= 0 (absent means 0: all attempts at once); `nonFatalStatusCodes` an
//!   array of codes (absent means none).
//! * A method config holding both a `retryPolicy` and a `hedgingPolicy` is an error
//!   (grpc-go ignores the hedging policy, C-core uses the retry policy; A6 says "only
//!   one of them may be set").
//! * Status codes: integers 0-16 or case-insensitive names (`14`, `"UNAVAILABLE"`,
//!   `"unavailable"`), as A6 says; grpc-go and C-core accept only upper-case names.
//! * `retryThrottling`: `maxTokens` an integer in (0, 1000] (grpc-java and C-core accept
//!   more; A6 does not); `tokenRatio` a number whose digits past the third decimal are
//!   dropped (0.5466 is 0.546), which must then be > 0; values above
//!   4294967.295 saturate (any ratio above `maxTokens` refills the bucket in one
//!   success anyway).
//! * Names: `{"service": "s", "method": "m"}` names one method, `{"service": "s"}` a
//!   whole service, `{}` (or an empty service) is the default for every method. An
//!   empty `method` is the same as an absent one. A method without a service, the same
//!   name twice (in one method config or across them) and a second default are errors.
//!   A method config with no names is valid and matches nothing.
//! * `timeout` a duration >= 0; `waitForReady` a boolean; `maxRequestMessageBytes` and
//!   `maxResponseMessageBytes` integers >= 0 (kept for callers; values above
//!   `u64::MAX` saturate).
//!
//! # Unknown keys
//!
//! gRPC ignores keys it does not define, so a misspelt field is silent there: with
//! `"hedgeDelay"` for `"hedgingDelay"` every hedge goes at once, and `"retryThrotling"`
//! means no throttle at all. This crate ignores them too, so that the same JSON behaves as
//! it does in grpc-go, but says so:
//!
//! * [`ServiceConfig::from_json`] logs them in one `WARN` event (message `service config:
//!   unknown fields ignored`, fields `count` and `keys`, which names the first 10), and
//!   [`ServiceConfig::ignored`] lists them as [`IgnoredKey`]s: the JSON path
//!   (`methodConfig[0].hedgingPolicy.hedgeDelay`), the key, and, for a near miss, the field
//!   it likely stands for (an edit distance, ignoring case, of at most a third of the
//!   key's length: `hedgingDelay`; `maxAttempts` for `MaxAttempts` or `max_attempts`).
//! * [`ServiceConfig::from_json_strict`] refuses them, with [`Rule::UnknownField`] and the
//!   same path and suggestion.
//! * A required field that is absent names the near miss that stands in its place:
//!   `methodConfig[0].retryPolicy.maxAttempts: is required (found "maxAttempt": did you
//!   mean maxAttempts?)`.
//!
//! A key is unknown only if gRPC's service config does not define it in that place: every
//! field of `grpc/service_config/service_config.proto` is known, whether or not this crate
//! uses it (`loadBalancingPolicy`, `loadBalancingConfig`, `healthCheckConfig.serviceName`,
//! `connectionScaling.maxConnectionsPerSubchannel`, `waitForReady`, `timeout`,
//! `maxRequestMessageBytes`, `maxResponseMessageBytes`, `name[].service` and
//! `name[].method`), as is `retryPolicy.perAttemptRecvTimeout`, which grpc-java and C-core
//! read. The contents of `loadBalancingConfig` belong to each load balancer and are not
//! looked into.
//!
//! ```
//! use tower_retry_hedge::config::ServiceConfig;
//!
//! let json = r#"{"methodConfig": [{
//!     "name": [{"service": "pkg.Search"}],
//!     "hedgingPolicy": {"maxAttempts": 3, "hedgeDelay": "0.05s"}
//! }]}"#;
//! let config = ServiceConfig::from_json(json)?; // and a WARN event
//! assert_eq!(
//!     config.ignored()[0].to_string(),
//!     "methodConfig[0].hedgingPolicy.hedgeDelay (did you mean hedgingDelay?)"
//! );
//! assert!(ServiceConfig::from_json_strict(json).is_err());
//! # Ok::<(), tower_retry_hedge::config::ConfigError>(())
//! ```
//!
//! # Policies for the layers
//!
//! [`ServiceConfig::policies`] makes the [`Policies`](crate::Policies) table the layers
//! take; [`ServiceConfig::policies_builder_with`] takes [`PolicyOptions`]: the backoff
//! jitter (gRPC's ±20 % by default, or the full jitter of the 2017 A6 text) and, with the
//! `retry-info` feature, `google.rpc.RetryInfo` read as pushback by every retry and hedging
//! policy made from the JSON (`PolicyOptions::retry_info`, off by default), as Google APIs
//! send their retry delay in `grpc-status-details-bin`:
//!
//! ```
//! # #[cfg(feature = "retry-info")]
//! # {
//! use tower_retry_hedge::config::{PolicyOptions, ServiceConfig};
//!
//! let config = ServiceConfig::from_json(r#"{"methodConfig": [{"name": [{}],
//!     "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
//!                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#)?;
//! let policies = config
//!     .policies_builder_with(PolicyOptions::new().retry_info(true))
//!     .build();
//! # let _ = policies;
//! # }
//! # Ok::<(), tower_retry_hedge::config::ConfigError>(())
//! ```
//!
//! # Decisions where A6 leaves room
//!
//! * **Integers written as floats.** `maxAttempts`, `maxTokens`, status codes and
//!   message sizes are JSON numbers with an integral value: `2`, `2.0` and `2e0` are all
//!   accepted, `2.5` is rejected. JSON has no separate integer type, and the protobuf
//!   JSON parser and grpc-java accept `2.0` too (grpc-go and C-core reject it).
//!   Numbers are never accepted as strings (`"2"`), as A6 asks for JSON numbers.
//! * **Huge `maxAttempts`.** Any integer >= 2 is kept as given, saturated to
//!   `u32::MAX`; the clamp to the client's cap (default 5) belongs to the layer, as A6
//!   says values above the cap are "treated as" the cap, not rejected.
//! * **`maxBackoff < initialBackoff`** is accepted: A6 does not forbid it, and the delay
//!   `min(initialBackoff * multiplier^(n-1), maxBackoff)` is then always `maxBackoff`.
//! * **`timeout: "0s"`** is valid and kept as `Some(Duration::ZERO)`: proto3 allows it
//!   and A6 sets no lower bound. grpc-go and grpc-java apply it as a deadline that has
//!   already expired; C-core reads 0 as "no timeout". The model keeps the value; the
//!   layer decides.
//! * **Durations** follow the proto3 JSON form exactly: an optional `-`, whole seconds,
//!   optionally `.` and 1 to 9 digits, and `s`; no `+`, exponent, whitespace or leading
//!   zeros, and at most 315 576 000 000 seconds (protobuf's 10 000 years).
//!   `".5s"` and `"1.s"` are rejected. A6 says the numeric part "must be a valid JSON
//!   number", which neither is, and the protobuf reference parser
//!   (`json/internal/parser.cc`) rejects both too ("duration must start with an
//!   integer", and a `.` must be followed by a digit). grpc-go accepts both and C-core
//!   accepts `".5s"`.
//! * **`tokenRatio`** is truncated on the shortest decimal form of the `f64` serde_json
//!   reads (correctly rounded: the crate enables serde_json's `float_roundtrip`), so the
//!   truncation is exact for any number written with up to 15 significant digits; only
//!   longer ones such as `0.29999999999999999999` may read as the nearest float (0.3)
//!   first. C-core truncates the text itself.
//! * **`maxTokens: 10.5`** is rejected: A6's validation rules ask for an integer (and
//!   C-core rejects it), although the comment in A6's schema speaks of "up to 3 decimal
//!   places" for both throttling fields.
//! * **Errors**: the first violation in document order is reported.
//!
//! # Limits on untrusted input
//!
//! A service config may come from DNS, so parsing never panics and its memory is
//! bounded: a document longer than 1 MiB is refused before parsing,
//! serde_json's recursion limit (128 levels) refuses deeper nesting, and
//! at most 10 000 method configs, 10 000 names in all and 100 status codes per list.
//! Values quoted in error messages are cut to 64 characters. Unknown keys cost a few
//! string comparisons each; at most 100 are kept (the rest are counted),
//! each cut to 64 characters, and only kept keys (or, for a missing field,
//! at most 100 keys of its object) are searched for a near miss.
//!
//! The document is read into a `serde_json::Value` first, which costs more than the
//! text: measured at up to 34 times the document's length at the peak for the worst
//! shapes (`[[{}],[{}],...]`; 24 times for `[0,0,...]`), so about 34 MiB for a
//! 1 MiB document, released when parsing ends. Callers with a tighter budget can
//! refuse longer documents before calling [`ServiceConfig::from_json`]; real service
//! configs are a few kilobytes.

mod duration;
mod error;
mod index;
mod model;
#[cfg(feature = "balance")]
mod outlier;
mod parse;
mod policies;
mod service_config;
#[cfg(test)]
mod tests;
mod unknown;
#[cfg(test)]
mod write;

pub use duration::DurationError;
#[cfg(test)]
pub(crate) use duration::format_duration;
pub(crate) use duration::parse_duration;
pub use error::{ConfigError, Rule};
pub(crate) use model::{
    ConfigPolicy, HedgingPolicyConfig, MethodConfig, MethodName, RetryPolicyConfig, RetryThrottling,
};
pub use policies::PolicyOptions;
pub use service_config::ServiceConfig;
pub use unknown::IgnoredKey;

/// The longest service-config document [`ServiceConfig::from_json`] parses, in bytes
/// (1 MiB). gRPC service configs are a few hundred bytes; DNS TXT records carrying
/// them are far smaller than this.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// The most entries `methodConfig` may have.
pub(crate) const MAX_METHOD_CONFIGS: usize = 10_000;

/// The most names (`name` entries) all method configs together may have.
pub(crate) const MAX_NAMES: usize = 10_000;

/// The most entries one `retryableStatusCodes` or `nonFatalStatusCodes` array may have
/// (there are 17 codes; repeats are allowed but pointless).
pub(crate) const MAX_STATUS_CODES: usize = 100;

/// The largest number of seconds a proto3 `Duration` may hold (10 000 years).
pub(crate) const MAX_DURATION_SECONDS: u64 = 315_576_000_000;

/// The most unknown keys [`ServiceConfig::ignored`] lists (the first ones read); more are
/// only counted ([`ServiceConfig::ignored_count`]).
pub(crate) const MAX_IGNORED_KEYS: usize = 100;

/// The longest an unknown key is quoted, in paths, [`IgnoredKey::key`] and
/// [`ConfigError::near_miss`], in characters; a longer key is cut and ends in `…`, and is
/// never a near miss.
pub(crate) const MAX_KEY_CHARS: usize = 64;
