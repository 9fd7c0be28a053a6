//! The data model of a validated service config: method names, policies, method
//! configs and retry throttling, as plain values.

use std::time::Duration;

use crate::classify::GrpcCodes;

/// The name a method config applies to: one method (`service` and `method`), a whole
/// service (`method` is `None`), or every method (the default: empty `service`, no
/// `method`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MethodName {
    pub(super) service: String,
    pub(super) method: Option<String>,
}

impl MethodName {
    /// The fully-qualified service name, such as `helloworld.Greeter`; empty for the
    /// default name.
    pub(crate) fn service(&self) -> &str {
        &self.service
    }

    /// The method name, such as `SayHello`; `None` when the name covers the whole
    /// service (or is the default).
    pub(crate) fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// Whether this is the default name, which applies to every method not otherwise
    /// named.
    pub(crate) fn is_default(&self) -> bool {
        self.service.is_empty()
    }
}

/// A validated `retryPolicy`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RetryPolicyConfig {
    pub(super) max_attempts: u32,
    pub(super) initial_backoff: Duration,
    pub(super) max_backoff: Duration,
    pub(super) backoff_multiplier: f64,
    pub(super) retryable_status_codes: GrpcCodes,
}

impl RetryPolicyConfig {
    /// `maxAttempts`: attempts in all, the original one included; >= 2, as given
    /// (saturated to `u32::MAX`), not yet clamped to the client's cap.
    pub(crate) fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `initialBackoff`: > 0.
    pub(crate) fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }

    /// `maxBackoff`: > 0; may be below `initial_backoff` (then every delay is
    /// `max_backoff`).
    pub(crate) fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// `backoffMultiplier`: finite and > 0.
    pub(crate) fn backoff_multiplier(&self) -> f64 {
        self.backoff_multiplier
    }

    /// `retryableStatusCodes`: never empty.
    pub(crate) fn retryable_status_codes(&self) -> GrpcCodes {
        self.retryable_status_codes
    }
}

/// A validated `hedgingPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HedgingPolicyConfig {
    pub(super) max_attempts: u32,
    pub(super) hedging_delay: Duration,
    pub(super) non_fatal_status_codes: GrpcCodes,
}

impl HedgingPolicyConfig {
    /// `maxAttempts`: attempts in all, the original one included; >= 2, as given
    /// (saturated to `u32::MAX`), not yet clamped to the client's cap.
    pub(crate) fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `hedgingDelay`: zero (send all attempts at once) when absent.
    pub(crate) fn hedging_delay(&self) -> Duration {
        self.hedging_delay
    }

    /// `nonFatalStatusCodes`: empty when absent.
    pub(crate) fn non_fatal_status_codes(&self) -> GrpcCodes {
        self.non_fatal_status_codes
    }
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
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MethodConfig {
    pub(super) names: Vec<MethodName>,
    pub(super) policy: Option<ConfigPolicy>,
    pub(super) timeout: Option<Duration>,
    pub(super) wait_for_ready: Option<bool>,
    pub(super) max_request_message_bytes: Option<u64>,
    pub(super) max_response_message_bytes: Option<u64>,
}

impl MethodConfig {
    /// The names this config applies to (possibly none).
    pub(crate) fn names(&self) -> &[MethodName] {
        &self.names
    }

    /// The retry or hedging policy, if any.
    pub(crate) fn policy(&self) -> Option<&ConfigPolicy> {
        self.policy.as_ref()
    }

    /// The retry policy, if the policy is one.
    #[cfg(test)]
    pub(crate) fn retry_policy(&self) -> Option<&RetryPolicyConfig> {
        match &self.policy {
            Some(ConfigPolicy::Retry(retry)) => Some(retry),
            _ => None,
        }
    }

    /// The hedging policy, if the policy is one.
    #[cfg(test)]
    pub(crate) fn hedging_policy(&self) -> Option<&HedgingPolicyConfig> {
        match &self.policy {
            Some(ConfigPolicy::Hedging(hedging)) => Some(hedging),
            _ => None,
        }
    }

    /// `timeout`: the default deadline of a call, across all its attempts. May be
    /// zero (see the guide's "Decisions where A6 leaves room").
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// `waitForReady`, kept for callers.
    pub(crate) fn wait_for_ready(&self) -> Option<bool> {
        self.wait_for_ready
    }

    /// `maxRequestMessageBytes`, kept for callers.
    pub(crate) fn max_request_message_bytes(&self) -> Option<u64> {
        self.max_request_message_bytes
    }

    /// `maxResponseMessageBytes`, kept for callers.
    pub(crate) fn max_response_message_bytes(&self) -> Option<u64> {
        self.max_response_message_bytes
    }
}

/// A validated `retryThrottling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RetryThrottling {
    pub(super) max_tokens: u32,
    pub(super) token_ratio_milli: u32,
}

impl RetryThrottling {
    /// `maxTokens`: in 1..=1000.
    pub(crate) fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// `tokenRatio` in thousandths, digits past the third decimal dropped: >= 1.
    #[cfg(test)]
    pub(crate) fn token_ratio_milli(&self) -> u32 {
        self.token_ratio_milli
    }

    /// `tokenRatio`, as the three-decimal value in force (0.5466 gives 0.546).
    pub(crate) fn token_ratio(&self) -> f64 {
        f64::from(self.token_ratio_milli) / 1000.0
    }
}
