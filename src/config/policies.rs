//! Service config → the policy table and throttle of the layers.

use super::{MethodConfig, MethodPolicy as ConfigPolicy, ServiceConfig};
use crate::backoff::{Exponential, Jitter};
use crate::policy::{HedgePolicy, MethodPolicy, Policies, PoliciesBuilder, RetryPolicy};
use crate::throttle::Throttle;

impl ServiceConfig {
    /// The policy table this config describes, ready for
    /// [`RetryLayer`](crate::RetryLayer) and [`HedgeLayer`](crate::HedgeLayer): one line for
    /// the common case.
    ///
    /// Backoff jitter is today's gRPC behaviour (±20 % after the cap, as grpc-go, grpc-java
    /// and C-core do), so the same JSON behaves as it does there; see
    /// [`policies_builder_with`](ServiceConfig::policies_builder_with) for the full jitter of
    /// the 2017 A6 text, or to set buffer limits or the client cap.
    ///
    /// ```
    /// use tower_retry_hedge::config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{
    ///   "methodConfig": [{
    ///     "name": [{"service": "helloworld.Greeter"}],
    ///     "retryPolicy": {
    ///       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
    ///     }
    ///   }],
    ///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
    /// }"#)?;
    /// let policies = config.policies();
    /// assert!(policies.lookup(&http::Method::POST, "/helloworld.Greeter/SayHello").is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policies(&self) -> Policies {
        self.policies_builder_with(Jitter::GRPC).build()
    }

    /// A builder of the policy table, with the backoff jitter of your choice, to which
    /// buffer limits, the client cap on `maxAttempts` or a different throttle can be added.
    ///
    /// ```
    /// use tower_retry_hedge::backoff::Jitter;
    /// use tower_retry_hedge::config::ServiceConfig;
    /// use tower_retry_hedge::BufferLimits;
    ///
    /// let config = ServiceConfig::from_json(r#"{"methodConfig": [{
    ///     "name": [{}],
    ///     "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s"}
    /// }]}"#)?;
    /// let policies = config
    ///     .policies_builder_with(Jitter::Full)
    ///     .buffer_limits(BufferLimits::new(64 * 1024, 8 * 1024 * 1024))
    ///     .max_attempts_cap(3)
    ///     .build();
    /// assert!(policies.lookup(&http::Method::POST, "/any.Service/Method").is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policies_builder_with(&self, jitter: Jitter) -> PoliciesBuilder {
        let mut builder = Policies::builder();
        for method_config in self.method_configs() {
            // A config without a retry or hedging policy still matches its names, and so
            // turns off what a broader name would have given them, as gRPC's lookup does.
            let policy = method_policy(method_config, jitter);
            for name in method_config.names() {
                builder = match (name.method(), &policy) {
                    (Some(method), Some(policy)) => {
                        builder.method(&format!("{}/{method}", name.service()), policy.clone())
                    }
                    (Some(method), None) => {
                        builder.method_without_policy(&format!("{}/{method}", name.service()))
                    }
                    (None, Some(policy)) if name.service().is_empty() => {
                        builder.default_policy(policy.clone())
                    }
                    (None, None) if name.service().is_empty() => builder,
                    (None, Some(policy)) => builder.service(name.service(), policy.clone()),
                    (None, None) => builder.service_without_policy(name.service()),
                };
            }
        }
        if let Some(throttling) = self.retry_throttling()
            && let Ok(throttle) = Throttle::new(throttling.max_tokens(), throttling.token_ratio())
        {
            builder = builder.throttle(throttle);
        }
        builder
    }
}

/// The layer policy of one method config; a `timeout` alone gives its methods that deadline;
/// `None` when it has neither a policy nor a timeout.
fn method_policy(config: &MethodConfig, jitter: Jitter) -> Option<MethodPolicy> {
    let Some(policy) = config.policy() else {
        return config.timeout().map(MethodPolicy::Timeout);
    };
    let policy = match policy {
        ConfigPolicy::Retry(retry) => {
            // A6 allows maxBackoff below initialBackoff: `a6` keeps the formula exact.
            let backoff = Exponential::a6(
                retry.initial_backoff(),
                retry.max_backoff(),
                retry.backoff_multiplier(),
                jitter,
            )
            .ok()?;
            let mut builder = RetryPolicy::builder()
                .max_attempts(retry.max_attempts())
                .backoff(backoff)
                .retryable(retry.retryable_status_codes());
            if let Some(timeout) = config.timeout() {
                builder = builder.timeout(timeout);
            }
            MethodPolicy::from(builder.build().ok()?)
        }
        ConfigPolicy::Hedging(hedging) => {
            let mut builder = HedgePolicy::builder()
                .max_attempts(hedging.max_attempts())
                .delay(hedging.hedging_delay())
                .non_fatal(hedging.non_fatal_status_codes());
            if let Some(timeout) = config.timeout() {
                builder = builder.timeout(timeout);
            }
            MethodPolicy::from(builder.build().ok()?)
        }
    };
    Some(policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use std::time::Duration;

    const A6: &str = r#"{
      "loadBalancingPolicy": "round_robin",
      "methodConfig": [
        {
          "name": [{"service": "pkg.Retried"}, {"service": "pkg.Other", "method": "Get"}],
          "timeout": "2s",
          "retryPolicy": {
            "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", 8]
          }
        },
        {
          "name": [{"service": "pkg.Hedged"}],
          "hedgingPolicy": {
            "maxAttempts": 4, "hedgingDelay": "0.5s",
            "nonFatalStatusCodes": ["UNAVAILABLE", "INTERNAL", "ABORTED"]
          }
        },
        { "name": [{}], "retryPolicy": {
            "maxAttempts": 2, "initialBackoff": "2s", "maxBackoff": "1s",
            "backoffMultiplier": 1.5, "retryableStatusCodes": ["aborted"] } },
        { "name": [{"service": "pkg.TimeoutOnly"}], "timeout": "1s" }
      ],
      "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
    }"#;

    fn lookup(policies: &Policies, path: &str) -> Option<MethodPolicy> {
        policies.lookup(&Method::POST, path).cloned()
    }

    #[test]
    fn a6_config_builds_the_table() {
        let policies = ServiceConfig::from_json(A6).unwrap().policies();
        let Some(MethodPolicy::Retry(retry)) = lookup(&policies, "/pkg.Retried/Any") else {
            panic!("retry policy expected");
        };
        assert_eq!(retry.max_attempts(), 4);
        assert_eq!(retry.timeout(), Some(Duration::from_secs(2)));
        assert!(matches!(
            lookup(&policies, "/pkg.Other/Get"),
            Some(MethodPolicy::Retry(_))
        ));
        let Some(MethodPolicy::Hedge(hedge)) = lookup(&policies, "/pkg.Hedged/X") else {
            panic!("hedge policy expected");
        };
        assert_eq!(hedge.max_attempts(), 4);
        assert_eq!(hedge.delay().current(), Duration::from_millis(500));
        // A service whose config has only a timeout gets that deadline, nothing more.
        assert!(matches!(
            lookup(&policies, "/pkg.TimeoutOnly/X"),
            Some(MethodPolicy::Timeout(t)) if t == Duration::from_secs(1)
        ));
        // The default takes what matches nothing else, including pkg.Other's other methods.
        for path in ["/pkg.Other/Put", "/x.Y/Z"] {
            let Some(MethodPolicy::Retry(default)) = lookup(&policies, path) else {
                panic!("default policy expected for {path}");
            };
            assert_eq!(default.max_attempts(), 2);
        }
    }

    #[test]
    fn max_backoff_below_initial_is_every_delay() {
        let policies = ServiceConfig::from_json(A6).unwrap().policies();
        let Some(MethodPolicy::Retry(default)) = lookup(&policies, "/x.Y/Z") else {
            panic!("default policy expected");
        };
        // min(2 s × 1.5^n, 1 s) is 1 s at every step, ±20 %.
        for attempt in 0..5 {
            let delay = default.backoff().delay(attempt);
            assert!(delay >= Duration::from_millis(800) && delay <= Duration::from_millis(1200));
        }
    }

    #[test]
    fn throttle_comes_from_retry_throttling() {
        let config = ServiceConfig::from_json(A6).unwrap();
        let policies = config.policies_builder_with(Jitter::Full).build();
        assert!(policies.has_throttle());
        let none = ServiceConfig::from_json(r#"{"methodConfig": []}"#)
            .unwrap()
            .policies();
        assert!(!none.has_throttle());
    }
}
