//! The data model of a validated service config: method names, policies, method
//! configs and retry throttling, as plain values.
//!
//! `Default` is where reading an object starts: the value of an absent optional field, and a
//! placeholder for a required one, which a parse always reads over.

use std::time::Duration;

use crate::classify::GrpcCodes;

/// The name a method config applies to: one method (`service` and `method`), a whole
/// service (`method` is `None`), or every method (the default: empty `service`, no
/// `method`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct MethodName {
    /// The fully-qualified service name, such as `helloworld.Greeter`; empty for the
    /// default name.
    pub(crate) service: String,
    /// The method name, such as `SayHello`; `None` when the name covers the whole service
    /// (or is the default).
    pub(crate) method: Option<String>,
}

impl MethodName {
    /// Whether this is the default name, which applies to every method not otherwise
    /// named.
    pub(crate) fn is_default(&self) -> bool {
        self.service.is_empty()
    }
}

/// A validated `retryPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct RetryPolicyConfig {
    /// `maxAttempts`: attempts in all, the original one included; >= 2, as given
    /// (saturated to `u32::MAX`), not yet clamped to the client's cap.
    pub(crate) max_attempts: u32,
    /// `initialBackoff`: > 0.
    pub(crate) initial_backoff: Duration,
    /// `maxBackoff`: > 0; may be below `initial_backoff` (then every delay is
    /// `max_backoff`).
    pub(crate) max_backoff: Duration,
    /// `backoffMultiplier`: finite and > 0.
    pub(crate) backoff_multiplier: f64,
    /// `retryableStatusCodes`: never empty without a `per_attempt_recv_timeout`.
    pub(crate) retryable_status_codes: GrpcCodes,
    /// `perAttemptRecvTimeout`: > 0. An attempt without response headers by then is
    /// cancelled and retried whatever `retryableStatusCodes` lists, as gRPC C-core does.
    pub(crate) per_attempt_recv_timeout: Option<Duration>,
}

/// A validated `hedgingPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct HedgingPolicyConfig {
    /// `maxAttempts`: attempts in all, the original one included; >= 2, as given
    /// (saturated to `u32::MAX`), not yet clamped to the client's cap.
    pub(crate) max_attempts: u32,
    /// `hedgingDelay`: zero (send all attempts at once) when absent.
    pub(crate) hedging_delay: Duration,
    /// `nonFatalStatusCodes`: empty when absent.
    pub(crate) non_fatal_status_codes: GrpcCodes,
}

/// The policy of a method config: retries or hedging, never both.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ConfigPolicy {
    /// A `retryPolicy`.
    Retry(RetryPolicyConfig),
    /// A `hedgingPolicy`.
    Hedging(HedgingPolicyConfig),
}

/// One validated entry of `methodConfig`.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct MethodConfig {
    /// The names this config applies to (possibly none).
    pub(crate) names: Vec<MethodName>,
    /// The retry or hedging policy, if any.
    pub(crate) policy: Option<ConfigPolicy>,
    /// `timeout`: the default deadline of a call, across all its attempts. May be zero (see
    /// the guide's "Decisions where A6 leaves room").
    pub(crate) timeout: Option<Duration>,
    /// `waitForReady`, kept for callers.
    pub(crate) wait_for_ready: Option<bool>,
    /// `maxRequestMessageBytes`, kept for callers.
    pub(crate) max_request_message_bytes: Option<u64>,
    /// `maxResponseMessageBytes`, kept for callers.
    pub(crate) max_response_message_bytes: Option<u64>,
}

impl MethodConfig {
    /// The retry policy, if the policy is one.
    pub(crate) fn retry_policy(&self) -> Option<&RetryPolicyConfig> {
        match &self.policy {
            Some(ConfigPolicy::Retry(retry)) => Some(retry),
            _ => None,
        }
    }

    /// The hedging policy, if the policy is one.
    pub(crate) fn hedging_policy(&self) -> Option<&HedgingPolicyConfig> {
        match &self.policy {
            Some(ConfigPolicy::Hedging(hedging)) => Some(hedging),
            _ => None,
        }
    }
}

/// A validated `retryThrottling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct RetryThrottling {
    /// `maxTokens`: in 1..=1000.
    pub(crate) max_tokens: u32,
    /// `tokenRatio` in thousandths, digits past the third decimal dropped: >= 1.
    pub(crate) token_ratio_milli: u32,
}

impl RetryThrottling {
    /// `tokenRatio`, as the three-decimal value in force (0.5466 gives 0.546).
    pub(crate) fn token_ratio(&self) -> f64 {
        f64::from(self.token_ratio_milli) / 1000.0
    }
}
