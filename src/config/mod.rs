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
//! A second example (a hedging policy, a default and errors), unknown keys, the decisions taken
//! where A6 leaves room and the limits on untrusted input are in [the guide's section on service
//! config](crate::guide#service-config).
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
//! # What is accepted
//!
//! * Top level: `methodConfig` and `retryThrottling` are read; every other field
//!   gRPC defines (`loadBalancingPolicy`, `loadBalancingConfig`, `healthCheckConfig`,
//!   ...) is accepted and ignored, as are keys gRPC does not define anywhere, as gRPC
//!   does, but those are reported (see [Unknown keys](crate::guide#unknown-keys)). Fields that
//!   are read must have the right type. A field whose value is `null` counts as absent,
//!   as in proto3 JSON. When an object repeats a key, the last value wins (as in
//!   grpc-go).
//! * `retryPolicy`: `maxAttempts` an integer >= 2; `initialBackoff` and `maxBackoff`
//!   durations > 0; `backoffMultiplier` a number > 0; `retryableStatusCodes` a
//!   non-empty array of codes. All required. `perAttemptRecvTimeout`, optional, a duration
//!   above zero (`"0s"` is an error, as in C-core); with it, `retryableStatusCodes` may be
//!   empty.
//!   It is applied as gRPC C-core applies it: an attempt with no response headers by then
//!   is cancelled and retried after the backoff whatever `retryableStatusCodes` lists
//!   (`maxAttempts`, the throttle, for which it is a failure, and the deadline permitting),
//!   and a gRPC call whose last attempt timed out ends `CANCELLED`; response headers in
//!   time stop its timer.
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

mod duration;
mod error;
mod index;
mod model;
mod objects;
#[cfg(feature = "balance")]
mod outlier;
mod parse;
mod policies;
mod service_config;
mod table;
#[cfg(test)]
mod tests;
mod unknown;

pub use duration::DurationError;
pub(crate) use duration::{format_duration, parse_duration};
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
